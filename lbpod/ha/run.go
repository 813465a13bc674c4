package ha

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Holder is the data path the election drives: SetActive(true) adds the LB addresses to net1 and
// sends the announcement burst; SetActive(false) removes them. Everything else (net1 up, routes,
// rules, NAT) stays installed in both roles, so a takeover is one address add and an announcement.
// SetActive must have taken effect in the kernel when it returns: Run sends the advert that lets
// the previous holder go right after it.
type Holder interface {
	SetActive(active bool)
}

// Leaser is an optional extension of Holder. Renew is called with every advert the active sends
// (each interval), so the holder can keep the addresses on a short kernel lifetime (valid_lft of a
// second or two) renewed by Renew: when this process stops renewing (kill -9 with the pod's
// network namespace left behind, SIGSTOP, a hung process), the kernel itself removes the
// addresses, and the dead replica's kernel stops answering ARP for them. The lifetime must be
// longer than the dead interval, so a live active never loses them between two renewals.
//
// holdFor is how long the standbys wait, at the least, before they may take over (Machine.HoldFor:
// the dead interval as this active advertised it, stretched on a starved node). A lifetime shorter
// than that would drop the addresses of a live but late active with nobody yet allowed to take
// them: the holder keeps the lifetime above it, and treats an active whose last renewal is older
// than it as possibly frozen.
//
// An error means the lifetime could not be renewed: the fence may lapse with the addresses in use,
// or be gone. Run then feeds RenewFailed to the machine: the active releases the addresses and
// resigns (a standby takes over after its skew), logs why and counts it
// (lbpod_ha_lifetime_renewal_failures_total); it does not send the advert it was renewing for.
type Leaser interface {
	Renew(holdFor time.Duration) error
}

// Readier is an optional extension of Holder: Ready says whether the data path could serve the
// addresses now (state applied, Service known). Run checks it at every wake; a standby that is
// not ready does not claim.
type Readier interface {
	Ready() bool
}

// PeerNoter is an optional extension of Holder: Peer is called with the sender of each advert the
// machine accepted from another replica of the group, authenticated when the election has a key
// (Options.Key), on the election's goroutine: it must not block. The sender is that replica's
// net1 MAC (a zero Config.ID is filled so). The conflict probe uses it: when two replicas take
// over at once, the other's announcement, or its ARP reply, reaches this one's probe, and a
// replica of the Service is no host that already uses the address.
type PeerNoter interface {
	Peer(id ID)
}

// Record is the Service's shared record of claims beside the election (cmd/lbpod: the Service's
// Lease): the replica that takes over writes its claim there, and a replica that reads a newer
// claim of another replica there lets go (Superseded), whether or not the underlay carried that
// replica's adverts. The record is not in the failover path: a takeover never waits for it.
type Record interface {
	// Claims delivers the claims the record names, as they change; Run feeds each to the machine
	// (Superseded), which ignores older ones and our own.
	Claims() <-chan Claim
	// Claimed says what this replica holds now: its claim after a takeover, the zero Claim once
	// it lets go. Called on the election's goroutine: it must not block.
	Claimed(c Claim)
	// Superseded says that this replica let go because the record named claim by, which it never
	// heard on the underlay, while it held the addresses with claim held: two replicas held them
	// at once. Called once per such step-down, on the election's goroutine: it must not block.
	Superseded(held, by Claim)
}

// First is an optional source of the Service's first claim (cmd/lbpod: the Lease, with the
// conflict probe before it). A standby at start listens a whole dead interval (three adverts)
// before it claims, for an active it might not hear yet; for a Service created a moment ago there
// is none, and the Service answers that much later. When the record has never named a holder,
// the API server can pick the holder at once instead: every replica offers its first claim, the
// record takes one (optimistic concurrency: one write wins, the others meet a conflict), and only
// its replica is told. Run offers once, after Start, the claim a takeover would make then
// (Machine.NextClaim); Grants delivers it back when the record holds it as the Service's first
// claim, or never. The machine then takes over at once (Granted) unless it has heard another
// replica meanwhile; everything else goes on as without it.
type First interface {
	// Offer is called once, on the election's goroutine: it must not block.
	Offer(c Claim)
	// Grants delivers the offered claim once the record took it.
	Grants() <-chan Claim
}

