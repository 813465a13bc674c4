//go:build dataplane

package dataplane

import (
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
)

// TestPortAddedWaitsForClusterIP: a TCP port added to a running Service while the "ClusterIP"
// does not serve it yet is held back: the client's connections are refused at once, never
// blackholed; once the ClusterIP accepts a connection, the port is served within a moment. Not
// serving it yet is, on the node, a reset (kube-proxy's nftables mode rejects a ClusterIP port it
// has no rule for: a refusal is no proof) and then dropped SYNs (its iptables mode). Held back
// longer than lbpod.GateBound, it is served anyway (and then blackholed, as before the gate).
func TestPortAddedWaitsForClusterIP(t *testing.T) {
	g, tp, svc := servedTopology(t, "v4", []string{clusterIPv4}, nil, "--port-gate")
	rule := func(op string, verdict ...string) {
		args := append([]string{"netns", "exec", tp.node, "iptables", op, "INPUT", "-p", "tcp", "-d", clusterIPv4, "--dport", "8443", "-j"}, verdict...)
		mustRun(t, "ip", args...)
	}
	reject := []string{"REJECT", "--reject-with", "tcp-reset"}
	iptables := func(op string) { rule(op, "DROP") }
	withExtra := append(append([]servicePort(nil), basePorts...), servicePort{Protocol: "TCP", Port: extraHTTPPort})
	dial := func(timeout time.Duration) error {
		c, err := dialIn(t, tp.client, "tcp", lbAddr(lbIPv4, extraHTTPPort), timeout)
		if err == nil {
			c.Close()
		}
		return err
	}
	logged := func(s string) func() bool {
		return func() bool { return strings.Count(tp.lbpod.logs.String(), s) > 0 }
	}

	rule("-I", reject...)
	writeService(t, svc, []string{clusterIPv4}, withExtra, nil)
	g.Eventually(logged("port held back (refused) until the ClusterIP serves it")).WithTimeout(3 * time.Second).WithPolling(20 * time.Millisecond).Should(BeTrue())
	g.Consistently(func() bool { return isRefused(dial(300 * time.Millisecond)) }).
		WithTimeout(400*time.Millisecond).WithPolling(100*time.Millisecond).Should(BeTrue(), "refused while held back")
	// The node's resets did not let the port through: the refusals were the lb pod's own.
	g.Expect(logged("port served by the ClusterIP: serving it")()).To(BeFalse(), "a refusal by the node let the port through")
	iptables("-I")
	rule("-D", reject...)
	g.Consistently(func() bool { return isRefused(dial(300 * time.Millisecond)) }).
		WithTimeout(400*time.Millisecond).WithPolling(100*time.Millisecond).Should(BeTrue(), "refused while held back")
	iptables("-D")
	removed := time.Now()
	g.Eventually(func() (string, error) { return httpGet(t, tp.client, lbAddr(lbIPv4, extraHTTPPort)) }).
		WithTimeout(2 * time.Second).WithPolling(20 * time.Millisecond).Should(Equal(httpReply(clusterIPv4, extraHTTPPort)))
	t.Logf("figure: portgate_served_after_clusterip_ms=%d (the node's drop removed -> the client's first answer on the added port)", time.Since(removed).Milliseconds())
	g.Expect(tp.lbpod.logs.String()).To(ContainSubstring("port served by the ClusterIP: serving it"))

	// Past the bound: served anyway, and the SYNs are lost on the node as before the gate.
	writeService(t, svc, []string{clusterIPv4}, basePorts, nil)
	g.Eventually(func() bool { return isRefused(dial(300 * time.Millisecond)) }).WithTimeout(3 * time.Second).WithPolling(50 * time.Millisecond).Should(BeTrue())
	iptables("-I")
	writeService(t, svc, []string{clusterIPv4}, withExtra, nil)
	g.Eventually(logged("port not answered by the ClusterIP within the bound: serving it anyway")).
		WithTimeout(5 * time.Second).WithPolling(50 * time.Millisecond).Should(BeTrue())
	g.Eventually(func() bool {
		var ne net.Error
		err := dial(300 * time.Millisecond)
		return errors.As(err, &ne) && ne.Timeout()
	}).WithTimeout(2*time.Second).WithPolling(50*time.Millisecond).Should(BeTrue(), "blackholed once served past the bound")
	iptables("-D")
}
