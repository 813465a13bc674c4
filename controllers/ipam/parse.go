package ipam

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// mappedBlock is ::ffff:0:0/96, where IPv6 spells IPv4 addresses. Such spellings are rejected
// everywhere (never silently unmapped): one address must have exactly one spelling, or the same
// underlay address could be handed to two Services, once per spelling.
var mappedBlock = netip.MustParsePrefix("::ffff:0:0/96")

// FamilyOf returns the family of a valid, unmapped address.
func FamilyOf(a netip.Addr) Family {
	if a.Is4() {
		return IPv4
	}
	return IPv6
}

// SortIPv4First returns a copy of addrs with IPv4 first, each family in the given order: the
// order of every comma-separated address list the operator writes and the lb pod reads.
func SortIPv4First(addrs []netip.Addr) []netip.Addr {
	out := slices.Clone(addrs)
	slices.SortStableFunc(out, func(a, b netip.Addr) int { return cmp.Compare(FamilyOf(a), FamilyOf(b)) })
	return out
}

func (f Family) String() string {
	switch f {
	case IPv4:
		return "IPv4"
	case IPv6:
		return "IPv6"
	}
	return fmt.Sprintf("Family(%d)", uint8(f))
}

// parseAddr parses one address and refuses zones and IPv4-mapped IPv6 spellings.
func parseAddr(s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%s is not an IP address (%s): %w", Quote(s), ParseErrorDetail(err), ErrInvalid)
	}
	if a.Zone() != "" {
		return netip.Addr{}, fmt.Errorf("%s has an IPv6 zone, which an underlay address cannot have: %w", Quote(s), ErrInvalid)
	}
	if a.Is4In6() {
		return netip.Addr{}, fmt.Errorf("%s is an IPv4-mapped IPv6 address; write it as IPv4 (%s): %w", Quote(s), a.Unmap(), ErrInvalid)
	}
	return a, nil
}

// parseDetailBytes bounds netip's reason: it may quote the rest of the value (`(at "...")`).
const parseDetailBytes = 96

// ParseErrorDetail keeps the reason of a net/netip parse error and drops its
// `ParseAddr("...")` prefix, which would repeat the value the message already quotes; what is
// left is cut to a bounded length, because netip may quote the unparsed rest of an arbitrarily
// long value. For messages that quote the value themselves (with Quote).
func ParseErrorDetail(err error) string {
	msg := err.Error()
	// ParsePrefix wraps ParseAddr's error: `netip.ParsePrefix("x/8"): ParseAddr("x"): ...`.
	for range 2 {
		if i := strings.Index(msg, "): "); i >= 0 && (strings.HasPrefix(msg, "Parse") || strings.HasPrefix(msg, "netip.Parse")) {
			msg = msg[i+3:]
		}
	}
	if len(msg) > parseDetailBytes {
		msg = TruncateUTF8(msg, parseDetailBytes) + "..."
	}
	return msg
}

// MaxListedAddrs is the most addresses a list may name: one per family. Anything longer is
// refused before it is parsed, so that a value of any size costs one pass over it (a list of
// tens of thousands, checked for repeats item by item, took half a second to refuse).
const MaxListedAddrs = 2

// ParseAddrs parses a comma-separated list of addresses (an annotation or spec.loadBalancerIP).
// Whitespace around each address is ignored; an empty or blank string is no address (nil, nil).
// More than MaxListedAddrs items, empty items, zones, IPv4-mapped IPv6 spellings and repeated
// addresses are errors wrapping ErrInvalid. Addresses keep their order.
func ParseAddrs(s string) ([]netip.Addr, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	if n := strings.Count(s, ",") + 1; n > MaxListedAddrs {
		return nil, fmt.Errorf("address list %s has %d items; at most %d, one per family: %w", Quote(s), n, MaxListedAddrs, ErrInvalid)
	}
	var out []netip.Addr
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			return nil, fmt.Errorf("address list %s has an empty item: %w", Quote(s), ErrInvalid)
		}
		a, err := parseAddr(item)
		if err != nil {
			return nil, err
		}
		for _, prev := range out {
			if prev == a {
				return nil, fmt.Errorf("address list %s names %s twice: %w", Quote(s), a, ErrInvalid)
			}
		}
		out = append(out, a)
	}
	return out, nil
}

