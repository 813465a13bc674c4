package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"k8s.io/apimachinery/pkg/types"

	"github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
	"github.com/lbsvc/lbsvc-operator/controllers/lbobjects"

	"github.com/lbsvc/lbsvc-operator/lbpod"
	"github.com/lbsvc/lbsvc-operator/lbpod/ha"
)

// The election among a Service's replicas (package lbpod/ha), on when the operator runs more than
// one (--replicas, env LBPOD_REPLICAS): every replica starts as a standby with the whole state but
// the LB addresses, and the elected one adds them. With one replica nothing changes: the pod holds
// the addresses from the start, as before.

// haOptions are the election's flags.
type haOptions struct {
	replicas int
	interval time.Duration
	priority uint
	lease    time.Duration
	// keyFile is the Service's election key (--ha-key-file, the operator's Secret mounted
	// read-only); key its content, read by run. replayWindow, legacyWindow and copyWindow
	// are ha.Config's.
	keyFile                                string
	key                                    []byte
	replayWindow, legacyWindow, copyWindow time.Duration
	// groupAddress: adverts go to the group's own address (ha.Options.NoGroupAddress unset).
	groupAddress bool
}

func (o options) haEnabled() bool { return o.ha.replicas > 1 }

func (o options) haConfig(network lbpod.Network) ha.Config {
	addrs := make([]netip.Addr, 0, len(network.Addresses))
	for _, p := range network.Addresses {
		addrs = append(addrs, p.Addr())
	}
	return ha.Config{Group: ha.GroupOf(addrs), Priority: uint8(o.ha.priority), Interval: o.ha.interval,
		ReplayWindow: o.ha.replayWindow, LegacyWindow: o.ha.legacyWindow, CopyWindow: o.ha.copyWindow}
}

// readHAKey reads the election key from path: at least ha.MinKeyLen bytes, used as they are (the
// operator's Secret holds 32 random bytes). A key file that is named but unusable stops lbpod:
// running unauthenticated instead would hide the mistake and leave the election forgeable.
func readHAKey(path string) ([]byte, error) {
	key, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("ha-key-file: %w", err)
	}
	if len(key) < ha.MinKeyLen {
		return nil, fmt.Errorf("ha-key-file %q: %d bytes, want at least %d", path, len(key), ha.MinKeyLen)
	}
	return key, nil
}

func (o haOptions) validate() error {
	if o.replicas < 1 {
		return fmt.Errorf("replicas %d: want 1 or more", o.replicas)
	}
	if o.priority > 255 {
		return fmt.Errorf("ha-priority %d: want 0 to 255", o.priority)
	}
	if o.interval <= 0 || o.interval > ha.MaxInterval {
		return fmt.Errorf("ha-interval %s: want more than 0 and at most %s", o.interval, ha.MaxInterval)
	}
	// The lease must outlive the dead interval, or a live active would lose the addresses
	// between two renewals; it is whole seconds in the kernel.
	if o.lease != 0 && (o.lease < time.Second || o.lease <= ha.DefaultDeadAdverts*o.interval) {
		return fmt.Errorf("ha-lease %s: want 0 (none) or at least 1s and longer than %d intervals", o.lease, ha.DefaultDeadAdverts)
	}
	if o.replayWindow <= 0 {
		return fmt.Errorf("ha-replay-window %s: want more than 0", o.replayWindow)
	}
	if o.legacyWindow < 0 {
		return fmt.Errorf("ha-legacy-window %s: want 0 (never) or more", o.legacyWindow)
	}
	if o.copyWindow < 0 {
		return fmt.Errorf("ha-copy-window %s: want 0 (never) or more", o.copyWindow)
	}
	return nil
}

