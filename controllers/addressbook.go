package controllers

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"sort"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/event"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
	"github.com/lbsvc/lbsvc-operator/controllers/ipam"
)

// AddressBook is the operator's memory of who holds which address. It wraps the pure allocator
// with what the reconcilers share: the restart gate (no address is handed out before every
// recorded allocation is loaded back), the Subnet configurations last applied, conflicts found
// while loading, and the Services to wake up when addresses move or free up.
//
// It is a manager Runnable: Start waits for the cache, rebuilds the allocator from the Services'
// lbsvc.io/allocated-ips annotations, then opens the gate. It runs after leader election, so a
// standby operator never hands out anything.
type AddressBook struct {
	alloc *ipam.Allocator
	cache cache.Cache

	ready     chan struct{}
	readyOnce sync.Once

	mu        sync.Mutex
	subnets   map[string]ipam.SubnetConfig // configuration last given to the allocator
	conflicts map[string]string            // owner → message, from the rebuild
	waiting   map[string]map[string]bool   // subnet → owners refused for lack of a free address

	// Wake carries Services to reconcile again (a channel source of the Service controller).
	Wake chan event.GenericEvent
	// stopped closes when Start returns, so that pending wakes give up instead of leaking.
	stopped chan struct{}
}

// NewAddressBook returns a closed-gate AddressBook that rebuilds from c when started.
func NewAddressBook(c cache.Cache) *AddressBook {
	return &AddressBook{
		alloc:     ipam.New(),
		cache:     c,
		ready:     make(chan struct{}),
		subnets:   map[string]ipam.SubnetConfig{},
		conflicts: map[string]string{},
		waiting:   map[string]map[string]bool{},
		Wake:      make(chan event.GenericEvent, 1024),
		stopped:   make(chan struct{}),
	}
}

// Start implements manager.Runnable.
func (b *AddressBook) Start(ctx context.Context) error {
	defer close(b.stopped)
	log := logf.FromContext(ctx).WithName("addressbook")
	if !b.cache.WaitForCacheSync(ctx) {
		return errors.New("address book: cache did not sync")
	}
	var subnets lbv1.SubnetList
	if err := b.cache.List(ctx, &subnets); err != nil {
		return fmt.Errorf("address book: list subnets: %w", err)
	}
	var services corev1.ServiceList
	if err := b.cache.List(ctx, &services); err != nil {
		return fmt.Errorf("address book: list services: %w", err)
	}
	restored, conflicts := b.rebuild(subnets.Items, services.Items)
	log.Info("allocator rebuilt from recorded allocations", "subnets", len(subnets.Items),
		"services", restored, "conflicts", conflicts)
	b.readyOnce.Do(func() { close(b.ready) })
	<-ctx.Done()
	return nil
}

// rebuild loads every parseable Subnet, then every recorded allocation, oldest Service first, so
// that when two Services recorded the same address the older one keeps it.
func (b *AddressBook) rebuild(subnets []lbv1.Subnet, services []corev1.Service) (restored, conflicts int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := range subnets {
		if cfg, err := ParseSubnetSpec(&subnets[i]); err == nil {
			b.alloc.SetSubnet(cfg)
			b.subnets[cfg.Name] = cfg
		}
	}
	sort.SliceStable(services, func(i, j int) bool {
		a, c := &services[i], &services[j]
		if !a.CreationTimestamp.Equal(&c.CreationTimestamp) {
			return a.CreationTimestamp.Before(&c.CreationTimestamp)
		}
		return a.Namespace+"/"+a.Name < c.Namespace+"/"+c.Name
	})
	for i := range services {
		svc := &services[i]
		recorded, subnet := svc.Annotations[lbv1.AllocatedIPsAnnotation], svc.Annotations[lbv1.AllocatedSubnetAnnotation]
		if recorded == "" || subnet == "" {
			continue
		}
		owner := OwnerKey(svc)
		addrs, err := ipam.ParseAddrs(recorded)
		if err == nil {
			_, err = b.alloc.Allocate(subnet, owner, addrs)
		}
		if err != nil {
			b.conflicts[owner] = fmt.Sprintf("recorded address(es) %s in subnet %q could not be restored: %v", recorded, subnet, err)
			conflicts++
			continue
		}
		restored++
	}
	return restored, conflicts
}

