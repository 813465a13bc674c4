package controllers

import (
	"fmt"
	"testing"

	"k8s.io/apimachinery/pkg/types"
)

// A Service that needs several key Secrets at once (its own lb pods' and a shared address's of
// each family) keeps all of them remembered: with one remembered per Service, each evicted the
// other and every pass created both again (answered AlreadyExists). At most haKeysPerService are
// kept, the oldest forgotten first; forget drops them all.
func TestHAKeysRemembersSeveralPerService(t *testing.T) {
	h := newHAKeys()
	key := func(i int) types.NamespacedName {
		return types.NamespacedName{Namespace: "ns", Name: fmt.Sprintf("lb-svc-key-%d", i)}
	}
	h.set("svc", key(4))
	h.set("svc", key(6))
	for range 3 {
		for _, k := range []types.NamespacedName{key(4), key(6)} {
			if !h.has("svc", k) {
				t.Fatalf("%s forgotten", k)
			}
			h.set("svc", k)
		}
	}
	if h.has("other", key(4)) {
		t.Fatal("another Service has the key")
	}
	for i := 10; i < 10+haKeysPerService; i++ {
		h.set("svc", key(i))
	}
	if h.has("svc", key(4)) || h.has("svc", key(6)) || !h.has("svc", key(10)) || len(h.created["svc"]) != haKeysPerService {
		t.Fatalf("after %d more: %v", haKeysPerService, h.created["svc"])
	}
	h.forget("svc")
	if h.has("svc", key(10)) {
		t.Fatal("remembered after forget")
	}
	var none *haKeys
	none.set("svc", key(1))
	if none.has("svc", key(1)) {
		t.Fatal("a nil haKeys remembers")
	}
}
