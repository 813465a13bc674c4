package v1alpha1

// Names shared by the operator, the lb pod and the tests. The Kube-OVN keys are kept verbatim so
// that Kube-OVN's documented YAML works unchanged.
const (
	// AttachmentProviderAnnotation opts a Service in: "<nad name>.<nad namespace>".
	AttachmentProviderAnnotation = "ovn.kubernetes.io/attachmentprovider"

	// LogicalSwitchAnnotationSuffix, after "<provider>.kubernetes.io/", names the Subnet to use.
	LogicalSwitchAnnotationSuffix = "logical_switch"
	// IPAddressAnnotationSuffix, after "<provider>.kubernetes.io/", carries the lb pod's address.
	IPAddressAnnotationSuffix = "ip_address"

	// LoadBalancerClass is our spec.loadBalancerClass; Services with another class are not ours.
	LoadBalancerClass = "lbsvc.io/lb-svc"

	// ConditionAddressAllocated is the condition type by which the operator tells, in a Service's
	// status, whether the Service holds an address from a Subnet (the lb pods of a shared address
	// read it: status is the operator's to write, not a tenant's).
	ConditionAddressAllocated = "lbsvc.io/AddressAllocated"

	// CleanupFinalizer is Kubernetes' own finalizer for load balancers, put on every served Service.
	CleanupFinalizer = "service.kubernetes.io/load-balancer-cleanup"

	// SubnetFinalizer keeps a Subnet while Services still hold addresses from it.
	SubnetFinalizer = "lbsvc.io/subnet-in-use"

	// AllocatedIPsAnnotation records on the Service the addresses the operator holds for it,
	// comma-separated (one per family). It is a mirror for people and tools: who holds an address
	// is the IP object (its creation is the claim), and the address book is rebuilt from those;
	// only allocations an earlier release recorded here alone are adopted from it, once, at start.
	AllocatedIPsAnnotation = "lbsvc.io/allocated-ips"
	// AllocatedSubnetAnnotation records on the Service the Subnet its addresses come from.
	AllocatedSubnetAnnotation = "lbsvc.io/subnet"

	// ServiceLabel, on the lb pod, names the Service it serves (read through the downward API).
	ServiceLabel = "lbsvc.io/service"
	// ComponentLabel marks every object the operator creates for a Service.
	ComponentLabel = "app.kubernetes.io/component"
	// ComponentLBPod is ComponentLabel's value on lb pods.
	ComponentLBPod = "lb-svc"

	// DeploymentPrefix is prepended to the Service name to name its Deployment.
	DeploymentPrefix = "lb-svc-"

	// LBPodIdentity names the ServiceAccount and RoleBinding that the lb pods of every Service of
	// a namespace share (with --lb-pod-namespace, "<LBPodIdentity>-<Service namespace>" in the lb
	// pod namespace). Which Lease each pod may write is narrowed by the Lease admission policy,
	// from the pod name its token carries.
	LBPodIdentity = "lbsvc-lbpod"
	// IdentityLabel marks that ServiceAccount and RoleBinding (value "namespace"): they belong to
	// no one Service, and no Service's teardown deletes them.
	IdentityLabel = "lbsvc.io/identity"
	// IdentityNamespace is IdentityLabel's value.
	IdentityNamespace = "namespace"
)