// Options configure Run.
type Options struct {
	// Interface is net1, the underlay interface the addresses live on.
	Interface string
	// Config is the election. A zero ID is filled with the interface's MAC.
	Config Config
	Log    *slog.Logger
	// Metrics, when not nil, are updated (register them yourself).
	Metrics *Metrics
	// OnChange, when not nil, is called after every change of role, with the reason (to label the
	// pod, record an Event). It runs on the election's goroutine: it must not block.
	OnChange func(role Role, reason string)
	// Key is the Service's shared secret (at least MinKeyLen bytes): every advert is sealed with
	// it (wire version 2), and Config.Authenticated is set. Empty: unauthenticated version-1
	// adverts, as replicas before version 2 sent (logged once as a warning).
	Key []byte
	// Record, when not nil, is the Service's record of claims: the takeovers are written there and
	// its claims fence this replica (see Record).
	Record Record
	// First, when not nil, may grant this replica the Service's first claim (see First).
	First First
	// NoGroupAddress: send to MulticastMAC and listen only there, as replicas before group
	// addresses (Group.MAC) did: for an underlay whose switches pass only that one multicast
	// address. The upgrade tests run the replicas of the release before so.
	NoGroupAddress bool
}

// Run elects among the replicas on Interface until ctx is done, then resigns: if active, it tells
// the standbys and keeps the addresses until a successor advertises or one interval has passed,
// and returns after releasing them (about one interval after ctx is done, at most two).
func Run(ctx context.Context, o Options, holder Holder) error {
	log := o.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ifi, err := net.InterfaceByName(o.Interface)
	if err != nil {
		return fmt.Errorf("ha: interface %q: %w", o.Interface, err)
	}
	cfg := o.Config.withDefaults()
	if cfg.ID == (ID{}) {
		if len(ifi.HardwareAddr) != len(cfg.ID) {
			return fmt.Errorf("ha: interface %q has no MAC to use as the replica ID", o.Interface)
		}
		copy(cfg.ID[:], ifi.HardwareAddr)
	}
	r := &runner{opts: o, cfg: cfg, log: log.With("id", cfg.ID.String(), "group", cfg.Group.String()),
		holder: holder, adverts: make(chan Frame, 64), origin: time.Now(), wall: time.Now,
		buf: make([]byte, 1500), oob: make([]byte, unix.CmsgSpace(int(unsafe.Sizeof(unix.Timespec{}))))}
	if err := r.authenticate(o.Key); err != nil {
		return err
	}
	return r.run(ctx)
}

type runner struct {
	opts    Options
	cfg     Config
	log     *slog.Logger
	holder  Holder
	m       *Machine
	origin  time.Time
	conn    *conn
	adverts chan Frame
	// key, guard and seq authenticate the adverts (nil key: version 1, unauthenticated); wall
	// is the wall clock they use (time.Now), apart from the machine's monotonic one.
	key   *Key
	guard *Guard
	seq   Sequencer
	wall  func() time.Time
	// stopRecv ends the current receive goroutine; linkUp and ready are the last link and
	// readiness states fed to the machine.
	stopRecv context.CancelFunc
	linkUp   bool
	ready    bool
	links    *linkProbe
	buf, oob []byte // for drain
	// drainedAt is the runner's clock when the queue socket was last read to the end (or opened),
	// drainedOff the wall clock's offset from it then: see dating.
	drainedAt  time.Duration
	drainedOff time.Duration
	// refusedSeen: the refusal reasons already logged as a warning (later ones are counted and
	// logged at debug level only: a forger on the underlay must not flood the log).
	refusedSeen map[string]bool
	// oldHeard is when an accepted advert of our wire version last came from another replica
	// (fromPeer) that listens only on MulticastMAC (no flagGroupAddressed), 0 for never (the runner's clock is
	// past 0 at the first advert): until Config.CopyWindow after it, every advert is also sent there
	// (copyToLegacy); copying says whether the last one was.
	oldHeard time.Duration
	copying  bool
	// lostLogged: a deferral for frames lost in the queue socket (Lost) was logged as a warning;
	// later ones are logged at debug level.
	lostLogged bool
}

