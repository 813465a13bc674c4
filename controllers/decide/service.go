package decide

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/lbsvc/lbsvc-operator/controllers/lbobjects"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
	"github.com/lbsvc/lbsvc-operator/controllers/ipam"
)

// The Service reconciler's decision in one pure step: everything it read (ServiceInputs) in,
// what to do (Plan) out: the addresses to keep, claim and drain, the lb pods' parameters (replica
// count and placement), and from them, once the claims are answered, every object to write
// (Plan.Objects). The reconciler gathers the inputs once, calls DecideService, then carries the
// plan out; a refusal found while carrying it out (a claim refused, an object in the way) turns
// the plan into a teardown through Refuse, never through a second decision. Table tests check
// the decisions without an API server.

// OwnedIP is an IP object owned by the Service (by UID), as the address book mirrors it.
type OwnedIP struct {
	Name     string
	UID      types.UID
	Addr     netip.Addr
	Subnet   string
	Draining bool
	// Conflict, when set, is what the probe heard: the IP object is in phase Conflict, no longer
	// the Service's to hold, and not to be drained (it stays until an admin deletes it).
	Conflict *lbv1.IPConflictStatus
	// SharingKey, of a shared address, is its key, and Members its members as the IP object
	// lists them; Member is the UID of the Service it is owned by here (one of them): draining
	// it means that member leaves, and the address drains only when the last one does.
	SharingKey string
	Members    []lbv1.IPMember
	Member     string
	// Owner, of a shared address, is its IP object's spec.service: its lb objects carry that UID.
	Owner lbv1.IPOwner
}

// ServiceInputs is what the reconciler read for one Service.
type ServiceInputs struct {
	Service *corev1.Service
	// EnableLBSvc is --enable-lb-svc: with it off only deletions of Services we served complete.
	EnableLBSvc bool
	// DefaultProvider is --default-attachment-provider.
	DefaultProvider string
	// NADFound tells whether the NetworkAttachmentDefinition the provider names exists.
	NADFound bool
	// Subnets are all Subnets.
	Subnets []lbv1.Subnet
	// Owned are the IP objects owned by the Service's UID, Bound, Draining and Conflict.
	Owned []OwnedIP
	// ForeignObject, when set, names an object at one of our per-Service names that is not ours.
	ForeignObject string
	// Nodes are the cluster's Nodes (trimmed to labels, taints, unschedulable and Ready), read
	// only when a Subnet of the Service's provider has a nodeSelector.
	Nodes []corev1.Node
	// LBDeployment is the Service's lb Deployment as the cache has it (nil: none yet), and LBPods
	// the pods carrying its UID label: whether lb pods from before authenticated adverts may still
	// run (LegacyPeers).
	LBDeployment *appsv1.Deployment
	LBPods       []corev1.Pod
	// LBPod holds the operator-wide lb pod settings (--lb-svc-image, --forwarding-sysctls,
	// --lb-pod-namespace, --lb-ha-interval, --lb-rules, and --lb-replicas as Replicas); the
	// Service's own fields are filled in by DecideService.
	LBPod lbobjects.Params
}

// PlanAction is the kind of plan.
type PlanAction int

// The plan kinds.
const (
	// PlanNothing: not ours, nothing of ours on it; touch nothing.
	PlanNothing PlanAction = iota
	// PlanServe: hold the addresses (Keep, then Claims), apply the objects, drain the rest.
	PlanServe
	// PlanTeardown: delete our objects, drain every owned address, clear what we wrote. With a
	// Refusal the Service stays ours (finalizer kept) and shows why; without one it is let go.
	PlanTeardown
)

// Claim is one address to take: Static when requested, else the lowest free of Family.
type Claim struct {
	Family ipam.Family
	Static netip.Addr
	// From, with Static, names where the Service asked for it (ValidatedService.RequestedFrom),
	// for the refusal of an address held by someone else (InUse).
	From string
	// Share, for a Service that shares (lbsvc.io/allow-shared-ip), is what it joins as: the
	// claim joins an address of its key where SharingClash allows (the static one, or the lowest
	// such), else claims a new shared address. CrossNamespace is --lb-pod-namespace being set.
	Share          *SharingMember
	CrossNamespace bool
}

