//go:build integration

package integration

import (
	"context"
	"testing"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
	"github.com/lbsvc/lbsvc-operator/controllers/lbobjects"
)

// haKeySecret waits for the Service's Deployment to mount a key Secret and returns that Secret.
func haKeySecret(t *testing.T, ns, svc string) *corev1.Secret {
	t.Helper()
	g := NewWithT(t)
	s := &corev1.Secret{}
	g.Eventually(func(g Gomega) {
		d := &appsv1.Deployment{}
		g.Expect(k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "lb-svc-" + svc}, d)).To(Succeed())
		vols := d.Spec.Template.Spec.Volumes
		g.Expect(vols).To(HaveLen(2))
		g.Expect(vols[1].Secret).NotTo(BeNil())
		g.Expect(d.Spec.Template.Spec.Containers[0].Args[0]).To(Equal("--ha-key-file=/etc/lbsvc/ha/ha.key"))
		g.Expect(k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: vols[1].Secret.SecretName}, s)).To(Succeed())
	}, timeout, interval).Should(Succeed())
	return s
}

// With standbys the operator creates one election key per claim: a Secret of 32 random bytes in the
// lb pods' namespace, immutable, owned by the claim's IP object, mounted by the Deployment; the
// same claim keeps it across passes and operator restarts; the address released and claimed
// again gets a new Secret and a new key. (envtest runs no garbage collector, so the old Secret's
// removal with its IP object is left to the e2e run; its owner reference is checked here.)
func TestHAKeyPerClaim(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	f := newFixture(t)
	addr := f.ip("81")
	svc := lbService(f.ns, "keyed", f.provider, addr)
	svc.Annotations[lbv1.ReplicasAnnotation] = "2"
	create(t, svc)
	waitAddress(t, f.ns, "keyed", addr)

	first := haKeySecret(t, f.ns, "keyed")
	ip := getIP(g, addr)
	g.Expect(first.Data).To(HaveLen(1))
	g.Expect(first.Data[lbobjects.HAKeyFile]).To(HaveLen(32))
	g.Expect(ptr.Deref(first.Immutable, false)).To(BeTrue())
	g.Expect(first.OwnerReferences).To(Equal([]metav1.OwnerReference{{APIVersion: "lbsvc.io/v1alpha1", Kind: "IP", Name: ip.Name, UID: ip.UID}}))
	g.Expect(first.Labels[lbobjects.ManagedByLabel]).To(Equal(lbobjects.ManagedByValue))

	// A restarted operator (nothing remembered) keeps the same Secret and key: its create answers
	// AlreadyExists and the Deployment is unchanged.
	startOperator(true)
	update(t, getService(g, f.ns, "keyed"), func(s *corev1.Service) { s.Labels["touch"] = "1" })
	g.Consistently(func(g Gomega) {
		s := haKeySecret(t, f.ns, "keyed")
		g.Expect(s.Name).To(Equal(first.Name))
		g.Expect(s.Data).To(Equal(first.Data))
	}, "2s", interval).Should(Succeed())

	// Released and claimed again: a new IP object, so a new Secret with another key.
	g.Expect(k8s.Delete(ctx, getService(g, f.ns, "keyed"))).To(Succeed())
	waitGone(t, ip)
	again := lbService(f.ns, "keyed2", f.provider, addr)
	again.Annotations[lbv1.ReplicasAnnotation] = "2"
	create(t, again)
	waitAddress(t, f.ns, "keyed2", addr)
	second := haKeySecret(t, f.ns, "keyed2")
	g.Expect(second.Name).NotTo(Equal(first.Name))
	g.Expect(second.Data[lbobjects.HAKeyFile]).To(HaveLen(32))
	g.Expect(second.Data[lbobjects.HAKeyFile]).NotTo(Equal(first.Data[lbobjects.HAKeyFile]))
	g.Expect(second.OwnerReferences[0].UID).To(Equal(getIP(g, addr).UID))
}

// deploymentArgs is the lbpod container's arguments and the Deployment's annotations, once it exists.
func deploymentArgs(g Gomega, ns, svc string) ([]string, map[string]string) {
	d := &appsv1.Deployment{}
	g.Expect(k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "lb-svc-" + svc}, d)).To(Succeed())
	return d.Spec.Template.Spec.Containers[0].Args, d.Annotations
}

// The legacy window: a fresh Service's lb pods get none (a forged unauthenticated advert is
// refused from their first moment); once an lb pod from before authentication (no wire label) is
// seen beside them, as in an upgrade's rollout, the Deployment gives its pods the 2 min window and
// keeps it after that pod is gone (no second rollout).
func TestHALegacyWindowOnlyForUpgrades(t *testing.T) {
	g := NewWithT(t)
	f := newFixture(t)
	addr := f.ip("82")
	svc := lbService(f.ns, "upgraded", f.provider, addr)
	svc.Annotations[lbv1.ReplicasAnnotation] = "2"
	create(t, svc)
	waitAddress(t, f.ns, "upgraded", addr)
	g.Eventually(func(g Gomega) {
		args, ann := deploymentArgs(g, f.ns, "upgraded")
		g.Expect(args).To(Equal([]string{"--ha-key-file=/etc/lbsvc/ha/ha.key", "--ha-legacy-window=0s"}))
		g.Expect(ann).NotTo(HaveKey(lbobjects.HALegacyPeersAnnotation))
	}, timeout, interval).Should(Succeed())

	// An lb pod of the previous version (envtest has no kubelet: the pod object stands for it).
	old := lbPodObject(t, getService(g, f.ns, "upgraded"), "lb-upgraded-old", addr, "")
	update(t, getService(g, f.ns, "upgraded"), func(s *corev1.Service) { s.Labels["touch"] = "1" })
	g.Eventually(func(g Gomega) {
		args, ann := deploymentArgs(g, f.ns, "upgraded")
		g.Expect(args).To(Equal([]string{"--ha-key-file=/etc/lbsvc/ha/ha.key", "--ha-legacy-window=2m0s"}))
		g.Expect(ann).To(HaveKeyWithValue(lbobjects.HALegacyPeersAnnotation, "true"))
	}, timeout, interval).Should(Succeed())

	forceDelete(t, old)
	update(t, getService(g, f.ns, "upgraded"), func(s *corev1.Service) { s.Labels["touch"] = "2" })
	g.Consistently(func(g Gomega) {
		args, _ := deploymentArgs(g, f.ns, "upgraded")
		g.Expect(args).To(ContainElement("--ha-legacy-window=2m0s"))
	}, "2s", interval).Should(Succeed())
}
