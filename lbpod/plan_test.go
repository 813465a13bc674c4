package lbpod

import (
	"net"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// seedState is the seed's desired state (LB 172.18.0.18/16, ClusterIP 10.109.201.193, TCP 80).
func seedState(t *testing.T) State {
	return Desired(Config{
		Network:  mustNetwork(t, "172.18.0.18/16", "172.18.0.1", "172.18.0.0/16"),
		Services: []Service{{ClusterIPs: addrs("10.109.201.193"), Ports: []Port{{TCP, 80}, {UDP, 53}}}},
	}, Observed{UplinkGateways: map[Family]Gateway{IPv4: {Addr: netip.MustParseAddr("10.16.0.1")}}}, Names{}).ForRules(RulesIPTables)
}

// converged is what the kernel reads back once st is applied (net1 is index 2, eth0 index 3).
func converged(t *testing.T, st State) Kernel {
	t.Helper()
	k := Kernel{
		Link:    Link{Name: "net1", Exists: true, Up: true, Addresses: st.Addresses},
		Indexes: map[string]int{"net1": 2, "eth0": 3},
		IPTables: map[Family]Saved{IPv4: mustSave(t, "*nat\n:PREROUTING ACCEPT\n:POSTROUTING ACCEPT\nCOMMIT\n*filter\n:INPUT ACCEPT\n:FORWARD ACCEPT\nCOMMIT\n"),
			IPv6: mustSave(t, "*filter\n:INPUT ACCEPT\n:FORWARD ACCEPT\nCOMMIT\n")},
	}
	for _, r := range st.Rules {
		k.Rules = append(k.Rules, KernelRule{Rule: r, Plain: true})
	}
	for _, r := range st.Routes {
		// As the kernel reads back what we write: unicast, an IPv4 device route scope link.
		scope := unix.RT_SCOPE_UNIVERSE
		if r.Family == IPv4 && !r.Gateway.IsValid() {
			scope = unix.RT_SCOPE_LINK
		}
		k.Routes = append(k.Routes, KernelRoute{Family: r.Family, Dst: r.Dst, Gateway: r.Gateway, LinkIndex: k.Indexes[r.Dev], OnLink: r.OnLink,
			Type: unix.RTN_UNICAST, Scope: scope, Text: routeText(r)})
	}
	for _, tb := range st.IPTables {
		saved := k.IPTables[tb.Family]
		for _, c := range tb.Chains {
			saved[c.Table][c.Name] = nil
			for _, r := range c.Rules {
				saved[c.Table][c.Name] = append(saved[c.Table][c.Name], strings.Join(r, " "))
			}
		}
		for _, j := range tb.Jumps {
			saved[j.Table][j.From] = append(saved[j.Table][j.From], "-j "+j.To)
		}
	}
	return k
}

func mustSave(t *testing.T, text string) Saved {
	t.Helper()
	s, err := ParseSave(text)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func opStrings(ops []Op) []string {
	var out []string
	for _, o := range ops {
		s := o.String()
		if r, ok := o.(RestoreOp); ok {
			// The payloads are PlanRestore's, tested there: name the table only.
			s = iptablesCmd(r.Family) + "-restore --noflush -t " + r.Table
		}
		out = append(out, s)
	}
	return out
}

func TestPlanSync(t *testing.T) {
	st := seedState(t)
	cases := map[string]struct {
		kernel func(k *Kernel)
		state  func(st State) State
		want   []string
	}{
		"converged: nothing to do": {},
		"from scratch: iptables first (the families side by side), then conntrack, link, address, rules, device routes before gateway routes": {
			kernel: func(k *Kernel) {
				*k = Kernel{Link: Link{Name: "net1", Exists: true}, Indexes: k.Indexes,
					IPTables: map[Family]Saved{IPv4: mustSave(t, "*nat\n:PREROUTING ACCEPT\nCOMMIT\n"), IPv6: mustSave(t, "*filter\nCOMMIT\n")}}
			},
			want: []string{
				"iptables-restore --noflush -t nat,filter",
				"ip6tables-restore --noflush -t filter",
				"conntrack -D (IPv4) to 172.18.0.18: keep all sources, ports [udp/53->10.109.201.193:53]",
				"ip link set net1 up",
				"ip addr add 172.18.0.18/16 dev net1",
				"ip rule add pref 32763 from 172.18.0.18 lookup 100",
				"ip rule add pref 32764 iif eth0 lookup 100",
				"ip rule add pref 32765 iif net1 lookup 100",
				"ip route replace table 100 172.18.0.0/16 dev net1 scope link",
				"ip route replace table 100 default via 172.18.0.1 dev net1",
				"ip route replace table 100 10.109.201.193 via 10.16.0.1 dev eth0",
			},
		},
		"standby: the address goes, nothing else": {
			state: State.Standby,
			want:  []string{"ip addr del 172.18.0.18/16 dev net1"},
		},
		"strays: a foreign address, a rule with a selector we never write, a duplicate rule, a multipath route, a stale route": {
			kernel: func(k *Kernel) {
				k.Link.Addresses = append(k.Link.Addresses, netip.MustParsePrefix("172.18.0.99/16"))
				k.Rules = append(k.Rules,
					KernelRule{Rule: Rule{Family: IPv4, Priority: 32000, IIF: "net1", Table: 100}, Plain: false},
					KernelRule{Rule: k.Rules[1].Rule, Plain: true})
				k.Routes = append(k.Routes,
					KernelRoute{Family: IPv4, Dst: netip.MustParsePrefix("0.0.0.0/0"), Gateway: netip.MustParseAddr("172.18.0.1"), LinkIndex: 2, MultiPath: true, Text: "default multipath"},
					KernelRoute{Family: IPv4, Dst: netip.MustParsePrefix("10.96.0.1/32"), Gateway: netip.MustParseAddr("10.16.0.1"), LinkIndex: 3, Text: "10.96.0.1 via 10.16.0.1 dev eth0"})
			},
			want: []string{
				"ip addr del 172.18.0.99/16 dev net1",
				"ip rule del pref 32000 iif net1 lookup 100",
				"ip rule del pref 32764 iif eth0 lookup 100",
				"ip route del table 100 default multipath",
				"ip route del table 100 10.96.0.1 via 10.16.0.1 dev eth0",
			},
		},
		// The rule of what the pod sends from its LB address is planned like the others: put
		// back when deleted by hand, and the one of an address the pod no longer has removed.
		"source rule: deleted by hand, added back": {
			kernel: func(k *Kernel) { k.Rules = k.Rules[1:] },
			want:   []string{"ip rule add pref 32763 from 172.18.0.18 lookup 100"},
		},
		"source rule: of another address (a /32 or a wider prefix), removed": {
			kernel: func(k *Kernel) {
				k.Rules = append(k.Rules,
					KernelRule{Rule: Rule{Family: IPv4, Priority: 32763, Src: netip.MustParsePrefix("172.18.0.99/32"), Table: 100}, Plain: true},
					KernelRule{Rule: Rule{Family: IPv4, Priority: 32763, Src: netip.MustParsePrefix("172.18.0.0/16"), Table: 100}, Plain: true})
			},
			want: []string{
				"ip rule del pref 32763 from 172.18.0.99 lookup 100",
				"ip rule del pref 32763 from 172.18.0.0/16 lookup 100",
			},
		},
		"source rule: at another priority, replaced": {
			kernel: func(k *Kernel) { k.Rules[0].Priority = 100 },
			want: []string{
				"ip rule del pref 100 from 172.18.0.18 lookup 100",
				"ip rule add pref 32763 from 172.18.0.18 lookup 100",
			},
		},
		"a route of another type, one of another scope: replaced": {
			kernel: func(k *Kernel) {
				for i, r := range k.Routes {
					switch r.Dst.String() {
					case "172.18.0.0/16":
						k.Routes[i].Type, k.Routes[i].Text = unix.RTN_LOCAL, "local 172.18.0.0/16 dev net1"
					case "0.0.0.0/0":
						k.Routes[i].Scope, k.Routes[i].Text = unix.RT_SCOPE_LINK, "default via 172.18.0.1 dev net1 scope link"
					}
				}
			},
			want: []string{
				"ip route del table 100 default via 172.18.0.1 dev net1 scope link",
				"ip route del table 100 local 172.18.0.0/16 dev net1",
				"ip route replace table 100 172.18.0.0/16 dev net1 scope link",
				"ip route replace table 100 default via 172.18.0.1 dev net1",
			},
		},
		"with a lifetime: a missing address is added on it": {
			kernel: func(k *Kernel) { k.Link.Addresses = nil },
			state:  func(st State) State { return st.WithAddressLifetime(1500 * time.Millisecond) },
			want:   []string{"ip addr replace 172.18.0.18/16 dev net1 valid_lft 2 preferred_lft 2"},
		},
		"with a lifetime: an address held for ever is given it": {
			kernel: func(k *Kernel) { k.Link.Permanent = k.Link.Addresses },
			state:  func(st State) State { return st.WithAddressLifetime(time.Second) },
			want:   []string{"ip addr replace 172.18.0.18/16 dev net1 valid_lft 1 preferred_lft 1"},
		},
		"with a lifetime: an address on one is left alone (renewing it is the election's)": {
			state: func(st State) State { return st.WithAddressLifetime(time.Second) },
		},
		"without a lifetime: an address held for ever is what the state wants": {
			kernel: func(k *Kernel) { k.Link.Permanent = k.Link.Addresses },
		},
		"standby with a lifetime: the address goes": {
			state: func(st State) State { return st.WithAddressLifetime(time.Second).Standby() },
			want:  []string{"ip addr del 172.18.0.18/16 dev net1"},
		},
		"lapsing: an address on a lifetime stays (nothing renews it)": {
			state: func(st State) State { return st.WithAddressLifetime(time.Second).Lapse() },
		},
		"lapsing: a missing address is not put back": {
			kernel: func(k *Kernel) { k.Link.Addresses = nil },
			state:  func(st State) State { return st.WithAddressLifetime(time.Second).Lapse() },
		},
		"lapsing: an address held for ever goes (no lifetime fences it)": {
			kernel: func(k *Kernel) { k.Link.Permanent = k.Link.Addresses },
			state:  func(st State) State { return st.WithAddressLifetime(time.Second).Lapse() },
			want:   []string{"ip addr del 172.18.0.18/16 dev net1"},
		},
		"lapsing: a foreign address still goes": {
			kernel: func(k *Kernel) {
				k.Link.Addresses = append(k.Link.Addresses, netip.MustParsePrefix("172.18.0.99/16"))
			},
			state: State.Lapse,
			want:  []string{"ip addr del 172.18.0.99/16 dev net1"},
		},
		"net1 recreated: down, no address, a new index; the routes on the old index are replaced": {
			kernel: func(k *Kernel) {
				k.Link.Up, k.Link.Addresses = false, nil
				k.Indexes["net1"] = 7
			},
			want: []string{
				"ip link set net1 up",
				"ip addr add 172.18.0.18/16 dev net1",
				"ip route del table 100 default via 172.18.0.1 dev net1",
				"ip route del table 100 172.18.0.0/16 dev net1 scope link",
				"ip route replace table 100 172.18.0.0/16 dev net1 scope link",
				"ip route replace table 100 default via 172.18.0.1 dev net1",
			},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			k := converged(t, st)
			if tc.kernel != nil {
				tc.kernel(&k)
			}
			want := st
			if tc.state != nil {
				want = tc.state(st)
			}
			p, err := PlanSync(k, want)
			if err != nil {
				t.Fatal(err)
			}
			if got := opStrings(p.Ops); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("ops:\n got %q\nwant %q", got, tc.want)
			}
			if (len(p.Changes) == 0) != (len(tc.want) == 0) {
				t.Errorf("changes %v for ops %q", p.Changes, tc.want)
			}
		})
	}
}

