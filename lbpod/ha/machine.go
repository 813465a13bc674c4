package ha

import (
	"fmt"
	"hash/fnv"
	"math"
	"time"
)

// Role is what a replica does with the LB addresses.
type Role uint8

const (
	// Standby: net1 up with every route and rule, no LB address; listens for adverts.
	Standby Role = iota
	// Active: holds the addresses, answers ARP/NDP, multicasts an advert every interval.
	Active
	// Resigning: shutting down while still active; has told the standbys and keeps the addresses
	// until a new active advertises or one interval has passed, so a planned move loses nothing.
	Resigning
	// Stopped: done; holds nothing.
	Stopped
)

func (r Role) String() string {
	switch r {
	case Standby:
		return "standby"
	case Active:
		return "active"
	case Resigning:
		return "resigning"
	case Stopped:
		return "stopped"
	}
	return fmt.Sprintf("role(%d)", uint8(r))
}

// holds says whether the role keeps the addresses on net1.
func (r Role) holds() bool { return r == Active || r == Resigning }

// Config is one replica's election settings.
type Config struct {
	ID       ID
	Group    Group
	Priority uint8
	// Interval between adverts; DefaultInterval when zero.
	Interval time.Duration
	// DeadAdverts: adverts missed before a standby takes over; DefaultDeadAdverts when zero.
	DeadAdverts int
	// Preempt: a standby with a higher priority than the active takes over. Off by default, as in
	// VRRP practice: a move costs announcements and a possible lost packet, for nothing gained.
	Preempt bool
	// MaxSlack bounds how far the dead interval stretches after this replica, or the active it
	// listens to, was seen late (see Machine.Slack); DefaultMaxSlack when zero, never stretched
	// when negative.
	MaxSlack time.Duration
	// MinPeerInterval and MaxPeerInterval bound the interval an advert of another replica may
	// carry: an advert outside them is refused (Output.Refused). Zero: derived from Interval, see
	// peerIntervals.
	MinPeerInterval, MaxPeerInterval time.Duration
	// Authenticated: the replicas share a key (Run sets it from Options.Key), so adverts must
	// come authenticated (Event.Authenticated, wire version 2). An unauthenticated one is refused
	// (RefusedUnauthenticated), except while legacyOpen: an upgrade from replicas without a key.
	Authenticated bool
	// LegacyWindow: how long after its start a replica with a key still accepts unauthenticated
	// adverts, as long as it has heard no authenticated one and has never been active (see
	// legacyOpen); 0: never. DefaultLegacyWindow is the flag's default.
	LegacyWindow time.Duration
	// CopyWindow: how long after the last advert of a replica that listens only on MulticastMAC
	// adverts are also copied there (runner.copyToLegacy); 0: never. Not LegacyWindow: that one
	// bounds how long unauthenticated adverts are believed, and the operator sets it to 0 unless a
	// Deployment still runs lb pods from before authenticated adverts, but lb pods from after them
	// and before group addresses carry the same wire label, so a Deployment rolling from those
	// gets 0 too. The copies start only with an authenticated advert (a forger cannot start them)
	// and cost one frame per advert. DefaultCopyWindow is the flag's default.
	CopyWindow time.Duration
	// ReplayWindow: how far an authenticated advert's sequence (the sender's wall clock) may lie
	// from ours (Guard); DefaultReplayWindow when zero.
	ReplayWindow time.Duration
	// SupersededBackoff is how long a replica that was superseded through the record (Superseded:
	// it held the addresses while another replica claimed them, and neither heard the other)
	// waits, beyond the dead interval, before it may claim again; it doubles at each such step
	// down up to MaxSupersededBackoff, and ends when the replica hears an advert (with
	// Authenticated, an authenticated one: a forged version-1 frame must not end it). Zero: the
	// defaults; negative: none.
	SupersededBackoff, MaxSupersededBackoff time.Duration
	// FirstClaims: the record may grant the Service's first claim (Granted; Run sets it when
	// Options.First is set). Term 1 is then that claim's alone, and a takeover starts at term 2
	// (see takeOver).
	FirstClaims bool
}

// Defaults: 100 ms adverts and 3 missed ones make a 300 ms dead interval (plus skew), the VRRP
// figures that move an address in well under a second.
const (
	DefaultInterval    = 100 * time.Millisecond
	DefaultDeadAdverts = 3
	DefaultPriority    = 100
	// DefaultMaxSlack: a starved node stretches the dead interval to at most 3.3 s. Past that
	// the replicas take over from each other again (each takeover is one Lease write), which is
	// the honest answer to a node that cannot run a process for seconds at a time.
	DefaultMaxSlack = 3 * time.Second
	// DefaultSupersededBackoff and DefaultMaxSupersededBackoff: see Config.SupersededBackoff.
	// When adverts are lost between two replicas (a switch that drops the EtherType, a one-way
	// link), the one superseded through the record cannot hear the holder either, so after the
	// dead interval it would claim again, supersede the other, and so on: each round moves the
	// clients and costs two record writes (the claim, and the superseded replica's note). Two
	// rounds a minute at most keep the record under five writes a minute, so the first wait is
	// 30 s (with 1 s doubling the first minute would see six rounds per replica, about 24
	// writes). The cap bounds the price: an active that really dies while adverts are still
	// lost is replaced within the dead interval plus at most 2 minutes, not 0.3 s. On a healthy
	// L2 nobody is superseded through the record, and failover is unchanged.
	DefaultSupersededBackoff    = 30 * time.Second
	DefaultMaxSupersededBackoff = 2 * time.Minute
)

