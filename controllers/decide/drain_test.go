package decide

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lbsvc/lbsvc-operator/controllers/lbobjects"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
)

const (
	victimUID = "uid-victim"
	lbPodNS   = "lbsvc-system"
)

// drainIP is 10.0.0.7, owned by team-a/web, with status.holders as given.
func drainIP(holders ...string) *lbv1.IP {
	ip := &lbv1.IP{
		ObjectMeta: metav1.ObjectMeta{Name: "10.0.0.7"},
		Spec:       lbv1.IPSpec{Address: "10.0.0.7", Subnet: "sn", Service: lbv1.IPOwner{Namespace: "team-a", Name: "web", UID: victimUID}},
	}
	for _, h := range holders {
		ip.Status.Holders = append(ip.Status.Holders, lbv1.IPHolder{Pod: h})
	}
	return ip
}

// ourLabels are what BuildDeployment (lbobjects) puts on an lb Deployment, its pod template and so its
// ReplicaSets and pods, for a Service of uid holding 10.0.0.7.
func ourLabels(uid string) map[string]string {
	return map[string]string{
		lbv1.ComponentLabel: lbv1.ComponentLBPod, lbv1.ServiceLabel: "web", lbobjects.ManagedByLabel: lbobjects.ManagedByValue,
		lbv1.ServiceNamespaceLabel: "team-a", lbv1.ServiceUIDLabel: uid, lbv1.IPv4Label: "10.0.0.7",
	}
}

func dropLabel(l map[string]string, key string) map[string]string {
	delete(l, key)
	return l
}

func drainPod(ns, name string, labels map[string]string, phase corev1.PodPhase) corev1.Pod {
	return corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels}, Status: corev1.PodStatus{Phase: phase}}
}

func drainRS(ns, name string, labels map[string]string, replicas int32) appsv1.ReplicaSet {
	return appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec: appsv1.ReplicaSetSpec{Replicas: ptr.To(replicas)}}
}

func drainDeployment(ns, name string, labels map[string]string, replicas int32) appsv1.Deployment {
	return appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To(replicas)}}
}

// The builders' own output is ours: the labels this rule checks are really on the Deployment
// and its pod template (hence on its ReplicaSets and pods), in both namespace layouts.
func TestBuiltLBObjectsAreProvablyOurs(t *testing.T) {
	for _, podNS := range []string{"", lbPodNS} {
		p := lbobjects.Params{
			ServiceName: "web", ServiceNamespace: "team-a", ServiceUID: victimUID, PodNamespace: podNS,
			Image: "img", NADName: "nad", NADNamespace: "kube-system", Provider: "nad.kube-system", SubnetName: "sn",
			Addresses: []netip.Addr{netip.MustParseAddr("10.0.0.7")}, CIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")},
			Gateways: []netip.Addr{netip.MustParseAddr("10.0.0.1")},
		}
		d, err := lbobjects.BuildDeployment(p)
		if err != nil {
			t.Fatal(err)
		}
		ip := drainIP()
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: d.Namespace, Name: "x", Labels: d.Spec.Template.Labels}}
		if !ProvablyOurs(d, ip, podNS) || !ProvablyOurs(pod, ip, podNS) {
			t.Errorf("--lb-pod-namespace=%q: built Deployment %s/%s (labels %v) or its pod is not provably ours", podNS, d.Namespace, d.Name, d.Labels)
		}
		if d.Spec.Template.Labels[lbv1.IPv4Label] != ip.Name {
			t.Errorf("template carries %q, want %q", d.Spec.Template.Labels[lbv1.IPv4Label], ip.Name)
		}
	}
}

