package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
	"github.com/lbsvc/lbsvc-operator/controllers/lbobjects"
	"github.com/lbsvc/lbsvc-operator/lbpod/ha"
	"github.com/lbsvc/lbsvc-operator/lbpod/probe"
)

// leaseRecorder is the election's Record (ha.Record): the Service's Lease. At each takeover the new
// active writes its pod name (holderIdentity, leaseTransitions, acquireTime) and its claim (the
// annotation lbsvc.io/ha-claim: term, priority, net1 MAC), which the operator mirrors into the
// Service's annotations and condition, an Event and the IP object.
//
// It is a record and a fence, not a lock: the election on the underlay decides (but for a new
// Service's first holder, which the Lease picks: firstClaim), the Lease is never renewed (an idle
// Service costs no API write), and a takeover at the dead interval never waits for it. But when the
// underlay loses adverts (a switch that drops their EtherType, a one-way link), two replicas that
// cannot hear each other both hold the address, and the Lease is the one place both can read:
//   - a replica writes only a claim newer than the recorded one by the election's order (term,
//     priority, ID), with optimistic concurrency (Update carries the resourceVersion read; on a
//     conflict it reads again and compares again), so two actives never write back over each
//     other, and the Lease changes once per claim;
//   - every recorded claim goes to the election (Claims), and an active whose claim is older
//     lets go (ha.Superseded), so at most one replica holds once the newer claim is recorded;
//   - a replica that let go that way writes a note (lbsvc.io/held-twice: both pods, its term,
//     the time), from which the operator raises the AddressHeldTwice Warning Event.
//
// When the Lease is absent the recorder creates it (the same name, labels and owner as the
// operator builds), as one of those writes.
type leaseRecorder struct {
	client                             apiClient
	namespace, service, name, identity string
	log                                *slog.Logger
	kick                               chan struct{}
	claims                             chan ha.Claim
	// shared, for the lb pods of a shared address, is what its Lease is built from (no one
	// Service owns it): the IP object and its owner's UID.
	shared *sharedLease
	// retryMax bounds the backoff between failed writes.
	retryMax time.Duration
	now      func() time.Time

	mu sync.Mutex
	// want is our claim while we hold the addresses, the zero Claim otherwise.
	want ha.Claim
	// note is a held-twice note to write, nil for none (a newer one replaces an unwritten one).
	note *heldTwice
	// told is the last recorded claim handed to the election.
	told ha.Claim

	// addrs are this lb pod's addresses (for a Lease of a release without the probe).
	addrs []netip.Addr
	// probing holds writes back while the conflict probe runs, so that its outcome goes with the
	// takeover's claim in one write; announce and conflicts are that outcome, until written.
	probing   bool
	announce  []netip.Addr
	conflicts []v1alpha1.AddressConflict
	// store and hasSynced are the watch's (set by run): the Lease as last seen, once listed.
	store     cache.Store
	hasSynced func() bool
}

// sharedLease is what the Lease of a shared address is built from (lbobjects.BuildSharedLease).
type sharedLease struct {
	ownerUID       types.UID
	ownerNamespace string
	ip             lbobjects.IPRef
}

// heldTwice is one step-down on the Lease's claim: our claim then, the claim that superseded it,
// and when.
type heldTwice struct {
	held, by ha.Claim
	at       time.Time
}

func newLeaseRecorder(client apiClient, namespace, service, name, identity string, log *slog.Logger) *leaseRecorder {
	return &leaseRecorder{client: client, namespace: namespace, service: service, name: name, identity: identity,
		log: log.With("lease", namespace+"/"+name), kick: make(chan struct{}, 1), claims: make(chan ha.Claim, 1),
		retryMax: 10 * time.Second, now: time.Now}
}

var _ ha.Record = (*leaseRecorder)(nil)

// Claims implements ha.Record.
func (r *leaseRecorder) Claims() <-chan ha.Claim { return r.claims }

// Claimed implements ha.Record: a takeover asks for a write.
func (r *leaseRecorder) Claimed(c ha.Claim) {
	r.mu.Lock()
	r.want = c
	r.mu.Unlock()
	if c != (ha.Claim{}) {
		r.wake()
	}
}