// Slack tuning. A gap is late when it exceeds the interval by more than lateAfter of an interval
// (timer jitter of a few milliseconds is not starvation); the slack then becomes twice the
// lateness, so the same gap once more is absorbed with room to spare; it decays by one
// slackDecay-th of the time that passes, so a single 1 s stall is forgotten in about 40 s.
const (
	lateAfter  = 4 // a quarter interval
	slackDecay = 20
)

func (c Config) withDefaults() Config {
	if c.Interval <= 0 {
		c.Interval = DefaultInterval
	}
	c.Interval = min(c.Interval, MaxInterval)
	if c.DeadAdverts <= 0 {
		c.DeadAdverts = DefaultDeadAdverts
	}
	if c.MaxSlack == 0 {
		c.MaxSlack = DefaultMaxSlack
	}
	if c.ReplayWindow <= 0 {
		c.ReplayWindow = DefaultReplayWindow
	}
	if c.SupersededBackoff == 0 {
		c.SupersededBackoff = DefaultSupersededBackoff
	}
	if c.MaxSupersededBackoff == 0 {
		c.MaxSupersededBackoff = DefaultMaxSupersededBackoff
	}
	c.MaxSupersededBackoff = max(c.MaxSupersededBackoff, c.SupersededBackoff)
	lo, hi := c.peerIntervals()
	if c.MinPeerInterval <= 0 {
		c.MinPeerInterval = lo
	}
	if c.MaxPeerInterval <= 0 {
		c.MaxPeerInterval = hi
	}
	return c
}

// The advert intervals the operator may give a Service's replicas (--lb-ha-interval; cmd/operator
// refuses others).
const (
	MinConfigInterval = 10 * time.Millisecond
	MaxConfigInterval = time.Second
)

// peerIntervals is the default range of the intervals accepted in another replica's advert. The
// interval sets how long the standbys wait for the active (DeadAdverts of them), so a frame with
// the longest interval the wire carries (65.535 s) would keep every replica waiting over three
// minutes; the range keeps out what no replica of this Service can send.
//
// Every replica of a Service runs the same Deployment, so normally all carry the same interval.
// But a rollout that changes --lb-ha-interval runs old and new pods side by side (maxSurge 1,
// maxUnavailable 0), and they must accept each other's adverts: a replica that refuses its
// rival's adverts never hears it win, so two holders with the same term would keep the addresses
// both until the rollout ends. A window relative to our own interval (say own/4 to 4 × own) would
// refuse the other generation after a change by more than 4×, which the operator allows (10 ms to
// 1 s). So the window is the operator's whole range, and our own interval in case lbpod runs
// with one outside it:
//   - at least min(own, MinConfigInterval) in whole milliseconds (the wire's unit: an interval
//     under a millisecond is carried as 0);
//   - at most max(own, MaxConfigInterval) plus what an active on a starved node adds to it (its
//     slack spread over the dead adverts, at most DefaultMaxSlack/DeadAdverts, rounded up to the
//     millisecond; neither is a flag, so every replica has the same), and at most MaxInterval.
//
// With the defaults that is 10 ms to 2 s: a refused frame can no longer stretch the wait, and
// the longest a plausible one can make the standbys wait is 3 × 2 s.
func (c Config) peerIntervals() (lo, hi time.Duration) {
	lo = min(c.Interval, MinConfigInterval).Truncate(time.Millisecond)
	d := time.Duration(c.DeadAdverts)
	stretch := (max(c.MaxSlack, DefaultMaxSlack) + d - 1) / d
	hi = max(c.Interval, MaxConfigInterval) + stretch + time.Millisecond - 1
	return lo, min(hi.Truncate(time.Millisecond), MaxInterval)
}

// MaxTerm is the highest term a replica takes or accepts. Terms grow by one per takeover from 1,
// so no honest replica comes near it; an advert above it is refused, and a takeover at it stays
// at it (saturating), so a term never wraps to 0 and loses to every older one.
const MaxTerm = math.MaxInt64

// nextTerm is the term after t, saturating at MaxTerm.
func nextTerm(t uint64) uint64 {
	if t >= MaxTerm {
		return MaxTerm
	}
	return t + 1
}

// Why an advert is refused (Output.Refused, and the reason label of
// lbpod_ha_adverts_rejected_total).
const (
	// RefusedInterval: the interval is outside [MinPeerInterval, MaxPeerInterval].
	RefusedInterval = "interval"
	// RefusedTerm: the term is above MaxTerm, one no replica reaches and whose successor wraps.
	RefusedTerm = "term"
	// RefusedSender: the sender ID is zero or a group MAC, which no net1 has.
	RefusedSender = "sender"
	// RefusedUnauthenticated: an unauthenticated (version 1) advert where an authenticated one is
	// required (Config.Authenticated), outside the legacy window.
	RefusedUnauthenticated = "unauthenticated"
)

// RefusalReasons lists every reason, for the metric's label values (RefusedAuth, RefusedReplay
// and RefusedStale are the Guard's).
var RefusalReasons = []string{RefusedInterval, RefusedTerm, RefusedSender, RefusedUnauthenticated, RefusedAuth, RefusedReplay, RefusedStale}

// EventKind says what happened.
type EventKind uint8

