package controllers

import (
	"github.com/lbsvc/lbsvc-operator/controllers/lbobjects"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
)

// lastAppliedAnnotation is kubectl apply's copy of the whole object: often the largest field
// of an object, and never read by the operator.
const lastAppliedAnnotation = "kubectl.kubernetes.io/last-applied-configuration"

// CacheOptions restricts the cached Deployments, ServiceAccounts, RoleBindings, Leases and Pods to
// the ones the operator creates (a cluster holds many, and caching them all would cost memory
// for nothing), and strips every cached object of what the operator never reads
// (TrimForCache). Services are cached whole but trimmed: any of them may become one we serve,
// and the API offers no selector on spec.type. Nodes are cached, trimmed, for placement (a
// Subnet's nodeSelector).
func CacheOptions() cache.Options {
	ours := cache.ByObject{Label: labels.SelectorFromSet(labels.Set{lbv1.ComponentLabel: lbv1.ComponentLBPod})}
	return cache.Options{
		ByObject: map[client.Object]cache.ByObject{
			&appsv1.Deployment{}:            ours,
			&corev1.ServiceAccount{}:        ours,
			&rbacv1.RoleBinding{}:           ours,
			&corev1.Pod{}:                   ours,
			&coordinationv1.Lease{}:         ours,
			&policyv1.PodDisruptionBudget{}: ours,
		},
		DefaultTransform: TrimForCache,
	}
}

// TrimForCache is the cache's transform: it drops managedFields (the server-side apply
// bookkeeping, several KiB per object and never read here) and kubectl's last-applied
// annotation from every object, reduces an lb pod to what the IP controller reads (name,
// namespace, UID, labels, owner, deletion, node) and a Node to what placement reads (labels,
// cordon, taints, readiness), and replaces a Deployment's pod template with a
// digest of its spec. It returns the object it was given, changed in
// place: the informer hands each object to it once, before anyone else sees it, and a second
// pass changes nothing.
func TrimForCache(obj any) (any, error) {
	m, ok := obj.(metav1.Object)
	if !ok {
		return obj, nil
	}
	m.SetManagedFields(nil)
	if a := m.GetAnnotations(); a != nil {
		if _, ok := a[lastAppliedAnnotation]; ok {
			delete(a, lastAppliedAnnotation)
			if len(a) == 0 {
				m.SetAnnotations(nil)
			}
		}
	}
	switch o := obj.(type) {
	case *corev1.Pod:
		return trimPod(o), nil
	case *corev1.Node:
		return trimNode(o), nil
	case *appsv1.Deployment:
		// Only its digest stands for the template (see specdigest.go).
		lbobjects.TrimDeployment(o)
	}
	return obj, nil
}

// trimPod keeps of an lb pod what the IP controller reads: which address it carries (labels),
// where it runs (spec.nodeName), its identity, and its Ready condition (the active-holder
// controller shows a single lb pod as the holder once it is Ready). Multus' network-status
// annotation, the containers and the rest of the status are dropped.
func trimPod(p *corev1.Pod) *corev1.Pod {
	return &corev1.Pod{
		TypeMeta: p.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name: p.Name, Namespace: p.Namespace, UID: p.UID, ResourceVersion: p.ResourceVersion,
			Generation: p.Generation, CreationTimestamp: p.CreationTimestamp, DeletionTimestamp: p.DeletionTimestamp,
			DeletionGracePeriodSeconds: p.DeletionGracePeriodSeconds,
			Labels:                     p.Labels, OwnerReferences: p.OwnerReferences, Finalizers: p.Finalizers,
		},
		Spec:   corev1.PodSpec{NodeName: p.Spec.NodeName},
		Status: corev1.PodStatus{Phase: p.Status.Phase, Conditions: readyOnly(p.Status.Conditions)},
	}
}

// trimNode keeps of a Node what placement reads (decide.Unplaceable): its labels, cordon, taints
// and Ready condition (type and status: the heartbeat times change every few seconds). Its images,
// addresses, capacity and the rest of its status, most of a Node's size, are dropped.
func trimNode(n *corev1.Node) *corev1.Node {
	out := &corev1.Node{
		TypeMeta: n.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion, CreationTimestamp: n.CreationTimestamp,
			DeletionTimestamp: n.DeletionTimestamp, Labels: n.Labels,
		},
		Spec: corev1.NodeSpec{Unschedulable: n.Spec.Unschedulable, Taints: n.Spec.Taints},
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			out.Status.Conditions = []corev1.NodeCondition{{Type: c.Type, Status: c.Status}}
		}
	}
	return out
}

func readyOnly(conds []corev1.PodCondition) []corev1.PodCondition {
	for _, c := range conds {
		if c.Type == corev1.PodReady {
			return []corev1.PodCondition{{Type: c.Type, Status: c.Status}}
		}
	}
	return nil
}
