//go:build integration

package integration

import (
	"context"
	"testing"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
	"github.com/lbsvc/lbsvc-operator/controllers/decide"
)

// readyNode creates a Node with labels and a Ready condition (envtest has no kubelet: the status
// is written by hand, and the not-ready taint the API server puts on a new Node, which the node
// lifecycle controller would take away, is removed by hand), deleted when the test ends.
func readyNode(t *testing.T, name string, labels map[string]string) *corev1.Node {
	t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	create(t, n)
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), n) })
	update(t, n, func(n *corev1.Node) { n.Spec.Taints = nil })
	NewWithT(t).Eventually(func(g Gomega) {
		g.Expect(k8s.Get(context.Background(), client.ObjectKeyFromObject(n), n)).To(Succeed())
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue,
			LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now(), Reason: "KubeletReady"}}
		g.Expect(k8s.Status().Update(context.Background(), n)).To(Succeed())
	}, timeout, interval).Should(Succeed())
	return n
}

// requiredTerms returns the Deployment's required node selector terms (nil when it has none),
// once it exists.
func requiredTerms(g Gomega, ns, svc string) []corev1.NodeSelectorTerm {
	d := &appsv1.Deployment{}
	g.Expect(k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "lb-svc-" + svc}, d)).To(Succeed())
	a := d.Spec.Template.Spec.Affinity
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return nil
	}
	return a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
}

func waitLBPodReason(t *testing.T, ns, svc, reason string) *metav1.Condition {
	t.Helper()
	var c *metav1.Condition
	NewWithT(t).Eventually(func(g Gomega) {
		c = findCondition(getService(g, ns, svc).Status.Conditions, decide.ConditionLBPodAvailable)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Reason).To(Equal(reason))
	}, timeout, interval).Should(Succeed())
	return c
}

func terms(reqs ...corev1.NodeSelectorRequirement) []corev1.NodeSelectorTerm {
	return []corev1.NodeSelectorTerm{{MatchExpressions: reqs}}
}

