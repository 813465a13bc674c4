//go:build dataplane

package dataplane

import (
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lbsvc/lbsvc-operator/lbpod/ha"
)

// The election's group addresses (ha.Group.MAC): an advert goes to its Service's own multicast
// address, so a node's other lb pods' net1s (macvlans on the same parent, which pass up only the
// multicast addresses joined on them) never get it; before, every advert went to the one shared
// address every replica joins, and was copied to every lb pod's net1 on the node and dropped there.

// addReplica adds a third node and pod, r, on the underlay, with its cluster side (clusterSide),
// as newHATopology made a and b.
func (tp *haTopology) addReplica(r string) {
	s := strings.TrimPrefix(tp.underlay, "lbh-u-")
	tp.node[r], tp.pod[r] = "lbh-n"+r+"-"+s, "lbh-p"+r+"-"+s
	tp.addNodeAndPod(r, "pn"+r)
	tp.clusterSide(r)
}

// addNeighbourPod adds a pod namespace on replica r's node with a net1 of its own (a macvlan on
// the same parent, as another Service's lb pod there has) and returns it.
func (tp *haTopology) addNeighbourPod(name, r string) string {
	t := tp.t
	ns := tp.pod[r] + "-" + name
	tp.addNS(ns)
	mustRun(t, "ip", "-n", tp.node[r], "link", "add", "link", "up0", "name", "nb-"+name, "type", "macvlan", "mode", "bridge")
	mustRun(t, "ip", "-n", tp.node[r], "link", "set", "nb-"+name, "netns", ns, "name", "net1")
	mustRun(t, "ip", "-n", ns, "link", "set", "net1", "up")
	return ns
}

// advertListener is an AF_PACKET socket on net1 in a pod namespace that joined one multicast
// address, as a replica's socket does, and has no filter: it sees every advert net1 passes up,
// with its Ethernet header (SOCK_RAW), so that it can tell where each was addressed. A macvlan
// passes up multicast by a 256-bucket hash of the addresses joined on it, so now and then it also
// passes a frame addressed elsewhere: the checks count adverts by their destination.
type advertListener struct{ fd int }

func listenAdverts(t *testing.T, ns string, join net.HardwareAddr) *advertListener {
	t.Helper()
	l := &advertListener{}
	if err := inNS(t, ns, func() error {
		ifi, err := net.InterfaceByName("net1")
		if err != nil {
			return err
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		l.fd = fd
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 50000}); err != nil {
			return err
		}
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(ha.EtherType), Ifindex: ifi.Index}); err != nil {
			return err
		}
		mreq := &unix.PacketMreq{Ifindex: int32(ifi.Index), Type: unix.PACKET_MR_MULTICAST, Alen: 6}
		copy(mreq.Address[:], join)
		return unix.SetsockoptPacketMreq(fd, unix.SOL_PACKET, unix.PACKET_ADD_MEMBERSHIP, mreq)
	}); err != nil {
		t.Fatalf("advert listener in %s joined to %s: %v", ns, join, err)
	}
	t.Cleanup(func() { unix.Close(l.fd) })
	return l
}

// seen counts the adverts of one group a listener read, by destination.
type seen struct {
	// toShared and toGroup: addressed to ha.MulticastMAC and to the group's address;
	// unmarked: of those, the ones without the flag of replicas that send to group addresses.
	toShared, toGroup, unmarked int
}

// count drops what is queued, then reads for d the adverts of group g.
func (l *advertListener) count(t *testing.T, g ha.Group, d time.Duration) seen {
	t.Helper()
	buf := make([]byte, 1500)
	for {
		if _, _, err := unix.Recvfrom(l.fd, buf, unix.MSG_DONTWAIT); err != nil {
			break
		}
	}
	var s seen
	for deadline := time.Now().Add(d); time.Now().Before(deadline); {
		n, _, err := unix.Recvfrom(l.fd, buf, 0)
		if err == unix.EAGAIN || err == unix.EINTR {
			continue
		}
		if err != nil {
			t.Fatalf("read adverts: %v", err)
		}
		if n < 14 {
			continue
		}
		f, err := ha.ParseFrame(buf[14:n])
		if err != nil || f.Advert.Group != g {
			continue
		}
		switch dst := net.HardwareAddr(buf[0:6]).String(); dst {
		case ha.MulticastMAC.String():
			s.toShared++
		case g.MAC().String():
			s.toGroup++
		default:
			t.Errorf("an advert of the group addressed to %s", dst)
		}
		if !f.GroupAddressed {
			s.unmarked++
		}
	}
	return s
}

