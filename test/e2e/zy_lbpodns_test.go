//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lbsvc/lbsvc-operator/controllers/lbobjects"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
)

const (
	operatorNamespace  = "lbsvc-system"
	operatorDeployment = "lbsvc-operator"
	lbPodNamespaceFlag = "--lb-pod-namespace=" + operatorNamespace
)

// setOperatorArg adds (or removes) one argument of the operator and waits for the rollout.
func setOperatorArg(t *testing.T, arg string, present bool) {
	t.Helper()
	var args []string
	out := kube(t, "get", "deployment", "-n", operatorNamespace, operatorDeployment,
		"-o", "jsonpath={.spec.template.spec.containers[0].args}")
	if err := json.Unmarshal([]byte(out), &args); err != nil {
		t.Fatalf("operator args %q: %v", out, err)
	}
	keep := slices.DeleteFunc(args, func(a string) bool { return a == arg })
	if present {
		keep = append(keep, arg)
	}
	value, err := json.Marshal(keep)
	if err != nil {
		t.Fatal(err)
	}
	patch := `[{"op":"replace","path":"/spec/template/spec/containers/0/args","value":` + string(value) + `}]`
	kube(t, "patch", "deployment", "-n", operatorNamespace, operatorDeployment, "--type=json", "-p", patch)
	kube(t, "rollout", "status", "deployment", "-n", operatorNamespace, operatorDeployment, "--timeout=120s")
	got := kube(t, "get", "deployment", "-n", operatorNamespace, operatorDeployment,
		"-o", "jsonpath={.spec.template.spec.containers[0].args}")
	if strings.Contains(got, arg) != present {
		t.Fatalf("operator args after the patch: %s", got)
	}
}

// manualEndpoints gives Service name of namespace ns, which has no selector, the seed's backend
// pods as endpoints of its port portName (the tenant runs no pod of its own).
func manualEndpoints(t *testing.T, ns, name, portName string, proto corev1.Protocol) {
	t.Helper()
	g := NewWithT(t)
	ctx := context.Background()
	var backends corev1.PodList
	g.Expect(k8s.List(ctx, &backends, client.InNamespace(seedNamespace), client.MatchingLabels{"app": backendApp})).To(Succeed())
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-manual", Namespace: ns,
			Labels: map[string]string{discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: "e2e"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To(portName), Port: ptr.To[int32](80), Protocol: ptr.To(proto)}},
	}
	for _, p := range backends.Items {
		if p.Status.PodIP != "" && podReady(&p) {
			slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{Addresses: []string{p.Status.PodIP},
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
		}
	}
	g.Expect(slice.Endpoints).NotTo(BeEmpty())
	g.Expect(k8s.Create(ctx, slice)).To(Succeed())
}

