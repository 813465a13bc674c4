package lbpod

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Defaults for the names and numbers the lb pod uses; the seed's listings show these.
const (
	// DefaultInterface is the macvlan interface Multus attaches to the lb pod.
	DefaultInterface = "net1"
	// DefaultUplink is the pod's primary (cluster network) interface.
	DefaultUplink = "eth0"
	// DefaultTable is the policy routing table holding the lb pod's routes.
	DefaultTable = 100
	// uplinkRulePriority and interfaceRulePriority are the seed's `ip rule` priorities, just
	// before the main table's 32766; sourceRulePriority, before them, is the rule of what the
	// pod sends from its LB address.
	sourceRulePriority    = 32763
	uplinkRulePriority    = 32764
	interfaceRulePriority = 32765
)

// Chains of our own: everything we install lives in them, so that a change never touches a rule
// someone else owns, and the built-in chains only hold one jump each.
const (
	// ChainPrerouting (nat) lets only allowed sources reach ChainServices.
	ChainPrerouting = "LBSVC-PREROUTING"
	// ChainServices (nat) holds one DNAT rule per Service port and protocol; above BucketAbove
	// rules it dispatches to bucket chains instead (see BucketChain).
	ChainServices = "LBSVC-SERVICES"
	// ChainPostrouting (nat) masquerades what goes to the ClusterIP.
	ChainPostrouting = "LBSVC-POSTROUTING"
	// ChainInput (filter) refuses what is addressed to the pod itself on the LB address: sources
	// outside loadBalancerSourceRanges, and the pod's own listeners.
	ChainInput = "LBSVC-INPUT"
	// ChainForward (filter) forwards from net1, and from the uplink into net1, only the
	// connections our DNAT created, so the lb pod is no open router between the underlay and the
	// cluster network for whoever uses it as next hop, on either side.
	ChainForward = "LBSVC-FORWARD"
)

// Observed is what the lb pod reads from the kernel before computing its state: eth0's gateway per
// family, from the main table's default route. An invalid address means the default route has no
// gateway (a device route), so the ClusterIP is reached on-link.
type Observed struct {
	UplinkGateways map[Family]Gateway
	// NoSCTP is set once the kernel refused our SCTP rules (no SCTP match or conntrack): the
	// SCTP ports are left out, the others still served.
	NoSCTP bool
	// NoIPv6 is set when the namespace has no IPv6 at all: then there is nothing to guard.
	NoIPv6 bool
}

// Problem is something of the Service the state cannot serve, with a named reason. NotReady
// problems make the lb pod not ready (a Service it would silently fail); the others are
// reported in /readyz's text, the log and a metric while the rest is served.
type Problem struct {
	Reason   string
	Message  string
	NotReady bool
}

// Reasons of the problems Desired reports.
const (
	// ReasonFamilyMismatch: an LB address of a family the Service has no ClusterIP of.
	ReasonFamilyMismatch = "FamilyMismatch"
	// ReasonSCTPUnavailable: the kernel refused the SCTP rules; the SCTP ports are not served.
	ReasonSCTPUnavailable = "SCTPUnavailable"
)

// Gateway is a next hop read from the main table.
type Gateway struct {
	Addr netip.Addr
	// OnLink is set when the main table's route carries the onlink flag (the gateway is outside
	// every connected subnet, as with Calico's 169.254.1.1); our route must carry it too.
	OnLink bool
}

// Rule is one `ip rule`: traffic entering IIF, or sent from Src, looks up Table.
type Rule struct {
	Family   Family
	Priority int
	IIF      string
	// Src, when valid, is the source address the rule selects (a host prefix).
	Src   netip.Prefix
	Table int
}

// args are the rule's selectors as `ip rule add` takes them: "iif eth0", "from 172.18.0.18".
func (r Rule) args() string {
	var parts []string
	if r.Src.IsValid() {
		from := r.Src.String()
		if r.Src.IsSingleIP() {
			from = r.Src.Addr().String()
		}
		parts = append(parts, "from "+from)
	}
	if r.IIF != "" {
		parts = append(parts, "iif "+r.IIF)
	}
	if len(parts) == 0 {
		return "from all"
	}
	return strings.Join(parts, " ")
}

