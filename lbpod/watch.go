package lbpod

import (
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"syscall"
	"unsafe"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// watchKernel signals the link and address changes that matter (net1 or eth0 recreated, up or
// down, a new MAC; a global address added or removed) on links, and the route and rule changes
// that matter (a route of the lb pod's table, any policy rule) on routes, so that they are
// repaired at once rather than at the next resync. Link-local addresses come and go with IPv6 DAD
// and are not ours; routes of other tables are the kernel's own (the addresses' prefix and local
// routes). Rules change only when someone changes them: every rule event is looked at.
//
// The events come from one non-blocking netlink socket read through the runtime poller, not from
// netlink.LinkSubscribe and AddrSubscribe: those read a blocking socket each, so every event (an
// active's four lifetime renewals a second among them) woke a thread parked in a syscall, which
// then had to win the only P back, and whose next read let sysmon take the P away again and wake
// yet another thread to poll: four thread wakes or more per event. Through the poller, an event
// that comes while the process runs is read on the same thread before it sleeps.
func watchKernel(ctx context.Context, log *slog.Logger, table int, held []netip.Prefix, ifaces ...string) (links, routes <-chan struct{}) {
	linksCh, routesCh := make(chan struct{}, 1), make(chan struct{}, 1)
	links, routes = linksCh, routesCh
	events, err := subscribeRoute(unix.RTMGRP_LINK | unix.RTMGRP_IPV4_IFADDR | unix.RTMGRP_IPV6_IFADDR |
		unix.RTMGRP_IPV4_ROUTE | unix.RTMGRP_IPV6_ROUTE | unix.RTMGRP_IPV4_RULE | 1<<(unix.RTNLGRP_IPV6_RULE-1))
	if err != nil {
		log.Warn("no netlink link, address, route or rule events; relying on the periodic resync", "err", err)
		return links, routes
	}
	go func() {
		<-ctx.Done()
		events.Close()
	}()
	raw, err := events.SyscallConn()
	if err != nil {
		events.Close()
		log.Warn("no netlink link, address, route or rule events; relying on the periodic resync", "err", err)
		return links, routes
	}
	go func() {
		buf := make([]byte, 64<<10)
		for {
			n, err := readEvents(raw, buf)
			if errors.Is(err, unix.ENOBUFS) {
				notify(linksCh) // events were lost: look
				notify(routesCh)
				continue
			}
			if err != nil {
				if ctx.Err() == nil { // closing the socket on shutdown is not worth a warning
					log.Warn("netlink events ended; relying on the periodic resync", "err", err)
				}
				return
			}
			msgs, err := syscall.ParseNetlinkMessage(buf[:n])
			if err != nil {
				notify(linksCh) // cannot tell what changed: look
				notify(routesCh)
				continue
			}
			for _, m := range msgs {
				if routeEventMatters(m, table) {
					notify(routesCh)
				} else if ev, ok := parseKernelEvent(m); ok && ev.matters(held, ifaces) {
					notify(linksCh)
				}
			}
		}
	}()
	return links, routes
}

// routeEventMatters says whether m is a route event of table (the lb pod's routes) or a rule
// event. Both headers (struct rtmsg, struct fib_rule_hdr) hold the table in their fifth byte,
// and an attribute (RTA_TABLE, FRA_TABLE: the same type) holds it when it is above 255.
func routeEventMatters(m syscall.NetlinkMessage, table int) bool {
	switch m.Header.Type {
	case unix.RTM_NEWRULE, unix.RTM_DELRULE:
		return true
	case unix.RTM_NEWROUTE, unix.RTM_DELROUTE:
	default:
		return false
	}
	if len(m.Data) < unix.SizeofRtMsg {
		return true // cannot tell: look
	}
	t := int(m.Data[4])
	if attrs, err := syscall.ParseNetlinkRouteAttr(&m); err == nil {
		for _, a := range attrs {
			if a.Attr.Type == unix.RTA_TABLE && len(a.Value) == 4 {
				t = int(binary.NativeEndian.Uint32(a.Value))
			}
		}
	}
	return t == table
}

// subscribeRoute opens a non-blocking NETLINK_ROUTE socket joined to groups, as a file the runtime
// poller serves (Close unblocks a read).
func subscribeRoute(groups uint32) (*os.File, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, err
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: groups}); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return os.NewFile(uintptr(fd), "netlink-route-events"), nil
}

