//go:build dataplane

package dataplane

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The election's data-path tests: two replicas, each in its own pod namespace with a macvlan
// net1 on its own node's uplink, one Service address, and a client on the same bridge:
//
//	client c0 ── underlay: br0 ── pa ═ up0 (node a) ── net1 (macvlan) in pod a
//	                          └── pb ═ up0 (node b) ── net1 (macvlan) in pod b
//
// The client sends a UDP request every 10 ms and records who answers; an AF_PACKET socket in the
// client namespace records every ARP packet that speaks for the address.

const (
	haLB       = "172.18.0.18"
	haClient   = "172.18.0.100"
	haEchoPort = 7007 // unprivileged: the replicas run without CAP_NET_BIND_SERVICE
	// haInterval is the replicas' advert interval (the default).
	haInterval = 100 * time.Millisecond
	// haLease is the kernel lifetime of the address, renewed at every advert (ha.Leaser): the
	// kernel drops it from a replica that stopped renewing (kill -9, SIGSTOP).
	haLease = time.Second
)

type haTopology struct {
	t                testing.TB
	underlay, client string
	node, pod        map[string]string // by replica name
}

func newHATopology(t *testing.T) *haTopology { return newHATopologyTB(t) }

func newHATopologyTB(t testing.TB) *haTopology {
	t.Helper()
	s := randomSuffix(t)
	tp := &haTopology{t: t, underlay: "lbh-u-" + s, client: "lbh-c-" + s,
		node: map[string]string{"a": "lbh-na-" + s, "b": "lbh-nb-" + s},
		pod:  map[string]string{"a": "lbh-pa-" + s, "b": "lbh-pb-" + s}}
	for _, ns := range []string{tp.underlay, tp.client} {
		tp.addNS(ns)
	}
	ip := func(ns string, args ...string) { mustRun(t, "ip", append([]string{"-n", ns}, args...)...) }
	ip(tp.underlay, "link", "add", "br0", "type", "bridge")
	ip(tp.underlay, "link", "set", "br0", "up")
	ip(tp.underlay, "link", "add", "pc", "type", "veth", "peer", "name", "c0", "netns", tp.client)
	ip(tp.underlay, "link", "set", "pc", "master", "br0", "up")
	ip(tp.client, "link", "set", "c0", "up")
	ip(tp.client, "addr", "add", haClient+"/16", "dev", "c0")
	for _, r := range []string{"a", "b"} {
		tp.addNodeAndPod(r, "p"+r)
	}
	return tp
}

// addNS adds a network namespace with lo up, deleted when the test ends.
func (tp *haTopology) addNS(ns string) {
	t := tp.t
	mustRun(t, "ip", "netns", "add", ns)
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
			t.Errorf("cleanup: ip netns del %s: %v %s", ns, err, out)
		}
	})
	mustRun(t, "ip", "-n", ns, "link", "set", "lo", "up")
}

// addNodeAndPod adds replica r's node (its uplink up0 on the underlay bridge, through port) and
// pod (net1, a macvlan on up0), both named in tp.node and tp.pod already.
func (tp *haTopology) addNodeAndPod(r, port string) {
	ip := func(ns string, args ...string) { mustRun(tp.t, "ip", append([]string{"-n", ns}, args...)...) }
	tp.addNS(tp.node[r])
	tp.addNS(tp.pod[r])
	ip(tp.underlay, "link", "add", port, "type", "veth", "peer", "name", "up0", "netns", tp.node[r])
	ip(tp.underlay, "link", "set", port, "master", "br0", "up")
	ip(tp.node[r], "link", "set", "up0", "up")
	ip(tp.node[r], "link", "add", "link", "up0", "name", "net1", "type", "macvlan", "mode", "bridge")
	ip(tp.node[r], "link", "set", "net1", "netns", tp.pod[r])
	ip(tp.pod[r], "link", "set", "net1", "up")
}

// mac is net1's MAC in replica r's pod.
func (tp *haTopology) mac(r string) string {
	tp.t.Helper()
	out := mustRun(tp.t, "ip", "-n", tp.pod[r], "-o", "link", "show", "net1")
	f := strings.Fields(out[strings.Index(out, "link/ether"):])
	return f[1]
}

