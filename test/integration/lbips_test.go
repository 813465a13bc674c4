//go:build integration

package integration

import (
	"context"
	"testing"
	"time"

	"github.com/lbsvc/lbsvc-operator/controllers/decide"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
)

// The annotation lbsvc.io/loadBalancerIPs asks for the address as spec.loadBalancerIP does, and
// wins over it: a Service with only the annotation gets exactly that address; a change of the
// annotation moves it (the old address drains before anyone else gets it); the field set to
// the same address changes nothing, set to another refuses the Service (LoadBalancerIPConflict,
// Warning Event), and removing it heals the Service.
func TestLoadBalancerIPsAnnotation(t *testing.T) {
	g := NewWithT(t)
	f := newFixture(t)
	annotated := func(name, addr string) *corev1.Service {
		s := lbService(f.ns, name, f.provider, "")
		s.Annotations[lbv1.LoadBalancerIPsAnnotation] = addr
		return s
	}
	svc := annotated("annotated", f.ip("80"))
	create(t, svc)
	svc = waitAddress(t, f.ns, "annotated", f.ip("80"))
	ownedBy := func(g Gomega, addr string) {
		ip := getIP(g, addr)
		g.Expect(ip.Spec.Address).To(Equal(addr))
		g.Expect(ip.Spec.Subnet).To(Equal(f.subnet))
		g.Expect(ip.Spec.Service).To(Equal(lbv1.IPOwner{Namespace: f.ns, Name: "annotated", UID: string(svc.UID)}))
		g.Expect(ip.DeletionTimestamp).To(BeNil())
	}
	ownedBy(g, f.ip("80"))

	// A changed annotation moves the address; an lb pod still holding the old one keeps it
	// draining, and a Service asking for it meanwhile is told so, naming its annotation.
	pod := lbPodObject(t, svc, "lb-annotated-old", f.ip("80"), "")
	update(t, svc, func(s *corev1.Service) { s.Annotations[lbv1.LoadBalancerIPsAnnotation] = f.ip("81") })
	waitAddress(t, f.ns, "annotated", f.ip("81"))
	ownedBy(g, f.ip("81"))
	waitDraining(t, f.ip("80"))
	create(t, annotated("taker", f.ip("80")))
	taker := waitRefused(t, f.ns, "taker", decide.ReasonAddressDraining)
	g.Expect(findCondition(taker.Status.Conditions, decide.ConditionAddressAllocated).Message).To(HavePrefix(
		"annotation lbsvc.io/loadBalancerIPs " + f.ip("80") + " is draining"))
	forceDelete(t, pod)
	waitAddress(t, f.ns, "taker", f.ip("80"))

	// The field asking for the same address: served as before, no warning.
	update(t, svc, func(s *corev1.Service) { s.Spec.LoadBalancerIP = " " + f.ip("81") + " " })
	g.Consistently(func(g Gomega) {
		s := getService(g, f.ns, "annotated")
		g.Expect(ingressIPs(s)).To(Equal([]string{f.ip("81")}))
		g.Expect(findCondition(s.Status.Conditions, decide.ConditionAddressAllocated).Reason).To(Equal(decide.ReasonAllocated))
		g.Expect(warningReasons(t, f.ns, "annotated")).To(BeEmpty())
	}, time.Second, 200*time.Millisecond).Should(Succeed())

	// The field asking for another address: refused, with a Warning Event; the address drains.
	update(t, svc, func(s *corev1.Service) { s.Spec.LoadBalancerIP = f.ip("82") })
	svc = waitRefused(t, f.ns, "annotated", decide.ReasonLoadBalancerIPConflict)
	want := `annotation lbsvc.io/loadBalancerIPs "` + f.ip("81") + `" and spec.loadBalancerIP "` + f.ip("82") +
		`" ask for different addresses; remove spec.loadBalancerIP (deprecated upstream; the annotation takes its place)`
	g.Expect(findCondition(svc.Status.Conditions, decide.ConditionAddressAllocated).Message).To(Equal(want))
	g.Eventually(func() []string { return eventMessages(t, f.ns, "annotated", decide.ReasonLoadBalancerIPConflict) }, timeout, interval).
		Should(ContainElement(want))
	assertNoDeployment(t, f.ns, "annotated")
	waitGone(t, &lbv1.IP{ObjectMeta: metav1.ObjectMeta{Name: f.ip("81")}})
	err := k8s.Get(context.Background(), client.ObjectKey{Name: f.ip("82")}, &lbv1.IP{})
	g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "nothing is claimed for a refused Service: %v", err)

	// The field removed: served again at the annotation's address.
	update(t, svc, func(s *corev1.Service) { s.Spec.LoadBalancerIP = "" })
	svc = waitAddress(t, f.ns, "annotated", f.ip("81"))
	ownedBy(g, f.ip("81"))
	g.Expect(findCondition(svc.Status.Conditions, decide.ConditionAddressAllocated).Reason).To(Equal(decide.ReasonAllocated))
}
