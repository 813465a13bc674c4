package lbobjects

import (
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
)

// Set is every object of one Service's lb pods, as it should be. PodDisruptionBudget is nil
// for a single lb pod (only standbys need it). ServiceAccount and RoleBinding are the
// namespace's shared identity (IdentityName), but for a shared address. The Lease is not among
// them: the lb pods create it at their first takeover, so the operator needs no Lease writes.
type Set struct {
	ServiceAccount      *corev1.ServiceAccount
	RoleBinding         *rbacv1.RoleBinding
	Deployment          *appsv1.Deployment
	PodDisruptionBudget *policyv1.PodDisruptionBudget
	// MemberRoleBindings, of a shared address, bind its lb pods in the other namespaces they
	// read (BuildMemberRoleBindings).
	MemberRoleBindings []*rbacv1.RoleBinding
	// HAKeySecret is the election key's Secret, nil without standbys. Created once, never
	// compared or updated (see BuildHAKeySecret); not in Stages.
	HAKeySecret *corev1.Secret
	// Retired are the Service's own ServiceAccount and RoleBinding of earlier releases, empty,
	// at their names: deleted once the Deployment has rolled out to the shared identity (the
	// lb pods still running under them need them until then).
	Retired []Object
}

// Build builds the whole Set of p.
func Build(p Params) (Set, error) {
	deploy, err := BuildDeployment(p)
	if err != nil {
		return Set{}, err
	}
	set := Set{ServiceAccount: BuildServiceAccount(p), RoleBinding: BuildRoleBinding(p),
		Deployment: deploy, PodDisruptionBudget: BuildPodDisruptionBudget(p), HAKeySecret: BuildHAKeySecret(p),
		MemberRoleBindings: BuildMemberRoleBindings(p)}
	if p.Shared == nil {
		all := At(p.PodNamespace, p.ServiceNamespace, p.ServiceName)
		set.Retired = []Object{all[1], all[2]}
	}
	return set, nil
}

// Stages orders the Set for writing: each stage's objects may be written in parallel, a stage
// only after the one before it. One stage: the RoleBinding refers to the installed ClusterRole
// LBPodClusterRole, which the API server does not look up when the creator holds `bind` on it,
// so nothing waits for anything (a pod starts long after the binding's create returns). The
// namespace's shared identity is written only by the first Service there (and when it differs):
// for every other it is a read of the cache.
func (s Set) Stages() [][]Object {
	stage := []Object{s.ServiceAccount, s.RoleBinding, s.Deployment}
	if s.PodDisruptionBudget != nil {
		stage = append(stage, s.PodDisruptionBudget)
	}
	for _, rb := range s.MemberRoleBindings {
		stage = append(stage, rb)
	}
	return [][]Object{stage}
}

// Unwanted lists, empty and at their names, the objects that this Set leaves out (a Service back
// to one lb pod no longer needs its budget, which lives beside its Deployment). The Lease stays:
// the operator may not delete Leases; it is the Service's (owner reference), and is not read
// with one lb pod.
func (s Set) Unwanted() []Object {
	if s.PodDisruptionBudget != nil {
		return nil
	}
	pdb := &policyv1.PodDisruptionBudget{}
	pdb.Namespace, pdb.Name = s.Deployment.Namespace, s.Deployment.Name
	return []Object{pdb}
}

// At lists a Service's per-Service objects the operator writes, empty, at their names: its
// Deployment, the ServiceAccount and RoleBinding of its own that earlier releases made (now
// Retired; the namespace's shared identity is never one Service's to delete), then the budget
// only standbys need. The RoleBinding was in the Service's namespace, since it granted reading
// the Service and writing its Lease; the rest live where the lb pods run. Neither the lb pods'
// Lease nor the per-Service Role of earlier releases is listed: the operator may write neither,
// and both carry the Service's owner reference, so the garbage collector removes them with the
// Service.
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
		mk(&rbacv1.RoleBinding{}, namespace), mk(&policyv1.PodDisruptionBudget{}, podNS),
	}
}