// TestHAGroupAddress: two replicas (a active, b standby) with a key. A neighbour pod on a's node
// whose net1 joined only the shared address (as every lb pod of every Service did, and as
// replicas still do to hear old ones) reads no advert addressed there in 2 s; one that joined the
// Service's group address reads the active's ten a second, each marked as sent to the group's
// address. With the replicas of the release before (--ha-group-address=false) the first reads
// them all, unmarked: the check can fail.
func TestHAGroupAddress(t *testing.T) {
	svc := filepath.Join(t.TempDir(), "svc.yaml")
	writeService(t, svc, []string{clusterIPv4}, []servicePort{{Protocol: "UDP", Port: haEchoPort, TargetPort: haEchoPort}}, nil)
	keyFile := writeHAKey(t)
	g := ha.GroupOf([]netip.Addr{netip.MustParseAddr(haLB)})
	for _, tc := range []struct {
		name  string
		extra []string
		// check says what is wrong with what the neighbours read in 2 s: on the shared address
		// and on the group's
		check func(shared, own seen) string
	}{
		{"group addresses", nil, func(shared, own seen) string {
			if shared.toShared != 0 || own.toGroup < 10 || own.unmarked != 0 {
				return "want none addressed to the shared address, the active's (at least 10) to the group's, all marked"
			}
			return ""
		}},
		{"the release before", []string{"--ha-group-address=false"}, func(shared, own seen) string {
			if shared.toShared < 10 || shared.unmarked != shared.toShared || shared.toGroup+own.toGroup != 0 {
				return "want the active's (at least 10) addressed to the shared address, unmarked, none to the group's"
			}
			return ""
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tp := newHATopology(t)
			tp.addClusterSide()
			a := tp.startReplicaLBPod("a", svc, append([]string{"--ha-key-file", keyFile}, tc.extra...)...)
			waitFor(t, 10*time.Second, "a active", func() bool { return a.role() == "active" && tp.holds("a") })
			b := tp.startReplicaLBPod("b", svc, append([]string{"--ha-key-file", keyFile}, tc.extra...)...)
			waitFor(t, 10*time.Second, "b standby", func() bool { return b.role() == "standby" })
			sharedL := listenAdverts(t, tp.addNeighbourPod("shared", "a"), ha.MulticastMAC)
			ownL := listenAdverts(t, tp.addNeighbourPod("own", "a"), g.MAC())
			shared := sharedL.count(t, g, 2*time.Second)
			own := ownL.count(t, g, 2*time.Second)
			t.Logf("figure: ha_group_address_adverts{replicas=%q} neighbour_on_shared_address=%+v neighbour_on_group_address=%+v (2 s each)", tc.name, shared, own)
			if why := tc.check(shared, own); why != "" {
				t.Errorf("the neighbours read %+v (shared address) and %+v (group's address): %s", shared, own, why)
			}
			if a.role() != "active" || b.role() != "standby" || tp.holds("b") {
				t.Errorf("afterwards a %s, b %s (b holds %t); want a active, b standby", a.role(), b.role(), tp.holds("b"))
			}
		})
	}
}

