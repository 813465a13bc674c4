//go:build e2e

package e2e

import (
	"context"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
)

// newLBService is a Service like the seed's, served through the seed's NAD, on the seed's backend,
// with the given port -> targetPort 80 mappings and an optional static address.
func newLBService(name, staticIP string, ports ...int32) *corev1.Service {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Namespace:   seedNamespace,
			Annotations: map[string]string{lbv1.AttachmentProviderAnnotation: seedProvider},
		},
		Spec: corev1.ServiceSpec{
			Type:           corev1.ServiceTypeLoadBalancer,
			Selector:       map[string]string{"app": backendApp},
			LoadBalancerIP: staticIP,
		},
	}
	for _, p := range ports {
		svc.Spec.Ports = append(svc.Spec.Ports, servicePort(p))
	}
	return svc
}

func servicePort(port int32) corev1.ServicePort {
	return corev1.ServicePort{
		Name: "p" + strconv.Itoa(int(port)), Protocol: corev1.ProtocolTCP, Port: port, TargetPort: intstr.FromInt32(80),
	}
}

// waitIngress waits (bounded) for the Service to get an address and returns it.
func waitIngress(t *testing.T, namespace, name string) string {
	t.Helper()
	var ip string
	NewWithT(t).Eventually(func() (string, error) {
		var err error
		ip, err = ingressIP(context.Background(), namespace, name)
		return ip, err
	}).WithTimeout(time.Minute).WithPolling(100*time.Millisecond).ShouldNot(BeEmpty(), "ingress of %s/%s", namespace, name)
	return ip
}

// timeUntilCurl polls url from the client namespace every 50 ms and returns how long it took to
// get an answer; it fails the test after timeout.
func timeUntilCurl(t *testing.T, url string, since time.Time, timeout time.Duration) time.Duration {
	t.Helper()
	NewWithT(t).Eventually(func() error {
		_, err := curlFromClient(url)
		return err
	}).WithTimeout(timeout).WithPolling(50*time.Millisecond).Should(Succeed(), "curl %s", url)
	return time.Since(since)
}

// TestDynamicServicePortChanges: a second Service gets a dynamic address from the Subnet and serves
// port 8080 -> targetPort 80; a port added answers within 1 s without restarting the lb pod, and a
// port removed stops answering.
func TestDynamicServicePortChanges(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	svc := newLBService("e2e-dyn-"+suffix(), "", 8080)
	created := time.Now()
	g.Expect(k8s.Create(ctx, svc)).To(Succeed())
	deleteServiceOnCleanup(t, svc)

	ip := waitIngress(t, svc.Namespace, svc.Name)
	addr, err := netip.ParseAddr(ip)
	g.Expect(err).NotTo(HaveOccurred())
	// Dynamic: inside the Subnet, neither the seed's static address, the gateway nor an excluded one.
	g.Expect(netip.MustParsePrefix(seedSubnetCIDR).Contains(addr)).To(BeTrue(), "address %s outside %s", ip, seedSubnetCIDR)
	g.Expect(ip).NotTo(Equal(seedAddress))
	g.Expect(addr.Compare(netip.MustParseAddr("172.18.0.10"))).To(Equal(1), "address %s is in the excluded range 172.18.0.0..172.18.0.10", ip)
	g.Expect(externalIPColumn(t, svc.Namespace, svc.Name)).To(Equal(ip))

	// port (8080) != targetPort (80)
	firstCurl := timeUntilCurl(t, "http://"+ip+":8080/", created, 2*time.Minute)
	t.Logf("figure: Service %s created -> first successful curl http://%s:8080/ from the client netns: %v", svc.Name, ip, firstCurl.Round(10*time.Millisecond))
	pod := waitLBPod(t, svc.Namespace, svc.Name)

	// Port added: live without a new lb pod or a restart. The latency is a figure, not an
	// assertion (no test asserts wall-clock times on this shared machine).
	// (Not 8081: the lb pod's own health server listens there.)
	changed := time.Now()
	updateService(t, svc, func(s *corev1.Service) { s.Spec.Ports = append(s.Spec.Ports, servicePort(8090)) })
	added := timeUntilCurl(t, "http://"+ip+":8090/", changed, 10*time.Second)
	t.Logf("figure: port 8090 added -> answering: %v", added.Round(10*time.Millisecond))
	same, err := lbPod(ctx, svc.Namespace, svc.Name)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(same.UID).To(Equal(pod.UID), "the lb pod was replaced")
	for _, cs := range same.Status.ContainerStatuses {
		g.Expect(cs.RestartCount).To(BeZero(), "container %s restarted", cs.Name)
	}

	// Port removed: stops answering; the other port keeps working.
	updateService(t, svc, func(s *corev1.Service) { s.Spec.Ports = s.Spec.Ports[:1] })
	g.Eventually(func() error {
		_, err := curlFromClient("http://" + ip + ":8090/")
		return err
	}).WithTimeout(5 * time.Second).WithPolling(100 * time.Millisecond).Should(HaveOccurred())
	_, err = curlFromClient("http://" + ip + ":8080/")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(lbPod(ctx, svc.Namespace, svc.Name)).To(HaveField("UID", pod.UID))
}

