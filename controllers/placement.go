package controllers

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
	"github.com/lbsvc/lbsvc-operator/controllers/decide"
	"github.com/lbsvc/lbsvc-operator/controllers/lbobjects"
)

// Placement wake-ups: a Service whose Subnet has a nodeSelector shows NoMatchingNode while no
// node can take its lb pods (decide.Unplaceable), so a node that starts or stops matching, or
// becomes (un)schedulable, wakes it. Nothing else about a node does: the kubelet's heartbeats
// update every node every few seconds, and none of them is a reason for a pass.

// nodeHandler wakes the Services of the Subnets whose nodeSelector matches the node, before or
// after the change, when its labels, cordon, taints or readiness changed.
func (r *ServiceReconciler) nodeHandler(mgr ctrl.Manager) handler.EventHandler {
	type queue = workqueue.TypedRateLimitingInterface[reconcile.Request]
	wake := func(ctx context.Context, q queue, nodes ...client.Object) {
		for _, req := range r.servicesPlacedOn(ctx, mgr.GetCache(), nodes...) {
			q.Add(req)
		}
	}
	return handler.Funcs{
		CreateFunc: func(ctx context.Context, e event.CreateEvent, q queue) { wake(ctx, q, e.Object) },
		DeleteFunc: func(ctx context.Context, e event.DeleteEvent, q queue) { wake(ctx, q, e.Object) },
		UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q queue) {
			if placementChanged(e.ObjectOld, e.ObjectNew) {
				wake(ctx, q, e.ObjectOld, e.ObjectNew)
			}
		},
	}
}

// placementChanged tells whether a node update may change where lb pods can be scheduled.
func placementChanged(old, cur client.Object) bool {
	o, ok1 := old.(*corev1.Node)
	n, ok2 := cur.(*corev1.Node)
	if !ok1 || !ok2 {
		return true
	}
	return !equality.Semantic.DeepEqual(o.Labels, n.Labels) || lbobjects.Schedulable(o) != lbobjects.Schedulable(n)
}

// servicesPlacedOn lists the Services of every Subnet whose nodeSelector matches one of nodes.
func (r *ServiceReconciler) servicesPlacedOn(ctx context.Context, c client.Reader, nodes ...client.Object) []reconcile.Request {
	var subnets lbv1.SubnetList
	if err := c.List(ctx, &subnets); err != nil {
		logf.FromContext(ctx).Error(err, "list subnets to wake")
		return nil
	}
	var reqs []reconcile.Request
	seen := map[string]bool{}
	for i := range subnets.Items {
		s := &subnets.Items[i]
		if !decide.HasNodeSelector(s) || seen[s.Spec.Provider] {
			continue
		}
		sel, err := metav1.LabelSelectorAsSelector(s.Spec.NodeSelector)
		if err != nil {
			continue
		}
		matches := false
		for _, n := range nodes {
			matches = matches || sel.Matches(labels.Set(n.GetLabels()))
		}
		if !matches {
			continue
		}
		seen[s.Spec.Provider] = true
		if reqs, err = servicesWithProvider(ctx, c, s.Spec.Provider, reqs); err != nil {
			logf.FromContext(ctx).Error(err, "list services to wake")
			return reqs
		}
	}
	return reqs
}
