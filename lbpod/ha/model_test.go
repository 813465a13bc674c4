package ha

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

// The model runs 2 or 3 replicas' machines, each behind its Guard with the Service's key, against
// a simulated underlay at 1 ms resolution, with faults chosen by the fuzzer: kill -9, restart,
// SIGSTOP/SIGCONT, SIGTERM, link down/up, a partition that the replica cannot see (its link stays
// up), and a data path not ready. Frames (the wire bytes, sealed with the key and numbered from
// the replica's wall clock, which is off by up to ±50 ms) take 0 to maxDelay to arrive; a frozen
// replica's frames wait in its socket buffer, as in the kernel. Beside the faults, an adversary on
// the underlay may, at any op:
//   - send a frame the machine refuses even without a key (a term above MaxTerm, an interval
//     outside the accepted range, an impossible sender);
//   - send any unauthenticated frame: version 1 with any fields (a resignation or a newer term
//     from a made-up sender, a replica's own ID), version 2 sealed with another key, a real frame
//     with one bit changed, a version-1 copy of a real advert;
//   - replay any sealed frame ever sent (captured off the wire), to every replica or to one, at
//     any later time;
//
// and a holder's lifetime renewal may fail. Every forged frame must be refused (a version-1 one
// may be obeyed only while the receiver's legacy window is open, when the fuzzer opened it); a
// replayed one may be accepted only by a receiver that has not accepted that sender's sequence or
// a later one (each incarnation checked apart). The properties below must hold regardless: no
// slack for the replays is needed, since the adversary stops at the repair, and before it a
// replay can only do what the replayed sender could. A replayed resignation in particular makes
// no takeover from a holder of a newer term that the receiver has heard for an interval and two
// deliveries, or since the receiver started (checkResignedTakeover); one that reaches a replica
// before it could hear the holder for another reason (a partition it cannot see, just healed)
// may still cost one more takeover, which the overlap bound covers.
//
// The Service's record (the Lease, cmd/lbpod) is a second channel: a replica that takes over
// writes its claim there after an API delay of 1 to maxAPIDelay, only when it is newer than the
// recorded one (term compare), and every replica's watch delivers each new record after another
// such delay (Superseded); a replica that stepped down on it writes a note (two holders). Further
// faults: a replica's adverts lost on the way out (mute) or in (deaf), every advert lost (a
// switch dropping the EtherType), and a replica cut from the API server. Keyless replicas use the
// record too (an lbpod of this version run without a key). These faults lose the replicas'
// adverts, not the adversary's frames: it may sit beyond the fault (on the replica's node); a
// sealed frame it captured was one that left its sender (not muted).
//
// Safety: two replicas that hear each other never both hold the addresses for longer than one
// advert interval plus two deliveries; two replicas that both reach the API server never both
// hold for longer than that plus three API delays (a write, a watch, and a write of the older
// claim that lands first), whatever the adverts do. Liveness: once every fault is repaired,
// exactly one holds within 2 s plus the longest slack, 5 s (a replica superseded through the record
// waits out its backoff, but the one whose claim superseded it waits none, and after a stall its
// dead interval carries its slack); with the legacy window open, within the longest wait a
// forged version-1 advert accepted just before the repair can impose (3 × 2 s and the slack:
// 11 s), the residual risk doc.go states.

const (
	maxDelay    = 10 * time.Millisecond
	overlapOK   = DefaultInterval + 2*maxDelay + 2*time.Millisecond
	maxAPIDelay = 50 * time.Millisecond
	overlapAPI  = overlapOK + 3*maxAPIDelay
)

// recordWrite is one write of the record on its way to the API server.
type recordWrite struct {
	at    time.Duration
	claim Claim
	note  bool // the note of a replica superseded through the record, not a claim
}

// recordRead is one record the watch delivers to a replica.
type recordRead struct {
	at    time.Duration
	claim Claim
}

type delivery struct {
	at    time.Duration
	frame []byte
	// forged: sent by the adversary, unauthenticated; the machine or the guard must refuse it.
	forged bool
	// replayed: sent by the adversary, a sealed frame captured off the wire.
	replayed bool
}

// resignation is a resignation a standby acted on (its deadline moved to its skew): its claim,
// when it came, and whether the adversary replayed it.
type resignation struct {
	claim    Claim
	at       time.Duration
	replayed bool
}

type simReplica struct {
	id                    ID
	m                     *Machine
	alive, frozen, linkUp bool
	isolated, reported    bool // reported: the link state the machine was last told
	unready, unreadyTold  bool // the data path cannot serve; what the machine was last told
	wake                  time.Duration
	inbox                 []delivery
	// keyless: an old replica (version 1, no key: it neither seals nor reads version 2; it uses
	// the record as every replica does). Otherwise guard and seq authenticate, and accepted is this incarnation's last accepted
	// sequence per sender, the model's own check of the replay rule.
	keyless  bool
	key      *Key
	guard    *Guard
	seq      Sequencer
	accepted map[ID]uint64
	// clockOff: how far this replica's wall clock is off.
	clockOff time.Duration
	// mute: its adverts are lost on the way out; deaf: adverts to it are lost; apiDown: it
	// reaches no API server (its writes wait, its watch delivers nothing).
	mute, deaf, apiDown bool
	writes              []recordWrite
	reads               []recordRead
	// offer is the first claim this incarnation offered the record (First), its write due at
	// offerAt (0: none pending); grants are the record's answers on their way back (Granted).
	offer   Claim
	offerAt time.Duration
	grants  []recordRead
	// resignedOn: the resignation this replica last acted on as a standby; started: when this
	// incarnation started.
	resignedOn resignation
	started    time.Duration
	// flooded: junk that passes the socket filter fills this replica's queue socket (a flood on
	// the underlay): while it queues (Machine.Queueing), every advert but resignations is dropped
	// there, and each read of the queue is incomplete (Lost, fed before the decision the read
	// was for: a wake, a resignation).
	flooded bool
}

// queueLost says that the adverts other than resignations are lost in r's queue socket now.
func (r *simReplica) queueLost() bool { return r.flooded && r.m.Queueing() }

// lost feeds replica i the loss its runner sees in a read of the queue socket now.
func (s *sim) lost(i int) {
	if !s.ignoreLoss {
		s.handle(i, Event{Kind: Lost, Now: s.now})
	}
}

func (r *simReplica) hears() bool { return r.alive && !r.frozen && r.linkUp && !r.isolated }

// apiOK: its recorder runs and reaches the API server.
func (r *simReplica) apiOK() bool { return r.alive && !r.frozen && !r.apiDown }

type sim struct {
	t        *testing.T
	now      time.Duration
	replicas []*simReplica
	rng      uint32
	since    map[[2]int]time.Duration // when a pair started to both hold while hearing each other
	// heard: since when replica [1] has been active (sending adverts) while [0] and [1] hear each
	// other and read the same wire version.
	heard    map[[2]int]time.Duration
	log      []string
	maxSlack time.Duration // the replicas' Config.MaxSlack
	legacy   time.Duration // the replicas' Config.LegacyWindow
	// wire holds every sealed frame sent, for the adversary's replays; refused counts the
	// refusals by reason.
	wire    [][]byte
	refused map[string]int
	// dropAll: the underlay drops every advert.
	dropAll bool
	// record is the claim the record names (zero: none yet); written counts its writes, notes
	// included; sinceAPI is since's twin for pairs that both reach the API server.
	record   Claim
	written  []time.Duration
	sinceAPI map[[2]int]time.Duration
	// firstSupersede is when the first replica stepped down on the record (0: never).
	firstSupersede time.Duration
	apiRng         uint32
	// held are the claims some replica took over with; supersededBy those a replica stepped
	// down on through the record (Output.Superseded).
	held         map[Claim]bool
	supersededBy []Claim
	// ignoreLoss: the runners neither see nor tell the losses in their queue sockets (Lost), as
	// before they did.
	ignoreLoss bool
}