func TestProvablyOurs(t *testing.T) {
	tests := map[string]struct {
		obj     metav1.Object
		ip      *lbv1.IP
		lbPodNS string
		want    bool
	}{
		"our pod in the Service's namespace holds the address": {
			ptr.To(drainPod("team-a", "lb", ourLabels(victimUID), corev1.PodRunning)), drainIP(), "", true},
		"our pod in the lb pod namespace holds the address": {
			ptr.To(drainPod(lbPodNS, "lb", ourLabels(victimUID), corev1.PodRunning)), drainIP(), lbPodNS, true},
		"our pod in the Service's namespace, listed in status.holders (left by a run without --lb-pod-namespace), still holds the address with the flag set": {
			ptr.To(drainPod("team-a", "lb-2", ourLabels(victimUID), corev1.PodRunning)), drainIP("team-a/lb-1"), lbPodNS, true},
		// With --lb-pod-namespace the tenant's own namespace holds no lb pod of ours: a pod there
		// that forges our labels and the UID of the tenant's own Service would keep each address
		// the tenant once had draining for ever.
		"with --lb-pod-namespace, a pod with our labels and the Service's UID in the Service's own namespace, never listed, does not hold the address": {
			ptr.To(drainPod("team-a", "squat", ourLabels(victimUID), corev1.PodRunning)), drainIP(), lbPodNS, false},
		"our pod in a namespace the lb pod namespace no longer is, listed in status.holders, holds the address": {
			ptr.To(drainPod("old-system", "lb-2", ourLabels(victimUID), corev1.PodRunning)), drainIP("old-system/lb-1"), lbPodNS, true},
		"a pod with our labels and the victim's UID in another namespace does not hold the address": {
			ptr.To(drainPod("team-b", "squat", ourLabels(victimUID), corev1.PodRunning)), drainIP("team-a/lb"), lbPodNS, false},
		"a zero-replica Deployment with our labels and the victim's UID in another namespace does not hold the address": {
			ptr.To(drainDeployment("team-b", "squat", ourLabels(victimUID), 0)), drainIP(), "", false},
		"a ReplicaSet with our labels and the victim's UID in another namespace does not hold the address": {
			ptr.To(drainRS("team-b", "squat-1", ourLabels(victimUID), 1)), drainIP(), "", false},
		"the lb pod namespace is trusted only when set: another namespace is not, even named like ours": {
			ptr.To(drainPod(lbPodNS, "lb", ourLabels(victimUID), corev1.PodRunning)), drainIP(), "", false},
		// Another Service's lb pods never carry this address (the IP object is the one claim on
		// it), so this is written by hand; whoever runs pods in team-a can announce any address
		// with or without our labels, and the drain waits only for our own lb pods.
		"a pod with a forged Service UID in the Service's own namespace does not hold the address": {
			ptr.To(drainPod("team-a", "forged", ourLabels("uid-other"), corev1.PodRunning)), drainIP(), "", false},
		"a pod of the Service's previous incarnation (same name, old UID) does not hold the new owner's address": {
			ptr.To(drainPod("team-a", "lb-old", ourLabels("uid-old"), corev1.PodRunning)), drainIP(), "", false},
		"a pod without the Service UID label does not hold the address": {
			ptr.To(drainPod("team-a", "lb", dropLabel(ourLabels(victimUID), lbv1.ServiceUIDLabel), corev1.PodRunning)), drainIP(), "", false},
		"a pod without our managed-by label does not hold the address": {
			ptr.To(drainPod("team-a", "lb", dropLabel(ourLabels(victimUID), lbobjects.ManagedByLabel), corev1.PodRunning)), drainIP(), "", false},
		"a pod without our component label does not hold the address": {
			ptr.To(drainPod("team-a", "lb", dropLabel(ourLabels(victimUID), lbv1.ComponentLabel), corev1.PodRunning)), drainIP(), "", false},
		"a pod managed by someone else does not hold the address": {
			ptr.To(drainPod("team-a", "lb", func() map[string]string { l := ourLabels(victimUID); l[lbobjects.ManagedByLabel] = "helm"; return l }(), corev1.PodRunning)), drainIP(), "", false},
		"an IP object without an owner UID trusts no UID label, not even an empty one": {
			ptr.To(drainPod("team-a", "lb", ourLabels(""), corev1.PodRunning)), func() *lbv1.IP { ip := drainIP(); ip.Spec.Service.UID = ""; return ip }(), "", false},
		"a status.holders entry that is not namespace/name trusts no namespace": {
			ptr.To(drainPod("team-b", "lb", ourLabels(victimUID), corev1.PodRunning)), drainIP("team-b"), "", false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := ProvablyOurs(tc.obj, tc.ip, tc.lbPodNS); got != tc.want {
				t.Errorf("ProvablyOurs(%s/%s) = %v, want %v", tc.obj.GetNamespace(), tc.obj.GetName(), got, tc.want)
			}
		})
	}
}

