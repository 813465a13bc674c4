package controllers

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
	"github.com/lbsvc/lbsvc-operator/controllers/ipam"
)

// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups="",resources=services/status,verbs=update;patch
// +kubebuilder:rbac:groups="",resources=services/finalizers,verbs=update
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=serviceaccounts,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=roles;rolebindings,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=k8s.cni.cncf.io,resources=network-attachment-definitions,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// FieldOwner names the operator in managedFields and events.
const FieldOwner = "lbsvc-operator"

// Field indexes on cached Services.
const (
	// indexServiceProvider: the attachment provider a served Service uses (maps NADs and Subnets
	// to the Services they affect).
	indexServiceProvider = "lbsvc.io/provider"
	// indexServiceSubnet: the Subnet a Service's recorded allocation comes from.
	indexServiceSubnet = "lbsvc.io/recorded-subnet"
)

// Options are the operator settings the reconcilers need (from cmd/operator's flags).
type Options struct {
	// LBSvcImage is the lb pod image.
	LBSvcImage string
	// DefaultAttachmentProvider, when set, serves LoadBalancer Services without the annotation.
	DefaultAttachmentProvider string
	// ForwardingSysctls selects the lb pod's forwarding sysctls.
	ForwardingSysctls ForwardingSysctls
	// MaxConcurrentReconciles is the number of Services reconciled in parallel.
	MaxConcurrentReconciles int
	// SkipNameValidation lets tests run several managers in one process.
	SkipNameValidation bool
}

// ServiceReconciler gives each served LoadBalancer Service an address and its lb-svc objects,
// and takes both away when the Service stops being served.
type ServiceReconciler struct {
	Client   client.Client
	Recorder events.EventRecorder
	Book     *AddressBook
	Options  Options
}

// SetupWithManager registers the field indexes and the controller.
func (r *ServiceReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if err := indexServices(mgr, r.Options.DefaultAttachmentProvider); err != nil {
		return err
	}
	servicesFor := func(field string, value func(client.Object) string) handler.MapFunc {
		return func(ctx context.Context, o client.Object) []reconcile.Request {
			var list corev1.ServiceList
			if err := mgr.GetCache().List(ctx, &list, client.MatchingFields{field: value(o)}); err != nil {
				logf.FromContext(ctx).Error(err, "list services to wake", "field", field)
				return nil
			}
			reqs := make([]reconcile.Request, 0, len(list.Items))
			for i := range list.Items {
				reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
			}
			return reqs
		}
	}
	nadProvider := func(o client.Object) string { return o.GetName() + "." + o.GetNamespace() }
	subnetProvider := func(o client.Object) string { return o.(*lbv1.Subnet).Spec.Provider }

	return ctrl.NewControllerManagedBy(mgr).
		Named("service").
		For(&corev1.Service{}, builder.WithPredicates(predicate.NewPredicateFuncs(r.interesting))).
		Owns(&appsv1.Deployment{}).
		Owns(&corev1.ServiceAccount{}).
		Owns(&rbacv1.Role{}).
		Owns(&rbacv1.RoleBinding{}).
		Watches(&nadv1.NetworkAttachmentDefinition{}, handler.EnqueueRequestsFromMapFunc(servicesFor(indexServiceProvider, nadProvider))).
		// Subnet status changes (counters) must not wake every Service of the Subnet: only its spec.
		Watches(&lbv1.Subnet{}, handler.EnqueueRequestsFromMapFunc(servicesFor(indexServiceProvider, subnetProvider)),
			builder.WithPredicates(predicate.Or(predicate.GenerationChangedPredicate{}, deletionStarted()))).
		WatchesRawSource(source.Channel(r.Book.Wake, &handler.EnqueueRequestForObject{})).
		WithOptions(controller.Options{
			MaxConcurrentReconciles: r.Options.MaxConcurrentReconciles,
			SkipNameValidation:      &r.Options.SkipNameValidation,
		}).
		Complete(r)
}

// deletionStarted passes updates that set a deletionTimestamp.
func deletionStarted() predicate.Funcs {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		return e.ObjectOld.GetDeletionTimestamp().IsZero() && !e.ObjectNew.GetDeletionTimestamp().IsZero()
	}}
}

