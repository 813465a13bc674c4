package lbpod

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
)

// RulesBackend names how the lb pod writes its packet rules.
type RulesBackend string

// The rules back ends lbpod's --rules flag (env LBPOD_RULES) chooses from.
const (
	// RulesIPTables drives iptables-restore (the --iptables flag picks nft, legacy or plain).
	RulesIPTables RulesBackend = v1alpha1.RulesIPTables
	// RulesNFTables talks nf_tables netlink directly: one table per family, the Service ports in
	// sets, so that changing one port is one set element added or deleted in one transaction,
	// without an exec'd binary fetching and decoding the whole table.
	RulesNFTables RulesBackend = v1alpha1.RulesNFTables
)

// NFTTable is the name of the table the nftables back end owns in each family (ip, ip6).
const NFTTable = "lbsvc"

// Chain names of the nftables back end, after the iptables chains they stand for.
const (
	NFTChainPrerouting  = "prerouting"
	NFTChainServices    = "services"
	NFTChainPostrouting = "postrouting"
	NFTChainInput       = "input"
	NFTChainForward     = "forward"
)

// NFTable is one family's nftables table as plain data: what the nftables back end writes in
// place of desiredTables' (or guardTables') chains, with the same semantics.
type NFTable struct {
	Family Family
	// Sets come first: rules refer to them.
	Sets   []NFTSet
	Chains []NFTChain
	// Flows is how these rules translate UDP and SCTP (see Tables.Flows).
	Flows FlowPolicy
}

// NFTChain is one chain of our table. Hook is empty for a regular chain (a jump target).
type NFTChain struct {
	Name string
	// Type ("nat", "filter"), Hook ("prerouting", "input", ...) and Priority make it a base chain.
	Type     string
	Hook     string
	Priority int32
	Rules    []NFTRule
}

// NFTRule is one rule: the expressions written, and how `nft list` shows them (for the log,
// the dry run and docs/lbpod.md; comparisons use Canon of the expressions).
type NFTRule struct {
	Text  string
	Exprs []expr.Any
}

// NFTSet is a set of Service ports of one protocol (type inet_service); a port change is an
// element added or deleted, nothing else.
type NFTSet struct {
	Name     string
	Protocol Protocol
	// Ports are sorted ascending, without repeats.
	Ports []uint16
}

// Spec renders what makes a chain a base chain, as compared with the kernel's.
func (c NFTChain) Spec() string {
	if c.Hook == "" {
		return "regular"
	}
	return fmt.Sprintf("type %s hook %s priority %d policy accept", c.Type, c.Hook, c.Priority)
}

// nftSetName names the port set of a protocol.
func nftSetName(p Protocol) string { return strings.ToLower(string(p)) + "_ports" }