// Superseded implements ha.Record: the note is written once.
func (r *leaseRecorder) Superseded(held, by ha.Claim) {
	r.mu.Lock()
	r.note = &heldTwice{held: held, by: by, at: r.now()}
	r.mu.Unlock()
	r.wake()
}

func (r *leaseRecorder) wake() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// tell hands a recorded claim to the election, the newest only: the machine ignores older claims
// and our own, so one that was not read yet may be replaced, but only by a newer one. Two callers
// (the watch, and a sync that read the Lease before it) could otherwise cross, the older claim
// replace the newer one not yet read, and the election never learn of the newer: the fence lost.
// The swap is made under mu, so that tellers do not interleave.
func (r *leaseRecorder) tell(c ha.Claim) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.told != (ha.Claim{}) && c.Compare(r.told) <= 0 {
		return
	}
	r.told = c
	for {
		select {
		case r.claims <- c:
			return
		default:
		}
		select {
		case <-r.claims:
		default:
		}
	}
}

// run writes what is asked (a claim, a note), retrying with backoff while it is still wanted. A
// conflict or a Lease created meanwhile is retried at once: another write landed, and the
// comparison is made again against it.
func (r *leaseRecorder) run(ctx context.Context) {
	go r.watch().RunWithContext(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.kick:
		}
		backoff := 200 * time.Millisecond
		for {
			err := r.sync(ctx)
			if err == nil || ctx.Err() != nil {
				break
			}
			if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) {
				continue
			}
			r.log.Warn("writing the Lease failed; retrying", "err", err, "in", backoff)
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, r.retryMax)
		}
	}
}

// watch follows the Lease, by name (a field selector: no other Lease of the namespace is sent to
// this pod, though its ClusterRole would allow watching them): every claim recorded goes to
// the election, and a record older than our claim while we hold (a Lease recreated empty), or
// the Lease deleted while we hold, asks for a write. Its store is what annotations reads.
func (r *leaseRecorder) watch() cache.Controller {
	leases := r.client.Leases(r.namespace)
	lw := oneByName(r.name, func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
		return leases.List(ctx, o)
	}, leases.Watch)
	seen := func(obj any) {
		l, ok := obj.(*coordinationv1.Lease)
		if !ok {
			return
		}
		recorded := r.recorded(l)
		if recorded != (ha.Claim{}) {
			r.tell(recorded)
		}
		r.mu.Lock()
		behind := r.want != (ha.Claim{}) && r.want.Compare(recorded) > 0
		r.mu.Unlock()
		if behind {
			r.wake()
		}
	}
	store, ctrl := cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: lw,
		ObjectType:    &coordinationv1.Lease{},
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    seen,
			UpdateFunc: func(_, obj any) { seen(obj) },
			// Deleted while we hold (the garbage collector removing a Lease an earlier owner of
			// the name left, which we found and wrote to before it went): create it again now,
			// not at the next takeover, or nobody would know who holds the address till then.
			DeleteFunc: func(any) {
				r.mu.Lock()
				holding := r.want != (ha.Claim{})
				r.mu.Unlock()
				if holding {
					r.wake()
				}
			},
		},
	})
	r.mu.Lock()
	r.store, r.hasSynced = store, ctrl.HasSynced
	r.mu.Unlock()
	return ctrl
}

// recorded is the claim the Lease names; the zero Claim when it names none or one that no replica
// makes (edited by hand, or written by an lb pod older than the claim annotation: any claim is
// newer than it).
func (r *leaseRecorder) recorded(l *coordinationv1.Lease) ha.Claim {
	s, ok := l.Annotations[v1alpha1.HAClaimAnnotation]
	if !ok {
		return ha.Claim{}
	}
	c, err := ha.ParseClaim(s)
	if err != nil {
		r.log.Warn("the Lease's claim is not one an lb pod writes; taken as none", "err", err)
		return ha.Claim{}
	}
	return c
}

