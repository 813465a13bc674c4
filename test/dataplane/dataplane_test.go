//go:build dataplane

package dataplane

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/gomega"
)

var (
	lbHTTPv4 = net.JoinHostPort(lbIPv4, fmt.Sprint(httpPort))
	lbHTTPv6 = net.JoinHostPort(lbIPv6, fmt.Sprint(httpPort))
)

func lbAddr(ip string, port int) string { return net.JoinHostPort(ip, fmt.Sprint(port)) }

// servedTopology builds a topology with its backends, writes a Service with basePorts, starts
// lbpod and waits until it is ready.
func servedTopology(t *testing.T, stack string, clusterIPs, sourceRanges []string, extra ...string) (Gomega, *topology, string) {
	t.Helper()
	g := NewWithT(t)
	tp := newTopology(t)
	tp.startBackends()
	svc := filepath.Join(t.TempDir(), "svc.yaml")
	writeService(t, svc, clusterIPs, basePorts, sourceRanges)
	tp.startLBPod(svc, stack, extra...)
	waitReady(g, tp)
	return g, tp, svc
}

// waitReady waits until lbpod reports ready.
func waitReady(g Gomega, tp *topology) {
	g.Eventually(func() int { code, _ := tp.readyz(); return code }).
		WithTimeout(5 * time.Second).WithPolling(50 * time.Millisecond).Should(Equal(200))
}

// expectServed asserts HTTP on httpPort and UDP on udpPort reach the backend through lbIP.
func expectServed(g Gomega, tp *topology, clientNS, lbIP, clusterIP string) {
	g.Eventually(func() (string, error) { return httpGet(tp.t, clientNS, lbAddr(lbIP, httpPort)) }).
		WithTimeout(3 * time.Second).WithPolling(50 * time.Millisecond).Should(Equal(httpReply(clusterIP, httpPort)))
	g.Expect(udpExchange(tp.t, clientNS, lbAddr(lbIP, udpPort), "ping")).To(Equal(udpReply(clusterIP, udpPort, "ping")))
}

var basePorts = []servicePort{
	{Protocol: "TCP", Port: httpPort},
	{Protocol: "TCP", Port: echoPort},
	{Protocol: "UDP", Port: udpPort},
	{Protocol: "SCTP", Port: 3868},
}

// TCP (HTTP) and UDP reach the backend through the LB address on the Service's port (the
// targetPort, 8080, has no listener), and the SCTP rules are installed.
func TestTCPUDPAndSCTPRulesIPv4(t *testing.T) {
	// The health server on all addresses, as in the pod.
	g, tp, _ := servedTopology(t, "v4", []string{clusterIPv4}, nil, append([]string{"--health-addr", ":8081"}, iptRules...)...)
	expectServed(g, tp, tp.client, lbIPv4, clusterIPv4)
	// The kubelet reaches it on the pod IP; the underlay does not, on the LB address.
	g.Expect(httpGetPath(t, tp.node, net.JoinHostPort(podV4, "8081"), "/healthz")).To(Equal("ok\n"))
	g.Expect(httpGet(t, tp.client, lbAddr(lbIPv4, 8081))).Error().To(Satisfy(isRefused))

	nat := tp.exec(tp.lb, "iptables-save", "-t", "nat")
	for _, line := range []string{
		"-A PREROUTING -j LBSVC-PREROUTING",
		"-A POSTROUTING -j LBSVC-POSTROUTING",
		"-A LBSVC-PREROUTING -d 172.18.0.18/32 -i net1 -j LBSVC-SERVICES",
		"-A LBSVC-SERVICES -d 172.18.0.18/32 -p tcp -m tcp --dport 80 -j DNAT --to-destination 10.109.201.193:80",
		"-A LBSVC-SERVICES -d 172.18.0.18/32 -p udp -m udp --dport 53 -j DNAT --to-destination 10.109.201.193:53",
		"-A LBSVC-SERVICES -d 172.18.0.18/32 -p sctp -m sctp --dport 3868 -j DNAT --to-destination 10.109.201.193:3868",
		"-A LBSVC-POSTROUTING -d 10.109.201.193/32 -j MASQUERADE",
	} {
		g.Expect(strings.Split(nat, "\n")).To(ContainElement(line), "iptables-save -t nat:\n%s", nat)
	}
	g.Expect(nat).NotTo(ContainSubstring("8080"), "DNAT must go to the Service port, never the targetPort")
}

// holdEcho opens a TCP connection from the client to the echo port on the LB address, closed
// when the test ends, and returns a function that sends one line on it and expects its echo
// within 1 s.
func holdEcho(t *testing.T, g Gomega, tp *topology) func(line string) {
	held, err := dialIn(t, tp.client, "tcp", lbAddr(lbIPv4, echoPort), time.Second)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { held.Close() })
	reader := bufio.NewReader(held)
	return func(line string) {
		t.Helper()
		g.Expect(held.SetDeadline(time.Now().Add(time.Second))).To(Succeed())
		_, err := fmt.Fprintln(held, line)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(reader.ReadString('\n')).To(Equal(echoReply(echoPort, line)))
	}
}