func TestPlanSyncErrors(t *testing.T) {
	st := seedState(t)
	k := converged(t, st)
	k.Link = Link{Name: "net1"}
	if _, err := PlanSync(k, st); err == nil || err.Error() != `interface "net1" not found (is the NetworkAttachmentDefinition attached?)` {
		t.Errorf("missing net1: %v", err)
	}
	k = converged(t, st)
	delete(k.Indexes, "eth0")
	if _, err := PlanSync(k, st); err == nil || err.Error() != `interface "eth0" not found` {
		t.Errorf("missing eth0: %v", err)
	}
	k = converged(t, st)
	delete(k.IPTables, IPv4)
	if _, err := PlanSync(k, st); err == nil || err.Error() != `no iptables rules were read` {
		t.Errorf("no iptables-save: %v", err)
	}
}

func TestFlowPolicyStale(t *testing.T) {
	lb := netip.MustParseAddr("172.18.0.18")
	target := netip.MustParseAddrPort("10.109.201.193:53")
	policy := FlowPolicy{LB: lb, Sources: prefixes("172.18.0.0/24"), Targets: map[Port]netip.AddrPort{{UDP, 53}: target}}
	sctp := FlowPolicy{LB: lb, Sources: prefixes("172.18.0.0/24"), Targets: map[Port]netip.AddrPort{{SCTP, 3868}: netip.AddrPortFrom(target.Addr(), 3868)}}
	flow := func(proto Protocol, src string, dport uint16, reply netip.AddrPort) Flow {
		return Flow{Protocol: proto, Src: netip.MustParseAddr(src), Dst: netip.AddrPortFrom(lb, dport), ReplySrc: reply}
	}
	cases := map[string]struct {
		policy FlowPolicy
		flow   Flow
		stale  bool
	}{
		"translated as now: kept":         {policy, flow(UDP, "172.18.0.100", 53, target), false},
		"source no longer allowed":        {policy, flow(UDP, "172.18.1.100", 53, target), true},
		"port gone":                       {policy, flow(UDP, "172.18.0.100", 54, netip.MustParseAddrPort("10.109.201.193:54")), true},
		"made before the DNAT rule":       {policy, flow(UDP, "172.18.0.100", 53, netip.AddrPortFrom(lb, 53)), true},
		"target changed":                  {policy, flow(UDP, "172.18.0.100", 53, netip.MustParseAddrPort("10.109.201.194:53")), true},
		"TCP is left to finish":           {policy, flow(TCP, "172.18.1.100", 53, target), false},
		"another destination: not ours":   {policy, Flow{Protocol: UDP, Src: netip.MustParseAddr("172.18.0.100"), Dst: netip.MustParseAddrPort("172.18.0.19:53")}, false},
		"all sources allowed":             {FlowPolicy{LB: lb, AllSources: true, Targets: policy.Targets}, flow(UDP, "192.0.2.1", 53, target), false},
		"SCTP with no ClusterIP: nothing": {FlowPolicy{LB: lb, AllSources: true}, flow(SCTP, "172.18.0.100", 3868, netip.AddrPortFrom(lb, 3868)), true},
		// SCTP entries as the conntrack library reads them: no ports (0).
		"SCTP without ports, allowed and translated to a target of an SCTP port: kept": {sctp, flow(SCTP, "172.18.0.100", 0, netip.AddrPortFrom(target.Addr(), 0)), false},
		"SCTP without ports, source no longer allowed":                                 {sctp, flow(SCTP, "172.18.1.100", 0, netip.AddrPortFrom(target.Addr(), 0)), true},
		"SCTP without ports, made before the DNAT rule":                                {sctp, flow(SCTP, "172.18.0.100", 0, netip.AddrPortFrom(lb, 0)), true},
		"SCTP without ports, to a target no SCTP port has":                             {policy, flow(SCTP, "172.18.0.100", 0, netip.AddrPortFrom(target.Addr(), 0)), true},
		"SCTP without ports, allowed only to another member's port": {FlowPolicy{LB: lb, Targets: sctp.Targets, PortSources: map[Port]FlowSources{{SCTP, 3868}: {Ranges: prefixes("192.0.2.0/24")}}},
			flow(SCTP, "172.18.0.100", 0, netip.AddrPortFrom(target.Addr(), 0)), true},
	}
	for name, tc := range cases {
		if got := tc.policy.Stale(tc.flow); got != tc.stale {
			t.Errorf("%s: Stale(%+v) = %t, want %t", name, tc.flow, got, tc.stale)
		}
	}
}

