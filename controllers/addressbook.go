package controllers

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"sort"
	"sync"

	"github.com/lbsvc/lbsvc-operator/controllers/decide"
	"github.com/lbsvc/lbsvc-operator/controllers/lbobjects"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/resourceversion"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
	"github.com/lbsvc/lbsvc-operator/controllers/ipam"
)

// AddressBook mirrors the IP objects in memory so that the Service reconciler can pick a free
// address without listing, and claims addresses by creating IP objects: the API server decides
// between two claimants (AlreadyExists means taken), so neither a stale cache nor a second
// operator process can hand one address out twice.
//
// It is a manager Runnable: Start rebuilds the mirror from the IP objects read through the API
// reader (not the cache, which may not yet hold a previous leader's last writes), adopts the
// allocations an earlier release recorded only as annotations, then opens the gate. It runs after
// leader election.
type AddressBook struct {
	alloc  *ipam.Allocator
	cache  cache.Cache
	reader client.Reader
	writer client.Client

	ready     chan struct{}
	readyOnce sync.Once

	mu         sync.Mutex
	subnets    map[string]ipam.SubnetConfig // configuration last given to the allocator
	ips        map[string]ipRecord          // IP object name → what it says
	byOwner    map[string]map[string]bool   // owner Service UID → its IP object names (OwnedBy runs on every Service event)
	rebuilding bool
	tombstones map[string]bool // IP objects deleted while the rebuild's list was in flight
	waiting    map[types.NamespacedName]bool
	// releases counts what may let a waiting Service in (an address freed, a Subnet changed). A
	// claim reads it before it looks and registers its refusal against what it read (waitAfter):
	// a release between the look and the registration wakes the Service instead of being lost.
	releases uint64

	// shareLocks serialize the claims of one sharing key (lockShare).
	shareLocks keyedLocks

	// DefaultProvider is --default-attachment-provider: adopt takes only Services we serve.
	DefaultProvider string

	// Wake carries Services to reconcile again (a channel source of the Service controller).
	Wake chan event.GenericEvent
	// stopped closes when Start returns, so that pending wakes give up instead of leaking.
	stopped chan struct{}
}

// ipRecord is one IP object as mirrored.
type ipRecord struct {
	uid      types.UID
	addr     netip.Addr
	subnet   string
	owner    lbv1.IPOwner
	draining bool
	// conflict is the probe's finding of an IP object in phase Conflict.
	conflict *lbv1.IPConflictStatus
	// sharingKey and members, of a shared address (spec.sharingKey, spec.members).
	sharingKey string
	members    []lbv1.IPMember
	// rv is the resourceVersion observed.
	rv string
}

// holderUIDs are the Services the record is owned by: the members of a shared address, else
// its owner.
func (r ipRecord) holderUIDs() []string {
	if r.sharingKey == "" {
		return []string{r.owner.UID}
	}
	out := make([]string, len(r.members))
	for i, m := range r.members {
		out[i] = m.UID
	}
	return out
}

// maxClaimTries bounds one claim's attempts when other claimants keep winning the addresses it
// picks (each loss teaches the mirror one more taken address).
const maxClaimTries = 32

// NewAddressBook returns a closed-gate AddressBook.
func NewAddressBook(c cache.Cache, reader client.Reader, writer client.Client) *AddressBook {
	return &AddressBook{
		alloc:   ipam.New(),
		cache:   c,
		reader:  reader,
		writer:  writer,
		ready:   make(chan struct{}),
		subnets: map[string]ipam.SubnetConfig{},
		ips:     map[string]ipRecord{},
		byOwner: map[string]map[string]bool{},
		waiting: map[types.NamespacedName]bool{},
		Wake:    make(chan event.GenericEvent, 1024),
		stopped: make(chan struct{}),
	}
}

