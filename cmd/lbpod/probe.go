package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
	"github.com/lbsvc/lbsvc-operator/lbpod"
	"github.com/lbsvc/lbsvc-operator/lbpod/metric"
	"github.com/lbsvc/lbsvc-operator/lbpod/probe"
)

// leaseState is what the prober reads and writes on the Service's Lease (leaseRecorder).
type leaseState interface {
	// annotations are the Lease's annotations, and whether it exists.
	annotations(ctx context.Context) (map[string]string, bool, error)
	// startProbe holds the Lease's writes back until probed.
	startProbe()
	// probed records the probe's outcome: the addresses found free (announced from now on), or
	// what answered. With standbys the announced ones go with the takeover's claim, in one write.
	probed(ctx context.Context, free []netip.Addr, conflicts []v1alpha1.AddressConflict) error
}

// prober runs the conflict probe once, before this lb pod first holds addresses its Service never
// announced (probe.Needed), and records the outcome on the Lease.
type prober struct {
	timing        probe.Timing
	iface         string
	addrs         []netip.Addr
	lease         leaseState // nil: no API (--service-file): every address is probed
	log           *slog.Logger
	conflictGauge *metric.GaugeVec

	// wanted, when set, says whether this replica still holds the election's active role: the
	// outcome of a probe by a replica that stepped down meanwhile (two replicas that took over at
	// the same moment; the other's announcement can then reach this one's probe) is dropped, and
	// a later takeover probes again.
	wanted func() bool
	// peer, when set, says whether a MAC is another replica's net1 (heard in the election's
	// authenticated adverts): its answers are not conflicts (notPeers).
	peer func(net.HardwareAddr) bool

	// mu serializes check; done says the outcome stands (read without mu: the holder asks while
	// holding its own lock, which wanted takes under mu).
	mu        sync.Mutex
	done      atomic.Bool
	reason    string                     // why the addresses may not be held; "" when they may
	conflicts []v1alpha1.AddressConflict // what answered, while reason stands
}

// recheckBlocked is how often a replica that its probe blocked reads the Lease again, to see
// whether the Service announced its addresses since (loopHolder.awaitAnnounced).
const recheckBlocked = 10 * time.Second

// newProber returns nil when nothing is to be probed: --conflict-probe off, or --service-file
// without --conflict-probe (the data path tests' lb pods keep their behaviour).
func newProber(o options, network lbpod.Network, lease leaseState, reg *metric.Registry, log *slog.Logger) (*prober, error) {
	timing, on, err := probe.TimingFor(o.conflictProbe)
	if err != nil || !on || (o.serviceFile != "" && !o.conflictProbeSet) {
		return nil, err
	}
	p := &prober{timing: timing, iface: o.iface, lease: lease, log: log,
		conflictGauge: metric.NewGaugeVec(metric.Opts{
			Name: "lbpod_address_conflict",
			Help: "1 for an LB address that a host on the underlay answered for before its first announcement (the lb pod holds none of its addresses then), by address and the MAC that answered; 0 once the Service announced it all the same (another replica did, and the operator did not take the report).",
		}, []string{"address", "mac"})}
	for _, a := range network.Addresses {
		p.addrs = append(p.addrs, a.Addr())
	}
	if err := reg.Register(p.conflictGauge); err != nil {
		return nil, err
	}
	return p, nil
}