// A port added while lbpod runs is served within 1 s, a removed one is refused within 1 s, and a
// TCP connection held open on an unchanged port keeps working across both changes.
func TestPortChangesKeepEstablishedFlows(t *testing.T) {
	g, tp, svc := servedTopology(t, "v4", []string{clusterIPv4}, nil)

	exchange := holdEcho(t, g, tp)
	exchange("before")

	g.Expect(httpGet(t, tp.client, lbAddr(lbIPv4, extraHTTPPort))).Error().To(Satisfy(isRefused))
	writeService(t, svc, []string{clusterIPv4}, append(basePorts, servicePort{Protocol: "TCP", Port: extraHTTPPort}), nil)
	added := time.Now()
	g.Eventually(func() (string, error) { return httpGet(t, tp.client, lbAddr(lbIPv4, extraHTTPPort)) }).
		WithTimeout(time.Second).WithPolling(20 * time.Millisecond).Should(Equal(httpReply(clusterIPv4, extraHTTPPort)))
	t.Logf("added port served after %s", time.Since(added).Round(time.Millisecond))
	exchange("after add")

	writeService(t, svc, []string{clusterIPv4}, basePorts, nil)
	removed := time.Now()
	g.Eventually(func() error { _, err := httpGet(t, tp.client, lbAddr(lbIPv4, extraHTTPPort)); return err }).
		WithTimeout(time.Second).WithPolling(20 * time.Millisecond).Should(Satisfy(isRefused))
	t.Logf("removed port refused after %s", time.Since(removed).Round(time.Millisecond))
	exchange("after remove")
	g.Expect(httpGet(t, tp.client, lbHTTPv4)).To(Equal(httpReply(clusterIPv4, httpPort)))
}

// kernelState is what must not change when init runs again.
func (tp *topology) kernelState() string {
	var b strings.Builder
	for _, cmd := range [][]string{
		{"iptables-save"}, {"ip6tables-save"},
		{"ip", "rule"}, {"ip", "-6", "rule"},
		{"ip", "route", "show", "table", "100"}, {"ip", "-6", "route", "show", "table", "100"},
		{"ip", "addr", "show", "dev", "net1"},
	} {
		out := tp.exec(tp.lb, cmd...)
		if strings.HasSuffix(cmd[0], "-save") {
			out = saveWithoutComments(out)
		}
		fmt.Fprintf(&b, "$ %s\n%s", strings.Join(cmd, " "), out)
	}
	return b.String()
}

// `lbpod init` twice leaves iptables-save, ip rule and table 100 byte-identical, and with the
// seed's configuration they read exactly as in the seed.
func TestInitTwiceIsIdempotent(t *testing.T) {
	g := NewWithT(t)
	tp := newTopology(t)
	svc := filepath.Join(t.TempDir(), "svc.yaml")
	writeService(t, svc, []string{clusterIPv4, clusterIPv6}, []servicePort{{Protocol: "TCP", Port: 80}}, nil)

	out, err := tp.runInit(svc, "dual", iptRules...)
	g.Expect(err).NotTo(HaveOccurred(), out)
	first := tp.kernelState()
	out, err = tp.runInit(svc, "dual", iptRules...)
	g.Expect(err).NotTo(HaveOccurred(), out)
	g.Expect(out).To(ContainSubstring(`msg=applied changes=0 `))
	g.Expect(tp.kernelState()).To(Equal(first))

	// The seed's listings (iproute2 ends route lines with a space).
	g.Expect(tp.exec(tp.lb, "ip", "rule")).To(Equal("0:\tfrom all lookup local\n" +
		"32763:\tfrom 172.18.0.18 lookup 100\n" +
		"32764:\tfrom all iif eth0 lookup 100\n" +
		"32765:\tfrom all iif net1 lookup 100\n" +
		"32766:\tfrom all lookup main\n" +
		"32767:\tfrom all lookup default\n"))
	g.Expect(tp.exec(tp.lb, "ip", "route", "show", "table", "100")).To(Equal("default via 172.18.0.1 dev net1 \n" +
		"10.109.201.193 via 10.16.0.1 dev eth0 \n" +
		"172.18.0.0/16 dev net1 scope link \n"))
	g.Expect(tp.exec(tp.lb, "ip", "-6", "route", "show", "table", "100")).To(Equal("fd18::/64 dev net1 metric 1024 pref medium\n" +
		"fd96::c1 via fd16::1 dev eth0 metric 1024 pref medium\n" +
		"default via fd18::1 dev net1 metric 1024 pref medium\n"))
	g.Expect(tp.exec(tp.lb, "iptables", "-t", "nat", "-S")).To(Equal("-P PREROUTING ACCEPT\n" +
		"-P INPUT ACCEPT\n" +
		"-P OUTPUT ACCEPT\n" +
		"-P POSTROUTING ACCEPT\n" +
		"-N LBSVC-POSTROUTING\n" +
		"-N LBSVC-PREROUTING\n" +
		"-N LBSVC-SERVICES\n" +
		"-A PREROUTING -j LBSVC-PREROUTING\n" +
		"-A POSTROUTING -j LBSVC-POSTROUTING\n" +
		"-A LBSVC-POSTROUTING -d 10.109.201.193/32 -j MASQUERADE\n" +
		"-A LBSVC-PREROUTING -d 172.18.0.18/32 -i net1 -j LBSVC-SERVICES\n" +
		"-A LBSVC-SERVICES -d 172.18.0.18/32 -p tcp -m tcp --dport 80 -j DNAT --to-destination 10.109.201.193:80\n"))
	g.Expect(tp.exec(tp.lb, "iptables", "-t", "filter", "-S")).To(Equal("-P INPUT ACCEPT\n" +
		"-P FORWARD ACCEPT\n" +
		"-P OUTPUT ACCEPT\n" +
		"-N LBSVC-FORWARD\n" +
		"-N LBSVC-INPUT\n" +
		"-A INPUT -j LBSVC-INPUT\n" +
		"-A FORWARD -j LBSVC-FORWARD\n" +
		"-A LBSVC-FORWARD -i net1 -m conntrack ! --ctstate DNAT -j DROP\n" +
		"-A LBSVC-FORWARD -i eth0 -o net1 -m conntrack ! --ctstate DNAT -j DROP\n" +
		"-A LBSVC-INPUT -d 172.18.0.18/32 -p tcp -j REJECT --reject-with tcp-reset\n" +
		"-A LBSVC-INPUT -d 172.18.0.18/32 -p udp -j REJECT --reject-with icmp-port-unreachable\n" +
		"-A LBSVC-INPUT -d 172.18.0.18/32 -p sctp -j REJECT --reject-with icmp-port-unreachable\n" +
		"-A LBSVC-INPUT ! -d 172.18.0.18/32 -i net1 -j DROP\n"))
}

