//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
)

// TestCreationTimeline: where the time from a Service's creation to the client's first answer
// goes (issue 24: "find where the time goes ... with a per-step figure"), for an IPv4 Service from
// the seed's Subnet and an IPv6-only one from a dual Subnet. While the client probes the address,
// the test polls the API every 20 ms and notes when it first sees each step (the address in the
// Service's status, the Deployment, the lb pods, one scheduled, its sandbox and network ready,
// its container running, Ready); afterwards it reads the lb pod that answered for the times its
// own log lines carry (the process's first line, the rules in place, the first claim granted by
// its Lease, the address added).
// Every clock here is the same host's (the nodes are network namespaces of this machine), so the
// steps line up. The steps are figures, not assertions; what the test asserts is that each step
// was seen, in an order that can happen, and that the client's first answer was a backend's 200.
func TestCreationTimeline(t *testing.T) {
	id := suffix()
	v4 := newLBService("e2e-tl4-"+id, "", 80)
	t.Run("IPv4", func(t *testing.T) {
		creationTimeline(t, v4)
	})
	t.Run("IPv6", func(t *testing.T) {
		subnet := newUnderlaySubnet(t, "e2e-tl-"+id, dualSubnetCIDR, dualGateways)
		single := corev1.IPFamilyPolicySingleStack
		v6 := newLBService("e2e-tl6-"+id, "", 80)
		v6.Spec.IPFamilyPolicy, v6.Spec.IPFamilies = &single, []corev1.IPFamily{corev1.IPv6Protocol}
		v6.Annotations[lbv1.AttachmentProviderAnnotation] = provider(subnet.Name)
		creationTimeline(t, v6)
	})
}

// step is one moment on a Service's way to its first answer, as seen from this test.
type step struct {
	name string
	at   time.Time
}

// stepLog notes the first time each step is seen.
type stepLog struct {
	mu    sync.Mutex
	steps map[string]time.Time
}

func (l *stepLog) see(name string, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.steps[name]; !ok {
		l.steps[name] = at
	}
}

func (l *stepLog) sorted() []step {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]step, 0, len(l.steps))
	for n, at := range l.steps {
		out = append(out, step{n, at})
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].at.Before(out[j].at) })
	return out
}

// The steps the API poll sees, in the order they can happen.
const (
	stepAddress   = "address in the Service's status"
	stepDeploy    = "lb Deployment created"
	stepPod       = "first lb pod created"
	stepScheduled = "first lb pod scheduled"
	stepSandbox   = "first lb pod's sandbox and network ready"
	stepRunning   = "first lb pod's container running"
	stepReady     = "first lb pod Ready"
	stepProcess   = "answering lb pod: first log line"
	stepRules     = "answering lb pod: Service read, rules in place (ready as a standby)"
	stepGranted   = "answering lb pod: its Lease granted the first claim"
	stepAddress1  = "answering lb pod: address added to net1 (active)"
	stepAnswer    = "client's first answer"
)

func creationTimeline(t *testing.T, svc *corev1.Service) {
	g := NewWithT(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	steps := &stepLog{steps: map[string]time.Time{}}

	created := time.Now()
	g.Expect(k8s.Create(ctx, svc)).To(Succeed())
	deleteServiceOnCleanup(t, svc)
	addr := make(chan string, 1)
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		pollSteps(ctx, svc, steps, addr)
	}()

	var ip string
	select {
	case ip = <-addr:
	case <-time.After(time.Minute):
		t.Fatalf("%s/%s got no address within a minute", svc.Namespace, svc.Name)
	}
	// The client's first answer: a TCP prober every 20 ms from the client's namespace (curl's
	// process start and its 1 s retransmit would hide sub-second steps). The figure is when the
	// first answered probe got its answer (a probe sent before the address was held waits for it).
	prober := startTCPProber(t, net.JoinHostPort(ip, "80"))
	g.Eventually(func() bool {
		prober.mu.Lock()
		defer prober.mu.Unlock()
		for _, p := range prober.probes {
			if p.ok {
				steps.see(stepAnswer, p.end)
				return true
			}
		}
		return false
	}).WithTimeout(2*time.Minute).WithPolling(20*time.Millisecond).Should(BeTrue(), "an answer from %s", ip)
	prober.Stop()

	// The poll runs on until the first lb pod is Ready (it may be after the first answer).
	g.Eventually(func() bool { _, ok := steps.get(stepReady); return ok }).WithTimeout(time.Minute).WithPolling(50 * time.Millisecond).Should(BeTrue())
	cancel()
	<-polled

	pod := waitLBPod(t, svc.Namespace, svc.Name)
	logSteps(t, pod, steps)

	all := steps.sorted()
	names := make([]string, 0, len(all))
	for _, s := range all {
		names = append(names, s.name)
	}
	g.Expect(names).To(ContainElements(stepAddress, stepDeploy, stepPod, stepScheduled, stepSandbox, stepRunning, stepReady,
		stepProcess, stepRules, stepAddress1, stepAnswer))
	var b strings.Builder
	prev := created
	for _, s := range all {
		fmt.Fprintf(&b, "\n  %6d ms (+%5d) %s", s.at.Sub(created).Milliseconds(), s.at.Sub(prev).Milliseconds(), s.name)
		prev = s.at
	}
	first, _ := steps.get(stepAnswer)
	t.Logf("figure: created_to_first_answer_%s_ms=%d (Service %s/%s, %s, answered by %s on %s); steps since creation (+ since the previous step):%s",
		strings.ToLower(string(svc.Spec.IPFamilies[0])), first.Sub(created).Milliseconds(), svc.Namespace, svc.Name, ip, pod.Name, pod.Spec.NodeName, b.String())
	// Orders that must hold whatever the machine's load: those of one object, or of one process
	// and what it causes. (Steps of different kinds of object are not ordered by this poll: the
	// API server serves each kind's list from its own watch cache, and a run saw a Deployment
	// 186 ms after its first pod.)
	for _, pair := range [][2]string{{stepPod, stepScheduled}, {stepScheduled, stepRunning},
		{stepProcess, stepRules}, {stepRules, stepAddress1}, {stepProcess, stepAnswer}} {
		a, _ := steps.get(pair[0])
		b, _ := steps.get(pair[1])
		g.Expect(a.After(b)).To(BeFalse(), "%q (%s) after %q (%s)", pair[0], a.Format(time.StampMicro), pair[1], b.Format(time.StampMicro))
	}
}