// check probes once per process (later calls return the first answer): "" when the addresses may
// be held, else why not. A probe that cannot run at all (no raw socket) lets them be held, with a
// warning: the probe guards against a mistake on the underlay, it is not the fence.
func (p *prober) check(ctx context.Context) string {
	if p == nil {
		return ""
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.done.Load() {
		reason, done := p.run(ctx)
		p.reason = reason
		p.done.Store(done)
	}
	return p.reason
}

// run probes and records; done is false when the outcome was dropped (wanted said no).
func (p *prober) run(ctx context.Context) (reason string, done bool) {
	p.hold()
	needed := p.addrs
	if p.lease != nil {
		ann, found, err := p.lease.annotations(ctx)
		if err != nil {
			p.log.Warn("conflict probe: the Lease cannot be read; probing every address", "err", err)
			ann, found = nil, false
		}
		needed = probe.Needed(p.addrs, ann, found)
	}
	if len(needed) == 0 {
		p.log.Info("conflict probe: not needed", "why", "the Service's Lease lists its addresses as announced")
		p.record(ctx, nil, nil)
		return "", true
	}
	start := time.Now()
	conflicts, err := probe.Run(ctx, p.iface, needed, p.timing, p.peerAnswer())
	took := time.Since(start)
	if err != nil {
		p.log.Warn("conflict probe failed; announcing without it", "addresses", needed, "err", err)
		p.record(ctx, needed, nil)
		return "", true
	}
	conflicts = p.notPeers(conflicts)
	if p.wanted != nil && !p.wanted() {
		p.log.Info("conflict probe: outcome dropped, this replica is no longer active", "addresses", needed, "answered", len(conflicts))
		p.record(ctx, nil, nil)
		return "", false
	}
	if len(conflicts) == 0 {
		p.log.Info("conflict probe: nobody answered", "addresses", needed, "took", took.Round(time.Millisecond))
		p.record(ctx, needed, nil)
		return "", true
	}
	var parts []string
	for _, c := range conflicts {
		p.conflictGauge.WithLabelValues(c.Address.String(), c.MAC.String()).Set(1)
		parts = append(parts, fmt.Sprintf("%s answered by %s", c.Address, c.MAC))
	}
	reason = "in use on the underlay: " + strings.Join(parts, ", ") + "; not announced"
	p.log.Error("conflict probe: "+reason, "took", took.Round(time.Millisecond))
	p.record(ctx, nil, conflicts)
	p.conflicts = conflicts
	return reason, true
}

// awaitAnnounced calls announcedSince every period until it reports true, then unblocked, and
// returns (or returns when ctx ends). Each call is one GET of the Lease; only a blocked lb pod
// makes them.
func (p *prober) awaitAnnounced(ctx context.Context, period time.Duration, unblocked func()) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if p.announcedSince(ctx) {
			unblocked()
			return
		}
	}
}

