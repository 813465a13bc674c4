package decide

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
	"github.com/lbsvc/lbsvc-operator/controllers/ipam"
)

// validService is a served IPv4 Service with one TCP port; opts change it.
func validService(opts ...func(*corev1.Service)) *corev1.Service {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web", Annotations: map[string]string{}},
		Spec: corev1.ServiceSpec{
			Type:       corev1.ServiceTypeLoadBalancer,
			ClusterIP:  "10.96.0.10",
			ClusterIPs: []string{"10.96.0.10"},
			IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol},
			Ports:      []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}},
		},
	}
	for _, o := range opts {
		o(svc)
	}
	return svc
}

func dualStack(svc *corev1.Service) {
	svc.Spec.ClusterIPs = []string{"fd00:96::10", "10.96.0.10"}
	svc.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol, corev1.IPv4Protocol}
}

func ipv6Only(svc *corev1.Service) {
	svc.Spec.ClusterIP, svc.Spec.ClusterIPs = "fd00:96::10", []string{"fd00:96::10"}
	svc.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol}
}

func lbIP(s string) func(*corev1.Service) {
	return func(svc *corev1.Service) { svc.Spec.LoadBalancerIP = s }
}

func lbIPsAnnotation(s string) func(*corev1.Service) {
	return func(svc *corev1.Service) { svc.Annotations[lbv1.LoadBalancerIPsAnnotation] = s }
}

func sourceRanges(r ...string) func(*corev1.Service) {
	return func(svc *corev1.Service) { svc.Spec.LoadBalancerSourceRanges = r }
}

func sourceRangesAnnotation(s string) func(*corev1.Service) {
	return func(svc *corev1.Service) { svc.Annotations[corev1.AnnotationLoadBalancerSourceRangesKey] = s }
}

func ports(p ...corev1.ServicePort) func(*corev1.Service) {
	return func(svc *corev1.Service) { svc.Spec.Ports = p }
}