// A Subnet's nodeSelector places its lb pods: the Deployment requires the matching nodes; a
// selector that matches no Ready node keeps the address and the Deployment and says so
// (NoMatchingNode, Warning Event) until a node is labelled; a changed selector changes the
// Deployment; an invalid one makes the Subnet InvalidSpec and leaves the Deployment as it was.
func TestNodeSelectorPlacement(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	key := "it.lbsvc.io/vlan-" + suffix()
	other := "it.lbsvc.io/other-" + suffix()
	plain := readyNode(t, "plain-"+suffix(), map[string]string{other: "a"})
	readyNode(t, "vlan-"+suffix(), map[string]string{key: "true"})

	// A Subnet restricted to the node with the label.
	f := newFixture(t)
	update(t, &lbv1.Subnet{ObjectMeta: metav1.ObjectMeta{Name: f.subnet}}, func(s *lbv1.Subnet) {
		s.Spec.NodeSelector = &metav1.LabelSelector{MatchLabels: map[string]string{key: "true"}}
	})
	create(t, lbService(f.ns, "placed", f.provider, ""))
	waitAddress(t, f.ns, "placed", f.ip("6"))
	g.Eventually(func(g Gomega) []corev1.NodeSelectorTerm { return requiredTerms(g, f.ns, "placed") }, timeout, interval).
		Should(Equal(terms(corev1.NodeSelectorRequirement{Key: key, Operator: corev1.NodeSelectorOpIn, Values: []string{"true"}})))
	waitLBPodReason(t, f.ns, "placed", decide.ReasonDeploymentPending)

	// A Subnet whose selector matches no node: the address is still handed out and the
	// Deployment applied, and the lb pod condition and a Warning Event say why nothing runs.
	lonelyProvider := createNAD(t, f.ns, "lonely-"+suffix())
	lonelyNet := nextNet()
	lonely := subnetObj("lonely-"+suffix(), lonelyProvider, lonelyNet+".0/24", lonelyNet+".1", nil)
	lonely.Spec.NodeSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
		{Key: other, Operator: metav1.LabelSelectorOpIn, Values: []string{"b"}}}}
	create(t, lonely)
	create(t, lbService(f.ns, "lonely", lonelyProvider, ""))
	waitAddress(t, f.ns, "lonely", lonelyNet+".2")
	c := waitLBPodReason(t, f.ns, "lonely", decide.ReasonNoMatchingNode)
	g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
	g.Expect(c.Message).To(HavePrefix(`subnet "` + lonely.Name + `": spec.nodeSelector "` + other + ` in (b)" matches no node: no lb pod can be scheduled`))
	g.Eventually(func() []string { return warningReasons(t, f.ns, "lonely") }, timeout, interval).Should(ContainElement(decide.ReasonNoMatchingNode))
	lonelyTerms := terms(corev1.NodeSelectorRequirement{Key: other, Operator: corev1.NodeSelectorOpIn, Values: []string{"b"}})
	g.Eventually(func(g Gomega) []corev1.NodeSelectorTerm { return requiredTerms(g, f.ns, "lonely") }, timeout, interval).Should(Equal(lonelyTerms))

	// Labelling a node to match heals the condition (the Node watch wakes the Service).
	update(t, plain, func(n *corev1.Node) { n.Labels[other] = "b" })
	waitLBPodReason(t, f.ns, "lonely", decide.ReasonDeploymentPending)

	// A changed selector changes the Deployment's affinity; a removed one removes it.
	update(t, &lbv1.Subnet{ObjectMeta: metav1.ObjectMeta{Name: f.subnet}}, func(s *lbv1.Subnet) {
		s.Spec.NodeSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: other, Operator: metav1.LabelSelectorOpExists}}}
	})
	g.Eventually(func(g Gomega) []corev1.NodeSelectorTerm { return requiredTerms(g, f.ns, "placed") }, timeout, interval).
		Should(Equal(terms(corev1.NodeSelectorRequirement{Key: other, Operator: corev1.NodeSelectorOpExists})))
	update(t, &lbv1.Subnet{ObjectMeta: metav1.ObjectMeta{Name: f.subnet}}, func(s *lbv1.Subnet) { s.Spec.NodeSelector = nil })
	g.Eventually(func(g Gomega) []corev1.NodeSelectorTerm { return requiredTerms(g, f.ns, "placed") }, timeout, interval).Should(BeNil())

	// An invalid selector: the Subnet is not Ready (InvalidSpec); its Service keeps its address
	// (SubnetNotReady) and its Deployment is left as it was.
	before := &appsv1.Deployment{}
	g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: f.ns, Name: "lb-svc-lonely"}, before)).To(Succeed())
	update(t, &lbv1.Subnet{ObjectMeta: metav1.ObjectMeta{Name: lonely.Name}}, func(s *lbv1.Subnet) {
		s.Spec.NodeSelector.MatchExpressions[0].Operator = "Equals"
	})
	waitReady(t, lonely.Name, metav1.ConditionFalse, decide.ReasonSubnetInvalid)
	g.Eventually(func(g Gomega) {
		s := getService(g, f.ns, "lonely")
		a := findCondition(s.Status.Conditions, decide.ConditionAddressAllocated)
		g.Expect(a).NotTo(BeNil())
		g.Expect(a.Reason).To(Equal(decide.ReasonSubnetNotReady))
		g.Expect(a.Message).To(ContainSubstring(`"Equals" is not a valid label selector operator`))
		g.Expect(ingressIPs(s)).To(Equal([]string{lonelyNet + ".2"}))
	}, timeout, interval).Should(Succeed())
	cur := &appsv1.Deployment{}
	g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(before), cur)).To(Succeed())
	g.Expect(cur.UID).To(Equal(before.UID))
	g.Expect(cur.Generation).To(Equal(before.Generation))
	g.Expect(cur.Spec.Template.Spec.Affinity).To(Equal(before.Spec.Template.Spec.Affinity))
}
