//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The tests of this file hold on any number of nodes >= 2: which node holds a pod is read from
// its spec.nodeName, and that node's namespaces are entered to look at it.

var macRE = regexp.MustCompile(`link/ether ([0-9a-f]{2}(?::[0-9a-f]{2}){5})`)

// net1MAC is the MAC address of the lb pod's net1, read in the pod's network namespace.
func net1MAC(pod *corev1.Pod) (string, error) {
	out, err := inNetnsOfPod(pod, "ip", "-o", "link", "show", "dev", lbInterface)
	if err != nil {
		return "", err
	}
	m := macRE.FindStringSubmatch(out)
	if m == nil {
		return "", fmt.Errorf("pod %s/%s: no MAC on %s: %q", pod.Namespace, pod.Name, lbInterface, out)
	}
	return m[1], nil
}

// clientARP is the client's neighbour entry for addr: its MAC, "" when there is none (or it is
// incomplete / failed).
func clientARP(addr string) (string, error) {
	out, err := run("nsenter", "--net=/run/netns/"+clientNetns, "ip", "neigh", "show", addr, "dev", "eth0")
	if err != nil {
		return "", fmt.Errorf("ip neigh show %s in netns %s: %w: %s", addr, clientNetns, err, out)
	}
	if m := regexp.MustCompile(`lladdr ([0-9a-f:]{17})`).FindStringSubmatch(out); m != nil {
		return m[1], nil
	}
	return "", nil
}

// underlayPortOf is the underlay switch port (ul-node<i>, in netns lbsvc-ul) on which the bridge
// learned mac, "" when it has not.
func underlayPortOf(mac string) (string, error) {
	out, err := run("nsenter", "--net=/run/netns/"+underlayNetns, "bridge", "fdb", "show", "br", "br0")
	if err != nil {
		return "", fmt.Errorf("bridge fdb in netns %s: %w: %s", underlayNetns, err, out)
	}
	for _, line := range nonEmptyLines(out) {
		f := strings.Fields(line)
		if len(f) >= 3 && f[0] == mac && f[1] == "dev" {
			return f[2], nil
		}
	}
	return "", nil
}

// underlayPort is the switch port of a node's eth0 (hack/cluster/up.sh: ul-node<i> for lbsvc-node<i>).
func underlayPort(node string) string { return "ul-" + strings.TrimPrefix(node, "lbsvc-") }

// holder is one network namespace in which an address is configured.
type holder struct {
	Node  string // the node whose cgroups hold the process
	Netns string // the namespace's inode (net:[...])
	Dev   string // the interface carrying the address
}

// holdersOf finds every pod network namespace, on every node, in which addr is configured: it
// walks the processes in the kubelets' cgroups (<cgroupRoot>/node<i>/kubepods/...), whatever the
// API server says about pods, so a pod that a dead node still runs counts too.
func holdersOf(addr string) ([]holder, error) {
	files, err := filepath.Glob("/proc/[0-9]*/cgroup")
	if err != nil {
		return nil, err
	}
	cgRE := regexp.MustCompile(`/` + cgroupRoot + `/(node[0-9]+)/kubepods/`)
	seen := map[string]bool{}
	var found []holder
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			continue // the process ended meanwhile
		}
		m := cgRE.FindSubmatch(data)
		if m == nil {
			continue
		}
		procDir := filepath.Dir(f)
		ns, err := os.Readlink(filepath.Join(procDir, "ns", "net"))
		if err != nil || seen[ns] {
			continue
		}
		seen[ns] = true
		out, err := run("nsenter", "--net="+filepath.Join(procDir, "ns", "net"), "ip", "-4", "-o", "addr", "show")
		if err != nil {
			continue // the process ended meanwhile
		}
		for _, line := range nonEmptyLines(out) {
			if f := strings.Fields(line); len(f) >= 4 && f[2] == "inet" && strings.HasPrefix(f[3], addr+"/") {
				found = append(found, holder{Node: "lbsvc-" + string(m[1]), Netns: ns, Dev: f[1]})
			}
		}
	}
	sort.Slice(found, func(i, j int) bool { return found[i].Node+found[i].Netns < found[j].Node+found[j].Netns })
	return found, nil
}

// TestLBPodsOnEveryNode: the lb pods of several Services spread over the nodes, and each serves
// from its own node: curl from the client answers, the client's ARP entry for the address names
// that pod's net1 MAC, and the underlay switch learned that MAC on the port of the pod's node.
func TestLBPodsOnEveryNode(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	nodes := multiNode(t)

	// One Service per node first, placed by the scheduler alone. It does not spread them by itself:
	// an lb pod requests 10m CPU, so the node with fewer BestEffort pods (counted at 100m each when
	// scoring) wins every time. Then, for each node still without an lb pod, one more Service
	// while the other nodes are cordoned.
	var svcs []*corev1.Service
	var lbPods []*corev1.Pod
	onNode := map[string]int{}
	addService := func() {
		svc := newLBService(fmt.Sprintf("e2e-spread%d-%s", len(svcs), suffix()), "", 80)
		g.Expect(k8s.Create(ctx, svc)).To(Succeed())
		deleteServiceOnCleanup(t, svc)
		pod := waitLBPod(t, svc.Namespace, svc.Name)
		onNode[pod.Spec.NodeName]++
		svcs, lbPods = append(svcs, svc), append(lbPods, pod)
	}
	for range nodes {
		addService()
	}
	t.Logf("the scheduler alone put the lb pods of %d Services on: %v", len(svcs), onNode)
	for _, node := range nodes {
		if onNode[node] > 0 {
			continue
		}
		uncordon := cordonAllBut(t, nodes, node)
		addService()
		uncordon()
	}
	g.Expect(onNode).To(HaveLen(len(nodes)), "lb pods of %d Services per node: %v", len(svcs), onNode)
	for i, svc := range svcs {
		pod := lbPods[i]
		ip := waitIngress(t, svc.Namespace, svc.Name)
		node := pod.Spec.NodeName
		timeUntilCurl(t, "http://"+ip+":80/", time.Now(), 2*time.Minute)
		mac, err := net1MAC(pod)
		g.Expect(err).NotTo(HaveOccurred())
		// Right after a curl, the client's entry is fresh and names the pod that answered.
		g.Eventually(func() (string, error) {
			if _, err := curlFromClient("http://" + ip + ":80/"); err != nil {
				return "", err
			}
			return clientARP(ip)
		}).WithTimeout(10*time.Second).WithPolling(200*time.Millisecond).Should(Equal(mac),
			"client ARP entry for %s (lb pod %s on %s, net1 %s)", ip, pod.Name, node, mac)
		g.Expect(underlayPortOf(mac)).To(Equal(underlayPort(node)), "underlay port of %s (lb pod %s on %s)", mac, pod.Name, node)
		t.Logf("service %s: %s served by lb pod %s on %s, net1 %s (switch port %s)", svc.Name, ip, pod.Name, node, mac, underlayPort(node))
	}
}