func (l *stepLog) get(name string) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	at, ok := l.steps[name]
	return at, ok
}

// pollSteps polls the API every 20 ms until ctx ends, noting the first time each step is seen;
// it sends the Service's first ingress address on addr.
func pollSteps(ctx context.Context, svc *corev1.Service, steps *stepLog, addr chan<- string) {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	sent := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		// Each step is stamped when the read that saw it returned: an upper bound of when it
		// happened, late by at most the poll period and that read's latency.
		if !sent {
			if ips, err := ingressIPs(ctx, svc); err == nil && len(ips) > 0 {
				steps.see(stepAddress, time.Now())
				addr <- ips[0]
				sent = true
			}
		}
		owned := client.MatchingLabels{lbv1.ServiceLabel: svc.Name}
		var deps appsv1.DeploymentList
		if err := k8s.List(ctx, &deps, client.InNamespace(svc.Namespace), owned); err == nil && len(deps.Items) > 0 {
			steps.see(stepDeploy, time.Now())
		}
		var pods corev1.PodList
		if err := k8s.List(ctx, &pods, client.InNamespace(svc.Namespace), owned); err != nil {
			continue
		}
		now := time.Now()
		for i := range pods.Items {
			p := &pods.Items[i]
			steps.see(stepPod, now)
			if p.Spec.NodeName != "" {
				steps.see(stepScheduled, now)
			}
			for _, c := range p.Status.Conditions {
				if c.Status != corev1.ConditionTrue {
					continue
				}
				switch c.Type {
				case corev1.PodReadyToStartContainers:
					steps.see(stepSandbox, now)
				case corev1.PodReady:
					steps.see(stepReady, now)
				}
			}
			for _, cs := range p.Status.ContainerStatuses {
				if cs.State.Running != nil {
					steps.see(stepRunning, now)
				}
			}
		}
	}
}

// logSteps reads the answering lb pod's log with the container runtime's timestamps (nanoseconds,
// this host's clock): its first line, its first readiness (the Service read and the rules in
// place, as a standby) and the first address it added to net1.
func logSteps(t *testing.T, pod *corev1.Pod, steps *stepLog) {
	t.Helper()
	out, err := run(kubectl, "logs", "--timestamps", "-n", pod.Namespace, pod.Name)
	if err != nil {
		t.Fatalf("logs of %s: %v: %s", pod.Name, err, out)
	}
	for i, line := range nonEmptyLines(out) {
		ts, msg, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, ts)
		if err != nil {
			continue
		}
		switch {
		case i == 0:
			steps.see(stepProcess, at)
		case strings.Contains(msg, "msg=ready "):
			steps.see(stepRules, at)
		case strings.Contains(msg, `msg="first claim granted"`):
			// The Lease's first claim (cmd/lbpod firstClaim): the election took over without
			// waiting out the dead interval. A Service whose first claim was not granted (the
			// line "first claim: not granted" says why) shows no such step.
			steps.see(stepGranted, at)
		case strings.Contains(msg, `msg="first claim: not granted`):
			t.Logf("%s: %s", pod.Name, msg)
		case strings.Contains(msg, `change="+address `), strings.Contains(msg, `msg="took over: the addresses are on net1"`):
			// Added by the loop, or, by a standby whose loop stood ready, by the election's
			// holder in one add (docs/lbpod.md#the-loop-and-the-failover-seam).
			steps.see(stepAddress1, at)
		}
	}
}
