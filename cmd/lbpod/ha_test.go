package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
	"github.com/lbsvc/lbsvc-operator/lbpod"
	"github.com/lbsvc/lbsvc-operator/lbpod/ha"
	"github.com/lbsvc/lbsvc-operator/lbpod/metric"
	"github.com/lbsvc/lbsvc-operator/lbpod/probe"
)

func TestParseFlagsElection(t *testing.T) {
	base := []string{"--service-file", "/svc.yaml"}
	o, err := parseFlags("lbpod", base)
	if err != nil {
		t.Fatal(err)
	}
	if o.haEnabled() || o.ha.replicas != 1 || o.ha.interval != 100*time.Millisecond || o.ha.priority != 100 || o.ha.lease != time.Second {
		t.Fatalf("defaults: %+v", o.ha)
	}
	t.Setenv(v1alpha1.EnvReplicas, "2")
	if o, err = parseFlags("lbpod", base); err != nil || !o.haEnabled() {
		t.Fatalf("LBPOD_REPLICAS=2: %+v, %v", o.ha, err)
	}
	if o, err = parseFlags("lbpod", append(base, "--replicas", "1")); err != nil || o.haEnabled() {
		t.Fatalf("--replicas 1 over the environment: %+v, %v", o.ha, err)
	}
	t.Setenv(v1alpha1.EnvHAInterval, "250ms")
	if o, err = parseFlags("lbpod", base); err != nil || o.ha.interval != 250*time.Millisecond {
		t.Fatalf("LBPOD_HA_INTERVAL=250ms: %+v, %v", o.ha, err)
	}
	if o, err = parseFlags("lbpod", append(base, "--ha-interval", "200ms")); err != nil || o.ha.interval != 200*time.Millisecond {
		t.Fatalf("--ha-interval 200ms over the environment: %+v, %v", o.ha, err)
	}
	t.Setenv(v1alpha1.EnvHAInterval, "")
	for args, want := range map[string]string{
		"--replicas x":                   `replicas "x": not a number`,
		"--replicas 0":                   "replicas 0: want 1 or more",
		"--ha-priority 256":              "ha-priority 256: want 0 to 255",
		"--ha-interval 0s":               "ha-interval 0s: want more than 0 and at most 1m5.535s",
		"--ha-interval fast":             `ha-interval "fast": not a duration (like 100ms)`,
		"--ha-lease 500ms":               "ha-lease 500ms: want 0 (none) or at least 1s and longer than 3 intervals",
		"--ha-interval 1s --ha-lease 2s": "ha-lease 2s: want 0 (none) or at least 1s and longer than 3 intervals",
	} {
		if _, err := parseFlags("lbpod", append(base, strings.Fields(args)...)); err == nil || err.Error() != want {
			t.Errorf("%s: err %v, want %q", args, err, want)
		}
	}
	if o, err = parseFlags("lbpod", append(base, "--ha-lease", "0s")); err != nil || o.ha.lease != 0 {
		t.Fatalf("--ha-lease 0s: %+v, %v", o.ha, err)
	}
	if o.ha.keyFile != "" || o.ha.replayWindow != ha.DefaultReplayWindow || o.ha.legacyWindow != ha.DefaultLegacyWindow ||
		o.ha.copyWindow != ha.DefaultCopyWindow {
		t.Fatalf("authentication defaults: %+v", o.ha)
	}
	o, err = parseFlags("lbpod", append(base, "--ha-key-file", "/k", "--ha-replay-window", "3s", "--ha-legacy-window", "0s", "--ha-copy-window", "5s"))
	if err != nil || o.ha.keyFile != "/k" || o.ha.replayWindow != 3*time.Second || o.ha.legacyWindow != 0 || o.ha.copyWindow != 5*time.Second {
		t.Fatalf("authentication flags: %+v, %v", o.ha, err)
	}
	if c := o.haConfig(lbpod.Network{}); c.ReplayWindow != 3*time.Second || c.LegacyWindow != 0 || c.CopyWindow != 5*time.Second {
		t.Fatalf("haConfig: %+v", c)
	}
	for args, want := range map[string]string{
		"--ha-replay-window 0s":  "ha-replay-window 0s: want more than 0",
		"--ha-legacy-window -1s": "ha-legacy-window -1s: want 0 (never) or more",
		"--ha-copy-window -1s":   "ha-copy-window -1s: want 0 (never) or more",
	} {
		if _, err := parseFlags("lbpod", append(base, strings.Fields(args)...)); err == nil || err.Error() != want {
			t.Errorf("%s: err %v, want %q", args, err, want)
		}
	}
}

