//go:build dataplane

package dataplane

import (
	"net"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
)

var linkLocal = regexp.MustCompile(`inet6 (fe80::[0-9a-f:]+)/64`)

// Without --health-addr, lbpod listens on LBPOD_POD_IP only (as the operator will set it from
// status.podIP): the kubelet's path (the node, to the pod IP) works, and from the underlay
// neither the LB address nor net1's IPv6 link-local address answers, for an IPv4-only Service
// too; the socket list shows the one listener.
func TestHealthServerOnPodIPOnly(t *testing.T) {
	g := NewWithT(t)
	tp := newTopology(t)
	tp.startBackends()
	svc := filepath.Join(t.TempDir(), "svc.yaml")
	writeService(t, svc, []string{clusterIPv4}, basePorts, nil)
	tp.startCommand(append([]string{"env", "LBPOD_POD_IP=" + podV4, lbpodBin, "--service-file", svc}, stackArgs("v4")...)...)

	g.Eventually(func() (string, error) { return httpGetPath(t, tp.node, net.JoinHostPort(podV4, "8081"), "/readyz") }).
		WithTimeout(5 * time.Second).WithPolling(50 * time.Millisecond).Should(Equal("ok\n"))
	expectServed(g, tp, tp.client, lbIPv4, clusterIPv4)
	g.Expect(tp.lbpod.logs.String()).To(ContainSubstring(`msg="health server address" addr=10.16.0.2:8081 why=LBPOD_POD_IP`))

	g.Expect(httpGet(t, tp.client, lbAddr(lbIPv4, 8081))).Error().To(Satisfy(isRefused))
	m := linkLocal.FindStringSubmatch(tp.ip(tp.lb, "-6", "addr", "show", "dev", "net1", "scope", "link"))
	g.Expect(m).To(HaveLen(2), "net1 has an IPv6 link-local address")
	// No reply at all here (the lb pod does not route IPv6 replies back out of net1 for an
	// IPv4-only Service); the listener list below is why nothing could answer anyway.
	g.Expect(dialIn(t, tp.client, "tcp", net.JoinHostPort(m[1]+"%c0", "8081"), time.Second)).Error().To(HaveOccurred())
	// The only TCP listener of lbpod's on 8081 is the pod IP: no wildcard, no net1 address.
	g.Expect(strings.Fields(tp.exec(tp.lb, "ss", "-Htln", "sport = :8081"))).To(ContainElement("10.16.0.2:8081"))
	g.Expect(strings.Count(tp.exec(tp.lb, "ss", "-Htln", "sport = :8081"), "\n")).To(Equal(1))
	// The pod IP itself, from the underlay with the lb pod's net1 as next hop: dropped on net1's
	// INPUT (no reply at all, and the DROP rule counted it), though the server listens there.
	tp.ip(tp.client, "route", "add", podV4+"/32", "via", lbIPv4, "dev", "c0")
	_, err := dialIn(t, tp.client, "tcp", net.JoinHostPort(podV4, "8081"), 500*time.Millisecond)
	g.Expect(err).To(MatchError(ContainSubstring("i/o timeout")))
	g.Expect(tp.exec(tp.lb, "iptables", "-t", "filter", "-S", "LBSVC-INPUT", "-v")).
		To(MatchRegexp(`! -d 172\.18\.0\.18/32 -i net1 -c [1-9]\d* \d+ -j DROP`))
	// Inside the pod, loopback is not the pod IP either: nothing listens on a wildcard.
	g.Expect(httpGet(t, tp.lb, "127.0.0.1:8081")).Error().To(Satisfy(isRefused))
}
