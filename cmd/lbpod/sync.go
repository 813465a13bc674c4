package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"

	"github.com/lbsvc/lbsvc-operator/lbpod"
)

// stats are the counters /metrics exposes.
type stats struct {
	reconciles, reconcileErrors, changes atomic.Uint64
	announce                             lbpod.AnnounceStats
}

// result is what one reconcile did.
type result struct {
	changes      int
	addressAdded bool
	took         time.Duration
	err          error
}

// reconciler computes the desired state from the Service and applies it.
type reconciler struct {
	opts    options
	network lbpod.Network
	applier *lbpod.Applier
	log     *slog.Logger
	stats   *stats
}

// reconcile applies the state for svc, then verifies that nothing differs any more.
func (r *reconciler) reconcile(svc *corev1.Service) result {
	start := time.Now()
	r.stats.reconciles.Add(1)
	res := r.apply(svc)
	res.took = time.Since(start)
	if res.err != nil {
		r.stats.reconcileErrors.Add(1)
	}
	r.stats.changes.Add(uint64(res.changes))
	return res
}

func (r *reconciler) apply(svc *corev1.Service) result {
	var res result
	service, err := lbpod.ServiceFromObject(svc)
	if err != nil {
		res.err = err
		return res
	}
	obs, err := r.applier.Observe(r.opts.names())
	if err != nil {
		res.err = err
		return res
	}
	st := lbpod.Desired(lbpod.Config{Network: r.network, Service: service}, obs, r.opts.names())
	set, fwdErr := lbpod.EnsureForwarding(r.opts.procSys, st.Forwarding)
	for _, s := range set {
		r.log.Info("forwarding turned on", "sysctl", s)
	}
	changes, err := r.applier.Sync(st, false)
	res.changes = len(changes)
	for _, c := range changes {
		if c.Kind == "address" && c.Added {
			res.addressAdded = true
		}
		r.log.Info("changed", "change", c.String())
	}
	if err != nil {
		res.err = err
		return res
	}
	drift, err := r.applier.Sync(st, true)
	if err != nil {
		res.err = fmt.Errorf("verify: %w", err)
		return res
	}
	if len(drift) > 0 {
		var what []string
		for _, c := range drift {
			what = append(what, c.String())
		}
		res.err = fmt.Errorf("state not converged after applying, still differs: %s", strings.Join(what, "; "))
		return res
	}
	res.err = fwdErr
	return res
}

// readiness is the state /readyz reports.
type readiness struct {
	mu     sync.Mutex
	ready  bool
	reason string
}

func (rd *readiness) set(ready bool, reason string) (changed bool) {
	rd.mu.Lock()
	defer rd.mu.Unlock()
	changed = rd.ready != ready || rd.reason != reason
	rd.ready, rd.reason = ready, reason
	return changed
}

func (rd *readiness) get() (bool, string) {
	rd.mu.Lock()
	defer rd.mu.Unlock()
	return rd.ready, rd.reason
}

// run is the main container: apply, then follow the Service, the kernel and the clock.
func run(ctx context.Context, o options, network lbpod.Network, log *slog.Logger) error {
	applier, err := newApplier(ctx, o, log)
	if err != nil {
		return err
	}
	src, err := newServiceSource(o, log)
	if err != nil {
		return err
	}
	st := &stats{}
	r := &reconciler{opts: o, network: network, applier: applier, log: log, stats: st}
	ready := &readiness{reason: "starting"}

	healthAddr, why, err := lbpod.HealthAddr(o.healthAddr, os.Getenv(lbpod.EnvPodIP), uplinkAddrs(o.uplink))
	if err != nil {
		return err
	}
	log.Info("health server address", "addr", healthAddr, "why", why)
	srv, err := startHealthServer(healthAddr, ready, st, log)
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()

	box := newServiceBox()
	go src.Run(ctx, box)
	kernel := watchKernel(ctx, log, o.iface, o.uplink)
	ann := &announcer{iface: o.iface, addrs: network.Addresses, interval: o.announceInterval, burst: make(chan struct{}, 1), stats: &st.announce, log: log}
	go ann.run(ctx)

	resync := time.NewTicker(o.resyncPeriod)
	defer resync.Stop()
	var (
		svc      *corev1.Service
		svcErr   error = errors.New("waiting for the Service")
		lastMAC  string
		lastSeen string // kernelFingerprint after the last reconcile
		debounce <-chan time.Time
		// A failed reconcile (an xtables lock held too long, net1 not there yet) is retried
		// sooner than the resync, backing off from 1 s up to the resync period.
		retry   <-chan time.Time
		backoff = time.Second
		first   = true
	)
	reconcile := func(why string) {
		if svcErr != nil {
			if ready.set(false, svcErr.Error()) {
				log.Error("not ready", "reason", svcErr.Error())
			}
			return
		}
		res := r.reconcile(svc)
		if res.changes > 0 {
			log.Info("applied", "trigger", why, "changes", res.changes, "took", res.took.Round(time.Microsecond))
		}
		if res.err != nil {
			if ready.set(false, res.err.Error()) {
				log.Error("not ready", "reason", res.err.Error())
			}
			retry = time.After(backoff)
			backoff = min(2*backoff, o.resyncPeriod)
		} else {
			retry, backoff = nil, time.Second
			if ready.set(true, "") {
				log.Info("ready", "trigger", why)
			}
		}
		// Announce after the first apply, after adding an address, and when net1's MAC changed
		// (a recreated net1, or one whose MAC was changed by hand).
		mac := ""
		if ifi, err := net.InterfaceByName(o.iface); err == nil {
			mac = ifi.HardwareAddr.String()
		}
		if (first && res.err == nil) || res.addressAdded || (mac != "" && lastMAC != "" && mac != lastMAC) {
			ann.trigger()
			first = false
		}
		if mac != "" {
			lastMAC = mac
		}
		lastSeen = kernelFingerprint(o.iface, o.uplink)
	}
	for {
		select {
		case <-ctx.Done():
			log.Info("stopping", "signal", context.Cause(ctx))
			return nil
		case <-box.changed:
			svc, svcErr = box.get()
			reconcile("service")
		case <-kernel:
			// Our own changes echo back as events: wait for the burst to end, then look once.
			if debounce == nil {
				debounce = time.After(50 * time.Millisecond)
			}
		case <-debounce:
			debounce = nil
			// Most events echo our own changes: look again only when the links or their
			// addresses differ from what the last reconcile left.
			if kernelFingerprint(o.iface, o.uplink) != lastSeen {
				reconcile("netlink")
			}
		case <-resync.C:
			reconcile("resync")
		case <-retry:
			reconcile("retry")
		}
	}
}

