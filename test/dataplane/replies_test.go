//go:build dataplane

package dataplane

import (
	"regexp"
	"strconv"
	"testing"
	"time"

	. "github.com/onsi/gomega"
)

// What the lb pod itself sends from its LB address reaches a client behind the Subnet's gateway,
// on each family and with each rules back end: the TCP reset for a port the Service does not
// have, the ICMP port unreachable for such a UDP port, the echo reply. None of it goes to the node
// over eth0. Without the rule `from <LB address> lookup 100` these took the main table's default
// route, through eth0: the remote client's probes timed out and the node got the packets.
func TestOwnRepliesReachRemoteClient(t *testing.T) {
	forEachRules(t, func(t *testing.T, rules []string) {
		g, tp, _ := servedTopology(t, "dual", []string{clusterIPv4, clusterIPv6}, nil, rules...)
		remote := tp.addRemote()
		// The node counts what arrives from the LB addresses.
		tp.exec(tp.node, "iptables", "-t", "raw", "-A", "PREROUTING", "-s", lbIPv4, "-m", "comment", "--comment", "from-lb")
		tp.exec(tp.node, "ip6tables", "-t", "raw", "-A", "PREROUTING", "-s", lbIPv6, "-m", "comment", "--comment", "from-lb")
		for _, f := range []struct{ lb, clusterIP string }{{lbIPv4, clusterIPv4}, {lbIPv6, clusterIPv6}} {
			// Forwarded replies (routed by `iif eth0`) reach the remote client: the path works.
			expectServed(g, tp, remote, f.lb, f.clusterIP)
			c, err := dialIn(t, remote, "tcp", lbAddr(f.lb, 22), 400*time.Millisecond)
			if err == nil {
				c.Close()
			}
			g.Expect(err).To(Satisfy(isRefused), "TCP to a port the Service does not have on %s: a reset", f.lb)
			_, err = udpExchange(t, remote, lbAddr(f.lb, 5353), "probe")
			g.Expect(err).To(Satisfy(isRefused), "UDP to a port the Service does not have on %s: port unreachable", f.lb)
			g.Expect(icmpEcho(t, remote, f.lb)).To(Succeed(), "echo to %s", f.lb)
		}
		g.Expect(tp.rawCount(tp.node, "iptables", "PREROUTING", "from-lb")).To(BeZero(), "IPv4 packets from the LB address at the node")
		g.Expect(tp.rawCount(tp.node, "ip6tables", "PREROUTING", "from-lb")).To(BeZero(), "IPv6 packets from the LB address at the node")
	})
}

// rawCount returns the packet counter of the rule commented comment in chain (PREROUTING, OUTPUT)
// of the raw table of namespace ns; cmd is iptables or ip6tables.
func (tp *topology) rawCount(ns, cmd, chain, comment string) int {
	tp.t.Helper()
	out := tp.exec(ns, cmd, "-t", "raw", "-L", chain, "-v", "-x", "-n")
	m := regexp.MustCompile(`(?m)^\s*(\d+)\s+\d+\s.*/\* ` + regexp.QuoteMeta(comment) + ` \*/`).FindStringSubmatch(out)
	if m == nil {
		tp.t.Fatalf("%s -t raw in %s: no rule %q:\n%s", cmd, ns, comment, out)
	}
	n, err := strconv.Atoi(m[1])
	if err != nil {
		tp.t.Fatal(err)
	}
	return n
}