// Start implements manager.Runnable.
func (b *AddressBook) Start(ctx context.Context) error {
	defer close(b.stopped)
	log := logf.FromContext(ctx).WithName("addressbook")
	inf, err := b.cache.GetInformer(ctx, &lbv1.IP{})
	if err != nil {
		return fmt.Errorf("address book: IP informer: %w", err)
	}
	b.mu.Lock()
	b.rebuilding, b.tombstones = true, map[string]bool{}
	b.mu.Unlock()
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { b.onIP(o, false) },
		UpdateFunc: func(_, o any) { b.onIP(o, false) },
		DeleteFunc: func(o any) { b.onIP(o, true) },
	}); err != nil {
		return fmt.Errorf("address book: IP event handler: %w", err)
	}
	if !b.cache.WaitForCacheSync(ctx) {
		return errors.New("address book: cache did not sync")
	}
	var subnets lbv1.SubnetList
	if err := b.reader.List(ctx, &subnets); err != nil {
		return fmt.Errorf("address book: list subnets: %w", err)
	}
	var ips lbv1.IPList
	if err := b.reader.List(ctx, &ips); err != nil {
		return fmt.Errorf("address book: list IP objects: %w", err)
	}
	b.mu.Lock()
	for i := range subnets.Items {
		if cfg, err := decide.ParseSubnetSpec(&subnets.Items[i]); err == nil {
			b.alloc.SetSubnet(cfg)
			b.subnets[cfg.Name] = cfg
		}
	}
	for i := range ips.Items {
		if !b.tombstones[ips.Items[i].Name] {
			b.observeLocked(&ips.Items[i])
		}
	}
	b.rebuilding, b.tombstones = false, nil
	b.mu.Unlock()
	adopted, err := b.adopt(ctx)
	if err != nil {
		return err
	}
	log.Info("address mirror rebuilt from IP objects", "subnets", len(subnets.Items), "ips", len(ips.Items), "adopted", adopted)
	b.readyOnce.Do(func() { close(b.ready) })
	<-ctx.Done()
	return nil
}

// adopt turns the allocations of a release without IP objects into IP objects, for the Services
// decide.Adoptable allows (ours, with the annotation equal to the ingress and a Subnet that holds
// the addresses). Oldest Service first; the API server settles any collision. A create the API
// server refuses as invalid is logged and skipped: one Service's annotations must not stop the
// operator from starting.
func (b *AddressBook) adopt(ctx context.Context) (int, error) {
	var services corev1.ServiceList
	if err := b.reader.List(ctx, &services); err != nil {
		return 0, fmt.Errorf("address book: list services: %w", err)
	}
	sort.SliceStable(services.Items, func(i, j int) bool {
		a, c := &services.Items[i], &services.Items[j]
		if !a.CreationTimestamp.Equal(&c.CreationTimestamp) {
			return a.CreationTimestamp.Before(&c.CreationTimestamp)
		}
		return a.Namespace+"/"+a.Name < c.Namespace+"/"+c.Name
	})
	b.mu.Lock()
	subnets := maps.Clone(b.subnets)
	b.mu.Unlock()
	n := 0
	for i := range services.Items {
		svc := &services.Items[i]
		if len(b.OwnedBy(svc.UID)) > 0 {
			continue
		}
		subnet := svc.Annotations[lbv1.AllocatedSubnetAnnotation]
		for _, a := range decide.Adoptable(svc, b.DefaultProvider, subnets) {
			ip := newIP(a, subnet, decide.IPOwnerOf(svc))
			if err := b.writer.Create(ctx, ip, client.FieldOwner(FieldOwner)); err != nil {
				if apierrors.IsAlreadyExists(err) {
					continue
				}
				if apierrors.IsInvalid(err) {
					logf.FromContext(ctx).Info("address book: not adopted", "address", a, "service", svc.Namespace+"/"+svc.Name, "err", decide.BoundedMessage(err.Error()))
					continue
				}
				return n, fmt.Errorf("address book: adopt %s for service %s/%s: %w", a, svc.Namespace, svc.Name, err)
			}
			b.Observe(ip)
			n++
		}
	}
	return n, nil
}

// newIP is the IP object that claims addr for owner; with share, a shared address whose first
// member is owner.
func newIP(addr netip.Addr, subnet string, owner lbv1.IPOwner, share ...decide.SharingMember) *lbv1.IP {
	ip := &lbv1.IP{
		ObjectMeta: metav1.ObjectMeta{
			Name:       lbv1.IPName(addr),
			Finalizers: []string{lbv1.DrainFinalizer},
			Labels:     map[string]string{lbobjects.ManagedByLabel: lbobjects.ManagedByValue},
		},
		Spec: lbv1.IPSpec{Address: addr.String(), Subnet: subnet, Service: owner},
	}
	for _, m := range share {
		ip.Spec.SharingKey = m.Key
		ip.Spec.Members, _ = decide.WithMember(ip.Spec.Members, decide.MemberRecord(m))
	}
	return ip
}

// shareKey is the allocator's key of the addresses shared under a sharing key: a static request
// of a Service of that key sees them as free and goes on to join (SharingClash decides).
func shareKey(key string) string { return "share/" + key }

// ownerKey is the allocator's key of an owner: the UID makes a Service deleted and created again
// a different owner.
func ownerKey(o lbv1.IPOwner) string { return o.Namespace + "/" + o.Name + "/" + o.UID }

