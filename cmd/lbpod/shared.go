package main

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
	"github.com/lbsvc/lbsvc-operator/lbpod"
)

// membership says which Services are members of a shared address, that is which Services the
// lb pod of that address serves.
//
// Trust: the lb pod forwards the address's ports to whatever its members' ClusterIPs are, so a
// Service must not become a member by its own say. The label (SharedIPLabelPrefix+<IP name>)
// only narrows the list and watch: anyone with the edit role in the namespace can set labels,
// and could otherwise put their Service's ports (and ClusterIP) on someone else's address. The
// proof is status.loadBalancer.ingress listing one of the lb pod's own addresses: the operator
// writes it when it makes a Service a member, and tenants with the edit role cannot write
// services/status. A Service of another type is no member either, whatever its status says
// (a Service turned into ClusterIP may keep an old status for a moment).
type membership struct {
	// namespace is the members' namespace (shared addresses never cross namespaces); empty for
	// a --service-file without --namespace: any.
	namespace string
	// label is the label key the operator puts on members (its value does not matter).
	label string
	// addrs are the lb pod's own addresses: one of them must be in the Service's status.
	addrs []netip.Addr
}

// newMembership checks that ipName names one of the lb pod's addresses: the operator sets both,
// and a pod that watched for another address's members would serve them on the wrong one.
func newMembership(namespace, ipName string, network lbpod.Network) (membership, error) {
	m := membership{namespace: namespace, label: v1alpha1.SharedIPLabelPrefix + ipName}
	var names []string
	found := false
	for _, a := range network.Addresses {
		m.addrs = append(m.addrs, a.Addr().Unmap())
		names = append(names, v1alpha1.IPName(a.Addr()))
		found = found || v1alpha1.IPName(a.Addr()) == ipName
	}
	if !found {
		return m, fmt.Errorf("shared-ip %q: not the IP object name of an address of this lb pod (want one of %s)", ipName, strings.Join(names, ", "))
	}
	return m, nil
}

// members keeps the Services that are members (see membership), sorted by namespace/name.
func (m membership) members(svcs []*corev1.Service) []*corev1.Service {
	var out []*corev1.Service
	for _, s := range svcs {
		if m.isMember(s) {
			out = append(out, s)
		}
	}
	slices.SortFunc(out, func(a, b *corev1.Service) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	return out
}

func (m membership) isMember(s *corev1.Service) bool {
	if m.namespace != "" && s.Namespace != m.namespace {
		return false
	}
	if _, labelled := s.Labels[m.label]; !labelled || s.Spec.Type != corev1.ServiceTypeLoadBalancer {
		return false
	}
	for _, in := range s.Status.LoadBalancer.Ingress {
		if a, err := netip.ParseAddr(in.IP); err == nil && slices.Contains(m.addrs, a.Unmap()) {
			return true
		}
	}
	return false
}

// sharedSource reads the members of a shared address from the API: one informer on the Services
// of the namespace that carry the label (list and watch narrowed by the label selector, relisted
// when a watch expires), and on each change the whole set of members, once the first list is in
// (before, a partial set would make the lb pod refuse the members not listed yet).
type sharedSource struct {
	client kubernetes.Interface
	membership
	log *slog.Logger
}

func (s *sharedSource) Get(ctx context.Context) ([]*corev1.Service, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	list, err := s.client.CoreV1().Services(s.namespace).List(ctx, metav1.ListOptions{LabelSelector: s.label})
	if err != nil {
		return nil, fmt.Errorf("services of %s labelled %s: %w", s.namespace, s.label, err)
	}
	var svcs []*corev1.Service
	for i := range list.Items {
		svcs = append(svcs, &list.Items[i])
	}
	return s.members(svcs), nil
}

func (s *sharedSource) Run(ctx context.Context, sink serviceSink) {
	services := s.client.CoreV1().Services(s.namespace)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = s.label
			return services.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = s.label
			return services.Watch(ctx, o)
		},
	}
	var synced atomic.Bool
	var store cache.Store
	// One publication at a time, each from the store as it is then: the handler's and the first
	// one could otherwise cross, and an older set arrive last.
	var mu sync.Mutex
	publish := func() {
		if !synced.Load() {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		var svcs []*corev1.Service
		for _, obj := range store.List() {
			if svc, ok := obj.(*corev1.Service); ok {
				svcs = append(svcs, svc.DeepCopy())
			}
		}
		sink.SetServices(s.members(svcs), nil)
	}
	var ctrl cache.Controller
	store, ctrl = cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: lw,
		ObjectType:    &corev1.Service{},
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { publish() },
			UpdateFunc: func(_, _ any) { publish() },
			// A member deleted leaves the set: its ports are refused, the others' go on.
			DeleteFunc: func(any) { publish() },
		},
	})
	go ctrl.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), ctrl.HasSynced) {
		return
	}
	// The store already holds what each event handled so far brought: set synced, then
	// publish, so that no change between the two is lost.
	synced.Store(true)
	publish()
	<-ctx.Done()
}