// Plan is what to do for a Service.
type Plan struct {
	Action PlanAction
	// Refusal, with PlanTeardown, is why the Service is not served; with PlanServe it is a
	// degraded state worth showing (the Subnet became invalid and no new address is handed out).
	Refusal *Refusal

	Provider, NADName, NADNamespace string
	Subnet                          string
	SubnetConfig                    ipam.SubnetConfig

	// Keep are the Bound IP objects that stay the Service's, Claims the addresses to take, in
	// the Subnet's family order. Drain are owned Bound IPs to let go of once the claims succeed.
	Keep   []OwnedIP
	Claims []Claim
	Drain  []OwnedIP
	// RemoveFinalizer: the Service is let go (PlanTeardown without refusal, and it was ours).
	RemoveFinalizer bool
	// Deleting: the Service is being deleted (its status is not worth clearing).
	Deleting bool

	// LBPod, with PlanServe, is what the lb pods are built from, all but the addresses (and their
	// CIDRs and gateways), which the claims decide: see Objects.
	LBPod lbobjects.Params
	// ReplicasWarning, when set, says why the Service's lbsvc.io/replicas annotation was ignored
	// (a typo must not take the Service down: it keeps the default, and says so).
	ReplicasWarning string
	// TrafficWarnings say why traffic through the address may be dropped or go otherwise than
	// the Service says although the Service is served (trafficWarning): they end the
	// AddressAllocated message (TrafficWarning joins them), and each goes out as a Warning Event
	// of its own reason when it is new to that message (one Event per reason: the Events
	// recorder folds a second Event of the same reason into the first, message and all).
	TrafficWarnings []Warning
	// Unplaceable, with PlanServe, says that the Subnet's nodeSelector matches no node an lb pod
	// can be scheduled on: the Service keeps its address and its Deployment, and shows it in
	// ConditionLBPodAvailable (LBPodCondition).
	Unplaceable *Refusal
	// Share, with PlanServe, is the Service as a member of shared addresses (it has
	// lbsvc.io/allow-shared-ip): its addresses are shared ones, served by the lb objects of each
	// address (SharedObjects) instead of its own. Rejoin are kept shared addresses whose record of
	// it is out of date (its ports changed): joined again, which the API server orders against
	// the other members.
	Share  *SharingMember
	Rejoin []OwnedIP
	// SharedReplicas is the lb pod count of a shared address: the operator's default, since the
	// objects are the address's and not one member's (lbsvc.io/replicas is not read for them).
	SharedReplicas int32
	// HoldObjects, with PlanServe, leaves the per-Service objects as they are: the Subnet is not
	// Ready (invalid, overlapping or being deleted) and the Service only keeps what it holds.
	// Objects rebuilt from an invalid Subnet could break the lb pods (an unparseable Subnet
	// gives no CIDR or gateway) or move them (an invalid nodeSelector gives no placement).
	HoldObjects bool
}

// Refuse is the teardown of a Service refused while its plan was carried out: a claim the API
// server refused, or an object in the way at one of its names. Everything it owns drains (claims
// made in the same pass included: nothing half-served stays) and it shows why.
func Refuse(ref *Refusal, owned []OwnedIP) Plan {
	return Plan{Action: PlanTeardown, Refusal: ref, Drain: Bound(owned)}
}

// ObjectConflict is the refusal of a Service one of whose per-Service names holds an object that
// is not ours (what names it, e.g. "Deployment default/lb-svc-web").
func ObjectConflict(what string) *Refusal {
	return &Refusal{ReasonObjectConflict, fmt.Sprintf("%s exists and was not created by lbsvc-operator for this Service; delete or rename it", what)}
}

