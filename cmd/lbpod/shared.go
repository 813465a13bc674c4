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
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/watch"
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
// services/status. The status must also carry our AddressAllocated condition, True, and the
// Service our load balancer class or none: another load balancer controller writes status too,
// and one whose pool overlaps a Subnet may list the address for a Service of its class. A Service
// of another type is no member either, whatever its status says (a Service turned into ClusterIP
// may keep an old status for a moment).
//
// A member is served only on the ports its ingress entry for the address lists (admitted): the
// operator lists the ports it judged free of clashes, and a member that adds another member's
// port to its spec (its tenant may) gets nothing on it before the operator refuses it.
type membership struct {
	// namespaces are the namespaces whose Services may be members: LBPOD_NAMESPACE, and from the
	// API those the lb pod's ServiceAccount lists (see sharedSource); empty for a --service-file
	// without --namespace: any.
	namespaces sets.Set[string]
	// label is the label key the operator puts on members (its value does not matter).
	label string
	// addrs are the lb pod's own addresses: one of them must be in the Service's status.
	addrs []netip.Addr
}

// newMembership checks that ipName names one of the lb pod's addresses: the operator sets both,
// and a pod that watched for another address's members would serve them on the wrong one.
func newMembership(namespace, ipName string, network lbpod.Network) (membership, error) {
	m := membership{namespaces: sets.New[string](), label: v1alpha1.SharedIPLabelPrefix + ipName}
	if namespace != "" {
		m.namespaces.Insert(namespace)
	}
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

// in is m with the members' namespaces replaced by namespaces.
func (m membership) in(namespaces sets.Set[string]) membership {
	m.namespaces = namespaces
	return m
}

// members keeps the Services that are members (see membership), sorted by namespace/name, each
// with the ports it was admitted on (admitted).
func (m membership) members(svcs []*corev1.Service) []*corev1.Service {
	var out []*corev1.Service
	for _, s := range svcs {
		if m.isMember(s) {
			out = append(out, m.admitted(s))
		}
	}
	slices.SortFunc(out, func(a, b *corev1.Service) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	return out
}

func (m membership) isMember(s *corev1.Service) bool {
	if m.namespaces.Len() > 0 && !m.namespaces.Has(s.Namespace) {
		return false
	}
	if _, labelled := s.Labels[m.label]; !labelled || s.Spec.Type != corev1.ServiceTypeLoadBalancer {
		return false
	}
	if c := s.Spec.LoadBalancerClass; c != nil && *c != v1alpha1.LoadBalancerClass {
		return false
	}
	if !meta.IsStatusConditionTrue(s.Status.Conditions, v1alpha1.ConditionAddressAllocated) {
		return false
	}
	return m.ingress(s) != nil
}

// ingress is s's status.loadBalancer.ingress entry of one of the lb pod's addresses, nil when none.
func (m membership) ingress(s *corev1.Service) *corev1.LoadBalancerIngress {
	for i, in := range s.Status.LoadBalancer.Ingress {
		if a, err := netip.ParseAddr(in.IP); err == nil && slices.Contains(m.addrs, a.Unmap()) {
			return &s.Status.LoadBalancer.Ingress[i]
		}
	}
	return nil
}

// admitted is member s with only the ports of its spec that its ingress entry lists (see
// membership): a copy when that drops any. An entry that lists none was written by a release
// that did not list them: all its ports stand, as they did.
func (m membership) admitted(s *corev1.Service) *corev1.Service {
	in := m.ingress(s)
	if in == nil || len(in.Ports) == 0 {
		return s
	}
	listed := func(p corev1.ServicePort) bool {
		return slices.ContainsFunc(in.Ports, func(l corev1.PortStatus) bool {
			return l.Port == p.Port && cmp.Or(l.Protocol, corev1.ProtocolTCP) == cmp.Or(p.Protocol, corev1.ProtocolTCP)
		})
	}
	if !slices.ContainsFunc(s.Spec.Ports, func(p corev1.ServicePort) bool { return !listed(p) }) {
		return s
	}
	c := s.DeepCopy()
	c.Spec.Ports = slices.DeleteFunc(c.Spec.Ports, func(p corev1.ServicePort) bool { return !listed(p) })
	return c
}

// memberNamespaces reads MemberNamespacesAnnotation's value: the namespaces it lists, sorted,
// without duplicates, empty items and own (always watched anyway), and the items that are no
// namespace name (malformed: ignored by the caller, and logged).
func memberNamespaces(annotation, own string) (namespaces, malformed []string) {
	seen := sets.New[string]()
	for _, item := range strings.Split(annotation, ",") {
		ns := strings.TrimSpace(item)
		switch {
		case ns == "" || ns == own || seen.Has(ns):
		case len(validation.IsDNS1123Label(ns)) > 0:
			malformed = append(malformed, ns)
		default:
			seen.Insert(ns)
		}
	}
	return sets.List(seen), malformed
}

// sharedSource reads the members of a shared address from the API: one informer per watched
// namespace on its Services that carry the label (list and watch narrowed by the label
// selector, relisted when a watch expires), and on each change the whole set of members,
// once the first list of LBPOD_NAMESPACE is in (before, a partial set would make the lb pod
// refuse the members not listed yet).
//
// The watched namespaces are own (LBPOD_NAMESPACE) and those that the lb pod's ServiceAccount
// lists in MemberNamespacesAnnotation, followed by name: a namespace added gets an informer, a
// namespace dropped loses it and its members at once. The annotation only widens what the lb
// pod tries to watch: its RBAC (RoleBindings the operator creates in member namespaces) and each
// member's status (membership) decide what it serves. A namespace whose Services it may not list
// yet is retried with a bounded backoff, logged once, and holds nothing else back.
type sharedSource struct {
	client apiClient
	membership
	// own is LBPOD_NAMESPACE, always watched.
	own string
	// podNamespace and serviceAccount name the lb pod's ServiceAccount (LBPOD_POD_NAMESPACE,
	// LBPOD_LEASE); serviceAccount empty: own alone.
	podNamespace, serviceAccount string
	// retryMin and retryMax bound the backoff of a list refused or failed (zero: 250 ms and 5 s).
	retryMin, retryMax time.Duration
	log                *slog.Logger
}

// cannotReadServiceAccount is logged (once) when the lb pod may not read its ServiceAccount (an
// older ClusterRole lbsvc-lbpod): it watches own alone meanwhile.
const cannotReadServiceAccount = "cannot read the ServiceAccount listing the member namespaces: watching LBPOD_NAMESPACE alone until it can"

// cannotReadServiceAccountYet is logged (once) when the first read of the ServiceAccount fails
// otherwise (a timeout, 429, 5xx): nothing is published until it is read or refused.
const cannotReadServiceAccountYet = "cannot read the ServiceAccount listing the member namespaces: retrying before the first publication"

// serviceAccounts lists and watches the lb pod's ServiceAccount by name.
func (s *sharedSource) serviceAccounts() *cache.ListWatch {
	sas := s.client.ServiceAccounts(s.podNamespace)
	return oneByName(s.serviceAccount, func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
		return sas.List(ctx, o)
	}, sas.Watch)
}

// readAnnotation reads the ServiceAccount's annotation once (a missing ServiceAccount lists
// none), or why it cannot be read.
func (s *sharedSource) readAnnotation(ctx context.Context) (string, error) {
	obj, err := s.serviceAccounts().ListWithContextFunc(ctx, metav1.ListOptions{})
	if err != nil {
		return "", fmt.Errorf("serviceaccount %s/%s: %w", s.podNamespace, s.serviceAccount, err)
	}
	var annotation string
	if list, ok := obj.(*corev1.ServiceAccountList); ok {
		for _, sa := range list.Items {
			annotation = sa.Annotations[v1alpha1.MemberNamespacesAnnotation]
		}
	}
	return annotation, nil
}

// others are the namespaces the annotation lists besides own; what is no namespace name there is
// logged and ignored.
func (s *sharedSource) others(annotation string) []string {
	namespaces, malformed := memberNamespaces(annotation, s.own)
	if len(malformed) > 0 {
		s.log.Warn("ignoring what is no namespace name in the ServiceAccount's annotation", "serviceaccount", s.podNamespace+"/"+s.serviceAccount,
			"annotation", v1alpha1.MemberNamespacesAnnotation, "ignored", strings.Join(malformed, ","))
	}
	return namespaces
}

// labelled lists the labelled Services of a namespace.
func (s *sharedSource) labelled(ctx context.Context, ns string, o metav1.ListOptions) (*corev1.ServiceList, error) {
	o.LabelSelector = s.label
	return s.client.Services(ns).List(ctx, o)
}

// Get reads the members once (lbpod init): those of own, and of each namespace the
// ServiceAccount lists that may be read (the others are logged and left out).
func (s *sharedSource) Get(ctx context.Context) ([]*corev1.Service, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var others []string
	// Only a refusal (settles) leaves a namespace out: a passing failure (a 503, a timeout) fails
	// the read, since a one-shot apply of some members only would remove the others' rules.
	if s.serviceAccount != "" {
		annotation, err := s.readAnnotation(ctx)
		if err != nil && !settles(err) {
			return nil, fmt.Errorf("serviceaccount %s/%s: %w", s.podNamespace, s.serviceAccount, err)
		}
		if err != nil {
			s.log.Warn(cannotReadServiceAccount, "err", err)
		}
		others = s.others(annotation)
	}
	read := sets.New[string]()
	var svcs []*corev1.Service
	for _, ns := range append([]string{s.own}, others...) {
		list, err := s.labelled(ctx, ns, metav1.ListOptions{})
		if err != nil && (ns == s.own || !settles(err)) {
			return nil, fmt.Errorf("services of %s labelled %s: %w", ns, s.label, err)
		}
		if err != nil {
			s.log.Warn("cannot list a member namespace's Services: its members are left out", "namespace", ns, "err", err)
			continue
		}
		read.Insert(ns)
		for i := range list.Items {
			svcs = append(svcs, &list.Items[i])
		}
	}
	return s.in(read).members(svcs), nil
}

func (s *sharedSource) Run(ctx context.Context, sink serviceSink) {
	w := &sharedWatch{src: s, ctx: ctx, sink: sink, watches: map[string]*nsWatch{}, logged: sets.New[string]()}
	w.setNamespaces(nil)
	if s.serviceAccount != "" {
		if !w.readFirstAnnotation(ctx) {
			return
		}
		go w.followServiceAccount(ctx)
	}
	// The first publication waits for own's first list, and for the other namespaces of the
	// first read only until their first list is in or refused.
	w.mu.Lock()
	waits := []chan struct{}{w.watches[s.own].synced}
	for ns, nw := range w.watches {
		if ns != s.own {
			waits = append(waits, nw.settled)
		}
	}
	w.mu.Unlock()
	for _, c := range waits {
		select {
		case <-c:
		case <-ctx.Done():
			return
		}
	}
	w.mu.Lock()
	w.ready = true
	w.mu.Unlock()
	w.publish()
	<-ctx.Done()
}

// sharedWatch is sharedSource.Run's state: the watched namespaces.
type sharedWatch struct {
	src  *sharedSource
	ctx  context.Context
	sink serviceSink
	// pub makes one publication at a time, each from the stores as they are then: two could
	// otherwise cross, and an older set arrive last.
	pub sync.Mutex
	// mu guards what follows.
	mu      sync.Mutex
	watches map[string]*nsWatch
	// ready: the first publication is due (see Run); none before.
	ready bool
	// annotation is the last value of the ServiceAccount's annotation applied.
	annotation *string
	// logged are the failures already logged: "serviceaccount", "namespace/<name>".
	logged sets.Set[string]
}

// nsWatch is the informer of one namespace's labelled Services.
type nsWatch struct {
	cancel context.CancelFunc
	// store is set once the namespace may be listed and its informer runs.
	store cache.Store
	// synced is closed after the informer's first list is in; settled after that or after the
	// first refused list (or when the watch stops), whichever comes first.
	synced, settled chan struct{}
	settle          func()
}

func (w *sharedWatch) logOnce(key, msg string, err error) {
	w.mu.Lock()
	first := !w.logged.Has(key)
	w.logged.Insert(key)
	w.mu.Unlock()
	if first {
		w.src.log.Warn(msg, "err", err)
	}
}

// setNamespaces watches own and others, and no other namespace.
func (w *sharedWatch) setNamespaces(others []string) {
	want := sets.New(others...).Insert(w.src.own)
	w.mu.Lock()
	changed := false
	for ns, nw := range w.watches {
		if !want.Has(ns) {
			nw.cancel()
			delete(w.watches, ns)
			changed = true
		}
	}
	for ns := range want {
		if _, ok := w.watches[ns]; !ok {
			w.watches[ns] = w.watch(ns)
			changed = true
		}
	}
	w.mu.Unlock()
	if changed {
		w.src.log.Info("member namespaces", "namespaces", strings.Join(sets.List(want), ","))
		w.publish()
	}
}

// setAnnotation applies a value of the ServiceAccount's annotation (a ServiceAccount deleted:
// empty).
func (w *sharedWatch) setAnnotation(value string) {
	w.mu.Lock()
	same := w.annotation != nil && *w.annotation == value
	w.annotation = &value
	w.mu.Unlock()
	if same {
		return
	}
	w.setNamespaces(w.src.others(value))
}

// readFirstAnnotation reads the ServiceAccount's annotation before the first publication and
// applies it, so that the first publication waits for the namespaces it lists. A passing failure
// (a timeout, 429, 5xx) is retried with untilAllowed's backoff: given up at once, the first
// publication held LBPOD_NAMESPACE's members alone, which the loop applied (a restarted container
// removed the other namespaces' rules; a new replica became ready and could take the address
// over with their ports refused). Only a refusal (settles) ends it without the annotation: the lb
// pod may not read the ServiceAccount and watches LBPOD_NAMESPACE alone until it can
// (followServiceAccount). false when ctx ended first.
func (w *sharedWatch) readFirstAnnotation(ctx context.Context) bool {
	s := w.src
	var annotation string
	var refused error
	read := func(ctx context.Context) error {
		a, err := s.readAnnotation(ctx)
		if err != nil && settles(err) {
			refused = err
			return nil
		}
		annotation = a
		return err
	}
	if !s.untilAllowed(ctx, "serviceaccount "+s.podNamespace+"/"+s.serviceAccount, read, func(err error) {
		w.logOnce("serviceaccount/first", cannotReadServiceAccountYet, err)
	}) {
		return false
	}
	if refused != nil {
		w.logOnce("serviceaccount", cannotReadServiceAccount, refused)
	} else {
		w.setAnnotation(annotation)
	}
	return true
}

// followServiceAccount watches the lb pod's ServiceAccount by name (a field selector) and
// applies each change of its annotation.
func (w *sharedWatch) followServiceAccount(ctx context.Context) {
	s := w.src
	lw := s.serviceAccounts()
	probe := func(ctx context.Context) error {
		_, err := lw.ListWithContextFunc(ctx, metav1.ListOptions{Limit: 1})
		return err
	}
	if !s.untilAllowed(ctx, "serviceaccount "+s.podNamespace+"/"+s.serviceAccount, probe, func(err error) {
		w.logOnce("serviceaccount", cannotReadServiceAccount, err)
	}) {
		return
	}
	apply := func(obj any) {
		if sa, ok := obj.(*corev1.ServiceAccount); ok {
			w.setAnnotation(sa.Annotations[v1alpha1.MemberNamespacesAnnotation])
		}
	}
	_, ctrl := informer(lw, &corev1.ServiceAccount{}, apply, func(any) { w.setAnnotation("") }, nil)
	ctrl.RunWithContext(ctx)
}

// watch starts the informer of namespace ns (called with mu held).
func (w *sharedWatch) watch(ns string) *nsWatch {
	ctx, cancel := context.WithCancel(w.ctx)
	nw := &nsWatch{cancel: cancel, synced: make(chan struct{}), settled: make(chan struct{})}
	nw.settle = sync.OnceFunc(func() { close(nw.settled) })
	go w.run(ctx, ns, nw)
	return nw
}

func (w *sharedWatch) run(ctx context.Context, ns string, nw *nsWatch) {
	defer nw.settle()
	s := w.src
	probe := func(ctx context.Context) error {
		_, err := s.labelled(ctx, ns, metav1.ListOptions{Limit: 1})
		return err
	}
	if !s.untilAllowed(ctx, "services of namespace "+ns, probe, func(err error) {
		w.logOnce("namespace/"+ns, "cannot list the Services of a member namespace (its RoleBinding not there yet?): retrying; the other namespaces' members are served", fmt.Errorf("namespace %s: %w", ns, err))
		if settles(err) {
			nw.settle()
		}
	}) {
		return
	}
	services := s.client.Services(ns)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return s.labelled(ctx, ns, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = s.label
			return services.Watch(ctx, o)
		},
	}
	// A member deleted leaves the set too: its ports are refused, the others' go on.
	publish := func(any) { w.publish() }
	store, ctrl := informer(lw, &corev1.Service{}, publish, publish, s.trimService)
	w.mu.Lock()
	nw.store = store
	w.mu.Unlock()
	go ctrl.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), ctrl.HasSynced) {
		return
	}
	// The store already holds what each event handled so far brought: mark it synced, then
	// publish, so that no change between the two is lost.
	close(nw.synced)
	nw.settle()
	w.publish()
}