// hearEachOther: adverts go both ways between a and b.
func (s *sim) hearEachOther(a, b *simReplica) bool {
	return a.hears() && b.hears() && !s.dropAll && !a.mute && !b.mute && !a.deaf && !b.deaf
}

// apiDelay draws from its own generator, so that the advert delays stay those the seeds were
// chosen with before the record existed.
func (s *sim) apiDelay() time.Duration {
	s.apiRng = s.apiRng*1664525 + 1013904223
	return time.Duration(1+(s.apiRng>>8)%uint32(maxAPIDelay/time.Millisecond)) * time.Millisecond
}

// offerDelay is how long after Start a replica's first-claim offer reaches the record, as in
// cmd/lbpod: its data path gets ready (up to 200 ms here), the conflict probe (100 ms), then the
// write (apiDelay). Drawn from the API server's generator, as apiDelay.
func (s *sim) offerDelay() time.Duration {
	s.apiRng = s.apiRng*1664525 + 1013904223
	return 100*time.Millisecond + time.Duration((s.apiRng>>8)%200)*time.Millisecond + s.apiDelay()
}

// wall is replica r's wall clock.
func (s *sim) wall(r *simReplica) time.Time { return wall0.Add(s.now + r.clockOff) }

func (s *sim) rand(n uint32) uint32 {
	s.rng = s.rng*1664525 + 1013904223
	return (s.rng >> 8) % n
}

func (s *sim) logf(format string, args ...any) {
	s.log = append(s.log, fmt.Sprintf("%7s ", s.now)+fmt.Sprintf(format, args...))
}

func (s *sim) handle(i int, ev Event) Output {
	r := s.replicas[i]
	held := r.m.Claim()
	out := r.m.Handle(ev)
	if out.Reason != "" || out.Hold != Keep {
		s.logf("r%d %s: %s %s (%s)", i, ev.Kind, out.Hold, out.Role, out.Reason)
	}
	r.wake = out.Wake
	if out.Hold == Take && strings.HasPrefix(out.Reason, "the active resigned") {
		s.checkResignedTakeover(i)
	}
	// The recorder: a new claim (a takeover, or a blind takeover's newer term: Superseded) is
	// written, as the runner's record does; a step-down on the record writes the note.
	if c := r.m.Claim(); c != held && c != (Claim{}) {
		if s.held == nil {
			s.held = map[Claim]bool{}
		}
		s.held[c] = true
		r.writes = append(r.writes, recordWrite{at: s.now + s.apiDelay(), claim: c})
	}
	if out.Superseded != nil {
		s.supersededBy = append(s.supersededBy, *out.Superseded)
		if s.firstSupersede == 0 {
			s.firstSupersede = s.now
		}
		r.writes = append(r.writes, recordWrite{at: s.now + s.apiDelay(), claim: *out.Superseded, note: true})
	}
	if out.Send != nil && r.linkUp && !r.isolated {
		frame := out.Send.Marshal()
		if !r.keyless {
			frame = r.key.Seal(*out.Send, r.seq.Next(s.wall(r), DefaultReplayWindow))
			if !r.mute {
				// On the wire for the adversary to capture, even where the underlay then drops it.
				s.wire = append(s.wire, frame)
			}
		}
		for j, o := range s.replicas {
			if j != i && o.alive && o.linkUp && !o.isolated && !r.mute && !o.deaf && !s.dropAll {
				o.inbox = append(o.inbox, delivery{at: s.now + time.Duration(s.rand(uint32(maxDelay/time.Millisecond)+1))*time.Millisecond, frame: frame})
			}
		}
	}
	if out.Done {
		r.alive = false // the process exits
		s.logf("r%d exited", i)
	}
	return out
}

func (s *sim) start(i int) {
	r := s.replicas[i]
	cfg := Config{ID: r.id, Group: group, Priority: DefaultPriority, MaxSlack: s.maxSlack,
		Authenticated: !r.keyless, LegacyWindow: s.legacy, FirstClaims: !r.keyless}
	r.m = NewMachine(cfg)
	if !r.keyless {
		// A new process: a new guard (it remembers nothing) and sequencer (from its wall clock).
		r.key = mustKey(s.t, testSecret)
		r.guard, r.seq, r.accepted = NewGuard(cfg.withDefaults(), r.key), Sequencer{}, map[ID]uint64{}
	}
	r.alive, r.frozen, r.inbox, r.reported, r.unreadyTold = true, false, nil, true, false
	r.writes, r.reads, r.grants, r.resignedOn, r.started = nil, nil, nil, resignation{}, s.now
	for k := range s.heard {
		if k[0] == i || k[1] == i {
			delete(s.heard, k) // a new process has heard nobody
		}
	}
	s.handle(i, Event{Kind: Start, Now: s.now})
	s.relist(i)
	// As the runner does after Start (First): offer the next claim as the Service's first; the
	// record takes it only while it has never named a claim (the API server's optimistic
	// concurrency: one such write wins). Keyless replicas are of a release without it.
	r.offer, r.offerAt = Claim{}, 0
	if !r.keyless {
		r.offer, r.offerAt = r.m.NextClaim(), s.now+s.offerDelay()
	}
}

// relist: a recorder that (re)starts or gets the API server back reads the record first.
func (s *sim) relist(i int) {
	if s.record != (Claim{}) {
		r := s.replicas[i]
		r.reads = append(r.reads, recordRead{at: s.now + s.apiDelay(), claim: s.record})
	}
}

// recorder carries out replica i's due record writes and feeds it the records its watch
// delivered. A claim is written only while the replica still holds it and when it is newer than
// the recorded one; otherwise the recorder hands the newer recorded claim to the machine.
func (s *sim) recorder(i int) {
	r := s.replicas[i]
	if !r.apiOK() {
		return
	}
	var keep []recordWrite
	for _, w := range r.writes {
		switch {
		case w.at > s.now:
			keep = append(keep, w)
		case w.note:
			s.written = append(s.written, s.now)
			s.logf("r%d record: note (superseded by %s)", i, w.claim)
		case r.m.Claim() != w.claim:
			// no longer ours: the recorder writes only while active
		case w.claim.Compare(s.record) > 0:
			s.write(i, w.claim, "")
		default:
			r.reads = append(r.reads, recordRead{at: s.now, claim: s.record})
		}
	}
	r.writes = keep
	s.landOffer(i)
	r.grants = s.deliver(i, r.grants, Granted)
	r.reads = s.deliver(i, r.reads, Superseded)
}

// landOffer: replica i's first-claim offer reaches the record when due, also after its process
// died (the write was on its way): the record takes it only while it has never named a claim.
func (s *sim) landOffer(i int) {
	r := s.replicas[i]
	if r.offerAt == 0 || r.offerAt > s.now || r.apiDown {
		return
	}
	if s.record == (Claim{}) {
		note := " (granted as the first claim)"
		if !r.alive {
			note = " (granted as the first claim; its author is dead)"
		}
		s.write(i, r.offer, note)
		r.grants = append(r.grants, recordRead{at: s.now + s.apiDelay(), claim: r.offer})
	}
	r.offerAt = 0
}

// write makes c, replica i's claim, the record's, and every live replica's watch delivers it.
func (s *sim) write(i int, c Claim, note string) {
	s.record = c
	s.written = append(s.written, s.now)
	s.logf("r%d record: %s%s", i, c, note)
	for _, o := range s.replicas {
		if o.alive {
			o.reads = append(o.reads, recordRead{at: s.now + s.apiDelay(), claim: c})
		}
	}
}

// deliver feeds replica i, while it lives, the claims of list that are due, as events of kind,
// and returns those still on their way.
func (s *sim) deliver(i int, list []recordRead, kind EventKind) []recordRead {
	var later []recordRead
	for _, rd := range list {
		if rd.at > s.now {
			later = append(later, rd)
			continue
		}
		if s.replicas[i].alive {
			s.handle(i, Event{Kind: kind, Now: s.now, Claim: rd.claim})
		}
	}
	return later
}

