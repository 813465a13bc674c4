package decide

import (
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
	"github.com/lbsvc/lbsvc-operator/controllers/ipam"
)

// validationReasons are every reason ValidateServiceInputs may return.
var validationReasons = []string{ReasonNoClusterIP, ReasonInvalidPorts, ReasonInvalidLoadBalancerIP,
	ReasonLoadBalancerIPConflict, ReasonInvalidSourceRanges, ReasonFamilyMismatch, ReasonAddressFamily}

// FuzzValidateServiceInputs feeds hostile Services (any ClusterIPs, ports, requested addresses in
// spec.loadBalancerIP or the annotation lbsvc.io/loadBalancerIPs, source ranges in the field or
// the annotation) against each kind of Subnet, and checks: no panic; a refusal has a known reason
// and a non-empty message of at most MaxMessageBytes of valid UTF-8; accepted inputs keep every
// promise of ValidatedService; the same input gives the same answer. Of the requested addresses:
// a refusal about them names its source, a conflict needs both set, and accepted addresses come
// from the annotation whenever it is set.
func FuzzValidateServiceInputs(f *testing.F) {
	f.Add(uint8(0), "10.96.0.10", "IPv4", "", "", "", "", []byte{0, 80, 0})
	f.Add(uint8(2), "fd00:96::10,10.96.0.10", "IPv6,IPv4", "172.18.0.5, fd00:18::5", "", "10.0.0.0/8\n::/0", "", []byte{1, 53, 1, 1, 53, 2})
	f.Add(uint8(1), "10.96.0.10", "IPv4", "", "", "", " 10.0.0.0/8 ,, 0.0.0.0/0", []byte{0, 0, 0})
	f.Add(uint8(0), "None", "", strings.Repeat("1", 300), "", "::ffff:10.0.0.0/104", "", []byte{})
	f.Add(uint8(2), "::ffff:10.96.0.10", "IPv4", "fd00:18::5%net1", "", "\xff\xfe/8", "１０.0.0.0/8", []byte{3, 0, 7})
	f.Add(uint8(2), "10.96.0.10,fd00:96::10", "IPv4,IPv6", "fd00:18::5,172.18.0.5", "172.18.0.5, fd00:18::5", "", "", []byte{0, 80, 0})
	f.Add(uint8(0), "10.96.0.10", "IPv4", "172.18.0.6", "172.18.0.5", "", "", []byte{0, 80, 0})
	f.Add(uint8(0), "10.96.0.10", "IPv4", "", "172.18.0.5,172.18.0.6", "", "", []byte{0, 80, 0})
	f.Add(uint8(2), "10.96.0.10", "IPv4", " ", "fd00:18::5", "", "", []byte{0, 80, 0})
	f.Fuzz(func(t *testing.T, subnetKind uint8, clusterIPs, ipFamilies, loadBalancerIP, lbIPsAnnotation, rangesField, rangesAnnotation string, portBytes []byte) {
		svc := validService()
		svc.Spec.ClusterIPs = nil
		if clusterIPs != "" {
			svc.Spec.ClusterIPs = strings.Split(clusterIPs, ",")
		}
		svc.Spec.ClusterIP = ""
		if len(svc.Spec.ClusterIPs) > 0 {
			svc.Spec.ClusterIP = svc.Spec.ClusterIPs[0]
		}
		svc.Spec.IPFamilies = nil
		for _, f := range strings.Split(ipFamilies, ",") {
			if f != "" {
				svc.Spec.IPFamilies = append(svc.Spec.IPFamilies, corev1.IPFamily(f))
			}
		}
		svc.Spec.LoadBalancerIP = loadBalancerIP
		if lbIPsAnnotation != "" {
			svc.Annotations[lbv1.LoadBalancerIPsAnnotation] = lbIPsAnnotation
		}
		if rangesField != "" {
			svc.Spec.LoadBalancerSourceRanges = strings.Split(rangesField, "\n")
		}
		if rangesAnnotation != "" {
			svc.Annotations[corev1.AnnotationLoadBalancerSourceRangesKey] = rangesAnnotation
		}
		// Three bytes per port: protocol selector, port high byte, port low byte.
		svc.Spec.Ports = nil
		for i := 0; i+2 < len(portBytes) && i < 3*64; i += 3 {
			proto := []corev1.Protocol{"", corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP, "ICMP"}[int(portBytes[i])%5]
			svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Protocol: proto, Port: int32(portBytes[i+1])<<8 | int32(portBytes[i+2])})
		}
		subnet := []ipam.SubnetConfig{subnetCfg(t, "172.18.0.0/16"), subnetCfg(t, "fd00:18::/64"), subnetCfg(t, "172.18.0.0/16", "fd00:18::/64")}[int(subnetKind)%3]

		got, ref := ValidateServiceInputs(svc, subnet)
		again, ref2 := ValidateServiceInputs(svc, subnet)
		if !reflect.DeepEqual(got, again) || !reflect.DeepEqual(ref, ref2) {
			t.Fatalf("not deterministic: %+v %v, then %+v %v", got, ref, again, ref2)
		}
		if ref != nil {
			if !slices.Contains(validationReasons, ref.Reason) {
				t.Fatalf("unknown reason %q", ref.Reason)
			}
			if ref.Message == "" || len(ref.Message) > MaxMessageBytes || !utf8.ValidString(ref.Message) {
				t.Fatalf("bad message (%d bytes, valid UTF-8 %v): %q", len(ref.Message), utf8.ValidString(ref.Message), ref.Message)
			}
			checkRequestedRefusal(t, ref, loadBalancerIP, lbIPsAnnotation)
			return
		}
		checkValidated(t, got, subnet)
		if len(got.Requested) > 0 && (got.RequestedFrom == FromLoadBalancerIPs) != (strings.TrimSpace(lbIPsAnnotation) != "") {
			t.Fatalf("requested %v from %q with annotation %q", got.Requested, got.RequestedFrom, lbIPsAnnotation)
		}
	})
}

