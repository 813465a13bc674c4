package lbpod

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync/atomic"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/ndp"
)

// AnnounceStats counts announcements; exposed on /metrics.
type AnnounceStats struct {
	Sent     atomic.Uint64
	Failures atomic.Uint64
}

// Announce tells the underlay that the addresses live at ifname's MAC: a gratuitous ARP request
// (sender and target both the address, broadcast) for IPv4, an unsolicited neighbour
// advertisement with the override flag to all nodes for IPv6. Switches refresh their FDB and
// neighbours replace a stale entry (after a MAC change, or a pod moved to another node). Every
// address is tried; failures are counted and returned together, for the caller to log.
func Announce(ifname string, addrs []netip.Prefix, stats *AnnounceStats) error {
	ifi, err := net.InterfaceByName(ifname)
	if err != nil {
		stats.Failures.Add(uint64(len(addrs)))
		return fmt.Errorf("announce on %q: %w", ifname, err)
	}
	var errs []error
	for _, p := range addrs {
		var err error
		if familyOf(p.Addr()) == IPv4 {
			err = gratuitousARP(ifi, p.Addr())
		} else {
			err = unsolicitedNA(ifi, p.Addr())
		}
		if err != nil {
			stats.Failures.Add(1)
			errs = append(errs, fmt.Errorf("announce %s on %q: %w", p.Addr(), ifname, err))
			continue
		}
		stats.Sent.Add(1)
	}
	return errors.Join(errs...)
}

func gratuitousARP(ifi *net.Interface, ip netip.Addr) error {
	c, err := arp.Dial(ifi)
	if err != nil {
		return err
	}
	defer c.Close()
	zero := make(net.HardwareAddr, len(ifi.HardwareAddr))
	pkt, err := arp.NewPacket(arp.OperationRequest, ifi.HardwareAddr, ip, zero, ip)
	if err != nil {
		return err
	}
	return c.WriteTo(pkt, ethernet.Broadcast)
}

func unsolicitedNA(ifi *net.Interface, ip netip.Addr) error {
	// Bound to the LB address itself (added without DAD, so usable at once).
	c, _, err := ndp.Listen(ifi, ndp.Addr(ip.String()))
	if err != nil {
		return err
	}
	defer c.Close()
	na := &ndp.NeighborAdvertisement{
		Override:      true,
		TargetAddress: ip,
		Options:       []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Target, Addr: ifi.HardwareAddr}},
	}
	return c.WriteTo(na, nil, netip.IPv6LinkLocalAllNodes())
}