// runElected runs the loop under the election: the loop as a standby, the election deciding when
// it holds the addresses. On ctx's end the election resigns first (the loop still running, so
// that releasing the addresses takes effect), then the loop stops.
func runElected(ctx context.Context, o options, network lbpod.Network, loop *lbpod.Loop, holder *loopHolder, recorder *leaseRecorder, log *slog.Logger) error {
	holder.ctx = ctx
	if recorder != nil {
		go recorder.run(ctx)
	}
	metrics := ha.NewMetrics()
	for _, c := range metrics.Collectors() {
		if err := loop.Registerer().Register(c); err != nil {
			return err
		}
	}
	loopCtx, stopLoop := context.WithCancel(context.WithoutCancel(ctx))
	defer stopLoop()
	loopDone := make(chan error, 1)
	go func() { loopDone <- loop.Run(loopCtx) }()
	opts := ha.Options{
		Interface: o.iface, Config: o.haConfig(network), Log: log, Metrics: metrics, Key: o.ha.key,
		NoGroupAddress: !o.ha.groupAddress,
		OnChange: func(role ha.Role, reason string) {
			log.Info("role", "role", role.String(), "reason", reason)
		},
	}
	if recorder != nil {
		opts.Record = recorder // a nil *leaseRecorder in the interface would not be nil
		first := newFirstClaim(recorder, holder.prober, holder, ha.DefaultDeadAdverts*o.ha.interval, log)
		go first.run(ctx)
		opts.First = first
	}
	haErr := ha.Run(ctx, opts, holder)
	stopLoop()
	return errors.Join(haErr, <-loopDone)
}

// leaseNamespace is where the Lease is: the Service's namespace, or for a shared address where
// its lb pods run (the owner's namespace, or the --lb-pod-namespace; lbobjects.SharedLeaseNamespace),
// not a member's: members come and go, the first of them may leave while the address stays, and
// whoever may write Leases in a member namespace must not be able to write the record of an
// address that namespace may no longer have a Service on (a forged claim there would move it; a
// forged conflict report would take it). The lb pods' ServiceAccount is bound there too.
func leaseNamespace(o options, readFile func(string) ([]byte, error)) string {
	if o.sharedIP != "" {
		return podNamespace(o, readFile)
	}
	return o.namespace
}

// newRecorder returns the Lease recorder, or nil when there is no API to write to (--service-file)
// or no pod or Lease name (outside a cluster).
func newRecorder(o options, network lbpod.Network, log *slog.Logger) (*leaseRecorder, error) {
	if o.serviceFile != "" || o.podName == "" || o.leaseName == "" {
		log.Info("nothing is recorded in a Lease", "why", "no API (--service-file), no --pod-name or no --lease-name")
		return nil, nil
	}
	client, err := newClient(o)
	if err != nil {
		return nil, err
	}
	r := newLeaseRecorder(client, leaseNamespace(o, os.ReadFile), o.service, o.leaseName, o.podName, log)
	if o.sharedIP != "" {
		r.shared = &sharedLease{ownerUID: types.UID(os.Getenv(v1alpha1.EnvOwnerUID)), ownerNamespace: o.namespace,
			ip: lbobjects.IPRef{Name: o.sharedIP, UID: types.UID(os.Getenv(v1alpha1.EnvSharedIPUID))}}
	}
	for _, a := range network.Addresses {
		r.addrs = append(r.addrs, a.Addr())
	}
	return r, nil
}

// loopHolder is the election's Holder: it switches the loop between active and standby and waits
// (at most waitHeld) until the loop reports the addresses held or let go, so that the advert the
// election sends next tells the truth; a takeover with the loop standing ready puts the addresses
// on itself instead (takeNow). With a lease it keeps the addresses on a kernel lifetime
// that every advert renews (ha.Leaser).
type loopHolder struct {
	loop     *lbpod.Loop
	iface    string
	addrs    []netip.Prefix
	lease    time.Duration
	waitHeld time.Duration
	log      *slog.Logger
	// recheckBlocked is awaitAnnounced's period (recheckBlocked; tests shorten it).
	recheckBlocked time.Duration

	mu      sync.Mutex
	held    bool
	changed chan struct{}
	// active is the election's last word; confirmed is when it last said so (SetActive(true) or
	// an advert sent as active, which calls Renew).
	active    bool
	confirmed time.Time
	renewed   time.Time     // the last lease renewal
	lifetime  time.Duration // the kernel lifetime it set
	// withheld is an announcement announce did not send (the election had not confirmed this
	// replica lately), sent by the next confirmation as active (Renew) and dropped by a step down.
	withheld *announcement
	// dead is the election's dead interval as this replica last advertised it (ha.Leaser): an
	// active not confirmed for longer may have been frozen and replaced.
	dead time.Duration
	now  func() time.Time // time.Now; tests step it
	// nl and renewer are putAddrs' netlink sockets (Renew's, and a takeover's in one add), opened
	// at the first use; one user at a time: the election's goroutine, or runProbe while probing
	// keeps Renew away from them. nl looks up link, the interface it renews on, once and again
	// only after a renewal failed (net1 recreated): the lookup reads and decodes every attribute
	// of the link, and cost the active lb pod more CPU than the renewal itself (11 % of it, 3
	// lookups a second). renewer replaces the addresses (addrRenewer).
	nl      *netlink.Handle
	link    netlink.Link
	renewer *addrRenewer
	// prober, when set, probes the underlay at the first takeover (prober.check); probing says it
	// runs now, during which the addresses stay off net1 (the loop is not made active and Renew
	// puts nothing on). ctx bounds it.
	prober  *prober
	probing bool
	ctx     context.Context
	// peers are the other replicas of the Service the election heard (Peer): their net1 MACs.
	peers map[ha.ID]bool
}