// Environment of the lb pod's containers, set by the operator and read by cmd/lbpod.
const (
	// EnvNamespace is the Service's (and the pod's) namespace, from the downward API.
	EnvNamespace = "LBPOD_NAMESPACE"
	// EnvService is the Service name, from the pod label ServiceLabel via the downward API.
	EnvService = "LBPOD_SERVICE"
	// EnvSharedIP, instead of EnvService, makes the lb pod serve every member of a shared address:
	// the address's IP object name. The members are the Services of EnvNamespace (and of the
	// namespaces MemberNamespacesAnnotation lists) labelled SharedIPLabelPrefix+<name> whose
	// status.loadBalancer.ingress shows the address.
	EnvSharedIP = "LBPOD_SHARED_IP"
	// EnvSharedIPUID is the shared address's IP object UID and EnvOwnerUID its owner's
	// (spec.service.uid): the lb pods' Lease carries them (an owner reference to the IP object,
	// so it goes with the address, and the UID label the operator trusts).
	EnvSharedIPUID = "LBPOD_SHARED_IP_UID"
	EnvOwnerUID    = "LBPOD_OWNER_UID"
	// EnvAddresses is the LB address with the subnet prefix length, e.g. "172.18.0.18/16";
	// for Dual one per family, comma-separated.
	EnvAddresses = "LBPOD_ADDRESSES"
	// EnvGateways is the Subnet gateway, one per family, comma-separated, in EnvAddresses' order.
	EnvGateways = "LBPOD_GATEWAYS"
	// EnvSubnets is the Subnet CIDR, one per family, comma-separated, in EnvAddresses' order.
	EnvSubnets = "LBPOD_SUBNETS"
	// EnvPodIP is the pod's cluster address (downward API status.podIP): the only address the
	// lb pod's health and metrics server listens on, so the underlay cannot reach it.
	EnvPodIP = "LBPOD_POD_IP"
	// EnvReplicas is the number of lb pods the Service runs: with more than one, the pods elect
	// one active holder of the address among themselves and the others stand by.
	EnvReplicas = "LBPOD_REPLICAS"
	// EnvPodName and EnvNodeName name the lb pod and its node (downward API), for the election's
	// sender identity and for what the pod reports.
	EnvPodName  = "LBPOD_POD_NAME"
	EnvNodeName = "LBPOD_NODE_NAME"
	// EnvLease names the Service's Lease (in EnvNamespace), where the replica that takes the
	// address over records itself; set only with standbys.
	EnvLease = "LBPOD_LEASE"
	// EnvPodNamespace is the lb pod's own namespace (downward API metadata.namespace): where its
	// ServiceAccount (named EnvLease) is, which differs from EnvNamespace with
	// --lb-pod-namespace. Unset (older Deployments): the pod's service account namespace file,
	// else EnvNamespace.
	EnvPodNamespace = "LBPOD_POD_NAMESPACE"
	// EnvHAInterval is the election's advert interval (a Go duration, "100ms"); set only with
	// standbys and only when --lb-ha-interval is not the lb pod's own default.
	EnvHAInterval = "LBPOD_HA_INTERVAL"
	// EnvRules is the lb pod's rules back end: RulesAuto (the default, also when unset or empty),
	// RulesNFTables or RulesIPTables.
	EnvRules = "LBPOD_RULES"
)

// The values of EnvRules (lbpod's --rules, the operator's --lb-rules).
const (
	// RulesAuto is nftables, or iptables where the node's kernel has no nf_tables. The operator
	// sets no EnvRules for it: a Deployment written before it became the default stays as it was.
	RulesAuto = "auto"
	// RulesNFTables is nf_tables over netlink, the Service ports in sets; an lb pod where
	// nf_tables is missing fails at start.
	RulesNFTables = "nftables"
	// RulesIPTables is iptables-restore, the variant the node uses.
	RulesIPTables = "iptables"
)

// LoadBalancerIPsAnnotation on a Service asks for its addresses: one per family, comma-separated
// (either order), as spec.loadBalancerIP takes them. It wins over that field, which Kubernetes
// deprecated in 1.24 (MetalLB's metallb.io/loadBalancerIPs and Cilium's lbipam.cilium.io/ips
// are the same move); when both are set they must ask for the same addresses.
const LoadBalancerIPsAnnotation = "lbsvc.io/loadBalancerIPs"

// AllowSharedIPAnnotation on a Service names its sharing key: Services with the same key (and
// Subnet) share one address when no protocol and port is served by two of them (MetalLB's
// metallb.io/allow-shared-ip). One lb Deployment per address serves every member.
const AllowSharedIPAnnotation = "lbsvc.io/allow-shared-ip"

// SharedIPNamespacesAnnotation on a sharing Service lists the other namespaces (comma-separated,
// or "*" for all) whose Services may share its address; both sides must name each other, and the
// operator must run with --lb-pod-namespace (Cilium's lbipam.cilium.io/sharing-cross-namespace).
const SharedIPNamespacesAnnotation = "lbsvc.io/shared-ip-namespaces"

