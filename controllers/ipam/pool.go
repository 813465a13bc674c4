package ipam

import (
	"fmt"
	"net/netip"
)

// pool is one family of one Subnet: its CIDR, what is never handed out, and what is held. It
// stores ranges and the held addresses only, never one entry per address of the CIDR.
type pool struct {
	family   Family
	prefix   netip.Prefix
	span     span       // the whole CIDR
	gateway  netip.Addr // invalid when the configuration has none inside the CIDR
	reserved []netip.Addr
	excluded []span // merged exclusions, clipped to the CIDR
	blocked  []span // merged reserved addresses, gateway and exclusions: never handed out
	usable   u128   // addresses of span outside blocked
	used     spanSet
}

// newPool builds the pool of prefix p. Exclusions of the other family or outside p are ignored
// (ParseSubnet refuses them; a hand-built SubnetConfig may still carry them).
func newPool(p netip.Prefix, gateway netip.Addr, excludes []Range) *pool {
	p = p.Masked()
	pl := &pool{family: FamilyOf(p.Addr()), prefix: p, span: prefixSpan(p), reserved: reservedAddrs(p)}
	var blocked []span
	for _, r := range pl.reserved {
		u := toU128(r)
		blocked = append(blocked, span{u, u})
	}
	if gateway.IsValid() && p.Contains(gateway) {
		pl.gateway = gateway
		u := toU128(gateway)
		blocked = append(blocked, span{u, u})
	}
	var excluded []span
	for _, r := range excludes {
		if !r.First.IsValid() || !r.Last.IsValid() || r.First.Is4() != pl.family.is4() || r.Last.Is4() != pl.family.is4() {
			continue
		}
		s := span{toU128(r.First), toU128(r.Last)}
		if s.last.less(s.first) || s.last.less(pl.span.first) || pl.span.last.less(s.first) {
			continue
		}
		if s.first.less(pl.span.first) {
			s.first = pl.span.first
		}
		if pl.span.last.less(s.last) {
			s.last = pl.span.last
		}
		excluded = append(excluded, s)
	}
	pl.excluded = mergeSpans(excluded)
	pl.blocked = mergeSpans(append(blocked, pl.excluded...))
	pl.usable = freeCount(pl.span, pl.blocked)
	return pl
}

func (f Family) is4() bool { return f == IPv4 }

// freeCount counts the addresses of whole outside the sorted disjoint spans of blocked (all inside
// whole), saturating at maxU128.
func freeCount(whole span, blocked []span) u128 {
	var n u128
	next := whole.first // the lowest address not yet accounted for
	for _, b := range blocked {
		if next.less(b.first) {
			n = n.addSat(span{next, b.first.dec()}.size())
		}
		if b.last == whole.last {
			return n
		}
		next = b.last.inc()
	}
	return n.addSat(span{next, whole.last}.size())
}

// check tells why a cannot be handed out by configuration, with the precise sentinel, or nil.
// The order matters where reasons overlap: the seed's subnet excludes its own network and gateway
// addresses, and "is the network address" says more than "is excluded".
func (p *pool) check(a netip.Addr) error {
	if !p.prefix.Contains(a) {
		return fmt.Errorf("%s is outside %s: %w", a, p.prefix, ErrOutOfRange)
	}
	for _, r := range p.reserved {
		if a == r {
			return fmt.Errorf("%s is the %s of %s: %w", a, reservedName(p.prefix, r), p.prefix, ErrReserved)
		}
	}
	if a == p.gateway {
		return fmt.Errorf("%s is the gateway of %s: %w", a, p.prefix, ErrGateway)
	}
	if find(p.excluded, toU128(a)) >= 0 {
		return fmt.Errorf("%s is in the subnet's excludeIps: %w", a, ErrExcluded)
	}
	return nil
}

// valid reports whether the configuration lets a be handed out (whoever holds it).
func (p *pool) valid(a netip.Addr) bool {
	return a.IsValid() && p.prefix.Contains(a) && find(p.blocked, toU128(a)) < 0
}

// lowestFree returns the lowest address at or above from that is neither blocked nor held. It
// steps over each blocked or held run as a whole, so a /8 whose first 16 million addresses are
// excluded costs a few comparisons, not 16 million.
func (p *pool) lowestFree(from u128) (u128, bool) {
	cand := from
	if cand.less(p.span.first) {
		cand = p.span.first
	}
	if p.span.last.less(cand) {
		return u128{}, false
	}
	for {
		moved := false
		for _, spans := range [2][]span{p.blocked, p.used.runs} {
			i := find(spans, cand)
			if i < 0 {
				continue
			}
			if !spans[i].last.less(p.span.last) {
				return u128{}, false
			}
			cand = spans[i].last.inc()
			moved = true
		}
		if !moved {
			return cand, true
		}
	}
}