// maxPeers bounds the replicas Peer remembers: the Deployment runs at most five, and without an
// election key anyone on the underlay can name himself one.
const maxPeers = 16

// Peer implements ha.PeerNoter: it remembers the sender of an advert the election accepted from
// another replica (authenticated, with a key), for the conflict probe (isPeer).
func (h *loopHolder) Peer(id ha.ID) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.peers == nil {
		h.peers = map[ha.ID]bool{}
	}
	if len(h.peers) < maxPeers {
		h.peers[id] = true
	}
}

// heardPeer says whether the election accepted an advert from another replica (Peer).
func (h *loopHolder) heardPeer() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.peers) > 0
}

// isPeer says whether mac is the net1 of another replica of the Service (Peer).
func (h *loopHolder) isPeer(mac net.HardwareAddr) bool {
	var id ha.ID
	if len(mac) != len(id) {
		return false
	}
	copy(id[:], mac)
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.peers[id]
}

func newLoopHolder(o options, network lbpod.Network, log *slog.Logger) *loopHolder {
	// Less than the dead interval, so that a slow apply never looks like a frozen process.
	return &loopHolder{iface: o.iface, addrs: network.Addresses, lease: o.ha.lease, waitHeld: 2 * o.ha.interval,
		recheckBlocked: recheckBlocked, log: log, changed: make(chan struct{}, 1), dead: ha.DefaultDeadAdverts * o.ha.interval, now: time.Now}
}

// announcement is what one call of announce was asked to send.
type announcement struct {
	ifname string
	addrs  []netip.Prefix
}

// announce is the loop's Announce: it sends only while the election confirmed this replica active
// within the dead interval. After SIGSTOP/SIGCONT the loop's announcement timers can fire before
// the election has noticed the freeze and stepped down; announcing then would pull the clients
// back from the replica that took over meanwhile. An announcement withheld is not lost: the next
// advert this replica sends as active (Renew) sends it first. On a starved node the loop can run
// later than the dead interval after a takeover; before, all three announcements of the takeover's
// burst could be withheld, and clients kept the old holder's MAC until their neighbour entry
// expired (seconds).
func (h *loopHolder) announce(ifname string, addrs []netip.Prefix) error {
	h.mu.Lock()
	lately := h.confirmedLatelyLocked()
	if !lately && h.active {
		h.withheld = &announcement{ifname: ifname, addrs: addrs}
	}
	h.mu.Unlock()
	if !lately {
		h.log.Info("announcement withheld: the election has not confirmed this replica active lately; the next advert as active sends it")
		return nil
	}
	return lbpod.Announce(ifname, addrs, h.loop.AnnounceStats())
}

// sendWithheld sends the announcement announce withheld, if any: called right after the election
// confirmed this replica active.
func (h *loopHolder) sendWithheld() {
	h.mu.Lock()
	a := h.withheld
	h.withheld = nil
	h.mu.Unlock()
	if a == nil {
		return
	}
	if err := lbpod.Announce(a.ifname, a.addrs, h.loop.AnnounceStats()); err != nil {
		h.log.Warn("the withheld announcement failed (not fatal)", "err", err)
		return
	}
	h.log.Info("sent the withheld announcement", "addresses", a.addrs)
}

