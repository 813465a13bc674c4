package ha

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"
)

// recordingHolder records what the runner asks of the data path; Renew fails with renewErr.
type recordingHolder struct {
	calls    []string
	renewErr error
}

func (h *recordingHolder) SetActive(active bool) {
	h.calls = append(h.calls, fmt.Sprintf("active=%t", active))
}

func (h *recordingHolder) Renew(time.Duration) error {
	h.calls = append(h.calls, "renew")
	return h.renewErr
}

// testRunner is a runner without a socket (every send fails and is counted) whose clock began an
// hour ago, started 400 ms ago as a standby: a Tick now takes over.
func testRunner(t *testing.T, h Holder) (*runner, *Metrics, *bytes.Buffer) {
	t.Helper()
	cfg := Config{ID: idA, Group: group, Priority: DefaultPriority, MaxSlack: -1}.withDefaults()
	var logs bytes.Buffer
	mt := NewMetrics()
	r := &runner{opts: Options{Metrics: mt}, cfg: cfg, holder: h, m: NewMachine(cfg), origin: time.Now().Add(-time.Hour),
		log: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})), wall: time.Now}
	r.handle(Event{Kind: Start, Now: r.now() - 400*time.Millisecond})
	return r, mt, &logs
}

// A renewal that fails at the takeover: the active advert is not sent, the machine is told, and
// the replica releases the addresses and resigns at once; the log says why and the metric counts.
func TestRunRenewalFailure(t *testing.T) {
	h := &recordingHolder{renewErr: errors.New("lease: interface \"net1\": Link not found")}
	r, mt, logs := testRunner(t, h)
	out := r.handle(Event{Kind: Tick, Now: r.now()})
	if out.Role != Standby || out.Hold != Release || out.Send == nil || !out.Send.Resigning || out.Send.Term != 1 {
		t.Fatalf("after a failed renewal: %+v, want a standby that released and resigned term 1", out)
	}
	if got := strings.Join(h.calls, ","); got != "active=false,active=true,renew,active=false" {
		t.Fatalf("holder calls %s, want release at start, take, renew, release", got)
	}
	if n := mt.RenewalFailures.Value(); n != 1 {
		t.Errorf("lbpod_ha_lifetime_renewal_failures_total %v, want 1", n)
	}
	// One send tried, the resignation (no socket here): the active advert never went out.
	if n := mt.SendErrors.Value() + mt.AdvertsSent.Value(); n != 1 {
		t.Errorf("%v adverts tried, want 1 (the resignation)", n)
	}
	if n := mt.Active.Value(); n != 0 {
		t.Errorf("lbpod_ha_active %v, want 0", n)
	}
	for _, want := range []string{"Link not found", "kernel lifetime could not be renewed: released them and resigned"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log does not say %q:\n%s", want, logs)
		}
	}
	// Renewals that work: the next takeover holds.
	h.renewErr, h.calls = nil, nil
	for r.m.Role() != Active {
		r.handle(Event{Kind: Tick, Now: r.m.deadline})
	}
	if got := strings.Join(h.calls, ","); got != "active=true,renew" {
		t.Fatalf("holder calls %s, want take and renew", got)
	}
}

// Refused adverts are counted by reason, change nothing, and only the first of a reason is a
// warning.
func TestRunRefused(t *testing.T) {
	h := &recordingHolder{}
	r, mt, logs := testRunner(t, h)
	wake := r.m.wakeAt
	forged := Advert{Group: group, Term: math.MaxUint64, Priority: 255, Sender: idB, Interval: MaxInterval}
	for range 3 {
		if out := r.handle(Event{Kind: Received, Now: r.now(), Advert: forged}); out.Refused != RefusedTerm || out.Wake != wake {
			t.Fatalf("forged advert: %+v, want refused for its term, wake unchanged", out)
		}
	}
	forged.Term = 3
	r.handle(Event{Kind: Received, Now: r.now(), Advert: forged})
	for reason, want := range map[string]float64{RefusedTerm: 3, RefusedInterval: 1, RefusedSender: 0} {
		if n := mt.AdvertsRejected.WithLabelValues(reason).Value(); n != want {
			t.Errorf("lbpod_ha_adverts_rejected_total{reason=%q} %v, want %v", reason, n, want)
		}
	}
	if n := strings.Count(logs.String(), "level=WARN msg=\"advert refused;"); n != 2 {
		t.Errorf("%d warnings, want one per reason (2):\n%s", n, logs)
	}
	if got := strings.Join(h.calls, ","); got != "active=false" || r.m.Term() != 0 {
		t.Errorf("holder calls %s term %d after refused adverts, want only the release at start, term 0", got, r.m.Term())
	}
}