func TestDrainVerdict(t *testing.T) {
	ours := ourLabels(victimUID)
	tests := map[string]struct {
		ip          *lbv1.IP
		lbPodNS     string
		pods        []corev1.Pod
		rss         []appsv1.ReplicaSet
		deps        []appsv1.Deployment
		wantWhy     string
		wantHolding []string
		wantKept    []string
		wantForeign []string
	}{
		"nothing carries the address: it is free": {ip: drainIP()},
		"a zero-replica Deployment with our address label in another namespace does not hold the address": {
			ip:          drainIP(),
			deps:        []appsv1.Deployment{drainDeployment("team-b", "squat", ours, 0)},
			wantForeign: []string{"deployment team-b/squat"},
		},
		"squatters of every kind in another namespace keep nothing, and are all named": {
			ip: drainIP("team-a/lb-gone"), lbPodNS: lbPodNS,
			pods:        []corev1.Pod{drainPod("team-b", "squat", ours, corev1.PodRunning)},
			rss:         []appsv1.ReplicaSet{drainRS("team-b", "squat-1", ours, 3)},
			deps:        []appsv1.Deployment{drainDeployment("team-b", "squat", ours, 3)},
			wantForeign: []string{"pod team-b/squat", "replicaset team-b/squat-1", "deployment team-b/squat"},
		},
		"a Failed pod holds nothing": {
			ip:   drainIP(),
			pods: []corev1.Pod{drainPod("team-a", "lb", ours, corev1.PodFailed)},
		},
		"a Succeeded pod holds nothing": {
			ip:   drainIP(),
			pods: []corev1.Pod{drainPod("team-a", "lb", ours, corev1.PodSucceeded)},
		},
		"our pod in the lb pod namespace holds it, the squatter beside it does not": {
			ip: drainIP(), lbPodNS: lbPodNS,
			pods:        []corev1.Pod{drainPod(lbPodNS, "lb", ours, corev1.PodRunning), drainPod("team-b", "squat", ours, corev1.PodRunning)},
			wantHolding: []string{lbPodNS + "/lb"},
			wantForeign: []string{"pod team-b/squat"},
		},
		"a pending pod of ours holds it": {
			ip:          drainIP(),
			pods:        []corev1.Pod{drainPod("team-a", "lb", ours, corev1.PodPending)},
			wantHolding: []string{"team-a/lb"},
		},
		"our ReplicaSet that may still create a pod keeps the address": {
			ip:      drainIP(),
			rss:     []appsv1.ReplicaSet{drainRS("team-a", "lb-1", ours, 1)},
			deps:    []appsv1.Deployment{drainDeployment("team-a", "lb", ours, 1)},
			wantWhy: "replicaset team-a/lb-1 may still create a pod holding 10.0.0.7",
		},
		"our ReplicaSet scaled to zero with no pod left keeps nothing": {
			ip:  drainIP(),
			rss: []appsv1.ReplicaSet{drainRS("team-a", "lb-1", ours, 0)},
		},
		"our Deployment not being deleted still asks for the address": {
			ip:      drainIP(),
			deps:    []appsv1.Deployment{drainDeployment("team-a", "lb", ours, 0)},
			wantWhy: "deployment team-a/lb still asks for 10.0.0.7",
		},
		"our Deployment being deleted asks for nothing": {
			ip: drainIP(),
			deps: []appsv1.Deployment{func() appsv1.Deployment {
				d := drainDeployment("team-a", "lb", ours, 1)
				d.DeletionTimestamp = ptr.To(metav1.Now())
				return d
			}()},
		},
		// Its last pod there was evicted and is about to be replaced: listing the namespace no
		// more would make the ReplicaSet foreign and let the address go.
		"our ReplicaSet left in the previous lb pod namespace keeps the address and that namespace listed": {
			ip: func() *lbv1.IP {
				ip := drainIP("old-system/lb-1-a")
				ip.Status.Holders[0].Node, ip.Status.Holders[0].Role = "n1", lbv1.RoleActive
				return ip
			}(), lbPodNS: lbPodNS,
			rss:      []appsv1.ReplicaSet{drainRS("old-system", "lb-1", ours, 1)},
			wantWhy:  "replicaset old-system/lb-1 may still create a pod holding 10.0.0.7",
			wantKept: []string{"old-system/lb-1-a"},
		},
		"our Deployment left in the previous lb pod namespace keeps it listed while it asks": {
			ip: drainIP("old-system/lb-1-a", "team-a/lb-2-b"), lbPodNS: lbPodNS,
			pods:        []corev1.Pod{drainPod("team-a", "lb-2-b", ours, corev1.PodRunning)},
			deps:        []appsv1.Deployment{drainDeployment("old-system", "lb", ours, 1)},
			wantHolding: []string{"team-a/lb-2-b"},
			wantKept:    []string{"old-system/lb-1-a"},
		},
		"the previous lb pod namespace drops out once nothing of ours there may hold the address": {
			ip: drainIP("old-system/lb-1-a"), lbPodNS: lbPodNS,
			rss: []appsv1.ReplicaSet{drainRS("old-system", "lb-1", ours, 0)},
			deps: []appsv1.Deployment{func() appsv1.Deployment {
				d := drainDeployment("old-system", "lb", ours, 1)
				d.DeletionTimestamp = ptr.To(metav1.Now())
				return d
			}()},
		},
		"our pod in the previous lb pod namespace lists it by itself: nothing kept": {
			ip: drainIP("old-system/lb-1-a"), lbPodNS: lbPodNS,
			pods:        []corev1.Pod{drainPod("old-system", "lb-1-b", ours, corev1.PodPending)},
			rss:         []appsv1.ReplicaSet{drainRS("old-system", "lb-1", ours, 1)},
			wantHolding: []string{"old-system/lb-1-b"},
		},
		"a squatter's ReplicaSet keeps no namespace listed": {
			ip: drainIP("team-a/lb-gone"), lbPodNS: lbPodNS,
			rss:         []appsv1.ReplicaSet{drainRS("team-b", "squat-1", ours, 1)},
			wantForeign: []string{"replicaset team-b/squat-1"},
		},
		"the Service's namespace is never kept: it is trusted anyway": {
			ip:      drainIP("team-a/lb-1-a"),
			rss:     []appsv1.ReplicaSet{drainRS("team-a", "lb-1", ours, 1)},
			wantWhy: "replicaset team-a/lb-1 may still create a pod holding 10.0.0.7",
		},
		"a pod with a forged Service UID in the Service's own namespace is ignored and named": {
			ip:          drainIP(),
			pods:        []corev1.Pod{drainPod("team-a", "forged", ourLabels("uid-other"), corev1.PodRunning)},
			wantForeign: []string{"pod team-a/forged"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			d := DrainVerdict(tc.ip, tc.lbPodNS, tc.pods, tc.rss, tc.deps)
			var keys, kept []string
			for i := range d.Holding {
				keys = append(keys, PodKey(&d.Holding[i]))
			}
			for _, h := range d.Kept {
				kept = append(kept, h.Pod)
				if h.Role != "" {
					t.Errorf("kept entry %s has role %q: none of them is known to hold the address", h.Pod, h.Role)
				}
			}
			if d.Why != tc.wantWhy || strings.Join(keys, ",") != strings.Join(tc.wantHolding, ",") ||
				strings.Join(kept, ",") != strings.Join(tc.wantKept, ",") || strings.Join(d.Foreign, ",") != strings.Join(tc.wantForeign, ",") {
				t.Errorf("got why %q holding %q kept %q foreign %q,\nwant    %q         %q      %q         %q",
					d.Why, keys, kept, d.Foreign, tc.wantWhy, tc.wantHolding, tc.wantKept, tc.wantForeign)
			}
		})
	}
}

