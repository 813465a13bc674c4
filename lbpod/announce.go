package lbpod

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync/atomic"
	"time"

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

// announcer sends the announcements: a burst of three, a second apart, on trigger; then one every
// interval. It sends nothing while the loop does not hold the address (a standby).
type announcer struct {
	iface    string
	addrs    []netip.Prefix
	interval time.Duration
	burst    chan struct{}
	// holding reports whether the address is to be announced now.
	holding func() bool
	send    func(ifname string, addrs []netip.Prefix) error
	log     *slog.Logger
}

// burstSize is how many announcements follow a trigger, a second apart: one lost frame (a switch
// port still coming up) does not leave the underlay with a stale neighbour entry.
const burstSize = 3

func (a *announcer) trigger() {
	select {
	case a.burst <- struct{}{}:
	default:
	}
}

func (a *announcer) run(ctx context.Context) {
	periodic := time.NewTicker(a.interval)
	defer periodic.Stop()
	var next <-chan time.Time
	remaining := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.burst:
			remaining, next = burstSize, time.After(0)
		case <-next:
			a.once()
			if remaining--; remaining > 0 {
				next = time.After(time.Second)
			} else {
				next = nil
			}
		case <-periodic.C:
			a.once()
		}
	}
}

func (a *announcer) once() {
	if !a.holding() {
		return
	}
	if err := a.send(a.iface, a.addrs); err != nil {
		a.log.Warn("announcement failed (not fatal; retried)", "err", err)
	}
}
