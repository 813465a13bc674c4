package lbpod

import (
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// forgetFlows deletes the conntrack entries the flow policy calls stale.
func forgetFlows(o ForgetFlowsOp) (uint, error) {
	family := netlink.InetFamily(unix.AF_INET)
	if o.Family == IPv6 {
		family = netlink.InetFamily(unix.AF_INET6)
	}
	return netlink.ConntrackDeleteFilters(netlink.ConntrackTable, family, staleFilter{o.Flows})
}

// staleFilter matches the conntrack entries FlowPolicy.Stale calls stale.
type staleFilter struct{ policy FlowPolicy }

func (f staleFilter) MatchConntrackFlow(c *netlink.ConntrackFlow) bool {
	proto := map[uint8]Protocol{unix.IPPROTO_UDP: UDP, unix.IPPROTO_SCTP: SCTP, unix.IPPROTO_TCP: TCP}[c.Forward.Protocol]
	src, _ := netip.AddrFromSlice(c.Forward.SrcIP)
	dst, _ := netip.AddrFromSlice(c.Forward.DstIP)
	replySrc, _ := netip.AddrFromSlice(c.Reverse.SrcIP)
	return f.policy.Stale(Flow{
		Protocol: proto,
		Src:      src.Unmap(),
		Dst:      netip.AddrPortFrom(dst.Unmap(), c.Forward.DstPort),
		ReplySrc: netip.AddrPortFrom(replySrc.Unmap(), c.Reverse.SrcPort),
	})
}
