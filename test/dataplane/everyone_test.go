//go:build dataplane

package dataplane

import (
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
)

// loadBalancerSourceRanges [0.0.0.0/0, ::/0] converges: ready, served to every source of both
// families, no "-s 0.0.0.0/0" / "-s ::/0" in the listings, and resyncs every 100 ms find nothing
// to change (a rule written with the /0 match would be re-added at each one).
func TestSourceRangeEveryoneConverges(t *testing.T) {
	g, tp, _ := servedTopology(t, "dual", []string{clusterIPv4, clusterIPv6}, []string{"0.0.0.0/0", "::/0"}, append([]string{"--resync-period", "100ms"}, iptRules...)...)
	for _, ns := range []string{tp.client, tp.outsider} {
		expectServed(g, tp, ns, lbIPv4, clusterIPv4)
		expectServed(g, tp, ns, lbIPv6, clusterIPv6)
	}
	g.Expect(tp.exec(tp.lb, "iptables", "-t", "nat", "-S")).NotTo(ContainSubstring("-s 0.0.0.0/0"))
	g.Expect(tp.exec(tp.lb, "ip6tables", "-t", "nat", "-S")).NotTo(ContainSubstring("-s ::/0"))
	changed := strings.Count(tp.lbpod.logs.String(), "msg=changed")
	g.Consistently(func() int { return strings.Count(tp.lbpod.logs.String(), "msg=changed") }).
		WithTimeout(600 * time.Millisecond).WithPolling(100 * time.Millisecond).Should(Equal(changed))
	code, body := tp.readyz()
	g.Expect(code).To(Equal(200), body)
}

// Source ranges as a user may write them converge on real iptables: a range listed twice, apart,
// is one rule, and IPv6 ranges that iptables prints back with a dotted tail (::1.0.0.0/104 and
// ::0.1.0.0/112, which Go spells ::100:0/104 and ::1:0/112) compare equal to their listing: the
// resyncs every 100 ms change nothing, the client is served in both families and a source
// outside the ranges refused.
func TestSourceRangeSpellingsConverge(t *testing.T) {
	ranges := []string{clientV4 + "/32", "::100:0/104", clientV6 + "/128", "10.0.0.0/8", "::1:0/112", clientV4 + "/32", clientV6 + "/128"}
	g, tp, _ := servedTopology(t, "dual", []string{clusterIPv4, clusterIPv6}, ranges, append([]string{"--resync-period", "100ms"}, iptRules...)...)
	expectServed(g, tp, tp.client, lbIPv4, clusterIPv4)
	expectServed(g, tp, tp.client, lbIPv6, clusterIPv6)
	for _, lb := range []string{lbIPv4, lbIPv6} {
		g.Expect(httpGet(t, tp.outsider, lbAddr(lb, httpPort))).Error().To(Satisfy(isRefused), "outsider to %s", lb)
	}
	v4, v6 := tp.exec(tp.lb, "iptables", "-t", "nat", "-S", "LBSVC-PREROUTING"), tp.exec(tp.lb, "ip6tables", "-t", "nat", "-S", "LBSVC-PREROUTING")
	g.Expect(strings.Count(v4, "-s "+clientV4+"/32 ")).To(Equal(1), v4)
	g.Expect(strings.Count(v6, "-s "+clientV6+"/128 ")).To(Equal(1), v6)
	g.Expect(v6).To(ContainSubstring("-s ::1.0.0.0/104 "))
	g.Expect(v6).To(ContainSubstring("-s ::0.1.0.0/112 "))
	changed := strings.Count(tp.lbpod.logs.String(), "msg=changed")
	g.Consistently(func() int { return strings.Count(tp.lbpod.logs.String(), "msg=changed") }).
		WithTimeout(600 * time.Millisecond).WithPolling(100 * time.Millisecond).Should(Equal(changed))
}
