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
// the one named like its ServiceAccount, carrying our component label.
const LBPodClusterRole = "lbsvc-lbpod"

// BuildServiceAccount returns the lb pod's ServiceAccount. Its name is the Service's object name,
// which is also the name of the Lease the lb pods record the holder in: the admission policy
// allows an lb pod's Lease writes on that name only.
func BuildServiceAccount(p Params) *corev1.ServiceAccount {
	sa := &corev1.ServiceAccount{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ServiceAccount"},
		ObjectMeta: p.objectMeta(p.podNamespace()),
	}
	if p.Shared != nil && len(p.MemberNamespaces) > 0 {
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

// BuildRoleBinding binds the lb pod's ServiceAccount to the ClusterRole LBPodClusterRole in the
// Service's namespace (where its Service and Lease are), and nowhere else.
func BuildRoleBinding(p Params) *rbacv1.RoleBinding {
	rb := &rbacv1.RoleBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "RoleBinding"},
		ObjectMeta: p.objectMeta(p.ServiceNamespace),
		RoleRef: rbacv1.RoleRef{
			APIGroup: rbacv1.GroupName,
			Kind:     "ClusterRole",
			Name:     LBPodClusterRole,
		},
		Subjects: []rbacv1.Subject{{
			Kind:      rbacv1.ServiceAccountKind,
			Name:      p.name(),
			Namespace: p.podNamespace(),
		}},
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

// BuildSharedLease returns the Lease the lb pods of a shared address create at their first
// takeover: BuildLease's labels for the address's owner UID (the one its lb objects carry), with
// SharedIPLabel in place of the Service's name, owned by the IP object so that it goes with the
// address rather than with any one member.
func BuildSharedLease(name, namespace string, ownerUID types.UID, ip IPRef) *coordinationv1.Lease {
	p := Params{ServiceNamespace: namespace, ServiceUID: ownerUID, Shared: &ip}
	m := p.objectMeta(namespace)
	m.Name = name
	return &coordinationv1.Lease{
		TypeMeta:   metav1.TypeMeta{APIVersion: "coordination.k8s.io/v1", Kind: "Lease"},
		ObjectMeta: m,
	}
}
