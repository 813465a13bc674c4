package lbpod

import (
	"fmt"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
)

func tcp(ports ...int32) []Port {
	var out []Port
	for _, p := range ports {
		out = append(out, Port{Protocol: TCP, Port: p})
	}
	return out
}

func portRange(proto Protocol, first, n int32) []Port {
	var out []Port
	for i := range n {
		out = append(out, Port{Protocol: proto, Port: first + i})
	}
	return out
}

// bucketTables is the IPv4 tables of the test Service with these ports.
func bucketTables(ports []Port) Tables {
	return desiredTables(IPv4, "net1", "eth0", netip.MustParseAddr("192.0.2.10"), oneTarget(netip.MustParseAddr("10.96.0.10"), true, ports, nil))
}

func chainNames(t Tables) []string {
	var names []string
	for _, c := range t.Chains {
		names = append(names, c.Name)
	}
	return names
}

func chainOf(t Tables, name string) Chain {
	for _, c := range t.Chains {
		if c.Name == name {
			return c
		}
	}
	return Chain{}
}

func TestBucketRules(t *testing.T) {
	dnat := func(proto string, port int) string {
		return fmt.Sprintf("-d 192.0.2.10/32 -p %s -m %s --dport %d -j DNAT --to-destination 10.96.0.10:%d", proto, proto, port, port)
	}
	join := func(c Chain) []string {
		var out []string
		for _, r := range c.Rules {
			out = append(out, strings.Join(r, " "))
		}
		return out
	}
	tests := map[string]struct {
		ports []Port
		// services is LBSVC-SERVICES; buckets maps each bucket chain to its first rule.
		services []string
		buckets  map[string]string
		chains   []string
	}{
		"64 rules stay flat, in the Service's order": {
			ports: append(tcp(443, 80), portRange(TCP, 1000, 62)...),
			services: append([]string{dnat("tcp", 443), dnat("tcp", 80)}, func() []string {
				var s []string
				for p := 1000; p < 1062; p++ {
					s = append(s, dnat("tcp", p))
				}
				return s
			}()...),
			chains: []string{ChainPrerouting, ChainServices, ChainPostrouting, ChainInput, ChainForward},
		},
		"65 rules: buckets by protocol then range, bucket 0 is 0:63": {
			ports: append(append(portRange(UDP, 60, 10), portRange(TCP, 5000, 54)...), Port{Protocol: SCTP, Port: 3868}),
			services: []string{
				"-p tcp -m tcp --dport 4992:5055 -j LBSVC-SERVICES-TCP-78",
				"-p udp -m udp --dport 0:63 -j LBSVC-SERVICES-UDP-0",
				"-p udp -m udp --dport 64:127 -j LBSVC-SERVICES-UDP-1",
				"-p sctp -m sctp --dport 3840:3903 -j LBSVC-SERVICES-SCTP-60",
			},
			buckets: map[string]string{
				"LBSVC-SERVICES-TCP-78":  dnat("tcp", 5000),
				"LBSVC-SERVICES-UDP-0":   dnat("udp", 60),
				"LBSVC-SERVICES-UDP-1":   dnat("udp", 64),
				"LBSVC-SERVICES-SCTP-60": dnat("sctp", 3868),
			},
			chains: []string{"LBSVC-SERVICES-TCP-78", "LBSVC-SERVICES-UDP-0", "LBSVC-SERVICES-UDP-1", "LBSVC-SERVICES-SCTP-60",
				ChainPrerouting, ChainServices, ChainPostrouting, ChainInput, ChainForward},
		},
		"the top bucket ends at 65535": {
			ports:    portRange(TCP, 65471, 65),
			services: []string{"-p tcp -m tcp --dport 65408:65471 -j LBSVC-SERVICES-TCP-1022", "-p tcp -m tcp --dport 65472:65535 -j LBSVC-SERVICES-TCP-1023"},
			buckets:  map[string]string{"LBSVC-SERVICES-TCP-1022": dnat("tcp", 65471), "LBSVC-SERVICES-TCP-1023": dnat("tcp", 65472)},
			chains: []string{"LBSVC-SERVICES-TCP-1022", "LBSVC-SERVICES-TCP-1023",
				ChainPrerouting, ChainServices, ChainPostrouting, ChainInput, ChainForward},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			tb := bucketTables(tc.ports)
			if got := join(chainOf(tb, ChainServices)); !reflect.DeepEqual(got, tc.services) {
				t.Errorf("LBSVC-SERVICES:\n got %q\nwant %q", got, tc.services)
			}
			if got := chainNames(tb); !reflect.DeepEqual(got, tc.chains) {
				t.Errorf("chains:\n got %q\nwant %q", got, tc.chains)
			}
			for chain, first := range tc.buckets {
				if got := join(chainOf(tb, chain)); len(got) == 0 || got[0] != first {
					t.Errorf("%s starts with %q, want %q", chain, got, first)
				}
			}
		})
	}
}

