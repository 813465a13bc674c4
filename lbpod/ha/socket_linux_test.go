package ha

import (
	"bytes"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
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

// loopbackQueue stands in for a standby's two sockets: UDP sockets on loopback, the queue one
// with receive times and the default buffer (big: the election's, setReceiveBuffer), and a
// sender to it. A frame sent on loopback is queued (or dropped) before the send returns.
func loopbackQueue(t *testing.T, big bool) (*conn, func([]byte)) {
	t.Helper()
	socket := func() int {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(fd) })
		if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
			t.Fatal(err)
		}
		return fd
	}
	queue, wait, sender := socket(), socket(), socket()
	if err := unix.SetsockoptInt(queue, unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1); err != nil {
		t.Fatal(err)
	}
	if big {
		setReceiveBuffer(queue)
		if n, _ := unix.GetsockoptInt(queue, unix.SOL_SOCKET, unix.SO_RCVBUF); n != 2*queueBuffer {
			t.Fatalf("queue buffer %d bytes, want %d", n, 2*queueBuffer)
		}
	}
	to, err := unix.Getsockname(queue)
	if err != nil {
		t.Fatal(err)
	}
	return &conn{fd: wait, queue: queue, queueing: true, group: group, maxVersion: authVersion}, func(b []byte) {
		if err := unix.Sendto(sender, b, 0, to); err != nil {
			t.Fatal(err)
		}
	}
}

// The reviewer's case: a standby due to claim finds, in its queue, junk that passes the socket
// filter (sealed with another key) ahead of a live active's sealed advert.
//   - With the election's buffer, 2000 junk frames and the advert are all read (the queue was
//     read 256 frames a wake, in a 212992-byte buffer: the advert was never read, and the
//     standby took over from the live active): no takeover, no loss.
//   - Where the queue overflows (the default buffer, 1000 junk frames: the kernel drops the
//     advert), the loss is seen: the claim is deferred by one dead interval and its skew
//     (315 ms), the adverts are read at once meanwhile; a live active's advert, read so, makes
//     the standby queue again, and the next loss defers again; with the active gone, the
//     deferred claim is made at its time.
func TestRunQueueFlood(t *testing.T) {
	junk := func(n int) [][]byte {
		wrong := mustKey(t, otherSecret)
		var frames [][]byte
		for i := range n {
			frames = append(frames, wrong.Seal(from(idC, 9), uint64(time.Now().UnixMicro())+uint64(i)))
		}
		return frames
	}
	// standby is a runner with the key, started 400 ms ago (due to claim), on a loopback queue.
	standby := func(t *testing.T, big bool) (*runner, *Metrics, *bytes.Buffer, func([]byte)) {
		r, mt, logs := testRunner(t, &recordingHolder{})
		if err := r.authenticate(testSecret); err != nil {
			t.Fatal(err)
		}
		r.handle(Event{Kind: Start, Now: r.now() - 400*time.Millisecond})
		c, send := loopbackQueue(t, big)
		r.conn, r.buf, r.oob = c, make([]byte, 1500), make([]byte, 64) // as Run
		return r, mt, logs, send
	}
	active := mustKey(t, testSecret)
	var seq Sequencer
	live := func() []byte { return active.Seal(from(idB, 1), seq.Next(time.Now(), DefaultReplayWindow)) }
	wake := func(r *runner) Output { // as the runner's wake: the queue, then the Tick
		return r.handle(Event{Kind: Tick, Now: r.now()})
	}

	t.Run("the buffer holds the flood", func(t *testing.T) {
		r, mt, _, send := standby(t, true)
		for _, f := range append(junk(2000), live()) {
			send(f)
		}
		r.drain(Output{})
		if out := wake(r); out.Role != Standby || r.m.Term() != 1 {
			t.Fatalf("after the flood and the live advert: %s, term %d; want a standby that heard term 1", out.Role, r.m.Term())
		}
		if n, lost := mt.AdvertsRejected.WithLabelValues(RefusedAuth).Value(), mt.QueueLosses.Value(); n != 2000 || lost != 0 {
			t.Errorf("refused %v as auth, %v losses; want 2000 and 0", n, lost)
		}
		if !r.conn.queueing {
			t.Error("the standby reads at once without a loss")
		}
	})

	t.Run("the queue overflows", func(t *testing.T) {
		r, mt, logs, send := standby(t, false)
		flood := func() {
			for _, f := range append(junk(1000), live()) {
				send(f)
			}
		}
		flood()
		out := r.drain(Output{})
		if out.Role != Standby || r.m.Term() != 0 || !strings.Contains(out.Reason, "no claim before 315ms from now") {
			t.Fatalf("after the overflow: %s term %d (%q); want a standby that did not hear the advert and defers 315ms", out.Role, r.m.Term(), out.Reason)
		}
		if out = wake(r); out.Role != Standby || r.conn.queueing || mt.QueueLosses.Value() != 1 {
			t.Fatalf("at the wake after the overflow: %s, queueing %t, %v losses; want a standby reading at once, 1 loss", out.Role, r.conn.queueing, mt.QueueLosses.Value())
		}
		if !strings.Contains(logs.String(), "level=WARN msg=\"ha: adverts lost in the queue socket;") {
			t.Errorf("the loss is not a warning:\n%s", logs)
		}
		// The live active's next advert, read at once: the standby follows it and queues again.
		out = r.received(out, mustFrame(t, live()))
		if out.Role != Standby || r.m.Term() != 1 || !r.conn.queueing {
			t.Fatalf("after the advert read at once: %s term %d queueing %t; want a standby that heard term 1 and queues", out.Role, r.m.Term(), r.conn.queueing)
		}
		// The next overflow defers again; then the active is gone: the claim comes at its time.
		r.m.deadline = r.now() // as if the wake came at the deadline
		flood()
		if out = r.drain(out); out.Role != Standby || !strings.Contains(out.Reason, "no claim before") || mt.QueueLosses.Value() != 2 {
			t.Fatalf("after the second overflow: %s (%q), %v losses; want a standby deferring its claim, 2 losses", out.Role, out.Reason, mt.QueueLosses.Value())
		}
		deadline := r.m.deadline
		if out = r.handle(Event{Kind: Tick, Now: deadline - time.Millisecond}); out.Role != Standby {
			t.Fatalf("a millisecond before the deferred claim: %s", out.Role)
		}
		if out = r.handle(Event{Kind: Tick, Now: deadline}); out.Role != Active || out.Send == nil || out.Send.Term != 2 {
			t.Fatalf("at the deferred claim: %+v, want active with term 2", out)
		}
		if n := strings.Count(logs.String(), "level=WARN msg=\"ha: adverts lost"); n != 1 {
			t.Errorf("%d warnings about losses, want the first only:\n%s", n, logs)
		}
	})

	t.Run("a read stops at its cap", func(t *testing.T) {
		c, send := loopbackQueue(t, true)
		for _, f := range junk(20) {
			send(f)
		}
		if got, complete := c.queued(make([]byte, 1500), make([]byte, 64), 10); len(got) != 10 || complete {
			t.Errorf("read with a cap of 10: %d frames, complete %t; want 10, incomplete", len(got), complete)
		}
		if got, complete := c.queued(make([]byte, 1500), make([]byte, 64), 100); len(got) != 10 || !complete {
			t.Errorf("read with a cap of 100: %d frames, complete %t; want the other 10, complete", len(got), complete)
		}
	})
}