// SharingChange is the refusal, for now, of a Service that asks for its own address under
// another sharing key (from: the key it holds it with, "" unshared; to: the one asked for): its
// lb pods let it go, it drains, and the next passes claim it again (AddressDraining until then).
func SharingChange(addr netip.Addr, from, to string) *Refusal {
	what := fmt.Sprintf("shared under the key %q", to)
	if to == "" {
		what = "unshared"
	}
	was := fmt.Sprintf("shared under the key %q", from)
	if from == "" {
		was = "unshared"
	}
	return &Refusal{ReasonAddressDraining, fmt.Sprintf("%s, held %s, is asked for %s: it drains from the lb pods that hold it now, then this Service claims it again (kubectl get ip %s)",
		addr, was, what, lbv1.IPName(addr))}
}

// Objects builds every per-Service object of a served Service once its addresses are known (the
// kept and the claimed ones), each with its Subnet's CIDR and gateway of the same family; owned
// is what the address book holds for the Service after the claims, which names the claim's IP
// objects (the election key belongs to them).
func (p Plan) Objects(addrs []netip.Addr, owned []OwnedIP) (lbobjects.Set, error) {
	params := p.LBPod
	params.Addresses = ipam.SortIPv4First(addrs)
	params.CIDRs, params.Gateways = FamilyParams(params.Addresses, p.SubnetConfig)
	params.Claim = nil
	for _, o := range owned {
		if !o.Draining && slices.Contains(addrs, o.Addr) {
			params.Claim = append(params.Claim, lbobjects.IPRef{Name: o.Name, UID: o.UID})
		}
	}
	return lbobjects.Build(params)
}

// SharedObjects builds the lb objects of each shared address the Service holds (addrs: the kept
// and claimed ones; owned: the address book's record after the claims), one Set per address,
// IPv4 first. Every member builds the same objects for an address: nothing of one member's goes
// into them (replicas are the default), so members never undo each other's writes.
func (p Plan) SharedObjects(addrs []netip.Addr, owned []OwnedIP) ([]lbobjects.Set, error) {
	var sets []lbobjects.Set
	for _, a := range ipam.SortIPv4First(addrs) {
		i := slices.IndexFunc(owned, func(o OwnedIP) bool { return o.Addr == a && o.SharingKey != "" && !o.Draining })
		if i < 0 {
			continue
		}
		o := owned[i]
		params := p.LBPod
		params.ServiceName, params.ServiceNamespace, params.ServiceUID = o.Owner.Name, o.Owner.Namespace, types.UID(o.Owner.UID)
		params.Addresses = []netip.Addr{a}
		params.CIDRs, params.Gateways = FamilyParams(params.Addresses, p.SubnetConfig)
		ref := lbobjects.IPRef{Name: o.Name, UID: o.UID}
		params.Shared, params.Claim = &ref, []lbobjects.IPRef{ref}
		params.Replicas, params.HALegacyPeers = p.SharedReplicas, false
		params.MemberNamespaces = nil
		for _, m := range o.Members {
			if m.Namespace != o.Owner.Namespace && !slices.Contains(params.MemberNamespaces, m.Namespace) {
				params.MemberNamespaces = append(params.MemberNamespaces, m.Namespace)
			}
		}
		slices.Sort(params.MemberNamespaces)
		set, err := lbobjects.Build(params)
		if err != nil {
			return nil, err
		}
		sets = append(sets, set)
	}
	return sets, nil
}

// AllocatedCondition is the AddressAllocated condition of a served Service holding addrs: True,
// or the plan's degraded state when its Subnet became invalid.
func (p Plan) AllocatedCondition(addrs []netip.Addr) metav1.Condition {
	c := metav1.Condition{Type: ConditionAddressAllocated, Status: metav1.ConditionTrue, Reason: ReasonAllocated,
		Message: fmt.Sprintf("%s from subnet %s", JoinAddrs(addrs), p.Subnet)}
	if w := p.TrafficWarning(); w != "" {
		c.Message += "; " + w
	}
	if p.Refusal != nil {
		c.Reason, c.Message = p.Refusal.Reason, BoundedMessage(p.Refusal.Message)
	}
	return c
}