// ReplicasAnnotation on a Service sets how many lb pods serve it (1 to MaxReplicas); it
// overrides --lb-replicas. 1 keeps a single lb pod with no standby.
const ReplicasAnnotation = "lbsvc.io/replicas"

// Names of the active/standby roles among a Service's lb pods.
const (
	// RoleActive and RoleStandby are the roles the IP object's status.holders show: RoleActive for
	// the lb pod that holds the address, as its Service's Lease records it. (Earlier releases
	// also put them in an lb pod label, lbsvc.io/role; the operator no longer writes pods.)
	RoleActive  = "active"
	RoleStandby = "standby"
	// ActivePodAnnotation and ActiveNodeAnnotation, on the Service, name the lb pod
	// ("<namespace>/<name>") and the node that hold its address.
	ActivePodAnnotation  = "lbsvc.io/active-pod"
	ActiveNodeAnnotation = "lbsvc.io/active-node"
)

// Annotations of the Service's Lease, written by its lb pods (cmd/lbpod).
const (
	// HAClaimAnnotation is the holder's claim in the election, "<term> <priority> <net1 MAC>"
	// (lbpod/ha.Claim): an lb pod writes the Lease only with a newer claim, and an active lb pod
	// that reads a newer claim of another pod there lets go (the Lease fences a broken underlay).
	HAClaimAnnotation = "lbsvc.io/ha-claim"
	// HeldTwiceAnnotation is written by an lb pod that let go because the Lease named a newer
	// claim it never heard on the underlay: "<pod> <RFC3339 time> <its term> <other pod> <other
	// term>", the two pods that held the address at once and when the first let go. The operator
	// raises the AddressHeldTwice Warning Event and condition from it.
	HeldTwiceAnnotation = "lbsvc.io/held-twice"
)

// MaxReplicas bounds ReplicasAnnotation: standbys beyond a handful add election traffic and
// scheduling constraints without adding availability.
const MaxReplicas = 5

// ProviderAnnotation returns "<provider>.kubernetes.io/<suffix>".
func ProviderAnnotation(provider, suffix string) string {
	return provider + ".kubernetes.io/" + suffix
}

// Names around the IP objects.
const (
	// DrainFinalizer keeps an IP object (and so its name, the address) taken until no lb pod
	// that could hold the address exists.
	DrainFinalizer = "lbsvc.io/drain"

	// IPv4Label and IPv6Label, on the lb Deployment, its pod template and so its ReplicaSets and
	// pods, carry the IP object name of the address the pod holds. They find the pods that could
	// still hold a draining address, whatever the Service has become since.
	IPv4Label = "lbsvc.io/ipv4"
	IPv6Label = "lbsvc.io/ipv6"

	// ServiceNamespaceLabel and ServiceUIDLabel, with ServiceLabel, tie every per-Service object
	// to its Service, also when it lives in another namespace (--lb-pod-namespace), where owner
	// references cannot reach.
	ServiceNamespaceLabel = "lbsvc.io/service-namespace"
	ServiceUIDLabel       = "lbsvc.io/service-uid"
	// SharedIPLabel, on the lb objects and pods of a shared address (one lb Deployment per
	// address, whatever its members), is the address's IP object name; with ComponentLabel it is
	// their Deployment's selector. ServiceLabel is absent there: the objects serve no one Service.
	SharedIPLabel = "lbsvc.io/shared-ip"
	// SharedIPLabelPrefix+<IP object name>, on a Service, says that it is a member of that
	// shared address: the lb pods of the address watch the Services so labelled (any one may set
	// a label: they serve only those whose status, which only the operator writes, shows the
	// address).
	SharedIPLabelPrefix = "ip.lbsvc.io/"
	// MemberNamespacesAnnotation, on the ServiceAccount of a shared address's lb pods (named
	// EnvLease, in the lb pods' namespace), lists the namespaces of the address's members other
	// than EnvNamespace, comma-separated and sorted (absent or empty: none). The operator writes
	// it; the lb pods watch the labelled Services of EnvNamespace and of these. Only who may edit
	// ServiceAccounts in the lb pod namespace can change it, and it only widens what the lb pods
	// try to watch: the RoleBindings the operator creates in member namespaces, and each
	// member's status, decide what they serve.
	MemberNamespacesAnnotation = "lbsvc.io/member-namespaces"
)
