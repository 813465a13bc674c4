//go:build integration

package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/lbsvc/lbsvc-operator/controllers"
	"github.com/lbsvc/lbsvc-operator/controllers/lbobjects"

	"github.com/lbsvc/lbsvc-operator/controllers/decide"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
)

// readyLBPod stands in for a running lb pod of svc on node (envtest has no kubelet): the
// Service's labels, bound to node, Ready as the test says.
func readyLBPod(t *testing.T, svc *corev1.Service, name, addr, node string, ready bool) *corev1.Pod {
	t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: svc.Namespace, Labels: map[string]string{
			lbv1.ComponentLabel: lbv1.ComponentLBPod, lbobjects.ManagedByLabel: lbobjects.ManagedByValue,
			lbv1.ServiceLabel: svc.Name, lbv1.ServiceNamespaceLabel: svc.Namespace,
			lbv1.ServiceUIDLabel: string(svc.UID), lbv1.IPv4Label: addr}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: image}}},
	}
	create(t, p)
	setReady(t, p, ready)
	return p
}

func setReady(t *testing.T, p *corev1.Pod, ready bool) {
	t.Helper()
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	NewWithT(t).Eventually(func(g Gomega) {
		g.Expect(k8s.Get(context.Background(), client.ObjectKeyFromObject(p), p)).To(Succeed())
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: st, LastTransitionTime: metav1.Now()}}
		g.Expect(k8s.Status().Update(context.Background(), p)).To(Succeed())
	}, timeout, interval).Should(Succeed())
}

// shownHolder waits until the Service, its condition and the roles in the IP object of addr show
// holder (pod name, "" for none) on node. The pods themselves carry no role: the operator may not
// write pods.
func shownHolder(t *testing.T, svc *corev1.Service, addr, holder, node, message string, roles map[string]string) {
	t.Helper()
	g := NewWithT(t)
	g.Eventually(func(g Gomega) {
		s := getService(g, svc.Namespace, svc.Name)
		wantPod := ""
		if holder != "" {
			wantPod = svc.Namespace + "/" + holder
		}
		g.Expect(s.Annotations[lbv1.ActivePodAnnotation]).To(Equal(wantPod))
		g.Expect(s.Annotations[lbv1.ActiveNodeAnnotation]).To(Equal(node))
		c := findCondition(s.Status.Conditions, decide.ConditionAddressActive)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Message).To(Equal(message))
		got := map[string]string{}
		for _, h := range getIP(g, addr).Status.Holders {
			got[strings.TrimPrefix(h.Pod, svc.Namespace+"/")] = h.Role
		}
		g.Expect(got).To(Equal(roles))
		for name := range roles {
			p := &corev1.Pod{}
			g.Expect(k8s.Get(context.Background(), client.ObjectKey{Namespace: svc.Namespace, Name: name}, p)).To(Succeed())
			g.Expect(p.Labels).NotTo(HaveKey("lbsvc.io/role"), "pod %s", name)
		}
	}, timeout, interval).Should(Succeed())
}

func eventMessages(t *testing.T, ns, name, reason string) []string {
	var out []string
	for _, e := range events(t, ns, name) {
		if e.Reason == reason {
			out = append(out, e.Message)
		}
	}
	return out
}

