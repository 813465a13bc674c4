package lbpod

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// watchKernel signals the link and address changes that matter (net1 or eth0 recreated, up or
// down, a new MAC; a global address added or removed) so that they are repaired at once rather
// than at the next resync. Link-local addresses come and go with IPv6 DAD and are not ours.
func watchKernel(ctx context.Context, log *slog.Logger, held []netip.Prefix, ifaces ...string) <-chan struct{} {
	out := make(chan struct{}, 1)
	links := make(chan netlink.LinkUpdate, 64)
	addrs := make(chan netlink.AddrUpdate, 64)
	onErr := func(err error) {
		if ctx.Err() == nil { // closing the socket on shutdown is not worth a warning
			log.Warn("netlink subscription", "err", err)
		}
	}
	if err := netlink.LinkSubscribeWithOptions(links, ctx.Done(), netlink.LinkSubscribeOptions{ErrorCallback: onErr}); err != nil {
		log.Warn("no netlink link events; relying on the periodic resync", "err", err)
		close(links)
	}
	if err := netlink.AddrSubscribeWithOptions(addrs, ctx.Done(), netlink.AddrSubscribeOptions{ErrorCallback: onErr}); err != nil {
		log.Warn("no netlink address events; relying on the periodic resync", "err", err)
		close(addrs)
	}
	notify := func() {
		select {
		case out <- struct{}{}:
		default:
		}
	}
	go func() {
		for links != nil || addrs != nil {
			select {
			case <-ctx.Done():
				return
			case u, ok := <-links:
				if !ok {
					links = nil
					continue
				}
				if slices.Contains(ifaces, u.Attrs().Name) {
					notify()
				}
			case u, ok := <-addrs:
				if !ok {
					addrs = nil
					continue
				}
				if !u.LinkAddress.IP.IsLinkLocalUnicast() && !renewal(u, held) {
					notify()
				}
			}
		}
		if ctx.Err() == nil {
			log.Warn("netlink subscriptions closed; relying on the periodic resync")
		}
	}()
	return out
}

// renewal says whether u is the LB address being added or replaced: with standbys the active
// renews the address's kernel lifetime four times a second, and each renewal is an RTM_NEWADDR
// that would otherwise wake the loop for a snapshot that finds nothing changed. Taking the
// address is the loop's own change (it snapshots after it); a removal (lifetime lapsed, deleted
// by hand) still wakes it.
func renewal(u netlink.AddrUpdate, held []netip.Prefix) bool {
	if !u.NewAddr {
		return false
	}
	a, ok := netip.AddrFromSlice(u.LinkAddress.IP)
	if !ok {
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
		link, err := netlink.LinkByName(name)
		if err != nil {
			out = append(out, s)
			continue
		}
		a := link.Attrs()
		s.Exists, s.Index, s.MAC, s.Up = true, a.Index, a.HardwareAddr.String(), a.Flags&net.FlagUp != 0
		addrs, _ := netlink.AddrList(link, netlink.FAMILY_ALL)
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
