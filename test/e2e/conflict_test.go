//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
	"github.com/lbsvc/lbsvc-operator/controllers/decide"
)

// TestStaticAddressInUseOnUnderlay: the client namespace on the underlay already uses an address
// of the seed's Subnet; a Service asking for it is refused AddressInUse, naming the client's MAC,
// because its lb pod's ARP probe (from 0.0.0.0) was answered before anything was announced: the
// IP object is in phase Conflict with that MAC, no lb pod network namespace ever holds the
// address, and the client's own use of it is untouched (its neighbours still resolve it to the
// client). The Service then asks for a free address and is served.
func TestStaticAddressInUseOnUnderlay(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	const taken, free = "172.18.0.77", "172.18.0.78"
	if out, err := run("ip", "-n", clientNetns, "addr", "add", taken+"/16", "dev", "eth0"); err != nil {
		t.Fatalf("give the client %s: %v: %s", taken, err, out)
	}
	t.Cleanup(func() {
		if out, err := run("ip", "-n", clientNetns, "addr", "del", taken+"/16", "dev", "eth0"); err != nil {
			t.Errorf("take %s from the client: %v: %s", taken, err, out)
		}
	})
	mac, err := run("ip", "netns", "exec", clientNetns, "cat", "/sys/class/net/eth0/address")
	g.Expect(err).NotTo(HaveOccurred())
	mac = strings.TrimSpace(mac)

	t.Cleanup(func() {
		// An admin clears the address once the host is gone; registered before the Service's
		// deletion, so run after it (last in, first out): a Service still asking for it would
		// claim it again.
		ip := &lbv1.IP{}
		ip.Name = taken
		if err := k8s.Delete(context.Background(), ip); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete ip %s: %v", taken, err)
		}
		NewWithT(t).Eventually(func() bool {
			return apierrors.IsNotFound(k8s.Get(context.Background(), client.ObjectKey{Name: taken}, &lbv1.IP{}))
		}).WithTimeout(time.Minute).WithPolling(200*time.Millisecond).Should(BeTrue(), "ip %s still exists", taken)
	})

	svc := newLBService("e2e-inuse-"+suffix(), taken, 80)
	created := time.Now()
	g.Expect(k8s.Create(ctx, svc)).To(Succeed())
	deleteServiceOnCleanup(t, svc)
	var cond *corev1.Service
	g.Eventually(func(g Gomega) {
		s := &corev1.Service{}
		g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(svc), s)).To(Succeed())
		c := meta.FindStatusCondition(s.Status.Conditions, decide.ConditionAddressAllocated)
		g.Expect(c).NotTo(BeNil())
		g.Expect([]string{string(c.Status), c.Reason}).To(Equal([]string{"False", decide.ReasonAddressInUse}))
		cond = s
	}).WithTimeout(2 * time.Minute).WithPolling(100 * time.Millisecond).Should(Succeed())
	t.Logf("figure: conflict_refused_after_ms=%d (Service created -> refused AddressInUse, probe answered by the client)", time.Since(created).Milliseconds())
	c := meta.FindStatusCondition(cond.Status.Conditions, decide.ConditionAddressAllocated)
	g.Expect(c.Message).To(HavePrefix(fmt.Sprintf("spec.loadBalancerIP %s is in use on the underlay: %s answered the lb pod's probe at ", taken, mac)))
	g.Expect(cond.Status.LoadBalancer.Ingress).To(BeEmpty())

	ip := &lbv1.IP{}
	g.Expect(k8s.Get(ctx, client.ObjectKey{Name: taken}, ip)).To(Succeed())
	g.Expect(ip.Status.Phase).To(Equal(lbv1.IPConflict))
	g.Expect(ip.Status.Conflict).NotTo(BeNil())
	g.Expect(ip.Status.Conflict.MAC).To(Equal(mac))
	g.Expect(ip.Status.Announced).To(BeFalse())
	holders, err := holdersOf(taken)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(holders).To(BeEmpty(), "lb pod network namespaces holding %s", taken)
	// The refused Service's lb pods are gone, and no lb pod answered for the address meanwhile:
	// the underlay still resolves it to the client (a second underlay host asks).
	g.Eventually(func() (int, error) {
		_, live, err := lbPodsOf(ctx, svc.Namespace, svc.Name)
		return live, err
	}).WithTimeout(time.Minute).WithPolling(200 * time.Millisecond).Should(Equal(0))
	asker := "lbsvc-e2e-ask-" + suffix()
	addUnderlayClient(t, asker, "172.18.0.8/16")
	// A connection attempt makes the asker resolve the address; the client's kernel refuses it.
	out, err := run("nsenter", "--net=/run/netns/"+asker, "curl", "-sS", "-m", "2", "http://"+taken+":80/")
	g.Expect(err).To(HaveOccurred(), "curl %s from a second underlay host: %s", taken, out)
	g.Expect(out).To(ContainSubstring("curl: (7)"), "the client refuses port 80 (curl cannot connect): %s", out)
	neigh, err := run("ip", "-n", asker, "neigh", "show", taken)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(neigh).To(ContainSubstring("lladdr "+mac), "who answers for %s: %s", taken, neigh)

	// Asked for a free address instead, the Service is served (the probe passes: nobody answers).
	updateService(t, svc, func(s *corev1.Service) { s.Spec.LoadBalancerIP = free })
	g.Eventually(func() (string, error) { return ingressIP(ctx, svc.Namespace, svc.Name) }).
		WithTimeout(time.Minute).WithPolling(100 * time.Millisecond).Should(Equal(free))
	g.Eventually(func() (string, error) {
		out, err := curlFromClient("http://" + free + ":80/")
		return strings.TrimSpace(out), err
	}).WithTimeout(2 * time.Minute).WithPolling(50 * time.Millisecond).ShouldNot(BeEmpty())
	g.Expect(k8s.Get(ctx, client.ObjectKey{Name: taken}, ip)).To(Succeed())
	g.Expect(ip.Status.Phase).To(Equal(lbv1.IPConflict), "the address in Conflict stays until an admin deletes it")
}