// informer is an informer of lw's objects calling changed with the object added or updated, and
// deleted with one deleted; transform, when not nil, trims each object before it is stored.
func informer(lw cache.ListerWatcher, obj runtime.Object, changed, deleted func(any), transform cache.TransformFunc) (cache.Store, cache.Controller) {
	return cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: lw,
		ObjectType:    obj,
		Transform:     transform,
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    changed,
			UpdateFunc: func(_, obj any) { changed(obj) },
			DeleteFunc: deleted,
		},
	})
}

// publish gives the sink the members of the watched namespaces whose first list is in.
func (w *sharedWatch) publish() {
	w.pub.Lock()
	defer w.pub.Unlock()
	w.mu.Lock()
	if !w.ready {
		w.mu.Unlock()
		return
	}
	watched := sets.New[string]()
	for ns := range w.watches {
		watched.Insert(ns)
	}
	m := w.src.in(watched)
	var svcs []*corev1.Service
	for _, nw := range w.watches {
		select {
		case <-nw.synced:
		default:
			continue
		}
		for _, obj := range nw.store.List() {
			// Only members are copied: anyone of a member namespace may label any Service.
			if svc, ok := obj.(*corev1.Service); ok && m.isMember(svc) {
				svcs = append(svcs, svc.DeepCopy())
			}
		}
	}
	w.mu.Unlock()
	w.sink.SetServices(m.members(svcs), nil)
}