// watchKernel signals the link and address changes that matter (net1 or eth0 recreated, up or
// down, a new MAC; a global address added or removed) so that they are repaired at once rather
// than at the next resync. Link-local addresses come and go with IPv6 DAD and are not ours.
func watchKernel(ctx context.Context, log *slog.Logger, ifaces ...string) <-chan struct{} {
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
	}
	if err := netlink.AddrSubscribeWithOptions(addrs, ctx.Done(), netlink.AddrSubscribeOptions{ErrorCallback: onErr}); err != nil {
		log.Warn("no netlink address events; relying on the periodic resync", "err", err)
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
				if !u.LinkAddress.IP.IsLinkLocalUnicast() {
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

// kernelFingerprint summarises what the netlink events are about: each interface's index, MAC,
// up flag and global addresses.
func kernelFingerprint(ifaces ...string) string {
	var b strings.Builder
	for _, name := range ifaces {
		link, err := netlink.LinkByName(name)
		if err != nil {
			fmt.Fprintf(&b, "%s:missing;", name)
			continue
		}
		a := link.Attrs()
		fmt.Fprintf(&b, "%s:%d:%s:%t:", name, a.Index, a.HardwareAddr, a.Flags&net.FlagUp != 0)
		addrs, _ := netlink.AddrList(link, netlink.FAMILY_ALL)
		var global []string
		for _, ad := range addrs {
			if !ad.IP.IsLinkLocalUnicast() {
				global = append(global, ad.IPNet.String())
			}
		}
		slices.Sort(global)
		b.WriteString(strings.Join(global, ",") + ";")
	}
	return b.String()
}

// announcer sends the announcements: three, a second apart, on trigger; one every interval.
type announcer struct {
	iface    string
	addrs    []netip.Prefix
	interval time.Duration
	burst    chan struct{}
	stats    *lbpod.AnnounceStats
	log      *slog.Logger
}

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
			remaining, next = 3, time.After(0)
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
	if err := lbpod.Announce(a.iface, a.addrs, a.stats); err != nil {
		a.log.Warn("announcement failed (not fatal; retried)", "err", err, "failures", a.stats.Failures.Load())
	}
}

// startHealthServer serves /healthz, /readyz and /metrics.
func startHealthServer(addr string, ready *readiness, st *stats, log *slog.Logger) (*http.Server, error) {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		ok, reason := ready.get()
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, "not ready:", reason)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) {
		ok, _ := ready.get()
		readyVal := 0
		if ok {
			readyVal = 1
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		metric(w, "lbpod_ready", "gauge", "1 while the desired state is applied and verified.", uint64(readyVal))
		metric(w, "lbpod_reconciles_total", "counter", "Reconciles run.", st.reconciles.Load())
		metric(w, "lbpod_reconcile_errors_total", "counter", "Reconciles that failed.", st.reconcileErrors.Load())
		metric(w, "lbpod_changes_total", "counter", "Kernel objects added or removed.", st.changes.Load())
		metric(w, "lbpod_announcements_total", "counter", "Gratuitous ARPs and unsolicited NAs sent.", st.announce.Sent.Load())
		metric(w, "lbpod_announce_failures_total", "counter", "Announcements that could not be sent.", st.announce.Failures.Load())
	})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("health-addr %q: %w", addr, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("health server", "err", err)
		}
	}()
	return srv, nil
}

func metric(w http.ResponseWriter, name, kind, help string, v uint64) {
	fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n%s %d\n", name, help, name, kind, name, v)
}

// uplinkAddrs lists the addresses of the uplink (eth0), for the health server's fallback
// address; nil when it cannot be read (HealthAddr then says why it has none).
func uplinkAddrs(name string) []netip.Addr {
	link, err := netlink.LinkByName(name)
	if err != nil {
		return nil
	}
	addrs, err := netlink.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		return nil
	}
	var out []netip.Addr
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			out = append(out, ip.Unmap())
		}
	}
	return out
}