// The key file: used as it is when long enough; a missing or short one is a one-line error.
func TestReadHAKey(t *testing.T) {
	dir := t.TempDir()
	good, short := filepath.Join(dir, "ha.key"), filepath.Join(dir, "short")
	secret := []byte("0123456789abcdef0123456789abcdef")
	if err := os.WriteFile(good, secret, 0o400); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(short, secret[:15], 0o400); err != nil {
		t.Fatal(err)
	}
	if key, err := readHAKey(good); err != nil || string(key) != string(secret) {
		t.Fatalf("readHAKey(good) = %q, %v", key, err)
	}
	for path, want := range map[string]string{
		short:                         `ha-key-file "` + short + `": 15 bytes, want at least 16`,
		filepath.Join(dir, "missing"): "ha-key-file: open " + filepath.Join(dir, "missing") + ": no such file or directory",
	} {
		if _, err := readHAKey(path); err == nil || err.Error() != want {
			t.Errorf("readHAKey(%s): %v, want %q", path, err, want)
		}
	}
	// run stops on it before anything else.
	o, err := parseFlags("lbpod", []string{"--service-file", "/svc.yaml", "--replicas", "2", "--ha-key-file", short})
	if err != nil {
		t.Fatal(err)
	}
	if err := run(context.Background(), o, lbpod.Network{}, slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "15 bytes, want at least 16") {
		t.Fatalf("run with a short key: %v", err)
	}
}

// A takeover in one add announces the addresses before tookOver returns, that is before the
// election's advert and while the put's confirmation is fresh; not from a goroutine that a
// starved node runs late.
func TestTookOverAnnouncesAtOnce(t *testing.T) {
	o, err := parseFlags("lbpod", []string{"--service-file", "/svc.yaml", "--interface", "lbsvc-test-none"})
	if err != nil {
		t.Fatal(err)
	}
	network := lbpod.Network{Addresses: []netip.Prefix{netip.MustParsePrefix("172.18.0.18/16"), netip.MustParsePrefix("fd18::18/64")}}
	h := newLoopHolder(o, network, slog.New(slog.DiscardHandler))
	h.loop = lbpod.NewLoop(lbpod.LoopConfig{Network: network, Log: slog.New(slog.DiscardHandler)})
	h.confirm(true)
	stats := h.loop.AnnounceStats()
	h.tookOver(nil)
	if n := stats.Failures.Load() + stats.Sent.Load(); n != 0 {
		t.Fatalf("no takeover, %d announcements tried", n)
	}
	took := time.Millisecond
	h.tookOver(&took)
	// The interface does not exist, so sending fails: that is how the test sees it was tried.
	if got := stats.Failures.Load(); got != 2 {
		t.Fatalf("when tookOver returned, %d announcements had been tried, want 2 (both addresses)", got)
	}
}