// With a key the runner seals what it sends and checks what it receives: each refusal is counted
// under its reason and changes nothing; the accepted advert reaches the machine as authenticated.
// Without one, version-2 frames are dropped unread, as an old replica's socket filter does.
func TestRunAuthenticated(t *testing.T) {
	h := &recordingHolder{}
	r, mt, _ := testRunner(t, h)
	wall := wall0
	r.wall = func() time.Time { return wall }
	if err := r.authenticate(testSecret); err != nil {
		t.Fatal(err)
	}
	r.handle(Event{Kind: Start, Now: r.now()})
	peer := mustKey(t, testSecret)
	resign := resigning(from(idB, 7))
	good := mustFrame(t, peer.Seal(from(idB, 7), usAt(0)))
	var out Output
	for _, f := range []Frame{
		mustFrame(t, mustKey(t, otherSecret).Seal(resign, usAt(1))), // auth
		mustFrame(t, resign.Marshal()),                              // unauthenticated (window 0)
		mustFrame(t, peer.Seal(resign, usAt(-time.Minute))),         // stale
		good,
		good, // replay
	} {
		out = r.received(out, f)
	}
	for reason, want := range map[string]float64{RefusedAuth: 1, RefusedUnauthenticated: 1, RefusedStale: 1, RefusedReplay: 1, RefusedTerm: 0} {
		if n := mt.AdvertsRejected.WithLabelValues(reason).Value(); n != want {
			t.Errorf("lbpod_ha_adverts_rejected_total{reason=%q} %v, want %v", reason, n, want)
		}
	}
	if n := mt.AdvertsReceived.Value(); n != 5 {
		t.Errorf("lbpod_ha_adverts_received_total %v, want 5", n)
	}
	if r.m.Role() != Standby || r.m.Term() != 7 || !r.m.heardAuth {
		t.Errorf("after the good advert: %s term %d heardAuth %t, want a standby that learnt term 7 authenticated", r.m.Role(), r.m.Term(), r.m.heardAuth)
	}
	// What it sends verifies with the peer's key, numbered from its wall clock.
	sealed := r.key.Seal(from(idA, 1), r.seq.Next(wall, r.cfg.ReplayWindow))
	if f := mustFrame(t, sealed); !peer.verify(&f) || f.Seq != usAt(0) {
		t.Errorf("sealed frame %+v does not verify or has sequence %d, want %d", f, f.Seq, usAt(0))
	}

	// Without a key: version 2 is not read at all, version 1 goes to the machine.
	old, oldMetrics, _ := testRunner(t, &recordingHolder{})
	old.received(Output{}, good)
	if n := oldMetrics.AdvertsReceived.Value(); n != 0 || old.m.Term() != 0 {
		t.Errorf("a keyless runner read a version-2 frame: received %v, term %d", n, old.m.Term())
	}
	old.received(Output{}, mustFrame(t, from(idB, 7).Marshal()))
	if n := oldMetrics.AdvertsReceived.Value(); n != 1 || old.m.Term() != 7 {
		t.Errorf("a keyless runner and a version-1 frame: received %v, term %d; want 1, 7", n, old.m.Term())
	}
}

