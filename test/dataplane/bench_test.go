//go:build dataplane

package dataplane

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/vishvananda/netns"
)

// The benchmarks measure once per run (use -benchtime=1x) and report their figures as metrics;
// hack/bench-dataplane.sh runs them and prints a summary.

const (
	iperfPort = 5201
	connPort  = 5202
)

// routeStraight adds the baseline path: the client reaches the node's own address (nodeV4)
// through the lb pod by plain routing, no DNAT and no MASQUERADE (a rule of ours at priority
// 1000 sends it to the main table; lbpod only manages rules pointing to table 100). lbpod
// forwards from net1, and from eth0 into net1, only what its DNAT created, so once lbpod is
// ready the baseline gets an ACCEPT of its own in FORWARD for each direction, before lbpod's
// jump (lbpod leaves rules outside its chains alone).
func (tp *topology) routeStraight() {
	tp.ip(tp.client, "route", "add", nodeV4+"/32", "via", lbIPv4)
	tp.ip(tp.lb, "rule", "add", "pref", "1000", "iif", "net1", "to", nodeV4+"/32", "lookup", "main")
	tp.ip(tp.node, "route", "add", subnetV4, "via", podV4)
}

// benchTopology builds the topology, a Service with the benchmark ports, and a ready lbpod.
func benchTopology(b *testing.B) *topology {
	g := NewWithT(b)
	tp := newTopology(b)
	tp.routeStraight()
	svc := filepath.Join(b.TempDir(), "svc.yaml")
	writeService(b, svc, []string{clusterIPv4}, []servicePort{{Protocol: "TCP", Port: iperfPort, TargetPort: iperfPort}, {Protocol: "TCP", Port: connPort, TargetPort: connPort}}, nil)
	// The iptables back end, not the default: the baseline's ACCEPT must come before lbpod's
	// forward filter, which an iptables rule can do and an nftables base chain of its own cannot
	// (a drop in lbpod's chain at the same hook would still drop). Both back ends put the same
	// conntrack NAT on the path; the rules a packet meets are nf_tables rules either way with
	// iptables-nft.
	tp.startLBPod(svc, "v4", iptRules...)
	waitReady(g, tp)
	tp.exec(tp.lb, "iptables", "-I", "FORWARD", "1", "-i", "net1", "-d", nodeV4+"/32", "-j", "ACCEPT")
	tp.exec(tp.lb, "iptables", "-I", "FORWARD", "1", "-i", "eth0", "-o", "net1", "-s", nodeV4+"/32", "-j", "ACCEPT")
	return tp
}

// iperf3 runs a 3 s TCP test (after 1 s of warm-up) from the client to addr and returns the
// received Gbit/s.
func (tp *topology) iperf3(b *testing.B, addr string) float64 {
	b.Helper()
	out, err := exec.Command("ip", "netns", "exec", tp.client, "iperf3", "-c", addr, "-p", fmt.Sprint(iperfPort), "-t", "3", "-O", "1", "-J").Output()
	if err != nil {
		b.Fatalf("iperf3 -c %s: %v\n%s", addr, err, out)
	}
	var res struct {
		End struct {
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		b.Fatalf("iperf3 output: %v", err)
	}
	return res.End.SumReceived.BitsPerSecond / 1e9
}

// BenchmarkThroughput: iperf3 through the LB address (DNAT + MASQUERADE) vs straight to the node
// through the same lb pod by routing.
func BenchmarkThroughput(b *testing.B) {
	if _, err := exec.LookPath("iperf3"); err != nil {
		b.Fatalf("iperf3 is needed (Debian package iperf3): %v", err)
	}
	tp := benchTopology(b)
	server := exec.Command("ip", "netns", "exec", tp.node, "iperf3", "-s", "-p", fmt.Sprint(iperfPort))
	if err := server.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { server.Process.Kill(); server.Wait() })
	g := NewWithT(b)
	g.Eventually(func() error {
		c, err := dialIn(b, tp.client, "tcp", net.JoinHostPort(nodeV4, fmt.Sprint(iperfPort)), time.Second)
		if err == nil {
			c.Close()
		}
		return err
	}).WithTimeout(5 * time.Second).WithPolling(50 * time.Millisecond).Should(Succeed())
	b.ResetTimer()
	// Alternate the paths, as in BenchmarkConnRate.
	var viaLB, straight float64
	const rounds = 3
	for range b.N {
		viaLB, straight = 0, 0
		for range rounds {
			straight += tp.iperf3(b, nodeV4) / rounds
			viaLB += tp.iperf3(b, lbIPv4) / rounds
		}
	}
	b.ReportMetric(viaLB, "lb-Gbit/s")
	b.ReportMetric(straight, "straight-Gbit/s")
	b.ReportMetric(viaLB/straight, "ratio")
}

