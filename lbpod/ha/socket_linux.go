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

// conn is the pair of AF_PACKET sockets on net1 for the adverts. AF_PACKET needs only CAP_NET_RAW,
// and works on a standby's net1, which has no IP address to send from.
//
// While the replica is a standby, the adverts that only move its deadline (every advert of a live
// active) go to the queue socket, which nothing waits on: they wait there, each with the kernel's
// receive time, until the runner wakes anyway (at its deadline) and reads them (queued). A
// standby then wakes about once per dead interval instead of once per advert; on a node with
// hundreds of lb pods each wake is paid in CPU (BenchmarkHAIdleCPU). The resignations, which a
// standby must act on at once, go to the other socket, which the runtime poller serves (recv),
// and which sends. A holder reads every advert at once there (a newer active must make it step
// down before the record does): setQueueing moves the adverts between the two. The queue holds
// what a flood leaves room for (queueBuffer); a read of it says whether it missed frames
// (queued), and a standby that did reads at once for a while (Machine.Queueing).
type conn struct {
	f       *os.File
	raw     syscall.RawConn
	ifindex int
	// fd is f's descriptor, for send and pending: reads through f hold f's read lock while they
	// wait, so a second reader must go to the descriptor itself. It is valid until close, which
	// the runner's goroutine calls, the one that sends and calls pending.
	fd int
	// queue is the queue socket's descriptor (SO_TIMESTAMPNS on), outside the poller: reading it
	// never blocks, and a frame arriving wakes nobody. Closed by close.
	queue int
	// queueing says whether the queue socket takes the adverts other than resignations (a
	// standby's sockets); the filters are built from group, maxVersion and groupAddressed.
	// leftover says that it no longer takes any but may still hold some it took as a standby:
	// queued reads it only while one of the two holds (a holder would pay a syscall a tick).
	queueing, leftover bool
	group              Group
	maxVersion         uint8
	groupAddressed     bool
	// to is where adverts go (the group's address, or MulticastMAC for a replica that does not
	// use group addresses), legacy where the copies for replicas listening only on MulticastMAC
	// go; as sendto takes them.
	to, legacy unix.RawSockaddrLinklayer
	// dropped is the queue socket's count of frames the kernel dropped (SK_MEMINFO_DROPS) at its
	// last read: queued compares it to tell a read that missed frames.
	dropped uint32
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// advertFilter is a classic BPF program that lets through only adverts of our group, so the
// kernel drops every other Service's adverts before they wake us, and of wire version 1 or
// maxVersion: a replica without a key reads version 1 only, as the replicas before version 2 did;
// one with a key reads both (version 1 for the legacy window and to count what it refuses). With
// groupAddressed it also drops the copies that replicas send to MulticastMAC for the replicas
// listening only there (flagLegacyCopy): it hears the same advert on the group's address.
// pass picks the adverts by their resigning flag: a standby's socket that the runner waits on
// takes the resignations only, its queue socket the others (see conn), so each advert is read
// once; a holder's socket takes them all (and its queue socket none: dropAll).
// Offsets are from the start of the payload (SOCK_DGRAM strips the Ethernet header).
func advertFilter(g Group, maxVersion uint8, groupAddressed bool, pass passAdverts) []unix.SockFilter {
	const (
		ldW  = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
		ldB  = unix.BPF_LD | unix.BPF_B | unix.BPF_ABS
		jeq  = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
		jset = unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K
		ret  = unix.BPF_RET | unix.BPF_K
	)
	// Jumps are filled in below: a step with drop set jumps to the last instruction when its
	// test comes out as dropIf.
	type step struct {
		ins          unix.SockFilter
		drop, dropIf bool
	}
	test := func(code uint16, k uint32, dropIf bool) step {
		return step{unix.SockFilter{Code: code, K: k}, true, dropIf}
	}
	load := func(code uint16, off uint32) step { return step{ins: unix.SockFilter{Code: code, K: off}} }
	steps := []step{
		load(ldW, 0), test(jeq, binary.BigEndian.Uint32(advertMagic[:]), false),
		load(ldW, 8), test(jeq, binary.BigEndian.Uint32(g[0:4]), false),
		load(ldW, 12), test(jeq, binary.BigEndian.Uint32(g[4:8]), false),
		load(ldB, 5),
	}
	if groupAddressed {
		steps = append(steps, test(jset, flagLegacyCopy, true))
	}
	if pass != passAll {
		steps = append(steps, test(jset, flagResigning, pass == passOthers))
	}
	steps = append(steps, load(ldB, 4), step{ins: unix.SockFilter{Code: jeq, K: advertVersion, Jt: 1}},
		test(jeq, uint32(maxVersion), false),
		step{ins: unix.SockFilter{Code: ret, K: 1 << 16}},
		step{ins: unix.SockFilter{Code: ret, K: 0}})
	prog := make([]unix.SockFilter, len(steps))
	last := len(steps) - 1
	for i, s := range steps {
		prog[i] = s.ins
		if !s.drop {
			continue
		}
		if off := uint8(last - i - 1); s.dropIf {
			prog[i].Jt = off
		} else {
			prog[i].Jf = off
		}
	}
	return prog
}

// passAdverts is which adverts of the group a socket takes (advertFilter).
type passAdverts int

const (
	passAll passAdverts = iota
	passResigning
	passOthers
)

// dropAll is a filter that takes nothing: the queue socket of a holder.
var dropAll = []unix.SockFilter{{Code: unix.BPF_RET | unix.BPF_K, K: 0}}

// filters are the filters of the socket the runner waits on and of the queue socket, for a
// standby (queueing) or not.
func (c *conn) filters(queueing bool) (wait, queue []unix.SockFilter) {
	if queueing {
		return advertFilter(c.group, c.maxVersion, c.groupAddressed, passResigning), advertFilter(c.group, c.maxVersion, c.groupAddressed, passOthers)
	}
	return advertFilter(c.group, c.maxVersion, c.groupAddressed, passAll), dropAll
}

// setQueueing moves the adverts other than resignations to the queue socket (on: a standby) or
// back to the socket the runner waits on. Each filter is replaced at once (SO_ATTACH_FILTER on a
// socket that has one), the socket that gains adverts first: an advert that arrives in between
// reaches both sockets (an authenticated second copy is refused as a replay; an unauthenticated
// one moves the deadline again, to the same time), never neither.
func (c *conn) setQueueing(on bool) error {
	if on == c.queueing {
		return nil
	}
	wait, queue := c.filters(on)
	gains, loses := c.queue, c.fd
	gainsF, losesF := queue, wait
	if !on {
		gains, loses, gainsF, losesF = c.fd, c.queue, wait, queue
	}
	if err := attachFilter(gains, gainsF); err != nil {
		return fmt.Errorf("advert socket filter: %w", err)
	}
	if err := attachFilter(loses, losesF); err != nil {
		return fmt.Errorf("advert socket filter: %w", err)
	}
	c.queueing = on
	c.leftover = !on
	return nil
}

// listen opens the two sockets on ifname (conn), filtered to group g (advertFilter) as a holder's
// (setQueueing turns the queue socket on for a standby). Each joins MulticastMAC and, with
// groupAddressed, the group's address (Group.MAC), where its adverts then go; without, it sends
// to MulticastMAC and listens only there, as replicas before group addresses did.
func listen(ifname string, g Group, maxVersion uint8, groupAddressed bool) (*conn, error) {
	ifi, err := net.InterfaceByName(ifname)
	if err != nil {
		return nil, err
	}
	to := MulticastMAC
	join := []net.HardwareAddr{MulticastMAC}
	if groupAddressed {
		to = g.MAC()
		join = append(join, to)
	}
	c := &conn{group: g, maxVersion: maxVersion, groupAddressed: groupAddressed}
	wait, drop := c.filters(false)
	fd, err := packetSocket(ifi, wait, join, false)
	if err != nil {
		return nil, err
	}
	queue, err := packetSocket(ifi, drop, join, true)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	// Non-blocking, so the runtime poller serves reads and Close unblocks them.
	f := os.NewFile(uintptr(fd), "ha-"+ifname)
	raw, err := f.SyscallConn()
	if err != nil {
		f.Close()
		unix.Close(queue)
		return nil, fmt.Errorf("advert socket on %q: %w", ifname, err)
	}
	c.f, c.raw, c.ifindex, c.fd, c.queue = f, raw, ifi.Index, fd, queue
	c.to, c.legacy = linkAddr(ifi.Index, to), linkAddr(ifi.Index, MulticastMAC)
	return c, nil
}

// packetSocket opens a non-blocking AF_PACKET socket for our EtherType on ifi with filter, joined
// to the multicast addresses join; stamped turns the kernel's receive times on (SO_TIMESTAMPNS).
func packetSocket(ifi *net.Interface, filter []unix.SockFilter, join []net.HardwareAddr, stamped bool) (int, error) {
	// Protocol 0: nothing is queued until bind, which comes after the filter.
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("AF_PACKET socket (needs NET_RAW): %w", err)
	}
	fail := func(what string, err error) (int, error) {
		unix.Close(fd)
		return -1, fmt.Errorf("%s on %q: %w", what, ifi.Name, err)
	}
	if err := attachFilter(fd, filter); err != nil {
		return fail("attach filter", err)
	}
	setReceiveBuffer(fd)
	if stamped {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1); err != nil {
			return fail("receive timestamps", err)
		}
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(EtherType), Ifindex: ifi.Index}); err != nil {
		return fail("bind", err)
	}
	for _, mac := range join {
		mreq := &unix.PacketMreq{Ifindex: int32(ifi.Index), Type: unix.PACKET_MR_MULTICAST, Alen: uint16(len(mac))}
		copy(mreq.Address[:], mac)
		if err := unix.SetsockoptPacketMreq(fd, unix.SOL_PACKET, unix.PACKET_ADD_MEMBERSHIP, mreq); err != nil {
			return fail("join "+mac.String(), err)
		}
	}
	return fd, nil
}

