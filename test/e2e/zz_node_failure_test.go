//go:build e2e

package e2e

// The file name sorts last on purpose: go test runs the tests in file order, and this one takes a
// node away for minutes; every other test should see a healthy cluster.

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
)

// failureBound bounds how long TestNodeFailureSingleLBPod waits for the address to answer again:
// NotReady after the node-monitor grace period (~40-60 s), then the lb pod's 30 s toleration of
// node.kubernetes.io/unreachable before it is evicted and replaced (300 s, the default, before the
// operator set 30 s: ~6 min in all).
const failureBound = 8 * time.Minute

// nodeAction runs hack/cluster/node.sh ACTION N and returns the moment of its first step (the
// RFC 3339 time that starts its first line) and its output.
func nodeAction(t *testing.T, action, node string) (time.Time, string) {
	t.Helper()
	n := strings.TrimPrefix(node, "lbsvc-node")
	out, err := run(filepath.Join(repoRoot, "hack", "cluster", "node.sh"), action, n)
	if err != nil {
		t.Fatalf("node.sh %s %s: %v: %s", action, n, err, out)
	}
	lines := nonEmptyLines(out)
	if len(lines) == 0 {
		t.Fatalf("node.sh %s %s printed nothing", action, n)
	}
	at, err := time.Parse(time.RFC3339Nano, strings.Fields(lines[0])[0])
	if err != nil {
		t.Fatalf("node.sh %s %s: first line %q does not start with an RFC 3339 time: %v", action, n, lines[0], err)
	}
	t.Logf("node.sh %s %s:\n%s", action, n, strings.Join(lines, "\n"))
	return at, out
}

// probe is one curl of the client loop.
type probe struct {
	at   time.Time // when it was sent
	end  time.Time // when it was answered or given up (the TCP prober's; zero for curl's)
	ok   bool
	kind string // why it failed (errKind), for the figures
}

// prober curls url from the client every 200 ms (each try bounded by curl's 1 s) until stopped.
type prober struct {
	mu     sync.Mutex
	probes []probe
	stop   context.CancelFunc
	done   chan struct{}
}

func startProber(url string) *prober {
	ctx, cancel := context.WithCancel(context.Background())
	p := &prober{stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			at := time.Now()
			_, err := curlFromClient(url)
			p.mu.Lock()
			p.probes = append(p.probes, probe{at: at, ok: err == nil})
			p.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return p
}

func (p *prober) Stop() { p.stop(); <-p.done }

// firstOKAfter is the start of the first successful probe that began after since.
func (p *prober) firstOKAfter(since time.Time) (time.Time, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pr := range p.probes {
		if pr.ok && pr.at.After(since) {
			return pr.at, true
		}
	}
	return time.Time{}, false
}

// failedBetween counts the probes that began in [from, to) and how many of them failed.
func (p *prober) failedBetween(from, to time.Time) (failed, total int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pr := range p.probes {
		if !pr.at.Before(from) && pr.at.Before(to) {
			total++
			if !pr.ok {
				failed++
			}
		}
	}
	return failed, total
}

func nodeReady(ctx context.Context, name string) (bool, error) {
	var node corev1.Node
	if err := k8s.Get(ctx, client.ObjectKey{Name: name}, &node); err != nil {
		return false, err
	}
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue, nil
		}
	}
	return false, nil
}

