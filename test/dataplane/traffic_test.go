//go:build dataplane

package dataplane

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/vishvananda/netns"
)

// trafficCounts are the outcomes of the requests a trafficGen sent.
type trafficCounts struct {
	tcpOK, udpOK, wrong, resets, timeouts, other atomic.Int64
	mu                                           sync.Mutex
	firstErrors                                  []string
}

func (c *trafficCounts) fail(kind *atomic.Int64, what string) {
	kind.Add(1)
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.firstErrors) < 10 {
		c.firstErrors = append(c.firstErrors, time.Now().Format("15:04:05.000")+" "+what)
	}
}

// classify counts an error as a reset (TCP RST or ICMP unreachable), a timeout or other.
func (c *trafficCounts) classify(proto string, err error) {
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET):
		c.fail(&c.resets, proto+": "+err.Error())
	case errors.As(err, &ne) && ne.Timeout():
		c.fail(&c.timeouts, proto+": "+err.Error())
	default:
		c.fail(&c.other, proto+": "+err.Error())
	}
}

// inClientNS locks the calling goroutine's thread into ns for good (the thread dies with the
// goroutine), so that every socket it opens lives there.
func inClientNS(ns string) error {
	runtime.LockOSThread()
	h, err := netns.GetFromName(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	return netns.Set(h)
}

// startTraffic sends, from ns until stop is closed, an HTTP request on a new TCP connection and
// a UDP request on one long-lived socket every interval, and checks every answer exactly.
func (tp *topology) startTraffic(ns, lbIP, clusterIP string, interval time.Duration, stop <-chan struct{}) (*trafficCounts, *sync.WaitGroup) {
	c := &trafficCounts{}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // TCP: a new connection each time, as a client pool would.
		defer wg.Done()
		if err := inClientNS(ns); err != nil {
			c.fail(&c.other, err.Error())
			return
		}
		want := httpReply(clusterIP, httpPort)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			conn, err := net.DialTimeout("tcp", lbAddr(lbIP, httpPort), time.Second)
			if err != nil {
				c.classify("tcp dial", err)
				continue
			}
			_ = conn.SetDeadline(time.Now().Add(time.Second))
			_, err = io.WriteString(conn, "GET / HTTP/1.0\r\nHost: lb\r\n\r\n")
			var body []byte
			if err == nil {
				body, err = io.ReadAll(conn)
			}
			conn.Close()
			switch {
			case err != nil:
				c.classify("tcp exchange", err)
			case !strings.HasSuffix(string(body), "\r\n\r\n"+want):
				c.fail(&c.wrong, fmt.Sprintf("tcp answer %q", body))
			default:
				c.tcpOK.Add(1)
			}
		}
	}()
	go func() { // UDP: one socket, so one conntrack entry that must survive every change.
		defer wg.Done()
		if err := inClientNS(ns); err != nil {
			c.fail(&c.other, err.Error())
			return
		}
		conn, err := net.Dial("udp", lbAddr(lbIP, udpPort))
		if err != nil {
			c.fail(&c.other, err.Error())
			return
		}
		defer conn.Close()
		tick := time.NewTicker(interval)
		defer tick.Stop()
		buf := make([]byte, 1500)
		for seq := 0; ; seq++ {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			payload := fmt.Sprintf("seq %d", seq)
			if _, err := conn.Write([]byte(payload)); err != nil {
				c.classify("udp send", err)
				continue
			}
			_ = conn.SetReadDeadline(time.Now().Add(time.Second))
			n, err := conn.Read(buf)
			if err != nil {
				c.classify("udp read", err)
				continue
			}
			if got := string(buf[:n]); got != udpReply(clusterIP, udpPort, payload) {
				c.fail(&c.wrong, fmt.Sprintf("udp answer %q to %q", got, payload))
				continue
			}
			c.udpOK.Add(1)
		}
	}()
	return c, &wg
}

// runTraffic is startTraffic until the returned stop is called (once or more: the first call
// stops the traffic and waits for it, the others do nothing), so that a test can stop it before
// reading the counts and defer it for an early failure.
func (tp *topology) runTraffic(ns, lbIP, clusterIP string, interval time.Duration) (*trafficCounts, func()) {
	stop := make(chan struct{})
	counts, wg := tp.startTraffic(ns, lbIP, clusterIP, interval, stop)
	var once sync.Once
	return counts, func() { once.Do(func() { close(stop); wg.Wait() }) }
}

// heldEcho sends line on a connection held open to the echo port and reports whether the exact
// echo came back within a second.
func heldEcho(held net.Conn, r *bufio.Reader, line string) bool {
	_ = held.SetDeadline(time.Now().Add(time.Second))
	if _, err := fmt.Fprintln(held, line); err != nil {
		return false
	}
	got, err := r.ReadString('\n')
	return err == nil && got == echoReply(echoPort, line)
}