// FuzzPlanRestoreBuckets: from any layout of our chains (flat or in buckets, left by an
// earlier Service), one PlanRestore transaction, run by a model of iptables-restore --noflush,
// gives exactly the wanted chains, deletes the stale buckets, never jumps to a missing chain,
// and planning again finds nothing. What it says it wrote covers every chain that changed, and
// a change it calls TCP-only leaves the UDP and SCTP translation as it was.
func FuzzPlanRestoreBuckets(f *testing.F) {
	f.Add([]byte{0, 150, 3, 100}, []byte{0, 150})             // TCP buckets, some emptied
	f.Add([]byte{0, 150, 4, 100}, []byte{0, 10})              // buckets with UDP, back to flat
	f.Add([]byte{0, 10}, []byte{0, 199, 5, 3, 4, 4})          // flat to buckets of all protocols
	f.Add([]byte{0, 199, 5, 80}, []byte{0, 198, 5, 80, 6, 1}) // one port moved
	f.Fuzz(func(t *testing.T, before, after []byte) {
		have, want := bucketTables(fuzzPorts(before)), bucketTables(fuzzPorts(after))
		saved := Saved{"nat": {"PREROUTING": nil, "POSTROUTING": nil}, "filter": {"INPUT": nil, "FORWARD": nil}}
		if p := PlanRestore(saved, have, "iptables"); len(p.Tables) > 0 {
			for _, table := range p.Tables {
				if err := modelRestore(saved, p.Payloads[table]); err != nil {
					t.Fatalf("from scratch: %v\n%s", err, p.Payloads[table])
				}
			}
		}
		old := cloneSaved(saved)
		p := PlanRestore(saved, want, "iptables")
		for _, table := range p.Tables {
			if err := modelRestore(saved, p.Payloads[table]); err != nil {
				t.Fatalf("change: %v\n%s", err, p.Payloads[table])
			}
		}
		for _, c := range want.Chains {
			var specs []string
			for _, r := range c.Rules {
				specs = append(specs, strings.Join(r, " "))
			}
			if got := saved[c.Table][c.Name]; !slices.Equal(got, specs) {
				t.Fatalf("%s after the change:\n got %q\nwant %q", c.Name, got, specs)
			}
		}
		for name := range saved["nat"] {
			if strings.HasPrefix(name, ChainServices+"-") && len(chainOf(want, name).Name) == 0 {
				t.Fatalf("stale bucket %s left", name)
			}
		}
		if again := PlanRestore(saved, want, "iptables"); len(again.Changes) > 0 {
			t.Fatalf("not converged: %v", again.Changes)
		}
		written := map[ChainRef]bool{}
		for _, c := range p.Written {
			written[c] = true
		}
		for table, chains := range saved {
			for name, rules := range chains {
				before, existed := old[table][name]
				if (!existed || !slices.Equal(before, rules)) && !written[ChainRef{table, name}] && !p.Whole {
					t.Fatalf("%s changed but is not in Written %v", name, p.Written)
				}
			}
		}
		if !p.FlowsChanged && !maps.Equal(have.Flows.Targets, want.Flows.Targets) {
			t.Fatalf("UDP/SCTP targets changed (%v -> %v) but FlowsChanged is false", have.Flows, want.Flows)
		}
	})
}

// fuzzPorts turns bytes into Service ports: pairs of (kind, n), kind picking a protocol and a
// place, n the number of consecutive ports (so that many ports fit in a few bytes).
func fuzzPorts(b []byte) []Port {
	var out []Port
	for i := 0; i+1 < len(b); i += 2 {
		proto := []Protocol{TCP, UDP, SCTP}[int(b[i])%3]
		first := int32(b[i])/3*211 + 1
		out = append(out, portRange(proto, first, int32(b[i+1])%200)...)
	}
	return uniquePorts(out)
}

func cloneSaved(s Saved) Saved {
	out := Saved{}
	for table, chains := range s {
		out[table] = map[string][]string{}
		for name, rules := range chains {
			out[table][name] = slices.Clone(rules)
		}
	}
	return out
}