// readEvents waits for the next datagram of events and reads it into buf. The read is a raw
// syscall (it does not block): entering the scheduler for it would wake sysmon, as ha's socket
// explains, at each of the active's renewals.
func readEvents(raw syscall.RawConn, buf []byte) (int, error) {
	var n uintptr
	var errno syscall.Errno
	if err := raw.Read(func(fd uintptr) bool {
		n, _, errno = unix.RawSyscall6(unix.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), unix.MSG_DONTWAIT, 0, 0)
		return errno != unix.EAGAIN
	}); err != nil {
		return 0, err
	}
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}

// kernelEvent is what watchKernel reads of one netlink event: a link's name, or an address added
// or removed.
type kernelEvent struct {
	link    string // RTM_NEWLINK, RTM_DELLINK
	isAddr  bool   // RTM_NEWADDR, RTM_DELADDR
	addr    netip.Addr
	newAddr bool
}

// parseKernelEvent decodes a link or address event; ok is false for any other message. An
// address is IFA_LOCAL when there is one (IPv4, and IPv6 with a peer), else IFA_ADDRESS, as
// netlink.AddrSubscribe reads it.
func parseKernelEvent(m syscall.NetlinkMessage) (ev kernelEvent, ok bool) {
	switch m.Header.Type {
	case unix.RTM_NEWLINK, unix.RTM_DELLINK, unix.RTM_NEWADDR, unix.RTM_DELADDR:
	default:
		return ev, false
	}
	attrs, err := syscall.ParseNetlinkRouteAttr(&m)
	if err != nil {
		return ev, false
	}
	if m.Header.Type == unix.RTM_NEWLINK || m.Header.Type == unix.RTM_DELLINK {
		for _, a := range attrs {
			if a.Attr.Type == unix.IFLA_IFNAME {
				ev.link = strings.TrimRight(string(a.Value), "\x00")
			}
		}
		return ev, ev.link != ""
	}
	ev.isAddr, ev.newAddr = true, m.Header.Type == unix.RTM_NEWADDR
	var local, address netip.Addr
	for _, a := range attrs {
		ip, ok := netip.AddrFromSlice(a.Value)
		switch {
		case !ok:
		case a.Attr.Type == unix.IFA_LOCAL:
			local = ip
		case a.Attr.Type == unix.IFA_ADDRESS:
			address = ip
		}
	}
	if ev.addr = local; !ev.addr.IsValid() {
		ev.addr = address
	}
	return ev, ev.addr.IsValid()
}

// matters says whether the event may need a repair: a change of one of ifaces, or a global
// address added or removed that is not a renewal of a held address.
func (ev kernelEvent) matters(held []netip.Prefix, ifaces []string) bool {
	if !ev.isAddr {
		return slices.Contains(ifaces, ev.link)
	}
	return !ev.addr.Unmap().IsLinkLocalUnicast() && !renewal(ev.addr, ev.newAddr, held)
}

// renewal says whether an address event is the LB address being added or replaced: with
// standbys the active renews the address's kernel lifetime four times a second, and each renewal
// is an RTM_NEWADDR that would otherwise wake the loop for a snapshot that finds nothing changed.
// Taking the address is the loop's own change (it snapshots after it); a removal (lifetime
// lapsed, deleted by hand) still wakes it.
func renewal(a netip.Addr, added bool, held []netip.Prefix) bool {
	if !added {
		return false
	}
	for _, p := range held {
		if p.Addr() == a.Unmap() {
			return true
		}
	}
	return false
}

