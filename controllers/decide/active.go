package decide

import (
	"fmt"
	"slices"
	"strings"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
	"github.com/lbsvc/lbsvc-operator/controllers/lbobjects"
)

// Which lb pod holds the address is decided on the wire, by the lb pods among themselves (see
// lbpod's election); the API server only hears of it. The lb pod that takes the address over
// writes the Service's Lease once (holderIdentity, leaseTransitions), never to renew it, and
// the operator mirrors that record where people look: the Service's active-pod/active-node
// annotations and AddressActive condition, an Event per move, and the IP object's status (each
// holder's role, status.active). Nothing in the operator acts on it beyond showing it, and it
// writes nothing on the lb pods (it may not write pods at all).

// ActiveInputs is what the visibility decision reads for one served Service.
type ActiveInputs struct {
	// Service is the served Service (its annotations hold what was shown last).
	Service *corev1.Service
	// Lease is the Service's Lease (nil: none yet).
	Lease *coordinationv1.Lease
	// Replicas is the Service's lb pod count (ServiceReplicas). With one, the Lease is not read:
	// it can only be left from a time with standbys (the operator may not delete it).
	Replicas int32
	// Pods are the Service's lb pods (found by label; terminating ones included).
	Pods []corev1.Pod
	// Addresses is the Service's recorded address list, for messages.
	Addresses string
}

// ActiveEvent is the Event of a move of the address to another lb pod.
type ActiveEvent struct {
	Reason, Message string
}

// ActivePlan is what DecideActive wants shown.
type ActivePlan struct {
	// ActivePod ("<namespace>/<name>") and ActiveNode name the holder; empty while unknown.
	ActivePod, ActiveNode string
	// Annotations are the wanted values of the active-pod/active-node annotations ("" removes).
	Annotations map[string]string
	// Condition is the wanted AddressActive condition.
	Condition metav1.Condition
	// Event is set when the holder changed since what the Service shows.
	Event *ActiveEvent
}

// ActiveHolder is the lb pod among pods (the Service's) that holds the address as far as the API
// server knows, or nil. With standbys, it is the pod the Lease names, if it is one of pods: a name
// that matches none (a pod gone since, or a value written by hand) gives no holder rather than a
// wrong one. With one lb pod (replicas 1: the Lease is not read), or before any pod wrote the
// Lease, the single running pod that is Ready holds the address (one pod cannot be a standby).
// Every other pod of the Service is a standby. Pure.
func ActiveHolder(lease *coordinationv1.Lease, pods []corev1.Pod, replicas int32) *corev1.Pod {
	if replicas > 1 {
		if id := leaseHolder(lease); id != "" {
			for i := range pods {
				if pods[i].Name == id {
					return &pods[i]
				}
			}
			return nil
		}
	}
	var live []*corev1.Pod
	for i := range pods {
		if pods[i].DeletionTimestamp == nil && podReady(&pods[i]) {
			live = append(live, &pods[i])
		}
	}
	if len(live) == 1 {
		return live[0]
	}
	return nil
}

// ServiceReplicas is the lb pod count of a served Service: its lbsvc.io/replicas, else def (the
// --lb-replicas), also for a bad value, as the Service pass decides it (lbPodParams).
func ServiceReplicas(svc *corev1.Service, def int32) int32 {
	def = max(def, 1)
	n, err := lbobjects.ParseReplicas(svc.Annotations, def)
	if err != nil {
		return def
	}
	return n
}

// DecideActive maps the Lease record and the lb pods to what the operator shows (the holder is
// ActiveHolder's). Pure.
func DecideActive(in ActiveInputs) ActivePlan {
	holder := ActiveHolder(in.Lease, in.Pods, in.Replicas)

	plan := ActivePlan{Annotations: map[string]string{lbv1.ActivePodAnnotation: "", lbv1.ActiveNodeAnnotation: ""}}
	if holder != nil {
		plan.ActivePod = holder.Namespace + "/" + holder.Name
		plan.ActiveNode = holder.Spec.NodeName
		plan.Annotations[lbv1.ActivePodAnnotation] = plan.ActivePod
		plan.Annotations[lbv1.ActiveNodeAnnotation] = plan.ActiveNode
	}

	var standbys []string
	pods := slices.Clone(in.Pods)
	slices.SortFunc(pods, func(a, b corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
	for _, p := range pods {
		isHolder := holder != nil && p.Name == holder.Name && p.Namespace == holder.Namespace
		if !isHolder && p.DeletionTimestamp == nil {
			standbys = append(standbys, fmt.Sprintf("%s/%s on node %s", p.Namespace, p.Name, nodeOrUnscheduled(p.Spec.NodeName)))
		}
	}

	standby := "no standby"
	if len(standbys) > 0 {
		standby = "standby: " + strings.Join(standbys, ", ")
	}
	if holder == nil {
		plan.Condition = metav1.Condition{Type: ConditionAddressActive, Status: metav1.ConditionFalse, Reason: ReasonNoActiveHolder,
			Message: BoundedMessage(fmt.Sprintf("no lb pod has reported holding %s yet; %s", in.Addresses, standby))}
		return plan
	}
	plan.Condition = metav1.Condition{Type: ConditionAddressActive, Status: metav1.ConditionTrue, Reason: ReasonActiveHolder,
		Message: BoundedMessage(fmt.Sprintf("%s held by pod %s on node %s; %s", in.Addresses, plan.ActivePod, nodeOrUnscheduled(plan.ActiveNode), standby))}

	was, wasNode := ShownHolder(in.Service)
	if was != plan.ActivePod {
		msg := fmt.Sprintf("%s now held by pod %s on node %s", in.Addresses, plan.ActivePod, nodeOrUnscheduled(plan.ActiveNode))
		if was != "" {
			msg += fmt.Sprintf(" (was pod %s on node %s)", was, nodeOrUnscheduled(wasNode))
		}
		plan.Event = &ActiveEvent{Reason: ReasonActiveHolder, Message: BoundedMessage(msg)}
	}
	return plan
}

// ShownHolder is the lb pod (namespace/name) and node the Service's AddressActive condition names
// as holding its address, empty when it names none. It reads the status, which only the operator
// writes, and not the lbsvc.io/active-pod and active-node annotations, mirrors a tenant may edit
// (to make a move look like none, or name a pod that never held the address).
func ShownHolder(svc *corev1.Service) (pod, node string) {
	if svc == nil {
		return "", ""
	}
	c := meta.FindStatusCondition(svc.Status.Conditions, ConditionAddressActive)
	if c == nil || c.Status != metav1.ConditionTrue || c.Reason != ReasonActiveHolder {
		return "", ""
	}
	// DecideActive's message: "<addresses> held by pod <pod> on node <node>; <standbys>".
	_, rest, ok := strings.Cut(c.Message, " held by pod ")
	if !ok {
		return "", ""
	}
	if pod, rest, ok = strings.Cut(rest, " on node "); !ok {
		return "", ""
	}
	node, _, _ = strings.Cut(rest, ";")
	if node == nodeOrUnscheduled("") {
		node = ""
	}
	return pod, node
}

func nodeOrUnscheduled(n string) string {
	if n == "" {
		return "(unscheduled)"
	}
	return n
}

// leaseHolder is the holder a Lease names ("" for none or no Lease).
func leaseHolder(l *coordinationv1.Lease) string {
	if l == nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// podReady tells whether the pod's Ready condition is True.
func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
