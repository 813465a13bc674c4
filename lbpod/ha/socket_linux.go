package ha

import (
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The election's syscalls at every wake (the adverts sent and received, the link probe) are made
// with unix.RawSyscall, which does not tell the Go scheduler: none of them blocks (the socket is
// non-blocking, waits go through the runtime poller), and entering a syscall the ordinary way
// (syscall.Syscall) wakes the runtime's sysmon thread whenever it sleeps, which it does between
// two of our wakes. Woken, sysmon polls every 20 µs until the process is idle again, and takes
// the only P (GOMAXPROCS 1) from a thread whose syscall outlasts one poll (a sendto through the
// underlay's bridge takes ~40 µs), which then needs another thread woken to run: with ten wakes a
// second, those wakes were most of an idle replica's CPU (BenchmarkHAIdleCPU).

// conn is an AF_PACKET socket on net1 for the adverts. AF_PACKET needs only CAP_NET_RAW, and works
// on a standby's net1, which has no IP address to send from.
type conn struct {
	f       *os.File
	raw     syscall.RawConn
	ifindex int
	// fd is f's descriptor, for send and pending: reads through f hold f's read lock while they
	// wait, so a second reader must go to the descriptor itself. It is valid until close, which
	// the runner's goroutine calls, the one that sends and calls pending.
	fd int
	// to is where adverts go (the group's address, or MulticastMAC for a replica that does not
	// use group addresses), legacy where the copies for replicas listening only on MulticastMAC
	// go; as sendto takes them.
	to, legacy unix.RawSockaddrLinklayer
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// advertFilter is a classic BPF program that lets through only adverts of our group, so the
// kernel drops every other Service's adverts before they wake us, and of wire version 1 or
// maxVersion: a replica without a key reads version 1 only, as the replicas before version 2 did;
// one with a key reads both (version 1 for the legacy window and to count what it refuses). With
// groupAddressed it also drops the copies that replicas send to MulticastMAC for the replicas
// listening only there (flagLegacyCopy): it hears the same advert on the group's address.
// Offsets are from the start of the payload (SOCK_DGRAM strips the Ethernet header).
func advertFilter(g Group, maxVersion uint8, groupAddressed bool) []unix.SockFilter {
	const (
		ldW  = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
		ldB  = unix.BPF_LD | unix.BPF_B | unix.BPF_ABS
		jeq  = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
		jset = unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K
		ret  = unix.BPF_RET | unix.BPF_K
	)
	// Jumps are filled in below: toDrop jumps to the last instruction when the test fails
	// (jeq) or holds (jset).
	type step struct {
		ins    unix.SockFilter
		toDrop bool
	}
	steps := []step{
		{unix.SockFilter{Code: ldW, K: 0}, false}, {unix.SockFilter{Code: jeq, K: binary.BigEndian.Uint32(advertMagic[:])}, true},
		{unix.SockFilter{Code: ldW, K: 8}, false}, {unix.SockFilter{Code: jeq, K: binary.BigEndian.Uint32(g[0:4])}, true},
		{unix.SockFilter{Code: ldW, K: 12}, false}, {unix.SockFilter{Code: jeq, K: binary.BigEndian.Uint32(g[4:8])}, true},
	}
	if groupAddressed {
		steps = append(steps, step{unix.SockFilter{Code: ldB, K: 5}, false}, step{unix.SockFilter{Code: jset, K: flagLegacyCopy}, true})
	}
	steps = append(steps,
		step{unix.SockFilter{Code: ldB, K: 4}, false}, step{unix.SockFilter{Code: jeq, K: advertVersion, Jt: 1}, false},
		step{unix.SockFilter{Code: jeq, K: uint32(maxVersion)}, true},
		step{unix.SockFilter{Code: ret, K: 1 << 16}, false},
		step{unix.SockFilter{Code: ret, K: 0}, false})
	prog := make([]unix.SockFilter, len(steps))
	drop := len(steps) - 1
	for i, s := range steps {
		prog[i] = s.ins
		if s.toDrop {
			off := uint8(drop - i - 1)
			if s.ins.Code == jset {
				prog[i].Jt = off
			} else {
				prog[i].Jf = off
			}
		}
	}
	return prog
}

// listen opens the socket on ifname, filtered to group g (advertFilter). It joins MulticastMAC
// and, with groupAddressed, the group's address (Group.MAC), where its adverts then go; without,
// it sends to MulticastMAC and listens only there, as replicas before group addresses did.
func listen(ifname string, g Group, maxVersion uint8, groupAddressed bool) (*conn, error) {
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
	filter := advertFilter(g, maxVersion, groupAddressed)
	if err := unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}); err != nil {
		return fail("attach filter", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(EtherType), Ifindex: ifi.Index}); err != nil {
		return fail("bind", err)
	}
	to := MulticastMAC
	join := []net.HardwareAddr{MulticastMAC}
	if groupAddressed {
		to = g.MAC()
		join = append(join, to)
	}
	for _, mac := range join {
		mreq := &unix.PacketMreq{Ifindex: int32(ifi.Index), Type: unix.PACKET_MR_MULTICAST, Alen: uint16(len(mac))}
		copy(mreq.Address[:], mac)
		if err := unix.SetsockoptPacketMreq(fd, unix.SOL_PACKET, unix.PACKET_ADD_MEMBERSHIP, mreq); err != nil {
			return fail("join "+mac.String(), err)
		}
	}
	// Non-blocking, so the runtime poller serves reads and Close unblocks them.
	f := os.NewFile(uintptr(fd), "ha-"+ifname)
	raw, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("advert socket on %q: %w", ifname, err)
	}
	return &conn{f: f, raw: raw, ifindex: ifi.Index, fd: fd, to: linkAddr(ifi.Index, to), legacy: linkAddr(ifi.Index, MulticastMAC)}, nil
}

