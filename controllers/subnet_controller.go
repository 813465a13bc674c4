package controllers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
	"github.com/lbsvc/lbsvc-operator/controllers/ipam"
)

// +kubebuilder:rbac:groups=lbsvc.io,resources=subnets,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=lbsvc.io,resources=subnets/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=lbsvc.io,resources=subnets/finalizers,verbs=update

// SubnetReconciler validates Subnets beyond the schema, keeps their counters current and holds
// their deletion while Services still have addresses from them.
type SubnetReconciler struct {
	Client   client.Client
	Recorder events.EventRecorder
	Book     *AddressBook
	// SkipNameValidation lets tests run several managers in one process.
	SkipNameValidation bool
}

// maxNamedServices bounds the Service names an in-use Event lists.
const maxNamedServices = 10

// SetupWithManager registers the controller: Subnets, every Subnet when one changes (overlap is
// relative), and the Subnet a Service's recorded allocation names.
func (r *SubnetReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if err := indexServicesBySubnet(mgr); err != nil {
		return err
	}
	allSubnets := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, _ client.Object) []reconcile.Request {
		var list lbv1.SubnetList
		if err := mgr.GetCache().List(ctx, &list); err != nil {
			logf.FromContext(ctx).Error(err, "list subnets")
			return nil
		}
		reqs := make([]reconcile.Request, len(list.Items))
		for i := range list.Items {
			reqs[i] = reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])}
		}
		return reqs
	})
	recordedSubnet := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		if s := o.GetAnnotations()[lbv1.AllocatedSubnetAnnotation]; s != "" {
			return []reconcile.Request{{NamespacedName: client.ObjectKey{Name: s}}}
		}
		return nil
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("subnet").
		For(&lbv1.Subnet{}).
		Watches(&lbv1.Subnet{}, allSubnets, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&corev1.Service{}, recordedSubnet, builder.WithPredicates(predicate.Or(
			predicate.AnnotationChangedPredicate{}, predicate.Funcs{
				CreateFunc: func(e event.CreateEvent) bool { return e.Object.GetAnnotations()[lbv1.AllocatedSubnetAnnotation] != "" },
				DeleteFunc: func(e event.DeleteEvent) bool { return e.Object.GetAnnotations()[lbv1.AllocatedSubnetAnnotation] != "" },
				// Annotation changes are AnnotationChangedPredicate's; nothing else matters here.
				UpdateFunc:  func(event.UpdateEvent) bool { return false },
				GenericFunc: func(event.GenericEvent) bool { return false },
			}))).
		WithOptions(controller.Options{SkipNameValidation: &r.SkipNameValidation}).
		Complete(r)
}