// Drift is repaired: a DNAT rule deleted by hand within one resync period, net1's addresses
// flushed and net1 recreated at once (netlink events).
func TestDriftIsRepaired(t *testing.T) {
	const resync = time.Second
	g, tp, _ := servedTopology(t, "v4", []string{clusterIPv4}, nil, append([]string{"--resync-period", resync.String()}, iptRules...)...)
	expectServed(g, tp, tp.client, lbIPv4, clusterIPv4)

	// iptables changes make no netlink event: only the resync can see this one.
	dnat := []string{"-d", "172.18.0.18/32", "-p", "tcp", "-m", "tcp", "--dport", "80", "-j", "DNAT", "--to-destination", "10.109.201.193:80"}
	tp.exec(tp.lb, append([]string{"iptables", "-t", "nat", "-D", "LBSVC-SERVICES"}, dnat...)...)
	g.Expect(httpGet(t, tp.client, lbHTTPv4)).Error().To(Satisfy(isRefused))
	deleted := time.Now()
	g.Eventually(func() (string, error) { return httpGet(t, tp.client, lbHTTPv4) }).
		WithTimeout(resync + time.Second).WithPolling(50 * time.Millisecond).Should(Equal(httpReply(clusterIPv4, httpPort)))
	t.Logf("deleted DNAT rule restored after %s", time.Since(deleted).Round(time.Millisecond))
	// The rule is back before lbpod logs the reconcile that added it.
	g.Eventually(tp.lbpod.logs.String).WithTimeout(time.Second).WithPolling(20 * time.Millisecond).Should(MatchRegexp(`msg=changed change="\+iptables iptables -t nat -A LBSVC-SERVICES -d 172.18.0.18/32 -p tcp -m tcp --dport 80 -j DNAT --to-destination 10.109.201.193:80"\n.*msg=applied trigger=resync changes=1 `))

	tp.ip(tp.lb, "addr", "flush", "dev", "net1", "scope", "global")
	g.Eventually(func() string { return tp.ip(tp.lb, "-4", "-o", "addr", "show", "dev", "net1") }).
		WithTimeout(resync + time.Second).WithPolling(50 * time.Millisecond).Should(ContainSubstring("inet 172.18.0.18/16"))
	expectServed(g, tp, tp.client, lbIPv4, clusterIPv4)

	// net1 recreated (a node reboot, a CNI re-ADD): same name, no address, down, a new MAC.
	tp.ip(tp.lb, "link", "del", "net1")
	tp.ip(tp.node, "link", "add", "link", "up0", "name", "net1", "type", "macvlan", "mode", "bridge")
	tp.ip(tp.node, "link", "set", "net1", "netns", tp.lb)
	g.Eventually(func() (string, error) { return httpGet(t, tp.client, lbHTTPv4) }).
		WithTimeout(resync + 2*time.Second).WithPolling(50 * time.Millisecond).Should(Equal(httpReply(clusterIPv4, httpPort)))
	g.Expect(tp.exec(tp.lb, "ip", "route", "show", "table", "100")).To(Equal("default via 172.18.0.1 dev net1 \n" +
		"10.109.201.193 via 10.16.0.1 dev eth0 \n" +
		"172.18.0.0/16 dev net1 scope link \n"))
	waitReady(g, tp)

	// Strays added by hand are removed: a second rule into table 100 (the kernel itself refuses an
	// identical one), a duplicate jump.
	tp.ip(tp.lb, "rule", "add", "pref", "32000", "iif", "net1", "lookup", "100")
	tp.exec(tp.lb, "iptables", "-t", "nat", "-A", "PREROUTING", "-j", "LBSVC-PREROUTING")
	g.Eventually(func() string { return tp.exec(tp.lb, "ip", "rule") }).WithTimeout(resync + time.Second).WithPolling(50 * time.Millisecond).
		Should(Equal("0:\tfrom all lookup local\n32763:\tfrom 172.18.0.18 lookup 100\n32764:\tfrom all iif eth0 lookup 100\n32765:\tfrom all iif net1 lookup 100\n32766:\tfrom all lookup main\n32767:\tfrom all lookup default\n"))
	g.Eventually(func() string { return tp.exec(tp.lb, "iptables", "-t", "nat", "-S", "PREROUTING") }).WithTimeout(resync + time.Second).WithPolling(50 * time.Millisecond).
		Should(Equal("-P PREROUTING ACCEPT\n-A PREROUTING -j LBSVC-PREROUTING\n"))
	// A rule put in front of the jump (which would accept the client's UDP untranslated): the jump
	// is moved back to the front, the rule left where it is (not ours).
	tp.exec(tp.lb, "iptables", "-t", "nat", "-I", "PREROUTING", "1", "-p", "udp", "-j", "ACCEPT")
	g.Eventually(func() string { return tp.exec(tp.lb, "iptables", "-t", "nat", "-S", "PREROUTING") }).WithTimeout(resync + time.Second).WithPolling(50 * time.Millisecond).
		Should(Equal("-P PREROUTING ACCEPT\n-A PREROUTING -j LBSVC-PREROUTING\n-A PREROUTING -p udp -j ACCEPT\n"))
	g.Eventually(tp.lbpod.logs.String).WithTimeout(time.Second).WithPolling(20 * time.Millisecond).
		Should(ContainSubstring(`msg=changed change="+jump iptables -t nat -A PREROUTING -j LBSVC-PREROUTING (moved to the front)"`))

	// Each repair counted by its cause: what the resync found (a DNAT rule, a jump), what the
	// kernel watch saw (net1's addresses flushed, net1 recreated) and what the apply it triggered
	// found (a rule). Counted once the apply is verified, a little after the kernel shows it.
	for _, cause := range []string{"iptables", "jump", "rule", "addresses_changed", "link_recreated"} {
		g.Eventually(func() string { _, m := tp.healthGet("/metrics"); return m }).WithTimeout(time.Second).WithPolling(20 * time.Millisecond).
			Should(MatchRegexp(`\nlbpod_repairs_total\{cause="%s"\} [1-9]\d*\n`, cause))
	}
	_, metrics := tp.healthGet("/metrics")
	g.Expect(metrics).To(MatchRegexp(`\nlbpod_syncs_total\{result="changed"\} [1-9]\d*\n`))
	g.Expect(metrics).To(MatchRegexp(`\nlbpod_sync_duration_seconds_count [1-9]\d*\n`))
	g.Expect(metrics).To(ContainSubstring("\nlbpod_active 1\n"))
	g.Expect(metrics).To(ContainSubstring("\nlbpod_ready 1\n"))
	g.Expect(metrics).To(MatchRegexp(`\nlbpod_announcements_sent_total [1-9]\d*\n`))
	// A burst may have been under way while net1 was gone: such a failure is counted too.
	g.Expect(metrics).To(MatchRegexp(`\nlbpod_announcements_failed_total \d+\n`))
}

