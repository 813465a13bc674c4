//go:build integration

package integration

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
	"github.com/lbsvc/lbsvc-operator/controllers/decide"
	"github.com/lbsvc/lbsvc-operator/controllers/lbobjects"
)

// The lb pods' conflict probe reports on their Service's Lease (lbsvc.io/address-conflict); the
// test writes that report as the lb pod would (there is no kubelet here: the probe itself is
// tested in test/dataplane and end to end).
func reportConflict(t *testing.T, svc *corev1.Service, note string) {
	t.Helper()
	lease := &coordinationv1.Lease{}
	key := client.ObjectKey{Namespace: svc.Namespace, Name: lbobjects.LeaseName("", svc.Namespace, svc.Name)}
	switch err := k8s.Get(context.Background(), key, lease); {
	case apierrors.IsNotFound(err):
		lease = lbobjects.BuildLease(key.Name, svc)
		lease.Annotations = map[string]string{lbv1.AddressConflictAnnotation: note}
		create(t, lease)
	case err != nil:
		t.Fatal(err)
	default:
		update(t, lease, func(l *coordinationv1.Lease) {
			if l.Annotations == nil {
				l.Annotations = map[string]string{}
			}
			l.Annotations[lbv1.AddressConflictAnnotation] = note
		})
	}
}

func conflictsTotal(g Gomega) float64 { return counterValue(g, "lbsvc_address_conflicts_total", 0) }

func lbAddresses(g Gomega, ns, svc string) string {
	d := &appsv1.Deployment{}
	g.Expect(k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "lb-svc-" + svc}, d)).To(Succeed())
	for _, e := range d.Spec.Template.Spec.Containers[0].Env {
		if e.Name == lbv1.EnvAddresses {
			return e.Value
		}
	}
	return ""
}

// A dynamic Service whose first address answered the probe: the IP object goes to phase Conflict
// with the MAC (one Warning on it and on the Service, the counter one higher), the Service gets
// the next free address and its lb pods are rebuilt for it; the address in Conflict is handed to
// nobody, stays when the Service goes, and is free again once an admin deletes its IP object.
func TestConflictMovesDynamicService(t *testing.T) {
	g := NewWithT(t)
	f := newFixture(t)
	first, second := f.ip("6"), f.ip("7")
	create(t, lbService(f.ns, "web", f.provider, ""))
	svc := waitAddress(t, f.ns, "web", first)
	before := conflictsTotal(g)
	at := time.Now().UTC().Truncate(time.Second)
	reportConflict(t, svc, fmt.Sprintf("%s 02:42:ac:12:00:05 %s", first, at.Format(time.RFC3339)))

	waitAddress(t, f.ns, "web", second)
	g.Eventually(func(g Gomega) { g.Expect(lbAddresses(g, f.ns, "web")).To(Equal(second + "/24")) }, timeout, interval).Should(Succeed())
	ip := getIP(g, first)
	g.Expect(ip.Status.Phase).To(Equal(lbv1.IPConflict))
	g.Expect(ip.Status.Conflict).NotTo(BeNil())
	g.Expect(ip.Status.Conflict.MAC).To(Equal("02:42:ac:12:00:05"))
	g.Expect(ip.Status.Conflict.Since.Time.Equal(at)).To(BeTrue(), "since %v, want %v", ip.Status.Conflict.Since, at)
	g.Expect(ip.Status.Message).To(Equal(fmt.Sprintf("in use on the underlay: 02:42:ac:12:00:05 answered the probe at %s; it is not handed out again until an admin deletes the IP object (kubectl delete ip %s)",
		at.Format(time.RFC3339), first)))
	want := fmt.Sprintf("%s is in use on the underlay: 02:42:ac:12:00:05 answered the lb pod's probe before the first announcement; the Service %s/web does not announce it, and it is not handed out again until an admin deletes the IP object (kubectl delete ip %s)", first, f.ns, first)
	g.Eventually(func() []string { return warningMessages(t, f.ns, "web", decide.ReasonAddressInUse) }, timeout, interval).Should(Equal([]string{want}))
	g.Eventually(func() []string { return ipWarnings(t, ip.UID, decide.ReasonAddressInUse) }, timeout, interval).Should(Equal([]string{want}))
	g.Expect(conflictsTotal(g)).To(Equal(before + 1))
	g.Expect(getIP(g, second).Status.Phase).NotTo(Equal(lbv1.IPConflict))

	// Another Service asking for the address in Conflict is refused, naming what answered.
	create(t, lbService(f.ns, "other", f.provider, first))
	refused := waitRefused(t, f.ns, "other", decide.ReasonAddressInUse)
	c := findCondition(refused.Status.Conditions, decide.ConditionAddressAllocated)
	g.Expect(c.Message).To(HavePrefix(fmt.Sprintf("spec.loadBalancerIP %s is in use on the underlay: 02:42:ac:12:00:05 answered", first)))
	// A third, dynamic, gets neither.
	create(t, lbService(f.ns, "third", f.provider, ""))
	waitAddress(t, f.ns, "third", f.ip("8"))

	// The Service goes: its address drains, the one in Conflict stays.
	g.Expect(k8s.Delete(context.Background(), getService(g, f.ns, "web"))).To(Succeed())
	waitGone(t, &lbv1.IP{ObjectMeta: metav1.ObjectMeta{Name: second}})
	g.Consistently(func(g Gomega) { g.Expect(getIP(g, first).Status.Phase).To(Equal(lbv1.IPConflict)) }, 2*time.Second, interval).Should(Succeed())

	// An admin clears it: the refused Service gets it.
	g.Expect(k8s.Delete(context.Background(), getIP(g, first))).To(Succeed())
	waitAddress(t, f.ns, "other", first)
	g.Expect(getIP(g, first).Status.Phase).NotTo(Equal(lbv1.IPConflict))
}