func (r *runner) now() time.Duration { return time.Since(r.origin) }

// authenticate sets up the sealing and the checks for key (none when empty) and the machine.
func (r *runner) authenticate(secret []byte) error {
	if len(secret) == 0 {
		r.cfg.Authenticated = false
		r.log.Warn("adverts are not authenticated (no key): anyone on the underlay can forge them; wire version 1")
	} else {
		key, err := NewKey(secret)
		if err != nil {
			return fmt.Errorf("ha: %w", err)
		}
		r.cfg.Authenticated = true
		r.key, r.guard = key, NewGuard(r.cfg, key)
		r.log.Info("adverts are authenticated", "replayWindow", r.cfg.ReplayWindow, "legacyWindow", r.cfg.LegacyWindow)
	}
	r.cfg.FirstClaims = r.opts.First != nil
	r.m = NewMachine(r.cfg)
	return nil
}

func (r *runner) run(ctx context.Context) error {
	links, err := newLinkProbe()
	if err != nil {
		return fmt.Errorf("ha: %w", err)
	}
	r.links = links
	defer links.close()
	defer r.closeConn()
	out := r.handle(Event{Kind: Start, Now: r.now()})
	r.linkUp, r.ready = true, true
	out = r.pollLink(out)
	wake := newWaker()
	defer wake.close()
	at := r.origin.Add(out.Wake)
	wake.reset(time.Until(at))
	done := ctx.Done()
	var claims, grants <-chan Claim
	if r.opts.Record != nil {
		claims = r.opts.Record.Claims()
	}
	if r.opts.First != nil {
		r.opts.First.Offer(r.m.NextClaim())
		grants = r.opts.First.Grants()
	}
	var hardStop <-chan time.Time
	for !out.Done {
		select {
		case <-done:
			done = nil
			out = r.handle(Event{Kind: Shutdown, Now: r.now()})
			// The machine lets go after one interval at the latest; this bounds a stuck send.
			hardStop = time.After(2 * r.cfg.Interval)
		case a := <-r.adverts:
			// A standby's queue socket holds what came before.
			out = r.drain(out)
			if !out.Done {
				out = r.received(out, a)
			}
		case c := <-claims:
			out = r.handle(Event{Kind: Superseded, Now: r.now(), Claim: c})
		case c := <-grants:
			grants = nil // offered once, granted at most once
			// As at a wake (a standby that is not ready does not claim, and it learns it is at
			// its wakes only).
			if out = r.upToNow(out); !out.Done {
				out = r.handle(Event{Kind: Granted, Now: r.now(), Claim: c})
			}
		case <-wake.C:
			if early := time.Until(at); early > 0 {
				wake.reset(early) // a fire from before the last reset
				continue
			}
			if out = r.upToNow(out); !out.Done {
				out = r.handle(Event{Kind: Tick, Now: r.now()})
			}
		case <-hardStop:
			if r.m.Role().holds() {
				r.holder.SetActive(false)
			}
			return errors.New("ha: resignation did not finish within two intervals; addresses released")
		}
		if !out.Done && r.m.Verifying() {
			// An active that was frozen reads what the others sent meanwhile before it says
			// anything (Machine.Verifying).
			out = r.drain(out)
			if !out.Done {
				out = r.handle(Event{Kind: Verified, Now: r.now()})
			}
		}
		at = r.origin.Add(out.Wake)
		wake.reset(time.Until(at))
	}
	return nil
}