// desiredNFT is desiredTables for the nftables back end (see its comment for the why of each
// rule): prerouting jumps allowed sources to services, which DNATs each protocol's set of
// ports to the ClusterIP (the port kept); postrouting masquerades to the ClusterIP; input
// rejects what reaches the LB address itself and drops whatever else arrives on net1 for the
// pod; forward passes from net1, and from the uplink into net1, only what our DNAT created. It
// is pure.
//
// Members of a shared address with ClusterIPs of the family each have their own three sets
// (tcp_ports_0, ... in member order) and DNAT rules to their own ClusterIP; one member keeps the
// plain names (tcp_ports). Members that allow different sources get a chain per source group
// (services_0, ...) that services jumps to per allowed source, as desiredTables does.
func desiredNFT(fam Family, iface, uplink string, lbIP netip.Addr, targets []target) NFTable {
	t := NFTable{Family: fam}
	t.Flows = FlowPolicy{LB: lbIP, Targets: map[Port]netip.AddrPort{}}
	pre := NFTChain{Name: NFTChainPrerouting, Type: "nat", Hook: "prerouting", Priority: -100}
	svc := NFTChain{Name: NFTChainServices}
	post := NFTChain{Name: NFTChainPostrouting, Type: "nat", Hook: "postrouting", Priority: 100}
	input := NFTChain{Name: NFTChainInput, Type: "filter", Hook: "input", Priority: 0}
	forward := NFTChain{Name: NFTChainForward, Type: "filter", Hook: "forward", Priority: 0}
	lb := netip.PrefixFrom(lbIP, lbIP.BitLen())

	// The sets and DNAT rules of each target with a ClusterIP of the family.
	var withIP []target
	for _, tg := range targets {
		if tg.clusterIP.IsValid() {
			withIP = append(withIP, tg)
		}
	}
	dnat := map[int][]NFTRule{} // by target index
	for i, tg := range withIP {
		suffix := ""
		if len(withIP) > 1 {
			suffix = "_" + strconv.Itoa(i)
		}
		byProto := map[Protocol][]uint16{}
		for _, p := range tg.ports {
			byProto[p.Protocol] = append(byProto[p.Protocol], uint16(p.Port))
			if p.Protocol != TCP {
				t.Flows.Targets[p] = netip.AddrPortFrom(tg.clusterIP, uint16(p.Port))
			}
		}
		for _, proto := range []Protocol{TCP, UDP, SCTP} {
			// Sorted and without repeats: the order of the Service's ports does not matter in a set.
			set := NFTSet{Name: nftSetName(proto) + suffix, Protocol: proto, Ports: byProto[proto]}
			slices.Sort(set.Ports)
			set.Ports = slices.Compact(set.Ports)
			dnat[tg.index] = append(dnat[tg.index], nftRule(nftL4Proto(proto), nftDportIn(set.Name), nftDNAT(fam, tg.clusterIP)))
			t.Sets = append(t.Sets, set)
		}
	}
	if len(withIP) == 0 {
		// Nothing is DNATed: the sets stay, empty, so that the table keeps its shape.
		for _, proto := range []Protocol{TCP, UDP, SCTP} {
			t.Sets = append(t.Sets, NFTSet{Name: nftSetName(proto), Protocol: proto})
		}
	}

	jump := func(chain string) nftPart { return nftVerdict(expr.VerdictJump, chain) }
	groups := sourceGroups(fam, targets)
	var groupChains []NFTChain
	if len(groups) == 1 {
		matches, all, allowed := sourceMatches(fam, groups[0].ranges)
		t.Flows.AllSources, t.Flows.Sources = all, allowed
		pre.Rules = nftSourceRules(fam, matches, iface, &lb, NFTChainServices)
		for _, tg := range withIP {
			svc.Rules = append(svc.Rules, dnat[tg.index]...)
		}
	} else {
		t.Flows.PortSources = map[Port]FlowSources{}
		pre.Rules = []NFTRule{nftRule(nftIifname(iface), nftAddrMatch(fam, false, lb, false), jump(NFTChainServices))}
		for i, g := range groups {
			matches, all, allowed := sourceMatches(fam, g.ranges)
			gc := NFTChain{Name: nftGroupChain(i)}
			svc.Rules = append(svc.Rules, nftSourceRules(fam, matches, "", nil, gc.Name)...)
			for _, tg := range g.targets {
				gc.Rules = append(gc.Rules, dnat[tg.index]...)
				for _, p := range tg.ports {
					if p.Protocol != TCP {
						t.Flows.PortSources[p] = FlowSources{All: all, Ranges: allowed}
					}
				}
			}
			groupChains = append(groupChains, gc)
		}
	}
	for _, clusterIP := range clusterIPsOf(targets) {
		post.Rules = append(post.Rules, nftRule(nftAddrMatch(fam, false, netip.PrefixFrom(clusterIP, clusterIP.BitLen()), false), nftPart{"masquerade", []expr.Any{&expr.Masq{}}}))
	}
	for _, proto := range []Protocol{TCP, UDP, SCTP} {
		input.Rules = append(input.Rules, nftRule(nftAddrMatch(fam, false, lb, false), nftL4Proto(proto), nftReject(fam, proto)))
	}
	if fam == IPv6 {
		for _, to := range ndDestinations {
			input.Rules = append(input.Rules, nftRule(nftIifname(iface), nftAddrMatch(fam, false, netip.MustParsePrefix(to), false),
				nftPart{"meta l4proto ipv6-icmp", nftL4ProtoExprs(unix.IPPROTO_ICMPV6)}, nftVerdict(expr.VerdictReturn, "")))
		}
	}
	input.Rules = append(input.Rules, nftRule(nftIifname(iface), nftAddrMatch(fam, false, lb, true), nftVerdict(expr.VerdictDrop, "")))
	// Both directions of a DNATed connection carry the DNAT status, so replies arriving on net1
	// for the connections it forwards pass too. Everything else from net1 is dropped by a rule of
	// its own: a packet conntrack found invalid has no connection, and an expression on its ct
	// status does not match at all (the kernel ends the rule), so "ct status & dnat == 0 drop"
	// would let it be forwarded (iptables' "! --ctstate DNAT" matches it, and drops it). From
	// the uplink into net1 the same two rules (see desiredTables for why).
	forward.Rules = append(forward.Rules,
		nftRule(nftIifname(iface), nftDNATed(), nftVerdict(expr.VerdictAccept, "")),
		nftRule(nftIifname(iface), nftVerdict(expr.VerdictDrop, "")),
		nftRule(nftIifname(uplink), nftOifname(iface), nftDNATed(), nftVerdict(expr.VerdictAccept, "")),
		nftRule(nftIifname(uplink), nftOifname(iface), nftVerdict(expr.VerdictDrop, "")))
	t.Chains = append([]NFTChain{pre, svc}, groupChains...)
	t.Chains = append(t.Chains, post, input, forward)
	return t
}