// selector is the rule's match as `ip rule` lists it: "from all iif eth0", "from 172.18.0.18".
func (r Rule) selector() string {
	if r.Src.IsValid() || r.IIF == "" {
		return r.args()
	}
	return "from all " + r.args()
}

// Route is one route in the lb pod's table. An invalid Gateway means a device (scope link) route.
type Route struct {
	Family  Family
	Dst     netip.Prefix
	Gateway netip.Addr
	Dev     string
	OnLink  bool
}

// IsDefault reports whether the route is a default route.
func (r Route) IsDefault() bool { return r.Dst.Bits() == 0 }

// Chain is one of our iptables chains and its rules, each rule the argument list iptables -S
// prints after "-A <chain>".
type Chain struct {
	Table string
	Name  string
	Rules [][]string
}

// Jump is the single rule in a built-in chain that sends traffic to one of our chains.
type Jump struct {
	Table string
	From  string
	To    string
}

// Tables is the iptables (or ip6tables) part of the state for one family.
type Tables struct {
	Family Family
	Chains []Chain
	Jumps  []Jump
	// Flows is how these rules translate UDP and SCTP: after a nat change, the conntrack
	// entries they would not translate the same way are deleted.
	Flows FlowPolicy
}

// State is the desired state of the lb pod's network namespace as plain data.
type State struct {
	Interface string
	Uplink    string
	Table     int
	// Addresses go on Interface, with the Subnet's prefix length.
	Addresses []netip.Prefix
	// AddressLifetime, above 0, is the kernel lifetime (valid and preferred, whole seconds rounded
	// up) the Addresses are added with, and an address the kernel holds for ever is given it.
	// With standbys the election keeps the addresses on a lifetime it renews (the kill -9
	// fence: they lapse from a kernel whose lb pod was killed or frozen); adding or repairing
	// one without it would take the fence away for good. 0: for ever (a single lb pod).
	AddressLifetime time.Duration
	// Lapsing are LB addresses that may stay on Interface while the kernel holds them on a
	// lifetime, but are neither added, repaired nor given a lifetime: those of an active whose
	// election has not confirmed the role lately (Lapse). One the kernel holds for ever is
	// removed, as an address of no one's.
	Lapsing []netip.Prefix
	Rules   []Rule
	Routes  []Route
	// IPTables holds one entry per family, IPv4 first.
	IPTables []Tables
	// NFTables holds the same rules for the nftables back end, one table per family in the
	// same order. The Applier keeps the one of its back end (ForRules).
	NFTables []NFTable
	// Forwarding lists the families whose forwarding sysctl must be on.
	Forwarding []Family
	// Problems lists what of the Service is not served, and why.
	Problems []Problem
	// Unserved lists the ports left out (SCTP without kernel support).
	Unserved []Port
}

// Standby returns the state without the LB addresses: what a standby lb pod holds, net1 up
// with every rule and route in place, so that becoming active only adds the addresses.
func (st State) Standby() State {
	st.Addresses, st.AddressLifetime, st.Lapsing = nil, 0, nil
	return st
}

// Lapse returns the state of an active whose role the election has not confirmed within the
// dead interval: a freeze, a starved node, a hung election. The LB addresses on net1 stay there
// until their kernel lifetime, which nothing renews now, lapses (or the election steps down and
// the loop takes them off); none is added or repaired. Taking them off at once, as a standby,
// made the lb pods of a starved node drop the addresses their elections were about to confirm:
// the loop's apply ran before the election after a stall, and the Service had no holder until
// the next advert put them back. The kernel lifetime is the fence either way.
func (st State) Lapse() State {
	st.Lapsing, st.Addresses, st.AddressLifetime = st.Addresses, nil, 0
	return st
}

// WithAddressLifetime returns the state with the addresses on a kernel lifetime (AddressLifetime).
func (st State) WithAddressLifetime(d time.Duration) State {
	st.AddressLifetime = d
	return st
}

// ForRules keeps the rules of one back end: PlanSync plans whichever rules the state holds.
func (st State) ForRules(b RulesBackend) State {
	if b == RulesNFTables {
		st.IPTables = nil
	} else {
		st.NFTables = nil
	}
	return st
}

