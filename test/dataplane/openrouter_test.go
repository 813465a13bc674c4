//go:build dataplane

package dataplane

import (
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"testing"
	"time"

	. "github.com/onsi/gomega"
)

// The lb pod is no open router: a client on the underlay that routes the ClusterIP (or another
// cluster address) through the LB address gets nothing, from an allowed source and from a
// disallowed one, and the DROP rule of LBSVC-FORWARD counted the packets; the Service itself is
// still served to the allowed client.
func TestNotAnOpenRouter(t *testing.T) {
	g, tp, _ := servedTopology(t, "v4", []string{clusterIPv4}, []string{clientV4 + "/32"}, iptRules...)
	expectServed(g, tp, tp.client, lbIPv4, clusterIPv4)
	for _, ns := range []string{tp.client, tp.outsider} {
		tp.ip(ns, "route", "add", clusterIPv4+"/32", "via", lbIPv4, "dev", "c0")
		tp.ip(ns, "route", "add", nodeV4+"/32", "via", lbIPv4, "dev", "c0")
		for _, dst := range []string{lbAddr(clusterIPv4, httpPort), lbAddr(nodeV4, httpPort)} {
			_, err := dialIn(t, ns, "tcp", dst, 300*time.Millisecond)
			g.Expect(err).To(MatchError(ContainSubstring("i/o timeout")), "%s -> %s", ns, dst)
		}
	}
	g.Expect(tp.exec(tp.lb, "iptables", "-t", "filter", "-S", "LBSVC-FORWARD", "-v")).
		To(MatchRegexp(`-A LBSVC-FORWARD -i net1 -m conntrack ! --ctstate DNAT -c ([4-9]|\d\d+) \d+ -j DROP`))
	// The allowed client is still served through the LB address.
	expectServed(g, tp, tp.client, lbIPv4, clusterIPv4)
}

// closedUDPPort is a UDP port of the Service that nothing behind the ClusterIP listens on.
const closedUDPPort = 5354

// Nor from the cluster side: a sender there that routes an underlay address through the lb pod
// (another pod of the node, with a bridge-type CNI) gets nothing into the underlay, on either
// family and with either back end. Before, `iif eth0 lookup 100` sent it out of net1,
// untranslated. What eth0 carries into net1 for our DNATed connections still passes: their
// replies, and an ICMP error about one (the ClusterIP's port unreachable for a Service port
// nothing listens on reaches the client as a refusal; conntrack gives it its connection's DNAT
// status, as it would a path MTU error).
func TestNotAnOpenRouterFromClusterSide(t *testing.T) {
	forEachRules(t, func(t *testing.T, rules []string) {
		g := NewWithT(t)
		tp := newTopology(t)
		tp.startBackends()
		svc := filepath.Join(t.TempDir(), "svc.yaml")
		writeService(t, svc, []string{clusterIPv4, clusterIPv6}, append(slices.Clone(basePorts), servicePort{Protocol: "UDP", Port: closedUDPPort}), nil)
		tp.startLBPod(svc, "dual", rules...)
		waitReady(g, tp)
		for _, f := range []struct{ cmd, sender, host, client, lb, clusterIP, podIP string }{
			{"iptables", "10.16.0.50", "/32", clientV4, lbIPv4, clusterIPv4, podV4},
			{"ip6tables", "fd16::50", "/128", clientV6, lbIPv6, clusterIPv6, podV6},
		} {
			expectServed(g, tp, tp.client, f.lb, f.clusterIP)
			_, err := udpExchange(t, tp.client, lbAddr(f.lb, closedUDPPort), "probe")
			g.Expect(err).To(Satisfy(isRefused), "the ClusterIP's port unreachable through %s", f.lb)

			// Another pod of the node sends to the client with the lb pod as next hop; the node
			// counts what it sends, the client what arrives.
			tp.ip(tp.node, "addr", "add", f.sender+f.host, "dev", "lo", "nodad")
			tp.ip(tp.node, "route", "add", f.client, "via", f.podIP, "dev", "nodeveth")
			tp.exec(tp.node, f.cmd, "-t", "raw", "-A", "OUTPUT", "-s", f.sender, "-p", "udp", "-m", "comment", "--comment", "sent")
			tp.exec(tp.client, f.cmd, "-t", "raw", "-A", "PREROUTING", "-s", f.sender, "-m", "comment", "--comment", "leaked")
			g.Expect(inNS(t, tp.node, func() error {
				c, err := net.DialUDP("udp", &net.UDPAddr{IP: net.ParseIP(f.sender)}, &net.UDPAddr{IP: net.ParseIP(f.client), Port: 9999})
				if err != nil {
					return err
				}
				defer c.Close()
				for range 3 {
					if _, err := c.Write([]byte("into the underlay")); err != nil {
						return err
					}
				}
				return nil
			})).To(Succeed())
			g.Expect(tp.rawCount(tp.node, f.cmd, "OUTPUT", "sent")).To(Equal(3), "sent through the lb pod from %s", f.sender)
			g.Consistently(func() int { return tp.rawCount(tp.client, f.cmd, "PREROUTING", "leaked") }).
				WithTimeout(500*time.Millisecond).WithPolling(50*time.Millisecond).Should(BeZero(), "forwarded from %s into the underlay", f.sender)
			// And the Service is still served.
			expectServed(g, tp, tp.client, f.lb, f.clusterIP)
		}
	})
}

// Nothing from the cluster side (eth0) is translated to a Service, even when it is addressed to
// the LB address: DNAT applies only to what arrives on net1. A pod of the node routes the LB
// address through the lb pod and opens a connection to a Service port; the node counts what the
// lb pod then sends to the ClusterIP from its own address (masqueraded). Before, the SYN was
// translated and reached the Service (and the backend's reply, sourced from the LB address,
// left through net1: a pod that may spoof its source there could have replies sent onto the
// underlay to a host of its choosing); now nothing reaches it. The underlay client is still
// served.
func TestNoDNATFromClusterSide(t *testing.T) {
	forEachRules(t, func(t *testing.T, rules []string) {
		g, tp, _ := servedTopology(t, "dual", []string{clusterIPv4, clusterIPv6}, nil, rules...)
		for _, f := range []struct{ cmd, lb, clusterIP, podIP string }{
			{"iptables", lbIPv4, clusterIPv4, podV4},
			{"ip6tables", lbIPv6, clusterIPv6, podV6},
		} {
			expectServed(g, tp, tp.client, f.lb, f.clusterIP)
			tp.ip(tp.node, "route", "add", f.lb, "via", f.podIP, "dev", "nodeveth")
			tp.exec(tp.node, f.cmd, "-t", "raw", "-A", "PREROUTING", "-s", f.podIP, "-d", f.clusterIP, "-p", "tcp", "--dport", fmt.Sprint(httpPort),
				"-m", "comment", "--comment", "translated")
			_, err := httpGet(t, tp.node, lbAddr(f.lb, httpPort))
			g.Expect(err).To(HaveOccurred(), "from the cluster side to %s", f.lb)
			g.Consistently(func() int { return tp.rawCount(tp.node, f.cmd, "PREROUTING", "translated") }).
				WithTimeout(300*time.Millisecond).WithPolling(50*time.Millisecond).Should(BeZero(), "translated to the Service from the cluster side through %s", f.lb)
			expectServed(g, tp, tp.client, f.lb, f.clusterIP)
		}
	})
}