// Copies to the shared address (copyToLegacy) start only with an accepted advert of our wire
// version from a replica that does not send to group addresses: not with a marked one, not with a
// forged one (a wrong key), not with a version-1 frame (those replicas cannot read ours anyway),
// not with one carrying our own ID or another group (the guard passes those on unverified, for
// the machine to ignore: one forged frame a window kept every advert copied to every lb pod);
// they stop one legacy window after the last such advert, and never with NoGroupAddress.
func TestRunCopiesForOldReplicas(t *testing.T) {
	r, _, logs := testRunner(t, &recordingHolder{})
	secret := bytes.Repeat([]byte{9}, MinKeyLen)
	key, _ := NewKey(secret)
	// The operator gives a Deployment rolling from replicas with a key and without group
	// addresses --ha-legacy-window=0s (they carry the same wire label): the copies must not
	// depend on it.
	r.cfg.LegacyWindow, r.cfg.CopyWindow = 0, time.Minute
	r.key, r.guard, r.cfg.Authenticated = key, NewGuard(r.cfg, key), true
	wrong, _ := NewKey(bytes.Repeat([]byte{8}, MinKeyLen))
	var seq uint64 = uint64(time.Now().UnixMicro())
	frame := func(k *Key, flags byte, a Advert) Frame {
		seq++
		f, err := ParseFrame(k.seal(a, seq, flags))
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	v1, err := ParseFrame(from(idB, 1).marshal(0))
	if err != nil {
		t.Fatal(err)
	}
	otherGroup, badInterval := from(idB, 1), from(idB, 1)
	otherGroup.Group, badInterval.Interval = Group{1}, 0
	for _, tc := range []struct {
		name string
		f    Frame
	}{
		{"marked", frame(key, flagGroupAddressed, from(idB, 1))},
		{"wrong key", frame(wrong, 0, from(idB, 1))},
		{"version 1", v1},
		{"with our own ID and a garbage tag", frame(wrong, 0, from(idA, 1))},
		{"with our own ID", frame(key, 0, from(idA, 1))},
		{"of another group with a garbage tag", frame(wrong, 0, otherGroup)},
		{"the machine refuses (interval 0)", frame(key, 0, badInterval)},
	} {
		r.oldHeard = 0
		r.received(Output{}, tc.f)
		if r.copyToLegacy() {
			t.Errorf("an advert %s starts the copies", tc.name)
		}
	}
	r.received(Output{}, frame(key, 0, from(idB, 1)))
	if !r.copyToLegacy() || !strings.Contains(logs.String(), "adverts also go there") {
		t.Fatalf("an old replica's advert does not start the copies (or is not logged):\n%s", logs)
	}
	r.oldHeard = r.now() - r.cfg.CopyWindow - time.Millisecond
	if r.copyToLegacy() || !strings.Contains(logs.String(), "adverts go to the group's address only") {
		t.Errorf("the copies go on (or their end is not logged) one window after the last old advert:\n%s", logs)
	}
	r.received(Output{}, frame(key, 0, from(idB, 1)))
	r.opts.NoGroupAddress = true
	if r.copyToLegacy() {
		t.Error("a replica run as the release before copies its adverts")
	}
}

// The queue socket's adverts are fed to the machine as of when the kernel received them, never
// earlier than the socket's last read to the end, never later than now, and at now when there is
// no stamp or the wall clock stepped since that read: a misdated advert may only delay a takeover.
func TestRunDatesQueuedAdverts(t *testing.T) {
	r, _, _ := testRunner(t, &recordingHolder{})
	wall := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	now := r.now()
	r.dating(now-300*time.Millisecond, wall.Add(-300*time.Millisecond)) // the read before
	dated := r.dating(now, wall)
	for _, tc := range []struct {
		name string
		at   time.Time
		want time.Duration
	}{
		{"stamped 30 ms ago", wall.Add(-30 * time.Millisecond), now - 30*time.Millisecond},
		{"stamped before the read before", wall.Add(-time.Second), now - 300*time.Millisecond},
		{"stamped after now", wall.Add(time.Second), now},
		{"no stamp", time.Time{}, now},
	} {
		if got := dated(tc.at); got != tc.want {
			t.Errorf("%s: dated %s before now, want %s", tc.name, now-got, now-tc.want)
		}
	}
	// The wall clock stepped back 2 s between two reads: the stamps say nothing, all are now.
	later := now + 100*time.Millisecond
	stepped := wall.Add(100*time.Millisecond - 2*time.Second)
	if got := r.dating(later, stepped)(stepped.Add(-30 * time.Millisecond)); got != later {
		t.Errorf("after a 2 s step: dated %s before now, want now", later-got)
	}
	// A slewing clock (0.5 ms a second, adjtime's most) is still trusted.
	slewed := stepped.Add(time.Second + 500*time.Microsecond)
	if got := r.dating(later+time.Second, slewed)(slewed.Add(-30 * time.Millisecond)); got != later+time.Second-30*time.Millisecond {
		t.Errorf("a clock slewed by 0.5 ms in a second: dated %s before now, want 30ms", later+time.Second-got)
	}
}

// mustFrame parses b as a frame.
func mustFrame(t *testing.T, b []byte) Frame {
	t.Helper()
	f, err := ParseFrame(b)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// usAt is the sequence number of a frame sealed d after wall0 (microseconds of the wall clock).
func usAt(d time.Duration) uint64 { return uint64(wall0.Add(d).UnixMicro()) }

// peerHolder records the peers the runner notes (PeerNoter).
type peerHolder struct {
	recordingHolder
	peers []ID
}

func (h *peerHolder) Peer(id ID) { h.peers = append(h.peers, id) }

// The runner notes as a peer the sender of each advert the machine accepted: authenticated when it
// has a key (a forged, unauthenticated, stale or replayed frame names nobody), any accepted one
// without a key; never its own.
func TestRunNotesPeers(t *testing.T) {
	h := &peerHolder{}
	r, _, _ := testRunner(t, h)
	wall := wall0
	r.wall = func() time.Time { return wall }
	if err := r.authenticate(testSecret); err != nil {
		t.Fatal(err)
	}
	peer := mustKey(t, testSecret)
	good := mustFrame(t, peer.Seal(from(idB, 7), usAt(0)))
	var out Output
	for _, f := range []Frame{
		mustFrame(t, mustKey(t, otherSecret).Seal(from(idC, 8), usAt(1))), // forged: another key
		mustFrame(t, from(idC, 8).Marshal()),                              // unauthenticated
		mustFrame(t, peer.Seal(from(idC, 8), usAt(-time.Minute))),         // stale
		good,
		good, // replay
	} {
		out = r.received(out, f)
	}
	if len(h.peers) != 1 || h.peers[0] != idB {
		t.Errorf("peers %v, want only %s (the one authenticated advert)", h.peers, idB)
	}

	keyless := &peerHolder{}
	old, _, _ := testRunner(t, keyless)
	old.received(Output{}, mustFrame(t, from(idB, 7).Marshal()))
	old.received(Output{}, mustFrame(t, from(idA, 9).Marshal())) // our own ID: not a peer
	if len(keyless.peers) != 1 || keyless.peers[0] != idB {
		t.Errorf("keyless: peers %v, want only %s", keyless.peers, idB)
	}
}