// Names are the interface names and table number; zero values mean the defaults.
type Names struct {
	Interface string
	Uplink    string
	Table     int
}

func (n Names) withDefaults() Names {
	if n.Interface == "" {
		n.Interface = DefaultInterface
	}
	if n.Uplink == "" {
		n.Uplink = DefaultUplink
	}
	if n.Table == 0 {
		n.Table = DefaultTable
	}
	return n
}

// Desired computes the state the lb pod must hold for cfg, given what it observed. It is pure.
//
// With several Services (the members of a shared address), each port is DNATed to its own
// member's ClusterIP of the address's family and admits its own member's source ranges; a port
// two members claim goes to the first by name (ReasonPortClash). One member, or members that all
// allow the same sources, give the single Service's layout.
func Desired(cfg Config, obs Observed, names Names) State {
	names = names.withDefaults()
	st := State{Interface: names.Interface, Uplink: names.Uplink, Table: names.Table}
	members, clashes := resolveMembers(cfg.Services, obs.NoSCTP)
	shared := len(cfg.Services) > 1
	for i, addr := range cfg.Addresses {
		fam := familyOf(addr.Addr())
		subnet, gw := cfg.Subnets[i], cfg.Gateways[i]
		targets := targetsOf(members, fam)

		st.Addresses = append(st.Addresses, addr)
		st.Forwarding = append(st.Forwarding, fam)
		// What the pod sends from the LB address itself (a TCP reset or ICMP port unreachable
		// of the input chain's REJECT rules, an echo reply, an ICMP error) goes back to the
		// underlay too: in the main table it would take eth0's default route, so a client
		// behind the Subnet's gateway got no answer and the node got packets from the LB
		// address. Only packets with that source match: the pod's own traffic (from its eth0
		// address) and the forwarded replies of DNATed flows (routed before their source is
		// translated back to the LB address) are not.
		st.Rules = append(st.Rules,
			Rule{Family: fam, Priority: sourceRulePriority, Src: netip.PrefixFrom(addr.Addr(), addr.Addr().BitLen()), Table: names.Table},
			Rule{Family: fam, Priority: uplinkRulePriority, IIF: names.Uplink, Table: names.Table},
			Rule{Family: fam, Priority: interfaceRulePriority, IIF: names.Interface, Table: names.Table})

		st.Routes = append(st.Routes, Route{Family: fam, Dst: netip.PrefixFrom(zeroAddr(fam), 0), Gateway: gw, Dev: names.Interface})
		for _, clusterIP := range clusterIPsOf(targets) {
			up := obs.UplinkGateways[fam]
			st.Routes = append(st.Routes, Route{Family: fam, Dst: netip.PrefixFrom(clusterIP, clusterIP.BitLen()), Gateway: up.Addr, Dev: names.Uplink, OnLink: up.Addr.IsValid() && up.OnLink})
		}
		st.Routes = append(st.Routes, Route{Family: fam, Dst: subnet, Dev: names.Interface})

		st.IPTables = append(st.IPTables, desiredTables(fam, names.Interface, names.Uplink, addr.Addr(), targets))
		st.NFTables = append(st.NFTables, desiredNFT(fam, names.Interface, names.Uplink, addr.Addr(), targets))
		// A shared address with a member served in the family stays ready for the others: one
		// tenant's Service without the family would otherwise keep every replica from taking
		// the address over.
		served := slices.ContainsFunc(members, func(m member) bool { _, ok := clusterIPOf(m.ClusterIPs, fam); return ok })
		for _, m := range members {
			if _, ok := clusterIPOf(m.ClusterIPs, fam); !ok {
				p := familyMismatch(addr.Addr(), fam, m.Service, shared)
				p.NotReady = !shared || !served
				st.Problems = append(st.Problems, p)
			}
		}
	}
	// A family without an LB address still reaches the pod over net1 (IPv6 link-local, or an
	// IPv4 address routed to it): drop all of it.
	for _, fam := range []Family{IPv4, IPv6} {
		if !slices.ContainsFunc(cfg.Addresses, func(p netip.Prefix) bool { return familyOf(p.Addr()) == fam }) && !(fam == IPv6 && obs.NoIPv6) {
			st.IPTables = append(st.IPTables, guardTables(fam, names.Interface, names.Uplink))
			st.NFTables = append(st.NFTables, guardNFT(fam, names.Interface, names.Uplink))
		}
	}
	if obs.NoSCTP {
		var sctp []string
		ports := 0
		withSCTP, _ := resolveMembers(cfg.Services, false)
		for _, m := range withSCTP {
			ports += len(m.ports)
			for _, p := range m.ports {
				if p.Protocol == SCTP {
					st.Unserved = append(st.Unserved, p)
					sctp = append(sctp, strconv.Itoa(int(p.Port)))
				}
			}
		}
		switch {
		case len(sctp) == 0:
		case len(sctp) == ports:
			// Nothing left to serve: a ready pod would hold and announce an address that
			// answers nothing (a silent blackhole). Not ready, it never claims it.
			st.Problems = append(st.Problems, Problem{Reason: ReasonSCTPUnavailable, NotReady: true, Message: fmt.Sprintf(
				"SCTP ports %s not served: the kernel refused the SCTP rules (no SCTP match or conntrack: modules xt_sctp, nf_conntrack_proto_sctp), and the Service has no other port: nothing is served, the pod stays not ready. Load the modules on the node and restart the pod",
				strings.Join(sctp, ","))})
		default:
			st.Problems = append(st.Problems, Problem{Reason: ReasonSCTPUnavailable, Message: fmt.Sprintf(
				"SCTP ports %s not served: the kernel refused the SCTP rules (no SCTP match or conntrack: modules xt_sctp, nf_conntrack_proto_sctp); the other ports are served. Load the modules on the node and restart the pod",
				strings.Join(sctp, ","))})
		}
	}
	st.Problems = append(st.Problems, clashes...)
	return st
}