// loadBalancerSourceRanges: a client inside a range is served, one outside is refused (TCP reset,
// UDP port unreachable), over IPv4 and IPv6.
//
// Run with each rules back end (iptables, nftables).
func TestSourceRanges(t *testing.T) {
	forEachRules(t, func(t *testing.T, rules []string) {
		g, tp, svc := servedTopology(t, "dual", []string{clusterIPv4, clusterIPv6}, []string{clientV4 + "/32", "fd18::100/127"}, rules...)
		for _, lb := range []struct{ ip, clusterIP string }{{lbIPv4, clusterIPv4}, {lbIPv6, clusterIPv6}} {
			expectServed(g, tp, tp.client, lb.ip, lb.clusterIP)
			g.Expect(httpGet(t, tp.outsider, lbAddr(lb.ip, httpPort))).Error().To(Satisfy(isRefused), "outsider to %s", lb.ip)
			g.Expect(udpExchange(t, tp.outsider, lbAddr(lb.ip, udpPort), "ping")).Error().To(Satisfy(isRefused), "outsider udp to %s", lb.ip)
		}
		// Narrowing the ranges while running refuses the former insider too.
		writeService(t, svc, []string{clusterIPv4, clusterIPv6}, basePorts, []string{"192.0.2.0/24"})
		g.Eventually(func() error { _, err := httpGet(t, tp.client, lbHTTPv4); return err }).
			WithTimeout(time.Second).WithPolling(20 * time.Millisecond).Should(Satisfy(isRefused))
		g.Eventually(func() error { _, err := httpGet(t, tp.client, lbHTTPv6); return err }).
			WithTimeout(time.Second).WithPolling(20 * time.Millisecond).Should(Satisfy(isRefused))
	})
}