// holds says whether replica r's net1 has the LB address.
func (tp *haTopology) holds(r string) bool {
	tp.t.Helper()
	return tp.holdsAddr(r, haLB)
}

// dumpState logs what a failed test needs to be understood: the client's neighbours, each pod's
// net1 addresses and MAC, and the ARP packets captured.
func (tp *haTopology) dumpState(capture *arpCapture) {
	t := tp.t
	out, _ := exec.Command("ip", "-n", tp.client, "neigh").CombinedOutput()
	t.Logf("client neighbours:\n%s", out)
	for _, r := range []string{"a", "b"} {
		out, _ := exec.Command("ip", "-n", tp.pod[r], "addr", "show", "dev", "net1").CombinedOutput()
		t.Logf("pod %s net1:\n%s", r, out)
	}
	for _, p := range capture.packets() {
		t.Logf("ARP %s op %d from %s", p.at.Format("15:04:05.000"), p.op, p.mac)
	}
}

// holdsAddr says whether replica r's net1 has address lb.
func (tp *haTopology) holdsAddr(r, lb string) bool {
	tp.t.Helper()
	return strings.Contains(mustRun(tp.t, "ip", "-n", tp.pod[r], "-o", "addr", "show", "dev", "net1"), " "+lb+"/")
}

// haReplica is a running hatest (or lbpod) process and the roles it printed.
type haReplica struct {
	*lbpodProcess
	name  string
	mu    sync.Mutex
	roles []string
}

func (r *haReplica) role() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.roles) == 0 {
		return ""
	}
	return r.roles[len(r.roles)-1]
}

// startReplica runs hatest for the LB address in replica r's pod namespace; t.Cleanup kills it if
// it still runs.
func (tp *haTopology) startReplica(bin, r string) *haReplica {
	return tp.startReplicaFor(bin, r, haLB)
}

func (tp *haTopology) startReplicaFor(bin, r, lb string) *haReplica {
	return tp.startProcess(r, bin, "--name", r, "--interface", "net1",
		"--addresses", lb+"/16", "--echo-port", fmt.Sprint(haEchoPort), "--interval", haInterval.String(),
		"--lease", haLease.String())
}

// roleLine matches hatest's "role=active" and lbpod's log line `msg=role role=active`.
var roleLine = regexp.MustCompile(`^role=(\w+)$|\bmsg=role role=(\w+)\b`)

// startProcess runs a replica's process in its pod namespace with the lb pod's capabilities
// only (NET_ADMIN and NET_RAW: setpriv limits the bounding set, so root gets no others) and follows
// the roles it reports; t.Cleanup kills it if it still runs.
func (tp *haTopology) startProcess(r string, args ...string) *haReplica {
	t := tp.t
	t.Helper()
	cmd := exec.Command("ip", append([]string{"netns", "exec", tp.pod[r], "setpriv", "--bounding-set=-all,+net_admin,+net_raw", "--"}, args...)...)
	rep := &haReplica{lbpodProcess: &lbpodProcess{cmd: cmd, logs: &lockedBuffer{}, done: make(chan error, 1)}, name: r}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout // one pipe for both, in order
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", args[0], err)
	}
	lines := make(chan struct{})
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			rep.logs.Write([]byte(sc.Text() + "\n"))
			if m := roleLine.FindStringSubmatch(sc.Text()); m != nil {
				rep.mu.Lock()
				rep.roles = append(rep.roles, m[1]+m[2])
				rep.mu.Unlock()
			}
		}
	}()
	go func() { <-lines; rep.done <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Signal(syscall.SIGCONT)
			_ = cmd.Process.Kill()
			<-rep.done
		}
		if t.Failed() {
			t.Logf("replica %s log:\n%s", r, rep.logs.String())
		}
	})
	return rep
}