func (b *AddressBook) onIP(o any, deleted bool) {
	if t, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
		o = t.Obj
	}
	ip, ok := o.(*lbv1.IP)
	if !ok {
		return
	}
	if deleted {
		b.forget(ip.Name, ip.UID)
		return
	}
	b.Observe(ip)
}

// Observe records what an IP object says.
func (b *AddressBook) Observe(ip *lbv1.IP) {
	b.mu.Lock()
	before, known := b.ips[ip.Name]
	b.observeLocked(ip)
	after := b.ips[ip.Name]
	b.mu.Unlock()
	conflict := known && before.conflict == nil && after.conflict != nil
	if conflict && after.sharingKey == "" {
		// Its owner must now move or be refused: wake it once the mirror says so (the IP watch
		// of the Service controller may run before this handler, and drops our own writes).
		b.wake(types.NamespacedName{Namespace: ip.Spec.Service.Namespace, Name: ip.Spec.Service.Name})
	}
	if conflict || known && !slices.EqualFunc(before.members, after.members, func(x, y lbv1.IPMember) bool { return x.UID == y.UID && x.Namespace == y.Namespace }) {
		// A shared address in use on the underlay, or a member joined or left: every member
		// moves, or its lb objects follow (the namespaces bound and watched).
		for _, m := range after.members {
			b.wake(types.NamespacedName{Namespace: m.Namespace, Name: m.Name})
		}
	}
}

func (b *AddressBook) observeLocked(ip *lbv1.IP) {
	addr, err := netip.ParseAddr(ip.Spec.Address)
	if err != nil {
		return
	}
	if old, ok := b.ips[ip.Name]; ok {
		// Passes observe what they read or wrote, the informer what it delivers: an older
		// version seen after a newer one must not undo it (the members of a shared address
		// change), or the mirror would keep a member that left until the next event. Nor an
		// earlier object of the name: a Service that starts or stops sharing its address drains
		// it and claims it again, and the informer's last update of the drained object (its
		// finalizer removed) came after the pass had observed the new one it created, which it
		// replaced until the new one's own event: a pass in between found the address held by
		// no claim of its own, claimed it, and was refused AddressInUse by itself. Objects of one
		// name never coexist, so the later resourceVersion is the later object's whatever the UID.
		if old.rv != "" {
			if c, err := resourceversion.CompareResourceVersion(ip.ResourceVersion, old.rv); err == nil && c < 0 {
				return
			}
		}
		b.unindexLocked(ip.Name, old)
	}
	rec := ipRecord{uid: ip.UID, addr: addr, subnet: ip.Spec.Subnet, owner: ip.Spec.Service,
		draining: !ip.DeletionTimestamp.IsZero(), sharingKey: ip.Spec.SharingKey, members: ip.Spec.Members, rv: ip.ResourceVersion}
	key := ownerKey(ip.Spec.Service)
	if rec.sharingKey != "" {
		key = shareKey(rec.sharingKey)
	}
	if ip.Status.Phase == lbv1.IPConflict && ip.Status.Conflict != nil {
		// In use on the underlay: held under a key of its own, so that not even its own Service
		// picks it again (an address a key holds counts as free for that key).
		c := *ip.Status.Conflict
		rec.conflict, key = &c, conflictKey(ip.Name)
	}
	b.ips[ip.Name] = rec
	for _, uid := range rec.holderUIDs() {
		names := b.byOwner[uid]
		if names == nil {
			names = map[string]bool{}
			b.byOwner[uid] = names
		}
		names[ip.Name] = true
	}
	b.alloc.HoldAddr(ip.Spec.Subnet, addr, key)
}

// conflictKey is the allocator key of an address in phase Conflict: nobody's.
func conflictKey(ipName string) string { return "conflict/" + ipName }

// forget drops a deleted IP object and wakes the Services waiting for an address.
func (b *AddressBook) forget(name string, uid types.UID) {
	b.mu.Lock()
	if b.rebuilding {
		b.tombstones[name] = true
	}
	rec, ok := b.ips[name]
	if ok && (uid == "" || rec.uid == "" || rec.uid == uid) {
		delete(b.ips, name)
		b.unindexLocked(name, rec)
		b.alloc.FreeAddr(rec.addr)
		b.releases++
	}
	b.mu.Unlock()
	if ok {
		b.WakeWaiting()
	}
}

func (b *AddressBook) unindexLocked(name string, rec ipRecord) {
	for _, uid := range rec.holderUIDs() {
		if names := b.byOwner[uid]; names != nil {
			delete(names, name)
			if len(names) == 0 {
				delete(b.byOwner, uid)
			}
		}
	}
}

