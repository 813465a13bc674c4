//go:build dataplane

package dataplane

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
)

var (
	counterRe = regexp.MustCompile(` -c (\d+) \d+ `)
	linkLocal = regexp.MustCompile(`inet6 (fe80::[0-9a-f:]+)/64`)
)

// packets returns the packet counter of the one rule of chain (filter table) whose `-S -v`
// line, counters cut out, equals rule; cmd is iptables or ip6tables.
func (tp *topology) packets(cmd, chain, rule string) int {
	tp.t.Helper()
	for _, l := range strings.Split(tp.exec(tp.lb, cmd, "-t", "filter", "-S", chain, "-v"), "\n") {
		m := counterRe.FindStringSubmatchIndex(l)
		if m == nil || l[:m[0]]+" "+l[m[1]:] != rule {
			continue
		}
		n, err := strconv.Atoi(l[m[2]:m[3]])
		if err != nil {
			tp.t.Fatal(err)
		}
		return n
	}
	tp.t.Fatalf("%s -S %s has no rule %q:\n%s", cmd, chain, rule, tp.exec(tp.lb, cmd, "-S", chain))
	return 0
}

// refusal is how a probe from the underlay must fail, and which rule must count it.
type refusal struct {
	name    string
	network string // tcp, udp
	addr    string
	// timeout: no answer at all (dropped); otherwise refused (TCP reset / ICMP port unreachable).
	timeout bool
	cmd     string // iptables or ip6tables
	chain   string
	rule    string
}

// expectRefused runs each probe from ns and checks how it failed and that its rule counted it.
func (tp *topology) expectRefused(g Gomega, ns string, probes []refusal) {
	tp.t.Helper()
	for _, p := range probes {
		before := tp.packets(p.cmd, p.chain, p.rule)
		var err error
		if p.network == "udp" {
			_, err = udpExchange(tp.t, ns, p.addr, "probe")
		} else {
			var c net.Conn
			c, err = dialIn(tp.t, ns, "tcp", p.addr, 400*time.Millisecond)
			if err == nil {
				c.Close()
			}
		}
		if p.timeout {
			g.Expect(err).To(MatchError(ContainSubstring("i/o timeout")), "%s: %s %s must get no answer", p.name, p.network, p.addr)
		} else {
			g.Expect(err).To(Satisfy(isRefused), "%s: %s %s must be refused", p.name, p.network, p.addr)
		}
		g.Expect(tp.packets(p.cmd, p.chain, p.rule)).To(BeNumerically(">", before), "%s: counted by %s %s %q", p.name, p.cmd, p.chain, p.rule)
	}
}

