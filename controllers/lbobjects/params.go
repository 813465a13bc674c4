package lbobjects

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/lbsvc/lbsvc-operator/controllers/ipam"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// Names and values of the lb pod that are ours alone (the shared ones live in apis/v1alpha1).
const (
	// ManagedByLabel / ManagedByValue mark every object the operator creates.
	ManagedByLabel = "app.kubernetes.io/managed-by"
	ManagedByValue = "lbsvc-operator"

	// ServiceUIDAnnotation, on each object the operator builds, names the Service's UID: with
	// the owner reference (same namespace) or the label of the same name, it proves the object is
	// ours even after a hand edit removed one of them.
	ServiceUIDAnnotation = "lbsvc.io/service-uid"

	// NetworksAnnotation is Multus' request for extra interfaces.
	NetworksAnnotation = "k8s.v1.cni.cncf.io/networks"
	// LBInterface is the macvlan interface Multus adds to the lb pod.
	LBInterface = "net1"

	lbpodBinary       = "/usr/local/bin/lbpod"
	probePort         = 8081
	runVolumeName     = "run"
	runMountPath      = "/run"
	mainContainer     = "lbpod"
	sysctlIPv6Fwd     = "net.ipv6.conf.all.forwarding"
	sysctlIPv4Fwd     = "net.ipv4.ip_forward"
	cidrSuffix        = "cidr"
	gatewaySuffix     = "gateway"
	serviceKind       = "Service"
	serviceAPIVersion = "v1"
)

// ForwardingSysctls selects which forwarding sysctls the lb pod sets through its securityContext.
// A new network namespace inherits IPv4 forwarding from the node but starts with IPv6 forwarding
// off, and /proc/sys is read-only in an unprivileged container, so the kubelet has to set them.
type ForwardingSysctls string

// The --forwarding-sysctls values.
const (
	ForwardingNone ForwardingSysctls = "none"
	ForwardingIPv6 ForwardingSysctls = "ipv6"
	ForwardingAll  ForwardingSysctls = "all"
)

// ParseForwardingSysctls validates a --forwarding-sysctls value.
func ParseForwardingSysctls(s string) (ForwardingSysctls, error) {
	switch f := ForwardingSysctls(s); f {
	case ForwardingNone, ForwardingIPv6, ForwardingAll:
		return f, nil
	}
	return "", fmt.Errorf("forwarding sysctls %q: want none, ipv6 or all", s)
}

// Params is everything the per-Service objects are built from: plain data, no client.
type Params struct {
	ServiceName      string
	ServiceNamespace string
	ServiceUID       types.UID
	// PodNamespace is where the Deployment and ServiceAccount live (--lb-pod-namespace, or the
	// Service's namespace); the RoleBinding stays in the Service's namespace, since it grants
	// reading the Service and writing its Lease there.
	PodNamespace string
	// Provider is the attachment provider, "<nad name>.<nad namespace>".
	Provider     string
	NADName      string
	NADNamespace string
	SubnetName   string
	// Addresses are the allocated addresses, one per family; CIDRs and Gateways hold the
	// Subnet's prefix and gateway of the same family, index for index.
	Addresses []netip.Addr
	CIDRs     []netip.Prefix
	Gateways  []netip.Addr
	Image     string
	Sysctls   ForwardingSysctls
	// Replicas is the number of lb pods (0 means 1). With more than one, one pod holds the
	// address and the others stand by, spread over nodes.
	Replicas int32
	// HAInterval is the standbys' advert interval (--lb-ha-interval); zero leaves the lb pod's
	// default (100 ms).
	HAInterval time.Duration
	// Rules is the lb pod's rules back end (--lb-rules): empty leaves the lb pod's default
	// (auto: nftables, iptables where nf_tables is missing) and sets no variable, so that a
	// Deployment written before the default changed is not rolled for it; "nftables" or
	// "iptables" sets LBPOD_RULES.
	Rules string
	// ConflictProbe is the lb pod's conflict probe timing (--lb-conflict-probe): empty leaves the
	// lb pod's default (fast) and sets no variable; "rfc" or "off" sets LBPOD_CONFLICT_PROBE.
	ConflictProbe string
	// NodeSelector is the Subnet's spec.nodeSelector: the lb pods run only on the nodes it
	// matches (a required node affinity, see NodeAffinity). nil: anywhere.
	NodeSelector *metav1.LabelSelector
	// Claim names the IP objects of the addresses (any order): the election key belongs to the
	// claim (BuildHAKeySecret). Empty: no key.
	Claim []IPRef
	// Shared, when set, makes these the lb objects of a shared address (one lb Deployment per
	// address, serving every member): Addresses holds that one address, Claim its IP object, and
	// ServiceName, ServiceNamespace and ServiceUID name the IP object's owner (spec.service), whose
	// UID the objects carry so that the drain counts them (decide.ProvablyOurs). They are named
	// after the address (SharedObjectName), selected by SharedIPLabel, owned by the IP object
	// rather than by a Service, and their lb pods watch the members (EnvSharedIP).
	Shared *IPRef
	// MemberNamespaces, with Shared, are the namespaces of the address's members other than its
	// owner's (sorted): the lb pods are bound there too and watch them (MemberNamespacesAnnotation).
	MemberNamespaces []string
	// HALegacyPeers: lb pods from before authenticated adverts may still run beside the new ones
	// (an upgrade's rollout), so the new ones get the legacy window (HALegacyWindow) to defer to
	// them; otherwise none (0), and a forged unauthenticated advert is refused from the start.
	HALegacyPeers bool
}