// IPv6 only: ip6tables DNAT to an IPv6 ClusterIP, IPv6 rules and routes, forwarding turned on.
func TestIPv6(t *testing.T) {
	g, tp, _ := servedTopology(t, "v6", []string{clusterIPv6}, nil, iptRules...)
	expectServed(g, tp, tp.client, lbIPv6, clusterIPv6)
	g.Expect(strings.Split(tp.exec(tp.lb, "ip6tables-save", "-t", "nat"), "\n")).To(ContainElements(
		"-A LBSVC-SERVICES -d fd18::18/128 -p tcp -m tcp --dport 80 -j DNAT --to-destination [fd96::c1]:80",
		"-A LBSVC-SERVICES -d fd18::18/128 -p sctp -m sctp --dport 3868 -j DNAT --to-destination [fd96::c1]:3868",
		"-A LBSVC-POSTROUTING -d fd96::c1/128 -j MASQUERADE"))
	g.Expect(tp.exec(tp.lb, "ip", "-6", "rule")).To(ContainSubstring("32764:\tfrom all iif eth0 lookup 100\n32765:\tfrom all iif net1 lookup 100\n"))
	g.Expect(tp.exec(tp.lb, "cat", "/proc/sys/net/ipv6/conf/all/forwarding")).To(Equal("1\n"))
	g.Expect(tp.exec(tp.lb, "ip", "rule")).NotTo(ContainSubstring("lookup 100"), "an IPv6-only pod installs no IPv4 rule")
	// IPv4 on net1 is dropped whole, in and through: an IPv6-only pod serves nothing over IPv4.
	g.Expect(tp.exec(tp.lb, "iptables", "-t", "filter", "-S")).To(Equal("-P INPUT ACCEPT\n-P FORWARD ACCEPT\n-P OUTPUT ACCEPT\n" +
		"-N LBSVC-FORWARD\n-N LBSVC-INPUT\n-A INPUT -j LBSVC-INPUT\n-A FORWARD -j LBSVC-FORWARD\n" +
		"-A LBSVC-FORWARD -i net1 -j DROP\n-A LBSVC-FORWARD -i eth0 -o net1 -j DROP\n-A LBSVC-INPUT -i net1 -j DROP\n"))
	g.Expect(tp.exec(tp.lb, "iptables", "-t", "nat", "-S")).NotTo(ContainSubstring("LBSVC"))
}

// Dual stack: both families served at once by one lbpod.
func TestDualStack(t *testing.T) {
	g, tp, _ := servedTopology(t, "dual", []string{clusterIPv6, clusterIPv4}, nil)
	expectServed(g, tp, tp.client, lbIPv4, clusterIPv4)
	expectServed(g, tp, tp.client, lbIPv6, clusterIPv6)
}

// After net1's MAC changes, the client's neighbour entries for the LB addresses follow without
// the client sending anything (gratuitous ARP, unsolicited NA with override).
func TestAnnouncementFollowsMACChange(t *testing.T) {
	g, tp, _ := servedTopology(t, "dual", []string{clusterIPv4, clusterIPv6}, nil)
	expectServed(g, tp, tp.client, lbIPv4, clusterIPv4)
	expectServed(g, tp, tp.client, lbIPv6, clusterIPv6)

	neighbour := func(ip string) string {
		out := strings.Fields(tp.ip(tp.client, "neigh", "show", ip, "dev", "c0"))
		for i, f := range out {
			if f == "lladdr" && i+1 < len(out) {
				return out[i+1]
			}
		}
		return ""
	}
	oldMAC := strings.TrimSpace(tp.exec(tp.lb, "cat", "/sys/class/net/net1/address"))
	g.Expect(neighbour(lbIPv4)).To(Equal(oldMAC))
	g.Expect(neighbour(lbIPv6)).To(Equal(oldMAC))

	const newMAC = "02:00:5e:10:00:18"
	tp.ip(tp.lb, "link", "set", "dev", "net1", "address", newMAC)
	changed := time.Now()
	g.Eventually(func() string { return neighbour(lbIPv4) }).WithTimeout(3 * time.Second).WithPolling(50 * time.Millisecond).Should(Equal(newMAC))
	g.Eventually(func() string { return neighbour(lbIPv6) }).WithTimeout(3 * time.Second).WithPolling(50 * time.Millisecond).Should(Equal(newMAC))
	t.Logf("client neighbour entries followed after %s", time.Since(changed).Round(time.Millisecond))
	expectServed(g, tp, tp.client, lbIPv4, clusterIPv4)
}