// Everything the underlay can try that is not a Service port, from the client of an IPv4-only
// lb pod whose health server listens on the pod IP only (LBPOD_POD_IP, as in a cluster; the
// kubelet's path, the node to the pod IP, works): the health port and other
// ports on the LB address are refused by LBSVC-INPUT's REJECT rules; the pod IP through net1,
// net1's IPv6 link-local address and the pod's IPv6 address get no answer (LBSVC-INPUT's DROP
// rules, the IPv6 one installed although the Service has no IPv6); the ClusterIP and the node
// through the lb pod get no answer (LBSVC-FORWARD, both families).
func TestExposureFromUnderlayIPv4Only(t *testing.T) {
	g := NewWithT(t)
	tp := newTopology(t)
	tp.startBackends()
	svc := filepath.Join(t.TempDir(), "svc.yaml")
	writeService(t, svc, []string{clusterIPv4}, basePorts, nil)
	tp.startCommand(append(append([]string{"env", "LBPOD_POD_IP=" + podV4, lbpodBin, "--service-file", svc}, iptRules...), stackArgs("v4")...)...)
	g.Eventually(func() (string, error) { return httpGetPath(t, tp.node, net.JoinHostPort(podV4, "8081"), "/readyz") }).
		WithTimeout(5 * time.Second).WithPolling(50 * time.Millisecond).Should(Equal("ok\n"))
	expectServed(g, tp, tp.client, lbIPv4, clusterIPv4)
	// The health server listens on LBPOD_POD_IP only: one TCP listener on 8081, no wildcard, no
	// net1 address; inside the pod, loopback is not the pod IP either.
	g.Expect(tp.lbpod.logs.String()).To(ContainSubstring(`msg="health server address" addr=10.16.0.2:8081 why=LBPOD_POD_IP`))
	g.Expect(strings.Fields(tp.exec(tp.lb, "ss", "-Htln", "sport = :8081"))).To(ContainElement("10.16.0.2:8081"))
	g.Expect(strings.Count(tp.exec(tp.lb, "ss", "-Htln", "sport = :8081"), "\n")).To(Equal(1))
	g.Expect(httpGet(t, tp.lb, "127.0.0.1:8081")).Error().To(Satisfy(isRefused))

	// Until duplicate address detection ends the link-local address is tentative and receives
	// nothing, which would hide what the rules do.
	g.Eventually(func() string { return tp.ip(tp.lb, "-6", "addr", "show", "dev", "net1", "scope", "link") }).
		WithTimeout(5 * time.Second).WithPolling(50 * time.Millisecond).Should(SatisfyAll(MatchRegexp(`inet6 fe80::`), Not(ContainSubstring("tentative"))))
	m := linkLocal.FindStringSubmatch(tp.ip(tp.lb, "-6", "addr", "show", "dev", "net1", "scope", "link"))
	g.Expect(m).To(HaveLen(2), "net1 has an IPv6 link-local address")
	ll := m[1] + "%c0"
	// Resolved by hand: the IPv6 guard drops neighbour discovery on net1 too, and the probes
	// below must reach the rule that drops them, not die unresolved on the client.
	mac := strings.TrimSpace(tp.exec(tp.lb, "cat", "/sys/class/net/net1/address"))
	tp.ip(tp.client, "-6", "neigh", "replace", m[1], "lladdr", mac, "dev", "c0", "nud", "permanent")
	// As in a pod run with --forwarding-sysctls=all: IPv6 forwarding on although the Service has
	// no IPv6, so that only the guard keeps the pod from routing IPv6 from the underlay.
	tp.exec(tp.lb, "sysctl", "-qw", "net.ipv6.conf.all.forwarding=1")
	tp.ip(tp.client, "route", "add", podV4+"/32", "via", lbIPv4, "dev", "c0")
	tp.ip(tp.client, "route", "add", clusterIPv4+"/32", "via", lbIPv4, "dev", "c0")
	tp.ip(tp.client, "-6", "route", "add", podV6+"/128", "via", m[1], "dev", "c0")
	tp.ip(tp.client, "-6", "route", "add", clusterIPv6+"/128", "via", m[1], "dev", "c0")

	const (
		rejectTCP = "-A LBSVC-INPUT -d 172.18.0.18/32 -p tcp -j REJECT --reject-with tcp-reset"
		rejectUDP = "-A LBSVC-INPUT -d 172.18.0.18/32 -p udp -j REJECT --reject-with icmp-port-unreachable"
		dropOther = "-A LBSVC-INPUT ! -d 172.18.0.18/32 -i net1 -j DROP"
		drop6In   = "-A LBSVC-INPUT -i net1 -j DROP"
		drop4Fwd  = "-A LBSVC-FORWARD -i net1 -m conntrack ! --ctstate DNAT -j DROP"
		drop6Fwd  = "-A LBSVC-FORWARD -i net1 -j DROP"
	)
	tp.expectRefused(g, tp.client, []refusal{
		{"health port on the LB address", "tcp", lbAddr(lbIPv4, 8081), false, "iptables", "LBSVC-INPUT", rejectTCP},
		{"another TCP port on the LB address", "tcp", lbAddr(lbIPv4, 22), false, "iptables", "LBSVC-INPUT", rejectTCP},
		{"another UDP port on the LB address", "udp", lbAddr(lbIPv4, 5353), false, "iptables", "LBSVC-INPUT", rejectUDP},
		{"health port on the pod IP through net1", "tcp", net.JoinHostPort(podV4, "8081"), true, "iptables", "LBSVC-INPUT", dropOther},
		{"health port on net1's IPv6 link-local", "tcp", net.JoinHostPort(ll, "8081"), true, "ip6tables", "LBSVC-INPUT", drop6In},
		{"health port on the pod's IPv6 through net1", "tcp", net.JoinHostPort(podV6, "8081"), true, "ip6tables", "LBSVC-INPUT", drop6In},
		{"ClusterIP through the lb pod", "tcp", lbAddr(clusterIPv4, httpPort), true, "iptables", "LBSVC-FORWARD", drop4Fwd},
		{"IPv6 ClusterIP through the lb pod", "tcp", lbAddr(clusterIPv6, httpPort), true, "ip6tables", "LBSVC-FORWARD", drop6Fwd},
	})
	// And the Service is still served.
	expectServed(g, tp, tp.client, lbIPv4, clusterIPv4)
}

