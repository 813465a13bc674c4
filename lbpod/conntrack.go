package lbpod

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// maxForget bounds the entries one walk deletes (and keeps in memory until then): the walk is
// best effort, and the next change walks again.
const maxForget = 65536

// forgetFlows deletes the conntrack entries the flow policy calls stale. It reads the kernel's
// dump one message at a time and keeps only the stale entries' messages, to delete them once the
// dump is over: netlink's ConntrackDeleteFilters holds the whole table in memory first, and a
// table filled on purpose (spoofed UDP to a served port: each source one entry, up to
// nf_conntrack_max, 32768 per core) cost the lb pod some hundred bytes per entry, past its
// memory limit on a large node, at the first port or member change.
func forgetFlows(o ForgetFlowsOp) (uint, error) {
	family := uint8(unix.AF_INET)
	if o.Family == IPv6 {
		family = unix.AF_INET6
	}
	var stale [][]byte
	dump := conntrackRequest(nl.IPCTNL_MSG_CT_GET, unix.NLM_F_DUMP, family)
	err := dump.ExecuteIter(unix.NETLINK_NETFILTER, 0, func(msg []byte) bool {
		if fl, ok := parseConntrackFlow(msg); ok && o.Flows.Stale(fl) {
			stale = append(stale, slices.Clone(msg))
		}
		return len(stale) < maxForget
	})
	if err != nil && !errors.Is(err, nl.ErrDumpInterrupted) {
		return 0, err
	}
	if len(stale) == 0 {
		return 0, err
	}
	// An interrupted dump (the table changed meanwhile) still deletes what it found, over one
	// socket (a request of its own would open one per entry).
	sock, serr := nl.GetNetlinkSocketAt(netns.None(), netns.None(), unix.NETLINK_NETFILTER)
	if serr != nil {
		return 0, errors.Join(err, fmt.Errorf("conntrack: %w", serr))
	}
	defer sock.Close()
	if serr := errors.Join(sock.SetSendTimeout(&nl.SocketTimeoutTv), sock.SetReceiveTimeout(&nl.SocketTimeoutTv)); serr != nil {
		return 0, errors.Join(err, fmt.Errorf("conntrack: %w", serr))
	}
	sockets := map[int]*nl.SocketHandle{unix.NETLINK_NETFILTER: {Socket: sock}}
	var deleted uint
	var failed int
	for _, msg := range stale {
		del := conntrackRequest(nl.IPCTNL_MSG_CT_DELETE, unix.NLM_F_ACK, family)
		del.Sockets = sockets
		del.AddRawData(msg[nl.SizeofNfgenmsg:])
		if _, derr := del.Execute(unix.NETLINK_NETFILTER, 0); derr == nil || errors.Is(derr, fs.ErrNotExist) {
			deleted++
		} else {
			failed++
		}
	}
	if failed > 0 {
		err = errors.Join(err, fmt.Errorf("conntrack: %d of %d stale entries not deleted", failed, len(stale)))
	}
	return deleted, err
}

// conntrackRequest is a ctnetlink request of the conntrack table for family.
func conntrackRequest(op, flags int, family uint8) *nl.NetlinkRequest {
	req := nl.NewNetlinkRequest(int(netlink.ConntrackTable)<<8|op, flags)
	req.AddData(&nl.Nfgenmsg{NfgenFamily: family, Version: nl.NFNETLINK_V0})
	return req
}

// parseConntrackFlow reads what Flow needs of a ctnetlink message (an nfgenmsg header, then the
// entry's attributes): the original tuple's protocol, source and destination, and the reply
// tuple's source. ok is false for a message that lacks them or does not parse.
func parseConntrackFlow(msg []byte) (fl Flow, ok bool) {
	if len(msg) < nl.SizeofNfgenmsg {
		return Flow{}, false
	}
	var orig, reply tuple
	var haveOrig, haveReply bool
	if !netlinkAttrs(msg[nl.SizeofNfgenmsg:], func(typ uint16, v []byte) {
		switch typ {
		case nl.CTA_TUPLE_ORIG:
			orig, haveOrig = parseTuple(v)
		case nl.CTA_TUPLE_REPLY:
			reply, haveReply = parseTuple(v)
		}
	}) || !haveOrig || !haveReply {
		return Flow{}, false
	}
	proto := map[uint8]Protocol{unix.IPPROTO_UDP: UDP, unix.IPPROTO_SCTP: SCTP, unix.IPPROTO_TCP: TCP}[orig.proto]
	return Flow{
		Protocol: proto,
		Src:      orig.src,
		Dst:      netip.AddrPortFrom(orig.dst, orig.dport),
		ReplySrc: netip.AddrPortFrom(reply.src, reply.sport),
	}, true
}

// netlinkAttrs calls f with each attribute of b (its type without the nested and byte-order
// flags, its value) and says whether b parsed to the end. Its own, not nl.ParseRouteAttr: that
// one panics on a last attribute whose padding runs past the buffer (FuzzParseConntrackFlow).
func netlinkAttrs(b []byte, f func(typ uint16, v []byte)) bool {
	for len(b) > 0 {
		if len(b) < unix.SizeofRtAttr {
			return false
		}
		n := int(binary.NativeEndian.Uint16(b[0:2]))
		if n < unix.SizeofRtAttr || n > len(b) {
			return false
		}
		f(binary.NativeEndian.Uint16(b[2:4])&nl.NLA_TYPE_MASK, b[unix.SizeofRtAttr:n])
		b = b[min((n+unix.RTA_ALIGNTO-1)&^(unix.RTA_ALIGNTO-1), len(b)):]
	}
	return true
}

// tuple is what parseConntrackFlow reads of a conntrack tuple.
type tuple struct {
	src, dst     netip.Addr
	proto        uint8
	sport, dport uint16
}

// parseTuple reads a CTA_TUPLE_ORIG or CTA_TUPLE_REPLY: ok once it has both addresses and the
// protocol.
func parseTuple(b []byte) (t tuple, ok bool) {
	var haveProto bool
	parsed := netlinkAttrs(b, func(typ uint16, v []byte) {
		switch typ {
		case nl.CTA_TUPLE_IP:
			if !netlinkAttrs(v, func(typ uint16, v []byte) {
				addr, valid := netip.AddrFromSlice(v)
				switch {
				case !valid:
				case typ == nl.CTA_IP_V4_SRC || typ == nl.CTA_IP_V6_SRC:
					t.src = addr.Unmap()
				case typ == nl.CTA_IP_V4_DST || typ == nl.CTA_IP_V6_DST:
					t.dst = addr.Unmap()
				}
			}) {
				t.src = netip.Addr{}
			}
		case nl.CTA_TUPLE_PROTO:
			if !netlinkAttrs(v, func(typ uint16, v []byte) {
				switch {
				case typ == nl.CTA_PROTO_NUM && len(v) == 1:
					t.proto, haveProto = v[0], true
				case typ == nl.CTA_PROTO_SRC_PORT && len(v) == 2:
					t.sport = binary.BigEndian.Uint16(v)
				case typ == nl.CTA_PROTO_DST_PORT && len(v) == 2:
					t.dport = binary.BigEndian.Uint16(v)
				}
			}) {
				haveProto = false
			}
		}
	})
	return t, parsed && t.src.IsValid() && t.dst.IsValid() && haveProto
}