// linkAddr is mac on the interface with index, for sendto.
func linkAddr(index int, mac net.HardwareAddr) unix.RawSockaddrLinklayer {
	sa := unix.RawSockaddrLinklayer{Family: unix.AF_PACKET, Protocol: htons(EtherType), Ifindex: int32(index), Halen: uint8(len(mac))}
	copy(sa.Addr[:], mac)
	return sa
}

// send multicasts one advert, encoded (Advert.Marshal or Key.Seal), to c.to, or with legacy to
// MulticastMAC. A full send buffer (EAGAIN) waits for room through the runtime poller.
func (c *conn) send(frame []byte, legacy bool) error {
	if len(frame) == 0 {
		return nil
	}
	to := &c.to
	if legacy {
		to = &c.legacy
	}
	err := c.sendto(frame, to)
	if err != unix.EAGAIN {
		return err
	}
	if werr := c.raw.Write(func(uintptr) bool {
		err = c.sendto(frame, to)
		return err != unix.EAGAIN
	}); werr != nil {
		return werr
	}
	return err
}

func (c *conn) sendto(frame []byte, to *unix.RawSockaddrLinklayer) error {
	_, _, e := unix.RawSyscall6(unix.SYS_SENDTO, uintptr(c.fd), uintptr(unsafe.Pointer(&frame[0])), uintptr(len(frame)),
		0, uintptr(unsafe.Pointer(to)), unsafe.Sizeof(*to))
	if e != 0 {
		return e
	}
	return nil
}

// recvfrom reads one queued frame without waiting (EAGAIN when there is none).
func recvfrom(fd uintptr, buf []byte) (int, error) {
	n, _, e := unix.RawSyscall6(unix.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)),
		unix.MSG_DONTWAIT, 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

