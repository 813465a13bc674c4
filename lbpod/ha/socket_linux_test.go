package ha

import (
	"net"
	"testing"
	"time"
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
