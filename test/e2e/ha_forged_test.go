//go:build e2e

package e2e

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"math"
	"net"
	"net/netip"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lbsvc/lbsvc-operator/lbpod/ha"
)

// underlayWire is a raw Ethernet socket for the election's EtherType on eth0 of an underlay
// network namespace, as any host on the L2 can open one: it reads the adverts the replicas send
// and sends whatever frame it likes. All of it runs on one goroutine locked into that namespace.
type underlayWire struct {
	fd  int
	ifi *net.Interface
}

// openUnderlayWire opens the socket on the calling goroutine, which it locks into netns.
func openUnderlayWire(netns string, group ha.Group) (*underlayWire, error) {
	if err := enterNetns(netns); err != nil {
		return nil, err
	}
	ifi, err := net.InterfaceByName("eth0")
	if err != nil {
		return nil, err
	}
	proto := int(htons(ha.EtherType))
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto)
	if err != nil {
		return nil, err
	}
	w := &underlayWire{fd: fd, ifi: ifi}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(ha.EtherType), Ifindex: ifi.Index}); err != nil {
		w.close()
		return nil, err
	}
	// The group's address, where its adverts go (ha.Group.MAC), and the shared one.
	for _, mac := range []net.HardwareAddr{group.MAC(), ha.MulticastMAC} {
		mreq := unix.PacketMreq{Ifindex: int32(ifi.Index), Type: unix.PACKET_MR_MULTICAST, Alen: 6}
		copy(mreq.Address[:], mac)
		if err := unix.SetsockoptPacketMreq(fd, unix.SOL_PACKET, unix.PACKET_ADD_MEMBERSHIP, &mreq); err != nil {
			w.close()
			return nil, err
		}
	}
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 1}); err != nil {
		w.close()
		return nil, err
	}
	return w, nil
}

func (w *underlayWire) close() { _ = unix.Close(w.fd) }

// capture returns the payload of the first advert of group heard within timeout.
func (w *underlayWire) capture(group ha.Group, timeout time.Duration) ([]byte, error) {
	buf := make([]byte, 1600)
	for end := time.Now().Add(timeout); time.Now().Before(end); {
		n, _, err := unix.Recvfrom(w.fd, buf, 0)
		if err != nil {
			if err == unix.EAGAIN || err == unix.EINTR {
				continue
			}
			return nil, err
		}
		if n < 14 || binary.BigEndian.Uint16(buf[12:14]) != ha.EtherType {
			continue
		}
		f, err := ha.ParseFrame(buf[14:n])
		if err == nil && f.Advert.Group == group && f.Version == 2 {
			return append([]byte(nil), buf[14:n]...), nil
		}
	}
	return nil, fmt.Errorf("no advert of group %s within %v", group, timeout)
}

// send puts payload on the wire to the group's own address (ha.Group.MAC: a forger who knows the
// Service's address derives it as the replicas do), from eth0's own MAC (the forged sender is
// inside the advert, as a forger would do). The data-path tests' forger sends to the shared
// address, where the replicas listen too.
func (w *underlayWire) send(payload []byte, to net.HardwareAddr) error {
	frame := make([]byte, 0, 14+len(payload))
	frame = append(frame, to...)
	frame = append(frame, w.ifi.HardwareAddr...)
	frame = binary.BigEndian.AppendUint16(frame, ha.EtherType)
	frame = append(frame, payload...)
	return unix.Sendto(w.fd, frame, 0, &unix.SockaddrLinklayer{Protocol: htons(ha.EtherType), Ifindex: w.ifi.Index, Halen: 6,
		Addr: [8]byte(append(append([]byte(nil), to...), 0, 0))})
}

// forgedKinds are the frames an attacker on the underlay sends, by the refusal reason each must
// meet at every replica that hears it.
type forgedKind struct {
	name, reason string
	// frame builds the payload; captured is a real advert heard on the wire a moment before.
	frame func(captured []byte) []byte
}