// clusterIPsOf lists the targets' ClusterIPs (of their family), each once, in member order.
func clusterIPsOf(targets []target) []netip.Addr {
	var out []netip.Addr
	for _, t := range targets {
		if t.clusterIP.IsValid() && !slices.Contains(out, t.clusterIP) {
			out = append(out, t.clusterIP)
		}
	}
	return out
}

// guardTables are the filter chains of a family the lb pod has no LB address of: nothing of it
// arriving on net1 is accepted or forwarded, and nothing from eth0 is forwarded into net1.
func guardTables(fam Family, iface, uplink string) Tables {
	return Tables{Family: fam,
		Jumps: []Jump{{Table: "filter", From: "INPUT", To: ChainInput}, {Table: "filter", From: "FORWARD", To: ChainForward}},
		Chains: []Chain{
			{Table: "filter", Name: ChainInput, Rules: [][]string{{"-i", iface, "-j", "DROP"}}},
			{Table: "filter", Name: ChainForward, Rules: [][]string{{"-i", iface, "-j", "DROP"}, {"-i", uplink, "-o", iface, "-j", "DROP"}}},
		},
	}
}

func clusterIPList(ips []netip.Addr) string {
	var s []string
	for _, a := range ips {
		s = append(s, a.String())
	}
	return "[" + strings.Join(s, ",") + "]"
}

// ndDestinations are the IPv6 destinations of neighbour discovery and MLD other than the LB
// address itself: link-local unicast and multicast.
var ndDestinations = []string{"fe80::/10", "ff00::/8"}

