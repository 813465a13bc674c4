package controllers

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/lbsvc/lbsvc-operator/controllers/decide"
	"github.com/lbsvc/lbsvc-operator/controllers/ipam"
	"github.com/lbsvc/lbsvc-operator/controllers/lbobjects"

	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
)

// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=services/status,verbs=patch
// +kubebuilder:rbac:groups="",resources=services/finalizers,verbs=update
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups="",resources=serviceaccounts,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=rolebindings,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=clusterroles,verbs=bind,resourceNames=lbsvc-lbpod
// +kubebuilder:rbac:groups=k8s.cni.cncf.io,resources=network-attachment-definitions,verbs=get;list;watch
// +kubebuilder:rbac:groups=lbsvc.io,resources=ips,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups=policy,resources=poddisruptionbudgets,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch

// FieldOwner names the operator in managedFields and events.
const FieldOwner = "lbsvc-operator"

// indexServiceProvider: the attachment provider a served Service uses (maps NADs and Subnets to
// the Services they affect).
const indexServiceProvider = "lbsvc.io/provider"

// Options are the operator settings the reconcilers need (from cmd/operator's flags).
type Options struct {
	// EnableLBSvc is --enable-lb-svc; off, the reconciler still runs, but only to let the
	// deletion of Services we served complete (nothing else is created, changed or deleted).
	EnableLBSvc bool
	// LBSvcImage is the lb pod image.
	LBSvcImage string
	// DefaultAttachmentProvider, when set, serves LoadBalancer Services without the annotation.
	DefaultAttachmentProvider string
	// ForwardingSysctls selects the lb pod's forwarding sysctls.
	ForwardingSysctls lbobjects.ForwardingSysctls
	// LBPodNamespace, when set, is where every lb pod runs (empty: the Service's namespace).
	LBPodNamespace string
	// LBReplicas is --lb-replicas: lb pods per Service unless its lbsvc.io/replicas says
	// otherwise (0 means 1).
	LBReplicas int32
	// LBHAInterval is --lb-ha-interval: the standbys' advert interval (zero: the lb pod's 100 ms).
	LBHAInterval time.Duration
	// LBRules is --lb-rules: the lb pods' rules back end (empty: the lb pod's default, nftables
	// with a fallback to iptables where nf_tables is missing).
	LBRules string
	// LBConflictProbe is --lb-conflict-probe: the lb pods' conflict probe timing (empty: the lb
	// pod's default, fast).
	LBConflictProbe string
	// MaxConcurrentReconciles is the number of Services reconciled in parallel.
	MaxConcurrentReconciles int
	// SkipNameValidation lets tests run several managers in one process.
	SkipNameValidation bool
}

// ServiceReconciler gives each served LoadBalancer Service an address and its lb-svc objects,
// and takes both away when the Service stops being served. Each pass (reconcile) gathers its
// inputs once, calls decide.DecideService (pure) and carries the plan out; the writes to the
// Service are in service_status.go, those to its objects in ensure.go.
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
	// haKeys remembers the election key Secrets created (ensureHAKey).
	haKeys *haKeys
}

// indexServiceUID: the Service UID label of our Deployments, ServiceAccounts and pods, so that a
// pass finds a Service's objects without scanning every object of the kind.
const indexServiceUID = "lbsvc.io/service-uid"