// receive hands one delivered frame to replica i as its runner does: version 2 dropped unread by
// an old replica, the guard's checks, then the machine. It checks that no forged frame gets
// through and that no replay is accepted twice by one incarnation.
func (s *sim) receive(i int, d delivery) {
	r := s.replicas[i]
	f, err := ParseFrame(d.frame)
	if err != nil {
		s.t.Fatalf("the model put an unreadable frame on the wire: %v", err)
	}
	if r.keyless && f.Version != advertVersion {
		return // its socket filter drops what it cannot read
	}
	var authenticated bool
	why := ""
	legacyOpen := r.m.legacyOpen(s.now)
	if !r.keyless {
		authenticated, why = r.guard.Open(f, s.wall(r))
	}
	resigned := r.m.resigned
	if why == "" {
		why = s.handle(i, Event{Kind: Received, Now: s.now, Advert: f.Advert, Authenticated: authenticated}).Refused
	}
	if why != "" {
		s.refused[why]++
		return
	}
	if f.Advert.Resigning && !resigned && r.m.resigned {
		r.resignedOn = resignation{claim: Claim{Term: f.Advert.Term, Priority: f.Advert.Priority, Sender: f.Advert.Sender},
			at: s.now, replayed: d.replayed}
	}
	ignored := f.Advert.Sender == r.id || f.Advert.Group != group // the machine ignores these
	if d.forged && !ignored && !(f.Version == advertVersion && (r.keyless || legacyOpen)) {
		s.t.Fatalf("r%d accepted the forged frame %+v (version %d):\n%s", i, f.Advert, f.Version, strings.Join(s.log, "\n"))
	}
	if authenticated {
		if last, ok := r.accepted[f.Advert.Sender]; ok && f.Seq <= last {
			s.t.Fatalf("r%d accepted sequence %d of %s after %d:\n%s", i, f.Seq, f.Advert.Sender, last, strings.Join(s.log, "\n"))
		}
		r.accepted[f.Advert.Sender] = f.Seq
	}
}

// step advances every replica that runs to s.now, then checks safety.
func (s *sim) step() {
	for i, r := range s.replicas {
		if !r.alive {
			s.landOffer(i)
		}
		if !r.alive || r.frozen {
			continue
		}
		if r.linkUp != r.reported {
			r.reported = r.linkUp
			kind := LinkDown
			if r.linkUp {
				kind = LinkUp
			}
			s.handle(i, Event{Kind: kind, Now: s.now})
		}
		if r.unready != r.unreadyTold {
			r.unreadyTold = r.unready
			kind := Ready
			if r.unready {
				kind = NotReady
			}
			s.handle(i, Event{Kind: kind, Now: s.now})
		}
		var keep []delivery
		for _, d := range r.inbox {
			switch {
			case d.at > s.now:
				keep = append(keep, d)
			case r.linkUp && !r.isolated && r.alive && r.queueLost():
				if d.frame[5]&flagResigning != 0 {
					// Read at once by the runner, after the queue: which missed frames.
					s.lost(i)
					s.receive(i, d)
				}
			case r.linkUp && !r.isolated && r.alive:
				s.receive(i, d)
			}
		}
		r.inbox = keep
		if r.alive {
			s.recorder(i)
		}
		if r.alive && r.m.Verifying() {
			// As the runner does: every frame due has been fed above, then Verified.
			s.handle(i, Event{Kind: Verified, Now: s.now})
		}
		if r.alive && s.now >= r.wake {
			if r.queueLost() {
				s.lost(i)
			}
			s.handle(i, Event{Kind: Tick, Now: s.now})
		}
	}
	for i, a := range s.replicas {
		for j, b := range s.replicas {
			if heard := a.alive && b.alive && b.m.Role() == Active && s.hearEachOther(a, b) && a.keyless == b.keyless && !a.queueLost(); !heard {
				delete(s.heard, [2]int{i, j})
			} else if _, ok := s.heard[[2]int{i, j}]; !ok {
				s.heard[[2]int{i, j}] = s.now
			}
		}
	}
	for i := range s.replicas {
		for j := i + 1; j < len(s.replicas); j++ {
			a, b := s.replicas[i], s.replicas[j]
			both := a.alive && b.alive && a.m.Role().holds() && b.m.Role().holds()
			s.overlap(s.since, [2]int{i, j}, both && s.hearEachOther(a, b), overlapOK, "hear each other")
			s.overlap(s.sinceAPI, [2]int{i, j}, both && a.apiOK() && b.apiOK(), overlapAPI, "both reach the API server")
		}
	}
}

// checkResignedTakeover: replica i took over because the active it followed resigned. When the
// adversary replayed that resignation, no replica may have been active with a newer term while
// the two heard each other, from an interval and two deliveries before the resignation came, or
// from i's start: i has heard that holder's advert by then, or before its takeover (a resignation
// counts no sooner than one interval and the skew after the start, and the skew is longer than a
// delivery here), and a resignation older than the term it knows moves nothing. (Before, any
// resignation moved the deadline: a replayed one made a replica that followed the holder take
// the addresses from it; and one replayed to a replica just started, after an advert of its
// sender, did so after the skew.)
func (s *sim) checkResignedTakeover(i int) {
	r := s.replicas[i]
	on := r.resignedOn
	if !on.replayed {
		return
	}
	for j, h := range s.replicas {
		since, ok := s.heard[[2]int{i, j}]
		if ok && h.m.Term() > on.claim.Term && (since <= on.at-DefaultInterval-2*maxDelay-2*time.Millisecond || since <= r.started) {
			s.t.Fatalf("r%d took over on a replayed resignation (%s at %s) from r%d, active with term %d and heard since %s:\n%s",
				i, on.claim, on.at, j, h.m.Term(), since, strings.Join(s.log, "\n"))
		}
	}
}

// overlap fails the test when a pair has been in a state (both hold, and how they reach each
// other) for longer than bound.
func (s *sim) overlap(since map[[2]int]time.Duration, key [2]int, in bool, bound time.Duration, how string) {
	if !in {
		delete(since, key)
		return
	}
	from, ok := since[key]
	if !ok {
		since[key] = s.now
		return
	}
	if s.now-from > bound {
		s.t.Fatalf("r%d and r%d %s and both hold the addresses since %s (now %s):\n%s",
			key[0], key[1], how, from, s.now, strings.Join(s.log, "\n"))
	}
}

func (s *sim) run(d time.Duration) {
	for end := s.now + d; s.now < end; s.now += time.Millisecond {
		s.step()
	}
}

// newSim returns a model of n replicas with the key (keyless: those without), started.
func newSim(t *testing.T, n int, rng uint32, legacy time.Duration, keyless ...int) *sim {
	s := &sim{t: t, since: map[[2]int]time.Duration{}, heard: map[[2]int]time.Duration{}, sinceAPI: map[[2]int]time.Duration{}, rng: rng, legacy: legacy, refused: map[string]int{}}
	for i := range n {
		r := &simReplica{id: ID{2, 0, 0, 0, 0, byte(i + 1)}, linkUp: true, keyless: slices.Contains(keyless, i)}
		r.clockOff = time.Duration(int(s.rand(101))-50) * time.Millisecond
		s.replicas = append(s.replicas, r)
		s.start(i)
	}
	return s
}

// notStarted takes replica i, just started by newSim, back to a process not started yet: it
// runs nothing, and its first-claim offer was never sent.
func (s *sim) notStarted(i int) {
	s.replicas[i].alive, s.replicas[i].offerAt = false, 0
}

