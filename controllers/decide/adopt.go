package decide

import (
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
	"github.com/lbsvc/lbsvc-operator/controllers/ipam"
)

// Adoptable decides which addresses of a Service an operator starting on a release without IP
// objects turns into IP objects (AddressBook.adopt): the ones in its lbsvc.io/allocated-ips
// annotation, only when all of these hold, else none:
//   - the annotation names exactly the addresses of status.loadBalancer.ingress, which the edit
//     role cannot write (a forged annotation alone adopts nothing);
//   - the Service is one we serve (ServiceProvider): ingress written by another load balancer
//     (MetalLB, a cloud's, another class) with our annotations copied beside it is not ours, and
//     adopting it would make the next pass tear down the other controller's ingress and finalizer;
//   - the Subnet its lbsvc.io/subnet annotation names exists (subnets: by name, as the address
//     book knows them) and holds every address: an annotation naming no Subnet, or one too long
//     for an IP object, would fail the create and with it the operator's start.
func Adoptable(svc *corev1.Service, defaultProvider string, subnets map[string]ipam.SubnetConfig) []netip.Addr {
	recorded, subnet := svc.Annotations[lbv1.AllocatedIPsAnnotation], svc.Annotations[lbv1.AllocatedSubnetAnnotation]
	if recorded == "" || subnet == "" || !svc.DeletionTimestamp.IsZero() {
		return nil
	}
	if _, served := ServiceProvider(svc, defaultProvider); !served {
		return nil
	}
	cfg, ok := subnets[subnet]
	if !ok {
		return nil
	}
	addrs, err := ipam.ParseAddrs(recorded)
	if err != nil || len(addrs) == 0 {
		return nil
	}
	ingress, seen := IngressSet(svc), map[netip.Addr]bool{}
	for _, a := range addrs {
		seen[a] = true
	}
	if len(ingress) != len(addrs) || len(seen) != len(addrs) {
		return nil
	}
	for _, a := range addrs {
		if !ingress[a] || !slices.ContainsFunc(cfg.CIDRs, func(p netip.Prefix) bool { return p.Contains(a) }) {
			return nil
		}
	}
	return addrs
}