// LBReplicas is p.Replicas with 0 read as 1.
func (p Params) LBReplicas() int32 {
	if p.Replicas < 1 {
		return 1
	}
	return p.Replicas
}

// ParseReplicas returns the lb pod count of a Service: the ReplicasAnnotation when set, else def.
// A bad value is an error that quotes at most a short prefix of it.
func ParseReplicas(annotations map[string]string, def int32) (int32, error) {
	v, ok := annotations[lbv1.ReplicasAnnotation]
	if !ok {
		return def, nil
	}
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 32)
	if err != nil || n < 1 || n > lbv1.MaxReplicas {
		return 0, fmt.Errorf("annotation %s=%q: want a whole number from 1 to %d", lbv1.ReplicasAnnotation, quotePrefix(v), lbv1.MaxReplicas)
	}
	return int32(n), nil
}

// quotePrefix cuts a user-given value to a short prefix for messages.
func quotePrefix(v string) string {
	const max = 32
	if len(v) <= max {
		return v
	}
	return strings.ToValidUTF8(v[:max], "") + "..."
}

// ObjectName is the name of the Deployment, ServiceAccount, Role and RoleBinding of a Service
// whose lb pod runs in its own namespace.
func ObjectName(service string) string { return lbv1.DeploymentPrefix + service }

// ObjectNameIn is the per-Service object name when lb pods of many namespaces share one
// (--lb-pod-namespace): "lb-svc-<namespace>-<service>" cut to 40 characters, then a digest of
// "<namespace>/<service>", since namespace names may hold dashes too ("a-b"/"c" and "a"/"b-c"
// must not meet).
func ObjectNameIn(podNamespace, namespace, service string) string {
	if PodNamespace(podNamespace, namespace) == namespace {
		return ObjectName(service)
	}
	readable := namespace + "-" + service
	if len(readable) > 40 {
		readable = strings.TrimRight(readable[:40], "-.")
	}
	sum := sha256.Sum256([]byte(namespace + "/" + service))
	return lbv1.DeploymentPrefix + readable + "-" + hex.EncodeToString(sum[:4])
}

// SharedObjectName is the name of the lb objects of a shared address: "lb-svc-4-" or
// "lb-svc-6-" and the IP object name with '-' for '.' ("lb-svc-4-172-18-0-12"). A Service name
// starts with a letter, and the names of --lb-pod-namespace end in an 8-digit digest, so no
// per-Service name is ever one of these; "lb-svc-" keeps the Lease admission policy's rule
// (the Lease is named like the ServiceAccount).
func SharedObjectName(ipName string) string {
	fam := "4"
	if strings.Count(ipName, "-") == 7 {
		fam = "6"
	}
	return lbv1.DeploymentPrefix + fam + "-" + strings.ReplaceAll(ipName, ".", "-")
}

// name is the per-Service object name, or the shared address's.
func (p Params) name() string {
	if p.Shared != nil {
		return SharedObjectName(p.Shared.Name)
	}
	return ObjectNameIn(p.PodNamespace, p.ServiceNamespace, p.ServiceName)
}

// PodNamespace is where a Service's lb pods, Deployment, ServiceAccount and budget live: the
// --lb-pod-namespace when set, else the Service's own namespace. The one place of that rule.
func PodNamespace(lbPodNamespace, serviceNamespace string) string {
	if lbPodNamespace == "" {
		return serviceNamespace
	}
	return lbPodNamespace
}

// podNamespace is where the Deployment and ServiceAccount live.
func (p Params) podNamespace() string { return PodNamespace(p.PodNamespace, p.ServiceNamespace) }

// shared tells whether the lb pod lives outside the Service's namespace.
func (p Params) shared() bool { return p.podNamespace() != p.ServiceNamespace }

// AddressLabels are the labels naming the IP objects of addrs (lbsvc.io/ipv4, lbsvc.io/ipv6).
func AddressLabels(addrs []netip.Addr) map[string]string {
	out := map[string]string{}
	for _, a := range addrs {
		if a.Is4() {
			out[lbv1.IPv4Label] = lbv1.IPName(a)
		} else {
			out[lbv1.IPv6Label] = lbv1.IPName(a)
		}
	}
	return out
}