// queueBuffer is the receive buffer asked for on each advert socket (setReceiveBuffer). The
// socket filter passes any frame with our magic, group and version, and anyone can make one (the
// group is a digest of the public LB addresses); a standby reads its queue socket only at its
// deadline, so frames that fill the queue meanwhile made the kernel drop the next ones, a live
// active's adverts among them. The kernel doubles the size asked for and counts each frame at
// its true size, 832 bytes for a small frame from a veth: the default buffer (212992 bytes) held
// 256 of them, under a tenth of a second of a flood of 3000 frames/s (1.5 Mbit/s). 2 MiB asked
// for is 4 MiB, 5041 small frames: a dead interval and skew (0.325 s with the defaults) of a flood
// of 15000 frames/s, 10 Mbit/s of minimal Ethernet frames. Beyond that, or with a dead interval
// stretched by a starved node, frames are dropped; the standby sees it (queued) and defers its
// claim (Lost). The memory is taken only while frames wait: on the queue socket of the standbys
// whose group a flood names, up to 4 MiB each, and on the socket read at once only while its
// reader lags.
const queueBuffer = 2 << 20

// setReceiveBuffer sets fd's receive buffer to queueBuffer: SO_RCVBUFFORCE (CAP_NET_ADMIN, which
// the lb pod has) passes net.core.rmem_max; without it SO_RCVBUF, up to that limit. Neither is
// fatal: the socket keeps the default buffer, and a queue that overflows is seen (queued).
func setReceiveBuffer(fd int) {
	if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, queueBuffer) != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, queueBuffer)
	}
}