// The same for a dual-stack lb pod, over IPv6: the health port and other ports on the IPv6 LB
// address are refused by ip6tables' REJECT rules, and the IPv6 ClusterIP routed through the LB
// address gets nothing (LBSVC-FORWARD).
func TestExposureFromUnderlayIPv6(t *testing.T) {
	g, tp, _ := servedTopology(t, "dual", []string{clusterIPv4, clusterIPv6}, nil, iptRules...)
	expectServed(g, tp, tp.client, lbIPv6, clusterIPv6)
	tp.ip(tp.client, "-6", "route", "add", clusterIPv6+"/128", "via", lbIPv6, "dev", "c0")
	tp.ip(tp.client, "-6", "route", "add", podV6+"/128", "via", lbIPv6, "dev", "c0")
	const (
		rejectTCP = "-A LBSVC-INPUT -d fd18::18/128 -p tcp -j REJECT --reject-with tcp-reset"
		rejectUDP = "-A LBSVC-INPUT -d fd18::18/128 -p udp -j REJECT --reject-with icmp6-port-unreachable"
		dropOther = "-A LBSVC-INPUT ! -d fd18::18/128 -i net1 -j DROP"
		dropFwd   = "-A LBSVC-FORWARD -i net1 -m conntrack ! --ctstate DNAT -j DROP"
	)
	tp.expectRefused(g, tp.client, []refusal{
		{"health port on the IPv6 LB address", "tcp", lbAddr(lbIPv6, 8081), false, "ip6tables", "LBSVC-INPUT", rejectTCP},
		{"another TCP port on the IPv6 LB address", "tcp", lbAddr(lbIPv6, 22), false, "ip6tables", "LBSVC-INPUT", rejectTCP},
		{"another UDP port on the IPv6 LB address", "udp", lbAddr(lbIPv6, 5353), false, "ip6tables", "LBSVC-INPUT", rejectUDP},
		{"health port on the pod's IPv6 through net1", "tcp", net.JoinHostPort(podV6, "8081"), true, "ip6tables", "LBSVC-INPUT", dropOther},
		{"IPv6 ClusterIP through the lb pod", "tcp", lbAddr(clusterIPv6, httpPort), true, "ip6tables", "LBSVC-FORWARD", dropFwd},
	})
	// ICMPv6 from net1 passes only to the LB address (ping) and to link-local and multicast
	// addresses (neighbour discovery): an echo to the pod's own IPv6 address gets no answer.
	g.Expect(icmpEcho(t, tp.client, lbIPv6)).To(Succeed(), "echo to the IPv6 LB address")
	before := tp.packets("ip6tables", "LBSVC-INPUT", dropOther)
	g.Expect(icmpEcho(t, tp.client, podV6)).To(MatchError(ContainSubstring("i/o timeout")), "echo to the pod's IPv6 address through net1")
	g.Expect(tp.packets("ip6tables", "LBSVC-INPUT", dropOther)).To(BeNumerically(">", before))
	expectServed(g, tp, tp.client, lbIPv6, clusterIPv6)
}