// waitFor polls cond every 10 ms for up to limit.
func waitFor(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, limit)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// udpProbe sends a numbered request every 10 ms from the client and records the replies.
type udpProbe struct {
	conn    net.Conn
	stop    chan struct{}
	wg      sync.WaitGroup
	mu      sync.Mutex
	replies []probeReply
	sent    []time.Time // by sequence number
}

type probeReply struct {
	at     time.Time
	from   string    // replica name
	sentAt time.Time // when the request it answers was sent
}

func startUDPProbe(t *testing.T, ns string) *udpProbe { return startUDPProbeTo(t, ns, haLB) }

func startUDPProbeTo(t *testing.T, ns, lb string) *udpProbe {
	t.Helper()
	conn, err := dialIn(t, ns, "udp", net.JoinHostPort(lb, fmt.Sprint(haEchoPort)), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	p := &udpProbe{conn: conn, stop: make(chan struct{})}
	p.wg.Add(2)
	go func() {
		defer p.wg.Done()
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for seq := 0; ; seq++ {
			select {
			case <-p.stop:
				return
			case <-tick.C:
			}
			p.mu.Lock()
			p.sent = append(p.sent, time.Now())
			p.mu.Unlock()
			_, _ = fmt.Fprintf(conn, "%d", seq)
		}
	}()
	go func() {
		defer p.wg.Done()
		buf := make([]byte, 1500)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				select {
				case <-p.stop:
					return
				default:
					continue // ICMP port unreachable from a kernel whose replica is gone
				}
			}
			now := time.Now()
			from, seq, _ := strings.Cut(string(buf[:n]), ": ")
			var i int
			if _, err := fmt.Sscan(seq, &i); err != nil {
				continue
			}
			p.mu.Lock()
			if i >= 0 && i < len(p.sent) {
				p.replies = append(p.replies, probeReply{at: now, from: from, sentAt: p.sent[i]})
			}
			p.mu.Unlock()
		}
	}()
	t.Cleanup(p.close)
	return p
}

func (p *udpProbe) close() {
	select {
	case <-p.stop:
		return
	default:
	}
	close(p.stop)
	_ = p.conn.SetReadDeadline(time.Now())
	p.wg.Wait()
	p.conn.Close()
}

// lastFrom is the replica that sent the latest reply, and how many replies there are.
func (p *udpProbe) lastFrom() (string, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.replies) == 0 {
		return "", 0
	}
	return p.replies[len(p.replies)-1].from, len(p.replies)
}

// outage is the longest time without a reply between since and the last reply, and the replicas
// that answered requests sent after since, in order of the requests, each once in a row. (A
// replica resumed after SIGSTOP answers what queued in its socket meanwhile: late replies to old
// requests, which say nothing about who holds the address now.)
func (p *udpProbe) outage(since time.Time) (time.Duration, []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var longest time.Duration
	prev := since
	for _, r := range p.replies {
		if r.at.Before(since) {
			continue
		}
		longest = max(longest, r.at.Sub(prev))
		prev = r.at
	}
	byRequest := append([]probeReply(nil), p.replies...)
	slices.SortStableFunc(byRequest, func(x, y probeReply) int { return x.sentAt.Compare(y.sentAt) })
	var order []string
	for _, r := range byRequest {
		if !r.sentAt.Before(since) && (len(order) == 0 || order[len(order)-1] != r.from) {
			order = append(order, r.from)
		}
	}
	return longest, order
}

// arpSeen is one ARP packet on the client's link that speaks for the LB address.
type arpSeen struct {
	at  time.Time
	op  uint16 // 1 request (gratuitous), 2 reply
	mac string
}

// arpCapture records, from an AF_PACKET socket in the client namespace, every ARP packet whose
// sender protocol address is the LB address: gratuitous ARPs and replies.
type arpCapture struct {
	fd   int
	done chan struct{}
	mu   sync.Mutex
	seen []arpSeen
}

