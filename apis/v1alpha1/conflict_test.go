package v1alpha1

import (
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"
)

func TestAddressConflictsRoundTrip(t *testing.T) {
	at := time.Date(2026, 11, 25, 1, 2, 3, 0, time.UTC)
	mac, _ := net.ParseMAC("02:42:ac:12:00:05")
	in := []AddressConflict{
		{Address: netip.MustParseAddr("172.18.0.18"), MAC: mac, At: at},
		{Address: netip.MustParseAddr("fd00:10:18::18"), MAC: mac, At: at},
	}
	s := FormatAddressConflicts(in)
	if want := "172.18.0.18 02:42:ac:12:00:05 2026-11-25T01:02:03Z, fd00:10:18::18 02:42:ac:12:00:05 2026-11-25T01:02:03Z"; s != want {
		t.Fatalf("format: %q, want %q", s, want)
	}
	out, err := ParseAddressConflicts(s)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 2 || out[0].Address != in[0].Address || out[1].Address != in[1].Address ||
		out[0].MAC.String() != mac.String() || !out[1].At.Equal(at) {
		t.Fatalf("parse: %+v", out)
	}
}

func TestParseAddressConflictsRefuses(t *testing.T) {
	for s, want := range map[string]string{
		"172.18.0.18 02:42:ac:12:00:05":                                                                  "want",
		"172.18.0.18 02:42:ac:12:00:05 yesterday":                                                        "RFC3339",
		"172.18.0.300 02:42:ac:12:00:05 2026-11-25T01:02:03Z":                                            "not an address",
		"172.18.0.18 02:42:ac:12:00:05:00:00 2026-11-25T01:02:03Z":                                       "not a MAC",
		"fe80::1%eth0 02:42:ac:12:00:05 2026-11-25T01:02:03Z":                                            "not an address",
		"1.1.1.1 02:42:ac:12:00:05 2026-11-25T01:02:03Z, 1.1.1.1 02:42:ac:12:00:05 2026-11-25T01:02:03Z": "twice",
		"a,b,c": "entries",
		strings.Repeat("x", 500) + " 02:42:ac:12:00:05 2026-11-25T01:02:03Z": "not an address",
	} {
		_, err := ParseAddressConflicts(s)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%.40q: error %v, want one containing %q", s, err, want)
		}
		if err != nil && len(err.Error()) > 300 {
			t.Errorf("%.40q: unbounded error (%d bytes)", s, len(err.Error()))
		}
	}
	if out, err := ParseAddressConflicts(" "); err != nil || out != nil {
		t.Errorf("empty: %v %v", out, err)
	}
}

func TestAnnounced(t *testing.T) {
	s := FormatAnnounced([]netip.Addr{netip.MustParseAddr("fd00::18"), netip.MustParseAddr("172.18.0.18"), netip.MustParseAddr("::ffff:172.18.0.18")})
	if s != "172.18.0.18,fd00::18" {
		t.Fatalf("format: %q", s)
	}
	got := ParseAnnounced(s + ",junk, fe80::1%eth0")
	if len(got) != 2 || got[0] != netip.MustParseAddr("172.18.0.18") || got[1] != netip.MustParseAddr("fd00::18") {
		t.Fatalf("parse: %v", got)
	}
}