// FuzzFlowPolicyStale: an entry the policy translates exactly as it says is never stale, and a
// TCP entry never is.
func FuzzFlowPolicyStale(f *testing.F) {
	f.Add([]byte{172, 18, 0, 100}, uint16(53), uint8(24))
	f.Fuzz(func(t *testing.T, src []byte, port uint16, bits uint8) {
		a, ok := netip.AddrFromSlice(src)
		if !ok || port == 0 {
			return
		}
		a = a.Unmap()
		lb := netip.MustParseAddr("172.18.0.18")
		target := netip.AddrPortFrom(netip.MustParseAddr("10.96.0.10"), port)
		r, err := a.Prefix(int(bits) % (a.BitLen() + 1))
		if err != nil {
			t.Fatal(err)
		}
		p := FlowPolicy{LB: lb, Sources: []netip.Prefix{r}, Targets: map[Port]netip.AddrPort{{UDP, int32(port)}: target}}
		fl := Flow{Protocol: UDP, Src: a, Dst: netip.AddrPortFrom(lb, port), ReplySrc: target}
		if p.Stale(fl) {
			t.Errorf("%+v stale under %s", fl, p)
		}
		fl.Protocol = TCP
		fl.ReplySrc = netip.AddrPort{}
		if p.Stale(fl) {
			t.Errorf("TCP %+v stale", fl)
		}
	})
}

