//go:build dataplane

package dataplane

import (
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lbsvc/lbsvc-operator/lbpod/ha"
)

// BenchmarkAdvertFanout: what one advert costs a node, by how many other lb pods the node runs.
// On a node, every lb pod's net1 is a macvlan on the same parent; a multicast frame sent from one
// of them is copied, in the sender's context, to every other macvlan whose multicast filter lets
// its destination through, and each copy runs that pod's socket filter before it is dropped.
// "shared": as before group addresses, every replica joined the one address every advert went to,
// so each advert was copied to all N other net1s: per node, N Services × 10 adverts a second ×
// N copies. "group": each joined its Service's own address (and the shared one, where nothing is
// sent), and the advert goes to its group's address: no copy but to its own group. The neighbours
// here are macvlans with a packet socket each (lbpod's: bound to the advert EtherType, a filter
// that drops what is not its group's, here every frame), in one namespace; the sender sends the
// advert frame lbpod sends, as fast as it can, and the process's CPU time (user and system: the
// copies are made in the sending syscall and the softirq it runs) is divided by the adverts
// sent. Reported: cpu-ns/advert, and node-cpu-ms/s, what N Services' actives cost that node at
// 10 adverts a second each. Figures in docs/benchmarks.md ("Advert fan-out").
func BenchmarkAdvertFanout(b *testing.B) {
	const sends = 20000
	for _, n := range []int{0, 50, 100, 200} {
		for _, mode := range []string{"shared", "group"} {
			b.Run(fmt.Sprintf("neighbours=%d/%s", n, mode), func(b *testing.B) {
				perAdvert := advertFanout(b, n, mode == "group", sends)
				b.ReportMetric(float64(perAdvert.Nanoseconds()), "cpu-ns/advert")
				b.ReportMetric(float64(n)*10*float64(perAdvert.Nanoseconds())/1e6, "node-cpu-ms/s")
			})
		}
	}
}

// advertFanout builds a parent (one end of a veth) with n+1 macvlans in bridge mode in a fresh
// namespace, neighbours 1..n each with a socket joined as a replica of its own Service joins,
// and returns the CPU time per advert sent from macvlan 0.
func advertFanout(b *testing.B, n int, group bool, sends int) time.Duration {
	ns := "lbh-fan-" + randomSuffix(b)
	mustRun(b, "ip", "netns", "add", ns)
	b.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
			b.Errorf("cleanup: ip netns del %s: %v %s", ns, err, out)
		}
	})
	ip := func(args ...string) { mustRun(b, "ip", append([]string{"-n", ns}, args...)...) }
	ip("link", "add", "up0", "type", "veth", "peer", "name", "up1")
	ip("link", "set", "up0", "up")
	ip("link", "set", "up1", "up")
	// One ip -batch: 200 neighbours are 400 commands.
	batch := ""
	for i := 0; i <= n; i++ {
		batch += fmt.Sprintf("link add mv%d link up0 type macvlan mode bridge\nlink set mv%d up\n", i, i)
	}
	cmd := exec.Command("ip", "-n", ns, "-batch", "-")
	cmd.Stdin = strings.NewReader(batch)
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("ip -batch: %v %s", err, out)
	}
	groupOf := func(i int) ha.Group {
		return ha.GroupOf([]netip.Addr{netip.AddrFrom4([4]byte{172, 18, byte(i >> 8), byte(i)})})
	}
	var perAdvert time.Duration
	if err := inNS(b, ns, func() error {
		var fds []int
		defer func() {
			for _, fd := range fds {
				unix.Close(fd)
			}
		}()
		open := func(i int) (int, *net.Interface, error) {
			ifi, err := net.InterfaceByName(fmt.Sprintf("mv%d", i))
			if err != nil {
				return 0, nil, err
			}
			fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				return 0, nil, err
			}
			fds = append(fds, fd)
			join := []net.HardwareAddr{ha.MulticastMAC}
			if group {
				join = append(join, groupOf(i).MAC())
			}
			if i > 0 {
				// Drops every frame: the neighbour's filter drops other groups' adverts.
				drop := []unix.SockFilter{{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 0}, {Code: unix.BPF_RET | unix.BPF_K, K: 0}}
				if err := unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &unix.SockFprog{Len: uint16(len(drop)), Filter: &drop[0]}); err != nil {
					return 0, nil, err
				}
			}
			if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(ha.EtherType), Ifindex: ifi.Index}); err != nil {
				return 0, nil, err
			}
			for _, mac := range join {
				mreq := &unix.PacketMreq{Ifindex: int32(ifi.Index), Type: unix.PACKET_MR_MULTICAST, Alen: 6}
				copy(mreq.Address[:], mac)
				if err := unix.SetsockoptPacketMreq(fd, unix.SOL_PACKET, unix.PACKET_ADD_MEMBERSHIP, mreq); err != nil {
					return 0, nil, err
				}
			}
			return fd, ifi, nil
		}
		for i := 1; i <= n; i++ {
			if _, _, err := open(i); err != nil {
				return err
			}
		}
		fd, ifi, err := open(0)
		if err != nil {
			return err
		}
		// The sender's own socket gets nothing it sent back from the macvlan (the source is
		// skipped) but its outgoing copy: read it away now and then, as lbpod does.
		to := &unix.SockaddrLinklayer{Protocol: htons(ha.EtherType), Ifindex: ifi.Index, Halen: 6}
		dst := ha.MulticastMAC
		if group {
			dst = groupOf(0).MAC()
		}
		copy(to.Addr[:], dst)
		key, err := ha.NewKey(make([]byte, ha.MinKeyLen))
		if err != nil {
			return err
		}
		frame := key.Seal(ha.Advert{Group: groupOf(0), Term: 1, Priority: 100, Sender: ha.ID(ifi.HardwareAddr), Interval: 100 * time.Millisecond}, 1)
		buf := make([]byte, 1500)
		var r0, r1 syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &r0); err != nil {
			return err
		}
		for i := 0; i < sends; i++ {
			for {
				err := unix.Sendto(fd, frame, 0, to)
				if err == nil {
					break
				}
				if err != unix.EAGAIN && err != unix.ENOBUFS {
					return err
				}
			}
			if i%64 == 0 {
				for {
					if _, _, err := unix.Recvfrom(fd, buf, unix.MSG_DONTWAIT); err != nil {
						break
					}
				}
			}
		}
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &r1); err != nil {
			return err
		}
		cpu := time.Duration(r1.Utime.Nano()-r0.Utime.Nano()) + time.Duration(r1.Stime.Nano()-r0.Stime.Nano())
		perAdvert = cpu / time.Duration(sends)
		return nil
	}); err != nil {
		b.Fatalf("fan-out in %s: %v", ns, err)
	}
	return perAdvert
}