// The holder waits for the loop to report the role applied, and announces only while the election
// has confirmed it active within the dead interval.
func TestLoopHolder(t *testing.T) {
	o, err := parseFlags("lbpod", []string{"--service-file", "/svc.yaml", "--interface", "lbsvc-test-none", "--ha-lease", "0s"})
	if err != nil {
		t.Fatal(err)
	}
	network := lbpod.Network{Addresses: []netip.Prefix{netip.MustParsePrefix("172.18.0.18/16")}}
	h := newLoopHolder(o, network, slog.New(slog.DiscardHandler))
	h.loop = lbpod.NewLoop(lbpod.LoopConfig{Network: network, Log: slog.New(slog.DiscardHandler)})
	clock := time.Unix(1000, 0)
	h.now = func() time.Time { return clock }

	// The loop reports the address held while SetActive waits: it returns then, not at its limit.
	h.waitHeld = time.Minute
	go h.onHeld(true)
	h.SetActive(true)
	if !h.loop.Active() {
		t.Fatal("the loop was not made active")
	}
	// Sent (the interface does not exist, so sending fails: that is how the test sees it tried).
	if err := h.announce("lbsvc-test-none", network.Addresses); err == nil {
		t.Fatal("an active just confirmed did not announce")
	}
	clock = clock.Add(299 * time.Millisecond)
	if err := h.announce("lbsvc-test-none", network.Addresses); err == nil {
		t.Fatal("an active confirmed 299 ms ago (dead interval 300 ms) did not announce")
	}
	clock = clock.Add(time.Millisecond)
	stats := h.loop.AnnounceStats()
	if err := h.announce("lbsvc-test-none", network.Addresses); err != nil {
		t.Fatalf("an active not confirmed for the dead interval (frozen?) announced: %v", err)
	}
	// The next advert confirms it again and sends the withheld announcement (tried: it fails,
	// counted per address), once.
	failures := stats.Failures.Load()
	if err := h.Renew(300 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if got := stats.Failures.Load() - failures; got != 1 {
		t.Fatalf("Renew after a withheld announcement tried %d announcements, want 1", got)
	}
	if err := h.Renew(300 * time.Millisecond); err != nil || stats.Failures.Load()-failures != 1 {
		t.Fatalf("a second Renew (err %v) sent the withheld announcement again: %d tries", err, stats.Failures.Load()-failures)
	}
	if err := h.announce("lbsvc-test-none", network.Addresses); err == nil {
		t.Fatal("an active confirmed by Renew did not announce")
	}
	// Withheld, then a step down: a standby never announces, not even what it withheld as active.
	clock = clock.Add(300 * time.Millisecond)
	if err := h.announce("lbsvc-test-none", network.Addresses); err != nil {
		t.Fatalf("an active not confirmed for the dead interval announced: %v", err)
	}
	h.confirm(false)
	h.confirm(true)
	h.sendWithheld()
	if got := stats.Failures.Load() - failures; got != 2 {
		t.Fatalf("after a step down the withheld announcement was sent (%d tries, want 2: the announce above only)", got)
	}

	// Standby: the loop has not reported the address gone; SetActive gives up after waitHeld.
	h.waitHeld = time.Millisecond
	h.SetActive(false)
	if h.loop.Active() {
		t.Fatal("the loop is still active")
	}
	if err := h.announce("lbsvc-test-none", network.Addresses); err != nil {
		t.Fatalf("a standby announced: %v", err)
	}
}

// The loop adds and repairs the addresses on the lifetime Renew puts on (none without a lease).
func TestLoopLifetime(t *testing.T) {
	network := lbpod.Network{Addresses: []netip.Prefix{netip.MustParsePrefix("172.18.0.18/16")}}
	for _, tc := range []struct {
		args []string
		dead time.Duration
		want time.Duration
	}{
		{[]string{"--ha-lease", "0s"}, 0, 0},
		{nil, 0, time.Second},                           // the default lease, the default dead interval
		{nil, 3300 * time.Millisecond, 4 * time.Second}, // stretched on a starved node, as Renew would
		{[]string{"--ha-lease", "5s"}, 0, 5 * time.Second},
	} {
		o, err := parseFlags("lbpod", append([]string{"--service-file", "/svc.yaml"}, tc.args...))
		if err != nil {
			t.Fatal(err)
		}
		h := newLoopHolder(o, network, slog.New(slog.DiscardHandler))
		if tc.dead > 0 {
			h.dead = tc.dead
		}
		if got := h.loopLifetime(); got != tc.want {
			t.Errorf("%v, dead interval %s: loop lifetime %s, want %s", tc.args, h.dead, got, tc.want)
		}
	}
}

func TestAddressLifetime(t *testing.T) {
	for _, tc := range []struct{ lease, holdFor, want time.Duration }{
		{time.Second, 300 * time.Millisecond, time.Second},     // calm: the lease
		{time.Second, 500 * time.Millisecond, time.Second},     // exactly a second
		{time.Second, 501 * time.Millisecond, 2 * time.Second}, // stretched: above holdFor
		{time.Second, 3300 * time.Millisecond, 4 * time.Second},
		{5 * time.Second, 3300 * time.Millisecond, 5 * time.Second},
	} {
		if got := addressLifetime(tc.lease, tc.holdFor); got != tc.want {
			t.Errorf("addressLifetime(%s, %s) = %s, want %s", tc.lease, tc.holdFor, got, tc.want)
		}
	}
}

// A renewal that cannot be done is an error for the election (which steps down), not a log line:
// here net1 does not exist.
func TestRenewFailureIsReported(t *testing.T) {
	o, err := parseFlags("lbpod", []string{"--service-file", "/svc.yaml", "--interface", "lbsvc-test-none"})
	if err != nil {
		t.Fatal(err)
	}
	network := lbpod.Network{Addresses: []netip.Prefix{netip.MustParsePrefix("172.18.0.18/16")}}
	h := newLoopHolder(o, network, slog.New(slog.DiscardHandler))
	err = h.Renew(300 * time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), `"lbsvc-test-none"`) {
		t.Fatalf("Renew without net1: %v, want an error naming the interface", err)
	}
	// A failed renewal is not recorded: the next one tries again (and fails again) at once.
	if err := h.Renew(300 * time.Millisecond); err == nil {
		t.Fatal("second Renew right after a failed one: nil, want it tried again and failing")
	}
}

