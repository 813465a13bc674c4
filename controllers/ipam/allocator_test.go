package ipam

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"reflect"
	"sync"
	"testing"
)

// subnet parses a Subnet or fails the test.
// subnet parses a Subnet without ParseSubnet's unicast check: the allocator's arithmetic is
// tested at the very top of the address space too (multicast and 240.0.0.0/4 as Subnets).
func subnet(t testing.TB, name, cidrBlock, gateway string, excludes ...string) SubnetConfig {
	t.Helper()
	cfg, err := parseSubnet(name, "", cidrBlock, gateway, excludes)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// seedSubnet is the seed's attach-subnet.
func seedSubnet(t testing.TB) SubnetConfig {
	return subnet(t, "attach-subnet", "172.18.0.0/16", "172.18.0.1", "172.18.0.0..172.18.0.10")
}

func allocator(t testing.TB, cfgs ...SubnetConfig) *Allocator {
	t.Helper()
	a := New()
	for _, cfg := range cfgs {
		if invalid := a.SetSubnet(cfg); invalid != nil {
			t.Fatalf("new subnet %s reported invalid owners %v", cfg.Name, invalid)
		}
	}
	return a
}

func mustAllocate(t testing.TB, a *Allocator, subnet, owner string, requested ...string) []netip.Addr {
	t.Helper()
	got, err := a.Allocate(subnet, owner, mustAddrs(t, requested...))
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func wantAddrs(t testing.TB, got []netip.Addr, want ...string) {
	t.Helper()
	if !reflect.DeepEqual(got, mustAddrs(t, want...)) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

func wantUsage(t testing.TB, a *Allocator, subnet string, want Usage) {
	t.Helper()
	got, ok := a.Usage(subnet)
	if !ok || got != want {
		t.Fatalf("usage of %s: got %+v (known %v), want %+v", subnet, got, ok, want)
	}
}

func TestSeedSubnet(t *testing.T) {
	a := allocator(t, seedSubnet(t))
	// 172.18.0.0/16 has 65536 addresses, 65534 hosts once the network (.0.0) and broadcast
	// (.255.255) addresses are set aside. The exclusion .0.0-.0.10 covers the network address
	// (already not a host) and the ten hosts .0.1-.0.10, one of which is the gateway .0.1: so the
	// gateway costs nothing extra and 65534 - 10 = 65524 addresses can be handed out.
	wantUsage(t, a, "attach-subnet", Usage{V4Used: 0, V4Available: 65524})

	wantAddrs(t, mustAllocate(t, a, "attach-subnet", "default/test-service"), "172.18.0.11")
	wantAddrs(t, mustAllocate(t, a, "attach-subnet", "default/second"), "172.18.0.12")
	wantAddrs(t, mustAllocate(t, a, "attach-subnet", "default/static", "172.18.0.18"), "172.18.0.18")
	wantUsage(t, a, "attach-subnet", Usage{V4Used: 3, V4Available: 65521})

	// The dynamic choice steps over the static .18 only when it gets there.
	for i := 13; i <= 17; i++ {
		wantAddrs(t, mustAllocate(t, a, "attach-subnet", fmt.Sprintf("default/svc-%d", i)), fmt.Sprintf("172.18.0.%d", i))
	}
	wantAddrs(t, mustAllocate(t, a, "attach-subnet", "default/after-static"), "172.18.0.19")

	if owner, ok := a.Owner("attach-subnet", netip.MustParseAddr("172.18.0.18")); !ok || owner != "default/static" {
		t.Fatalf("owner of .18: %q %v", owner, ok)
	}
	if _, ok := a.Owner("attach-subnet", netip.MustParseAddr("172.18.0.20")); ok {
		t.Fatal(".20 has an owner")
	}
	subnet, addrs, ok := a.Lookup("default/test-service")
	if !ok || subnet != "attach-subnet" || !reflect.DeepEqual(addrs, mustAddrs(t, "172.18.0.11")) {
		t.Fatalf("lookup: %q %v %v", subnet, addrs, ok)
	}
	wantOwners := []string{"default/after-static", "default/second", "default/static", "default/svc-13", "default/svc-14",
		"default/svc-15", "default/svc-16", "default/svc-17", "default/test-service"}
	if got := a.Owners("attach-subnet"); !reflect.DeepEqual(got, wantOwners) {
		t.Fatalf("owners: %v", got)
	}
}

func TestAllocateStatic(t *testing.T) {
	seed := seedSubnet(t)
	dual := subnet(t, "dual", "172.20.0.0/24,fd00:20::/120", "")
	tests := map[string]struct {
		subnet    string
		requested []string
		want      []string
		wantErr   error
		wantMsg   string
	}{
		"inside":       {subnet: "attach-subnet", requested: []string{"172.18.0.18"}, want: []string{"172.18.0.18"}},
		"highest host": {subnet: "attach-subnet", requested: []string{"172.18.255.254"}, want: []string{"172.18.255.254"}},
		"outside": {subnet: "attach-subnet", requested: []string{"172.19.0.5"}, wantErr: ErrOutOfRange,
			wantMsg: `subnet "attach-subnet": 172.19.0.5 is outside 172.18.0.0/16: address outside subnet`},
		"excluded": {subnet: "attach-subnet", requested: []string{"172.18.0.5"}, wantErr: ErrExcluded,
			wantMsg: `subnet "attach-subnet": 172.18.0.5 is in the subnet's excludeIps: address excluded`},
		"gateway (also excluded: the gateway says more)": {subnet: "attach-subnet", requested: []string{"172.18.0.1"}, wantErr: ErrGateway,
			wantMsg: `subnet "attach-subnet": 172.18.0.1 is the gateway of 172.18.0.0/16: address is the subnet gateway`},
		"network (also excluded)": {subnet: "attach-subnet", requested: []string{"172.18.0.0"}, wantErr: ErrReserved,
			wantMsg: `subnet "attach-subnet": 172.18.0.0 is the network address of 172.18.0.0/16: address is the network or broadcast address`},
		"broadcast": {subnet: "attach-subnet", requested: []string{"172.18.255.255"}, wantErr: ErrReserved,
			wantMsg: `subnet "attach-subnet": 172.18.255.255 is the broadcast address of 172.18.0.0/16: address is the network or broadcast address`},
		"taken": {subnet: "attach-subnet", requested: []string{"172.18.0.11"}, wantErr: ErrInUse,
			wantMsg: `subnet "attach-subnet": 172.18.0.11 is held by "default/first": address already allocated`},
		"family not served": {subnet: "attach-subnet", requested: []string{"fd00::5"}, wantErr: ErrFamily,
			wantMsg: `subnet "attach-subnet": fd00::5 is IPv6 but the subnet serves only 172.18.0.0/16: address family not served by subnet`},
		"two of one family": {subnet: "dual", requested: []string{"172.20.0.5", "172.20.0.6"}, wantErr: ErrFamily,
			wantMsg: `subnet "dual": 172.20.0.5 and 172.20.0.6 are both IPv4; a Service gets one address per family: address family not served by subnet`},
		"IPv4-mapped": {subnet: "attach-subnet", requested: []string{"::ffff:172.18.0.18"}, wantErr: ErrFamily,
			wantMsg: `subnet "attach-subnet": ::ffff:172.18.0.18 is an IPv4-mapped IPv6 address; request 172.18.0.18 instead: address family not served by subnet`},
		"IPv6 anycast": {subnet: "dual", requested: []string{"fd00:20::"}, wantErr: ErrReserved,
			wantMsg: `subnet "dual": fd00:20:: is the subnet-router anycast address of fd00:20::/120: address is the network or broadcast address`},
		"dual, both static, IPv6 first": {subnet: "dual", requested: []string{"fd00:20::9", "172.20.0.9"}, want: []string{"172.20.0.9", "fd00:20::9"}},
		"dual, IPv6 static only":        {subnet: "dual", requested: []string{"fd00:20::9"}, want: []string{"172.20.0.2", "fd00:20::9"}},
		"unknown subnet": {subnet: "nope", wantErr: ErrUnknownSubnet,
			wantMsg: `subnet "nope": cannot allocate for "default/svc": unknown subnet`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			a := allocator(t, seed, dual)
			wantAddrs(t, mustAllocate(t, a, "attach-subnet", "default/first"), "172.18.0.11")
			got, err := a.Allocate(tc.subnet, "default/svc", mustAddrs(t, tc.requested...))
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) || err.Error() != tc.wantMsg {
					t.Fatalf("error:\n got %v\nwant %s", err, tc.wantMsg)
				}
				if _, _, ok := a.Lookup("default/svc"); ok {
					t.Fatal("a failed allocation left a holding")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			wantAddrs(t, got, tc.want...)
		})
	}
}

func TestAllocateZeroAndZoned(t *testing.T) {
	a := allocator(t, subnet(t, "v6", "fd00:20::/64", ""))
	if _, err := a.Allocate("v6", "o", []netip.Addr{{}}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("zero address: %v", err)
	}
	if _, err := a.Allocate("v6", "o", []netip.Addr{netip.MustParseAddr("fd00:20::5%net1")}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("zoned address: %v", err)
	}
}

func TestExhaustion(t *testing.T) {
	// A /30 has hosts .1 and .2; the gateway .1 leaves one.
	a := allocator(t, subnet(t, "tiny", "10.9.0.0/30", ""))
	wantUsage(t, a, "tiny", Usage{V4Available: 1})
	wantAddrs(t, mustAllocate(t, a, "tiny", "ns/a"), "10.9.0.2")
	wantUsage(t, a, "tiny", Usage{V4Used: 1, V4Available: 0})
	_, err := a.Allocate("tiny", "ns/b", nil)
	if want := `subnet "tiny": 10.9.0.0/30 has no free address left for "ns/b": no free address left`; !errors.Is(err, ErrExhausted) || err.Error() != want {
		t.Fatalf("got %v, want %s", err, want)
	}
	// Asking again for what one holds is not exhaustion.
	wantAddrs(t, mustAllocate(t, a, "tiny", "ns/a"), "10.9.0.2")
	a.Release("ns/a")
	wantAddrs(t, mustAllocate(t, a, "tiny", "ns/b"), "10.9.0.2")
}

func TestPointToPointPrefixes(t *testing.T) {
	// RFC 3021: both addresses of a /31 are hosts; with one as gateway one is left.
	a := allocator(t, subnet(t, "p2p", "192.168.77.0/31", "192.168.77.1"))
	wantUsage(t, a, "p2p", Usage{V4Available: 1})
	wantAddrs(t, mustAllocate(t, a, "p2p", "ns/a"), "192.168.77.0")

	// Without a gateway (a hand-built config) a /31 has two and a /32 one.
	a = allocator(t,
		SubnetConfig{Name: "p2p", CIDRs: mustPrefixes(t, "192.168.77.0/31")},
		SubnetConfig{Name: "host", CIDRs: mustPrefixes(t, "192.168.78.9/32")})
	wantUsage(t, a, "p2p", Usage{V4Available: 2})
	wantUsage(t, a, "host", Usage{V4Available: 1})
	wantAddrs(t, mustAllocate(t, a, "p2p", "ns/a"), "192.168.77.0")
	wantAddrs(t, mustAllocate(t, a, "p2p", "ns/b"), "192.168.77.1")
	wantAddrs(t, mustAllocate(t, a, "host", "ns/c"), "192.168.78.9")
	if _, err := a.Allocate("host", "ns/d", nil); !errors.Is(err, ErrExhausted) {
		t.Fatalf("got %v", err)
	}

	// Through ParseSubnet a /32 needs its only address as gateway: nothing is left to hand out.
	a = allocator(t, subnet(t, "host", "192.168.78.9/32", "192.168.78.9"))
	wantUsage(t, a, "host", Usage{V4Available: 0})
}

func TestDual(t *testing.T) {
	a := allocator(t, subnet(t, "dual", "fd00:18::/64,172.18.0.0/16", "", "172.18.0.2", "fd00:18::2..fd00:18::ff"))
	// IPv6 /64: 2^64 addresses less the anycast, gateway and 254 excluded: far above MaxInt64.
	wantUsage(t, a, "dual", Usage{V4Available: 65534 - 2, V6Available: math.MaxInt64})
	wantAddrs(t, mustAllocate(t, a, "dual", "ns/a"), "172.18.0.3", "fd00:18::100")
	wantAddrs(t, mustAllocate(t, a, "dual", "ns/b"), "172.18.0.4", "fd00:18::101")
	wantUsage(t, a, "dual", Usage{V4Used: 2, V4Available: 65530, V6Used: 2, V6Available: math.MaxInt64})
	subnet, released := a.Release("ns/a")
	if subnet != "dual" || !reflect.DeepEqual(released, mustAddrs(t, "172.18.0.3", "fd00:18::100")) {
		t.Fatalf("release: %q %v", subnet, released)
	}
	wantAddrs(t, mustAllocate(t, a, "dual", "ns/c", "fd00:18::ffff"), "172.18.0.3", "fd00:18::ffff")
}

func TestIPv6(t *testing.T) {
	a := allocator(t, subnet(t, "v6", "fd00:18::/120", ""))
	// 256 addresses less the subnet-router anycast fd00:18:: and the gateway fd00:18::1.
	wantUsage(t, a, "v6", Usage{V6Available: 254})
	wantAddrs(t, mustAllocate(t, a, "v6", "ns/a"), "fd00:18::2")
	wantAddrs(t, mustAllocate(t, a, "v6", "ns/b", "fd00:18::ff"), "fd00:18::ff")
	wantUsage(t, a, "v6", Usage{V6Used: 2, V6Available: 252})

	// The top of the IPv6 space: nothing overflows past ffff...ffff.
	a = allocator(t, subnet(t, "top", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffc/126", "", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe..ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"))
	wantUsage(t, a, "top", Usage{V6Available: 0})
	if _, err := a.Allocate("top", "ns/a", nil); !errors.Is(err, ErrExhausted) {
		t.Fatalf("got %v", err)
	}
	a = allocator(t, subnet(t, "top", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffc/126", ""))
	wantAddrs(t, mustAllocate(t, a, "top", "ns/a"), "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe")
	wantAddrs(t, mustAllocate(t, a, "top", "ns/b"), "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff")
	if _, err := a.Allocate("top", "ns/c", nil); !errors.Is(err, ErrExhausted) {
		t.Fatalf("got %v", err)
	}
}

func TestHugeExclusions(t *testing.T) {
	// All of a /8 but its last 256 addresses excluded, in one range and in 1024 pieces: either
	// way the search steps over ranges, never address by address.
	var pieces []string
	for i := 0; i < 1024; i++ {
		first := netip.AddrFrom4([4]byte{10, byte(i >> 2), byte(i&3) << 6, 0})
		last := netip.AddrFrom4([4]byte{10, byte(i >> 2), byte(i&3)<<6 | 63, 255})
		pieces = append(pieces, first.String()+".."+last.String())
	}
	pieces[1023] = "10.255.192.0..10.255.254.255"
	for name, excludes := range map[string][]string{"one range": {"10.0.0.0..10.255.254.255"}, "1024 ranges": pieces} {
		t.Run(name, func(t *testing.T) {
			a := allocator(t, subnet(t, "big", "10.0.0.0/8", "", excludes...))
			// 10.255.255.0-.255 remain, less the broadcast .255.
			wantUsage(t, a, "big", Usage{V4Available: 255})
			wantAddrs(t, mustAllocate(t, a, "big", "ns/a"), "10.255.255.0")
			wantAddrs(t, mustAllocate(t, a, "big", "ns/b"), "10.255.255.1")
			wantUsage(t, a, "big", Usage{V4Used: 2, V4Available: 253})
		})
	}
}

func TestIdempotentAndMoves(t *testing.T) {
	seed := seedSubnet(t)
	other := subnet(t, "other", "172.30.0.0/24", "")
	a := allocator(t, seed, other)
	wantAddrs(t, mustAllocate(t, a, "attach-subnet", "ns/a"), "172.18.0.11")
	wantAddrs(t, mustAllocate(t, a, "attach-subnet", "ns/a"), "172.18.0.11")
	// A static request naming what one holds is satisfied; so is no request after a static one.
	wantAddrs(t, mustAllocate(t, a, "attach-subnet", "ns/a", "172.18.0.11"), "172.18.0.11")
	wantUsage(t, a, "attach-subnet", Usage{V4Used: 1, V4Available: 65523})

	// A different static request moves the owner; the old address is free afterwards.
	wantAddrs(t, mustAllocate(t, a, "attach-subnet", "ns/a", "172.18.0.18"), "172.18.0.18")
	if _, ok := a.Owner("attach-subnet", netip.MustParseAddr("172.18.0.11")); ok {
		t.Fatal(".11 still held")
	}
	wantUsage(t, a, "attach-subnet", Usage{V4Used: 1, V4Available: 65523})

	// A failed move keeps what the owner had.
	wantAddrs(t, mustAllocate(t, a, "attach-subnet", "ns/b"), "172.18.0.11")
	for _, req := range []string{"172.18.0.11", "172.18.0.1", "172.19.0.1"} {
		if _, err := a.Allocate("attach-subnet", "ns/a", mustAddrs(t, req)); err == nil {
			t.Fatalf("moving to %s succeeded", req)
		}
		if subnet, addrs, _ := a.Lookup("ns/a"); subnet != "attach-subnet" || !reflect.DeepEqual(addrs, mustAddrs(t, "172.18.0.18")) {
			t.Fatalf("after a failed move to %s: %s %v", req, subnet, addrs)
		}
	}
	if _, err := a.Allocate("other", "ns/a", mustAddrs(t, "172.30.0.1")); !errors.Is(err, ErrGateway) {
		t.Fatalf("got %v", err)
	}
	if subnet, _, _ := a.Lookup("ns/a"); subnet != "attach-subnet" {
		t.Fatalf("a failed move to another subnet moved the owner to %q", subnet)
	}

	// Moving to another Subnet frees the old address once the new one is secured.
	wantAddrs(t, mustAllocate(t, a, "other", "ns/a"), "172.30.0.2")
	if _, ok := a.Owner("attach-subnet", netip.MustParseAddr("172.18.0.18")); ok {
		t.Fatal(".18 still held after the move")
	}
	if got := a.Owners("attach-subnet"); !reflect.DeepEqual(got, []string{"ns/b"}) {
		t.Fatalf("owners: %v", got)
	}
	wantUsage(t, a, "attach-subnet", Usage{V4Used: 1, V4Available: 65523})
	wantUsage(t, a, "other", Usage{V4Used: 1, V4Available: 252})
}

func TestReleaseAndReallocate(t *testing.T) {
	a := allocator(t, seedSubnet(t))
	for i := 0; i < 5; i++ {
		mustAllocate(t, a, "attach-subnet", fmt.Sprintf("ns/%d", i))
	}
	subnet, released := a.Release("ns/1")
	if subnet != "attach-subnet" || !reflect.DeepEqual(released, mustAddrs(t, "172.18.0.12")) {
		t.Fatalf("release: %q %v", subnet, released)
	}
	if subnet, released := a.Release("ns/1"); subnet != "" || released != nil {
		t.Fatalf("second release: %q %v", subnet, released)
	}
	wantAddrs(t, mustAllocate(t, a, "attach-subnet", "ns/new"), "172.18.0.12")
	wantAddrs(t, mustAllocate(t, a, "attach-subnet", "ns/newer"), "172.18.0.16")
	// Releasing from the middle of a run splits it correctly.
	a.Release("ns/3")
	a.Release("ns/2")
	wantAddrs(t, mustAllocate(t, a, "attach-subnet", "ns/x"), "172.18.0.13")
	wantAddrs(t, mustAllocate(t, a, "attach-subnet", "ns/y"), "172.18.0.14")
	wantAddrs(t, mustAllocate(t, a, "attach-subnet", "ns/z"), "172.18.0.17")
}

func TestSetSubnet(t *testing.T) {
	a := allocator(t, subnet(t, "s", "172.18.0.0/24", "", "172.18.0.2..172.18.0.9"))
	wantAddrs(t, mustAllocate(t, a, "s", "ns/a"), "172.18.0.10")
	wantAddrs(t, mustAllocate(t, a, "s", "ns/b"), "172.18.0.11")
	wantAddrs(t, mustAllocate(t, a, "s", "ns/c", "172.18.0.200"), "172.18.0.200")
	// 254 hosts - gateway - 8 excluded = 245.
	wantUsage(t, a, "s", Usage{V4Used: 3, V4Available: 242})

	// Shrinking the exclusions: nobody is invalid, and the lowest free address is now .2.
	if invalid := a.SetSubnet(subnet(t, "s", "172.18.0.0/24", "")); invalid != nil {
		t.Fatalf("invalid: %v", invalid)
	}
	wantUsage(t, a, "s", Usage{V4Used: 3, V4Available: 250})
	wantAddrs(t, mustAllocate(t, a, "s", "ns/d"), "172.18.0.2")

	// Growing the exclusions over .10 and moving the gateway onto .11 invalidates ns/a and ns/b.
	invalid := a.SetSubnet(subnet(t, "s", "172.18.0.0/24", "172.18.0.11", "172.18.0.10"))
	if !reflect.DeepEqual(invalid, []string{"ns/a", "ns/b"}) {
		t.Fatalf("invalid: %v", invalid)
	}
	// Held addresses stay held (counted as used) until moved. Usable: 254 - gateway - 1 excluded
	// = 252; of the four held, .2 and .200 are usable: 250 available.
	wantUsage(t, a, "s", Usage{V4Used: 4, V4Available: 250})
	if owner, _ := a.Owner("s", netip.MustParseAddr("172.18.0.10")); owner != "ns/a" {
		t.Fatalf("owner of .10: %q", owner)
	}
	// Allocate moves them to the lowest free addresses.
	wantAddrs(t, mustAllocate(t, a, "s", "ns/a"), "172.18.0.1")
	wantAddrs(t, mustAllocate(t, a, "s", "ns/b"), "172.18.0.3")
	wantUsage(t, a, "s", Usage{V4Used: 4, V4Available: 248})

	// Shrinking the CIDR puts .200 outside; adding IPv6 leaves everybody short of a family.
	invalid = a.SetSubnet(subnet(t, "s", "172.18.0.0/25,fd00:18::/120", "172.18.0.11"))
	if !reflect.DeepEqual(invalid, []string{"ns/a", "ns/b", "ns/c", "ns/d"}) {
		t.Fatalf("invalid: %v", invalid)
	}
	wantAddrs(t, mustAllocate(t, a, "s", "ns/a"), "172.18.0.1", "fd00:18::2")
	wantAddrs(t, mustAllocate(t, a, "s", "ns/c"), "172.18.0.4", "fd00:18::3")
	if _, ok := a.Owner("s", netip.MustParseAddr("172.18.0.200")); ok {
		t.Fatal(".200 still held")
	}
	// 126 hosts - gateway = 125, three held; 254 IPv6, two held; ns/b and ns/d hold no IPv6 yet.
	wantUsage(t, a, "s", Usage{V4Used: 4, V4Available: 121, V6Used: 2, V6Available: 252})

	// Dropping IPv4 leaves IPv4 addresses held but invalid.
	invalid = a.SetSubnet(subnet(t, "s", "fd00:18::/120", ""))
	if !reflect.DeepEqual(invalid, []string{"ns/a", "ns/b", "ns/c", "ns/d"}) {
		t.Fatalf("invalid: %v", invalid)
	}
	wantUsage(t, a, "s", Usage{V4Used: 4, V4Available: 0, V6Used: 2, V6Available: 252})
	wantAddrs(t, mustAllocate(t, a, "s", "ns/a"), "fd00:18::2")
	wantUsage(t, a, "s", Usage{V4Used: 3, V4Available: 0, V6Used: 2, V6Available: 252})

	// RemoveSubnet forgets everything.
	a.RemoveSubnet("s")
	if _, ok := a.Usage("s"); ok {
		t.Fatal("usage of a removed subnet")
	}
	if _, _, ok := a.Lookup("ns/a"); ok {
		t.Fatal("holding survived RemoveSubnet")
	}
	if got := a.Owners("s"); got != nil {
		t.Fatalf("owners: %v", got)
	}
	a.RemoveSubnet("s")
}

func TestOverlappingSubnetsNeverShare(t *testing.T) {
	a := allocator(t, subnet(t, "wide", "172.18.0.0/16", ""), subnet(t, "narrow", "172.18.0.0/24", ""))
	wantAddrs(t, mustAllocate(t, a, "wide", "ns/a"), "172.18.0.2")
	wantAddrs(t, mustAllocate(t, a, "narrow", "ns/b"), "172.18.0.3")
	if _, err := a.Allocate("wide", "ns/c", mustAddrs(t, "172.18.0.3")); !errors.Is(err, ErrInUse) {
		t.Fatalf("got %v", err)
	}
	// An owner moving between them may keep its address.
	wantAddrs(t, mustAllocate(t, a, "narrow", "ns/a", "172.18.0.2"), "172.18.0.2")
	if owner, ok := a.Owner("wide", netip.MustParseAddr("172.18.0.2")); ok {
		t.Fatalf("still held in wide by %q", owner)
	}
}

func TestZeroAllocator(t *testing.T) {
	var a Allocator
	if _, err := a.Allocate("s", "o", nil); !errors.Is(err, ErrUnknownSubnet) {
		t.Fatalf("got %v", err)
	}
	a.SetSubnet(subnet(t, "s", "10.0.0.0/24", ""))
	wantAddrs(t, mustAllocate(t, &a, "s", "o"), "10.0.0.2")
}

func TestConcurrentStatic(t *testing.T) {
	a := allocator(t, seedSubnet(t))
	want := netip.MustParseAddr("172.18.0.18")
	var wg sync.WaitGroup
	errs := make([]error, 50)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = a.Allocate("attach-subnet", fmt.Sprintf("ns/svc-%d", i), []netip.Addr{want})
		}()
	}
	wg.Wait()
	winner, ok := a.Owner("attach-subnet", want)
	if !ok {
		t.Fatal("nobody holds the address")
	}
	wins, inUse := 0, 0
	for i, err := range errs {
		switch {
		case err == nil:
			wins++
			if fmt.Sprintf("ns/svc-%d", i) != winner {
				t.Errorf("ns/svc-%d succeeded but %s holds it", i, winner)
			}
		case errors.Is(err, ErrInUse) && err.Error() == fmt.Sprintf(`subnet "attach-subnet": 172.18.0.18 is held by %q: address already allocated`, winner):
			inUse++
		default:
			t.Errorf("ns/svc-%d: %v", i, err)
		}
	}
	if wins != 1 || inUse != 49 {
		t.Fatalf("%d won, %d got ErrInUse", wins, inUse)
	}
	wantUsage(t, a, "attach-subnet", Usage{V4Used: 1, V4Available: 65523})
}

func TestConfigIsCopied(t *testing.T) {
	cfg := subnet(t, "s", "10.0.0.0/24", "", "10.0.0.2")
	a := allocator(t, cfg)
	cfg.Excludes[0] = rng("10.0.0.3", "10.0.0.3")
	wantAddrs(t, mustAllocate(t, a, "s", "o"), "10.0.0.3")
	got, ok := a.Config("s")
	if !ok || got.Excludes[0] != rng("10.0.0.2", "10.0.0.2") {
		t.Fatalf("config: %+v", got)
	}
	if _, ok := a.Config("nope"); ok {
		t.Fatal("config of an unknown subnet")
	}
}

func TestWholeAddressSpaces(t *testing.T) {
	// Hand-built (ParseSubnet refuses ::/0 for holding the IPv4-mapped block): the arithmetic
	// must neither overflow nor scan.
	a := allocator(t,
		SubnetConfig{Name: "all4", CIDRs: mustPrefixes(t, "0.0.0.0/0"), Gateways: mustAddrs(t, "0.0.0.1")},
		SubnetConfig{Name: "all6", CIDRs: mustPrefixes(t, "::/0")},
		SubnetConfig{Name: "top6", CIDRs: mustPrefixes(t, "::/0"), Excludes: []Range{rng("::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe")}})
	// 2^32 less network, broadcast and gateway.
	wantUsage(t, a, "all4", Usage{V4Available: 1<<32 - 3})
	wantAddrs(t, mustAllocate(t, a, "all4", "ns/a"), "0.0.0.2")
	wantAddrs(t, mustAllocate(t, a, "all4", "ns/b", "255.255.255.254"), "255.255.255.254")
	wantUsage(t, a, "all4", Usage{V4Used: 2, V4Available: 1<<32 - 5})
	wantUsage(t, a, "all6", Usage{V6Available: math.MaxInt64})
	wantAddrs(t, mustAllocate(t, a, "all6", "ns/c"), "::1")
	wantUsage(t, a, "top6", Usage{V6Available: 1})
	wantAddrs(t, mustAllocate(t, a, "top6", "ns/d"), "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff")
	wantUsage(t, a, "top6", Usage{V6Used: 1, V6Available: 0})
}

func TestAddrMath(t *testing.T) {
	for _, s := range []string{"0.0.0.0", "10.1.2.3", "255.255.255.255", "::", "fd00::1", "::ffff:10.1.2.3", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "1:2:3:4:5:6:7:8"} {
		a := netip.MustParseAddr(s)
		if got := addrOf(toU128(a), FamilyOf(a)); got != a {
			t.Errorf("%s: round trip gave %s", s, got)
		}
	}
	spans := map[string][2]string{
		"10.0.0.0/8":         {"10.0.0.0", "10.255.255.255"},
		"10.0.0.5/32":        {"10.0.0.5", "10.0.0.5"},
		"0.0.0.0/0":          {"0.0.0.0", "255.255.255.255"},
		"fd00::/64":          {"fd00::", "fd00::ffff:ffff:ffff:ffff"},
		"fd00::/63":          {"fd00::", "fd00::1:ffff:ffff:ffff:ffff"},
		"fd00::/65":          {"fd00::", "fd00::7fff:ffff:ffff:ffff"},
		"::/0":               {"::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"},
		"fd00::8/128":        {"fd00::8", "fd00::8"},
		"2001:db8:8000::/33": {"2001:db8:8000::", "2001:db8:ffff:ffff:ffff:ffff:ffff:ffff"},
	}
	for p, want := range spans {
		prefix := netip.MustParsePrefix(p)
		s := prefixSpan(prefix)
		f := FamilyOf(prefix.Addr())
		if got := [2]string{addrOf(s.first, f).String(), addrOf(s.last, f).String()}; got != want {
			t.Errorf("%s: got %v, want %v", p, got, want)
		}
	}
	u := func(n uint64) u128 { return u128{lo: n} }
	got := mergeSpans([]span{{u(10), u(12)}, {u(1), u(3)}, {u(4), u(5)}, {u(11), u(20)}, {u(22), u(22)}, {u(7), u(7)}})
	want := []span{{u(1), u(5)}, {u(7), u(7)}, {u(10), u(20)}, {u(22), u(22)}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("merge: got %v, want %v", got, want)
	}
	var set spanSet
	for _, n := range []uint64{5, 7, 6, 1, 9, 6} {
		set.add(u(n))
	}
	if want := []span{{u(1), u(1)}, {u(5), u(7)}, {u(9), u(9)}}; !reflect.DeepEqual(set.runs, want) {
		t.Errorf("add: got %v, want %v", set.runs, want)
	}
	for _, n := range []uint64{6, 1, 42} {
		set.remove(u(n))
	}
	if want := []span{{u(5), u(5)}, {u(7), u(7)}, {u(9), u(9)}}; !reflect.DeepEqual(set.runs, want) {
		t.Errorf("remove: got %v, want %v", set.runs, want)
	}
	if got := (span{u128{}, maxU128}).size(); got != maxU128 {
		t.Errorf("size of everything: %v", got)
	}
	if got := (u128{hi: 1}).int64Sat(); got != math.MaxInt64 {
		t.Errorf("saturation: %d", got)
	}
}