// attachFilter sets the socket filter of fd, replacing the one it has.
func attachFilter(fd int, filter []unix.SockFilter) error {
	return unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]})
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

// pending reads, without waiting, the adverts already queued in the socket the runner waits on (at
// most max), for a runner about to decide: after a stall the timer and the socket are ready at
// once. It runs on the goroutine that closes c, so the descriptor cannot be closed under it.
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

// stampedFrame is an advert read from the queue socket and when the kernel received it (wall
// clock; zero when the kernel gave no time).
type stampedFrame struct {
	f  Frame
	at time.Time
}

// maxQueued caps one read of the queue socket (queued): 8192 frames, over what the buffer
// (queueBuffer) holds of the smallest ones (5041), so a read that reaches it met frames coming as
// fast as it read them. It stops there (tens of milliseconds of CPU), and the standby knows it
// missed some (Lost).
const maxQueued = 2 * queueBuffer / 512

// queued reads, without waiting, the adverts waiting in the queue socket, oldest first, each with
// the kernel's receive time (SCM_TIMESTAMPNS), until none is left or max were read. oob holds the
// control message. complete is false when the read missed frames: it stopped at max, or the
// kernel dropped frames since the last read (its buffer was full). The drops are read from the
// socket's own counter (SO_MEMINFO) once the queue is empty, not from SO_RXQ_OVFL: that one comes
// with the frames queued after a drop, and the frames dropped while the queue was full are
// followed by no frame until it is read. Like pending, it runs on the goroutine that closes c.
func (c *conn) queued(buf, oob []byte, max int) (got []stampedFrame, complete bool) {
	if !c.queueing && !c.leftover {
		return nil, true
	}
	complete = false // unless the queue is found empty below
	for range max {
		iov := unix.Iovec{Base: &buf[0]}
		iov.SetLen(len(buf))
		msg := unix.Msghdr{Iov: &iov, Iovlen: 1, Control: &oob[0]}
		msg.SetControllen(len(oob))
		n, _, e := unix.RawSyscall(unix.SYS_RECVMSG, uintptr(c.queue), uintptr(unsafe.Pointer(&msg)), unix.MSG_DONTWAIT)
		if e != 0 {
			c.leftover = c.leftover && e != unix.EAGAIN // EAGAIN: nothing more queued
			complete = true
			break
		}
		f, err := ParseFrame(buf[:n])
		if err != nil {
			continue
		}
		got = append(got, stampedFrame{f, receivedAt(oob[:msg.Controllen])})
	}
	if dropped, ok := socketDrops(c.queue); ok && dropped != c.dropped {
		c.dropped, complete = dropped, false
	}
	return got, complete
}