// A takeover goes through the loop unless the loop stands ready (lbpod.Loop.TakeOver): the holder
// puts nothing on net1 for a loop that has not applied as a standby (here it never ran), tells
// the loop, and waits for it as before.
func TestTakeoverWaitsForALoopNotStanding(t *testing.T) {
	o, err := parseFlags("lbpod", []string{"--service-file", "/svc.yaml", "--interface", "lbsvc-test-none"})
	if err != nil {
		t.Fatal(err)
	}
	network := lbpod.Network{Addresses: []netip.Prefix{netip.MustParsePrefix("172.18.0.18/16")}}
	var logs strings.Builder
	h := newLoopHolder(o, network, slog.New(slog.NewTextHandler(&logs, nil)))
	h.loop = lbpod.NewLoop(lbpod.LoopConfig{Network: network, Log: slog.New(slog.DiscardHandler)})
	h.waitHeld = time.Millisecond
	h.SetActive(false)
	if took, err := h.loop.TakeOver(func() error { t.Fatal("put ran for a loop that never applied"); return nil }); took || err != nil {
		t.Fatalf("TakeOver of a loop that never applied: %t, %v", took, err)
	}
	h.SetActive(true)
	if !h.loop.Active() {
		t.Fatal("the loop was not made active")
	}
	// takeNow would have tried net1 and failed (it does not exist): it did not try.
	if l := logs.String(); strings.Contains(l, "took over") || strings.Contains(l, "could not put the addresses") || !strings.Contains(l, "the loop has not applied the role yet") {
		t.Fatalf("want the takeover left to the loop and waited for; log:\n%s", l)
	}
}