func startARPCapture(t *testing.T, ns, ifname string) *arpCapture {
	t.Helper()
	c := &arpCapture{done: make(chan struct{})}
	proto := int(htons(unix.ETH_P_ARP))
	if err := inNS(t, ns, func() error {
		ifi, err := net.InterfaceByName(ifname)
		if err != nil {
			return err
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto)
		if err != nil {
			return err
		}
		c.fd = fd
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 50000}); err != nil {
			return err
		}
		return unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: uint16(proto), Ifindex: ifi.Index})
	}); err != nil {
		t.Fatalf("ARP capture in %s: %v", ns, err)
	}
	lb := net.ParseIP(haLB).To4()
	go func() {
		defer close(c.done)
		buf := make([]byte, 1500)
		for {
			n, _, err := unix.Recvfrom(c.fd, buf, 0)
			if err == unix.EAGAIN || err == unix.EINTR {
				continue
			}
			if err != nil {
				return
			}
			// Ethernet (14) + ARP for IPv4 over Ethernet (28).
			if n < 42 || binary.BigEndian.Uint16(buf[12:14]) != unix.ETH_P_ARP || !net.IP(buf[28:32]).Equal(lb) {
				continue
			}
			c.mu.Lock()
			c.seen = append(c.seen, arpSeen{at: time.Now(), op: binary.BigEndian.Uint16(buf[20:22]), mac: net.HardwareAddr(buf[22:28]).String()})
			c.mu.Unlock()
		}
	}()
	t.Cleanup(c.close)
	return c
}

func (c *arpCapture) close() {
	select {
	case <-c.done:
		return
	default:
	}
	_ = unix.Shutdown(c.fd, unix.SHUT_RDWR)
	unix.Close(c.fd)
	<-c.done
}

func (c *arpCapture) packets() []arpSeen {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]arpSeen(nil), c.seen...)
}

// checkOneMAC asserts that the ARP packets for the address came from one MAC at a time: first
// only from old, then only from next, with old allowed at most one advert interval after next's
// first packet.
func checkOneMAC(t *testing.T, seen []arpSeen, old, next string) {
	t.Helper()
	var lines []string
	for _, s := range seen {
		lines = append(lines, fmt.Sprintf("%s op %d from %s", s.at.Format("15:04:05.000"), s.op, s.mac))
	}
	var firstNext time.Time
	sawOld := false
	for _, s := range seen {
		switch s.mac {
		case old:
			sawOld = true
			if !firstNext.IsZero() && s.at.Sub(firstNext) > haInterval {
				t.Errorf("ARP for %s from the old holder %s %s after the new one %s first spoke:\n%s",
					haLB, old, s.at.Sub(firstNext), next, strings.Join(lines, "\n"))
				return
			}
		case next:
			if firstNext.IsZero() {
				firstNext = s.at
			}
		default:
			t.Errorf("ARP for %s from a third MAC %s:\n%s", haLB, s.mac, strings.Join(lines, "\n"))
			return
		}
	}
	t.Logf("ARP for %s seen by the client: %d packets, %d from the old holder, the new one first %s after the old one's last",
		haLB, len(seen), countFrom(seen, old), lastFrom(seen, old, firstNext))
	if !sawOld || firstNext.IsZero() {
		t.Errorf("want ARP for %s from %s, then from %s; saw:\n%s", haLB, old, next, strings.Join(lines, "\n"))
	}
}

// waitLapse waits until replica a's kernel dropped the address on its own (the lease lapsed) and
// prints how long after the address's last renewal that took, at most.
func waitLapse(t *testing.T, tp *haTopology, how string) {
	t.Helper()
	start := time.Now()
	waitFor(t, haLease+3*time.Second, "the lease of the "+how+" replica's address lapses", func() bool { return !tp.holds("a") })
	t.Logf("figure: ha_lease_lapse_%s_ms=%d (after the failover; lease %s)", how, time.Since(start).Milliseconds(), haLease)
}

// buildHATest builds test/dataplane/hatest into the test's TempDir (once per top-level test; the
// build cache makes the second one quick).
func buildHATest(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "hatest")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/lbsvc/lbsvc-operator/test/dataplane/hatest").CombinedOutput()
	if err != nil {
		t.Fatalf("go build hatest: %v\n%s", err, out)
	}
	return bin
}

