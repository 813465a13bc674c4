package lbobjects

import (
	"slices"
	"strings"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/types"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// LBPodClusterRole is the ClusterRole every lb pod's RoleBinding refers to, installed with the
// operator (config/rbac/lbpod_role.yaml, the chart's lbpod-clusterrole.yaml): read Services, and
// read, create and update Leases, in the namespace of the RoleBinding only. One static role
// instead of a Role per Service: the operator may bind it (the `bind` verb, on this one name)
// without holding what it grants, so its own token needs no Lease writes anywhere. Which Lease an
// lb pod may write is narrowed by the admission policy config/rbac/lbpod_lease_policy.yaml: only
// its own Service's (named like the lb Deployment its pod name begins with; a shared address's
// lb pods, the one named like their ServiceAccount), carrying our component label.
const LBPodClusterRole = "lbsvc-lbpod"

// IdentityName is the name of the ServiceAccount (in the lb pod namespace) and the RoleBinding
// (in the Service's namespace) that the lb pods of every Service of a namespace share:
// LBPodIdentity, or with --lb-pod-namespace LBPodIdentity-<Service namespace>, so that an lb pod
// there reads the Services of its own Service's namespace only. One per namespace, not one per
// Service: a new Service costs no ServiceAccount or RoleBinding write, and the RoleBindings of a
// namespace (which the API server's authorizer walks on every request there) do not grow with
// its Services. The Lease each pod may write is still its own Service's only: the admission
// policy matches the Lease's name against the pod name in the pod's token (PodMayWriteLease).
func IdentityName(lbPodNamespace, namespace string) string {
	if PodNamespace(lbPodNamespace, namespace) == namespace {
		return lbv1.LBPodIdentity
	}
	return lbv1.LBPodIdentity + "-" + namespace
}

// identityName is the lb pods' ServiceAccount: the namespace's shared one, or a shared
// address's own (whose annotation lists the member namespaces its lb pods read).
func (p Params) identityName() string {
	if p.Shared != nil {
		return p.name()
	}
	return IdentityName(p.PodNamespace, p.ServiceNamespace)
}

// identityMeta is the metadata of the namespace's shared identity objects: our component label
// (so the operator's cache holds them), IdentityLabel, and the Service namespace they serve; no
// Service's UID and no owner, since they outlive any one Service.
func (p Params) identityMeta(ns string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: p.identityName(), Namespace: ns, Labels: map[string]string{
		lbv1.ComponentLabel:        lbv1.ComponentLBPod,
		ManagedByLabel:             ManagedByValue,
		lbv1.IdentityLabel:         lbv1.IdentityNamespace,
		lbv1.ServiceNamespaceLabel: p.ServiceNamespace,
	}}
}

// IsIdentity tells whether o is a namespace's shared lb pod ServiceAccount or RoleBinding, by
// its labels and name.
func IsIdentity(o metav1.Object) bool {
	l := o.GetLabels()
	return l[lbv1.IdentityLabel] == lbv1.IdentityNamespace && l[lbv1.ComponentLabel] == lbv1.ComponentLBPod &&
		strings.HasPrefix(o.GetName(), lbv1.LBPodIdentity)
}

// BuildServiceAccount returns the lb pods' ServiceAccount: the namespace's shared one
// (IdentityName), or a shared address's own, named like its Lease and annotated with the
// namespaces of its members.
func BuildServiceAccount(p Params) *corev1.ServiceAccount {
	if p.Shared == nil {
		return &corev1.ServiceAccount{
			TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ServiceAccount"},
			ObjectMeta: p.identityMeta(p.podNamespace()),
		}
	}
	sa := &corev1.ServiceAccount{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ServiceAccount"},
		ObjectMeta: p.objectMeta(p.podNamespace()),
	}
	if len(p.MemberNamespaces) > 0 {
		sa.Annotations[lbv1.MemberNamespacesAnnotation] = strings.Join(p.MemberNamespaces, ",")
	}
	return sa
}

