package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Protocol is the address family (or families) a Subnet serves.
// +kubebuilder:validation:Enum=IPv4;IPv6;Dual
type Protocol string

// The protocols a Subnet can declare.
const (
	ProtocolIPv4 Protocol = "IPv4"
	ProtocolIPv6 Protocol = "IPv6"
	ProtocolDual Protocol = "Dual"
)

// SubnetSpec describes a block of underlay addresses and the NetworkAttachmentDefinition
// (provider) through which LoadBalancer Services receive them. Field names follow Kube-OVN's
// Subnet so that its documented YAML applies with only the apiVersion changed.
//
// +kubebuilder:validation:XValidation:rule="self.cidrBlock.split(',').all(c, isCIDR(c))",message="cidrBlock must be one CIDR, or two comma-separated CIDRs (one IPv4, one IPv6) for Dual"
// +kubebuilder:validation:XValidation:rule="!has(self.protocol) || self.protocol != 'Dual' || (self.cidrBlock.split(',').size() == 2 && self.cidrBlock.split(',').all(c, isCIDR(c)) && cidr(self.cidrBlock.split(',')[0]).ip().family() != cidr(self.cidrBlock.split(',')[1]).ip().family())",message="protocol Dual needs one IPv4 and one IPv6 CIDR in cidrBlock, comma-separated"
// +kubebuilder:validation:XValidation:rule="!has(self.protocol) || self.protocol == 'Dual' || (self.cidrBlock.split(',').size() == 1 && isCIDR(self.cidrBlock) && cidr(self.cidrBlock).ip().family() == (self.protocol == 'IPv4' ? 4 : 6))",message="cidrBlock must hold exactly one CIDR of the family named by protocol"
// +kubebuilder:validation:XValidation:rule="!has(self.gateway) || self.gateway.split(',').all(g, isIP(g))",message="gateway must be an IP address, or one per family comma-separated"
// +kubebuilder:validation:XValidation:rule="self.provider == oldSelf.provider",message="provider is immutable"
// +kubebuilder:validation:XValidation:rule="self.cidrBlock.split(',').all(c, !isCIDR(c) || cidr(c).masked().ip().isGlobalUnicast())",message="cidrBlock must be unicast host addresses: not 0.0.0.0/0 or ::/0, loopback, link-local, multicast or unspecified (the operator also refuses any CIDR that overlaps such a range)"
type SubnetSpec struct {
	// Protocol is IPv4, IPv6 or Dual. When omitted it follows from cidrBlock.
	// +optional
	Protocol Protocol `json:"protocol,omitempty"`

	// Provider names the NetworkAttachmentDefinition as "<name>.<namespace>"; a Service whose
	// ovn.kubernetes.io/attachmentprovider annotation has this value draws from this Subnet.
	// +kubebuilder:validation:MinLength=3
	// +kubebuilder:validation:MaxLength=317
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+$`
	Provider string `json:"provider"`

	// CIDRBlock is the subnet: one CIDR, or "<IPv4 CIDR>,<IPv6 CIDR>" for Dual.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=100
	CIDRBlock string `json:"cidrBlock"`

	// Gateway is the underlay router the lb pod sends replies through: one address, or one per
	// family comma-separated for Dual. Defaults to the first address after each network address.
	// It is never handed out.
	// +optional
	// +kubebuilder:validation:MaxLength=100
	Gateway string `json:"gateway,omitempty"`

	// ExcludeIPs are addresses never handed out: single addresses ("172.18.0.5") and inclusive
	// ranges ("172.18.0.0..172.18.0.10").
	// +optional
	// +kubebuilder:validation:MaxItems=1024
	// +kubebuilder:validation:items:MaxLength=100
	ExcludeIPs []string `json:"excludeIps,omitempty"`

	// Namespaces, when set, are the only namespaces whose Services may draw from this Subnet.
	// +optional
	// +kubebuilder:validation:MaxItems=1024
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:items:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Namespaces []string `json:"namespaces,omitempty"`

	// NodeSelector, when set, is where the lb pods of this Subnet's Services may run: only on
	// nodes whose labels it matches (nodes whose uplink carries the underlay VLAN). It becomes a
	// required node affinity of the lb pods (matchLabels as In with one value; matchExpressions
	// In, NotIn, Exists and DoesNotExist as they are). An empty selector matches every node.
	// An invalid one (another operator, In without values, a bad key) makes the Subnet not Ready
	// (InvalidSpec). Changing it moves the lb pods by their Deployment's own strategy.
	// +optional
	NodeSelector *metav1.LabelSelector `json:"nodeSelector,omitempty"`
}

// SubnetStatus reports whether the Subnet is usable and how many addresses it has left.
// Counters saturate at the largest int64 (an IPv6 /64 has more addresses than that).
type SubnetStatus struct {
	// Conditions: Ready tells whether the Subnet is valid and serving.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// V4AvailableIPs is the number of IPv4 addresses that can still be handed out.
	// +optional
	V4AvailableIPs int64 `json:"v4availableIPs"`
	// V4UsingIPs is the number of IPv4 addresses held by Services.
	// +optional
	V4UsingIPs int64 `json:"v4usingIPs"`
	// V6AvailableIPs is the number of IPv6 addresses that can still be handed out.
	// +optional
	V6AvailableIPs int64 `json:"v6availableIPs"`
	// V6UsingIPs is the number of IPv6 addresses held by Services.
	// +optional
	V6UsingIPs int64 `json:"v6usingIPs"`

	// ObservedGeneration is the spec generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// Subnet is a block of underlay addresses for LoadBalancer Services.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Provider",type=string,JSONPath=`.spec.provider`
// +kubebuilder:printcolumn:name="Protocol",type=string,JSONPath=`.spec.protocol`,priority=1
// +kubebuilder:printcolumn:name="CIDR",type=string,JSONPath=`.spec.cidrBlock`
// +kubebuilder:printcolumn:name="Gateway",type=string,JSONPath=`.spec.gateway`
// +kubebuilder:printcolumn:name="V4Used",type=integer,JSONPath=`.status.v4usingIPs`
// +kubebuilder:printcolumn:name="V4Available",type=integer,JSONPath=`.status.v4availableIPs`
// +kubebuilder:printcolumn:name="V6Used",type=integer,JSONPath=`.status.v6usingIPs`
// +kubebuilder:printcolumn:name="V6Available",type=integer,JSONPath=`.status.v6availableIPs`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="Message",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].message`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Subnet struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   SubnetSpec   `json:"spec"`
	Status SubnetStatus `json:"status,omitempty"`
}

// SubnetList is a list of Subnets.
//
// +kubebuilder:object:root=true
type SubnetList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Subnet `json:"items"`
}