// A static Service whose address answered: refused AddressInUse with the MAC, its lb Deployment
// removed, the IP object kept in phase Conflict.
func TestConflictRefusesStaticService(t *testing.T) {
	g := NewWithT(t)
	f := newFixture(t)
	addr := f.ip("40")
	create(t, lbService(f.ns, "web", f.provider, addr))
	svc := waitAddress(t, f.ns, "web", addr)
	at := time.Now().UTC().Truncate(time.Second)
	reportConflict(t, svc, fmt.Sprintf("%s 02:42:ac:12:00:07 %s", addr, at.Format(time.RFC3339)))

	refused := waitRefused(t, f.ns, "web", decide.ReasonAddressInUse)
	c := findCondition(refused.Status.Conditions, decide.ConditionAddressAllocated)
	g.Expect(c.Message).To(Equal(fmt.Sprintf("spec.loadBalancerIP %s is in use on the underlay: 02:42:ac:12:00:07 answered the lb pod's probe at %s; it is not announced, and is not handed out again until an admin deletes the IP object (kubectl delete ip %s)",
		addr, at.Format(time.RFC3339), addr)))
	g.Eventually(func() bool {
		err := k8s.Get(context.Background(), client.ObjectKey{Namespace: f.ns, Name: "lb-svc-web"}, &appsv1.Deployment{})
		return apierrors.IsNotFound(err)
	}, timeout, interval).Should(BeTrue())
	g.Consistently(func(g Gomega) {
		ip := getIP(g, addr)
		g.Expect(ip.DeletionTimestamp).To(BeNil())
		g.Expect(ip.Status.Phase).To(Equal(lbv1.IPConflict))
	}, 2*time.Second, interval).Should(Succeed())

	// An admin clears it (some seconds later: the report is older than the new IP object by more
	// than the clock skew allowed) and the Service claims the address again. The report is still
	// on its Lease (nothing clears it: the operator writes no Leases, and no lb pod ran since),
	// but it was about the IP object deleted: the new one stays Bound.
	g.Eventually(func() bool { return time.Since(at) > decide.ConflictReportSkew+time.Second }, 2*decide.ConflictReportSkew, interval).Should(BeTrue())
	g.Expect(k8s.Delete(context.Background(), getIP(g, addr))).To(Succeed())
	waitAddress(t, f.ns, "web", addr)
	g.Consistently(func(g Gomega) {
		ip := getIP(g, addr)
		g.Expect(ip.Status.Phase).To(Equal(lbv1.IPBound))
		g.Expect(ip.Status.Conflict).To(BeNil())
	}, 2*time.Second, interval).Should(Succeed())
	g.Expect(ingressIPs(getService(g, f.ns, "web"))).To(Equal([]string{addr}))
}

// A report for an address the Lease already lists as announced is not believed (the probe runs
// only before the first announcement: a later report is a bug or a lie), nor is a malformed one;
// the IP object records announced for good.
func TestConflictAfterAnnouncementIgnored(t *testing.T) {
	g := NewWithT(t)
	f := newFixture(t)
	addr := f.ip("50")
	create(t, lbService(f.ns, "web", f.provider, addr))
	svc := waitAddress(t, f.ns, "web", addr)
	lease := lbobjects.BuildLease(lbobjects.LeaseName("", f.ns, "web"), svc)
	lease.Annotations = map[string]string{lbv1.AnnouncedAnnotation: addr}
	create(t, lease)
	g.Eventually(func(g Gomega) { g.Expect(getIP(g, addr).Status.Announced).To(BeTrue()) }, timeout, interval).Should(Succeed())
	before := conflictsTotal(g)

	for _, note := range []string{
		addr + " 02:42:ac:12:00:05 " + time.Now().UTC().Format(time.RFC3339),
		strings.Repeat("garbage ", 100),
	} {
		reportConflict(t, svc, note)
		g.Consistently(func(g Gomega) {
			ip := getIP(g, addr)
			g.Expect(ip.Status.Phase).To(Equal(lbv1.IPBound))
			g.Expect(ip.Status.Announced).To(BeTrue())
			g.Expect(getService(g, f.ns, "web").Annotations[lbv1.AllocatedIPsAnnotation]).To(Equal(addr))
		}, 2*time.Second, interval).Should(Succeed())
	}
	// The Lease dropping its list later does not unset it.
	update(t, lease, func(l *coordinationv1.Lease) { delete(l.Annotations, lbv1.AnnouncedAnnotation) })
	g.Consistently(func(g Gomega) { g.Expect(getIP(g, addr).Status.Announced).To(BeTrue()) }, time.Second, interval).Should(Succeed())
	g.Expect(warningMessages(t, f.ns, "web", decide.ReasonAddressInUse)).To(BeEmpty())
	g.Expect(conflictsTotal(g)).To(Equal(before))
}

