package controllers

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"time"

	"github.com/lbsvc/lbsvc-operator/controllers/decide"
	"github.com/lbsvc/lbsvc-operator/controllers/lbobjects"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
)

// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch

// actionShow is the Event action of the active-holder controller.
const actionShow = "ShowHolder"

// ActiveReconciler shows which lb pod holds each served Service's address (see DecideActive).
// It only mirrors: it never starts, stops or moves anything.
type ActiveReconciler struct {
	Client   client.Client
	Recorder events.EventRecorder
	// LBPodNamespace is --lb-pod-namespace (empty: the Service's namespace).
	LBPodNamespace string
	// LBReplicas is --lb-replicas, the lb pods of a Service without lbsvc.io/replicas.
	LBReplicas         int32
	SkipNameValidation bool
	// Now is the clock of the AddressHeldTwice quiet period; time.Now when nil.
	Now func() time.Time
}

// Reconcile gathers the Service, its Lease and its lb pods from the cache, decides, and writes
// only what differs.
func (r *ActiveReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	svc := &corev1.Service{}
	if err := r.Client.Get(ctx, req.NamespacedName, svc); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	// Only a Service we serve: our AddressAllocated condition (which a tenant cannot write) is
	// True. Anything else is the Service controller's business.
	if c := meta.FindStatusCondition(svc.Status.Conditions, decide.ConditionAddressAllocated); c == nil ||
		c.Status != "True" || svc.DeletionTimestamp != nil {
		return ctrl.Result{}, nil
	}
	leaseKey := types.NamespacedName{Namespace: svc.Namespace, Name: lbobjects.LeaseName(r.LBPodNamespace, svc.Namespace, svc.Name)}
	podNS := lbobjects.PodNamespace(r.LBPodNamespace, svc.Namespace)
	ours := func(l *coordinationv1.Lease) bool { return l.Labels[lbv1.ServiceUIDLabel] == string(svc.UID) }
	mine := []client.ListOption{client.InNamespace(podNS), client.MatchingFields{indexServiceUID: string(svc.UID)}}
	replicas := decide.ServiceReplicas(svc, r.LBReplicas)
	shared, err := r.sharedAddress(ctx, svc)
	if err != nil {
		return ctrl.Result{}, err
	}
	if shared != nil {
		// A member of a shared address: its lb pods and Lease are the address's. Both are where
		// the owner's lb pods would run (lbobjects.SharedLeaseNamespace), the Lease labelled with
		// the owner's UID, as the IP controller reads it.
		name, owner := shared.Name, shared.Spec.Service
		leaseKey = types.NamespacedName{Namespace: lbobjects.SharedLeaseNamespace(r.LBPodNamespace, owner.Namespace), Name: lbobjects.SharedObjectName(name)}
		podNS = lbobjects.PodNamespace(r.LBPodNamespace, owner.Namespace) // where the address's lb pods run
		ours = func(l *coordinationv1.Lease) bool {
			return l.Labels[lbv1.SharedIPLabel] == name && l.Labels[lbv1.ServiceUIDLabel] == owner.UID
		}
		mine = []client.ListOption{client.InNamespace(podNS), client.MatchingLabels{lbv1.SharedIPLabel: name}}
		replicas = max(r.LBReplicas, 1)
	}
	var lease *coordinationv1.Lease
	l := &coordinationv1.Lease{}
	switch err := r.Client.Get(ctx, leaseKey, l); {
	case err == nil:
		if ours(l) {
			lease = l
		}
	case !apierrors.IsNotFound(err):
		return ctrl.Result{}, err
	}
	var pods corev1.PodList
	if err := r.Client.List(ctx, &pods, mine...); err != nil {
		return ctrl.Result{}, err
	}
	if shared == nil {
		// The lb pods of a shared address carry the UID of the Service it was first claimed for,
		// which may since have left it for an address of its own: they are not that Service's.
		pods.Items = slices.DeleteFunc(pods.Items, func(p corev1.Pod) bool { return p.Labels[lbv1.SharedIPLabel] != "" })
	}
	// The addresses as the status shows them (only we write it): the held-twice Warning goes to
	// the IP objects they name, so not the mirror annotation, which the Service's tenant may edit.
	addrs := decide.IngressAddrs(svc)
	plan := decide.DecideActive(decide.ActiveInputs{Service: svc, Lease: lease, Pods: pods.Items,
		Replicas: replicas, Addresses: addrs})
	now := time.Now
	if r.Now != nil {
		now = r.Now
	}
	var note string
	if lease != nil {
		note = lease.Annotations[lbv1.HeldTwiceAnnotation]
	}
	held := decide.DecideHeldTwice(decide.HeldTwiceInputs{Note: note, Pods: pods.Items, Addresses: addrs, Now: now(),
		Current: meta.FindStatusCondition(svc.Status.Conditions, decide.ConditionAddressHeldTwice)})
	if err := r.apply(ctx, svc, plan, held); err != nil {
		if apierrors.IsConflict(err) {
			// The Service pass wrote first: look again, without logging an error.
			return ctrl.Result{Requeue: true}, nil
		}
		return ctrl.Result{}, err
	}
	return ctrl.Result{RequeueAfter: held.RecheckAfter}, nil
}

