//go:build dataplane

package dataplane

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestHALBPod runs the failover cases with the real lbpod binary, two replicas elected over net1
// (--replicas 2): each pod also has its cluster side (eth0 to its node, the ClusterIP on the
// node's lo, a UDP backend there that answers with the node's name), and the Service has one UDP
// port, so the client's replies say which replica forwarded them.
func TestHALBPod(t *testing.T) {
	svc := filepath.Join(t.TempDir(), "svc.yaml")
	writeService(t, svc, []string{clusterIPv4}, []servicePort{{Protocol: "UDP", Port: haEchoPort, TargetPort: haEchoPort}}, nil)
	runHAFailover(t, "ha_lbpod_outage", (*haTopology).addClusterSide, func(tp *haTopology, r string) *haReplica {
		return tp.startProcess(r, lbpodBin, "--service-file", svc, "--health-addr", "127.0.0.1:8081",
			"--addresses", haLB+"/16", "--gateways", gatewayV4, "--subnets", subnetV4,
			"--replicas", "2", "--ha-interval", haInterval.String(), "--ha-lease", haLease.String())
	})
}

// TestHALBPodDualStack: two lbpod replicas for a dual-stack Service; SIGTERM on the active moves
// both addresses, and the client's IPv6 requests go on being answered, by the standby.
func TestHALBPodDualStack(t *testing.T) {
	tp, a, _ := startDualHA(t)
	mustRun(t, "ip", "-n", tp.client, "addr", "add", clientV6+"/64", "dev", "c0", "nodad")
	// The election's metrics are on /metrics (the pods' health servers are on their own loopbacks).
	waitFor(t, 5*time.Second, "the metrics show a active, b standby, adverts flowing", func() bool {
		ma, mb := tp.metrics("a"), tp.metrics("b")
		return strings.Contains(ma, "\nlbpod_ha_active 1\n") && strings.Contains(mb, "\nlbpod_ha_active 0\n") &&
			!strings.Contains(ma, "\nlbpod_ha_adverts_sent_total 0\n") && !strings.Contains(mb, "\nlbpod_ha_adverts_received_total 0\n") &&
			strings.Contains(ma, `lbpod_ha_transitions_total{to="active"} 1`)
	})
	probe := startUDPProbeTo(t, tp.client, lbIPv6)
	waitFor(t, 5*time.Second, "the client is served by a over IPv6", func() bool { from, n := probe.lastFrom(); return from == "a" && n >= 10 })
	begin := time.Now()
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	waitFor(t, 5*time.Second, "b serves the client over IPv6", func() bool { from, _ := probe.lastFrom(); return from == "b" })
	_, n := probe.lastFrom()
	waitFor(t, 5*time.Second, "50 more replies", func() bool { _, m := probe.lastFrom(); return m >= n+50 })
	probe.close()
	outage, order := probe.outage(begin)
	if got := strings.Join(order, ","); got != "a,b" && got != "b" {
		t.Errorf("after SIGTERM replies came from %v, want a then b only", order)
	}
	for _, lb := range []string{haLB, lbIPv6} {
		if tp.holdsAddr("a", lb) || !tp.holdsAddr("b", lb) {
			t.Errorf("%s: a holds=%t, b holds=%t; want b alone", lb, tp.holdsAddr("a", lb), tp.holdsAddr("b", lb))
		}
	}
	t.Logf("figure: ha_lbpod_outage_sigterm_ipv6_ms=%d", outage.Milliseconds())
}

