//go:build dataplane

package dataplane

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
)

// The shared address's second member has a ClusterIP of its own, which the node answers on too.
const clusterIPv4B = "10.109.201.194"

// sharedMember is one Service of the shared-address tests' file.
type sharedMember struct {
	name, clusterIP string
	ports           []servicePort
	ranges          []string
	// proven: the status lists the LB address (what the operator writes for a member). Every
	// Service of the file carries the label; without the status it must not be served.
	proven bool
	// admitted, when set, are the ports the status lists on the address (what the operator
	// admitted); unset, it lists none (an operator release that did not list them).
	admitted []servicePort
}

// writeMembers writes the Services lbpod --shared-ip reads, as YAML documents.
func writeMembers(t testing.TB, path string, members ...sharedMember) {
	t.Helper()
	var docs []string
	labels := map[string]string{v1alpha1.SharedIPLabelPrefix + lbIPv4: ""}
	for _, m := range members {
		var ingress []string
		if m.proven {
			ingress = []string{lbIPv4}
		}
		docs = append(docs, serviceYAML(m.name, []string{m.clusterIP}, m.ports, m.ranges, labels, ingress, m.admitted))
	}
	writeFile(t, path, "---\n"+strings.Join(docs, "---\n"))
}

// Answers of the member backends, exact so that a test can tell which member answered.
func memberTCPReply(ip string, port int) string { return fmt.Sprintf("member %s tcp %d\n", ip, port) }
func memberUDPReply(ip string, port int, payload string) string {
	return fmt.Sprintf("member %s udp %d: %s", ip, port, payload)
}

// serveMember serves ip in the node namespace: on each TCP port a greeting (memberTCPReply) to
// every connection, closed after it; on each UDP port an answer to every datagram.
func (tp *topology) serveMember(ip string, tcpPorts, udpPorts []int) {
	t := tp.t
	t.Helper()
	for _, port := range tcpPorts {
		ln := listenIn(t, tp.node, lbAddr(ip, port))
		reply := memberTCPReply(ip, port)
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				io.WriteString(c, reply)
				c.Close()
			}
		}()
	}
	for _, port := range udpPorts {
		serveUDP(t, tp.node, lbAddr(ip, port), func(payload string) string { return memberUDPReply(ip, port, payload) })
	}
}

