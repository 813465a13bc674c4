package controllers

import (
	"cmp"
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
	"github.com/lbsvc/lbsvc-operator/controllers/decide"
	"github.com/lbsvc/lbsvc-operator/controllers/lbobjects"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
)

// The Service pass's writes to the Service itself and its Events. Status and metadata go in one
// patch to the status subresource: the API server keeps metadata changes made through a Service's
// status (Kubernetes' own service controller adds this same finalizer that way), so the ingress,
// our conditions, our finalizer and the mirror annotations land together, as one write, and a
// pass that changes nothing writes nothing.

// recordServed shows a served Service's addresses: the ingress, conditions, our finalizer and the
// mirror annotations in one write. Our condition and our finalizer going in together is the proof
// (which a tenant cannot write: it is in status) that lets a later pass remove the finalizer,
// whenever the operator is killed. confirmed says that this write went to the live Service, which
// now carries our finalizer and is not being deleted (see confirmService).
func (r *ServiceReconciler) recordServed(ctx context.Context, svc *corev1.Service, plan decide.Plan, addrs []netip.Addr) (confirmed bool, err error) {
	allocated := plan.AllocatedCondition(addrs)
	if plan.Refusal != nil {
		r.warnOnChange(svc, allocated, actionAllocate)
	}
	var allocatedBefore string
	if c := meta.FindStatusCondition(svc.Status.Conditions, decide.ConditionAddressAllocated); c != nil && c.Status == metav1.ConditionTrue {
		allocatedBefore = c.Message
	}
	current, err := r.currentDeployment(ctx, svc, plan, addrs)
	if err != nil {
		return false, err
	}
	lbPod := plan.LBPodCondition(current)
	if plan.Unplaceable != nil {
		r.warnOnChange(svc, lbPod, actionSchedule)
	}
	written, err := r.patchService(ctx, svc, func(s *corev1.Service) {
		setServedStatus(s, plan, addrs, []metav1.Condition{allocated, lbPod})
		controllerutil.AddFinalizer(s, lbv1.CleanupFinalizer)
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		s.Annotations[lbv1.AllocatedIPsAnnotation] = decide.JoinAddrs(addrs)
		s.Annotations[lbv1.AllocatedSubnetAnnotation] = plan.Subnet
		var shared []netip.Addr
		if plan.Share != nil {
			shared = addrs
		}
		setMemberLabels(s, shared)
	})
	if err != nil {
		return false, err
	}
	if plan.ReplicasWarning != "" {
		r.Recorder.Eventf(svc, nil, corev1.EventTypeWarning, decide.ReasonInvalidReplicas, actionApply, "%s", plan.ReplicasWarning)
	}
	for _, w := range plan.TrafficWarnings {
		if written && !strings.Contains(allocatedBefore, w.Message) {
			r.Recorder.Eventf(svc, nil, corev1.EventTypeWarning, w.Reason, actionApply, "%s", w.Message)
		}
	}
	return written && svc.DeletionTimestamp.IsZero() && controllerutil.ContainsFinalizer(svc, lbv1.CleanupFinalizer), nil
}

// reportServed ends a served pass: the Event of a new or moved address, and the lb pod condition
// from the Deployment as ensured.
func (r *ServiceReconciler) reportServed(ctx context.Context, svc *corev1.Service, plan decide.Plan, addrs []netip.Addr,
	previous string, claimedAny bool, deploy *appsv1.Deployment) error {
	recorded := decide.JoinAddrs(addrs)
	switch {
	case previous == "" && claimedAny:
		r.Recorder.Eventf(svc, nil, corev1.EventTypeNormal, decide.ReasonAllocated, actionAllocate, "allocated %s from subnet %q", recorded, plan.Subnet)
	case previous != recorded && previous != "":
		r.Recorder.Eventf(svc, nil, corev1.EventTypeNormal, decide.ReasonAddressMoved, actionAllocate,
			"address moved from %s to %s (subnet %q); the old address drains until its lb pod is gone", decide.BoundedMessage(previous), recorded, plan.Subnet)
	}
	_, err := r.patchService(ctx, svc, func(s *corev1.Service) {
		setServedStatus(s, plan, addrs, []metav1.Condition{plan.AllocatedCondition(addrs), plan.LBPodCondition(deploy)})
	})
	return err
}