// upToNow feeds the machine what happened before now, before an input decided as of now (a Tick,
// a grant): the adverts first, since they came before now, then the link's or readiness's change
// (pollLink), which is fed as of now, after which the machine would take the adverts as of now.
func (r *runner) upToNow(out Output) Output {
	if out = r.drain(out); out.Done {
		return out
	}
	return r.pollLink(out)
}

// drain feeds the adverts waiting in the queue socket (conn), dated when the kernel received them,
// and the resignations already waiting, in the channel and in the socket, at every wake before the
// machine decides anything: a standby at its deadline learns only now of the adverts that moved it,
// and after a stall (a starved CPU) the timer and the sockets are ready at once: without this, a
// standby would take over from an active whose adverts it has received but not read. The queue is
// read to the end (up to maxQueued); a read that missed frames is told to the machine (Lost),
// which then defers a due claim and has the adverts read at once (Machine.Queueing).
func (r *runner) drain(out Output) Output {
	var waiting []Frame
	for more := true; more; {
		select {
		case a := <-r.adverts:
			waiting = append(waiting, a)
		default:
			more = false
		}
	}
	if r.conn == nil {
		for _, a := range waiting {
			out = r.received(out, a)
		}
		return out
	}
	queued, complete := r.conn.queued(r.buf, r.oob, maxQueued)
	if r.m.ClaimDue(r.now()) || r.m.Verifying() {
		// What the receiving goroutine has not read yet, when it matters (a claim, or an active
		// that was frozen): after a stall the timer and the socket are ready at once.
		waiting = append(waiting, r.conn.pending(r.buf, 64)...)
	}
	dated := r.dating(r.now(), r.wall())
	for _, q := range queued {
		out = r.feed(out, q.f, dated(q.at))
	}
	if !complete && !out.Done {
		// After the frames read: they came before the loss was seen, and before the claim
		// that the loss must defer (Lost).
		if r.opts.Metrics != nil {
			r.opts.Metrics.QueueLosses.Inc()
		}
		out = r.handle(Event{Kind: Lost, Now: r.now()})
	}
	for _, a := range waiting {
		out = r.received(out, a)
	}
	return out
}

// dating notes a read of the queue socket to the end at now (wall: the wall clock then) and
// returns when a frame of that read stamped by the kernel at at was received, on the runner's
// clock: never before the socket's previous read (it was not there then), never after now; now
// itself when there is no stamp or the wall clock stepped since that read (it kept pace with the
// monotonic clock within a millisecond, where a slewing clock drifts by at most half a
// millisecond a second). The kernel stamps with the wall clock, and a step of it (NTP, an admin)
// in between would misdate the frames. Dating late only delays a takeover; early could make a
// standby claim from a live active, so every doubt dates late.
func (r *runner) dating(now time.Duration, wall time.Time) func(at time.Time) time.Duration {
	off := time.Duration(wall.UnixNano()) - now
	step, since := off-r.drainedOff, r.drainedAt
	r.drainedAt, r.drainedOff = now, off
	trusted := step <= time.Millisecond && step >= -time.Millisecond
	return func(at time.Time) time.Duration {
		if at.IsZero() || !trusted {
			return now
		}
		return min(max(now-wall.Sub(at), since), now)
	}
}

// received feeds an advert read just now, after polling the readiness (see pollReady).
func (r *runner) received(out Output, f Frame) Output {
	if out = r.pollReady(out); out.Done {
		return out
	}
	return r.feed(out, f, r.now())
}