// trafficWarning adds to Plan.TrafficWarnings what svc's spec does to traffic through the address
// that the Service does not say (families: the ones it is served in). The lb pod DNATs to the
// ClusterIP from its own pod, so kube-proxy applies the Service's spec to what it forwards as to
// a client pod:
//   - internalTrafficPolicy Local: only endpoints on the lb pod's node get it, and on a node
//     without one it is dropped;
//   - sessionAffinity ClientIP: kube-proxy sees one client, the lb pod (it masquerades), so
//     every client of the address goes to one endpoint for the affinity's timeout.
//
// And the lb pod applies loadBalancerSourceRanges per family: ranges that name none of a family
// refuse every client of that family (kube-proxy would leave it open; the lb pod does not open
// what the Service restricts). The Service is still served, but not silently.
func (p *Plan) trafficWarning(svc *corev1.Service, families []ipam.Family, ranges []netip.Prefix) {
	add := func(reason, msg string) { p.TrafficWarnings = append(p.TrafficWarnings, Warning{reason, msg}) }
	if pol := svc.Spec.InternalTrafficPolicy; pol != nil && *pol == corev1.ServiceInternalTrafficPolicyLocal {
		add(ReasonInternalTrafficPolicyLocal, "spec.internalTrafficPolicy is Local: the lb pod reaches the Service as a pod of its node, so traffic through the address reaches only endpoints on the lb pod's node and is dropped where it has none; set it to Cluster")
	}
	if svc.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
		add(ReasonSessionAffinityClientIP, "spec.sessionAffinity is ClientIP: kube-proxy sees every client of the address as the lb pod, so all of them go to one endpoint")
	}
	if len(ranges) == 0 {
		return
	}
	for _, f := range families {
		if !slices.ContainsFunc(ranges, func(r netip.Prefix) bool { return ipam.FamilyOf(r.Addr()) == f }) {
			add(ReasonSourceRangesOmitFamily, fmt.Sprintf("spec.loadBalancerSourceRanges name no %s range: every %s client is refused; add one (%s for all)", f, f, map[ipam.Family]string{ipam.IPv4: "0.0.0.0/0", ipam.IPv6: "::/0"}[f]))
		}
	}
}

// Warning is a reason and its message: a served Service's Warning Event.
type Warning struct{ Reason, Message string }

// TrafficWarning is the TrafficWarnings' messages, joined as the AddressAllocated message ends.
func (p Plan) TrafficWarning() string {
	msgs := make([]string, 0, len(p.TrafficWarnings))
	for _, w := range p.TrafficWarnings {
		msgs = append(msgs, w.Message)
	}
	return strings.Join(msgs, "; ")
}

// RefusedCondition is the AddressAllocated condition of a refused Service.
func RefusedCondition(ref *Refusal) metav1.Condition {
	return metav1.Condition{Type: ConditionAddressAllocated, Status: metav1.ConditionFalse, Reason: ref.Reason,
		Message: BoundedMessage(ref.Message)}
}

// LBPodCondition is the lb pod condition of a served Service: False NoMatchingNode while its
// Subnet's nodeSelector matches no node an lb pod can be scheduled on, else the Deployment's.
func (p Plan) LBPodCondition(d *appsv1.Deployment) metav1.Condition {
	if p.Unplaceable != nil {
		return metav1.Condition{Type: ConditionLBPodAvailable, Status: metav1.ConditionFalse, Reason: p.Unplaceable.Reason,
			Message: BoundedMessage(p.Unplaceable.Message)}
	}
	return LBPodCondition(d)
}

// LBPodCondition mirrors the Deployment's Available condition; it never waits for the pod.
func LBPodCondition(d *appsv1.Deployment) metav1.Condition {
	c := metav1.Condition{Type: ConditionLBPodAvailable, Status: metav1.ConditionFalse, Reason: ReasonDeploymentPending,
		Message: "the lb-svc Deployment has not reported availability yet"}
	for _, dc := range d.Status.Conditions {
		if dc.Type != appsv1.DeploymentAvailable {
			continue
		}
		msg := BoundedMessage(fmt.Sprintf("deployment %s/%s: %s", d.Namespace, d.Name, dc.Message))
		if dc.Status == corev1.ConditionTrue {
			return metav1.Condition{Type: ConditionLBPodAvailable, Status: metav1.ConditionTrue, Reason: ReasonDeploymentAvailable, Message: msg}
		}
		return metav1.Condition{Type: ConditionLBPodAvailable, Status: metav1.ConditionFalse, Reason: ReasonDeploymentUnavailable, Message: msg}
	}
	return c
}

