package main

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"syscall"
	"testing"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// vishvanandaReplace is the request netlink.Handle.AddrReplace sent for the renewals before
// addrRenewer (its addrHandle, for an address without peer, label or scope), built with the
// package's own message types.
func vishvanandaReplace(seq uint32, index int, p netip.Prefix, secs int) []byte {
	req := nl.NewNetlinkRequest(unix.RTM_NEWADDR, unix.NLM_F_CREATE|unix.NLM_F_REPLACE|unix.NLM_F_ACK)
	req.Seq = seq
	ip := net.IP(p.Addr().AsSlice())
	family := nl.GetIPFamily(ip)
	msg := nl.NewIfAddrmsg(family)
	msg.Index = uint32(index)
	msg.Prefixlen = uint8(p.Bits())
	if p.Addr().Is6() {
		msg.Flags = unix.IFA_F_NODAD
	}
	req.AddData(msg)
	req.AddData(nl.NewRtAttr(unix.IFA_LOCAL, ip))
	req.AddData(nl.NewRtAttr(unix.IFA_ADDRESS, ip))
	if p.Addr().Is4() && p.Bits() < 31 {
		mask := net.CIDRMask(p.Bits(), 32)
		bcast := make(net.IP, 4)
		for i := range ip {
			bcast[i] = ip[i] | ^mask[i]
		}
		req.AddData(nl.NewRtAttr(unix.IFA_BROADCAST, bcast))
	}
	cache := nl.IfaCacheInfo{IfaCacheinfo: unix.IfaCacheinfo{Valid: uint32(secs), Prefered: uint32(secs)}}
	req.AddData(nl.NewRtAttr(unix.IFA_CACHEINFO, cache.Serialize()))
	return req.Serialize()
}

// The renewal's request is, byte for byte, the one netlink.Handle.AddrReplace sent: the kernel
// state it leaves (broadcast, flags, lifetimes) is the one the loop and the renewals left before.
func TestAddrReplaceRequest(t *testing.T) {
	for _, s := range []string{"172.18.0.18/16", "172.18.0.18/30", "172.18.0.18/31", "172.18.0.18/32", "10.1.2.3/8", "fd18::18/64", "fd18::18/128"} {
		p := netip.MustParsePrefix(s)
		got := addrReplaceRequest(nil, 7, 42, p, 3)
		if want := vishvanandaReplace(7, 42, p, 3); !bytes.Equal(got, want) {
			t.Errorf("%s:\n got % x\nwant % x", s, got, want)
		}
	}
}

// ackOf finds the ack of the request among the messages and reads the kernel's error from it.
func TestAckOf(t *testing.T) {
	msg := func(typ uint16, seq uint32, errno int32) []byte {
		b := binary.NativeEndian.AppendUint32(nil, 16+4+16)
		b = binary.NativeEndian.AppendUint16(b, typ)
		b = binary.NativeEndian.AppendUint16(b, 0)
		b = binary.NativeEndian.AppendUint32(b, seq)
		b = binary.NativeEndian.AppendUint32(b, 0)
		b = binary.NativeEndian.AppendUint32(b, uint32(-errno))
		return append(b, make([]byte, 16)...) // the request's header
	}
	for name, tc := range map[string]struct {
		b    []byte
		done bool
		err  error
	}{
		"success":           {msg(unix.NLMSG_ERROR, 5, 0), true, nil},
		"no such device":    {msg(unix.NLMSG_ERROR, 5, int32(unix.ENODEV)), true, syscall.ENODEV},
		"an earlier ack":    {msg(unix.NLMSG_ERROR, 4, int32(unix.ENODEV)), false, nil},
		"an earlier, ours":  {append(msg(unix.NLMSG_ERROR, 4, 0), msg(unix.NLMSG_ERROR, 5, int32(unix.EINVAL))...), true, syscall.EINVAL},
		"another message":   {msg(unix.RTM_NEWADDR, 5, 0), false, nil},
		"a truncated reply": {msg(unix.NLMSG_ERROR, 5, 0)[:10], false, nil}, // read on (at most 1 s)
	} {
		done, err := ackOf(tc.b, 5)
		if done != tc.done || !errors.Is(err, tc.err) || (err == nil) != (tc.err == nil) {
			t.Errorf("%s: ackOf = %t, %v; want %t, %v", name, done, err, tc.done, tc.err)
		}
	}
}