// echoPodOn is a pod of the echo backend pinned to node, labelled app=<app>.
func echoPodOn(name, node, app string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: seedNamespace, Labels: map[string]string{"app": app}},
		Spec: corev1.PodSpec{
			NodeSelector:                  map[string]string{corev1.LabelHostname: node},
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			Containers: []corev1.Container{{
				Name: "echo", Image: "localhost/lbsvc-echo:dev", ImagePullPolicy: corev1.PullIfNotPresent,
			}},
		},
	}
}

// clusterIPService is a ClusterIP Service on port 8080 -> 80 for the pods labelled app=<app>.
func clusterIPService(name, app string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: seedNamespace},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": app},
			Ports:    []corev1.ServicePort{{Name: "http", Port: 8080, TargetPort: intstr.FromInt32(80)}},
		},
	}
}

// TestCrossNodeTraffic: a pod on each node reaches the pod on every other node directly
// (pod-to-pod over the node-to-node link) and through a ClusterIP Service whose only endpoint
// is on the other node (pod-to-Service); each answer names the pod that gave it. The client end
// runs in the source pod's network namespace, entered from its node (no pods/exec).
func TestCrossNodeTraffic(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	nodes := multiNode(t)
	id := suffix()

	pods := map[string]*corev1.Pod{}
	services := map[string]*corev1.Service{}
	for _, node := range nodes {
		app := "e2e-x-" + strings.TrimPrefix(node, "lbsvc-") + "-" + id
		pod := echoPodOn(app, node, app)
		svc := clusterIPService(app, app)
		for _, obj := range []client.Object{pod, svc} {
			g.Expect(k8s.Create(ctx, obj)).To(Succeed())
			t.Cleanup(func() { _ = k8s.Delete(context.Background(), obj) })
		}
		pods[node], services[node] = pod, svc
	}
	for _, node := range nodes {
		pod := pods[node]
		g.Eventually(func() (bool, error) {
			err := k8s.Get(ctx, client.ObjectKeyFromObject(pod), pod)
			return podReady(pod), err
		}).WithTimeout(2*time.Minute).WithPolling(250*time.Millisecond).Should(BeTrue(), "pod %s ready", pod.Name)
		g.Expect(pod.Spec.NodeName).To(Equal(node))
		g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(services[node]), services[node])).To(Succeed())
	}

	for _, from := range nodes {
		for _, to := range nodes {
			if from == to {
				continue
			}
			src, dst := pods[from], pods[to]
			for what, url := range map[string]string{
				"pod-to-pod":     "http://" + dst.Status.PodIP + ":80/",
				"pod-to-Service": "http://" + services[to].Spec.ClusterIP + ":8080/",
			} {
				// The Service's endpoints reach kube-proxy of the source node within moments.
				g.Eventually(func() (string, error) {
					out, err := inNetnsOfPod(src, "curl", "-sS", "--fail", "-m", "1", url)
					return strings.TrimSpace(out), err
				}).WithTimeout(30*time.Second).WithPolling(200*time.Millisecond).Should(Equal(dst.Name),
					"%s: %s (on %s, %s) -> %s (on %s, %s)", what, src.Name, from, src.Status.PodIP, url, to, dst.Status.PodIP)
				t.Logf("%s: %s on %s -> %s answered by %s on %s", what, src.Name, from, url, dst.Name, to)
			}
		}
	}
}

// pinnedBackend is a one-replica Deployment of the echo backend on node, labelled app=<name>.
func pinnedBackend(name, node string) *appsv1.Deployment {
	pod := echoPodOn("", node, name)
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: seedNamespace},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: pod.Labels}, Spec: pod.Spec},
		},
	}
}

// startPinnedBackend creates a one-pod backend on node, removed when the test ends, and waits
// (bounded) until it is ready.
func startPinnedBackend(t *testing.T, name, node string) *appsv1.Deployment {
	t.Helper()
	ctx := context.Background()
	backend := pinnedBackend(name, node)
	g := NewWithT(t)
	g.Expect(k8s.Create(ctx, backend)).To(Succeed())
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), backend) })
	g.Eventually(func() (int32, error) {
		err := k8s.Get(ctx, client.ObjectKeyFromObject(backend), backend)
		return backend.Status.ReadyReplicas, err
	}).WithTimeout(2 * time.Minute).Should(Equal(int32(1)))
	return backend
}
