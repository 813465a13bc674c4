package controllers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
)

// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups="",resources=services/status,verbs=patch
// +kubebuilder:rbac:groups="",resources=services/finalizers,verbs=update
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups="",resources=serviceaccounts,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=roles;rolebindings,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups=k8s.cni.cncf.io,resources=network-attachment-definitions,verbs=get;list;watch
// +kubebuilder:rbac:groups=lbsvc.io,resources=ips,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups=policy,resources=poddisruptionbudgets,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// FieldOwner names the operator in managedFields and events.
const FieldOwner = "lbsvc-operator"

// indexServiceProvider: the attachment provider a served Service uses (maps NADs and Subnets to
// the Services they affect).
const indexServiceProvider = "lbsvc.io/provider"

// Options are the operator settings the reconcilers need (from cmd/operator's flags).
type Options struct {
	// EnableLBSvc is --enable-lb-svc; off, only deletions of Services we served complete.
	EnableLBSvc bool
	// LBSvcImage is the lb pod image.
	LBSvcImage string
	// DefaultAttachmentProvider, when set, serves LoadBalancer Services without the annotation.
	DefaultAttachmentProvider string
	// ForwardingSysctls selects the lb pod's forwarding sysctls.
	ForwardingSysctls ForwardingSysctls
	// LBPodNamespace, when set, is where every lb pod runs (empty: the Service's namespace).
	LBPodNamespace string
	// LBReplicas is --lb-replicas: lb pods per Service unless its lbsvc.io/replicas says
	// otherwise (0 means 1).
	LBReplicas int32
	// LBHAInterval is --lb-ha-interval: the standbys' advert interval (zero: the lb pod's 100 ms).
	LBHAInterval time.Duration
	// LBRules is --lb-rules: the lb pods' rules back end (empty: the lb pod's iptables).
	LBRules string
	// MaxConcurrentReconciles is the number of Services reconciled in parallel.
	MaxConcurrentReconciles int
	// SkipNameValidation lets tests run several managers in one process.
	SkipNameValidation bool
}

// ServiceReconciler gives each served LoadBalancer Service an address and its lb-svc objects,
// and takes both away when the Service stops being served. Each pass gathers its inputs once,
// calls DecideService (pure) and applies the plan.
type ServiceReconciler struct {
	Client client.Client
	// Reader reads from the API server directly, for the rare checks a cache cannot answer.
	Reader   client.Reader
	Recorder events.EventRecorder
	Book     *AddressBook
	Options  Options

	// own holds the versions Client wrote (Client records into it when Setup wrapped it); the
	// watches drop the events that only echo them.
	own *ownWrites
	// specs remembers which live Deployment specs match which desired ones: the cache holds
	// Deployments without their template (TrimForCache).
	specs *specDigests
}

// indexServiceUID: the Service UID label of our Deployments, ServiceAccounts and pods, so that a
// pass finds a Service's objects without scanning every object of the kind.
const indexServiceUID = "lbsvc.io/service-uid"

// SetupWithManager registers the field index and the controller.
func (r *ServiceReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &corev1.Service{}, indexServiceProvider, func(o client.Object) []string {
		if p, ok := ServiceProvider(o.(*corev1.Service), r.Options.DefaultAttachmentProvider); ok {
			return []string{p}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("index services by provider: %w", err)
	}
	for _, o := range []client.Object{&appsv1.Deployment{}, &corev1.ServiceAccount{}, &corev1.Pod{}} {
		if err := mgr.GetFieldIndexer().IndexField(context.Background(), o, indexServiceUID, func(o client.Object) []string {
			if uid := o.GetLabels()[lbv1.ServiceUIDLabel]; uid != "" {
				return []string{uid}
			}
			return nil
		}); err != nil {
			return fmt.Errorf("index %T by service UID: %w", o, err)
		}
	}
	if r.own == nil {
		r.own = newOwnWrites()
	}
	if r.own.wake == nil && r.Book != nil {
		// An event held back while our write was in flight, and not its echo, wakes the Service.
		r.own.wake = func(o client.Object) {
			if k, ok := serviceOf(o); ok {
				r.Book.wake(k)
			}
		}
	}
	if r.specs == nil {
		r.specs = newSpecDigests()
	}
	notOwn := builder.WithPredicates(r.own.notOwn())
	servicesOf := func(providerOf func(client.Object) string) handler.MapFunc {
		return func(ctx context.Context, o client.Object) []reconcile.Request {
			var list corev1.ServiceList
			if err := mgr.GetCache().List(ctx, &list, client.MatchingFields{indexServiceProvider: providerOf(o)}); err != nil {
				logf.FromContext(ctx).Error(err, "list services to wake")
				return nil
			}
			reqs := make([]reconcile.Request, 0, len(list.Items))
			for i := range list.Items {
				reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
			}
			// A Subnet change (deleted, overlap resolved, namespaces widened) may unblock any
			// waiting Service, whatever its provider.
			for _, k := range r.Book.Waiting() {
				reqs = append(reqs, reconcile.Request{NamespacedName: k})
			}
			return reqs
		}
	}
	nadProvider := func(o client.Object) string { return o.GetName() + "." + o.GetNamespace() }
	subnetProvider := func(o client.Object) string { return o.(*lbv1.Subnet).Spec.Provider }
	// Our per-Service objects (by their labels) and IP objects wake the Service they belong to.
	byService := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		if k, ok := serviceOf(o); ok {
			return []reconcile.Request{{NamespacedName: k}}
		}
		return nil
	})

	return ctrl.NewControllerManagedBy(mgr).
		Named("service").
		For(&corev1.Service{}, builder.WithPredicates(predicate.NewPredicateFuncs(r.interesting), r.own.notOwn())).
		Watches(&appsv1.Deployment{}, byService, notOwn).
		Watches(&corev1.ServiceAccount{}, byService, notOwn).
		Watches(&rbacv1.Role{}, byService, notOwn).
		Watches(&rbacv1.RoleBinding{}, byService, notOwn).
		Watches(&policyv1.PodDisruptionBudget{}, byService, notOwn).
		// The Service reads only which IP objects it owns and whether they drain: the IP
		// controller's status writes (holders) are nothing to it.
		Watches(&lbv1.IP{}, byService, builder.WithPredicates(r.own.notOwn(), deletionStarted())).
		Watches(&nadv1.NetworkAttachmentDefinition{}, handler.EnqueueRequestsFromMapFunc(servicesOf(nadProvider))).
		// Subnet status changes (counters) must not wake every Service of the Subnet: only its spec.
		Watches(&lbv1.Subnet{}, handler.EnqueueRequestsFromMapFunc(servicesOf(subnetProvider)),
			builder.WithPredicates(predicate.Or(predicate.GenerationChangedPredicate{}, deletionStarted(), deleted()))).
		WatchesRawSource(source.Channel(r.Book.Wake, &handler.EnqueueRequestForObject{})).
		WithOptions(controller.Options{
			MaxConcurrentReconciles: r.Options.MaxConcurrentReconciles,
			SkipNameValidation:      &r.Options.SkipNameValidation,
		}).
		Complete(r)
}

