//go:build integration

package integration

import (
	"context"
	"testing"
	"time"

	"github.com/lbsvc/lbsvc-operator/controllers/decide"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
)

// The operator stopped and a new one started on the same API server: every Service keeps its
// address, a new Service gets a free one, and of two Services recorded with one address the
// older keeps it while the younger is told and moved.
func TestRestartKeepsAddresses(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	f := newFixture(t)
	// Dynamic ones first take .6, .7, .8; a static one holds .100.
	for _, n := range []string{"a", "b", "c"} {
		create(t, lbService(f.ns, n, f.provider, ""))
		waitAddress(t, f.ns, n, f.ip(map[string]string{"a": "6", "b": "7", "c": "8"}[n]))
	}
	create(t, lbService(f.ns, "static", f.provider, f.ip("100")))
	waitAddress(t, f.ns, "static", f.ip("100"))
	// Free .6: after the restart the lowest free address is .6 again, so a rebuild that forgot
	// b or c would hand their address out.
	a := getService(g, f.ns, "a")
	g.Expect(k8s.Delete(ctx, a)).To(Succeed())
	waitGone(t, a)

	stopOperator()
	// While no operator runs, a younger Service shows up claiming b's address in the annotations
	// (as a tenant with the edit role, a restored backup or a buggy tool would write it). The
	// annotation is a mirror for humans: it must win nothing.
	young := lbService(f.ns, "young", f.provider, "")
	young.Annotations[lbv1.AllocatedIPsAnnotation] = f.ip("7")
	young.Annotations[lbv1.AllocatedSubnetAnnotation] = f.subnet
	create(t, young)
	startOperator(true)

	create(t, lbService(f.ns, "d", f.provider, ""))
	g.Eventually(func(g Gomega) {
		got := append(ingressIPs(getService(g, f.ns, "d")), ingressIPs(getService(g, f.ns, "young"))...)
		g.Expect(got).To(ConsistOf(f.ip("6"), f.ip("9")))
	}, timeout, interval).Should(Succeed())
	g.Consistently(func(g Gomega) {
		for n, ip := range map[string]string{"b": "7", "c": "8", "static": "100"} {
			s := getService(g, f.ns, n)
			g.Expect(ingressIPs(s)).To(Equal([]string{f.ip(ip)}), "service %s", n)
		}
	}, time.Second, 200*time.Millisecond).Should(Succeed())
	g.Expect(warningReasons(t, f.ns, "b")).To(BeEmpty())
	g.Expect(events(t, f.ns, "young")).To(HaveEach(HaveField("Type", corev1.EventTypeNormal)))
	// The IP objects, not the annotations, say who holds what.
	ip7 := &lbv1.IP{}
	g.Expect(k8s.Get(ctx, client.ObjectKey{Name: f.ip("7")}, ip7)).To(Succeed())
	g.Expect(ip7.Spec.Service.Name).To(Equal("b"))
	waitSubnetCounters(t, f.subnet, 5, 249-5)
}

// A Subnet in use is kept (finalizer, Event naming its Services) until they let go.
func TestSubnetInUseBlocksDeletion(t *testing.T) {
	g, ctx, f := servedFixture(t, "user")
	sn := &lbv1.Subnet{}
	g.Expect(k8s.Get(ctx, client.ObjectKey{Name: f.subnet}, sn)).To(Succeed())
	g.Expect(k8s.Delete(ctx, sn)).To(Succeed())
	g.Eventually(func(g Gomega) {
		var list corev1.EventList
		g.Expect(k8s.List(ctx, &list, client.InNamespace("default"))).To(Succeed())
		var msgs []string
		for _, e := range list.Items {
			if e.InvolvedObject.Name == f.subnet && e.Reason == decide.ReasonSubnetInUse {
				msgs = append(msgs, e.Message)
			}
		}
		g.Expect(msgs).To(ContainElement(`subnet "` + f.subnet + `" still has 1 address(es) bound or draining, of service(s) ` + f.ns + "/user"))
	}, timeout, interval).Should(Succeed())
	g.Consistently(func(g Gomega) {
		g.Expect(k8s.Get(ctx, client.ObjectKey{Name: f.subnet}, sn)).To(Succeed())
		g.Expect(sn.DeletionTimestamp).NotTo(BeNil())
	}, time.Second, 200*time.Millisecond).Should(Succeed())
	// New Services are not served from a Subnet being deleted.
	create(t, lbService(f.ns, "late", f.provider, ""))
	waitRefused(t, f.ns, "late", decide.ReasonSubnetNotReady)

	user := getService(g, f.ns, "user")
	g.Expect(k8s.Delete(ctx, user)).To(Succeed())
	waitGone(t, user)
	waitGone(t, sn)
}