// icmpEcho sends one ICMP (IPv4) or ICMPv6 echo request from namespace ns to dst and waits
// 400 ms for its reply.
func icmpEcho(t testing.TB, ns, dst string) error {
	network, listen, proto := "ip4:icmp", "0.0.0.0", 1
	var request, reply icmp.Type = ipv4.ICMPTypeEcho, ipv4.ICMPTypeEchoReply
	if netip.MustParseAddr(dst).Is6() {
		network, listen, proto = "ip6:ipv6-icmp", "::", 58
		request, reply = ipv6.ICMPTypeEchoRequest, ipv6.ICMPTypeEchoReply
	}
	return inNS(t, ns, func() error {
		c, err := icmp.ListenPacket(network, listen)
		if err != nil {
			return err
		}
		defer c.Close()
		req, err := (&icmp.Message{Type: request, Body: &icmp.Echo{ID: os.Getpid() & 0xffff, Seq: 1, Data: []byte("lbsvc")}}).Marshal(nil)
		if err != nil {
			return err
		}
		if _, err := c.WriteTo(req, &net.IPAddr{IP: net.ParseIP(dst)}); err != nil {
			return err
		}
		if err := c.SetReadDeadline(time.Now().Add(400 * time.Millisecond)); err != nil {
			return err
		}
		buf := make([]byte, 1500)
		for {
			n, peer, err := c.ReadFrom(buf)
			if err != nil {
				return err
			}
			// The socket gets every ICMP message of the namespace (neighbour discovery too).
			if m, err := icmp.ParseMessage(proto, buf[:n]); err == nil && m.Type == reply && peer.String() == dst {
				return nil
			}
		}
	})
}

// An IPv6 LB address for an IPv4-only Service (the Subnet's family is not the Service's) is a
// named problem: the lb pod is not ready and says why; the IPv6 address refuses at once (a TCP
// reset, no blackhole) while the IPv4 one is served.
func TestFamilyMismatchIsNotReady(t *testing.T) {
	g := NewWithT(t)
	tp := newTopology(t)
	tp.startBackends()
	svc := filepath.Join(t.TempDir(), "svc.yaml")
	writeService(t, svc, []string{clusterIPv4}, basePorts, nil)
	tp.startLBPod(svc, "dual", iptRules...)
	g.Eventually(func() string { _, body := tp.readyz(); return body }).WithTimeout(5 * time.Second).WithPolling(50 * time.Millisecond).
		Should(Equal("not ready: FamilyMismatch: LB address fd18::18 is IPv6 but the Service has no IPv6 ClusterIP (spec.clusterIPs [10.109.201.193]): nothing would be forwarded to it; give the Service that family (spec.ipFamilies, spec.ipFamilyPolicy) or use a Subnet of its family\n"))
	code, _ := tp.readyz()
	g.Expect(code).To(Equal(503))
	expectServed(g, tp, tp.client, lbIPv4, clusterIPv4)
	tp.expectRefused(g, tp.client, []refusal{
		{"the mismatched address", "tcp", lbHTTPv6, false, "ip6tables", "LBSVC-INPUT", "-A LBSVC-INPUT -d fd18::18/128 -p tcp -j REJECT --reject-with tcp-reset"},
	})
	g.Expect(tp.lbpod.logs.String()).To(ContainSubstring(`msg="not ready" reason="FamilyMismatch: LB address fd18::18 is IPv6 but`))
}

// A kernel that refuses SCTP rules (no xt_sctp) fails only the SCTP ports: TCP and UDP are
// served, /readyz stays OK and says which ports are not served, and so do the log and
// lbpod_unserved_ports. iptables-restore is wrapped to refuse any payload with an SCTP match,
// as the kernel would, so that the host's modules are left alone.
func TestSCTPUnavailableFailsOnlySCTPPorts(t *testing.T) {
	g, tp, _ := servedBehindRestore(t, func(_, real string) string {
		return "case \"$payload\" in *'-m sctp'*) echo \"iptables-restore v1.8.9: Couldn't load match \\`sctp':No such file or directory\" >&2; exit 2;; esac\n" +
			"printf '%s\\n' \"$payload\" | exec " + real + " \"$@\"\n"
	})

	const note = "SCTPUnavailable: SCTP ports 3868 not served: the kernel refused the SCTP rules (no SCTP match or conntrack: modules xt_sctp, nf_conntrack_proto_sctp); the other ports are served. Load the modules on the node and restart the pod"
	g.Eventually(func() string { _, body := tp.readyz(); return body }).WithTimeout(5 * time.Second).WithPolling(50 * time.Millisecond).
		Should(Equal("ok: " + note + "\n"))
	expectServed(g, tp, tp.client, lbIPv4, clusterIPv4)
	g.Expect(tp.exec(tp.lb, "iptables", "-t", "nat", "-S", "LBSVC-SERVICES")).NotTo(ContainSubstring("sctp"))
	_, metrics := tp.healthGet("/metrics")
	g.Expect(metrics).To(ContainSubstring("\nlbpod_unserved_ports{protocol=\"SCTP\"} 1\n"))
	logs := tp.lbpod.logs.String()
	g.Expect(logs).To(ContainSubstring(`msg="the kernel refused the SCTP rules; serving the other ports"`))
	g.Expect(logs).To(ContainSubstring(fmt.Sprintf("msg=\"serving with a problem\" reason=SCTPUnavailable message=%q", strings.TrimPrefix(note, "SCTPUnavailable: "))))
}