func TestSnapshotCauses(t *testing.T) {
	net1 := LinkSnapshot{Name: "net1", Exists: true, Index: 2, MAC: "02:00:00:00:00:01", Up: true, Addresses: "172.18.0.18/16"}
	eth0 := LinkSnapshot{Name: "eth0", Exists: true, Index: 3, MAC: "02:00:00:00:00:02", Up: true, Addresses: "10.16.0.2/16"}
	with := func(s LinkSnapshot, f func(*LinkSnapshot)) LinkSnapshot { f(&s); return s }
	cases := map[string]struct {
		after []LinkSnapshot
		want  []string
	}{
		"nothing":   {[]LinkSnapshot{net1, eth0}, nil},
		"missing":   {[]LinkSnapshot{{Name: "net1"}, eth0}, []string{CauseLinkMissing}},
		"recreated": {[]LinkSnapshot{with(net1, func(s *LinkSnapshot) { s.Index, s.MAC, s.Up, s.Addresses = 9, "02:00:00:00:00:09", false, "" }), eth0}, []string{CauseLinkRecreated}},
		"new MAC":   {[]LinkSnapshot{with(net1, func(s *LinkSnapshot) { s.MAC = "02:00:00:00:00:09" }), eth0}, []string{CauseMACChanged}},
		"down":      {[]LinkSnapshot{with(net1, func(s *LinkSnapshot) { s.Up = false }), eth0}, []string{CauseLinkDown}},
		"flushed, on both": {[]LinkSnapshot{with(net1, func(s *LinkSnapshot) { s.Addresses = "" }), with(eth0, func(s *LinkSnapshot) { s.Addresses = "" })},
			[]string{CauseAddresses}},
	}
	for name, tc := range cases {
		if got := SnapshotCauses([]LinkSnapshot{net1, eth0}, tc.after); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: got %q, want %q", name, got, tc.want)
		}
	}
	if got := SnapshotCauses(nil, []LinkSnapshot{net1}); got != nil {
		t.Errorf("no earlier snapshot: got %q", got)
	}
}