// serviceOf is the Service an object of ours belongs to: a Service itself, the owner of an IP
// object, or the Service named by the labels of a per-Service object.
func serviceOf(o client.Object) (types.NamespacedName, bool) {
	switch o := o.(type) {
	case *corev1.Service:
		return client.ObjectKeyFromObject(o), true
	case *lbv1.IP:
		return types.NamespacedName{Namespace: o.Spec.Service.Namespace, Name: o.Spec.Service.Name}, o.Spec.Service.Name != ""
	}
	l := o.GetLabels()
	if l[lbv1.ServiceNamespaceLabel] == "" || l[lbv1.ServiceLabel] == "" {
		return types.NamespacedName{}, false
	}
	return types.NamespacedName{Namespace: l[lbv1.ServiceNamespaceLabel], Name: l[lbv1.ServiceLabel]}, true
}

// deletionStarted passes updates that set a deletionTimestamp.
func deletionStarted() predicate.Funcs {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		return e.ObjectOld.GetDeletionTimestamp().IsZero() && !e.ObjectNew.GetDeletionTimestamp().IsZero()
	}}
}

// deleted passes deletions and creations (which GenerationChanged does not see as changes), and
// no update: an unset UpdateFunc would pass every update, so that each Subnet counter write woke
// every Service of the Subnet (1000 reconciles per write in make bench-operator).
func deleted() predicate.Funcs {
	return predicate.Funcs{
		DeleteFunc: func(event.DeleteEvent) bool { return true },
		CreateFunc: func(event.CreateEvent) bool { return true },
		UpdateFunc: func(event.UpdateEvent) bool { return false },
	}
}

// interesting filters out Services the operator has nothing to do with: the common case of a
// ClusterIP Service never reaches the queue.
func (r *ServiceReconciler) interesting(o client.Object) bool {
	svc, ok := o.(*corev1.Service)
	if !ok {
		return true
	}
	return svc.Spec.Type == corev1.ServiceTypeLoadBalancer || hasOurConditions(svc) || len(r.Book.OwnedBy(svc.UID)) > 0
}

// Reconcile implements reconcile.Reconciler. A write conflict (the cache had not seen our own
// previous write yet) is retried through the rate limiter without being logged as an error.
func (r *ServiceReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	err := r.reconcile(ctx, req)
	if apierrors.IsConflict(err) {
		return ctrl.Result{Requeue: true}, nil
	}
	if errors.Is(err, errServiceGone) {
		// The deletion's own event brings the pass that lets the Service go.
		return ctrl.Result{}, nil
	}
	if errors.Is(err, errStrayPods) {
		return ctrl.Result{RequeueAfter: drainRecheck}, nil
	}
	if err != nil {
		return ctrl.Result{}, err
	}
	svc := &corev1.Service{}
	if r.Client.Get(ctx, req.NamespacedName, svc) == nil {
		if c := meta.FindStatusCondition(svc.Status.Conditions, ConditionAddressAllocated); c != nil && c.Reason == ReasonObjectConflict {
			// An object in the way is not in our label-selected cache, so its removal sends no
			// event: look again now and then (one uncached read per conflicted Service).
			return ctrl.Result{RequeueAfter: conflictRecheck}, nil
		}
	}
	if r.Book.IsWaiting(req.NamespacedName) {
		// A released address or a Subnet change wakes the Service at once, also one that came
		// between its refused look and its registration as waiting (AddressBook.waitAfter). The
		// recheck is a backstop that costs a cache read (kill -9 churn once left a Service
		// refused SubnetExhausted for a whole 90 s settle; whether that gap was the cause is
		// not known).
		return ctrl.Result{RequeueAfter: waitingRecheck}, nil
	}
	return ctrl.Result{}, nil
}

// waitingRecheck is how often a Service waiting for an address (refused SubnetExhausted,
// AddressInUse, AddressDraining, ...) looks again without being woken: a pass that changes
// nothing reads the cache and writes nothing.
const waitingRecheck = 30 * time.Second

// conflictRecheck is how often a Service refused for an object in the way looks again.
const conflictRecheck = 10 * time.Second

func (r *ServiceReconciler) reconcile(ctx context.Context, req ctrl.Request) error {
	if err := r.Book.WaitReady(ctx); err != nil {
		return err
	}
	svc := &corev1.Service{}
	if err := r.Client.Get(ctx, req.NamespacedName, svc); err != nil {
		if apierrors.IsNotFound(err) {
			r.Book.SetWaiting(req.NamespacedName, false)
			return nil
		}
		return fmt.Errorf("get service %s: %w", req, err)
	}
	in, err := r.gather(ctx, svc)
	if err != nil {
		return err
	}
	plan := DecideService(in)
	return r.apply(ctx, svc, plan)
}

