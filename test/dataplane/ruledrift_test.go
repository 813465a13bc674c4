//go:build dataplane

package dataplane

import (
	"path/filepath"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
)

// A policy rule or a route of table 100 that differs from ours only in what the comparison once
// ignored is ours no longer, and the next apply replaces it: a rule with a selector or an option
// we never write (suppress_prefixlength 0 makes `iif eth0 lookup 100` skip the default route,
// ipproto tcp lets UDP replies go by the main table), a route of another type (local makes the
// pod take the subnet's packets for itself) or scope. Each drift is made by hand with ip; `lbpod
// init` (one apply) puts back exactly what it wrote before, and a second finds nothing to do.
func TestRuleAndRouteDriftIsReplaced(t *testing.T) {
	rule := func(family string, pref string, extra ...string) [][]string {
		iif := map[string]string{"32764": "eth0", "32765": "net1"}[pref]
		return [][]string{{family, "rule", "del", "pref", pref}, append([]string{family, "rule", "add", "pref", pref, "iif", iif, "lookup", "100"}, extra...)}
	}
	for _, d := range []struct {
		name string
		ip   [][]string
	}{
		{"rule suppress_prefixlength 0", rule("-4", "32764", "suppress_prefixlength", "0")},
		{"rule suppress_ifgroup", rule("-4", "32764", "suppress_ifgroup", "1")},
		{"rule ipproto tcp", rule("-4", "32765", "ipproto", "tcp")},
		{"rule dport", rule("-4", "32765", "ipproto", "udp", "dport", "53")},
		{"rule sport", rule("-4", "32765", "ipproto", "udp", "sport", "53")},
		{"rule tos", rule("-4", "32765", "tos", "0x10")},
		{"rule uidrange", rule("-4", "32764", "uidrange", "0-0")},
		{"rule fwmark mask only", rule("-4", "32764", "fwmark", "0/0x1")},
		{"rule tun_id", rule("-4", "32764", "tun_id", "5")},
		{"rule realms", rule("-4", "32764", "realms", "5")},
		{"IPv6 rule ipproto tcp", rule("-6", "32765", "ipproto", "tcp")},
		{"route local", [][]string{{"route", "replace", "table", "100", "local", subnetV4, "dev", "net1"}}},
		{"route scope host", [][]string{{"route", "replace", "table", "100", subnetV4, "dev", "net1", "scope", "host"}}},
		{"route unreachable", [][]string{{"route", "replace", "table", "100", "unreachable", clusterIPv4}}},
		{"IPv6 route local", [][]string{{"-6", "route", "replace", "table", "100", "local", subnetV6, "dev", "net1"}}},
	} {
		t.Run(d.name, func(t *testing.T) {
			g := NewWithT(t)
			tp := newTopology(t)
			svc := filepath.Join(t.TempDir(), "svc.yaml")
			writeService(t, svc, []string{clusterIPv4, clusterIPv6}, basePorts, nil)
			out, err := tp.runInit(svc, "dual")
			g.Expect(err).NotTo(HaveOccurred(), out)
			listing := func() string {
				var b strings.Builder
				for _, cmd := range [][]string{{"rule"}, {"-6", "rule"}, {"route", "show", "table", "100"}, {"-6", "route", "show", "table", "100"}} {
					b.WriteString(tp.ip(tp.lb, cmd...))
				}
				return b.String()
			}
			want := listing()

			for _, cmd := range d.ip {
				tp.ip(tp.lb, cmd...)
			}
			g.Expect(listing()).NotTo(Equal(want), "the drift")
			out, err = tp.runInit(svc, "dual")
			g.Expect(err).NotTo(HaveOccurred(), out)
			g.Expect(out).To(ContainSubstring("msg=applied changes=2 "), "one object deleted, ours added")
			g.Expect(listing()).To(Equal(want))
			out, err = tp.runInit(svc, "dual")
			g.Expect(err).NotTo(HaveOccurred(), out)
			g.Expect(out).To(ContainSubstring("msg=applied changes=0 "))
		})
	}
}