// leftDeployment says that the cache shows an lb Deployment of ours for the Service (its UID label)
// although nothing else of ours is on it: a write of a killed operator that reached the API server
// after its successor had let the Service go (type changed, provider removed). Nothing else would
// delete it while the Service exists, and it would keep its address draining for ever. One being
// deleted already asks for nothing.
//
// Its labels are all that says it is ours, and whoever may create Deployments in the namespace can
// write them: it makes the operator delete that Deployment (at our name, in the Service's own
// namespace or the lb pod namespace), never take the Service's finalizer (DecideService).
func leftDeployment(in ServiceInputs) bool {
	d := in.LBDeployment
	return d != nil && d.DeletionTimestamp.IsZero() && d.Labels[lbv1.ServiceUIDLabel] == string(in.Service.UID) &&
		d.Labels[lbobjects.ManagedByLabel] == lbobjects.ManagedByValue
}

// DecideService is the Service reconciler's decision.
func DecideService(in ServiceInputs) Plan {
	svc := in.Service
	deleting := !svc.DeletionTimestamp.IsZero()
	// Ours: it owns an address, or shows our conditions (which went in with our finalizer, in one
	// write to status that a tenant cannot make). Only then is the cleanup finalizer ours to take
	// off: another load balancer controller puts the same one.
	ours := len(in.Owned) > 0 || HasOurConditions(svc)
	provider, served := ServiceProvider(svc, in.DefaultProvider)
	if !in.EnableLBSvc {
		// With the flag off nothing is served: only a deletion we must not block completes.
		served = false
		if !deleting {
			return Plan{Action: PlanNothing}
		}
	}
	if !served || deleting {
		if !ours && !leftDeployment(in) {
			return Plan{Action: PlanNothing}
		}
		return Plan{Action: PlanTeardown, Drain: Bound(in.Owned), RemoveFinalizer: ours, Deleting: deleting}
	}
	refuse := func(ref *Refusal) Plan {
		return Plan{Action: PlanTeardown, Refusal: ref, Drain: Bound(in.Owned)}
	}

	if in.ForeignObject != "" {
		return refuse(ObjectConflict(in.ForeignObject))
	}
	nadName, nadNS, err := SplitProvider(provider)
	if err != nil {
		return refuse(err.(*Refusal))
	}
	if !in.NADFound {
		return refuse(&Refusal{ReasonNADNotFound, fmt.Sprintf("network attachment definition %s/%s (provider %q) does not exist: create it, or correct the annotation %s (<nad name>.<nad namespace>)", nadNS, nadName, provider, lbv1.AttachmentProviderAnnotation)})
	}
	subnet, err := ChooseSubnet(svc, provider, in.Subnets)
	if err != nil {
		return refuse(err.(*Refusal))
	}
	p := Plan{Action: PlanServe, Provider: provider, NADName: nadName, NADNamespace: nadNS, Subnet: subnet.Name}
	p.LBPod, p.ReplicasWarning = lbPodParams(in, p)

	cfg, verr := ValidateSubnet(subnet, in.Subnets)
	if verr == nil && !subnet.DeletionTimestamp.IsZero() {
		verr = &Refusal{ReasonSubnetNotReady, fmt.Sprintf("subnet %q is being deleted", subnet.Name)}
	}
	if verr != nil {
		ref := verr.(*Refusal)
		if ref.Reason != ReasonSubnetNotReady {
			ref = &Refusal{ReasonSubnetNotReady, fmt.Sprintf("subnet %q: %s", subnet.Name, ref.Message)}
		}
		// An invalid Subnet hands out nothing new, but what it already gave stays bound.
		held := inSubnet(Bound(in.Owned), subnet.Name)
		if len(held) == 0 {
			return refuse(ref)
		}
		parsed, perr := ParseSubnetSpec(subnet)
		if perr != nil {
			// Unparseable: keep the addresses as they are, and the objects as last applied.
			parsed = ipam.SubnetConfig{Name: subnet.Name}
		}
		p.SubnetConfig = parsed
		p.Keep = held
		p.Drain = without(Bound(in.Owned), held)
		p.HoldObjects = true
		if m := heldMember(svc, held); m != nil {
			// Still a member of the addresses it keeps: the lb pods of a shared address serve
			// the Services labelled for it, on the ports their status admits (setServedStatus).
			p.shareAs(svc, m, in.LBPod.Replicas)
		}
		p.Refusal = &Refusal{ref.Reason, ref.Message + "; the Service keeps " + JoinOwned(held) + " and nothing new is handed out"}
		return p
	}
	p.SubnetConfig = cfg
	p.LBPod.NodeSelector = subnet.Spec.NodeSelector.DeepCopy()
	p.Unplaceable = Unplaceable(subnet, in.Nodes)

	// The Service's own inputs, checked against the Subnet: something to forward to, ports,
	// the requested addresses, source ranges, and the families both sides have.
	v, ref := ValidateServiceInputs(svc, cfg)
	if ref != nil {
		return refuse(ref)
	}
	requested, families := v.Requested, v.Families
	p.trafficWarning(svc, families, v.SourceRanges)
	sharing, sref := ParseSharing(svc)
	if sref != nil {
		return refuse(sref)
	}
	key := ""
	if sharing != nil {
		m := MemberOf(svc, *sharing)
		p.shareAs(svc, &m, in.LBPod.Replicas)
		key = sharing.Key
	}
	// Across namespaces only with the lb pods outside every tenant.
	cross := in.LBPod.PodNamespace != ""
	owned := inSubnet(Bound(in.Owned), subnet.Name)
	ingress := IngressSet(svc)
	for _, f := range families {
		static, hasStatic := staticOf(requested, f)
		if ref := probeRefusal(in.Owned, subnet.Name, f, static, hasStatic, v.RequestedFrom); ref != nil {
			return refuse(ref)
		}
		var keep *OwnedIP
		for i := range owned {
			o := &owned[i]
			if ipam.FamilyOf(o.Addr) != f || ipam.CheckAddr(cfg, o.Addr) != nil || o.SharingKey != key {
				continue
			}
			if key != "" && SharingClash(key, MembersOf(key, o.Members), *p.Share, cross) != nil {
				// Its ports now clash with another member's: it leaves, and claims again.
				continue
			}
			if hasStatic && o.Addr != static {
				continue
			}
			// Prefer the address already published, then the lowest: two operators that each
			// claimed one for the same Service converge on the same choice.
			if keep == nil || (ingress[o.Addr] && !ingress[keep.Addr]) ||
				(ingress[o.Addr] == ingress[keep.Addr] && o.Addr.Less(keep.Addr)) {
				keep = o
			}
		}
		if keep != nil {
			p.Keep = append(p.Keep, *keep)
			if key != "" {
				if _, changed := WithMember(keep.Members, MemberRecord(*p.Share)); changed {
					p.Rejoin = append(p.Rejoin, *keep)
				}
			}
			continue
		}
		if hasStatic {
			// Its own address, asked for with another sharing key (the Service starts or stops
			// sharing it): the unshared lb pods and the shared ones are different Deployments,
			// which must not hold it at once. It drains first, then is claimed again. Not when
			// other members share it: it stays theirs, and the claim is refused as in use.
			for _, o := range owned {
				if o.Addr == static && o.SharingKey != key && len(o.Members) <= 1 {
					return Refuse(SharingChange(static, o.SharingKey, key), in.Owned)
				}
			}
		}
		c := Claim{Family: f, Static: static, Share: p.Share, CrossNamespace: cross}
		if hasStatic {
			c.From = v.RequestedFrom
		}
		p.Claims = append(p.Claims, c)
	}
	p.Drain = without(Bound(in.Owned), p.Keep)
	return p
}

