package v1alpha1

import (
	"net/netip"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// IPOwner names the Service an address is allocated to. The UID makes a Service deleted and
// created again under the same name a different owner: it never inherits a draining address.
type IPOwner struct {
	// Namespace of the Service.
	// +kubebuilder:validation:MaxLength=63
	Namespace string `json:"namespace"`
	// Name of the Service.
	// +kubebuilder:validation:MaxLength=63
	Name string `json:"name"`
	// UID of the Service.
	// +kubebuilder:validation:MaxLength=64
	UID string `json:"uid"`
}

// IPMember is one Service on a shared address.
type IPMember struct {
	// Namespace of the Service.
	// +kubebuilder:validation:MaxLength=63
	Namespace string `json:"namespace"`
	// Name of the Service.
	// +kubebuilder:validation:MaxLength=63
	Name string `json:"name"`
	// UID of the Service.
	// +kubebuilder:validation:MaxLength=64
	UID string `json:"uid"`
	// Ports are the protocols and ports it serves on the address ("TCP/53"), sorted: no two
	// members serve the same one.
	// +optional
	// +kubebuilder:validation:MaxItems=4096
	// +kubebuilder:validation:items:MaxLength=11
	Ports []string `json:"ports,omitempty"`
	// Namespaces are the other namespaces it accepts members from ("*": all).
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=63
	Namespaces []string `json:"namespaces,omitempty"`
}

// IPSpec is one allocated address. Its address, Subnet, owner and sharing key never change: a
// Service that moves to another address gets a new IP object and the old one drains. Only the
// members of a shared address change, each join and leave an update the API server orders
// (resourceVersion), so that two passes never both take the last free port or both let go of
// an address someone joins.
//
// +kubebuilder:validation:XValidation:rule="self.address == oldSelf.address && self.subnet == oldSelf.subnet && self.service == oldSelf.service",message="an IP object's address, subnet and service are immutable"
// +kubebuilder:validation:XValidation:rule="has(self.sharingKey) == has(oldSelf.sharingKey) && (!has(self.sharingKey) || self.sharingKey == oldSelf.sharingKey)",message="an IP object's sharingKey is immutable"
// +kubebuilder:validation:XValidation:rule="!has(self.members) || size(self.members) == 0 || has(self.sharingKey)",message="only a shared address (sharingKey) has members"
// +kubebuilder:validation:XValidation:rule="isIP(self.address)",message="address must be an IP address"
type IPSpec struct {
	// Address is the allocated address, in its canonical text form.
	// +kubebuilder:validation:MaxLength=45
	Address string `json:"address"`
	// Subnet is the Subnet the address comes from.
	// +kubebuilder:validation:MaxLength=253
	Subnet string `json:"subnet"`
	// Service is the owner; of a shared address, the Service it was first claimed for (the
	// members are its holders then, and its lb objects carry this UID).
	Service IPOwner `json:"service"`
	// SharingKey, when set, makes the address shared (lbsvc.io/allow-shared-ip) by Members,
	// in the owner's namespace unless members name each other's namespaces.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	SharingKey string `json:"sharingKey,omitempty"`
	// Members are the Services on a shared address. The last one leaving drains it.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	Members []IPMember `json:"members,omitempty"`
}

// IPPhase is where an address is in its life.
// +kubebuilder:validation:Enum=Bound;Draining;Conflict
type IPPhase string

// The phases of an IP object.
const (
	// IPBound: the address belongs to its Service, whose lb pods may hold it.
	IPBound IPPhase = "Bound"
	// IPDraining: the Service let go of the address; it is handed out again only once no lb pod
	// that could hold it exists (the object is deleted then).
	IPDraining IPPhase = "Draining"
	// IPConflict: before the address was first announced, a host on the underlay answered the
	// lb pod's probe for it (status.conflict). The object stays, so the address is not handed out
	// again, whatever becomes of its Service, until an admin deletes it.
	IPConflict IPPhase = "Conflict"
)

// IPConflictStatus is what the conflict probe heard.
type IPConflictStatus struct {
	// MAC is the hardware address of the host that answered.
	// +kubebuilder:validation:MaxLength=17
	MAC string `json:"mac"`
	// Since is when it answered, as the lb pod reported it.
	Since metav1.Time `json:"since"`
}

// IPHolder is an lb pod that holds, or could hold, the address.
type IPHolder struct {
	// Pod is "<namespace>/<name>" of the lb pod.
	Pod string `json:"pod"`
	// Node the pod runs on (empty while unscheduled).
	// +optional
	Node string `json:"node,omitempty"`
	// Role is active for the pod that holds the address (as its Service's Lease records it, or
	// the one Ready pod of a single lb pod) and standby for the others; empty when the owner
	// Service is gone.
	// +optional
	Role string `json:"role,omitempty"`
}

// IPStatus reports the phase and the lb pods behind the address.
type IPStatus struct {
	// Phase is Bound, Draining or Conflict.
	// +optional
	Phase IPPhase `json:"phase,omitempty"`
	// Announced is set once the Service's lb pods have announced the address (their Lease lists
	// it in lbsvc.io/announced), and never cleared: a conflict reported after that is not
	// believed (the probe runs only before the first announcement).
	// +optional
	Announced bool `json:"announced,omitempty"`
	// Conflict, in phase Conflict, is the underlay host that answered the probe.
	// +optional
	Conflict *IPConflictStatus `json:"conflict,omitempty"`
	// Holders are the lb pods that carry the address in their template (at most 16 listed).
	// +optional
	// +kubebuilder:validation:MaxItems=16
	Holders []IPHolder `json:"holders,omitempty"`
	// Active is the lb pod ("<namespace>/<name>") that holds the address on the wire, as its
	// Service's lb pods last reported it; empty while unknown.
	// +optional
	Active string `json:"active,omitempty"`
	// Node is the node of the active holder (else of the first holder), for `kubectl get ips`.
	// +optional
	Node string `json:"node,omitempty"`
	// Members, of a shared address, names its members (spec.members) for `kubectl get ips`,
	// comma-separated, cut to 256 bytes with the count of the rest.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	Members string `json:"members,omitempty"`
	// Message says what the address waits for, when it waits.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message,omitempty"`
}

// IP records who holds an underlay address. Creating it is the claim: the API server, not a
// cache, decides between two claimants (AlreadyExists means taken). Only the operator writes IP
// objects. The finalizer lbsvc.io/drain keeps the name taken until no lb pod can hold the
// address any more.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=lbip
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Address",type=string,JSONPath=`.spec.address`
// +kubebuilder:printcolumn:name="Subnet",type=string,JSONPath=`.spec.subnet`
// +kubebuilder:printcolumn:name="Namespace",type=string,JSONPath=`.spec.service.namespace`
// +kubebuilder:printcolumn:name="Service",type=string,JSONPath=`.spec.service.name`
// +kubebuilder:printcolumn:name="Members",type=string,JSONPath=`.status.members`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.status.node`
// +kubebuilder:printcolumn:name="Active",type=string,JSONPath=`.status.active`,priority=1
// +kubebuilder:printcolumn:name="Message",type=string,JSONPath=`.status.message`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type IP struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec IPSpec `json:"spec"`
	// Status defaults to phase Bound (the API server fills it in when it reads an object stored
	// without one): the claim that creates an IP object binds it, so that state costs no status
	// write of its own; the IP controller writes only what differs (holders, Draining,
	// Conflict, the members of a shared address).
	// +kubebuilder:default={phase: Bound}
	Status IPStatus `json:"status,omitempty"`
}

// IPList is a list of IP objects.
//
// +kubebuilder:object:root=true
type IPList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []IP `json:"items"`
}

// IPName is the object name of an address: the IPv4 dotted form, or the fully expanded IPv6
// form with '-' for ':' ("fd00-0000-...-0018"). Both are canonical (one name per address) and
// valid as object names and label values.
func IPName(a netip.Addr) string {
	a = a.WithZone("")
	if a.Is4() || a.Is4In6() {
		return a.Unmap().String()
	}
	return strings.ReplaceAll(a.StringExpanded(), ":", "-")
}
