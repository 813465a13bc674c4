package lbpod

import (
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// FuzzSharedDesired holds the member → rules merge against any members (up to 4, each with up to
// 8 ports of TCP/UDP/SCTP from a small range so that they clash, a ClusterIP or none, everyone or
// one source range): in the iptables rules every (protocol, port) some member has is DNATed
// exactly once, to the ClusterIP of the first member by name that has it and a ClusterIP, and no
// other port is; a PortClash problem is reported exactly when two members have one port; in the
// nftables table each member's port sets hold exactly the ports it is given. Desired is pure: the
// same input gives the same state.
func FuzzSharedDesired(f *testing.F) {
	f.Add([]byte{0, 1, 53, 1, 1, 53})
	f.Add([]byte{0, 0, 53, 0, 0, 53, 2, 2, 60, 3, 1, 200})
	f.Add([]byte{7, 0, 1, 7, 1, 1, 7, 2, 1, 5, 0, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		members := map[int]*Service{}
		for i := 0; i+2 < len(data) && i < 3*32; i += 3 {
			m := int(data[i]) % 4
			s := members[m]
			if s == nil {
				s = &Service{Name: fmt.Sprintf("default/m%d", m)}
				if data[i]&0x10 == 0 {
					s.ClusterIPs = addrs(fmt.Sprintf("10.96.0.%d", 10+m))
				}
				if data[i]&0x20 != 0 {
					s.SourceRanges = prefixes(fmt.Sprintf("172.18.%d.0/24", m))
				}
				members[m] = s
			}
			if len(s.Ports) < 8 {
				s.Ports = append(s.Ports, Port{[]Protocol{TCP, UDP, SCTP}[int(data[i+1])%3], int32(data[i+2])%16 + 50})
			}
		}
		var svcs []Service
		for m := 3; m >= 0; m-- { // given out of order on purpose: the first by name wins, not by position
			if s := members[m]; s != nil {
				svcs = append(svcs, *s)
			}
		}
		cfg := Config{Network: sharedNet, Services: svcs}
		st := Desired(cfg, sharedObs, Names{})
		if again := Desired(cfg, sharedObs, Names{}); !reflect.DeepEqual(again, st) {
			t.Fatal("Desired is not deterministic")
		}

		// What each (protocol, port) should go to: the first member by name that has it.
		sorted := slices.Clone(svcs)
		slices.SortFunc(sorted, func(a, b Service) int { return strings.Compare(a.Name, b.Name) })
		owner := map[Port]Service{}
		clash := false
		for _, s := range sorted {
			seen := map[Port]bool{}
			for _, p := range s.Ports {
				if seen[p] {
					continue
				}
				seen[p] = true
				if _, taken := owner[p]; taken {
					clash = true
					continue
				}
				owner[p] = s
			}
		}
		hasClash := slices.ContainsFunc(st.Problems, func(p Problem) bool { return p.Reason == ReasonPortClash })
		if hasClash != clash {
			t.Fatalf("PortClash reported %v, want %v (members %+v, problems %+v)", hasClash, clash, svcs, st.Problems)
		}

		// iptables: each DNAT rule, wherever it is (flat, grouped by sources, bucketed).
		got := map[Port][]string{}
		for _, c := range st.IPTables[0].Chains {
			for _, r := range c.Rules {
				if k := slices.Index(r, "-j"); k < 0 || k+1 >= len(r) || r[k+1] != "DNAT" {
					continue
				}
				i, j := slices.Index(r, "-p"), slices.Index(r, "--dport")
				to := slices.Index(r, "--to-destination")
				if i < 0 || j < 0 || to < 0 {
					t.Fatalf("DNAT rule %v", r)
				}
				n, err := strconv.Atoi(r[j+1])
				if err != nil {
					t.Fatalf("DNAT rule %v: %v", r, err)
				}
				p := Port{Protocol(strings.ToUpper(r[i+1])), int32(n)}
				got[p] = append(got[p], r[to+1])
			}
		}
		for p, s := range owner {
			var want []string
			if len(s.ClusterIPs) > 0 {
				want = []string{netip.AddrPortFrom(s.ClusterIPs[0], uint16(p.Port)).String()}
			}
			if !slices.Equal(got[p], want) {
				t.Fatalf("%s/%d: DNAT to %v, want %v (members %+v)", p.Protocol, p.Port, got[p], want, svcs)
			}
		}
		for p, to := range got {
			if _, ok := owner[p]; !ok {
				t.Fatalf("%s/%d DNATed to %v, but no member has it", p.Protocol, p.Port, to)
			}
		}

		// nftables: the ports in all port sets, together, are exactly the owned ports with a
		// ClusterIP, each once.
		count := map[Port]int{}
		for _, set := range st.NFTables[0].Sets {
			proto, _, ok := strings.Cut(set.Name, "_ports")
			if !ok {
				continue
			}
			for _, port := range set.Ports {
				count[Port{Protocol(strings.ToUpper(proto)), int32(port)}]++
			}
		}
		for p, s := range owner {
			want := 0
			if len(s.ClusterIPs) > 0 {
				want = 1
			}
			if count[p] != want {
				t.Fatalf("nftables: %s/%d in %d port sets, want %d (members %+v)", p.Protocol, p.Port, count[p], want, svcs)
			}
		}
		for p, n := range count {
			if _, ok := owner[p]; !ok {
				t.Fatalf("nftables: %s/%d in %d port sets, but no member has it", p.Protocol, p.Port, n)
			}
		}
	})
}
