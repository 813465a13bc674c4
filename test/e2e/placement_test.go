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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
)

// TestSubnetNodeSelectorPlacesLBPods: a Subnet whose nodeSelector names the second node (by the
// hostname label every kubelet sets) puts both lb pods of a two-replica Service there, the spread
// counting that node only, and the client on the underlay reaches the Service through it.
func TestSubnetNodeSelectorPlacesLBPods(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	second := multiNode(t)[1]
	g.Eventually(backendNames, time.Minute).WithArguments(t).Should(HaveLen(backendReplicas))
	backends := backendNames(t)

	// 172.19.0.0/16: the client namespace holds its gateway (TestDualStack's Subnet is gone by now).
	subnet := newUnderlaySubnet(t, "e2e-place-"+suffix(), "172.19.0.0/16", "172.19.0.1")
	g.Eventually(func() error {
		var s lbv1.Subnet
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(subnet), &s); err != nil {
			return err
		}
		s.Spec.NodeSelector = &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelHostname: second}}
		return k8s.Update(ctx, &s)
	}).WithTimeout(30 * time.Second).WithPolling(200 * time.Millisecond).Should(Succeed())
	// The operator has seen the selector (its cache is the one the Service pass reads).
	g.Eventually(func() (bool, error) {
		var s lbv1.Subnet
		err := k8s.Get(ctx, client.ObjectKeyFromObject(subnet), &s)
		return s.Spec.NodeSelector != nil && s.Status.ObservedGeneration == s.Generation, err
	}).WithTimeout(30 * time.Second).WithPolling(200 * time.Millisecond).Should(BeTrue())

	svc := newLBService("e2e-place-"+suffix(), "", 80)
	svc.Annotations[lbv1.AttachmentProviderAnnotation] = provider(subnet.Name)
	svc.Annotations[lbv1.ReplicasAnnotation] = "2"
	g.Expect(k8s.Create(ctx, svc)).To(Succeed())
	deleteServiceOnCleanup(t, svc)
	ip := waitIngress(t, svc.Namespace, svc.Name)

	g.Eventually(func() ([]string, error) {
		ready, live, err := lbPodsOf(ctx, svc.Namespace, svc.Name)
		if err != nil || live != 2 {
			return nil, fmt.Errorf("%d live lb pods: %v", live, err)
		}
		var on []string
		for _, p := range ready {
			on = append(on, p.Spec.NodeName)
		}
		return on, nil
	}).WithTimeout(2*time.Minute).WithPolling(250*time.Millisecond).Should(Equal([]string{second, second}), "nodes of the ready lb pods")

	g.Eventually(func() (string, error) {
		out, err := curlFromClient("http://" + ip + ":80/")
		return strings.TrimSpace(out), err
	}).WithTimeout(2 * time.Minute).WithPolling(50 * time.Millisecond).Should(BeElementOf(backends))
	holders, err := holdersOf(ip)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(holders).To(HaveLen(1), "holders of %s: %v", ip, holders)
	g.Expect(holders[0].Node).To(Equal(second))
}
