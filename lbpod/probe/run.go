package probe

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/packet"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"

	"github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
)

// Run probes addrs on the interface ifname with timing t and returns what answered, one entry per
// address at most, in addrs' order. Answers from a MAC that ignore (when set) names do not count
// (Answers). The addresses must not be configured on the interface meanwhile (its kernel would
// answer). Both families are probed at once.
func Run(ctx context.Context, ifname string, addrs []netip.Addr, t Timing, ignore func(net.HardwareAddr) bool) ([]v1alpha1.AddressConflict, error) {
	if len(addrs) == 0 {
		return nil, nil
	}
	ifi, err := upInterface(ctx, ifname, 2*time.Second)
	if err != nil {
		return nil, fmt.Errorf("conflict probe: %w", err)
	}
	conns := map[uint16]net.PacketConn{} // one raw socket per EtherType
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	type send struct {
		conn  net.PacketConn
		frame []byte
		to    net.HardwareAddr
	}
	var sends []send
	for _, a := range addrs {
		var frame []byte
		proto, to := uint16(ethernet.EtherTypeARP), ethernet.Broadcast
		if a.Is4() {
			frame, err = ARPProbe(ifi.HardwareAddr, a)
		} else {
			proto = uint16(ethernet.EtherTypeIPv6)
			if frame, err = DADProbe(ifi.HardwareAddr, a); err == nil {
				to = net.HardwareAddr(frame[:6])
			}
		}
		if err != nil {
			return nil, fmt.Errorf("conflict probe for %s: %w", a, err)
		}
		c, ok := conns[proto]
		if !ok {
			pc, err := packet.Listen(ifi, packet.Raw, int(proto), &packet.Config{Filter: socketFilter})
			if err != nil {
				return nil, fmt.Errorf("conflict probe: raw socket on %s: %w", ifname, err)
			}
			c, conns[proto] = pc, pc
		}
		sends = append(sends, send{c, frame, to})
	}

	// A backstop: the readers' deadline is set again after the last probe.
	deadline := time.Now().Add(t.Total() + time.Second)
	var mu sync.Mutex
	found := NewAnswers(addrs, ifi.HardwareAddr, ignore)
	var wg sync.WaitGroup
	for _, c := range conns {
		_ = c.SetReadDeadline(deadline)
		wg.Add(1)
		go func(c net.PacketConn) {
			defer wg.Done()
			buf := make([]byte, 1600)
			for {
				n, _, err := c.ReadFrom(buf)
				if err != nil {
					return // the deadline, or closed
				}
				mu.Lock()
				done := found.Add(buf[:n], time.Now())
				mu.Unlock()
				if done {
					for _, o := range conns {
						_ = o.SetReadDeadline(time.Now())
					}
					return
				}
			}
		}(c)
	}

	var sendErr error
	wait := time.Duration(0)
	if t.MaxWait > 0 {
		wait = rand.N(t.MaxWait)
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for i := 0; i < t.Probes; i++ {
		select {
		case <-ctx.Done():
			for _, c := range conns {
				_ = c.SetReadDeadline(time.Now())
			}
			wg.Wait()
			return nil, ctx.Err()
		case <-timer.C:
		}
		mu.Lock()
		all := found.All()
		mu.Unlock()
		if all {
			break
		}
		for _, s := range sends {
			if _, err := s.conn.WriteTo(s.frame, &packet.Addr{HardwareAddr: s.to}); err != nil {
				sendErr = errors.Join(sendErr, err)
			}
		}
		timer.Reset(t.Spacing)
	}
	// The readers listen Listen more after the last probe (or stopped when all answered).
	for _, c := range conns {
		_ = c.SetReadDeadline(time.Now().Add(t.Listen))
	}
	wg.Wait()
	out := found.List()
	if sendErr != nil && len(out) == 0 {
		return nil, fmt.Errorf("conflict probe: send: %w", sendErr)
	}
	return out, nil
}

// socketFilter is the probe sockets' classic BPF program: it drops the frames the kernel marks
// PACKET_OTHERHOST and keeps the rest. The kernel hands those to packet sockets although the
// host would not take them: a frame to another unicast MAC seen in promiscuous mode, and a
// VLAN-tagged frame on a trunk that has no device for its VLAN (the tag removed, so it reads
// like one of ours). A host that uses the address on another VLAN is no conflict on ours. Our
// probes' answers come to our MAC, to a broadcast or to a multicast group, and are kept.
var socketFilter = mustAssemble(
	bpf.LoadExtension{Num: bpf.ExtType},
	bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.PACKET_OTHERHOST, SkipTrue: 1},
	bpf.RetConstant{Val: math.MaxUint32}, // keep the whole frame
	bpf.RetConstant{Val: 0},              // drop it
)

func mustAssemble(prog ...bpf.Instruction) []bpf.RawInstruction {
	raw, err := bpf.Assemble(prog)
	if err != nil {
		panic(err)
	}
	return raw
}

// upInterface waits, at most wait, until the interface is up: the lb pod's loop sets net1 up in
// its first apply, which may run at the same time as the probe (frames sent on a link that is
// down are lost, and the probe would hear nothing).
func upInterface(ctx context.Context, name string, wait time.Duration) (*net.Interface, error) {
	deadline := time.Now().Add(wait)
	for {
		ifi, err := net.InterfaceByName(name)
		if err != nil {
			return nil, err
		}
		if ifi.Flags&net.FlagUp != 0 && ifi.Flags&net.FlagRunning != 0 {
			return ifi, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%s is not up after %s", name, wait)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}
