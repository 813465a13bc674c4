package decide

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
	"github.com/lbsvc/lbsvc-operator/controllers/ipam"
)

// Input validation of a Service, pure: the Service (and the Subnet it draws from) in, the parsed
// inputs or a Refusal out. The planner calls ValidateServiceInputs once it has chosen a valid
// Subnet; every message is bounded by BoundedMessage and quotes at most a short prefix of a bad
// value, whatever the size of the field.

// MaxMessageBytes bounds every refusal message: it becomes a condition message and the note of
// an Event, and the API server refuses an Event whose note exceeds 1 KiB (the Event, and so the
// only trace of the refusal, would be lost).
const MaxMessageBytes = 1024

// MaxSourceRanges bounds loadBalancerSourceRanges: each range is one iptables rule in the lb pod,
// evaluated for every new connection. The API server sets no limit (an annotation may hold
// thousands); 1024 is far beyond any hand-written list.
const MaxSourceRanges = 1024

// truncatedMark ends a message that BoundedMessage had to cut.
const truncatedMark = "..."

// BoundedMessage returns msg as valid UTF-8 (invalid bytes replaced by U+FFFD) of at most
// MaxMessageBytes bytes; a longer message is cut at a character boundary and ends in "...".
func BoundedMessage(msg string) string {
	msg = strings.ToValidUTF8(msg, string(utf8.RuneError))
	if len(msg) <= MaxMessageBytes {
		return msg
	}
	return ipam.TruncateUTF8(msg, MaxMessageBytes-len(truncatedMark)) + truncatedMark
}

// quote renders a user-supplied value for a message: Go-quoted, at most its first
// ipam.QuotePrefixBytes bytes, always valid UTF-8 (see ipam.Quote).
func quote(s string) string { return ipam.Quote(s) }

// refusal builds a Refusal with a bounded message.
func refusal(reason, format string, args ...any) *Refusal {
	return &Refusal{Reason: reason, Message: BoundedMessage(fmt.Sprintf(format, args...))}
}

// ValidatedService is what ValidateServiceInputs read from a Service, checked and canonical.
type ValidatedService struct {
	// ClusterIPs are the Service's ClusterIPs, IPv4 first: what the lb pod forwards to.
	ClusterIPs []netip.Addr
	// Requested are the addresses asked for (the annotation lbsvc.io/loadBalancerIPs, else
	// spec.loadBalancerIP): at most one per family, IPv4 first; nil asks for the lowest free
	// address of each family.
	Requested []netip.Addr
	// RequestedFrom names where Requested was read, as messages name it: FromLoadBalancerIPs or
	// FromLoadBalancerIP; empty when Requested is nil.
	RequestedFrom string
	// SourceRanges are the allowed client ranges (spec.loadBalancerSourceRanges, else the
	// annotation), masked, deduplicated and sorted (IPv4 first, then by address and length), so
	// that reordering the list changes nothing. Nil allows every source. A /0 (0.0.0.0/0, ::/0)
	// allows every source of its family; it is kept, and the other ranges of its family, which
	// it makes redundant, are dropped. A data path must render a /0 without a source match:
	// "-s 0.0.0.0/0" is printed back by iptables without it and would never converge. (How a
	// family with no range at all is treated is the data path's decision: kube-proxy leaves it
	// open, and so treats a /0 like no range.)
	SourceRanges []netip.Prefix
	// Families are the families to allocate, in the Subnet's order (IPv4 first): those the
	// Subnet serves and the Service has a ClusterIP of. Empty until AllocationFamilies ran.
	Families []ipam.Family
}

// ValidateServiceInputs is the planner's one entry point: it checks the Service on its own
// (ValidateServiceSpec) and then against the Subnet it draws from (AllocationFamilies). The first
// problem found wins, in this order: no ClusterIP, ports, the requested addresses, source
// ranges, families. The Subnet must have parsed (subnet.CIDRs non-empty); its name is used in
// messages.
func ValidateServiceInputs(svc *corev1.Service, subnet ipam.SubnetConfig) (ValidatedService, *Refusal) {
	v, ref := ValidateServiceSpec(svc)
	if ref != nil {
		return ValidatedService{}, ref
	}
	if v.Families, ref = AllocationFamilies(svc, v, subnet); ref != nil {
		return ValidatedService{}, ref
	}
	return v, nil
}