// trimService is the shared informers' transform: it keeps of a Service what the lb pod reads.
// Anyone of a member namespace may put the address's label on any Service there, and each is
// cached: kept whole, a few large ones (managed fields, 256 KiB of annotations, thousands of
// ports) took the lb pods past their memory limit. Managed fields and every annotation but the
// source ranges' go, and so do the labels but the address's; a Service that is not a member by
// its status (which only the operator writes) keeps no ports, ranges or annotation either: when it
// becomes one, the update that shows it comes whole, and is kept so.
func (s *sharedSource) trimService(obj any) (any, error) {
	svc, ok := obj.(*corev1.Service)
	if !ok {
		return obj, nil
	}
	svc.ManagedFields = nil
	keep := func(m map[string]string, key string) map[string]string {
		if v, ok := m[key]; ok {
			return map[string]string{key: v}
		}
		return nil
	}
	svc.Annotations = keep(svc.Annotations, corev1.AnnotationLoadBalancerSourceRangesKey)
	svc.Labels = keep(svc.Labels, s.label)
	// Any namespace: each informer watches one the lb pods may serve (membership alone holds
	// only LBPOD_NAMESPACE).
	if !s.membership.in(nil).isMember(svc) {
		svc.Annotations, svc.Spec.Ports, svc.Spec.LoadBalancerSourceRanges = nil, nil, nil
	}
	return svc, nil
}

// settles tells whether a failed first list of a member namespace settles it for the first
// publication: only a refusal does (its RoleBinding is not there yet: the other namespaces'
// members are served meanwhile). A passing failure (a timeout, 429, 5xx) does not: settled by it,
// a new replica published without that namespace's members, became ready and could take the
// address over with their ports refused.
func settles(err error) bool { return apierrors.IsForbidden(err) }

// untilAllowed calls probe until it succeeds (true) or ctx ends (false), after each failure
// calling failed and waiting a backoff doubling from retryMin to retryMax.
// what names what is read, for the log line when it succeeds after failing.
func (s *sharedSource) untilAllowed(ctx context.Context, what string, probe func(context.Context) error, failed func(error)) bool {
	delay, limit := cmp.Or(s.retryMin, 250*time.Millisecond), cmp.Or(s.retryMax, 5*time.Second)
	logged := false
	for {
		err := probe(ctx)
		if err == nil {
			if logged {
				s.log.Info("readable now", "what", what)
			}
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		failed(err)
		logged = true
		select {
		case <-ctx.Done():
			return false
		case <-time.After(delay):
		}
		delay = min(2*delay, limit)
	}
}
