//go:build chart

package chart

import (
	"context"
	"os"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// TestAPIServerAcceptsChart sends every object the chart renders, with every optional value set, to a
// real kube-apiserver (envtest, KUBEBUILDER_ASSETS): the CRDs are created, the rest is a server-side
// dry run, so schema and admission errors in templates show here and not at a user's install. The
// prometheus-operator kinds are left out: their CRDs are not ours to install.
func TestAPIServerAcceptsChart(t *testing.T) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Fatal("KUBEBUILDER_ASSETS is not set: run hack/test-chart.sh (make test-chart)")
	}
	env := &envtest.Environment{}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("start envtest: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stop envtest: %v", err)
		}
	})
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, o := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "lbsvc-system"}},
		&schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "lbsvc-test"}, Value: 1000},
	} {
		if err := c.Create(ctx, o); err != nil {
			t.Fatalf("create %s: %v", o.GetName(), err)
		}
	}

	objs := mustTemplate(t,
		"replicas=2", "lbReplicas=2", "lbPodNamespace=lbsvc-lb", "defaultAttachmentProvider=underlay.default",
		"forwardingSysctls=all", "maxConcurrentReconciles=8", "priorityClassName=lbsvc-test",
		"nodeSelector.kubernetes\\.io/os=linux", "tolerations[0].key=node-role.kubernetes.io/control-plane",
		"tolerations[0].operator=Exists", "tolerations[0].effect=NoSchedule",
		"affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].weight=100",
		"affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].podAffinityTerm.topologyKey=kubernetes.io/hostname",
		"imagePullSecrets[0].name=regcred", "podAnnotations.a=b", "podLabels.c=d", "serviceAccount.annotations.e=f",
		"prometheus.serviceMonitor.enabled=true", "prometheus.prometheusRule.enabled=true")
	sent := map[string]bool{}
	for id, o := range objs {
		u := &unstructured.Unstructured{Object: o}
		if strings.HasPrefix(u.GetAPIVersion(), "monitoring.coreos.com/") {
			continue
		}
		var opts []client.CreateOption
		if u.GetKind() != "CustomResourceDefinition" {
			opts = append(opts, client.DryRunAll)
		}
		if err := c.Create(ctx, u, opts...); err != nil {
			t.Errorf("%s: %v", id, err)
		}
		sent[u.GetKind()] = true
	}
	for _, kind := range []string{"CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
		"ServiceAccount", "Deployment", "Service", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} {
		if !sent[kind] {
			t.Errorf("no %s sent to the API server", kind)
		}
	}
}