// nftSourceRules are the rules that jump allowed sources (and, when lb is given, only to it,
// when iface is, only arriving there) to chain, each once.
func nftSourceRules(fam Family, matches []sourceMatch, iface string, lb *netip.Prefix, chain string) []NFTRule {
	var rules []NFTRule
	for _, m := range matches {
		var parts []nftPart
		if iface != "" {
			parts = append(parts, nftIifname(iface))
		}
		if m.from.IsValid() {
			parts = append(parts, nftAddrMatch(fam, true, m.from.Masked(), false))
		}
		if lb != nil {
			parts = append(parts, nftAddrMatch(fam, false, *lb, false))
		}
		rules = append(rules, nftRule(append(parts, nftVerdict(expr.VerdictJump, chain))...))
	}
	return slices.CompactFunc(rules, func(a, b NFTRule) bool { return a.Text == b.Text })
}

// guardNFT is guardTables for the nftables back end: nothing of a family the lb pod has no LB
// address of is accepted or forwarded from net1, nor forwarded from the uplink into net1.
func guardNFT(fam Family, iface, uplink string) NFTable {
	drop := nftRule(nftIifname(iface), nftVerdict(expr.VerdictDrop, ""))
	into := nftRule(nftIifname(uplink), nftOifname(iface), nftVerdict(expr.VerdictDrop, ""))
	return NFTable{Family: fam, Chains: []NFTChain{
		{Name: NFTChainInput, Type: "filter", Hook: "input", Priority: 0, Rules: []NFTRule{drop}},
		{Name: NFTChainForward, Type: "filter", Hook: "forward", Priority: 0, Rules: []NFTRule{drop, into}},
	}}
}

// nftPart is a piece of a rule: its text as nft prints it and its expressions.
type nftPart struct {
	text  string
	exprs []expr.Any
}

func nftRule(parts ...nftPart) NFTRule {
	var r NFTRule
	var text []string
	for _, p := range parts {
		text = append(text, p.text)
		r.Exprs = append(r.Exprs, p.exprs...)
	}
	r.Text = strings.Join(text, " ")
	return r
}