func subnetCfg(t testing.TB, cidrs ...string) ipam.SubnetConfig {
	t.Helper()
	cfg, err := ipam.ParseSubnet("sn", "", strings.Join(cidrs, ","), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func prefixes(s ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(s))
	for i, p := range s {
		out[i] = netip.MustParsePrefix(p)
	}
	return out
}

func addrs(s ...string) []netip.Addr {
	out := make([]netip.Addr, len(s))
	for i, a := range s {
		out[i] = netip.MustParseAddr(a)
	}
	return out
}

func TestValidateServiceInputs(t *testing.T) {
	v4 := subnetCfg(t, "172.18.0.0/16")
	v6 := subnetCfg(t, "fd00:18::/64")
	dual := subnetCfg(t, "172.18.0.0/16", "fd00:18::/64")
	long := strings.Repeat("x", 20000)
	tests := map[string]struct {
		svc    *corev1.Service
		subnet ipam.SubnetConfig
		want   ValidatedService
		reason string
		msg    string // the whole message
	}{
		// Accepted.
		"the seed's Service": {
			svc: validService(), subnet: v4,
			want: ValidatedService{ClusterIPs: addrs("10.96.0.10"), Families: []ipam.Family{ipam.IPv4}},
		},
		"clusterIP only (older objects)": {
			svc: validService(func(s *corev1.Service) { s.Spec.ClusterIPs = nil }), subnet: v4,
			want: ValidatedService{ClusterIPs: addrs("10.96.0.10"), Families: []ipam.Family{ipam.IPv4}},
		},
		"Dual Subnet, IPv4-only Service: the IPv4 address only": {
			svc: validService(), subnet: dual,
			want: ValidatedService{ClusterIPs: addrs("10.96.0.10"), Families: []ipam.Family{ipam.IPv4}},
		},
		"Dual Subnet, IPv6-only Service: the IPv6 address only": {
			svc: validService(ipv6Only), subnet: dual,
			want: ValidatedService{ClusterIPs: addrs("fd00:96::10"), Families: []ipam.Family{ipam.IPv6}},
		},
		"Dual Subnet, dual-stack Service (IPv6 primary): both, IPv4 first": {
			svc: validService(dualStack), subnet: dual,
			want: ValidatedService{ClusterIPs: addrs("10.96.0.10", "fd00:96::10"), Families: []ipam.Family{ipam.IPv4, ipam.IPv6}},
		},
		"IPv6 Subnet, dual-stack Service: IPv6 only": {
			svc: validService(dualStack), subnet: v6,
			want: ValidatedService{ClusterIPs: addrs("10.96.0.10", "fd00:96::10"), Families: []ipam.Family{ipam.IPv6}},
		},
		"static addresses for Dual, IPv6 first, with spaces": {
			svc: validService(dualStack, lbIP(" fd00:18::5 , 172.18.0.5 ")), subnet: dual,
			want: ValidatedService{ClusterIPs: addrs("10.96.0.10", "fd00:96::10"), Requested: addrs("172.18.0.5", "fd00:18::5"),
				RequestedFrom: FromLoadBalancerIP, Families: []ipam.Family{ipam.IPv4, ipam.IPv6}},
		},
		"static IPv4 on a Dual Subnet and dual-stack Service: IPv6 stays dynamic": {
			svc: validService(dualStack, lbIP("172.18.0.5")), subnet: dual,
			want: ValidatedService{ClusterIPs: addrs("10.96.0.10", "fd00:96::10"), Requested: addrs("172.18.0.5"),
				RequestedFrom: FromLoadBalancerIP, Families: []ipam.Family{ipam.IPv4, ipam.IPv6}},
		},
		"blank loadBalancerIP is dynamic": {
			svc: validService(lbIP("  ")), subnet: v4,
			want: ValidatedService{ClusterIPs: addrs("10.96.0.10"), Families: []ipam.Family{ipam.IPv4}},
		},
		"source ranges canonical: masked, sorted, deduplicated": {
			svc:    validService(sourceRanges(" fd00::1/64", "10.1.2.3/8 ", "fd00::/64", "10.0.0.0/8", "10.0.0.0/16", "192.168.1.7/32")),
			subnet: v4,
			want: ValidatedService{ClusterIPs: addrs("10.96.0.10"), Families: []ipam.Family{ipam.IPv4},
				SourceRanges: prefixes("10.0.0.0/8", "10.0.0.0/16", "192.168.1.7/32", "fd00::/64")},
		},
		"source ranges: a /0 is kept and holds the other ranges of its family": {
			svc:    validService(sourceRanges("fd00::/64", "10.0.0.0/8", "0.0.0.0/0", "192.168.1.7/32", "1.2.3.4/0")),
			subnet: v4,
			want: ValidatedService{ClusterIPs: addrs("10.96.0.10"), Families: []ipam.Family{ipam.IPv4},
				SourceRanges: prefixes("0.0.0.0/0", "fd00::/64")},
		},
		"source ranges: ::/0 alone": {
			svc:    validService(sourceRangesAnnotation("::/0")),
			subnet: v4,
			want: ValidatedService{ClusterIPs: addrs("10.96.0.10"), Families: []ipam.Family{ipam.IPv4},
				SourceRanges: prefixes("::/0")},
		},
		"source ranges from the annotation, whitespace tolerated": {
			svc:    validService(sourceRangesAnnotation("  10.0.0.0/8 ,\t192.168.0.0/16\n")),
			subnet: v4,
			want: ValidatedService{ClusterIPs: addrs("10.96.0.10"), Families: []ipam.Family{ipam.IPv4},
				SourceRanges: prefixes("10.0.0.0/8", "192.168.0.0/16")},
		},
		"the field wins over the annotation (the annotation is not read)": {
			svc:    validService(sourceRanges("10.0.0.0/8"), sourceRangesAnnotation("garbage")),
			subnet: v4,
			want: ValidatedService{ClusterIPs: addrs("10.96.0.10"), Families: []ipam.Family{ipam.IPv4},
				SourceRanges: prefixes("10.0.0.0/8")},
		},
		"blank annotation allows everyone": {
			svc: validService(sourceRangesAnnotation("   ")), subnet: v4,
			want: ValidatedService{ClusterIPs: addrs("10.96.0.10"), Families: []ipam.Family{ipam.IPv4}},
		},
		"SCTP, UDP and TCP on one port number; empty protocol is TCP": {
			svc: validService(ports(corev1.ServicePort{Port: 53, Protocol: corev1.ProtocolUDP}, corev1.ServicePort{Port: 53},
				corev1.ServicePort{Port: 53, Protocol: corev1.ProtocolSCTP}, corev1.ServicePort{Port: 65535, Protocol: corev1.ProtocolTCP})),
			subnet: v4,
			want:   ValidatedService{ClusterIPs: addrs("10.96.0.10"), Families: []ipam.Family{ipam.IPv4}},
		},

		// No ClusterIP.
		"ExternalName": {
			svc: validService(func(s *corev1.Service) {
				s.Spec.Type, s.Spec.ClusterIP, s.Spec.ClusterIPs = corev1.ServiceTypeExternalName, "", nil
			}),
			subnet: v4, reason: ReasonNoClusterIP,
			msg: "an ExternalName Service has no ClusterIP for the lb pod to forward to",
		},
		"headless": {
			svc:    validService(func(s *corev1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "None", []string{"None"} }),
			subnet: v4, reason: ReasonNoClusterIP,
			msg: "spec.clusterIP is None: a headless Service has no ClusterIP for the lb pod to forward to",
		},
		"not allocated yet": {
			svc:    validService(func(s *corev1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "", nil }),
			subnet: v4, reason: ReasonNoClusterIP,
			msg: "spec.clusterIPs is empty: the Service has no ClusterIP (yet) for the lb pod to forward to",
		},
		"ClusterIP garbage, quoted by its prefix": {
			svc:    validService(func(s *corev1.Service) { s.Spec.ClusterIPs = []string{long} }),
			subnet: v4, reason: ReasonNoClusterIP,
			msg: `spec.clusterIPs[0] "` + strings.Repeat("x", 64) + `"... (20000 bytes) is not an IP address`,
		},
		"ClusterIP IPv4-mapped": {
			svc:    validService(func(s *corev1.Service) { s.Spec.ClusterIPs = []string{"::ffff:10.96.0.10"} }),
			subnet: v4, reason: ReasonNoClusterIP,
			msg: `spec.clusterIPs[0] "::ffff:10.96.0.10" is not an IP address`,
		},
		"two IPv4 ClusterIPs": {
			svc:    validService(func(s *corev1.Service) { s.Spec.ClusterIPs = []string{"10.96.0.10", "10.96.0.11"} }),
			subnet: v4, reason: ReasonNoClusterIP,
			msg: "spec.clusterIPs has two IPv4 addresses; at most one per family",
		},

		// Ports.
		"no ports": {
			svc: validService(ports()), subnet: v4, reason: ReasonInvalidPorts,
			msg: "spec.ports is empty: the lb pod has nothing to forward",
		},
		"port 0": {
			svc:    validService(ports(corev1.ServicePort{Port: 80}, corev1.ServicePort{Port: 0, Protocol: corev1.ProtocolUDP})),
			subnet: v4, reason: ReasonInvalidPorts,
			msg: "spec.ports[1].port 0 is outside 1-65535",
		},
		"port 65536": {
			svc:    validService(ports(corev1.ServicePort{Port: 65536})),
			subnet: v4, reason: ReasonInvalidPorts,
			msg: "spec.ports[0].port 65536 is outside 1-65535",
		},
		"unknown protocol": {
			svc:    validService(ports(corev1.ServicePort{Port: 80, Protocol: "ICMP"})),
			subnet: v4, reason: ReasonInvalidPorts,
			msg: `spec.ports[0].protocol "ICMP" is not TCP, UDP or SCTP`,
		},
		"lower-case protocol": {
			svc:    validService(ports(corev1.ServicePort{Port: 80, Protocol: "tcp"})),
			subnet: v4, reason: ReasonInvalidPorts,
			msg: `spec.ports[0].protocol "tcp" is not TCP, UDP or SCTP`,
		},
		"duplicate port, empty protocol meaning TCP": {
			svc:    validService(ports(corev1.ServicePort{Port: 80, Protocol: corev1.ProtocolTCP}, corev1.ServicePort{Port: 443}, corev1.ServicePort{Port: 80})),
			subnet: v4, reason: ReasonInvalidPorts,
			msg: "spec.ports[2] repeats 80/TCP of spec.ports[0]",
		},

		// spec.loadBalancerIP.
		"loadBalancerIP garbage": {
			svc: validService(lbIP("lb")), subnet: v4, reason: ReasonInvalidLoadBalancerIP,
			msg: `spec.loadBalancerIP: "lb" is not an IP address (unable to parse IP)`,
		},
		"loadBalancerIP of 20,000 characters": {
			svc: validService(lbIP(strings.Repeat("1", 20000))), subnet: v4, reason: ReasonInvalidLoadBalancerIP,
			msg: `spec.loadBalancerIP: "` + strings.Repeat("1", 64) + `"... (20000 bytes) is not an IP address (unable to parse IP)`,
		},
		"loadBalancerIP with a space instead of a comma": {
			svc: validService(lbIP("172.18.0.5 172.18.0.6")), subnet: v4, reason: ReasonInvalidLoadBalancerIP,
			msg: `spec.loadBalancerIP: "172.18.0.5 172.18.0.6" is not an IP address (unexpected character (at " 172.18.0.6"))`,
		},
		"loadBalancerIP with leading zeros": {
			svc: validService(lbIP("172.18.0.05")), subnet: v4, reason: ReasonInvalidLoadBalancerIP,
			msg: `spec.loadBalancerIP: "172.18.0.05" is not an IP address (IPv4 field has octet with leading zero)`,
		},
		"loadBalancerIP with a zone": {
			svc: validService(ipv6Only, lbIP("fd00:18::5%net1")), subnet: v6, reason: ReasonInvalidLoadBalancerIP,
			msg: `spec.loadBalancerIP: "fd00:18::5%net1" has an IPv6 zone, which an underlay address cannot have`,
		},
		"loadBalancerIP IPv4-mapped": {
			svc: validService(lbIP("::ffff:172.18.0.5")), subnet: v4, reason: ReasonInvalidLoadBalancerIP,
			msg: `spec.loadBalancerIP: "::ffff:172.18.0.5" is an IPv4-mapped IPv6 address; write it as IPv4 (172.18.0.5)`,
		},
		"loadBalancerIP trailing comma": {
			svc: validService(lbIP("172.18.0.5,")), subnet: v4, reason: ReasonInvalidLoadBalancerIP,
			msg: `spec.loadBalancerIP: address list "172.18.0.5," has an empty item`,
		},
		"loadBalancerIP two of one family": {
			svc: validService(lbIP("172.18.0.5,172.18.0.6")), subnet: v4, reason: ReasonInvalidLoadBalancerIP,
			msg: `spec.loadBalancerIP "172.18.0.5,172.18.0.6" has two IPv4 addresses; at most one per family`,
		},
		"loadBalancerIP three": {
			svc: validService(dualStack, lbIP("172.18.0.5,fd00:18::5,172.18.0.6")), subnet: dual, reason: ReasonInvalidLoadBalancerIP,
			msg: `spec.loadBalancerIP: address list "172.18.0.5,fd00:18::5,172.18.0.6" has 3 items; at most 2, one per family`,
		},

		// The annotation lbsvc.io/loadBalancerIPs, preferred over spec.loadBalancerIP.
		"annotation only": {
			svc: validService(dualStack, lbIPsAnnotation(" fd00:18::5 , 172.18.0.5 ")), subnet: dual,
			want: ValidatedService{ClusterIPs: addrs("10.96.0.10", "fd00:96::10"), Requested: addrs("172.18.0.5", "fd00:18::5"),
				RequestedFrom: FromLoadBalancerIPs, Families: []ipam.Family{ipam.IPv4, ipam.IPv6}},
		},
		"field only": {
			svc: validService(lbIP("172.18.0.5")), subnet: v4,
			want: ValidatedService{ClusterIPs: addrs("10.96.0.10"), Requested: addrs("172.18.0.5"),
				RequestedFrom: FromLoadBalancerIP, Families: []ipam.Family{ipam.IPv4}},
		},
		"both equal in another order": {
			svc: validService(dualStack, lbIPsAnnotation("172.18.0.5, fd00:18::5"), lbIP("fd00:18::5,172.18.0.5")), subnet: dual,
			want: ValidatedService{ClusterIPs: addrs("10.96.0.10", "fd00:96::10"), Requested: addrs("172.18.0.5", "fd00:18::5"),
				RequestedFrom: FromLoadBalancerIPs, Families: []ipam.Family{ipam.IPv4, ipam.IPv6}},
		},
		"blank annotation: the field is used": {
			svc: validService(lbIPsAnnotation("  "), lbIP("172.18.0.5")), subnet: v4,
			want: ValidatedService{ClusterIPs: addrs("10.96.0.10"), Requested: addrs("172.18.0.5"),
				RequestedFrom: FromLoadBalancerIP, Families: []ipam.Family{ipam.IPv4}},
		},
		"annotation with a blank field": {
			svc: validService(lbIPsAnnotation("172.18.0.5"), lbIP(" ")), subnet: v4,
			want: ValidatedService{ClusterIPs: addrs("10.96.0.10"), Requested: addrs("172.18.0.5"),
				RequestedFrom: FromLoadBalancerIPs, Families: []ipam.Family{ipam.IPv4}},
		},
		"both different: refused LoadBalancerIPConflict": {
			svc: validService(lbIPsAnnotation("172.18.0.5"), lbIP("172.18.0.6")), subnet: v4, reason: ReasonLoadBalancerIPConflict,
			msg: `annotation lbsvc.io/loadBalancerIPs "172.18.0.5" and spec.loadBalancerIP "172.18.0.6" ask for different addresses; remove spec.loadBalancerIP (deprecated upstream; the annotation takes its place)`,
		},
		"both different by one family: refused LoadBalancerIPConflict": {
			svc: validService(dualStack, lbIPsAnnotation("172.18.0.5,fd00:18::5"), lbIP("172.18.0.5")), subnet: dual,
			reason: ReasonLoadBalancerIPConflict,
			msg:    `annotation lbsvc.io/loadBalancerIPs "172.18.0.5,fd00:18::5" and spec.loadBalancerIP "172.18.0.5" ask for different addresses; remove spec.loadBalancerIP (deprecated upstream; the annotation takes its place)`,
		},
		"both different and long: each value quoted by its prefix": {
			svc: validService(lbIPsAnnotation("172.18.0.5"+strings.Repeat(" ", 20000)), lbIP(strings.Repeat(" ", 20000)+"172.18.0.6")), subnet: v4,
			reason: ReasonLoadBalancerIPConflict,
			msg: `annotation lbsvc.io/loadBalancerIPs "172.18.0.5` + strings.Repeat(" ", 54) + `"... (20010 bytes) and spec.loadBalancerIP "` +
				strings.Repeat(" ", 64) + `"... (20010 bytes) ask for different addresses; remove spec.loadBalancerIP (deprecated upstream; the annotation takes its place)`,
		},
		"bad annotation": {
			svc: validService(lbIPsAnnotation("172.18.0.05"), lbIP("172.18.0.5")), subnet: v4, reason: ReasonInvalidLoadBalancerIP,
			msg: `annotation lbsvc.io/loadBalancerIPs: "172.18.0.05" is not an IP address (IPv4 field has octet with leading zero)`,
		},
		"bad field beside a good annotation: the field is named": {
			svc: validService(lbIPsAnnotation("172.18.0.5"), lbIP("lb")), subnet: v4, reason: ReasonInvalidLoadBalancerIP,
			msg: `spec.loadBalancerIP: "lb" is not an IP address (unable to parse IP)`,
		},
		"annotation with two IPv4": {
			svc: validService(lbIPsAnnotation("172.18.0.5,172.18.0.6")), subnet: v4, reason: ReasonInvalidLoadBalancerIP,
			msg: `annotation lbsvc.io/loadBalancerIPs "172.18.0.5,172.18.0.6" has two IPv4 addresses; at most one per family`,
		},
		"annotation asks for a family the Service lacks": {
			svc: validService(lbIPsAnnotation("fd00:18::5")), subnet: dual, reason: ReasonFamilyMismatch,
			msg: "annotation lbsvc.io/loadBalancerIPs fd00:18::5 is IPv6 but the Service has no IPv6 ClusterIP (ipFamilies IPv4)",
		},
		"annotation asks for a family the Subnet lacks": {
			svc: validService(dualStack, lbIPsAnnotation("fd00:18::5")), subnet: v4, reason: ReasonAddressFamily,
			msg: `annotation lbsvc.io/loadBalancerIPs fd00:18::5 is IPv6 but subnet "sn" serves only IPv4`,
		},

		// Source ranges.
		"source range garbage": {
			svc: validService(sourceRanges("10.0.0.0/8", "garbage")), subnet: v4, reason: ReasonInvalidSourceRanges,
			msg: `spec.loadBalancerSourceRanges[1] "garbage" is not a CIDR (no '/')`,
		},
		"source range host address without a prefix": {
			svc: validService(sourceRanges("192.168.1.7")), subnet: v4, reason: ReasonInvalidSourceRanges,
			msg: `spec.loadBalancerSourceRanges[0] "192.168.1.7" is an address, not a CIDR; for this host alone write 192.168.1.7/32`,
		},
		"source range IPv6 host without a prefix": {
			svc: validService(sourceRanges("fd00::7")), subnet: v4, reason: ReasonInvalidSourceRanges,
			msg: `spec.loadBalancerSourceRanges[0] "fd00::7" is an address, not a CIDR; for this host alone write fd00::7/128`,
		},
		"source range IPv4-mapped": {
			svc: validService(sourceRanges("::ffff:10.0.0.0/104")), subnet: v4, reason: ReasonInvalidSourceRanges,
			msg: `spec.loadBalancerSourceRanges[0] "::ffff:10.0.0.0/104" is an IPv4-mapped IPv6 range; write it as IPv4 (10.0.0.0/8)`,
		},
		"source range IPv4-mapped, short prefix": {
			svc: validService(sourceRanges("::ffff:10.0.0.0/90")), subnet: v4, reason: ReasonInvalidSourceRanges,
			msg: `spec.loadBalancerSourceRanges[0] "::ffff:10.0.0.0/90" is an IPv4-mapped IPv6 range; write it as IPv4 (0.0.0.0/0)`,
		},
		"source range with a zone": {
			svc: validService(sourceRanges("fe80::/64%eth0")), subnet: v4, reason: ReasonInvalidSourceRanges,
			msg: `spec.loadBalancerSourceRanges[0] "fe80::/64%eth0" is not a CIDR (bad bits after slash: "64%eth0")`,
		},
		"source range leading zeros": {
			svc: validService(sourceRanges("010.0.0.0/8")), subnet: v4, reason: ReasonInvalidSourceRanges,
			msg: `spec.loadBalancerSourceRanges[0] "010.0.0.0/8" is not a CIDR (IPv4 field has octet with leading zero)`,
		},
		"source range prefix too long": {
			svc: validService(sourceRanges("10.0.0.0/33")), subnet: v4, reason: ReasonInvalidSourceRanges,
			msg: `spec.loadBalancerSourceRanges[0] "10.0.0.0/33" is not a CIDR (prefix length out of range)`,
		},
		"source range empty item in the field": {
			svc: validService(sourceRanges("10.0.0.0/8", "  ")), subnet: v4, reason: ReasonInvalidSourceRanges,
			msg: `spec.loadBalancerSourceRanges[1] "  " is empty`,
		},
		"annotation: stray comma": {
			svc: validService(sourceRangesAnnotation("10.0.0.0/8,,192.168.0.0/16")), subnet: v4, reason: ReasonInvalidSourceRanges,
			msg: `annotation service.beta.kubernetes.io/load-balancer-source-ranges item 2 "" is empty`,
		},
		"annotation: semicolons": {
			svc: validService(sourceRangesAnnotation("10.0.0.0/8;192.168.0.0/16")), subnet: v4, reason: ReasonInvalidSourceRanges,
			msg: `annotation service.beta.kubernetes.io/load-balancer-source-ranges item 1 "10.0.0.0/8;192.168.0.0/16" is not a CIDR (unexpected character (at "/8;192.168.0.0"))`,
		},
		"annotation: Unicode digits": {
			svc: validService(sourceRangesAnnotation("10.0.0.0/8, １０.0.0.0/8")), subnet: v4, reason: ReasonInvalidSourceRanges,
			msg: `annotation service.beta.kubernetes.io/load-balancer-source-ranges item 2 " １０.0.0.0/8" is not a CIDR (unexpected character (at "１０.0.0.0"))`,
		},
		"annotation: 20,000 characters": {
			svc: validService(sourceRangesAnnotation("10.0.0.0/8," + long)), subnet: v4, reason: ReasonInvalidSourceRanges,
			msg: `annotation service.beta.kubernetes.io/load-balancer-source-ranges item 2 "` + strings.Repeat("x", 64) + `"... (20000 bytes) is not a CIDR (no '/')`,
		},
		"too many source ranges": {
			svc: validService(sourceRangesAnnotation(strings.Repeat("10.0.0.0/8,", MaxSourceRanges) + "10.0.0.0/8")), subnet: v4,
			reason: ReasonInvalidSourceRanges,
			msg:    "annotation service.beta.kubernetes.io/load-balancer-source-ranges has 1025 source ranges; at most 1024",
		},

		// Families.
		"IPv6 Subnet, IPv4-only Service": {
			svc: validService(), subnet: v6, reason: ReasonFamilyMismatch,
			msg: `the Service has no IPv6 ClusterIP (ipFamilies IPv4) but subnet "sn" serves only IPv6`,
		},
		"IPv4 Subnet, IPv6-only Service without ipFamilies": {
			svc:    validService(ipv6Only, func(s *corev1.Service) { s.Spec.IPFamilies = nil }),
			subnet: v4, reason: ReasonFamilyMismatch,
			msg: `the Service has no IPv4 ClusterIP (ClusterIPs IPv6) but subnet "sn" serves only IPv4`,
		},
		"Dual Subnet, IPv6 address for an IPv4-only Service": {
			svc: validService(lbIP("fd00:18::5")), subnet: dual, reason: ReasonFamilyMismatch,
			msg: "spec.loadBalancerIP fd00:18::5 is IPv6 but the Service has no IPv6 ClusterIP (ipFamilies IPv4)",
		},
		"IPv4 Subnet, IPv6 address": {
			svc: validService(dualStack, lbIP("fd00:18::5")), subnet: v4, reason: ReasonAddressFamily,
			msg: `spec.loadBalancerIP fd00:18::5 is IPv6 but subnet "sn" serves only IPv4`,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, ref := ValidateServiceInputs(tc.svc, tc.subnet)
			if tc.reason != "" {
				if ref == nil || ref.Reason != tc.reason || ref.Message != tc.msg {
					t.Fatalf("refusal:\n got %v\nwant %s: %s", ref, tc.reason, tc.msg)
				}
				if !reflect.DeepEqual(got, ValidatedService{}) {
					t.Fatalf("a refusal came with inputs %+v", got)
				}
				return
			}
			if ref != nil {
				t.Fatalf("refused: %v", ref)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("\n got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestBoundedMessage(t *testing.T) {
	tests := map[string]struct{ in, want string }{
		"short":               {"subnet \"sn\" is gone", "subnet \"sn\" is gone"},
		"exactly the limit":   {strings.Repeat("a", MaxMessageBytes), strings.Repeat("a", MaxMessageBytes)},
		"one byte over":       {strings.Repeat("a", MaxMessageBytes+1), strings.Repeat("a", MaxMessageBytes-3) + "..."},
		"cut before a rune":   {strings.Repeat("a", MaxMessageBytes-4) + "😀😀", strings.Repeat("a", MaxMessageBytes-4) + "..."},
		"invalid UTF-8 fixed": {"a\xffb", "a\uFFFDb"},
		"40,000 bytes":        {strings.Repeat("é", 20000), strings.Repeat("é", (MaxMessageBytes-3)/2) + "..."},
	}
	for name, tc := range tests {
		got := BoundedMessage(tc.in)
		if got != tc.want {
			t.Errorf("%s: got %q (%d bytes), want %q", name, got, len(got), tc.want)
		}
		if len(got) > MaxMessageBytes || !utf8.ValidString(got) {
			t.Errorf("%s: %d bytes, valid UTF-8 %v", name, len(got), utf8.ValidString(got))
		}
	}
}

// TestValidatePortsCases checks every port problem on its own (ValidateServiceInputs stops at the
// first one).
func TestValidatePortsCases(t *testing.T) {
	tests := map[string]struct {
		ports []corev1.ServicePort
		msg   string // "" when valid
	}{
		"one of each protocol": {ports: []corev1.ServicePort{{Port: 1, Protocol: "TCP"}, {Port: 1, Protocol: "UDP"}, {Port: 1, Protocol: "SCTP"}}},
		"negative":             {ports: []corev1.ServicePort{{Port: -1}}, msg: "spec.ports[0].port -1 is outside 1-65535"},
		"UDP twice":            {ports: []corev1.ServicePort{{Port: 53, Protocol: "UDP"}, {Port: 53, Protocol: "UDP"}}, msg: "spec.ports[1] repeats 53/UDP of spec.ports[0]"},
		"long protocol":        {ports: []corev1.ServicePort{{Port: 1, Protocol: corev1.Protocol(strings.Repeat("P", 100))}}, msg: `spec.ports[0].protocol "` + strings.Repeat("P", 64) + `"... (100 bytes) is not TCP, UDP or SCTP`},
	}
	for name, tc := range tests {
		ref := ValidatePorts(tc.ports)
		switch {
		case tc.msg == "" && ref != nil:
			t.Errorf("%s: refused: %v", name, ref)
		case tc.msg != "" && (ref == nil || ref.Reason != ReasonInvalidPorts || ref.Message != tc.msg):
			t.Errorf("%s:\n got %v\nwant %s: %s", name, ref, ReasonInvalidPorts, tc.msg)
		}
	}
}

// TestSubnetNotUnicastRefused: a Subnet that could hand out loopback, multicast, link-local or
// unspecified addresses is refused with InvalidSpec, and the message names the range.
func TestSubnetNotUnicastRefused(t *testing.T) {
	tests := map[string]string{ // cidrBlock -> message
		"0.0.0.0/0":                 `subnet "bad": cidrBlock 0.0.0.0/0 overlaps the "this network" block (RFC 1122) 0.0.0.0/8, which cannot be an underlay address: invalid subnet configuration`,
		"127.0.0.0/8":               `subnet "bad": cidrBlock 127.0.0.0/8 overlaps the loopback block 127.0.0.0/8, which cannot be an underlay address: invalid subnet configuration`,
		"169.254.0.0/16":            `subnet "bad": cidrBlock 169.254.0.0/16 overlaps the link-local block 169.254.0.0/16, which cannot be an underlay address: invalid subnet configuration`,
		"172.18.0.0/16,fe80::/64":   `subnet "bad": cidrBlock fe80::/64 overlaps the link-local block fe80::/10, which cannot be an underlay address: invalid subnet configuration`,
		"::/0":                      `subnet "bad": cidrBlock ::/0 overlaps the unspecified address ::/128, which cannot be an underlay address: invalid subnet configuration`,
		"ff05::/16":                 `subnet "bad": cidrBlock ff05::/16 overlaps the multicast block ff00::/8, which cannot be an underlay address: invalid subnet configuration`,
		"240.0.0.0/8":               `subnet "bad": cidrBlock 240.0.0.0/8 overlaps the reserved block (RFC 1112, with the broadcast address 255.255.255.255) 240.0.0.0/4, which cannot be an underlay address: invalid subnet configuration`,
		"232.0.0.0/8,fd00:18::/64":  `subnet "bad": cidrBlock 232.0.0.0/8 overlaps the multicast block 224.0.0.0/4, which cannot be an underlay address: invalid subnet configuration`,
		"fd00:18::/64,192.0.2.0/24": "", // documentation ranges are allowed
	}
	for cidrBlock, want := range tests {
		s := lbv1.Subnet{ObjectMeta: metav1.ObjectMeta{Name: "bad"}, Spec: lbv1.SubnetSpec{Provider: "nad.ns", CIDRBlock: cidrBlock}}
		_, err := ValidateSubnet(&s, []lbv1.Subnet{s})
		switch ref, _ := err.(*Refusal); {
		case want == "" && err != nil:
			t.Errorf("%s: refused: %v", cidrBlock, err)
		case want != "" && (ref == nil || ref.Reason != ReasonSubnetInvalid || ref.Message != want):
			t.Errorf("%s:\n got %v\nwant %s: %s", cidrBlock, err, ReasonSubnetInvalid, want)
		}
	}
}