// modelRestore applies one table's payload as iptables-restore --noflush does, all or nothing:
// a declared chain is created or emptied, -A appends, -I <chain> 1 inserts first, -D deletes
// the first equal rule (an error when there is none), -F empties, -X deletes an empty chain no
// rule jumps to; a rule jumping to a chain that does not exist is an error.
func modelRestore(saved Saved, payload string) error {
	lines := strings.Split(strings.TrimSpace(payload), "\n")
	if len(lines) < 2 || !strings.HasPrefix(lines[0], "*") || lines[len(lines)-1] != "COMMIT" {
		return fmt.Errorf("not one table's transaction: %q", payload)
	}
	table := lines[0][1:]
	work := cloneSaved(Saved{table: saved[table]})[table]
	if work == nil {
		work = map[string][]string{}
	}
	for _, line := range lines[1 : len(lines)-1] {
		f := strings.Fields(line)
		switch {
		case strings.HasPrefix(line, ":"):
			work[f[0][1:]] = nil
		case len(f) >= 2 && (f[0] == "-A" || f[0] == "-D" || f[0] == "-I" || f[0] == "-F" || f[0] == "-X"):
			chain := f[1]
			rules, ok := work[chain]
			if !ok && chain != "PREROUTING" && chain != "POSTROUTING" && chain != "INPUT" && chain != "FORWARD" {
				return fmt.Errorf("%q: no chain %s", line, chain)
			}
			spec := strings.Join(f[2:], " ")
			switch f[0] {
			case "-A":
				work[chain] = append(rules, spec)
			case "-I":
				spec = strings.Join(f[3:], " ")
				work[chain] = append([]string{spec}, rules...)
			case "-D":
				i := slices.Index(rules, spec)
				if i < 0 {
					return fmt.Errorf("%q: no such rule", line)
				}
				work[chain] = slices.Delete(slices.Clone(rules), i, i+1)
			case "-F":
				work[chain] = nil
			case "-X":
				if len(rules) > 0 {
					return fmt.Errorf("%q: chain not empty", line)
				}
				delete(work, chain)
			}
		default:
			return fmt.Errorf("unknown line %q", line)
		}
	}
	for chain, rules := range work {
		for _, r := range rules {
			_, target, _ := strings.Cut(r, "-j ")
			target, _, _ = strings.Cut(target, " ")
			if strings.HasPrefix(target, "LBSVC-") {
				if _, ok := work[target]; !ok {
					return fmt.Errorf("%s jumps to missing chain %s", chain, target)
				}
			}
		}
	}
	saved[table] = work
	return nil
}

func TestParseChain(t *testing.T) {
	got, err := ParseChain("LBSVC-X", "-N LBSVC-X\n-A LBSVC-X -p tcp -j RETURN\n-A LBSVC-X -j DROP\n")
	if err != nil || !reflect.DeepEqual(got, []string{"-p tcp -j RETURN", "-j DROP"}) {
		t.Fatalf("ParseChain = %q, %v", got, err)
	}
	if got, err := ParseChain("LBSVC-X", "-N LBSVC-X\n"); err != nil || got != nil {
		t.Fatalf("empty chain: %q, %v", got, err)
	}
	if _, err := ParseChain("LBSVC-X", "-N LBSVC-X\n-A LBSVC-Y -j DROP\n"); err == nil || !strings.Contains(err.Error(), "line 2: not a rule of that chain") {
		t.Fatalf("another chain's rule: err = %v", err)
	}
}