// The operator shows which lb pod holds the address: from the only Ready pod when there is one
// lb pod, from the Lease the lb pods write when there are standbys; a Lease naming a pod that
// is not one of the Service's lb pods shows no holder rather than a wrong one; back to one lb
// pod, the Lease left behind is not read.
func TestActiveHolderShown(t *testing.T) {
	g := NewWithT(t)
	f := newFixture(t)
	create(t, lbService(f.ns, "web", f.provider, f.ip("70")))
	svc := waitAddress(t, f.ns, "web", f.ip("70"))
	addr := f.ip("70")

	readyLBPod(t, svc, "lb-a", addr, "n1", true)
	shownHolder(t, svc, addr, "lb-a", "n1", addr+" held by pod "+f.ns+"/lb-a on node n1; no standby",
		map[string]string{"lb-a": lbv1.RoleActive})
	g.Eventually(func() []string { return eventMessages(t, f.ns, "web", decide.ReasonActiveHolder) }, timeout, interval).
		Should(Equal([]string{addr + " now held by pod " + f.ns + "/lb-a on node n1"}))

	// Standbys: the lb pod that takes the address over creates the Lease with itself in (the
	// operator creates none); the operator follows it.
	update(t, getService(g, f.ns, "web"), func(s *corev1.Service) { s.Annotations[lbv1.ReplicasAnnotation] = "2" })
	lease := lbobjects.BuildLease("lb-svc-web", svc)
	lease.Spec.HolderIdentity, lease.Spec.LeaseTransitions = ptr.To("lb-a"), ptr.To[int32](0)
	create(t, lease)
	lbB := readyLBPod(t, svc, "lb-b", addr, "n2", true)
	shownHolder(t, svc, addr, "lb-a", "n1", addr+" held by pod "+f.ns+"/lb-a on node n1; standby: "+f.ns+"/lb-b on node n2",
		map[string]string{"lb-a": lbv1.RoleActive, "lb-b": lbv1.RoleStandby})
	update(t, lease, func(l *coordinationv1.Lease) {
		l.Spec.HolderIdentity, l.Spec.LeaseTransitions = ptr.To("lb-b"), ptr.To[int32](1)
	})
	shownHolder(t, svc, addr, "lb-b", "n2", addr+" held by pod "+f.ns+"/lb-b on node n2; standby: "+f.ns+"/lb-a on node n1",
		map[string]string{"lb-a": lbv1.RoleStandby, "lb-b": lbv1.RoleActive})
	g.Eventually(func() []string { return eventMessages(t, f.ns, "web", decide.ReasonActiveHolder) }, timeout, interval).
		Should(ConsistOf(addr+" now held by pod "+f.ns+"/lb-a on node n1",
			addr+" now held by pod "+f.ns+"/lb-b on node n2 (was pod "+f.ns+"/lb-a on node n1)"))

	g.Eventually(func(g Gomega) {
		ip := getIP(g, addr)
		g.Expect(ip.Status.Active).To(Equal(f.ns + "/lb-b"))
		g.Expect(ip.Status.Node).To(Equal("n2"))
		g.Expect(ip.Status.Holders).To(Equal([]lbv1.IPHolder{{Pod: f.ns + "/lb-b", Node: "n2", Role: "active"}, {Pod: f.ns + "/lb-a", Node: "n1", Role: "standby"}}))
	}, timeout, interval).Should(Succeed())

	// A forged holder (not one of this Service's lb pods) shows none, and none active.
	update(t, lease, func(l *coordinationv1.Lease) { l.Spec.HolderIdentity = ptr.To("not-a-pod") })
	shownHolder(t, svc, addr, "", "", "no lb pod has reported holding "+addr+" yet; standby: "+f.ns+"/lb-a on node n1, "+f.ns+"/lb-b on node n2",
		map[string]string{"lb-a": "", "lb-b": ""})
	c := findCondition(getService(g, f.ns, "web").Status.Conditions, decide.ConditionAddressActive)
	g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
	g.Expect(c.Reason).To(Equal(decide.ReasonNoActiveHolder))
	// The address itself is untouched by any of this.
	g.Expect(ingressIPs(getService(g, f.ns, "web"))).To(Equal([]string{addr}))

	// Back to one lb pod: the Lease stays (the operator may not delete Leases; the garbage
	// collector takes it with the Service) and is not read: the one Ready pod holds the address.
	setReady(t, lbB, false)
	update(t, getService(g, f.ns, "web"), func(s *corev1.Service) { s.Annotations[lbv1.ReplicasAnnotation] = "1" })
	shownHolder(t, svc, addr, "lb-a", "n1", addr+" held by pod "+f.ns+"/lb-a on node n1; standby: "+f.ns+"/lb-b on node n2",
		map[string]string{"lb-a": lbv1.RoleActive, "lb-b": lbv1.RoleStandby})
	g.Expect(k8s.Get(context.Background(), client.ObjectKeyFromObject(lease), lease)).To(Succeed())
	g.Expect(lease.Spec.HolderIdentity).To(Equal(ptr.To("not-a-pod")))

	// No longer a LoadBalancer: who held the address is no longer shown (it would name a pod
	// long gone, and, back to LoadBalancer, the first holder's Event would name it as the one
	// before).
	update(t, getService(g, f.ns, "web"), func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeClusterIP })
	g.Eventually(func(g Gomega) {
		s := getService(g, f.ns, "web")
		g.Expect(s.Status.LoadBalancer.Ingress).To(BeEmpty())
		g.Expect(s.Annotations).NotTo(HaveKey(lbv1.ActivePodAnnotation))
		g.Expect(s.Annotations).NotTo(HaveKey(lbv1.ActiveNodeAnnotation))
		g.Expect(findCondition(s.Status.Conditions, decide.ConditionAddressActive)).To(BeNil())
	}, timeout, interval).Should(Succeed())
}