// connRate opens and resets TCP connections to addr from the client for d, with workers in
// parallel, and returns connections per second.
func (tp *topology) connRate(b *testing.B, addr string, workers int, d time.Duration) float64 {
	var count atomic.Int64
	var wg sync.WaitGroup
	deadline := time.Now().Add(d)
	errs := make(chan error, workers)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// This goroutine's thread stays in the client namespace and dies with it (never
			// unlocked), so every socket below is created there without switching back and forth.
			runtime.LockOSThread()
			h, err := netns.GetFromName(tp.client)
			if err != nil {
				errs <- err
				return
			}
			defer h.Close()
			if err := netns.Set(h); err != nil {
				errs <- err
				return
			}
			for time.Now().Before(deadline) {
				c, err := net.DialTimeout("tcp", addr, time.Second)
				if err != nil {
					errs <- err
					return
				}
				// A reset instead of a FIN: no TIME_WAIT, so the client's ports never run out.
				c.(*net.TCPConn).SetLinger(0)
				c.Close()
				count.Add(1)
			}
		}()
	}
	wg.Wait()
	select {
	case err := <-errs:
		b.Fatalf("connect to %s: %v", addr, err)
	default:
	}
	return float64(count.Load()) / d.Seconds()
}

// BenchmarkConnRate: new TCP connections per second through the LB address vs straight.
func BenchmarkConnRate(b *testing.B) {
	tp := benchTopology(b)
	ln := listenIn(b, tp.node, fmt.Sprintf(":%d", connPort))
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	b.ResetTimer()
	// Alternate the two paths in short rounds so that load from elsewhere on the machine weighs on
	// both alike.
	var viaLB, straight float64
	const rounds = 4
	for range b.N {
		viaLB, straight = 0, 0
		for range rounds {
			straight += tp.connRate(b, net.JoinHostPort(nodeV4, fmt.Sprint(connPort)), 4, time.Second) / rounds
			viaLB += tp.connRate(b, net.JoinHostPort(lbIPv4, fmt.Sprint(connPort)), 4, time.Second) / rounds
		}
	}
	b.ReportMetric(viaLB, "lb-conn/s")
	b.ReportMetric(straight, "straight-conn/s")
	b.ReportMetric(viaLB/straight, "ratio")
}

var appliedLine = regexp.MustCompile(`msg=applied trigger=service changes=(\d+) took=(\S+) read=(\S+) execute=(\S+) verify=(\S+) saves=(\d+)`)

// applyTime is one of lbpod's "applied" log lines for a Service change: the whole reconcile, and
// its read-and-plan, execute and verify parts.
type applyTime struct {
	took, read, execute, verify time.Duration
	line                        string
}

// appliedTimes returns the durations of lbpod's "applied" log lines for Service changes.
func appliedTimes(logs string) []time.Duration {
	var out []time.Duration
	for _, a := range applyTimes(logs) {
		out = append(out, a.took)
	}
	return out
}

func applyTimes(logs string) []applyTime {
	var out []applyTime
	for _, m := range appliedLine.FindAllStringSubmatch(logs, -1) {
		var a applyTime
		var err error
		for i, d := range []*time.Duration{&a.took, &a.read, &a.execute, &a.verify} {
			if *d, err = time.ParseDuration(m[i+2]); err != nil {
				break
			}
		}
		if err == nil {
			a.line = m[0]
			out = append(out, a)
		}
	}
	return out
}

func tcpPorts(first, n int) []servicePort {
	var ps []servicePort
	for i := range n {
		ps = append(ps, servicePort{Protocol: "TCP", Port: first + i})
	}
	return ps
}

// applyRuns is how many times BenchmarkApply measures each figure; it reports the median, so
// that one run slowed down by the rest of a shared machine does not make the figure.
const applyRuns = 5

