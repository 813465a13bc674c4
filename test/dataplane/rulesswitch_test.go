//go:build dataplane

package dataplane

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/lbsvc/lbsvc-operator/lbpod"
)

// An lbpod restarted in the same namespace with another rules back end (an lb pod container
// restarted after the default changed, or --lb-rules changed) removes what the other back end
// left, so nothing of the old rules stays in force: a port the Service dropped while lbpod was
// down is refused, not DNATed by a leftover rule, and the Service is served by the new back end
// alone, both families.
func TestRestartWithOtherRules(t *testing.T) {
	for _, c := range []struct {
		name          string
		first, second []string
		old           func(tp *topology) string // what the first back end holds of ours
		removed       int                       // changes logged as removed
		metric        string
	}{
		{"iptables-nft to the default", append([]string{"--iptables", "nft"}, iptRules...), nil, iptablesLeft("nft"), 18,
			`lbpod_rules_backend{backend="nftables",why="default"} 1`},
		{"iptables-legacy to the default", append([]string{"--iptables", "legacy"}, iptRules...), nil, iptablesLeft("legacy"), 18,
			`lbpod_rules_backend{backend="nftables",why="default"} 1`},
		{"the default to iptables", nil, append([]string{"--iptables", "nft"}, iptRules...), nftablesLeft, 2,
			`lbpod_rules_backend{backend="iptables",why="flag"} 1`},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := NewWithT(t)
			tp := newTopology(t)
			tp.startBackends()
			svc := filepath.Join(t.TempDir(), "svc.yaml")
			withExtra := append(append([]servicePort{}, basePorts...), servicePort{Protocol: "TCP", Port: extraHTTPPort})
			writeService(t, svc, []string{clusterIPv4, clusterIPv6}, withExtra, nil)
			first := tp.startLBPod(svc, "dual", c.first...)
			waitReady(g, tp)
			g.Expect(httpGet(t, tp.client, lbAddr(lbIPv4, extraHTTPPort))).To(Equal(httpReply(clusterIPv4, extraHTTPPort)))
			g.Expect(c.old(tp)).NotTo(BeEmpty(), "the first back end's rules, before the restart")

			// Down, the Service loses a port; up again with the other back end.
			first.stop(t)
			writeService(t, svc, []string{clusterIPv4, clusterIPv6}, basePorts, nil)
			second := tp.startLBPod(svc, "dual", c.second...)
			waitReady(g, tp)
			// Traffic first: what a leftover rule would do to a client.
			expectServed(g, tp, tp.client, lbIPv4, clusterIPv4)
			expectServed(g, tp, tp.client, lbIPv6, clusterIPv6)
			g.Expect(httpGet(t, tp.client, lbAddr(lbIPv4, extraHTTPPort))).Error().To(Satisfy(isRefused), "a leftover rule still DNATs the dropped port")
			g.Expect(httpGet(t, tp.client, lbAddr(lbIPv6, extraHTTPPort))).Error().To(Satisfy(isRefused), "a leftover rule still DNATs the dropped port")
			g.Expect(c.old(tp)).To(BeEmpty(), "the first back end's rules, after the restart")
			g.Expect(strings.Count(second.logs.String(), `msg="removed what the other rules back end left"`)).To(Equal(c.removed), second.logs.String())
			_, metrics := tp.healthGet("/metrics")
			g.Expect(strings.Split(metrics, "\n")).To(ContainElement(c.metric))
			// The new back end alone: with it, a restart finds nothing of the other to remove.
			second.stop(t)
			third := tp.startLBPod(svc, "dual", c.second...)
			waitReady(g, tp)
			g.Expect(third.logs.String()).NotTo(ContainSubstring("removed what the other rules back end left"))
			expectServed(g, tp, tp.client, lbIPv4, clusterIPv4)
		})
	}
}

// An lbpod restarted with another rules back end while the Service cannot be read (the API
// server down) leaves the other back end's rules in force until its own first apply: the
// address stays served and filtered by them, never bare on net1. Once the Service is read and
// applied, only the new back end's rules remain. Both present at once is safe: the first NAT
// chain that translates a connection wins, and either back end's filter lets through only what
// a DNAT created.
func TestRestartWithOtherRulesKeepsThemUntilApplied(t *testing.T) {
	iptables := append([]string{"--iptables", "nft"}, iptRules...)
	for _, c := range []struct {
		name          string
		first, second []string
		old, new      func(tp *topology) string
		removed       int
	}{
		{"iptables to the default", iptables, nil, iptablesLeft("nft"), nftablesLeft, 18},
		{"the default to iptables", nil, iptables, nftablesLeft, iptablesLeft("nft"), 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := NewWithT(t)
			tp := newTopology(t)
			tp.startBackends()
			svc := filepath.Join(t.TempDir(), "svc.yaml")
			writeService(t, svc, []string{clusterIPv4, clusterIPv6}, basePorts, nil)
			first := tp.startLBPod(svc, "dual", c.first...)
			waitReady(g, tp)
			old := c.old(tp)
			g.Expect(old).NotTo(BeEmpty(), "the first back end's rules")
			g.Expect(c.new(tp)).To(BeEmpty(), "the second back end's rules, before it ran")

			// Down, and up again with the other back end and no Service to read.
			first.stop(t)
			g.Expect(os.Rename(svc, svc+".away")).To(Succeed())
			second := tp.startLBPod(svc, "dual", c.second...)
			g.Eventually(func() string { _, body := tp.readyz(); return body }).WithTimeout(5 * time.Second).WithPolling(50 * time.Millisecond).
				Should(HaveSuffix("no such file or directory\n"))
			g.Expect(c.old(tp)).To(Equal(old), "the first back end's rules, while nothing was applied")
			g.Expect(c.new(tp)).To(BeEmpty(), "the second back end's rules, before its first apply")
			expectServed(g, tp, tp.client, lbIPv4, clusterIPv4)
			expectServed(g, tp, tp.client, lbIPv6, clusterIPv6)
			g.Expect(second.logs.String()).NotTo(ContainSubstring("removed what the other rules back end left"))

			// The Service back: applied by the new back end, then the old one's rules removed.
			g.Expect(os.Rename(svc+".away", svc)).To(Succeed())
			waitReady(g, tp)
			g.Eventually(func() string { return c.old(tp) }).WithTimeout(time.Second).WithPolling(20 * time.Millisecond).Should(BeEmpty())
			g.Expect(c.new(tp)).NotTo(BeEmpty(), "the second back end's rules")
			g.Expect(strings.Count(second.logs.String(), `msg="removed what the other rules back end left"`)).To(Equal(c.removed), second.logs.String())
			expectServed(g, tp, tp.client, lbIPv4, clusterIPv4)
			expectServed(g, tp, tp.client, lbIPv6, clusterIPv6)
		})
	}
}