func runModel(t *testing.T, data []byte) {
	n := 2 + int(len(data)%2)
	// Every fourth length opens the legacy window: a forged version-1 frame may then be obeyed by
	// a replica that has heard no authenticated advert and never held, and safety must hold too.
	var legacy time.Duration
	if len(data)%4 >= 2 {
		legacy = DefaultLegacyWindow
	}
	s := newSim(t, n, uint32(len(data)), legacy)
	for k := 0; k+2 < len(data) && k < 3*64; k += 3 {
		s.run(time.Duration(data[k]) * 4 * time.Millisecond)
		i := int(data[k+2]) % n
		r := s.replicas[i]
		// Op bytes from 200 up are the faults of the advert channel and the API server (bytes
		// below, as in the corpus written before they existed, mean what they did).
		if op := data[k+1]; op >= 200 {
			switch (op - 200) % 4 {
			case 0:
				r.mute = !r.mute
				s.logf("r%d mute=%t", i, r.mute)
			case 1:
				r.deaf = !r.deaf
				s.logf("r%d deaf=%t", i, r.deaf)
			case 2:
				s.dropAll = !s.dropAll
				s.logf("adverts dropped=%t", s.dropAll)
			case 3:
				r.apiDown = !r.apiDown
				s.logf("r%d apiDown=%t", i, r.apiDown)
				if !r.apiDown && r.alive {
					s.relist(i)
				}
			}
		} else {
			switch data[k+1] % 10 {
			case 0:
				if r.alive {
					s.logf("r%d kill -9", i)
					r.alive = false
				}
			case 1:
				if !r.alive {
					s.logf("r%d restart", i)
					s.start(i)
				}
			case 2:
				if r.alive {
					s.logf("r%d SIGSTOP", i)
					r.frozen = true
				}
			case 3:
				if r.frozen {
					s.logf("r%d SIGCONT", i)
					r.frozen = false
				}
			case 4:
				if r.alive && !r.frozen {
					s.logf("r%d SIGTERM", i)
					s.handle(i, Event{Kind: Shutdown, Now: s.now})
				}
			case 5:
				s.logf("r%d link down", i)
				r.linkUp = false
			case 6:
				s.logf("r%d link up", i)
				r.linkUp = true
			case 7:
				r.isolated = !r.isolated
				s.logf("r%d isolated=%t", i, r.isolated)
			case 8, 9:
				r.unready = data[k+1]%10 == 8
				s.logf("r%d unready=%t", i, r.unready)
			}
		}
		// The replica byte's top bit adds the adversary's move (bytes below 128, as in the
		// corpus written before it existed, add nothing): bits 4 to 6 choose it.
		if b := data[k+2]; b&0x80 != 0 {
			if kind := b >> 4 & 7; kind < 6 {
				a := s.forge(kind, i)
				s.logf("forged advert: term %d interval %s priority %d sender %s resigning %t", a.Term, a.Interval, a.Priority, a.Sender, a.Resigning)
				s.inject(a.Marshal())
			} else if r.alive && !r.frozen {
				s.logf("r%d lifetime renewal fails", i)
				s.handle(i, Event{Kind: RenewFailed, Now: s.now})
			}
		}
		// The op byte's tens add the moves against the authentication (bytes from 200 up, the
		// faults above, add none).
		if op := data[k+1]; op < 200 {
			s.attack(op/10, i)
		}
	}
	// Repair everything (once the replicas told to stop have stopped: a resignation takes up to
	// an interval); within two seconds and the longest slack exactly one replica holds. (A
	// replica superseded through the record waits out its backoff; the replica whose claim
	// superseded it waits none, but after a stall its dead interval carries its slack.)
	s.logf("repair")
	s.repair()
	s.run(2 * DefaultInterval)
	s.repair()
	for i, r := range s.replicas {
		if !r.alive {
			s.start(i)
		}
	}
	// Within the legacy window a forged version-1 advert is obeyed like an old replica's: the
	// last one before the repair may make the replicas wait for its sender as long as a real
	// active's dead interval can stretch (the longest accepted interval, 3 times, and the slack
	// already counted).
	settle := 2*time.Second + DefaultMaxSlack
	if legacy > 0 {
		cfg := Config{}.withDefaults()
		settle += time.Duration(cfg.DeadAdverts) * cfg.MaxPeerInterval
	}
	s.run(settle)
	var holders []string
	for i, r := range s.replicas {
		if r.m.Role().holds() {
			holders = append(holders, fmt.Sprintf("r%d(term %d)", i, r.m.Term()))
		}
	}
	if len(holders) != 1 {
		t.Fatalf("%s after the repair, holders %v, want exactly one:\n%s", settle, holders, strings.Join(s.log, "\n"))
	}
}

// repair ends every fault but the dead processes.
func (s *sim) repair() {
	s.dropAll = false
	for i, r := range s.replicas {
		if r.apiDown && r.alive {
			s.relist(i)
		}
		r.linkUp, r.isolated, r.frozen, r.unready = true, false, false, false
		r.mute, r.deaf, r.apiDown, r.flooded = false, false, false, false
	}
}

// Op bytes: (wait in 4 ms units, op, replica).
func FuzzModel(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{100, 0, 0, 100, 1, 0})          // kill the first active, restart it
	f.Add([]byte{100, 2, 0, 200, 3, 0})          // freeze and resume it
	f.Add([]byte{100, 4, 0, 50, 4, 1, 50, 1, 0}) // SIGTERM twice, restart
	f.Add([]byte{100, 5, 0, 100, 6, 0, 9})       // link down and up, three replicas
	f.Add([]byte{100, 7, 0, 200, 7, 0})          // a partition the replica cannot see, healed
	f.Add([]byte{100, 2, 0, 60, 3, 0, 1, 2, 1, 60, 3, 1})
	// Op 3 (SIGCONT) on a replica that runs does nothing: the adversary's move alone.
	f.Add([]byte{100, 3, 0x80, 2, 3, 0x80, 50, 3, 0x90, 50, 3, 0xa1, 50, 3, 0xb0, 50, 3, 0xc0, 50, 3, 0xd0}) // forged frames of every kind
	f.Add([]byte{100, 3, 0xe0, 100, 3, 0xf1, 100, 7, 0x80, 100, 7, 0xb0, 9})                                 // renewals fail; forged frames across a partition
	// The tens of the op byte: the moves against the authentication, every one, then replays of
	// a resignation to a restarted replica (fresh guard) and to one replica only.
	f.Add([]byte{100, 13, 0, 20, 23, 0, 20, 33, 0, 20, 43, 1, 20, 53, 0, 20, 63, 1, 20, 73, 0, 20, 83, 1, 20, 93, 1})
	f.Add([]byte{100, 4, 0, 50, 1, 0, 0, 83, 0, 5, 83, 0, 100, 93, 0, 100, 74, 1, 1, 91, 1, 0, 83, 1})
	f.Add([]byte{100, 13, 0, 2, 13, 1, 2, 13, 0, 2, 13, 1, 0})                      // version-1 frames with the legacy window open
	f.Add([]byte{100, 4, 2, 100, 0, 0, 0, 1, 0, 50, 83, 0, 0})                      // a resignation replayed to a restarted standby
	f.Add([]byte{100, 4, 2, 100, 0, 0, 0, 101, 0, 0, 3, 0, 0})                      // an advert and a resignation replayed at its restart
	f.Add([]byte{100, 202, 0, 250, 3, 0, 250, 3, 0, 250, 202, 0})                   // every advert dropped for 3 s
	f.Add([]byte{100, 202, 0, 250, 200, 0, 2, 202, 0, 250, 3, 0, 250, 200, 0})      // a partition healed one way first
	f.Add([]byte{100, 201, 1, 250, 3, 0, 250, 201, 1, 100, 200, 1, 250, 200, 1, 9}) // deaf, then mute
	f.Add([]byte{100, 203, 0, 50, 202, 0, 250, 3, 0, 250, 202, 0, 50, 203, 0})      // the API lost during a drop
	f.Add([]byte{100, 133, 1, 250, 3, 0, 250, 140, 0, 100, 133, 1})                 // a standby flooded, the active killed
	f.Add([]byte{100, 143, 1, 5, 143, 1, 50, 4, 0, 5, 143, 1, 100, 143, 0})         // losses without a flood, around a resignation
	f.Fuzz(func(t *testing.T, data []byte) { runModel(t, data) })
}