// setMemberLabels puts on s the label of each shared address it is a member of (SharedIPLabelPrefix
// and the IP object name: the lb pods of the address watch the Services so labelled) and takes
// off every other label of that prefix.
func setMemberLabels(s *corev1.Service, shared []netip.Addr) {
	want := map[string]bool{}
	for _, a := range shared {
		want[lbv1.SharedIPLabelPrefix+lbv1.IPName(a)] = true
	}
	for k := range s.Labels {
		if strings.HasPrefix(k, lbv1.SharedIPLabelPrefix) && !want[k] {
			delete(s.Labels, k)
		}
	}
	for k := range want {
		if s.Labels == nil {
			s.Labels = map[string]string{}
		}
		s.Labels[k] = ""
	}
}

// currentDeployment is the Service's lb Deployment as the cache shows it (an empty one when there
// is none), for a Service that shares that of its first address: its status is what the lb pod
// condition reads.
func (r *ServiceReconciler) currentDeployment(ctx context.Context, svc *corev1.Service, plan decide.Plan, addrs []netip.Addr) (*appsv1.Deployment, error) {
	current := &appsv1.Deployment{}
	key := client.ObjectKey{Namespace: lbobjects.PodNamespace(r.Options.LBPodNamespace, svc.Namespace),
		Name: lbobjects.ObjectNameIn(r.Options.LBPodNamespace, svc.Namespace, svc.Name)}
	if plan.Share != nil && len(addrs) > 0 {
		key.Name = lbobjects.SharedObjectName(lbv1.IPName(addrs[0]))
	}
	if err := r.Client.Get(ctx, key, current); err != nil && !apierrors.IsNotFound(err) {
		return nil, err
	}
	return current, nil
}

// recordTeardown clears what we wrote on a Service we tore down (owned: the IP objects it owned
// before the drain): our annotations, our finalizer when it is let go, our ingress entries, and
// our conditions, or the refusal's.
func (r *ServiceReconciler) recordTeardown(ctx context.Context, svc *corev1.Service, plan decide.Plan, owned []decide.OwnedIP) error {
	ours := map[string]bool{}
	for _, o := range owned {
		ours[o.Addr.String()] = true
	}
	recorded := svc.Annotations[lbv1.AllocatedIPsAnnotation]
	var refused *metav1.Condition
	if plan.Refusal != nil {
		cond := decide.RefusedCondition(plan.Refusal)
		r.warnOnChange(svc, cond, actionAllocate)
		refused = &cond
	}
	if _, err := r.patchService(ctx, svc, func(s *corev1.Service) {
		delete(s.Annotations, lbv1.AllocatedIPsAnnotation)
		delete(s.Annotations, lbv1.AllocatedSubnetAnnotation)
		// Who held the address goes too (the active controller no longer looks at a Service we
		// do not serve): left, it would show a pod long gone, and on a return to LoadBalancer
		// the first holder's Event would name it as the one before.
		delete(s.Annotations, lbv1.ActivePodAnnotation)
		delete(s.Annotations, lbv1.ActiveNodeAnnotation)
		meta.RemoveStatusCondition(&s.Status.Conditions, decide.ConditionAddressActive)
		meta.RemoveStatusCondition(&s.Status.Conditions, decide.ConditionAddressHeldTwice)
		setMemberLabels(s, nil)
		if plan.RemoveFinalizer {
			controllerutil.RemoveFinalizer(s, lbv1.CleanupFinalizer)
		}
		switch {
		case refused != nil:
			setStatus(s, nil, ours, []metav1.Condition{*refused})
		case plan.Deleting:
			// The Service goes: its status goes with it.
		default:
			setStatus(s, nil, ours, nil)
		}
	}); err != nil {
		return client.IgnoreNotFound(err)
	}
	if len(owned) > 0 && plan.Refusal == nil {
		if kept := sharedWithOthers(owned); len(kept) == len(owned) {
			r.Recorder.Eventf(svc, nil, corev1.EventTypeNormal, decide.ReasonCleanedUp, actionCleanup,
				"left the shared address %s: its other members keep it", decide.JoinOwned(kept))
		} else {
			r.Recorder.Eventf(svc, nil, corev1.EventTypeNormal, decide.ReasonCleanedUp, actionCleanup,
				"released %s: it drains until its lb pod is gone; the lb-svc objects are deleted", joinOwnedOr(owned, recorded))
		}
	}
	return nil
}

