// Package apiserver starts a kube-apiserver and etcd of their own (envtest) for an integration
// test, with an admin client: what tests that need a whole API server to themselves (admission
// policies, real tokens) share.
package apiserver

import (
	"testing"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// Start starts the API server (KUBEBUILDER_ASSETS names its binaries), stops it when the test
// ends, and returns the environment (to add users), its admin config and an admin client. A
// failure to start ends the test.
func Start(t testing.TB) (*envtest.Environment, *rest.Config, kubernetes.Interface) {
	t.Helper()
	env := &envtest.Environment{}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("envtest (set KUBEBUILDER_ASSETS, see make envtest-assets): %v", err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	return env, cfg, kubernetes.NewForConfigOrDie(cfg)
}