func forgedKinds(group ha.Group) []forgedKind {
	madeUp := ha.ID{0x02, 0x00, 0x5e, 0x10, 0x20, 0x30}
	wrongKey := make([]byte, 32)
	if _, err := rand.Read(wrongKey); err != nil {
		panic(err)
	}
	k, err := ha.NewKey(wrongKey)
	if err != nil {
		panic(err)
	}
	return []forgedKind{
		// Issue 22's two frames, unauthenticated as they were sent on the demo: a resignation from a
		// made-up sender (it forced one failover per frame) and the maximal term, priority and
		// interval (it left nobody holding the address for minutes).
		{"resign", ha.RefusedUnauthenticated, func([]byte) []byte {
			return ha.Advert{Group: group, Term: 1, Priority: 100, Sender: madeUp, Resigning: true, Interval: 100 * time.Millisecond}.Marshal()
		}},
		{"max_term", ha.RefusedUnauthenticated, func([]byte) []byte {
			return ha.Advert{Group: group, Term: math.MaxUint64, Priority: 255, Sender: madeUp, Interval: ha.MaxInterval}.Marshal()
		}},
		// The same resignation, sealed with a key that is not the Service's.
		{"wrong_key", ha.RefusedAuth, func([]byte) []byte {
			return k.Seal(ha.Advert{Group: group, Term: math.MaxInt32, Priority: 255, Sender: madeUp, Resigning: true, Interval: 100 * time.Millisecond},
				uint64(time.Now().UnixMicro()))
		}},
		// A real advert of the active, captured on the underlay and sent again.
		{"replay", ha.RefusedReplay, func(captured []byte) []byte { return captured }},
	}
}

// rejected reads an lb pod's lbpod_ha_adverts_rejected_total by reason, through the API server's
// pod proxy.
func rejected(pod *corev1.Pod) (map[string]float64, error) {
	page, err := run(kubectl, "get", "--raw", "/api/v1/namespaces/"+pod.Namespace+"/pods/"+pod.Name+":"+lbPodHealthPort+"/proxy/metrics")
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, r := range []string{ha.RefusedUnauthenticated, ha.RefusedAuth, ha.RefusedReplay, ha.RefusedStale} {
		for _, v := range samples(page, "lbpod_ha_adverts_rejected_total", map[string]string{"reason": r}) {
			out[r] += v
		}
	}
	return out, nil
}