// sync makes one attempt at what is asked: it reads the Lease (creating it when absent), hands
// its claim to the election, and writes our claim when it is newer than the recorded one, and the
// note when there is one, in one Update with the resourceVersion read.
func (r *leaseRecorder) sync(ctx context.Context) error {
	r.mu.Lock()
	want, note := r.want, r.note
	probing, announce, conflicts := r.probing, r.announce, r.conflicts
	r.mu.Unlock()
	if probing || (want == (ha.Claim{}) && note == nil && announce == nil && conflicts == nil) {
		return nil // while the probe runs, its outcome is awaited: one write for both
	}
	leases := r.client.Leases(r.namespace)
	l, err := leases.Get(ctx, r.name, metav1.GetOptions{})
	absent := apierrors.IsNotFound(err)
	switch {
	case absent:
		if l, err = r.newLease(ctx); err != nil {
			return err
		}
	case err != nil:
		return err
	}
	recorded := r.recorded(l)
	if recorded != (ha.Claim{}) {
		r.tell(recorded)
	}
	prev := ptr.Deref(l.Spec.HolderIdentity, "")
	claimed := want != (ha.Claim{}) && want.Compare(recorded) > 0
	if !claimed && note == nil && announce == nil && conflicts == nil {
		return nil // the Lease names a claim as new as ours or newer: never written over
	}
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	if _, listed := l.Annotations[v1alpha1.AnnouncedAnnotation]; !listed && (claimed || announce != nil || conflicts != nil) {
		// The operator reads a claim without the list as a release before the probe, whose
		// addresses were all held: say so explicitly, or say that nothing was announced yet.
		if recorded != (ha.Claim{}) {
			l.Annotations[v1alpha1.AnnouncedAnnotation] = v1alpha1.FormatAnnounced(r.addrs)
		} else {
			l.Annotations[v1alpha1.AnnouncedAnnotation] = ""
		}
	}
	if announce != nil {
		l.Annotations[v1alpha1.AnnouncedAnnotation] = probe.Announced(l.Annotations, announce)
	}
	if conflicts != nil {
		l.Annotations[v1alpha1.AddressConflictAnnotation] = v1alpha1.FormatAddressConflicts(conflicts)
	}
	transitions := ptr.Deref(l.Spec.LeaseTransitions, 0)
	if claimed {
		if prev != "" && prev != r.identity {
			transitions++
		}
		r.stamp(l, want, transitions)
	}
	if note != nil {
		other := note.by.Sender.String() // the pod is named when the Lease still records that claim
		if recorded == note.by && prev != "" {
			other = prev
		}
		l.Annotations[v1alpha1.HeldTwiceAnnotation] = fmt.Sprintf("%s %s %d %s %d",
			r.identity, note.at.UTC().Format(time.RFC3339), note.held.Term, other, note.by.Term)
	}
	if err := r.put(ctx, l, absent); err != nil {
		return err
	}
	r.mu.Lock()
	if r.note == note {
		r.note = nil
	}
	if announce != nil && slices.Equal(r.announce, announce) {
		r.announce = nil
	}
	if conflicts != nil && len(r.conflicts) == len(conflicts) {
		r.conflicts = nil
	}
	r.mu.Unlock()
	if claimed {
		r.log.Info("recorded the takeover", "holder", r.identity, "claim", want.String(), "previous", prev, "previousClaim", recorded.String(),
			"transitions", transitions, "created", absent)
	}
	if note != nil {
		r.log.Warn("recorded that two replicas held the addresses", "note", l.Annotations[v1alpha1.HeldTwiceAnnotation])
	}
	return nil
}

// stamp makes l name this pod as the holder of claim c, with transitions.
func (r *leaseRecorder) stamp(l *coordinationv1.Lease, c ha.Claim, transitions int32) {
	l.Spec.HolderIdentity, l.Spec.LeaseTransitions = ptr.To(r.identity), ptr.To(transitions)
	l.Spec.AcquireTime = &metav1.MicroTime{Time: r.now()}
	l.Annotations[v1alpha1.HAClaimAnnotation] = c.String()
}

// put writes l: created when it was absent, else updated with the resourceVersion it was read at.
func (r *leaseRecorder) put(ctx context.Context, l *coordinationv1.Lease, absent bool) error {
	leases := r.client.Leases(r.namespace)
	var err error
	if absent {
		_, err = leases.Create(ctx, l, metav1.CreateOptions{})
	} else {
		_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
	}
	return err
}