// TestHALBPodInitStandby: `lbpod init` of a replica (--replicas 2) installs the standby state:
// every rule and route, no LB address, and nothing announced (a new pod must not pull the
// clients away from the active while it starts).
func TestHALBPodInitStandby(t *testing.T) {
	tp := newTopology(t)
	garps := captureGARPs(t, tp.client, "c0", lbIPv4)
	svc := filepath.Join(t.TempDir(), "svc.yaml")
	writeService(t, svc, []string{clusterIPv4}, basePorts, nil)
	if out, err := tp.runInit(svc, "v4", "--replicas", "2"); err != nil {
		t.Fatalf("lbpod init: %v\n%s", err, out)
	}
	if out := tp.ip(tp.lb, "-4", "-o", "addr", "show", "dev", "net1"); out != "" {
		t.Errorf("net1 after init of a replica: %q, want no address", out)
	}
	if out := tp.exec(tp.lb, "ip", "route", "show", "table", "100"); !strings.Contains(out, "default via "+gatewayV4+" dev net1") {
		t.Errorf("table 100 after init of a replica:\n%s", out)
	}
	// Init announces synchronously before it exits, so anything it sent is on the wire by now;
	// the window only lets the capture read it.
	select {
	case mac := <-garps:
		t.Errorf("the init of a replica announced %s from %s", lbIPv4, mac)
	case <-time.After(300 * time.Millisecond):
	}
}

// TestHALBPodGroupsApart: two Services' lbpods on one underlay (one replica each of a 2-replica
// election, different addresses) both become active, and neither process ever receives the
// other's adverts: the kernel's filter on the group drops them before they wake anybody.
func TestHALBPodGroupsApart(t *testing.T) {
	svc := filepath.Join(t.TempDir(), "svc.yaml")
	writeService(t, svc, []string{clusterIPv4}, []servicePort{{Protocol: "UDP", Port: haEchoPort, TargetPort: haEchoPort}}, nil)
	tp := newHATopology(t)
	tp.addClusterSide()
	start := func(r, lb string) *haReplica {
		return tp.startProcess(r, lbpodBin, "--service-file", svc, "--health-addr", "127.0.0.1:8081",
			"--addresses", lb+"/16", "--gateways", gatewayV4, "--subnets", subnetV4, "--replicas", "2")
	}
	a, b := start("a", haLB), start("b", "172.18.0.19")
	waitFor(t, 10*time.Second, "both active", func() bool { return a.role() == "active" && b.role() == "active" })
	sent := regexp.MustCompile(`\nlbpod_ha_adverts_sent_total (\d+)\n`)
	waitFor(t, 10*time.Second, "each sent 10 adverts", func() bool {
		for _, r := range []string{"a", "b"} {
			m := sent.FindStringSubmatch(tp.metrics(r))
			if m == nil || len(m[1]) < 2 {
				return false
			}
		}
		return true
	})
	for _, r := range []string{"a", "b"} {
		if m := tp.metrics(r); !strings.Contains(m, "\nlbpod_ha_adverts_received_total 0\n") || !strings.Contains(m, "\nlbpod_ha_active 1\n") {
			t.Errorf("replica %s: want active with no advert received; metrics:\n%s", r, m)
		}
	}
}

// BenchmarkHAIdleCPU: CPU time of an active and a standby lbpod replica (one UDP port, default
// election settings: adverts every 100 ms, authenticated, a lease renewed with each) with nothing
// changing, in ms per 60 s, to compare with BenchmarkIdleCPU. The CPU time is the kernel's own
// count in ns for the whole process, exited threads included (the process CPU clock,
// clock_getcpuclockid(3)), not the 10 ms ticks of /proc/<pid>/stat, which over a 20 s window moved
// in steps of 30 ms per minute. wakes-per-s are the context switches of all its threads
// (/proc/<pid>/task/*/status): how often the process is put to sleep and woken, which is most of
// what an idle Go process costs. Then the memory of each (reportMemory).
//
// Environment, for comparing builds and finding where the time goes:
//   - LBSVC_IDLE_BINS="name=path,name=path": the lbpod binaries to measure, each with its own
//     pair of replicas, alternating round after round (default: this tree's lbpod, named "this"),
//     so that a change is compared with its baseline in the same run.
//   - LBSVC_IDLE_WINDOW: the measurement window (default 30s).
//   - LBSVC_IDLE_ROUNDS: how many times each binary is measured (default 1).
//   - LBSVC_IDLE_PROFILE: a command run (by sh) on each replica over the window, with {pid},
//     {secs} and {out} (<name>-<round>-<active|standby>) replaced, e.g.
//     'perf record -q -g -p {pid} -o /tmp/{out}.data -- sleep {secs}' or
//     'timeout {secs} strace -f -c -p {pid} -o /tmp/{out}.txt'.
func BenchmarkHAIdleCPU(b *testing.B) {
	bins := [][2]string{{"this", lbpodBin}}
	if v := os.Getenv("LBSVC_IDLE_BINS"); v != "" {
		bins = nil
		for _, nb := range strings.Split(v, ",") {
			name, path, ok := strings.Cut(nb, "=")
			if !ok {
				b.Fatalf("LBSVC_IDLE_BINS %q: want name=path,name=path", v)
			}
			bins = append(bins, [2]string{name, path})
		}
	}
	window := 30 * time.Second
	if v := os.Getenv("LBSVC_IDLE_WINDOW"); v != "" {
		var err error
		if window, err = time.ParseDuration(v); err != nil {
			b.Fatal(err)
		}
	}
	rounds := 1
	if v := os.Getenv("LBSVC_IDLE_ROUNDS"); v != "" {
		var err error
		if rounds, err = strconv.Atoi(v); err != nil {
			b.Fatal(err)
		}
	}
	for round := range rounds {
		for _, nb := range bins {
			b.Run(nb[0], func(b *testing.B) {
				for range b.N {
					benchHAIdleCPU(b, nb[1], window, fmt.Sprintf("%s-%d", nb[0], round))
				}
			})
		}
	}
}