// ValidateServiceSpec checks what needs no Subnet: the Service has a ClusterIP to forward to,
// sane ports, parseable requested addresses (ParseLoadBalancerIP) and valid source ranges.
func ValidateServiceSpec(svc *corev1.Service) (ValidatedService, *Refusal) {
	var v ValidatedService
	var ref *Refusal
	if v.ClusterIPs, ref = ForwardTargets(svc); ref != nil {
		return ValidatedService{}, ref
	}
	if ref = ValidatePorts(svc.Spec.Ports); ref != nil {
		return ValidatedService{}, ref
	}
	if v.Requested, v.RequestedFrom, ref = ParseLoadBalancerIP(svc); ref != nil {
		return ValidatedService{}, ref
	}
	if v.SourceRanges, ref = ParseSourceRanges(svc); ref != nil {
		return ValidatedService{}, ref
	}
	return v, nil
}

// ForwardTargets returns the ClusterIPs the lb pod forwards to, IPv4 first. An ExternalName or
// headless Service, or one whose ClusterIP is not allocated (yet), has nothing to forward to and
// is refused with ReasonNoClusterIP. The API server keeps a LoadBalancer Service from being
// either, so this guards against what an older or foreign API server let through.
func ForwardTargets(svc *corev1.Service) ([]netip.Addr, *Refusal) {
	if svc.Spec.Type == corev1.ServiceTypeExternalName {
		return nil, refusal(ReasonNoClusterIP, "an ExternalName Service has no ClusterIP for the lb pod to forward to")
	}
	ips := svc.Spec.ClusterIPs
	if len(ips) == 0 && svc.Spec.ClusterIP != "" {
		ips = []string{svc.Spec.ClusterIP}
	}
	if len(ips) == 0 {
		return nil, refusal(ReasonNoClusterIP, "spec.clusterIPs is empty: the Service has no ClusterIP (yet) for the lb pod to forward to")
	}
	if len(ips) > 2 {
		return nil, refusal(ReasonNoClusterIP, "spec.clusterIPs has %d addresses; at most one per family", len(ips))
	}
	var out []netip.Addr
	for i, s := range ips {
		if s == corev1.ClusterIPNone {
			return nil, refusal(ReasonNoClusterIP, "spec.clusterIP is None: a headless Service has no ClusterIP for the lb pod to forward to")
		}
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" || a.Is4In6() {
			return nil, refusal(ReasonNoClusterIP, "spec.clusterIPs[%d] %s is not an IP address", i, quote(s))
		}
		if slices.ContainsFunc(out, func(o netip.Addr) bool { return o.Is4() == a.Is4() }) {
			return nil, refusal(ReasonNoClusterIP, "spec.clusterIPs has two %s addresses; at most one per family", ipam.FamilyOf(a))
		}
		out = append(out, a)
	}
	return ipam.SortIPv4First(out), nil
}

// ValidatePorts refuses, with ReasonInvalidPorts: no port at all (nothing to forward), a port
// outside 1-65535, a protocol other than TCP, UDP or SCTP (empty means TCP, as the API server
// defaults it), and a (port, protocol) pair given twice (the lb pod would have two DNAT rules for
// one match). The API server refuses all of these too; the check keeps a bad object from an
// older API server or a direct etcd write from reaching the lb pod.
func ValidatePorts(ports []corev1.ServicePort) *Refusal {
	if len(ports) == 0 {
		return refusal(ReasonInvalidPorts, "spec.ports is empty: the lb pod has nothing to forward")
	}
	type key struct {
		port  int32
		proto corev1.Protocol
	}
	seen := make(map[key]int, len(ports))
	for i, p := range ports {
		proto := p.Protocol
		switch proto {
		case "":
			proto = corev1.ProtocolTCP
		case corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP:
		default:
			return refusal(ReasonInvalidPorts, "spec.ports[%d].protocol %s is not TCP, UDP or SCTP", i, quote(string(p.Protocol)))
		}
		if p.Port < 1 || p.Port > 65535 {
			return refusal(ReasonInvalidPorts, "spec.ports[%d].port %d is outside 1-65535", i, p.Port)
		}
		k := key{p.Port, proto}
		if j, dup := seen[k]; dup {
			return refusal(ReasonInvalidPorts, "spec.ports[%d] repeats %d/%s of spec.ports[%d]", i, p.Port, proto, j)
		}
		seen[k] = i
	}
	return nil
}