// A transaction with the SCTP rules refused, then not (the xtables lock held past
// iptables-restore's wait, a timeout): SCTP stays served, with no SCTPUnavailable. Before, such a
// refusal (twice in a row: the applier retries once by itself) turned the SCTP ports off for the
// pod's life. iptables-restore is wrapped to refuse the first two payloads with an SCTP match.
func TestSCTPRefusedThenAcceptedStaysServed(t *testing.T) {
	// Refused twice: the applier reads the tables again after a refusal and retries at once, so
	// one refusal alone never reaches the SCTP fallback.
	g, tp, bin := servedBehindRestore(t, func(bin, real string) string {
		count := filepath.Join(bin, "refused")
		return "case \"$payload\" in *'-m sctp'*) n=$(cat " + count + " 2>/dev/null || echo 0); if [ \"$n\" -lt 2 ]; then echo $((n+1)) > " + count +
			"; echo 'iptables-restore: Another app is currently holding the xtables lock' >&2; exit 4; fi;; esac\n" +
			"printf '%s\\n' \"$payload\" | exec " + real + " \"$@\"\n"
	})
	count := filepath.Join(bin, "refused")

	g.Eventually(func() string { _, body := tp.readyz(); return body }).WithTimeout(5 * time.Second).WithPolling(50 * time.Millisecond).
		Should(Equal("ok\n"))
	g.Expect(os.ReadFile(count)).To(Equal([]byte("2\n")), "the wrapper refused the transactions with the SCTP rules twice")
	expectServed(g, tp, tp.client, lbIPv4, clusterIPv4)
	g.Expect(tp.exec(tp.lb, "iptables", "-t", "nat", "-S", "LBSVC-SERVICES")).To(ContainSubstring("-p sctp -m sctp --dport 3868"))
	_, metrics := tp.healthGet("/metrics")
	g.Expect(metrics).To(ContainSubstring("\nlbpod_unserved_ports{protocol=\"SCTP\"} 0\n"))
	g.Expect(tp.lbpod.logs.String()).To(ContainSubstring(`msg="a transaction with the SCTP rules was refused once, then went in: SCTP is served"`))
}

// servedBehindRestore starts the backends and an lb pod of the base Service on the iptables back
// end whose iptables-restore is a shell wrapper: the payload read into $payload, then body(bin,
// real), where bin is the wrapper's directory (for its own files) and real the iptables-restore
// it stands in front of. It returns bin.
func servedBehindRestore(t *testing.T, body func(bin, real string) string) (Gomega, *topology, string) {
	g := NewWithT(t)
	tp := newTopology(t)
	tp.startBackends()
	real, err := exec.LookPath("iptables-restore")
	g.Expect(err).NotTo(HaveOccurred())
	bin := t.TempDir()
	wrapper := "#!/bin/sh\npayload=$(cat)\n" + body(bin, real)
	g.Expect(os.WriteFile(filepath.Join(bin, "iptables-restore"), []byte(wrapper), 0o755)).To(Succeed())
	svc := filepath.Join(t.TempDir(), "svc.yaml")
	writeService(t, svc, []string{clusterIPv4}, basePorts, nil)
	tp.startCommand(append([]string{"env", "PATH=" + bin + ":" + os.Getenv("PATH"), lbpodBin, "--service-file", svc, "--health-addr", "127.0.0.1:8081", "--iptables", "plain", "--rules", "iptables"}, stackArgs("v4")...)...)
	return g, tp, bin
}