func benchHAIdleCPU(b *testing.B, bin string, window time.Duration, label string) {
	tp := newHATopologyTB(b)
	tp.addClusterSide()
	svc := filepath.Join(b.TempDir(), "svc.yaml")
	writeService(b, svc, []string{clusterIPv4}, []servicePort{{Protocol: "UDP", Port: haEchoPort, TargetPort: haEchoPort}}, nil)
	keyFile := writeHAKey(b) // as the operator runs them: every advert sealed and verified
	start := func(r string) *haReplica {
		return tp.startProcess(r, bin, "--service-file", svc, "--health-addr", "127.0.0.1:8081",
			"--addresses", haLB+"/16", "--gateways", gatewayV4, "--subnets", subnetV4, "--replicas", "2",
			"--ha-key-file", keyFile,
			"--service-file-poll", "1h") // as BenchmarkIdleCPU: the harness's file polling is no lb pod's cost
	}
	a := start("a")
	waitFor(b, 10*time.Second, "a active", func() bool { return a.role() == "active" })
	s := start("b")
	waitFor(b, 10*time.Second, "b standby", func() bool { return s.role() == "standby" })
	time.Sleep(2 * time.Second) // past the start (the first resync, the standby's first apply)
	type sample struct{ cpu, wakes int64 }
	take := func(r *haReplica) sample {
		pid := r.cmd.Process.Pid
		cpu, err := processCPU(pid)
		if err != nil {
			b.Fatal(err)
		}
		return sample{cpu, contextSwitches(pid)}
	}
	var profiles []*exec.Cmd
	if tmpl := os.Getenv("LBSVC_IDLE_PROFILE"); tmpl != "" {
		for role, r := range map[string]*haReplica{"active": a, "standby": s} {
			line := strings.NewReplacer("{pid}", fmt.Sprint(r.cmd.Process.Pid), "{secs}", fmt.Sprint(window.Seconds()),
				"{out}", label+"-"+role).Replace(tmpl)
			cmd := exec.Command("sh", "-c", line)
			cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
			if err := cmd.Start(); err != nil {
				b.Fatal(err)
			}
			profiles = append(profiles, cmd)
		}
	}
	// The CPU floor, in the same window: a Go process that sends a datagram every interval (an
	// active's advert, the plain Go way) and one that receives them (a standby woken by each),
	// over the active's loopback (test/dataplane/gofloor).
	var floors []*exec.Cmd
	for _, args := range [][]string{{"--recv", "127.0.0.1:8090"}, {"--send", "127.0.0.1:8090", "--every", haInterval.String()}} {
		cmd := exec.Command("ip", append([]string{"netns", "exec", tp.pod["a"], goFloorBin}, args...)...)
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		floors = append(floors, cmd)
	}
	defer func() {
		for _, cmd := range floors {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	}()
	time.Sleep(time.Second) // past the floors' start, as the lb pods' 2 s above
	floorCPU := func() (recv, send int64) {
		var got [2]int64
		for i, cmd := range floors {
			// ip netns exec execs the floor in its own process, so the pid is the floor's.
			cpu, err := processCPU(cmd.Process.Pid)
			if err != nil {
				b.Fatal(err)
			}
			got[i] = cpu
		}
		return got[0], got[1]
	}
	fr0, fs0 := floorCPU()
	a0, s0, t0 := take(a), take(s), time.Now()
	time.Sleep(window) // the measurement window itself, not a wait for a condition
	a1, s1, took := take(a), take(s), time.Since(t0)
	fr1, fs1 := floorCPU()
	for _, cmd := range profiles {
		_ = cmd.Wait()
	}
	if a.role() != "active" || s.role() != "standby" {
		b.Fatalf("roles changed during the window: a %s, b %s", a.role(), s.role())
	}
	perMin := func(ns int64) float64 { return float64(ns) / 1e6 * float64(time.Minute) / float64(took) }
	perSec := func(n int64) float64 { return float64(n) / took.Seconds() }
	b.ReportMetric(perMin(a1.cpu-a0.cpu), "active-cpu-ms-per-60s")
	b.ReportMetric(perMin(s1.cpu-s0.cpu), "standby-cpu-ms-per-60s")
	b.ReportMetric(perSec(a1.wakes-a0.wakes), "active-wakes-per-s")
	b.ReportMetric(perSec(s1.wakes-s0.wakes), "standby-wakes-per-s")
	b.ReportMetric(perMin(fs1-fs0), "floor-send-cpu-ms-per-60s")
	b.ReportMetric(perMin(fr1-fr0), "floor-recv-cpu-ms-per-60s")
	// After the window, the memory of each (memoryOf: RSS, PSS, private and anonymous KiB; the
	// two share the binary's pages, so PSS counts half of those in each).
	reportMemory(b, "active", a.cmd.Process.Pid)
	reportMemory(b, "standby", s.cmd.Process.Pid)
	// The floor from the same run: a Go process built alike that only answers HTTP, after its
	// first answer (test/dataplane/gofloor). It runs in the active's namespace, on a port the lb
	// pod does not use (its health and metrics answer on 8081).
	floor := exec.Command("ip", "netns", "exec", tp.pod["a"], goFloorBin, "--addr", "127.0.0.1:8089")
	if err := floor.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = floor.Process.Kill(); _ = floor.Wait() }()
	waitFor(b, 10*time.Second, "the floor process answers", func() bool {
		body, err := httpGetPath(tp.t, tp.pod["a"], "127.0.0.1:8089", "/healthz")
		return err == nil && body == "ok\n"
	})
	reportMemory(b, "floor", floor.Process.Pid)
	// The second floor: the lb pod's libraries without Kubernetes' (test/dataplane/libfloor),
	// after its first answer and two listings of the links.
	lib := exec.Command("ip", "netns", "exec", tp.pod["a"], libFloorBin, "--addr", "127.0.0.1:8090")
	libStart := time.Now()
	if err := lib.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = lib.Process.Kill(); _ = lib.Wait() }()
	waitFor(b, 10*time.Second, "the library floor has listed the links twice", func() bool {
		body, err := httpGetPath(tp.t, tp.pod["a"], "127.0.0.1:8090", "/metrics")
		return err == nil && strings.Contains(body, "\nlibfloor_links ") && time.Since(libStart) > 2*time.Second
	})
	reportMemory(b, "libfloor", lib.Process.Pid)
}

