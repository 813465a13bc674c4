package controllers

import (
	"fmt"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
)

// Who may hold an address (issue 22, "drain squatting"). The address labels (lbsvc.io/ipv4,
// lbsvc.io/ipv6) are plain labels: anyone who may create a pod, ReplicaSet or Deployment in
// any namespace can put them on it. Counted by those labels alone, a tenant's zero-replica
// Deployment keeps any released address Draining for ever. So an object counts, as a holder or
// as something that may still create one, only when it is provably one the operator made for
// the IP object's Service:
//
//   - it carries our component and managed-by labels (the builders put both, with the Service
//     UID label, on the Deployment and its pod template, hence on its ReplicaSets and pods);
//   - its Service UID label is the IP object's spec.service.uid;
//   - it lives in a namespace trusted for that IP object (trustedNamespaces).
//
// A pod that has Succeeded or Failed runs nothing and holds nothing.
//
// The namespace is the part a tenant cannot forge: creating an object in the Service's own
// namespace or in --lb-pod-namespace takes rights there. Labels alone, even our managed-by
// label and the victim's exact UID, prove nothing. A pod in the Service's own namespace that
// carries the address with another Service's UID is not ours either: no lb pod of another
// Service carries this address (the IP object is the one claim on it; a Service created again
// under the same name is another UID and waits for the drain), so it was written by hand, and
// whoever may run pods there can announce any address with or without our labels: the drain
// exists to outwait our own lb pods, not to police the namespace's owner.

// trustedNamespaces are the namespaces whose objects may hold ip's address: the owner
// Service's namespace, lbPodNamespace when set, and the namespaces of ip's current
// status.holders.
//
// Why the last is sound: only the operator writes IP objects and their status (no built-in
// role aggregates them), and it writes into status.holders only pods that passed
// provablyOurs with the namespaces trusted at that moment. So a namespace enters the set only
// as the Service's namespace or as the --lb-pod-namespace of some operator run, and stays in
// it only while one of our pods (our labels, the owner's UID, not finished) still lives there:
// the first status write that finds none drops it for good. That keeps the lb pods left in a
// previous --lb-pod-namespace counted until they are gone after the flag changed (the Service
// controller deletes their Deployment first; ReplicaSets go with it before the pods do), and
// never lets a tenant's namespace in. Limits: status.holders lists at most 16 pods (a Service
// has at most 5 replicas, and the new lb pod namespace gets pods only once the old one's are
// gone); pods created in the old namespace and never recorded (an operator restart with the new
// flag in the moment between their creation and the next status write) are not known; a
// ReplicaSet of ours there is counted only while the namespace is (if its last pod died just as
// the garbage collector was about to remove it, a status write in between drops it); and a
// status written by a release before this rule (which listed any pod with the label) may name a
// foreign namespace, which stays trusted only for pods there that forge our labels and the
// exact UID, and only until the first status write that finds none.
func trustedNamespaces(ip *lbv1.IP, lbPodNamespace string) map[string]bool {
	ns := map[string]bool{ip.Spec.Service.Namespace: true}
	if lbPodNamespace != "" {
		ns[lbPodNamespace] = true
	}
	for _, h := range ip.Status.Holders {
		if n, _, ok := strings.Cut(h.Pod, "/"); ok && n != "" {
			ns[n] = true
		}
	}
	return ns
}

// provablyOurs tells whether obj, a pod, ReplicaSet or Deployment that carries ip's address
// label, was made by the operator for ip's Service (see trustedNamespaces). It says nothing
// about a pod's phase: see podHolds.
func provablyOurs(obj metav1.Object, ip *lbv1.IP, lbPodNamespace string) bool {
	return ours(obj, ip, trustedNamespaces(ip, lbPodNamespace))
}

func ours(obj metav1.Object, ip *lbv1.IP, trusted map[string]bool) bool {
	l := obj.GetLabels()
	return l[ManagedByLabel] == ManagedByValue && l[lbv1.ComponentLabel] == lbv1.ComponentLBPod &&
		ip.Spec.Service.UID != "" && l[lbv1.ServiceUIDLabel] == ip.Spec.Service.UID &&
		trusted[obj.GetNamespace()]
}

