package ipam

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
)

// Allocator holds every Subnet's allocations, keyed by owner ("namespace/name" of a Service).
// The zero value is ready to use; one mutex guards everything, which is plenty for the rate at
// which Services change.
type Allocator struct {
	mu       sync.Mutex
	subnets  map[string]*subnetState
	holdings map[string]holding // owner -> what it holds
}

// subnetState is one Subnet: its pools (one per CIDR, in CIDR order) and who holds which address.
// owners also keeps addresses a configuration change made invalid, until their owner moves.
type subnetState struct {
	cfg    SubnetConfig
	pools  []*pool
	owners map[netip.Addr]string
}

// holding is what one owner holds: addresses of one Subnet, in the Subnet's CIDR order.
type holding struct {
	subnet string
	addrs  []netip.Addr
}

// New returns an empty Allocator.
func New() *Allocator {
	return &Allocator{subnets: map[string]*subnetState{}, holdings: map[string]holding{}}
}

func (a *Allocator) init() {
	if a.subnets == nil {
		a.subnets = map[string]*subnetState{}
		a.holdings = map[string]holding{}
	}
}

// poolFor returns the pool serving family f, or nil.
func (s *subnetState) poolFor(f Family) *pool {
	for _, p := range s.pools {
		if p.family == f {
			return p
		}
	}
	return nil
}

// validHeld reports whether held address addr is still one the configuration could hand out.
func (s *subnetState) validHeld(addr netip.Addr) bool {
	p := s.poolFor(FamilyOf(addr))
	return p != nil && !addr.Is4In6() && p.valid(addr)
}

// hold records addr as owner's; free forgets it.
func (s *subnetState) hold(addr netip.Addr, owner string) {
	s.owners[addr] = owner
	if p := s.poolFor(FamilyOf(addr)); p != nil && p.prefix.Contains(addr) {
		p.used.add(toU128(addr))
	}
}

func (s *subnetState) free(addr netip.Addr) {
	delete(s.owners, addr)
	if p := s.poolFor(FamilyOf(addr)); p != nil && p.prefix.Contains(addr) {
		p.used.remove(toU128(addr))
	}
}

// satisfied reports whether owner's holding addrs is complete and valid under s: one valid
// address per pool and nothing else.
func (s *subnetState) satisfied(addrs []netip.Addr) bool {
	if len(addrs) != len(s.pools) {
		return false
	}
	for i, p := range s.pools {
		if FamilyOf(addrs[i]) != p.family || !p.valid(addrs[i]) {
			return false
		}
	}
	return true
}

// SetSubnet adds a Subnet or replaces its configuration. Existing allocations are kept; it returns
// the owners whose addresses are no longer valid under the new configuration (the caller moves them).
//
// The returned owners are sorted. They include the owners that hold an address now outside the
// CIDRs, excluded, the gateway or a reserved address, and also those that lack an address of a
// family the Subnet now serves: calling Allocate for each of them (without a static request, or
// with the Service's own) keeps what is still valid and replaces or completes the rest.
func (a *Allocator) SetSubnet(cfg SubnetConfig) (invalidOwners []string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.init()
	cfg = cloneConfig(cfg)
	ns := &subnetState{cfg: cfg, owners: map[netip.Addr]string{}}
	for i, p := range cfg.CIDRs {
		var gw netip.Addr
		if i < len(cfg.Gateways) {
			gw = cfg.Gateways[i]
		}
		ns.pools = append(ns.pools, newPool(p, gw, cfg.Excludes))
	}
	old := a.subnets[cfg.Name]
	a.subnets[cfg.Name] = ns
	if old == nil {
		return nil
	}
	for addr, owner := range old.owners {
		ns.hold(addr, owner)
	}
	for owner, h := range a.holdings {
		if h.subnet == cfg.Name && !ns.satisfied(h.addrs) {
			invalidOwners = append(invalidOwners, owner)
		}
	}
	slices.Sort(invalidOwners)
	return invalidOwners
}

func cloneConfig(cfg SubnetConfig) SubnetConfig {
	cfg.CIDRs = slices.Clone(cfg.CIDRs)
	cfg.Gateways = slices.Clone(cfg.Gateways)
	cfg.Excludes = slices.Clone(cfg.Excludes)
	return cfg
}

// Config returns the configuration a Subnet was last set with.
func (a *Allocator) Config(name string) (SubnetConfig, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	s, ok := a.subnets[name]
	if !ok {
		return SubnetConfig{}, false
	}
	return cloneConfig(s.cfg), true
}

// RemoveSubnet forgets a Subnet and every allocation in it.
func (a *Allocator) RemoveSubnet(name string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	s, ok := a.subnets[name]
	if !ok {
		return
	}
	for _, owner := range s.owners {
		delete(a.holdings, owner)
	}
	delete(a.subnets, name)
}