// TestHALBPodUpgradeToGroupAddress: the rolling update from the release before group addresses.
// a and b run as that release (--ha-group-address=false: they send to the shared address and
// listen only there), a active. c starts with group addresses and the higher priority: it hears a
// (it listens on both), stays a standby, and copies its adverts to the shared address from then on.
// a is stopped (SIGTERM): c takes over, and b, the old standby, must keep hearing it through the
// copies and stay a standby: one holder throughout, no failed probe. b is stopped too (within the
// window: an old standby that outlives it stops hearing the new active and claims); one copy
// window (8 s here) after c last heard an old replica, c stops copying: a neighbour on the shared
// address gets nothing more.
func TestHALBPodUpgradeToGroupAddress(t *testing.T) {
	svc := filepath.Join(t.TempDir(), "svc.yaml")
	writeService(t, svc, []string{clusterIPv4}, []servicePort{{Protocol: "UDP", Port: haEchoPort, TargetPort: haEchoPort}}, nil)
	keyFile := writeHAKey(t)
	g := ha.GroupOf([]netip.Addr{netip.MustParseAddr(haLB)})
	tp := newHATopology(t)
	tp.addClusterSide()
	tp.addReplica("c")
	// Priorities 0 and 255: the skews (Machine.skew) then order the claims after a's resignation,
	// c's at most 17 ms, b's at least 25 ms, so that the new replica takes over.
	old := []string{"--ha-key-file", keyFile, "--ha-group-address=false", "--ha-priority", "0"}
	a := tp.startReplicaLBPod("a", svc, old...)
	waitFor(t, 10*time.Second, "the old replica a active", func() bool { return a.role() == "active" && tp.holds("a") })
	b := tp.startReplicaLBPod("b", svc, old...)
	waitFor(t, 10*time.Second, "the old replica b standby", func() bool { return b.role() == "standby" })
	// c runs as the operator starts it beside old replicas that already have a key: they carry
	// the wire label of this version, so the legacy window is 0 (decide.LegacyPeers); the copies
	// do not depend on it (--ha-copy-window, 8 s here instead of 2 min).
	c := tp.startReplicaLBPod("c", svc, "--ha-key-file", keyFile, "--ha-priority", "255", "--ha-legacy-window", "0s", "--ha-copy-window", "8s")
	waitFor(t, 10*time.Second, "the new replica c standby", func() bool { return c.role() == "standby" })
	probe := startProbeLoop(t, tp.client, "c0")
	waitFor(t, 5*time.Second, "50 answers from a", func() bool { return probe.okFrom("a") >= 50 })
	holders := func() []string {
		var h []string
		for _, r := range []string{"a", "b", "c"} {
			if tp.holds(r) {
				h = append(h, r)
			}
		}
		return h
	}
	if h := holders(); len(h) != 1 || h[0] != "a" || b.role() != "standby" || c.role() != "standby" {
		t.Fatalf("behind the old active: holders %v, b %s, c %s; want a alone, both standbys", h, b.role(), c.role())
	}
	stopped := time.Now()
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	waitFor(t, 5*time.Second, "c active and holding", func() bool { return c.role() == "active" && tp.holds("c") })
	// Thirty intervals with the new active: the old standby hears its copies, or it claims.
	var twice []string
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if h := holders(); len(h) > 1 && twice == nil {
			twice = h
		}
	}
	if twice != nil || b.role() != "standby" || c.role() != "active" {
		t.Errorf("with the new active: held by %v at once, b %s, c %s; want c alone active, b a standby", twice, b.role(), c.role())
	}
	if !strings.Contains(c.logs.String(), "adverts also go there") {
		t.Errorf("c does not say that it copies its adverts to the shared address")
	}
	n := probe.okFrom("c")
	waitFor(t, 5*time.Second, "25 answers from c", func() bool { return probe.okFrom("c") >= n+25 })
	probe.close()
	_, failed, fromOthers, outage := probe.result()
	t.Logf("figure: ha_upgrade_group_address_outage_ms=%d (the longest time between two answers, ending %s after the SIGTERM; probes every 20 ms with the neighbour entry flushed; %d answered by b or c, %d failed)",
		outage.Milliseconds(), probe.outageAt.Sub(stopped).Round(time.Millisecond), fromOthers, failed)
	if failed != 0 {
		t.Errorf("%d probes failed during the upgrade, want 0", failed)
	}
	_ = b.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-b.done:
	case <-time.After(5 * time.Second):
		t.Fatal("b did not exit within 5 s of SIGTERM")
	}
	// b never sent as a standby: c last heard an old replica when a resigned; its window ends
	// 8 s after that.
	waitFor(t, 15*time.Second, "c stops copying", func() bool { return strings.Contains(c.logs.String(), "adverts go to the group's address only") })
	shared := listenAdverts(t, tp.addNeighbourPod("shared", "c"), ha.MulticastMAC)
	if got := shared.count(t, g, time.Second); got.toShared != 0 || c.role() != "active" || !tp.holds("c") {
		t.Errorf("after the window: %d adverts addressed to the shared address in 1 s, c %s holding %t; want none, c active and holding", got.toShared, c.role(), tp.holds("c"))
	}
	// No refusal, but for at most one replay: when c turns standby it swaps its sockets'
	// filters (conn.setQueueing), and an advert arriving in between reaches both, its second
	// copy refused as a replay (seen once, 2026-11-29, 20 ms after c started). A replay of the
	// copies old replicas send to the shared address would be one per advert.
	rej := tp.rejected("c")
	for reason, n := range rej {
		if n != 0 && (reason != "replay" || n > 1) {
			t.Errorf("c refused adverts during the upgrade: %v; want none but one replay at most (no replay of its own copies)", rej)
			break
		}
	}
	if len(rej) == 0 {
		t.Error("c's metrics show no lbpod_ha_adverts_rejected_total")
	}
}
