package ipam

import (
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

func FuzzParseSubnet(f *testing.F) {
	f.Add("IPv4", "172.18.0.0/16", "172.18.0.1", "172.18.0.0..172.18.0.10", "")
	f.Add("Dual", "fd00:18::/64,172.18.0.0/16", "fd00:18::1,172.18.0.1", "fd00:18::2..fd00:18::ff", "172.18.0.5")
	f.Add("", "10.0.0.0/31", "10.0.0.0", "", "")
	f.Add("IPv6", "::ffff:10.0.0.0/104", "", "", "")
	f.Add("", "172.18.0.5/16", "172.18.0.0", "172.17.0.0..172.18.0.4", "x")
	f.Add("Dual", " 10.0.0.0/8 , fd00::/8 ", "", "10.0.0.0 .. 10.255.255.0", "fe80::1%eth0")
	f.Fuzz(func(t *testing.T, protocol, cidrBlock, gateway, ex1, ex2 string) {
		excludes := []string{ex1, ex2}
		if ex2 == "" {
			excludes = excludes[:1]
		}
		cfg, err := ParseSubnet("fz", protocol, cidrBlock, gateway, excludes)
		if err != nil {
			if !errors.Is(err, ErrInvalid) || !strings.HasPrefix(err.Error(), `subnet "fz": `) {
				t.Fatalf("error does not name the subnet or wrap ErrInvalid: %v", err)
			}
			checkMessage(t, err)
			return
		}
		checkConfig(t, cfg)
		for _, p := range cfg.CIDRs {
			for _, r := range nonUnicast {
				if p.Overlaps(r.prefix) {
					t.Fatalf("%v overlaps %v", p, r.prefix)
				}
			}
		}
		// What it parsed, written back canonically, parses to the same configuration.
		gateways := make([]string, len(cfg.Gateways))
		for i, gw := range cfg.Gateways {
			gateways[i] = gw.String()
		}
		excl := make([]string, len(cfg.Excludes))
		for i, r := range cfg.Excludes {
			excl[i] = r.String()
		}
		again, err := ParseSubnet("fz", "", prefixList(cfg.CIDRs), strings.Join(gateways, ","), excl)
		if err != nil || !reflect.DeepEqual(again, cfg) {
			t.Fatalf("round trip: %+v -> %+v, %v", cfg, again, err)
		}
	})
}

// checkConfig checks everything ParseSubnet promises about a configuration it returns.
func checkConfig(t *testing.T, cfg SubnetConfig) {
	t.Helper()
	if len(cfg.CIDRs) < 1 || len(cfg.CIDRs) > 2 || len(cfg.Gateways) != len(cfg.CIDRs) {
		t.Fatalf("bad shape: %+v", cfg)
	}
	if len(cfg.CIDRs) == 2 && (!cfg.CIDRs[0].Addr().Is4() || !cfg.CIDRs[1].Addr().Is6()) {
		t.Fatalf("Dual not IPv4 first: %v", cfg.CIDRs)
	}
	for i, p := range cfg.CIDRs {
		if p.Masked() != p || p.Overlaps(mappedBlock) || p.Addr().Zone() != "" {
			t.Fatalf("bad CIDR %v", p)
		}
		gw := cfg.Gateways[i]
		if !p.Contains(gw) || slices.Contains(reservedAddrs(p), gw) {
			t.Fatalf("bad gateway %v for %v", gw, p)
		}
	}
	for _, r := range cfg.Excludes {
		if r.Last.Less(r.First) {
			t.Fatalf("backwards exclusion %v", r)
		}
		inside := false
		for _, p := range cfg.CIDRs {
			inside = inside || (p.Contains(r.First) && p.Contains(r.Last))
		}
		if !inside {
			t.Fatalf("exclusion %v outside %v", r, cfg.CIDRs)
		}
	}
}

func FuzzParseExcludes(f *testing.F) {
	f.Add("172.18.0.0..172.18.0.10\n172.18.0.20")
	f.Add(" fd00::1 .. fd00::ff ")
	f.Add("10.0.0.9..10.0.0.1")
	f.Add("10.0.0.1..fd00::1\n")
	f.Add("::ffff:10.0.0.1..::ffff:10.0.0.2")
	f.Add("fe80::1%eth0..fe80::2")
	f.Fuzz(func(t *testing.T, s string) {
		items := strings.Split(s, "\n")
		ranges, err := ParseExcludes(items)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error does not wrap ErrInvalid: %v", err)
			}
			checkMessage(t, err)
			return
		}
		if len(ranges) != len(items) {
			t.Fatalf("%d items gave %d ranges", len(items), len(ranges))
		}
		rendered := make([]string, len(ranges))
		for i, r := range ranges {
			if r.Last.Less(r.First) || r.First.Is4() != r.Last.Is4() {
				t.Fatalf("bad range %v", r)
			}
			for _, a := range []netip.Addr{r.First, r.Last} {
				if !a.IsValid() || a.Zone() != "" || a.Is4In6() {
					t.Fatalf("bad address %v in %q", a, items[i])
				}
			}
			rendered[i] = r.String()
		}
		again, err := ParseExcludes(rendered)
		if err != nil || !reflect.DeepEqual(again, ranges) {
			t.Fatalf("round trip: %v -> %v, %v", ranges, again, err)
		}
	})
}