// feed counts one advert, checks it (Guard.Open: a refused one goes no further) and feeds it to
// the machine as received at (the runner's clock). A replica without a key drops version-2 frames
// unread, as replicas before version 2 do (their socket filter).
func (r *runner) feed(out Output, f Frame, at time.Duration) Output {
	var authenticated bool
	if out.Done || r.guard == nil && f.Version != advertVersion {
		return out
	}
	if r.opts.Metrics != nil {
		r.opts.Metrics.AdvertsReceived.Inc()
	}
	if r.guard != nil {
		var why string
		if authenticated, why = r.guard.Open(f, r.wall()); why != "" {
			r.refused(f.Advert, why)
			return out
		}
	}
	ev := Event{Kind: Received, Now: at, Advert: f.Advert, Authenticated: authenticated}
	// Only an advert the machine accepts from another replica counts: the guard passes frames
	// with our own ID (or another group) on unverified, for the machine to ignore, and one forged
	// so with a garbage tag turned the copies on, each advert copied to every lb pod of every node
	// for the window. Noted before the machine handles it (its refuse is what Handle checks
	// first), so that an answer it sends at once (an active that wins) reaches the old replica too.
	if !f.GroupAddressed && f.Version == r.sendVersion() && r.fromPeer(ev) && r.m.refuse(ev) == "" {
		r.oldHeard = at
	}
	return r.handle(ev)
}

// fromPeer says whether ev is an advert of another replica of our group whose sender we can
// believe: authenticated when the election has a key (anyone can put any sender in a frame that
// is not), any one without a key.
func (r *runner) fromPeer(ev Event) bool {
	return ev.Kind == Received && ev.Advert.Group == r.cfg.Group && ev.Advert.Sender != r.cfg.ID &&
		(ev.Authenticated || r.guard == nil)
}

// sendVersion is the wire version this replica sends: 2 with a key, 1 without.
func (r *runner) sendVersion() uint8 {
	if r.key != nil {
		return authVersion
	}
	return advertVersion
}

// copyToLegacy says whether adverts also go to MulticastMAC now: within Config.CopyWindow of the
// last advert heard from a replica that listens only there (an upgrade from the release before
// group addresses: its standbys must keep hearing the active, or they claim), whatever
// Config.LegacyWindow says (CopyWindow says why). Its first and last copies are logged.
func (r *runner) copyToLegacy() bool {
	on := !r.opts.NoGroupAddress && r.oldHeard > 0 && r.now() < r.oldHeard+r.cfg.CopyWindow
	if on != r.copying {
		r.copying = on
		if on {
			r.log.Info("a replica that listens only on the shared multicast address is in the group: adverts also go there", "address", MulticastMAC.String(), "for", r.cfg.CopyWindow)
		} else {
			r.log.Info("no replica that listens only on the shared multicast address heard lately: adverts go to the group's address only", "address", r.cfg.Group.MAC().String())
		}
	}
	return on
}

// pollLink feeds LinkDown/LinkUp when net1's carrier changed, and (re)opens the socket when net1
// is (back) up or was recreated with another index; then it polls the holder's readiness. It runs
// at every wake: an active notices a cut link within one interval, a standby at the latest at its
// deadline, before it would claim.
func (r *runner) pollLink(out Output) Output {
	index, up := r.links.state(r.opts.Interface)
	if up && r.conn != nil && r.conn.ifindex != index {
		r.closeConn() // net1 was recreated: the socket is bound to the old one
	}
	if up && r.conn == nil {
		if err := r.openConn(); err != nil {
			r.log.Warn("advert socket", "err", err)
			up = false
		}
	}
	switch {
	case up && !r.linkUp:
		r.linkUp = true
		out = r.handle(Event{Kind: LinkUp, Now: r.now()})
	case !up && r.linkUp:
		r.linkUp = false
		r.closeConn()
		out = r.handle(Event{Kind: LinkDown, Now: r.now()})
	}
	return r.pollReady(out)
}

