package ipam

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
	"time"
)

// naiveAllocator is the baseline the benchmarks compare with: a map of used addresses and a scan
// from the first address of the CIDR, one address at a time, checking each against the gateway,
// the reserved addresses and every exclusion.
type naiveAllocator struct {
	cfg       SubnetConfig
	broadcast netip.Addr // IPv4 only
	used      map[netip.Addr]string
}

func newNaive(cfg SubnetConfig) *naiveAllocator {
	n := &naiveAllocator{cfg: cfg, used: map[netip.Addr]string{}}
	if p := cfg.CIDRs[0]; p.Addr().Is4() && p.Bits() <= 30 {
		n.broadcast = lastOf(p)
	}
	return n
}

func (n *naiveAllocator) usable(a netip.Addr) bool {
	if a == n.cfg.CIDRs[0].Addr() || a == n.broadcast || a == n.cfg.Gateways[0] {
		return false
	}
	for _, r := range n.cfg.Excludes {
		if !a.Less(r.First) && !r.Last.Less(a) {
			return false
		}
	}
	return true
}

func (n *naiveAllocator) allocate(owner string) (netip.Addr, bool) {
	p := n.cfg.CIDRs[0]
	for a := p.Addr(); p.Contains(a); a = a.Next() {
		if _, taken := n.used[a]; !taken && n.usable(a) {
			n.used[a] = owner
			return a, true
		}
	}
	return netip.Addr{}, false
}

func (n *naiveAllocator) allocateStatic(owner string, a netip.Addr) bool {
	if _, taken := n.used[a]; taken || !n.usable(a) {
		return false
	}
	n.used[a] = owner
	return true
}

var benchOwners = func() []string {
	owners := make([]string, 1000)
	for i := range owners {
		owners[i] = fmt.Sprintf("bench/svc-%d", i)
	}
	return owners
}()

// naiveTime measures one round of the baseline and caches it per case: the testing package calls
// a benchmark function several times with a growing b.N, and the baseline (hundreds of
// milliseconds where it scans exclusions) must not be scaled with it.
var naiveTime = map[string]time.Duration{}

func reportBaseline(b *testing.B, name string, round func()) {
	b.Helper()
	d, ok := naiveTime[name]
	if !ok {
		start := time.Now()
		round()
		d = time.Since(start)
		naiveTime[name] = d
	}
	perOp := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	b.ReportMetric(float64(d.Nanoseconds()), "naive-ns/op")
	b.ReportMetric(float64(d.Nanoseconds())/perOp, "speedup")
}

// BenchmarkAllocate: one op is 1000 sequential dynamic allocations into a fresh Allocator.
func BenchmarkAllocate(b *testing.B) {
	cases := []struct {
		name     string
		cfg      SubnetConfig
		baseline bool // the naive scan of 16 million excluded addresses per allocation takes hours
	}{
		{"v4-16-seed", seedSubnet(b), true},
		{"v4-8-exclude-65536", subnet(b, "s", "10.0.0.0/8", "", "10.0.0.0..10.0.255.255"), true},
		{"v4-8-exclude-16M", subnet(b, "s", "10.0.0.0/8", "", "10.0.0.0..10.254.255.255"), false},
		{"v6-64", subnet(b, "s", "fd00:18::/64", ""), true},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				a := New()
				a.SetSubnet(tc.cfg)
				b.StartTimer()
				for _, owner := range benchOwners {
					if _, err := a.Allocate(tc.cfg.Name, owner, nil); err != nil {
						b.Fatal(err)
					}
				}
			}
			if tc.baseline {
				reportBaseline(b, "dynamic/"+tc.name, func() {
					n := newNaive(tc.cfg)
					for _, owner := range benchOwners {
						if _, ok := n.allocate(owner); !ok {
							b.Fatal("naive allocator exhausted")
						}
					}
				})
			}
		})
	}
}

// BenchmarkAllocateStatic: one op is 1000 static allocations of scattered addresses of the
// seed's /16 into a fresh Allocator.
func BenchmarkAllocateStatic(b *testing.B) {
	cfg := seedSubnet(b)
	r := rand.New(rand.NewPCG(1, 2))
	var addrs []netip.Addr
	for len(addrs) < len(benchOwners) {
		a := netip.AddrFrom4([4]byte{172, 18, byte(r.IntN(256)), byte(r.IntN(256))})
		if validIn(cfg, a) == nil && !slices.Contains(addrs, a) {
			addrs = append(addrs, a)
		}
	}
	for b.Loop() {
		b.StopTimer()
		a := New()
		a.SetSubnet(cfg)
		b.StartTimer()
		for i, owner := range benchOwners {
			if _, err := a.Allocate(cfg.Name, owner, addrs[i:i+1]); err != nil {
				b.Fatal(err)
			}
		}
	}
	reportBaseline(b, "static", func() {
		n := newNaive(cfg)
		for i, owner := range benchOwners {
			if !n.allocateStatic(owner, addrs[i]) {
				b.Fatal("naive allocator refused", addrs[i])
			}
		}
	})
}
