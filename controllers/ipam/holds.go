package ipam

import (
	"fmt"
	"net/netip"
)

// Per-address holds. The operator's source of truth is one IP object per address in the API
// server; the Allocator mirrors that set to pick candidates quickly. These methods hold and free
// single addresses under a key (the IP object's owner) instead of an owner's whole holding, so
// that a Service moving from one address to another holds both while the old one drains.

// HoldAddr records addr as held by key in subnet. Nothing is validated: an IP object exists, so
// the API server already decided. An address the configuration does not allow (or a subnet not
// configured yet) is still held and counted as used; SetSubnet keeps these holds.
func (a *Allocator) HoldAddr(subnet string, addr netip.Addr, key string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.init()
	for name, s := range a.subnets {
		if _, ok := s.owners[addr]; ok && name != subnet {
			s.free(addr)
		}
	}
	s, ok := a.subnets[subnet]
	if !ok {
		s = &subnetState{cfg: SubnetConfig{Name: subnet}, owners: map[netip.Addr]string{}}
		a.subnets[subnet] = s
	}
	s.hold(addr, key)
}

// FreeAddr forgets addr wherever it is held and returns the subnet that held it.
func (a *Allocator) FreeAddr(addr netip.Addr) (subnet string, ok bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for name, s := range a.subnets {
		if _, held := s.owners[addr]; held {
			s.free(addr)
			return name, true
		}
	}
	return "", false
}

// Holder returns the key holding addr in any subnet.
func (a *Allocator) Holder(addr netip.Addr) (key string, ok bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.holder(addr)
}

// Pick chooses, without holding it, an address of family f in subnet for key: static when it
// is valid (each refusal wraps the sentinel Allocate uses: ErrFamily, ErrOutOfRange, ErrReserved,
// ErrGateway, ErrExcluded, ErrInUse), else the lowest address nobody holds (ErrExhausted when
// none). An address key already holds counts as free for key.
func (a *Allocator) Pick(subnet string, f Family, static netip.Addr, key string) (netip.Addr, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.init()
	s, ok := a.subnets[subnet]
	if !ok || len(s.pools) == 0 {
		return netip.Addr{}, fmt.Errorf("subnet %q: cannot pick for %q: %w", subnet, key, ErrUnknownSubnet)
	}
	if static.IsValid() {
		if err := checkRequested(static); err != nil {
			return netip.Addr{}, fmt.Errorf("subnet %q: %w", subnet, err)
		}
		f = FamilyOf(static)
	}
	p := s.poolFor(f)
	if p == nil {
		what := f.String()
		if static.IsValid() {
			what = static.String() + " is " + what
		}
		return netip.Addr{}, fmt.Errorf("subnet %q: %s but the subnet serves only %s: %w", subnet, what, prefixList(s.cfg.CIDRs), ErrFamily)
	}
	if static.IsValid() {
		if err := a.checkStatic(s, p, key, static); err != nil {
			return netip.Addr{}, fmt.Errorf("subnet %q: %w", subnet, err)
		}
		return static, nil
	}
	addr, err := a.lowestFree(subnet, p, key)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("subnet %q: %w", subnet, err)
	}
	return addr, nil
}

// Families lists the families a configured subnet serves, in CIDR order.
func (a *Allocator) Families(subnet string) []Family {
	a.mu.Lock()
	defer a.mu.Unlock()
	s, ok := a.subnets[subnet]
	if !ok {
		return nil
	}
	out := make([]Family, len(s.pools))
	for i, p := range s.pools {
		out[i] = p.family
	}
	return out
}

// CheckAddr tells why cfg would not hand out addr (the sentinels of Pick, bar ErrInUse), or nil.
func CheckAddr(cfg SubnetConfig, addr netip.Addr) error {
	if err := checkRequested(addr); err != nil {
		return err
	}
	for i, c := range cfg.CIDRs {
		if FamilyOf(c.Addr()) != FamilyOf(addr) {
			continue
		}
		var gw netip.Addr
		if i < len(cfg.Gateways) {
			gw = cfg.Gateways[i]
		}
		return newPool(c, gw, cfg.Excludes).check(addr)
	}
	return fmt.Errorf("%s is %s but the subnet serves only %s: %w", addr, FamilyOf(addr), prefixList(cfg.CIDRs), ErrFamily)
}

// CountUsage is the Usage of cfg when exactly held are held.
func CountUsage(cfg SubnetConfig, held []netip.Addr) Usage {
	a := New()
	a.SetSubnet(cfg)
	for _, h := range held {
		a.HoldAddr(cfg.Name, h, "")
	}
	u, _ := a.Usage(cfg.Name)
	return u
}
