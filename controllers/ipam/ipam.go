// Package ipam hands out underlay addresses from Subnets. It is pure: no Kubernetes client, no
// clock, no I/O. The Service reconciler rebuilds it from what the cluster records (the Services'
// lbsvc.io/allocated-ips annotations) before it hands out any new address after a start.
//
// CONTRACT (fixed; implementation to be filled in): memory grows with the addresses in use, never
// with the size of a Subnet, so an IPv4 /8 and an IPv6 /64 work. All methods of Allocator are safe
// for concurrent use.
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

// ParseSubnet parses and validates a Subnet spec's fields (protocol may be empty: it then
// follows from cidrBlock). Gateway defaults to the first address after each network address.
// It checks what a schema cannot: gateway inside its CIDR and not the network/broadcast address,
// exclusions inside the CIDR and First <= Last, protocol consistent with the CIDRs.
func ParseSubnet(name, protocol, cidrBlock, gateway string, excludeIPs []string) (SubnetConfig, error) {
	panic("not implemented")
}

// ParseExcludes parses excludeIps entries: "a" or "a..b".
func ParseExcludes(items []string) ([]Range, error) { panic("not implemented") }

// ParseAddrs parses a comma-separated list of addresses (an annotation or spec.loadBalancerIP).
func ParseAddrs(s string) ([]netip.Addr, error) { panic("not implemented") }

// Overlaps reports whether two Subnets share any address.
func Overlaps(a, b SubnetConfig) bool { panic("not implemented") }

// Allocator holds every Subnet's allocations, keyed by owner ("namespace/name" of a Service).
type Allocator struct{}

// New returns an empty Allocator.
func New() *Allocator { panic("not implemented") }

// SetSubnet adds a Subnet or replaces its configuration. Existing allocations are kept; it returns
// the owners whose addresses are no longer valid under the new configuration (the caller moves them).
func (a *Allocator) SetSubnet(cfg SubnetConfig) (invalidOwners []string) { panic("not implemented") }

// RemoveSubnet forgets a Subnet and every allocation in it.
func (a *Allocator) RemoveSubnet(name string) { panic("not implemented") }

// Allocate gives owner one address per family the Subnet serves. requested, when non-empty, are
// the static addresses wanted (a subset of families is allowed: the others are chosen dynamically).
// Dynamic choice is deterministic: the lowest free address. Idempotent: an owner that already holds
// addresses in this Subnet that satisfy the request gets them back unchanged; an owner holding
// other addresses (another Subnet, or a different static request) has them released first, but only
// once the new allocation succeeded (on failure the old addresses are kept).
func (a *Allocator) Allocate(subnet, owner string, requested []netip.Addr) ([]netip.Addr, error) {
	panic("not implemented")
}

// Release frees every address owner holds. It is a no-op for an unknown owner.
func (a *Allocator) Release(owner string) (subnet string, released []netip.Addr) {
	panic("not implemented")
}

// Lookup returns the Subnet and addresses owner holds.
func (a *Allocator) Lookup(owner string) (subnet string, addrs []netip.Addr, ok bool) {
	panic("not implemented")
}

// Owner returns who holds addr in subnet.
func (a *Allocator) Owner(subnet string, addr netip.Addr) (owner string, ok bool) {
	panic("not implemented")
}

// Owners lists, sorted, the owners holding addresses in subnet.
func (a *Allocator) Owners(subnet string) []string { panic("not implemented") }

// Usage reports a Subnet's counters.
func (a *Allocator) Usage(subnet string) (Usage, bool) { panic("not implemented") }