// gather reads everything DecideService needs, once.
func (r *ServiceReconciler) gather(ctx context.Context, svc *corev1.Service) (ServiceInputs, error) {
	in := ServiceInputs{
		Service: svc, EnableLBSvc: r.Options.EnableLBSvc, DefaultProvider: r.Options.DefaultAttachmentProvider,
		Owned: r.Book.OwnedBy(svc.UID),
	}
	provider, served := ServiceProvider(svc, r.Options.DefaultAttachmentProvider)
	if !served || !r.Options.EnableLBSvc || !svc.DeletionTimestamp.IsZero() {
		return in, nil
	}
	if name, ns, err := SplitProvider(provider); err == nil {
		var nad nadv1.NetworkAttachmentDefinition
		err := r.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &nad)
		if err != nil && !apierrors.IsNotFound(err) {
			return in, fmt.Errorf("get network attachment definition %s/%s: %w", ns, name, err)
		}
		in.NADFound = err == nil
	}
	var subnets lbv1.SubnetList
	if err := r.Client.List(ctx, &subnets); err != nil {
		return in, fmt.Errorf("list subnets: %w", err)
	}
	in.Subnets = subnets.Items
	if c := meta.FindStatusCondition(svc.Status.Conditions, ConditionAddressAllocated); c != nil && c.Reason == ReasonObjectConflict {
		// Only after a conflict was seen: is the foreign object still there? (uncached read)
		foreign, err := r.foreignObject(ctx, svc)
		if err != nil {
			return in, err
		}
		in.ForeignObject = foreign
	}
	return in, nil
}

// apply carries the plan out.
func (r *ServiceReconciler) apply(ctx context.Context, svc *corev1.Service, plan Plan) error {
	key := client.ObjectKeyFromObject(svc)
	switch plan.Action {
	case PlanNothing:
		r.Book.SetWaiting(key, false)
		return nil
	case PlanTeardown:
		r.Book.SetWaiting(key, plan.Refusal != nil)
		return r.teardown(ctx, svc, plan)
	}

	if plan.SubnetConfig.CIDRs != nil && plan.Refusal == nil {
		r.Book.EnsureSubnet(plan.SubnetConfig)
	}
	addrs := make([]netip.Addr, 0, len(plan.Keep)+len(plan.Claims))
	for _, k := range plan.Keep {
		addrs = append(addrs, k.Addr)
	}
	var claimed []netip.Addr
	for _, c := range plan.Claims {
		addr, ref, err := r.Book.Claim(ctx, plan.Subnet, c, IPOwnerOf(svc))
		if err != nil {
			return err
		}
		if ref != nil {
			allocations.WithLabelValues("refused", ref.Reason).Inc()
			// Refused: the Service gives up what it held and shows why (claims already made
			// drain with the rest: nothing half-served stays). Claim has marked it waiting.
			plan.Action, plan.Refusal = PlanTeardown, ref
			plan.Drain = bound(r.Book.OwnedBy(svc.UID))
			return r.teardown(ctx, svc, plan)
		}
		allocations.WithLabelValues("allocated", ReasonAllocated).Inc()
		claimed = append(claimed, addr)
	}
	addrs = SortAddrs(append(addrs, claimed...))
	r.Book.SetWaiting(key, plan.Refusal != nil)
	if len(addrs) == 0 {
		return r.teardown(ctx, svc, Plan{Action: PlanTeardown, Refusal: plan.Refusal, Drain: plan.Drain})
	}

	recorded := JoinAddrs(addrs)
	previous := svc.Annotations[lbv1.AllocatedIPsAnnotation]
	allocated := metav1.Condition{Type: ConditionAddressAllocated, Status: metav1.ConditionTrue, Reason: ReasonAllocated,
		Message: fmt.Sprintf("%s from subnet %s", recorded, plan.Subnet)}
	if plan.Refusal != nil {
		allocated.Reason, allocated.Message = plan.Refusal.Reason, BoundedMessage(plan.Refusal.Message)
		r.warnOnChange(svc, allocated)
	}
	// Our condition goes in before our finalizer: it is the proof (which a tenant cannot write)
	// that lets a later pass remove the finalizer, whenever the operator is killed.
	current := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: ObjectNameIn(r.Options.LBPodNamespace, svc.Namespace, svc.Name)}}
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: r.podNamespace(svc), Name: current.Name}, current); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	if err := r.patchStatus(ctx, svc, addrs, nil, []metav1.Condition{allocated, podCondition(current)}); err != nil {
		return err
	}
	if err := r.patchMeta(ctx, svc, func(s *corev1.Service) {
		controllerutil.AddFinalizer(s, lbv1.CleanupFinalizer)
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		s.Annotations[lbv1.AllocatedIPsAnnotation] = recorded
		s.Annotations[lbv1.AllocatedSubnetAnnotation] = plan.Subnet
	}); err != nil {
		return err
	}

	cidrs, gateways := FamilyParams(addrs, plan.SubnetConfig)
	params := LBPodParams{
		ServiceName: svc.Name, ServiceNamespace: svc.Namespace, ServiceUID: svc.UID, PodNamespace: r.Options.LBPodNamespace,
		Provider: plan.Provider, NADName: plan.NADName, NADNamespace: plan.NADNamespace, SubnetName: plan.Subnet,
		Addresses: addrs, CIDRs: cidrs, Gateways: gateways,
		Image: r.Options.LBSvcImage, Sysctls: r.Options.ForwardingSysctls, HAInterval: r.Options.LBHAInterval, Rules: r.Options.LBRules,
	}
	def := max(r.Options.LBReplicas, 1)
	params.Replicas = def
	if n, err := ParseReplicas(svc.Annotations, def); err != nil {
		// A typo must not take the Service down: it keeps the default, and says so.
		r.Recorder.Eventf(svc, nil, corev1.EventTypeWarning, ReasonInvalidReplicas, actionApply, "%s; using %d", BoundedMessage(err.Error()), def)
	} else {
		params.Replicas = n
	}
	// An lb pod of this Service left elsewhere (--lb-pod-namespace changed) holds the same address:
	// it goes first, and the new one comes only once its pods are gone.
	if moving, err := r.removeStray(ctx, svc); err != nil || moving {
		if err == nil {
			err = errStrayPods
		}
		return err
	}
	deploy, foreign, err := r.applyObjects(ctx, svc, params)
	if err != nil {
		if !errors.Is(err, errServiceGone) {
			r.Recorder.Eventf(svc, nil, corev1.EventTypeWarning, ReasonApplyFailed, actionApply, "%s", BoundedMessage(err.Error()))
		}
		return err
	}
	if foreign != "" {
		in := ServiceInputs{Service: svc, EnableLBSvc: true, Owned: r.Book.OwnedBy(svc.UID), ForeignObject: foreign,
			DefaultProvider: r.Options.DefaultAttachmentProvider}
		return r.apply(ctx, svc, DecideService(in))
	}
	for _, d := range plan.Drain {
		if err := r.Book.Drain(ctx, d); err != nil {
			return err
		}
	}
	switch {
	case previous == "" && len(claimed) > 0:
		r.Recorder.Eventf(svc, nil, corev1.EventTypeNormal, ReasonAllocated, actionAllocate, "allocated %s from subnet %q", recorded, plan.Subnet)
	case previous != recorded && previous != "":
		r.Recorder.Eventf(svc, nil, corev1.EventTypeNormal, ReasonAddressMoved, actionAllocate,
			"address moved from %s to %s (subnet %q); the old address drains until its lb pod is gone", BoundedMessage(previous), recorded, plan.Subnet)
	}

	return r.patchStatus(ctx, svc, addrs, nil, []metav1.Condition{allocated, podCondition(deploy)})
}