// `lbpod init` fails with one line naming the field and value on a bad configuration, and on a
// missing net1.
func TestInitErrors(t *testing.T) {
	g := NewWithT(t)
	tp := newTopology(t)
	svc := filepath.Join(t.TempDir(), "svc.yaml")
	writeService(t, svc, []string{clusterIPv4}, basePorts, nil)

	out, err := tp.runInit(svc, "v4", "--addresses", "172.18.0.300/16")
	g.Expect(err).To(HaveOccurred())
	g.Expect(out).To(Equal(`lbpod init: addresses "172.18.0.300/16": "172.18.0.300/16" is not an address with a prefix length (like 172.18.0.18/16)` + "\n"))

	out, err = tp.runInit(svc, "v4", "--gateways", "10.0.0.1")
	g.Expect(err).To(HaveOccurred())
	g.Expect(out).To(Equal(`lbpod init: gateways "10.0.0.1": 10.0.0.1 is outside subnet 172.18.0.0/16` + "\n"))

	writeService(t, svc, []string{"None"}, basePorts, nil)
	out, err = tp.runInit(svc, "v4")
	g.Expect(err).To(HaveOccurred())
	g.Expect(out).To(Equal(`lbpod init: service default/test-svc: spec.clusterIPs "None": a headless Service has no ClusterIP to forward to` + "\n"))

	tp.ip(tp.lb, "link", "del", "net1")
	out, err = tp.runInit(svc, "v4")
	g.Expect(err).To(HaveOccurred())
	g.Expect(out).To(Equal("lbpod init: interface \"net1\" not found: is the NetworkAttachmentDefinition attached to this pod (Multus)? (route ip+net: no such network interface)\n"))
}

// With /proc/sys read-only (as in a pod) and IPv6 forwarding off, lbpod is not ready and says
// what the operator must do; SIGTERM still ends it promptly.
func TestForwardingSysctlReadOnly(t *testing.T) {
	g := NewWithT(t)
	tp := newTopology(t)
	svc := filepath.Join(t.TempDir(), "svc.yaml")
	writeService(t, svc, []string{clusterIPv6}, basePorts, nil)
	g.Expect(tp.exec(tp.lb, "cat", "/proc/sys/net/ipv6/conf/all/forwarding")).To(Equal("0\n"), "a new namespace starts with IPv6 forwarding off")
	// `ip netns exec` gives the command its own mount namespace: make /proc/sys read-only there.
	script := "mount --bind /proc/sys /proc/sys && mount -o remount,bind,ro /proc/sys && exec \"$@\""
	args := append([]string{"sh", "-c", script, "sh", lbpodBin, "--service-file", svc, "--health-addr", "127.0.0.1:8081", "--resync-period", "100ms"}, stackArgs("v6")...)
	p := tp.startCommand(args...)
	g.Eventually(func() string { _, body := tp.readyz(); return body }).WithTimeout(5 * time.Second).WithPolling(50 * time.Millisecond).
		Should(ContainSubstring("net.ipv6.conf.all.forwarding is 0 and cannot be set here"))
	code, body := tp.readyz()
	g.Expect(code).To(Equal(503))
	g.Expect(body).To(ContainSubstring("run the operator with --forwarding-sysctls=ipv6 (or all), and allow that unsafe sysctl on the kubelet (--allowed-unsafe-sysctls=net.ipv6.conf.all.forwarding)"))
	// Several resyncs later, still one line.
	g.Eventually(func() string { _, m := tp.healthGet("/metrics"); return m }).WithTimeout(5 * time.Second).WithPolling(50 * time.Millisecond).
		Should(MatchRegexp(`\nlbpod_syncs_total\{result="error"\} ([5-9]|\d\d+)\n`))
	took := p.stop(t)
	g.Expect(took).To(BeNumerically("<", time.Second))
	g.Expect(strings.Count(p.logs.String(), "cannot be set here")).To(Equal(1), "one clear line, not one per resync:\n%s", p.logs.String())
}