// newLease is the Lease as the operator builds it (name, labels, owner: the Service, whose UID
// it reads), not yet created.
func (r *leaseRecorder) newLease(ctx context.Context) (*coordinationv1.Lease, error) {
	if r.shared != nil {
		if r.shared.ip.UID == "" || r.shared.ownerUID == "" {
			return nil, fmt.Errorf("the Lease %s/%s is absent, and %s or %s is not set to create it with", r.namespace, r.name, v1alpha1.EnvSharedIPUID, v1alpha1.EnvOwnerUID)
		}
		return lbobjects.BuildSharedLease(r.name, r.namespace, r.shared.ownerNamespace, r.shared.ownerUID, r.shared.ip), nil
	}
	svc, err := r.client.Services(r.namespace).Get(ctx, r.service, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("the Lease is absent; reading Service %s/%s to create it: %w", r.namespace, r.service, err)
	}
	// Named as given (LBPOD_LEASE): the name also depends on --lb-pod-namespace.
	return lbobjects.BuildLease(r.name, svc), nil
}

// annotations implements leaseState: the Lease as the watch has it once synced (no round trip at
// a takeover), else as the API server says.
func (r *leaseRecorder) annotations(ctx context.Context) (map[string]string, bool, error) {
	r.mu.Lock()
	watching := r.hasSynced != nil
	r.mu.Unlock()
	// Bounded, the whole of it: a takeover's probe waits for this read while this replica is the
	// elected active holding nothing (its adverts keep the standbys from claiming), and an API
	// server that does not answer would hold it for its own timeout (about a minute). Past the
	// bound the read fails and the probe covers every address.
	read, cancel := context.WithTimeout(ctx, leaseReadTimeout)
	defer cancel()
	if watching {
		// The watch's first list comes within a moment of start; a takeover that comes first
		// (at creation) waits for it; without it the API server is asked, within what is left.
		if l, err := r.cachedLease(read); err == nil {
			if l == nil {
				return nil, false, nil
			}
			return l.Annotations, true, nil
		}
	}
	l, err := r.client.Leases(r.namespace).Get(read, r.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	return l.Annotations, true, nil
}

// leaseReadTimeout bounds a read of the Lease that a takeover waits for (annotations): the wait
// for the watch's first list and the read from the API server together.
const leaseReadTimeout = 2 * time.Second

// startProbe implements leaseState: writes wait for the probe's outcome.
func (r *leaseRecorder) startProbe() {
	r.mu.Lock()
	r.probing = true
	r.mu.Unlock()
}

// probed implements leaseState. With the recorder running (standbys) the outcome goes with the
// claim's write; a single lb pod writes it here, retrying a few times on a conflict. A write that
// fails otherwise (the API server unreachable, a timeout) is retried in the background until it
// lands: the address is announced all the same, and until the Lease lists it as announced the
// operator believes a conflict report for it, so that a later probe (a replacement pod's, after a
// drain) that one host on the underlay answers would move a Service off an address it has held.
func (r *leaseRecorder) probed(ctx context.Context, free []netip.Addr, conflicts []v1alpha1.AddressConflict) error {
	r.mu.Lock()
	r.probing = false
	if free != nil {
		r.announce = slices.Clone(free)
	}
	if conflicts != nil {
		r.conflicts = slices.Clone(conflicts)
	}
	running := r.hasSynced != nil
	r.mu.Unlock()
	if running {
		r.wake()
		return nil
	}
	// The single lb pod puts its addresses on net1 only after this returns (holdSingle): a write
	// the API server does not answer (a stalled etcd) must not hold them off longer than the
	// read before the probe may (leaseReadTimeout); the background goes on trying.
	err := r.syncBounded(ctx)
	if err == nil || ctx.Err() != nil {
		return err
	}
	go func() {
		for wait := 100 * time.Millisecond; ; wait = min(2*wait, r.retryMax) {
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
			if err := r.syncBounded(ctx); err == nil {
				r.log.Info("the conflict probe's outcome is recorded on the Lease, after failed writes")
				return
			}
		}
	}()
	return err
}

// syncBounded is syncRetrying within leaseReadTimeout.
func (r *leaseRecorder) syncBounded(ctx context.Context) error {
	bounded, cancel := context.WithTimeout(ctx, leaseReadTimeout)
	defer cancel()
	return r.syncRetrying(bounded)
}

// syncRetrying is sync, tried again at once (up to five times) when another write came first.
func (r *leaseRecorder) syncRetrying(ctx context.Context) error {
	var err error
	for try := 0; try < 5; try++ {
		if err = r.sync(ctx); err == nil || !(apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err)) {
			return err
		}
	}
	return err
}