// processCPU returns the CPU time a process has used so far, all its threads together (exited
// ones too), in ns: its process CPU clock (CLOCK_SCHED of MAKE_PROCESS_CPUCLOCK(pid), what
// clock_getcpuclockid(3) returns), which any process may read.
func processCPU(pid int) (int64, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(int32(^pid)<<3|2, &ts); err != nil {
		return 0, fmt.Errorf("CPU clock of %d: %w", pid, err)
	}
	return ts.Nano(), nil
}

// contextSwitches sums the voluntary and involuntary context switches of a process's threads
// (those still alive).
func contextSwitches(pid int) int64 {
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	var n int64
	for _, t := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/status", pid, t.Name()))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.HasSuffix(k, "ctxt_switches") {
				c, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				n += c
			}
		}
	}
	return n
}

// metrics fetches replica r's /metrics ("" when it does not answer).
func (tp *haTopology) metrics(r string) string {
	body, err := httpGetPath(tp.t, tp.pod[r], "127.0.0.1:8081", "/metrics")
	if err != nil {
		return ""
	}
	return body
}

// addClusterSide gives each replica's pod an eth0 to its node (both families), as the harness's
// topology does, the ClusterIPs on the node, a UDP backend on each that answers
// "<replica>: <payload>", and the IPv4 subnet gateway on the underlay bridge.
func (tp *haTopology) addClusterSide() {
	t := tp.t
	mustRun(t, "ip", "-n", tp.underlay, "addr", "add", gatewayV4+"/16", "dev", "br0")
	for _, r := range []string{"a", "b"} {
		tp.clusterSide(r)
	}
}