// confirmedLately says whether the election confirmed this replica active (SetActive(true), or
// an advert sent as active) within the dead interval it last advertised: announce's condition,
// and the loop's Confirmed. Past it, a standby may have taken over, and the election steps down
// at its next input (it was frozen), or it hangs.
func (h *loopHolder) confirmedLately() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.confirmedLatelyLocked()
}

func (h *loopHolder) confirmedLatelyLocked() bool {
	return h.active && h.now().Sub(h.confirmed) < h.dead
}

func (h *loopHolder) confirm(active bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.active = active
	if active {
		h.confirmed = h.now()
	} else {
		h.renewed, h.lifetime = time.Time{}, 0 // the next takeover puts the lease on at its first advert
		h.withheld = nil                       // a standby never announces
	}
}

// onHeld is the loop's OnHeld.
func (h *loopHolder) onHeld(held bool) {
	h.mu.Lock()
	h.held = held
	h.mu.Unlock()
	select {
	case h.changed <- struct{}{}:
	default:
	}
}

// SetActive implements ha.Holder. The first takeover of a replica with a prober starts the
// conflict probe and returns at once, so that the takeover's advert goes out now (another standby
// must not claim, nor probe, meanwhile); the loop holds the addresses once the probe found nobody.
func (h *loopHolder) SetActive(active bool) {
	h.confirm(active)
	h.mu.Lock()
	startProbe := active && h.prober != nil && !h.probing && !h.prober.finished()
	h.probing = h.probing || startProbe
	wait := h.probing
	h.mu.Unlock()
	if startProbe {
		h.prober.hold() // before the election hands the claim to the recorder
		go h.runProbe()
	}
	if wait {
		if !active {
			h.loop.SetActive(false)
		}
		return // runProbe makes the loop active if the election still says so
	}
	if active && h.takeNow() {
		// The addresses are on net1, the loop active and the announcement on its way: the advert
		// may go. The loop applies and verifies the active state behind it, and reports the
		// addresses held (OnHeld).
		return
	}
	h.loop.SetActive(active)
	timeout := time.NewTimer(h.waitHeld)
	defer timeout.Stop()
	for {
		h.mu.Lock()
		held := h.held
		h.mu.Unlock()
		if held == active {
			return
		}
		select {
		case <-h.changed:
		case <-timeout.C:
			h.log.Warn("the loop has not applied the role yet; going on", "active", active, "waited", h.waitHeld)
			return
		}
	}
}

// takeNow is a takeover in one address add (lbpod.Loop.TakeOver): when the loop stands by ready
// and is not applying, the holder puts the addresses on net1 itself, on the lifetime the loop would
// give them, makes the loop active and announces them, without waiting for the loop; it reports
// whether it did. Otherwise (the loop not yet applied, applying now, a Service change pending, no
// lease, a netlink error) the loop does the takeover, and SetActive waits for it as before.
// Through the loop, on a node where 50 standbys took over at once, in a kernel whose netlink lock
// the failed node's links were holding, the address reached net1 0.25-1.2 s after the takeover,
// the announcement after that (docs/benchmarks.md).
func (h *loopHolder) takeNow() bool {
	h.mu.Lock()
	took := h.takeNowLocked()
	h.mu.Unlock()
	h.tookOver(took)
	return took != nil
}

// takeNowLocked is takeNow's takeover with h.mu held, so that neither a step down (SetActive(false)
// confirms under h.mu first) nor a renewal (which checks probing under h.mu) runs beside it: it
// returns when it took over and how long the address took, nil when it did not. The loop's own
// calls into the holder (Confirmed, AddressLifetime, OnHeld) take h.mu while it applies, so
// TakeOver only tries the loop's apply lock, never waits for it.
func (h *loopHolder) takeNowLocked() *time.Duration {
	if h.lease <= 0 || h.loop == nil || !h.active {
		return nil
	}
	start := h.now()
	lifetime := addressLifetime(h.lease, h.dead)
	took, err := h.loop.TakeOver(func() error { return h.putAddrs(int(lifetime / time.Second)) })
	if err != nil {
		h.log.Warn("could not put the addresses on net1 at the takeover; the loop does it", "err", err)
	}
	if !took {
		return nil
	}
	// The election is alive and still deciding to be active now, not only when it began: the put
	// may have waited for the kernel's netlink lock for a good part of the dead interval (214 ms
	// seen on make demo), and the loop, announce and Renew judge confirmation from here.
	end := h.now()
	h.renewed, h.lifetime, h.confirmed = start, lifetime, end
	d := end.Sub(start)
	return &d
}