// TestHAFailover moves the address from the active replica to the standby four ways and prints
// the client's outage for each (the longest time without a UDP reply, requests every 10 ms).
// The replicas are hatest, the election with a minimal data path of its own.
func TestHAFailover(t *testing.T) {
	bin := buildHATest(t)
	runHAFailover(t, "ha_outage", func(*haTopology) {}, func(tp *haTopology, r string) *haReplica { return tp.startReplica(bin, r) })
}

// haCase is one way the active replica a goes away: disrupt acts on it; restore waits for what
// must follow (and undoes a cut link) after b took over.
type haCase struct {
	name    string
	disrupt func(tp *haTopology, a *haReplica)
	restore func(t *testing.T, tp *haTopology, a *haReplica)
}

func haCases(start func(tp *haTopology, r string) *haReplica) []haCase {
	return []haCase{
		{name: "kill9",
			disrupt: func(_ *haTopology, a *haReplica) { _ = a.cmd.Process.Kill() },
			restore: func(t *testing.T, tp *haTopology, a *haReplica) {
				<-a.done
				// kill -9 leaves the address in the pod's namespace (the kernel outlives the
				// process) until its lease lapses.
				waitLapse(t, tp, "killed")
				// The container restarts: it releases first thing and stays standby.
				again := start(tp, "a")
				waitFor(t, 10*time.Second, "restarted a is a standby without the address", func() bool { return !tp.holds("a") && again.role() == "standby" })
			}},
		{name: "sigterm",
			disrupt: func(_ *haTopology, a *haReplica) { _ = a.cmd.Process.Signal(syscall.SIGTERM) },
			restore: func(t *testing.T, tp *haTopology, a *haReplica) {
				select {
				case err := <-a.done:
					if err != nil {
						t.Errorf("a after SIGTERM: %v", err)
					}
				case <-time.After(5 * time.Second):
					t.Errorf("a did not exit within 5 s of SIGTERM")
				}
				if tp.holds("a") {
					t.Errorf("a resigned but its net1 still has the address")
				}
			}},
		{name: "sigstop",
			disrupt: func(_ *haTopology, a *haReplica) { _ = a.cmd.Process.Signal(syscall.SIGSTOP) },
			restore: func(t *testing.T, tp *haTopology, a *haReplica) {
				waitLapse(t, tp, "stopped")
				_ = a.cmd.Process.Signal(syscall.SIGCONT)
				waitFor(t, 5*time.Second, "a steps down after SIGCONT", func() bool { return !tp.holds("a") && a.role() == "standby" })
				// It read b's takeover advert, queued while it was stopped, before saying anything.
				if l := a.logs.String(); !strings.Contains(l, "): stepping down") || strings.Contains(l, "keeping the addresses") {
					t.Errorf("a's log does not say it let go on b's newer term:\n%s", l)
				}
			}},
		{name: "partition",
			// The switch port stops forwarding, the link stays up: a cannot tell, and stays active
			// on its side while b takes over on the client's side.
			disrupt: func(tp *haTopology, _ *haReplica) {
				mustRun(tp.t, "bridge", "-n", tp.underlay, "link", "set", "dev", "pa", "state", "0")
			},
			restore: func(t *testing.T, tp *haTopology, a *haReplica) {
				if a.role() != "active" {
					t.Errorf("a behind an invisible partition is %s, want still active", a.role())
				}
				mustRun(t, "bridge", "-n", tp.underlay, "link", "set", "dev", "pa", "state", "3")
				healed := time.Now()
				// Healed: a hears b's newer term at b's next advert and lets go, without announcing.
				waitFor(t, 5*time.Second, "a steps down after the partition heals", func() bool { return !tp.holds("a") && a.role() == "standby" })
				t.Logf("figure: ha_partition_heal_to_one_holder_ms=%d", time.Since(healed).Milliseconds())
			}},
		{name: "linkdown",
			disrupt: func(tp *haTopology, _ *haReplica) {
				mustRun(tp.t, "ip", "-n", tp.node["a"], "link", "set", "up0", "down")
			},
			restore: func(t *testing.T, tp *haTopology, a *haReplica) {
				waitFor(t, 5*time.Second, "a releases on link loss", func() bool { return !tp.holds("a") && a.role() == "standby" })
				mustRun(t, "ip", "-n", tp.node["a"], "link", "set", "up0", "up")
			}},
	}
}