// clusterSide gives replica r's pod its eth0 to its node, the ClusterIPs on the node and their
// UDP backend (addClusterSide).
func (tp *haTopology) clusterSide(r string) {
	t := tp.t
	node, pod := tp.node[r], tp.pod[r]
	ip := func(ns string, args ...string) { mustRun(t, "ip", append([]string{"-n", ns}, args...)...) }
	ip(node, "link", "add", "nodeveth", "type", "veth", "peer", "name", "eth0", "netns", pod)
	ip(node, "link", "set", "nodeveth", "up")
	ip(node, "addr", "add", nodeV4+"/16", "dev", "nodeveth")
	ip(pod, "link", "set", "eth0", "up")
	ip(pod, "addr", "add", podV4+"/16", "dev", "eth0")
	ip(pod, "route", "add", "default", "via", nodeV4, "dev", "eth0")
	ip(node, "addr", "add", nodeV6+"/64", "dev", "nodeveth", "nodad")
	ip(pod, "addr", "add", podV6+"/64", "dev", "eth0", "nodad")
	ip(pod, "-6", "route", "add", "default", "via", nodeV6, "dev", "eth0")
	for _, clusterIP := range []string{clusterIPv4, clusterIPv6} {
		if strings.Contains(clusterIP, ":") {
			ip(node, "addr", "add", clusterIP+"/128", "dev", "lo", "nodad") // usable at once
		} else {
			ip(node, "addr", "add", clusterIP+"/32", "dev", "lo")
		}
		serveUDP(t, node, net.JoinHostPort(clusterIP, fmt.Sprint(haEchoPort)), func(payload string) string { return r + ": " + payload })
	}
}

// startDualHA starts two lbpod replicas, a then b, for a dual-stack UDP Service on the HA
// topology (the underlay also routes IPv6), and returns once a holds both addresses and b
// stands by.
func startDualHA(t *testing.T) (tp *haTopology, a, b *haReplica) {
	t.Helper()
	svc := filepath.Join(t.TempDir(), "svc.yaml")
	writeService(t, svc, []string{clusterIPv4, clusterIPv6}, []servicePort{{Protocol: "UDP", Port: haEchoPort, TargetPort: haEchoPort}}, nil)
	tp = newHATopology(t)
	tp.addClusterSide()
	mustRun(t, "ip", "-n", tp.underlay, "addr", "add", gatewayV6+"/64", "dev", "br0", "nodad")
	start := func(r string) *haReplica {
		return tp.startProcess(r, lbpodBin, "--service-file", svc, "--health-addr", "127.0.0.1:8081",
			"--addresses", haLB+"/16,"+lbIPv6+"/64", "--gateways", gatewayV4+","+gatewayV6, "--subnets", subnetV4+","+subnetV6,
			"--replicas", "2", "--ha-interval", haInterval.String(), "--ha-lease", haLease.String())
	}
	a = start("a")
	waitFor(t, 10*time.Second, "a holds both addresses", func() bool {
		return a.role() == "active" && tp.holdsAddr("a", haLB) && tp.holdsAddr("a", lbIPv6)
	})
	b = start("b")
	waitFor(t, 10*time.Second, "b starts as standby", func() bool { return b.role() == "standby" })
	return tp, a, b
}

