package ha

import (
	"bytes"
	"fmt"
	"net"
	"slices"
	"testing"
	"time"

	"golang.org/x/net/bpf"
)

// The link probe's raw ioctls read what the standard library reads: the index and the up and
// running flags of lo, and nothing for an interface that does not exist or whose name is too long.
func TestLinkProbe(t *testing.T) {
	p, err := newLinkProbe()
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		t.Skip(err)
	}
	index, up := p.state("lo")
	if want := lo.Flags&net.FlagUp != 0 && lo.Flags&net.FlagRunning != 0; index != lo.Index || up != want {
		t.Errorf("state(lo) = %d, %t; want %d, %t", index, up, lo.Index, want)
	}
	for _, name := range []string{"no-such-link", "a-name-longer-than-ifnamsiz"} {
		if index, up := p.state(name); index != 0 || up {
			t.Errorf("state(%q) = %d, %t; want 0, false", name, index, up)
		}
	}
}

// The runner's waker, on a timerfd and on the fallback timer: it fires once, not before the time
// it was reset to; a reset to later drops a fire already waiting and puts the fire off.
func TestWaker(t *testing.T) {
	for name, w := range map[string]*waker{"timerfd": newWaker(), "timer": newTimerWaker()} {
		t.Run(name, func(t *testing.T) {
			defer w.close()
			if name == "timerfd" && w.timer != nil {
				t.Skip("no timerfd here")
			}
			start := time.Now()
			w.reset(20 * time.Millisecond)
			select {
			case <-w.C:
				if took := time.Since(start); took < 20*time.Millisecond {
					t.Errorf("fired after %s, before the 20ms it was set to", took)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("did not fire")
			}
			w.reset(0)
			<-w.C // at once
			w.reset(0)
			for deadline := time.Now().Add(10 * time.Second); len(w.C) == 0; time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("did not fire")
				}
			}
			w.reset(time.Hour) // drops the fire waiting in C
			if len(w.C) != 0 {
				t.Error("a fire from before the reset is still waiting")
			}
			select {
			case <-w.C:
				t.Error("fired after a reset to an hour")
			case <-time.After(50 * time.Millisecond): // a later fire would be a fire from before the reset
			}
		})
	}
}

// The socket filter, run in x/net/bpf's interpreter of classic BPF (what the kernel runs, without
// a socket): our group's adverts of the versions read pass, whole; other groups, other protocols
// and other versions do not; the copies for replicas listening only on MulticastMAC are dropped
// by a replica that hears the group's address, and read by one that listens only there; the
// a standby's resignations go to the socket the runner waits on and only there, every other
// advert to its queue socket and only there; a holder's socket takes them all.
func TestAdvertFilter(t *testing.T) {
	g := Group{1, 2, 3, 4, 5, 6, 7, 8}
	a := Advert{Group: g, Term: 1, Sender: ID{0x02, 1, 2, 3, 4, 5}, Interval: 100 * time.Millisecond}
	resign := Advert{Group: g, Resigning: true, Sender: a.Sender, Interval: a.Interval}
	k, _ := NewKey(bytes.Repeat([]byte{7}, MinKeyLen))
	otherGroup := a
	otherGroup.Group[7]++
	frames := map[string][]byte{
		"v1":                a.marshal(0),
		"v1 group":          a.marshal(flagGroupAddressed),
		"v1 copy":           a.marshal(flagGroupAddressed | flagLegacyCopy),
		"v1 resigning":      resign.marshal(0),
		"v2":                k.seal(a, 1, 0),
		"v2 group":          k.seal(a, 1, flagGroupAddressed),
		"v2 copy":           k.seal(a, 1, flagGroupAddressed|flagLegacyCopy),
		"v2 resigning":      k.seal(resign, 1, flagGroupAddressed),
		"v2 resigning copy": k.seal(resign, 1, flagGroupAddressed|flagLegacyCopy),
		"other group":       k.seal(otherGroup, 1, flagGroupAddressed),
		"v3":                append(append([]byte("LBHA"), 3), k.seal(a, 1, flagGroupAddressed)[5:]...),
		"v3 resigning":      append(append([]byte("LBHA"), 3), k.seal(resign, 1, flagGroupAddressed)[5:]...),
		"arp":               append([]byte{0, 1, 8, 0, 6, 4, 0, 1}, make([]byte, 48)...),
	}
	for _, tc := range []struct {
		maxVersion     uint8
		groupAddressed bool
		pass           passAdverts
		passes         []string
	}{
		{authVersion, true, passAll, []string{"v1", "v1 group", "v1 resigning", "v2", "v2 group", "v2 resigning"}},
		{authVersion, true, passOthers, []string{"v1", "v1 group", "v2", "v2 group"}},
		{authVersion, true, passResigning, []string{"v1 resigning", "v2 resigning"}},
		{authVersion, false, passAll, []string{"v1", "v1 group", "v1 copy", "v1 resigning", "v2", "v2 group", "v2 copy", "v2 resigning", "v2 resigning copy"}},
		{authVersion, false, passOthers, []string{"v1", "v1 group", "v1 copy", "v2", "v2 group", "v2 copy"}},
		{authVersion, false, passResigning, []string{"v1 resigning", "v2 resigning", "v2 resigning copy"}},
		{advertVersion, true, passAll, []string{"v1", "v1 group", "v1 resigning"}},
		{advertVersion, true, passOthers, []string{"v1", "v1 group"}},
		{advertVersion, true, passResigning, []string{"v1 resigning"}},
		{advertVersion, false, passAll, []string{"v1", "v1 group", "v1 copy", "v1 resigning"}},
		{advertVersion, false, passOthers, []string{"v1", "v1 group", "v1 copy"}},
		{advertVersion, false, passResigning, []string{"v1 resigning"}},
	} {
		name := fmt.Sprintf("max version %d, group addressed %t, pass %d", tc.maxVersion, tc.groupAddressed, tc.pass)
		prog := advertFilter(g, tc.maxVersion, tc.groupAddressed, tc.pass)
		raw := make([]bpf.RawInstruction, len(prog))
		for i, ins := range prog {
			raw[i] = bpf.RawInstruction{Op: ins.Code, Jt: ins.Jt, Jf: ins.Jf, K: ins.K}
		}
		insns, ok := bpf.Disassemble(raw)
		if !ok {
			t.Fatalf("the filter (%s) does not disassemble: %v", name, raw)
		}
		vm, err := bpf.NewVM(insns)
		if err != nil {
			t.Fatalf("the filter (%s): %v", name, err)
		}
		for frameName, frame := range frames {
			n, err := vm.Run(frame)
			if err != nil {
				t.Fatalf("%s: %v", frameName, err)
			}
			if want := slices.Contains(tc.passes, frameName); (n > 0) != want {
				t.Errorf("%s: %s passes %t, want %t", name, frameName, n > 0, want)
			} else if want && n < len(frame) {
				t.Errorf("%s: %s passes %d of its %d bytes", name, frameName, n, len(frame))
			}
		}
	}
}