// warnOnChange sends the Warning Event of a refusal when the condition changes, so requeues and
// unrelated updates do not flood the Service's events.
func (r *ServiceReconciler) warnOnChange(svc *corev1.Service, cond metav1.Condition, action string) {
	old := meta.FindStatusCondition(svc.Status.Conditions, cond.Type)
	if old == nil || old.Status != cond.Status || old.Reason != cond.Reason || old.Message != cond.Message {
		r.Recorder.Eventf(svc, nil, corev1.EventTypeWarning, cond.Reason, action, "%s", cond.Message)
	}
}

// patchService applies mutate to the Service and, when its metadata or status changed, sends the
// difference as one patch to the status subresource (which keeps the metadata changes and ignores
// the spec), under optimistic locking: a pass that read an old Service is sent round again.
// written says that the patch was sent and accepted; svc is then the Service as the API server
// answered it.
func (r *ServiceReconciler) patchService(ctx context.Context, svc *corev1.Service, mutate func(*corev1.Service)) (written bool, err error) {
	before := svc.DeepCopy()
	mutate(svc)
	if statusEqual(before.Status, svc.Status) && equalStringMaps(before.Annotations, svc.Annotations) &&
		equalStringMaps(before.Labels, svc.Labels) && slices.Equal(before.Finalizers, svc.Finalizers) {
		return false, nil
	}
	if err := r.Client.Status().Patch(ctx, svc, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{}), client.FieldOwner(FieldOwner)); err != nil {
		return false, fmt.Errorf("patch service %s/%s: %w", svc.Namespace, svc.Name, err)
	}
	return true, nil
}

// setStatus sets the ingress to addrs (or, with remove, only drops the entries of those addresses:
// what another controller wrote stays) and sets conds; with no conds our conditions are removed.
func setStatus(svc *corev1.Service, addrs []netip.Addr, remove map[string]bool, conds []metav1.Condition) {
	if remove != nil {
		svc.Status.LoadBalancer.Ingress = slices.DeleteFunc(svc.Status.LoadBalancer.Ingress, func(i corev1.LoadBalancerIngress) bool {
			return i.Hostname == "" && remove[i.IP]
		})
		if len(svc.Status.LoadBalancer.Ingress) == 0 {
			svc.Status.LoadBalancer.Ingress = nil
		}
	} else {
		svc.Status.LoadBalancer.Ingress = ingressFor(addrs)
	}
	if conds == nil {
		meta.RemoveStatusCondition(&svc.Status.Conditions, decide.ConditionAddressAllocated)
		meta.RemoveStatusCondition(&svc.Status.Conditions, decide.ConditionLBPodAvailable)
	}
	for _, c := range conds {
		c.ObservedGeneration = svc.Generation
		meta.SetStatusCondition(&svc.Status.Conditions, c)
	}
	if remove != nil {
		// Let go or refused: there is no lb pod to report on.
		meta.RemoveStatusCondition(&svc.Status.Conditions, decide.ConditionLBPodAvailable)
	}
}

// setServedStatus is setStatus of a served Service: its addresses and conds, and for a member of a
// shared address the ports admitted for it (admitPorts).
func setServedStatus(s *corev1.Service, plan decide.Plan, addrs []netip.Addr, conds []metav1.Condition) {
	setStatus(s, addrs, nil, conds)
	if plan.Share != nil {
		admitPorts(s, plan.Share.Ports)
	}
}

