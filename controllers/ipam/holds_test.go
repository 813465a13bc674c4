package ipam

import (
	"errors"
	"net/netip"
	"testing"
)

func TestPerAddressHolds(t *testing.T) {
	a := New()
	cfg, err := ParseSubnet("s", "Dual", "10.0.0.0/29,fd00::/125", "", []string{"10.0.0.2"})
	if err != nil {
		t.Fatal(err)
	}
	// A hold that arrives before its subnet is configured survives the configuration.
	a.HoldAddr("s", netip.MustParseAddr("10.0.0.3"), "ns/a/1")
	a.SetSubnet(cfg)

	got, err := a.Pick("s", IPv4, netip.Addr{}, "ns/b/2")
	if err != nil || got != netip.MustParseAddr("10.0.0.4") {
		t.Fatalf("dynamic pick = %v, %v; want 10.0.0.4 (.1 gateway, .2 excluded, .3 held)", got, err)
	}
	// Picking does not hold.
	if again, _ := a.Pick("s", IPv4, netip.Addr{}, "ns/c/3"); again != got {
		t.Fatalf("second pick = %v, want %v", again, got)
	}
	if got6, err := a.Pick("s", IPv6, netip.Addr{}, "ns/b/2"); err != nil || got6 != netip.MustParseAddr("fd00::2") {
		t.Fatalf("v6 pick = %v, %v; want fd00::2", got6, err)
	}
	for _, tc := range []struct {
		static string
		key    string
		want   error
	}{
		{"10.0.0.3", "ns/b/2", ErrInUse},
		{"10.0.0.3", "ns/a/1", nil}, // its own holder may pick it again
		{"10.0.0.2", "ns/b/2", ErrExcluded},
		{"10.0.0.1", "ns/b/2", ErrGateway},
		{"10.0.0.7", "ns/b/2", ErrReserved},
		{"10.0.1.1", "ns/b/2", ErrOutOfRange},
		{"::ffff:10.0.0.5", "ns/b/2", ErrFamily},
	} {
		_, err := a.Pick("s", IPv4, netip.MustParseAddr(tc.static), tc.key)
		if !errors.Is(err, tc.want) && !(tc.want == nil && err == nil) {
			t.Errorf("Pick(%s by %s) = %v, want %v", tc.static, tc.key, err, tc.want)
		}
	}
	// A second subnet's pick sees the first subnet's holds (overlap never hands one address twice).
	cfg2, _ := ParseSubnet("t", "IPv4", "10.0.0.0/29", "10.0.0.1", nil)
	a.SetSubnet(cfg2)
	if _, err := a.Pick("t", IPv4, netip.MustParseAddr("10.0.0.3"), "ns/z/9"); !errors.Is(err, ErrInUse) {
		t.Fatalf("overlapping pick = %v, want ErrInUse", err)
	}
	u, _ := a.Usage("s")
	if u.V4Used != 1 || u.V4Available != 3 {
		t.Fatalf("usage = %+v, want V4Used 1, V4Available 3 (.3..6 less .3)", u)
	}
	if subnet, ok := a.FreeAddr(netip.MustParseAddr("10.0.0.3")); !ok || subnet != "s" {
		t.Fatalf("FreeAddr = %q, %v", subnet, ok)
	}
	if got, _ := a.Pick("s", IPv4, netip.Addr{}, "ns/b/2"); got != netip.MustParseAddr("10.0.0.3") {
		t.Fatalf("after free, pick = %v, want 10.0.0.3", got)
	}
	if _, err := a.Pick("nope", IPv4, netip.Addr{}, "k"); !errors.Is(err, ErrUnknownSubnet) {
		t.Fatalf("unknown subnet pick = %v", err)
	}
	if fs := a.Families("s"); len(fs) != 2 || fs[0] != IPv4 || fs[1] != IPv6 {
		t.Fatalf("families = %v", fs)
	}
}