func FuzzParseAddrs(f *testing.F) {
	f.Add("172.18.0.18")
	f.Add(" fd00::18 , 172.18.0.18 ")
	f.Add("172.18.0.18,172.18.0.18")
	f.Add("::ffff:1.2.3.4")
	f.Add("fe80::1%net1,")
	f.Add("")
	f.Add(strings.Repeat("1", 5000))
	f.Add("10.0.0.1" + strings.Repeat("\xff", 300))
	f.Fuzz(func(t *testing.T, s string) {
		addrs, err := ParseAddrs(s)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error does not wrap ErrInvalid: %v", err)
			}
			checkMessage(t, err)
			return
		}
		rendered := make([]string, len(addrs))
		for i, a := range addrs {
			if !a.IsValid() || a.Zone() != "" || a.Is4In6() || slices.Contains(addrs[:i], a) {
				t.Fatalf("bad address %v from %q", a, s)
			}
			rendered[i] = a.String()
		}
		again, err := ParseAddrs(strings.Join(rendered, ","))
		if err != nil || !reflect.DeepEqual(again, addrs) {
			t.Fatalf("round trip: %v -> %v, %v", addrs, again, err)
		}
	})
}

// FuzzAllocator drives an Allocator with a random sequence of operations on two small Subnets that
// may overlap, and checks it against a brute-force model: the exact address or sentinel of every
// Allocate, the owners SetSubnet reports, and after every step that no address is held twice,
// that nobody holds a gateway, excluded or reserved address unless SetSubnet reported it, and
// that the usage counters are exact.
func FuzzAllocator(f *testing.F) {
	f.Add([]byte{0, 0, 8, 0, 0, 0, 0, 1, 0, 1, 1, 2, 0, 7, 0, 1, 0, 2, 0})
	f.Add([]byte{2, 1, 4, 5, 1, 0, 3, 9, 200, 5, 1, 1, 0, 3, 0, 2, 0, 0, 1, 1, 3, 1, 2, 7, 0, 0, 1, 1, 1, 0, 4, 0, 5, 1, 2, 9, 9})
	f.Add([]byte{1, 1, 8, 0, 0, 0, 2, 0, 0, 2, 0, 1, 0, 0, 3, 1, 1, 0, 8, 1, 3, 0, 4, 1, 0, 0, 1, 1, 0})
	f.Add([]byte{2, 0, 6, 1, 2, 7, 2, 1, 9, 40, 1, 100, 101, 0, 0, 0, 0, 0, 1, 0, 2, 0, 3, 0, 4, 0, 5, 0, 6, 3, 0, 0, 0, 8, 8})
	f.Fuzz(func(t *testing.T, data []byte) {
		m := newAllocModel(t, data)
		for step := 0; step < 64 && !m.r.done(); step++ {
			m.step()
			m.check()
		}
	})
}

// byteReader hands out the fuzzer's bytes, then zeros.
type byteReader struct {
	data []byte
	pos  int
}

func (r *byteReader) next() int {
	if r.pos >= len(r.data) {
		r.pos++
		return 0
	}
	r.pos++
	return int(r.data[r.pos-1])
}

func (r *byteReader) done() bool { return r.pos >= len(r.data) }

const fuzzOwners = 6

var fuzzSubnets = []string{"a", "b"}

type allocModel struct {
	t       *testing.T
	r       *byteReader
	a       *Allocator
	cfgs    map[string]SubnetConfig
	invalid map[string]bool // owners SetSubnet reported and that have not moved since
}

func newAllocModel(t *testing.T, data []byte) *allocModel {
	m := &allocModel{t: t, r: &byteReader{data: data}, a: New(), cfgs: map[string]SubnetConfig{}, invalid: map[string]bool{}}
	for _, name := range fuzzSubnets {
		m.setSubnet(name)
	}
	return m
}

