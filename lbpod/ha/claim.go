package ha

import (
	"cmp"
	"fmt"
	"net"
	"strconv"
	"strings"
)

// Claim is one replica's claim to the addresses: the term it took them with, its priority and its
// ID. Claims are ordered as the election settles two actives that hear each other: newer term,
// then higher priority, then higher ID. The same order decides, through the Service's record (the
// Lease, cmd/lbpod), between two actives that do not hear each other (Superseded).
type Claim struct {
	Term     uint64
	Priority uint8
	Sender   ID
}

// Compare orders c against o by the election's order: +1 when c wins, -1 when o wins, 0 for the
// same claim.
func (c Claim) Compare(o Claim) int {
	if r := cmp.Compare(c.Term, o.Term); r != 0 {
		return r
	}
	if r := cmp.Compare(c.Priority, o.Priority); r != 0 {
		return r
	}
	for i := range c.Sender {
		if r := cmp.Compare(c.Sender[i], o.Sender[i]); r != 0 {
			return r
		}
	}
	return 0
}

// String is the claim's text form, "<term> <priority> <sender MAC>", as the record carries it.
func (c Claim) String() string {
	return fmt.Sprintf("%d %d %s", c.Term, c.Priority, c.Sender)
}

// ParseClaim reads String's form. It refuses what no replica claims: a term above MaxTerm, a
// priority above 255, a sender that is no unicast MAC (zero, or a group address), so a record
// edited by hand cannot make a replica learn a term that wraps or step down for a made-up sender
// that the adverts would refuse.
func ParseClaim(s string) (Claim, error) {
	f := strings.Fields(s)
	if len(f) != 3 {
		return Claim{}, fmt.Errorf("claim %q: want \"<term> <priority> <mac>\"", s)
	}
	term, err := strconv.ParseUint(f[0], 10, 64)
	if err != nil || term > MaxTerm {
		return Claim{}, fmt.Errorf("claim %q: term %q is not 0 to %d", s, f[0], uint64(MaxTerm))
	}
	prio, err := strconv.ParseUint(f[1], 10, 8)
	if err != nil {
		return Claim{}, fmt.Errorf("claim %q: priority %q is not 0 to 255", s, f[1])
	}
	mac, err := net.ParseMAC(f[2])
	if err != nil || len(mac) != len(ID{}) {
		return Claim{}, fmt.Errorf("claim %q: sender %q is not a MAC", s, f[2])
	}
	c := Claim{Term: term, Priority: uint8(prio)}
	copy(c.Sender[:], mac)
	if c.Sender == (ID{}) || c.Sender[0]&1 != 0 {
		return Claim{}, fmt.Errorf("claim %q: sender %s is not a unicast MAC", s, c.Sender)
	}
	return c, nil
}
