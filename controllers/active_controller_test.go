package controllers

import (
	"testing"

	"github.com/lbsvc/lbsvc-operator/controllers/decide"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestActiveInputsChanged(t *testing.T) {
	base := func() *corev1.Service {
		s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "s", Generation: 1,
			Labels:      map[string]string{"team": "a"},
			Annotations: map[string]string{"lbsvc.io/allocated-ips": "172.18.0.18", "lbsvc.io/active-pod": "default/p", "other": "x"}}}
		s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "172.18.0.18"}, {IP: "fd00::18"}}
		s.Status.Conditions = []metav1.Condition{
			{Type: decide.ConditionAddressAllocated, Status: metav1.ConditionTrue, Reason: "Allocated", ObservedGeneration: 1},
			{Type: decide.ConditionLBPodAvailable, Status: metav1.ConditionFalse, Reason: "Starting", ObservedGeneration: 1},
		}
		return s
	}
	for _, tc := range []struct {
		name   string
		change func(*corev1.Service)
		want   bool
	}{
		{"nothing", func(*corev1.Service) {}, false},
		{"a label", func(s *corev1.Service) { s.Labels["team"] = "b" }, false},
		{"an annotation not ours", func(s *corev1.Service) { s.Annotations["other"] = "y" }, false},
		{"the LBPodAvailable condition", func(s *corev1.Service) { s.Status.Conditions[1].Status = metav1.ConditionTrue }, false},
		{"the ingress", func(s *corev1.Service) {
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "172.18.0.19"}}
		}, true},
		{"the ingress, reordered", func(s *corev1.Service) {
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "fd00::18"}, {IP: "172.18.0.18"}}
		}, false},
		{"the generation", func(s *corev1.Service) { s.Generation = 2 }, true},
		{"deletion", func(s *corev1.Service) { now := metav1.Now(); s.DeletionTimestamp = &now }, true},
		// The mirror is never read: a tenant who edits it moves nothing the controller shows.
		{"the mirror annotation, edited by hand", func(s *corev1.Service) { s.Annotations["lbsvc.io/allocated-ips"] = "172.18.0.19" }, false},
		{"the active pod, edited by hand", func(s *corev1.Service) { s.Annotations["lbsvc.io/active-pod"] = "default/q" }, true},
		{"the active node appears", func(s *corev1.Service) { s.Annotations["lbsvc.io/active-node"] = "n1" }, true},
		{"AddressAllocated false", func(s *corev1.Service) { s.Status.Conditions[0].Status = metav1.ConditionFalse }, true},
		{"AddressAllocated reason", func(s *corev1.Service) { s.Status.Conditions[0].Reason = "Other" }, true},
		{"AddressAllocated gone", func(s *corev1.Service) { s.Status.Conditions = s.Status.Conditions[1:] }, true},
		{"AddressActive appears", func(s *corev1.Service) {
			s.Status.Conditions = append(s.Status.Conditions, metav1.Condition{Type: decide.ConditionAddressActive, Status: metav1.ConditionTrue})
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cur := base()
			tc.change(cur)
			if got := activeInputsChanged(base(), cur); got != tc.want {
				t.Errorf("activeInputsChanged = %v, want %v", got, tc.want)
			}
		})
	}
}
