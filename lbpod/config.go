// Package lbpod is the data path of an lb pod: from the LB address, its Subnet and the Service it
// serves, it computes the addresses, policy routes and NAT rules the pod needs (desired.go, pure)
// and applies them to the kernel changing only what differs (apply.go).
package lbpod

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// Family is an IP family: IPv4 or IPv6.
type Family int

const (
	// IPv4 is the IPv4 family.
	IPv4 Family = 4
	// IPv6 is the IPv6 family.
	IPv6 Family = 6
)

// String returns "IPv4" or "IPv6".
func (f Family) String() string {
	if f == IPv6 {
		return "IPv6"
	}
	return "IPv4"
}

// familyOf returns the family of an address (IPv4-mapped IPv6 addresses count as IPv4).
func familyOf(a netip.Addr) Family {
	if a.Unmap().Is4() {
		return IPv4
	}
	return IPv6
}

// Protocol is a Service port protocol as Kubernetes spells it: TCP, UDP or SCTP.
type Protocol string

// The protocols a Service port can carry.
const (
	TCP  Protocol = "TCP"
	UDP  Protocol = "UDP"
	SCTP Protocol = "SCTP"
)

// Port is one Service port: the protocol and the Service's `port` (what the ClusterIP answers on;
// never targetPort, which only the endpoints know).
type Port struct {
	Protocol Protocol
	Port     int32
}

// Network is the lb pod's place on the underlay, one entry per family, IPv4 first: the LB address
// with the Subnet's prefix length, the Subnet's gateway and CIDR. It comes from the operator
// (environment) and does not change during the pod's life.
type Network struct {
	Addresses []netip.Prefix
	Gateways  []netip.Addr
	Subnets   []netip.Prefix
}

// Service is what the lb pod needs from one Service it serves: its name, the ClusterIPs (IPv4
// first), the ports and the allowed source ranges (empty: everybody).
type Service struct {
	// Name is "namespace/name": it orders the members of a shared address (the first by name
	// keeps a port two of them claim) and names them in problems and the log.
	Name         string
	ClusterIPs   []netip.Addr
	Ports        []Port
	SourceRanges []netip.Prefix
}

// Config is the whole input of the desired state.
type Config struct {
	Network
	// Services are the Services served on the address: one for an lb pod of its own Service,
	// the members of a shared address (annotation lbsvc.io/allow-shared-ip) otherwise. Each
	// port DNATs to its own member's ClusterIP and obeys its own member's source ranges.
	Services []Service
}

// ParseNetwork parses the comma-separated address, gateway and subnet lists (as in the
// LBPOD_ADDRESSES, LBPOD_GATEWAYS and LBPOD_SUBNETS variables) and checks they agree. Errors name
// the field and the value.
func ParseNetwork(addresses, gateways, subnets string) (Network, error) {
	var n Network
	for _, s := range splitList(addresses) {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return Network{}, fmt.Errorf("addresses %q: %q is not an address with a prefix length (like 172.18.0.18/16)", addresses, s)
		}
		n.Addresses = append(n.Addresses, p)
	}
	for _, s := range splitList(gateways) {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return Network{}, fmt.Errorf("gateways %q: %q is not an IP address", gateways, s)
		}
		n.Gateways = append(n.Gateways, a)
	}
	for _, s := range splitList(subnets) {
		p, err := netip.ParsePrefix(s)
		if err != nil || p.Masked() != p {
			return Network{}, fmt.Errorf("subnets %q: %q is not a CIDR (like 172.18.0.0/16)", subnets, s)
		}
		n.Subnets = append(n.Subnets, p)
	}
	if len(n.Addresses) == 0 || len(n.Addresses) > 2 {
		return Network{}, fmt.Errorf("addresses %q: want one address, or two (IPv4,IPv6) for dual stack", addresses)
	}
	if len(n.Gateways) != len(n.Addresses) {
		return Network{}, fmt.Errorf("gateways %q: want %d entries, one per address in %q", gateways, len(n.Addresses), addresses)
	}
	if len(n.Subnets) != len(n.Addresses) {
		return Network{}, fmt.Errorf("subnets %q: want %d entries, one per address in %q", subnets, len(n.Addresses), addresses)
	}
	if len(n.Addresses) == 2 && (familyOf(n.Addresses[0].Addr()) != IPv4 || familyOf(n.Addresses[1].Addr()) != IPv6) {
		return Network{}, fmt.Errorf("addresses %q: dual stack wants the IPv4 address first, then the IPv6 one", addresses)
	}
	for i, addr := range n.Addresses {
		subnet, gw := n.Subnets[i], n.Gateways[i]
		if addr.Bits() != subnet.Bits() {
			return Network{}, fmt.Errorf("addresses %q: %s has prefix length %d but its subnet %s has %d", addresses, addr, addr.Bits(), subnet, subnet.Bits())
		}
		if !subnet.Contains(addr.Addr()) {
			return Network{}, fmt.Errorf("addresses %q: %s is outside subnet %s", addresses, addr.Addr(), subnet)
		}
		if !subnet.Contains(gw) {
			return Network{}, fmt.Errorf("gateways %q: %s is outside subnet %s", gateways, gw, subnet)
		}
		if gw == addr.Addr() {
			return Network{}, fmt.Errorf("gateways %q: %s is also the LB address", gateways, gw)
		}
	}
	return n, nil
}