// socketDrops reads the count of frames the kernel dropped for socket fd (SK_MEMINFO_DROPS; it
// wraps at 2^32, so only a change says something).
func socketDrops(fd int) (uint32, bool) {
	var mem [unix.SK_MEMINFO_VARS]uint32
	size := uint32(unsafe.Sizeof(mem))
	if _, _, e := unix.RawSyscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, unix.SO_MEMINFO,
		uintptr(unsafe.Pointer(&mem[0])), uintptr(unsafe.Pointer(&size)), 0); e != 0 || size <= unix.SK_MEMINFO_DROPS*4 {
		return 0, false
	}
	return mem[unix.SK_MEMINFO_DROPS], true
}

// receivedAt is the time in an SCM_TIMESTAMPNS control message, zero without one.
func receivedAt(oob []byte) time.Time {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return time.Time{}
	}
	for _, m := range msgs {
		if m.Header.Level == unix.SOL_SOCKET && m.Header.Type == unix.SCM_TIMESTAMPNS && len(m.Data) >= int(unsafe.Sizeof(unix.Timespec{})) {
			ts := (*unix.Timespec)(unsafe.Pointer(&m.Data[0]))
			return time.Unix(ts.Unix())
		}
	}
	return time.Time{}
}

func (c *conn) close() error {
	unix.Close(c.queue)
	return c.f.Close()
}

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
