package decide

import lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"

// Condition types the operator sets in a Service's status.conditions and a Subnet's status.
const (
	// ConditionAddressAllocated tells whether the Service holds an address from a Subnet.
	ConditionAddressAllocated = lbv1.ConditionAddressAllocated
	// ConditionLBPodAvailable mirrors the Available condition of the Service's lb-svc Deployment.
	ConditionLBPodAvailable = "lbsvc.io/LBPodAvailable"
	// ConditionAddressActive tells which lb pod holds the address (from the Lease its lb pods
	// write when one takes the address over).
	ConditionAddressActive = "lbsvc.io/AddressActive"
	// ConditionAddressHeldTwice is True while two lb pods of the Service held its address at once
	// lately (the lb pods' election was split: their adverts did not reach each other), False
	// after a quiet period; absent while that never happened.
	ConditionAddressHeldTwice = "lbsvc.io/AddressHeldTwice"
	// ConditionSubnetReady tells whether a Subnet is valid and may hand out addresses.
	ConditionSubnetReady = "Ready"
)

// Reasons of conditions and Events. One place, so that the docs, the tests and the code agree.
const (
	// ReasonAllocated: the Service holds its address(es).
	ReasonAllocated = "Allocated"
	// ReasonAddressMoved: the Service's address changed (new static address or Subnet).
	ReasonAddressMoved = "AddressMoved"
	// ReasonInvalidProvider: the attachment provider is not "<nad name>.<nad namespace>".
	ReasonInvalidProvider = "InvalidProvider"
	// ReasonNADNotFound: the NetworkAttachmentDefinition named by the provider does not exist.
	ReasonNADNotFound = "NetworkAttachmentDefinitionNotFound"
	// ReasonSubnetNotFound: no Subnet (or the one named by logical_switch) serves the provider.
	ReasonSubnetNotFound = "SubnetNotFound"
	// ReasonSubnetAmbiguous: several Subnets serve the provider and none is named.
	ReasonSubnetAmbiguous = "SubnetAmbiguous"
	// ReasonSubnetProviderMismatch: the Subnet named by logical_switch has another provider.
	ReasonSubnetProviderMismatch = "SubnetProviderMismatch"
	// ReasonNamespaceNotAllowed: the Subnet's spec.namespaces excludes the Service's namespace.
	ReasonNamespaceNotAllowed = "NamespaceNotAllowed"
	// ReasonSubnetNotReady: the Subnet is invalid (see its Ready condition) or being deleted.
	ReasonSubnetNotReady = "SubnetNotReady"
	// ReasonInvalidLoadBalancerIP: the annotation lbsvc.io/loadBalancerIPs or spec.loadBalancerIP
	// does not parse as address(es), at most one per family.
	ReasonInvalidLoadBalancerIP = "InvalidLoadBalancerIP"
	// ReasonLoadBalancerIPConflict: the annotation lbsvc.io/loadBalancerIPs and
	// spec.loadBalancerIP are both set and ask for different addresses.
	ReasonLoadBalancerIPConflict = "LoadBalancerIPConflict"
	// ReasonAddressOutOfRange: the static address is outside the Subnet.
	ReasonAddressOutOfRange = "AddressOutOfRange"
	// ReasonAddressExcluded: the static address is in the Subnet's excludeIps.
	ReasonAddressExcluded = "AddressExcluded"
	// ReasonAddressIsGateway: the static address is the Subnet's gateway.
	ReasonAddressIsGateway = "AddressIsGateway"
	// ReasonAddressReserved: the static address is a network or broadcast address.
	ReasonAddressReserved = "AddressReserved"
	// ReasonAddressInUse: the static address is held by another Service.
	ReasonAddressInUse = "AddressInUse"
	// ReasonAddressFamily: the static address's family is not served by the Subnet.
	ReasonAddressFamily = "AddressFamilyMismatch"
	// ReasonSubnetExhausted: the Subnet has no free address left.
	ReasonSubnetExhausted = "SubnetExhausted"
	// ReasonAllocationFailed: any other allocation error.
	ReasonAllocationFailed = "AllocationFailed"
	// ReasonAddressConflict: after a restart two Services recorded one address; the older kept it.
	ReasonAddressConflict = "AddressConflict"
	// ReasonApplyFailed: creating or updating the lb-svc objects failed (requeued with backoff).
	ReasonApplyFailed = "ApplyFailed"
	// ReasonCleanupFailed: deleting the lb-svc objects failed (requeued with backoff).
	ReasonCleanupFailed = "CleanupFailed"
	// ReasonCleanedUp: the Service is no longer served; its objects and address are gone.
	ReasonCleanedUp = "CleanedUp"
	// ReasonAddressDraining: the address asked for is draining (its last lb pod still exists);
	// the Service gets it once that pod is gone.
	ReasonAddressDraining = "AddressDraining"
	// ReasonObjectConflict: an object at one of the Service's per-Service names is not ours.
	ReasonObjectConflict = "ObjectConflict"
	// ReasonDrainBlocked (Event on an IP object): a pod that could hold the address sits on a
	// node that is not Ready, so the address cannot be handed out again.
	ReasonDrainBlocked = "DrainBlocked"
	// ReasonDrained (Event on an IP object): no lb pod can hold the address any more.
	ReasonDrained = "Drained"
	// ReasonForeignHolderIgnored (Warning Event on an IP object): pods, ReplicaSets or
	// Deployments carry the address label but are not provably lb pods of the IP's Service
	// (labels, Service UID, namespace); they neither hold the address nor delay its release.
	ReasonForeignHolderIgnored = "ForeignHolderIgnored"
	// ReasonDeploymentAvailable / ReasonDeploymentUnavailable / ReasonDeploymentPending describe
	// ConditionLBPodAvailable.
	ReasonDeploymentAvailable   = "DeploymentAvailable"
	ReasonDeploymentUnavailable = "DeploymentUnavailable"
	ReasonDeploymentPending     = "DeploymentPending"
	// ReasonNoMatchingNode (ConditionLBPodAvailable, and a Warning Event): the Subnet's
	// spec.nodeSelector matches no Ready, schedulable node, so no lb pod can be scheduled. The
	// address stays allocated and the Deployment applied: it schedules once a node matches.
	ReasonNoMatchingNode = "NoMatchingNode"

	// ReasonInvalidReplicas (Warning Event): the lbsvc.io/replicas annotation is not a whole
	// number from 1 to 5; the Service keeps --lb-replicas.
	ReasonInvalidReplicas = "InvalidReplicas"
	// ReasonInternalTrafficPolicyLocal (Warning Event, and the end of the AddressAllocated
	// message): a served Service's spec.internalTrafficPolicy is Local (Plan.TrafficWarnings).
	ReasonInternalTrafficPolicyLocal = "InternalTrafficPolicyLocal"
	// ReasonSessionAffinityClientIP (the same way): spec.sessionAffinity is ClientIP, which
	// pins every client of the address to one endpoint (Plan.TrafficWarnings).
	ReasonSessionAffinityClientIP = "SessionAffinityClientIP"
	// ReasonSourceRangesOmitFamily (the same way): loadBalancerSourceRanges name no range of
	// one of the address's families, so every client of that family is refused.
	ReasonSourceRangesOmitFamily = "SourceRangesOmitFamily"
	// ReasonActiveHolder: an lb pod holds the address (condition AddressActive and the Event of
	// each move). ReasonNoActiveHolder: none has reported holding it yet.
	ReasonActiveHolder   = "ActiveHolder"
	ReasonNoActiveHolder = "NoActiveHolder"
	// ReasonAddressHeldTwice (ConditionAddressHeldTwice True, and a Warning Event on the Service
	// and its IP objects): two lb pods held the address at once, until the Lease fenced one.
	// ReasonSingleHolder: no such report for HeldTwiceQuiet.
	ReasonAddressHeldTwice = "AddressHeldTwice"
	ReasonSingleHolder     = "SingleHolder"

	// ReasonSubnetValid: the Subnet parsed and overlaps no older Subnet.
	ReasonSubnetValid = "Valid"
	// ReasonSubnetInvalid: a field is inconsistent (gateway or exclusion outside the CIDR, ...).
	ReasonSubnetInvalid = "InvalidSpec"
	// ReasonSubnetOverlap: the Subnet shares addresses with an older Subnet.
	ReasonSubnetOverlap = "Overlap"
	// ReasonSubnetInUse: deletion waits for the Services that still hold addresses.
	ReasonSubnetInUse = "SubnetInUse"
)