// The election's peers are remembered (bounded), and the conflict probe does not count their
// answers: two replicas that took over at once hear each other during the probe.
func TestProbeIgnoresPeers(t *testing.T) {
	o, err := parseFlags("lbpod", []string{"--service-file", "/svc.yaml", "--interface", "lbsvc-test-none"})
	if err != nil {
		t.Fatal(err)
	}
	h := newLoopHolder(o, lbpod.Network{}, slog.New(slog.DiscardHandler))
	peerMAC, _ := net.ParseMAC("3a:f9:b2:96:02:8b")
	hostMAC, _ := net.ParseMAC("02:00:5e:10:20:30")
	if h.isPeer(peerMAC) {
		t.Fatal("a peer before any advert")
	}
	var id ha.ID
	copy(id[:], peerMAC)
	h.Peer(id)
	if !h.isPeer(peerMAC) || h.isPeer(hostMAC) || h.isPeer(net.HardwareAddr{1, 2, 3}) {
		t.Fatalf("after Peer(%s): isPeer(peer) %t, isPeer(host) %t", id, h.isPeer(peerMAC), h.isPeer(hostMAC))
	}
	for i := range 2 * maxPeers {
		h.Peer(ha.ID{2, 0, 0, 0, 0, byte(i)})
	}
	if len(h.peers) != maxPeers {
		t.Errorf("%d peers remembered, want at most %d", len(h.peers), maxPeers)
	}

	addr := netip.MustParseAddr("172.18.0.44")
	p := &prober{log: slog.New(slog.DiscardHandler), peer: h.isPeer}
	got := p.notPeers([]v1alpha1.AddressConflict{{Address: addr, MAC: peerMAC}, {Address: addr, MAC: hostMAC}})
	if len(got) != 1 || got[0].MAC.String() != hostMAC.String() {
		t.Errorf("notPeers kept %v, want only the host %s", got, hostMAC)
	}
	ignore := p.peerAnswer()
	if !ignore(peerMAC) || ignore(hostMAC) {
		t.Errorf("the probe's ignore: peer %t, host %t; want true, false", ignore(peerMAC), ignore(hostMAC))
	}
	if (&prober{log: slog.New(slog.DiscardHandler)}).peerAnswer() != nil {
		t.Error("without peers the probe's ignore is not nil")
	}
	if got := (&prober{log: slog.New(slog.DiscardHandler)}).notPeers([]v1alpha1.AddressConflict{{Address: addr, MAC: peerMAC}}); len(got) != 1 {
		t.Errorf("without peers notPeers kept %v, want the answer", got)
	}
}

// fakeLease is the prober's view of the Lease (leaseState) without an API server: annotations the
// test sets, reads counted, an error when failing is set.
type fakeLease struct {
	mu      sync.Mutex
	ann     map[string]string
	reads   int
	failing bool
}

func (f *fakeLease) annotations(context.Context) (map[string]string, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reads++
	if f.failing {
		return nil, false, errors.New("the API server is away")
	}
	return maps.Clone(f.ann), f.ann != nil, nil
}

func (f *fakeLease) startProbe() {}

func (f *fakeLease) probed(context.Context, []netip.Addr, []v1alpha1.AddressConflict) error {
	return nil
}

func (f *fakeLease) set(ann map[string]string, failing bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ann, f.failing = ann, failing
}

func (f *fakeLease) readCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reads
}

