package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/lbsvc/lbsvc-operator/controllers/lbobjects"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
)

// leaseRecorder writes, at each takeover, this pod's name into the Service's Lease (holderIdentity,
// leaseTransitions, acquireTime), which the operator mirrors into the role labels, the Service's
// annotations and condition, an Event, and the IP object. It is a record, not a lock: the election
// on the underlay decides, the Lease is never renewed (an idle Service costs no API write), and the
// recorder runs beside the election, so an unreachable API server delays only what people see.
type leaseRecorder struct {
	client kubernetes.Interface
	// namespace and service name the Service, name its Lease, identity this pod.
	namespace, service, name, identity string
	log                                *slog.Logger
	active                             atomic.Bool
	kick                               chan struct{}
	// retryMax bounds the backoff between failed writes.
	retryMax time.Duration
}

func newLeaseRecorder(client kubernetes.Interface, namespace, service, name, identity string, log *slog.Logger) *leaseRecorder {
	return &leaseRecorder{client: client, namespace: namespace, service: service, name: name, identity: identity,
		log: log.With("lease", namespace+"/"+name), kick: make(chan struct{}, 1), retryMax: 10 * time.Second}
}

// onRole is the election's OnChange: becoming active asks for a write.
func (r *leaseRecorder) onRole(active bool) {
	r.active.Store(active)
	if active {
		select {
		case r.kick <- struct{}{}:
		default:
		}
	}
}

// run writes the record after each takeover, retrying with backoff while this pod stays active.
// It also watches the Lease: two replicas that claimed at the same moment both write it, and the
// one that loses the election may write last; the one that stays active then writes itself back
// (one write, only after such a race), so the record names the pod that holds the address.
func (r *leaseRecorder) run(ctx context.Context) {
	go r.watch(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.kick:
		}
		backoff := 200 * time.Millisecond
		for r.active.Load() {
			err := r.write(ctx)
			if err == nil {
				break
			}
			r.log.Warn("recording the takeover in the Lease failed; retrying", "err", err, "in", backoff)
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, r.retryMax)
		}
	}
}

// watch follows the Lease (by name: it needs nothing wider) and asks for a write when it
// names another pod while this one is active.
func (r *leaseRecorder) watch(ctx context.Context) {
	leases := r.client.CoordinationV1().Leases(r.namespace)
	lw := oneByName(r.name, func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
		return leases.List(ctx, o)
	}, leases.Watch)
	seen := func(obj any) {
		if l, ok := obj.(*coordinationv1.Lease); ok && r.active.Load() && ptr.Deref(l.Spec.HolderIdentity, "") != r.identity {
			select {
			case r.kick <- struct{}{}:
			default:
			}
		}
	}
	_, ctrl := cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: lw,
		ObjectType:    &coordinationv1.Lease{},
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    seen,
			UpdateFunc: func(_, obj any) { seen(obj) },
		},
	})
	ctrl.RunWithContext(ctx)
}

// write names this pod the holder, unless the Lease already does. leaseTransitions counts changes
// from one holder to another, as Kubernetes' leader election counts them. An absent Lease is
// created (the operator does not create it, see lbobjects.BuildLease); two replicas that create
// it at once are told AlreadyExists, and the retry updates it.
func (r *leaseRecorder) write(ctx context.Context) error {
	leases := r.client.CoordinationV1().Leases(r.namespace)
	l, err := leases.Get(ctx, r.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return r.create(ctx)
	}
	if err != nil {
		return err
	}
	prev := ptr.Deref(l.Spec.HolderIdentity, "")
	if prev == r.identity {
		return nil
	}
	transitions := ptr.Deref(l.Spec.LeaseTransitions, 0)
	if prev != "" {
		transitions++
	}
	l.Spec.HolderIdentity, l.Spec.LeaseTransitions = ptr.To(r.identity), ptr.To(transitions)
	l.Spec.AcquireTime = &metav1.MicroTime{Time: time.Now()}
	if _, err := leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
		return err
	}
	r.log.Info("recorded the takeover", "holder", r.identity, "previous", prev, "transitions", transitions)
	return nil
}

// create makes the Service's Lease with this pod as its first holder. The Service is read for
// its UID, which the Lease's labels and owner reference carry.
func (r *leaseRecorder) create(ctx context.Context) error {
	svc, err := r.client.CoreV1().Services(r.namespace).Get(ctx, r.service, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("read service %s/%s to create its lease: %w", r.namespace, r.service, err)
	}
	l := lbobjects.BuildLease(r.name, svc)
	l.Spec.HolderIdentity, l.Spec.LeaseTransitions = ptr.To(r.identity), ptr.To[int32](0)
	l.Spec.AcquireTime = &metav1.MicroTime{Time: time.Now()}
	if _, err := r.client.CoordinationV1().Leases(r.namespace).Create(ctx, l, metav1.CreateOptions{}); err != nil {
		return err
	}
	r.log.Info("recorded the takeover in a new Lease", "holder", r.identity)
	return nil
}