// TestHALBPodStandbyReadsAtItsDeadline: an idle standby is not woken by each of the active's
// adverts. They wait in its queue socket and are read, several at once, when its deadline comes
// (about every dead interval, ~0.3 s), every one of them: its received counter, sampled every
// 10 ms, climbs in steps of several adverts rather than one every 100 ms, and by as many as the
// active sent. A standby woken by each advert (the build before) shows ~30 steps of one in 3 s.
func TestHALBPodStandbyReadsAtItsDeadline(t *testing.T) {
	tp := newHATopology(t)
	tp.addClusterSide()
	svc := filepath.Join(t.TempDir(), "svc.yaml")
	writeService(t, svc, []string{clusterIPv4}, []servicePort{{Protocol: "UDP", Port: haEchoPort, TargetPort: haEchoPort}}, nil)
	keyFile := writeHAKey(t)
	start := func(r string) *haReplica {
		return tp.startProcess(r, lbpodBin, "--service-file", svc, "--health-addr", "127.0.0.1:8081",
			"--addresses", haLB+"/16", "--gateways", gatewayV4, "--subnets", subnetV4, "--replicas", "2",
			"--ha-key-file", keyFile, "--ha-interval", haInterval.String())
	}
	a := start("a")
	waitFor(t, 10*time.Second, "a active", func() bool { return a.role() == "active" })
	b := start("b")
	// Which one ends up standby does not matter here (see docs/benchmarks.md, Idle CPU, on a
	// second replica that may take over at start): wait for one of each.
	var standby string
	waitFor(t, 10*time.Second, "one active and one standby, settled", func() bool {
		ma, mb := tp.metrics("a"), tp.metrics("b")
		switch {
		case strings.Contains(ma, "\nlbpod_ha_active 1\n") && strings.Contains(mb, "\nlbpod_ha_active 0\n") && b.role() == "standby":
			standby = "b"
		case strings.Contains(mb, "\nlbpod_ha_active 1\n") && strings.Contains(ma, "\nlbpod_ha_active 0\n") && a.role() == "standby":
			standby = "a"
		default:
			return false
		}
		return !strings.Contains(tp.metrics(standby), "\nlbpod_ha_adverts_received_total 0\n")
	})
	active := map[string]string{"a": "b", "b": "a"}[standby]
	received := func(r string) int {
		return int(metricValue(t, tp.metrics(r), "lbpod_ha_adverts_received_total"))
	}
	sent0, got0 := int(metricValue(t, tp.metrics(active), "lbpod_ha_adverts_sent_total")), received(standby)
	steps, biggest, last := 0, 0, got0
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); {
		<-time.After(10 * time.Millisecond) // the sampling period
		if n := received(standby); n != last {
			steps++
			biggest = max(biggest, n-last)
			last = n
		}
	}
	// The adverts still waiting in the queue are read at the next deadline: one more dead
	// interval and they are counted too.
	sent := int(metricValue(t, tp.metrics(active), "lbpod_ha_adverts_sent_total")) - sent0
	waitFor(t, 2*time.Second, "the standby has read what the active sent in the window", func() bool { return received(standby)-got0 >= sent })
	got := received(standby) - got0
	t.Logf("figure: ha_standby_reads steps=%d biggest=%d received=%d sent=%d (3 s, sampled every 10 ms)", steps, biggest, got, sent)
	if steps > 18 || biggest < 2 {
		t.Errorf("the standby's received counter rose in %d steps (the biggest %d adverts) over 3 s: want it woken about once per dead interval (~10 steps of ~3), not once per advert", steps, biggest)
	}
	if got > sent+2 {
		t.Errorf("the standby counted %d adverts, the active sent %d", got, sent)
	}
	if r := map[string]*haReplica{"a": a, "b": b}[standby]; r.role() != "standby" {
		t.Errorf("the standby %s became %s during the window", standby, r.role())
	}
}

