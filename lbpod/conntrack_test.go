package lbpod

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// ctMessage is a ctnetlink message as the kernel dumps an entry (nfgenmsg, then nested tuples),
// for the walk's parser.
func ctMessage(proto uint8, src, dst netip.AddrPort, replySrc netip.AddrPort) []byte {
	tuple := func(typ int, s, d netip.AddrPort) *nl.RtAttr {
		t := nl.NewRtAttr(typ|int(nl.NLA_F_NESTED), nil)
		ip := t.AddRtAttr(nl.CTA_TUPLE_IP|int(nl.NLA_F_NESTED), nil)
		srcType, dstType := nl.CTA_IP_V4_SRC, nl.CTA_IP_V4_DST
		if s.Addr().Is6() {
			srcType, dstType = nl.CTA_IP_V6_SRC, nl.CTA_IP_V6_DST
		}
		ip.AddRtAttr(srcType, s.Addr().AsSlice())
		ip.AddRtAttr(dstType, d.Addr().AsSlice())
		p := t.AddRtAttr(nl.CTA_TUPLE_PROTO|int(nl.NLA_F_NESTED), nil)
		p.AddRtAttr(nl.CTA_PROTO_NUM, []byte{proto})
		p.AddRtAttr(nl.CTA_PROTO_SRC_PORT, binary.BigEndian.AppendUint16(nil, s.Port()))
		p.AddRtAttr(nl.CTA_PROTO_DST_PORT, binary.BigEndian.AppendUint16(nil, d.Port()))
		return t
	}
	family := uint8(unix.AF_INET)
	if src.Addr().Is6() {
		family = unix.AF_INET6
	}
	msg := (&nl.Nfgenmsg{NfgenFamily: family, Version: nl.NFNETLINK_V0}).Serialize()
	msg = append(msg, tuple(nl.CTA_TUPLE_ORIG, src, dst).Serialize()...)
	msg = append(msg, tuple(nl.CTA_TUPLE_REPLY, replySrc, src).Serialize()...)
	msg = append(msg, nl.NewRtAttr(nl.CTA_MARK, []byte{0, 0, 0, 1}).Serialize()...)
	return msg
}

// The walk reads each dumped entry as the flow policy needs it, both families, and skips what it
// cannot read instead of guessing.
func TestParseConntrackFlow(t *testing.T) {
	ap := netip.MustParseAddrPort
	for _, want := range []Flow{
		{Protocol: UDP, Src: netip.MustParseAddr("192.0.2.7"), Dst: ap("172.18.0.18:53"), ReplySrc: ap("10.96.0.10:53")},
		{Protocol: SCTP, Src: netip.MustParseAddr("2001:db8::7"), Dst: ap("[fd00:172:18::18]:3868"), ReplySrc: ap("[fd00:10:96::c1]:3868")},
		{Protocol: TCP, Src: netip.MustParseAddr("192.0.2.8"), Dst: ap("172.18.0.18:80"), ReplySrc: ap("10.96.0.10:8080")},
	} {
		proto := map[Protocol]uint8{UDP: unix.IPPROTO_UDP, SCTP: unix.IPPROTO_SCTP, TCP: unix.IPPROTO_TCP}[want.Protocol]
		got, ok := parseConntrackFlow(ctMessage(proto, netip.AddrPortFrom(want.Src, 40000), want.Dst, want.ReplySrc))
		if !ok || got != want {
			t.Errorf("parsed %+v, %t; want %+v", got, ok, want)
		}
	}
	full := ctMessage(unix.IPPROTO_UDP, ap("192.0.2.7:40000"), ap("172.18.0.18:53"), ap("10.96.0.10:53"))
	for name, msg := range map[string][]byte{
		"empty":                 nil,
		"header only":           full[:nl.SizeofNfgenmsg],
		"cut inside a tuple":    full[:nl.SizeofNfgenmsg+12],
		"no reply tuple":        append((&nl.Nfgenmsg{NfgenFamily: unix.AF_INET}).Serialize(), nl.NewRtAttr(nl.CTA_MARK, []byte{0, 0, 0, 1}).Serialize()...),
		"an attribute too long": append(full[:nl.SizeofNfgenmsg:nl.SizeofNfgenmsg], 0xff, 0x00, 0x01, 0x00),
	} {
		if fl, ok := parseConntrackFlow(msg); ok {
			t.Errorf("%s: parsed %+v", name, fl)
		}
	}
}

// Whatever the kernel (or a corrupted buffer) hands the walk, parsing never panics, and what it
// reads back is a flow whose addresses are valid.
func FuzzParseConntrackFlow(f *testing.F) {
	ap := netip.MustParseAddrPort
	f.Add(ctMessage(unix.IPPROTO_UDP, ap("192.0.2.7:40000"), ap("172.18.0.18:53"), ap("10.96.0.10:53")))
	f.Add(ctMessage(unix.IPPROTO_SCTP, ap("[2001:db8::7]:40000"), ap("[fd00:172:18::18]:3868"), ap("[fd00:10:96::c1]:3868")))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, msg []byte) {
		fl, ok := parseConntrackFlow(msg)
		if ok && (!fl.Src.IsValid() || !fl.Dst.Addr().IsValid() || !fl.ReplySrc.Addr().IsValid()) {
			t.Fatalf("parsed %+v with an invalid address", fl)
		}
	})
}
