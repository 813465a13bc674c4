package main

import (
	"context"
	"log/slog"
	"net/netip"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
	"github.com/lbsvc/lbsvc-operator/lbpod/ha"
	"github.com/lbsvc/lbsvc-operator/lbpod/probe"
)

// firstClaim is the election's First: the Service's first claim, decided by the API server.
//
// A standby at start listens a whole dead interval (3 adverts, 0.3 s by default) before it claims,
// since an active may exist that it has not heard yet. A Service created a moment ago has none:
// its Lease is absent (the first write creates it) or names no holder. Then every replica, once its
// data path is ready, probes the underlay for its addresses (the conflict probe, which a first
// announcement needs anyway) and writes its claim into the Lease with the resourceVersion it read
// (the Update of a Lease that still names no holder, or its Create where it is absent): the API
// server lets one such write through and refuses the others with a conflict. The winner's election
// takes over at once (ha.Granted), the others stay standbys and hear its adverts. So the API
// server decides who holds a new address, and the Service answers about 0.3 s sooner. The write is
// the one the takeover would make anyway (the claim, with the addresses announced): no write more
// is stored; each other replica's attempt is one refused request.
//
// It is an accelerator, never the path itself: when anything is not as expected (the Lease names
// a holder or cannot be read, another replica was heard, the probe got an answer or could not run,
// the data path is not ready in time, the write failed), it grants nothing and the dead interval
// decides as before, the takeover probing as before. It gives up after one dead interval: by
// then the election takes over by itself. A granted claim nobody takes over with (its replica died
// after the write landed, heard another replica first, or gave up on a write that landed all the
// same) stays in the Lease; it is term 1, and a takeover at the dead interval is term 2 or newer
// (ha.Config.FirstClaims), so it outranks that claim instead of stepping down for it.
type firstClaim struct {
	recorder *leaseRecorder
	prober   *prober // nil: no conflict probe (--conflict-probe=off)
	holder   firstHolder
	// within bounds the whole attempt: the dead interval.
	within time.Duration
	// poll is how often the data path's readiness is looked at while waiting for it.
	poll time.Duration
	log  *slog.Logger

	offered chan ha.Claim
	grants  chan ha.Claim
}

var _ ha.First = (*firstClaim)(nil)

// firstHolder is what firstClaim asks the election's holder (loopHolder): whether the loop stands
// ready, whether the election made this replica active, and whether it heard another replica.
type firstHolder interface {
	Ready() bool
	isActive() bool
	heardPeer() bool
}

func newFirstClaim(recorder *leaseRecorder, p *prober, holder firstHolder, within time.Duration, log *slog.Logger) *firstClaim {
	return &firstClaim{recorder: recorder, prober: p, holder: holder, within: within, poll: 5 * time.Millisecond,
		log: log, offered: make(chan ha.Claim, 1), grants: make(chan ha.Claim, 1)}
}

// Offer implements ha.First.
func (f *firstClaim) Offer(c ha.Claim) {
	select {
	case f.offered <- c:
	default:
	}
}

// Grants implements ha.First.
func (f *firstClaim) Grants() <-chan ha.Claim { return f.grants }

// run waits for the election's offer and tries once.
func (f *firstClaim) run(ctx context.Context) {
	var c ha.Claim
	select {
	case <-ctx.Done():
		return
	case c = <-f.offered:
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, f.within)
	defer cancel()
	why := f.try(ctx, c)
	if why != "" {
		f.log.Info("first claim: not granted; the dead interval decides", "why", why, "after", time.Since(start).Round(time.Millisecond))
		return
	}
	f.log.Info("first claim granted", "claim", c.String(), "after", time.Since(start).Round(time.Millisecond))
	f.grants <- c
}

// try makes the attempt; "" when the record took c, else why not.
func (f *firstClaim) try(ctx context.Context, c ha.Claim) string {
	l, err := f.recorder.cachedLease(ctx)
	switch {
	case err != nil:
		return "the Lease cannot be read: " + err.Error()
	case l != nil && !neverHeld(l):
		return "the Lease has named a holder"
	}
	free, ok, why := f.prober.probeFirst(ctx)
	if !ok {
		return why
	}
	if !f.waitReady(ctx) {
		return "the data path was not ready within the dead interval"
	}
	switch {
	case f.holder.isActive():
		return "the election took over meanwhile"
	case f.holder.heardPeer():
		return "another replica was heard"
	}
	took, err := f.recorder.grant(ctx, l, c, free)
	switch {
	case err != nil:
		return "writing the Lease failed: " + err.Error()
	case !took:
		return "the Lease was written first (another replica's claim, or this one's takeover)"
	}
	f.prober.settle()
	return ""
}

// waitReady waits, a bounded time (ctx), until the loop stands ready as a standby.
func (f *firstClaim) waitReady(ctx context.Context) bool {
	t := time.NewTicker(f.poll)
	defer t.Stop()
	for !f.holder.Ready() {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
	return true
}

// neverHeld says whether l has never named a holder: no holder, no claim, no list of announced
// addresses, no conflict report and no note (as BuildLease makes it).
func neverHeld(l *coordinationv1.Lease) bool {
	if ptr.Deref(l.Spec.HolderIdentity, "") != "" {
		return false
	}
	for _, k := range []string{v1alpha1.HAClaimAnnotation, v1alpha1.AnnouncedAnnotation, v1alpha1.AddressConflictAnnotation, v1alpha1.HeldTwiceAnnotation} {
		if _, ok := l.Annotations[k]; ok {
			return false
		}
	}
	return true
}

// cachedLease is the Lease as the watch lists it (waiting, within ctx, for its first list), nil
// when absent.
func (r *leaseRecorder) cachedLease(ctx context.Context) (*coordinationv1.Lease, error) {
	// Polled every 2 ms, not with cache.WaitForCacheSync, which looks every 100 ms: the first
	// list takes a few ms, and each ms here delays a new Service's first answer. run may not
	// have set up the watch yet (it starts beside the election).
	t := time.NewTicker(2 * time.Millisecond)
	defer t.Stop()
	var store cache.Store
	for {
		r.mu.Lock()
		s, synced := r.store, r.hasSynced
		r.mu.Unlock()
		if synced != nil && synced() {
			store = s
			break
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-t.C:
		}
	}
	obj, found, err := store.GetByKey(r.namespace + "/" + r.name)
	if err != nil || !found {
		return nil, err
	}
	return obj.(*coordinationv1.Lease).DeepCopy(), nil
}

// grant writes c as the Service's first claim into l (the Lease as read, never held; nil: absent,
// then created), with the addresses free announced (nil: no probe ran): the write a takeover
// makes, made before it. The resourceVersion read (or the Create) lets one replica's write
// through; it reports whether this one's was.
func (r *leaseRecorder) grant(ctx context.Context, l *coordinationv1.Lease, c ha.Claim, free []netip.Addr) (bool, error) {
	absent := l == nil
	if absent {
		var err error
		if l, err = r.newLease(ctx); err != nil {
			return false, err
		}
	}
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	// With the probe, the addresses nobody answered for; without it, none yet (as a takeover's
	// write says for a Lease that named no claim).
	l.Annotations[v1alpha1.AnnouncedAnnotation] = ""
	if free != nil {
		l.Annotations[v1alpha1.AnnouncedAnnotation] = probe.Announced(l.Annotations, free)
	}
	r.stamp(l, c, 0)
	err := r.put(ctx, l, absent)
	if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	r.log.Info("recorded the Service's first claim", "holder", r.identity, "claim", c.String(), "created", absent,
		"announced", l.Annotations[v1alpha1.AnnouncedAnnotation])
	return true, nil
}