// lbsvc.io/replicas: 2 gives two lb pods with a rolling update, a budget and the Lease they write;
// back to 1 (here through a bad value, which keeps the default and says so), the budget and the
// Lease go and the Deployment recreates again.
func TestReplicasObjects(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	f := newFixture(t)
	svc := lbService(f.ns, "ha", f.provider, f.ip("80"))
	svc.Annotations[lbv1.ReplicasAnnotation] = "2"
	create(t, svc)
	waitAddress(t, f.ns, "ha", f.ip("80"))
	key := client.ObjectKey{Namespace: f.ns, Name: "lb-svc-ha"}
	g.Eventually(func(g Gomega) {
		d := &appsv1.Deployment{}
		g.Expect(k8s.Get(ctx, key, d)).To(Succeed())
		g.Expect(*d.Spec.Replicas).To(Equal(int32(2)))
		g.Expect(d.Spec.Strategy.Type).To(Equal(appsv1.RollingUpdateDeploymentStrategyType))
		g.Expect(d.Spec.Template.Spec.TopologySpreadConstraints).To(HaveLen(1))
		pdb := &policyv1.PodDisruptionBudget{}
		g.Expect(k8s.Get(ctx, key, pdb)).To(Succeed())
		g.Expect(pdb.Spec.MaxUnavailable.IntValue()).To(Equal(1))
		g.Expect(pdb.Labels[lbv1.ServiceUIDLabel]).To(Equal(string(getService(g, f.ns, "ha").UID)))
		rb := &rbacv1.RoleBinding{}
		g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: f.ns, Name: "lbsvc-lbpod"}, rb)).To(Succeed())
		g.Expect(rb.RoleRef).To(Equal(rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "lbsvc-lbpod"}))
	}, timeout, interval).Should(Succeed())
	// The operator creates neither a Lease (the lb pods do) nor a Role (they are bound to the
	// installed ClusterRole lbsvc-lbpod).
	g.Expect(apierrors.IsNotFound(k8s.Get(ctx, key, &coordinationv1.Lease{}))).To(BeTrue(), "no Lease from the operator")
	g.Expect(apierrors.IsNotFound(k8s.Get(ctx, key, &rbacv1.Role{}))).To(BeTrue(), "no Role")

	// The operator never writes the Lease: what an lb pod wrote stays.
	lease := lbobjects.BuildLease("lb-svc-ha", getService(g, f.ns, "ha"))
	lease.Spec.HolderIdentity = ptr.To("lb-svc-ha-x")
	create(t, lease)
	update(t, getService(g, f.ns, "ha"), func(s *corev1.Service) { s.Labels = map[string]string{"touch": "1"} })
	g.Consistently(func(g Gomega) {
		g.Expect(k8s.Get(ctx, key, lease)).To(Succeed())
		g.Expect(lease.Spec.HolderIdentity).To(Equal(ptr.To("lb-svc-ha-x")))
	}, 2*time.Second, 200*time.Millisecond).Should(Succeed())

	update(t, getService(g, f.ns, "ha"), func(s *corev1.Service) { s.Annotations[lbv1.ReplicasAnnotation] = "seven" })
	g.Eventually(func() []string { return warningReasons(t, f.ns, "ha") }, timeout, interval).Should(ContainElement(decide.ReasonInvalidReplicas))
	g.Expect(eventMessages(t, f.ns, "ha", decide.ReasonInvalidReplicas)).To(ContainElement(
		`annotation lbsvc.io/replicas="seven": want a whole number from 1 to 5; using 1`))
	g.Eventually(func(g Gomega) {
		d := &appsv1.Deployment{}
		g.Expect(k8s.Get(ctx, key, d)).To(Succeed())
		g.Expect(*d.Spec.Replicas).To(Equal(int32(1)))
		g.Expect(d.Spec.Strategy.Type).To(Equal(appsv1.RecreateDeploymentStrategyType))
		g.Expect(apierrors.IsNotFound(k8s.Get(ctx, key, &policyv1.PodDisruptionBudget{}))).To(BeTrue(), "budget gone")
	}, timeout, interval).Should(Succeed())
	// The Lease stays, untouched: the operator may not delete it, and it goes with the Service.
	g.Expect(k8s.Get(ctx, key, lease)).To(Succeed())
	g.Expect(lease.Spec.HolderIdentity).To(Equal(ptr.To("lb-svc-ha-x")))
}

