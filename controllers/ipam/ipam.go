// Package ipam hands out underlay addresses from Subnets. It is pure: no Kubernetes client, no
// clock, no I/O. The Service reconciler rebuilds it from what the cluster records (the Services'
// lbsvc.io/allocated-ips annotations) before it hands out any new address after a start.
//
// CONTRACT (fixed): memory grows with the addresses in use, never with the size of a Subnet, so an
// IPv4 /8 and an IPv6 /64 work. All methods of Allocator are safe for concurrent use.
//
// Decisions beyond the contract, each tested:
//   - Never handed out: the gateway, excluded addresses, an IPv4 network and broadcast address on
//     prefixes up to /30, and the IPv6 subnet-router anycast address (the network address). An IPv4
//     /31 has two usable addresses and a /32 one (RFC 3021). A /31 parsed by ParseSubnet keeps one
//     besides its gateway; a /32 has no room for a default gateway, so ParseSubnet needs its one
//     address named as gateway and it then serves nothing (only a hand-built SubnetConfig without
//     gateway hands the address out).
//   - IPv4-mapped IPv6 spellings (::ffff:a.b.c.d) are rejected everywhere, never unmapped: one
//     address has one spelling, so it can never be held twice under two names.
//   - Addresses are numbers (u128) and what is blocked or held is kept as merged runs, so finding
//     the lowest free address steps over whole runs, whatever their length.
package ipam

import (
	"errors"
	"net/netip"
)

// Family is an IP address family.
type Family uint8

// The two address families.
const (
	IPv4 Family = 4
	IPv6 Family = 6
)

// Sentinel errors; every returned error wraps one of them with the Subnet name and the value,
// e.g. `subnet "attach-subnet": 172.19.0.5 is outside 172.18.0.0/16: address outside subnet`.
var (
	ErrUnknownSubnet = errors.New("unknown subnet")
	ErrOutOfRange    = errors.New("address outside subnet")
	ErrExcluded      = errors.New("address excluded")
	ErrGateway       = errors.New("address is the subnet gateway")
	ErrReserved      = errors.New("address is the network or broadcast address")
	ErrInUse         = errors.New("address already allocated")
	ErrExhausted     = errors.New("no free address left")
	ErrFamily        = errors.New("address family not served by subnet")
	ErrInvalid       = errors.New("invalid subnet configuration")
)

// Range is an inclusive range of addresses of one family; a single address has First == Last.
type Range struct {
	First, Last netip.Addr
}

// SubnetConfig is a parsed, validated Subnet: at most one CIDR per family.
type SubnetConfig struct {
	Name     string
	CIDRs    []netip.Prefix // one per family, IPv4 first when Dual
	Gateways []netip.Addr   // same order as CIDRs
	Excludes []Range        // each inside one of CIDRs
}

// Usage counts one Subnet's addresses; counts saturate at math.MaxInt64.
type Usage struct {
	V4Used, V4Available int64
	V6Used, V6Available int64
}
