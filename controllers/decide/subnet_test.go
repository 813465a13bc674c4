package decide

import (
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
	"github.com/lbsvc/lbsvc-operator/controllers/ipam"
)

func svcWith(typ corev1.ServiceType, class *string, ann map[string]string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "s", Namespace: "ns", Annotations: ann},
		Spec:       corev1.ServiceSpec{Type: typ, LoadBalancerClass: class},
	}
}

func TestServiceProvider(t *testing.T) {
	ann := map[string]string{lbv1.AttachmentProviderAnnotation: "nad.kube-system"}
	tests := map[string]struct {
		svc          *corev1.Service
		def          string
		wantProvider string
		wantServed   bool
	}{
		"annotated":                {svcWith(corev1.ServiceTypeLoadBalancer, nil, ann), "", "nad.kube-system", true},
		"annotated, our class":     {svcWith(corev1.ServiceTypeLoadBalancer, ptr.To(lbv1.LoadBalancerClass), ann), "", "nad.kube-system", true},
		"annotated, foreign class": {svcWith(corev1.ServiceTypeLoadBalancer, ptr.To("metallb.io/l2"), ann), "", "", false},
		"not a load balancer":      {svcWith(corev1.ServiceTypeNodePort, nil, ann), "", "", false},
		"no annotation":            {svcWith(corev1.ServiceTypeLoadBalancer, nil, nil), "", "", false},
		"no annotation, default":   {svcWith(corev1.ServiceTypeLoadBalancer, nil, nil), "d.net", "d.net", true},
		"default, foreign class":   {svcWith(corev1.ServiceTypeLoadBalancer, ptr.To("other"), nil), "d.net", "", false},
		"annotation wins":          {svcWith(corev1.ServiceTypeLoadBalancer, nil, ann), "d.net", "nad.kube-system", true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p, ok := ServiceProvider(tc.svc, tc.def)
			if p != tc.wantProvider || ok != tc.wantServed {
				t.Errorf("got %q %v, want %q %v", p, ok, tc.wantProvider, tc.wantServed)
			}
		})
	}
}

func TestSplitProvider(t *testing.T) {
	for in, want := range map[string][2]string{
		"lb-svc-attachment.kube-system": {"lb-svc-attachment", "kube-system"},
		"my.dotted.nad.ns":              {"my.dotted.nad", "ns"},
	} {
		n, ns, err := SplitProvider(in)
		if err != nil || n != want[0] || ns != want[1] {
			t.Errorf("%q: %q %q %v", in, n, ns, err)
		}
	}
	for _, in := range []string{"nodot", ".ns", "nad."} {
		_, _, err := SplitProvider(in)
		var ref *Refusal
		if !errors.As(err, &ref) || ref.Reason != ReasonInvalidProvider {
			t.Errorf("%q: %v", in, err)
		}
	}
}

func subnet(name, provider string, namespaces ...string) lbv1.Subnet {
	return lbv1.Subnet{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: lbv1.SubnetSpec{Provider: provider, CIDRBlock: "10.0.0.0/24", Namespaces: namespaces}}
}

func TestChooseSubnet(t *testing.T) {
	const p = "nad.net"
	ls := p + ".kubernetes.io/logical_switch"
	tests := map[string]struct {
		ann        map[string]string
		subnets    []lbv1.Subnet
		want       string
		wantReason string
		wantMsg    string
	}{
		"only one":   {subnets: []lbv1.Subnet{subnet("a", p), subnet("x", "other.net")}, want: "a"},
		"none":       {subnets: []lbv1.Subnet{subnet("x", "other.net")}, wantReason: ReasonSubnetNotFound, wantMsg: `no subnet has provider "nad.net": create a Subnet with spec.provider "nad.net"`},
		"ambiguous":  {subnets: []lbv1.Subnet{subnet("b", p), subnet("a", p)}, wantReason: ReasonSubnetAmbiguous, wantMsg: `subnets a, b all have provider "nad.net": name one with annotation ` + ls},
		"named":      {ann: map[string]string{ls: "b"}, subnets: []lbv1.Subnet{subnet("a", p), subnet("b", p)}, want: "b"},
		"named gone": {ann: map[string]string{ls: "c"}, subnets: []lbv1.Subnet{subnet("a", p)}, wantReason: ReasonSubnetNotFound, wantMsg: `subnet "c" named by annotation ` + ls + ` does not exist: create it, or correct or remove the annotation`},
		"named, other provider": {ann: map[string]string{ls: "x"}, subnets: []lbv1.Subnet{subnet("x", "other.net")},
			wantReason: ReasonSubnetProviderMismatch, wantMsg: `subnet "x" has provider "other.net", not "nad.net"`},
		"namespace allowed": {subnets: []lbv1.Subnet{subnet("a", p, "x", "ns")}, want: "a"},
		"namespace refused": {subnets: []lbv1.Subnet{subnet("a", p, "x", "y")}, wantReason: ReasonNamespaceNotAllowed,
			wantMsg: `subnet "a" does not serve namespace "ns" (see the subnet's spec.namespaces)`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			s, err := ChooseSubnet(svcWith(corev1.ServiceTypeLoadBalancer, nil, tc.ann), p, tc.subnets)
			if tc.wantReason == "" {
				if err != nil || s == nil || s.Name != tc.want {
					t.Fatalf("got %v %v, want %s", s, err, tc.want)
				}
				return
			}
			var ref *Refusal
			if !errors.As(err, &ref) || ref.Reason != tc.wantReason || ref.Message != tc.wantMsg {
				t.Fatalf("got %v, want %s: %s", err, tc.wantReason, tc.wantMsg)
			}
		})
	}
}