// Where requested addresses are read from, as messages name them.
const (
	// FromLoadBalancerIPs is the annotation lbsvc.io/loadBalancerIPs, which wins.
	FromLoadBalancerIPs = "annotation " + lbv1.LoadBalancerIPsAnnotation
	// FromLoadBalancerIP is spec.loadBalancerIP, deprecated upstream since Kubernetes 1.24.
	FromLoadBalancerIP = "spec.loadBalancerIP"
)

// ParseLoadBalancerIP reads the addresses a Service asks for and names where they came from:
// the annotation lbsvc.io/loadBalancerIPs when it is set, else spec.loadBalancerIP (the field is
// deprecated upstream, and the annotation also works where a tool drops it). Both are parsed by
// parseRequested. When both are set they must ask for the same addresses, in any order and
// spelling ("10.0.0.5, fd00::5" is "fd00::5,10.0.0.5"); else the Service is refused with
// ReasonLoadBalancerIPConflict, and the message says to remove the field. A bad value is
// refused for its own source, the annotation checked first.
func ParseLoadBalancerIP(svc *corev1.Service) (addrs []netip.Addr, from string, ref *Refusal) {
	annotation := svc.Annotations[lbv1.LoadBalancerIPsAnnotation]
	field := svc.Spec.LoadBalancerIP //nolint:staticcheck // deprecated upstream but ours to honour
	fromAnnotation, ref := parseRequested(FromLoadBalancerIPs, annotation)
	if ref != nil {
		return nil, "", ref
	}
	fromField, ref := parseRequested(FromLoadBalancerIP, field)
	if ref != nil {
		return nil, "", ref
	}
	switch {
	case fromAnnotation != nil && fromField != nil && !slices.Equal(fromAnnotation, fromField):
		return nil, "", refusal(ReasonLoadBalancerIPConflict,
			"%s %s and %s %s ask for different addresses; remove %s (deprecated upstream; the annotation takes its place)",
			FromLoadBalancerIPs, quote(annotation), FromLoadBalancerIP, quote(field), FromLoadBalancerIP)
	case fromAnnotation != nil:
		return fromAnnotation, FromLoadBalancerIPs, nil
	case fromField != nil:
		return fromField, FromLoadBalancerIP, nil
	}
	return nil, "", nil
}

// parseRequested parses one source of requested addresses (from names it in messages): empty
// or blank asks for any address; otherwise one address, or one per family comma-separated
// (either order), whitespace around each ignored. Refused with ReasonInvalidLoadBalancerIP:
// anything ipam.ParseAddrs refuses (not an address, leading zeros, a zone, an IPv4-mapped IPv6
// spelling, an empty item, a repeat) and two addresses of one family. The result is IPv4 first.
func parseRequested(from, v string) ([]netip.Addr, *Refusal) {
	addrs, err := ipam.ParseAddrs(v)
	if err != nil {
		// ipam's sentinel says "invalid subnet configuration", which is not what is wrong here.
		detail := strings.TrimSuffix(err.Error(), ": "+ipam.ErrInvalid.Error())
		return nil, refusal(ReasonInvalidLoadBalancerIP, "%s: %s", from, detail)
	}
	for i := 1; i < len(addrs); i++ {
		if addrs[i].Is4() == addrs[0].Is4() {
			return nil, refusal(ReasonInvalidLoadBalancerIP, "%s %s has two %s addresses; at most one per family",
				from, quote(v), ipam.FamilyOf(addrs[0]))
		}
	}
	return ipam.SortIPv4First(addrs), nil
}