// A family marked pending (an earlier run committed its nat rules, at least in part, and failed
// before forgetting the flows) has its flows forgotten though its tables read as wanted; the
// plan holds no change, so that verifying still converges. A family without an LB address has
// nothing to forget. The same for the nftables back end.
func TestPlanSyncFlowsPending(t *testing.T) {
	const forget = "conntrack -D (IPv4) to 172.18.0.18: keep all sources, ports [udp/53->10.109.201.193:53]"
	st := seedState(t)
	k := converged(t, st)
	k.FlowsPending = map[Family]bool{IPv4: true, IPv6: true}
	p, err := PlanSync(k, st)
	if err != nil {
		t.Fatal(err)
	}
	if got := opStrings(p.Ops); !reflect.DeepEqual(got, []string{forget}) || len(p.Changes) != 0 {
		t.Errorf("iptables: ops %q, changes %v; want only %q", got, p.Changes, forget)
	}
	k.FlowsPending = nil
	if p, err := PlanSync(k, st); err != nil || len(p.Ops) != 0 {
		t.Errorf("nothing pending: ops %q, err %v", opStrings(p.Ops), err)
	}

	nst := Desired(Config{
		Network:  mustNetwork(t, "172.18.0.18/16", "172.18.0.1", "172.18.0.0/16"),
		Services: []Service{{ClusterIPs: addrs("10.109.201.193"), Ports: []Port{{TCP, 80}, {UDP, 53}}}},
	}, Observed{UplinkGateways: map[Family]Gateway{IPv4: {Addr: netip.MustParseAddr("10.16.0.1")}}}, Names{}).ForRules(RulesNFTables)
	nk := converged(t, nst)
	nk.NFTables = map[Family]NFTKernel{}
	for _, tb := range nst.NFTables {
		nk.NFTables[tb.Family] = ApplyNFT(NFTKernel{}, PlanNFT(NFTKernel{}, tb).Steps)
	}
	nk.FlowsPending = map[Family]bool{IPv4: true}
	p, err = PlanSync(nk, nst)
	if err != nil {
		t.Fatal(err)
	}
	if got := opStrings(p.Ops); !reflect.DeepEqual(got, []string{forget}) || len(p.Changes) != 0 {
		t.Errorf("nftables: ops %q, changes %v; want only %q", got, p.Changes, forget)
	}
}

