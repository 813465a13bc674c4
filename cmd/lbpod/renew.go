package main

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// addrRenewer replaces the held addresses with a fresh kernel lifetime (the lease's renewal, four
// times a second on an active) over a NETLINK_ROUTE socket of its own, with raw syscalls: the
// request and its ack, which the kernel queues before the sendto returns, are read without
// entering the Go scheduler. Through netlink.Handle each renewal's sendto and recvfrom entered it,
// and that woke the runtime's sysmon thread from its sleep, which then polled every 20 µs until
// the process was idle again: about as many thread wakes a second as all the election's other
// work (BenchmarkHAIdleCPU). The request is the one netlink.Handle.AddrReplace sends.
type addrRenewer struct {
	fd  int
	seq uint32
	req []byte
	ack []byte
}

func newAddrRenewer() (*addrRenewer, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, err
	}
	// The ack is there when sendto returns; should it ever not be, the read waits, at most 1 s.
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 1}); err != nil {
		unix.Close(fd)
		return nil, err
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return &addrRenewer{fd: fd, req: make([]byte, 0, 128), ack: make([]byte, 4096)}, nil
}

// replace puts p on the interface with index, valid and preferred for secs seconds (created, or
// replaced if there), and returns the kernel's answer.
func (r *addrRenewer) replace(index int, p netip.Prefix, secs int) error {
	r.seq++
	r.req = addrReplaceRequest(r.req[:0], r.seq, index, p, secs)
	if _, _, e := unix.RawSyscall6(unix.SYS_SENDTO, uintptr(r.fd), uintptr(unsafe.Pointer(&r.req[0])), uintptr(len(r.req)), 0, 0, 0); e != 0 {
		return e
	}
	for {
		got, _, e := unix.RawSyscall6(unix.SYS_RECVFROM, uintptr(r.fd), uintptr(unsafe.Pointer(&r.ack[0])), uintptr(len(r.ack)), unix.MSG_DONTWAIT, 0, 0)
		n := int(got)
		if e == unix.EAGAIN {
			var err error
			if n, err = unix.Read(r.fd, r.ack); err != nil {
				return fmt.Errorf("no answer from the kernel: %w", err)
			}
		} else if e != 0 {
			return e
		}
		done, err := ackOf(r.ack[:n], r.seq)
		if done {
			return err
		}
	}
}

// addrReplaceRequest appends to b the RTM_NEWADDR request (NLM_F_CREATE|NLM_F_REPLACE, acked)
// that netlink.Handle.AddrReplace sends for p on index with lifetime secs and no peer: IFA_LOCAL
// and IFA_ADDRESS both p's address, IPv6 with IFA_F_NODAD (as the loop adds it: usable at once),
// IPv4 with the subnet's broadcast below /31, the lifetimes in IFA_CACHEINFO.
func addrReplaceRequest(b []byte, seq uint32, index int, p netip.Prefix, secs int) []byte {
	ne := binary.NativeEndian
	addr := p.Addr().Unmap()
	family, flags := byte(unix.AF_INET), byte(0)
	if addr.Is6() {
		family, flags = unix.AF_INET6, unix.IFA_F_NODAD
	}
	b = ne.AppendUint32(b, 0) // the length, set below
	b = ne.AppendUint16(b, unix.RTM_NEWADDR)
	b = ne.AppendUint16(b, unix.NLM_F_REQUEST|unix.NLM_F_ACK|unix.NLM_F_CREATE|unix.NLM_F_REPLACE)
	b = ne.AppendUint32(b, seq)
	b = ne.AppendUint32(b, 0) // to the kernel
	b = append(b, family, byte(p.Bits()), flags, 0)
	b = ne.AppendUint32(b, uint32(index))
	attr := func(typ uint16, v []byte) {
		b = ne.AppendUint16(b, uint16(unix.SizeofRtAttr+len(v)))
		b = ne.AppendUint16(b, typ)
		b = append(b, v...)
		for len(b)%unix.NLMSG_ALIGNTO != 0 {
			b = append(b, 0)
		}
	}
	ip := addr.AsSlice()
	attr(unix.IFA_LOCAL, ip)
	attr(unix.IFA_ADDRESS, ip)
	if addr.Is4() && p.Bits() < 31 {
		bcast := [4]byte(ip)
		host := ^uint32(0) >> p.Bits()
		binary.BigEndian.PutUint32(bcast[:], binary.BigEndian.Uint32(bcast[:])|host)
		attr(unix.IFA_BROADCAST, bcast[:])
	}
	var cache [unix.SizeofIfaCacheinfo]byte // preferred, valid, then two stamps the kernel fills
	ne.PutUint32(cache[0:], uint32(secs))
	ne.PutUint32(cache[4:], uint32(secs))
	attr(unix.IFA_CACHEINFO, cache[:])
	ne.PutUint32(b, uint32(len(b)))
	return b
}

// ackOf finds the ack of request seq in the messages of b: done says it is there, with the
// kernel's error (nil for success). Other messages (an ack of an earlier request whose read timed
// out) are skipped.
func ackOf(b []byte, seq uint32) (done bool, err error) {
	msgs, err := syscall.ParseNetlinkMessage(b)
	if err != nil {
		return true, fmt.Errorf("the kernel's answer: %w", err)
	}
	for _, m := range msgs {
		if m.Header.Type != unix.NLMSG_ERROR || m.Header.Seq != seq {
			continue
		}
		if len(m.Data) < 4 {
			return true, fmt.Errorf("the kernel's answer: %d bytes", len(m.Data))
		}
		if errno := -int32(binary.NativeEndian.Uint32(m.Data)); errno != 0 {
			return true, syscall.Errno(errno)
		}
		return true, nil
	}
	return false, nil
}
