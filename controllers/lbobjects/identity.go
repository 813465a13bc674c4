package lbobjects

import (
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// BuildServiceAccount returns the lb pod's ServiceAccount.
func BuildServiceAccount(p Params) *corev1.ServiceAccount {
	sa := &corev1.ServiceAccount{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ServiceAccount"},
		ObjectMeta: p.objectMeta(p.podNamespace()),
	}
	return sa
}

// BuildRole returns the Role that lets the lb pod read its own Service and nothing else; with
// standbys, also read, watch and update (never create or delete) its own Lease, where the pod that
// takes the address over records itself (list and watch only pass with a field selector on that
// one name).
func BuildRole(p Params) *rbacv1.Role {
	r := &rbacv1.Role{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "Role"},
		ObjectMeta: p.objectMeta(p.ServiceNamespace),
		Rules: []rbacv1.PolicyRule{{
			APIGroups:     []string{""},
			Resources:     []string{"services"},
			ResourceNames: []string{p.ServiceName},
			Verbs:         []string{"get", "list", "watch"},
		}},
	}
	if p.LBReplicas() > 1 {
		r.Rules = append(r.Rules, rbacv1.PolicyRule{
			APIGroups:     []string{coordinationv1.GroupName},
			Resources:     []string{"leases"},
			ResourceNames: []string{p.name()},
			Verbs:         []string{"get", "list", "watch", "update"},
		})
	}
	return r
}

// BuildLease returns the Service's Lease, or nil for a single lb pod. The operator writes only
// its metadata: the spec belongs to the lb pods, which write it once per takeover (holder and
// transitions), never to renew it, so an idle Service costs no write. It is a record for people
// and for the operator's AddressActive condition, not a lock: who holds the address is settled on
// the underlay by the lb pods' election.
func BuildLease(p Params) *coordinationv1.Lease {
	if p.LBReplicas() == 1 {
		return nil
	}
	return &coordinationv1.Lease{
		TypeMeta:   metav1.TypeMeta{APIVersion: "coordination.k8s.io/v1", Kind: "Lease"},
		ObjectMeta: p.objectMeta(p.ServiceNamespace),
	}
}

// BuildRoleBinding binds the lb pod's ServiceAccount to its Role.
func BuildRoleBinding(p Params) *rbacv1.RoleBinding {
	rb := &rbacv1.RoleBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "RoleBinding"},
		ObjectMeta: p.objectMeta(p.ServiceNamespace),
		RoleRef: rbacv1.RoleRef{
			APIGroup: rbacv1.GroupName,
			Kind:     "Role",
			Name:     p.name(),
		},
		Subjects: []rbacv1.Subject{{
			Kind:      rbacv1.ServiceAccountKind,
			Name:      p.name(),
			Namespace: p.podNamespace(),
		}},
	}
	return rb
}