// warnOnChange sends the Warning Event of a refusal when the condition changes, so requeues and
// unrelated updates do not flood the Service's events.
func (r *ServiceReconciler) warnOnChange(svc *corev1.Service, cond metav1.Condition) {
	old := meta.FindStatusCondition(svc.Status.Conditions, cond.Type)
	if old == nil || old.Status != cond.Status || old.Reason != cond.Reason || old.Message != cond.Message {
		r.Recorder.Eventf(svc, nil, corev1.EventTypeWarning, cond.Reason, actionAllocate, "%s", cond.Message)
	}
}

// podCondition mirrors the Deployment's Available condition; it never waits for the pod.
func podCondition(d *appsv1.Deployment) metav1.Condition {
	c := metav1.Condition{Type: ConditionLBPodAvailable, Status: metav1.ConditionFalse, Reason: ReasonDeploymentPending,
		Message: "the lb-svc Deployment has not reported availability yet"}
	for _, dc := range d.Status.Conditions {
		if dc.Type != appsv1.DeploymentAvailable {
			continue
		}
		msg := BoundedMessage(fmt.Sprintf("deployment %s/%s: %s", d.Namespace, d.Name, dc.Message))
		if dc.Status == corev1.ConditionTrue {
			return metav1.Condition{Type: ConditionLBPodAvailable, Status: metav1.ConditionTrue, Reason: ReasonDeploymentAvailable, Message: msg}
		}
		return metav1.Condition{Type: ConditionLBPodAvailable, Status: metav1.ConditionFalse, Reason: ReasonDeploymentUnavailable, Message: msg}
	}
	return c
}

// teardown deletes our objects, drains every owned address and clears what we wrote. With a
// refusal the Service keeps our finalizer and shows the reason; without one it is let go.
func (r *ServiceReconciler) teardown(ctx context.Context, svc *corev1.Service, plan Plan) error {
	if err := r.deleteObjects(ctx, svc); err != nil {
		r.Recorder.Eventf(svc, nil, corev1.EventTypeWarning, ReasonCleanupFailed, actionCleanup, "%s", BoundedMessage(err.Error()))
		return err
	}
	owned := r.Book.OwnedBy(svc.UID)
	for _, d := range plan.Drain {
		if err := r.Book.Drain(ctx, d); err != nil {
			return err
		}
	}
	ours := map[string]bool{}
	for _, o := range owned {
		ours[o.Addr.String()] = true
	}
	recorded := svc.Annotations[lbv1.AllocatedIPsAnnotation]
	if err := r.patchMeta(ctx, svc, func(s *corev1.Service) {
		delete(s.Annotations, lbv1.AllocatedIPsAnnotation)
		delete(s.Annotations, lbv1.AllocatedSubnetAnnotation)
		if plan.RemoveFinalizer {
			controllerutil.RemoveFinalizer(s, lbv1.CleanupFinalizer)
		}
	}); err != nil {
		return client.IgnoreNotFound(err)
	}
	switch {
	case plan.Refusal != nil:
		cond := metav1.Condition{Type: ConditionAddressAllocated, Status: metav1.ConditionFalse, Reason: plan.Refusal.Reason,
			Message: BoundedMessage(plan.Refusal.Message)}
		r.warnOnChange(svc, cond)
		if err := r.patchStatus(ctx, svc, nil, ours, []metav1.Condition{cond}); err != nil {
			return err
		}
	case plan.Deleting:
		// The Service goes: its status goes with it.
	default:
		if err := r.patchStatus(ctx, svc, nil, ours, nil); err != nil {
			return err
		}
	}
	if len(owned) > 0 && plan.Refusal == nil {
		r.Recorder.Eventf(svc, nil, corev1.EventTypeNormal, ReasonCleanedUp, actionCleanup,
			"released %s: it drains until its lb pod is gone; the lb-svc objects are deleted", joinOwnedOr(owned, recorded))
	}
	return nil
}

func joinOwnedOr(owned []OwnedIP, recorded string) string {
	if len(owned) == 0 {
		return orDash(recorded)
	}
	return joinOwned(owned)
}

// patchMeta applies mutate to the Service's metadata and patches only when something changed.
func (r *ServiceReconciler) patchMeta(ctx context.Context, svc *corev1.Service, mutate func(*corev1.Service)) error {
	before := svc.DeepCopy()
	mutate(svc)
	if equalStringMaps(before.Annotations, svc.Annotations) && slices.Equal(before.Finalizers, svc.Finalizers) {
		return nil
	}
	if err := r.Client.Patch(ctx, svc, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{}), client.FieldOwner(FieldOwner)); err != nil {
		return fmt.Errorf("patch service %s/%s metadata: %w", svc.Namespace, svc.Name, err)
	}
	return nil
}