// addUnderlayClient makes a second client on the underlay: a network namespace with a veth on the
// switch (br0 in the underlay namespace) holding addr (an excluded address of the seed's Subnet).
func addUnderlayClient(t *testing.T, name, addr string) {
	t.Helper()
	mustRun := func(args ...string) {
		t.Helper()
		if out, err := run(args[0], args[1:]...); err != nil {
			t.Fatalf("%v: %v: %s", args, err, out)
		}
	}
	port := "ul-" + name[len(name)-6:]
	mustRun("ip", "netns", "add", name)
	t.Cleanup(func() {
		if out, err := run("ip", "netns", "del", name); err != nil {
			t.Errorf("ip netns del %s: %v: %s", name, err, out)
		}
	})
	mustRun("ip", "-n", underlayNetns, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", name)
	mustRun("ip", "-n", underlayNetns, "link", "set", port, "master", "br0", "up")
	mustRun("ip", "-n", name, "addr", "add", addr, "dev", "eth0")
	mustRun("ip", "-n", name, "link", "set", "eth0", "up")
	mustRun("ip", "-n", name, "link", "set", "lo", "up")
}

// TestForgedAdvertsChangeNothing: a Service with two lb pods; from the client namespace (an
// ordinary host on the underlay) an attacker sends the frames of issue 22 (a resignation and the
// maximal term from a made-up sender), one sealed with a wrong key, and a replay of a real advert
// it captured on the wire, 25 of each, while two clients probe the address every 20 ms: the
// client namespace, and a second client that forgets its neighbour entry before every probe (a
// cached MAC would hide an address nobody holds). Neither client misses an answer, the same
// network namespace holds the address throughout, the Lease records no takeover, and each lb pod
// counts every forged frame under its reason.
func TestForgedAdvertsChangeNothing(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	multiNode(t)
	id := suffix()
	svc, ip, cur := startStandbyService(t, "e2e-forge-"+id)
	group := ha.GroupOf([]netip.Addr{netip.MustParseAddr(ip)})

	c2 := "lbsvc-e2e-c2-" + id
	addUnderlayClient(t, c2, "172.18.0.9/16")
	forget := func() error {
		link, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		err = netlink.NeighDel(&netlink.Neigh{LinkIndex: link.Attrs().Index, IP: net.ParseIP(ip)})
		if err != nil && err != unix.ENOENT {
			return fmt.Errorf("forget the neighbour %s: %w", ip, err)
		}
		return nil
	}
	cached := startTCPProber(t, ip+":80")
	forgetful := startTCPProberIn(t, c2, ip+":80", forget)
	cached.waitAnswered(t, time.Now(), time.Minute)
	forgetful.waitAnswered(t, time.Now(), time.Minute)
	cached.waitSteady(t, 10)
	forgetful.waitSteady(t, 10)

	holders, err := holdersOf(ip)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(holders).To(HaveLen(1))
	lease := &coordinationv1.Lease{}
	g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: svc.Namespace, Name: "lb-svc-" + svc.Name}, lease)).To(Succeed())
	transitions := ptr.Deref(lease.Spec.LeaseTransitions, 0)
	pods := []*corev1.Pod{cur.active, cur.standby}
	before := make([]map[string]float64, len(pods))
	for i, p := range pods {
		before[i], err = rejected(p)
		g.Expect(err).NotTo(HaveOccurred(), "metrics of %s", p.Name)
	}

	const perKind = 25
	kinds := forgedKinds(group)
	start := time.Now()
	stop := make(chan struct{})
	most := maxHolders(ip, stop)
	attacked := make(chan error, 1)
	go func() {
		w, err := openUnderlayWire(clientNetns, group)
		if err != nil {
			attacked <- err
			return
		}
		defer w.close()
		captured, err := w.capture(group, 5*time.Second)
		if err != nil {
			attacked <- err
			return
		}
		// Interleaved, one frame every 20 ms: 100 frames in about 2 s, the replays within the
		// replay window of the capture, so that they meet the replay check and not only the time
		// window.
		pace := time.NewTicker(20 * time.Millisecond)
		defer pace.Stop()
		for i := 0; i < perKind; i++ {
			for _, k := range kinds {
				if err := w.send(k.frame(captured), group.MAC()); err != nil {
					attacked <- fmt.Errorf("send %s: %w", k.name, err)
					return
				}
				<-pace.C
			}
		}
		attacked <- nil
	}()
	g.Expect(<-attacked).To(Succeed(), "the attack from the client namespace")
	// Any effect of the last frames shows within a dead interval (300 ms) and lasts longer: 50
	// probes begun after the last frame (about a second) must all be counted.
	last := time.Now()
	cached.waitProbes(t, last, 50)
	forgetful.waitProbes(t, last, 50)
	close(stop)
	for name, p := range map[string]*tcpProber{"client": cached, "forgetful client": forgetful} {
		gap, failed, total, why := p.outage(start, time.Now())
		t.Logf("figure: ha_forged_outage_%s_ms=%d (failed probes %d of %d: %s; %d forged frames of %d kinds)",
			map[string]string{"client": "cached", "forgetful client": "forgetful"}[name], gap.Milliseconds(), failed, total, why, perKind*len(kinds), len(kinds))
		g.Expect(failed).To(BeZero(), "%s: probes failed during the attack (%s)", name, why)
		g.Expect(total).To(BeNumerically(">", 50), "%s: probes during the attack", name)
	}
	g.Expect(<-most).To(Equal(1), "network namespaces holding %s at once during the attack", ip)
	after, err := holdersOf(ip)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(after).To(Equal(holders), "the holder of %s after the attack", ip)
	g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(lease), lease)).To(Succeed())
	g.Expect(ptr.Deref(lease.Spec.LeaseTransitions, 0)).To(Equal(transitions), "takeovers recorded in the Lease")

	// Every replica hears every frame (the switch floods the group MAC). The active ignores its own
	// adverts replayed (a frame from oneself is never believed), so it counts no replay.
	for i, p := range pods {
		now, err := rejected(p)
		g.Expect(err).NotTo(HaveOccurred())
		delta := map[string]int{}
		for r, v := range now {
			if d := int(v - before[i][r]); d != 0 {
				delta[r] = d
			}
		}
		want := map[string]int{ha.RefusedUnauthenticated: 2 * perKind, ha.RefusedAuth: perKind}
		if p == cur.standby {
			want[ha.RefusedReplay] = perKind
		}
		t.Logf("%s (%s) refused: %v", p.Name, map[bool]string{true: "active", false: "standby"}[p == cur.active], delta)
		g.Expect(delta).To(Equal(want), "refusals counted by %s", p.Name)
	}
}

// waitProbes waits until n probes began after since (whatever their result).
func (p *tcpProber) waitProbes(t *testing.T, since time.Time, n int) {
	t.Helper()
	NewWithT(t).Eventually(func() int {
		p.mu.Lock()
		defer p.mu.Unlock()
		c := 0
		for i := len(p.probes) - 1; i >= 0 && p.probes[i].at.After(since); i-- {
			c++
		}
		return c
	}).WithTimeout(time.Minute).WithPolling(50*time.Millisecond).Should(BeNumerically(">=", n), "probes after %v", since)
}