// shareAs makes p the plan of m, a member of shared addresses: their lb pods are the address's,
// replicas (--lb-replicas) of them, and the Service's lbsvc.io/replicas is not read (said so).
func (p *Plan) shareAs(svc *corev1.Service, m *SharingMember, replicas int32) {
	p.Share = m
	p.SharedReplicas = max(replicas, 1)
	if _, set := svc.Annotations[lbv1.ReplicasAnnotation]; set {
		p.ReplicasWarning = fmt.Sprintf("annotation %s is not read on a Service that shares its address: its lb pods are the address's, %d of them (--lb-replicas)",
			lbv1.ReplicasAnnotation, p.SharedReplicas)
	}
}

// heldMember is the Service as a member of the shared addresses among held (kept while its
// Subnet is not Ready), nil when none is shared: as their IP objects record it, whatever its
// annotations say now (nothing is joined or left meanwhile), on the recorded ports its spec still
// has. Those were checked against the other members when recorded; a port added to the spec
// since is not, so it is not admitted until the Subnet is Ready again and the Service rejoins.
// With no such port left it is no member to serve (nil): an ingress entry that lists no port
// means every port of the spec to the lb pods (entries of releases that did not list them).
func heldMember(svc *corev1.Service, held []OwnedIP) *SharingMember {
	var m *SharingMember
	for _, o := range held {
		i := slices.IndexFunc(o.Members, func(r lbv1.IPMember) bool { return r.UID == string(svc.UID) })
		if o.SharingKey == "" || i < 0 {
			continue
		}
		rec := MembersOf(o.SharingKey, o.Members[i:i+1])[0]
		if m != nil {
			rec.Ports = commonPorts(rec.Ports, m.Ports)
		}
		m = &rec
	}
	if m == nil {
		return nil
	}
	m.Ports = commonPorts(m.Ports, SharingPortsOf(svc.Spec.Ports))
	if len(m.Ports) == 0 {
		return nil
	}
	return m
}

