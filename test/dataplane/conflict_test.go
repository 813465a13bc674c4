//go:build dataplane

package dataplane

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
)

// neighbourMAC is the MAC a namespace's neighbour table gives ip on dev ("" when none).
func neighbourMAC(tp *topology, ns, dev, ip string) string {
	out := strings.Fields(tp.ip(ns, "neigh", "show", ip, "dev", dev))
	for i, f := range out {
		if f == "lladdr" && i+1 < len(out) {
			return out[i+1]
		}
	}
	return ""
}

// TestConflictProbe: a host on the underlay (the outsider namespace) already uses the LB address.
// lbpod with --conflict-probe fast probes before its first announcement (IPv4: an ARP probe from
// 0.0.0.0; IPv6: DAD, an NS from ::), hears the host, and holds nothing: net1 never carries the
// address, /readyz says why naming the host's MAC, lbpod_address_conflict shows it, and a client
// still reaches the host, not lbpod (its neighbour entry is the host's MAC).
func TestConflictProbe(t *testing.T) {
	for _, tc := range []struct{ stack, addr, dev, clusterIP string }{
		{"v4", lbIPv4, "c0", clusterIPv4},
		{"v6", lbIPv6, "c0", clusterIPv6},
	} {
		t.Run(tc.stack, func(t *testing.T) {
			g := NewWithT(t)
			tp := newTopology(t)
			tp.startBackends()
			if tc.stack == "v6" {
				tp.ip(tp.outsider, "addr", "add", tc.addr+"/64", "dev", "c0", "nodad")
			} else {
				tp.ip(tp.outsider, "addr", "add", tc.addr+"/16", "dev", "c0")
			}
			hostMAC := strings.TrimSpace(tp.exec(tp.outsider, "cat", "/sys/class/net/c0/address"))
			svc := filepath.Join(t.TempDir(), "svc.yaml")
			writeService(t, svc, []string{tc.clusterIP}, basePorts, nil)
			p := tp.startLBPod(svc, tc.stack, "--conflict-probe", "fast")

			want := fmt.Sprintf("in use on the underlay: %s answered by %s; not announced", tc.addr, hostMAC)
			g.Eventually(func() string { code, body := tp.readyz(); return fmt.Sprint(code, " ", strings.TrimSpace(body)) }).
				WithTimeout(5*time.Second).WithPolling(50*time.Millisecond).Should(Equal("503 not ready: "+want), "lbpod log:\n%s", p.logs.String())
			_, metrics := tp.healthGet("/metrics")
			g.Expect(metrics).To(ContainSubstring(fmt.Sprintf(`lbpod_address_conflict{address="%s",mac="%s"} 1`, tc.addr, hostMAC)))
			// Held by nobody but the host, also a while later (the loop's resyncs put nothing back).
			g.Consistently(func() string { return tp.ip(tp.lb, "addr", "show", "dev", "net1") }).
				WithTimeout(time.Second).WithPolling(100 * time.Millisecond).ShouldNot(ContainSubstring(tc.addr + "/"))
			_, err := dialIn(t, tp.client, "tcp", lbAddr(tc.addr, httpPort), time.Second)
			g.Expect(isRefused(err)).To(BeTrue(), "the host (no listener on the port) refuses: %v", err)
			g.Expect(neighbourMAC(tp, tp.client, "c0", tc.addr)).To(Equal(hostMAC))
			g.Expect(p.logs.String()).To(ContainSubstring("conflict probe: " + want))
		})
	}
}

// TestConflictProbeCost: with nobody on the address, the probe passes and lbpod serves; the
// figure is lbpod start → the client's first answer with --conflict-probe fast against off, in
// the same run, a fresh topology each (3 rounds, medians).
func TestConflictProbeCost(t *testing.T) {
	first := func(mode string) time.Duration {
		g := NewWithT(t)
		tp := newTopology(t)
		tp.startBackends()
		svc := filepath.Join(t.TempDir(), "svc.yaml")
		writeService(t, svc, []string{clusterIPv4}, basePorts, nil)
		start := time.Now()
		p := tp.startLBPod(svc, "v4", "--conflict-probe", mode)
		g.Eventually(func() (string, error) { return httpGet(t, tp.client, lbHTTPv4) }).
			WithTimeout(5 * time.Second).WithPolling(10 * time.Millisecond).Should(Equal(httpReply(clusterIPv4, httpPort)))
		took := time.Since(start)
		if mode == "fast" {
			g.Expect(p.logs.String()).To(ContainSubstring("conflict probe: nobody answered"))
		} else {
			g.Expect(p.logs.String()).NotTo(ContainSubstring("conflict probe"))
		}
		p.stop(t)
		return took
	}
	var fast, off []time.Duration
	for range 3 {
		off = append(off, first("off"))
		fast = append(fast, first("fast"))
	}
	median := func(d []time.Duration) time.Duration {
		s := slices.Clone(d)
		slices.Sort(s)
		return s[len(s)/2]
	}
	t.Logf("figure: conflict_probe_first_answer_ms fast=%d off=%d added=%d (lbpod start -> first HTTP answer from the client, medians of 3; runs fast %v off %v)",
		median(fast).Milliseconds(), median(off).Milliseconds(), (median(fast) - median(off)).Milliseconds(), fast, off)
}

// TestConflictProbeStandbys: two replicas, and the client on the underlay already holds the LB
// address. The first to take over advertises, probes, hears the client and holds nothing; it
// stays the election's active, so the other stays standby (it neither claims nor probes), and
// neither net1 ever carries the address.
func TestConflictProbeStandbys(t *testing.T) {
	g := NewWithT(t)
	svc := filepath.Join(t.TempDir(), "svc.yaml")
	writeService(t, svc, []string{clusterIPv4}, []servicePort{{Protocol: "UDP", Port: haEchoPort, TargetPort: haEchoPort}}, nil)
	tp := newHATopology(t)
	tp.addClusterSide()
	mustRun(t, "ip", "-n", tp.client, "addr", "add", haLB+"/16", "dev", "c0")
	clientMAC := strings.TrimSpace(mustRun(t, "ip", "netns", "exec", tp.client, "cat", "/sys/class/net/c0/address"))
	start := func(r string) *haReplica {
		return tp.startProcess(r, lbpodBin, "--service-file", svc, "--health-addr", "127.0.0.1:8081",
			"--addresses", haLB+"/16", "--gateways", gatewayV4, "--subnets", subnetV4,
			"--replicas", "2", "--ha-interval", haInterval.String(), "--conflict-probe", "fast")
	}
	a, b := start("a"), start("b")
	want := fmt.Sprintf("conflict probe: in use on the underlay: %s answered by %s; not announced", haLB, clientMAC)
	var prober, other *haReplica
	g.Eventually(func() bool {
		for _, pair := range [][2]*haReplica{{a, b}, {b, a}} {
			if strings.Contains(pair[0].logs.String(), want) {
				prober, other = pair[0], pair[1]
				return true
			}
		}
		return false
	}).WithTimeout(5*time.Second).WithPolling(20*time.Millisecond).Should(BeTrue(), "a:\n%s\nb:\n%s", a.logs.String(), b.logs.String())
	g.Consistently(func() []string {
		return []string{prober.role(), other.role(), fmt.Sprint(tp.holds("a")), fmt.Sprint(tp.holds("b"))}
	}).WithTimeout(1500 * time.Millisecond).WithPolling(50 * time.Millisecond).Should(Equal([]string{"active", "standby", "false", "false"}))
	g.Expect(other.logs.String()).NotTo(ContainSubstring("conflict probe"), "the standby never probed")
}