// ParseExcludes parses excludeIps entries: "a" or "a..b".
// Whitespace around entries and around each side of ".." is ignored. A range needs both ends of one
// family and First <= Last. Errors wrap ErrInvalid and quote the entry. Entries keep their order;
// they may overlap (the allocator merges them).
func ParseExcludes(items []string) ([]Range, error) {
	out := make([]Range, 0, len(items))
	for _, raw := range items {
		item := strings.TrimSpace(raw)
		if item == "" {
			return nil, fmt.Errorf("exclusion %s is empty: %w", Quote(raw), ErrInvalid)
		}
		firstText, lastText, isRange := strings.Cut(item, "..")
		first, err := parseAddr(strings.TrimSpace(firstText))
		if err != nil {
			return nil, fmt.Errorf("exclusion %s: %w", Quote(item), err)
		}
		last := first
		if isRange {
			if last, err = parseAddr(strings.TrimSpace(lastText)); err != nil {
				return nil, fmt.Errorf("exclusion %s: %w", Quote(item), err)
			}
			if first.Is4() != last.Is4() {
				return nil, fmt.Errorf("exclusion %s mixes IPv4 and IPv6: %w", Quote(item), ErrInvalid)
			}
			if last.Less(first) {
				return nil, fmt.Errorf("exclusion %s starts after it ends (%s > %s): %w", Quote(item), first, last, ErrInvalid)
			}
		}
		out = append(out, Range{First: first, Last: last})
	}
	return out, nil
}

// String renders r the way excludeIps spells it.
func (r Range) String() string {
	if r.First == r.Last {
		return r.First.String()
	}
	return r.First.String() + ".." + r.Last.String()
}

// hasNetworkAndBroadcast tells whether an IPv4 prefix reserves its first and last address.
// RFC 3021: a /31 is a point-to-point link whose two addresses are both hosts, and a /32 is one
// host; shorter prefixes lose their network and broadcast addresses.
func hasNetworkAndBroadcast(p netip.Prefix) bool { return p.Addr().Is4() && p.Bits() <= 30 }

// reservedAddrs returns the addresses of p that are never handed out whatever the configuration:
// IPv4's network and broadcast addresses (none on a /31 or /32, RFC 3021), and IPv6's
// subnet-router anycast address, which is the network address (RFC 4291 2.6.1), on every prefix.
func reservedAddrs(p netip.Prefix) []netip.Addr {
	s := prefixSpan(p)
	switch {
	case p.Addr().Is6():
		return []netip.Addr{p.Addr()}
	case hasNetworkAndBroadcast(p):
		return []netip.Addr{p.Addr(), addrOf(s.last, IPv4)}
	}
	return nil
}

// ParseSubnet parses and validates a Subnet spec's fields (protocol may be empty: it then
// follows from cidrBlock). Gateway defaults to the first address after each network address.
// It checks what a schema cannot: gateway inside its CIDR and not the network/broadcast address,
// exclusions inside the CIDR and First <= Last, protocol consistent with the CIDRs.
//
// Details: whitespace around every item is ignored. cidrBlock holds one CIDR, or for Dual one IPv4
// and one IPv6 CIDR in either order (the result puts IPv4 first); a CIDR with host bits set is an
// error (it names the network meant). Gateways are matched to CIDRs by family, so their order does
// not matter; a family without one gets the default. A /32 (or IPv6 /128) has no default gateway, so
// it needs one given explicitly, which then leaves nothing to hand out. IPv4-mapped IPv6
// spellings, CIDRs overlapping ::ffff:0:0/96, and zones are rejected, and so are CIDRs that
// overlap a range that is never a unicast host address on a link (see nonUnicast), so 0.0.0.0/0
// or ::/0 never parse. Every error reads
// `subnet "NAME": <value> <problem>: <sentinel>` and wraps ErrInvalid.
func ParseSubnet(name, protocol, cidrBlock, gateway string, excludeIPs []string) (SubnetConfig, error) {
	cfg, err := parseSubnet(name, protocol, cidrBlock, gateway, excludeIPs)
	if err == nil {
		err = checkUnicast(cfg.CIDRs)
	}
	if err != nil {
		return SubnetConfig{}, fmt.Errorf("subnet %q: %w", name, err)
	}
	return cfg, nil
}

func parseSubnet(name, protocol, cidrBlock, gateway string, excludeIPs []string) (SubnetConfig, error) {
	cidrs, err := parseCIDRs(cidrBlock)
	if err != nil {
		return SubnetConfig{}, err
	}
	if err := checkProtocol(strings.TrimSpace(protocol), cidrs); err != nil {
		return SubnetConfig{}, err
	}
	gateways, err := parseGateways(gateway, cidrs)
	if err != nil {
		return SubnetConfig{}, err
	}
	excludes, err := ParseExcludes(excludeIPs)
	if err != nil {
		return SubnetConfig{}, err
	}
	for _, r := range excludes {
		if err := checkExclude(r, cidrs); err != nil {
			return SubnetConfig{}, err
		}
	}
	if len(excludes) == 0 {
		excludes = nil
	}
	return SubnetConfig{Name: name, CIDRs: cidrs, Gateways: gateways, Excludes: excludes}, nil
}