// TestModelScenarios names the cases the brief asks for; FuzzModel explores around them.
func TestModelScenarios(t *testing.T) {
	for name, ops := range map[string][]byte{
		"kill -9 the active":            {100, 0, 0},
		"SIGTERM the active":            {100, 4, 0},
		"SIGSTOP then SIGCONT":          {100, 2, 0, 150, 3, 0},
		"cut the active's link":         {100, 5, 0, 150, 6, 0},
		"invisible partition, healed":   {100, 7, 0, 150, 7, 0},
		"three replicas, resignations":  {100, 4, 0, 30, 4, 1, 30, 1, 0, 30, 4, 2, 0},
		"standby not ready, then ready": {100, 8, 1, 20, 0, 0, 150, 9, 1},
		"the issue's frame, twice":      {100, 3, 0x80, 2, 3, 0x80},
		"forged frames of every kind":   {100, 3, 0x80, 50, 3, 0x90, 50, 3, 0xa0, 50, 3, 0xb0, 50, 3, 0xc0, 50, 3, 0xd0},
		"the renewals fail":             {100, 3, 0xe0, 100, 3, 0xe1, 100, 3, 0xe0},
		"every move against the key":    {100, 13, 0, 20, 23, 0, 20, 33, 0, 20, 43, 1, 20, 53, 0, 20, 63, 1, 20, 73, 0, 20, 83, 1, 20, 93, 1},
		"replayed resignations":         {100, 4, 0, 50, 1, 0, 0, 83, 0, 5, 83, 0, 100, 93, 0, 100, 74, 1, 1, 91, 1, 0, 83, 1},
		// r2 resigns, r1 takes over, r0 restarts (a guard that never saw the resignation) and
		// listens to r1 for 200 ms; then the resignation is replayed. r0 used to take over after
		// its skew (checkResignedTakeover).
		"a resignation replayed to a restarted standby": {100, 4, 2, 100, 0, 0, 0, 1, 0, 50, 83, 0, 0},
		// The same, replayed the moment r0 restarts, after an advert of r2's (move 10): r0
		// follows r2, and used to take over after its skew, before r1's next advert.
		"an advert and a resignation replayed at a restart": {100, 4, 2, 100, 0, 0, 0, 101, 0, 0, 3, 0, 0},
		"every advert dropped, healed":                      {100, 202, 0, 250, 3, 0, 250, 3, 0, 250, 202, 0},
		"a partition healed one way":                        {100, 202, 0, 250, 200, 0, 2, 202, 0, 250, 3, 0, 250, 200, 0},
		"one-way loss, both ways":                           {100, 200, 0, 250, 3, 0, 250, 200, 0, 100, 200, 1, 250, 3, 0, 250, 200, 1},
		"the API lost during a drop":                        {100, 203, 0, 50, 202, 0, 250, 3, 0, 250, 202, 0, 50, 203, 0},
		"three replicas, adverts lost":                      {100, 202, 0, 250, 3, 0, 250, 3, 0, 250, 202, 0, 0},
		"a standby flooded, the active killed":              {100, 133, 1, 250, 3, 0, 250, 140, 0, 100, 133, 1},
		"every replica flooded, the active resigns":         {100, 133, 0, 0, 133, 1, 0, 133, 2, 250, 3, 0, 50, 4, 0, 250, 3, 0},
	} {
		t.Run(name, func(t *testing.T) { runModel(t, ops) })
	}
}

// TestStarvationDoesNotFlap runs two replicas on a starved node: each stalls for 300 to 500 ms
// once a second (hundreds of pods on two cores), out of phase. With the fixed VRRP figures
// (MaxSlack -1) every stall of the active longer than the dead interval hands the addresses to
// the other replica, about once a second; with the slack the first stalls teach both replicas
// how late the node runs and the active keeps the addresses. Safety is checked as in the model
// (a stalled replica counts as not hearing), and at the end exactly one holds.
func TestStarvationDoesNotFlap(t *testing.T) {
	stalls := []time.Duration{380 * time.Millisecond, 420 * time.Millisecond, 300 * time.Millisecond,
		500 * time.Millisecond, 450 * time.Millisecond}
	takeovers := func(maxSlack time.Duration) int {
		s := newSim(t, 0, 7, 0)
		s.maxSlack = maxSlack
		n := 0
		for i := range 2 {
			s.replicas = append(s.replicas, &simReplica{id: ID{2, 0, 0, 0, 0, byte(i + 1)}, linkUp: true})
			s.start(i)
		}
		before := make([]Role, 2)
		for end := 60 * time.Second; s.now < end; s.now += time.Millisecond {
			for i, r := range s.replicas {
				second, within := s.now/time.Second, s.now%time.Second
				start := time.Duration(i) * 500 * time.Millisecond // out of phase
				stall := stalls[(int(second)+i)%len(stalls)]
				r.frozen = s.now > 2*time.Second && within >= start && within < start+stall
			}
			s.step()
			for i, r := range s.replicas {
				if role := r.m.Role(); role != before[i] {
					if role == Active && s.now > 2*time.Second { // after the first election settled
						n++
					}
					before[i] = role
				}
			}
		}
		for _, r := range s.replicas {
			r.frozen = false
		}
		s.run(5 * time.Second)
		holders := 0
		for _, r := range s.replicas {
			if r.m.Role().holds() {
				holders++
			}
		}
		if holders != 1 {
			t.Fatalf("MaxSlack %s: %d holders once the starvation ended, want 1", maxSlack, holders)
		}
		return n
	}
	fixed, adaptive := takeovers(-1), takeovers(0)
	t.Logf("takeovers in 60 s: fixed dead interval %d, with slack %d", fixed, adaptive)
	if fixed < 30 {
		t.Errorf("fixed dead interval: %d takeovers in 60 s, want at least 30 (the scenario must starve it)", fixed)
	}
	if adaptive > 1 {
		t.Errorf("with slack: %d takeovers in 60 s, want at most 1 (the first stall, then the slack holds)", adaptive)
	}
}

// inject delivers a frame that no replica sent (a forger on the underlay) to every replica that
// hears the underlay now.
func (s *sim) inject(frame []byte) { s.send(frame, true, -1) }

// send puts a frame of the adversary on the wire: to every replica that hears the underlay now,
// or to replica only (a forger next to it on the L2).
func (s *sim) send(frame []byte, forged bool, only int) {
	s.put(delivery{frame: frame, forged: forged}, only)
}

// put is send with every flag of the delivery given.
func (s *sim) put(d delivery, only int) {
	d.at = s.now
	for i, r := range s.replicas {
		if r.alive && r.linkUp && !r.isolated && (only < 0 || i == only) {
			r.inbox = append(r.inbox, d)
		}
	}
}