// patchStatus sets the ingress to addrs (or, with remove, only drops the entries of those
// addresses: what another controller wrote stays) and sets conds; with no conds our conditions
// are removed. It patches only on a difference.
func (r *ServiceReconciler) patchStatus(ctx context.Context, svc *corev1.Service, addrs []netip.Addr, remove map[string]bool, conds []metav1.Condition) error {
	before := svc.DeepCopy()
	if remove != nil {
		svc.Status.LoadBalancer.Ingress = slices.DeleteFunc(svc.Status.LoadBalancer.Ingress, func(i corev1.LoadBalancerIngress) bool {
			return i.Hostname == "" && remove[i.IP]
		})
		if len(svc.Status.LoadBalancer.Ingress) == 0 {
			svc.Status.LoadBalancer.Ingress = nil
		}
	} else {
		svc.Status.LoadBalancer.Ingress = ingressFor(addrs)
	}
	if conds == nil {
		meta.RemoveStatusCondition(&svc.Status.Conditions, ConditionAddressAllocated)
		meta.RemoveStatusCondition(&svc.Status.Conditions, ConditionLBPodAvailable)
	}
	for _, c := range conds {
		c.ObservedGeneration = svc.Generation
		meta.SetStatusCondition(&svc.Status.Conditions, c)
	}
	if remove != nil {
		// Let go or refused: there is no lb pod to report on.
		meta.RemoveStatusCondition(&svc.Status.Conditions, ConditionLBPodAvailable)
	}
	if statusEqual(before.Status, svc.Status) {
		return nil
	}
	if err := r.Client.Status().Patch(ctx, svc, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{}), client.FieldOwner(FieldOwner)); err != nil {
		return fmt.Errorf("patch service %s/%s status: %w", svc.Namespace, svc.Name, err)
	}
	return nil
}

// ingressFor lists the addresses as ingress points; ipMode stays unset (VIP) so that kube-proxy
// serves in-cluster clients directly.
func ingressFor(addrs []netip.Addr) []corev1.LoadBalancerIngress {
	if len(addrs) == 0 {
		return nil
	}
	out := make([]corev1.LoadBalancerIngress, len(addrs))
	for i, a := range addrs {
		out[i] = corev1.LoadBalancerIngress{IP: a.String()}
	}
	return out
}

func statusEqual(a, b corev1.ServiceStatus) bool {
	if len(a.LoadBalancer.Ingress) != len(b.LoadBalancer.Ingress) || len(a.Conditions) != len(b.Conditions) {
		return false
	}
	for i := range a.LoadBalancer.Ingress {
		x, y := a.LoadBalancer.Ingress[i], b.LoadBalancer.Ingress[i]
		if x.IP != y.IP || x.Hostname != y.Hostname || ipMode(x) != ipMode(y) || len(x.Ports) != len(y.Ports) {
			return false
		}
	}
	for i := range a.Conditions {
		x, y := a.Conditions[i], b.Conditions[i]
		if x.Type != y.Type || x.Status != y.Status || x.Reason != y.Reason || x.Message != y.Message ||
			x.ObservedGeneration != y.ObservedGeneration || !x.LastTransitionTime.Equal(&y.LastTransitionTime) {
			return false
		}
	}
	return true
}

// ipMode reads an ingress' ipMode with the API server's default (VIP) for unset, so that the
// defaulted value the server returns compares equal to the unset one we write.
func ipMode(i corev1.LoadBalancerIngress) corev1.LoadBalancerIPMode {
	if i.IPMode == nil {
		return corev1.LoadBalancerIPModeVIP
	}
	return *i.IPMode
}

func equalStringMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// errStrayPods requeues (with backoff) a Service whose lb pods still run where they no longer belong.
var errStrayPods = errors.New("waiting for the lb pods left in the previous lb pod namespace to be gone")

// removeStray deletes our Deployments and ServiceAccounts of svc that are not where they belong
// now, and tells whether pods of svc still run outside the lb pod namespace.
func (r *ServiceReconciler) removeStray(ctx context.Context, svc *corev1.Service) (bool, error) {
	mine := client.MatchingFields{indexServiceUID: string(svc.UID)}
	podNS, name := r.podNamespace(svc), ObjectNameIn(r.Options.LBPodNamespace, svc.Namespace, svc.Name)
	var deps appsv1.DeploymentList
	if err := r.Client.List(ctx, &deps, mine); err != nil {
		return false, err
	}
	var sas corev1.ServiceAccountList
	if err := r.Client.List(ctx, &sas, mine); err != nil {
		return false, err
	}
	var stray []client.Object
	for i := range deps.Items {
		if d := &deps.Items[i]; d.Namespace != podNS || d.Name != name {
			stray = append(stray, d)
		}
	}
	for i := range sas.Items {
		if sa := &sas.Items[i]; sa.Namespace != podNS || sa.Name != name {
			stray = append(stray, sa)
		}
	}
	for _, o := range stray {
		if !o.GetDeletionTimestamp().IsZero() {
			continue
		}
		if _, ok := o.(*appsv1.Deployment); ok && r.specs != nil {
			r.specs.forget(client.ObjectKeyFromObject(o))
		}
		if err := r.Client.Delete(ctx, o, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil && !apierrors.IsNotFound(err) {
			return false, fmt.Errorf("delete %s %s/%s left from a previous lb pod namespace: %w", kindOf(o), o.GetNamespace(), o.GetName(), err)
		}
	}
	var pods corev1.PodList
	if err := r.Client.List(ctx, &pods, mine); err != nil {
		return false, err
	}
	for i := range pods.Items {
		if pods.Items[i].Namespace != podNS {
			return true, nil
		}
	}
	return false, nil
}

// podNamespace is where a Service's lb pod runs.
func (r *ServiceReconciler) podNamespace(svc *corev1.Service) string {
	if r.Options.LBPodNamespace != "" {
		return r.Options.LBPodNamespace
	}
	return svc.Namespace
}

// perServiceObjects lists our objects of a Service, empty, at their names: the four every
// Service has, then the two only standbys need (budget and Lease).
func (r *ServiceReconciler) perServiceObjects(svc *corev1.Service) []client.Object {
	name := ObjectNameIn(r.Options.LBPodNamespace, svc.Namespace, svc.Name)
	podNS := r.podNamespace(svc)
	mk := func(o client.Object, ns string) client.Object {
		o.SetNamespace(ns)
		o.SetName(name)
		return o
	}
	return []client.Object{
		mk(&appsv1.Deployment{}, podNS), mk(&corev1.ServiceAccount{}, podNS),
		mk(&rbacv1.Role{}, svc.Namespace), mk(&rbacv1.RoleBinding{}, svc.Namespace),
		mk(&policyv1.PodDisruptionBudget{}, podNS), mk(&coordinationv1.Lease{}, svc.Namespace),
	}
}

// ownedBy tells whether obj was built by us for svc: the owner reference, the UID label or the
// UID annotation (any one survives a hand edit of the others).
func ownedBy(obj client.Object, svc *corev1.Service) bool {
	if metav1.IsControlledBy(obj, svc) {
		return true
	}
	uid := string(svc.UID)
	return obj.GetLabels()[lbv1.ServiceUIDLabel] == uid || obj.GetAnnotations()[ServiceUIDAnnotation] == uid
}

// foreignObject names an object at one of the Service's per-Service names that is not ours.
func (r *ServiceReconciler) foreignObject(ctx context.Context, svc *corev1.Service) (string, error) {
	for _, o := range r.perServiceObjects(svc) {
		err := r.Reader.Get(ctx, client.ObjectKeyFromObject(o), o)
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return "", fmt.Errorf("get %T %s/%s: %w", o, o.GetNamespace(), o.GetName(), err)
		}
		if !ownedBy(o, svc) {
			return fmt.Sprintf("%s %s/%s", kindOf(o), o.GetNamespace(), o.GetName()), nil
		}
	}
	return "", nil
}