// parseCIDRs parses cidrBlock into at most one prefix per family, IPv4 first.
func parseCIDRs(cidrBlock string) ([]netip.Prefix, error) {
	if strings.TrimSpace(cidrBlock) == "" {
		return nil, fmt.Errorf("cidrBlock is empty: %w", ErrInvalid)
	}
	items := strings.Split(cidrBlock, ",")
	if len(items) > 2 {
		return nil, fmt.Errorf("cidrBlock %s has %d CIDRs; at most two (one IPv4, one IPv6): %w", Quote(cidrBlock), len(items), ErrInvalid)
	}
	var cidrs []netip.Prefix
	for _, item := range items {
		item = strings.TrimSpace(item)
		if item == "" {
			return nil, fmt.Errorf("cidrBlock %s has an empty item: %w", Quote(cidrBlock), ErrInvalid)
		}
		p, err := netip.ParsePrefix(item)
		if err != nil {
			return nil, fmt.Errorf("cidrBlock %s is not a CIDR (%s): %w", Quote(item), ParseErrorDetail(err), ErrInvalid)
		}
		if p.Addr().Is4In6() {
			// Wider prefixes that hold the mapped block are refused by checkUnicast.
			return nil, fmt.Errorf("cidrBlock %s is inside the IPv4-mapped block %s; write IPv4 CIDRs as IPv4: %w", p, mappedBlock, ErrInvalid)
		}
		if p.Masked() != p {
			return nil, fmt.Errorf("cidrBlock %s has host bits set (the network is %s): %w", p, p.Masked(), ErrInvalid)
		}
		for _, prev := range cidrs {
			if prev.Addr().Is4() == p.Addr().Is4() {
				return nil, fmt.Errorf("cidrBlock %s has two %s CIDRs; one per family: %w", Quote(cidrBlock), FamilyOf(p.Addr()), ErrInvalid)
			}
		}
		cidrs = append(cidrs, p)
	}
	if len(cidrs) == 2 && cidrs[1].Addr().Is4() {
		cidrs[0], cidrs[1] = cidrs[1], cidrs[0]
	}
	return cidrs, nil
}

// checkProtocol checks that protocol, when given, names the families of cidrs.
func checkProtocol(protocol string, cidrs []netip.Prefix) error {
	var want []Family
	switch protocol {
	case "":
		return nil
	case "IPv4":
		want = []Family{IPv4}
	case "IPv6":
		want = []Family{IPv6}
	case "Dual":
		want = []Family{IPv4, IPv6}
	default:
		return fmt.Errorf("protocol %s is not IPv4, IPv6 or Dual: %w", Quote(protocol), ErrInvalid)
	}
	ok := len(want) == len(cidrs)
	for i := 0; ok && i < len(cidrs); i++ {
		ok = FamilyOf(cidrs[i].Addr()) == want[i]
	}
	if !ok {
		return fmt.Errorf("protocol %s does not match cidrBlock %s: %w", protocol, prefixList(cidrs), ErrInvalid)
	}
	return nil
}