const (
	// Start: the process began. Whatever an earlier incarnation left on net1 is released, and the
	// replica listens for one dead interval before it may claim: a restart never preempts.
	Start EventKind = iota + 1
	// Tick: the wake time the last Output asked for has come (or any time earlier).
	Tick
	// Received: an advert of our group from another replica.
	Received
	// Shutdown: SIGTERM. An active resigns; a standby stops at once.
	Shutdown
	// LinkDown and LinkUp: net1 lost or regained its carrier. An active that cannot reach the
	// underlay gives the addresses up at once, so that it comes back as a standby, not as a rival.
	LinkDown
	LinkUp
	// NotReady and Ready: the replica's data path cannot (or can again) serve the addresses: its
	// rules are not installed yet, its Service is unknown. A standby that is not ready does not
	// claim, so a ready one can; an active is not made to step down by it (a passing error in
	// the data path should not cost a failover).
	NotReady
	Ready
	// RenewFailed: the holder could not renew the addresses' kernel lifetime (Leaser). The
	// lifetime is the fence that removes the addresses from a kernel whose process died or
	// froze; an active that cannot keep it steps down: it releases the addresses at once, sends
	// a resigning advert so that a standby takes over after its skew, and listens as a standby.
	RenewFailed
	// Superseded: the Service's record (the Lease, cmd/lbpod) names Event.Claim, another
	// replica's claim. It is treated like hearing that replica's advert, across an underlay that
	// may have lost it: every replica learns the term (its next claim is newer); an active or a
	// resigning replica whose own claim is older lets go at once, without announcing. An active
	// that lets go this way never heard the winner, so the two held the addresses at once: the
	// output says so (Output.Superseded), and it waits SupersededBackoff more before its next
	// claim, since it cannot hear the holder it would take the addresses from. Except an active
	// that took over before the record named any claim to it (the API server unreachable at its
	// start): it did not know the term it had to pass, so it takes the next one and keeps the
	// addresses, once per process (see superseded).
	Superseded
	// Verified: every advert that was waiting when the machine said Verifying (in the runner's
	// channel and in the socket) has been fed to it. An active that was frozen and heard no
	// newer claim among them keeps the addresses and advertises at once.
	Verified
	// Granted: the Service's record took Event.Claim, this replica's NextClaim, as the Service's
	// first: it had never named a holder, and the API server accepts one such write only (First,
	// cmd/lbpod). No replica had held the addresses when the write landed (a takeover at the dead
	// interval may race it: term 1 is the grant's, Config.FirstClaims, so such a takeover is
	// newer), so a standby that started, may claim, and has heard no other replica (neither an
	// advert nor a claim in the record) takes over at once instead of after the dead interval: a
	// new Service answers three adverts sooner. Anything else ignores it (the dead interval
	// decides, as without a record).
	Granted
	// Lost: the runner's read of the queue socket was incomplete: the kernel dropped frames since
	// the last read (the socket's buffer was full: a flood of frames that pass the socket filter,
	// which anyone can make, since the group is derived from the public LB addresses), or the read
	// stopped at its cap. An advert of a live active may be among them, so what the standby knows
	// is not what was sent: a standby whose claim would be due must not take over on it. It defers
	// its claim to one dead interval (and its skew) from now and reads every advert at once
	// meanwhile (Queueing is false), as a holder does; once per advert heard (see lost).
	Lost
)

func (k EventKind) String() string {
	switch k {
	case Start:
		return "start"
	case Tick:
		return "tick"
	case Received:
		return "received"
	case Shutdown:
		return "shutdown"
	case LinkDown:
		return "link-down"
	case LinkUp:
		return "link-up"
	case NotReady:
		return "not-ready"
	case Ready:
		return "ready"
	case RenewFailed:
		return "renew-failed"
	case Superseded:
		return "superseded"
	case Verified:
		return "verified"
	case Granted:
		return "granted"
	case Lost:
		return "lost"
	}
	return fmt.Sprintf("event(%d)", uint8(k))
}

// Event is one input. Now is a monotonic clock reading (any fixed origin): the machine never reads
// a clock itself, so tests are exact.
type Event struct {
	Kind   EventKind
	Now    time.Duration
	Advert Advert // Received only
	// Authenticated (Received only): the advert's tag and sequence verified (Guard.Open).
	Authenticated bool
	Claim         Claim // Superseded and Granted only
}

// Hold is the change the caller applies to net1.
type Hold uint8

const (
	// Keep: no change.
	Keep Hold = iota
	// Take: add the addresses and send the announcement burst.
	Take
	// Release: remove the addresses.
	Release
)

func (h Hold) String() string {
	switch h {
	case Keep:
		return "keep"
	case Take:
		return "take"
	case Release:
		return "release"
	}
	return fmt.Sprintf("hold(%d)", uint8(h))
}

// Output is what the caller does after an event, in this order: Hold, then Send.
type Output struct {
	Hold Hold
	// Send, when not nil, is multicast on net1.
	Send *Advert
	// Role after the event.
	Role Role
	// Wake is when the machine wants the next Tick (same clock as Event.Now): an active's next
	// advert, a standby's deadline. An input that comes later than it is lateness, and lateness
	// beyond the dead interval means the process was frozen (SIGSTOP, a paused VM, CPU
	// starvation), not idle.
	Wake time.Duration
	// Reason says why Hold or Role changed, for the log and the Event; empty when nothing did.
	Reason string
	// Failover is set on a takeover that followed an active's silence or resignation: from the
	// last advert heard from it to now.
	Failover time.Duration
	// Done: stopped; the caller may exit.
	Done bool
	// Refused is set when the event was an advert the machine refused, to the reason
	// (RefusalReasons): one that no replica of this Service can send. A refused advert changes
	// nothing at all (not even the clock the machine last saw), and the output repeats the role
	// and wake time of the last one.
	Refused string
	// Superseded is set when an active let go because the record named this newer claim of
	// another replica, which it had not heard on the underlay: the two held the addresses at the
	// same time, from that claim until now (the caller reports it once).
	Superseded *Claim
}