// desiredTables computes our chains for one family.
//
// Allowed sources (all, when loadBalancerSourceRanges is empty) jump from LBSVC-PREROUTING to
// LBSVC-SERVICES, which DNATs each Service port to ClusterIP:port. What is DNATed is forwarded, so
// whatever still reaches INPUT addressed to the LB address is meant for the pod itself: a refused
// source, a port the Service does not have, or the pod's own health server. LBSVC-INPUT rejects
// all of it (a TCP reset, an ICMP port unreachable), so the underlay sees nothing of the pod but
// its Service ports. ICMP stays allowed (ping, and IPv6 neighbour discovery). Anything else
// arriving on net1 for the pod itself, addressed to another of its addresses (the pod IP, with
// the lb pod as next hop: Linux accepts any local address on any interface), is dropped, so
// the health server and the pod's cluster side cannot be reached from the underlay. LBSVC-FORWARD
// passes between net1 and the uplink only connections our DNAT created, both ways.
//
// Members of a shared address that allow different sources cannot share one source check: then
// every source of the LB address reaches LBSVC-SERVICES, which sends each allowed source to the
// chain of the members that allow it (LBSVC-SERVICES-S<n>, one per distinct set of ranges),
// which DNATs only those members' ports. A source allowed by several groups tries each in turn
// (a chain without its port returns).
func desiredTables(fam Family, iface, uplink string, lbIP netip.Addr, targets []target) Tables {
	lb := hostPrefix(lbIP)
	t := Tables{Family: fam, Jumps: []Jump{
		{Table: "nat", From: "PREROUTING", To: ChainPrerouting},
		{Table: "nat", From: "POSTROUTING", To: ChainPostrouting},
		{Table: "filter", From: "INPUT", To: ChainInput},
		{Table: "filter", From: "FORWARD", To: ChainForward},
	}}
	pre := Chain{Table: "nat", Name: ChainPrerouting}
	svc := Chain{Table: "nat", Name: ChainServices}
	post := Chain{Table: "nat", Name: ChainPostrouting}
	input := Chain{Table: "filter", Name: ChainInput}
	// Both directions of a DNATed connection carry the DNAT status, so replies arriving on net1
	// for the connections it forwards pass too. From the uplink into net1 likewise only what
	// belongs to such a connection: the replies, and the ICMP errors about it (conntrack gives a
	// related packet its connection's status). Otherwise, with `iif eth0 lookup 100`, whatever
	// the cluster side routes through the pod (another pod on a bridge-type CNI) would be
	// forwarded into the underlay, untranslated.
	forward := Chain{Table: "filter", Name: ChainForward, Rules: [][]string{
		{"-i", iface, "-m", "conntrack", "!", "--ctstate", "DNAT", "-j", "DROP"},
		{"-i", uplink, "-o", iface, "-m", "conntrack", "!", "--ctstate", "DNAT", "-j", "DROP"}}}

	groups := sourceGroups(fam, targets)
	t.Flows = FlowPolicy{LB: lbIP, Targets: map[Port]netip.AddrPort{}}
	var buckets []Chain
	if len(groups) == 1 {
		matches, all, allowed := sourceMatches(fam, groups[0].ranges)
		t.Flows.AllSources, t.Flows.Sources = all, allowed
		pre.Rules = sourceRules(matches, []string{"-d", lb, "-i", iface}, ChainServices)
		svc.Rules, buckets = bucketRules(ChainServices, dnatRules(lb, targets, t.Flows.Targets))
	} else {
		// Each port's sources are its group's: a member leaving or changing its ranges leaves
		// the other members' flows alone.
		t.Flows.PortSources = map[Port]FlowSources{}
		pre.Rules = [][]string{{"-d", lb, "-i", iface, "-j", ChainServices}}
		for i, g := range groups {
			matches, all, allowed := sourceMatches(fam, g.ranges)
			name := groupChain(i)
			svc.Rules = append(svc.Rules, sourceRules(matches, nil, name)...)
			rules, bs := bucketRules(name, dnatRules(lb, g.targets, t.Flows.Targets))
			buckets = append(buckets, bs...)
			buckets = append(buckets, Chain{Table: "nat", Name: name, Rules: rules})
			for _, tg := range g.targets {
				for _, p := range tg.ports {
					if p.Protocol != TCP {
						t.Flows.PortSources[p] = FlowSources{All: all, Ranges: allowed}
					}
				}
			}
		}
	}
	for _, proto := range []Protocol{TCP, UDP, SCTP} {
		p := strings.ToLower(string(proto))
		input.Rules = append(input.Rules, []string{"-d", lb, "-p", p, "-j", "REJECT", "--reject-with", rejectWith(fam, proto)})
	}
	if fam == IPv6 {
		// Neighbour discovery and MLD, to link-local and multicast addresses (what is for the LB
		// address is not dropped anyway); not echo to the pod's own addresses.
		for _, to := range ndDestinations {
			input.Rules = append(input.Rules, []string{"-d", to, "-i", iface, "-p", "ipv6-icmp", "-j", "RETURN"})
		}
	}
	input.Rules = append(input.Rules, []string{"!", "-d", lb, "-i", iface, "-j", "DROP"})
	for _, clusterIP := range clusterIPsOf(targets) {
		post.Rules = append(post.Rules, []string{"-d", hostPrefix(clusterIP), "-j", "MASQUERADE"})
	}
	// Bucket (and group) chains first: LBSVC-SERVICES jumps to them, and a chain is created
	// before the rules that jump to it (PlanRestore declares every chain first anyway).
	t.Chains = append(buckets, pre, svc, post, input, forward)
	return t
}