// eth0 the way some CNIs set it up: a /32 with the default route via a link-scope gateway
// outside any subnet (Calico's 169.254.1.1), or a plain device route with no gateway at all.
// The ClusterIP route in table 100 follows the main table's default route.
func TestUplinkWithoutSubnetGateway(t *testing.T) {
	cases := map[string]struct {
		defaultRoute [][]string
		wantRoute    string
	}{
		"link-scope gateway": {
			defaultRoute: [][]string{{"route", "add", "169.254.1.1", "dev", "eth0", "scope", "link"}, {"route", "add", "default", "via", "169.254.1.1", "dev", "eth0"}},
			wantRoute:    "10.109.201.193 via 169.254.1.1 dev eth0 \n",
		},
		"device route": {
			defaultRoute: [][]string{{"route", "add", "default", "dev", "eth0"}},
			wantRoute:    "10.109.201.193 dev eth0 scope link \n",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			tp := newTopology(t)
			tp.startBackends()
			tp.ip(tp.lb, "route", "del", "default")
			tp.ip(tp.lb, "addr", "del", podV4+"/16", "dev", "eth0")
			tp.ip(tp.lb, "addr", "add", podV4+"/32", "dev", "eth0")
			for _, r := range tc.defaultRoute {
				tp.ip(tp.lb, r...)
			}
			// The node answers ARP for the gateway (and for the ClusterIP itself) and routes
			// back to the pod's /32.
			tp.ip(tp.node, "addr", "add", "169.254.1.1/32", "dev", "lo")
			tp.ip(tp.node, "route", "add", podV4+"/32", "dev", "nodeveth")
			svc := filepath.Join(t.TempDir(), "svc.yaml")
			writeService(t, svc, []string{clusterIPv4}, basePorts, nil)
			tp.startLBPod(svc, "v4")
			waitReady(g, tp)
			expectServed(g, tp, tp.client, lbIPv4, clusterIPv4)
			g.Expect(tp.exec(tp.lb, "ip", "route", "show", "table", "100")).To(Equal("default via 172.18.0.1 dev net1 \n" +
				tc.wantRoute + "172.18.0.0/16 dev net1 scope link \n"))
		})
	}
}

// The announcements are gratuitous ARP requests (sender = target = the LB address, from net1's
// MAC, broadcast), sent as a burst at start and then every --announce-interval, whether anybody
// asks or not.
func TestAnnouncementsRepeat(t *testing.T) {
	g := NewWithT(t)
	tp := newTopology(t)
	// Listen before lbpod starts so that the start burst is seen too.
	garps := captureGARPs(t, tp.client, "c0", lbIPv4)
	svc := filepath.Join(t.TempDir(), "svc.yaml")
	writeService(t, svc, []string{clusterIPv4}, basePorts, nil)
	tp.startLBPod(svc, "v4", "--announce-interval", "300ms")
	waitReady(g, tp)
	mac := strings.TrimSpace(tp.exec(tp.lb, "cat", "/sys/class/net/net1/address"))

	// In 2 s: the burst (3, a second apart) plus the periodic ones (about 6).
	start := time.Now()
	var seen []string
	g.Eventually(func() int {
		for {
			select {
			case src := <-garps:
				seen = append(seen, src)
			default:
				return len(seen)
			}
		}
	}).WithTimeout(2 * time.Second).WithPolling(50 * time.Millisecond).Should(BeNumerically(">=", 6))
	t.Logf("%d gratuitous ARPs in %s", len(seen), time.Since(start).Round(time.Millisecond))
	for _, src := range seen {
		g.Expect(src).To(Equal(mac + " -> ff:ff:ff:ff:ff:ff"))
	}
}