// nftAddrMatch matches the source (src) or destination address against a prefix; not inverts.
// A prefix shorter than the address is masked first, as nft does.
func nftAddrMatch(fam Family, src bool, p netip.Prefix, not bool) nftPart {
	offset, n := uint32(16), uint32(4) // IPv4 header: daddr at 16, saddr at 12
	name := "ip"
	if fam == IPv6 {
		offset, n, name = 24, 16, "ip6" // IPv6 header: daddr at 24, saddr at 8
		if src {
			offset = 8
		}
	} else if src {
		offset = 12
	}
	dir := "daddr"
	if src {
		dir = "saddr"
	}
	op, opText := expr.CmpOpEq, ""
	if not {
		op, opText = expr.CmpOpNeq, "!= "
	}
	exprs := []expr.Any{&expr.Payload{OperationType: expr.PayloadLoad, DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: n}}
	text := fmt.Sprintf("%s %s %s%s", name, dir, opText, p.Addr())
	if p.Bits() < p.Addr().BitLen() {
		mask := netip.PrefixFrom(p.Addr(), p.Bits())
		exprs = append(exprs, &expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: n, Mask: prefixMask(mask), Xor: make([]byte, n)})
		text = fmt.Sprintf("%s %s %s%s", name, dir, opText, p)
	}
	exprs = append(exprs, &expr.Cmp{Op: op, Register: 1, Data: p.Addr().AsSlice()})
	return nftPart{text, exprs}
}

// prefixMask is the netmask of a prefix as bytes.
func prefixMask(p netip.Prefix) []byte {
	m := make([]byte, p.Addr().BitLen()/8)
	for i := 0; i < p.Bits(); i++ {
		m[i/8] |= 0x80 >> (i % 8)
	}
	return m
}

var nftProtoNumbers = map[Protocol]byte{TCP: unix.IPPROTO_TCP, UDP: unix.IPPROTO_UDP, SCTP: unix.IPPROTO_SCTP}

func nftL4ProtoExprs(proto byte) []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}}}
}

func nftL4Proto(p Protocol) nftPart {
	return nftPart{"meta l4proto " + strings.ToLower(string(p)), nftL4ProtoExprs(nftProtoNumbers[p])}
}

// nftDportIn matches the transport header's destination port (the same offset for TCP, UDP and
// SCTP) against a set.
func nftDportIn(set string) nftPart {
	return nftPart{"th dport @" + set, []expr.Any{
		&expr.Payload{OperationType: expr.PayloadLoad, DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Lookup{SourceRegister: 1, SetName: set},
	}}
}

// nftDNAT rewrites the destination address only: the port stays the Service port, as the
// iptables back end's --to-destination ClusterIP:same port. The kernel reads a range without a
// maximum as ending at its minimum, and says so when listed: written that way, it reads back equal.
// (See Canon.)
func nftDNAT(fam Family, to netip.Addr) nftPart {
	nfproto, name := uint32(unix.NFPROTO_IPV4), "ip"
	if fam == IPv6 {
		nfproto, name = unix.NFPROTO_IPV6, "ip6"
	}
	return nftPart{fmt.Sprintf("dnat %s to %s", name, to), []expr.Any{
		&expr.Immediate{Register: 1, Data: to.AsSlice()},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: nfproto, RegAddrMin: 1, RegAddrMax: 1},
	}}
}

func nftReject(fam Family, p Protocol) nftPart {
	switch {
	case p == TCP:
		return nftPart{"reject with tcp reset", []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_TCP_RST}}}
	case fam == IPv6:
		return nftPart{"reject with icmpv6 port-unreachable", []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: 4}}}
	default:
		return nftPart{"reject with icmp port-unreachable", []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: 3}}}
	}
}

// nftIifname matches the input interface by name; the kernel compares IFNAMSIZ bytes, as nft
// writes them.
func nftIifname(name string) nftPart { return nftIfname("iifname", expr.MetaKeyIIFNAME, name) }

// nftOifname matches the output interface by name, as nftIifname the input one.
func nftOifname(name string) nftPart { return nftIfname("oifname", expr.MetaKeyOIFNAME, name) }

func nftIfname(text string, key expr.MetaKey, name string) nftPart {
	data := make([]byte, unix.IFNAMSIZ)
	copy(data, name)
	return nftPart{fmt.Sprintf("%s %q", text, name), []expr.Any{&expr.Meta{Key: key, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: data}}}
}