// checkRequestedRefusal checks a refusal about the requested addresses: it names its source
// (the messages of ReasonAddressFamily and ReasonFamilyMismatch about a requested address too),
// and a conflict comes only with both sources set.
func checkRequestedRefusal(t *testing.T, ref *Refusal, field, annotation string) {
	t.Helper()
	named := strings.HasPrefix(ref.Message, FromLoadBalancerIPs) || strings.HasPrefix(ref.Message, FromLoadBalancerIP)
	switch ref.Reason {
	case ReasonInvalidLoadBalancerIP, ReasonLoadBalancerIPConflict:
		if !named {
			t.Fatalf("%s does not name its source: %q", ref.Reason, ref.Message)
		}
	}
	if ref.Reason == ReasonLoadBalancerIPConflict && (strings.TrimSpace(field) == "" || strings.TrimSpace(annotation) == "") {
		t.Fatalf("conflict with field %q and annotation %q", field, annotation)
	}
	if named && strings.HasPrefix(ref.Message, FromLoadBalancerIP) && strings.TrimSpace(field) == "" {
		t.Fatalf("names spec.loadBalancerIP, which is blank: %q", ref.Message)
	}
	if named && strings.HasPrefix(ref.Message, FromLoadBalancerIPs) && strings.TrimSpace(annotation) == "" {
		t.Fatalf("names the annotation, which is blank: %q", ref.Message)
	}
}

// checkValidated checks every promise of an accepted ValidatedService.
func checkValidated(t *testing.T, v ValidatedService, subnet ipam.SubnetConfig) {
	t.Helper()
	if len(v.ClusterIPs) == 0 || len(v.ClusterIPs) > 2 || (len(v.ClusterIPs) == 2 && !(v.ClusterIPs[0].Is4() && v.ClusterIPs[1].Is6())) {
		t.Fatalf("ClusterIPs %v: want one per family, IPv4 first", v.ClusterIPs)
	}
	for _, a := range v.ClusterIPs {
		if a.Is4In6() || a.Zone() != "" {
			t.Fatalf("ClusterIP %v", a)
		}
	}
	if len(v.Families) == 0 {
		t.Fatal("no family to allocate")
	}
	for i, f := range v.Families {
		if i > 0 && f <= v.Families[i-1] {
			t.Fatalf("families %v not IPv4 first and distinct", v.Families)
		}
		if !slices.ContainsFunc(subnet.CIDRs, func(p netip.Prefix) bool { return ipam.FamilyOf(p.Addr()) == f }) ||
			!slices.ContainsFunc(v.ClusterIPs, func(a netip.Addr) bool { return ipam.FamilyOf(a) == f }) {
			t.Fatalf("family %v not served by both subnet %v and ClusterIPs %v", f, subnet.CIDRs, v.ClusterIPs)
		}
	}
	if (len(v.Requested) == 0) != (v.RequestedFrom == "") {
		t.Fatalf("requested %v from %q", v.Requested, v.RequestedFrom)
	}
	for i, r := range v.Requested {
		if r.Is4In6() || r.Zone() != "" || !slices.Contains(v.Families, ipam.FamilyOf(r)) || (i > 0 && ipam.FamilyOf(r) <= ipam.FamilyOf(v.Requested[i-1])) {
			t.Fatalf("requested %v with families %v", v.Requested, v.Families)
		}
	}
	if len(v.SourceRanges) > MaxSourceRanges {
		t.Fatalf("%d source ranges", len(v.SourceRanges))
	}
	for i, p := range v.SourceRanges {
		if !p.IsValid() || p.Masked() != p || p.Addr().Is4In6() || p.Addr().Zone() != "" {
			t.Fatalf("source range %v not canonical", p)
		}
		if i > 0 && comparePrefixes(v.SourceRanges[i-1], p) >= 0 {
			t.Fatalf("source ranges %v not sorted and distinct", v.SourceRanges)
		}
		if p.Bits() > 0 && slices.Contains(v.SourceRanges, netip.PrefixFrom(p.Addr(), 0).Masked()) {
			t.Fatalf("source ranges %v: %v is inside its family's /0", v.SourceRanges, p)
		}
	}
}