// TestLBPodNamespaceRestrictedTenant: with --lb-pod-namespace=lbsvc-system the seed's story works
// for a Service whose namespace enforces Pod Security "restricted": its lb pod runs in
// lbsvc-system, nothing runs in the tenant's namespace, and the address answers from the client.
func TestLBPodNamespaceRestrictedTenant(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	tenant := "tenant-" + suffix()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: tenant, Labels: map[string]string{
		"pod-security.kubernetes.io/enforce": "restricted"}}}
	g.Expect(k8s.Create(ctx, ns)).To(Succeed())
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), ns) })

	setOperatorArg(t, lbPodNamespaceFlag, true)
	t.Cleanup(func() {
		setOperatorArg(t, lbPodNamespaceFlag, false)
		// The seed's lb pod moves back beside its Service for the tests that follow.
		waitLBPod(t, seedNamespace, seedService)
	})

	// The tenant runs no pod at all: its Service's endpoints are the seed's backend pods.
	svc := newLBService("web", "")
	svc.Namespace = tenant
	svc.Spec.Selector = nil
	svc.Spec.Ports = []corev1.ServicePort{servicePort(80)}
	g.Expect(k8s.Create(ctx, svc)).To(Succeed())
	deleteServiceOnCleanup(t, svc)
	manualEndpoints(t, tenant, "web", "p80", corev1.ProtocolTCP)

	addr := waitIngress(t, tenant, "web")
	took := timeUntilCurl(t, "http://"+addr+":80/", time.Now(), 2*time.Minute)
	t.Logf("tenant Service %s/web at %s answered %v after its address showed", tenant, addr, took.Round(time.Millisecond))

	var pods corev1.PodList
	g.Eventually(func(g Gomega) {
		g.Expect(k8s.List(ctx, &pods, client.InNamespace(operatorNamespace), client.MatchingLabels{
			lbv1.ServiceNamespaceLabel: tenant, lbv1.ServiceLabel: "web"})).To(Succeed())
		// --lb-replicas defaults to 2: an active and a standby.
		g.Expect(pods.Items).To(HaveLen(2), "the tenant's lb pods run in %s", operatorNamespace)
	}).WithTimeout(time.Minute).WithPolling(250 * time.Millisecond).Should(Succeed())
	var inTenant corev1.PodList
	g.Expect(k8s.List(ctx, &inTenant, client.InNamespace(tenant))).To(Succeed())
	g.Expect(inTenant.Items).To(BeEmpty(), "nothing runs in the restricted namespace")
	// Its IP object names the pod in lbsvc-system.
	g.Eventually(func(g Gomega) {
		ip := &lbv1.IP{}
		g.Expect(k8s.Get(ctx, client.ObjectKey{Name: addr}, ip)).To(Succeed())
		g.Expect(ip.Spec.Service.Namespace).To(Equal(tenant))
		g.Expect(ip.Status.Holders).To(ContainElement(HaveField("Pod", operatorNamespace+"/"+pods.Items[0].Name)))
	}).WithTimeout(time.Minute).WithPolling(250 * time.Millisecond).Should(Succeed())
	// The lb pod that took the address over created the Service's Lease in the tenant's namespace
	// (it runs as lbsvc-lbpod-<tenant> in lbsvc-system: the RoleBinding beside the Service and
	// the admission policy, which reads its pod name from its token, let it write that one
	// Lease), and the IP object shows that pod active.
	g.Expect(pods.Items[0].Spec.ServiceAccountName).To(Equal(lbobjects.IdentityName(operatorNamespace, tenant)))
	g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(svc), svc)).To(Succeed())
	g.Eventually(func(g Gomega) {
		l := &coordinationv1.Lease{}
		g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: tenant, Name: lbobjects.LeaseName(operatorNamespace, tenant, "web")}, l)).To(Succeed())
		g.Expect(l.Labels).To(HaveKeyWithValue(lbv1.ServiceUIDLabel, string(svc.UID)))
		g.Expect(l.Spec.HolderIdentity).NotTo(BeNil())
		ip := &lbv1.IP{}
		g.Expect(k8s.Get(ctx, client.ObjectKey{Name: addr}, ip)).To(Succeed())
		g.Expect(ip.Status.Active).To(Equal(operatorNamespace + "/" + *l.Spec.HolderIdentity))
	}).WithTimeout(time.Minute).WithPolling(250 * time.Millisecond).Should(Succeed())

	// Sharing across namespaces: TCP 53 of the tenant's Service and UDP 53 of one in the seed's
	// namespace, each naming the other's namespace, on one address served from lbsvc-system.
	key := "xns-" + suffix()
	tcp := newLBService("dns-tcp", "")
	tcp.Namespace, tcp.Spec.Selector = tenant, nil
	tcp.Spec.Ports = []corev1.ServicePort{{Name: "dns", Protocol: corev1.ProtocolTCP, Port: 53, TargetPort: intstr.FromInt32(80)}}
	tcp.Annotations[lbv1.AllowSharedIPAnnotation], tcp.Annotations[lbv1.SharedIPNamespacesAnnotation] = key, seedNamespace
	g.Expect(k8s.Create(ctx, tcp)).To(Succeed())
	deleteServiceOnCleanup(t, tcp)
	manualEndpoints(t, tenant, "dns-tcp", "dns", corev1.ProtocolTCP)
	shared := waitIngress(t, tenant, "dns-tcp")
	udp := newLBService("e2e-xns-udp-"+suffix(), "")
	udp.Spec.Ports = []corev1.ServicePort{{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53, TargetPort: intstr.FromInt32(80)}}
	udp.Annotations[lbv1.AllowSharedIPAnnotation], udp.Annotations[lbv1.SharedIPNamespacesAnnotation] = key, tenant
	joined := time.Now()
	g.Expect(k8s.Create(ctx, udp)).To(Succeed())
	deleteServiceOnCleanup(t, udp)
	g.Expect(waitIngress(t, udp.Namespace, udp.Name)).To(Equal(shared), "the member of the other namespace shares the address")
	timeUntilCurl(t, "http://"+shared+":53/", joined, 2*time.Minute)
	g.Eventually(udpFromClient).WithArguments(shared, 53).WithTimeout(time.Minute).WithPolling(50 * time.Millisecond).
		Should(BeElementOf(backendNames(t)))
	t.Logf("figure: shared across namespaces, member of the second namespace created -> TCP and UDP 53 answered: %v", time.Since(joined).Round(10*time.Millisecond))
	var deps appsv1.DeploymentList
	g.Expect(k8s.List(ctx, &deps, client.MatchingLabels{lbv1.SharedIPLabel: shared})).To(Succeed())
	g.Expect(deps.Items).To(HaveLen(1))
	g.Expect(deps.Items[0].Namespace).To(Equal(operatorNamespace))
}
