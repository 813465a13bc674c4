package lbpod

import (
	"errors"
	"net"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"
)

func TestVerdict(t *testing.T) {
	mismatch := Problem{Reason: ReasonFamilyMismatch, Message: "LB address fd18::18 is IPv6 ...", NotReady: true}
	noSCTP := Problem{Reason: ReasonSCTPUnavailable, Message: "SCTP ports 3868 not served ..."}
	cases := map[string]struct {
		res        Result
		active     bool
		wantReady  bool
		wantReason string
	}{
		"applied":                  {Result{}, true, true, ""},
		"failed":                   {Result{Err: errors.New(`interface "net1" not found`)}, true, false, `interface "net1" not found`},
		"failed beats problems":    {Result{Err: errors.New("boom"), Problems: []Problem{mismatch}}, true, false, "boom"},
		"family mismatch":          {Result{Problems: []Problem{noSCTP, mismatch}}, true, false, "FamilyMismatch: LB address fd18::18 is IPv6 ..."},
		"SCTP unavailable: served": {Result{Problems: []Problem{noSCTP}}, true, true, "SCTPUnavailable: SCTP ports 3868 not served ..."},
		"standby":                  {Result{}, false, true, "standby, not holding the LB address"},
		"standby without SCTP":     {Result{Problems: []Problem{noSCTP}}, false, true, "standby, not holding the LB address; SCTPUnavailable: SCTP ports 3868 not served ..."},
	}
	for name, tc := range cases {
		ready, reason := Verdict(tc.res, tc.active)
		if ready != tc.wantReady || reason != tc.wantReason {
			t.Errorf("%s: Verdict = %t %q, want %t %q", name, ready, reason, tc.wantReady, tc.wantReason)
		}
	}
}

func TestShouldAnnounce(t *testing.T) {
	net1 := []LinkSnapshot{{Name: "net1", Exists: true, MAC: "02:00:00:00:00:01"}}
	newMAC := []LinkSnapshot{{Name: "net1", Exists: true, MAC: "02:00:00:00:00:09"}}
	gone := []LinkSnapshot{{Name: "net1"}}
	cases := map[string]struct {
		res                          Result
		active, wasActive, announced bool
		before, now                  []LinkSnapshot
		want                         bool
	}{
		"first apply":                    {Result{}, true, true, false, nil, net1, true},
		"nothing new":                    {Result{}, true, true, true, net1, net1, false},
		"address added":                  {Result{AddressAdded: true}, true, true, true, net1, net1, true},
		"became active":                  {Result{}, true, false, true, net1, net1, true},
		"new MAC":                        {Result{}, true, true, true, net1, newMAC, true},
		"net1 gone: no MAC to compare":   {Result{}, true, true, true, net1, gone, false},
		"standby never announces":        {Result{AddressAdded: true}, false, true, false, net1, newMAC, false},
		"failed apply announces nothing": {Result{Err: errors.New("x")}, true, false, false, nil, net1, false},
	}
	for name, tc := range cases {
		if got := ShouldAnnounce(tc.res, tc.active, tc.wasActive, tc.announced, tc.before, tc.now); got != tc.want {
			t.Errorf("%s: ShouldAnnounce = %t, want %t", name, got, tc.want)
		}
	}
}

func TestRenewalIsNotDrift(t *testing.T) {
	held := []netip.Prefix{netip.MustParsePrefix("172.18.0.18/16"), netip.MustParsePrefix("fd00::18/64")}
	upd := func(ip string, add bool) netlink.AddrUpdate {
		return netlink.AddrUpdate{LinkAddress: net.IPNet{IP: net.ParseIP(ip)}, NewAddr: add}
	}
	for _, tc := range []struct {
		u    netlink.AddrUpdate
		want bool
	}{
		{upd("172.18.0.18", true), true}, // IPv4 in its 16-byte form, as net.ParseIP gives it
		{upd("fd00::18", true), true},
		{upd("172.18.0.18", false), false}, // lapsed or deleted: a repair
		{upd("172.18.0.19", true), false},  // someone else's address
		{upd("10.0.0.1", true), false},
	} {
		if got := renewal(tc.u, held); got != tc.want {
			t.Errorf("renewal(%s new=%t) = %t, want %t", tc.u.LinkAddress.IP, tc.u.NewAddr, got, tc.want)
		}
	}
}

// An active loop holds the addresses only while the owner of the role confirms it.
func TestHoldingNeedsConfirmation(t *testing.T) {
	confirmed := true
	l := NewLoop(LoopConfig{Confirmed: func() bool { return confirmed }})
	if !l.holding() {
		t.Fatal("active and confirmed: not holding")
	}
	confirmed = false
	if l.holding() || !l.Active() {
		t.Fatalf("active, not confirmed: holding %t active %t, want not holding, still active", l.holding(), l.Active())
	}
	confirmed = true
	l.SetActive(false)
	if l.holding() {
		t.Fatal("standby: holding")
	}
	if !NewLoop(LoopConfig{}).holding() {
		t.Fatal("active without Confirmed: not holding")
	}
}
