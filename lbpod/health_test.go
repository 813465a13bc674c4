package lbpod

import (
	"net/netip"
	"strings"
	"testing"
)

func TestHealthAddr(t *testing.T) {
	uplink := []netip.Addr{netip.MustParseAddr("fe80::1"), netip.MustParseAddr("10.244.1.7"), netip.MustParseAddr("fd00::7")}
	tests := []struct {
		name, flag, podIP string
		uplink            []netip.Addr
		addr, err         string
	}{
		{name: "flag wins", flag: "127.0.0.1:9000", podIP: "10.244.1.7", addr: "127.0.0.1:9000"},
		{name: "pod IP v4", podIP: "10.244.1.7", addr: "10.244.1.7:8081"},
		{name: "pod IP v6", podIP: "fd00::7", addr: "[fd00::7]:8081"},
		{name: "mapped v4 unmapped", podIP: "::ffff:10.244.1.7", addr: "10.244.1.7:8081"},
		{name: "bad pod IP", podIP: "10.244.1.x", err: `LBPOD_POD_IP="10.244.1.x" is not an IP address`},
		{name: "zone refused", podIP: "fe80::1%eth0", err: "is not an IP address"},
		{name: "unset: uplink's first global, link-local skipped", uplink: uplink, addr: "10.244.1.7:8081"},
		{name: "unset, no uplink address: error, never a wildcard", uplink: []netip.Addr{netip.MustParseAddr("fe80::1")}, err: "no address for the health server"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			addr, _, err := HealthAddr(tc.flag, tc.podIP, tc.uplink)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || addr != tc.addr {
				t.Fatalf("HealthAddr = %q, %v; want %q", addr, err, tc.addr)
			}
		})
	}
	long := strings.Repeat("x", 1000)
	if _, _, err := HealthAddr("", long, nil); err == nil || len(err.Error()) > 120 {
		t.Fatalf("a long bad value must give a bounded message, got %d chars", len(err.Error()))
	}
}
