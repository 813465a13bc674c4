//go:build dataplane

package dataplane

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/packet"
	. "github.com/onsi/gomega"
	"golang.org/x/sys/unix"

	"github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
	"github.com/lbsvc/lbsvc-operator/lbpod/probe"
)

// TestConflictProbeOtherVLAN: a host on another VLAN of the same wire uses the LB address. Its
// tagged ARP replies reach net1 (no device for the VLAN: the kernel removes the tag and marks the
// frame PACKET_OTHERHOST), and a packet socket without a filter takes them for an answer; the
// probe's filter drops them, so nobody answered. The same host's untagged reply still answers.
func TestConflictProbeOtherVLAN(t *testing.T) {
	g := NewWithT(t)
	tp := newTopology(t)
	tp.ip(tp.lb, "link", "set", "net1", "up")
	lb := netip.MustParseAddr(lbIPv4)
	hostMAC, err := net.ParseMAC(strings.TrimSpace(tp.exec(tp.outsider, "cat", "/sys/class/net/c0/address")))
	g.Expect(err).NotTo(HaveOccurred())
	net1MAC, err := net.ParseMAC(strings.TrimSpace(tp.exec(tp.lb, "cat", "/sys/class/net/net1/address")))
	g.Expect(err).NotTo(HaveOccurred())

	// reply is the host's ARP reply for the LB address, broadcast, tagged with vlan when set.
	reply := func(vlan *ethernet.VLAN) []byte {
		p, err := arp.NewPacket(arp.OperationReply, hostMAC, lb, ethernet.Broadcast, netip.IPv4Unspecified())
		g.Expect(err).NotTo(HaveOccurred())
		pb, err := p.MarshalBinary()
		g.Expect(err).NotTo(HaveOccurred())
		f, err := (&ethernet.Frame{Destination: ethernet.Broadcast, Source: hostMAC, VLAN: vlan, EtherType: ethernet.EtherTypeARP, Payload: pb}).MarshalBinary()
		g.Expect(err).NotTo(HaveOccurred())
		return f
	}
	// openIn opens a raw ARP socket on dev in namespace ns, without a filter.
	openIn := func(ns, dev string) *packet.Conn {
		var c *packet.Conn
		g.Expect(inNS(t, ns, func() error {
			ifi, err := net.InterfaceByName(dev)
			if err != nil {
				return err
			}
			c, err = packet.Listen(ifi, packet.Raw, unix.ETH_P_ARP, nil)
			return err
		})).To(Succeed())
		t.Cleanup(func() { c.Close() })
		return c
	}
	host := openIn(tp.outsider, "c0")
	// sending sends frame from the host every 5 ms until the returned stop (or the test's end,
	// before the socket closes).
	sending := func(frame []byte) (stop func()) {
		done := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			tick := time.NewTicker(5 * time.Millisecond)
			defer tick.Stop()
			for {
				if _, err := host.WriteTo(frame, &packet.Addr{HardwareAddr: ethernet.Broadcast}); err != nil {
					t.Errorf("send: %v", err)
					return
				}
				select {
				case <-done:
					return
				case <-tick.C:
				}
			}
		})
		stop = sync.OnceFunc(func() { close(done); wg.Wait() })
		t.Cleanup(stop)
		return stop
	}
	probeNet1 := func() []v1alpha1.AddressConflict {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var got []v1alpha1.AddressConflict
		g.Expect(inNS(t, tp.lb, func() error {
			var err error
			got, err = probe.Run(ctx, "net1", []netip.Addr{lb}, probe.Fast, nil)
			return err
		})).To(Succeed())
		return got
	}

	stop := sending(reply(&ethernet.VLAN{ID: 7}))
	// The tagged reply reaches net1's packet sockets, untagged, and reads as an answer.
	plain := openIn(tp.lb, "net1")
	g.Expect(plain.SetReadDeadline(time.Now().Add(2 * time.Second))).To(Succeed())
	buf := make([]byte, 1600)
	for heard := false; !heard; {
		n, _, err := plain.ReadFrom(buf)
		g.Expect(err).NotTo(HaveOccurred(), "the tagged reply never reached net1")
		_, _, heard = probe.Answer(buf[:n], []netip.Addr{lb}, net1MAC)
	}
	// The probe does not count it.
	g.Expect(probeNet1()).To(BeEmpty())
	stop()

	// The host's untagged reply is an answer.
	sending(reply(nil))
	got := probeNet1()
	g.Expect(got).To(HaveLen(1))
	g.Expect(got[0].Address).To(Equal(lb))
	g.Expect(got[0].MAC.String()).To(Equal(hostMAC.String()))
}
