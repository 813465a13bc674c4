package controllers

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"sync"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// The cache keeps our Deployments without their pod template: the template was 8 of the 33 MiB
// live heap with 1000 Services (make bench-operator, heap.pprof), the largest single part, and the
// operator reads it only to tell whether the Deployment still matches what it wants. In its place
// the cached object carries a digest of the whole live spec (cachedSpecDigestKey in the otherwise
// empty template's annotations), and the reconciler remembers, per Deployment, which live spec it
// has seen match which desired spec (specDigests). A pass whose desired spec and live spec are
// both the ones remembered writes nothing without reading the template; any other pass reads the
// Deployment from the API server once and compares in full, as before. A hand edit of any spec
// field, a removal included, changes the live spec and so its digest: it is reverted as before.

// cachedSpecDigestKey holds, in a cached Deployment's emptied template, the digest of the live
// spec the cache dropped. It never reaches the API server: no write starts from a cached
// Deployment (ensure applies the desired object; dropRollingUpdate sends a raw patch).
const cachedSpecDigestKey = "lbsvc.io/cached-spec-digest"

// specDigest is a digest of a Deployment spec: sha256 of its JSON (maps marshal sorted, so equal
// specs give equal digests).
func specDigest(spec *appsv1.DeploymentSpec) string {
	b, err := json.Marshal(spec)
	if err != nil {
		// A spec that does not marshal cannot be compared by digest: an empty digest never
		// matches a remembered one, so the pass reads the object from the API server.
		return ""
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:16])
}

// trimDeployment replaces the pod template of d with the digest of d's live spec.
func trimDeployment(d *appsv1.Deployment) {
	if templateTrimmed(d) {
		return
	}
	digest := specDigest(&d.Spec)
	d.Spec.Template = corev1.PodTemplateSpec{}
	d.Spec.Template.Annotations = map[string]string{cachedSpecDigestKey: digest}
}

// templateTrimmed tells whether d came from the cache without its template. A Deployment the API
// server holds always has a container, so an empty container list says the cache emptied it.
func templateTrimmed(d *appsv1.Deployment) bool {
	return len(d.Spec.Template.Spec.Containers) == 0 && d.Spec.Template.Annotations[cachedSpecDigestKey] != ""
}

// liveSpecDigest is the digest of d's live spec, from the cache's note or from the full object.
func liveSpecDigest(d *appsv1.Deployment) string {
	if templateTrimmed(d) {
		return d.Spec.Template.Annotations[cachedSpecDigestKey]
	}
	return specDigest(&d.Spec)
}

// specDigests remembers, per Deployment, the desired spec and the live spec that were found to
// match (or that our own create produced). It is memory only: after a restart each Deployment is
// read once from the API server and compared in full.
type specDigests struct {
	mu   sync.Mutex
	seen map[types.NamespacedName]specMatch
}

type specMatch struct{ desired, live string }

func newSpecDigests() *specDigests {
	return &specDigests{seen: map[types.NamespacedName]specMatch{}}
}

// matches tells whether the live spec was seen to match the desired spec.
func (s *specDigests) matches(key types.NamespacedName, desired, live string) bool {
	if desired == "" || live == "" {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.seen[key]
	return ok && m.desired == desired && m.live == live
}

// remember notes that the live spec matches the desired spec.
func (s *specDigests) remember(key types.NamespacedName, desired, live string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seen[key] = specMatch{desired: desired, live: live}
}

// forget drops what is remembered of a Deployment that goes.
func (s *specDigests) forget(key types.NamespacedName) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.seen, key)
}