func kindOf(o client.Object) string {
	switch o.(type) {
	case *appsv1.Deployment:
		return "Deployment"
	case *corev1.ServiceAccount:
		return "ServiceAccount"
	case *rbacv1.Role:
		return "Role"
	case *rbacv1.RoleBinding:
		return "RoleBinding"
	case *policyv1.PodDisruptionBudget:
		return "PodDisruptionBudget"
	case *coordinationv1.Lease:
		return "Lease"
	}
	return fmt.Sprintf("%T", o)
}

// applyObjects creates or server-side applies the ServiceAccount, Role, RoleBinding and
// Deployment. It returns the current Deployment, or the name of an object in the way that is
// not ours (left untouched).
func (r *ServiceReconciler) applyObjects(ctx context.Context, svc *corev1.Service, p LBPodParams) (*appsv1.Deployment, string, error) {
	sa, err := BuildServiceAccount(p)
	if err != nil {
		return nil, "", err
	}
	role, err := BuildRole(p)
	if err != nil {
		return nil, "", err
	}
	rb, err := BuildRoleBinding(p)
	if err != nil {
		return nil, "", err
	}
	deploy, err := BuildDeployment(p)
	if err != nil {
		return nil, "", err
	}
	cur := &appsv1.Deployment{}
	// Once per pass, whatever it answers: the objects of a stage call it in parallel.
	confirm := sync.OnceValue(func() error {
		live := &corev1.Service{}
		err := r.Reader.Get(ctx, client.ObjectKeyFromObject(svc), live)
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("get service %s/%s: %w", svc.Namespace, svc.Name, err)
		}
		if err != nil || live.UID != svc.UID || !live.DeletionTimestamp.IsZero() {
			return errServiceGone
		}
		return nil
	})
	// In stages, each stage's objects ensured in parallel: a Role or RoleBinding create by the
	// operator waits 107-145 ms in the API server for its escalation check (make bench-operator),
	// and one object after the other held the Service's worker for the sum. First the lb pods'
	// identity, their Role and (with standbys) the Lease they write; then the RoleBinding, which
	// the API server refuses (404) before its Role exists, beside the Deployment and (with
	// standbys) its budget: a pod starts long after the binding's create returns.
	lease, pdb := BuildLease(p), BuildPodDisruptionBudget(p)
	first := []ensureJob{{sa, &corev1.ServiceAccount{}}, {role, &rbacv1.Role{}}}
	if lease != nil {
		first = append(first, ensureJob{lease, &coordinationv1.Lease{}})
	}
	second := []ensureJob{{rb, &rbacv1.RoleBinding{}}, {deploy, cur}}
	if pdb != nil {
		second = append(second, ensureJob{pdb, &policyv1.PodDisruptionBudget{}})
	}
	for _, stage := range [][]ensureJob{first, second} {
		if foreign, err := r.ensureAll(ctx, svc, stage, confirm); err != nil || foreign != "" {
			return nil, foreign, err
		}
	}
	if p.replicas() == 1 {
		for _, o := range r.perServiceObjects(svc)[4:] {
			if err := r.deleteOwned(ctx, svc, o, false); err != nil {
				return nil, "", err
			}
		}
	}
	if cur.Name == "" {
		return deploy, "", nil
	}
	return cur, "", nil
}

// ensureJob is one object for ensure: what it should be, and where to read what it is.
type ensureJob struct{ desired, cur client.Object }

// ensureAll ensures the jobs in parallel. It returns the first object in the order of jobs that is
// not ours, else the first error in that order.
func (r *ServiceReconciler) ensureAll(ctx context.Context, svc *corev1.Service, jobs []ensureJob, confirm func() error) (string, error) {
	foreign := make([]string, len(jobs))
	errs := make([]error, len(jobs))
	var wg sync.WaitGroup
	for i, j := range jobs {
		wg.Go(func() { foreign[i], errs[i] = r.ensure(ctx, svc, j.desired, j.cur, confirm) })
	}
	wg.Wait()
	for _, f := range foreign {
		if f != "" {
			return f, nil
		}
	}
	for _, err := range errs {
		if err != nil {
			return "", err
		}
	}
	return "", nil
}

// errServiceGone: the API server no longer has the Service this pass read from the cache.
var errServiceGone = errors.New("the service is gone or being deleted")

