package decide

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
	"github.com/lbsvc/lbsvc-operator/controllers/ipam"
)

// Adoption takes only a Service we serve whose annotation equals its ingress, from a Subnet that
// exists and holds the addresses; anything else, however its annotations were written, is left
// alone (another controller's ingress is not ours to tear down, and a name no IP object can carry
// must not stop the operator's start).
func TestAdoptable(t *testing.T) {
	subnets := map[string]ipam.SubnetConfig{
		"net": {Name: "net", CIDRs: []netip.Prefix{netip.MustParsePrefix("172.18.0.0/24"), netip.MustParsePrefix("fd00:172:18::/64")}},
	}
	ours := func(mod func(*corev1.Service)) *corev1.Service {
		s := svcWith(corev1.ServiceTypeLoadBalancer, nil, map[string]string{
			lbv1.AttachmentProviderAnnotation: "nad.kube-system",
			lbv1.AllocatedIPsAnnotation:       "172.18.0.6,fd00:172:18::6",
			lbv1.AllocatedSubnetAnnotation:    "net",
		})
		s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "172.18.0.6"}, {IP: "fd00:172:18::6"}}
		if mod != nil {
			mod(s)
		}
		return s
	}
	both := []netip.Addr{netip.MustParseAddr("172.18.0.6"), netip.MustParseAddr("fd00:172:18::6")}
	for name, tc := range map[string]struct {
		svc  *corev1.Service
		def  string
		want []netip.Addr
	}{
		"ours, annotation equals ingress":           {ours(nil), "", both},
		"our class":                                 {ours(func(s *corev1.Service) { s.Spec.LoadBalancerClass = ptr.To(lbv1.LoadBalancerClass) }), "", both},
		"served by the default provider":            {ours(func(s *corev1.Service) { delete(s.Annotations, lbv1.AttachmentProviderAnnotation) }), "nad.kube-system", both},
		"another class (MetalLB wrote the ingress)": {ours(func(s *corev1.Service) { s.Spec.LoadBalancerClass = ptr.To("metallb.io/l2") }), "", nil},
		"no provider and no default":                {ours(func(s *corev1.Service) { delete(s.Annotations, lbv1.AttachmentProviderAnnotation) }), "", nil},
		"not a load balancer":                       {ours(func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeClusterIP }), "", nil},
		"being deleted":                             {ours(func(s *corev1.Service) { s.DeletionTimestamp = &metav1.Time{Time: time.Now()} }), "", nil},
		"annotation without ingress":                {ours(func(s *corev1.Service) { s.Status.LoadBalancer.Ingress = nil }), "", nil},
		"annotation names one of two":               {ours(func(s *corev1.Service) { s.Annotations[lbv1.AllocatedIPsAnnotation] = "172.18.0.6" }), "", nil},
		"annotation names another address":          {ours(func(s *corev1.Service) { s.Annotations[lbv1.AllocatedIPsAnnotation] = "172.18.0.7,fd00:172:18::6" }), "", nil},
		"annotation repeats an address": {ours(func(s *corev1.Service) {
			s.Annotations[lbv1.AllocatedIPsAnnotation] = "172.18.0.6,172.18.0.6"
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "172.18.0.6"}, {IP: "172.18.0.6"}}
		}), "", nil},
		"no Subnet annotation":     {ours(func(s *corev1.Service) { delete(s.Annotations, lbv1.AllocatedSubnetAnnotation) }), "", nil},
		"a Subnet that is not":     {ours(func(s *corev1.Service) { s.Annotations[lbv1.AllocatedSubnetAnnotation] = "gone" }), "", nil},
		"a name no IP could carry": {ours(func(s *corev1.Service) { s.Annotations[lbv1.AllocatedSubnetAnnotation] = strings.Repeat("n", 254) }), "", nil},
		"an address outside the Subnet": {ours(func(s *corev1.Service) {
			s.Annotations[lbv1.AllocatedIPsAnnotation] = "10.0.0.6"
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "10.0.0.6"}}
		}), "", nil},
		"garbage annotation": {ours(func(s *corev1.Service) { s.Annotations[lbv1.AllocatedIPsAnnotation] = "not an address" }), "", nil},
	} {
		if got := Adoptable(tc.svc, tc.def, subnets); !slices.Equal(got, tc.want) {
			t.Errorf("%s: adopts %v, want %v", name, got, tc.want)
		}
	}
}