// pollReady feeds NotReady/Ready when the holder's readiness changed. It runs at every wake and
// before every advert is handled, so that a standby that became ready just before a resignation
// takes over after its skew, not at its next wake.
func (r *runner) pollReady(out Output) Output {
	if rd, ok := r.holder.(Readier); ok && !out.Done {
		switch ready := rd.Ready(); {
		case ready && !r.ready:
			r.ready = true
			out = r.handle(Event{Kind: Ready, Now: r.now()})
		case !ready && r.ready:
			r.ready = false
			out = r.handle(Event{Kind: NotReady, Now: r.now()})
		}
	}
	return out
}

func (r *runner) openConn() error {
	maxVersion := uint8(advertVersion)
	if r.key != nil {
		maxVersion = authVersion
	}
	c, err := listen(r.opts.Interface, r.cfg.Group, maxVersion, !r.opts.NoGroupAddress)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.conn, r.stopRecv = c, cancel
	r.dating(r.now(), r.wall()) // the socket is empty when opened: its first read dates from here
	r.queueFor()
	go r.receive(ctx, c)
	return nil
}

func (r *runner) closeConn() {
	if r.conn == nil {
		return
	}
	r.stopRecv()
	r.conn.close()
	r.conn = nil
}

// receive forwards the adverts of c until ctx is done or c is closed (a standby's resignations
// only: the others wait in the queue socket, see drain).
func (r *runner) receive(ctx context.Context, c *conn) {
	buf := make([]byte, 1500)
	for ctx.Err() == nil {
		f, err := c.recv(buf)
		if errors.Is(err, errNotAdvert) {
			continue // the filter keeps these out; a kernel without it lets them through
		}
		if err != nil {
			if ctx.Err() == nil {
				r.log.Warn("advert receive", "err", err)
			}
			return
		}
		select {
		case r.adverts <- f:
		case <-ctx.Done():
			return
		}
	}
}

// handle feeds one event to the machine and carries out its output: the holder first, then the
// advert (so a successor's advert is only sent once it holds the addresses). An active's advert
// goes out only once the holder renewed the addresses' lifetime (Leaser); when that fails, the
// advert is not sent and the machine is told (RenewFailed), and handle returns what it said.
func (r *runner) handle(ev Event) Output {
	before, held := r.m.Role(), r.m.Claim()
	out := r.m.Handle(ev)
	if out.Refused != "" {
		r.refused(ev.Advert, out.Refused)
		return out
	}
	if p, ok := r.holder.(PeerNoter); ok && r.fromPeer(ev) {
		p.Peer(ev.Advert.Sender)
	}
	switch out.Hold {
	case Take:
		r.holder.SetActive(true)
	case Release:
		r.holder.SetActive(false)
	}
	var renewErr error
	if out.Send != nil {
		if l, ok := r.holder.(Leaser); ok && out.Role == Active {
			renewErr = l.Renew(r.m.HoldFor())
		}
		if renewErr == nil {
			r.sendAdvert(*out.Send)
		}
	}
	r.report(ev, before, out)
	r.record(held, out)
	r.queueFor()
	if renewErr != nil {
		if r.opts.Metrics != nil {
			r.opts.Metrics.RenewalFailures.Inc()
		}
		r.log.Warn("the addresses' kernel lifetime could not be renewed; stepping down", "err", renewErr)
		return r.handle(Event{Kind: RenewFailed, Now: r.now()})
	}
	return out
}

// queueFor lets a standby's adverts wait in the queue socket until it wakes, and has any other
// role, or a standby that lost frames there, read them at once (Machine.Queueing,
// conn.setQueueing, which does nothing when that does not change). If the filters cannot be
// changed, the socket is closed and reopened at the next wake (pollLink).
func (r *runner) queueFor() {
	if r.conn == nil {
		return
	}
	if err := r.conn.setQueueing(r.m.Queueing()); err != nil {
		r.log.Warn("advert socket", "err", err)
		r.closeConn()
	}
}