// addrAt returns the address off places after the first of p, wrapping around inside p.
func addrAt(p netip.Prefix, off int) netip.Addr {
	size := 1 << (p.Addr().BitLen() - p.Bits())
	a := p.Addr()
	for i := 0; i < off%size; i++ {
		a = a.Next()
	}
	return a
}

// lastOf returns the last address of p, by setting its host bits.
func lastOf(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// genConfig builds a small valid configuration from the fuzzer's bytes: IPv4 prefixes /24-/32 and
// IPv6 /120-/128, at the bottom of private space or at the very top of the address space.
func (m *allocModel) genConfig(name string) SubnetConfig {
	fams := [][]Family{{IPv4}, {IPv6}, {IPv4, IPv6}}[m.r.next()%3]
	top := m.r.next()%2 == 1
	var cidrs []netip.Prefix
	var gateways, excludes []string
	for _, fam := range fams {
		base, bits := netip.MustParseAddr("10.7.0.0"), 24
		if fam == IPv6 {
			base, bits = netip.MustParseAddr("fd00:7::"), 120
		}
		if top && fam == IPv4 {
			base = netip.MustParseAddr("255.255.255.0")
		} else if top {
			base = netip.MustParseAddr("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ff00")
		}
		p := netip.PrefixFrom(base, bits+m.r.next()%9).Masked()
		cidrs = append(cidrs, p)
		if m.r.next()%2 == 1 {
			gateways = append(gateways, addrAt(p, m.r.next()).String())
		}
		for n := m.r.next() % 3; n > 0; n-- {
			first, last := addrAt(p, m.r.next()), addrAt(p, m.r.next())
			if last.Less(first) {
				first, last = last, first
			}
			excludes = append(excludes, first.String()+".."+last.String())
		}
	}
	block := prefixList(cidrs)
	// The bytes may have picked a gateway on a reserved address, or a /32 with no default
	// gateway: fall back step by step to something valid.
	// parseSubnet, not ParseSubnet: the top of the address space (multicast, 240.0.0.0/4) is
	// refused as a Subnet, yet the allocator's arithmetic must still hold at its very end.
	for _, gw := range []string{strings.Join(gateways, ","), "", cidrs[0].Addr().String()} {
		cfg, err := parseSubnet(name, "", block, gw, excludes)
		if err == nil {
			return cfg
		}
	}
	cfg, err := ParseSubnet(name, "", "10.7.0.0/24", "", nil)
	if err != nil {
		m.t.Fatal(err)
	}
	return cfg
}

func (m *allocModel) setSubnet(name string) {
	cfg := m.genConfig(name)
	_, existed := m.cfgs[name]
	m.cfgs[name] = cfg
	var want []string
	if existed {
		for o := 0; o < fuzzOwners; o++ {
			owner := ownerName(o)
			if sub, addrs, ok := m.a.Lookup(owner); ok && sub == name && !satisfies(cfg, addrs) {
				want = append(want, owner)
			}
		}
	}
	got := m.a.SetSubnet(cfg)
	if !reflect.DeepEqual(got, want) {
		m.t.Fatalf("SetSubnet(%+v) reported %v, want %v\n%s", cfg, got, want, m.a)
	}
	for _, owner := range got {
		m.invalid[owner] = true
	}
}

func ownerName(o int) string { return fmt.Sprintf("ns/svc-%d", o) }

// validIn tells, by brute force, whether cfg lets addr be handed out, and why not.
func validIn(cfg SubnetConfig, addr netip.Addr) error {
	for i, p := range cfg.CIDRs {
		if p.Addr().Is4() != addr.Is4() {
			continue
		}
		switch {
		case !p.Contains(addr):
			return ErrOutOfRange
		case addr == p.Addr() && (p.Addr().Is6() || p.Bits() <= 30):
			return ErrReserved
		case p.Addr().Is4() && p.Bits() <= 30 && addr == lastOf(p):
			return ErrReserved
		case addr == cfg.Gateways[i]:
			return ErrGateway
		}
		for _, r := range cfg.Excludes {
			if r.First.Is4() == addr.Is4() && !addr.Less(r.First) && !r.Last.Less(addr) {
				return ErrExcluded
			}
		}
		return nil
	}
	return ErrFamily
}

func satisfies(cfg SubnetConfig, addrs []netip.Addr) bool {
	if len(addrs) != len(cfg.CIDRs) {
		return false
	}
	for i, p := range cfg.CIDRs {
		if addrs[i].Is4() != p.Addr().Is4() || validIn(cfg, addrs[i]) != nil {
			return false
		}
	}
	return true
}

// holders maps every held address to its owner, from Lookup.
func (m *allocModel) holders() map[netip.Addr]string {
	held := map[netip.Addr]string{}
	for o := 0; o < fuzzOwners; o++ {
		owner := ownerName(o)
		_, addrs, _ := m.a.Lookup(owner)
		for _, addr := range addrs {
			if prev, dup := held[addr]; dup {
				m.t.Fatalf("%s held by %s and %s\n%s", addr, prev, owner, m.a)
			}
			held[addr] = owner
		}
	}
	return held
}

func (m *allocModel) step() {
	name := fuzzSubnets[m.r.next()%2]
	owner := ownerName(m.r.next() % fuzzOwners)
	switch op := m.r.next() % 6; op {
	case 0, 1, 2:
		// No request, one static address, or one per family: the offsets may land outside
		// the Subnet, on the wrong family, or on a held address.
		var req []netip.Addr
		for n := 0; n < op; n++ {
			p := netip.MustParsePrefix("10.7.0.0/23")
			if m.r.next()%2 == 1 {
				p = netip.MustParsePrefix("fd00:7::/119")
			}
			if m.r.next()%4 == 0 {
				p = netip.MustParsePrefix("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ff00/120")
			}
			req = append(req, addrAt(p, m.r.next()))
		}
		m.allocate(name, owner, req)
	case 3:
		sub, addrs, _ := m.a.Lookup(owner)
		gotSub, got := m.a.Release(owner)
		if gotSub != sub || !reflect.DeepEqual(got, addrs) {
			m.t.Fatalf("Release(%s) = %s %v, Lookup said %s %v", owner, gotSub, got, sub, addrs)
		}
		delete(m.invalid, owner)
	case 4:
		m.setSubnet(name)
	case 5:
		if _, ok := m.cfgs[name]; ok && m.r.next()%4 == 0 {
			m.a.RemoveSubnet(name)
			delete(m.cfgs, name)
			for o := 0; o < fuzzOwners; o++ {
				if _, _, ok := m.a.Lookup(ownerName(o)); !ok {
					delete(m.invalid, ownerName(o))
				}
			}
		} else if !ok {
			m.setSubnet(name)
		}
	}
}

// expect computes what Allocate must do, by brute force over the model's state.
func (m *allocModel) expect(name, owner string, req []netip.Addr) ([]netip.Addr, error) {
	cfg, ok := m.cfgs[name]
	if !ok {
		return nil, ErrUnknownSubnet
	}
	want := make([]netip.Addr, len(cfg.CIDRs))
	for _, r := range req {
		i := slices.IndexFunc(cfg.CIDRs, func(p netip.Prefix) bool { return p.Addr().Is4() == r.Is4() })
		if i < 0 || want[i].IsValid() {
			return nil, ErrFamily
		}
		want[i] = r
	}
	held := m.holders()
	sub, cur, _ := m.a.Lookup(owner)
	var result []netip.Addr
	for i, p := range cfg.CIDRs {
		if sub == name {
			if k := slices.IndexFunc(cur, func(a netip.Addr) bool { return a.Is4() == p.Addr().Is4() }); k >= 0 &&
				validIn(cfg, cur[k]) == nil && (!want[i].IsValid() || want[i] == cur[k]) {
				result = append(result, cur[k])
				continue
			}
		}
		if want[i].IsValid() {
			if err := validIn(cfg, want[i]); err != nil {
				return nil, err
			}
			if h, ok := held[want[i]]; ok && h != owner {
				return nil, ErrInUse
			}
			result = append(result, want[i])
			continue
		}
		var found netip.Addr
		for a := p.Addr(); p.Contains(a); a = a.Next() {
			h, isHeld := held[a]
			if validIn(cfg, a) == nil && (!isHeld || (h == owner && sub != name)) {
				found = a
				break
			}
			if a == lastOf(p) {
				break // the top of the address space: Next would wrap
			}
		}
		if !found.IsValid() {
			return nil, ErrExhausted
		}
		result = append(result, found)
	}
	return result, nil
}

func (m *allocModel) allocate(name, owner string, req []netip.Addr) {
	want, wantErr := m.expect(name, owner, req)
	sub, before, _ := m.a.Lookup(owner)
	got, err := m.a.Allocate(name, owner, req)
	if wantErr != nil {
		if !errors.Is(err, wantErr) || !strings.HasPrefix(err.Error(), fmt.Sprintf("subnet %q: ", name)) {
			m.t.Fatalf("Allocate(%s, %s, %v) = %v, %v; want %v\n%s", name, owner, req, got, err, wantErr, m.a)
		}
		if sub2, after, _ := m.a.Lookup(owner); sub2 != sub || !reflect.DeepEqual(after, before) {
			m.t.Fatalf("failed Allocate changed %s's holding from %s %v to %s %v", owner, sub, before, sub2, after)
		}
		return
	}
	if err != nil || !reflect.DeepEqual(got, want) {
		m.t.Fatalf("Allocate(%s, %s, %v) = %v, %v; want %v\n%s", name, owner, req, got, err, want, m.a)
	}
	delete(m.invalid, owner)
}

// check verifies the invariants over the whole Allocator.
func (m *allocModel) check() {
	held := m.holders()
	perSubnet := map[string][]string{}
	for o := 0; o < fuzzOwners; o++ {
		owner := ownerName(o)
		sub, addrs, ok := m.a.Lookup(owner)
		if !ok {
			continue
		}
		cfg, known := m.cfgs[sub]
		if !known {
			m.t.Fatalf("%s holds %v in removed subnet %s", owner, addrs, sub)
		}
		perSubnet[sub] = append(perSubnet[sub], owner)
		for _, addr := range addrs {
			if got, ok := m.a.Owner(sub, addr); !ok || got != owner {
				m.t.Fatalf("Owner(%s, %s) = %q, Lookup says %s", sub, addr, got, owner)
			}
		}
		if !m.invalid[owner] && !satisfies(cfg, addrs) {
			m.t.Fatalf("%s holds %v, invalid in %+v, and was never reported\n%s", owner, addrs, cfg, m.a)
		}
	}
	for _, name := range fuzzSubnets {
		cfg, ok := m.cfgs[name]
		if !ok {
			if _, ok := m.a.Usage(name); ok {
				m.t.Fatalf("usage of removed subnet %s", name)
			}
			continue
		}
		if got := m.a.Owners(name); !reflect.DeepEqual(got, perSubnet[name]) {
			m.t.Fatalf("Owners(%s) = %v, want %v", name, got, perSubnet[name])
		}
		var want Usage
		for _, owner := range perSubnet[name] {
			_, addrs, _ := m.a.Lookup(owner)
			for _, addr := range addrs {
				if addr.Is4() {
					want.V4Used++
				} else {
					want.V6Used++
				}
			}
		}
		for _, p := range cfg.CIDRs {
			a := p.Addr()
			for n := 1 << (a.BitLen() - p.Bits()); n > 0; n-- {
				owner, isHeld := m.a.Owner(name, a)
				if isHeld && held[a] != owner {
					m.t.Fatalf("Owner(%s, %s) = %s, Lookup says %q", name, a, owner, held[a])
				}
				if validIn(cfg, a) == nil && !(isHeld && slices.Contains(perSubnet[name], owner)) {
					if a.Is4() {
						want.V4Available++
					} else {
						want.V6Available++
					}
				}
				a = a.Next()
			}
		}
		if got, _ := m.a.Usage(name); got != want {
			m.t.Fatalf("Usage(%s) = %+v, want %+v\n%s", name, got, want, m.a)
		}
	}
}

// checkMessage checks that an error message is valid UTF-8 and short enough for an Event note
// (1 KiB) whatever the value it quotes.
func checkMessage(t *testing.T, err error) {
	t.Helper()
	if msg := err.Error(); len(msg) > 1024 || !utf8.ValidString(msg) {
		t.Fatalf("message of %d bytes, valid UTF-8 %v: %q", len(msg), utf8.ValidString(msg), msg)
	}
}

// FuzzQuote checks that a quoted value is valid UTF-8, bounded, and whole when short.
func FuzzQuote(f *testing.F) {
	for _, s := range []string{"", "lb", "a\x00\n", strings.Repeat("é", 40), strings.Repeat("\xff", 70), strings.Repeat("😀", 17)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		q := Quote(s)
		if !utf8.ValidString(q) {
			t.Fatalf("Quote(%q) = %q is not valid UTF-8", s, q)
		}
		// Every byte quotes to at most 4 (\xff) or a character to 10 (\U0010ffff) per 4 bytes,
		// plus the quotes and the "... (N bytes)" suffix.
		if len(q) > 4*QuotePrefixBytes+2+len("... (9223372036854775807 bytes)") {
			t.Fatalf("Quote of %d bytes is %d bytes long", len(s), len(q))
		}
		if len(s) <= QuotePrefixBytes && q != strconv.Quote(s) {
			t.Fatalf("short value %q quoted as %s", s, q)
		}
		if cut := TruncateUTF8(s, QuotePrefixBytes); !strings.HasPrefix(s, cut) || len(cut) > QuotePrefixBytes ||
			(utf8.ValidString(s) && !utf8.ValidString(cut)) {
			t.Fatalf("TruncateUTF8(%q) = %q", s, cut)
		}
	})
}