// ParseSourceRanges parses the allowed client ranges: spec.loadBalancerSourceRanges when it has
// items, else the annotation service.beta.kubernetes.io/load-balancer-source-ranges (a comma
// separated list), the precedence Kubernetes and kube-proxy use. Whitespace around each item is
// ignored, as the API server ignores it. Refused with ReasonInvalidSourceRanges:
//   - an empty item (a stray comma), which the API server refuses too;
//   - an address without a prefix length ("10.0.0.1"): the API server requires CIDRs in both
//     places, and guessing /32 would silently widen a typo such as a missing "/24" the other way;
//     the message suggests the host prefix;
//   - leading zeros ("010.0.0.0/8"): older API servers accepted them, but some parsers read them
//     as octal (CVE-2021-29923), so the range meant is ambiguous;
//   - zones and IPv4-mapped IPv6 ranges (::ffff:10.0.0.0/104): one range has one spelling, and
//     an IPv4 client never arrives as an IPv6 source; the message names the IPv4 range;
//   - more than MaxSourceRanges items.
//
// Host bits are allowed (the API server allows them) and masked: "10.0.0.1/8" is 10.0.0.0/8.
// /0 is accepted (see ValidatedService.SourceRanges). The result is canonical: see
// ValidatedService.SourceRanges.
func ParseSourceRanges(svc *corev1.Service) ([]netip.Prefix, *Refusal) {
	items, field := svc.Spec.LoadBalancerSourceRanges, "spec.loadBalancerSourceRanges"
	name := func(i int) string { return fmt.Sprintf("%s[%d]", field, i) }
	if len(items) == 0 {
		a := strings.TrimSpace(svc.Annotations[corev1.AnnotationLoadBalancerSourceRangesKey])
		if a == "" {
			return nil, nil
		}
		items, field = strings.Split(a, ","), "annotation "+corev1.AnnotationLoadBalancerSourceRangesKey
		name = func(i int) string { return fmt.Sprintf("%s item %d", field, i+1) }
	}
	if len(items) > MaxSourceRanges {
		return nil, refusal(ReasonInvalidSourceRanges, "%s has %d source ranges; at most %d", field, len(items), MaxSourceRanges)
	}
	out := make([]netip.Prefix, 0, len(items))
	for i, raw := range items {
		p, problem := parseSourceRange(strings.TrimSpace(raw))
		if problem != "" {
			return nil, refusal(ReasonInvalidSourceRanges, "%s %s %s", name(i), quote(raw), problem)
		}
		out = append(out, p)
	}
	slices.SortFunc(out, comparePrefixes)
	out = slices.Compact(out)
	// A family's /0 holds every other range of that family.
	var everyone4, everyone6 bool
	for _, p := range out {
		if p.Bits() == 0 {
			everyone4, everyone6 = everyone4 || p.Addr().Is4(), everyone6 || p.Addr().Is6()
		}
	}
	return slices.DeleteFunc(out, func(p netip.Prefix) bool {
		return p.Bits() > 0 && (p.Addr().Is4() && everyone4 || p.Addr().Is6() && everyone6)
	}), nil
}

// parseSourceRange parses one trimmed item; problem says what is wrong ("" when nothing).
func parseSourceRange(s string) (netip.Prefix, string) {
	if s == "" {
		return netip.Prefix{}, "is empty"
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		if a, aerr := netip.ParseAddr(s); aerr == nil && a.Zone() == "" && !a.Is4In6() {
			return netip.Prefix{}, fmt.Sprintf("is an address, not a CIDR; for this host alone write %s", netip.PrefixFrom(a, a.BitLen()))
		}
		return netip.Prefix{}, fmt.Sprintf("is not a CIDR (%s)", ipam.ParseErrorDetail(err))
	}
	if p.Addr().Is4In6() {
		v4 := netip.PrefixFrom(p.Addr().Unmap(), max(p.Bits()-96, 0)).Masked()
		return netip.Prefix{}, fmt.Sprintf("is an IPv4-mapped IPv6 range; write it as IPv4 (%s)", v4)
	}
	return p.Masked(), ""
}

