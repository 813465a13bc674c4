package controllers

import (
	"context"
	"crypto/rand"
	"fmt"
	"slices"
	"sync"

	"github.com/lbsvc/lbsvc-operator/controllers/lbobjects"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// +kubebuilder:rbac:groups="",resources=secrets,verbs=create

// The election key's Secret (lbobjects.BuildHAKeySecret) is the one per-Service object the
// operator only creates: it may not read, list, update or delete any Secret (a token that can read
// Secrets cluster-wide would read every other credential), so it cannot compare it, and it never
// needs to: the key is random, the Secret immutable, its name changes with the claim, and the
// garbage collector removes it with the claim's IP objects.

// haKeys remembers, per Service, the key Secrets this operator process created or found created,
// so that a pass creates at most once per claim; after a restart one create per Secret answers
// AlreadyExists. A Service may need several at once (its own lb pods' and those of the shared
// addresses it first claimed, one per family), so a few are kept per Service: with one, two of
// them evicted each other and every pass created both again.
type haKeys struct {
	mu      sync.Mutex
	created map[types.UID][]types.NamespacedName
}

// haKeysPerService bounds the Secrets remembered per Service (the oldest is forgotten first): a
// Service's own key and one per family of a shared address, with room for a claim that changed.
const haKeysPerService = 4

func newHAKeys() *haKeys { return &haKeys{created: map[types.UID][]types.NamespacedName{}} }

// A nil haKeys (a reconciler built by hand in a test) remembers nothing.
func (h *haKeys) has(svc types.UID, key types.NamespacedName) bool {
	if h == nil {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Contains(h.created[svc], key)
}

func (h *haKeys) set(svc types.UID, key types.NamespacedName) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	keys := h.created[svc]
	if slices.Contains(keys, key) {
		return
	}
	if len(keys) >= haKeysPerService {
		keys = slices.Delete(keys, 0, 1)
	}
	h.created[svc] = append(keys, key)
}

// forget drops a Service that is let go or torn down.
func (h *haKeys) forget(svc types.UID) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.created, svc)
}

// ensureHAKey creates the Service's key Secret with a new random key unless this process already
// did. A Secret of that name that exists already is taken as the key: the name holds the claim's
// IP object UIDs, and only who may create Secrets in the lb pods' namespace could have put it
// there first (the Service's own tenant, or with --lb-pod-namespace nobody but the operator's
// admins): that is the README's threat model, not a tenant of another namespace.
func (r *ServiceReconciler) ensureHAKey(ctx context.Context, svc *corev1.Service, s *corev1.Secret, confirm func() error) error {
	if s == nil {
		return nil
	}
	key := client.ObjectKeyFromObject(s)
	if r.haKeys.has(svc.UID, key) {
		return nil
	}
	if err := confirm(); err != nil {
		return err
	}
	obj := s.DeepCopy()
	b := make([]byte, lbobjects.HAKeyLen)
	if _, err := rand.Read(b); err != nil {
		return fmt.Errorf("election key for %s: %w", key, err)
	}
	obj.Data = map[string][]byte{lbobjects.HAKeyFile: b}
	if err := r.Client.Create(ctx, obj, client.FieldOwner(FieldOwner)); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create Secret %s/%s: %w", key.Namespace, key.Name, err)
	}
	r.haKeys.set(svc.UID, key)
	return nil
}
