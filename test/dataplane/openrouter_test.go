//go:build dataplane

package dataplane

import (
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