// refused counts an advert the machine or the guard refused; the first of each reason is a
// warning.
func (r *runner) refused(a Advert, why string) {
	if r.opts.Metrics != nil {
		r.opts.Metrics.AdvertsRejected.WithLabelValues(why).Inc()
	}
	attrs := []any{"reason", why, "sender", a.Sender.String(), "term", a.Term, "interval", a.Interval, "priority", a.Priority, "resigning", a.Resigning}
	if r.refusedSeen[why] {
		r.log.Debug("advert refused", attrs...)
		return
	}
	if r.refusedSeen == nil {
		r.refusedSeen = map[string]bool{}
	}
	r.refusedSeen[why] = true
	r.log.Warn("advert refused; further ones are counted in lbpod_ha_adverts_rejected_total", attrs...)
}

// report updates the metrics, logs a change and tells OnChange about a new role.
func (r *runner) report(ev Event, before Role, out Output) {
	mt := r.opts.Metrics
	if mt != nil {
		mt.Term.Set(float64(r.m.Term()))
		mt.Slack.Set(r.m.Slack().Seconds())
		if out.Role.holds() {
			mt.Active.Set(1)
		} else {
			mt.Active.Set(0)
		}
		if out.Failover > 0 {
			mt.LastFailover.Set(out.Failover.Seconds())
		}
	}
	if out.Role != before || out.Reason != "" {
		attrs := []any{"event", ev.Kind.String(), "role", out.Role.String(), "term", r.m.Term(), "reason", out.Reason}
		if out.Failover > 0 {
			attrs = append(attrs, "failover", out.Failover.Round(time.Millisecond))
		}
		switch {
		case ev.Kind != Lost:
			r.log.Info("ha", attrs...)
		case r.lostLogged:
			// A flood that lasts defers a claim about once per dead interval: counted in
			// lbpod_ha_queue_losses_total, not logged each time.
			r.log.Debug("ha", attrs...)
		default:
			r.lostLogged = true
			r.log.Warn("ha: adverts lost in the queue socket; further losses are counted in lbpod_ha_queue_losses_total", attrs...)
		}
	}
	if out.Role != before && mt != nil {
		mt.Transitions.WithLabelValues(out.Role.String()).Inc()
	}
	// The first role (standby, at Start) is reported too, so the caller can label the pod.
	if out.Role != before || ev.Kind == Start {
		if r.opts.OnChange != nil {
			r.opts.OnChange(out.Role, out.Reason)
		}
	}
}

// record tells the Record what this replica holds after an output, and about a step-down on the
// record's claim (held is our claim before the event).
func (r *runner) record(held Claim, out Output) {
	rec := r.opts.Record
	if rec == nil {
		return
	}
	if out.Superseded != nil {
		if r.opts.Metrics != nil {
			r.opts.Metrics.Superseded.Inc()
		}
		rec.Superseded(held, *out.Superseded)
	}
	if now := r.m.Claim(); now != held {
		rec.Claimed(now)
	}
}

// sendAdvert sends a to the group's address and, while copyToLegacy, a copy (its own sequence
// number, flagLegacyCopy) to MulticastMAC.
func (r *runner) sendAdvert(a Advert) {
	var flags byte
	if !r.opts.NoGroupAddress {
		flags = flagGroupAddressed
	}
	frame := func(flags byte) []byte {
		if r.key != nil {
			return r.key.seal(a, r.seq.Next(r.wall(), r.cfg.ReplayWindow), flags)
		}
		return a.marshal(flags)
	}
	var err error
	if r.conn == nil {
		err = errors.New("no socket (net1 down)")
	} else if err = r.conn.send(frame(flags), false); err == nil && r.copyToLegacy() {
		err = r.conn.send(frame(flags|flagLegacyCopy), true)
	}
	mt := r.opts.Metrics
	if err != nil {
		if mt != nil {
			mt.SendErrors.Inc()
		}
		r.log.Debug("advert not sent", "err", err)
		return
	}
	if mt != nil {
		mt.AdvertsSent.Inc()
	}
}