// WaitReady blocks until the mirror has been rebuilt (or ctx ends).
func (b *AddressBook) WaitReady(ctx context.Context) error {
	select {
	case <-b.ready:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for the address mirror rebuild: %w", ctx.Err())
	}
}

// OwnedBy lists the IP objects owned by a Service UID, sorted by address.
func (b *AddressBook) OwnedBy(uid types.UID) []decide.OwnedIP {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []decide.OwnedIP
	for name := range b.byOwner[string(uid)] {
		r := b.ips[name]
		o := decide.OwnedIP{Name: name, UID: r.uid, Addr: r.addr, Subnet: r.subnet, Draining: r.draining, Conflict: r.conflict}
		if r.sharingKey != "" {
			o.SharingKey, o.Members, o.Member, o.Owner = r.sharingKey, r.members, string(uid), r.owner
		}
		out = append(out, o)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Addr.Less(out[j].Addr) })
	return out
}

// EnsureSubnet gives the allocator cfg when it differs from what it has, and wakes the waiting
// Services (a larger range or fewer exclusions may let them in).
func (b *AddressBook) EnsureSubnet(cfg ipam.SubnetConfig) {
	b.mu.Lock()
	if old, ok := b.subnets[cfg.Name]; ok && reflect.DeepEqual(old, cfg) {
		b.mu.Unlock()
		return
	}
	b.alloc.SetSubnet(cfg)
	b.subnets[cfg.Name] = cfg
	b.releases++
	b.mu.Unlock()
	b.WakeWaiting()
}

// Claim creates the IP object of one address for owner: c.Static when set, else the lowest
// address of c.Family the mirror shows free. A refusal (address in use, draining, excluded,
// exhausted, ...) is returned as such; an API failure as an error.
func (b *AddressBook) Claim(ctx context.Context, subnet string, c decide.Claim, owner lbv1.IPOwner) (netip.Addr, *decide.Refusal, error) {
	key := ownerKey(owner)
	if c.Share != nil {
		// One claim of a key at a time: two first members created together would each see no
		// address of the key yet and claim one each.
		unlock := b.lockShare(c.Share.Key)
		defer unlock()
		if !c.Static.IsValid() {
			// The lowest address of the key it may join, before a new one.
			if addr, ok, err := b.joinAny(ctx, subnet, c); err != nil || ok {
				return addr, nil, err
			}
		} else {
			// The requested address held by the key counts as free: its create meets the IP
			// object, and the join decides (SharingClash).
			key = shareKey(c.Share.Key)
		}
	}
	svc := types.NamespacedName{Namespace: owner.Namespace, Name: owner.Name}
	for try := 0; try < maxClaimTries; try++ {
		seen := b.releaseCount()
		addr, err := b.alloc.Pick(subnet, c.Family, c.Static, key)
		if err != nil {
			ref := decide.AllocationRefusal(err)
			if errors.Is(err, ipam.ErrInUse) {
				ref = b.inUse(c.From, c.Static)
			}
			b.waitAfter(svc, seen)
			return netip.Addr{}, ref, nil
		}
		ip := newIP(addr, subnet, owner)
		if c.Share != nil {
			ip = newIP(addr, subnet, owner, *c.Share)
		}
		// Hold it in the mirror while the claim is in flight, so that parallel reconciles pick
		// other addresses instead of racing for this one.
		tentative := b.holdTentative(subnet, addr, key)
		err = b.writer.Create(ctx, ip, client.FieldOwner(FieldOwner))
		if err == nil {
			b.Observe(ip)
			return addr, nil, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			if tentative {
				b.alloc.FreeAddr(addr)
			}
			return netip.Addr{}, nil, fmt.Errorf("claim %s: create IP %s: %w", addr, ip.Name, err)
		}
		cur := &lbv1.IP{}
		if err := b.reader.Get(ctx, client.ObjectKey{Name: ip.Name}, cur); err != nil {
			if apierrors.IsNotFound(err) {
				continue // released in between: try again
			}
			return netip.Addr{}, nil, fmt.Errorf("claim %s: get IP %s: %w", addr, ip.Name, err)
		}
		b.Observe(cur)
		if c.Share != nil && cur.Spec.SharingKey != "" {
			joined, ref, err := b.Join(ctx, cur.Name, c)
			switch {
			case err != nil:
				return netip.Addr{}, nil, err
			case joined:
				return addr, nil, nil
			case ref != nil && c.Static.IsValid():
				b.waitAfter(svc, seen)
				return netip.Addr{}, ref, nil
			}
			continue // gone meanwhile, or (a dynamic claim) not for us: the mirror knows it now
		}
		if cur.Spec.Service.UID == owner.UID && cur.Spec.SharingKey == "" && c.Share == nil &&
			cur.DeletionTimestamp.IsZero() && cur.Status.Phase != lbv1.IPConflict {
			return addr, nil, nil
		}
		if c.Static.IsValid() {
			b.waitAfter(svc, seen)
			if cur.Status.Phase == lbv1.IPConflict && cur.Status.Conflict != nil {
				return netip.Addr{}, decide.InUseOnUnderlay(c.From, addr, *cur.Status.Conflict), nil
			}
			return netip.Addr{}, decide.InUse(c.From, addr, !cur.DeletionTimestamp.IsZero()), nil
		}
	}
	return netip.Addr{}, nil, fmt.Errorf("claim in subnet %q: lost %d races for a free address", subnet, maxClaimTries)
}