// With --enable-lb-svc=false nothing is created for a new Service, and nothing that exists is
// touched, even for a Service that stopped being eligible.
func TestFlagOff(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	f := newFixture(t)
	served := lbService(f.ns, "served", f.provider, "")
	create(t, served)
	before := waitAddress(t, f.ns, "served", f.ip("6"))
	d := &appsv1.Deployment{}
	g.Eventually(func() error {
		return k8s.Get(ctx, client.ObjectKey{Namespace: f.ns, Name: "lb-svc-served"}, d)
	}, timeout, interval).Should(Succeed())

	startOperator(false)
	t.Cleanup(func() { startOperator(true) })

	create(t, lbService(f.ns, "fresh", f.provider, ""))
	update(t, served, func(s *corev1.Service) { delete(s.Annotations, lbv1.AttachmentProviderAnnotation) })
	g.Consistently(func(g Gomega) {
		fresh := getService(g, f.ns, "fresh")
		g.Expect(fresh.Finalizers).To(BeEmpty())
		g.Expect(fresh.Annotations).NotTo(HaveKey(lbv1.AllocatedIPsAnnotation))
		g.Expect(fresh.Status.LoadBalancer.Ingress).To(BeEmpty())
		err := k8s.Get(ctx, client.ObjectKey{Namespace: f.ns, Name: "lb-svc-fresh"}, &appsv1.Deployment{})
		g.Expect(apierrors.IsNotFound(err)).To(BeTrue())

		s := getService(g, f.ns, "served")
		g.Expect(s.Finalizers).To(Equal(before.Finalizers))
		g.Expect(s.Annotations[lbv1.AllocatedIPsAnnotation]).To(Equal(f.ip("6")))
		g.Expect(ingressIPs(s)).To(Equal([]string{f.ip("6")}))
		cur := &appsv1.Deployment{}
		g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(d), cur)).To(Succeed())
		g.Expect(cur.UID).To(Equal(d.UID))
		g.Expect(cur.DeletionTimestamp).To(BeNil())
	}, 3*time.Second, 250*time.Millisecond).Should(Succeed())
	g.Expect(events(t, f.ns, "fresh")).To(BeEmpty())

	// Deleting a Service we served still completes with the flag off: finalizer removed, the
	// address drained (and free again).
	g.Expect(k8s.Delete(ctx, getService(g, f.ns, "served"))).To(Succeed())
	waitGone(t, before)
	g.Eventually(func() bool {
		return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKey{Name: f.ip("6")}, &lbv1.IP{}))
	}, timeout, interval).Should(BeTrue())
}

// The Subnet reconciler: what the schema cannot catch is reported in the Ready condition;
// what it can (a bad cidrBlock) is refused at admission.
func TestSubnetValidation(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	provider := "any." + ns
	net := nextNet()
	// Age decides which of two overlapping Subnets stays valid; within one second of creation
	// time, the name does: "ov-a-" sorts before "ov-b-", so no wait is needed here.
	older := subnetObj("ov-a-"+suffix(), provider, net+".0/24", net+".1", nil)
	create(t, older)
	waitReady(t, older.Name, metav1.ConditionTrue, decide.ReasonSubnetValid)
	cases := []struct {
		subnet *lbv1.Subnet
		reason string
	}{
		{subnetObj("ov-b-"+suffix(), provider, net+".128/25", net+".129", nil), decide.ReasonSubnetOverlap},
		{subnetObj("gw-out-"+suffix(), provider, nextNet()+".0/24", "10.250.9.1", nil), decide.ReasonSubnetInvalid},
		{subnetObj("ex-out-"+suffix(), provider, nextNet()+".0/24", "", []string{"10.250.9.5..10.250.9.9"}), decide.ReasonSubnetInvalid},
	}
	for _, c := range cases {
		create(t, c.subnet)
		waitReady(t, c.subnet.Name, metav1.ConditionFalse, c.reason)
	}
	// The older Subnet stays valid.
	waitReady(t, older.Name, metav1.ConditionTrue, decide.ReasonSubnetValid)

	bad := subnetObj("bad-cidr-"+suffix(), provider, "10.1.2.300/24", "", nil)
	err := k8s.Create(ctx, bad)
	g := NewWithT(t)
	g.Expect(apierrors.IsInvalid(err)).To(BeTrue(), "create with cidrBlock 10.1.2.300/24: %v", err)
	g.Expect(err.Error()).To(ContainSubstring("cidrBlock must be one CIDR"))
}

func waitReady(t *testing.T, name string, status metav1.ConditionStatus, reason string) {
	t.Helper()
	NewWithT(t).Eventually(func(g Gomega) {
		s := &lbv1.Subnet{}
		g.Expect(k8s.Get(context.Background(), client.ObjectKey{Name: name}, s)).To(Succeed())
		c := findCondition(s.Status.Conditions, decide.ConditionSubnetReady)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Status).To(Equal(status))
		g.Expect(c.Reason).To(Equal(reason))
	}, timeout, interval).Should(Succeed())
}