// Machine is one replica's election state. It is a pure function of the events fed to it.
type Machine struct {
	cfg     Config
	role    Role
	started bool
	lastNow time.Duration
	// term is ours while we hold; maxTerm the highest seen in the group.
	term, maxTerm uint64
	linkDown      bool
	notReady      bool
	// deadline: a standby takes over at this time unless it hears an active first.
	deadline time.Duration
	// listenFrom: when this standby last began to listen (listen).
	listenFrom time.Duration
	// peerInterval: the active's advertised interval, which sets our dead interval.
	peerInterval time.Duration
	// lastHeard: the last advert (or resignation) from an active, for the failover figure.
	lastHeard   time.Duration
	heardActive bool
	// resigned: the last advert heard was a resignation (for the reason of the takeover).
	resigned bool
	// nextAdvert: an active's (or a resigning one's) next send; resignUntil: when a resigning
	// replica lets go even without having heard its successor.
	nextAdvert, resignUntil time.Duration
	// slack stretches the dead interval after lateness was seen (see Slack).
	slack time.Duration
	// wakeAt is the wake time the last Output asked for: an input later than it is lateness.
	wakeAt time.Duration
	// heardFrom and heardAt: the sender and time of the last advert heard (a resignation only when
	// acted on): the active we follow, whose resignation alone moves our deadline, and the gap to
	// its next advert.
	heardFrom ID
	heardAt   time.Duration
	// recordedOther: the record named another replica's claim (Superseded) since start.
	recordedOther bool
	// recordSeen: the record has named a claim (Superseded, our own included) or granted ours
	// (Granted) since start. An active that has seen none took over blind: see superseded.
	recordSeen bool
	// sentAt and sent: when our last advert went out and the interval it carried; prevSent the
	// one before (a standby that missed the last one goes by it).
	sentAt          time.Duration
	sent, prevSent  time.Duration
	sentSinceActive bool
	// startedAt, heardAuth and everActive decide whether the legacy window is open (legacyOpen).
	startedAt             time.Duration
	heardAuth, everActive bool
	// backoff is added to a standby's wait since it was superseded through the record without
	// hearing the winner (SupersededBackoff, doubling); 0 once it hears an advert (an
	// authenticated one when Config.Authenticated).
	backoff time.Duration
	// verifying: an active found it was frozen (frozenFor) and waits, holding but silent, for
	// the adverts queued meanwhile (Verifying, Verified); frozenGap is how long it was frozen.
	verifying bool
	frozenGap time.Duration
	// deferred: this standby deferred its claim for frames lost in its queue (Lost) and has heard
	// no advert since: it reads at once (Queueing), and a further Lost defers nothing.
	deferred bool
}

// Queueing says whether the adverts other than resignations may wait in the runner's queue socket
// until the next wake: for a standby, unless it deferred its claim for frames lost there (Lost):
// it then reads each advert as it comes, so that the one dead interval it waits is heard whole.
func (m *Machine) Queueing() bool { return m.role == Standby && !m.deferred }

// Verifying says that the machine, an active that was frozen, waits for every advert already
// waiting to be fed to it (in the order they came), then Verified. Meanwhile it holds the
// addresses and sends nothing: a replica that took over during the freeze has advertised its
// newer term by now, and hearing it makes this one let go as any active would; if none did (the
// other replicas are gone, or as starved), keeping the addresses costs no failover.
func (m *Machine) Verifying() bool { return m.verifying }

// NewMachine returns a machine for cfg; feed it Start first.
func NewMachine(cfg Config) *Machine {
	return &Machine{cfg: cfg.withDefaults()}
}

// Role is the current role.
func (m *Machine) Role() Role { return m.role }

// Claim is this replica's claim while it holds the addresses (term, priority, ID), else the zero
// Claim.
func (m *Machine) Claim() Claim {
	if !m.role.holds() {
		return Claim{}
	}
	return Claim{Term: m.term, Priority: m.cfg.Priority, Sender: m.cfg.ID}
}

// NextClaim is the claim a takeover would make now: the next term after the highest seen. The
// runner offers it to the record as the Service's first claim (Granted).
func (m *Machine) NextClaim() Claim {
	return Claim{Term: nextTerm(m.maxTerm), Priority: m.cfg.Priority, Sender: m.cfg.ID}
}

// Backoff is the wait added to this replica's next claim since it was superseded through the
// record without hearing the winner (see Config.SupersededBackoff); 0 normally.
func (m *Machine) Backoff() time.Duration { return m.backoff }

// Term is the current term while holding, else the highest term seen.
func (m *Machine) Term() uint64 {
	if m.role.holds() {
		return m.term
	}
	return m.maxTerm
}

// deadInterval is how long a standby waits without an advert before it considers the active
// gone: the dead adverts at the active's advertised interval (which carries the active's own
// slack), plus our slack (our own lateness, and the gaps we saw between the active's adverts).
func (m *Machine) deadInterval() time.Duration {
	iv := m.cfg.Interval
	if m.peerInterval > iv {
		iv = m.peerInterval
	}
	return time.Duration(m.cfg.DeadAdverts)*iv + m.slack
}

// Slack is how much the dead interval is stretched now. The fixed VRRP figures assume a replica
// runs within a fraction of the interval; on a starved node (hundreds of pods on two cores, a
// noisy neighbour) an active that cannot run for 400 ms would be replaced by a standby that is
// just as starved, the two would take turns, and every turn costs announcements and a Lease
// write. So every replica measures lateness: its own (how long after the wake time it asked for an
// input came) and, as a standby, the gaps between the active's adverts beyond the interval.
// The active advertises a longer interval by its slack, so the standbys wait longer for it; a
// standby adds its own slack to its wait. Slack decays as time passes, so failover returns to
// its sub-second figure once the node is calm. Safety is unchanged: the active steps down when it
// was frozen for longer than the shortest dead interval it advertised lately.
func (m *Machine) Slack() time.Duration { return m.slack }