// WaitReady blocks until the allocator has been rebuilt (or ctx ends).
func (b *AddressBook) WaitReady(ctx context.Context) error {
	select {
	case <-b.ready:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for the allocator rebuild: %w", ctx.Err())
	}
}

// OwnerKey is the allocator's owner name of a Service: "namespace/name".
func OwnerKey(svc *corev1.Service) string { return svc.Namespace + "/" + svc.Name }

// EnsureSubnet gives the allocator cfg when it differs from what it has. Services whose addresses
// the new configuration invalidates are woken up: their next Allocate keeps what is still valid
// and replaces the rest.
func (b *AddressBook) EnsureSubnet(cfg ipam.SubnetConfig) {
	b.mu.Lock()
	if old, ok := b.subnets[cfg.Name]; ok && reflect.DeepEqual(old, cfg) {
		b.mu.Unlock()
		return
	}
	invalid := b.alloc.SetSubnet(cfg)
	b.subnets[cfg.Name] = cfg
	b.mu.Unlock()
	for _, o := range invalid {
		b.wake(o)
	}
	// A larger range or fewer exclusions may let refused Services in.
	b.wakeWaiting(cfg.Name)
}

// RemoveSubnet forgets a Subnet (called once no Service holds an address from it).
func (b *AddressBook) RemoveSubnet(name string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.alloc.RemoveSubnet(name)
	delete(b.subnets, name)
	delete(b.waiting, name)
}

// Allocate hands owner its address(es) in subnet, and remembers refused owners so that a freed
// address wakes them.
func (b *AddressBook) Allocate(subnet, owner string, requested []netip.Addr) ([]netip.Addr, error) {
	b.mu.Lock()
	addrs, err := b.alloc.Allocate(subnet, owner, requested)
	if err != nil && (errors.Is(err, ipam.ErrInUse) || errors.Is(err, ipam.ErrExhausted)) {
		if b.waiting[subnet] == nil {
			b.waiting[subnet] = map[string]bool{}
		}
		b.waiting[subnet][owner] = true
	} else if err == nil {
		delete(b.waiting[subnet], owner)
	}
	b.mu.Unlock()
	return addrs, err
}

// Release frees owner's addresses and wakes the Services waiting for an address in that Subnet.
func (b *AddressBook) Release(owner string) (subnet string, released []netip.Addr) {
	b.mu.Lock()
	subnet, released = b.alloc.Release(owner)
	delete(b.conflicts, owner)
	for _, w := range b.waiting {
		delete(w, owner)
	}
	b.mu.Unlock()
	if len(released) > 0 {
		b.wakeWaiting(subnet)
	}
	return subnet, released
}

// Lookup returns what owner holds.
func (b *AddressBook) Lookup(owner string) (subnet string, addrs []netip.Addr, ok bool) {
	return b.alloc.Lookup(owner)
}

// Owners lists the owners holding addresses in subnet.
func (b *AddressBook) Owners(subnet string) []string { return b.alloc.Owners(subnet) }

// Usage reports a Subnet's counters.
func (b *AddressBook) Usage(subnet string) (ipam.Usage, bool) { return b.alloc.Usage(subnet) }

// TakeConflict returns, once, the message of a conflict found for owner during the rebuild.
func (b *AddressBook) TakeConflict(owner string) (string, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	msg, ok := b.conflicts[owner]
	delete(b.conflicts, owner)
	return msg, ok
}

func (b *AddressBook) wakeWaiting(subnet string) {
	b.mu.Lock()
	var owners []string
	for o := range b.waiting[subnet] {
		owners = append(owners, o)
	}
	b.mu.Unlock()
	for _, o := range owners {
		b.wake(o)
	}
}

// wake enqueues a Service without ever blocking the caller (a reconciler holding no lock must
// not wait on the queue it feeds): when the buffer is full the send finishes in the background.
func (b *AddressBook) wake(owner string) {
	key := ownerName(owner)
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

func cutOwner(owner string) (ns, name string, ok bool) {
	for i := 0; i < len(owner); i++ {
		if owner[i] == '/' {
			return owner[:i], owner[i+1:], true
		}
	}
	return "", owner, false
}

// ownerName turns an owner key back into an object key.
func ownerName(owner string) types.NamespacedName {
	ns, name, _ := cutOwner(owner)
	return types.NamespacedName{Namespace: ns, Name: name}
}
