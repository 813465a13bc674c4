package decide

import (
	"fmt"
	"net/netip"
	"slices"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
)

// Before the first announcement of an address, the lb pod that is to hold it probes the underlay
// (ARP from 0.0.0.0, IPv6 DAD) and, when a host answers, writes what it heard into its Service's
// Lease (lbsvc.io/address-conflict) instead of announcing. The IP controller turns that report
// into phase Conflict on the IP object; the Service pass then moves a dynamic Service to another
// address and refuses a static one (ReasonAddressInUse). A report is believed only for an address
// its Service's lb pods never announced: once the Lease lists it in lbsvc.io/announced, the IP
// object records Announced for good, and a later report is ignored.

// MaxConflictsPerFamily bounds how many addresses of one family a Service may lose to the
// conflict probe: past it the Service is refused instead of moved again. A host that answers
// every probe (or an lb pod that reports every address) locks at most this many addresses per
// Service in phase Conflict.
const MaxConflictsPerFamily = 3

// MaxConflictsPerNamespace bounds how many addresses of one family the Services of one namespace
// may hold in phase Conflict at once: past it a new report from that namespace is not believed
// (the lb pod that made it still does not announce the address; the Service stays on it). The
// report is read from the Service's Lease, which the namespace's tenants may write as well as its
// lb pods, and a Conflict object outlives its Service: without a bound per namespace, one Service
// of quota created and deleted again and again would lock the Subnet's addresses for good.
const MaxConflictsPerNamespace = 3

// ConflictReportSkew is how much earlier than its IP object's creation a conflict report may be
// dated and still be about it: the report carries the lb pod's clock, the object the API
// server's. A report older than that is about an earlier IP object of the address.
const ConflictReportSkew = 5 * time.Second

// IPConflictInputs is what the IP controller read for one Bound or Conflict IP object.
type IPConflictInputs struct {
	IP *lbv1.IP
	// Lease is the owner Service's Lease (nil: none, or not that Service's by its UID label).
	Lease *coordinationv1.Lease
	// NamespaceConflicts is how many other IP objects of the address's family whose owner
	// Service is of the same namespace are in phase Conflict (read only when the Lease reports a
	// conflict).
	NamespaceConflicts int
}

// IPConflictPlan is what the IP object's status says about the probe.
type IPConflictPlan struct {
	// Phase is IPConflict or IPBound.
	Phase lbv1.IPPhase
	// Announced is status.announced.
	Announced bool
	// Conflict is status.conflict (set in phase Conflict).
	Conflict *lbv1.IPConflictStatus
	// Message is status.message in phase Conflict.
	Message string
	// Event, when set, is the Warning to send on the IP object and its Service, once: the
	// transition into phase Conflict. It names the owner Service: only Services of the owner's
	// namespace get it.
	Event string
	// MemberEvent, of a shared address, is Event for its members of other namespaces: the same
	// without the owner Service, another tenant's (a message names no other tenant's object).
	MemberEvent string
	// Ignored, when set, says why a report on the Lease was not believed (for the log).
	Ignored string
}