// A replica blocked by what answered its probe reads the Lease again while blocked, and stays
// blocked while the Lease does not list the addresses as announced (or cannot be read); once
// another replica announced them (the operator then keeps the Service on them) it is unblocked,
// its conflict gauge goes to 0, and as the election's active it takes the addresses, as a standby
// it stays one. Before this, such a replica stayed blocked for good: never ready, so never
// claiming, and holding nothing as the active, so that the Service had no holder once the
// replica that announced failed.
func TestBlockedReplicaUnblocksOnceAnnounced(t *testing.T) {
	o, err := parseFlags("lbpod", []string{"--service-file", "/svc.yaml", "--interface", "lbsvc-test-none", "--ha-lease", "0s"})
	if err != nil {
		t.Fatal(err)
	}
	addr := netip.MustParseAddr("172.18.0.18")
	hostMAC, _ := net.ParseMAC("02:00:5e:10:20:30")
	network := lbpod.Network{Addresses: []netip.Prefix{netip.PrefixFrom(addr, 16)}}
	for _, active := range []bool{true, false} {
		t.Run(fmt.Sprintf("active=%t", active), func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var logs syncBuffer
			log := slog.New(slog.NewTextHandler(&logs, nil))
			h := newLoopHolder(o, network, log)
			h.loop = lbpod.NewLoop(lbpod.LoopConfig{Network: network, Log: slog.New(slog.DiscardHandler)})
			h.waitHeld = time.Millisecond
			h.recheckBlocked = 5 * time.Millisecond
			lease := &fakeLease{}
			// What the recorder writes with the blocked replica's conflict while nothing was claimed
			// before: the claim, an empty announced list and the conflict.
			lease.set(map[string]string{v1alpha1.HAClaimAnnotation: "1 100 02:00:00:00:00:0b", v1alpha1.AnnouncedAnnotation: ""}, false)
			reg := metric.NewRegistry()
			p, err := newProber(options{conflictProbe: "fast", iface: "lbsvc-test-none"}, network, lease, reg, log)
			if err != nil || p == nil {
				t.Fatalf("newProber: %v, %v", p, err)
			}
			const reason = "in use on the underlay: 172.18.0.18 answered by 02:00:5e:10:20:30; not announced"
			p.reason, p.conflicts = reason, []v1alpha1.AddressConflict{{Address: addr, MAC: hostMAC}}
			p.done.Store(true)
			gauge := p.conflictGauge.WithLabelValues(addr.String(), hostMAC.String())
			gauge.Set(1)
			h.prober = p
			h.SetActive(active)
			h.loop.Block(reason)
			stopped := make(chan struct{})
			go func() {
				h.awaitAnnounced(ctx)
				close(stopped)
			}()

			waitFor := func(what string, cond func() bool) {
				t.Helper()
				for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatalf("not within 10s: %s; log:\n%s", what, logs.String())
					}
				}
			}
			// Not announced, then not readable: read again and again, blocked all along.
			reads := lease.readCount()
			waitFor("three more reads of the Lease", func() bool { return lease.readCount() >= reads+3 })
			lease.set(nil, true)
			reads = lease.readCount()
			waitFor("three more reads of a Lease that fails", func() bool { return lease.readCount() >= reads+3 })
			if got := h.loop.Blocked(); got != reason || !h.holdsNothing() || gauge.Value() != 1 || p.check(ctx) != reason {
				t.Fatalf("unblocked (%q, gauge %v) while the Lease did not list the address", got, gauge.Value())
			}
			// Another replica announced it.
			lease.set(map[string]string{v1alpha1.HAClaimAnnotation: "2 100 02:00:00:00:00:0a", v1alpha1.AnnouncedAnnotation: "172.18.0.18"}, false)
			waitFor("unblocked", func() bool { return h.loop.Blocked() == "" })
			if gauge.Value() != 0 || p.check(ctx) != "" || h.holdsNothing() {
				t.Errorf("unblocked, but gauge %v, check %q, holdsNothing %t", gauge.Value(), p.check(ctx), h.holdsNothing())
			}
			if h.loop.Active() != active {
				t.Errorf("unblocked: loop active %t, want %t (the election's)", h.loop.Active(), active)
			}
			if l := logs.String(); !strings.Contains(l, "no longer blocked") {
				t.Errorf("no log line says so:\n%s", l)
			}
			// It stops reading the Lease.
			select {
			case <-stopped:
			case <-time.After(10 * time.Second):
				t.Error("still reading the Lease 10s after the unblock")
			}
		})
	}
}