// TestLBPodRecreated: the seed's lb pod deleted, its replacement serves the same address.
func TestLBPodRecreated(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	url := "http://" + seedAddress + ":80/"
	old := waitLBPod(t, seedNamespace, seedService)
	timeUntilCurl(t, url, time.Now(), time.Minute)

	deleted := time.Now()
	g.Expect(k8s.Delete(ctx, old)).To(Succeed())
	// Wait for the old pod's answers to stop counting: the replacement must be the one serving.
	g.Eventually(func() bool {
		var p corev1.Pod
		return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKeyFromObject(old), &p))
	}).WithTimeout(time.Minute).WithPolling(50 * time.Millisecond).Should(BeTrue())
	back := timeUntilCurl(t, url, deleted, 2*time.Minute)
	t.Logf("figure: lb pod deleted -> curl %s works again: %v", url, back.Round(10*time.Millisecond))

	pod := waitLBPod(t, seedNamespace, seedService)
	g.Expect(pod.UID).NotTo(Equal(old.UID))
	state, err := readLBPodState(pod)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(state.addresses).To(Equal([]string{seedAddress + "/16"}))
	g.Expect(ingressIP(ctx, seedNamespace, seedService)).To(Equal(seedAddress))
}

// TestServiceDeletedReleasesAddress: a deleted Service's Deployment and pod are garbage collected,
// and its address can be taken by a new Service.
func TestServiceDeletedReleasesAddress(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	svc := newLBService("e2e-gc-"+suffix(), "", 80)
	g.Expect(k8s.Create(ctx, svc)).To(Succeed())
	deleteServiceOnCleanup(t, svc)
	ip := waitIngress(t, svc.Namespace, svc.Name)
	waitLBPod(t, svc.Namespace, svc.Name)
	deployKey := client.ObjectKey{Namespace: svc.Namespace, Name: lbv1.DeploymentPrefix + svc.Name}
	g.Expect(k8s.Get(ctx, deployKey, &appsv1.Deployment{})).To(Succeed())

	g.Expect(k8s.Delete(ctx, svc)).To(Succeed())
	g.Eventually(func() bool {
		return apierrors.IsNotFound(k8s.Get(ctx, deployKey, &appsv1.Deployment{}))
	}).WithTimeout(time.Minute).Should(BeTrue(), "deployment %s still there", deployKey)
	g.Eventually(func() ([]corev1.Pod, error) {
		var pods corev1.PodList
		err := k8s.List(ctx, &pods, client.InNamespace(svc.Namespace), client.MatchingLabels{lbv1.ServiceLabel: svc.Name})
		return pods.Items, err
	}).WithTimeout(2 * time.Minute).Should(BeEmpty())
	g.Eventually(func() bool {
		return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKeyFromObject(svc), &corev1.Service{}))
	}).WithTimeout(time.Minute).Should(BeTrue(), "service %s/%s still there (finalizer)", svc.Namespace, svc.Name)
	g.Eventually(func() error {
		_, err := curlFromClient("http://" + ip + ":80/")
		return err
	}).WithTimeout(30*time.Second).Should(HaveOccurred(), "%s still answers", ip)

	// The address is free again: a new Service asking for it statically gets it.
	next := newLBService("e2e-reuse-"+suffix(), ip, 80)
	g.Expect(k8s.Create(ctx, next)).To(Succeed())
	deleteServiceOnCleanup(t, next)
	g.Expect(waitIngress(t, next.Namespace, next.Name)).To(Equal(ip))
	timeUntilCurl(t, "http://"+ip+":80/", time.Now(), 2*time.Minute)
}

