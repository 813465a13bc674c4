package lbpod

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"reflect"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

func TestGatePorts(t *testing.T) {
	tcp80, tcp81, udp53 := Port{TCP, 80}, Port{TCP, 81}, Port{UDP, 53}
	ports := []Port{tcp80, tcp81, udp53}
	for name, tc := range map[string]struct {
		admitted     map[Port]bool
		started      bool
		serve, check []Port
	}{
		"the first apply serves everything":           {serve: ports},
		"a TCP port added later waits; UDP never":     {admitted: map[Port]bool{tcp80: true}, started: true, serve: []Port{tcp80, udp53}, check: []Port{tcp81}},
		"admitted ports are served":                   {admitted: map[Port]bool{tcp80: true, tcp81: true}, started: true, serve: ports},
		"nothing admitted yet: only UDP goes at once": {started: true, serve: []Port{udp53}, check: []Port{tcp80, tcp81}},
	} {
		serve, check := GatePorts(ports, tc.admitted, tc.started)
		if !reflect.DeepEqual(serve, tc.serve) || !reflect.DeepEqual(check, tc.check) {
			t.Errorf("%s: serve %v check %v, want %v %v", name, serve, check, tc.serve, tc.check)
		}
	}
}

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

var _ net.Error = timeoutErr{}

// The gate's effect: a port added later is held back while the ClusterIP does not accept a
// connection (refused, timed out, unreachable), served once it does, the loop woken once; a port
// removed and added again is checked again.
func TestPortGate(t *testing.T) {
	g := NewPortGate(slog.New(slog.DiscardHandler))
	var served atomic.Bool // the next dials are accepted (kube-proxy serves the port)
	var dials atomic.Int32
	g.dial = func(context.Context, string) error {
		n := dials.Add(1)
		time.Sleep(time.Millisecond)
		switch {
		case served.Load():
			return nil
		case n%3 == 0:
			return &net.OpError{Op: "dial", Err: syscall.ENETUNREACH} // the node has no rule yet
		case n%3 == 1:
			// kube-proxy's nftables mode rejects a ClusterIP port it does not serve yet.
			return &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}
		}
		return timeoutErr{}
	}
	woken := make(chan struct{}, 4)
	wake := func() { woken <- struct{}{} }
	svc := Service{ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")}, Ports: []Port{{TCP, 80}}}
	ctx := context.Background()
	if got := g.filter(ctx, svc, wake).Ports; !reflect.DeepEqual(got, []Port{{TCP, 80}}) {
		t.Fatalf("first apply: %v", got)
	}
	svc.Ports = []Port{{TCP, 80}, {TCP, 81}}
	if got := g.filter(ctx, svc, wake).Ports; !reflect.DeepEqual(got, []Port{{TCP, 80}}) {
		t.Fatalf("81 added, not answered: %v", got)
	}
	// Refusals, timeouts and unreachables: tried again (every GateTry), and the port stays held.
	for deadline := time.Now().Add(time.Second); dials.Load() < 4; {
		if time.Now().After(deadline) {
			t.Fatalf("%d dials in a second, want the check to try again", dials.Load())
		}
		time.Sleep(5 * time.Millisecond) // bounded polling
	}
	if got := g.filter(ctx, svc, wake).Ports; !reflect.DeepEqual(got, []Port{{TCP, 80}}) {
		t.Fatalf("still not answered: %v after %d dials", got, dials.Load())
	}
	served.Store(true)
	select {
	case <-woken:
	case <-time.After(time.Second):
		t.Fatal("not woken after the ClusterIP answered")
	}
	if got := g.filter(ctx, svc, wake).Ports; !reflect.DeepEqual(got, []Port{{TCP, 80}, {TCP, 81}}) {
		t.Fatalf("answered: %v", got)
	}
	// Removed, then added again: checked again.
	svc.Ports = []Port{{TCP, 80}}
	g.filter(ctx, svc, wake)
	served.Store(false)
	svc.Ports = []Port{{TCP, 80}, {TCP, 81}}
	if got := g.filter(ctx, svc, wake).Ports; !reflect.DeepEqual(got, []Port{{TCP, 80}}) {
		t.Fatalf("added again: %v", got)
	}
}

// Ports added by the hundred are checked at most GateDials at a time, and all let through once
// served.
func TestPortGateManyPorts(t *testing.T) {
	g := NewPortGate(slog.New(slog.DiscardHandler))
	var running, most atomic.Int32
	g.dial = func(context.Context, string) error {
		n := running.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		time.Sleep(2 * time.Millisecond) // a connection's round trip
		running.Add(-1)
		return nil
	}
	woken := make(chan struct{}, 1000)
	wake := func() { woken <- struct{}{} }
	svc := Service{ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")}, Ports: []Port{{TCP, 1}}}
	ctx := context.Background()
	g.filter(ctx, svc, wake)
	for p := int32(2); p <= 201; p++ {
		svc.Ports = append(svc.Ports, Port{TCP, p})
	}
	if got := g.filter(ctx, svc, wake).Ports; len(got) != 1 {
		t.Fatalf("200 ports added: %d served at once, want 1", len(got))
	}
	for i := range 200 {
		select {
		case <-woken:
		case <-time.After(GateBound):
			t.Fatalf("woken %d times, want 200", i)
		}
	}
	if got := g.filter(ctx, svc, wake).Ports; len(got) != 201 {
		t.Fatalf("%d ports served, want 201", len(got))
	}
	if m := most.Load(); m > GateDials || m < 2 {
		t.Errorf("at most %d tries at once, want 2..%d", m, GateDials)
	}
}