// runHAFailover runs every haCase on a fresh topology (setup adds to it) with replicas from start,
// printing `figure: <prefix>_<case>_ms=`.
func runHAFailover(t *testing.T, prefix string, setup func(tp *haTopology), start func(tp *haTopology, r string) *haReplica) {
	for _, tc := range haCases(start) {
		t.Run(tc.name, func(t *testing.T) {
			tp := newHATopology(t)
			setup(tp)
			capture := startARPCapture(t, tp.client, "c0")
			t.Cleanup(func() {
				if t.Failed() {
					tp.dumpState(capture)
				}
			})
			a := start(tp, "a")
			waitFor(t, 10*time.Second, "a becomes active", func() bool { return a.role() == "active" && tp.holds("a") })
			b := start(tp, "b")
			waitFor(t, 10*time.Second, "b starts as standby", func() bool { return b.role() == "standby" })
			probe := startUDPProbe(t, tp.client)
			waitFor(t, 5*time.Second, "the client is served by a", func() bool { from, n := probe.lastFrom(); return from == "a" && n >= 10 })

			begin := time.Now()
			tc.disrupt(tp, a)
			waitFor(t, 5*time.Second, "b serves the client", func() bool { from, _ := probe.lastFrom(); return from == "b" })
			tc.restore(t, tp, a)
			// Half a second more of traffic: b keeps the address, a does not come back.
			_, n := probe.lastFrom()
			waitFor(t, 5*time.Second, "50 more replies", func() bool { _, m := probe.lastFrom(); return m >= n+50 })
			probe.close()
			outage, order := probe.outage(begin)
			if strings.Join(order, ",") != "a,b" && strings.Join(order, ",") != "b" {
				t.Errorf("after the disruption replies came from %v, want a then b only", order)
			}
			if b.role() != "active" || !tp.holds("b") || tp.holds("a") {
				t.Errorf("afterwards: b %s holds=%t, a holds=%t; want b active holding alone", b.role(), tp.holds("b"), tp.holds("a"))
			}
			capture.close()
			checkOneMAC(t, capture.packets(), tp.mac("a"), tp.mac("b"))
			t.Logf("figure: %s_%s_ms=%d", prefix, tc.name, outage.Milliseconds())
		})
	}
}

func countFrom(seen []arpSeen, mac string) int {
	n := 0
	for _, s := range seen {
		if s.mac == mac {
			n++
		}
	}
	return n
}

// lastFrom is how long before first the last packet from mac came (negative: after).
func lastFrom(seen []arpSeen, mac string, first time.Time) time.Duration {
	var last time.Time
	for _, s := range seen {
		if s.mac == mac {
			last = s.at
		}
	}
	return first.Sub(last).Round(time.Millisecond)
}

// TestHAGroupsApart: replicas of two Services on one underlay do not elect among each other (the
// group is the address; the kernel filter drops the other group's adverts): each is active.
func TestHAGroupsApart(t *testing.T) {
	bin := buildHATest(t)
	tp := newHATopology(t)
	a := tp.startReplicaFor(bin, "a", haLB)
	b := tp.startReplicaFor(bin, "b", "172.18.0.19")
	waitFor(t, 5*time.Second, "both active", func() bool { return a.role() == "active" && b.role() == "active" })
	// Ten advert intervals later both still are, and neither ever stepped down.
	deadline := time.Now().Add(10 * haInterval)
	waitFor(t, 5*time.Second, "ten intervals", func() bool { return time.Now().After(deadline) })
	for _, r := range []*haReplica{a, b} {
		r.mu.Lock()
		roles := strings.Join(r.roles, ",")
		r.mu.Unlock()
		if roles != "standby,active" {
			t.Errorf("replica %s went through %s, want standby,active", r.name, roles)
		}
	}
}