// The Service's other ports and its source ranges change 14 times while a client sends an HTTP
// request on a new TCP connection and a UDP request on one long-lived socket every 10 ms, and
// holds one TCP connection open: the ports that stay never give a wrong answer, a reset or a
// timeout. Every version of the Service allows the client.
//
// Run with each rules back end (iptables, nftables).
func TestChangesUnderTraffic(t *testing.T) {
	forEachRules(t, func(t *testing.T, rules []string) {
		g, tp, svc := servedTopology(t, "v4", []string{clusterIPv4}, nil, rules...)
		expectServed(g, tp, tp.client, lbIPv4, clusterIPv4)
		held, err := dialIn(t, tp.client, "tcp", lbAddr(lbIPv4, echoPort), time.Second)
		g.Expect(err).NotTo(HaveOccurred())
		defer held.Close()
		heldReader := bufio.NewReader(held)

		extraTCP := servicePort{Protocol: "TCP", Port: extraHTTPPort}
		extraUDP := servicePort{Protocol: "UDP", Port: 5353}
		extraSCTP := servicePort{Protocol: "SCTP", Port: 3869}
		with := func(extra ...servicePort) []servicePort {
			return append(append([]servicePort{}, basePorts...), extra...)
		}
		steps := []struct {
			ports  []servicePort
			ranges []string
		}{
			{with(extraTCP), nil},
			{with(extraTCP), []string{clientV4 + "/32"}},
			{with(), []string{clientV4 + "/32", outsiderV4 + "/32"}},
			{with(extraUDP), []string{"172.18.0.0/24"}},
			{with(extraUDP, extraTCP), []string{"172.18.0.0/25", "192.0.2.0/24"}},
			{with(extraSCTP), []string{"0.0.0.0/0"}},
			{with(extraSCTP, extraUDP), nil},
			{with(), []string{clientV4 + "/32"}},
			{with(extraTCP, extraUDP, extraSCTP), []string{"172.18.0.96/28"}},
			{with(extraTCP), []string{"172.18.0.96/28", outsiderV4 + "/32"}},
			{with(), []string{"192.0.2.0/24", "172.18.0.0/16"}},
			{with(extraUDP), []string{clientV4 + "/32"}},
			{with(extraUDP), nil},
			{with(), nil},
		}
		applied := func() int { return strings.Count(tp.lbpod.logs.String(), "msg=applied trigger=service") }

		counts, stopTraffic := tp.runTraffic(tp.client, lbIPv4, clusterIPv4, 10*time.Millisecond)
		defer stopTraffic()
		heldFailures := 0
		for i, s := range steps {
			before, okBefore := applied(), counts.tcpOK.Load()+counts.udpOK.Load()
			writeService(t, svc, []string{clusterIPv4}, s.ports, s.ranges)
			g.Eventually(applied).WithTimeout(5*time.Second).WithPolling(10*time.Millisecond).Should(BeNumerically(">", before), "step %d applied", i)
			// Some traffic on each version before the next change.
			g.Eventually(func() int64 { return counts.tcpOK.Load() + counts.udpOK.Load() }).
				WithTimeout(10*time.Second).WithPolling(10*time.Millisecond).Should(BeNumerically(">=", okBefore+10), "step %d: traffic", i)
			if !heldEcho(held, heldReader, fmt.Sprintf("step %d", i)) {
				heldFailures++
			}
		}
		stopTraffic()

		// The iptables run keeps the figures' historical names; the nftables run's carry its name.
		f := "traffic"
		if len(rules) > 0 {
			f = "traffic_nftables"
		}
		fmt.Fprintf(os.Stdout, strings.ReplaceAll("figure: F_changes=%d\nfigure: F_tcp_ok=%d\nfigure: F_udp_ok=%d\nfigure: F_wrong=%d\nfigure: F_resets=%d\nfigure: F_timeouts=%d\nfigure: F_other_errors=%d\nfigure: F_held_connection_failures=%d\n", "F", f),
			len(steps), counts.tcpOK.Load(), counts.udpOK.Load(), counts.wrong.Load(), counts.resets.Load(), counts.timeouts.Load(), counts.other.Load(), heldFailures)
		g.Expect(counts.firstErrors).To(BeEmpty())
		g.Expect(counts.wrong.Load()).To(BeZero())
		g.Expect(counts.resets.Load()).To(BeZero())
		g.Expect(counts.timeouts.Load()).To(BeZero())
		g.Expect(counts.other.Load()).To(BeZero())
		g.Expect(heldFailures).To(BeZero())
		g.Expect(counts.tcpOK.Load()).To(BeNumerically(">=", 5*len(steps)))
		g.Expect(counts.udpOK.Load()).To(BeNumerically(">=", 5*len(steps)))
	})
}

// A UDP client that keeps sending from one source port is refused as soon as the source ranges
// no longer allow it: its conntrack entry (translated to the ClusterIP) is deleted with the
// change instead of carrying it on until it times out. The allowed client's entry stays.
//
// Run with each rules back end (iptables, nftables).
func TestNarrowedRangeForgetsUDPFlows(t *testing.T) {
	forEachRules(t, func(t *testing.T, rules []string) {
		g, tp, svc := servedTopology(t, "v4", []string{clusterIPv4}, []string{clientV4 + "/32", outsiderV4 + "/32"}, rules...)
		client, outsider := udpSession(t, tp.client, lbAddr(lbIPv4, udpPort)), udpSession(t, tp.outsider, lbAddr(lbIPv4, udpPort))
		g.Expect(client("a")).To(Equal(udpReply(clusterIPv4, udpPort, "a")))
		g.Expect(outsider("a")).To(Equal(udpReply(clusterIPv4, udpPort, "a")))

		writeService(t, svc, []string{clusterIPv4}, basePorts, []string{clientV4 + "/32"})
		g.Eventually(func() error { _, err := outsider("again"); return err }).
			WithTimeout(time.Second).WithPolling(20 * time.Millisecond).Should(Satisfy(isRefused))
		g.Expect(client("b")).To(Equal(udpReply(clusterIPv4, udpPort, "b")))
		g.Expect(tp.lbpod.logs.String()).To(ContainSubstring(`msg="deleted stale conntrack entries" family=IPv4 keep="sources 172.18.0.100/32, ports [sctp/3868->10.109.201.193:3868 udp/53->10.109.201.193:53]" entries=1`))
	})
}