// comparePrefixes orders IPv4 first, then by address, then by length.
func comparePrefixes(a, b netip.Prefix) int {
	if c := cmp.Compare(ipam.FamilyOf(a.Addr()), ipam.FamilyOf(b.Addr())); c != 0 {
		return c
	}
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return cmp.Compare(a.Bits(), b.Bits())
}

// AllocationFamilies decides which families the Service gets an address of: those its Subnet
// serves AND it has a ClusterIP of, in the Subnet's order (IPv4 first). So a Dual Subnet gives an
// IPv4-only Service only an IPv4 address (an IPv6 address would have nothing to forward to and
// would blackhole its traffic), and an IPv4 Subnet gives a dual-stack Service an IPv4 address
// only (reachable over IPv4; MetalLB-style "dual or nothing" would refuse a Service that works).
// Refused with ReasonFamilyMismatch when no family is left, or when the requested addresses
// (named by v.RequestedFrom) ask for a family the Service has no ClusterIP of; with
// ReasonAddressFamily (as the allocator would) when they ask for a family the Subnet does not
// serve.
func AllocationFamilies(svc *corev1.Service, v ValidatedService, subnet ipam.SubnetConfig) ([]ipam.Family, *Refusal) {
	svcFams := familiesOfAddrs(v.ClusterIPs)
	subnetFams := make([]ipam.Family, 0, len(subnet.CIDRs))
	for _, c := range subnet.CIDRs {
		subnetFams = append(subnetFams, ipam.FamilyOf(c.Addr()))
	}
	for _, r := range v.Requested {
		f := ipam.FamilyOf(r)
		if !slices.Contains(subnetFams, f) {
			return nil, refusal(ReasonAddressFamily, "%s %s is %s but subnet %q serves only %s",
				v.RequestedFrom, r, f, subnet.Name, joinFamilies(subnetFams))
		}
		if !slices.Contains(svcFams, f) {
			return nil, refusal(ReasonFamilyMismatch, "%s %s is %s but the Service has no %s ClusterIP (%s)",
				v.RequestedFrom, r, f, f, describeServiceFamilies(svc, svcFams))
		}
	}
	var out []ipam.Family
	for _, f := range subnetFams {
		if slices.Contains(svcFams, f) {
			out = append(out, f)
		}
	}
	if len(out) == 0 {
		missing := subnetFams[0]
		return nil, refusal(ReasonFamilyMismatch, "the Service has no %s ClusterIP (%s) but subnet %q serves only %s",
			missing, describeServiceFamilies(svc, svcFams), subnet.Name, joinFamilies(subnetFams))
	}
	return out, nil
}

// describeServiceFamilies says which families the Service has, in the words of its spec.
func describeServiceFamilies(svc *corev1.Service, fams []ipam.Family) string {
	if len(svc.Spec.IPFamilies) > 0 {
		s := make([]string, len(svc.Spec.IPFamilies))
		for i, f := range svc.Spec.IPFamilies {
			s[i] = string(f)
		}
		// The field is the API server's record; a value there cannot be long, but bound it anyway.
		return "ipFamilies " + ipam.TruncateUTF8(strings.Join(s, ","), ipam.QuotePrefixBytes)
	}
	return "ClusterIPs " + joinFamilies(fams)
}

func joinFamilies(fams []ipam.Family) string {
	s := make([]string, len(fams))
	for i, f := range fams {
		s[i] = f.String()
	}
	return strings.Join(s, " and ")
}

func familiesOfAddrs(addrs []netip.Addr) []ipam.Family {
	out := make([]ipam.Family, len(addrs))
	for i, a := range addrs {
		out[i] = ipam.FamilyOf(a)
	}
	return out
}
