package lbpod

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// rtnl is the process's one rtnetlink handle, opened at its first use in the lb pod's network
// namespace (the process never leaves it). vishvananda/netlink's package functions open, set up
// and close a socket for every request: a resync made 23 of them every 10 s, about six syscalls
// each beside the request itself, and on a node with hundreds of idle lb pods that was the largest
// part of an idle standby's CPU after its election (docs/benchmarks.md, Idle CPU). The handle's
// socket serialises concurrent requests (netlink locks it per request). If it cannot be opened,
// requests fall back to a socket each, as the package functions do.
var rtnl = sync.OnceValue(func() *netlink.Handle {
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return &netlink.Handle{} // no sockets: one per request
	}
	// As the package functions' sockets: a request never waits for ever on a stuck kernel.
	_ = h.SetSocketTimeout(time.Minute)
	return h
})

func addressOp(o AddressOp) error {
	link, err := rtnl().LinkByName(o.Name)
	if err != nil {
		return fmt.Errorf("interface %q: %w", o.Name, err)
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: o.Prefix.Addr().AsSlice(), Mask: net.CIDRMask(o.Prefix.Bits(), o.Prefix.Addr().BitLen())}}
	if !o.Add {
		if err := rtnl().AddrDel(link, addr); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
			return fmt.Errorf("remove stale address %s from %q: %w", o.Prefix, o.Name, err)
		}
		return nil
	}
	if familyOf(o.Prefix.Addr()) == IPv6 {
		// Usable at once: duplicate address detection would hold it "tentative" for about a
		// second, and the operator's IPAM already guarantees it is unique.
		addr.Flags = unix.IFA_F_NODAD
	}
	if o.Lifetime > 0 {
		// Replace: the address may be there for ever (Link.Permanent), and must end up on the
		// lifetime either way.
		secs := lifetimeSeconds(o.Lifetime)
		addr.ValidLft, addr.PreferedLft = secs, secs
		if err := rtnl().AddrReplace(link, addr); err != nil {
			return fmt.Errorf("add address %s to %q with lifetime %ds: %w", o.Prefix, o.Name, secs, err)
		}
		return nil
	}
	if err := rtnl().AddrAdd(link, addr); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("add address %s to %q: %w", o.Prefix, o.Name, err)
	}
	return nil
}

func ruleOp(o RuleOp) error {
	if !o.Add {
		raw, ok := o.Old.raw.(*netlink.Rule)
		if !ok {
			return fmt.Errorf("%s: not read from the kernel", o)
		}
		// vishvananda/netlink (v1.3.1) sends a tun_id in 4 bytes where the kernel takes 8, and the
		// kernel refuses the request (ERANGE). Left out, it no longer narrows which rule the
		// kernel deletes: the first of that priority that matches the rest.
		r := *raw
		r.TunID = 0
		if err := rtnl().RuleDel(&r); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("remove stale rule (%s): %w", o, err)
		}
		return nil
	}
	nr := netlink.NewRule()
	nr.Family = netlinkFamily(o.Rule.Family)
	nr.Priority = o.Rule.Priority
	nr.IifName = o.Rule.IIF
	if src := o.Rule.Src; src.IsValid() {
		nr.Src = &net.IPNet{IP: src.Addr().AsSlice(), Mask: net.CIDRMask(src.Bits(), src.Addr().BitLen())}
	}
	nr.Table = o.Rule.Table
	if err := rtnl().RuleAdd(nr); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("%s: %w", o, err)
	}
	return nil
}

func routeOp(o RouteOp) error {
	if !o.Add {
		r, ok := o.Old.raw.(*netlink.Route)
		if !ok {
			return fmt.Errorf("%s: not read from the kernel", o)
		}
		if err := rtnl().RouteDel(r); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("remove stale route (%s): %w", o, err)
		}
		return nil
	}
	r := o.Route
	nr := &netlink.Route{
		Family:    netlinkFamily(r.Family),
		Table:     o.Table,
		LinkIndex: o.LinkIndex,
		Dst:       &net.IPNet{IP: r.Dst.Addr().AsSlice(), Mask: net.CIDRMask(r.Dst.Bits(), r.Dst.Addr().BitLen())},
	}
	if r.Gateway.IsValid() {
		nr.Gw = r.Gateway.AsSlice()
	} else {
		nr.Scope = netlink.SCOPE_LINK
	}
	if r.OnLink {
		nr.Flags = int(netlink.FLAG_ONLINK)
	}
	if err := rtnl().RouteReplace(nr); err != nil {
		return fmt.Errorf("%s: %w", o, err)
	}
	return nil
}