// SetupWithManager registers the field index and the controller.
func (r *ServiceReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &corev1.Service{}, indexServiceProvider, func(o client.Object) []string {
		if p, ok := decide.ServiceProvider(o.(*corev1.Service), r.Options.DefaultAttachmentProvider); ok {
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
	if r.haKeys == nil {
		r.haKeys = newHAKeys()
	}
	notOwn := builder.WithPredicates(r.own.notOwn())
	servicesOf := func(providerOf func(client.Object) string) handler.MapFunc {
		return func(ctx context.Context, o client.Object) []reconcile.Request {
			reqs, err := servicesWithProvider(ctx, mgr.GetCache(), providerOf(o), nil)
			if err != nil {
				logf.FromContext(ctx).Error(err, "list services to wake")
				return nil
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
	// Those of a shared address wake its members.
	byService := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		var reqs []reconcile.Request
		for _, k := range r.servicesOf(o) {
			reqs = append(reqs, reconcile.Request{NamespacedName: k})
		}
		return reqs
	})

	return ctrl.NewControllerManagedBy(mgr).
		Named("service").
		For(&corev1.Service{}, builder.WithPredicates(predicate.NewPredicateFuncs(r.interesting), r.own.notOwn())).
		Watches(&appsv1.Deployment{}, byService, notOwn).
		Watches(&corev1.ServiceAccount{}, byService, notOwn).
		Watches(&rbacv1.RoleBinding{}, byService, notOwn).
		Watches(&policyv1.PodDisruptionBudget{}, byService, notOwn).
		// The Service reads only which IP objects it owns, whether they drain and whether they
		// are in use on the underlay: the IP controller's other status writes (holders) are
		// nothing to it.
		Watches(&lbv1.IP{}, byService, builder.WithPredicates(r.own.notOwn(), predicate.Or(deletionStarted(), becameConflict()))).
		Watches(&nadv1.NetworkAttachmentDefinition{}, handler.EnqueueRequestsFromMapFunc(servicesOf(nadProvider))).
		// Subnet status changes (counters) must not wake every Service of the Subnet: only its spec.
		Watches(&lbv1.Subnet{}, handler.EnqueueRequestsFromMapFunc(servicesOf(subnetProvider)),
			builder.WithPredicates(predicate.Or(predicate.GenerationChangedPredicate{}, deletionStarted(), deleted()))).
		// A node that comes, goes or changes its labels, cordon, taints or readiness may be where
		// the lb pods of a Subnet with a nodeSelector can (no longer) run.
		Watches(&corev1.Node{}, r.nodeHandler(mgr)).
		WatchesRawSource(source.Channel(r.Book.Wake, &handler.EnqueueRequestForObject{})).
		WithOptions(controller.Options{
			MaxConcurrentReconciles: r.Options.MaxConcurrentReconciles,
			SkipNameValidation:      &r.Options.SkipNameValidation,
		}).
		Complete(r)
}

// servicesWithProvider appends to reqs the Services (from the cache c) served through provider.
func servicesWithProvider(ctx context.Context, c client.Reader, provider string, reqs []reconcile.Request) ([]reconcile.Request, error) {
	var list corev1.ServiceList
	if err := c.List(ctx, &list, client.MatchingFields{indexServiceProvider: provider}, client.UnsafeDisableDeepCopy); err != nil {
		return reqs, err
	}
	for i := range list.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
	}
	return reqs, nil
}

// servicesOf are the Services an object of ours belongs to: serviceOf's, or the members of the
// shared address an IP object or lb object is of (an lb object only as far as it is provably the
// address's: decide.MembersToWake).
func (r *ServiceReconciler) servicesOf(o client.Object) []types.NamespacedName {
	var members []lbv1.IPMember
	switch ip, ok := o.(*lbv1.IP); {
	case ok && ip.Spec.SharingKey != "":
		members = ip.Spec.Members
	case !ok && o.GetLabels()[lbv1.SharedIPLabel] != "":
		owner, all := r.Book.Shared(o.GetLabels()[lbv1.SharedIPLabel])
		members = decide.MembersToWake(o, owner, all, r.Options.LBPodNamespace)
	case !ok && lbobjects.IsIdentity(o):
		return r.servicesUsing(o.GetLabels()[lbv1.ServiceNamespaceLabel])
	default:
		if k, ok := serviceOf(o); ok {
			return []types.NamespacedName{k}
		}
		return nil
	}
	return memberKeys(members)
}

// memberKeys are the Services of a shared address's members.
func memberKeys(members []lbv1.IPMember) []types.NamespacedName {
	out := make([]types.NamespacedName, len(members))
	for i, m := range members {
		out[i] = types.NamespacedName{Namespace: m.Namespace, Name: m.Name}
	}
	return out
}

// servicesUsing lists the Services of namespace whose lb pods run under the namespace's shared
// identity (their Deployments, as cached): the passes that put it back when it is deleted or
// edited.
func (r *ServiceReconciler) servicesUsing(namespace string) []types.NamespacedName {
	var deps appsv1.DeploymentList
	if err := r.Client.List(context.Background(), &deps, client.InNamespace(lbobjects.PodNamespace(r.Options.LBPodNamespace, namespace)),
		client.MatchingLabels{lbv1.ServiceNamespaceLabel: namespace}); err != nil {
		return nil
	}
	var out []types.NamespacedName
	for i := range deps.Items {
		if d := &deps.Items[i]; d.Labels[lbv1.SharedIPLabel] == "" {
			if k, ok := serviceOf(d); ok {
				out = append(out, k)
			}
		}
	}
	return out
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

// becameConflict passes updates that put an IP object in phase Conflict.
func becameConflict() predicate.Funcs {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		o, ok1 := e.ObjectOld.(*lbv1.IP)
		n, ok2 := e.ObjectNew.(*lbv1.IP)
		return ok1 && ok2 && o.Status.Phase != lbv1.IPConflict && n.Status.Phase == lbv1.IPConflict
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
	return svc.Spec.Type == corev1.ServiceTypeLoadBalancer || decide.HasOurConditions(svc) || len(r.Book.OwnedBy(svc.UID)) > 0
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
		if c := meta.FindStatusCondition(svc.Status.Conditions, decide.ConditionAddressAllocated); c != nil && c.Reason == decide.ReasonObjectConflict {
			// An object in the way is not in our label-selected cache, so its removal sends no
			// event: look again now and then (one uncached read per conflicted Service).
			return ctrl.Result{RequeueAfter: conflictRecheck}, nil
		}
	}
	if r.Book.IsWaiting(req.NamespacedName) {
		// A released address or a Subnet change wakes the Service at once, also one that came
		// between its refused look and its registration as waiting (AddressBook.waitAfter). The
		// recheck is a backstop against any wake-up still lost; it costs a cache read.
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

// reconcile is one pass over a Service, in a straight line: gather its inputs, decide the whole
// plan (pure), claim the addresses the plan asks for, write the Service's status and metadata,
// ensure its objects, drain what it let go of, report. A refusal met on the way (a claim
// refused, an object in the way) turns the plan into a teardown (decide.Refuse).
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
	plan := decide.DecideService(in)
	switch plan.Action {
	case decide.PlanNothing:
		r.Book.SetWaiting(req.NamespacedName, false)
		return nil
	case decide.PlanTeardown:
		return r.teardown(ctx, svc, plan)
	}

	addrs, claimed, refused, err := r.claim(ctx, svc, plan)
	if err != nil {
		return err
	}
	if refused != nil {
		// Claim has marked the Service waiting.
		return r.teardown(ctx, svc, decide.Refuse(refused, r.Book.OwnedBy(svc.UID)))
	}
	if len(addrs) == 0 {
		return r.teardown(ctx, svc, decide.Plan{Action: decide.PlanTeardown, Refusal: plan.Refusal, Drain: plan.Drain})
	}
	if refused, err := r.rejoin(ctx, plan); err != nil {
		return err
	} else if refused != nil {
		return r.teardown(ctx, svc, decide.Refuse(refused, r.Book.OwnedBy(svc.UID)))
	}
	var objects lbobjects.Set
	var shared []lbobjects.Set
	switch {
	case plan.HoldObjects:
	case plan.Share != nil:
		if shared, err = plan.SharedObjects(addrs, r.Book.OwnedBy(svc.UID)); err != nil {
			return err
		}
	default:
		if objects, err = plan.Objects(addrs, r.Book.OwnedBy(svc.UID)); err != nil {
			return err
		}
	}
	previous := decide.IngressAddrs(svc) // what the last pass recorded; not the tenant-editable mirror
	confirmed, err := r.recordServed(ctx, svc, plan, addrs)
	if err != nil {
		return err
	}
	var deploy *appsv1.Deployment
	if plan.HoldObjects {
		// The Subnet is not Ready: the objects stay as they are.
		if deploy, err = r.currentDeployment(ctx, svc, plan, addrs); err != nil {
			return err
		}
	} else {
		var foreign string
		if plan.Share != nil {
			deploy, foreign, err = r.ensureShared(ctx, svc, shared, confirmed)
		} else {
			deploy, foreign, err = r.ensureObjects(ctx, svc, objects, confirmed)
		}
		if err != nil {
			if !errors.Is(err, errServiceGone) && !errors.Is(err, errStrayPods) {
				r.Recorder.Eventf(svc, nil, corev1.EventTypeWarning, decide.ReasonApplyFailed, actionApply, "%s", decide.BoundedMessage(err.Error()))
			}
			return err
		}
		if foreign != "" {
			return r.teardown(ctx, svc, decide.Refuse(decide.ObjectConflict(foreign), r.Book.OwnedBy(svc.UID)))
		}
	}
	for _, d := range plan.Drain {
		if slices.Contains(addrs, d.Addr) {
			// Claimed again in this pass: a member whose ports clashed with a member that has
			// left since joins the same shared address again; its leave would undo that join.
			continue
		}
		if err := r.Book.Drain(ctx, d); err != nil {
			return err
		}
	}
	return r.reportServed(ctx, svc, plan, addrs, previous, len(claimed) > 0, deploy)
}

// claim holds the plan's addresses: the kept ones, and each claim made through the address book
// (the API server decides between claimants). It returns every address, IPv4 first, the claimed
// ones, or the refusal of a claim.
func (r *ServiceReconciler) claim(ctx context.Context, svc *corev1.Service, plan decide.Plan) (addrs, claimed []netip.Addr, refused *decide.Refusal, err error) {
	if plan.SubnetConfig.CIDRs != nil && plan.Refusal == nil {
		r.Book.EnsureSubnet(plan.SubnetConfig)
	}
	for _, k := range plan.Keep {
		addrs = append(addrs, k.Addr)
	}
	for _, c := range plan.Claims {
		addr, ref, err := r.Book.Claim(ctx, plan.Subnet, c, decide.IPOwnerOf(svc))
		if err != nil {
			return nil, nil, nil, err
		}
		if ref != nil {
			allocations.WithLabelValues("refused", ref.Reason).Inc()
			return nil, nil, ref, nil
		}
		allocations.WithLabelValues("allocated", decide.ReasonAllocated).Inc()
		claimed = append(claimed, addr)
	}
	r.Book.SetWaiting(client.ObjectKeyFromObject(svc), plan.Refusal != nil)
	return ipam.SortIPv4First(append(addrs, claimed...)), claimed, nil, nil
}

// rejoin brings the member records of the kept shared addresses up to date (plan.Rejoin), or
// returns why one may not be (a port now served by another member).
func (r *ServiceReconciler) rejoin(ctx context.Context, plan decide.Plan) (*decide.Refusal, error) {
	for _, o := range plan.Rejoin {
		joined, ref, err := r.Book.Join(ctx, o.Name, decide.Claim{Share: plan.Share, CrossNamespace: r.Options.LBPodNamespace != ""})
		switch {
		case err != nil:
			return nil, err
		case ref != nil:
			return ref, nil
		case !joined:
			return nil, fmt.Errorf("shared address %s is gone: looking again", o.Addr)
		}
	}
	return nil, nil
}

// teardown deletes our objects, drains every owned address and clears what we wrote. With a
// refusal the Service keeps our finalizer and shows the reason; without one it is let go.
func (r *ServiceReconciler) teardown(ctx context.Context, svc *corev1.Service, plan decide.Plan) error {
	r.Book.SetWaiting(client.ObjectKeyFromObject(svc), plan.Refusal != nil)
	r.haKeys.forget(svc.UID)
	// Objects left in a previous lb pod namespace first: there they have no owner reference, so
	// only we can delete them (their pods are then waited for by the drain, as any holder).
	if _, err := r.removeStray(ctx, svc); err != nil {
		r.Recorder.Eventf(svc, nil, corev1.EventTypeWarning, decide.ReasonCleanupFailed, actionCleanup, "%s", decide.BoundedMessage(err.Error()))
		return err
	}
	if err := r.deleteObjects(ctx, svc, true); err != nil {
		r.Recorder.Eventf(svc, nil, corev1.EventTypeWarning, decide.ReasonCleanupFailed, actionCleanup, "%s", decide.BoundedMessage(err.Error()))
		return err
	}
	owned := r.Book.OwnedBy(svc.UID)
	for _, d := range plan.Drain {
		if err := r.Book.Drain(ctx, d); err != nil {
			return err
		}
	}
	return r.recordTeardown(ctx, svc, plan, owned)
}

// cachedDeployment is the Service's lb Deployment as the cache has it (ours only: the cache holds
// Deployments with our component label), nil when there is none.
func (r *ServiceReconciler) cachedDeployment(ctx context.Context, svc *corev1.Service) (*appsv1.Deployment, error) {
	deploy := &appsv1.Deployment{}
	key := types.NamespacedName{Namespace: lbobjects.PodNamespace(r.Options.LBPodNamespace, svc.Namespace),
		Name: lbobjects.ObjectNameIn(r.Options.LBPodNamespace, svc.Namespace, svc.Name)}
	switch err := r.Client.Get(ctx, key, deploy); {
	case err == nil:
		return deploy, nil
	case apierrors.IsNotFound(err):
		return nil, nil
	default:
		return nil, fmt.Errorf("get deployment %s: %w", key, err)
	}
}

// gather reads everything DecideService needs, once.
func (r *ServiceReconciler) gather(ctx context.Context, svc *corev1.Service) (decide.ServiceInputs, error) {
	in := decide.ServiceInputs{
		Service: svc, EnableLBSvc: r.Options.EnableLBSvc, DefaultProvider: r.Options.DefaultAttachmentProvider,
		Owned: r.Book.OwnedBy(svc.UID),
		LBPod: lbobjects.Params{PodNamespace: r.Options.LBPodNamespace, Image: r.Options.LBSvcImage, Sysctls: r.Options.ForwardingSysctls,
			Replicas: r.Options.LBReplicas, HAInterval: r.Options.LBHAInterval, Rules: r.Options.LBRules,
			ConflictProbe: r.Options.LBConflictProbe},
	}
	provider, served := decide.ServiceProvider(svc, r.Options.DefaultAttachmentProvider)
	if !served || !r.Options.EnableLBSvc || !svc.DeletionTimestamp.IsZero() {
		if r.Options.EnableLBSvc {
			// An lb Deployment of ours left behind after the Service was let go (a late write
			// of a killed operator) is torn down too: a cache read, nothing from the API.
			deploy, err := r.cachedDeployment(ctx, svc)
			if err != nil {
				return in, err
			}
			in.LBDeployment = deploy
		}
		return in, nil
	}
	if name, ns, err := decide.SplitProvider(provider); err == nil {
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
	if slices.ContainsFunc(in.Subnets, func(s lbv1.Subnet) bool { return s.Spec.Provider == provider && decide.HasNodeSelector(&s) }) {
		// Where its lb pods may run. Read-only: no copy of every Node on each pass.
		var nodes corev1.NodeList
		if err := r.Client.List(ctx, &nodes, client.UnsafeDisableDeepCopy); err != nil {
			return in, fmt.Errorf("list nodes: %w", err)
		}
		in.Nodes = nodes.Items
	}
	// Its lb Deployment and pods, for LegacyPeers (from the cache: metadata and labels only).
	deploy, err := r.cachedDeployment(ctx, svc)
	if err != nil {
		return in, err
	}
	in.LBDeployment = deploy
	var pods corev1.PodList
	if err := r.Client.List(ctx, &pods, client.MatchingFields{indexServiceUID: string(svc.UID)}); err != nil {
		return in, fmt.Errorf("list lb pods: %w", err)
	}
	// Not those of a shared address the Service happens to own (they carry its UID).
	in.LBPods = slices.DeleteFunc(pods.Items, func(p corev1.Pod) bool { return p.Labels[lbv1.SharedIPLabel] != "" })
	if c := meta.FindStatusCondition(svc.Status.Conditions, decide.ConditionAddressAllocated); c != nil && c.Reason == decide.ReasonObjectConflict {
		// Only after a conflict was seen: is the foreign object still there? (uncached read)
		foreign, err := r.foreignObject(ctx, svc)
		if err != nil {
			return in, err
		}
		in.ForeignObject = foreign
	}
	return in, nil
}