// A note in the Lease that two lb pods held the address at once (written by the one the Lease
// fenced) is reported once: one AddressHeldTwice Warning Event on the Service and one on its IP
// object, the condition True with the same message, and lbsvc_addresses_held_twice_total one
// higher. Later passes (another Lease write, a pod change) report nothing more; a newer note is
// reported again.
func TestAddressHeldTwiceReported(t *testing.T) {
	g := NewWithT(t)
	f := newFixture(t)
	addr := f.ip("71")
	svc := lbService(f.ns, "web", f.provider, addr)
	svc.Annotations[lbv1.ReplicasAnnotation] = "2"
	create(t, svc)
	svc = waitAddress(t, f.ns, "web", addr)
	readyLBPod(t, svc, "lb-a", addr, "n1", true)
	readyLBPod(t, svc, "lb-b", addr, "n2", true)
	// The Lease as the lb pod that first took the address over created it (the operator creates none).
	lease := lbobjects.BuildLease("lb-svc-web", svc)
	lease.Spec.HolderIdentity, lease.Spec.LeaseTransitions = ptr.To("lb-a"), ptr.To[int32](0)
	create(t, lease)
	ip := getIP(g, addr)
	before := heldTwiceTotal(g)

	// Seconds ago, so that the condition stays True for the whole test (quiet period 10 min).
	at := time.Now().UTC().Add(-2 * time.Second).Truncate(time.Second).Format(time.RFC3339)
	update(t, lease, func(l *coordinationv1.Lease) {
		l.Spec.HolderIdentity, l.Spec.LeaseTransitions = ptr.To("lb-b"), ptr.To[int32](1)
		l.Annotations = map[string]string{lbv1.HAClaimAnnotation: "4 100 02:00:00:00:00:0b", lbv1.HeldTwiceAnnotation: "lb-a " + at + " 3 lb-b 4"}
	})
	msg := fmt.Sprintf(`%s was held by two lb pods at once: "lb-a" (term 3) and "lb-b" (term 4); at %s the Lease fenced "lb-a", `+
		`whose adverts and the other's did not reach each other: check that the underlay carries EtherType 0x88B5 multicast between their nodes`, addr, at)
	warnings := func() []string { return warningMessages(t, f.ns, "web", decide.ReasonAddressHeldTwice) }
	g.Eventually(warnings, timeout, interval).Should(Equal([]string{msg}))
	g.Eventually(func() []string { return ipWarnings(t, ip.UID, decide.ReasonAddressHeldTwice) }, timeout, interval).Should(Equal([]string{msg}))
	c := findCondition(getService(g, f.ns, "web").Status.Conditions, decide.ConditionAddressHeldTwice)
	g.Expect(c).NotTo(BeNil())
	g.Expect([]string{string(c.Status), c.Reason, c.Message}).To(Equal([]string{"True", decide.ReasonAddressHeldTwice, msg}))
	g.Expect(heldTwiceTotal(g)).To(Equal(before + 1))
	// The holder is shown as usual.
	shownHolder(t, svc, addr, "lb-b", "n2", addr+" held by pod "+f.ns+"/lb-b on node n2; standby: "+f.ns+"/lb-a on node n1",
		map[string]string{"lb-a": lbv1.RoleStandby, "lb-b": lbv1.RoleActive})

	// Later passes report nothing more: a Lease write that keeps the note, a pod that changes.
	update(t, lease, func(l *coordinationv1.Lease) { l.Spec.LeaseTransitions = ptr.To[int32](2) })
	setReady(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "lb-a"}}, false)
	g.Consistently(warnings, 2*time.Second, interval).Should(Equal([]string{msg}))
	g.Expect(ipWarnings(t, ip.UID, decide.ReasonAddressHeldTwice)).To(Equal([]string{msg}))
	g.Expect(heldTwiceTotal(g)).To(Equal(before + 1))

	// A newer note (the other way round) is another report.
	at2 := time.Now().UTC().Truncate(time.Second).Format(time.RFC3339)
	update(t, lease, func(l *coordinationv1.Lease) {
		l.Spec.HolderIdentity = ptr.To("lb-a")
		l.Annotations[lbv1.HAClaimAnnotation] = "5 100 02:00:00:00:00:0a"
		l.Annotations[lbv1.HeldTwiceAnnotation] = "lb-b " + at2 + " 4 lb-a 5"
	})
	msg2 := fmt.Sprintf(`%s was held by two lb pods at once: "lb-b" (term 4) and "lb-a" (term 5); at %s the Lease fenced "lb-b", `+
		`whose adverts and the other's did not reach each other: check that the underlay carries EtherType 0x88B5 multicast between their nodes`, addr, at2)
	g.Eventually(warnings, timeout, interval).Should(ConsistOf(msg, msg2))
	g.Eventually(func() []string { return ipWarnings(t, ip.UID, decide.ReasonAddressHeldTwice) }, timeout, interval).Should(ConsistOf(msg, msg2))
	g.Expect(heldTwiceTotal(g)).To(Equal(before + 2))
}