// admitPorts lists, on each ingress entry of a member of a shared address, the ports of its spec
// that are among member (the plan's: the whole spec as this pass judged it, no clash with the
// other members; while its Subnet is not Ready, what the IP objects recorded): the lb pods of the
// address serve a member only on the ports listed there, which only the operator writes. A
// member that adds a port of another member to its spec (a tenant may) thus takes nothing from
// it in the moment before its pass refuses it: the port is not listed. The status write carries
// the version the pass read (optimistic lock), so a spec changed since is judged again before
// any port is listed.
func admitPorts(s *corev1.Service, member []decide.SharingPort) {
	ports := make([]corev1.PortStatus, 0, len(s.Spec.Ports))
	for _, p := range s.Spec.Ports {
		ps := corev1.PortStatus{Port: p.Port, Protocol: cmp.Or(p.Protocol, corev1.ProtocolTCP)}
		if slices.Contains(member, decide.SharingPort{Protocol: ps.Protocol, Port: ps.Port}) {
			ports = append(ports, ps)
		}
	}
	for i := range s.Status.LoadBalancer.Ingress {
		s.Status.LoadBalancer.Ingress[i].Ports = slices.Clone(ports)
	}
}

// ingressFor lists the addresses as ingress points; ipMode stays unset (VIP) so that kube-proxy
// serves in-cluster clients directly.
func ingressFor(addrs []netip.Addr) []corev1.LoadBalancerIngress {
	if len(addrs) == 0 {
		return nil
	}
	out := make([]corev1.LoadBalancerIngress, len(addrs))
	for i, a := range addrs {
		out[i] = corev1.LoadBalancerIngress{IP: a.String()}
	}
	return out
}

func statusEqual(a, b corev1.ServiceStatus) bool {
	if len(a.LoadBalancer.Ingress) != len(b.LoadBalancer.Ingress) || len(a.Conditions) != len(b.Conditions) {
		return false
	}
	for i := range a.LoadBalancer.Ingress {
		x, y := a.LoadBalancer.Ingress[i], b.LoadBalancer.Ingress[i]
		if x.IP != y.IP || x.Hostname != y.Hostname || ipMode(x) != ipMode(y) || !slices.EqualFunc(x.Ports, y.Ports, portStatusEqual) {
			return false
		}
	}
	for i := range a.Conditions {
		x, y := a.Conditions[i], b.Conditions[i]
		if x.Type != y.Type || x.Status != y.Status || x.Reason != y.Reason || x.Message != y.Message ||
			x.ObservedGeneration != y.ObservedGeneration || !x.LastTransitionTime.Equal(&y.LastTransitionTime) {
			return false
		}
	}
	return true
}

func portStatusEqual(a, b corev1.PortStatus) bool {
	return a.Port == b.Port && a.Protocol == b.Protocol && ptr.Equal(a.Error, b.Error)
}

// ipMode reads an ingress' ipMode with the API server's default (VIP) for unset, so that the
// defaulted value the server returns compares equal to the unset one we write.
func ipMode(i corev1.LoadBalancerIngress) corev1.LoadBalancerIPMode {
	if i.IPMode == nil {
		return corev1.LoadBalancerIPModeVIP
	}
	return *i.IPMode
}

func equalStringMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// sharedWithOthers are the shared addresses among owned that had other members than the Service.
func sharedWithOthers(owned []decide.OwnedIP) []decide.OwnedIP {
	var out []decide.OwnedIP
	for _, o := range owned {
		if o.SharingKey != "" && len(o.Members) > 1 {
			out = append(out, o)
		}
	}
	return out
}

func joinOwnedOr(owned []decide.OwnedIP, recorded string) string {
	if len(owned) == 0 {
		return orDash(recorded)
	}
	return decide.JoinOwned(owned)
}