// BuildMemberRoleBindings are the extra RoleBindings of a shared address's lb pods: in each
// member namespace other than the owner's (to read the members there), and in the lb pod
// namespace when it is another (to read their own ServiceAccount, which lists those namespaces).
func BuildMemberRoleBindings(p Params) []*rbacv1.RoleBinding {
	if p.Shared == nil {
		return nil
	}
	namespaces := slices.Clone(p.MemberNamespaces)
	if ns := p.podNamespace(); ns != p.ServiceNamespace && !slices.Contains(namespaces, ns) {
		namespaces = append(namespaces, ns)
	}
	slices.Sort(namespaces)
	var out []*rbacv1.RoleBinding
	for _, ns := range namespaces {
		rb := BuildRoleBinding(p)
		rb.Namespace = ns
		rb.OwnerReferences = []metav1.OwnerReference{IPOwnerReference(*p.Shared)}
		out = append(out, rb)
	}
	return out
}

// BuildRoleBinding binds the lb pods' ServiceAccount to the ClusterRole LBPodClusterRole in the
// Service's namespace (where its Service and Lease are), and nowhere else: the namespace's shared
// binding, or a shared address's own.
func BuildRoleBinding(p Params) *rbacv1.RoleBinding {
	rb := &rbacv1.RoleBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "RoleBinding"},
		ObjectMeta: p.identityMeta(p.ServiceNamespace),
		RoleRef: rbacv1.RoleRef{
			APIGroup: rbacv1.GroupName,
			Kind:     "ClusterRole",
			Name:     LBPodClusterRole,
		},
		Subjects: []rbacv1.Subject{{
			Kind:      rbacv1.ServiceAccountKind,
			Name:      p.identityName(),
			Namespace: p.podNamespace(),
		}},
	}
	if p.Shared != nil {
		rb.ObjectMeta = p.objectMeta(p.ServiceNamespace)
	}
	return rb
}

// LeaseName is the name of a Service's Lease (in the Service's namespace), which its lb pods
// create at their first takeover and update at each: the per-Service object name, the name of
// their ServiceAccount too.
func LeaseName(lbPodNamespace, namespace, service string) string {
	return ObjectNameIn(lbPodNamespace, namespace, service)
}

// BuildLease returns the Lease that the lb pods of svc create, empty, at their first takeover when
// it is absent (the operator does not create it: it holds no Lease writes). It carries the labels,
// annotation and owner reference of every per-Service object: the operator trusts a Lease only
// with the Service's UID label, the admission policy lets an lb pod write only a Lease with our
// component label, and the garbage collector removes it with the Service. The owner reference does
// not block the Service's deletion: where OwnerReferencesPermissionEnforcement runs, that would
// need the lb pod to update the Service's finalizers.
func BuildLease(name string, svc metav1.Object) *coordinationv1.Lease {
	p := Params{ServiceName: svc.GetName(), ServiceNamespace: svc.GetNamespace(), ServiceUID: svc.GetUID()}
	m := p.objectMeta(p.ServiceNamespace)
	m.Name = name
	m.OwnerReferences[0].BlockOwnerDeletion = nil
	return &coordinationv1.Lease{
		TypeMeta:   metav1.TypeMeta{APIVersion: "coordination.k8s.io/v1", Kind: "Lease"},
		ObjectMeta: m,
	}
}

// SharedLeaseNamespace is where a shared address's Lease is: where its lb pods run (the
// --lb-pod-namespace, else its owner's namespace, the only member namespace then). Not in a
// member's namespace when they differ: the owner may leave while the address stays, and whoever
// writes Leases in that namespace would keep writing the address's record.
func SharedLeaseNamespace(lbPodNamespace, ownerNamespace string) string {
	return PodNamespace(lbPodNamespace, ownerNamespace)
}

// BuildSharedLease returns the Lease the lb pods of a shared address create at their first
// takeover, in namespace, where they run (SharedLeaseNamespace): BuildLease's labels for the
// address's owner (its namespace and UID, as its lb objects carry them), with SharedIPLabel in
// place of the Service's name, owned by the IP object so that it goes with the address rather
// than with any one member.
func BuildSharedLease(name, namespace, ownerNamespace string, ownerUID types.UID, ip IPRef) *coordinationv1.Lease {
	p := Params{ServiceNamespace: ownerNamespace, ServiceUID: ownerUID, Shared: &ip}
	m := p.objectMeta(namespace)
	m.Name = name
	return &coordinationv1.Lease{
		TypeMeta:   metav1.TypeMeta{APIVersion: "coordination.k8s.io/v1", Kind: "Lease"},
		ObjectMeta: m,
	}
}
