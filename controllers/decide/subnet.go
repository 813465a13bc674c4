package decide

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
	"github.com/lbsvc/lbsvc-operator/controllers/ipam"
)

// The pure decisions of the Service and Subnet reconcilers: Kubernetes objects in, a verdict out.
// Each refusal carries a reason (a named constant) and a message naming the object and the value,
// which become the condition and the Event.

// Refusal is why a Service cannot be served right now.
type Refusal struct {
	Reason  string
	Message string
}

func (r *Refusal) Error() string { return r.Reason + ": " + r.Message }

// ServiceProvider decides whether the operator serves svc, and through which attachment provider.
// It ignores deletion (the caller handles it) and the --enable-lb-svc flag (DecideService
// applies it: with the flag off only the deletion of a Service we served is carried out).
func ServiceProvider(svc *corev1.Service, defaultProvider string) (provider string, served bool) {
	if svc.Spec.Type != corev1.ServiceTypeLoadBalancer {
		return "", false
	}
	if c := svc.Spec.LoadBalancerClass; c != nil && *c != lbv1.LoadBalancerClass {
		return "", false
	}
	if p := strings.TrimSpace(svc.Annotations[lbv1.AttachmentProviderAnnotation]); p != "" {
		return p, true
	}
	if defaultProvider != "" {
		return defaultProvider, true
	}
	return "", false
}

// SplitProvider splits "<nad name>.<nad namespace>". A namespace has no dot, so the last dot
// separates them (a NAD name may itself contain dots).
func SplitProvider(provider string) (name, namespace string, err error) {
	i := strings.LastIndexByte(provider, '.')
	if i <= 0 || i == len(provider)-1 {
		return "", "", &Refusal{ReasonInvalidProvider,
			fmt.Sprintf("attachment provider %q is not <nad name>.<nad namespace>", provider)}
	}
	return provider[:i], provider[i+1:], nil
}

// ChooseSubnet picks the Subnet a Service draws from: the one named by
// "<provider>.kubernetes.io/logical_switch", else the only Subnet whose provider matches.
// It also enforces the Subnet's namespace restriction.
func ChooseSubnet(svc *corev1.Service, provider string, subnets []lbv1.Subnet) (*lbv1.Subnet, error) {
	if name := svc.Annotations[lbv1.ProviderAnnotation(provider, lbv1.LogicalSwitchAnnotationSuffix)]; name != "" {
		i := slices.IndexFunc(subnets, func(s lbv1.Subnet) bool { return s.Name == name })
		if i < 0 {
			return nil, &Refusal{ReasonSubnetNotFound, fmt.Sprintf("subnet %q named by annotation %s does not exist: create it, or correct or remove the annotation",
				name, lbv1.ProviderAnnotation(provider, lbv1.LogicalSwitchAnnotationSuffix))}
		}
		if subnets[i].Spec.Provider != provider {
			return nil, &Refusal{ReasonSubnetProviderMismatch, fmt.Sprintf("subnet %q has provider %q, not %q",
				name, subnets[i].Spec.Provider, provider)}
		}
		return &subnets[i], namespaceAllowed(&subnets[i], svc.Namespace)
	}
	var matches []string
	var chosen *lbv1.Subnet
	for i := range subnets {
		if subnets[i].Spec.Provider == provider {
			matches = append(matches, subnets[i].Name)
			chosen = &subnets[i]
		}
	}
	switch len(matches) {
	case 0:
		return nil, &Refusal{ReasonSubnetNotFound, fmt.Sprintf("no subnet has provider %q: create a Subnet with spec.provider %q", provider, provider)}
	case 1:
		return chosen, namespaceAllowed(chosen, svc.Namespace)
	}
	sort.Strings(matches)
	return nil, &Refusal{ReasonSubnetAmbiguous, fmt.Sprintf("subnets %s all have provider %q: name one with annotation %s",
		strings.Join(matches, ", "), provider, lbv1.ProviderAnnotation(provider, lbv1.LogicalSwitchAnnotationSuffix))}
}

func namespaceAllowed(s *lbv1.Subnet, namespace string) error {
	if len(s.Spec.Namespaces) == 0 || slices.Contains(s.Spec.Namespaces, namespace) {
		return nil
	}
	// The other namespaces are not listed: they are other tenants' business (the admin reads
	// them on the Subnet).
	return &Refusal{ReasonNamespaceNotAllowed, fmt.Sprintf("subnet %q does not serve namespace %q (see the subnet's spec.namespaces)",
		s.Name, namespace)}
}

