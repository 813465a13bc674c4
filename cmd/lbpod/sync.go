package main

import (
	"context"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/lbsvc/lbsvc-operator/lbpod"
)

// loopConfig is the loop's configuration from the flags.
func loopConfig(o options, network lbpod.Network, applier *lbpod.Applier, log *slog.Logger) lbpod.LoopConfig {
	cfg := lbpod.LoopConfig{
		Network: network, Names: o.names(), Applier: applier, ProcSys: o.procSys,
		ResyncPeriod: o.resyncPeriod, AnnounceInterval: o.announceInterval, Log: log,
	}
	if o.portGate {
		cfg.Gate = lbpod.NewPortGate(log)
	}
	return cfg
}

// run is the main container: the loop of package lbpod, fed by the Service source, with its
// health and metrics server on the pod's cluster address.
func run(ctx context.Context, o options, network lbpod.Network, log *slog.Logger) error {
	if o.ha.keyFile != "" {
		// First: a pod whose key cannot be read fails with this one line.
		key, err := readHAKey(o.ha.keyFile)
		if err != nil {
			return err
		}
		o.ha.key = key
	}
	if err := requireInterface(o.iface); err != nil {
		return err
	}
	applier, rules, err := newApplier(ctx, o, log)
	if err != nil {
		return err
	}
	src, err := newServiceSource(o, network, log)
	if err != nil {
		return err
	}
	cfg := loopConfig(o, network, applier, log)
	var holder *loopHolder
	if o.haEnabled() {
		holder = newLoopHolder(o, network, log)
		cfg.OnHeld, cfg.Announce = holder.onHeld, holder.announce
		cfg.AddressLifetime, cfg.Confirmed = holder.loopLifetime, holder.confirmedLately
	}
	loop := lbpod.NewLoop(cfg)
	if err := loop.Registerer().Register(lbpod.RulesBackendInfo(rules)); err != nil {
		return err
	}

	uplinkAddrs, node := uplink(o.uplink)
	healthAddr, why, err := lbpod.HealthAddr(o.healthAddr, os.Getenv(lbpod.EnvPodIP), uplinkAddrs)
	if err != nil {
		return err
	}
	log.Info("health server address", "addr", healthAddr, "why", why, "node", node)
	srv, err := lbpod.ServeHealth(healthAddr, loop.Handler(), node, log)
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()

	recorder, err := newRecorder(o, network, log)
	if err != nil {
		return err
	}
	var lease leaseState
	if recorder != nil {
		lease = recorder // a nil *leaseRecorder in the interface would not be nil
	}
	prober, err := newProber(o, network, lease, loop.Registerer(), log)
	if err != nil {
		return err
	}

	go src.Run(ctx, loop)
	if holder == nil {
		if prober != nil {
			// The rules go in meanwhile; the addresses only once the underlay has no other owner.
			loop.SetActive(false)
			go holdSingle(ctx, loop, prober, recheckBlocked)
		}
		return loop.Run(ctx)
	}
	holder.loop, holder.prober = loop, prober
	if prober != nil {
		prober.wanted, prober.peer = holder.isActive, holder.isPeer
	}
	loop.SetActive(false) // a standby until elected
	return runElected(ctx, o, network, loop, holder, recorder, log)
}

// uplink reads the uplink (eth0, the pod's cluster interface): its addresses, for the health
// server's fallback address, and the gateways of the routes through it, the node's side of the
// pod's link for the bridge, ptp and most CNIs, where the kubelet's probes come from. What cannot
// be read is left empty (HealthAddr then says why it has no address).
func uplink(name string) (addrs, gateways []netip.Addr) {
	link, err := netlink.LinkByName(name)
	if err != nil {
		return nil, nil
	}
	if list, err := netlink.AddrList(link, netlink.FAMILY_ALL); err == nil {
		for _, a := range list {
			if ip, ok := netip.AddrFromSlice(a.IP); ok {
				addrs = append(addrs, ip.Unmap())
			}
		}
	}
	if routes, err := netlink.RouteList(link, netlink.FAMILY_ALL); err == nil {
		for _, r := range routes {
			if gw, ok := netip.AddrFromSlice(r.Gw); ok && !slices.Contains(gateways, gw.Unmap()) {
				gateways = append(gateways, gw.Unmap())
			}
		}
	}
	return addrs, gateways
}

// holdSingle makes a single lb pod (no election) active once its probe finds the addresses free.
// Blocked by what answered, it reads the Lease every period and holds the addresses once the
// Lease shows them announced all the same, as a blocked replica with standbys does: a pod whose
// first read of the Lease failed probes even addresses announced long ago (the operator then
// ignores its report), and a host on the underlay that answers every probe left the Service
// without a holder until the pod was deleted.
func holdSingle(ctx context.Context, loop *lbpod.Loop, p *prober, period time.Duration) {
	if reason := p.check(ctx); reason != "" {
		loop.Block(reason)
		p.awaitAnnounced(ctx, period, func() {
			loop.Unblock()
			loop.SetActive(true)
		})
		return
	}
	loop.SetActive(true)
}