func warningMessages(t *testing.T, ns, name, reason string) []string {
	var out []string
	for _, e := range events(t, ns, name) {
		if e.Reason == reason && e.Type == corev1.EventTypeWarning {
			out = append(out, e.Message)
		}
	}
	return out
}

// heldTwiceTotal reads lbsvc_addresses_held_twice_total from the operator's registry.
func heldTwiceTotal(g Gomega) float64 { return counterValue(g, "lbsvc_addresses_held_twice_total", -1) }

// counterValue reads an unlabelled counter from the operator's registry (missing when not yet
// registered or never counted: the value given).
func counterValue(g Gomega, name string, missing float64) float64 {
	mfs, err := metrics.Registry.Gather()
	g.Expect(err).NotTo(HaveOccurred())
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return missing
}

// TestSharedAddressHolderShownToEveryMember: the Lease of a shared address lives where its lb
// pods run, here the --lb-pod-namespace (they write it there, with the owner's UID), and names no
// Service. Every member, one of another namespace too, shows the holder it records, follows it
// when it changes and is told when two lb pods held the address at once; a Lease with the
// address's label and name in a member's namespace, the owner's included, which that namespace's
// tenant can write (and may go on writing after its Service left the address), is not read.
func TestSharedAddressHolderShownToEveryMember(t *testing.T) {
	// Two lb pods for a shared address (--lb-replicas, as the operator's default): the Lease is read.
	g, f, system, other, owner := crossNamespacePair(t, func(o *controllers.Options) { o.LBReplicas = 2 })
	addr := f.ip("6")
	ip := getIP(g, addr)
	name := lbobjects.SharedObjectName(addr)
	// The address's lb pods (no kubelet here: pod objects stand in), as its Deployment labels them.
	for _, p := range []struct{ name, node string }{{"lb-a", "n1"}, {"lb-b", "n2"}} {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: p.name, Namespace: system, Labels: map[string]string{
				lbv1.ComponentLabel: lbv1.ComponentLBPod, lbobjects.ManagedByLabel: lbobjects.ManagedByValue,
				lbv1.SharedIPLabel: addr, lbv1.ServiceNamespaceLabel: f.ns, lbv1.ServiceUIDLabel: string(owner.UID), lbv1.IPv4Label: addr}},
			Spec: corev1.PodSpec{NodeName: p.node, Containers: []corev1.Container{{Name: "c", Image: image}}},
		}
		create(t, pod)
		setReady(t, pod, true)
	}
	forged := lbobjects.BuildSharedLease(name, other.ns, f.ns, owner.UID, lbobjects.IPRef{Name: ip.Name, UID: ip.UID})
	forged.Spec.HolderIdentity, forged.Spec.LeaseTransitions = ptr.To("lb-b"), ptr.To[int32](7)
	create(t, forged)
	atOwner := time.Now().UTC().Add(-time.Second).Truncate(time.Second).Format(time.RFC3339)
	forgedByOwner := lbobjects.BuildSharedLease(name, f.ns, f.ns, owner.UID, lbobjects.IPRef{Name: ip.Name, UID: ip.UID})
	forgedByOwner.Spec.HolderIdentity, forgedByOwner.Spec.LeaseTransitions = ptr.To("lb-b"), ptr.To[int32](9)
	forgedByOwner.Annotations = map[string]string{lbv1.HeldTwiceAnnotation: "lb-a " + atOwner + " 8 lb-b 9",
		lbv1.AddressConflictAnnotation: addr + " 02:42:ac:12:00:05 " + atOwner}
	create(t, forgedByOwner)
	lease := lbobjects.BuildSharedLease(name, system, f.ns, owner.UID, lbobjects.IPRef{Name: ip.Name, UID: ip.UID})
	lease.Spec.HolderIdentity, lease.Spec.LeaseTransitions = ptr.To("lb-a"), ptr.To[int32](0)
	create(t, lease)

	shown := func(holder, node, standby, standbyNode string) {
		t.Helper()
		for _, s := range []struct{ ns, name string }{{f.ns, "dns-tcp"}, {other.ns, "dns-udp"}} {
			g.Eventually(func(g Gomega) {
				svc := getService(g, s.ns, s.name)
				g.Expect(svc.Annotations[lbv1.ActivePodAnnotation]).To(Equal(system+"/"+holder), "%s/%s", s.ns, s.name)
				g.Expect(svc.Annotations[lbv1.ActiveNodeAnnotation]).To(Equal(node))
				c := findCondition(svc.Status.Conditions, decide.ConditionAddressActive)
				g.Expect(c).NotTo(BeNil())
				g.Expect(c.Message).To(Equal(fmt.Sprintf("%s held by pod %s/%s on node %s; standby: %s/%s on node %s", addr, system, holder, node, system, standby, standbyNode)))
			}, timeout, interval).Should(Succeed())
		}
	}
	shown("lb-a", "n1", "lb-b", "n2")
	update(t, lease, func(l *coordinationv1.Lease) {
		l.Spec.HolderIdentity, l.Spec.LeaseTransitions = ptr.To("lb-b"), ptr.To[int32](1)
	})
	shown("lb-b", "n2", "lb-a", "n1")

	at := time.Now().UTC().Add(-2 * time.Second).Truncate(time.Second).Format(time.RFC3339)
	update(t, lease, func(l *coordinationv1.Lease) {
		l.Annotations = map[string]string{lbv1.HAClaimAnnotation: "4 100 02:00:00:00:00:0b", lbv1.HeldTwiceAnnotation: "lb-a " + at + " 3 lb-b 4"}
	})
	msg := fmt.Sprintf(`%s was held by two lb pods at once: "lb-a" (term 3) and "lb-b" (term 4); at %s the Lease fenced "lb-a", `+
		`whose adverts and the other's did not reach each other: check that the underlay carries EtherType 0x88B5 multicast between their nodes`, addr, at)
	for _, s := range []struct{ ns, name string }{{f.ns, "dns-tcp"}, {other.ns, "dns-udp"}} {
		g.Eventually(func() []string { return warningMessages(t, s.ns, s.name, decide.ReasonAddressHeldTwice) }, timeout, interval).
			Should(Equal([]string{msg}), "%s/%s", s.ns, s.name)
	}
	// The forged Leases are still there, naming another holder (and, the owner's, a note of
	// its own and a conflict report): never read, the address not in phase Conflict.
	g.Expect(k8s.Get(context.Background(), client.ObjectKeyFromObject(forged), forged)).To(Succeed())
	g.Expect(forged.Spec.HolderIdentity).To(Equal(ptr.To("lb-b")))
	g.Expect(k8s.Get(context.Background(), client.ObjectKeyFromObject(forgedByOwner), forgedByOwner)).To(Succeed())
	g.Expect(forgedByOwner.Annotations).To(HaveKey(lbv1.AddressConflictAnnotation))
	g.Expect(getIP(g, addr).Status.Phase).NotTo(Equal(lbv1.IPConflict))
	shown("lb-b", "n2", "lb-a", "n1")

	// The owner leaves the address for one of its own: the address's lb pods still carry its
	// UID, but they are not its lb pods (none is shown as its holder or standby); the other
	// member keeps the address and its holder.
	update(t, getService(g, f.ns, "dns-tcp"), func(s *corev1.Service) {
		delete(s.Annotations, lbv1.AllowSharedIPAnnotation)
		delete(s.Annotations, lbv1.SharedIPNamespacesAnnotation)
	})
	own := f.ip("7")
	waitAddress(t, f.ns, "dns-tcp", own)
	g.Eventually(func(g Gomega) {
		c := findCondition(getService(g, f.ns, "dns-tcp").Status.Conditions, decide.ConditionAddressActive)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Message).To(HavePrefix("no lb pod has reported holding " + own))
		g.Expect(c.Message).NotTo(ContainSubstring("lb-"))
	}, timeout, interval).Should(Succeed())
	g.Expect(getService(g, other.ns, "dns-udp").Annotations[lbv1.ActivePodAnnotation]).To(Equal(system + "/lb-b"))
}