// syncBuffer is a strings.Builder that a logger on other goroutines may write to.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// The probe before the first claim (firstClaim): nothing to probe without a prober; none once a
// takeover has probed; none when the probe would outlast what is left of the dead interval (the
// rfc timing); and once settled, the takeover's check holds the addresses without probing again
// (it would need net1 to probe: there is none here).
func TestProbeFirst(t *testing.T) {
	ctx := context.Background()
	var none *prober
	if free, ok, why := none.probeFirst(ctx); free != nil || !ok || why != "" {
		t.Errorf("without a prober: %v %t %q, want nothing to probe", free, ok, why)
	}
	none.settle() // no prober: nothing to settle, no panic

	addr := netip.MustParseAddr("172.18.0.44")
	newProber := func(timing probe.Timing) *prober {
		return &prober{timing: timing, iface: "lbsvc-test-none", addrs: []netip.Addr{addr}, log: slog.New(slog.DiscardHandler)}
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	p := newProber(probe.RFC)
	if _, ok, why := p.probeFirst(short); ok || !strings.Contains(why, "longer than the dead interval") {
		t.Errorf("rfc timing within 300 ms: ok %t, why %q", ok, why)
	}
	if p.finished() {
		t.Error("a probe that did not run stands")
	}

	p = newProber(probe.Fast)
	p.done.Store(true)
	if _, ok, why := p.probeFirst(ctx); ok || why != "a takeover probed already" {
		t.Errorf("after a takeover's probe: ok %t, why %q", ok, why)
	}

	p = newProber(probe.Fast)
	p.reason = "stale"
	p.settle()
	if !p.finished() || p.check(ctx) != "" {
		t.Errorf("settled: finished %t, check %q; want the addresses held without a probe", p.finished(), p.check(ctx))
	}

	// A takeover at the dead interval probed while the grant's write was on its way, and a host
	// answered: the grant's settle keeps that outcome, for announcedSince to lift once the Lease
	// lists the addresses as announced (clearing it would leave that with nothing to lift, and
	// the holder blocked for good).
	p = newProber(probe.Fast)
	blocked := "in use on the underlay: 172.18.0.44 answered by 02:00:5e:00:00:01; not announced"
	p.reason = blocked
	p.done.Store(true)
	p.settle()
	if !p.finished() || p.check(ctx) != blocked {
		t.Errorf("settled after a takeover's probe found an answer: finished %t, check %q; want %q kept", p.finished(), p.check(ctx), blocked)
	}
}

// A single lb pod (no election) blocked by what answered its probe reads the Lease again while
// blocked and, once it lists the address as announced, holds it: its first read of the Lease
// could fail (an API server timeout), and then it probed an address announced long ago, which a
// host on the underlay that answers every probe blocked for good (the operator ignores a report
// on an announced address, so nothing moved the Service either).
func TestBlockedSingleLBPodUnblocksOnceAnnounced(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr := netip.MustParseAddr("172.18.0.18")
	network := lbpod.Network{Addresses: []netip.Prefix{netip.PrefixFrom(addr, 16)}}
	loop := lbpod.NewLoop(lbpod.LoopConfig{Network: network, Log: slog.New(slog.DiscardHandler)})
	loop.SetActive(false)
	lease := &fakeLease{}
	lease.set(map[string]string{v1alpha1.AnnouncedAnnotation: ""}, false)
	p, err := newProber(options{conflictProbe: "fast", iface: "lbsvc-test-none"}, network, lease, metric.NewRegistry(), slog.New(slog.DiscardHandler))
	if err != nil || p == nil {
		t.Fatalf("newProber: %v, %v", p, err)
	}
	// What the probe found (made without the Lease, it probed the announced address too).
	const reason = "in use on the underlay: 172.18.0.18 answered by 02:00:5e:10:20:30; not announced"
	p.reason = reason
	p.done.Store(true)
	returned := make(chan struct{})
	go func() {
		holdSingle(ctx, loop, p, 5*time.Millisecond)
		close(returned)
	}()

	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("not within 10s: %s", what)
			}
		}
	}
	reads := lease.readCount()
	waitFor("three more reads of the Lease", func() bool { return lease.readCount() >= reads+3 })
	if loop.Blocked() != reason || loop.Active() {
		t.Fatalf("blocked %q, active %t: want blocked, not active", loop.Blocked(), loop.Active())
	}
	lease.set(map[string]string{v1alpha1.AnnouncedAnnotation: "172.18.0.18"}, false)
	waitFor("unblocked and active", func() bool { return loop.Blocked() == "" && loop.Active() })
	// It stops reading the Lease.
	select {
	case <-returned:
	case <-time.After(10 * time.Second):
		t.Error("still reading the Lease 10s after the unblock")
	}
}