// ipsDstNAT is the conntrack status bit of a connection whose destination was translated
// (IPS_DST_NAT), host byte order as the kernel keeps ct status.
const ipsDstNAT = 1 << 5

func nftDNATed() nftPart {
	mask := binaryutil.NativeEndian.PutUint32(ipsDstNAT)
	return nftPart{"ct status & dnat != 0", []expr.Any{
		&expr.Ct{Key: expr.CtKeySTATUS, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
	}}
}

func nftVerdict(kind expr.VerdictKind, chain string) nftPart {
	text := map[expr.VerdictKind]string{expr.VerdictJump: "jump " + chain, expr.VerdictReturn: "return", expr.VerdictDrop: "drop", expr.VerdictAccept: "accept"}[kind]
	return nftPart{text, []expr.Any{&expr.Verdict{Kind: kind, Chain: chain}}}
}

// Canon renders a rule's expressions in a canonical form: what the kernel gives back for a
// rule compares equal to what was written, field by field, leaving out what the kernel does not
// return (a set's transaction ID). An expression of a kind we never write renders with its
// type, so a foreign rule never compares equal to ours.
func Canon(exprs []expr.Any) string {
	var b strings.Builder
	for i, e := range exprs {
		if i > 0 {
			b.WriteString("; ")
		}
		switch e := e.(type) {
		case *expr.Payload:
			fmt.Fprintf(&b, "payload op=%d base=%d off=%d len=%d dreg=%d sreg=%d csum=%d/%d/%d", e.OperationType, e.Base, e.Offset, e.Len, e.DestRegister, e.SourceRegister, e.CsumType, e.CsumOffset, e.CsumFlags)
		case *expr.Cmp:
			fmt.Fprintf(&b, "cmp op=%d reg=%d data=%x", e.Op, e.Register, e.Data)
		case *expr.Bitwise:
			fmt.Fprintf(&b, "bitwise sreg=%d dreg=%d len=%d mask=%x xor=%x", e.SourceRegister, e.DestRegister, e.Len, e.Mask, e.Xor)
		case *expr.Lookup:
			fmt.Fprintf(&b, "lookup set=%s sreg=%d dreg=%d/%t invert=%t", e.SetName, e.SourceRegister, e.DestRegister, e.IsDestRegSet, e.Invert)
		case *expr.Meta:
			fmt.Fprintf(&b, "meta key=%d reg=%d sreg=%t", e.Key, e.Register, e.SourceRegister)
		case *expr.Ct:
			fmt.Fprintf(&b, "ct key=%d reg=%d sreg=%t dir=%d", e.Key, e.Register, e.SourceRegister, e.Direction)
		case *expr.Immediate:
			fmt.Fprintf(&b, "immediate reg=%d data=%x", e.Register, e.Data)
		case *expr.NAT:
			fmt.Fprintf(&b, "nat type=%d family=%d addr=%d-%d proto=%d-%d flags=%t%t%t%t%t", e.Type, e.Family, e.RegAddrMin, e.RegAddrMax, e.RegProtoMin, e.RegProtoMax, e.Random, e.FullyRandom, e.Persistent, e.Prefix, e.Specified)
		case *expr.Masq:
			fmt.Fprintf(&b, "masq proto=%d-%d flags=%t%t%t%t", e.RegProtoMin, e.RegProtoMax, e.Random, e.FullyRandom, e.Persistent, e.ToPorts)
		case *expr.Reject:
			fmt.Fprintf(&b, "reject type=%d code=%d", e.Type, e.Code)
		case *expr.Verdict:
			fmt.Fprintf(&b, "verdict kind=%d chain=%s", e.Kind, e.Chain)
		default:
			fmt.Fprintf(&b, "%T%+v", e, e)
		}
	}
	return b.String()
}

// portKey encodes a port as a set element key (inet_service: network byte order).
func portKey(p uint16) []byte { return binary.BigEndian.AppendUint16(nil, p) }
