package decide

import (
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
	"github.com/lbsvc/lbsvc-operator/controllers/lbobjects"
)

func TestLegacyPeers(t *testing.T) {
	pod := func(ns string, wire string, mutate func(*corev1.Pod)) corev1.Pod {
		p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: ns, Labels: map[string]string{
			lbobjects.ManagedByLabel: lbobjects.ManagedByValue, lbv1.ComponentLabel: lbv1.ComponentLBPod,
		}}}
		if wire != "" {
			p.Labels[lbobjects.HAWireLabel] = wire
		}
		if mutate != nil {
			mutate(&p)
		}
		return p
	}
	marked := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{lbobjects.HALegacyPeersAnnotation: "true"}}}
	plain := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{lbobjects.ServiceUIDAnnotation: "u"}}}
	for name, tc := range map[string]struct {
		deploy *appsv1.Deployment
		pods   []corev1.Pod
		want   bool
	}{
		"a fresh claim: nothing yet":                     {nil, nil, false},
		"every pod of this version":                      {plain, []corev1.Pod{pod("team", "2", nil), pod("team", "2", nil)}, false},
		"an upgrade: a pod from before authentication":   {plain, []corev1.Pod{pod("team", "2", nil), pod("team", "", nil)}, true},
		"the Deployment says so, the old pods are gone":  {marked, []corev1.Pod{pod("team", "2", nil)}, true},
		"an old pod that finished holds nothing":         {plain, []corev1.Pod{pod("team", "", func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded })}, false},
		"a pod outside the lb pod namespace is not ours": {plain, []corev1.Pod{pod("elsewhere", "", nil)}, false},
		"a pod without our labels is not ours":           {plain, []corev1.Pod{pod("team", "", func(p *corev1.Pod) { delete(p.Labels, lbobjects.ManagedByLabel) })}, false},
		"another wire version is no version 2 replica":   {plain, []corev1.Pod{pod("team", "1", nil)}, true},
		"an annotation other than true does not count":   {&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{lbobjects.HALegacyPeersAnnotation: "yes"}}}, nil, false},
	} {
		if got := LegacyPeers(tc.deploy, tc.pods, "team"); got != tc.want {
			t.Errorf("%s: LegacyPeers = %v, want %v", name, got, tc.want)
		}
	}
}