// indexServices registers the Service indexes both reconcilers use (once per manager).
func indexServices(mgr ctrl.Manager, defaultProvider string) error {
	ctx := context.Background()
	if err := mgr.GetFieldIndexer().IndexField(ctx, &corev1.Service{}, indexServiceProvider, func(o client.Object) []string {
		if p, ok := ServiceProvider(o.(*corev1.Service), defaultProvider); ok {
			return []string{p}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("index services by provider: %w", err)
	}
	return nil
}

// indexServicesBySubnet registers the recorded-subnet index (used by both reconcilers).
func indexServicesBySubnet(mgr ctrl.Manager) error {
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &corev1.Service{}, indexServiceSubnet, func(o client.Object) []string {
		if s := o.GetAnnotations()[lbv1.AllocatedSubnetAnnotation]; s != "" {
			return []string{s}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("index services by recorded subnet: %w", err)
	}
	return nil
}

// interesting filters out Services the operator has nothing to do with: the common case of a
// ClusterIP Service never reaches the queue.
func (r *ServiceReconciler) interesting(o client.Object) bool {
	svc, ok := o.(*corev1.Service)
	if !ok {
		return true
	}
	return svc.Spec.Type == corev1.ServiceTypeLoadBalancer || hasOurTraces(svc)
}

// hasOurTraces tells whether the operator has touched the Service (and so must clean it up).
func hasOurTraces(svc *corev1.Service) bool {
	if controllerutil.ContainsFinalizer(svc, lbv1.CleanupFinalizer) {
		return true
	}
	if _, ok := svc.Annotations[lbv1.AllocatedIPsAnnotation]; ok {
		return true
	}
	_, ok := svc.Annotations[lbv1.AllocatedSubnetAnnotation]
	return ok
}

// Reconcile implements reconcile.Reconciler. A write conflict (the cache had not seen our own
// previous write yet) is retried through the rate limiter without being logged as an error.
func (r *ServiceReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	res, err := r.reconcile(ctx, req)
	if apierrors.IsConflict(err) {
		return ctrl.Result{Requeue: true}, nil
	}
	return res, err
}

func (r *ServiceReconciler) reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	if err := r.Book.WaitReady(ctx); err != nil {
		return ctrl.Result{}, err
	}
	svc := &corev1.Service{}
	if err := r.Client.Get(ctx, req.NamespacedName, svc); err != nil {
		if apierrors.IsNotFound(err) {
			// Gone without our finalizer (never served, or already cleaned): make sure nothing is held.
			r.Book.Release(req.Namespace + "/" + req.Name)
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, fmt.Errorf("get service %s: %w", req, err)
	}
	provider, served := ServiceProvider(svc, r.Options.DefaultAttachmentProvider)
	if !served || !svc.DeletionTimestamp.IsZero() {
		if !hasOurTraces(svc) && !hasOurStatus(svc) {
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, r.cleanup(ctx, svc)
	}
	return r.serve(ctx, svc, provider)
}

// serve resolves the NAD and Subnet, allocates, records, applies the lb-svc objects and reports.
func (r *ServiceReconciler) serve(ctx context.Context, svc *corev1.Service, provider string) (ctrl.Result, error) {
	owner := OwnerKey(svc)
	if msg, ok := r.Book.TakeConflict(owner); ok {
		r.Recorder.Eventf(svc, nil, corev1.EventTypeWarning, ReasonAddressConflict, actionAllocate, "%s; reallocating", msg)
	}

	nadName, nadNS, refusal := r.resolve(ctx, svc, provider)
	var subnet *lbv1.Subnet
	if refusal == nil {
		subnet, refusal = r.chooseSubnet(ctx, svc, provider)
	}
	var addrs []netip.Addr
	var cfgErr error
	if refusal == nil {
		cfg, err := r.subnetConfig(ctx, subnet)
		if err != nil {
			refusal, cfgErr = asRefusal(err)
		} else {
			requested, err := RequestedAddrs(svc)
			if err == nil {
				addrs, err = r.Book.Allocate(subnet.Name, owner, requested)
				if err != nil {
					err = AllocationRefusal(err)
				}
			}
			if err != nil {
				refusal, cfgErr = asRefusal(err)
			} else {
				return r.apply(ctx, svc, provider, nadName, nadNS, subnet.Name, SortAddrs(addrs), cfg)
			}
		}
	}
	if cfgErr != nil {
		return ctrl.Result{}, cfgErr
	}
	return ctrl.Result{}, r.refuse(ctx, svc, refusal)
}

func asRefusal(err error) (*Refusal, error) {
	var ref *Refusal
	if errors.As(err, &ref) {
		return ref, nil
	}
	return nil, err
}

// resolve checks the provider names an existing NetworkAttachmentDefinition.
func (r *ServiceReconciler) resolve(ctx context.Context, svc *corev1.Service, provider string) (name, ns string, ref *Refusal) {
	name, ns, err := SplitProvider(provider)
	if err != nil {
		ref, _ = asRefusal(err)
		return "", "", ref
	}
	var nad nadv1.NetworkAttachmentDefinition
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &nad); err != nil {
		return "", "", &Refusal{ReasonNADNotFound, fmt.Sprintf("network attachment definition %s/%s (provider %q): %v", ns, name, provider, err)}
	}
	return name, ns, nil
}

func (r *ServiceReconciler) chooseSubnet(ctx context.Context, svc *corev1.Service, provider string) (*lbv1.Subnet, *Refusal) {
	var list lbv1.SubnetList
	if err := r.Client.List(ctx, &list); err != nil {
		return nil, &Refusal{ReasonSubnetNotFound, fmt.Sprintf("list subnets: %v", err)}
	}
	s, err := ChooseSubnet(svc, provider, list.Items)
	if err != nil {
		ref, _ := asRefusal(err)
		return nil, ref
	}
	return s, nil
}

// subnetConfig validates the chosen Subnet against all others and hands it to the allocator.
func (r *ServiceReconciler) subnetConfig(ctx context.Context, s *lbv1.Subnet) (cfgOut subnetCfg, err error) {
	if !s.DeletionTimestamp.IsZero() {
		return cfgOut, &Refusal{ReasonSubnetNotReady, fmt.Sprintf("subnet %q is being deleted", s.Name)}
	}
	var list lbv1.SubnetList
	if err := r.Client.List(ctx, &list); err != nil {
		return cfgOut, fmt.Errorf("list subnets: %w", err)
	}
	cfg, err := ValidateSubnet(s, list.Items)
	if err != nil {
		var ref *Refusal
		if errors.As(err, &ref) {
			return cfgOut, &Refusal{ReasonSubnetNotReady, fmt.Sprintf("subnet %q: %s", s.Name, ref.Message)}
		}
		return cfgOut, err
	}
	r.Book.EnsureSubnet(cfg)
	return cfg, nil
}

// apply records the allocation, creates or updates the lb-svc objects and sets the status.
func (r *ServiceReconciler) apply(ctx context.Context, svc *corev1.Service, provider, nadName, nadNS, subnetName string,
	addrs []netip.Addr, cfg subnetCfg) (ctrl.Result, error) {
	recorded := JoinAddrs(addrs)
	previous := svc.Annotations[lbv1.AllocatedIPsAnnotation]
	if err := r.patchMeta(ctx, svc, func(s *corev1.Service) {
		controllerutil.AddFinalizer(s, lbv1.CleanupFinalizer)
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		s.Annotations[lbv1.AllocatedIPsAnnotation] = recorded
		s.Annotations[lbv1.AllocatedSubnetAnnotation] = subnetName
	}); err != nil {
		return ctrl.Result{}, err
	}
	if previous != recorded {
		if previous == "" {
			r.Recorder.Eventf(svc, nil, corev1.EventTypeNormal, ReasonAllocated, actionAllocate,
				"allocated %s from subnet %q", recorded, subnetName)
		} else {
			r.Recorder.Eventf(svc, nil, corev1.EventTypeNormal, ReasonAddressMoved, actionAllocate,
				"address moved from %s to %s (subnet %q)", previous, recorded, subnetName)
		}
	}

	cidrs, gateways := FamilyParams(addrs, cfg)
	params := LBPodParams{
		ServiceName: svc.Name, ServiceNamespace: svc.Namespace, ServiceUID: svc.UID,
		Provider: provider, NADName: nadName, NADNamespace: nadNS, SubnetName: subnetName,
		Addresses: addrs, CIDRs: cidrs, Gateways: gateways,
		Image: r.Options.LBSvcImage, Sysctls: r.Options.ForwardingSysctls,
	}
	deploy, err := r.applyObjects(ctx, svc, params)
	if err != nil {
		r.Recorder.Eventf(svc, nil, corev1.EventTypeWarning, ReasonApplyFailed, actionApply, "%v", err)
		return ctrl.Result{}, err
	}

	allocated := metav1.Condition{
		Type: ConditionAddressAllocated, Status: metav1.ConditionTrue, Reason: ReasonAllocated,
		Message: fmt.Sprintf("%s from subnet %s", recorded, subnetName),
	}
	return ctrl.Result{}, r.patchStatus(ctx, svc, addrs, []metav1.Condition{allocated, podCondition(deploy)})
}

// subnetCfg is the parsed Subnet the lb pod's prefix and gateway come from.
type subnetCfg = ipam.SubnetConfig

// podCondition mirrors the Deployment's Available condition; it never waits for the pod.
func podCondition(d *appsv1.Deployment) metav1.Condition {
	c := metav1.Condition{Type: ConditionLBPodAvailable, Status: metav1.ConditionFalse, Reason: ReasonDeploymentPending,
		Message: "the lb-svc Deployment has not reported availability yet"}
	for _, dc := range d.Status.Conditions {
		if dc.Type != appsv1.DeploymentAvailable {
			continue
		}
		msg := fmt.Sprintf("deployment %s: %s", d.Name, dc.Message)
		if dc.Status == corev1.ConditionTrue {
			return metav1.Condition{Type: ConditionLBPodAvailable, Status: metav1.ConditionTrue, Reason: ReasonDeploymentAvailable, Message: msg}
		}
		return metav1.Condition{Type: ConditionLBPodAvailable, Status: metav1.ConditionFalse, Reason: ReasonDeploymentUnavailable, Message: msg}
	}
	return c
}

// refuse reports why the Service cannot be served. The Warning Event is sent only when the
// condition changes, so requeues and unrelated updates do not flood the Service's events.
// Whatever the Service held before stays held (the allocator keeps it on a failed request).
func (r *ServiceReconciler) refuse(ctx context.Context, svc *corev1.Service, ref *Refusal) error {
	cond := metav1.Condition{Type: ConditionAddressAllocated, Status: metav1.ConditionFalse, Reason: ref.Reason, Message: ref.Message}
	old := meta.FindStatusCondition(svc.Status.Conditions, ConditionAddressAllocated)
	if old == nil || old.Status != cond.Status || old.Reason != cond.Reason || old.Message != cond.Message {
		r.Recorder.Eventf(svc, nil, corev1.EventTypeWarning, ref.Reason, actionAllocate, "%s", ref.Message)
	}
	_, held, _ := r.Book.Lookup(OwnerKey(svc))
	return r.patchStatus(ctx, svc, SortAddrs(held), []metav1.Condition{cond})
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

// patchStatus sets the ingress to addrs and the given conditions, patching only on a difference.
func (r *ServiceReconciler) patchStatus(ctx context.Context, svc *corev1.Service, addrs []netip.Addr, conds []metav1.Condition) error {
	before := svc.DeepCopy()
	svc.Status.LoadBalancer.Ingress = ingressFor(addrs)
	for _, c := range conds {
		c.ObservedGeneration = svc.Generation
		meta.SetStatusCondition(&svc.Status.Conditions, c)
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

func hasOurStatus(svc *corev1.Service) bool {
	return meta.FindStatusCondition(svc.Status.Conditions, ConditionAddressAllocated) != nil ||
		meta.FindStatusCondition(svc.Status.Conditions, ConditionLBPodAvailable) != nil
}

// applyObjects creates or updates the ServiceAccount, Role, RoleBinding and Deployment.
func (r *ServiceReconciler) applyObjects(ctx context.Context, svc *corev1.Service, p LBPodParams) (*appsv1.Deployment, error) {
	sa, err := BuildServiceAccount(p)
	if err != nil {
		return nil, err
	}
	role, err := BuildRole(p)
	if err != nil {
		return nil, err
	}
	rb, err := BuildRoleBinding(p)
	if err != nil {
		return nil, err
	}
	deploy, err := BuildDeployment(p)
	if err != nil {
		return nil, err
	}
	if err := r.ensure(ctx, svc, sa, &corev1.ServiceAccount{}, func(cur client.Object) {}); err != nil {
		return nil, err
	}
	if err := r.ensure(ctx, svc, role, &rbacv1.Role{}, func(cur client.Object) { cur.(*rbacv1.Role).Rules = role.Rules }); err != nil {
		return nil, err
	}
	if err := r.ensure(ctx, svc, rb, &rbacv1.RoleBinding{}, func(cur client.Object) {
		cur.(*rbacv1.RoleBinding).Subjects = rb.Subjects
	}); err != nil {
		return nil, err
	}
	cur := &appsv1.Deployment{}
	if err := r.ensure(ctx, svc, deploy, cur, func(c client.Object) { c.(*appsv1.Deployment).Spec = deploy.Spec }); err != nil {
		return nil, err
	}
	if cur.Name == "" {
		return deploy, nil
	}
	return cur, nil
}

// ensure creates desired, or updates the existing object when its desired-hash differs. cur
// receives the existing object. An object of that name the Service does not control is left
// alone and reported: the operator never takes over what it did not create.
func (r *ServiceReconciler) ensure(ctx context.Context, svc *corev1.Service, desired, cur client.Object, copySpec func(client.Object)) error {
	kind := desired.GetObjectKind().GroupVersionKind().Kind
	err := r.Client.Get(ctx, client.ObjectKeyFromObject(desired), cur)
	if apierrors.IsNotFound(err) {
		if err := r.Client.Create(ctx, desired, client.FieldOwner(FieldOwner)); err != nil {
			return fmt.Errorf("create %s %s/%s: %w", kind, desired.GetNamespace(), desired.GetName(), err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("get %s %s/%s: %w", kind, desired.GetNamespace(), desired.GetName(), err)
	}
	if !metav1.IsControlledBy(cur, svc) {
		return fmt.Errorf("%s %s/%s exists and is not controlled by service %s", kind, cur.GetNamespace(), cur.GetName(), svc.Name)
	}
	want := desired.GetAnnotations()[DesiredHashAnnotation]
	if cur.GetAnnotations()[DesiredHashAnnotation] == want {
		return nil
	}
	anns := cur.GetAnnotations()
	if anns == nil {
		anns = map[string]string{}
	}
	anns[DesiredHashAnnotation] = want
	cur.SetAnnotations(anns)
	labels := cur.GetLabels()
	if labels == nil {
		labels = map[string]string{}
	}
	for k, v := range desired.GetLabels() {
		labels[k] = v
	}
	cur.SetLabels(labels)
	cur.SetOwnerReferences(desired.GetOwnerReferences())
	copySpec(cur)
	if err := r.Client.Update(ctx, cur, client.FieldOwner(FieldOwner)); err != nil {
		return fmt.Errorf("update %s %s/%s: %w", kind, cur.GetNamespace(), cur.GetName(), err)
	}
	return nil
}

// cleanup undoes everything the operator did for a Service: objects deleted, address released,
// status and annotations cleared, finalizer removed last (so that a failure is retried).
func (r *ServiceReconciler) cleanup(ctx context.Context, svc *corev1.Service) error {
	name := ObjectName(svc.Name)
	for _, obj := range []client.Object{&appsv1.Deployment{}, &rbacv1.RoleBinding{}, &rbacv1.Role{}, &corev1.ServiceAccount{}} {
		err := r.Client.Get(ctx, types.NamespacedName{Namespace: svc.Namespace, Name: name}, obj)
		if apierrors.IsNotFound(err) {
			continue
		}
		if err == nil && !metav1.IsControlledBy(obj, svc) {
			continue
		}
		if err == nil {
			err = r.Client.Delete(ctx, obj, client.PropagationPolicy(metav1.DeletePropagationBackground))
		}
		if err != nil && !apierrors.IsNotFound(err) {
			err = fmt.Errorf("clean up %T %s/%s: %w", obj, svc.Namespace, name, err)
			r.Recorder.Eventf(svc, nil, corev1.EventTypeWarning, ReasonCleanupFailed, actionCleanup, "%v", err)
			return err
		}
	}
	subnet, released := r.Book.Release(OwnerKey(svc))
	recorded := svc.Annotations[lbv1.AllocatedIPsAnnotation]

	if svc.DeletionTimestamp.IsZero() {
		// Clear only what is ours: ingress entries with our addresses, our conditions.
		before := svc.DeepCopy()
		ours := map[string]bool{}
		for _, a := range strings.Split(recorded, ",") {
			ours[a] = true
		}
		for _, a := range released {
			ours[a.String()] = true
		}
		svc.Status.LoadBalancer.Ingress = slices.DeleteFunc(svc.Status.LoadBalancer.Ingress, func(i corev1.LoadBalancerIngress) bool { return ours[i.IP] })
		if len(svc.Status.LoadBalancer.Ingress) == 0 {
			svc.Status.LoadBalancer.Ingress = nil
		}
		meta.RemoveStatusCondition(&svc.Status.Conditions, ConditionAddressAllocated)
		meta.RemoveStatusCondition(&svc.Status.Conditions, ConditionLBPodAvailable)
		if !statusEqual(before.Status, svc.Status) {
			if err := r.Client.Status().Patch(ctx, svc, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{}), client.FieldOwner(FieldOwner)); err != nil {
				return fmt.Errorf("clear service %s/%s status: %w", svc.Namespace, svc.Name, err)
			}
		}
	}
	if err := r.patchMeta(ctx, svc, func(s *corev1.Service) {
		delete(s.Annotations, lbv1.AllocatedIPsAnnotation)
		delete(s.Annotations, lbv1.AllocatedSubnetAnnotation)
		controllerutil.RemoveFinalizer(s, lbv1.CleanupFinalizer)
	}); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	}
	if recorded != "" || len(released) > 0 {
		r.Recorder.Eventf(svc, nil, corev1.EventTypeNormal, ReasonCleanedUp, actionCleanup,
			"released %s (subnet %q) and removed the lb-svc objects", orDash(recorded), subnet)
	}
	return nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