func TestValidateSubnet(t *testing.T) {
	at := func(name, cidr, gw string, ex []string, age int) lbv1.Subnet {
		return lbv1.Subnet{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(time.Unix(int64(1000+age), 0))},
			Spec: lbv1.SubnetSpec{Provider: "p.n", CIDRBlock: cidr, Gateway: gw, ExcludeIPs: ex}}
	}
	old := at("old", "10.0.0.0/24", "", nil, 0)
	young := at("young", "10.0.0.128/25", "", nil, 5)
	disjoint := at("disjoint", "10.0.1.0/24", "", nil, 6)
	gwOut := at("gw-out", "10.0.2.0/24", "10.9.9.9", nil, 7)
	exOut := at("ex-out", "10.0.3.0/24", "", []string{"10.9.9.1..10.9.9.5"}, 8)
	all := []lbv1.Subnet{old, young, disjoint, gwOut, exOut}
	tests := map[string]struct {
		s          lbv1.Subnet
		wantReason string
		wantMsg    string
	}{
		"older of two overlapping is valid": {s: old},
		"younger overlaps": {s: young, wantReason: ReasonSubnetOverlap,
			wantMsg: `subnet "young" (10.0.0.128/25) overlaps older subnet(s) old`},
		"disjoint":      {s: disjoint},
		"gateway out":   {s: gwOut, wantReason: ReasonSubnetInvalid},
		"exclusion out": {s: exOut, wantReason: ReasonSubnetInvalid},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := ValidateSubnet(&tc.s, all)
			if tc.wantReason == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			var ref *Refusal
			if !errors.As(err, &ref) || ref.Reason != tc.wantReason || (tc.wantMsg != "" && ref.Message != tc.wantMsg) {
				t.Fatalf("got %v, want %s %s", err, tc.wantReason, tc.wantMsg)
			}
		})
	}
}

func TestAllocationRefusal(t *testing.T) {
	for sentinel, want := range map[error]string{
		ipam.ErrOutOfRange: ReasonAddressOutOfRange, ipam.ErrExcluded: ReasonAddressExcluded,
		ipam.ErrGateway: ReasonAddressIsGateway, ipam.ErrReserved: ReasonAddressReserved,
		ipam.ErrInUse: ReasonAddressInUse, ipam.ErrExhausted: ReasonSubnetExhausted,
		ipam.ErrFamily: ReasonAddressFamily, ipam.ErrUnknownSubnet: ReasonSubnetNotReady,
		errors.New("other"): ReasonAllocationFailed,
	} {
		err := fmt.Errorf(`subnet "s": 10.0.0.1: %w`, sentinel)
		ref := AllocationRefusal(err)
		if ref.Reason != want || ref.Message != err.Error() {
			t.Errorf("%v: %s %q", sentinel, ref.Reason, ref.Message)
		}
	}
}

// An address held by someone else is refused naming where the Service asked for it, and the IP
// object, never the other Service.
func TestInUse(t *testing.T) {
	addr := netip.MustParseAddr("fd00::5")
	for name, tc := range map[string]struct {
		from     string
		draining bool
		want     Refusal
	}{
		"field, held": {FromLoadBalancerIP, false, Refusal{ReasonAddressInUse,
			"spec.loadBalancerIP fd00::5 is held by another Service (kubectl get ip fd00-0000-0000-0000-0000-0000-0000-0005)"}},
		"annotation, held": {FromLoadBalancerIPs, false, Refusal{ReasonAddressInUse,
			"annotation lbsvc.io/loadBalancerIPs fd00::5 is held by another Service (kubectl get ip fd00-0000-0000-0000-0000-0000-0000-0005)"}},
		"annotation, draining": {FromLoadBalancerIPs, true, Refusal{ReasonAddressDraining,
			"annotation lbsvc.io/loadBalancerIPs fd00::5 is draining: an lb pod that held it still exists; this Service gets it once that pod is gone (kubectl get ip fd00-0000-0000-0000-0000-0000-0000-0005)"}},
	} {
		if got := InUse(tc.from, addr, tc.draining); *got != tc.want {
			t.Errorf("%s:\n got %v\nwant %v", name, got, &tc.want)
		}
	}
}