// tookOver logs a takeover takeNowLocked did (took not nil) and announces the addresses before
// it returns: the election sends its advert once SetActive returns. The announcement goes from the
// caller's goroutine while the confirmation the put just made is fresh. Sent from a goroutine of
// its own, on a node whose lb pods were starved (a whole node's actives failing over onto it) it
// ran after the election's advert, often later than the dead interval, so that announce withheld
// it until the next advert, and clients kept the failed node's MAC up to 1.5 s after the address
// was on net1 (docs/benchmarks.md). A few packets: the advert waits ~0.1 ms more.
func (h *loopHolder) tookOver(took *time.Duration) {
	if took == nil {
		return
	}
	h.log.Info("took over: the addresses are on net1", "took", took.Round(time.Microsecond))
	if err := h.announce(h.iface, h.addrs); err != nil {
		h.log.Warn("the takeover's announcement failed (the loop's burst follows)", "err", err)
	}
}

// runProbe runs the prober once; with nobody answering it makes the loop active if the election
// still wants this replica active, else it blocks the loop (the election keeps this replica
// active, so that no standby takes the addresses either: the operator moves the Service) until the
// Lease shows the addresses announced after all (awaitAnnounced).
func (h *loopHolder) runProbe() {
	ctx := h.ctx
	if ctx == nil {
		ctx = context.Background()
	}
	reason := h.prober.check(ctx)
	if reason != "" {
		h.loop.Block(reason)
		h.mu.Lock()
		h.probing = false
		h.mu.Unlock()
		go h.awaitAnnounced(ctx)
		return
	}
	// A probe whose outcome was dropped (this replica stepped down meanwhile) is not finished:
	// it runs again at the next takeover. Nobody answered and still active: the takeover in one
	// address add when the loop stands ready (a replica's first takeover always comes here,
	// and in a node's failure most of the survivors' takeovers are their first), else through
	// the loop. While probing is set, Renew leaves the netlink sockets to it.
	h.holdIfActive(true)
}

// holdIfActive takes the addresses if the election still wants this replica active, after a probe
// that found nobody (endProbe: it also ends probing, under the same lock) or once a block was
// lifted: the takeover in one address add when the loop stands ready, else through the loop.
func (h *loopHolder) holdIfActive(endProbe bool) {
	h.mu.Lock()
	took := h.takeNowLocked()
	if endProbe {
		h.probing = false
	}
	active := h.active
	h.mu.Unlock()
	h.tookOver(took)
	if active && took == nil {
		h.loop.SetActive(true)
	}
}

// awaitAnnounced reads the Lease every recheckBlocked while the probe's conflict blocks this
// replica, and once the Service announced its addresses all the same (prober.announcedSince)
// unblocks the loop: a standby is then ready to claim, and an active takes the addresses as after
// a probe that found nobody. Each read is one GET of the Lease; only a blocked replica makes them.
func (h *loopHolder) awaitAnnounced(ctx context.Context) {
	h.prober.awaitAnnounced(ctx, h.recheckBlocked, func() {
		h.loop.Unblock()
		h.holdIfActive(false)
	})
}

// isActive says whether the election last made this replica active.
func (h *loopHolder) isActive() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.active
}

// holdsNothing says that the addresses must stay off net1: the probe runs, or found them in use.
func (h *loopHolder) holdsNothing() bool {
	h.mu.Lock()
	probing := h.probing
	h.mu.Unlock()
	return probing || (h.loop != nil && h.loop.Blocked() != "")
}

// Ready implements ha.Readier: a standby claims only once its loop has applied and verified the
// state (Service known, rules and routes in place), so that it never takes traffic it cannot
// forward while another replica could.
func (h *loopHolder) Ready() bool {
	ready, _ := h.loop.Ready()
	return ready
}

