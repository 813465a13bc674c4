package lbpod

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

// nftSeed is the seed's Service for the nftables back end: one TCP port, IPv4.
func nftSeed(ports []Port, ranges []netip.Prefix) NFTable {
	return desiredNFT(IPv4, "net1", "eth0", netip.MustParseAddr("172.18.0.18"), oneTarget(netip.MustParseAddr("10.109.201.193"), true, ports, ranges))
}

func stepStrings(steps []NFTStep) []string {
	var out []string
	for _, s := range steps {
		out = append(out, s.String())
	}
	return out
}

// From nothing, the whole table goes in one batch, in the order the kernel needs (sets and
// chains before the rules that use them); the steps read as the nft commands they stand for.
func TestPlanNFTFromScratch(t *testing.T) {
	p := PlanNFT(NFTKernel{}, nftSeed([]Port{{TCP, 80}, {UDP, 53}}, nil))
	want := []string{
		"add table ip lbsvc",
		"add set ip lbsvc tcp_ports { type inet_service; elements = { 80 } }",
		"add set ip lbsvc udp_ports { type inet_service; elements = { 53 } }",
		"add set ip lbsvc sctp_ports { type inet_service; }",
		"add chain ip lbsvc prerouting { type nat hook prerouting priority -100; }",
		"add chain ip lbsvc services",
		"add chain ip lbsvc postrouting { type nat hook postrouting priority 100; }",
		"add chain ip lbsvc input { type filter hook input priority 0; }",
		"add chain ip lbsvc forward { type filter hook forward priority 0; }",
		"add rule ip lbsvc prerouting iifname \"net1\" ip daddr 172.18.0.18 jump services",
		"add rule ip lbsvc services meta l4proto tcp th dport @tcp_ports dnat ip to 10.109.201.193",
		"add rule ip lbsvc services meta l4proto udp th dport @udp_ports dnat ip to 10.109.201.193",
		"add rule ip lbsvc services meta l4proto sctp th dport @sctp_ports dnat ip to 10.109.201.193",
		"add rule ip lbsvc postrouting ip daddr 10.109.201.193 masquerade",
		"add rule ip lbsvc input ip daddr 172.18.0.18 meta l4proto tcp reject with tcp reset",
		"add rule ip lbsvc input ip daddr 172.18.0.18 meta l4proto udp reject with icmp port-unreachable",
		"add rule ip lbsvc input ip daddr 172.18.0.18 meta l4proto sctp reject with icmp port-unreachable",
		`add rule ip lbsvc input iifname "net1" ip daddr != 172.18.0.18 drop`,
		`add rule ip lbsvc forward iifname "net1" ct status & dnat != 0 accept`,
		`add rule ip lbsvc forward iifname "net1" drop`,
		`add rule ip lbsvc forward iifname "eth0" oifname "net1" ct status & dnat != 0 accept`,
		`add rule ip lbsvc forward iifname "eth0" oifname "net1" drop`,
	}
	if got := stepStrings(p.Steps); !slices.Equal(got, want) {
		t.Fatalf("steps:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if !p.Whole || !p.FlowsChanged || len(p.Changes) != 1 || p.Changes[0].String() != "+nftables table ip lbsvc" {
		t.Fatalf("whole %t, flows %t, changes %v", p.Whole, p.FlowsChanged, p.Changes)
	}
}

// Exact plans for the changes that matter: a port change is element steps only (UDP ones
// forget flows, TCP ones do not), a source range change refills prerouting, drift of the
// table's shape rebuilds it in the same batch.
func TestPlanNFTChanges(t *testing.T) {
	base := []Port{{TCP, 80}, {TCP, 443}, {UDP, 53}}
	installed := ApplyNFT(NFTKernel{}, PlanNFT(NFTKernel{}, nftSeed(base, nil)).Steps)
	extraChain := cloneNFTKernel(installed)
	extraChain.Chains["other"] = NFTKernelChain{Spec: "regular"}
	otherHook := cloneNFTKernel(installed)
	otherHook.Chains[NFTChainInput] = NFTKernelChain{Spec: "type filter hook input priority 0 policy drop"}
	// Made dormant by hand (nft add table ip lbsvc '{ flags dormant; }'): every chain and set as
	// wanted, but no base chain hooked, so nothing is DNATed, rejected or dropped.
	dormant := cloneNFTKernel(installed)
	dormant.Flags = 1
	for name, c := range map[string]struct {
		have      NFTKernel
		want      NFTable
		steps     []string
		whole     bool
		sets      []string
		forgetUDP bool
	}{
		"nothing to do": {have: installed, want: nftSeed(base, nil)},
		"tcp port swapped": {have: installed, want: nftSeed([]Port{{TCP, 80}, {TCP, 8443}, {UDP, 53}}, nil),
			steps: []string{"delete element ip lbsvc tcp_ports { 443 }", "add element ip lbsvc tcp_ports { 8443 }"}, sets: []string{"tcp_ports"}},
		"udp port removed": {have: installed, want: nftSeed([]Port{{TCP, 80}, {TCP, 443}}, nil),
			steps: []string{"delete element ip lbsvc udp_ports { 53 }"}, sets: []string{"udp_ports"}, forgetUDP: true},
		"source range given": {have: installed, want: nftSeed(base, []netip.Prefix{netip.MustParsePrefix("172.18.0.0/24"), netip.MustParsePrefix("fd00::/8")}),
			steps: []string{"flush chain ip lbsvc prerouting", "add rule ip lbsvc prerouting iifname \"net1\" ip saddr 172.18.0.0/24 ip daddr 172.18.0.18 jump services"}, whole: true, forgetUDP: true},
		"extra chain":   {have: extraChain, want: nftSeed(base, nil), whole: true, forgetUDP: true},
		"hook changed":  {have: otherHook, want: nftSeed(base, nil), whole: true, forgetUDP: true},
		"table dormant": {have: dormant, want: nftSeed(base, nil), whole: true, forgetUDP: true},
	} {
		t.Run(name, func(t *testing.T) {
			p := PlanNFT(c.have, c.want)
			got := stepStrings(p.Steps)
			if c.whole && c.steps == nil {
				// A rebuild: delete the table, then everything from scratch.
				c.steps = append([]string{"delete table ip lbsvc"}, stepStrings(PlanNFT(NFTKernel{}, c.want).Steps)...)
			}
			if !slices.Equal(got, c.steps) || p.Whole != c.whole || !slices.Equal(p.ChangedSets, c.sets) || p.FlowsChanged != c.forgetUDP {
				t.Fatalf("got steps %q whole %t sets %v flows %t\nwant steps %q whole %t sets %v flows %t", got, p.Whole, p.ChangedSets, p.FlowsChanged, c.steps, c.whole, c.sets, c.forgetUDP)
			}
		})
	}
}

// PlanSync puts every family's nftables steps in one batch (one transaction), before the
// addresses, and forgets UDP flows after it; the iptables rules are left out by ForRules.
func TestPlanSyncNFTablesOneBatch(t *testing.T) {
	cfg := Config{
		Network: Network{
			Addresses: []netip.Prefix{netip.MustParsePrefix("172.18.0.18/16"), netip.MustParsePrefix("fd18::18/64")},
			Gateways:  []netip.Addr{netip.MustParseAddr("172.18.0.1"), netip.MustParseAddr("fd18::1")},
			Subnets:   []netip.Prefix{netip.MustParsePrefix("172.18.0.0/16"), netip.MustParsePrefix("fd18::/64")},
		},
		Services: []Service{{ClusterIPs: []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fd96::1")}, Ports: []Port{{UDP, 53}}}},
	}
	st := Desired(cfg, Observed{}, Names{}).ForRules(RulesNFTables)
	if len(st.IPTables) != 0 || len(st.NFTables) != 2 {
		t.Fatalf("ForRules kept %d iptables and %d nftables tables", len(st.IPTables), len(st.NFTables))
	}
	k := Kernel{Link: Link{Name: "net1", Exists: true, Up: true}, Indexes: map[string]int{"net1": 2, "eth0": 3},
		NFTables: map[Family]NFTKernel{IPv4: {}, IPv6: {}}}
	p, err := PlanSync(k, st)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, op := range p.Ops {
		kinds = append(kinds, fmt.Sprintf("%T", op))
	}
	if kinds[0] != "lbpod.NFTablesOp" || kinds[1] != "lbpod.ForgetFlowsOp" || kinds[2] != "lbpod.ForgetFlowsOp" || slices.Contains(kinds[1:], "lbpod.NFTablesOp") {
		t.Fatalf("ops %v", kinds)
	}
	batch := p.Ops[0].(NFTablesOp)
	if !batch.Whole[IPv4] || !batch.Whole[IPv6] || batch.Steps[0].String() != "add table ip lbsvc" {
		t.Fatalf("batch %v", batch)
	}
	if _, err := PlanSync(Kernel{Link: k.Link, Indexes: k.Indexes}, st); err == nil || err.Error() != "no IPv4 nftables table was read" {
		t.Fatalf("no table read: %v", err)
	}
}

// fuzzNFT builds a wanted table from fuzz bytes: ports of the three protocols, maybe source
// ranges, maybe no ClusterIP, maybe a guard table.
func fuzzNFT(data []byte) NFTable {
	next := func() byte {
		if len(data) == 0 {
			return 0
		}
		b := data[0]
		data = data[1:]
		return b
	}
	mode := next()
	if mode%7 == 0 {
		return guardNFT(IPv4, "net1", "eth0")
	}
	var ports []Port
	for n := int(next() % 24); n > 0; n-- {
		ports = append(ports, Port{[]Protocol{TCP, UDP, SCTP}[next()%3], int32(next() % 16)})
	}
	var ranges []netip.Prefix
	for n := int(mode % 4); n > 1; n-- {
		ranges = append(ranges, netip.PrefixFrom(netip.AddrFrom4([4]byte{172, 18, next(), 0}), int(8+next()%25)).Masked())
	}
	return desiredNFT(IPv4, "net1", "eth0", netip.MustParseAddr("172.18.0.18"), oneTarget(netip.MustParseAddr("10.0.0.1"), mode%5 != 0, ports, ranges))
}

// FuzzPlanNFT: from a table left by any other wanted table, with drift (an element, a rule, a
// chain or a set gone, or the table gone), the plan applied to the model gives the wanted
// table, and planning again finds nothing.
func FuzzPlanNFT(f *testing.F) {
	f.Add([]byte{1, 3, 0, 80, 1, 53, 2, 9}, []byte{1, 2, 0, 81, 0, 80}, uint8(0))
	f.Add([]byte{3, 1, 0, 1, 7, 20}, []byte{7}, uint8(3))
	f.Add([]byte{5}, []byte{2, 1, 1, 4, 9, 10}, uint8(5))
	f.Fuzz(func(t *testing.T, before, after []byte, drift uint8) {
		have := ApplyNFT(NFTKernel{}, PlanNFT(NFTKernel{}, fuzzNFT(before)).Steps)
		switch drift % 6 {
		case 1:
			for name, s := range have.Sets {
				if len(s.Ports) > 0 {
					s.Ports = s.Ports[1:]
					have.Sets[name] = s
					break
				}
			}
		case 2:
			for name, c := range have.Chains {
				if len(c.Rules) > 0 {
					c.Rules = c.Rules[:len(c.Rules)-1]
					have.Chains[name] = c
					break
				}
			}
		case 3:
			delete(have.Chains, NFTChainInput)
		case 4:
			delete(have.Sets, "udp_ports")
		case 5:
			have = NFTKernel{}
		}
		want := fuzzNFT(after)
		p := PlanNFT(have, want)
		got := ApplyNFT(have, p.Steps)
		if again := PlanNFT(got, want); len(again.Steps) > 0 {
			t.Fatalf("not converged after %q: still %q", stepStrings(p.Steps), stepStrings(again.Steps))
		}
		fromScratch := ApplyNFT(NFTKernel{}, PlanNFT(NFTKernel{}, want).Steps)
		if fmt.Sprint(got) != fmt.Sprint(fromScratch) {
			t.Fatalf("model after the plan %v, from scratch %v", got, fromScratch)
		}
		if len(p.Steps) == 0 && len(p.Changes) != 0 || len(p.Steps) > 0 && len(p.Changes) == 0 {
			t.Fatalf("steps %q but changes %v", stepStrings(p.Steps), p.Changes)
		}
	})
}