// podHolds tells whether a pod may still hold an address: one that has Succeeded or Failed
// runs nothing.
func podHolds(p *corev1.Pod) bool {
	return p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed
}

// holdingPods splits pods that carry ip's address label into ours that may hold it (in the
// order given) and the names ("pod <ns>/<name>") of those that are not ours. Ours that
// finished are in neither.
func holdingPods(pods []corev1.Pod, ip *lbv1.IP, lbPodNamespace string) (holding []corev1.Pod, foreign []string) {
	return splitPods(pods, ip, trustedNamespaces(ip, lbPodNamespace))
}

func splitPods(pods []corev1.Pod, ip *lbv1.IP, trusted map[string]bool) (holding []corev1.Pod, foreign []string) {
	for i := range pods {
		p := &pods[i]
		switch {
		case !ours(p, ip, trusted):
			foreign = append(foreign, "pod "+podKey(p))
		case podHolds(p):
			holding = append(holding, *p)
		}
	}
	return holding, foreign
}

// drainVerdict decides, from the API server's lists of the pods, ReplicaSets and Deployments
// that carry ip's address label, whether the address may go: the pods of ours that hold it,
// else why it may not go yet ("" when nothing of ours can hold it any more), and the names of
// the objects ignored as not ours.
func drainVerdict(ip *lbv1.IP, lbPodNamespace string, pods []corev1.Pod, rss []appsv1.ReplicaSet, deps []appsv1.Deployment) (why string, holding []corev1.Pod, foreign []string) {
	trusted := trustedNamespaces(ip, lbPodNamespace)
	holding, foreign = splitPods(pods, ip, trusted)
	var whyRS, whyDep string
	for i := range rss {
		rs := &rss[i]
		switch {
		case !ours(rs, ip, trusted):
			foreign = append(foreign, "replicaset "+rs.Namespace+"/"+rs.Name)
		case whyRS == "" && ((rs.Spec.Replicas != nil && *rs.Spec.Replicas > 0) || rs.Status.Replicas > 0):
			whyRS = fmt.Sprintf("replicaset %s/%s may still create a pod holding %s", rs.Namespace, rs.Name, ip.Spec.Address)
		}
	}
	for i := range deps {
		d := &deps[i]
		switch {
		case !ours(d, ip, trusted):
			foreign = append(foreign, "deployment "+d.Namespace+"/"+d.Name)
		case whyDep == "" && d.DeletionTimestamp.IsZero():
			whyDep = fmt.Sprintf("deployment %s/%s still asks for %s", d.Namespace, d.Name, ip.Spec.Address)
		}
	}
	switch {
	case len(holding) > 0:
		return "", holding, foreign
	case whyRS != "":
		return whyRS, nil, foreign
	}
	return whyDep, nil, foreign
}

// foreignMessage is the note of the ForeignHolderIgnored Event about the objects ignored for
// ip ("" when none): sorted, at most maxForeignNamed of them named, bounded.
func foreignMessage(ip *lbv1.IP, foreign []string) string {
	if len(foreign) == 0 {
		return ""
	}
	names := slices.Sorted(slices.Values(foreign))
	if len(names) > maxForeignNamed {
		names = append(names[:maxForeignNamed], fmt.Sprintf("and %d more", len(foreign)-maxForeignNamed))
	}
	return BoundedMessage(fmt.Sprintf("%s: ignored %d object(s) carrying its address label that are not lb pods of service %s/%s "+
		"(not our labels, another UID, or outside its namespace and the lb pod namespace); they neither hold it nor delay its release: %s",
		ip.Spec.Address, len(foreign), ip.Spec.Service.Namespace, ip.Spec.Service.Name, strings.Join(names, ", ")))
}

// maxForeignNamed is how many ignored objects a ForeignHolderIgnored Event names.
const maxForeignNamed = 5