// lbPodParams fills the Service's own fields into the operator-wide lb pod settings: its name
// and UID, the attachment, the Subnet, and the replica count (its annotation, else the default).
func lbPodParams(in ServiceInputs, p Plan) (lbobjects.Params, string) {
	lp := in.LBPod
	svc := in.Service
	lp.ServiceName, lp.ServiceNamespace, lp.ServiceUID = svc.Name, svc.Namespace, svc.UID
	lp.Provider, lp.NADName, lp.NADNamespace, lp.SubnetName = p.Provider, p.NADName, p.NADNamespace, p.Subnet
	lp.HALegacyPeers = LegacyPeers(in.LBDeployment, in.LBPods, lbobjects.PodNamespace(lp.PodNamespace, svc.Namespace))
	def := max(in.LBPod.Replicas, 1)
	n, err := lbobjects.ParseReplicas(svc.Annotations, def)
	if err != nil {
		lp.Replicas = def
		return lp, fmt.Sprintf("%s; using %d", BoundedMessage(err.Error()), def)
	}
	lp.Replicas = n
	return lp, ""
}

func staticOf(requested []netip.Addr, f ipam.Family) (netip.Addr, bool) {
	for _, r := range requested {
		if ipam.FamilyOf(r) == f {
			return r, true
		}
	}
	return netip.Addr{}, false
}

// filter returns the IPs drop does not reject, nil when none (plans compare equal in tests).
func filter(ips []OwnedIP, drop func(OwnedIP) bool) []OwnedIP {
	var out []OwnedIP
	for _, o := range ips {
		if !drop(o) {
			out = append(out, o)
		}
	}
	return out
}

// Bound are the IPs that are not draining.
func Bound(ips []OwnedIP) []OwnedIP {
	return filter(ips, func(o OwnedIP) bool { return o.Draining || o.Conflict != nil })
}