// Allocate gives owner one address per family the Subnet serves. requested, when non-empty, are
// the static addresses wanted (a subset of families is allowed: the others are chosen dynamically).
// Dynamic choice is deterministic: the lowest free address. Idempotent: an owner that already holds
// addresses in this Subnet that satisfy the request gets them back unchanged; an owner holding
// other addresses (another Subnet, or a different static request) has them released first, but only
// once the new allocation succeeded (on failure the old addresses are kept).
//
// The result is in the Subnet's CIDR order (IPv4 first). Families are decided one by one: an
// address the owner holds in this Subnet is kept when it is still valid and matches the request
// for its family (any address matches when that family is not requested). A static address is
// checked in this order, each with its sentinel: ErrFamily (family not served, IPv4-mapped, or two
// of one family), ErrOutOfRange, ErrReserved, ErrGateway, ErrExcluded, then ErrInUse naming the
// owner that holds it (in this or any other Subnet, so overlapping Subnets cannot hand one address
// to two owners). ErrExhausted when a family has no free address left.
func (a *Allocator) Allocate(subnet, owner string, requested []netip.Addr) ([]netip.Addr, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.init()
	addrs, err := a.allocate(subnet, owner, requested)
	if err != nil {
		return nil, fmt.Errorf("subnet %q: %w", subnet, err)
	}
	return addrs, nil
}

func (a *Allocator) allocate(name, owner string, requested []netip.Addr) ([]netip.Addr, error) {
	s, ok := a.subnets[name]
	if !ok {
		return nil, fmt.Errorf("cannot allocate for %q: %w", owner, ErrUnknownSubnet)
	}
	want := make([]netip.Addr, len(s.pools)) // per pool: the static request, or invalid
	for _, r := range requested {
		if err := checkRequested(r); err != nil {
			return nil, err
		}
		i := slices.IndexFunc(s.pools, func(p *pool) bool { return p.family == FamilyOf(r) })
		if i < 0 {
			return nil, fmt.Errorf("%s is %s but the subnet serves only %s: %w", r, FamilyOf(r), prefixList(s.cfg.CIDRs), ErrFamily)
		}
		if want[i].IsValid() {
			return nil, fmt.Errorf("%s and %s are both %s; a Service gets one address per family: %w", want[i], r, FamilyOf(r), ErrFamily)
		}
		want[i] = r
	}

	cur, hasCur := a.holdings[owner]
	result := make([]netip.Addr, len(s.pools))
	for i, p := range s.pools {
		if hasCur && cur.subnet == name {
			if held, ok := heldOf(cur.addrs, p.family); ok && p.valid(held) && (!want[i].IsValid() || want[i] == held) {
				result[i] = held
				continue
			}
		}
		if want[i].IsValid() {
			if err := a.checkStatic(s, p, owner, want[i]); err != nil {
				return nil, err
			}
			result[i] = want[i]
			continue
		}
		addr, err := a.lowestFree(name, p, owner)
		if err != nil {
			return nil, err
		}
		result[i] = addr
	}

	// Everything is secured: only now let go of what the owner held and is not kept. Release
	// before holding, so an owner moving between overlapping Subnets can keep its address.
	if hasCur {
		old := a.subnets[cur.subnet]
		for _, addr := range cur.addrs {
			if cur.subnet != name || !slices.Contains(result, addr) {
				old.free(addr)
			}
		}
	}
	for _, addr := range result {
		s.hold(addr, owner)
	}
	a.holdings[owner] = holding{subnet: name, addrs: result}
	return slices.Clone(result), nil
}

// checkRequested refuses what cannot be an underlay address at all.
func checkRequested(r netip.Addr) error {
	switch {
	case !r.IsValid():
		return fmt.Errorf("the zero address cannot be requested: %w", ErrInvalid)
	case r.Zone() != "":
		return fmt.Errorf("%s has an IPv6 zone, which an underlay address cannot have: %w", r, ErrInvalid)
	case r.Is4In6():
		return fmt.Errorf("%s is an IPv4-mapped IPv6 address; request %s instead: %w", r, r.Unmap(), ErrFamily)
	}
	return nil
}

func heldOf(addrs []netip.Addr, f Family) (netip.Addr, bool) {
	for _, addr := range addrs {
		if FamilyOf(addr) == f {
			return addr, true
		}
	}
	return netip.Addr{}, false
}

// checkStatic tells whether owner may have addr of pool p in subnet s.
func (a *Allocator) checkStatic(s *subnetState, p *pool, owner string, addr netip.Addr) error {
	if err := p.check(addr); err != nil {
		return err
	}
	if holder, ok := a.holder(addr); ok && holder != owner {
		return fmt.Errorf("%s is held by %q: %w", addr, holder, ErrInUse)
	}
	return nil
}

