//go:build e2e

// Package e2e runs the seed's whole story on the local cluster that hack/cluster/up.sh brings up
// (hack/cluster/e2e.sh brings it up, installs the operator, runs these tests and tears it down).
// The lb pod's network namespace is entered from the node (nsenter on one of its processes), never
// through pods/exec: the lb pod grants no such access and needs none.
package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/lbsvc/lbsvc-operator/controllers/lbobjects"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
)

// The cluster's fixed names and addresses (hack/cluster/lib.sh) and the seed's objects
// (config/samples). Every node's network namespace is named like the node (lbsvc-node<i>); node 1
// also holds the control plane.
const (
	clientNetns   = "lbsvc-client"
	underlayNetns = "lbsvc-ul"
	podBridge     = "lbsvc-br0"
	cgroupRoot    = "lbsvc-cluster"
	controlPlane  = "lbsvc-node1"

	seedNamespace   = "default"
	seedService     = "test-service"
	seedAddress     = "172.18.0.18"
	seedSubnetCIDR  = "172.18.0.0/16"
	subnetGateway   = "172.18.0.1"
	seedProvider    = "lb-svc-attachment.kube-system"
	backendApp      = "dynamic"
	backendReplicas = 2
	lbInterface     = "net1"
)

var (
	k8s     client.Client
	kubectl string
	// repoRoot is the checkout, for config/samples.
	repoRoot string
)

func TestMain(m *testing.M) {
	if err := setup(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e setup: %v\n(run the tests through hack/cluster/e2e.sh, which brings the cluster up)\n", err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

func setup() error {
	kubeconfig := os.Getenv("KUBECONFIG")
	if kubeconfig == "" {
		return fmt.Errorf("KUBECONFIG is not set")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
	}
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, lbv1.AddToScheme} {
		if err := add(scheme); err != nil {
			return err
		}
	}
	if k8s, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		return fmt.Errorf("client for %s: %w", cfg.Host, err)
	}
	if kubectl, err = exec.LookPath("kubectl"); err != nil {
		return fmt.Errorf("kubectl not on PATH: %w", err)
	}
	repoRoot = os.Getenv("LBSVC_E2E_ROOT")
	if repoRoot == "" {
		if repoRoot, err = filepath.Abs("../.."); err != nil {
			return err
		}
	}
	// The seed's objects, verbatim, as a user applies them (demo.sh does the same).
	samples := filepath.Join(repoRoot, "config", "samples")
	flag := "-f"
	if _, err := os.Stat(filepath.Join(samples, "kustomization.yaml")); err == nil {
		flag = "-k"
	}
	if out, err := run(kubectl, "apply", flag, samples); err != nil {
		return fmt.Errorf("kubectl apply %s %s: %w: %s", flag, samples, err, out)
	}
	return nil
}