// ensure creates desired, or server-side applies it (field manager lbsvc-operator, forced, so
// hand edits to the fields we own are reverted) when the current object differs from it. An
// object of that name that is not ours is left alone and its name returned. Before it creates
// anything, confirm must say that the Service still lives: a pass whose Service writes were all
// no-ops may have read a Service the cache still shows after its deletion, and a Deployment
// created then would never be deleted by us (no pass comes back for a gone Service) and would
// hold its address draining for ever where no garbage collector runs.
func (r *ServiceReconciler) ensure(ctx context.Context, svc *corev1.Service, desired, cur client.Object, confirm func() error) (string, error) {
	key := client.ObjectKeyFromObject(desired)
	what := fmt.Sprintf("%s %s/%s", kindOf(desired), key.Namespace, key.Name)
	err := r.Client.Get(ctx, key, cur)
	switch {
	case apierrors.IsNotFound(err):
		// Not in our (label-selected) cache: create it; if that name is taken, see by whom.
		if err := confirm(); err != nil {
			return "", err
		}
		create := desired.DeepCopyObject().(client.Object)
		err = r.Client.Create(ctx, create, client.FieldOwner(FieldOwner))
		if err == nil {
			r.rememberSpec(desired, create)
			return "", nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return "", fmt.Errorf("create %s: %w", what, err)
		}
		if err := r.Reader.Get(ctx, key, cur); err != nil {
			return "", fmt.Errorf("get %s: %w", what, err)
		}
		if !ownedBy(cur, svc) {
			return what, nil
		}
		if upToDate(desired, cur) {
			r.rememberSpec(desired, cur)
			return "", nil // ours, and our cache had not seen it yet
		}
	case err != nil:
		return "", fmt.Errorf("get %s: %w", what, err)
	case !ownedBy(cur, svc):
		return what, nil
	default:
		current, err := r.upToDate(ctx, desired, cur)
		if err != nil {
			return "", fmt.Errorf("%s: %w", what, err)
		}
		if current {
			return "", nil
		}
	}
	if err := r.dropRollingUpdate(ctx, desired, cur); err != nil {
		return "", fmt.Errorf("%s: %w", what, err)
	}
	if d, ok := desired.(*appsv1.Deployment); ok {
		if err := r.replaceForeignShape(ctx, d, cur); err != nil {
			return "", fmt.Errorf("%s: %w", what, err)
		}
	}
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(desired)
	if err != nil {
		return "", fmt.Errorf("%s: %w", what, err)
	}
	obj := &unstructured.Unstructured{Object: u}
	unstructured.RemoveNestedField(obj.Object, "status")
	unstructured.RemoveNestedField(obj.Object, "metadata", "creationTimestamp")
	if err := r.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(obj), client.FieldOwner(FieldOwner), client.ForceOwnership); err != nil {
		return "", fmt.Errorf("apply %s: %w", what, err)
	}
	return "", nil
}

// upToDate is upToDate for a cached object. A Deployment comes from the cache without its
// template: when its live spec is one already seen to match the desired spec, it is up to date;
// else it is read from the API server and compared in full (once per Deployment and change), and
// cur becomes that full object, so that what follows needs no second read.
func (r *ServiceReconciler) upToDate(ctx context.Context, desired, cur client.Object) (bool, error) {
	d, ok := desired.(*appsv1.Deployment)
	c, _ := cur.(*appsv1.Deployment)
	if !ok || c == nil || !templateTrimmed(c) {
		return upToDate(desired, cur), nil
	}
	rest := d.DeepCopy()
	rest.Spec.Template = corev1.PodTemplateSpec{}
	if !upToDate(rest, c) {
		return false, nil // metadata, owner, replicas, strategy or selector differ: no need to look further
	}
	key := client.ObjectKeyFromObject(c)
	if r.specs.matches(key, specDigest(&d.Spec), liveSpecDigest(c)) {
		return true, nil
	}
	full := &appsv1.Deployment{}
	if err := r.Reader.Get(ctx, key, full); err != nil {
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return false, fmt.Errorf("get: %w", err)
	}
	full.DeepCopyInto(c)
	if !upToDate(desired, c) {
		return false, nil
	}
	r.rememberSpec(desired, c)
	return true, nil
}

// rememberSpec notes, for a Deployment, that live (a full object from the API server: our
// create's answer or a read) matches desired, when it does.
func (r *ServiceReconciler) rememberSpec(desired, live client.Object) {
	d, ok := desired.(*appsv1.Deployment)
	l, _ := live.(*appsv1.Deployment)
	if !ok || l == nil || r.specs == nil || templateTrimmed(l) || !upToDate(d, l) {
		return
	}
	r.specs.remember(client.ObjectKeyFromObject(l), specDigest(&d.Spec), specDigest(&l.Spec))
}

// dropRollingUpdate clears strategy.rollingUpdate before a Deployment goes back to Recreate (its
// Service back to one lb pod): the API server refuses Recreate with rollingUpdate set, and a server-
// side apply that omits the field does not remove it when the object was created, not applied.
func (r *ServiceReconciler) dropRollingUpdate(ctx context.Context, desired, cur client.Object) error {
	d, ok := desired.(*appsv1.Deployment)
	if !ok || d.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
		return nil
	}
	c, ok := cur.(*appsv1.Deployment)
	if !ok || c.Name == "" || c.Spec.Strategy.RollingUpdate == nil {
		return nil
	}
	patch := []byte(`{"spec":{"strategy":{"type":"Recreate","rollingUpdate":null}}}`)
	if err := r.Client.Patch(ctx, c, client.RawPatch(types.MergePatchType, patch), client.FieldOwner(FieldOwner)); err != nil {
		return fmt.Errorf("clear rollingUpdate: %w", err)
	}
	return nil
}

// replaceForeignShape puts the desired pod template in place whole when the live one has
// something added that is not ours (see samePodShape: a capability, a variable, a container, a
// volume, host networking): server-side apply removes only the fields its manager owns, so an
// addition made by hand would survive every apply. A JSON patch replaces the template, after a
// test of the live resourceVersion (a conflict is retried by the next pass): the `patch` verb
// the operator has, no `update`. cur is the live Deployment when it was read in full already
// (upToDate's read, or the one after a create found the name taken); else it is read here.
func (r *ServiceReconciler) replaceForeignShape(ctx context.Context, desired *appsv1.Deployment, cur client.Object) error {
	live, _ := cur.(*appsv1.Deployment)
	if live == nil || live.ResourceVersion == "" || templateTrimmed(live) {
		live = &appsv1.Deployment{}
		if err := r.Reader.Get(ctx, client.ObjectKeyFromObject(desired), live); err != nil {
			return client.IgnoreNotFound(err)
		}
	}
	if samePodShape(&desired.Spec.Template.Spec, &live.Spec.Template.Spec) {
		return nil
	}
	patch, err := json.Marshal([]map[string]any{
		{"op": "test", "path": "/metadata/resourceVersion", "value": live.ResourceVersion},
		{"op": "replace", "path": "/spec/template", "value": desired.Spec.Template},
	})
	if err != nil {
		return err
	}
	if err := r.Client.Patch(ctx, live, client.RawPatch(types.JSONPatchType, patch), client.FieldOwner(FieldOwner)); err != nil {
		return fmt.Errorf("replace the pod template: %w", err)
	}
	return nil
}