// holder returns who holds addr in any Subnet.
func (a *Allocator) holder(addr netip.Addr) (string, bool) {
	for _, s := range a.subnets {
		if owner, ok := s.owners[addr]; ok {
			return owner, true
		}
	}
	return "", false
}

// lowestFree picks the lowest address of p that nobody holds, here or in another Subnet.
func (a *Allocator) lowestFree(name string, p *pool, owner string) (netip.Addr, error) {
	from := p.span.first
	for {
		u, ok := p.lowestFree(from)
		if !ok {
			return netip.Addr{}, fmt.Errorf("%s has no free address left for %q: %w", p.prefix, owner, ErrExhausted)
		}
		addr := addrOf(u, p.family)
		holder, held := a.holder(addr)
		if !held || holder == owner {
			return addr, nil
		}
		// Held through an overlapping Subnet: the caller should not let Subnets overlap, but
		// one address must never reach two owners even if it does.
		if u == p.span.last {
			return netip.Addr{}, fmt.Errorf("%s has no free address left for %q: %w", p.prefix, owner, ErrExhausted)
		}
		from = u.inc()
	}
}

// Release frees every address owner holds. It is a no-op for an unknown owner.
func (a *Allocator) Release(owner string) (subnet string, released []netip.Addr) {
	a.mu.Lock()
	defer a.mu.Unlock()
	h, ok := a.holdings[owner]
	if !ok {
		return "", nil
	}
	s := a.subnets[h.subnet]
	for _, addr := range h.addrs {
		s.free(addr)
	}
	delete(a.holdings, owner)
	return h.subnet, slices.Clone(h.addrs)
}

// Lookup returns the Subnet and addresses owner holds.
func (a *Allocator) Lookup(owner string) (subnet string, addrs []netip.Addr, ok bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	h, ok := a.holdings[owner]
	if !ok {
		return "", nil, false
	}
	return h.subnet, slices.Clone(h.addrs), true
}

// Owner returns who holds addr in subnet.
func (a *Allocator) Owner(subnet string, addr netip.Addr) (owner string, ok bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	s, ok := a.subnets[subnet]
	if !ok {
		return "", false
	}
	owner, ok = s.owners[addr]
	return owner, ok
}

// Owners lists, sorted, the owners holding addresses in subnet.
func (a *Allocator) Owners(subnet string) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	s, ok := a.subnets[subnet]
	if !ok {
		return nil
	}
	var owners []string
	for _, owner := range s.owners {
		owners = append(owners, owner)
	}
	slices.Sort(owners)
	return slices.Compact(owners)
}

// Usage reports a Subnet's counters.
//
// Used counts the addresses held, per family. Available counts the addresses Allocate could still
// hand out: the usable addresses (the CIDR less reserved addresses, gateway and exclusions) that
// nobody holds. So Used + Available is the usable count, except while an owner reported by
// SetSubnet still holds an address the new configuration does not allow (it counts as used, and
// was never available). Both saturate at math.MaxInt64.
func (a *Allocator) Usage(subnet string) (Usage, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	s, ok := a.subnets[subnet]
	if !ok {
		return Usage{}, false
	}
	var used, validUsed [2]u128 // index 0: IPv4, 1: IPv6
	for addr := range s.owners {
		i := familyIndex(FamilyOf(addr))
		used[i] = used[i].addSat(u128{lo: 1})
		if s.validHeld(addr) {
			validUsed[i] = validUsed[i].addSat(u128{lo: 1})
		}
	}
	var avail [2]u128
	for _, p := range s.pools {
		i := familyIndex(p.family)
		avail[i] = p.usable.sub(validUsed[i])
	}
	return Usage{
		V4Used: used[0].int64Sat(), V4Available: avail[0].int64Sat(),
		V6Used: used[1].int64Sat(), V6Available: avail[1].int64Sat(),
	}, true
}

func familyIndex(f Family) int {
	if f == IPv4 {
		return 0
	}
	return 1
}

// String summarises the Allocator for debugging: every Subnet and its holders.
func (a *Allocator) String() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	names := make([]string, 0, len(a.subnets))
	for name := range a.subnets {
		names = append(names, name)
	}
	slices.Sort(names)
	var b strings.Builder
	for _, name := range names {
		s := a.subnets[name]
		fmt.Fprintf(&b, "%s %s:", name, prefixList(s.cfg.CIDRs))
		addrs := make([]netip.Addr, 0, len(s.owners))
		for addr := range s.owners {
			addrs = append(addrs, addr)
		}
		slices.SortFunc(addrs, netip.Addr.Compare)
		for _, addr := range addrs {
			fmt.Fprintf(&b, " %s=%s", addr, s.owners[addr])
		}
		b.WriteString("\n")
	}
	return b.String()
}