// ParseSubnetSpec parses a Subnet into the allocator's configuration.
func ParseSubnetSpec(s *lbv1.Subnet) (ipam.SubnetConfig, error) {
	return ipam.ParseSubnet(s.Name, string(s.Spec.Protocol), s.Spec.CIDRBlock, s.Spec.Gateway, s.Spec.ExcludeIPs)
}

// olderThan orders Subnets by age, then name: the older of two overlapping Subnets stays valid.
func olderThan(a, b *lbv1.Subnet) bool {
	if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
		return a.CreationTimestamp.Before(&b.CreationTimestamp)
	}
	return a.Name < b.Name
}

// ValidateSubnet checks what the schema cannot: the fields agree with each other (gateway and
// exclusions inside the CIDR, ...) and the Subnet overlaps no older valid Subnet.
func ValidateSubnet(s *lbv1.Subnet, all []lbv1.Subnet) (ipam.SubnetConfig, error) {
	cfg, err := ParseSubnetSpec(s)
	if err != nil {
		return ipam.SubnetConfig{}, &Refusal{ReasonSubnetInvalid, err.Error()}
	}
	if ref := validNodeSelector(s); ref != nil {
		return ipam.SubnetConfig{}, ref
	}
	var overlapping []string
	for i := range all {
		o := &all[i]
		if o.Name == s.Name || !olderThan(o, s) {
			continue
		}
		ocfg, err := ParseSubnetSpec(o)
		if err != nil {
			continue
		}
		if ipam.Overlaps(cfg, ocfg) {
			overlapping = append(overlapping, o.Name)
		}
	}
	if len(overlapping) > 0 {
		sort.Strings(overlapping)
		return ipam.SubnetConfig{}, &Refusal{ReasonSubnetOverlap, fmt.Sprintf("subnet %q (%s) overlaps older subnet(s) %s",
			s.Name, s.Spec.CIDRBlock, strings.Join(overlapping, ", "))}
	}
	return cfg, nil
}

// AllocationRefusal turns an allocator error into the reason shown to the user.
func AllocationRefusal(err error) *Refusal {
	reason := ReasonAllocationFailed
	for _, m := range []struct {
		err    error
		reason string
	}{
		{ipam.ErrOutOfRange, ReasonAddressOutOfRange},
		{ipam.ErrExcluded, ReasonAddressExcluded},
		{ipam.ErrGateway, ReasonAddressIsGateway},
		{ipam.ErrReserved, ReasonAddressReserved},
		{ipam.ErrInUse, ReasonAddressInUse},
		{ipam.ErrExhausted, ReasonSubnetExhausted},
		{ipam.ErrFamily, ReasonAddressFamily},
		{ipam.ErrUnknownSubnet, ReasonSubnetNotReady},
	} {
		if errors.Is(err, m.err) {
			reason = m.reason
			break
		}
	}
	return &Refusal{reason, err.Error()}
}

// JoinAddrs renders addresses IPv4 first, comma-separated: the lbsvc.io/allocated-ips format.
func JoinAddrs(addrs []netip.Addr) string {
	sorted := ipam.SortIPv4First(addrs)
	s := make([]string, len(sorted))
	for i, a := range sorted {
		s[i] = a.String()
	}
	return strings.Join(s, ",")
}

// FamilyParams pairs each address with its Subnet's CIDR and gateway of the same family.
func FamilyParams(addrs []netip.Addr, cfg ipam.SubnetConfig) (cidrs []netip.Prefix, gateways []netip.Addr) {
	for _, a := range addrs {
		for i, c := range cfg.CIDRs {
			if c.Addr().Is4() == a.Is4() {
				cidrs = append(cidrs, c)
				if i < len(cfg.Gateways) {
					gateways = append(gateways, cfg.Gateways[i])
				}
				break
			}
		}
	}
	return cidrs, gateways
}

// InUse is the refusal of a static address another claim holds; from names where the Service
// asked for it (Claim.From). It names the IP object, never the other Service: an admin finds the
// holder there, a tenant learns nothing of another tenant.
func InUse(from string, addr netip.Addr, draining bool) *Refusal {
	if draining {
		return &Refusal{ReasonAddressDraining, fmt.Sprintf(
			"%s %s is draining: an lb pod that held it still exists; this Service gets it once that pod is gone (kubectl get ip %s)",
			from, addr, lbv1.IPName(addr))}
	}
	return &Refusal{ReasonAddressInUse, fmt.Sprintf("%s %s is held by another Service (kubectl get ip %s)", from, addr, lbv1.IPName(addr))}
}
