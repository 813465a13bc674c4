package lbpod

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// The members of the shared-address tests: A answers TCP 53 on its ClusterIP, B UDP 53 on its.
var (
	sharedNet = Network{Addresses: prefixes("172.18.0.18/16"), Gateways: addrs("172.18.0.1"), Subnets: prefixes("172.18.0.0/16")}
	sharedObs = Observed{UplinkGateways: map[Family]Gateway{IPv4: {Addr: netip.MustParseAddr("10.16.0.1")}}}
	memberA   = Service{Name: "default/a", ClusterIPs: addrs("10.96.0.10"), Ports: []Port{{TCP, 53}}}
	memberB   = Service{Name: "default/b", ClusterIPs: addrs("10.96.0.20"), Ports: []Port{{UDP, 53}}}
)

func lines(s string) []string { return strings.Split(strings.TrimSuffix(s, "\n"), "\n") }

func nftRuleTexts(t NFTable) map[string][]string {
	out := map[string][]string{}
	for _, c := range t.Chains {
		out[c.Name] = nil
		for _, r := range c.Rules {
			out[c.Name] = append(out[c.Name], r.Text)
		}
	}
	return out
}

func nftSetPorts(t NFTable) map[string][]uint16 {
	out := map[string][]uint16{}
	for _, s := range t.Sets {
		out[s.Name] = s.Ports
	}
	return out
}

// nftDNATTexts are the DNAT rules of the i-th member with a ClusterIP, as nft lists them.
func nftDNATTexts(i int, clusterIP string) []string {
	var out []string
	for _, proto := range []string{"tcp", "udp", "sctp"} {
		out = append(out, fmt.Sprintf("meta l4proto %s th dport @%s_ports_%d dnat ip to %s", proto, proto, i, clusterIP))
	}
	return out
}