// A tenant writes the conflict report into their own Service's Lease themselves (the Lease is in
// their namespace, which they may write as well as its lb pods), then deletes the Service and
// does it again: each report put an address in phase Conflict, kept after its Service, so one
// Service of quota locked the Subnet's addresses for good. Now a namespace holds at most
// MaxConflictsPerNamespace addresses of a family in Conflict: the next report is not believed,
// the Service keeps its address, and that address drains with it.
func TestConflictReportsOfANamespaceAreBounded(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	f := newFixture(t)
	at := time.Now().UTC().Truncate(time.Second).Format(time.RFC3339)
	var locked []string
	for i := range decide.MaxConflictsPerNamespace + 1 {
		name := fmt.Sprintf("cycle-%d", i)
		create(t, lbService(f.ns, name, f.provider, ""))
		var svc *corev1.Service
		g.Eventually(func(g Gomega) {
			svc = getService(g, f.ns, name)
			g.Expect(ingressIPs(svc)).To(HaveLen(1))
		}, timeout, interval).Should(Succeed())
		addr := ingressIPs(svc)[0]
		reportConflict(t, svc, fmt.Sprintf("%s 02:42:ac:12:00:05 %s", addr, at))
		if i < decide.MaxConflictsPerNamespace {
			g.Eventually(func(g Gomega) { g.Expect(getIP(g, addr).Status.Phase).To(Equal(lbv1.IPConflict)) }, timeout, interval).Should(Succeed())
			locked = append(locked, addr)
		} else {
			g.Consistently(func(g Gomega) {
				g.Expect(getIP(g, addr).Status.Phase).To(Equal(lbv1.IPBound))
				g.Expect(ingressIPs(getService(g, f.ns, name))).To(Equal([]string{addr}))
			}, time.Second, interval).Should(Succeed(), "the report past the bound is not believed")
			g.Expect(k8s.Delete(ctx, getService(g, f.ns, name))).To(Succeed())
			waitGone(t, &lbv1.IP{ObjectMeta: metav1.ObjectMeta{Name: addr}})
			continue
		}
		g.Expect(k8s.Delete(ctx, getService(g, f.ns, name))).To(Succeed())
		waitGone(t, svc)
	}
	for _, addr := range locked {
		g.Expect(getIP(g, addr).Status.Phase).To(Equal(lbv1.IPConflict), "%s stays locked until an admin clears it", addr)
	}
}

// TestConcurrentConflictReportsOfANamespaceAreBounded: 20 Services of a namespace report their
// addresses in use on the underlay at once; the IP controller's workers decide them in parallel,
// yet exactly MaxConflictsPerNamespace addresses end in phase Conflict, in each of three rounds.
// Before, each worker counted from a cache that did not show the other's writes yet: 4, 4 and 5.
func TestConcurrentConflictReportsOfANamespaceAreBounded(t *testing.T) {
	for round := range 3 {
		t.Run(fmt.Sprint(round), func(t *testing.T) {
			g := NewWithT(t)
			f := newFixture(t)
			at := time.Now().UTC().Truncate(time.Second).Format(time.RFC3339)
			svcs := make([]*corev1.Service, 20)
			for i := range svcs {
				create(t, lbService(f.ns, fmt.Sprintf("s%d", i), f.provider, ""))
			}
			for i := range svcs {
				g.Eventually(func(g Gomega) {
					svcs[i] = getService(g, f.ns, fmt.Sprintf("s%d", i))
					g.Expect(ingressIPs(svcs[i])).To(HaveLen(1))
				}, timeout, interval).Should(Succeed())
			}
			var wg sync.WaitGroup
			for _, svc := range svcs {
				wg.Go(func() { reportConflict(t, svc, fmt.Sprintf("%s 02:42:ac:12:00:05 %s", ingressIPs(svc)[0], at)) })
			}
			wg.Wait()
			inConflict := func(g Gomega) int {
				var list lbv1.IPList
				g.Expect(k8s.List(context.Background(), &list)).To(Succeed())
				n := 0
				for _, ip := range list.Items {
					if ip.Spec.Service.Namespace == f.ns && ip.Status.Phase == lbv1.IPConflict {
						n++
					}
				}
				return n
			}
			g.Eventually(inConflict, timeout, interval).Should(Equal(decide.MaxConflictsPerNamespace))
			g.Consistently(inConflict, 2*time.Second, interval).Should(Equal(decide.MaxConflictsPerNamespace))
		})
	}
}