// advertisedInterval is what an active puts in its adverts: its interval plus its slack spread
// over the dead adverts, in whole milliseconds rounded up (the wire's unit).
func (m *Machine) advertisedInterval() time.Duration {
	d := time.Duration(m.cfg.DeadAdverts)
	iv := m.cfg.Interval + (m.slack+d-1)/d
	return min((iv + time.Millisecond - 1).Truncate(time.Millisecond), MaxInterval)
}

// HoldFor is how long the standbys will wait, at the least, before they take over from this
// replica as active: the dead adverts at the shorter of the intervals it advertised last (a
// standby that missed the last advert goes by the one before). A holder that keeps the
// addresses on a kernel lifetime keeps it longer than this, so a starved but live active does
// not lose them before anyone else may take them.
func (m *Machine) HoldFor() time.Duration {
	iv := m.cfg.Interval
	if m.sentSinceActive {
		iv = m.sent
		if m.prevSent > 0 {
			iv = min(iv, m.prevSent)
		}
	}
	return time.Duration(m.cfg.DeadAdverts) * iv
}

// observe updates the slack with one lateness: how long after its wake time an input came (our
// own lateness), or how much longer than the interval the active took between two adverts.
func (m *Machine) observe(late time.Duration) {
	if m.cfg.MaxSlack < 0 {
		return
	}
	// Later than the longest dead interval we would ever allow is a freeze (SIGSTOP, a paused
	// VM), not starvation: it teaches nothing about how late this node runs.
	if late > time.Duration(m.cfg.DeadAdverts)*m.cfg.Interval+m.cfg.MaxSlack {
		return
	}
	if late > m.cfg.Interval/lateAfter {
		m.slack = max(m.slack, min(2*late, m.cfg.MaxSlack))
	}
}

// decay lets the slack shrink by a slackDecay-th of the time passed.
func (m *Machine) decay(elapsed time.Duration) {
	m.slack = max(0, m.slack-elapsed/slackDecay)
}

// ClaimDue says whether a Tick at now would make this standby take over. Before any Tick the
// runner reads every advert already waiting in its sockets (drain): after a stall the timer and
// the sockets are ready at the same time, and a replica must not take over from an active whose
// adverts it has simply not read yet.
func (m *Machine) ClaimDue(now time.Duration) bool {
	return m.role == Standby && m.started && m.mayClaim() && now >= m.deadline
}

// skew staggers the standbys so that two of them rarely claim at the same moment: higher priority
// first (a quarter interval across the priority range), then one of 8 slots from the ID (2.5 %
// of an interval apart), in whole milliseconds. A tie that still happens is settled by the
// adverts within one interval.
func (m *Machine) skew() time.Duration {
	h := fnv.New32a()
	h.Write(m.cfg.ID[:])
	slot := time.Duration(h.Sum32() % 8)
	iv := m.cfg.Interval
	return (iv*time.Duration(255-int(m.cfg.Priority))/1020 + iv*slot/40).Truncate(time.Millisecond)
}

// refuse says why the advert of ev (of our group, from another replica) is refused, or "" when it
// is not: unauthenticated where authentication is required and the legacy window is closed, or
// one that no replica of this Service can send. Without authentication, an advert that is
// plausible (a resignation, or a newer term with a sane interval, from a made-up sender) is
// obeyed like a real one; with it, a forger cannot make one (Guard). With terms at most MaxTerm
// and intervals at most MaxPeerInterval (≤ MaxInterval), nothing an accepted advert carries can
// make the machine's arithmetic overflow: terms only grow through nextTerm, and the longest
// duration added to a clock reading is DeadAdverts × MaxInterval plus MaxSlack, a skew and the
// legacy delay.
func (m *Machine) refuse(ev Event) string {
	a := ev.Advert
	switch {
	case m.cfg.Authenticated && !ev.Authenticated && !m.legacyOpen(ev.Now):
		return RefusedUnauthenticated
	case a.Term > MaxTerm:
		return RefusedTerm
	case a.Interval < m.cfg.MinPeerInterval || a.Interval > m.cfg.MaxPeerInterval:
		return RefusedInterval
	case a.Sender == ID{} || a.Sender[0]&1 != 0:
		return RefusedSender
	}
	return ""
}

// beats says whether advert a wins over us as active: newer term first, then priority, then ID.
func (m *Machine) beats(a Advert) bool {
	return Claim{Term: a.Term, Priority: a.Priority, Sender: a.Sender}.Compare(m.own()) > 0
}

// own is our claim with the current term (held or last held).
func (m *Machine) own() Claim {
	return Claim{Term: m.term, Priority: m.cfg.Priority, Sender: m.cfg.ID}
}

// advert is the advert to send now; it records when and with which interval, for HoldFor.
func (m *Machine) advert(now time.Duration, resigning bool) *Advert {
	iv := m.advertisedInterval()
	if m.sentSinceActive {
		m.prevSent = m.sent
	} else {
		m.prevSent = 0
	}
	m.sentAt, m.sent, m.sentSinceActive = now, iv, true
	return &Advert{Group: m.cfg.Group, Term: m.term, Priority: m.cfg.Priority, Sender: m.cfg.ID,
		Resigning: resigning, Interval: iv}
}