// TestLBPodLeastPrivilege: the lb pod (one container) is not privileged, holds only NET_ADMIN and
// NET_RAW, and its ServiceAccount (the namespace's lbsvc-lbpod) can read the Services of its
// Service's namespace (the ClusterRole lbsvc-lbpod, bound there; it cannot name one Service) and
// nothing else but its Lease (TestRBACTable).
func TestLBPodLeastPrivilege(t *testing.T) {
	g := NewWithT(t)
	pod := waitLBPod(t, seedNamespace, seedService)
	g.Expect(pod.Spec.InitContainers).To(BeEmpty())
	g.Expect(pod.Spec.Containers).To(HaveLen(1))
	for _, c := range pod.Spec.Containers {
		sc := c.SecurityContext
		g.Expect(sc).NotTo(BeNil(), "container %s has no securityContext", c.Name)
		if sc.Privileged != nil {
			g.Expect(*sc.Privileged).To(BeFalse(), "container %s is privileged", c.Name)
		}
		g.Expect(sc.Capabilities).NotTo(BeNil(), "container %s", c.Name)
		var added []string
		for _, c := range sc.Capabilities.Add {
			added = append(added, string(c))
		}
		sort.Strings(added)
		g.Expect(added).To(Equal([]string{"NET_ADMIN", "NET_RAW"}), "capabilities of container %s", c.Name)
	}

	// The namespace's one lb pod ServiceAccount.
	g.Expect(pod.Spec.ServiceAccountName).To(Equal(lbv1.LBPodIdentity))
	sa := "system:serviceaccount:" + seedNamespace + ":" + pod.Spec.ServiceAccountName
	canI := func(verb, resource string) string {
		// can-i exits 1 on "no": the answer is the output, not the status.
		out, _ := run(kubectl, "auth", "can-i", verb, resource, "-n", seedNamespace, "--as="+sa)
		if lines := nonEmptyLines(out); len(lines) > 0 {
			return lines[0]
		}
		return out
	}
	g.Expect(canI("get", "services/"+seedService)).To(Equal("yes"))
	g.Expect(canI("watch", "services/"+seedService)).To(Equal("yes"))
	g.Expect(canI("get", "services/kubernetes")).To(Equal("yes"), "any Service of the namespace: the price of one static ClusterRole")
	g.Expect(canI("update", "services/"+seedService)).To(Equal("no"))
	g.Expect(canI("get", "pods")).To(Equal("no"))
	g.Expect(canI("get", "secrets")).To(Equal("no"))
	g.Expect(canI("create", "pods/exec")).To(Equal("no"))
}

// TestLBAddressServesOnlyServicePorts: on the underlay, the LB address answers on the Service's
// ports only; nothing of the lb pod itself (its health and metrics server on :8081) is reachable
// there.
func TestLBAddressServesOnlyServicePorts(t *testing.T) {
	g := NewWithT(t)
	waitLBPod(t, seedNamespace, seedService)
	timeUntilCurl(t, "http://"+seedAddress+":80/", time.Now(), time.Minute)
	for _, path := range []string{"/healthz", "/metrics"} {
		out, err := curlFromClient("http://" + seedAddress + ":8081" + path)
		g.Expect(err).To(HaveOccurred(), "the lb pod's %s answers on the LB address from the underlay: %.200s", path, out)
	}
}

// TestUDPThroughLBAddress: a UDP port of a Service is served through the LB address too (the
// backend echoes each datagram after its pod name).
func TestUDPThroughLBAddress(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	svc := newLBService("e2e-udp-"+suffix(), "")
	svc.Spec.Ports = []corev1.ServicePort{{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 5353, TargetPort: intstr.FromInt32(80)}}
	g.Expect(k8s.Create(ctx, svc)).To(Succeed())
	deleteServiceOnCleanup(t, svc)
	ip := waitIngress(t, svc.Namespace, svc.Name)
	waitLBPod(t, svc.Namespace, svc.Name)
	g.Eventually(backendNames, time.Minute).WithArguments(t).Should(HaveLen(backendReplicas))
	backends := backendNames(t)

	// bash's /dev/udp: one datagram out, the first line of the answer back (head reads the whole
	// datagram at once; bash's read would take one byte of it and drop the rest).
	script := `exec 3<>/dev/udp/` + ip + `/5353 && printf e2e-ping >&3 && timeout 1 head -n 1 <&3`
	g.Eventually(func() (string, error) {
		out, err := run("nsenter", "--net=/run/netns/"+clientNetns, "bash", "-c", script)
		return strings.TrimSpace(out), err
	}).WithTimeout(time.Minute).WithPolling(200 * time.Millisecond).Should(BeElementOf(backends))
}

// updateService changes svc on the API server, retrying on a conflict: the operator writes the
// Service too (status, annotations such as lbsvc.io/active-node), so a read-modify-write races it.
func updateService(t *testing.T, svc *corev1.Service, change func(*corev1.Service)) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(svc), svc); err != nil {
			return err
		}
		change(svc)
		return k8s.Update(context.Background(), svc)
	})
	if err != nil {
		t.Fatalf("update service %s/%s: %v", svc.Namespace, svc.Name, err)
	}
}