// The Event names at most a few objects, sorted, and says how many it left out.
func TestForeignMessageNamesAFew(t *testing.T) {
	ip := drainIP()
	if got := ForeignMessage(ip, nil); got != "" {
		t.Errorf("no foreign object: %q, want none", got)
	}
	got := ForeignMessage(ip, []string{"pod team-b/g", "pod team-b/f", "deployment team-b/squat", "pod team-b/e", "pod team-b/d", "pod team-b/c", "pod team-b/b"})
	want := "10.0.0.7: ignored 7 object(s) carrying its address label that are not lb pods of service team-a/web " +
		"(not our labels, another UID, or outside the namespace its lb pods live in); they neither hold it nor delay its release: " +
		"deployment team-b/squat, pod team-b/b, pod team-b/c, pod team-b/d, pod team-b/e, and 2 more"
	if got != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}
	long := make([]string, 5)
	for i := range long {
		long[i] = "pod " + strings.Repeat("n", 63) + "/" + strings.Repeat("p", 253)
	}
	if got := ForeignMessage(ip, long); len(got) > MaxMessageBytes {
		t.Errorf("message of %d bytes, want at most %d", len(got), MaxMessageBytes)
	}
}

// A Service's objects found by its UID away from where its lb pods belong now are its own left
// behind only in a namespace one of its IP objects trusts: a forgery elsewhere is neither
// deleted nor waited for (it froze the Service's pass before).
func TestStrayOurs(t *testing.T) {
	v4, v6 := drainIP("old-system/lb-1"), drainIP()
	v6.Name, v6.Spec.Address = "fd00-0000-0000-0000-0000-0000-0000-0007", "fd00::7"
	ips := []*lbv1.IP{v4, v6}
	for name, tc := range map[string]struct {
		obj  metav1.Object
		ips  []*lbv1.IP
		want bool
	}{
		"our Deployment left in the Service's namespace":           {ptr.To(drainDeployment("team-a", "lb-svc-web", ourLabels(victimUID), 1)), ips, true},
		"our pod left in a previous lb pod namespace, recorded":    {ptr.To(drainPod("old-system", "lb-2", ourLabels(victimUID), corev1.PodRunning)), ips, true},
		"a pod with our labels and the UID in a tenant namespace":  {ptr.To(drainPod("team-b", "squat", ourLabels(victimUID), corev1.PodRunning)), ips, false},
		"a Deployment with our labels and the UID in a tenant one": {ptr.To(drainDeployment("team-b", "squat", ourLabels(victimUID), 0)), ips, false},
		"no IP object known: nothing is trusted":                   {ptr.To(drainPod("team-a", "lb", ourLabels(victimUID), corev1.PodRunning)), nil, false},
	} {
		t.Run(name, func(t *testing.T) {
			if got := StrayOurs(tc.obj, tc.ips, lbPodNS); got != tc.want {
				t.Errorf("StrayOurs = %v, want %v", got, tc.want)
			}
		})
	}
}