// Reconcile implements reconcile.Reconciler.
func (r *SubnetReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	if err := r.Book.WaitReady(ctx); err != nil {
		return ctrl.Result{}, err
	}
	subnet := &lbv1.Subnet{}
	if err := r.Client.Get(ctx, req.NamespacedName, subnet); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !subnet.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, r.finalize(ctx, subnet)
	}
	if !controllerutil.ContainsFinalizer(subnet, lbv1.SubnetFinalizer) {
		before := subnet.DeepCopy()
		controllerutil.AddFinalizer(subnet, lbv1.SubnetFinalizer)
		if err := r.Client.Patch(ctx, subnet, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
			return ctrl.Result{}, fmt.Errorf("add finalizer to subnet %q: %w", subnet.Name, err)
		}
	}

	var all lbv1.SubnetList
	if err := r.Client.List(ctx, &all); err != nil {
		return ctrl.Result{}, fmt.Errorf("list subnets: %w", err)
	}
	before := subnet.DeepCopy()
	cond := metav1.Condition{Type: ConditionSubnetReady, Status: metav1.ConditionTrue, Reason: ReasonSubnetValid,
		Message: "subnet is valid", ObservedGeneration: subnet.Generation}
	cfg, err := ValidateSubnet(subnet, all.Items)
	var usage ipam.Usage
	if err != nil {
		var ref *Refusal
		if !errors.As(err, &ref) {
			return ctrl.Result{}, err
		}
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, ref.Reason, ref.Message
		old := meta.FindStatusCondition(subnet.Status.Conditions, ConditionSubnetReady)
		if old == nil || old.Reason != ref.Reason || old.Message != ref.Message {
			r.Recorder.Eventf(subnet, nil, corev1.EventTypeWarning, ref.Reason, actionValidate, "%s", ref.Message)
		}
		// Addresses already handed out stay counted even though no new one is handed out.
		if u, ok := r.Book.Usage(subnet.Name); ok {
			usage = u
			usage.V4Available, usage.V6Available = 0, 0
		}
	} else {
		r.Book.EnsureSubnet(cfg)
		usage, _ = r.Book.Usage(subnet.Name)
	}
	meta.SetStatusCondition(&subnet.Status.Conditions, cond)
	subnet.Status.V4UsingIPs, subnet.Status.V4AvailableIPs = usage.V4Used, usage.V4Available
	subnet.Status.V6UsingIPs, subnet.Status.V6AvailableIPs = usage.V6Used, usage.V6Available
	subnet.Status.ObservedGeneration = subnet.Generation
	if subnetStatusEqual(before.Status, subnet.Status) {
		return ctrl.Result{}, nil
	}
	if err := r.Client.Status().Patch(ctx, subnet, client.MergeFrom(before)); err != nil {
		return ctrl.Result{}, fmt.Errorf("patch subnet %q status: %w", subnet.Name, err)
	}
	return ctrl.Result{}, nil
}

// finalize lets a Subnet go once no Service holds (or records) an address from it.
func (r *SubnetReconciler) finalize(ctx context.Context, subnet *lbv1.Subnet) error {
	if !controllerutil.ContainsFinalizer(subnet, lbv1.SubnetFinalizer) {
		return nil
	}
	users := map[string]bool{}
	for _, o := range r.Book.Owners(subnet.Name) {
		users[o] = true
	}
	var recorded corev1.ServiceList
	if err := r.Client.List(ctx, &recorded, client.MatchingFields{indexServiceSubnet: subnet.Name}); err != nil {
		return fmt.Errorf("list services of subnet %q: %w", subnet.Name, err)
	}
	for i := range recorded.Items {
		users[OwnerKey(&recorded.Items[i])] = true
	}
	if len(users) > 0 {
		names := make([]string, 0, len(users))
		for u := range users {
			names = append(names, u)
		}
		sort.Strings(names)
		shown := names
		if len(shown) > maxNamedServices {
			shown = shown[:maxNamedServices]
		}
		msg := fmt.Sprintf("subnet %q is still used by %d service(s): %s", subnet.Name, len(names), strings.Join(shown, ", "))
		if len(names) > len(shown) {
			msg += ", ..."
		}
		r.Recorder.Eventf(subnet, nil, corev1.EventTypeWarning, ReasonSubnetInUse, actionDelete, "%s", msg)
		// The Service watch brings the Subnet back when one of them lets go.
		return nil
	}
	r.Book.RemoveSubnet(subnet.Name)
	before := subnet.DeepCopy()
	controllerutil.RemoveFinalizer(subnet, lbv1.SubnetFinalizer)
	if err := r.Client.Patch(ctx, subnet, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("remove finalizer from subnet %q: %w", subnet.Name, err)
	}
	return nil
}

func subnetStatusEqual(a, b lbv1.SubnetStatus) bool {
	if a.V4AvailableIPs != b.V4AvailableIPs || a.V4UsingIPs != b.V4UsingIPs || a.V6AvailableIPs != b.V6AvailableIPs ||
		a.V6UsingIPs != b.V6UsingIPs || a.ObservedGeneration != b.ObservedGeneration {
		return false
	}
	return slices.EqualFunc(a.Conditions, b.Conditions, func(x, y metav1.Condition) bool {
		return x.Type == y.Type && x.Status == y.Status && x.Reason == y.Reason && x.Message == y.Message &&
			x.ObservedGeneration == y.ObservedGeneration && x.LastTransitionTime.Equal(&y.LastTransitionTime)
	})
}