// tcpGreeting connects from ns and reads what the server sends until it closes.
func tcpGreeting(t testing.TB, ns, addr string) (string, error) {
	conn, err := dialIn(t, ns, "tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(time.Second))
	b, err := io.ReadAll(conn)
	return string(b), err
}

// startShared builds a topology whose node answers on the second ClusterIP too, writes the
// members, starts lbpod --shared-ip on the LB address and waits until it is ready.
func startShared(t *testing.T, rules []string, members ...sharedMember) (Gomega, *topology, string) {
	g := NewWithT(t)
	tp := newTopology(t)
	tp.ip(tp.node, "addr", "add", clusterIPv4B+"/32", "dev", "lo")
	file := filepath.Join(t.TempDir(), "members.yaml")
	writeMembers(t, file, members...)
	tp.startLBPod(file, "v4", append([]string{"--shared-ip", lbIPv4}, rules...)...)
	return g, tp, file
}

// Two Services on one address: TCP 53 is A's (its backend answers), UDP 53 is B's; B admits
// only the client, A everyone, so the outsider reaches A's TCP 53 but not B's UDP 53; a
// labelled Service without the status proof is not served. Run with each rules back end.
func TestSharedAddressTwoServices(t *testing.T) {
	forEachRules(t, func(t *testing.T, rules []string) {
		a := sharedMember{name: "a", clusterIP: clusterIPv4, ports: []servicePort{{Protocol: "TCP", Port: 53}}, proven: true}
		b := sharedMember{name: "b", clusterIP: clusterIPv4B, ports: []servicePort{{Protocol: "UDP", Port: 53}}, ranges: []string{clientV4 + "/32"}, proven: true}
		intruder := sharedMember{name: "intruder", clusterIP: clusterIPv4B, ports: []servicePort{{Protocol: "TCP", Port: 80}}}
		g, tp, _ := startShared(t, rules, b, intruder, a)
		tp.serveMember(clusterIPv4, []int{53}, nil)
		tp.serveMember(clusterIPv4B, []int{80}, []int{53})
		waitReady(g, tp)

		g.Eventually(func() (string, error) { return tcpGreeting(t, tp.client, lbAddr(lbIPv4, 53)) }).
			WithTimeout(3 * time.Second).WithPolling(50 * time.Millisecond).Should(Equal(memberTCPReply(clusterIPv4, 53)))
		g.Expect(udpExchange(t, tp.client, lbAddr(lbIPv4, 53), "ping")).To(Equal(memberUDPReply(clusterIPv4B, 53, "ping")))
		g.Expect(tcpGreeting(t, tp.outsider, lbAddr(lbIPv4, 53))).To(Equal(memberTCPReply(clusterIPv4, 53)), "B's ranges do not restrict A")
		g.Expect(udpExchange(t, tp.outsider, lbAddr(lbIPv4, 53), "ping")).Error().To(Satisfy(isRefused), "B's ranges restrict B")
		g.Expect(tcpGreeting(t, tp.client, lbAddr(lbIPv4, 80))).Error().To(Satisfy(isRefused), "the intruder (label without status) is not served")
		if len(rules) > 0 { // iptables: the source groups as written
			nat := tp.exec(tp.lb, "iptables-save", "-t", "nat")
			g.Expect(strings.Split(nat, "\n")).To(ContainElements(
				"-A LBSVC-PREROUTING -d 172.18.0.18/32 -i net1 -j LBSVC-SERVICES",
				"-A LBSVC-SERVICES -j LBSVC-SERVICES-S0",
				"-A LBSVC-SERVICES -s 172.18.0.100/32 -j LBSVC-SERVICES-S1",
				"-A LBSVC-SERVICES-S0 -d 172.18.0.18/32 -p tcp -m tcp --dport 53 -j DNAT --to-destination 10.109.201.193:53",
				"-A LBSVC-SERVICES-S1 -d 172.18.0.18/32 -p udp -m udp --dport 53 -j DNAT --to-destination 10.109.201.194:53",
			), "iptables-save -t nat:\n%s", nat)
		}
	})
}

// A member is served only on the ports the operator admitted for it (its status lists them on
// the address): its tenant adds the other member's TCP 53 to its spec, and, in the moment before
// the operator refuses it (here: for ever), TCP 53 stays the other member's, though by name
// ("aaa" before "web") the lb pod would give a clash to the newcomer. Its own admitted UDP 53 is
// served. Run with each rules back end.
func TestSharedMemberServedOnlyOnAdmittedPorts(t *testing.T) {
	forEachRules(t, func(t *testing.T, rules []string) {
		web := sharedMember{name: "web", clusterIP: clusterIPv4, ports: []servicePort{{Protocol: "TCP", Port: 53}}, proven: true,
			admitted: []servicePort{{Protocol: "TCP", Port: 53}}}
		newcomer := sharedMember{name: "aaa", clusterIP: clusterIPv4B, ports: []servicePort{{Protocol: "UDP", Port: 53}, {Protocol: "TCP", Port: 53}},
			proven: true, admitted: []servicePort{{Protocol: "UDP", Port: 53}}}
		g, tp, _ := startShared(t, rules, web, newcomer)
		tp.serveMember(clusterIPv4, []int{53}, nil)
		tp.serveMember(clusterIPv4B, []int{53}, []int{53})
		waitReady(g, tp)

		g.Eventually(func() (string, error) { return tcpGreeting(t, tp.client, lbAddr(lbIPv4, 53)) }).
			WithTimeout(3*time.Second).WithPolling(50*time.Millisecond).Should(Equal(memberTCPReply(clusterIPv4, 53)), "TCP 53 stays web's")
		g.Expect(udpExchange(t, tp.client, lbAddr(lbIPv4, 53), "ping")).To(Equal(memberUDPReply(clusterIPv4B, 53, "ping")))
	})
}

// A member leaves and comes back while a client talks to the other: A (HTTP on a new TCP
// connection and UDP on one long-lived socket every 10 ms, and one TCP connection held open)
// never fails; B's ports are refused once it left (removed from the file, or its status proof
// gone) and answered once it is back. B admits only the client, so each change also switches the
// rules between one source check and per-member source groups. Run with each rules back end.
func TestSharedMemberLeavesUnderTraffic(t *testing.T) {
	forEachRules(t, func(t *testing.T, rules []string) {
		a := sharedMember{name: "a", clusterIP: clusterIPv4, ports: []servicePort{{Protocol: "TCP", Port: httpPort}, {Protocol: "TCP", Port: echoPort}, {Protocol: "UDP", Port: udpPort}}, proven: true}
		b := sharedMember{name: "b", clusterIP: clusterIPv4B, ports: []servicePort{{Protocol: "TCP", Port: 53}, {Protocol: "UDP", Port: 5353}}, ranges: []string{clientV4 + "/32"}, proven: true}
		g, tp, file := startShared(t, rules, a, b)
		tp.startBackends()
		tp.serveMember(clusterIPv4B, []int{53}, []int{5353})
		waitReady(g, tp)
		expectServed(g, tp, tp.client, lbIPv4, clusterIPv4)
		bServed := func(g Gomega) {
			g.Expect(tcpGreeting(t, tp.client, lbAddr(lbIPv4, 53))).To(Equal(memberTCPReply(clusterIPv4B, 53)))
			g.Expect(udpExchange(t, tp.client, lbAddr(lbIPv4, 5353), "hi")).To(Equal(memberUDPReply(clusterIPv4B, 5353, "hi")))
		}
		bRefused := func(g Gomega) {
			g.Expect(tcpGreeting(t, tp.client, lbAddr(lbIPv4, 53))).Error().To(Satisfy(isRefused))
			g.Expect(udpExchange(t, tp.client, lbAddr(lbIPv4, 5353), "hi")).Error().To(Satisfy(isRefused))
		}
		g.Eventually(bServed).WithTimeout(3 * time.Second).WithPolling(50 * time.Millisecond).Should(Succeed())

		held, err := dialIn(t, tp.client, "tcp", lbAddr(lbIPv4, echoPort), time.Second)
		g.Expect(err).NotTo(HaveOccurred())
		defer held.Close()
		heldReader := bufio.NewReader(held)
		heldFailures := 0
		counts, stopTraffic := tp.runTraffic(tp.client, lbIPv4, clusterIPv4, 10*time.Millisecond)
		defer stopTraffic()
		ok := func() int64 { return counts.tcpOK.Load() + counts.udpOK.Load() }
		const cycles = 4
		gone := b
		gone.proven = false
		for i := range cycles {
			// Left: removed from the file, or (odd cycles) still labelled but without the status.
			if i%2 == 0 {
				writeMembers(t, file, a)
			} else {
				writeMembers(t, file, a, gone)
			}
			g.Eventually(bRefused).WithTimeout(3*time.Second).WithPolling(20*time.Millisecond).Should(Succeed(), "cycle %d: B left", i)
			before := ok()
			g.Eventually(ok).WithTimeout(5*time.Second).WithPolling(10*time.Millisecond).Should(BeNumerically(">=", before+20), "cycle %d: traffic without B", i)
			writeMembers(t, file, a, b)
			g.Eventually(bServed).WithTimeout(3*time.Second).WithPolling(20*time.Millisecond).Should(Succeed(), "cycle %d: B back", i)
			before = ok()
			g.Eventually(ok).WithTimeout(5*time.Second).WithPolling(10*time.Millisecond).Should(BeNumerically(">=", before+20), "cycle %d: traffic with B", i)
			if !heldEcho(held, heldReader, fmt.Sprintf("cycle %d", i)) {
				heldFailures++
			}
		}
		stopTraffic()

		f := "shared_" + map[bool]string{true: "iptables", false: "nftables"}[len(rules) > 0]
		failures := counts.wrong.Load() + counts.resets.Load() + counts.timeouts.Load() + counts.other.Load()
		fmt.Fprintf(os.Stdout, strings.ReplaceAll("figure: F_member_changes=%d\nfigure: F_requests=%d\nfigure: F_tcp_ok=%d\nfigure: F_udp_ok=%d\nfigure: F_failures=%d\nfigure: F_held_connection_failures=%d\n", "F", f),
			2*cycles, counts.tcpOK.Load()+counts.udpOK.Load()+failures, counts.tcpOK.Load(), counts.udpOK.Load(), failures, heldFailures)
		g.Expect(counts.firstErrors).To(BeEmpty())
		g.Expect(failures).To(BeZero())
		g.Expect(heldFailures).To(BeZero())
		g.Expect(counts.tcpOK.Load()).To(BeNumerically(">=", 10*cycles))
		g.Expect(counts.udpOK.Load()).To(BeNumerically(">=", 10*cycles))
	})
}