// apply writes the plans on the Service (and the held-twice Warning on its IP objects): the
// operator writes nothing on lb pods (it has no pod writes), so who is active is shown on the
// Service, its Event and the IP object.
func (r *ActiveReconciler) apply(ctx context.Context, svc *corev1.Service, plan decide.ActivePlan, held decide.HeldTwicePlan) error {
	// Nothing to say yet and nothing said before: no write (a Service whose lb pod has not
	// started costs no extra write).
	shownBefore := meta.FindStatusCondition(svc.Status.Conditions, decide.ConditionAddressActive) != nil
	if plan.ActivePod == "" && !shownBefore && svc.Annotations[lbv1.ActivePodAnnotation] == "" {
		return r.write(ctx, svc, held, nil, nil)
	}
	ann := maps.Clone(svc.Annotations)
	for k, v := range plan.Annotations {
		if v == "" {
			delete(ann, k)
		} else {
			ann[k] = v
		}
	}
	if maps.Equal(ann, svc.Annotations) {
		// The annotations show the holder already: none to write. The Event still goes when the
		// condition named another holder (plan.Event): a tenant who wrote the new holder into the
		// mirror first does not hide a move.
		ann = nil
	}
	return r.write(ctx, svc, held, ann, plan.Event, plan.Condition)
}

// write patches the Service's annotations (ann, when not nil: they changed) and conditions
// (AddressHeldTwice, and the others given) in one write to the status subresource, which keeps
// metadata changes; then, only once that landed, it sends the active pod's Event and the
// AddressHeldTwice Warning on the Service and its IP objects and counts it: a failed patch is
// retried, and no Event may go out twice.
func (r *ActiveReconciler) write(ctx context.Context, svc *corev1.Service, held decide.HeldTwicePlan,
	ann map[string]string, event *decide.ActiveEvent, others ...metav1.Condition) error {
	beforeStatus := svc.DeepCopy()
	changed := ann != nil
	if changed {
		svc.Annotations = ann
	}
	if held.Condition != nil {
		others = append(others, *held.Condition)
	}
	for _, c := range others {
		c.ObservedGeneration = svc.Generation
		changed = meta.SetStatusCondition(&svc.Status.Conditions, c) || changed
	}
	if changed {
		if err := r.Client.Status().Patch(ctx, svc, client.MergeFromWithOptions(beforeStatus, client.MergeFromWithOptimisticLock{}), client.FieldOwner(FieldOwner)); err != nil {
			return fmt.Errorf("patch service %s/%s: %w", svc.Namespace, svc.Name, err)
		}
	}
	if event != nil {
		r.Recorder.Eventf(svc, nil, corev1.EventTypeNormal, event.Reason, actionShow, "%s", event.Message)
	}
	if held.Warning == "" {
		return nil
	}
	addressesHeldTwice.Inc()
	r.Recorder.Eventf(svc, nil, corev1.EventTypeWarning, decide.ReasonAddressHeldTwice, actionShow, "%s", held.Warning)
	for _, name := range held.IPObjects {
		ip := &lbv1.IP{}
		if err := r.Client.Get(ctx, types.NamespacedName{Name: name}, ip); err != nil {
			continue // gone (released meanwhile): the Service's Event stands
		}
		// Related: the Service as just written. The events recorder folds an Event into an
		// earlier one with the same reason, action, regarding and related object (resource
		// versions included), whatever its message: the IP object does not change between two
		// reports, so without the Service's new version a second split brain would only count
		// up the first one's series and its message would never show.
		r.Recorder.Eventf(ip, svc, corev1.EventTypeWarning, decide.ReasonAddressHeldTwice, actionShow, "%s", held.Warning)
	}
	return nil
}