// Once the IP object's owner Service is gone, the drain deletes the Deployments of ours that still
// ask for its address unless something else controls them: controlled by that Service (what the
// garbage collector would delete), or by nothing (the lb pod namespace layout, which has no owner
// reference). A shared address's objects are not any member's.
func TestOrphaned(t *testing.T) {
	owned := func(name string, ref metav1.OwnerReference) *appsv1.Deployment {
		d := drainDeployment("team-a", name, ourLabels(victimUID), 2)
		d.OwnerReferences = []metav1.OwnerReference{ref}
		return &d
	}
	svcRef := func(uid string) metav1.OwnerReference {
		return metav1.OwnerReference{APIVersion: "v1", Kind: "Service", Name: "web", UID: types.UID(uid), Controller: ptr.To(true)}
	}
	mine := owned("lb-svc-web", svcRef(victimUID))
	other := owned("lb-svc-other", svcRef("uid-other"))
	notController := owned("lb-svc-ref", svcRef(victimUID))
	notController.OwnerReferences[0].Controller = nil
	notService := owned("lb-svc-rs", metav1.OwnerReference{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "x", UID: victimUID, Controller: ptr.To(true)})
	noOwner := owned("lb-svc-none", svcRef(victimUID))
	noOwner.OwnerReferences = nil
	asking := []*appsv1.Deployment{mine, other, notController, notService, noOwner}
	names := func(ds []*appsv1.Deployment) []string {
		var out []string
		for _, d := range ds {
			out = append(out, d.Name)
		}
		return out
	}
	want := []string{"lb-svc-web", "lb-svc-ref", "lb-svc-none"}
	if got := names(Orphaned(drainIP(), asking, true)); !slices.Equal(got, want) {
		t.Errorf("owner gone: Orphaned = %v, want %v", got, want)
	}
	if got := Orphaned(drainIP(), asking, false); got != nil {
		t.Errorf("owner alive: Orphaned = %v, want none", names(got))
	}
	shared := drainIP()
	shared.Spec.SharingKey = "dns"
	if got := Orphaned(shared, asking, true); got != nil {
		t.Errorf("shared address: Orphaned = %v, want none", names(got))
	}
	// End to end with DrainVerdict: the Deployment it names is the one Orphaned returns.
	d := DrainVerdict(drainIP(), "", nil, nil, []appsv1.Deployment{*mine})
	if d.Why != "deployment team-a/lb-svc-web still asks for 10.0.0.7" || !slices.Equal(names(Orphaned(drainIP(), d.Asking, true)), []string{"lb-svc-web"}) {
		t.Errorf("DrainVerdict: why %q, asking %v", d.Why, names(d.Asking))
	}
	// Its pods still running: DrainVerdict has no Why (the pods are the reason to wait), but the
	// Deployment still asks, and is still orphaned: deleting it is what lets the pods go where no
	// garbage collector follows it.
	running := drainPod("team-a", "lb-svc-web-1", ourLabels(victimUID), corev1.PodRunning)
	d = DrainVerdict(drainIP(), "", []corev1.Pod{running}, nil, []appsv1.Deployment{*mine})
	if d.Why != "" || len(d.Holding) != 1 || !slices.Equal(names(Orphaned(drainIP(), d.Asking, true)), []string{"lb-svc-web"}) {
		t.Errorf("DrainVerdict with a running pod: why %q, holding %d, asking %v", d.Why, len(d.Holding), names(d.Asking))
	}
	// AskingDeployments, from the cache's Deployments, says the same, and ignores what is not ours
	// (another namespace, another UID) or no longer asks (being deleted).
	foreignNS := drainDeployment("team-b", "lb-svc-web", ourLabels(victimUID), 2)
	otherUID := drainDeployment("team-a", "lb-svc-x", ourLabels("uid-other"), 2)
	going := *mine.DeepCopy()
	going.Name = "lb-svc-going"
	going.DeletionTimestamp = &metav1.Time{Time: time.Unix(1, 0)}
	got := AskingDeployments(drainIP(), "", []appsv1.Deployment{foreignNS, *mine, otherUID, going})
	if !slices.Equal(names(got), []string{"lb-svc-web"}) {
		t.Errorf("AskingDeployments = %v, want [lb-svc-web]", names(got))
	}
}
