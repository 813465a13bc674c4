package ha

import (
	"bytes"
	"cmp"
	"encoding/hex"
	"testing"
	"time"
)

var (
	testSecret  = []byte("0123456789abcdef0123456789abcdef")
	otherSecret = []byte("fedcba9876543210fedcba9876543210")
	// wall0 is the model's and the tests' wall clock origin.
	wall0 = time.Date(2026, 11, 24, 17, 0, 0, 0, time.UTC)
)

func mustKey(t testing.TB, secret []byte) *Key {
	t.Helper()
	k, err := NewKey(secret)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// The version-2 wire format, byte for byte: the version-1 header with version 2, the sequence,
// then the tag (pinned, so that a change of the MAC input is seen: replicas of two builds must
// verify each other; the value is from an independent HMAC-SHA256: Python's hmac module).
func TestSealWire(t *testing.T) {
	a := Advert{Group: Group{1, 2, 3, 4, 5, 6, 7, 8}, Term: 0x0102030405060708, Priority: 200,
		Sender: ID{0x02, 0xaa, 0xbb, 0xcc, 0xdd, 0xee}, Resigning: true, Interval: 100 * time.Millisecond}
	b := mustKey(t, testSecret).Seal(a, 0x1122334455667788)
	const header = "4c424841" + "02" + "01" + "c8" + "00" + "0102030405060708" + "0102030405060708" + "02aabbccddee" + "0064" + "1122334455667788"
	if got := hex.EncodeToString(b[:40]); got != header {
		t.Fatalf("sealed header %s, want %s", got, header)
	}
	if got, want := hex.EncodeToString(b[40:]), "39c180a1a5b9a2ed41d71ae4a7922028"; got != want {
		t.Errorf("tag %s, want %s", got, want)
	}
	f, err := ParseFrame(append(b, make([]byte, 4)...)) // Ethernet padding is ignored
	if err != nil || f.Advert != a || f.Version != 2 || f.Seq != 0x1122334455667788 {
		t.Fatalf("ParseFrame = %+v, %v", f, err)
	}
	if !mustKey(t, testSecret).verify(&f) || mustKey(t, otherSecret).verify(&f) {
		t.Fatal("the tag verifies with another key, or not with its own")
	}
	// Any byte changed (every field, the sequence, the tag) fails the tag.
	for i := range b {
		c := append([]byte(nil), b...)
		c[i] ^= 0x10
		if f, err := ParseFrame(c); err == nil && f.Version == 2 && mustKey(t, testSecret).verify(&f) {
			t.Errorf("byte %d changed: the tag still verifies", i)
		}
	}
	if _, err := ParseFrame(b[:55]); err == nil || err.Error() != "not an lbsvc advert: 55 bytes, want 56 for version 2" {
		t.Errorf("short version-2 frame: %v", err)
	}
	v1, err := ParseFrame(a.Marshal())
	if err != nil || v1.Version != 1 || v1.Advert != a || mustKey(t, testSecret).verify(&v1) {
		t.Fatalf("version 1 through ParseFrame: %+v, %v (must never verify)", v1, err)
	}
	if _, err := NewKey(testSecret[:15]); err == nil || err.Error() != "ha key: 15 bytes, want at least 16" {
		t.Errorf("short key: %v", err)
	}
}

func TestSequencer(t *testing.T) {
	var s Sequencer
	at := wall0.UnixMicro()
	for i, tc := range []struct {
		wall time.Time
		want int64
	}{
		{wall0, at},
		{wall0, at + 1},                              // the clock did not move
		{wall0.Add(-4 * time.Second), at + 2},        // it went back, by less than half the window
		{wall0.Add(time.Millisecond), at + 1000},     // it moved on
		{wall0.Add(time.Millisecond), at + 1000 + 1}, // and stood
		// Back by more than half the window: from the clock again, or the receivers, whose
		// clocks took the same step, would refuse every number as stale for 50 s.
		{wall0.Add(-60 * time.Second), at - 60_000_000},
		{wall0.Add(-60 * time.Second), at - 60_000_000 + 1},
		// Back by more than half the window in small steps: as one step.
		{wall0.Add(-62 * time.Second), at - 60_000_000 + 2},
		{wall0.Add(-64 * time.Second), at - 60_000_000 + 3},
		{wall0.Add(-66 * time.Second), at - 66_000_000},
	} {
		if got := s.Next(tc.wall, 10*time.Second); got != uint64(tc.want) {
			t.Errorf("step %d: %d, want %d", i, got, tc.want)
		}
	}
	// A restart in the same pod: a new sequencer starts at its wall clock, past what the old sent.
	var again Sequencer
	if n := again.Next(wall0.Add(time.Second), 0); n <= uint64(at+1001) {
		t.Errorf("after a restart %d, want above %d", n, at+1001)
	}
}

// TestClockStepBack: every node's wall clock steps back (NTP correcting a cluster that ran
// ahead). The receiver must accept the sender's next advert, not refuse it as stale (the
// sender counting on from its last number) or as a replay (the receiver remembering that
// number) until the clock has caught up; before, a step of 60 s had it refuse them for 50 s.
func TestClockStepBack(t *testing.T) {
	for _, step := range []time.Duration{2 * time.Second, 4 * time.Second, 7 * time.Second, 60 * time.Second, time.Hour} {
		var s Sequencer
		r := NewReplay(10 * time.Second)
		for ms := range 10 {
			w := wall0.Add(time.Duration(ms) * 100 * time.Millisecond)
			if why := r.Check(idA, s.Next(w, 10*time.Second), w); why != "" {
				t.Fatalf("step %v: before it, advert %d refused: %s", step, ms, why)
			}
		}
		// Both clocks step between two adverts.
		var last uint64
		var lastWall time.Time
		for ms := range 10 {
			lastWall = wall0.Add(time.Second - step + time.Duration(ms)*100*time.Millisecond)
			last = s.Next(lastWall, 10*time.Second)
			if why := r.Check(idA, last, lastWall); why != "" {
				t.Errorf("step %v: advert %d after it refused: %s", step, ms, why)
			}
		}
		if why := r.Check(idA, last, lastWall); why != RefusedReplay {
			t.Errorf("step %v: the last advert again: %q, want %q", step, why, RefusedReplay)
		}
		// A capture from before the step, further than the window from the clock now.
		if why := r.Check(idA, uint64(wall0.UnixMicro()), lastWall); step > 12*time.Second && why != RefusedStale {
			t.Errorf("step %v: a capture from before the step: %q, want %q", step, why, RefusedStale)
		}
	}
}

func TestReplay(t *testing.T) {
	r := NewReplay(10 * time.Second)
	us := func(d time.Duration) uint64 { return uint64(wall0.Add(d).UnixMicro()) }
	for i, tc := range []struct {
		sender ID
		seq    uint64
		wall   time.Duration
		want   string
	}{
		{idA, us(0), 0, ""},
		{idA, us(0), 0, RefusedReplay},                  // the same frame again
		{idA, us(-time.Millisecond), 0, RefusedReplay},  // an older one
		{idA, us(time.Millisecond), 0, ""},              // the next
		{idB, us(-10 * time.Second), 0, ""},             // at the window's edge
		{idB, us(-10*time.Second) - 1, 0, RefusedStale}, // both a replay and stale: stale is checked first
		{idC, us(-10*time.Second - time.Microsecond), 0, RefusedStale},
		{idC, us(10*time.Second + time.Microsecond), 0, RefusedStale}, // from the future
		{idC, us(10 * time.Second), 0, ""},
		{idC, ^uint64(0), 0, RefusedStale},
		{idA, us(2 * time.Millisecond), time.Hour, RefusedStale}, // a capture replayed an hour later
	} {
		if got := r.Check(tc.sender, tc.seq, wall0.Add(tc.wall)); got != tc.want {
			t.Errorf("step %d (%s seq %d): %q, want %q", i, tc.sender, tc.seq, got, tc.want)
		}
	}
	// The table holds replayCap senders; the one heard longest ago goes first.
	r = NewReplay(0)
	for i := range replayCap + 1 {
		id := ID{2, 0, 0, 0, 1, byte(i)}
		if got := r.Check(id, us(time.Duration(i)*time.Millisecond), wall0); got != "" {
			t.Fatalf("sender %d: %q", i, got)
		}
	}
	if len(r.last) != replayCap {
		t.Fatalf("%d senders kept, want %d", len(r.last), replayCap)
	}
	if _, ok := r.last[ID{2, 0, 0, 0, 1, 0}]; ok {
		t.Fatal("the oldest sender was not the one forgotten")
	}
	if got := r.Check(ID{2, 0, 0, 0, 1, 1}, us(time.Millisecond), wall0); got != RefusedReplay {
		t.Fatalf("a kept sender's replay: %q", got)
	}
}

// Guard.Open: who is verified, who is passed through to the machine, and why the rest is refused.
func TestGuardOpen(t *testing.T) {
	key := mustKey(t, testSecret)
	g := NewGuard(Config{ID: idA, Group: group}.withDefaults(), key)
	seal := func(k *Key, a Advert, d time.Duration) Frame {
		f, err := ParseFrame(k.Seal(a, uint64(wall0.Add(d).UnixMicro())))
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	v1 := func(a Advert) Frame { return Frame{Advert: a, Version: 1} }
	other := from(idB, 3)
	other.Group = Group{9}
	for i, tc := range []struct {
		name string
		f    Frame
		auth bool
		want string
	}{
		{"sealed with the key", seal(key, from(idB, 3), 0), true, ""},
		{"the same frame replayed", seal(key, from(idB, 3), 0), false, RefusedReplay},
		{"sealed with another key", seal(mustKey(t, otherSecret), from(idB, 4), time.Second), false, RefusedAuth},
		{"stale", seal(key, from(idC, 4), -time.Minute), false, RefusedStale},
		{"version 1: the machine's legacy rule decides", v1(from(idB, 5)), false, ""},
		{"our own ID, forged: the machine ignores it", seal(mustKey(t, otherSecret), from(idA, 9), 0), false, ""},
		{"another group: the machine ignores it", seal(mustKey(t, otherSecret), other, 0), false, ""},
		{"the next frame", seal(key, from(idB, 3), time.Millisecond), true, ""},
	} {
		auth, why := g.Open(tc.f, wall0)
		if auth != tc.auth || why != tc.want {
			t.Errorf("%d %s: authenticated %t refused %q, want %t %q", i, tc.name, auth, why, tc.auth, tc.want)
		}
	}
}

// The legacy rule: a replica with a key obeys version-1 adverts only within its window after
// start, before it heard an authenticated advert, and before it was ever active.
func TestLegacyWindow(t *testing.T) {
	v1 := func(at int, a Advert) Event { return recv(at, a) }
	v2 := func(at int, a Advert) Event { ev := recv(at, a); ev.Authenticated = true; return ev }
	for name, tc := range map[string]struct {
		keyless bool          // a replica without a key
		window  time.Duration // LegacyWindow; 1 s when zero, none when negative
		steps   []Event
		want    []string // the refusal of each step, "" accepted
	}{
		"within the window: obeyed": {steps: []Event{at(Start, 0), v1(50, from(idB, 2)), v1(999, from(idB, 2))},
			want: []string{"", "", ""}},
		"after the window: refused": {steps: []Event{at(Start, 0), v1(50, from(idB, 2)), v1(1000, from(idB, 2))},
			want: []string{"", "", RefusedUnauthenticated}},
		"after an authenticated advert: refused": {steps: []Event{at(Start, 0), v1(50, from(idB, 2)), v2(60, from(idC, 3)), v1(70, from(idB, 2))},
			want: []string{"", "", "", RefusedUnauthenticated}},
		"once active: refused, even a resignation": {steps: []Event{at(Start, 0), at(Tick, 315), v1(320, resigning(from(idB, 9)))},
			want: []string{"", "", RefusedUnauthenticated}},
		"window 0: never": {window: -1, steps: []Event{at(Start, 0), v1(1, from(idB, 2))},
			want: []string{"", RefusedUnauthenticated}},
		"without a key: every advert is obeyed": {keyless: true, steps: []Event{at(Start, 0), v1(5000, from(idB, 2))},
			want: []string{"", ""}},
	} {
		t.Run(name, func(t *testing.T) {
			window := cmp.Or(tc.window, time.Second)
			m := NewMachine(Config{ID: idA, Group: group, Priority: DefaultPriority, MaxSlack: -1,
				Authenticated: !tc.keyless, LegacyWindow: max(window, 0)})
			for i, ev := range tc.steps {
				before := *m
				out := m.Handle(ev)
				if out.Refused != tc.want[i] {
					t.Fatalf("step %d (%s at %s): refused %q, want %q", i, ev.Kind, ev.Now, out.Refused, tc.want[i])
				}
				if out.Refused != "" && *m != before {
					t.Fatalf("step %d: a refused advert changed the machine", i)
				}
			}
		})
	}
}

// A fresh standby with a key, within the legacy window, defers to an old replica's version-1
// adverts and takes over at its resignation, half an interval after its skew (legacyDelay): the
// upgrade's hand-over, step by step.
func TestLegacyHandOver(t *testing.T) {
	m := NewMachine(Config{ID: idA, Group: group, Priority: DefaultPriority, MaxSlack: -1, Authenticated: true, LegacyWindow: DefaultLegacyWindow})
	m.Handle(at(Start, 0))
	for now := 50; now < 3000; now += 100 {
		if out := m.Handle(recv(now, from(idB, 4))); out.Refused != "" || out.Role != Standby || out.Wake != ms(now+365) {
			t.Fatalf("old active's advert at %dms: %+v, want obeyed, a standby waiting for it", now, out)
		}
		m.Handle(at(Tick, now+50))
	}
	out := m.Handle(recv(3050, resigning(from(idB, 4))))
	if out.Refused != "" || out.Wake != ms(3115) {
		t.Fatalf("old active's resignation: %+v, want obeyed, a claim after the skew and half an interval", out)
	}
	if out = m.Handle(at(Tick, 3115)); out.Hold != Take || out.Send == nil || out.Send.Term != 5 {
		t.Fatalf("at the skew: %+v, want a takeover with term 5", out)
	}
	if out = m.Handle(recv(3120, from(idB, 4))); out.Refused != RefusedUnauthenticated {
		t.Fatalf("a version-1 advert once active: %+v, want refused", out)
	}
}

// A replica with a key superseded through the record waits its backoff until it hears an
// authenticated advert: a version-1 one (anyone can send it) is refused, since having been active
// closed the legacy window, and leaves the wait as it was; the authenticated one ends it.
func TestSupersededBackoffAuthenticated(t *testing.T) {
	m := NewMachine(Config{ID: idA, Group: group, Priority: DefaultPriority, MaxSlack: -1, Authenticated: true, LegacyWindow: DefaultLegacyWindow})
	for _, s := range recordedActiveAt315 {
		m.Handle(s.ev)
	}
	if out := m.Handle(record(400, idB, 3)); out.Superseded == nil || out.Role != Standby || out.Wake != ms(30715) || m.Backoff() != 30*time.Second {
		t.Fatalf("superseded: %+v backoff %s, want a standby waiting until 30.715s (backoff 30s)", out, m.Backoff())
	}
	if out := m.Handle(recv(500, from(idB, 3))); out.Refused != RefusedUnauthenticated || out.Wake != ms(30715) || m.Backoff() != 30*time.Second {
		t.Fatalf("a version-1 advert: %+v backoff %s, want refused as unauthenticated, still waiting until 30.715s (backoff 30s)", out, m.Backoff())
	}
	ev := recv(600, from(idB, 3))
	ev.Authenticated = true
	if out := m.Handle(ev); out.Refused != "" || out.Wake != ms(915) || m.Backoff() != 0 {
		t.Fatalf("an authenticated advert: %+v backoff %s, want obeyed, a standby waiting its dead interval until 915ms (backoff 0)", out, m.Backoff())
	}
}

// FuzzParseFrame: any bytes either parse or are refused as not an advert; a version-2 frame
// verifies exactly when it is what the key seals for its fields and sequence (the tag covers every
// byte before it, the reserved byte and unknown flags included).
func FuzzParseFrame(f *testing.F) {
	key := mustKey(f, testSecret)
	f.Add(key.Seal(from(idB, 3), 42))
	f.Add(from(idB, 3).Marshal())
	f.Add([]byte("LBHA\x02"))
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, err := ParseFrame(b)
		if err != nil {
			return
		}
		if fr.Version != 2 {
			if key.verify(&fr) {
				t.Fatal("a version-1 frame verified")
			}
			return
		}
		resealed := key.Seal(fr.Advert, fr.Seq)
		if key.verify(&fr) != bytes.Equal(resealed, b[:sealedLen]) {
			t.Fatalf("verify %t for %x, resealed %x", key.verify(&fr), b[:sealedLen], resealed)
		}
	})
}