// LinkSnapshot is what the kernel watch compares: an interface's index, MAC, up flag and global
// addresses. Most netlink events echo the lb pod's own changes; only a snapshot that differs
// from the one taken after the last reconcile is worth a repair.
type LinkSnapshot struct {
	Name   string
	Exists bool
	Index  int
	MAC    string
	Up     bool
	// Addresses are the global addresses, sorted, comma-separated.
	Addresses string
}

// snapshotLinks reads the snapshot of each interface.
func snapshotLinks(names ...string) []LinkSnapshot {
	out := make([]LinkSnapshot, 0, len(names))
	for _, name := range names {
		s := LinkSnapshot{Name: name}
		link, err := rtnl().LinkByName(name)
		if err != nil {
			out = append(out, s)
			continue
		}
		a := link.Attrs()
		s.Exists, s.Index, s.MAC, s.Up = true, a.Index, a.HardwareAddr.String(), a.Flags&net.FlagUp != 0
		addrs, _ := rtnl().AddrList(link, netlink.FAMILY_ALL)
		var global []string
		for _, ad := range addrs {
			if !ad.IP.IsLinkLocalUnicast() {
				global = append(global, ad.IPNet.String())
			}
		}
		slices.Sort(global)
		s.Addresses = strings.Join(global, ",")
		out = append(out, s)
	}
	return out
}

// Causes of a repair the kernel watch can name (the "cause" label of lbpod_repairs_total).
const (
	CauseLinkMissing   = "link_missing"
	CauseLinkRecreated = "link_recreated"
	CauseMACChanged    = "mac_changed"
	CauseLinkDown      = "link_down"
	CauseAddresses     = "addresses_changed"
	CauseLinkChanged   = "link_changed"
)

// SnapshotCauses names what changed between two snapshots of the same interfaces, one cause per
// interface at most (the strongest: missing, recreated, new MAC, down, addresses). It is pure.
func SnapshotCauses(before, after []LinkSnapshot) []string {
	var out []string
	for i, a := range after {
		if i >= len(before) || before[i] == a {
			continue
		}
		b := before[i]
		var cause string
		switch {
		case !a.Exists:
			cause = CauseLinkMissing
		case !b.Exists || a.Index != b.Index:
			cause = CauseLinkRecreated
		case a.MAC != b.MAC:
			cause = CauseMACChanged
		case !a.Up && b.Up:
			cause = CauseLinkDown
		case a.Addresses != b.Addresses:
			cause = CauseAddresses
		default:
			cause = CauseLinkChanged
		}
		if !slices.Contains(out, cause) {
			out = append(out, cause)
		}
	}
	return out
}

// watchNFTables signals every change of the nftables ruleset in the namespace (iptables-nft
// writes there), ours included, so that a resync reads the iptables tables again only when
// something changed them. ok is false when the subscription is refused: then nothing can be
// known, and every resync reads.
func watchNFTables(ctx context.Context, log *slog.Logger) (changed <-chan struct{}, ok bool) {
	sock, err := nl.Subscribe(unix.NETLINK_NETFILTER, unix.NFNLGRP_NFTABLES)
	if err != nil {
		log.Info("no nftables events; every resync reads the iptables tables", "err", err)
		return nil, false
	}
	out := make(chan struct{}, 1)
	notify := func() {
		select {
		case out <- struct{}{}:
		default:
		}
	}
	go func() {
		<-ctx.Done()
		sock.Close()
	}()
	go func() {
		for {
			if _, _, err := sock.Receive(); err != nil {
				if ctx.Err() != nil {
					return
				}
				// ENOBUFS: events were lost, so the tables may have changed unseen.
				notify()
				if !errors.Is(err, unix.ENOBUFS) {
					log.Warn("nftables events ended; every resync reads the iptables tables", "err", err)
					close(out)
					return
				}
				continue
			}
			notify()
		}
	}()
	return out, true
}