// captureGARPs reads ARP frames on dev in namespace ns and sends "<src MAC> -> <dst MAC>" for each
// gratuitous request for ip (sender and target both ip).
func captureGARPs(t *testing.T, ns, dev, ip string) <-chan string {
	t.Helper()
	const ethPARP = 0x0806
	var fd int
	if err := inNS(t, ns, func() error {
		var err error
		fd, err = syscall.Socket(syscall.AF_PACKET, syscall.SOCK_RAW, int(htons(ethPARP)))
		if err != nil {
			return err
		}
		ifi, err := net.InterfaceByName(dev)
		if err != nil {
			return err
		}
		return syscall.Bind(fd, &syscall.SockaddrLinklayer{Protocol: htons(ethPARP), Ifindex: ifi.Index})
	}); err != nil {
		t.Fatalf("packet socket in %s: %v", ns, err)
	}
	// Reads time out every 100 ms so that the reader notices the end of the test.
	if err := syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &syscall.Timeval{Usec: 100000}); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	stopped := make(chan struct{})
	t.Cleanup(func() { close(done); <-stopped; syscall.Close(fd) })
	want := net.ParseIP(ip).To4()
	out := make(chan string, 100)
	go func() {
		defer close(stopped)
		buf := make([]byte, 1500)
		for {
			select {
			case <-done:
				return
			default:
			}
			n, err := syscall.Read(fd, buf)
			if errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EINTR) {
				continue
			}
			if err != nil {
				return
			}
			// Ethernet (14) + ARP: op at 20, sender MAC 22, sender IP 28, target IP 38.
			if n < 42 || buf[20] != 0 || buf[21] != 1 {
				continue
			}
			if net.IP(buf[28:32]).Equal(want) && net.IP(buf[38:42]).Equal(want) {
				select {
				case out <- net.HardwareAddr(buf[6:12]).String() + " -> " + net.HardwareAddr(buf[0:6]).String():
				default:
				}
			}
		}
	}()
	return out
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// A removed UDP port stops being served even to a client that keeps sending from the same source
// port: its conntrack entries are deleted with the DNAT rule (kube-proxy does the same), instead
// of translating until they time out.
//
// Run with each rules back end (iptables, nftables).
func TestRemovedUDPPortForgetsFlows(t *testing.T) {
	forEachRules(t, func(t *testing.T, rules []string) {
		g, tp, svc := servedTopology(t, "v4", []string{clusterIPv4}, nil, rules...)
		exchange := udpSession(t, tp.client, lbAddr(lbIPv4, udpPort))
		g.Expect(exchange("one")).To(Equal(udpReply(clusterIPv4, udpPort, "one")))

		var withoutUDP []servicePort
		for _, p := range basePorts {
			if p.Protocol != "UDP" {
				withoutUDP = append(withoutUDP, p)
			}
		}
		writeService(t, svc, []string{clusterIPv4}, withoutUDP, nil)
		g.Eventually(func() error { _, err := exchange("again"); return err }).
			WithTimeout(time.Second).WithPolling(20 * time.Millisecond).Should(Satisfy(isRefused))
		g.Eventually(tp.lbpod.logs.String).WithTimeout(time.Second).WithPolling(20 * time.Millisecond).
			Should(ContainSubstring(`msg="deleted stale conntrack entries" family=IPv4 keep="all sources, ports [sctp/3868->10.109.201.193:3868]" entries=1`))
	})
}

// Routes of the lb pod's table and policy rules are watched like links and addresses: deleted or
// added by hand, they are repaired at once (netlink events), not at the next resync (an hour here).
func TestRouteAndRuleDriftIsRepairedAtOnce(t *testing.T) {
	const hour = time.Hour
	g, tp, _ := servedTopology(t, "v4", []string{clusterIPv4}, nil, "--resync-period", hour.String())
	expectServed(g, tp, tp.client, lbIPv4, clusterIPv4)
	const table100 = "default via 172.18.0.1 dev net1 \n10.109.201.193 via 10.16.0.1 dev eth0 \n172.18.0.0/16 dev net1 scope link \n"
	const rules = "0:\tfrom all lookup local\n32763:\tfrom 172.18.0.18 lookup 100\n32764:\tfrom all iif eth0 lookup 100\n32765:\tfrom all iif net1 lookup 100\n32766:\tfrom all lookup main\n32767:\tfrom all lookup default\n"
	g.Expect(tp.exec(tp.lb, "ip", "route", "show", "table", "100")).To(Equal(table100))
	g.Expect(tp.exec(tp.lb, "ip", "rule")).To(Equal(rules))

	for _, drift := range [][]string{
		{"route", "del", "default", "table", "100"},
		{"route", "del", "10.109.201.193", "table", "100"},
		{"rule", "del", "pref", "32765"},
		{"rule", "del", "pref", "32763"},
		{"rule", "add", "pref", "32000", "iif", "net1", "lookup", "100"},         // a stray
		{"rule", "add", "pref", "32000", "from", "172.18.0.99", "lookup", "100"}, // another address's
	} {
		tp.ip(tp.lb, drift...)
		changed := time.Now()
		g.Eventually(func() string {
			return tp.exec(tp.lb, "ip", "route", "show", "table", "100") + tp.exec(tp.lb, "ip", "rule")
		}).
			WithTimeout(3*time.Second).WithPolling(20*time.Millisecond).Should(Equal(table100+rules), "after ip %s", strings.Join(drift, " "))
		t.Logf("ip %s: repaired after %s", strings.Join(drift, " "), time.Since(changed).Round(time.Millisecond))
	}
	expectServed(g, tp, tp.client, lbIPv4, clusterIPv4)
	g.Expect(tp.lbpod.logs.String()).To(MatchRegexp(`msg=applied trigger=routes changes=1 `))
	g.Expect(tp.lbpod.logs.String()).NotTo(ContainSubstring("trigger=resync"))
	// Counted once each apply is verified, a little after the kernel shows it.
	g.Eventually(func() string { _, m := tp.healthGet("/metrics"); return m }).WithTimeout(time.Second).WithPolling(20 * time.Millisecond).
		Should(And(MatchRegexp(`\nlbpod_repairs_total\{cause="route"\} 2\n`), MatchRegexp(`\nlbpod_repairs_total\{cause="rule"\} 4\n`)))
}