// sourceRules are the rules that send allowed sources (after the match prefix) to chain, each
// once.
func sourceRules(matches []sourceMatch, match []string, chain string) [][]string {
	var rules [][]string
	for _, m := range matches {
		var r []string
		if m.from.IsValid() {
			r = append(r, "-s", iptPrefix(m.from))
		}
		// Everyone: iptables -S prints "-s 0.0.0.0/0" back without the match, so a rule written
		// with it would never compare equal and be re-added at every sync.
		rules = append(rules, append(append(r, match...), "-j", chain))
	}
	return slices.CompactFunc(rules, slices.Equal[[]string])
}

// dnatRules are the DNAT rules of targets' ports, each to its own member's ClusterIP, in member
// order; the UDP and SCTP ones are recorded in flows.
func dnatRules(lb string, targets []target, flows map[Port]netip.AddrPort) []portRule {
	var dnat []portRule
	for _, tg := range targets {
		if !tg.clusterIP.IsValid() {
			continue
		}
		for _, p := range tg.ports {
			proto := strings.ToLower(string(p.Protocol))
			target := netip.AddrPortFrom(tg.clusterIP, uint16(p.Port))
			dnat = append(dnat, portRule{port: p, rule: []string{"-d", lb, "-p", proto, "-m", proto, "--dport", strconv.Itoa(int(p.Port)), "-j", "DNAT", "--to-destination", iptAddrPort(target)}})
			if p.Protocol != TCP {
				flows[p] = target
			}
		}
	}
	return dnat
}

// BucketAbove is the number of DNAT rules of a family above which LBSVC-SERVICES no longer holds
// them itself but dispatches to bucket chains of at most BucketPorts ports each. The kernel reads
// the chain from the top for each new connection, and iptables-nft must fetch and decode a whole
// chain to delete one of its rules (about 10 ms of CPU for 1000 rules, against 2 ms for a chain
// of 64): with buckets, changing one port rewrites or patches a small chain, in one transaction,
// and the verification reads back only that chain. Up to BucketAbove rules (the seed's Services)
// the chain stays flat, as the seed shows it.
const BucketAbove = 64

// BucketPorts is the width of a bucket's port range: ports p and q of one protocol share a
// bucket when p/BucketPorts == q/BucketPorts. Ranges, not hashes, because iptables dispatches
// by a --dport range match; a Service's many ports are usually runs, which fill few buckets.
const BucketPorts = 64

// BucketChain names the bucket chain of a protocol's port range that holds port.
func BucketChain(proto Protocol, port int32) string {
	return bucketChain(ChainServices, proto, port)
}

// bucketChain names the bucket of port of the chain parent (LBSVC-SERVICES, or a source group's).
func bucketChain(parent string, proto Protocol, port int32) string {
	return fmt.Sprintf("%s-%s-%d", parent, proto, int(port)/BucketPorts)
}

// portRule is the DNAT rule of one Service port.
type portRule struct {
	port Port
	rule []string
}