// Handle applies one event and says what to do.
func (m *Machine) Handle(ev Event) Output {
	var out Output
	if m.role == Stopped {
		return Output{Role: Stopped, Done: true, Wake: ev.Now}
	}
	if ev.Kind == Received && ev.Advert.Sender != m.cfg.ID && ev.Advert.Group == m.cfg.Group {
		if why := m.refuse(ev); why != "" {
			return Output{Role: m.role, Wake: m.wakeAt, Refused: why}
		}
		m.heardAuth = m.heardAuth || ev.Authenticated
	}
	now := ev.Now
	if m.started && now < m.lastNow {
		now = m.lastNow // a clock that went back is treated as standing still
	}
	if !m.started {
		m.started, m.lastNow, m.startedAt = true, now, now
		m.role = Standby
		m.listen(now)
		// Whatever an earlier incarnation of this replica left on net1 goes (kill -9 leaves the
		// addresses in the pod's network namespace).
		out.Hold, out.Reason = Release, "started: standby until no active is heard for the dead interval"
	} else {
		m.decay(now - m.lastNow)
		if gap, frozen := m.frozenFor(now); frozen {
			m.frozen(now, gap, &out)
		}
		// After the frozen check: lateness is judged by the dead interval the others knew of.
		m.observe(now - m.wakeAt)
	}
	m.lastNow = now

	switch ev.Kind {
	case Start:
		// handled above
	case Tick:
		m.tick(now, &out)
	case Received:
		m.received(now, ev.Advert, m.cfg.Authenticated && !ev.Authenticated, &out)
	case Shutdown:
		m.shutdown(now, &out)
	case LinkDown:
		m.linkDown = true
		switch m.role {
		case Active:
			m.stepDown(now, &out, "net1 lost its link")
		case Resigning:
			m.stop(&out, "net1 lost its link while resigning")
		}
	case NotReady:
		m.notReady = true
	case Ready:
		m.notReady = false
	case LinkUp:
		m.linkDown = false
		if m.role == Standby {
			// The other side of the link may have an active we have not heard yet.
			m.listen(now)
		}
	case Superseded:
		m.superseded(now, ev.Claim, &out)
	case Granted:
		m.granted(now, ev.Claim, &out)
	case Lost:
		m.lost(now, &out)
	case Verified:
		if m.verifying && m.role == Active {
			m.verifying = false
			out.Reason = fmt.Sprintf("frozen for %s, longer than the dead interval, and no newer claim was waiting: keeping the addresses", m.frozenGap)
			out.Send = m.advert(now, false)
			m.nextAdvert = now + m.cfg.Interval
		}
	case RenewFailed:
		switch m.role {
		case Active:
			// Resign first (the advert carries our term), then let go at once: unlike a
			// shutdown, the addresses are not kept until a successor advertises, since nothing
			// fences them any more if this process stops.
			resign := m.advert(now, true)
			m.stepDown(now, &out, "the addresses' kernel lifetime could not be renewed: released them and resigned")
			out.Send = resign
		case Resigning:
			m.stop(&out, "the addresses' kernel lifetime could not be renewed while resigning")
		}
	}
	if m.role != Active {
		m.verifying = false
	}
	out.Role = m.role
	out.Done = m.role == Stopped
	out.Wake = m.wake(now)
	m.wakeAt = out.Wake
	return out
}

// frozenFor says whether we ran later than the others would wait, and by how much. For a holder
// that is the time since its last advert, against the dead interval it advertised (HoldFor): a
// standby that heard that advert may take over once it has passed. Otherwise it is how late we
// woke: a standby's wait began at an advert it heard, and the time it did not run is time it did
// not listen.
func (m *Machine) frozenFor(now time.Duration) (gap time.Duration, frozen bool) {
	if m.role.holds() && m.sentSinceActive {
		gap = now - m.sentAt
		return gap, gap > m.HoldFor()
	}
	gap = now - m.wakeAt
	return gap, gap > m.deadInterval()
}

// frozen: we did not run for longer than the others would wait (frozenFor). Others have had time
// to take over with a newer term: an active sends nothing until it has read what they sent
// meanwhile (Verifying: it must not fight a newer holder, nor give up addresses nobody took), and
// a standby listens again before it may claim.
func (m *Machine) frozen(now, gap time.Duration, out *Output) {
	gap = gap.Round(time.Millisecond)
	switch m.role {
	case Active:
		if !m.verifying {
			m.verifying, m.frozenGap = true, gap
		}
	case Resigning:
		m.stop(out, fmt.Sprintf("frozen for %s while resigning", gap))
	case Standby:
		m.listen(now)
	}
}

// listen: a standby that could not hear until now (it started, its link came back, it was
// frozen) listens a whole dead interval before it may claim, since an active it has not heard yet
// may exist; and a resignation it hears in its first advert interval counts from the end of that
// interval (received).
func (m *Machine) listen(now time.Duration) {
	m.listenFrom = now
	m.deadline = max(m.deadline, now+m.deadInterval()+m.skew())
}

func (m *Machine) tick(now time.Duration, out *Output) {
	switch m.role {
	case Standby:
		if m.mayClaim() && now >= m.deadline {
			why := "no advert for the dead interval"
			if m.resigned {
				why = "the active resigned"
			}
			m.takeOver(now, out, why)
		}
	case Active:
		if now >= m.nextAdvert && !m.verifying {
			out.Send = m.advert(now, false)
			m.nextAdvert = now + m.cfg.Interval
		}
	case Resigning:
		if now >= m.resignUntil {
			m.stop(out, "resigned: one interval passed without a successor's advert")
		} else if now >= m.nextAdvert {
			out.Send = m.advert(now, true)
			m.nextAdvert = now + m.cfg.Interval/4
		}
	}
}