// iptablesLeft returns what one iptables variant's save shows of ours, both families.
func iptablesLeft(variant string) func(tp *topology) string {
	return func(tp *topology) string {
		return ourLines(tp.exec(tp.lb, "iptables-"+variant+"-save")) + ourLines(tp.exec(tp.lb, "ip6tables-"+variant+"-save"))
	}
}

// nftablesLeft names the families that hold an nftables table of ours.
func nftablesLeft(tp *topology) string {
	conn := nftConn(tp.t, tp.lb)
	var out string
	for _, fam := range []lbpod.Family{lbpod.IPv4, lbpod.IPv6} {
		k, err := lbpod.ReadNFT(conn, fam, lbpod.NFTKernel{}, nil)
		if err != nil {
			tp.t.Fatal(err)
		}
		if k.Exists {
			out += fam.String() + " table " + lbpod.NFTTable + "\n"
		}
	}
	return out
}

// ourLines keeps the lines of an iptables-save output that name a chain of ours.
func ourLines(save string) string {
	var out []string
	for _, l := range strings.Split(save, "\n") {
		if strings.Contains(l, "LBSVC") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// Where nf_tables cannot be reached, the default falls back to iptables, says so once in the
// log and in lbpod_rules_backend, and serves; an explicit --rules nftables is an error at start.
// nf_tables cannot be taken out of one namespace of the running kernel, so nonft takes it away
// from lbpod and its children (the kernel's own answer to a netfilter netlink socket, as on a
// kernel without nfnetlink): the probe fails for real, and the fallback runs for real, with
// iptables-legacy, since iptables-nft cannot work there either.
func TestDefaultFallsBackWithoutNFTables(t *testing.T) {
	g := NewWithT(t)
	tp := newTopology(t)
	tp.startBackends()
	svc := filepath.Join(t.TempDir(), "svc.yaml")
	writeService(t, svc, []string{clusterIPv4}, basePorts, nil)

	out, err := exec.Command("ip", append([]string{"netns", "exec", tp.lb, nonftBin, lbpodBin, "init", "--service-file", svc, "--rules", "nftables"}, stackArgs("v4")...)...).CombinedOutput()
	g.Expect(err).To(HaveOccurred())
	g.Expect(string(out)).To(Equal("lbpod init: rules nftables: nf_tables cannot be used in this network namespace (socket: protocol not supported): "+
		"run with --rules iptables (LBPOD_RULES; the operator's --lb-rules) to use iptables instead, or with --rules auto to fall back to it by itself\n"), "%s", out)

	p := tp.startCommand(append([]string{nonftBin, lbpodBin, "--service-file", svc, "--health-addr", "127.0.0.1:8081"}, stackArgs("v4")...)...)
	waitReady(g, tp)
	expectServed(g, tp, tp.client, lbIPv4, clusterIPv4)
	logs := p.logs.String()
	g.Expect(strings.Count(logs, "why=fallback")).To(Equal(1), logs)
	g.Expect(logs).To(ContainSubstring(`level=WARN msg="rules back end" rules=iptables why=fallback nftables="socket: protocol not supported"` + "\n"))
	_, metrics := tp.healthGet("/metrics")
	g.Expect(strings.Split(metrics, "\n")).To(ContainElement(`lbpod_rules_backend{backend="iptables",why="fallback"} 1`))
	g.Expect(strings.Split(tp.exec(tp.lb, "iptables-legacy-save", "-t", "nat"), "\n")).To(ContainElement(
		"-A LBSVC-SERVICES -d 172.18.0.18/32 -p tcp -m tcp --dport 80 -j DNAT --to-destination 10.109.201.193:80"))
	k, err := lbpod.ReadNFT(nftConn(t, tp.lb), lbpod.IPv4, lbpod.NFTKernel{}, nil)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(k.Exists).To(BeFalse(), "no nftables table of ours")
}
