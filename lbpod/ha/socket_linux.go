package ha

import (
	"encoding/binary"
	"fmt"
	"net"
	"os"

	"golang.org/x/sys/unix"
)

// conn is an AF_PACKET socket on net1 for the adverts. AF_PACKET needs only CAP_NET_RAW, and works
// on a standby's net1, which has no IP address to send from.
type conn struct {
	f       *os.File
	ifindex int
	// fd is f's descriptor, for pending: reads through f hold f's read lock while they wait, so
	// a second reader must go to the descriptor itself. It is valid until close.
	fd int
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// advertFilter is a classic BPF program that lets through only adverts of our group, so the
// kernel drops every other Service's adverts before they wake us, and of wire version 1 or
// maxVersion: a replica without a key reads version 1 only, as the replicas before version 2 did;
// one with a key reads both (version 1 for the legacy window and to count what it refuses).
// Offsets are from the start of the payload (SOCK_DGRAM strips the Ethernet header).
func advertFilter(g Group, maxVersion uint8) []unix.SockFilter {
	const (
		ldW = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
		ldB = unix.BPF_LD | unix.BPF_B | unix.BPF_ABS
		jeq = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
		ret = unix.BPF_RET | unix.BPF_K
	)
	prog := []unix.SockFilter{
		{Code: ldW, K: 0}, {Code: jeq, K: binary.BigEndian.Uint32(advertMagic[:]), Jf: 8},
		{Code: ldW, K: 8}, {Code: jeq, K: binary.BigEndian.Uint32(g[0:4]), Jf: 6},
		{Code: ldW, K: 12}, {Code: jeq, K: binary.BigEndian.Uint32(g[4:8]), Jf: 4},
		{Code: ldB, K: 4}, {Code: jeq, K: advertVersion, Jt: 1}, {Code: jeq, K: uint32(maxVersion), Jf: 1},
		{Code: ret, K: 1 << 16},
		{Code: ret, K: 0},
	}
	return prog
}

// listen opens the socket on ifname, joined to MulticastMAC and filtered to group g.
func listen(ifname string, g Group, maxVersion uint8) (*conn, error) {
	ifi, err := net.InterfaceByName(ifname)
	if err != nil {
		return nil, err
	}
	// Protocol 0: nothing is queued until bind, which comes after the filter.
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("AF_PACKET socket (needs NET_RAW): %w", err)
	}
	fail := func(what string, err error) (*conn, error) {
		unix.Close(fd)
		return nil, fmt.Errorf("%s on %q: %w", what, ifname, err)
	}
	filter := advertFilter(g, maxVersion)
	if err := unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}); err != nil {
		return fail("attach filter", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(EtherType), Ifindex: ifi.Index}); err != nil {
		return fail("bind", err)
	}
	mreq := &unix.PacketMreq{Ifindex: int32(ifi.Index), Type: unix.PACKET_MR_MULTICAST, Alen: uint16(len(MulticastMAC))}
	copy(mreq.Address[:], MulticastMAC)
	if err := unix.SetsockoptPacketMreq(fd, unix.SOL_PACKET, unix.PACKET_ADD_MEMBERSHIP, mreq); err != nil {
		return fail("join "+MulticastMAC.String(), err)
	}
	// Non-blocking, so the runtime poller serves reads and Close unblocks them.
	return &conn{f: os.NewFile(uintptr(fd), "ha-"+ifname), ifindex: ifi.Index, fd: fd}, nil
}

// send multicasts one advert, encoded (Advert.Marshal or Key.Seal).
func (c *conn) send(frame []byte) error {
	to := &unix.SockaddrLinklayer{Protocol: htons(EtherType), Ifindex: c.ifindex, Halen: uint8(len(MulticastMAC))}
	copy(to.Addr[:], MulticastMAC)
	raw, err := c.f.SyscallConn()
	if err != nil {
		return err
	}
	var sendErr error
	if err := raw.Write(func(fd uintptr) bool {
		sendErr = unix.Sendto(int(fd), frame, 0, to)
		return sendErr != unix.EAGAIN
	}); err != nil {
		return err
	}
	return sendErr
}

// recv reads the next advert, blocking until one comes or c is closed; a frame that does not
// parse is returned as an error.
func (c *conn) recv(buf []byte) (Frame, error) {
	n, err := c.f.Read(buf)
	if err != nil {
		return Frame{}, err
	}
	return ParseFrame(buf[:n])
}

// pending reads, without waiting, the adverts already queued in the socket (at most max), for a
// standby about to take over after a stall: see Machine.ClaimDue. It runs on the goroutine that
// closes c, so the descriptor cannot be closed under it.
func (c *conn) pending(buf []byte, max int) []Frame {
	var got []Frame
	for range max {
		n, _, err := unix.Recvfrom(c.fd, buf, unix.MSG_DONTWAIT)
		if err != nil {
			break // EAGAIN: nothing more queued
		}
		if f, err := ParseFrame(buf[:n]); err == nil {
			got = append(got, f)
		}
	}
	return got
}

func (c *conn) close() error { return c.f.Close() }

// linkProbe reads an interface's index and whether it is up with a carrier (IFF_UP and
// IFF_RUNNING) with two ioctls on a socket kept open: it runs at every wake (an active's ten a
// second), and a netlink dump of every link would cost more than all the election's other work.
type linkProbe struct{ fd int }

func newLinkProbe() (*linkProbe, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	return &linkProbe{fd: fd}, nil
}

func (p *linkProbe) state(ifname string) (index int, up bool) {
	ifr, err := unix.NewIfreq(ifname)
	if err != nil {
		return 0, false
	}
	if err := unix.IoctlIfreq(p.fd, unix.SIOCGIFINDEX, ifr); err != nil {
		return 0, false
	}
	index = int(ifr.Uint32())
	if err := unix.IoctlIfreq(p.fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return 0, false
	}
	flags := ifr.Uint16()
	return index, flags&unix.IFF_UP != 0 && flags&unix.IFF_RUNNING != 0
}

func (p *linkProbe) close() { unix.Close(p.fd) }