// received handles an advert of another replica; legacy says it was accepted unauthenticated in
// the legacy window (legacyOpen): a claim it leads to waits legacyDelay more.
func (m *Machine) received(now time.Duration, a Advert, legacy bool, out *Output) {
	if a.Sender == m.cfg.ID || a.Group != m.cfg.Group {
		return // our own, looped back, or another Service's
	}
	// Before the term is learnt: a resignation counts only from the active we follow, at the
	// newest term we know of (see below).
	followed := m.heardActive && a.Sender == m.heardFrom && a.Term >= m.maxTerm
	m.maxTerm = max(m.maxTerm, a.Term)
	// The underlay carries adverts between us again: claims are settled by them, not the record.
	// With a key only an authenticated advert says so: anyone can send a version-1 frame. (One
	// accepted in the legacy window cannot meet a backoff today, since only an active is
	// superseded and having been active closes the window; this keeps it so if that changes.)
	if !legacy {
		m.backoff = 0
	}
	switch m.role {
	case Standby:
		if a.Resigning && !followed {
			// A resignation says only that its sender leaves. From a replica we do not follow, or
			// at a term older than one we know, it says nothing about the active we listen to (or
			// have not heard yet): a successor may hold already. And a sealed resignation can be
			// replayed within the replay window to a replica whose guard never saw it (one that
			// just started); obeyed, it made that replica take the addresses from a live active
			// after its skew. So it neither moves the deadline nor changes whom we follow; the
			// dead interval decides, as without it.
			return
		}
		// A gap that spans frames lost in our queue (deferred) is our loss, not the active's
		// lateness: measured, a flood stretched the dead interval to its longest.
		if m.heardActive && a.Sender == m.heardFrom && !a.Resigning && !m.deferred {
			m.observe(now - m.heardAt - m.cfg.Interval)
		}
		repeated := m.resigned && a.Resigning && a.Sender == m.heardFrom
		// Heard: a later loss may defer a claim again (lost). With a key, not by a version-1
		// frame of the legacy window, which anyone can send.
		m.deferred = m.deferred && legacy
		m.heardFrom, m.heardAt = a.Sender, now
		m.lastHeard, m.heardActive = now, true
		if a.Interval > 0 {
			m.peerInterval = a.Interval
		}
		m.resigned = a.Resigning
		if a.Resigning {
			// A planned move: claim after the skew only, not the dead interval, counted from the
			// first resignation. The resigning replica repeats it every quarter interval; a skew
			// longer than that (up to 0.425 of an interval) pushed back by every repeat would
			// claim only after the resigning replica let go, leaving nobody in between.
			//
			// Counted no sooner than one advert interval after we began to listen (listen): a
			// live successor's advert reaches us within it and ends the wait. A sealed
			// resignation of an old active can be replayed within the replay window to a replica
			// that just started (its guard has seen nothing), right after one of that active's
			// adverts, so that the replica follows it; counted at once, it made the replica claim
			// after its skew, before the successor's next advert.
			if !repeated {
				iv := max(m.cfg.Interval, m.peerInterval)
				m.deadline = max(now, m.listenFrom+iv) + m.skew() + m.legacyDelay(legacy)
			}
			return
		}
		if m.cfg.Preempt && m.cfg.Priority > a.Priority && m.mayClaim() {
			m.takeOver(now, out, fmt.Sprintf("preempting %s (priority %d < %d)", a.Sender, a.Priority, m.cfg.Priority))
			return
		}
		m.deadline = now + m.deadInterval() + m.skew() + m.legacyDelay(legacy)
	case Active:
		if a.Resigning {
			return // it is leaving: nothing to settle
		}
		if m.beats(a) {
			// From now on we follow it: its resignation must count.
			m.heardFrom, m.heardAt = a.Sender, now
			m.lastHeard, m.heardActive = now, true
			m.stepDown(now, out, fmt.Sprintf("%s is active with term %d (ours %d): stepping down", a.Sender, a.Term, m.term))
			return
		}
		// We win: say so at once rather than at the next interval, so the other steps down now
		// (after a freeze, once the queue is read: Verified).
		if !m.verifying {
			out.Send = m.advert(now, false)
			m.nextAdvert = now + m.cfg.Interval
		}
	case Resigning:
		if !a.Resigning {
			m.stop(out, fmt.Sprintf("handed over to %s (term %d)", a.Sender, a.Term))
		}
	}
}

// superseded handles a claim read from the record (Superseded).
func (m *Machine) superseded(now time.Duration, c Claim, out *Output) {
	if c.Term > MaxTerm {
		return // a term no replica reaches: the record is refused as a whole
	}
	// Our own claim too teaches the term: lbpod restarted in the same pod keeps net1's MAC, and
	// its next claim must be newer than the one it recorded before.
	m.maxTerm = max(m.maxTerm, c.Term)
	if c.Sender != m.cfg.ID {
		m.recordedOther = true
	}
	blind := !m.recordSeen
	m.recordSeen = true
	if c.Sender == m.cfg.ID || !m.role.holds() || c.Compare(m.own()) <= 0 {
		return
	}
	if blind && m.role == Active {
		// We took over before the record named any claim to us (the API server was unreachable
		// at our start), so our term could not pass the recorded one, which may be a dead pod's:
		// stepping down for it left nobody holding for the whole backoff. A takeover that had
		// read the record would have taken the next term; take it now and advertise at once.
		// Recorded (the runner sees our claim change), it fences the claim's author should it
		// be alive and unheard, as any newer takeover does; it cannot go back and forth, since
		// only the first claim the record names to a process is read so.
		old := m.term
		m.term = nextTerm(c.Term)
		m.maxTerm = m.term
		if !m.verifying { // after a freeze, once the queue is read (Verified)
			out.Send = m.advert(now, false)
			m.nextAdvert = now + m.cfg.Interval
		}
		out.Reason = fmt.Sprintf("the record, read for the first time, names %s's claim with term %d, newer than ours (%d), taken before the record could be read: keeping the addresses with term %d",
			c.Sender, c.Term, old, m.term)
		return
	}
	if m.role == Resigning {
		m.stop(out, fmt.Sprintf("the record names %s's newer claim (term %d) while resigning: handed over", c.Sender, c.Term))
		return
	}
	switch {
	case m.cfg.SupersededBackoff < 0:
	case m.backoff == 0:
		m.backoff = m.cfg.SupersededBackoff
	default:
		m.backoff = min(2*m.backoff, m.cfg.MaxSupersededBackoff)
	}
	m.stepDown(now, out, "")
	out.Reason = fmt.Sprintf("the record names %s active with term %d (ours %d), never heard on the underlay: both held the addresses; stepping down, next claim no sooner than %s from now",
		c.Sender, c.Term, m.term, (m.deadline - now).Round(time.Millisecond))
	out.Superseded = &c
}

