//go:build dataplane

package dataplane

import (
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/gomega"
)

// The failover seam of lbpod.Loop: a standby holds every rule and route but not the LB address
// and announces nothing; SetActive(true) adds the address, reports it held, announces it (a burst
// of three, then periodically) and the client is served; SetActive(false) takes it away again.
func TestStandbyThenActive(t *testing.T) {
	g := NewWithT(t)
	tp := newTopology(t)
	tp.startBackends()
	garps := captureGARPs(t, tp.client, "c0", lbIPv4)
	svc := filepath.Join(t.TempDir(), "svc.yaml")
	writeService(t, svc, []string{clusterIPv4}, basePorts, nil)

	cmd := exec.Command("ip", append([]string{"netns", "exec", tp.lb, loopDriverBin, "--service-file", svc, "--standby", "--announce-interval", "300ms"}, stackArgs("v4")...)...)
	stdin, logs := startLoopDriver(t, cmd)

	g.Eventually(func() string { _, body := tp.readyz(); return body }).WithTimeout(10 * time.Second).WithPolling(50 * time.Millisecond).
		Should(Equal("ok: standby, not holding the LB address\n"))
	g.Expect(tp.ip(tp.lb, "-4", "-o", "addr", "show", "dev", "net1")).To(BeEmpty())
	g.Expect(tp.ip(tp.lb, "-o", "link", "show", "dev", "net1")).To(MatchRegexp(`<[^>]*\bUP\b`))
	g.Expect(tp.exec(tp.lb, "ip", "route", "show", "table", "100")).To(Equal("default via 172.18.0.1 dev net1 \n" +
		"10.109.201.193 via 10.16.0.1 dev eth0 \n" +
		"172.18.0.0/16 dev net1 scope link \n"))
	g.Expect(tp.exec(tp.lb, "ip", "rule")).To(ContainSubstring("32764:\tfrom all iif eth0 lookup 100\n32765:\tfrom all iif net1 lookup 100\n"))
	g.Expect(tp.exec(tp.lb, "iptables", "-t", "nat", "-S", "LBSVC-SERVICES")).To(ContainSubstring("--dport 80 -j DNAT --to-destination 10.109.201.193:80"))
	// Nothing announced over several announce intervals, nobody answers for the address.
	g.Consistently(func() int { return len(garps) }).WithTimeout(time.Second).WithPolling(100 * time.Millisecond).Should(BeZero())
	_, err := dialIn(t, tp.client, "tcp", lbHTTPv4, 300*time.Millisecond)
	g.Expect(err).To(MatchError(ContainSubstring("i/o timeout")), "no one holds the address: ARP goes unanswered")
	g.Expect(logs.String()).NotTo(ContainSubstring("held true"))
	_, metricsBody := tp.healthGet("/metrics")
	g.Expect(metricsBody).To(ContainSubstring("\nlbpod_active 0\n"))

	activated := time.Now()
	_, err = io.WriteString(stdin, "active\n")
	g.Expect(err).NotTo(HaveOccurred())
	g.Eventually(logs.String).WithTimeout(5 * time.Second).WithPolling(10 * time.Millisecond).Should(ContainSubstring("held true\n"))
	held := time.Since(activated)
	var first time.Duration
	g.Eventually(func() int { return len(garps) }).WithTimeout(5 * time.Second).WithPolling(10 * time.Millisecond).Should(BeNumerically(">=", 1))
	first = time.Since(activated)
	g.Eventually(func() (string, error) { return httpGet(t, tp.client, lbHTTPv4) }).
		WithTimeout(5 * time.Second).WithPolling(20 * time.Millisecond).Should(Equal(httpReply(clusterIPv4, httpPort)))
	served := time.Since(activated)
	// The burst (three) and the periodic ones: at least five within 2.5 s of activation.
	g.Eventually(func() int { return len(garps) }).WithTimeout(3 * time.Second).WithPolling(50 * time.Millisecond).Should(BeNumerically(">=", 5))
	fmt.Printf("figure: standby_to_held_ms=%d\nfigure: standby_to_first_garp_ms=%d\nfigure: standby_to_served_ms=%d\n",
		held.Milliseconds(), first.Milliseconds(), served.Milliseconds())
	_, metricsBody = tp.healthGet("/metrics")
	g.Expect(metricsBody).To(ContainSubstring("\nlbpod_active 1\n"))

	_, err = io.WriteString(stdin, "standby\n")
	g.Expect(err).NotTo(HaveOccurred())
	g.Eventually(logs.String).WithTimeout(5 * time.Second).WithPolling(10 * time.Millisecond).Should(ContainSubstring("held false\n"))
	g.Expect(tp.ip(tp.lb, "-4", "-o", "addr", "show", "dev", "net1")).To(BeEmpty())
	g.Expect(strings.Count(logs.String(), "held true")).To(Equal(1))
}

// startLoopDriver starts cmd (loopdriver in the lb namespace) with its stdin held open (it reads
// roles from it) and its output captured; cleanup stops it, and shows the log of a failed test.
func startLoopDriver(t *testing.T, cmd *exec.Cmd) (io.WriteCloser, *lockedBuffer) {
	t.Helper()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	logs := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		stdin.Close()
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("loopdriver log:\n%s", logs.String())
		}
	})
	return stdin, logs
}