// upToDate tells whether cur already has every field desired sets (server defaults aside).
func upToDate(desired, cur client.Object) bool {
	if !subset(desired.GetLabels(), cur.GetLabels()) || !subset(desired.GetAnnotations(), cur.GetAnnotations()) {
		return false
	}
	for _, ref := range desired.GetOwnerReferences() {
		if !slices.ContainsFunc(cur.GetOwnerReferences(), func(o metav1.OwnerReference) bool {
			return o.UID == ref.UID && ptrTrue(o.Controller)
		}) {
			return false
		}
	}
	switch d := desired.(type) {
	case *appsv1.Deployment:
		c := cur.(*appsv1.Deployment)
		return equality.Semantic.DeepDerivative(d.Spec, c.Spec) && samePodShape(&d.Spec.Template.Spec, &c.Spec.Template.Spec)
	case *rbacv1.Role:
		return equality.Semantic.DeepDerivative(d.Rules, cur.(*rbacv1.Role).Rules)
	case *rbacv1.RoleBinding:
		c := cur.(*rbacv1.RoleBinding)
		return equality.Semantic.DeepDerivative(d.RoleRef, c.RoleRef) && equality.Semantic.DeepDerivative(d.Subjects, c.Subjects)
	case *policyv1.PodDisruptionBudget:
		return equality.Semantic.DeepDerivative(d.Spec, cur.(*policyv1.PodDisruptionBudget).Spec)
	}
	return true
}

func ptrTrue(b *bool) bool { return b != nil && *b }

// samePodShape completes DeepDerivative for the lb pod's template. DeepDerivative lets the live
// object carry what the desired one leaves unset, so that the API server's defaults never look
// like drift; but it also passes a list with elements appended and a flag the desired object
// leaves false: an environment variable the operator no longer sets (--lb-rules or
// --lb-ha-interval set back to the default) stayed in the Deployment, and a capability, a
// container, a volume or host networking added by hand survived. The API server's defaulting
// appends to none of these lists and sets none of these flags, so they must match exactly in
// length and be off.
func samePodShape(want, have *corev1.PodSpec) bool {
	if len(want.Containers) != len(have.Containers) || len(want.InitContainers) != len(have.InitContainers) ||
		len(want.Volumes) != len(have.Volumes) || len(want.EphemeralContainers) != len(have.EphemeralContainers) ||
		have.HostNetwork || have.HostPID || have.HostIPC || (have.HostUsers != nil) != (want.HostUsers != nil) {
		return false
	}
	sameContainer := func(w, h *corev1.Container) bool {
		if len(w.Env) != len(h.Env) || len(w.EnvFrom) != len(h.EnvFrom) || len(w.Args) != len(h.Args) ||
			len(w.Command) != len(h.Command) || len(w.VolumeMounts) != len(h.VolumeMounts) ||
			len(w.VolumeDevices) != len(h.VolumeDevices) || len(w.Ports) != len(h.Ports) {
			return false
		}
		if w.SecurityContext != nil && w.SecurityContext.Capabilities != nil {
			hc := h.SecurityContext
			if hc == nil || hc.Capabilities == nil || len(hc.Capabilities.Add) != len(w.SecurityContext.Capabilities.Add) ||
				len(hc.Capabilities.Drop) != len(w.SecurityContext.Capabilities.Drop) {
				return false
			}
		}
		return true
	}
	sameContainers := func(want, have []corev1.Container) bool {
		for i := range want {
			if !sameContainer(&want[i], &have[i]) {
				return false
			}
		}
		return true
	}
	return sameContainers(want.Containers, have.Containers) && sameContainers(want.InitContainers, have.InitContainers)
}

func subset(want, have map[string]string) bool {
	for k, v := range want {
		if w, ok := have[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// deleteObjects deletes our per-Service objects (those that carry our owner reference, labels or
// annotation).
// Background propagation: the name is free at once for a Service created again, and the drain of
// the addresses waits for the ReplicaSets and pods the garbage collector removes after it.
func (r *ServiceReconciler) deleteObjects(ctx context.Context, svc *corev1.Service) error {
	for _, obj := range r.perServiceObjects(svc) {
		if err := r.deleteOwned(ctx, svc, obj, true); err != nil {
			return err
		}
	}
	return nil
}

// deleteOwned deletes obj (named, empty) if it is svc's. With askAPI, an object our cache does
// not show is looked up on the API server too: the cache may not show yet what the previous pass
// created a moment ago, and once the Service is let go no pass comes back for it (a Deployment
// missed here would ask for its address for ever: the drain waits for it).
func (r *ServiceReconciler) deleteOwned(ctx context.Context, svc *corev1.Service, obj client.Object, askAPI bool) error {
	err := r.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj)
	if apierrors.IsNotFound(err) && askAPI {
		err = r.Reader.Get(ctx, client.ObjectKeyFromObject(obj), obj)
	}
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("get %s %s/%s: %w", kindOf(obj), obj.GetNamespace(), obj.GetName(), err)
	}
	if !ownedBy(obj, svc) || !obj.GetDeletionTimestamp().IsZero() {
		return nil
	}
	if _, ok := obj.(*appsv1.Deployment); ok && r.specs != nil {
		r.specs.forget(client.ObjectKeyFromObject(obj))
	}
	if err := r.Client.Delete(ctx, obj, client.PropagationPolicy(metav1.DeletePropagationBackground),
		client.Preconditions{UID: ptrUID(obj.GetUID())}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete %s %s/%s: %w", kindOf(obj), obj.GetNamespace(), obj.GetName(), err)
	}
	return nil
}

func ptrUID(u types.UID) *types.UID { return &u }
