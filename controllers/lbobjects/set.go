package lbobjects

import (
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
)

// Set is every per-Service object of one Service, as it should be. Lease and
// PodDisruptionBudget are nil for a single lb pod (only standbys need them).
type Set struct {
	ServiceAccount      *corev1.ServiceAccount
	Role                *rbacv1.Role
	RoleBinding         *rbacv1.RoleBinding
	Lease               *coordinationv1.Lease
	Deployment          *appsv1.Deployment
	PodDisruptionBudget *policyv1.PodDisruptionBudget
	// HAKeySecret is the election key's Secret, nil without standbys. Created once, never
	// compared or updated (see BuildHAKeySecret); not in Stages.
	HAKeySecret *corev1.Secret
}

// Build builds the whole Set of p.
func Build(p Params) (Set, error) {
	deploy, err := BuildDeployment(p)
	if err != nil {
		return Set{}, err
	}
	return Set{ServiceAccount: BuildServiceAccount(p), Role: BuildRole(p), RoleBinding: BuildRoleBinding(p),
		Lease: BuildLease(p), Deployment: deploy, PodDisruptionBudget: BuildPodDisruptionBudget(p),
		HAKeySecret: BuildHAKeySecret(p)}, nil
}

// Stages orders the Set for writing: each stage's objects may be written in parallel, a stage
// only after the one before it. First the lb pods' identity, their Role and (with standbys) the
// Lease they write; then the RoleBinding, which the API server refuses (404) before its Role
// exists, beside the Deployment and (with standbys) its budget: a pod starts long after the
// binding's create returns. In parallel because a Role or RoleBinding create by the operator
// waits 107-145 ms in the API server for its escalation check (make bench-operator).
func (s Set) Stages() [][]Object {
	first := []Object{s.ServiceAccount, s.Role}
	if s.Lease != nil {
		first = append(first, s.Lease)
	}
	second := []Object{s.RoleBinding, s.Deployment}
	if s.PodDisruptionBudget != nil {
		second = append(second, s.PodDisruptionBudget)
	}
	return [][]Object{first, second}
}

// Unwanted lists, empty and at their names, the objects of the Service that this Set leaves out
// (a Service back to one lb pod no longer needs its Lease and budget).
func (s Set) Unwanted(lbPodNamespace, namespace, service string) []Object {
	if s.Lease != nil {
		return nil
	}
	return At(lbPodNamespace, namespace, service)[4:]
}

// At lists a Service's per-Service objects, empty, at their names: the four every Service has
// (Deployment, ServiceAccount, Role, RoleBinding), then the two only standbys need (budget and
// Lease). The Role, RoleBinding and Lease stay in the Service's namespace, since they grant
// reading the Service; the rest live where the lb pods run.
func At(lbPodNamespace, namespace, service string) []Object {
	name := ObjectNameIn(lbPodNamespace, namespace, service)
	podNS := PodNamespace(lbPodNamespace, namespace)
	mk := func(o Object, ns string) Object {
		o.SetNamespace(ns)
		o.SetName(name)
		return o
	}
	return []Object{
		mk(&appsv1.Deployment{}, podNS), mk(&corev1.ServiceAccount{}, podNS),
		mk(&rbacv1.Role{}, namespace), mk(&rbacv1.RoleBinding{}, namespace),
		mk(&policyv1.PodDisruptionBudget{}, podNS), mk(&coordinationv1.Lease{}, namespace),
	}
}