// run executes a command and returns its combined output.
func run(name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// kube runs kubectl and fails the test on error.
func kube(t *testing.T, args ...string) string {
	t.Helper()
	out, err := run(kubectl, args...)
	if err != nil {
		t.Fatalf("kubectl %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return out
}

// curlFromClient fetches url from the underlay's client namespace (172.18.0.1/16): the path a
// user outside the cluster takes. The timeout is short: the tests poll.
func curlFromClient(url string) (string, error) {
	out, err := run("nsenter", "--net=/run/netns/"+clientNetns, "curl", "-sS", "--fail", "-m", "1", url)
	if err != nil {
		return "", fmt.Errorf("curl %s from netns %s: %w: %s", url, clientNetns, err, out)
	}
	return out, nil
}

// nodeNetns is the network namespace of a node (spec.nodeName of its pods).
func nodeNetns(node string) string { return "/run/netns/" + node }

// inNode runs a command in a node's network namespace.
func inNode(node string, args ...string) (string, error) {
	out, err := run("nsenter", append([]string{"--net=" + nodeNetns(node)}, args...)...)
	if err != nil {
		return "", fmt.Errorf("node %s: %s: %w: %s", node, strings.Join(args, " "), err, out)
	}
	return out, nil
}

// nodeNames lists the cluster's nodes, sorted (lbsvc-node1 first).
func nodeNames(t *testing.T) []string {
	t.Helper()
	var nodes corev1.NodeList
	if err := k8s.List(context.Background(), &nodes); err != nil {
		t.Fatalf("list nodes: %v", err)
	}
	var names []string
	for _, n := range nodes.Items {
		names = append(names, n.Name)
	}
	sort.Strings(names)
	return names
}

// multiNode returns the cluster's nodes and fails the test unless there are at least two: the
// tests that call it are about what happens between nodes.
func multiNode(t *testing.T) []string {
	t.Helper()
	nodes := nodeNames(t)
	if len(nodes) < 2 {
		t.Fatalf("this test needs at least 2 nodes (NODES=2 hack/cluster/e2e.sh), the cluster has %q", nodes)
	}
	return nodes
}

// cordonAllBut cordons every node but keep, so that the next pod lands on keep. It returns the
// function that uncordons them; they are uncordoned at the end of the test in any case.
func cordonAllBut(t *testing.T, nodes []string, keep string) (uncordon func()) {
	t.Helper()
	var cordoned []string
	for _, n := range nodes {
		if n != keep {
			kube(t, "cordon", n)
			cordoned = append(cordoned, n)
		}
	}
	uncordon = func() {
		for _, n := range cordoned {
			if out, err := run(kubectl, "uncordon", n); err != nil {
				t.Errorf("kubectl uncordon %s: %v: %s", n, err, out)
			}
		}
	}
	t.Cleanup(func() {
		for _, n := range cordoned {
			_, _ = run(kubectl, "uncordon", n)
		}
	})
	return uncordon
}

// podGatewayOf is the address of the pod bridge on the pod's node: the gateway of its eth0, read
// in that node's namespace.
func podGatewayOf(pod *corev1.Pod) (string, error) {
	out, err := inNode(pod.Spec.NodeName, "ip", "-4", "-o", "addr", "show", "dev", podBridge)
	if err != nil {
		return "", err
	}
	f := strings.Fields(out)
	for i := range f {
		if f[i] == "inet" && i+1 < len(f) {
			return strings.SplitN(f[i+1], "/", 2)[0], nil
		}
	}
	return "", fmt.Errorf("node %s: no IPv4 address on %s: %q", pod.Spec.NodeName, podBridge, out)
}

// inNetnsOfPod runs a command in the network namespace of pod, entered from the node through the
// /proc entry of one of the pod's processes (found by the pod UID in its cgroup path).
func inNetnsOfPod(pod *corev1.Pod, args ...string) (string, error) {
	pid, err := pidOfPod(pod)
	if err != nil {
		return "", err
	}
	out, err := run("nsenter", append([]string{"--net=/proc/" + pid + "/ns/net"}, args...)...)
	if err != nil {
		return "", fmt.Errorf("pod %s/%s: %s: %w: %s", pod.Namespace, pod.Name, strings.Join(args, " "), err, out)
	}
	return out, nil
}

// pidOfPod finds a process of pod: the kubelet's cgroupfs driver puts every container of the pod
// under a cgroup named pod<UID>.
func pidOfPod(pod *corev1.Pod) (string, error) {
	files, err := filepath.Glob("/proc/[0-9]*/cgroup")
	if err != nil {
		return "", err
	}
	needle := []byte("/pod" + string(pod.UID) + "/")
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			continue // the process ended meanwhile
		}
		if bytes.Contains(data, needle) {
			return filepath.Base(filepath.Dir(f)), nil
		}
	}
	return "", fmt.Errorf("no process of pod %s/%s (uid %s) found in /proc", pod.Namespace, pod.Name, pod.UID)
}

// lbPodsOf lists the Service's lb pods that are running and ready, and how many are live (not
// being deleted, ready or not).
func lbPodsOf(ctx context.Context, namespace, service string) (ready []*corev1.Pod, live int, err error) {
	var pods corev1.PodList
	if err := k8s.List(ctx, &pods, client.InNamespace(namespace), client.MatchingLabels{lbv1.ServiceLabel: service}); err != nil {
		return nil, 0, err
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.DeletionTimestamp != nil {
			continue
		}
		live++
		if p.Status.Phase == corev1.PodRunning && podReady(p) {
			ready = append(ready, p)
		}
	}
	return ready, live, nil
}

// lbPod returns the running, ready lb pod of a Service that holds its address (the only one, or
// with standbys the one its Lease names), or an error saying what is missing.
func lbPod(ctx context.Context, namespace, service string) (*corev1.Pod, error) {
	ready, live, err := lbPodsOf(ctx, namespace, service)
	if err != nil {
		return nil, err
	}
	if live == 1 && len(ready) == 1 {
		return ready[0], nil
	}
	// Standbys (or a rollout): the pod that holds the address is the one the Lease names.
	holder, err := leaseHolder(ctx, namespace, service)
	if err != nil {
		return nil, err
	}
	for _, p := range ready {
		if p.Name == holder {
			return p, nil
		}
	}
	return nil, fmt.Errorf("service %s/%s: %d ready lb pods of %d live, none of them the Lease's holder %q", namespace, service, len(ready), live, holder)
}

// leaseHolder is the lb pod the Service's Lease names (where the lb pod that takes the address
// over records itself; the operator writes nothing on lb pods), "" while there is no Lease or no
// holder yet. The Service's lb pods run beside it (no --lb-pod-namespace).
func leaseHolder(ctx context.Context, namespace, service string) (string, error) {
	l := &coordinationv1.Lease{}
	err := k8s.Get(ctx, client.ObjectKey{Namespace: namespace, Name: lbobjects.LeaseName("", namespace, service)}, l)
	if apierrors.IsNotFound(err) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	if l.Spec.HolderIdentity == nil {
		return "", nil
	}
	return *l.Spec.HolderIdentity, nil
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// waitLBPod waits (bounded) for the Service's lb pod to be running and ready.
func waitLBPod(t *testing.T, namespace, service string) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	NewWithT(t).Eventually(func() error {
		var err error
		pod, err = lbPod(context.Background(), namespace, service)
		return err
	}).WithTimeout(2*time.Minute).WithPolling(250*time.Millisecond).Should(Succeed(), "lb pod of %s/%s", namespace, service)
	return pod
}

// ingressIP returns the Service's first status.loadBalancer.ingress address, or "".
func ingressIP(ctx context.Context, namespace, name string) (string, error) {
	var svc corev1.Service
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &svc); err != nil {
		return "", err
	}
	if len(svc.Status.LoadBalancer.Ingress) == 0 {
		return "", nil
	}
	return svc.Status.LoadBalancer.Ingress[0].IP, nil
}

// backendNames lists the pod names of the seed's backend Deployment.
func backendNames(t *testing.T) []string {
	t.Helper()
	var pods corev1.PodList
	if err := k8s.List(context.Background(), &pods, client.InNamespace(seedNamespace), client.MatchingLabels{"app": backendApp}); err != nil {
		t.Fatalf("list backend pods: %v", err)
	}
	var names []string
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil && podReady(&p) {
			names = append(names, p.Name)
		}
	}
	sort.Strings(names)
	return names
}

// suffix is a random suffix for the names of objects a test creates.
func suffix() string {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// deleteService removes a Service a test created, at the end of the test, whatever its outcome.
func deleteServiceOnCleanup(t *testing.T, svc *corev1.Service) {
	t.Cleanup(func() {
		if err := k8s.Delete(context.Background(), svc); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete service %s/%s: %v", svc.Namespace, svc.Name, err)
		}
	})
}