// From one lb pod to two: the Deployment goes to two replicas with Recreate (the single pod holds
// its addresses outside the election, so a RollingUpdate's new replicas would claim them beside
// it), and to RollingUpdate once its status shows the rollout complete (envtest runs no
// Deployment controller: the test writes that status). Then a new claim with standbys (a move to
// another address; an address family added or removed is the same): the new pods elect with
// another key and group than the old, which they would never hear, so Recreate again until that
// rollout is complete.
func TestOneToTwoLBPodsRecreates(t *testing.T) {
	g, ctx, f := servedFixture(t, "grow")
	key := client.ObjectKey{Namespace: f.ns, Name: "lb-svc-grow"}
	strategy := func(g Gomega, replicas int32) appsv1.DeploymentStrategy {
		d := &appsv1.Deployment{}
		g.Expect(k8s.Get(ctx, key, d)).To(Succeed())
		g.Expect(*d.Spec.Replicas).To(Equal(replicas))
		return d.Spec.Strategy
	}
	recreate := appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType}
	rollingUpdate := appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType,
		RollingUpdate: &appsv1.RollingUpdateDeployment{MaxUnavailable: ptr.To(intstr.FromInt32(0)), MaxSurge: ptr.To(intstr.FromInt32(1))}}
	// rolledOut writes the Deployment controller's report: both new pods there, the old ones gone.
	rolledOut := func() {
		g.Eventually(func(g Gomega) {
			d := &appsv1.Deployment{}
			g.Expect(k8s.Get(ctx, key, d)).To(Succeed())
			d.Status = appsv1.DeploymentStatus{ObservedGeneration: d.Generation, Replicas: 2, UpdatedReplicas: 2, ReadyReplicas: 2, AvailableReplicas: 2,
				Conditions: []appsv1.DeploymentCondition{{Type: appsv1.DeploymentAvailable, Status: corev1.ConditionTrue, Reason: "MinimumReplicasAvailable"}}}
			g.Expect(k8s.Status().Update(ctx, d)).To(Succeed())
		}, timeout, interval).Should(Succeed())
	}
	g.Eventually(func(g Gomega) {
		g.Expect(strategy(g, 1)).To(Equal(recreate))
	}, timeout, interval).Should(Succeed())

	update(t, getService(g, f.ns, "grow"), func(s *corev1.Service) { s.Annotations[lbv1.ReplicasAnnotation] = "2" })
	g.Eventually(func(g Gomega) {
		g.Expect(strategy(g, 2)).To(Equal(recreate))
	}, timeout, interval).Should(Succeed())
	g.Consistently(func(g Gomega) {
		g.Expect(strategy(g, 2).Type).To(Equal(appsv1.RecreateDeploymentStrategyType))
	}, time.Second, interval).Should(Succeed())
	rolledOut()
	g.Eventually(func(g Gomega) {
		g.Expect(strategy(g, 2)).To(Equal(rollingUpdate))
	}, timeout, interval).Should(Succeed())

	// The new claim: the new template (its addresses, its key Secret) goes out with Recreate.
	var before appsv1.Deployment
	g.Expect(k8s.Get(ctx, key, &before)).To(Succeed())
	update(t, getService(g, f.ns, "grow"), func(s *corev1.Service) { s.Spec.LoadBalancerIP = f.ip("31") })
	waitAddress(t, f.ns, "grow", f.ip("31"))
	g.Eventually(func(g Gomega) {
		d := &appsv1.Deployment{}
		g.Expect(k8s.Get(ctx, key, d)).To(Succeed())
		g.Expect(d.Spec.Template.Spec.Containers[0].Env).To(ContainElement(corev1.EnvVar{Name: lbv1.EnvAddresses, Value: f.ip("31") + "/24"}))
		g.Expect(d.Spec.Template.Spec.Volumes).NotTo(Equal(before.Spec.Template.Spec.Volumes), "a new key Secret")
		g.Expect(d.Spec.Strategy).To(Equal(recreate))
	}, timeout, interval).Should(Succeed())
	g.Consistently(func(g Gomega) {
		g.Expect(strategy(g, 2).Type).To(Equal(appsv1.RecreateDeploymentStrategyType))
	}, time.Second, interval).Should(Succeed())
	rolledOut()
	g.Eventually(func(g Gomega) {
		g.Expect(strategy(g, 2)).To(Equal(rollingUpdate))
	}, timeout, interval).Should(Succeed())
}

// servedFixture is a new fixture with one Service of it, name, served on the Subnet's first
// address.
func servedFixture(t *testing.T, name string) (Gomega, context.Context, fixture) {
	t.Helper()
	f := newFixture(t)
	create(t, lbService(f.ns, name, f.provider, ""))
	waitAddress(t, f.ns, name, f.ip("6"))
	return NewWithT(t), context.Background(), f
}
