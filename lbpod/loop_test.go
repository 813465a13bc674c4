package lbpod

import (
	"encoding/binary"
	"errors"
	"maps"
	"net/netip"
	"slices"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestVerdict(t *testing.T) {
	mismatch := Problem{Reason: ReasonFamilyMismatch, Message: "LB address fd18::18 is IPv6 ...", NotReady: true}
	noSCTP := Problem{Reason: ReasonSCTPUnavailable, Message: "SCTP ports 3868 not served ..."}
	cases := map[string]struct {
		res             Result
		active, lapsing bool
		wantReady       bool
		wantReason      string
	}{
		"applied":                  {Result{}, true, false, true, ""},
		"failed":                   {Result{Err: errors.New(`interface "net1" not found`)}, true, false, false, `interface "net1" not found`},
		"failed beats problems":    {Result{Err: errors.New("boom"), Problems: []Problem{mismatch}}, true, false, false, "boom"},
		"family mismatch":          {Result{Problems: []Problem{noSCTP, mismatch}}, true, false, false, "FamilyMismatch: LB address fd18::18 is IPv6 ..."},
		"SCTP unavailable: served": {Result{Problems: []Problem{noSCTP}}, true, false, true, "SCTPUnavailable: SCTP ports 3868 not served ..."},
		"standby":                  {Result{}, false, false, true, "standby, not holding the LB address"},
		"standby without SCTP":     {Result{Problems: []Problem{noSCTP}}, false, false, true, "standby, not holding the LB address; SCTPUnavailable: SCTP ports 3868 not served ..."},
		"lapsing":                  {Result{}, false, true, true, "active, not confirmed by the election: the LB address lapses with its lifetime"},
		"lapsing and failed":       {Result{Err: errors.New("boom")}, false, true, false, "boom"},
	}
	for name, tc := range cases {
		ready, reason := Verdict(tc.res, tc.active, tc.lapsing)
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
	for _, tc := range []struct {
		ip    string
		added bool
		want  bool
	}{
		{"::ffff:172.18.0.18", true, true}, // IPv4 in its 16-byte form
		{"172.18.0.18", true, true},
		{"fd00::18", true, true},
		{"172.18.0.18", false, false}, // lapsed or deleted: a repair
		{"172.18.0.19", true, false},  // someone else's address
		{"10.0.0.1", true, false},
	} {
		if got := renewal(netip.MustParseAddr(tc.ip), tc.added, held); got != tc.want {
			t.Errorf("renewal(%s added=%t) = %t, want %t", tc.ip, tc.added, got, tc.want)
		}
	}
}

// nlMessage builds a netlink message of type typ: its fixed header (hdrLen bytes of zeros but
// for the family, first) and the attributes, as the kernel sends an event.
func nlMessage(typ uint16, hdrLen int, family byte, attrs map[uint16][]byte) syscall.NetlinkMessage {
	data := make([]byte, hdrLen)
	data[0] = family
	for _, k := range slices.Sorted(maps.Keys(attrs)) {
		v := attrs[k]
		a := make([]byte, (4+len(v)+3)&^3)
		binary.NativeEndian.PutUint16(a[0:], uint16(4+len(v)))
		binary.NativeEndian.PutUint16(a[2:], k)
		copy(a[4:], v)
		data = append(data, a...)
	}
	return syscall.NetlinkMessage{Header: syscall.NlMsghdr{Type: typ, Len: uint32(syscall.NLMSG_HDRLEN + len(data))}, Data: data}
}

// The kernel watch reads a link's name and an address's IFA_LOCAL (else IFA_ADDRESS) from the
// events, and wakes the loop for the interfaces it serves and for global addresses but the held
// ones' renewals.
func TestKernelEvents(t *testing.T) {
	held := []netip.Prefix{netip.MustParsePrefix("172.18.0.18/16"), netip.MustParsePrefix("fd00::18/64")}
	ifaces := []string{"net1", "eth0"}
	addr := func(typ uint16, family byte, attrs map[uint16][]byte) syscall.NetlinkMessage {
		return nlMessage(typ, syscall.SizeofIfAddrmsg, family, attrs)
	}
	link := func(typ uint16, name string) syscall.NetlinkMessage {
		return nlMessage(typ, syscall.SizeofIfInfomsg, 0, map[uint16][]byte{unix.IFLA_IFNAME: append([]byte(name), 0), unix.IFLA_MTU: {0, 5, 0, 0}})
	}
	ip := func(s string) []byte { return netip.MustParseAddr(s).AsSlice() }
	for name, tc := range map[string]struct {
		m       syscall.NetlinkMessage
		want    kernelEvent
		ok      bool
		matters bool
	}{
		"net1 changed": {link(unix.RTM_NEWLINK, "net1"), kernelEvent{link: "net1"}, true, true},
		"eth0 deleted": {link(unix.RTM_DELLINK, "eth0"), kernelEvent{link: "eth0"}, true, true},
		"another link": {link(unix.RTM_NEWLINK, "veth9"), kernelEvent{link: "veth9"}, true, false},
		"renewal": {addr(unix.RTM_NEWADDR, unix.AF_INET, map[uint16][]byte{unix.IFA_ADDRESS: ip("172.18.0.18"), unix.IFA_LOCAL: ip("172.18.0.18")}),
			kernelEvent{isAddr: true, addr: netip.MustParseAddr("172.18.0.18"), newAddr: true}, true, false},
		"IPv4 with a peer": {addr(unix.RTM_NEWADDR, unix.AF_INET, map[uint16][]byte{unix.IFA_ADDRESS: ip("172.18.0.1"), unix.IFA_LOCAL: ip("172.18.0.18")}),
			kernelEvent{isAddr: true, addr: netip.MustParseAddr("172.18.0.18"), newAddr: true}, true, false},
		"held address removed": {addr(unix.RTM_DELADDR, unix.AF_INET, map[uint16][]byte{unix.IFA_ADDRESS: ip("172.18.0.18"), unix.IFA_LOCAL: ip("172.18.0.18")}),
			kernelEvent{isAddr: true, addr: netip.MustParseAddr("172.18.0.18")}, true, true},
		"IPv6 renewal": {addr(unix.RTM_NEWADDR, unix.AF_INET6, map[uint16][]byte{unix.IFA_ADDRESS: ip("fd00::18"), unix.IFA_CACHEINFO: make([]byte, 16)}),
			kernelEvent{isAddr: true, addr: netip.MustParseAddr("fd00::18"), newAddr: true}, true, false},
		"another address": {addr(unix.RTM_NEWADDR, unix.AF_INET6, map[uint16][]byte{unix.IFA_ADDRESS: ip("fd00::19")}),
			kernelEvent{isAddr: true, addr: netip.MustParseAddr("fd00::19"), newAddr: true}, true, true},
		"link-local": {addr(unix.RTM_NEWADDR, unix.AF_INET6, map[uint16][]byte{unix.IFA_ADDRESS: ip("fe80::1")}),
			kernelEvent{isAddr: true, addr: netip.MustParseAddr("fe80::1"), newAddr: true}, true, false},
		"a route":         {nlMessage(unix.RTM_NEWROUTE, syscall.SizeofRtMsg, unix.AF_INET, nil), kernelEvent{}, false, false},
		"no address attr": {addr(unix.RTM_NEWADDR, unix.AF_INET, nil), kernelEvent{isAddr: true, newAddr: true}, false, false},
	} {
		ev, ok := parseKernelEvent(tc.m)
		if ev != tc.want || ok != tc.ok {
			t.Errorf("%s: parseKernelEvent = %+v, %t; want %+v, %t", name, ev, ok, tc.want, tc.ok)
			continue
		}
		if got := ok && ev.matters(held, ifaces); got != tc.matters {
			t.Errorf("%s: matters = %t, want %t", name, got, tc.matters)
		}
	}
}

// An active loop holds the addresses only while the owner of the role confirms it; unconfirmed,
// it lets those on a lifetime lapse, or, with no lifetime to fence them, stands by.
func TestHoldingNeedsConfirmation(t *testing.T) {
	confirmed := true
	lifetime := func() time.Duration { return time.Second }
	l := NewLoop(LoopConfig{Confirmed: func() bool { return confirmed }, AddressLifetime: lifetime})
	if !l.holding() || l.role() != roleHolding {
		t.Fatal("active and confirmed: not holding")
	}
	confirmed = false
	if l.holding() || !l.Active() || l.role() != roleLapsing {
		t.Fatalf("active, not confirmed: role %d holding %t active %t, want lapsing, not holding, still active", l.role(), l.holding(), l.Active())
	}
	if r := NewLoop(LoopConfig{Confirmed: func() bool { return false }}).role(); r != roleStandby {
		t.Fatalf("active, not confirmed, no lifetime: role %d, want standby", r)
	}
	l.Block("conflict")
	if r := l.role(); r != roleStandby {
		t.Fatalf("blocked, not confirmed: role %d, want standby", r)
	}
	l = NewLoop(LoopConfig{Confirmed: func() bool { return confirmed }, AddressLifetime: lifetime})
	confirmed = true
	l.SetActive(false)
	if l.holding() || l.role() != roleStandby {
		t.Fatal("standby: holding")
	}
	if !NewLoop(LoopConfig{}).holding() {
		t.Fatal("active without Confirmed: not holding")
	}
}

// The kernel watch wakes the loop for a route of its table (in the header's table byte, or in
// RTA_TABLE above 255) and for every rule, not for the kernel's routes of other tables.
func TestRouteEvents(t *testing.T) {
	route := func(typ uint16, table byte, attrs map[uint16][]byte) syscall.NetlinkMessage {
		m := nlMessage(typ, unix.SizeofRtMsg, unix.AF_INET, attrs)
		m.Data[4] = table
		return m
	}
	u32 := func(v uint32) []byte { return binary.NativeEndian.AppendUint32(nil, v) }
	for name, tc := range map[string]struct {
		m    syscall.NetlinkMessage
		want bool
	}{
		"our table, added":        {route(unix.RTM_NEWROUTE, 100, nil), true},
		"our table, deleted":      {route(unix.RTM_DELROUTE, 100, nil), true},
		"main (a prefix route)":   {route(unix.RTM_NEWROUTE, unix.RT_TABLE_MAIN, nil), false},
		"local":                   {route(unix.RTM_DELROUTE, unix.RT_TABLE_LOCAL, nil), false},
		"RTA_TABLE says ours":     {route(unix.RTM_NEWROUTE, unix.RT_TABLE_COMPAT, map[uint16][]byte{unix.RTA_TABLE: u32(100)}), true},
		"RTA_TABLE says another":  {route(unix.RTM_NEWROUTE, 100, map[uint16][]byte{unix.RTA_TABLE: u32(1000)}), false},
		"a rule added":            {nlMessage(unix.RTM_NEWRULE, 12, unix.AF_INET, nil), true},
		"a rule deleted":          {nlMessage(unix.RTM_DELRULE, 12, unix.AF_INET6, nil), true},
		"a link":                  {nlMessage(unix.RTM_NEWLINK, syscall.SizeofIfInfomsg, 0, nil), false},
		"a truncated route event": {syscall.NetlinkMessage{Header: syscall.NlMsghdr{Type: unix.RTM_NEWROUTE}, Data: []byte{2, 0}}, true},
	} {
		if got := routeEventMatters(tc.m, 100); got != tc.want {
			t.Errorf("%s: routeEventMatters = %t, want %t", name, got, tc.want)
		}
	}
}

// A member of a shared address that cannot be read is left out with MemberInvalid, and the lb pod
// stays ready for the others (not ready, no replica would take the address over: one tenant's
// Service would stop every member's failover); with no member left, it is not ready.
func TestServicesFromObjectsMemberInvalid(t *testing.T) {
	svc := func(name, proto string) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
			Spec: corev1.ServiceSpec{ClusterIPs: []string{"10.96.0.10"}, Ports: []corev1.ServicePort{{Protocol: corev1.Protocol(proto), Port: 53}}}}
	}
	out, problems, err := servicesFromObjects([]*corev1.Service{svc("a", "UDP"), svc("b", "ICMP")})
	if err != nil || len(out) != 1 || len(problems) != 1 || problems[0].Reason != ReasonMemberInvalid || problems[0].NotReady {
		t.Fatalf("one of two unreadable: %d served, problems %+v, err %v; want one served, MemberInvalid, ready", len(out), problems, err)
	}
	out, problems, err = servicesFromObjects([]*corev1.Service{svc("a", "ICMP"), svc("b", "ICMP")})
	if err != nil || len(out) != 0 || len(problems) != 2 || !problems[0].NotReady || !problems[1].NotReady {
		t.Fatalf("both unreadable: %d served, problems %+v, err %v; want none, not ready", len(out), problems, err)
	}
}