// bucketRules lays out the DNAT rules of one family's chain parent (LBSVC-SERVICES, or a source
// group's): up to BucketAbove of them stay in it in the Service's order; above, it gets one dispatch rule per used
// bucket (by protocol, then range: TCP, UDP, SCTP, ascending), and each bucket chain holds its
// ports' rules in the Service's order. It is pure.
func bucketRules(parent string, dnat []portRule) (services [][]string, buckets []Chain) {
	if len(dnat) <= BucketAbove {
		for _, d := range dnat {
			services = append(services, d.rule)
		}
		return services, nil
	}
	type key struct {
		proto  int
		bucket int
	}
	protoOrder := map[Protocol]int{TCP: 0, UDP: 1, SCTP: 2}
	index := map[key]int{}
	var keys []key
	for _, d := range dnat {
		k := key{protoOrder[d.port.Protocol], int(d.port.Port) / BucketPorts}
		i, ok := index[k]
		if !ok {
			i = len(buckets)
			index[k] = i
			keys = append(keys, k)
			buckets = append(buckets, Chain{Table: "nat", Name: bucketChain(parent, d.port.Protocol, d.port.Port)})
		}
		buckets[i].Rules = append(buckets[i].Rules, d.rule)
	}
	order := make([]int, len(keys))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int {
		if keys[a].proto != keys[b].proto {
			return keys[a].proto - keys[b].proto
		}
		return keys[a].bucket - keys[b].bucket
	})
	sorted := make([]Chain, 0, len(buckets))
	for _, i := range order {
		k, b := keys[i], buckets[i]
		proto := strings.ToLower(string([]Protocol{TCP, UDP, SCTP}[k.proto]))
		lo, hi := k.bucket*BucketPorts, k.bucket*BucketPorts+BucketPorts-1
		// iptables -S prints a range as lo:hi, 0:63 included.
		services = append(services, []string{"-p", proto, "-m", proto, "--dport", fmt.Sprintf("%d:%d", lo, hi), "-j", b.Name})
		sorted = append(sorted, b)
	}
	return services, sorted
}

// rejectWith is the REJECT type iptables -S prints for a refused packet of a protocol.
func rejectWith(fam Family, proto Protocol) string {
	switch {
	case proto == TCP:
		return "tcp-reset"
	case fam == IPv6:
		return "icmp6-port-unreachable"
	default:
		return "icmp-port-unreachable"
	}
}

// uniquePorts drops repeated (protocol, port) pairs, keeping the first, so no rule is duplicated.
func uniquePorts(ports []Port) []Port {
	var out []Port
	// A map, not a scan of out: a Service of 1000 ports would cost half a million comparisons
	// (about a millisecond) on every sync.
	seen := make(map[Port]bool, len(ports))
	for _, p := range ports {
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	return out
}

func clusterIPOf(clusterIPs []netip.Addr, fam Family) (netip.Addr, bool) {
	for _, a := range clusterIPs {
		if familyOf(a) == fam {
			return a.Unmap(), true
		}
	}
	return netip.Addr{}, false
}

func zeroAddr(fam Family) netip.Addr {
	if fam == IPv6 {
		return netip.IPv6Unspecified()
	}
	return netip.IPv4Unspecified()
}

// hostPrefix renders an address as iptables -S does: with /32 or /128.
func hostPrefix(a netip.Addr) string {
	return iptPrefix(netip.PrefixFrom(a, a.BitLen()))
}

// iptAddr spells an address as iptables prints it back (glibc's inet_ntop): an IPv6 address whose
// first 96 bits are zero and next 16 are not ends in dotted IPv4 (::1.0.0.0, which Go spells
// ::100:0). Written in Go's spelling, a rule with such an address would never compare equal to
// its listing, and every sync would write its chain again.
func iptAddr(a netip.Addr) string {
	if b := a.As16(); a.Is6() && !a.Is4In6() && [12]byte(b[:12]) == [12]byte{} && (b[12] != 0 || b[13] != 0) {
		return "::" + netip.AddrFrom4([4]byte(b[12:])).String()
	}
	return a.String()
}

// iptPrefix is a prefix as iptables prints it back (see iptAddr).
func iptPrefix(p netip.Prefix) string { return iptAddr(p.Addr()) + "/" + strconv.Itoa(p.Bits()) }

// iptAddrPort is a DNAT destination as iptables prints it back (see iptAddr).
func iptAddrPort(ap netip.AddrPort) string {
	if ap.Addr().Is6() {
		return "[" + iptAddr(ap.Addr()) + "]:" + strconv.Itoa(int(ap.Port()))
	}
	return ap.String()
}
