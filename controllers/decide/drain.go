package decide

import (
	"fmt"
	"slices"
	"strings"

	"github.com/lbsvc/lbsvc-operator/controllers/lbobjects"

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
//   - it lives in a namespace trusted for that IP object (trustedNamespaces): where the lb pods
//     of the Service live now (its own namespace, or --lb-pod-namespace when set), or where its
//     status.holders saw them before the flag changed.
//
// A pod that has Succeeded or Failed runs nothing and holds nothing.
//
// The namespace is the part a tenant cannot forge: creating an object in the Service's own
// namespace or in --lb-pod-namespace takes rights there. With --lb-pod-namespace the Service's
// own namespace is not trusted (unless status.holders lists it: lb pods left there by a run
// without the flag): a tenant may create pods there, and pods that forge our labels and a
// Service's UID would keep each address the tenant once had draining for ever, one Service of
// quota at a time. Labels alone, even our managed-by
// label and the victim's exact UID, prove nothing. A pod in the Service's own namespace that
// carries the address with another Service's UID is not ours either: no lb pod of another
// Service carries this address (the IP object is the one claim on it; a Service created again
// under the same name is another UID and waits for the drain), so it was written by hand, and
// whoever may run pods there can announce any address with or without our labels: the drain
// exists to outwait our own lb pods, not to police the namespace's owner.

// trustedNamespaces are the namespaces whose objects may hold ip's address: where its lb pods
// live (homeNamespace), and the namespaces of ip's current status.holders.
//
// Why the last is sound: only the operator writes IP objects and their status (no built-in
// role aggregates them), and it writes into status.holders only pods that passed ProvablyOurs
// with the namespaces trusted at that moment, plus entries already there (KeptHolders). So a
// namespace enters the set only as the Service's namespace or as the --lb-pod-namespace of some
// operator run, and stays in it only while something of ours there may hold the address: a pod
// of ours (our labels, the owner's UID, not finished), or a ReplicaSet or Deployment of ours
// that may still create one (KeptHolders, read from the API server). The first status write
// that finds none drops it for good. That keeps the lb pods left in a previous
// --lb-pod-namespace counted until they, and what could bring them back, are gone after the flag
// changed, and never lets a tenant's namespace in. Limits: status.holders lists at most 16 pods
// (a Service has at most 5 replicas, and the new lb pod namespace gets pods only once the old
// one's are gone); lb pods created in the old namespace and never recorded (the operator
// restarted with the new flag in the moment between their creation and the next status write)
// are not known; and a status written by a release before this rule (which listed any pod with
// the label) may name a foreign namespace, which then stays trusted only for objects there that
// forge our labels and the exact UID, and only as long as they exist.
func trustedNamespaces(ip *lbv1.IP, lbPodNamespace string) map[string]bool {
	ns := map[string]bool{homeNamespace(ip, lbPodNamespace): true}
	for _, h := range ip.Status.Holders {
		if n, _, ok := strings.Cut(h.Pod, "/"); ok && n != "" {
			ns[n] = true
		}
	}
	return ns
}

// homeNamespace is where the lb pods of ip's Service live: lbPodNamespace when set, else the
// Service's own namespace (lbobjects.PodNamespace).
func homeNamespace(ip *lbv1.IP, lbPodNamespace string) string {
	return lbobjects.PodNamespace(lbPodNamespace, ip.Spec.Service.Namespace)
}

// ProvablyOurs tells whether obj, a pod, ReplicaSet or Deployment that carries ip's address
// label, was made by the operator for ip's Service (see trustedNamespaces). It says nothing
// about a pod's phase: see podHolds.
func ProvablyOurs(obj metav1.Object, ip *lbv1.IP, lbPodNamespace string) bool {
	return ours(obj, ip, trustedNamespaces(ip, lbPodNamespace))
}

// StrayOurs tells whether obj, found by a Service's UID label away from where its lb pods belong
// now, is provably one of that Service's objects left behind (a previous --lb-pod-namespace, or
// the Service's own namespace before the flag was set): our labels and the Service's UID, in a
// namespace one of its IP objects trusts or in the Service's own. Anything else that carries the
// UID (a tenant's forgery in another namespace) is neither deleted nor waited for. The Service's
// own namespace counts here though it is not trusted for drains: deleting an object there that
// forges our labels and the Service's UID only takes from the tenant what they wrote for their
// own Service.
func StrayOurs(obj metav1.Object, ips []*lbv1.IP, lbPodNamespace string) bool {
	for _, ip := range ips {
		trusted := trustedNamespaces(ip, lbPodNamespace)
		trusted[ip.Spec.Service.Namespace] = true
		if ours(obj, ip, trusted) {
			return true
		}
	}
	return false
}

func ours(obj metav1.Object, ip *lbv1.IP, trusted map[string]bool) bool {
	return labelledFor(obj, ip.Spec.Service.UID) && trusted[obj.GetNamespace()]
}

// labelledFor tells whether obj carries our labels and the Service UID uid: what our objects
// carry, and what anyone who may write such objects in some namespace can write too.
func labelledFor(obj metav1.Object, uid string) bool {
	l := obj.GetLabels()
	return l[lbobjects.ManagedByLabel] == lbobjects.ManagedByValue && l[lbv1.ComponentLabel] == lbv1.ComponentLBPod &&
		uid != "" && l[lbv1.ServiceUIDLabel] == uid
}

// podHolds tells whether a pod may still hold an address: one that has Succeeded or Failed
// runs nothing.
func podHolds(p *corev1.Pod) bool {
	return p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed
}

// HoldingPods splits pods that carry ip's address label into ours that may hold it (in the
// order given) and the names ("pod <ns>/<name>") of those that are not ours. Ours that
// finished are in neither.
func HoldingPods(pods []corev1.Pod, ip *lbv1.IP, lbPodNamespace string) (holding []corev1.Pod, foreign []string) {
	return splitPods(pods, ip, trustedNamespaces(ip, lbPodNamespace))
}

func splitPods(pods []corev1.Pod, ip *lbv1.IP, trusted map[string]bool) (holding []corev1.Pod, foreign []string) {
	for i := range pods {
		p := &pods[i]
		switch {
		case !ours(p, ip, trusted):
			foreign = append(foreign, "pod "+PodKey(p))
		case podHolds(p):
			holding = append(holding, *p)
		}
	}
	return holding, foreign
}

// mayCreate tells whether a ReplicaSet may still create a pod (or still has one).
func mayCreate(rs *appsv1.ReplicaSet) bool {
	return (rs.Spec.Replicas != nil && *rs.Spec.Replicas > 0) || rs.Status.Replicas > 0
}

// asks tells whether a Deployment still asks for its pods: it is not being deleted.
func asks(d *appsv1.Deployment) bool { return d.DeletionTimestamp.IsZero() }

// DrainDecision is what the API server's lists of the objects carrying an address say.
type DrainDecision struct {
	// Why the address may not go yet although no pod of ours holds it ("" when nothing of ours
	// may create a holder, or when Holding is not empty).
	Why string
	// Holding are the pods of ours that may hold the address.
	Holding []corev1.Pod
	// Kept are the status.holders entries to keep listed (see KeptHolders).
	Kept []lbv1.IPHolder
	// Foreign names the objects ignored as not ours ("pod ns/name", "replicaset ...", ...).
	Foreign []string
	// Asking are the Deployments of ours that still ask for the address (Why names the first
	// when no ReplicaSet or pod comes before it).
	Asking []*appsv1.Deployment
}

// DrainVerdict decides, from the API server's lists of the pods, ReplicaSets and Deployments
// that carry ip's address label, whether the address may go: the pods of ours that hold it,
// else why it may not go yet ("" when nothing of ours can hold it any more), and the names of
// the objects ignored as not ours.
func DrainVerdict(ip *lbv1.IP, lbPodNamespace string, pods []corev1.Pod, rss []appsv1.ReplicaSet, deps []appsv1.Deployment) DrainDecision {
	trusted := trustedNamespaces(ip, lbPodNamespace)
	var d DrainDecision
	d.Holding, d.Foreign = splitPods(pods, ip, trusted)
	creating := blocking(rss, "replicaset", ip, trusted, mayCreate, &d.Foreign)
	asking := blocking(deps, "deployment", ip, trusted, asks, &d.Foreign)
	d.Asking = asking
	blocked := map[string]bool{}
	for _, o := range creating {
		blocked[o.Namespace] = true
	}
	for _, o := range asking {
		blocked[o.Namespace] = true
	}
	d.Kept = KeptHolders(ip, lbPodNamespace, d.Holding, blocked)
	switch {
	case len(d.Holding) > 0:
	case len(creating) > 0:
		d.Why = fmt.Sprintf("replicaset %s/%s may still create a pod holding %s", creating[0].Namespace, creating[0].Name, ip.Spec.Address)
	case len(asking) > 0:
		d.Why = fmt.Sprintf("deployment %s/%s still asks for %s", asking[0].Namespace, asking[0].Name, ip.Spec.Address)
	}
	return d
}

// AskingDeployments are those of deps (Deployments that carry ip's address label) that are ours
// and still ask for the address, as DrainDecision.Asking.
func AskingDeployments(ip *lbv1.IP, lbPodNamespace string, deps []appsv1.Deployment) []*appsv1.Deployment {
	var ignored []string
	return blocking(deps, "deployment", ip, trustedNamespaces(ip, lbPodNamespace), asks, &ignored)
}

// blocking returns those of items (ReplicaSets or Deployments) that are ours and may still
// create a holder (blocks), and appends "<kind> <namespace>/<name>" of those not ours to foreign.
func blocking[T any, P interface {
	*T
	metav1.Object
}](items []T, kind string, ip *lbv1.IP, trusted map[string]bool, blocks func(P) bool, foreign *[]string) []P {
	var out []P
	for i := range items {
		o := P(&items[i])
		switch {
		case !ours(o, ip, trusted):
			*foreign = append(*foreign, kind+" "+o.GetNamespace()+"/"+o.GetName())
		case blocks(o):
			out = append(out, o)
		}
	}
	return out
}

// DroppingNamespaces are the namespaces trusted only because ip's status.holders lists them
// (neither the Service's nor lbPodNamespace) in which none of holding, the pods of ours found
// now, lives: the next status write would drop them, and with them the trust in what is there.
func DroppingNamespaces(ip *lbv1.IP, lbPodNamespace string, holding []corev1.Pod) map[string]bool {
	var out map[string]bool
	for _, h := range ip.Status.Holders {
		n, _, ok := strings.Cut(h.Pod, "/")
		if !ok || n == "" || n == homeNamespace(ip, lbPodNamespace) ||
			slices.ContainsFunc(holding, func(p corev1.Pod) bool { return p.Namespace == n }) {
			continue
		}
		if out == nil {
			out = map[string]bool{}
		}
		out[n] = true
	}
	return out
}

// KeptHolders are the entries of ip's status.holders that stay listed although no pod of ours
// holds the address in their namespace: those of a dropping namespace (DroppingNamespaces) that
// is blocked, where an object of ours may still create a holder (a ReplicaSet that may create a
// pod, a Deployment that still asks). Dropping them would stop trusting that namespace, so that
// the object would be ignored and the address released while it may still create a pod that
// holds it (an lb pod evicted in a previous --lb-pod-namespace, its ReplicaSet about to replace
// it). They are kept as they were, less the role: none of them is known to hold the address now.
func KeptHolders(ip *lbv1.IP, lbPodNamespace string, holding []corev1.Pod, blocked map[string]bool) []lbv1.IPHolder {
	dropping := DroppingNamespaces(ip, lbPodNamespace, holding)
	var out []lbv1.IPHolder
	for _, h := range ip.Status.Holders {
		if n, _, _ := strings.Cut(h.Pod, "/"); dropping[n] && blocked[n] {
			out = append(out, lbv1.IPHolder{Pod: h.Pod, Node: h.Node})
		}
	}
	return out
}

// ForeignMessage is the note of the ForeignHolderIgnored Event about the objects ignored for
// ip ("" when none): sorted, at most maxForeignNamed of them named, bounded.
func ForeignMessage(ip *lbv1.IP, foreign []string) string {
	if len(foreign) == 0 {
		return ""
	}
	names := slices.Sorted(slices.Values(foreign))
	if len(names) > maxForeignNamed {
		names = append(names[:maxForeignNamed], fmt.Sprintf("and %d more", len(foreign)-maxForeignNamed))
	}
	return BoundedMessage(fmt.Sprintf("%s: ignored %d object(s) carrying its address label that are not lb pods of service %s/%s "+
		"(not our labels, another UID, or outside the namespace its lb pods live in); they neither hold it nor delay its release: %s",
		ip.Spec.Address, len(foreign), ip.Spec.Service.Namespace, ip.Spec.Service.Name, strings.Join(names, ", ")))
}

// maxForeignNamed is how many ignored objects a ForeignHolderIgnored Event names.
const maxForeignNamed = 5

// PodKey is "<namespace>/<name>", as status.holders and messages name a pod.
func PodKey(p *corev1.Pod) string { return p.Namespace + "/" + p.Name }

// Orphaned are those of asking (Deployments of ours that still ask for ip's address, from
// DrainVerdict or AskingDeployments: our labels, the owner's UID, a trusted namespace) that no Service wants any more:
// ip's owner Service is gone (ownerGone, read from the API server), and nothing else controls
// them (their controller, if any, is that Service, by UID). Such a Deployment asks for the address
// until the garbage collector deletes it, which is for ever where none runs (an API server without
// a kube-controller-manager) or where it has no owner reference to follow (the lb pod namespace
// layout), and the drain waits for it all that time. One write of a killed operator that reached
// the API server after its successor had let the Service go leaves one. A shared address's objects
// are not here: no member owns them (IPReconciler.deleteSharedObjects).
func Orphaned(ip *lbv1.IP, asking []*appsv1.Deployment, ownerGone bool) []*appsv1.Deployment {
	if !ownerGone || ip.Spec.SharingKey != "" || ip.Spec.Service.UID == "" {
		return nil
	}
	var out []*appsv1.Deployment
	for _, d := range asking {
		c := metav1.GetControllerOf(d)
		if c == nil || (c.Kind == "Service" && c.APIVersion == "v1" && string(c.UID) == ip.Spec.Service.UID) {
			out = append(out, d)
		}
	}
	return out
}