// attack is the adversary's move against the authentication (move 0 and above 9: none):
//
//	1 a version-1 frame, any fields      2 version 2 sealed with another key, any fields
//	3 a real frame with one bit changed  4 a version-1 copy of a real frame
//	5 replay the latest real frame       6 replay one of the last 64
//	7 replay any ever sent               8 replay the latest resignation
//	9 replay one of the last 64 to replica i only
//	10 replay to replica i only the latest resignation, right after its sender's last advert
//	   before it (a replica that never heard that sender, one just started, then follows it)
//	13 flood replica i's queue socket, or stop (simReplica.flooded)
//	14 a loss in replica i's queue now (Lost), without a flood: the runner may see one at any read
func (s *sim) attack(move byte, i int) {
	switch r := s.replicas[i]; move {
	case 13:
		r.flooded = !r.flooded
		s.logf("r%d flooded=%t", i, r.flooded)
		return
	case 14:
		if r.alive && !r.frozen {
			s.logf("r%d lost frames in its queue", i)
			s.handle(i, Event{Kind: Lost, Now: s.now})
		}
		return
	}
	plausible := func() Advert {
		a := Advert{Group: group, Term: uint64(s.rand(64)), Priority: uint8(s.rand(256)), Resigning: s.rand(2) == 0,
			Sender: ID{2, 0xba, 0xd0, 0, 0, byte(s.rand(256))}, Interval: time.Duration(10+s.rand(1991)) * time.Millisecond}
		if s.rand(2) == 0 {
			a.Sender = s.replicas[s.rand(uint32(len(s.replicas)))].id
		}
		return a
	}
	pick := func(last int) []byte {
		if len(s.wire) == 0 {
			return nil
		}
		from := max(0, len(s.wire)-last)
		return s.wire[from+int(s.rand(uint32(len(s.wire)-from)))]
	}
	var frame, before []byte // before: sent just before frame
	forged, only := true, -1
	switch move {
	case 1:
		frame = plausible().Marshal()
	case 2:
		frame = mustKey(s.t, otherSecret).Seal(plausible(), uint64(s.wall(s.replicas[i]).UnixMicro()))
	case 3:
		if real := pick(64); real != nil {
			frame = slices.Clone(real)
			frame[s.rand(uint32(len(frame)))] ^= 1 << s.rand(8)
		}
	case 4:
		if real := pick(64); real != nil {
			f, _ := ParseFrame(real)
			frame = f.Advert.Marshal()
		}
	case 5, 6, 7, 8, 9, 10:
		forged = false
		switch move {
		case 5:
			frame = pick(1)
		case 6:
			frame = pick(64)
		case 7:
			frame = pick(len(s.wire))
		case 8:
			for j := len(s.wire) - 1; j >= 0 && frame == nil; j-- {
				if s.wire[j][5]&flagResigning != 0 {
					frame = s.wire[j]
				}
			}
		case 9:
			frame, only = pick(64), i
		case 10:
			only = i
			for j := len(s.wire) - 1; j >= 0 && frame == nil; j-- {
				if s.wire[j][5]&flagResigning == 0 {
					continue
				}
				frame = s.wire[j]
				resigned, _ := ParseFrame(frame)
				for k := j - 1; k >= 0 && before == nil; k-- {
					if f, _ := ParseFrame(s.wire[k]); f.Advert.Sender == resigned.Advert.Sender && !f.Advert.Resigning {
						before = s.wire[k]
					}
				}
			}
		}
	}
	if frame == nil {
		return
	}
	for _, frame := range [][]byte{before, frame} {
		f, err := ParseFrame(frame)
		if err != nil {
			// None, or a changed bit in the magic or the version: no replica reads it (the
			// socket filter).
			continue
		}
		s.logf("adversary move %d: version %d seq %d sender %s term %d resigning %t to %d", move, f.Version, f.Seq, f.Advert.Sender, f.Advert.Term, f.Advert.Resigning, only)
		s.put(delivery{frame: frame, forged: forged, replayed: !forged}, only)
	}
}

// forge makes a frame of one of the kinds the machine refuses, with everything else chosen at
// random: a plausible or wild term, any priority, resigning or not, a made-up sender or replica
// i's own ID (whose frames the others would otherwise take for i's).
func (s *sim) forge(kind byte, i int) Advert {
	a := Advert{Group: group, Term: uint64(s.rand(64)), Priority: uint8(s.rand(256)), Resigning: s.rand(2) == 0,
		Sender: ID{2, 0xba, 0xd0, 0, 0, byte(s.rand(256))}, Interval: time.Duration(10+s.rand(1991)) * time.Millisecond}
	if s.rand(2) == 0 {
		a.Sender = s.replicas[i].id
	}
	wildTerm := func() uint64 {
		return []uint64{MaxTerm + 1, MaxTerm + 1 + uint64(s.rand(1<<30))<<32, math.MaxUint64}[s.rand(3)]
	}
	switch kind {
	case 0, 1: // the frame and its neighbours: a term no replica reaches
		a.Term = wildTerm()
		if kind == 0 { // exactly the issue's
			a.Priority, a.Interval, a.Resigning = 255, MaxInterval, false
		}
	case 2: // too short an interval (none at all included)
		a.Interval = time.Duration(s.rand(10)) * time.Millisecond
	case 3: // too long an interval, up to the longest the wire carries
		a.Interval = 2001*time.Millisecond + time.Duration(s.rand(uint32(MaxInterval/time.Millisecond)-2000))*time.Millisecond
	case 4: // both
		a.Term, a.Interval = wildTerm(), MaxInterval
	case 5: // a sender no net1 has
		a.Sender = []ID{{}, {0x03, 0x6c, 0x62, 0x73, 0x76, 0x63}, {0xff, 0xff, 0xff, 0xff, 0xff, 0xff}}[s.rand(3)]
	}
	return a
}

// TestUpgradeFromUnauthenticated: a rolling update from replicas without a key. The old replica
// (version 1: it neither seals nor reads version 2) is active; a new one with the key starts.
// Within its legacy window it defers to the old active's adverts (it stays a standby however long
// they go on), takes over at the old one's resignation after its skew and half an interval
// (legacyDelay), and the two hold at once only until the one interval the old one gives a
// successor has passed (it cannot read the new one's adverts: 20 ms here): make before break,
// never two holders beyond that. Once active, the new replica refuses
// version 1, as it does after the window (TestLegacyWindow).
func TestUpgradeFromUnauthenticated(t *testing.T) {
	s := newSim(t, 2, 3, DefaultLegacyWindow, 0)
	old, next := s.replicas[0], s.replicas[1]
	s.notStarted(1) // started below, once the old one holds
	s.run(time.Second)
	if s.holder() != 0 {
		t.Fatalf("the old replica does not hold after 1 s:\n%s", strings.Join(s.log, "\n"))
	}
	s.start(1)
	for end := s.now + 30*time.Second; s.now < end; s.now += time.Millisecond {
		s.step()
		if next.m.Role() != Standby || !old.m.Role().holds() {
			t.Fatalf("at %s the new replica is %s, the old %s; want standby behind the old active:\n%s", s.now, next.m.Role(), old.m.Role(), strings.Join(s.log, "\n"))
		}
	}
	if len(s.refused) != 0 {
		t.Fatalf("refused %v behind the old active, want nothing", s.refused)
	}
	resigned := s.now
	s.handle(0, Event{Kind: Shutdown, Now: s.now})
	var took, both time.Duration = -1, 0
	for end := s.now + time.Second; s.now < end; s.now += time.Millisecond {
		s.step()
		if took < 0 && next.m.Role() == Active {
			took = s.now - resigned
		}
		if old.alive && old.m.Role().holds() && next.m.Role().holds() {
			both += time.Millisecond
		}
	}
	t.Logf("the new replica took over %s after the old one resigned; both held for %s", took, both)
	if old.alive || next.m.Role() != Active || took < 0 || took > next.m.skew()+DefaultInterval/2+maxDelay {
		t.Fatalf("after the resignation: old alive %t, new %s (took over after %s, want within its skew, half an interval and a delivery):\n%s",
			old.alive, next.m.Role(), took, strings.Join(s.log, "\n"))
	}
	if both > DefaultInterval {
		t.Errorf("both held for %s, want at most one interval (the old one's wait for a successor)", both)
	}
	if len(s.refused) != 0 {
		t.Errorf("refused %v during the hand-over, want nothing", s.refused)
	}
	// An old replica's advert now (the old pod restarted, a rollback) is refused.
	s.send(from(ID{2, 0, 0, 0, 0, 1}, 9).Marshal(), false, 1)
	s.run(time.Millisecond)
	if s.refused[RefusedUnauthenticated] != 1 || next.m.Role() != Active {
		t.Errorf("a version-1 advert after the takeover: refused %v, new replica %s; want refused as unauthenticated, still active", s.refused, next.m.Role())
	}
}