// TestNodeFailureSingleLBPod: the node that holds a Service's only lb pod fails like a powered-off
// machine (hack/cluster/node.sh fail). A client curls the address in a bounded loop; the outage
// (fail -> first answer again) is the baseline that standby lb pods must beat. Then the node
// recovers: it is Ready again, nothing is left Terminating, the address is configured in exactly
// one network namespace on all nodes (the replacement lb pod's net1), and the client's ARP entry
// names that net1.
func TestNodeFailureSingleLBPod(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	nodes := multiNode(t)
	target := nodes[len(nodes)-1]
	g.Expect(target).NotTo(Equal(controlPlane))
	id := suffix()

	// The backend stays on the control-plane node, so the outage is the lb pod's alone.
	backend := startPinnedBackend(t, "e2e-fail-be-"+id, controlPlane)

	// The lb pod on the target node: every other node cordoned while it is scheduled.
	uncordon := cordonAllBut(t, nodes, target)
	svc := newLBService("e2e-fail-"+id, "", 80)
	// One lb pod, no standby: the baseline the standbys are measured against.
	svc.Annotations[lbv1.ReplicasAnnotation] = "1"
	svc.Spec.Selector = map[string]string{"app": backend.Name}
	g.Expect(k8s.Create(ctx, svc)).To(Succeed())
	deleteServiceOnCleanup(t, svc)
	ip := waitIngress(t, svc.Namespace, svc.Name)
	old := waitLBPod(t, svc.Namespace, svc.Name)
	g.Expect(old.Spec.NodeName).To(Equal(target))
	uncordon()
	url := "http://" + ip + ":80/"
	timeUntilCurl(t, url, time.Now(), 2*time.Minute)
	oldMAC, err := net1MAC(old)
	g.Expect(err).NotTo(HaveOccurred())

	p := startProber(url)
	defer p.Stop()
	g.Eventually(func() bool { _, ok := p.firstOKAfter(time.Time{}); return ok }).WithTimeout(10 * time.Second).Should(BeTrue())

	failedAt, _ := nodeAction(t, "fail", target)
	t.Cleanup(func() {
		_, _ = run(filepath.Join(repoRoot, "hack", "cluster", "node.sh"), "recover", strings.TrimPrefix(target, "lbsvc-node"))
	})

	// Bounded wait; meanwhile note when the control plane sees what.
	var notReadyAt, evictedAt, replacementReadyAt, backAt time.Time
	var replacement *corev1.Pod
	deadline := failedAt.Add(failureBound)
	for time.Now().Before(deadline) {
		now := time.Now()
		if ready, err := nodeReady(ctx, target); err == nil && !ready && notReadyAt.IsZero() {
			notReadyAt = now
		}
		var pods corev1.PodList
		if err := k8s.List(ctx, &pods, client.InNamespace(svc.Namespace), client.MatchingLabels{lbv1.ServiceLabel: svc.Name}); err == nil {
			for i := range pods.Items {
				pod := &pods.Items[i]
				if pod.UID == old.UID && pod.DeletionTimestamp != nil && evictedAt.IsZero() {
					evictedAt = now
				}
				if pod.UID != old.UID && podReady(pod) && replacementReadyAt.IsZero() {
					replacementReadyAt, replacement = now, pod
				}
			}
		}
		if at, ok := p.firstOKAfter(failedAt); ok {
			backAt = at
			break
		}
		time.Sleep(time.Second)
	}
	timeline := func() string {
		return fmt.Sprintf("node NotReady +%v, lb pod %s marked for deletion +%v, replacement Ready +%v",
			since(failedAt, notReadyAt), old.Name, since(failedAt, evictedAt), since(failedAt, replacementReadyAt))
	}
	if backAt.IsZero() {
		t.Logf("figure: node failure with one lb pod (%s on %s): outage > %v, the address did not answer again within the bound (%s)",
			old.Name, target, failureBound, timeline())
		t.Fatalf("%s did not answer within %v of the failure of %s: %s", url, failureBound, target, timeline())
	}
	// The answer may come a moment before the loop above saw the replacement Ready: then its
	// Ready condition says when (to the second).
	if replacement == nil {
		replacement = waitLBPod(t, svc.Namespace, svc.Name)
		for _, c := range replacement.Status.Conditions {
			if c.Type == corev1.PodReady {
				replacementReadyAt = c.LastTransitionTime.Time
			}
		}
	}
	t.Logf("figure: node failure with one lb pod (%s on %s) -> %s answers again: %v (%s)",
		old.Name, target, url, backAt.Sub(failedAt).Round(100*time.Millisecond), timeline())
	g.Expect(replacement.UID).NotTo(Equal(old.UID))
	g.Expect(replacement.Spec.NodeName).NotTo(Equal(target))

	// Recover: converge with one holder of the address.
	recoveredAt, _ := nodeAction(t, "recover", target)
	// From the moment the node is back: the thawed old lb pod still has the address on its net1
	// until its kubelet, seeing the pod deleted, stops it.
	newMAC, err := net1MAC(replacement)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(newMAC).NotTo(Equal(oldMAC))
	maxHolders := 0
	var onceAt time.Time
	g.Eventually(func() ([]holder, error) {
		h, err := holdersOf(ip)
		if len(h) > maxHolders {
			maxHolders = len(h)
		}
		if len(h) == 1 && onceAt.IsZero() {
			onceAt = time.Now()
		}
		return h, err
	}).WithTimeout(2*time.Minute).WithPolling(500*time.Millisecond).Should(
		And(HaveLen(1), ContainElement(HaveField("Node", replacement.Spec.NodeName))), "network namespaces holding %s", ip)
	g.Eventually(nodeReady).WithArguments(ctx, target).WithTimeout(2*time.Minute).WithPolling(time.Second).Should(BeTrue(), "node %s Ready again", target)
	g.Eventually(func() ([]string, error) {
		var pods corev1.PodList
		err := k8s.List(ctx, &pods)
		var terminating []string
		for _, pod := range pods.Items {
			if pod.DeletionTimestamp != nil {
				terminating = append(terminating, pod.Namespace+"/"+pod.Name+" on "+pod.Spec.NodeName)
			}
		}
		return terminating, err
	}).WithTimeout(3*time.Minute).WithPolling(time.Second).Should(BeEmpty(), "pods left Terminating after %s recovered", target)

	g.Eventually(func() (string, error) {
		if _, err := curlFromClient(url); err != nil {
			return "", err
		}
		return clientARP(ip)
	}).WithTimeout(30*time.Second).WithPolling(200*time.Millisecond).Should(Equal(newMAC), "client ARP entry for %s", ip)
	converged := time.Now()
	failed, total := p.failedBetween(recoveredAt, converged)
	t.Logf("figure: node %s recovered -> %s held by one network namespace again (%s on %s): %v, most holders seen %d; then Ready, nothing Terminating, client ARP on the replacement; failed probes from recover to converged %d of %d",
		target, ip, replacement.Name, replacement.Spec.NodeName, onceAt.Sub(recoveredAt).Round(100*time.Millisecond), maxHolders, failed, total)
}

// since formats the time from start to at, or "never" when at is zero.
func since(start, at time.Time) string {
	if at.IsZero() {
		return "never"
	}
	return at.Sub(start).Round(100 * time.Millisecond).String()
}
