package ipam

import (
	"math"
	"math/bits"
	"net/netip"
	"sort"
)

// u128 is an address as a 128-bit unsigned number, so that IPv4 and IPv6 share one arithmetic and
// a range of any size (an IPv6 /64 has 2^64 addresses) is two numbers, never a list.
type u128 struct{ hi, lo uint64 }

// maxU128 is the largest u128; an IPv6 range reaching it cannot be stepped past.
var maxU128 = u128{math.MaxUint64, math.MaxUint64}

// toU128 converts an address; IPv4 occupies the low 32 bits.
func toU128(a netip.Addr) u128 {
	if a.Is4() {
		b := a.As4()
		return u128{lo: uint64(b[0])<<24 | uint64(b[1])<<16 | uint64(b[2])<<8 | uint64(b[3])}
	}
	b := a.As16()
	var u u128
	for i := 0; i < 8; i++ {
		u.hi = u.hi<<8 | uint64(b[i])
		u.lo = u.lo<<8 | uint64(b[i+8])
	}
	return u
}

// addrOf converts back to an address of family f.
func addrOf(u u128, f Family) netip.Addr {
	if f == IPv4 {
		v := uint32(u.lo)
		return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
	}
	var b [16]byte
	for i := 0; i < 8; i++ {
		b[7-i] = byte(u.hi >> (8 * i))
		b[15-i] = byte(u.lo >> (8 * i))
	}
	return netip.AddrFrom16(b)
}

func (u u128) cmp(v u128) int {
	switch {
	case u.hi < v.hi:
		return -1
	case u.hi > v.hi:
		return 1
	case u.lo < v.lo:
		return -1
	case u.lo > v.lo:
		return 1
	}
	return 0
}

func (u u128) less(v u128) bool { return u.cmp(v) < 0 }

// inc returns u+1; callers make sure u is not maxU128.
func (u u128) inc() u128 {
	lo, carry := bits.Add64(u.lo, 1, 0)
	return u128{u.hi + carry, lo}
}

// dec returns u-1; callers make sure u is not zero.
func (u u128) dec() u128 {
	lo, borrow := bits.Sub64(u.lo, 1, 0)
	return u128{u.hi - borrow, lo}
}

// sub returns u-v; callers make sure v <= u.
func (u u128) sub(v u128) u128 {
	lo, borrow := bits.Sub64(u.lo, v.lo, 0)
	return u128{u.hi - v.hi - borrow, lo}
}

// addSat returns u+v, saturating at maxU128.
func (u u128) addSat(v u128) u128 {
	lo, carry := bits.Add64(u.lo, v.lo, 0)
	hi, over := bits.Add64(u.hi, v.hi, carry)
	if over != 0 {
		return maxU128
	}
	return u128{hi, lo}
}

// int64Sat returns u as an int64, saturating at math.MaxInt64 (the Subnet status counters).
func (u u128) int64Sat() int64 {
	if u.hi != 0 || u.lo > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(u.lo)
}

// span is an inclusive range of addresses of one family as numbers.
type span struct{ first, last u128 }

// size returns the number of addresses in s, saturating at maxU128 (only ::/0 has 2^128).
func (s span) size() u128 {
	d := s.last.sub(s.first)
	if d == maxU128 {
		return maxU128
	}
	return d.inc()
}

// prefixSpan returns the first and last address of a masked prefix.
func prefixSpan(p netip.Prefix) span {
	first := toU128(p.Addr())
	hostBits := p.Addr().BitLen() - p.Bits()
	var mask u128 // the host bits set to one
	switch {
	case hostBits >= 128:
		mask = maxU128
	case hostBits > 64:
		mask = u128{hi: 1<<(hostBits-64) - 1, lo: math.MaxUint64}
	case hostBits == 64:
		mask = u128{lo: math.MaxUint64}
	default:
		mask = u128{lo: 1<<hostBits - 1}
	}
	return span{first, u128{first.hi | mask.hi, first.lo | mask.lo}}
}

// mergeSpans sorts spans and joins those that overlap or touch, so that a search can step over
// each as a whole: the result is sorted, disjoint and never adjacent.
func mergeSpans(in []span) []span {
	if len(in) == 0 {
		return nil
	}
	s := append([]span(nil), in...)
	sort.Slice(s, func(i, j int) bool { return s[i].first.less(s[j].first) })
	out := s[:1]
	for _, cur := range s[1:] {
		top := &out[len(out)-1]
		if top.last == maxU128 || !top.last.inc().less(cur.first) {
			if top.last.less(cur.last) {
				top.last = cur.last
			}
			continue
		}
		out = append(out, cur)
	}
	return out
}

// find returns the index of the span of sorted disjoint spans that holds u, or -1.
func find(spans []span, u u128) int {
	i := sort.Search(len(spans), func(i int) bool { return !spans[i].last.less(u) })
	if i < len(spans) && !u.less(spans[i].first) {
		return i
	}
	return -1
}

// spanSet is a set of addresses held as sorted, disjoint, non-adjacent runs: addresses handed
// out in order collapse into one run, so the lowest-free search steps over them at once.
type spanSet struct{ runs []span }

// add inserts u; it is a no-op when u is in the set already.
func (s *spanSet) add(u u128) {
	if find(s.runs, u) >= 0 {
		return
	}
	i := sort.Search(len(s.runs), func(i int) bool { return !s.runs[i].last.less(u) })
	joinPrev := i > 0 && s.runs[i-1].last.inc() == u
	joinNext := i < len(s.runs) && u != maxU128 && u.inc() == s.runs[i].first
	switch {
	case joinPrev && joinNext:
		s.runs[i-1].last = s.runs[i].last
		s.runs = append(s.runs[:i], s.runs[i+1:]...)
	case joinPrev:
		s.runs[i-1].last = u
	case joinNext:
		s.runs[i].first = u
	default:
		s.runs = append(s.runs, span{})
		copy(s.runs[i+1:], s.runs[i:])
		s.runs[i] = span{u, u}
	}
}

// remove deletes u; it is a no-op when u is not in the set.
func (s *spanSet) remove(u u128) {
	i := find(s.runs, u)
	if i < 0 {
		return
	}
	r := s.runs[i]
	switch {
	case r.first == u && r.last == u:
		s.runs = append(s.runs[:i], s.runs[i+1:]...)
	case r.first == u:
		s.runs[i].first = u.inc()
	case r.last == u:
		s.runs[i].last = u.dec()
	default:
		s.runs[i].last = u.dec()
		s.runs = append(s.runs, span{})
		copy(s.runs[i+2:], s.runs[i+1:])
		s.runs[i+1] = span{u.inc(), r.last}
	}
}