// ServiceFromObject extracts what the lb pod needs from a Service object. Errors name the field
// and the value.
func ServiceFromObject(svc *corev1.Service) (Service, error) {
	name := svc.Namespace + "/" + svc.Name
	out := Service{Name: name}
	clusterIPs := svc.Spec.ClusterIPs
	if len(clusterIPs) == 0 && svc.Spec.ClusterIP != "" {
		clusterIPs = []string{svc.Spec.ClusterIP}
	}
	if len(clusterIPs) == 0 {
		return Service{}, fmt.Errorf("service %s: spec.clusterIPs is empty (not allocated yet)", name)
	}
	for _, s := range clusterIPs {
		if s == corev1.ClusterIPNone {
			return Service{}, fmt.Errorf("service %s: spec.clusterIPs %q: a headless Service has no ClusterIP to forward to", name, s)
		}
		a, err := netip.ParseAddr(s)
		if err != nil {
			return Service{}, fmt.Errorf("service %s: spec.clusterIPs %q: not an IP address", name, s)
		}
		out.ClusterIPs = append(out.ClusterIPs, a.Unmap())
	}
	// IPv4 first, as everywhere else in the lb pod.
	slices.SortStableFunc(out.ClusterIPs, func(a, b netip.Addr) int { return int(familyOf(a)) - int(familyOf(b)) })
	for i, p := range svc.Spec.Ports {
		proto := Protocol(p.Protocol)
		if proto == "" {
			proto = TCP
		}
		switch proto {
		case TCP, UDP, SCTP:
		default:
			return Service{}, fmt.Errorf("service %s: spec.ports[%d].protocol %q: want TCP, UDP or SCTP", name, i, p.Protocol)
		}
		if p.Port < 1 || p.Port > 65535 {
			return Service{}, fmt.Errorf("service %s: spec.ports[%d].port %d: out of range 1-65535", name, i, p.Port)
		}
		out.Ports = append(out.Ports, Port{Protocol: proto, Port: p.Port})
	}
	ranges, field := svc.Spec.LoadBalancerSourceRanges, "spec.loadBalancerSourceRanges"
	if len(ranges) == 0 {
		// Kubernetes' older way to say the same thing; kube-proxy honours it too.
		if a := svc.Annotations[corev1.AnnotationLoadBalancerSourceRangesKey]; strings.TrimSpace(a) != "" {
			ranges, field = splitList(a), "annotation "+corev1.AnnotationLoadBalancerSourceRangesKey
		}
	}
	for _, s := range ranges {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			return Service{}, fmt.Errorf("service %s: %s %.64q: not a CIDR", name, field, s)
		}
		p = p.Masked()
		if p.Addr().Is4In6() {
			// An IPv4-mapped IPv6 range (::ffff:10.0.0.0/104; the API server takes it without
			// strict CIDR validation, the operator refuses the Service for it, and a --service-file
			// may hold it) is the IPv4 range it maps: the rules are per family, and an IPv6 prefix
			// of an IPv4 address fits neither (the apply failed, keeping the previous rules until
			// the operator's refusal). Masked, only a prefix of 96 bits or more keeps the mapped form.
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		out.SourceRanges = append(out.SourceRanges, p)
	}
	return out, nil
}

// splitList splits a comma-separated list, dropping blanks.
func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}
