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