// announcedSince reads the Lease again and, when it now lists every address as announced (by
// another replica: probe.Needed finds nothing left to probe), lifts the conflict this replica
// found and reports true. The operator believes a conflict only when it was reported before the
// address's first announcement (decide.DecideIPConflict); after it, the Service stays on the
// address, so a replica still blocked by what it heard would leave the Service with no holder once
// the replica that announced failed: blocked, it is never ready, so it never claims, and as the
// active it holds nothing. A Lease that cannot be read lifts nothing.
func (p *prober) announcedSince(ctx context.Context) bool {
	if p == nil || p.lease == nil {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.done.Load() || p.reason == "" {
		return false
	}
	ann, found, err := p.lease.annotations(ctx)
	if err != nil || !found || len(probe.Needed(p.addrs, ann, found)) > 0 {
		return false
	}
	p.log.Warn("conflict probe: the Service's Lease lists its addresses as announced since; no longer blocked by what answered this replica's probe",
		"was", p.reason)
	for _, c := range p.conflicts {
		p.conflictGauge.WithLabelValues(c.Address.String(), c.MAC.String()).Set(0)
	}
	p.reason, p.conflicts = "", nil
	return true
}

// peerAnswer is the probe's ignore predicate (probe.Run): answers from another replica of the
// Service (peer) are no conflict. Two replicas that took over at once (at start, or after a
// partition) hear each other's announcements and ARP replies during the probe; the probe skips
// them as they are read, so that a sibling heard first does not end the listening before a host
// that really uses the address answers. Each peer is logged once per probe. nil without peer.
func (p *prober) peerAnswer() func(net.HardwareAddr) bool {
	if p.peer == nil {
		return nil
	}
	var mu sync.Mutex
	logged := map[string]bool{}
	return func(mac net.HardwareAddr) bool {
		if !p.peer(mac) {
			return false
		}
		mu.Lock()
		defer mu.Unlock()
		if !logged[mac.String()] {
			logged[mac.String()] = true
			p.log.Info("conflict probe: answered by another replica of this Service, not a conflict", "mac", mac)
		}
		return true
	}
}

// notPeers drops the answers that came from another replica of the Service (peer), as the probe
// knows it now: peerAnswer asked while the answer was read, and the election may have heard the
// replica's first advert only since. A replica that took a sibling's answer for a host using the
// address blocked for good, leaving the Service with no holder once the other replica failed
// (seen on make demo: one of 100 Services down for good after a node failure). Each is logged.
func (p *prober) notPeers(conflicts []v1alpha1.AddressConflict) []v1alpha1.AddressConflict {
	if p.peer == nil {
		return conflicts
	}
	var kept []v1alpha1.AddressConflict
	for _, c := range conflicts {
		if p.peer(c.MAC) {
			p.log.Info("conflict probe: answered by another replica of this Service, not a conflict", "address", c.Address, "mac", c.MAC)
			continue
		}
		kept = append(kept, c)
	}
	return kept
}

// hold holds the Lease's writes back until record: called before the takeover's claim is handed
// to the recorder, so that claim and outcome go in one write. Idempotent.
func (p *prober) hold() {
	if p != nil && p.lease != nil {
		p.lease.startProbe()
	}
}

// record gives the outcome to the Lease (and releases its writes).
func (p *prober) record(ctx context.Context, free []netip.Addr, conflicts []v1alpha1.AddressConflict) {
	if p.lease == nil {
		return
	}
	if err := p.lease.probed(ctx, free, conflicts); err != nil {
		p.log.Warn("conflict probe: recording the outcome on the Lease failed; trying again in the background", "err", err)
	}
}

// finished says whether a probe's outcome stands (check will not probe again).
func (p *prober) finished() bool { return p.done.Load() }

// probeFirst probes, before the Service's first claim (firstClaim), every address of this lb pod:
// the Lease has never listed one as announced. ok when nobody answered; else why the claim is not
// to be offered (an answer, which the takeover's own probe then finds and reports as usual, or a
// probe that could not run). Its outcome stands only once settled: when the record did not take
// the claim, the takeover probes again. Without a prober (--conflict-probe=off) there is nothing
// to probe.
func (p *prober) probeFirst(ctx context.Context) (free []netip.Addr, ok bool, why string) {
	if p == nil {
		return nil, true, ""
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done.Load() {
		return nil, false, "a takeover probed already"
	}
	if d, ok := ctx.Deadline(); ok && time.Until(d) < p.timing.Total() {
		return nil, false, fmt.Sprintf("the conflict probe takes up to %s, longer than the dead interval", p.timing.Total())
	}
	start := time.Now()
	conflicts, err := probe.Run(ctx, p.iface, p.addrs, p.timing, p.peerAnswer())
	if err != nil {
		return nil, false, "the conflict probe could not run: " + err.Error()
	}
	if conflicts = p.notPeers(conflicts); len(conflicts) > 0 {
		return nil, false, fmt.Sprintf("the conflict probe got %d answers (the takeover probes again)", len(conflicts))
	}
	p.log.Info("conflict probe: nobody answered", "addresses", p.addrs, "took", time.Since(start).Round(time.Millisecond), "before", "the first claim")
	return p.addrs, true, ""
}

// settle makes the outcome of probeFirst stand: the record took the first claim with the
// addresses listed as announced, and the takeover that follows holds them without probing again.
// An outcome that already stands is kept: a takeover at the dead interval, while the grant's
// write was on its way, probed itself (check) and may have been blocked by an answer; clearing
// that reason would leave the holder waiting for a Lease that lists the addresses as announced
// (announcedSince) with nothing to lift. It lifts it, once the grant's Lease shows.
func (p *prober) settle() {
	if p == nil {
		return
	}
	p.mu.Lock()
	if !p.done.Load() {
		p.reason, p.conflicts = "", nil
		p.done.Store(true)
	}
	p.mu.Unlock()
}
