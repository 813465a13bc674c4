package decide

import (
	"fmt"
	"slices"
	"strings"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
)

// Which lb pod holds the address is decided on the wire, by the lb pods among themselves (see
// lbpod's election); the API server only hears of it. The lb pod that takes the address over
// writes the Service's Lease once (holderIdentity, leaseTransitions), never to renew it, and
// the operator mirrors that record where people look: a role label on every lb pod, the
// Service's active-pod/active-node annotations and AddressActive condition, an Event per move,
// and the IP object's status. Nothing in the operator acts on it beyond showing it.

// ActiveInputs is what the visibility decision reads for one served Service.
type ActiveInputs struct {
	// Service is the served Service (its annotations hold what was shown last).
	Service *corev1.Service
	// Lease is the Service's Lease (nil: none, as with a single lb pod).
	Lease *coordinationv1.Lease
	// Pods are the Service's lb pods (found by label; terminating ones included).
	Pods []corev1.Pod
	// Addresses is the Service's recorded address list, for messages.
	Addresses string
}

// RolePatch sets the role label of one lb pod.
type RolePatch struct {
	Namespace, Name, Role string
}

// ActiveEvent is the Event of a move of the address to another lb pod.
type ActiveEvent struct {
	Reason, Message string
}

// ActivePlan is what DecideActive wants shown.
type ActivePlan struct {
	// ActivePod ("<namespace>/<name>") and ActiveNode name the holder; empty while unknown.
	ActivePod, ActiveNode string
	// Roles lists only the lb pods whose role label differs from the one wanted.
	Roles []RolePatch
	// Annotations are the wanted values of the active-pod/active-node annotations ("" removes).
	Annotations map[string]string
	// Condition is the wanted AddressActive condition.
	Condition metav1.Condition
	// Event is set when the holder changed since what the Service shows.
	Event *ActiveEvent
}

// DecideActive maps the Lease record and the lb pods to what the operator shows. Pure.
//
// The holder is the pod the Lease names, if it is one of the Service's lb pods: a name that
// matches no lb pod of this Service (a pod gone since, or a value written by hand) shows no
// holder rather than a wrong one. Without a Lease (one lb pod, no election), or before any pod
// wrote it, the single running pod that is Ready holds the address (one pod cannot be a standby).
func DecideActive(in ActiveInputs) ActivePlan {
	var holder *corev1.Pod
	if id := leaseHolder(in.Lease); id != "" {
		for i := range in.Pods {
			if in.Pods[i].Name == id {
				holder = &in.Pods[i]
			}
		}
	} else {
		var live []*corev1.Pod
		for i := range in.Pods {
			if in.Pods[i].DeletionTimestamp == nil && podReady(&in.Pods[i]) {
				live = append(live, &in.Pods[i])
			}
		}
		if len(live) == 1 {
			holder = live[0]
		}
	}

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
		role := lbv1.RoleStandby
		if holder != nil && p.Name == holder.Name && p.Namespace == holder.Namespace {
			role = lbv1.RoleActive
		} else if p.DeletionTimestamp == nil {
			standbys = append(standbys, fmt.Sprintf("%s/%s on node %s", p.Namespace, p.Name, nodeOrUnscheduled(p.Spec.NodeName)))
		}
		if p.Labels[lbv1.RoleLabel] != role {
			plan.Roles = append(plan.Roles, RolePatch{Namespace: p.Namespace, Name: p.Name, Role: role})
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

	was := ""
	if in.Service != nil {
		was = in.Service.Annotations[lbv1.ActivePodAnnotation]
	}
	if was != plan.ActivePod {
		msg := fmt.Sprintf("%s now held by pod %s on node %s", in.Addresses, plan.ActivePod, nodeOrUnscheduled(plan.ActiveNode))
		if was != "" {
			msg += fmt.Sprintf(" (was pod %s on node %s)", was, nodeOrUnscheduled(in.Service.Annotations[lbv1.ActiveNodeAnnotation]))
		}
		plan.Event = &ActiveEvent{Reason: ReasonActiveHolder, Message: BoundedMessage(msg)}
	}
	return plan
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