func prefixList(cidrs []netip.Prefix) string {
	s := make([]string, len(cidrs))
	for i, p := range cidrs {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}

// parseGateways returns one gateway per CIDR, in the order of cidrs.
func parseGateways(gateway string, cidrs []netip.Prefix) ([]netip.Addr, error) {
	gateways := make([]netip.Addr, len(cidrs))
	if strings.TrimSpace(gateway) != "" {
		for _, item := range strings.Split(gateway, ",") {
			item = strings.TrimSpace(item)
			if item == "" {
				return nil, fmt.Errorf("gateway %s has an empty item: %w", Quote(gateway), ErrInvalid)
			}
			gw, err := parseAddr(item)
			if err != nil {
				return nil, fmt.Errorf("gateway %w", err)
			}
			i := cidrIndex(cidrs, FamilyOf(gw))
			if i < 0 {
				return nil, fmt.Errorf("gateway %s is %s but cidrBlock %s has no %s CIDR: %w", gw, FamilyOf(gw), prefixList(cidrs), FamilyOf(gw), ErrInvalid)
			}
			if gateways[i].IsValid() {
				return nil, fmt.Errorf("gateway %s has two %s addresses; one per family: %w", Quote(gateway), FamilyOf(gw), ErrInvalid)
			}
			gateways[i] = gw
		}
	}
	for i, p := range cidrs {
		gw := gateways[i]
		if !gw.IsValid() {
			gw = p.Addr().Next()
			if !p.Contains(gw) {
				return nil, fmt.Errorf("cidrBlock %s has no room for a default gateway (the first address after the network); set gateway: %w", p, ErrInvalid)
			}
			gateways[i] = gw
			continue
		}
		if !p.Contains(gw) {
			return nil, fmt.Errorf("gateway %s is outside %s: %w", gw, p, ErrInvalid)
		}
		for _, r := range reservedAddrs(p) {
			if gw == r {
				return nil, fmt.Errorf("gateway %s is the %s of %s: %w", gw, reservedName(p, r), p, ErrInvalid)
			}
		}
	}
	return gateways, nil
}

// reservedName says which reserved address r (from reservedAddrs) is.
func reservedName(p netip.Prefix, r netip.Addr) string {
	switch {
	case p.Addr().Is6():
		return "subnet-router anycast address"
	case r == p.Addr():
		return "network address"
	}
	return "broadcast address"
}

func cidrIndex(cidrs []netip.Prefix, f Family) int {
	for i, p := range cidrs {
		if FamilyOf(p.Addr()) == f {
			return i
		}
	}
	return -1
}

// checkExclude checks that r lies wholly inside the CIDR of its family.
func checkExclude(r Range, cidrs []netip.Prefix) error {
	i := cidrIndex(cidrs, FamilyOf(r.First))
	if i < 0 {
		return fmt.Errorf("exclusion %s is %s but cidrBlock %s has no %s CIDR: %w", r, FamilyOf(r.First), prefixList(cidrs), FamilyOf(r.First), ErrInvalid)
	}
	p := cidrs[i]
	switch in1, in2 := p.Contains(r.First), p.Contains(r.Last); {
	case in1 && in2:
		return nil
	case in1 || in2:
		return fmt.Errorf("exclusion %s is partly outside %s: %w", r, p, ErrInvalid)
	}
	if ps := prefixSpan(p); toU128(r.First).less(ps.first) && ps.last.less(toU128(r.Last)) {
		// Both ends outside, yet the range spans the whole CIDR.
		return fmt.Errorf("exclusion %s is partly outside %s: %w", r, p, ErrInvalid)
	}
	return fmt.Errorf("exclusion %s is outside %s: %w", r, p, ErrInvalid)
}

// Overlaps reports whether two Subnets share any address.
// It compares the CIDRs only: exclusions do not make two overlapping CIDRs disjoint, because an
// exclusion is a policy that can change while the underlay network cannot be split by it.
func Overlaps(a, b SubnetConfig) bool {
	for _, p := range a.CIDRs {
		for _, q := range b.CIDRs {
			if p.Overlaps(q) {
				return true
			}
		}
	}
	return false
}

// nonUnicast are the ranges a Subnet may not overlap: an lb pod could never hold (or never be
// reached on) an address from them, and handing one out would be worse than refusing the Subnet
// (0.0.0.0/0 would hand out 127.0.0.1, 224.0.0.1, 169.254.169.254). A CIDR inside the
// IPv4-mapped block is refused earlier, with a message that names the IPv4 spelling.
//
// Allowed on purpose: private ranges (RFC 1918, fc00::/7), shared address space (100.64.0.0/10),
// benchmarking (198.18.0.0/15) and the documentation ranges (192.0.2.0/24, 198.51.100.0/24,
// 203.0.113.0/24, 2001:db8::/32). They are unicast and routable on a private underlay, labs and
// tests use them, and refusing them would break working setups for no gain on the wire.
var nonUnicast = []struct {
	prefix netip.Prefix
	what   string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), `"this network" block (RFC 1122)`},
	{netip.MustParsePrefix("127.0.0.0/8"), "loopback block"},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local block"},
	{netip.MustParsePrefix("224.0.0.0/4"), "multicast block"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved block (RFC 1112, with the broadcast address 255.255.255.255)"},
	{netip.MustParsePrefix("::/128"), "unspecified address"},
	{netip.MustParsePrefix("::1/128"), "loopback address"},
	{netip.MustParsePrefix("fe80::/10"), "link-local block"},
	{netip.MustParsePrefix("ff00::/8"), "multicast block"},
	{mappedBlock, "IPv4-mapped block"},
}

// checkUnicast refuses CIDRs that overlap a nonUnicast range, naming the first one.
func checkUnicast(cidrs []netip.Prefix) error {
	for _, p := range cidrs {
		for _, r := range nonUnicast {
			if p.Overlaps(r.prefix) {
				return fmt.Errorf("cidrBlock %s overlaps the %s %s, which cannot be an underlay address: %w", p, r.what, r.prefix, ErrInvalid)
			}
		}
	}
	return nil
}