func checkLines(t *testing.T, what string, got, want []string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("%s:\n%s\nwant:\n%s", what, strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// Two members on one address, in any order of the input: each port goes to its own member's
// ClusterIP, both ClusterIPs are routed through eth0 and masqueraded, UDP 53's flows are B's.
func TestDesiredSharedTwoMembers(t *testing.T) {
	st := Desired(Config{Network: sharedNet, Services: []Service{memberB, memberA}}, sharedObs, Names{})
	if len(st.Problems) != 0 {
		t.Fatalf("problems: %v", st.Problems)
	}
	checkLines(t, "routes", lines(RenderRoutes(st, IPv4)), []string{
		"default via 172.18.0.1 dev net1",
		"10.96.0.10 via 10.16.0.1 dev eth0",
		"10.96.0.20 via 10.16.0.1 dev eth0",
		"172.18.0.0/16 dev net1 scope link",
	})
	checkLines(t, "iptables nat", lines(RenderIPTables(st, IPv4, "nat")), []string{
		"-N LBSVC-PREROUTING",
		"-N LBSVC-SERVICES",
		"-N LBSVC-POSTROUTING",
		"-A PREROUTING -j LBSVC-PREROUTING",
		"-A POSTROUTING -j LBSVC-POSTROUTING",
		"-A LBSVC-PREROUTING -d 172.18.0.18/32 -i net1 -j LBSVC-SERVICES",
		"-A LBSVC-SERVICES -d 172.18.0.18/32 -p tcp -m tcp --dport 53 -j DNAT --to-destination 10.96.0.10:53",
		"-A LBSVC-SERVICES -d 172.18.0.18/32 -p udp -m udp --dport 53 -j DNAT --to-destination 10.96.0.20:53",
		"-A LBSVC-POSTROUTING -d 10.96.0.10/32 -j MASQUERADE",
		"-A LBSVC-POSTROUTING -d 10.96.0.20/32 -j MASQUERADE",
	})
	nft := st.NFTables[0]
	if want := map[string][]uint16{"tcp_ports_0": {53}, "udp_ports_0": nil, "sctp_ports_0": nil, "tcp_ports_1": nil, "udp_ports_1": {53}, "sctp_ports_1": nil}; !reflect.DeepEqual(nftSetPorts(nft), want) {
		t.Errorf("nft sets %v, want %v", nftSetPorts(nft), want)
	}
	rules := nftRuleTexts(nft)
	checkLines(t, "nft prerouting", rules[NFTChainPrerouting], []string{`iifname "net1" ip daddr 172.18.0.18 jump services`})
	checkLines(t, "nft services", rules[NFTChainServices], slices.Concat(nftDNATTexts(0, "10.96.0.10"), nftDNATTexts(1, "10.96.0.20")))
	checkLines(t, "nft postrouting", rules[NFTChainPostrouting], []string{"ip daddr 10.96.0.10 masquerade", "ip daddr 10.96.0.20 masquerade"})
	wantFlows := FlowPolicy{LB: netip.MustParseAddr("172.18.0.18"), AllSources: true,
		Targets: map[Port]netip.AddrPort{{UDP, 53}: netip.MustParseAddrPort("10.96.0.20:53")}}
	for _, got := range []FlowPolicy{st.IPTables[0].Flows, nft.Flows} {
		if !reflect.DeepEqual(got, wantFlows) {
			t.Errorf("flows %+v, want %+v", got, wantFlows)
		}
	}
}

// One member in the list is the single Service's state, whatever its name.
func TestDesiredSharedOneMemberIsSingle(t *testing.T) {
	named := memberA
	named.SourceRanges = prefixes("172.18.0.100/32")
	anon := named
	anon.Name = ""
	a := Desired(Config{Network: sharedNet, Services: []Service{named}}, sharedObs, Names{})
	b := Desired(Config{Network: sharedNet, Services: []Service{anon}}, sharedObs, Names{})
	if render(a) != render(b) || !reflect.DeepEqual(a.NFTables, b.NFTables) {
		t.Fatalf("a name changed the state:\n%s\n%s", render(a), render(b))
	}
	checkLines(t, "nft sets", slices.Sorted(func(yield func(string) bool) {
		for n := range nftSetPorts(a.NFTables[0]) {
			if !yield(n) {
				return
			}
		}
	}), []string{"sctp_ports", "tcp_ports", "udp_ports"})
}

// Two members with the same port and protocol: the first by name keeps it, the other is told by
// a PortClash problem that does not make the pod not ready, and keeps its other ports.
func TestDesiredSharedClash(t *testing.T) {
	b := memberB
	b.Ports = []Port{{TCP, 53}, {UDP, 53}}
	st := Desired(Config{Network: sharedNet, Services: []Service{b, memberA}}, sharedObs, Names{})
	want := []Problem{{Reason: ReasonPortClash, Message: "TCP 53 of Service default/b is also a port of Service default/a on the same address: default/a (the first by name) is served on it, default/b is not; give one of them another port"}}
	if !reflect.DeepEqual(st.Problems, want) {
		t.Fatalf("problems %+v, want %+v", st.Problems, want)
	}
	checkLines(t, "LBSVC-SERVICES", lines(RenderIPTables(st, IPv4, "nat"))[6:8], []string{
		"-A LBSVC-SERVICES -d 172.18.0.18/32 -p tcp -m tcp --dport 53 -j DNAT --to-destination 10.96.0.10:53",
		"-A LBSVC-SERVICES -d 172.18.0.18/32 -p udp -m udp --dport 53 -j DNAT --to-destination 10.96.0.20:53",
	})
	if got := nftSetPorts(st.NFTables[0]); !slices.Equal(got["tcp_ports_0"], []uint16{53}) || got["tcp_ports_1"] != nil || !slices.Equal(got["udp_ports_1"], []uint16{53}) {
		t.Fatalf("nft sets %v", got)
	}
}

// Members that allow different sources: every source of the LB address reaches the services
// chain, which sends each member's allowed sources to that member's group; A's range does not
// restrict B and B's does not restrict A, on both back ends; the flow policy is per port.
func TestDesiredSharedSourceRanges(t *testing.T) {
	a, b := memberA, memberB
	a.Ports = []Port{{TCP, 53}, {UDP, 54}}
	a.SourceRanges = prefixes("172.18.0.100/32", "fd00::/8")
	b.SourceRanges = prefixes("172.18.0.0/24", "10.0.0.0/8")
	c := Service{Name: "default/c", ClusterIPs: addrs("10.96.0.30"), Ports: []Port{{TCP, 80}}}
	st := Desired(Config{Network: sharedNet, Services: []Service{c, b, a}}, sharedObs, Names{})
	checkLines(t, "iptables nat", lines(RenderIPTables(st, IPv4, "nat")), []string{
		"-N LBSVC-SERVICES-S0",
		"-N LBSVC-SERVICES-S1",
		"-N LBSVC-SERVICES-S2",
		"-N LBSVC-PREROUTING",
		"-N LBSVC-SERVICES",
		"-N LBSVC-POSTROUTING",
		"-A PREROUTING -j LBSVC-PREROUTING",
		"-A POSTROUTING -j LBSVC-POSTROUTING",
		"-A LBSVC-SERVICES-S0 -d 172.18.0.18/32 -p tcp -m tcp --dport 53 -j DNAT --to-destination 10.96.0.10:53",
		"-A LBSVC-SERVICES-S0 -d 172.18.0.18/32 -p udp -m udp --dport 54 -j DNAT --to-destination 10.96.0.10:54",
		"-A LBSVC-SERVICES-S1 -d 172.18.0.18/32 -p udp -m udp --dport 53 -j DNAT --to-destination 10.96.0.20:53",
		"-A LBSVC-SERVICES-S2 -d 172.18.0.18/32 -p tcp -m tcp --dport 80 -j DNAT --to-destination 10.96.0.30:80",
		"-A LBSVC-PREROUTING -d 172.18.0.18/32 -i net1 -j LBSVC-SERVICES",
		"-A LBSVC-SERVICES -s 172.18.0.100/32 -j LBSVC-SERVICES-S0",
		"-A LBSVC-SERVICES -s 172.18.0.0/24 -j LBSVC-SERVICES-S1",
		"-A LBSVC-SERVICES -s 10.0.0.0/8 -j LBSVC-SERVICES-S1",
		"-A LBSVC-SERVICES -j LBSVC-SERVICES-S2",
		"-A LBSVC-POSTROUTING -d 10.96.0.10/32 -j MASQUERADE",
		"-A LBSVC-POSTROUTING -d 10.96.0.20/32 -j MASQUERADE",
		"-A LBSVC-POSTROUTING -d 10.96.0.30/32 -j MASQUERADE",
	})
	rules := nftRuleTexts(st.NFTables[0])
	checkLines(t, "nft prerouting", rules[NFTChainPrerouting], []string{`iifname "net1" ip daddr 172.18.0.18 jump services`})
	checkLines(t, "nft services", rules[NFTChainServices], []string{
		"ip saddr 172.18.0.100 jump services_0",
		"ip saddr 172.18.0.0/24 jump services_1",
		"ip saddr 10.0.0.0/8 jump services_1",
		"jump services_2",
	})
	checkLines(t, "nft services_0", rules["services_0"], nftDNATTexts(0, "10.96.0.10"))
	checkLines(t, "nft services_1", rules["services_1"], nftDNATTexts(1, "10.96.0.20"))
	checkLines(t, "nft services_2", rules["services_2"], nftDNATTexts(2, "10.96.0.30"))
	wantFlows := FlowPolicy{LB: netip.MustParseAddr("172.18.0.18"),
		Targets: map[Port]netip.AddrPort{{UDP, 54}: netip.MustParseAddrPort("10.96.0.10:54"), {UDP, 53}: netip.MustParseAddrPort("10.96.0.20:53")},
		PortSources: map[Port]FlowSources{
			{UDP, 54}: {Ranges: prefixes("172.18.0.100/32")},
			{UDP, 53}: {Ranges: prefixes("172.18.0.0/24", "10.0.0.0/8")},
		}}
	for _, got := range []FlowPolicy{st.IPTables[0].Flows, st.NFTables[0].Flows} {
		if !reflect.DeepEqual(got, wantFlows) {
			t.Errorf("flows %+v, want %+v", got, wantFlows)
		}
	}
	if got, want := wantFlows.String(), "ports [udp/53->10.96.0.20:53 (sources 172.18.0.0/24,10.0.0.0/8) udp/54->10.96.0.10:54 (sources 172.18.0.100/32)]"; got != want {
		t.Errorf("String %q, want %q", got, want)
	}

	// Members that allow the same sources (in another order) keep the single Service's layout.
	b.SourceRanges = prefixes("fd00::/8", "172.18.0.100/32")
	st = Desired(Config{Network: sharedNet, Services: []Service{b, a}}, sharedObs, Names{})
	checkLines(t, "same ranges", lines(RenderIPTables(st, IPv4, "nat"))[5:8], []string{
		"-A LBSVC-PREROUTING -s 172.18.0.100/32 -d 172.18.0.18/32 -i net1 -j LBSVC-SERVICES",
		"-A LBSVC-SERVICES -d 172.18.0.18/32 -p tcp -m tcp --dport 53 -j DNAT --to-destination 10.96.0.10:53",
		"-A LBSVC-SERVICES -d 172.18.0.18/32 -p udp -m udp --dport 54 -j DNAT --to-destination 10.96.0.10:54",
	})
}

// Conntrack after a change: a member leaving or narrowing its ranges makes only its own flows
// stale; the other member's, translated to its ClusterIP from a source it allows, stay.
func TestFlowPolicySharedPerMember(t *testing.T) {
	lb := netip.MustParseAddr("172.18.0.18")
	client, outsider := netip.MustParseAddr("172.18.0.100"), netip.MustParseAddr("172.18.0.200")
	flow := func(src netip.Addr, port uint16, target string) Flow {
		return Flow{Protocol: UDP, Src: src, Dst: netip.AddrPortFrom(lb, port), ReplySrc: netip.MustParseAddrPort(target)}
	}
	toA := func(src netip.Addr) Flow { return flow(src, 54, "10.96.0.10:54") }
	toB := func(src netip.Addr) Flow { return flow(src, 53, "10.96.0.20:53") }
	a, b := memberA, memberB
	a.Ports = []Port{{UDP, 54}}
	policy := func(services ...Service) FlowPolicy {
		return Desired(Config{Network: sharedNet, Services: services}, sharedObs, Names{}).IPTables[0].Flows
	}
	for name, c := range map[string]struct {
		policy FlowPolicy
		stale  map[Flow]bool
	}{
		"both, everyone": {policy(a, b), map[Flow]bool{toA(client): false, toA(outsider): false, toB(client): false, toB(outsider): false}},
		"B left":         {policy(a), map[Flow]bool{toA(client): false, toA(outsider): false, toB(client): true, toB(outsider): true}},
		"B narrowed to the client": {policy(a, func() Service { b := b; b.SourceRanges = prefixes("172.18.0.100/32"); return b }()),
			map[Flow]bool{toA(client): false, toA(outsider): false, toB(client): false, toB(outsider): true}},
		"A narrowed to the client": {policy(func() Service { a := a; a.SourceRanges = prefixes("172.18.0.100/32"); return a }(), b),
			map[Flow]bool{toA(client): false, toA(outsider): true, toB(client): false, toB(outsider): false}},
		"B's port moved to A": {policy(Service{Name: "default/a", ClusterIPs: a.ClusterIPs, Ports: []Port{{UDP, 53}, {UDP, 54}}}),
			map[Flow]bool{toA(client): false, toB(client): true, flow(client, 53, "10.96.0.10:53"): false}},
	} {
		for fl, want := range c.stale {
			if got := c.policy.Stale(fl); got != want {
				t.Errorf("%s: %s from %s to %s: stale %t, want %t (policy %s)", name, fl.Dst, fl.Src, fl.ReplySrc, got, want, c.policy)
			}
		}
	}
}

// A member without a ClusterIP of the address's family is named in its FamilyMismatch; the
// other member is served, and the lb pod stays ready for it (not ready, no replica would take the
// address over: one tenant's Service would stop every member's failover). With no member of the
// family left, it is not ready.
func TestDesiredSharedFamilyMismatch(t *testing.T) {
	b := memberB
	b.ClusterIPs = addrs("fd96::20")
	alone := Desired(Config{Network: sharedNet, Services: []Service{b}}, sharedObs, Names{})
	if len(alone.Problems) != 1 || !alone.Problems[0].NotReady {
		t.Fatalf("the only member without the family: problems %+v, want one, not ready", alone.Problems)
	}
	st := Desired(Config{Network: sharedNet, Services: []Service{memberA, b}}, sharedObs, Names{})
	want := []Problem{{Reason: ReasonFamilyMismatch, Message: "LB address 172.18.0.18 is IPv4 but the Service default/b has no IPv4 ClusterIP (spec.clusterIPs [fd96::20]): nothing would be forwarded to it; give the Service that family (spec.ipFamilies, spec.ipFamilyPolicy) or use a Subnet of its family"}}
	if !reflect.DeepEqual(st.Problems, want) {
		t.Fatalf("problems %+v, want %+v", st.Problems, want)
	}
	checkLines(t, "iptables nat", lines(RenderIPTables(st, IPv4, "nat"))[5:8], []string{
		"-A LBSVC-PREROUTING -d 172.18.0.18/32 -i net1 -j LBSVC-SERVICES",
		"-A LBSVC-SERVICES -d 172.18.0.18/32 -p tcp -m tcp --dport 53 -j DNAT --to-destination 10.96.0.10:53",
		"-A LBSVC-POSTROUTING -d 10.96.0.10/32 -j MASQUERADE",
	})
	// The nftables table: only A's sets (one target with a ClusterIP keeps the plain names).
	if got := nftSetPorts(st.NFTables[0]); !reflect.DeepEqual(got, map[string][]uint16{"tcp_ports": {53}, "udp_ports": nil, "sctp_ports": nil}) {
		t.Fatalf("nft sets %v", got)
	}
}

// The port gate checks each member's TCP ports at that member's own ClusterIP.
func TestPortGateSharedChecksOwnClusterIP(t *testing.T) {
	g := NewPortGate(slog.New(slog.DiscardHandler))
	dialed := make(chan string, 4)
	g.dial = func(_ context.Context, addr string) error { dialed <- addr; return nil }
	woken := make(chan struct{}, 4)
	wake := func() { woken <- struct{}{} }
	a := Service{Name: "default/a", ClusterIPs: addrs("10.96.0.10"), Ports: []Port{{TCP, 80}}}
	b := Service{Name: "default/b", ClusterIPs: addrs("10.96.0.20"), Ports: []Port{{UDP, 53}}}
	out := g.filterAll(context.Background(), []Service{a}, wake)
	if !slices.Equal(out[0].Ports, a.Ports) {
		t.Fatalf("first apply: %v", out)
	}
	b.Ports = []Port{{UDP, 53}, {TCP, 81}}
	out = g.filterAll(context.Background(), []Service{a, b}, wake)
	if !slices.Equal(out[0].Ports, a.Ports) || !slices.Equal(out[1].Ports, []Port{{UDP, 53}}) {
		t.Fatalf("B joined with TCP 81: %v", out)
	}
	select {
	case got := <-dialed:
		if got != "10.96.0.20:81" {
			t.Fatalf("dialed %s, want B's ClusterIP", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no check within 5 s")
	}
	select {
	case <-woken:
	case <-time.After(5 * time.Second):
		t.Fatal("the loop was not woken within 5 s")
	}
	out = g.filterAll(context.Background(), []Service{a, b}, wake)
	if !slices.Equal(out[1].Ports, b.Ports) {
		t.Fatalf("after the check: %v", out)
	}
}

// Membership and source range changes in every order, on both back ends' models: each plan
// applies (no jump to a missing chain, no chain deleted while in use), converges (a second plan
// is empty), leaves no group or bucket chain behind, and a change of UDP targets or of the
// sources of a UDP port always forgets flows.
func TestPlanSharedTransitions(t *testing.T) {
	a := Service{Name: "default/a", ClusterIPs: addrs("10.96.0.10"), Ports: append([]Port{{UDP, 54}}, portRange(TCP, 1000, 70)...)}
	aNarrow := a
	aNarrow.SourceRanges = prefixes("172.18.0.100/32")
	b := memberB
	bNarrow := b
	bNarrow.SourceRanges = prefixes("172.18.0.0/24")
	c := Service{Name: "default/c", ClusterIPs: addrs("10.96.0.30"), Ports: portRange(TCP, 2000, 3)}
	configs := map[string][]Service{
		"none": nil, "a": {a}, "b": {b}, "a+b": {a, b}, "a narrow+b": {aNarrow, b}, "a narrow+b narrow": {aNarrow, bNarrow},
		"a+b narrow+c": {a, bNarrow, c}, "b narrow+c": {bNarrow, c}, "a narrow": {aNarrow},
	}
	for from, fromSvcs := range configs {
		for to, toSvcs := range configs {
			have := Desired(Config{Network: sharedNet, Services: fromSvcs}, sharedObs, Names{})
			want := Desired(Config{Network: sharedNet, Services: toSvcs}, sharedObs, Names{})

			// iptables
			saved := Saved{"nat": {"PREROUTING": nil, "POSTROUTING": nil}, "filter": {"INPUT": nil, "FORWARD": nil}}
			for _, st := range []State{have, want} {
				p := PlanRestore(saved, st.IPTables[0], "iptables")
				for _, table := range p.Tables {
					if err := modelRestore(saved, p.Payloads[table]); err != nil {
						t.Fatalf("%s -> %s: %v\n%s", from, to, err, p.Payloads[table])
					}
				}
				if st.IPTables[0].Flows.String() != have.IPTables[0].Flows.String() && !p.FlowsChanged {
					t.Errorf("%s -> %s: flows %s -> %s but FlowsChanged is false", from, to, have.IPTables[0].Flows, st.IPTables[0].Flows)
				}
			}
			if again := PlanRestore(saved, want.IPTables[0], "iptables"); len(again.Changes) > 0 {
				t.Errorf("%s -> %s: iptables not converged: %v", from, to, again.Changes)
			}
			for name := range saved["nat"] {
				if strings.HasPrefix(name, ChainServices+"-") && chainOf(want.IPTables[0], name).Name == "" {
					t.Errorf("%s -> %s: chain %s left", from, to, name)
				}
			}

			// nftables
			k := ApplyNFT(NFTKernel{}, PlanNFT(NFTKernel{}, have.NFTables[0]).Steps)
			p := PlanNFT(k, want.NFTables[0])
			if have.NFTables[0].Flows.String() != want.NFTables[0].Flows.String() && !p.FlowsChanged {
				t.Errorf("%s -> %s: nft flows %s -> %s but FlowsChanged is false", from, to, have.NFTables[0].Flows, want.NFTables[0].Flows)
			}
			k = ApplyNFT(k, p.Steps)
			if again := PlanNFT(k, want.NFTables[0]); len(again.Steps) > 0 {
				t.Errorf("%s -> %s: nftables not converged: %v", from, to, stepStrings(again.Steps))
			}
		}
	}
}
