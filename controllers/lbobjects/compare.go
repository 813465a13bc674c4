package lbobjects

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
)

func ptrTrue(b *bool) bool { return b != nil && *b }

// SamePodShape completes DeepDerivative for the lb pod's template. DeepDerivative lets the live
// object carry what the desired one leaves unset, so that the API server's defaults never look
// like drift; but it also passes a list with elements appended and a flag the desired object
// leaves false: an environment variable the operator no longer sets (--lb-rules or
// --lb-ha-interval set back to the default) stayed in the Deployment, and a capability, a
// container, a volume or host networking added by hand survived. The API server's defaulting
// appends to none of these lists and sets none of these flags, so they must match exactly in
// length and be off. The required node affinity (the Subnet's nodeSelector) must be exactly the
// desired one: DeepDerivative would let a removed selector, or a removed requirement, stay.
func SamePodShape(want, have *corev1.PodSpec) bool {
	if len(want.Containers) != len(have.Containers) || len(want.InitContainers) != len(have.InitContainers) ||
		len(want.Volumes) != len(have.Volumes) || len(want.EphemeralContainers) != len(have.EphemeralContainers) ||
		have.HostNetwork || have.HostPID || have.HostIPC || (have.HostUsers != nil) != (want.HostUsers != nil) ||
		!equality.Semantic.DeepEqual(requiredNodeAffinity(want), requiredNodeAffinity(have)) {
		return false
	}
	sameContainer := func(w, h *corev1.Container) bool {
		if len(w.Env) != len(h.Env) || len(w.EnvFrom) != len(h.EnvFrom) || len(w.Args) != len(h.Args) ||
			len(w.Command) != len(h.Command) || len(w.VolumeMounts) != len(h.VolumeMounts) ||
			len(w.VolumeDevices) != len(h.VolumeDevices) || len(w.Ports) != len(h.Ports) {
			return false
		}
		if w.SecurityContext != nil && w.SecurityContext.Capabilities != nil {
			hc := h.SecurityContext
			if hc == nil || hc.Capabilities == nil || len(hc.Capabilities.Add) != len(w.SecurityContext.Capabilities.Add) ||
				len(hc.Capabilities.Drop) != len(w.SecurityContext.Capabilities.Drop) {
				return false
			}
		}
		return true
	}
	sameContainers := func(want, have []corev1.Container) bool {
		for i := range want {
			if !sameContainer(&want[i], &have[i]) {
				return false
			}
		}
		return true
	}
	return sameContainers(want.Containers, have.Containers) && sameContainers(want.InitContainers, have.InitContainers)
}

// requiredNodeAffinity is the pod's required node selector, nil when it has none.
func requiredNodeAffinity(p *corev1.PodSpec) *corev1.NodeSelector {
	if p.Affinity == nil || p.Affinity.NodeAffinity == nil {
		return nil
	}
	return p.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution
}