// TestUpgradeOldStandby: the rollout's other order. An old active, an old standby and a new
// replica with the key; the old active resigns. The old standby cannot read the new replica's
// adverts: had the new one claimed first, both would hold until the old standby went. With the
// legacy delay the old standby claims first and the new one defers to it, whatever the skews
// (every assignment of the three IDs). The sim's safety check runs throughout.
func TestUpgradeOldStandby(t *testing.T) {
	for _, order := range [][3]int{{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}} {
		oldActive, oldStandby, next := order[0], order[1], order[2]
		t.Run(fmt.Sprintf("old active r%d, old standby r%d, new r%d", oldActive, oldStandby, next), func(t *testing.T) {
			s := newSim(t, 3, 5, DefaultLegacyWindow, oldActive, oldStandby)
			s.notStarted(oldStandby)
			s.notStarted(next)
			s.run(time.Second)
			s.start(oldStandby)
			s.start(next)
			s.run(10 * time.Second)
			if s.holder() != oldActive {
				t.Fatalf("holder r%d, want the old active r%d:\n%s", s.holder(), oldActive, strings.Join(s.log, "\n"))
			}
			s.handle(oldActive, Event{Kind: Shutdown, Now: s.now})
			s.run(10 * time.Second)
			if s.replicas[oldStandby].m.Role() != Active || s.replicas[next].m.Role() != Standby {
				t.Fatalf("after the resignation: old standby %s, new %s; want the old standby active, the new one behind it:\n%s",
					s.replicas[oldStandby].m.Role(), s.replicas[next].m.Role(), strings.Join(s.log, "\n"))
			}
			// Then the rollout stops the old standby too: the new replica takes over.
			s.handle(oldStandby, Event{Kind: Shutdown, Now: s.now})
			s.run(time.Second)
			if s.holder() != next || s.replicas[oldActive].alive || s.replicas[oldStandby].alive {
				t.Fatalf("after the second resignation: holder r%d, want the new r%d alone:\n%s", s.holder(), next, strings.Join(s.log, "\n"))
			}
		})
	}
}

// TestRecordBoundsSplitBrain: adverts lost for five simulated minutes (every advert, or one
// replica's one way), with the record as the only channel between the replicas. The record is
// written at most 5 times in any minute (each claim that supersedes another costs two writes:
// the claim and the superseded replica's note; the superseded replica then waits 30 s, doubling),
// at most one replica holds once the first supersede has landed (beyond the overlap the model
// bounds), and after the loss ends exactly one holds at once and stays so. The figures are
// logged: writes in the worst minute, and the time from the end of the loss to one holder.
func TestRecordBoundsSplitBrain(t *testing.T) {
	for _, tc := range []struct {
		name      string
		replicas  int
		fault     func(s *sim, on bool)
		maxWrites int // in any 60 s
	}{
		{"every advert dropped, 2 replicas", 2, func(s *sim, on bool) { s.dropAll = on }, 5},
		{"the active's adverts lost on the way out", 2, func(s *sim, on bool) { s.replicas[s.holder()].mute = on }, 5},
		{"the active hears nothing", 2, func(s *sim, on bool) { s.replicas[s.holder()].deaf = on }, 5},
		{"the standby's adverts lost on the way out", 2, func(s *sim, on bool) { s.replicas[1-s.holder()].mute = on }, 5},
		{"the standby hears nothing", 2, func(s *sim, on bool) { s.replicas[1-s.holder()].deaf = on }, 5},
		// Two standbys that claim within an API delay of each other both cost a note.
		{"every advert dropped, 3 replicas", 3, func(s *sim, on bool) { s.dropAll = on }, 8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSim(t, tc.replicas, 3, 0)
			s.run(2 * time.Second)
			if s.holder() < 0 {
				t.Fatalf("no holder before the fault:\n%s", strings.Join(s.log, "\n"))
			}
			// The fault is toggled on the replicas chosen now (holder() changes meanwhile).
			var faulty []*simReplica
			before := make([]simReplica, len(s.replicas))
			for i, r := range s.replicas {
				before[i] = *r
			}
			start, writesBefore := s.now, len(s.written)
			tc.fault(s, true)
			for i, r := range s.replicas {
				if r.mute != before[i].mute || r.deaf != before[i].deaf {
					faulty = append(faulty, r)
				}
			}
			s.run(5 * time.Minute) // s.step fails on two holders beyond overlapAPI
			worst := 0
			w := s.written[writesBefore:]
			for i := range w {
				n := 0
				for _, at := range w[i:] {
					if at-w[i] < time.Minute {
						n++
					}
				}
				worst = max(worst, n)
			}
			s.dropAll = false
			for _, r := range faulty {
				r.mute, r.deaf = false, false
			}
			healed := s.now
			var one time.Duration = -1
			for end := s.now + 5*time.Second; s.now < end; s.now += time.Millisecond {
				s.step()
				switch {
				case s.holders() != 1:
					one = -1
				case one < 0:
					one = s.now - healed
				}
			}
			superseded := "never"
			if s.firstSupersede > 0 {
				superseded = (s.firstSupersede - start).String() + " into the loss"
			}
			t.Logf("%d record writes in 5 min of loss, %d in the worst minute; first supersede %s; one holder %s after the loss ended",
				len(w), worst, superseded, one)
			if worst > tc.maxWrites {
				t.Errorf("%d record writes in one minute, want at most %d:\n%s", worst, tc.maxWrites, strings.Join(s.log, "\n"))
			}
			if one < 0 || one > overlapOK {
				t.Errorf("after the loss ended: one holder after %s, want within %s and staying:\n%s", one, overlapOK, strings.Join(s.log, "\n"))
			}
		})
	}
}

// holder is the replica that holds the addresses, the first if several do, or -1.
func (s *sim) holder() int {
	for i, r := range s.replicas {
		if r.alive && r.m.Role().holds() {
			return i
		}
	}
	return -1
}

// holders counts the replicas that hold the addresses.
func (s *sim) holders() int {
	n := 0
	for _, r := range s.replicas {
		if r.alive && r.m.Role().holds() {
			n++
		}
	}
	return n
}

// TestModelFirstClaimAuthorDies: the replica whose first-claim offer the record takes dies before
// it could take over with it (kill -9 after its write was sent, never restarted); the write lands
// all the same and the record names a claim nobody holds. The other replica takes over at its
// dead interval, and must not lose to that claim: term 1 is the grant's (Config.FirstClaims), so
// its takeover is newer. Checked over 2000 starts: someone holds within a second of the start and
// from then on, and no replica steps down for a claim that no replica ever held.
func TestModelFirstClaimAuthorDies(t *testing.T) {
	for seed := range uint32(2000) {
		s := newSim(t, 2, seed, 0)
		s.apiRng = seed * 7919
		// The offers were drawn at start: kill the author of the first to land, before it lands.
		first := 0
		if s.replicas[1].offerAt < s.replicas[0].offerAt {
			first = 1
		}
		killAt := time.Duration(s.rand(uint32(s.replicas[first].offerAt/time.Millisecond))) * time.Millisecond
		s.run(killAt)
		s.replicas[first].alive = false
		s.logf("r%d kill -9 (for good)", first)
		var firstHeld, gapFrom, gap time.Duration
		for s.now < 3*time.Second {
			s.step()
			s.now += time.Millisecond
			switch {
			case s.holders() > 0 && firstHeld == 0:
				firstHeld = s.now
			case s.holders() > 0 && gapFrom != 0:
				gap, gapFrom = max(gap, s.now-gapFrom), 0
			case s.holders() == 0 && firstHeld != 0 && gapFrom == 0:
				gapFrom = s.now
			}
		}
		if gapFrom != 0 {
			gap = max(gap, s.now-gapFrom)
		}
		if firstHeld == 0 || firstHeld > time.Second || gap > 0 {
			t.Fatalf("seed %d: first holder at %s, then no holder for %s (want someone within 1 s, and always after):\n%s",
				seed, firstHeld, gap, strings.Join(s.log, "\n"))
		}
		for _, c := range s.supersededBy {
			if !s.held[c] {
				t.Fatalf("seed %d: a replica stepped down for %s, a claim nobody held:\n%s", seed, c, strings.Join(s.log, "\n"))
			}
		}
	}
}