// TestPlanRestoreBuckets: one port changed among 1000 touches only its buckets and the
// dispatch, patched; TCP only, so no conntrack walk; back to a flat chain deletes the buckets.
func TestPlanRestoreBuckets(t *testing.T) {
	before := bucketTables(portRange(TCP, 10000, 1000))
	saved := Saved{"nat": {"PREROUTING": nil, "POSTROUTING": nil}, "filter": {"INPUT": nil, "FORWARD": nil}}
	for _, table := range PlanRestore(saved, before, "iptables").Tables {
		if err := modelRestore(saved, PlanRestore(saved, before, "iptables").Payloads[table]); err != nil {
			t.Fatal(err)
		}
	}
	after := bucketTables(append(portRange(TCP, 10000, 999), Port{Protocol: TCP, Port: 20000}))
	p := PlanRestore(saved, after, "iptables")
	wantPayload := "*nat\n:LBSVC-SERVICES-TCP-312 - [0:0]\n" +
		"-D LBSVC-SERVICES-TCP-171 -d 192.0.2.10/32 -p tcp -m tcp --dport 10999 -j DNAT --to-destination 10.96.0.10:10999\n" +
		"-A LBSVC-SERVICES-TCP-312 -d 192.0.2.10/32 -p tcp -m tcp --dport 20000 -j DNAT --to-destination 10.96.0.10:20000\n" +
		"-A LBSVC-SERVICES -p tcp -m tcp --dport 19968:20031 -j LBSVC-SERVICES-TCP-312\nCOMMIT\n"
	if p.Payloads["nat"] != wantPayload || len(p.Tables) != 1 {
		t.Fatalf("payloads:\n got %q\nwant %q", p.Payloads, wantPayload)
	}
	wantWritten := []ChainRef{{"nat", "LBSVC-SERVICES-TCP-171"}, {"nat", "LBSVC-SERVICES-TCP-312"}, {"nat", ChainServices}}
	if !reflect.DeepEqual(p.Written, wantWritten) || p.Whole || p.FlowsChanged {
		t.Fatalf("Written %v Whole %t FlowsChanged %t, want %v false false", p.Written, p.Whole, p.FlowsChanged, wantWritten)
	}

	flat := bucketTables(append(tcp(80), Port{Protocol: UDP, Port: 53}))
	p = PlanRestore(saved, flat, "iptables")
	if !p.Whole || !p.FlowsChanged {
		t.Fatalf("back to flat: Whole %t FlowsChanged %t, want both (buckets deleted, a UDP rule added)", p.Whole, p.FlowsChanged)
	}
	if err := modelRestore(saved, p.Payloads["nat"]); err != nil {
		t.Fatal(err)
	}
	for name := range saved["nat"] {
		if strings.HasPrefix(name, ChainServices+"-") {
			t.Fatalf("bucket %s left after going back to a flat chain", name)
		}
	}
}

func TestVerifyReads(t *testing.T) {
	nat := func(names ...string) []ChainRef {
		var out []ChainRef
		for _, n := range names {
			out = append(out, ChainRef{"nat", n})
		}
		return out
	}
	ops := []Op{
		RestoreOp{Family: IPv4, Chains: nat("A", "B", "C")},
		RestoreOp{Family: IPv6, Chains: nat("A"), Whole: true},
		ForgetFlowsOp{Family: IPv4},
	}
	whole, chains := VerifyReads(ops, 4)
	if !reflect.DeepEqual(whole, map[Family]bool{IPv6: true}) || !reflect.DeepEqual(chains, map[Family][]ChainRef{IPv4: nat("A", "B", "C")}) {
		t.Fatalf("max 4: whole %v chains %v", whole, chains)
	}
	whole, chains = VerifyReads(ops, 2)
	if !reflect.DeepEqual(whole, map[Family]bool{IPv4: true, IPv6: true}) || len(chains) != 0 {
		t.Fatalf("max 2: whole %v chains %v", whole, chains)
	}
	if whole, chains := VerifyReads([]Op{LinkUpOp{Name: "net1"}}, 4); len(whole)+len(chains) != 0 {
		t.Fatalf("no restore: whole %v chains %v", whole, chains)
	}
}

func TestParallelRestores(t *testing.T) {
	v4, v6 := RestoreOp{Family: IPv4}, RestoreOp{Family: IPv6}
	tests := []struct {
		ops  []Op
		want int
	}{
		{nil, 0},
		{[]Op{v4}, 1},
		{[]Op{v4, v6, ForgetFlowsOp{}}, 2},
		{[]Op{v4, v4}, 1},
		{[]Op{LinkUpOp{}, v4}, 0},
	}
	for _, tc := range tests {
		if got := parallelRestores(tc.ops); got != tc.want {
			t.Errorf("parallelRestores(%v) = %d, want %d", tc.ops, got, tc.want)
		}
	}
}

// oneTarget is the family's view of a single Service (what desiredTables and desiredNFT took
// before shared addresses): its ClusterIP when has, its ports without repeats, its ranges.
func oneTarget(clusterIP netip.Addr, has bool, ports []Port, ranges []netip.Prefix) []target {
	if !has {
		clusterIP = netip.Addr{}
	}
	return []target{{clusterIP: clusterIP, ports: uniquePorts(ports), ranges: ranges}}
}