// A rule as vishvananda/netlink reads ours (the kernel sends no attribute for what is not set,
// and the library leaves NewRule's defaults) is plain; each selector or option we never write
// makes it not ours.
func TestPlainRule(t *testing.T) {
	ours := func() netlink.Rule {
		r := *netlink.NewRule()
		r.Priority, r.Family, r.Table, r.IifName = 32764, unix.AF_INET, 100, "eth0"
		return r
	}
	if !plainRule(ours()) {
		t.Fatal("ours is not plain")
	}
	// A source is read into Rule.Src and compared with ours (the rule of the LB address has one).
	from := ours()
	from.Src = &net.IPNet{IP: net.IPv4(172, 18, 0, 18).To4(), Mask: net.CIDRMask(32, 32)}
	if !plainRule(from) {
		t.Fatal("a rule from an address is not plain")
	}
	mask, src := uint32(1), netip.MustParsePrefix("172.18.0.0/16")
	for name, change := range map[string]func(r *netlink.Rule){
		"to":                    func(r *netlink.Rule) { r.Dst = &net.IPNet{IP: src.Addr().AsSlice(), Mask: net.CIDRMask(16, 32)} },
		"oif":                   func(r *netlink.Rule) { r.OifName = "net1" },
		"not":                   func(r *netlink.Rule) { r.Invert = true },
		"fwmark":                func(r *netlink.Rule) { r.Mark = 1 },
		"fwmark 0/1":            func(r *netlink.Rule) { r.Mask = &mask },
		"tos":                   func(r *netlink.Rule) { r.Tos = 0x10 },
		"tun_id":                func(r *netlink.Rule) { r.TunID = 5 },
		"ipproto":               func(r *netlink.Rule) { r.IPProto = unix.IPPROTO_TCP },
		"dport":                 func(r *netlink.Rule) { r.Dport = netlink.NewRulePortRange(53, 53) },
		"sport":                 func(r *netlink.Rule) { r.Sport = netlink.NewRulePortRange(53, 53) },
		"uidrange":              func(r *netlink.Rule) { r.UIDRange = netlink.NewRuleUIDRange(0, 0) },
		"suppress_prefixlength": func(r *netlink.Rule) { r.SuppressPrefixlen = 0 },
		"suppress_ifgroup":      func(r *netlink.Rule) { r.SuppressIfgroup = 0 },
		"goto":                  func(r *netlink.Rule) { r.Goto = 32765 },
		"realms":                func(r *netlink.Rule) { r.Flow = 5 },
	} {
		r := ours()
		change(&r)
		if plainRule(r) {
			t.Errorf("%s: plain", name)
		}
	}
}