// TestModelBlindTakeover: a replica starts while its API server is unreachable, so it takes over
// before it could read the record, with a term that cannot pass the recorded one. When the API
// server answers, the record names an older holder's claim with a newer term.
//   - That holder is dead (the Service's other pods gone, this one replaced): the replica keeps
//     the addresses with the next term, and records it. Before, it stepped down for the dead
//     pod's claim, wrote a held-twice note, and nobody held the addresses for the 30 s backoff.
//   - That holder is alive but neither hears the other (adverts lost both ways): the newer term
//     written fences it within the API's latency, as any newer takeover does (the model's own
//     check of two holders that both reach the API server runs throughout), and the election
//     settles on one holder once the adverts flow again.
func TestModelBlindTakeover(t *testing.T) {
	// setup runs two replicas through failovers until r1 holds with a recorded term above what
	// a fresh takeover takes (2), then restarts r0 without the API server (deaf and mute too
	// with alive: r1 goes on holding; else r1 is killed first).
	setup := func(t *testing.T, alive bool) (*sim, Claim) {
		s := newSim(t, 2, 11, 0)
		s.run(2 * time.Second)
		for s.record.Term <= 2 || s.holder() != 1 {
			h := s.holder()
			s.replicas[h].alive = false
			s.logf("r%d kill -9", h)
			s.run(time.Second)
			s.start(h)
			s.run(time.Second)
		}
		old := s.record
		r0, r1 := s.replicas[0], s.replicas[1]
		if old.Sender != r1.id {
			t.Fatalf("setup: record %s, want r1's claim:\n%s", old, strings.Join(s.log, "\n"))
		}
		r0.alive = false
		if !alive {
			r1.alive = false
		}
		r0.apiDown, r0.mute, r0.deaf = true, alive, alive
		s.logf("r0 restarted without the API server (r1 alive and unheard: %t)", alive)
		s.start(0)
		s.run(time.Second)
		if r0.m.Role() != Active || r0.m.Term() >= old.Term {
			t.Fatalf("r0 %s with term %d, want active with a term below the recorded %s:\n%s", r0.m.Role(), r0.m.Term(), old, strings.Join(s.log, "\n"))
		}
		return s, old
	}

	t.Run("the recorded holder is dead", func(t *testing.T) {
		s, old := setup(t, false)
		r0, from := s.replicas[0], len(s.supersededBy)
		r0.apiDown = false
		s.logf("r0 reaches the API server")
		s.relist(0)
		for end := s.now + time.Minute; s.now < end; s.now += time.Millisecond {
			s.step()
			if r0.m.Role() != Active {
				t.Fatalf("at %s r0 is %s, want it to keep the addresses:\n%s", s.now, r0.m.Role(), strings.Join(s.log, "\n"))
			}
		}
		want := Claim{Term: old.Term + 1, Priority: DefaultPriority, Sender: r0.id}
		if s.record != want || len(s.supersededBy) != from {
			t.Fatalf("record %s, step-downs on it %v; want %s recorded, none:\n%s", s.record, s.supersededBy[from:], want, strings.Join(s.log, "\n"))
		}
	})

	t.Run("the recorded holder is alive and unheard", func(t *testing.T) {
		s, old := setup(t, true)
		r0, r1 := s.replicas[0], s.replicas[1]
		if r1.m.Role() != Active {
			t.Fatalf("r1 %s, want still active (it cannot hear r0):\n%s", r1.m.Role(), strings.Join(s.log, "\n"))
		}
		r0.apiDown = false
		s.logf("r0 reaches the API server")
		s.relist(0)
		s.run(time.Second) // s.step fails on two holders that both reach the API beyond overlapAPI
		want := Claim{Term: old.Term + 1, Priority: DefaultPriority, Sender: r0.id}
		if r0.m.Role() != Active || r1.m.Role() != Standby || s.record != want {
			t.Fatalf("r0 %s, r1 %s, record %s; want r0 active with %s recorded, r1 fenced:\n%s", r0.m.Role(), r1.m.Role(), s.record, want, strings.Join(s.log, "\n"))
		}
		// r0's newer term reads, once, as a blind takeover's: the next one supersedes it as any.
		r0.mute, r0.deaf = false, false
		s.logf("adverts flow again")
		s.run(5 * time.Second)
		if s.holders() != 1 {
			t.Fatalf("%d holders once the adverts flow, want 1:\n%s", s.holders(), strings.Join(s.log, "\n"))
		}
	})
}

// TestModelFlood: junk that passes the socket filter floods every replica's queue socket for 60
// simulated seconds while the active lives: a standby's queue then loses every advert but the
// resignations. Before the losses were seen (ignoreLoss), each standby took over at its deadline,
// the active stepped down on the newer term and, a standby now, lost the adverts in turn: the
// addresses moved about every dead interval, a Lease write each time. Now a loss defers the
// claim once and the standby reads at once until it hears the active: no takeover. With the
// active killed during the flood, the standby takes over at most one dead interval and its skew
// later than without the flood (the deferral happens once per advert heard); once the flood
// ends, exactly one holds.
func TestModelFlood(t *testing.T) {
	flood := func(ignoreLoss bool) (*sim, int) {
		s := newSim(t, 2, 5, 0)
		s.ignoreLoss = ignoreLoss
		s.run(2 * time.Second)
		if s.holders() != 1 {
			t.Fatalf("%d holders before the flood, want 1:\n%s", s.holders(), strings.Join(s.log, "\n"))
		}
		for _, r := range s.replicas {
			r.flooded = true
		}
		s.logf("flood")
		n, holder := 0, s.holder()
		for end := s.now + time.Minute; s.now < end; s.now += time.Millisecond {
			s.step()
			if h := s.holder(); h != holder {
				n, holder = n+1, h
			}
		}
		return s, n
	}
	_, before := flood(true)
	s, n := flood(false)
	t.Logf("holder changes in 60 s of flood: %d with the losses unseen, %d with them seen", before, n)
	if before < 60 {
		t.Errorf("with the losses unseen: %d holder changes in 60 s, want at least 60 (the scenario must flap)", before)
	}
	if n != 0 {
		t.Fatalf("%d holder changes in 60 s of flood, want 0:\n%s", n, strings.Join(s.log, "\n"))
	}
	// The active killed during the flood: the standby's deadline (a dead interval and skew after
	// the last advert it heard, at most the kill), one deferral, a delivery.
	h := s.holder()
	standby := s.replicas[1-h]
	s.replicas[h].alive = false
	s.logf("r%d kill -9", h)
	killed := s.now
	bound := 2*(time.Duration(DefaultDeadAdverts)*DefaultInterval+standby.m.skew()) + maxDelay
	for s.now < killed+bound && standby.m.Role() != Active {
		s.step()
		s.now += time.Millisecond
	}
	if standby.m.Role() != Active {
		t.Fatalf("no takeover within %s of the kill during the flood:\n%s", bound, strings.Join(s.log, "\n"))
	}
	t.Logf("takeover %s after the kill, during the flood", s.now-killed)
	s.start(h)
	s.run(5 * time.Second)
	for _, r := range s.replicas {
		r.flooded = false
	}
	s.run(5 * time.Second)
	if s.holders() != 1 {
		t.Fatalf("%d holders after the flood, want 1:\n%s", s.holders(), strings.Join(s.log, "\n"))
	}
}