// loopLifetime is the loop's AddressLifetime: the kernel lifetime the loop adds the addresses
// with (at a takeover, and when it repairs them), so that they are never on the kernel without
// the fence, not even before the first renewal; 0 without a lease. It is the lifetime Renew puts
// on, for the dead interval last advertised.
func (h *loopHolder) loopLifetime() time.Duration {
	if h.lease <= 0 {
		return 0
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return addressLifetime(h.lease, h.dead)
}

// addressLifetime is the kernel lifetime of the held addresses: the lease, or holdFor and half a
// second (the renewals' period and then some) in whole seconds, whichever is longer.
func addressLifetime(lease, holdFor time.Duration) time.Duration {
	return max(lease, (holdFor + time.Second/2 + time.Second - 1).Truncate(time.Second))
}

// The holder is the election's Leaser: without Renew the type assertion in ha.Run would fail
// silently and the addresses would lapse a second after every takeover.
var _ ha.Leaser = (*loopHolder)(nil)

// The conflict probe needs the peers: without Peer two replicas that took over at once could take
// each other's answers for a host that uses the address, and block for good.
var _ ha.PeerNoter = (*loopHolder)(nil)

// Renew implements ha.Leaser: called with every advert the active sends, it confirms the role
// for announce, and, every quarter of the lease, replaces the addresses with a fresh lifetime.
// (Not at every advert: each replace is a netlink event.) The lifetime is addressLifetime's; a
// longer one, after the election stretched its dead interval on a starved node, is put on at once.
// An error (no netlink socket, net1 gone, an address refused) makes the election step down: the
// lifetime is the fence, and an active that cannot keep it must not hold on. After a successful
// renewal it sends an announcement that announce withheld.
func (h *loopHolder) Renew(holdFor time.Duration) error {
	if err := h.renew(holdFor); err != nil {
		return err
	}
	h.sendWithheld()
	return nil
}

// replaceAddrs puts every held address on the interface with a lifetime of secs seconds, looking
// the interface up when it is not known yet.
func (h *loopHolder) replaceAddrs(secs int) error {
	if h.link == nil {
		link, err := h.nl.LinkByName(h.iface)
		if err != nil {
			return fmt.Errorf("lease: interface %q: %w", h.iface, err)
		}
		h.link = link
	}
	var errs []error
	for _, p := range h.addrs {
		if err := h.renewer.replace(h.link.Attrs().Index, p, secs); err != nil {
			errs = append(errs, fmt.Errorf("lease: %s with lifetime %ds: %w", p, secs, err))
		}
	}
	return errors.Join(errs...)
}

// renew is Renew without the withheld announcement.
func (h *loopHolder) renew(holdFor time.Duration) error {
	h.confirm(true)
	if h.holdsNothing() {
		return nil // nothing on net1 to renew, and nothing may be put there
	}
	h.mu.Lock()
	if holdFor > 0 {
		h.dead = holdFor
	}
	lifetime, now := addressLifetime(h.lease, holdFor), h.now()
	due := h.lease > 0 && (now.Sub(h.renewed) >= h.lease/4 || lifetime > h.lifetime)
	h.mu.Unlock()
	if !due {
		return nil
	}
	if err := h.putAddrs(int(lifetime / time.Second)); err != nil {
		return err // not recorded: the next advert tries again, if the election stays active
	}
	h.mu.Lock()
	h.renewed, h.lifetime = now, lifetime
	h.mu.Unlock()
	return nil
}

// putAddrs puts every held address on net1 with a lifetime of secs seconds (created, or
// replaced), over the netlink sockets kept for it (the package functions open one per call:
// eight sockets a second per active lb pod), opened at the first call. One caller at a time (see
// loopHolder.nl).
func (h *loopHolder) putAddrs(secs int) error {
	if h.nl == nil {
		nl, err := netlink.NewHandle()
		if err != nil {
			return fmt.Errorf("lease: netlink socket: %w", err)
		}
		h.nl = nl
	}
	if h.renewer == nil {
		r, err := newAddrRenewer()
		if err != nil {
			return fmt.Errorf("lease: netlink socket: %w", err)
		}
		h.renewer = r
	}
	cached := h.link != nil
	err := h.replaceAddrs(secs)
	if err != nil && cached {
		h.link = nil // net1 may have been recreated since it was looked up: once more, afresh
		err = h.replaceAddrs(secs)
	}
	return err
}
