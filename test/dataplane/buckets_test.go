//go:build dataplane

package dataplane

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
)

// manyPortsServed starts lbpod (with flags) on a Service of many ports, waits until it serves
// them, and holds a connection open on the echo port, exchanged once ("before").
func manyPortsServed(t *testing.T, many []servicePort, flags ...string) (Gomega, *topology, string, func(string)) {
	g := NewWithT(t)
	tp := newTopology(t)
	tp.startBackends()
	svc := filepath.Join(t.TempDir(), "svc.yaml")
	writeService(t, svc, []string{clusterIPv4}, many, nil)
	tp.startLBPod(svc, "v4", flags...)
	waitReady(g, tp)
	expectServed(g, tp, tp.client, lbIPv4, clusterIPv4)
	exchange := holdEcho(t, g, tp)
	exchange("before")
	return g, tp, svc, exchange
}

// A Service with more than 64 ports gets its DNAT rules in bucket chains: traffic still reaches
// every port (HTTP and UDP through their buckets), one port added and one removed is applied
// as a patch of those buckets and the dispatch and verified by listing just them (no
// iptables-save), a held connection keeps working, and going back to a few ports makes
// LBSVC-SERVICES flat again with no bucket chain left.
func TestBucketedPorts(t *testing.T) {
	many := append(append([]servicePort{}, basePorts...), tcpPorts(10000, 200)...)
	g, tp, svc, exchange := manyPortsServed(t, many, append([]string{"--iptables", "nft"}, iptRules...)...)

	g.Expect(tp.exec(tp.lb, "iptables-nft", "-t", "nat", "-S", "LBSVC-SERVICES")).To(Equal(strings.Join([]string{
		"-N LBSVC-SERVICES",
		"-A LBSVC-SERVICES -p tcp -m tcp --dport 64:127 -j LBSVC-SERVICES-TCP-1",
		"-A LBSVC-SERVICES -p tcp -m tcp --dport 9984:10047 -j LBSVC-SERVICES-TCP-156",
		"-A LBSVC-SERVICES -p tcp -m tcp --dport 10048:10111 -j LBSVC-SERVICES-TCP-157",
		"-A LBSVC-SERVICES -p tcp -m tcp --dport 10112:10175 -j LBSVC-SERVICES-TCP-158",
		"-A LBSVC-SERVICES -p tcp -m tcp --dport 10176:10239 -j LBSVC-SERVICES-TCP-159",
		"-A LBSVC-SERVICES -p udp -m udp --dport 0:63 -j LBSVC-SERVICES-UDP-0",
		"-A LBSVC-SERVICES -p sctp -m sctp --dport 3840:3903 -j LBSVC-SERVICES-SCTP-60",
	}, "\n") + "\n"))
	g.Expect(tp.exec(tp.lb, "iptables-nft", "-t", "nat", "-S", "LBSVC-SERVICES-TCP-1")).To(Equal(
		"-N LBSVC-SERVICES-TCP-1\n" +
			"-A LBSVC-SERVICES-TCP-1 -d 172.18.0.18/32 -p tcp -m tcp --dport 80 -j DNAT --to-destination 10.109.201.193:80\n" +
			"-A LBSVC-SERVICES-TCP-1 -d 172.18.0.18/32 -p tcp -m tcp --dport 81 -j DNAT --to-destination 10.109.201.193:81\n"))

	// 8443 goes into a new bucket (8384:8447), 10199 leaves one that keeps other ports.
	changed := append(append([]servicePort{}, many[:len(many)-1]...), servicePort{Protocol: "TCP", Port: extraHTTPPort})
	writeService(t, svc, []string{clusterIPv4}, changed, nil)
	g.Eventually(func() (string, error) { return httpGet(t, tp.client, lbAddr(lbIPv4, extraHTTPPort)) }).
		WithTimeout(time.Second).WithPolling(20 * time.Millisecond).Should(Equal(httpReply(clusterIPv4, extraHTTPPort)))
	g.Eventually(tp.lbpod.logs.String).WithTimeout(time.Second).WithPolling(20 * time.Millisecond).
		Should(MatchRegexp(`msg=applied trigger=service changes=4 took=\S+ read=\S+ execute=\S+ verify=\S+ saves=0 lists=3\n`))
	g.Expect(tp.exec(tp.lb, "iptables-nft", "-t", "nat", "-S", "LBSVC-SERVICES-TCP-159")).NotTo(ContainSubstring("--dport 10199 "))
	exchange("after the change")

	writeService(t, svc, []string{clusterIPv4}, basePorts, nil)
	g.Eventually(func() error { _, err := httpGet(t, tp.client, lbAddr(lbIPv4, extraHTTPPort)); return err }).
		WithTimeout(time.Second).WithPolling(20 * time.Millisecond).Should(Satisfy(isRefused))
	waitReady(g, tp)
	nat := tp.exec(tp.lb, "iptables-nft-save", "-t", "nat")
	g.Expect(nat).NotTo(ContainSubstring("LBSVC-SERVICES-"), "bucket chains left behind:\n%s", nat)
	g.Expect(strings.Split(nat, "\n")).To(ContainElement(
		"-A LBSVC-SERVICES -d 172.18.0.18/32 -p tcp -m tcp --dport 80 -j DNAT --to-destination 10.109.201.193:80"))
	expectServed(g, tp, tp.client, lbIPv4, clusterIPv4)
	exchange("back to a flat chain")
}
