package controllers

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Only what changes where an lb pod may be scheduled wakes Services: not a heartbeat.
func TestPlacementChanged(t *testing.T) {
	base := func() *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", ResourceVersion: "1", Labels: map[string]string{"vlan/100": "true"}},
			Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
	}
	for name, tc := range map[string]struct {
		edit func(*corev1.Node)
		want bool
	}{
		"a heartbeat (new resourceVersion only)": {func(n *corev1.Node) { n.ResourceVersion = "2" }, false},
		"an annotation":                          {func(n *corev1.Node) { n.Annotations = map[string]string{"a": "b"} }, false},
		"a label added":                          {func(n *corev1.Node) { n.Labels["zone"] = "a" }, true},
		"a label removed":                        {func(n *corev1.Node) { n.Labels = nil }, true},
		"cordoned":                               {func(n *corev1.Node) { n.Spec.Unschedulable = true }, true},
		"not Ready":                              {func(n *corev1.Node) { n.Status.Conditions[0].Status = corev1.ConditionUnknown }, true},
		"tainted NoSchedule": {func(n *corev1.Node) {
			n.Spec.Taints = []corev1.Taint{{Key: "k", Effect: corev1.TaintEffectNoSchedule}}
		}, true},
		"tainted PreferNoSchedule": {func(n *corev1.Node) {
			n.Spec.Taints = []corev1.Taint{{Key: "k", Effect: corev1.TaintEffectPreferNoSchedule}}
		}, false},
	} {
		t.Run(name, func(t *testing.T) {
			old, cur := base(), base()
			tc.edit(cur)
			if got := placementChanged(old, cur); got != tc.want {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}
