//go:build dataplane

package dataplane

import (
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"golang.org/x/sys/unix"
)

// No open router for packets conntrack finds invalid either: a host on the underlay that routes
// the ClusterIP through the LB address and sends TCP segments with SYN and FIN set (an invalid
// flag combination: conntrack gives them no connection) gets none of them forwarded to the
// cluster side, with either rules back end. nftables' "ct status" does not match a packet without
// a connection (the kernel ends the rule), so a forward rule "ct status & dnat == 0 drop" let
// them through.
func TestNotAnOpenRouterForInvalidPackets(t *testing.T) {
	for name, rules := range map[string][]string{"iptables": iptRules, "nftables": nftRules} {
		t.Run(name, func(t *testing.T) {
			g, tp, _ := servedTopology(t, "v4", []string{clusterIPv4}, nil, rules...)
			expectServed(g, tp, tp.client, lbIPv4, clusterIPv4)
			tp.ip(tp.client, "route", "add", clusterIPv4+"/32", "via", lbIPv4, "dev", "c0")
			// The node's raw table counts what arrives: segments from the client itself (forwarded
			// without translation), and, as a control, SYNs from the lb pod to the ClusterIP (DNATed
			// and masqueraded as a Service's are).
			tp.exec(tp.node, "iptables", "-t", "raw", "-A", "PREROUTING", "-s", clientV4, "-p", "tcp", "-m", "comment", "--comment", "leaked")
			tp.exec(tp.node, "iptables", "-t", "raw", "-A", "PREROUTING", "-s", podV4, "-d", clusterIPv4, "-p", "tcp", "--tcp-flags", "SYN,FIN", "SYN",
				"-m", "comment", "--comment", "served")
			count := func(comment string) int { return tp.rawCount(tp.node, "iptables", "PREROUTING", comment) }
			// Control: a SYN written by the same raw sender to the LB address's port is DNATed and
			// reaches the node, so the sender and the counters work (a test that can fail).
			g.Expect(sendTCP(t, tp.client, clientV4, lbIPv4, httpPort, tcpSYN)).To(Succeed())
			g.Eventually(func() int { return count("served") }).WithTimeout(2 * time.Second).WithPolling(50 * time.Millisecond).Should(Equal(1))

			const sent = 5
			for range sent {
				g.Expect(sendTCP(t, tp.client, clientV4, clusterIPv4, httpPort, tcpSYN|tcpFIN)).To(Succeed())
			}
			g.Consistently(func() int { return count("leaked") }).WithTimeout(500*time.Millisecond).WithPolling(50*time.Millisecond).Should(Equal(0),
				"invalid segments routed to the ClusterIP through the LB address were forwarded")
			// And the Service is still served.
			expectServed(g, tp, tp.client, lbIPv4, clusterIPv4)
		})
	}
}

// TCP flags of sendTCP.
const (
	tcpFIN = 0x01
	tcpSYN = 0x02
)

// sendTCP sends, from network namespace ns, one IPv4 TCP segment from src to dst:port with flags,
// written whole (IP_HDRINCL), so no socket state or kernel check stands in its way.
func sendTCP(t testing.TB, ns, src, dst string, port int, flags byte) error {
	return inNS(t, ns, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_RAW)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		s, d := netip.MustParseAddr(src).As4(), netip.MustParseAddr(dst).As4()
		tcp := make([]byte, 20)
		binary.BigEndian.PutUint16(tcp[0:], 40000)
		binary.BigEndian.PutUint16(tcp[2:], uint16(port))
		binary.BigEndian.PutUint32(tcp[4:], 1)
		tcp[12] = 5 << 4
		tcp[13] = flags
		binary.BigEndian.PutUint16(tcp[14:], 64240)
		pseudo := append(append(append([]byte{}, s[:]...), d[:]...), 0, unix.IPPROTO_TCP, 0, 20)
		binary.BigEndian.PutUint16(tcp[16:], checksum(append(pseudo, tcp...)))
		ip := make([]byte, 20)
		ip[0], ip[8], ip[9] = 0x45, 64, unix.IPPROTO_TCP
		binary.BigEndian.PutUint16(ip[2:], 40)
		copy(ip[12:], s[:])
		copy(ip[16:], d[:])
		binary.BigEndian.PutUint16(ip[10:], checksum(ip))
		return unix.Sendto(fd, append(ip, tcp...), 0, &unix.SockaddrInet4{Addr: d})
	})
}

// checksum is the Internet checksum (RFC 1071).
func checksum(b []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return ^uint16(sum)
}