// BenchmarkApply: how long lbpod takes (apply and verify, from its log) to install 1, 100 and
// 1000 ports from scratch, and to change one port among 1000, with the default rules back end
// (backend=nftables: no --rules flag) and --rules iptables in each variant (backend=nft, legacy);
// and, as the floor of the same run, what the back end's own
// binaries take for the 1000 rules (for nftables: bare google/nftables transactions).
// Medians of applyRuns runs.
func BenchmarkApply(b *testing.B) {
	for _, backend := range []string{"nft", "legacy", "nftables"} {
		flags := append([]string{"--iptables", backend}, iptRules...)
		if backend == "nftables" {
			flags = nil // the default
		}
		for _, n := range []int{1, 100, 1000} {
			b.Run(fmt.Sprintf("backend=%s/ports=%d", backend, n), func(b *testing.B) {
				figures := map[string][]time.Duration{}
				for range b.N * applyRuns {
					g := NewWithT(b)
					tp := newTopology(b)
					svc := filepath.Join(b.TempDir(), "svc.yaml")
					writeService(b, svc, []string{clusterIPv4}, tcpPorts(10000, n), nil)
					p := tp.startLBPod(svc, "v4", flags...)
					g.Eventually(func() []time.Duration { return appliedTimes(p.logs.String()) }).
						WithTimeout(30 * time.Second).WithPolling(20 * time.Millisecond).Should(HaveLen(1))
					first := applyTimes(p.logs.String())[0]
					figures["from-scratch-ms"] = append(figures["from-scratch-ms"], first.took)
					b.Logf("%d ports from scratch: %s", n, first.line)
					if n == 1000 {
						changed := append(tcpPorts(10000, 999), servicePort{Protocol: "TCP", Port: 20000})
						writeService(b, svc, []string{clusterIPv4}, changed, nil)
						g.Eventually(func() []time.Duration { return appliedTimes(p.logs.String()) }).
							WithTimeout(30 * time.Second).WithPolling(20 * time.Millisecond).Should(HaveLen(2))
						change := applyTimes(p.logs.String())[1]
						b.Logf("change one of 1000: %s", change.line)
						figures["change-one-of-1000-ms"] = append(figures["change-one-of-1000-ms"], change.took)
						// Until the new rules are in the kernel (what a client sees); the rest is
						// lbpod reading them back to verify.
						figures["change-one-of-1000-in-kernel-ms"] = append(figures["change-one-of-1000-in-kernel-ms"], change.read+change.execute)
						var restore, save, changeOne time.Duration
						if backend == "nftables" {
							restore, save, changeOne = tp.nftFloor()
						} else {
							restore, save, changeOne = tp.iptablesFloor(backend)
						}
						figures["floor-restore-1000-ms"] = append(figures["floor-restore-1000-ms"], restore)
						figures["floor-save-1000-ms"] = append(figures["floor-save-1000-ms"], save)
						figures["floor-change-one-ms"] = append(figures["floor-change-one-ms"], changeOne)
					}
					// Stopped now, so that it does not run beside the next measurement.
					tp.lbpod.stop(b)
				}
				for unit, ds := range figures {
					slices.Sort(ds)
					b.ReportMetric(ms(ds[len(ds)/2]), unit)
				}
			})
		}
	}
}

// iptablesFloor replays the lb pod's IPv4 tables (1000 DNAT rules and the rest, in the chains
// lbpod laid them out in) into a fresh namespace with the back end's own iptables-restore,
// lists them once with its iptables-save, and runs the smallest transaction that changes one
// port: delete one DNAT rule and append it again, in its chain. All three are timed inside that
// namespace: what the binaries alone cost for the work lbpod's apply and verify do (with
// iptables-nft, a transaction that deletes a rule also waits for the kernel to release it).
func (tp *topology) iptablesFloor(backend string) (restore, save, change time.Duration) {
	tp.t.Helper()
	dir := tp.t.TempDir()
	saved := tp.exec(tp.lb, "iptables-"+backend+"-save")
	rules, changeOne := filepath.Join(dir, "rules"), filepath.Join(dir, "change")
	dnat := regexp.MustCompile(`(?m)^-A (\S+) (.* --dport 10998 -j DNAT .*)$`).FindStringSubmatch(saved)
	if dnat == nil {
		tp.t.Fatalf("no DNAT rule for port 10998 in:\n%s", saved)
	}
	payload := fmt.Sprintf("*nat\n-D %s %s\n-A %s %s\nCOMMIT\n", dnat[1], dnat[2], dnat[1], dnat[2])
	for path, text := range map[string]string{rules: saved, changeOne: payload} {
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			tp.t.Fatal(err)
		}
	}
	ns := "lbt-f-" + tp.suffix
	mustRun(tp.t, "ip", "netns", "add", ns)
	defer mustRun(tp.t, "ip", "netns", "del", ns)
	script := `b=iptables-` + backend + `; s=$(date +%s%N); $b-restore --noflush "$1"; m=$(date +%s%N); $b-save >/dev/null; e=$(date +%s%N); ` +
		`$b-restore --noflush "$2"; c=$(date +%s%N); echo $((m-s)) $((e-m)) $((c-e))`
	var r, sv, ch int64
	if _, err := fmt.Sscan(tp.exec(ns, "bash", "-c", script, "floor", rules, changeOne), &r, &sv, &ch); err != nil {
		tp.t.Fatal(err)
	}
	return time.Duration(r), time.Duration(sv), time.Duration(ch)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