// Sharing an address (issue 23): reasons of ParseSharing and SharingClash (sharing.go).
const (
	// ReasonInvalidSharing: lbsvc.io/allow-shared-ip or lbsvc.io/shared-ip-namespaces is malformed.
	ReasonInvalidSharing = "InvalidSharing"
	// ReasonSharingConflict: the Service may not join the address it asks for (a port served by
	// another member, another key, a namespace not named on both sides).
	ReasonSharingConflict = "SharingConflict"
)

// Input validation (issue 12): reasons of ValidateServiceInputs (validate.go).
const (
	// ReasonInvalidSourceRanges: spec.loadBalancerSourceRanges, or the annotation
	// service.beta.kubernetes.io/load-balancer-source-ranges, has an item that is not a CIDR
	// (or is an IPv4-mapped range, or there are too many).
	ReasonInvalidSourceRanges = "InvalidSourceRanges"
	// ReasonFamilyMismatch: the Service has no ClusterIP of any family its Subnet serves, or
	// the requested addresses (annotation or spec.loadBalancerIP) ask for a family the Service
	// has no ClusterIP of.
	ReasonFamilyMismatch = "FamilyMismatch"
	// ReasonNoClusterIP: the Service (ExternalName, headless, or not allocated yet) has no
	// ClusterIP for the lb pod to forward to.
	ReasonNoClusterIP = "NoClusterIP"
	// ReasonInvalidPorts: no port, a port outside 1-65535, a protocol other than TCP, UDP or
	// SCTP, or a (port, protocol) pair given twice.
	ReasonInvalidPorts = "InvalidPorts"
)