// probeRefusal is the refusal of a Service because of what the conflict probe heard in family f
// of its Subnet: the address it asks for (static) answered on the underlay, or, asking for none,
// MaxConflictsPerFamily addresses given to it did. Below that a dynamic Service just gets the
// next free address (the one in phase Conflict stays taken).
func probeRefusal(owned []OwnedIP, subnet string, f ipam.Family, static netip.Addr, hasStatic bool, from string) *Refusal {
	var conflicts []OwnedIP
	for _, o := range owned {
		if o.Conflict != nil && o.Subnet == subnet && ipam.FamilyOf(o.Addr) == f {
			conflicts = append(conflicts, o)
		}
	}
	if hasStatic {
		for _, o := range conflicts {
			if o.Addr == static {
				return InUseOnUnderlay(from, static, *o.Conflict)
			}
		}
		return nil
	}
	if len(conflicts) < MaxConflictsPerFamily {
		return nil
	}
	macs := make([]string, 0, len(conflicts))
	for _, o := range conflicts {
		macs = append(macs, o.Addr.String()+" ("+o.Conflict.MAC+")")
	}
	return &Refusal{ReasonAddressInUse, BoundedMessage(fmt.Sprintf(
		"%d %s addresses given to this Service were in use on the underlay before their first announcement: %s; "+
			"no further address is tried: check the underlay for a host answering for every address (kubectl get ips), then delete those IP objects",
		len(conflicts), f, strings.Join(macs, ", ")))}
}

// InUseOnUnderlay is the refusal of an address a host on the underlay answered for (its IP
// object is in phase Conflict).
func InUseOnUnderlay(from string, addr netip.Addr, c lbv1.IPConflictStatus) *Refusal {
	return &Refusal{ReasonAddressInUse, BoundedMessage(fmt.Sprintf(
		"%s %s is in use on the underlay: %s answered the lb pod's probe at %s; it is not announced, and is not handed out again until an admin deletes the IP object (kubectl delete ip %s)",
		from, addr, c.MAC, c.Since.UTC().Format("2006-01-02T15:04:05Z"), lbv1.IPName(addr)))}
}

func inSubnet(ips []OwnedIP, subnet string) []OwnedIP {
	return filter(ips, func(o OwnedIP) bool { return o.Subnet != subnet })
}

func without(ips, remove []OwnedIP) []OwnedIP {
	return filter(ips, func(o OwnedIP) bool {
		return slices.ContainsFunc(remove, func(r OwnedIP) bool { return r.Name == o.Name })
	})
}

// JoinOwned renders the IPs' addresses as JoinAddrs does.
func JoinOwned(ips []OwnedIP) string {
	addrs := make([]netip.Addr, len(ips))
	for i, o := range ips {
		addrs[i] = o.Addr
	}
	return JoinAddrs(addrs)
}

// IngressSet is the set of addresses the Service's status.loadBalancer.ingress shows.
func IngressSet(svc *corev1.Service) map[netip.Addr]bool {
	out := map[netip.Addr]bool{}
	for _, i := range svc.Status.LoadBalancer.Ingress {
		if a, err := netip.ParseAddr(i.IP); err == nil {
			out[a] = true
		}
	}
	return out
}

// IngressAddrs is the Service's addresses as its status shows them, IPv4 first ("a,b"; "" for
// none). Only a writer of services/status (the operator; not a tenant with the edit role) sets
// them, so, unlike the lbsvc.io/allocated-ips annotation that mirrors them, they may name the IP
// objects an Event goes to and the address an earlier pass recorded.
func IngressAddrs(svc *corev1.Service) string {
	// Sorted first: JoinAddrs sorts stably, and a set's order must not leak in.
	return JoinAddrs(slices.SortedFunc(maps.Keys(IngressSet(svc)), netip.Addr.Compare))
}

// HasOurConditions tells whether the Service's status carries our conditions: only a writer of
// services/status (not a tenant with the edit role) can have put them there, so they prove we
// served it, unlike annotations.
func HasOurConditions(svc *corev1.Service) bool {
	return meta.FindStatusCondition(svc.Status.Conditions, ConditionAddressAllocated) != nil ||
		meta.FindStatusCondition(svc.Status.Conditions, ConditionLBPodAvailable) != nil
}

// IPOwnerOf is the IPOwner of a Service.
func IPOwnerOf(svc *corev1.Service) lbv1.IPOwner {
	return lbv1.IPOwner{Namespace: svc.Namespace, Name: svc.Name, UID: string(svc.UID)}
}