// DecideIPConflict decides an IP object's phase, announced flag and conflict from its owner's
// Lease. Phase Conflict is kept once set: only deleting the object clears it.
func DecideIPConflict(in IPConflictInputs) IPConflictPlan {
	ip := in.IP
	p := IPConflictPlan{Phase: lbv1.IPBound, Announced: ip.Status.Announced}
	if ip.Status.Phase == lbv1.IPConflict && ip.Status.Conflict != nil {
		c := *ip.Status.Conflict
		p.Phase, p.Conflict, p.Message = lbv1.IPConflict, &c, ConflictMessage(ip.Name, c)
		return p
	}
	if in.Lease == nil {
		return p
	}
	addr, err := netip.ParseAddr(ip.Spec.Address)
	if err != nil {
		return p
	}
	ann := in.Lease.Annotations
	if LeaseAnnounced(ann, addr) {
		p.Announced = true
	}
	note, ok := ann[lbv1.AddressConflictAnnotation]
	if !ok {
		return p
	}
	reports, err := lbv1.ParseAddressConflicts(note)
	if err != nil {
		p.Ignored = BoundedMessage(fmt.Sprintf("annotation %s on Lease %s/%s does not parse: %v", lbv1.AddressConflictAnnotation, in.Lease.Namespace, in.Lease.Name, err))
		return p
	}
	i := slices.IndexFunc(reports, func(c lbv1.AddressConflict) bool { return c.Address == addr })
	if i < 0 {
		return p
	}
	if p.Announced {
		p.Ignored = fmt.Sprintf("a conflict reported for %s after it was announced is not believed (the probe runs only before the first announcement)", addr)
		return p
	}
	if created := ip.CreationTimestamp.Time; !created.IsZero() && reports[i].At.Before(created.Add(-ConflictReportSkew)) {
		// Nothing clears a report from the Lease (the operator does not write Leases): one about
		// an earlier IP object of the address, which an admin deleted to clear its Conflict,
		// would otherwise put the new one in Conflict at once.
		p.Ignored = fmt.Sprintf("a conflict reported for %s at %s is not believed: it predates this IP object (created %s), so it was about an earlier claim of the address",
			addr, reports[i].At.UTC().Format(time.RFC3339), created.UTC().Format(time.RFC3339))
		return p
	}
	if in.NamespaceConflicts >= MaxConflictsPerNamespace {
		p.Ignored = BoundedMessage(fmt.Sprintf("a conflict reported for %s is not believed: namespace %s already holds %d addresses of its family in phase Conflict (at most %d; an admin clears one by deleting its IP object)",
			addr, ip.Spec.Service.Namespace, in.NamespaceConflicts, MaxConflictsPerNamespace))
		return p
	}
	c := lbv1.IPConflictStatus{MAC: reports[i].MAC.String(), Since: metav1.NewTime(reports[i].At.UTC())}
	p.Phase, p.Conflict, p.Message = lbv1.IPConflict, &c, ConflictMessage(ip.Name, c)
	p.Event = BoundedMessage(fmt.Sprintf("%s is in use on the underlay: %s answered the lb pod's probe before the first announcement; the Service %s/%s does not announce it, and %s",
		ip.Spec.Address, c.MAC, ip.Spec.Service.Namespace, ip.Spec.Service.Name, clearHint(ip.Name)))
	if ip.Spec.SharingKey != "" {
		p.MemberEvent = BoundedMessage(fmt.Sprintf("the shared address %s is in use on the underlay: %s answered the lb pod's probe before the first announcement; its lb pods do not announce it, and %s",
			ip.Spec.Address, c.MAC, clearHint(ip.Name)))
	}
	return p
}

// EventFor is the plan's Warning for a Service of namespace ns concerned by ip (its owner, or a
// member of a shared address): Event in the owner's namespace, else MemberEvent.
func (p IPConflictPlan) EventFor(ip *lbv1.IP, ns string) string {
	if ns == ip.Spec.Service.Namespace {
		return p.Event
	}
	return p.MemberEvent
}

// LeaseAnnounced tells whether a Lease's annotations count addr as announced: listed in
// lbsvc.io/announced, or a claim recorded by a release without the probe (no list at all).
func LeaseAnnounced(ann map[string]string, addr netip.Addr) bool {
	list, ok := ann[lbv1.AnnouncedAnnotation]
	if !ok {
		return ann[lbv1.HAClaimAnnotation] != ""
	}
	return slices.Contains(lbv1.ParseAnnounced(list), addr.Unmap())
}

// ConflictMessage is the IP object's status.message in phase Conflict.
func ConflictMessage(ipName string, c lbv1.IPConflictStatus) string {
	return BoundedMessage(fmt.Sprintf("in use on the underlay: %s answered the probe at %s; %s",
		c.MAC, c.Since.UTC().Format("2006-01-02T15:04:05Z"), clearHint(ipName)))
}

func clearHint(ipName string) string {
	return fmt.Sprintf("it is not handed out again until an admin deletes the IP object (kubectl delete ip %s)", ipName)
}