// SetupWithManager watches served Services, their Leases and their lb pods.
func (r *ActiveReconciler) SetupWithManager(mgr ctrl.Manager) error {
	members := func(ip *lbv1.IP) []reconcile.Request {
		var reqs []reconcile.Request
		for _, k := range memberKeys(ip.Spec.Members) {
			reqs = append(reqs, reconcile.Request{NamespacedName: k})
		}
		return reqs
	}
	byLabels := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
		l := o.GetLabels()
		if name := l[lbv1.SharedIPLabel]; name != "" {
			// A shared address's Lease and lb pods name no Service: they wake the members the IP
			// object lists, as far as they are provably the address's (decide.MembersToWake: a
			// Lease or pod forged with its labels in another namespace wakes no member there).
			ip := &lbv1.IP{}
			if r.Client.Get(ctx, types.NamespacedName{Name: name}, ip) != nil {
				return nil
			}
			var reqs []reconcile.Request
			for _, k := range memberKeys(decide.MembersToWake(o, ip.Spec.Service, ip.Spec.Members, r.LBPodNamespace)) {
				reqs = append(reqs, reconcile.Request{NamespacedName: k})
			}
			return reqs
		}
		if l[lbv1.ServiceNamespaceLabel] == "" || l[lbv1.ServiceLabel] == "" {
			return nil
		}
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: l[lbv1.ServiceNamespaceLabel], Name: l[lbv1.ServiceLabel]}}}
	})
	b := ctrl.NewControllerManagedBy(mgr).
		Named("active").
		For(&corev1.Service{}, builder.WithPredicates(predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
			old, okOld := e.ObjectOld.(*corev1.Service)
			cur, okNew := e.ObjectNew.(*corev1.Service)
			return !okOld || !okNew || activeInputsChanged(old, cur)
		}})).
		Watches(&coordinationv1.Lease{}, byLabels).
		Watches(&corev1.Pod{}, byLabels).
		// A member that joined is seen as one once the IP object lists it: its own status write
		// may reach this cache first.
		Watches(&lbv1.IP{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			return members(o.(*lbv1.IP))
		}), builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		WithOptions(controller.Options{MaxConcurrentReconciles: 2, SkipNameValidation: &r.SkipNameValidation})
	return b.Complete(r)
}

// activeInputs are the annotations of a Service that DecideActive and apply read or write.
var activeInputs = []string{lbv1.ActivePodAnnotation, lbv1.ActiveNodeAnnotation, lbv1.ReplicasAnnotation}

// activeInputsChanged tells whether a Service update changes anything this controller reads:
// whether the Service is served (our AddressAllocated condition, its deletion), the addresses,
// what it shows (the holder annotations, the AddressActive condition) and the generation its
// condition records. Every other update (the Service controller's own status and metadata
// writes, a tenant's label) would make a pass that finds nothing to do: without this filter
// the controller made 4.00 passes per Service in make bench-operator.
func activeInputsChanged(old, cur *corev1.Service) bool {
	if old.Generation != cur.Generation || old.DeletionTimestamp.IsZero() != cur.DeletionTimestamp.IsZero() ||
		!maps.Equal(decide.IngressSet(old), decide.IngressSet(cur)) {
		return true
	}
	for _, k := range activeInputs {
		if old.Annotations[k] != cur.Annotations[k] {
			return true
		}
	}
	for _, t := range []string{decide.ConditionAddressAllocated, decide.ConditionAddressActive, decide.ConditionAddressHeldTwice} {
		a, b := meta.FindStatusCondition(old.Status.Conditions, t), meta.FindStatusCondition(cur.Status.Conditions, t)
		if (a == nil) != (b == nil) || a != nil && (a.Status != b.Status || a.Reason != b.Reason ||
			a.Message != b.Message || a.ObservedGeneration != b.ObservedGeneration) {
			return true
		}
	}
	return false
}

// sharedAddress is the IP object of the shared address a Service we serve is a member of (nil
// for none): the one its status shows (only we write it), shared, and listing the Service among
// its members by UID (the cluster-scoped IP object is written by the operator alone).
func (r *ActiveReconciler) sharedAddress(ctx context.Context, svc *corev1.Service) (*lbv1.IP, error) {
	name := sharedAddressOf(svc)
	if name == "" {
		return nil, nil
	}
	ip := &lbv1.IP{}
	if err := r.Client.Get(ctx, types.NamespacedName{Name: name}, ip); err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	if ip.Spec.SharingKey == "" || !slices.ContainsFunc(ip.Spec.Members, func(m lbv1.IPMember) bool { return m.UID == string(svc.UID) }) {
		return nil, nil
	}
	return ip, nil
}

// sharedAddressOf is the IP object name of the first shared address a Service we serve is a
// member of ("" for none): it shares (lbsvc.io/allow-shared-ip), and its status, which only we
// write, shows the address.
func sharedAddressOf(svc *corev1.Service) string {
	if svc.Annotations[lbv1.AllowSharedIPAnnotation] == "" || len(svc.Status.LoadBalancer.Ingress) == 0 {
		return ""
	}
	a, err := netip.ParseAddr(svc.Status.LoadBalancer.Ingress[0].IP)
	if err != nil {
		return ""
	}
	return lbv1.IPName(a)
}