// familyOrdered returns the indices of p.Addresses with IPv4 first, so that every
// comma-separated list the lb pod reads is in the same, predictable order.
func (p Params) familyOrdered() []int {
	idx := make([]int, len(p.Addresses))
	for i := range idx {
		idx[i] = i
	}
	// The same order as ipam.SortIPv4First, kept as indices: CIDRs and Gateways pair by index.
	slices.SortStableFunc(idx, func(a, b int) int {
		return cmp.Compare(ipam.FamilyOf(p.Addresses[a]), ipam.FamilyOf(p.Addresses[b]))
	})
	return idx
}

// lists renders the address, address/prefix, CIDR and gateway lists, IPv4 first.
func (p Params) lists() (addrs, addrPrefixes, cidrs, gateways string) {
	var a, ap, c, g []string
	for _, i := range p.familyOrdered() {
		a = append(a, p.Addresses[i].String())
		if i < len(p.CIDRs) {
			ap = append(ap, netip.PrefixFrom(p.Addresses[i], p.CIDRs[i].Bits()).String())
			c = append(c, p.CIDRs[i].Masked().String())
		}
		if i < len(p.Gateways) {
			g = append(g, p.Gateways[i].String())
		}
	}
	return strings.Join(a, ","), strings.Join(ap, ","), strings.Join(c, ","), strings.Join(g, ",")
}

func (p Params) ownerReference() metav1.OwnerReference {
	return metav1.OwnerReference{
		APIVersion:         serviceAPIVersion,
		Kind:               serviceKind,
		Name:               p.ServiceName,
		UID:                p.ServiceUID,
		Controller:         ptr.To(true),
		BlockOwnerDeletion: ptr.To(true),
	}
}

// Labels are the labels of every object built for the Service (and of its lb pod).
func Labels(service string) map[string]string {
	return map[string]string{
		lbv1.ComponentLabel: lbv1.ComponentLBPod,
		lbv1.ServiceLabel:   service,
		ManagedByLabel:      ManagedByValue,
	}
}

// labels are Labels plus the Service's namespace and UID; of a shared address, the address in
// place of the Service's name.
func (p Params) labels() map[string]string {
	l := Labels(p.ServiceName)
	if p.Shared != nil {
		delete(l, lbv1.ServiceLabel)
		l[lbv1.SharedIPLabel] = p.Shared.Name
	}
	l[lbv1.ServiceNamespaceLabel] = p.ServiceNamespace
	l[lbv1.ServiceUIDLabel] = string(p.ServiceUID)
	return l
}

// selectorLabels is the Deployment's (immutable) selector: stable for the Service's lifetime.
// In a shared lb pod namespace it also names the Service's namespace, since Services of two
// namespaces may share a name.
func (p Params) selectorLabels() map[string]string {
	if p.Shared != nil {
		return map[string]string{lbv1.ComponentLabel: lbv1.ComponentLBPod, lbv1.SharedIPLabel: p.Shared.Name}
	}
	l := map[string]string{
		lbv1.ComponentLabel: lbv1.ComponentLBPod,
		lbv1.ServiceLabel:   p.ServiceName,
	}
	if p.shared() {
		l[lbv1.ServiceNamespaceLabel] = p.ServiceNamespace
	}
	return l
}

// objectMeta is the metadata of an object in namespace ns: an owner reference to the Service
// where the namespaces allow one (garbage collection then follows the Service).
func (p Params) objectMeta(ns string) metav1.ObjectMeta {
	m := metav1.ObjectMeta{
		Name:        p.name(),
		Namespace:   ns,
		Labels:      p.labels(),
		Annotations: map[string]string{ServiceUIDAnnotation: string(p.ServiceUID)},
	}
	switch {
	case p.Shared != nil:
		// The members come and go; the objects go with the address (the IP controller deletes
		// them when it drains; the garbage collector after it, should anything be left).
		m.OwnerReferences = []metav1.OwnerReference{IPOwnerReference(*p.Shared)}
	case ns == p.ServiceNamespace:
		m.OwnerReferences = []metav1.OwnerReference{p.ownerReference()}
	}
	return m
}

// IPOwnerReference is an owner reference to an IP object (cluster-scoped, so any namespace's
// objects may name it). It does not block the IP object's deletion: that would need update
// rights on its finalizers, which the lb pods creating their Lease lack.
func IPOwnerReference(r IPRef) metav1.OwnerReference {
	return metav1.OwnerReference{APIVersion: lbv1.GroupVersion.String(), Kind: ipKind, Name: r.Name, UID: r.UID}
}