// metricValue is the value of the unlabelled metric name in a /metrics page (0 when absent).
func metricValue(t *testing.T, page, name string) float64 {
	t.Helper()
	for _, line := range strings.Split(page, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatalf("%s: %q", name, line)
			}
			return f
		}
	}
	return 0
}

// TestHALBPodTakeoverInOneAdd: a standby whose loop stands ready (every rule and route applied
// and verified, only the address missing) takes over by putting the address on net1 itself, on
// the lease's kernel lifetime, and announcing it at once, before its loop applies again; also at
// its first takeover with the conflict probe on (the probe finds the address free, then the
// takeover is the same one add). The active is cut off by an invisible partition (its switch
// port stops forwarding), so the client keeps a's MAC until b's announcement arrives: the figure
// is how long after b's takeover that was.
func TestHALBPodTakeoverInOneAdd(t *testing.T) {
	for _, tc := range []struct {
		name  string
		extra []string
	}{{"no probe", nil}, {"probe", []string{"--conflict-probe", "fast"}}} {
		t.Run(tc.name, func(t *testing.T) { testTakeoverInOneAdd(t, tc.extra) })
	}
}

func testTakeoverInOneAdd(t *testing.T, extra []string) {
	tp, _, b := startStallPair(t, extra...) // a active, b standby, with the lease
	capture := startARPCapture(t, tp.client, "c0")
	waitFor(t, 10*time.Second, "b stands by, ready", func() bool { return strings.Contains(tp.metrics("b"), "\nlbpod_ready 1\n") })
	probe := startUDPProbe(t, tp.client)
	waitFor(t, 5*time.Second, "the client is served by a", func() bool { from, n := probe.lastFrom(); return from == "a" && n >= 10 })

	begin := time.Now()
	mustRun(t, "bridge", "-n", tp.underlay, "link", "set", "dev", "pa", "state", "0")
	waitFor(t, 5*time.Second, "b serves the client", func() bool { from, _ := probe.lastFrom(); return from == "b" })
	probe.close()

	took := regexp.MustCompile(`(?m)^time=(\S+) level=INFO msg="took over: the addresses are on net1" took=(\S+)$`).FindStringSubmatch(b.logs.String())
	if took == nil {
		t.Fatalf("b did not take over by itself (no `took over` line); its log:\n%s", b.logs.String())
	}
	at, err := time.Parse(time.RFC3339Nano, took[1])
	if err != nil {
		t.Fatal(err)
	}
	if len(extra) > 0 && !strings.Contains(b.logs.String(), "conflict probe: nobody answered") {
		t.Errorf("b's first takeover did not probe; its log:\n%s", b.logs.String())
	}
	// On the lease's lifetime (the kill -9 fence), not for ever.
	if out := mustRun(t, "ip", "-n", tp.pod["b"], "-o", "-4", "addr", "show", "dev", "net1"); !strings.Contains(out, " "+haLB+"/16 ") || strings.Contains(out, "valid_lft forever") {
		t.Errorf("b's net1 after the takeover: %q, want %s on a finite lifetime", out, haLB)
	}
	capture.close()
	var first time.Time
	for _, s := range capture.packets() {
		if s.mac == tp.mac("b") {
			first = s.at
			break
		}
	}
	if first.IsZero() {
		t.Fatalf("the client saw no ARP from b (%s) although b serves it", tp.mac("b"))
	}
	if first.Before(at.Add(-time.Millisecond)) {
		t.Errorf("b's first ARP at %s, before it took over at %s", first.Format("15:04:05.000"), at.Format("15:04:05.000"))
	}
	outage, _ := probe.outage(begin)
	t.Logf("figure: ha_lbpod_takeover_to_announcement_ms=%d (the address put on in %s; partition outage %d ms)", first.Sub(at).Milliseconds(), took[2], outage.Milliseconds())
	mustRun(t, "bridge", "-n", tp.underlay, "link", "set", "dev", "pa", "state", "3")
}