func subset(want, have map[string]string) bool {
	for k, v := range want {
		if w, ok := have[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func KindOf(o Object) string {
	switch o.(type) {
	case *appsv1.Deployment:
		return "Deployment"
	case *corev1.ServiceAccount:
		return "ServiceAccount"
	case *rbacv1.Role:
		return "Role"
	case *rbacv1.RoleBinding:
		return "RoleBinding"
	case *policyv1.PodDisruptionBudget:
		return "PodDisruptionBudget"
	case *coordinationv1.Lease:
		return "Lease"
	}
	return fmt.Sprintf("%T", o)
}

// CachedSpecDigestKey holds, in a cached Deployment's emptied template, the digest of the live
// spec the cache dropped. It never reaches the API server: no write starts from a cached
// Deployment (ensure applies the desired object; dropRollingUpdate sends a raw patch).
const CachedSpecDigestKey = "lbsvc.io/cached-spec-digest"

// SpecDigest is a digest of a Deployment spec: sha256 of its JSON (maps marshal sorted, so equal
// specs give equal digests).
func SpecDigest(spec *appsv1.DeploymentSpec) string {
	b, err := json.Marshal(spec)
	if err != nil {
		// A spec that does not marshal cannot be compared by digest: an empty digest never
		// matches a remembered one, so the pass reads the object from the API server.
		return ""
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:16])
}

// CachedElectionKey holds, in a cached Deployment's emptied template, what its lb pods elect
// with (election: "<key Secret> <addresses>"), which FromSingle compares with the desired
// template's. Never sent to the API server, as CachedSpecDigestKey.
const CachedElectionKey = "lbsvc.io/cached-election"

// TrimDeployment replaces the pod template of d with the digest of d's live spec and what its
// pods elect with.
func TrimDeployment(d *appsv1.Deployment) {
	if TemplateTrimmed(d) {
		return
	}
	digest := SpecDigest(&d.Spec)
	key, addrs := election(d)
	d.Spec.Template = corev1.PodTemplateSpec{}
	d.Spec.Template.Annotations = map[string]string{CachedSpecDigestKey: digest}
	if key != "" || addrs != "" {
		d.Spec.Template.Annotations[CachedElectionKey] = key + " " + addrs
	}
}

// TemplateTrimmed tells whether d came from the cache without its template. A Deployment the API
// server holds always has a container, so an empty container list says the cache emptied it.
func TemplateTrimmed(d *appsv1.Deployment) bool {
	return len(d.Spec.Template.Spec.Containers) == 0 && d.Spec.Template.Annotations[CachedSpecDigestKey] != ""
}

// LiveSpecDigest is the digest of d's live spec, from the cache's note or from the full object.
func LiveSpecDigest(d *appsv1.Deployment) string {
	if TemplateTrimmed(d) {
		return d.Spec.Template.Annotations[CachedSpecDigestKey]
	}
	return SpecDigest(&d.Spec)
}

// ExactAnnotations are annotations of ours whose absence also says something: a live object
// must carry the desired value, or none when none is desired (the subset check alone would keep
// a value no longer wanted; the Service pass removes one no longer desired explicitly).
var ExactAnnotations = []string{lbv1.MemberNamespacesAnnotation}

// UpToDate tells whether cur already has every field desired sets (server defaults aside).
func UpToDate(desired, cur Object) bool {
	if !subset(desired.GetLabels(), cur.GetLabels()) || !subset(desired.GetAnnotations(), cur.GetAnnotations()) {
		return false
	}
	for _, k := range ExactAnnotations {
		if desired.GetAnnotations()[k] != cur.GetAnnotations()[k] {
			return false
		}
	}
	for _, ref := range desired.GetOwnerReferences() {
		// The controller flag only where desired sets it: the objects of a shared address are
		// owned by its IP object without it, and were otherwise never up to date (every pass
		// of every member applied them again).
		if !slices.ContainsFunc(cur.GetOwnerReferences(), func(o metav1.OwnerReference) bool {
			return o.UID == ref.UID && (!ptrTrue(ref.Controller) || ptrTrue(o.Controller))
		}) {
			return false
		}
	}
	switch d := desired.(type) {
	case *appsv1.Deployment:
		c := cur.(*appsv1.Deployment)
		return equality.Semantic.DeepDerivative(d.Spec, c.Spec) && SamePodShape(&d.Spec.Template.Spec, &c.Spec.Template.Spec)
	case *rbacv1.RoleBinding:
		c := cur.(*rbacv1.RoleBinding)
		return equality.Semantic.DeepDerivative(d.RoleRef, c.RoleRef) && equality.Semantic.DeepDerivative(d.Subjects, c.Subjects)
	case *policyv1.PodDisruptionBudget:
		return equality.Semantic.DeepDerivative(d.Spec, cur.(*policyv1.PodDisruptionBudget).Spec)
	}
	return true
}

// RoleRefChanged tells whether cur is a RoleBinding whose roleRef is not desired's: the API server
// refuses any change of a roleRef, so such a binding must be deleted and created again (a
// binding to the per-Service Role of a release before the ClusterRole LBPodClusterRole).
func RoleRefChanged(desired, cur Object) bool {
	d, ok := desired.(*rbacv1.RoleBinding)
	c, ok2 := cur.(*rbacv1.RoleBinding)
	return ok && ok2 && c.Name != "" && c.RoleRef != d.RoleRef
}

// Object is any API object the builders make: controller-runtime's client.Object, named here
// so that this package needs no client.
type Object interface {
	metav1.Object
	runtime.Object
}

// RolledOut tells whether a Deployment that was up to date as read (cur) has no pod left of an
// earlier template: the controller saw its latest generation and every replica it runs is an
// updated one.
func RolledOut(cur *appsv1.Deployment) bool {
	want := int32(1)
	if cur.Spec.Replicas != nil {
		want = *cur.Spec.Replicas
	}
	s := cur.Status
	return cur.Name != "" && s.ObservedGeneration >= cur.Generation && s.UpdatedReplicas == want && s.Replicas == want
}