// holdTentative holds addr for key in the mirror unless something holds it already; it reports
// whether it did (the caller frees it if the claim fails for another reason than a holder).
func (b *AddressBook) holdTentative(subnet string, addr netip.Addr, key string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, held := b.alloc.Holder(addr); held {
		return false
	}
	b.alloc.HoldAddr(subnet, addr, key)
	return true
}

// inUse is the refusal of a static address someone else holds: draining, in use on the
// underlay (phase Conflict), or another Service's.
func (b *AddressBook) inUse(from string, addr netip.Addr) *decide.Refusal {
	b.mu.Lock()
	rec := b.ips[lbv1.IPName(addr)]
	b.mu.Unlock()
	if rec.conflict != nil {
		return decide.InUseOnUnderlay(from, addr, *rec.conflict)
	}
	return decide.InUse(from, addr, rec.draining)
}

// Drain deletes an IP object (its finalizer keeps it, Draining, until no lb pod can hold the
// address). The UID precondition makes sure a stale mirror never deletes another owner's claim.
func (b *AddressBook) Drain(ctx context.Context, o decide.OwnedIP) error {
	if o.SharingKey != "" {
		return b.leave(ctx, o)
	}
	b.mu.Lock()
	rec, ok := b.ips[o.Name]
	b.mu.Unlock()
	if !ok || rec.draining {
		return nil
	}
	ip := &lbv1.IP{ObjectMeta: metav1.ObjectMeta{Name: o.Name}}
	err := b.writer.Delete(ctx, ip, client.Preconditions{UID: &rec.uid})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("drain %s: %w", o.Addr, err)
	}
	b.markDraining(o.Name, rec.uid)
	return nil
}

// markDraining records in the mirror that the IP object name of uid was deleted.
func (b *AddressBook) markDraining(name string, uid types.UID) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if r, ok := b.ips[name]; ok && r.uid == uid {
		r.draining = true
		b.ips[name] = r
	}
}

// releaseCount is the number of releases so far (see releases).
func (b *AddressBook) releaseCount() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.releases
}

// waitAfter marks a Service refused an address as waiting, and wakes it at once when something
// was released since seen (what the refused look read): that release's wake went out before the
// Service was waiting, and without this the Service would wait for the next one.
func (b *AddressBook) waitAfter(key types.NamespacedName, seen uint64) {
	b.mu.Lock()
	b.waiting[key] = true
	missed := b.releases != seen
	b.mu.Unlock()
	if missed {
		b.wake(key)
	}
}

// SetWaiting records whether a Service waits for something that a released address or a Subnet
// change may bring.
func (b *AddressBook) SetWaiting(key types.NamespacedName, waiting bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if waiting {
		b.waiting[key] = true
	} else {
		delete(b.waiting, key)
	}
}

// IsWaiting tells whether the Service waits for a released address or a Subnet change.
func (b *AddressBook) IsWaiting(key types.NamespacedName) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.waiting[key]
}

// Waiting lists the waiting Services.
func (b *AddressBook) Waiting() []types.NamespacedName {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]types.NamespacedName, 0, len(b.waiting))
	for k := range b.waiting {
		out = append(out, k)
	}
	return out
}

// WakeWaiting enqueues every waiting Service.
func (b *AddressBook) WakeWaiting() {
	for _, k := range b.Waiting() {
		b.wake(k)
	}
}

// wake enqueues a Service without ever blocking the caller (an informer handler or a reconciler
// must not wait on the queue it feeds): when the buffer is full the send finishes in the background.
func (b *AddressBook) wake(key types.NamespacedName) {
	svc := &corev1.Service{}
	svc.Namespace, svc.Name = key.Namespace, key.Name
	ev := event.GenericEvent{Object: svc}
	select {
	case b.Wake <- ev:
	default:
		go func() {
			select {
			case b.Wake <- ev:
			case <-b.stopped:
			}
		}()
	}
}