// granted handles the record's grant of the Service's first claim (Granted). The claim must be
// ours as NextClaim made it (our ID and priority, a term no replica was seen with: our own record
// of it may have taught the term already), and this replica a standby that may claim and has
// heard no other replica since start, on the underlay or in the record.
func (m *Machine) granted(now time.Duration, c Claim, out *Output) {
	m.recordSeen = true // it read the record, which had never named a claim
	if m.role != Standby || !m.mayClaim() || m.heardActive || m.recordedOther || m.backoff > 0 ||
		c.Sender != m.cfg.ID || c.Priority != m.cfg.Priority || c.Term == 0 || c.Term > MaxTerm || c.Term < m.maxTerm {
		return
	}
	m.takeOverAt(now, c.Term, out, "the Service's record granted its first claim")
}

// lost handles a read of the queue socket that missed frames (Lost): the standby could not hear
// until now, and listens again (listen: no claim before one dead interval and its skew from now,
// and a resignation counts from one advert interval after now), reading at once meanwhile. A
// live active's next adverts reach it then, move its deadline as ever, and it queues again. Once
// per advert heard: a standby that deferred already and heard nothing since keeps its deadline,
// so a flood that lasts cannot postpone a failover forever. An active that is really gone is
// replaced at most one dead interval and skew after the first loss seen since its last advert
// heard (a loss seen at the deadline: twice the usual wait, 0.65 s with the defaults), and the
// deadline is never brought forward. A resignation already heard from the followed active defers nothing: it
// says that active leaves, whatever it sent before, and a hand-over put off would leave nobody
// holding the addresses.
func (m *Machine) lost(now time.Duration, out *Output) {
	if m.role != Standby || m.deferred || m.resigned {
		return
	}
	m.deferred = true
	m.listen(now)
	out.Reason = fmt.Sprintf("frames were lost in the queue socket (a flood?): reading every advert at once, no claim before %s from now",
		(m.deadline - now).Round(time.Millisecond))
}

func (m *Machine) shutdown(now time.Duration, out *Output) {
	switch m.role {
	case Active:
		m.role = Resigning
		m.resignUntil = now + m.cfg.Interval
		m.nextAdvert = now + m.cfg.Interval/4
		out.Send = m.advert(now, true)
		out.Reason = "shutting down: resigning, keeping the addresses until a successor advertises"
	case Standby:
		m.stop(out, "shutting down as standby")
	}
}

// mayClaim: a standby claims only with a link and a data path ready to serve.
func (m *Machine) mayClaim() bool { return !m.linkDown && !m.notReady }

// takeOver makes this replica active with a term newer than any seen. With FirstClaims, never
// term 1: that is the Service's first claim (NextClaim of a replica that has seen no term), which
// the record may hold for a replica that never took over with it (it died after its write landed,
// heard another replica first, or its write timed out after landing). A takeover at term 1 would
// tie with that claim in the record, lose it to the higher MAC (Claim.Compare), and step down for
// SupersededBackoff while nobody holds the addresses; at term 2 it wins, and a replica that did
// take over with the grant steps down on its first advert, as to any newer claim.
func (m *Machine) takeOver(now time.Duration, out *Output, why string) {
	least := m.maxTerm
	if m.cfg.FirstClaims {
		least = max(least, 1)
	}
	m.takeOverAt(now, nextTerm(least), out, why)
}

// takeOverAt makes this replica active with term (at least the highest seen).
func (m *Machine) takeOverAt(now time.Duration, term uint64, out *Output, why string) {
	m.maxTerm = term
	m.term = term
	m.role = Active
	m.everActive = true
	m.resigned = false
	m.nextAdvert = now + m.cfg.Interval
	out.Hold, out.Send = Take, m.advert(now, false)
	out.Reason = fmt.Sprintf("%s: active with term %d", why, m.term)
	if m.heardActive {
		out.Failover = now - m.lastHeard
	}
}

func (m *Machine) stepDown(now time.Duration, out *Output, why string) {
	m.role = Standby
	m.sentSinceActive = false
	m.deferred = false
	m.deadline = now + m.deadInterval() + m.skew() + m.backoff
	out.Hold, out.Reason = Release, why
}

func (m *Machine) stop(out *Output, why string) {
	if m.role.holds() {
		out.Hold = Release
	}
	m.role = Stopped
	m.sentSinceActive = false
	out.Reason = why
}

// wake is the next time the machine needs a Tick (see Output.Wake): an active's next advert, a
// standby's deadline, at most one interval away otherwise.
func (m *Machine) wake(now time.Duration) time.Duration {
	w := now + m.cfg.Interval
	switch m.role {
	case Standby:
		// A standby that may claim sleeps until its deadline: every advert moves it, so a
		// standby wakes for adverts only, not also for a timer that would fire between two of
		// them (with hundreds of lb pods on a node, each wake is paid in CPU).
		if m.mayClaim() {
			w = m.deadline
		}
	case Active:
		w = min(w, m.nextAdvert)
		if m.verifying {
			w = now // until Verified
		}
	case Resigning:
		w = min(w, m.nextAdvert, m.resignUntil)
	case Stopped:
		w = now
	}
	return max(w, now)
}