// recv reads the next advert, blocking until one comes or c is closed; a frame that does not
// parse is returned as an error.
func (c *conn) recv(buf []byte) (Frame, error) {
	var n int
	var err error
	if rerr := c.raw.Read(func(fd uintptr) bool {
		n, err = recvfrom(fd, buf)
		return err != unix.EAGAIN
	}); rerr != nil {
		return Frame{}, rerr
	}
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
		n, err := recvfrom(uintptr(c.fd), buf)
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
// The ioctls are raw syscalls (see above); they do not block.
type linkProbe struct{ fd int }

// ifreq is struct ifreq: the name, then a union of which the ioctls here read an int (the index)
// or a short (the flags).
type ifreq struct {
	name [unix.IFNAMSIZ]byte
	data [24]byte
}

func (p *linkProbe) ioctl(req uint, ifr *ifreq) error {
	if _, _, e := unix.RawSyscall(unix.SYS_IOCTL, uintptr(p.fd), uintptr(req), uintptr(unsafe.Pointer(ifr))); e != 0 {
		return e
	}
	return nil
}

func newLinkProbe() (*linkProbe, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	return &linkProbe{fd: fd}, nil
}

func (p *linkProbe) state(ifname string) (index int, up bool) {
	var ifr ifreq
	if len(ifname) >= len(ifr.name) {
		return 0, false
	}
	copy(ifr.name[:], ifname)
	if err := p.ioctl(unix.SIOCGIFINDEX, &ifr); err != nil {
		return 0, false
	}
	index = int(binary.NativeEndian.Uint32(ifr.data[:]))
	if err := p.ioctl(unix.SIOCGIFFLAGS, &ifr); err != nil {
		return 0, false
	}
	flags := binary.NativeEndian.Uint16(ifr.data[:])
	return index, flags&unix.IFF_UP != 0 && flags&unix.IFF_RUNNING != 0
}

func (p *linkProbe) close() { unix.Close(p.fd) }

// waker is the runner's timer: a timerfd that the runtime poller serves, rather than a time.Timer.
// sysmon sleeps until the next Go timer: with the runner's timer, it woke with each of an
// active's ten wakes a second, and again up to 10 ms later, before it saw the process idle and
// slept on. A timerfd wakes only the thread waiting in the poller (BenchmarkHAIdleCPU). Where no
// timerfd can be made, it is a time.Timer.
type waker struct {
	// C receives when the timer fires; a receive may be stale (a fire just before reset), so the
	// runner checks the time.
	C     chan struct{}
	f     *os.File
	fd    int
	timer *time.Timer // the fallback
}

func newWaker() *waker {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return newTimerWaker()
	}
	w := &waker{C: make(chan struct{}, 1), f: os.NewFile(uintptr(fd), "ha-timer"), fd: fd}
	raw, err := w.f.SyscallConn()
	if err != nil {
		w.f.Close()
		return newTimerWaker()
	}
	go func() {
		var n [8]byte // the expirations since the last read
		for {
			if err := raw.Read(func(fd uintptr) bool {
				_, _, e := unix.RawSyscall(unix.SYS_READ, fd, uintptr(unsafe.Pointer(&n[0])), uintptr(len(n)))
				return e != unix.EAGAIN
			}); err != nil {
				return // closed
			}
			w.fire()
		}
	}()
	return w
}

// newTimerWaker is the fallback waker, on a time.Timer.
func newTimerWaker() *waker {
	w := &waker{C: make(chan struct{}, 1)}
	w.timer = time.AfterFunc(time.Hour, w.fire)
	w.timer.Stop()
	return w
}

func (w *waker) fire() {
	select {
	case w.C <- struct{}{}:
	default:
	}
}

// reset (re)arms the timer to fire once after d, at once when d is not positive; a fire already
// waiting in C is dropped first (a fire of the timer as it was armed before may still follow).
func (w *waker) reset(d time.Duration) {
	select {
	case <-w.C:
	default:
	}
	d = max(d, time.Nanosecond) // 0 would disarm a timerfd
	if w.timer != nil {
		w.timer.Reset(d)
	} else {
		spec := unix.ItimerSpec{Value: unix.NsecToTimespec(int64(d))}
		if _, _, e := unix.RawSyscall6(unix.SYS_TIMERFD_SETTIME, uintptr(w.fd), 0, uintptr(unsafe.Pointer(&spec)), 0, 0, 0); e != 0 {
			w.fire() // cannot happen with a valid spec; wake at once rather than never
		}
	}
}

func (w *waker) close() {
	if w.timer != nil {
		w.timer.Stop()
		return
	}
	w.f.Close()
}
