package ha

import (
	"cmp"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"
)

// Test replicas: with priority 100 and a 100 ms interval their skews are 15, 20 and 25 ms.
var (
	idA   = ID{2, 0, 0, 0, 0, 5}
	idB   = ID{2, 0, 0, 0, 0, 3}
	idC   = ID{2, 0, 0, 0, 0, 1}
	group = GroupOf(nil)
)

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

func TestSkew(t *testing.T) {
	for _, tc := range []struct {
		id       ID
		priority uint8
		want     time.Duration
	}{
		{idA, 100, ms(15)}, {idB, 100, ms(20)}, {idC, 100, ms(25)},
		{idA, 255, 0}, {idA, 0, ms(25)}, {idC, 255, ms(10)},
	} {
		if got := NewMachine(Config{ID: tc.id, Priority: tc.priority}).skew(); got != tc.want {
			t.Errorf("skew(%s, priority %d) = %s, want %s", tc.id, tc.priority, got, tc.want)
		}
	}
}

func from(id ID, term uint64) Advert {
	return Advert{Group: group, Term: term, Priority: DefaultPriority, Sender: id, Interval: DefaultInterval}
}

func resigning(a Advert) Advert { a.Resigning = true; return a }

func recv(at int, a Advert) Event    { return Event{Kind: Received, Now: ms(at), Advert: a} }
func at(kind EventKind, n int) Event { return Event{Kind: kind, Now: ms(n)} }

// record is the record naming id's claim with term and priority 100, read at n ms (Superseded).
func record(n int, id ID, term uint64) Event {
	return Event{Kind: Superseded, Now: ms(n), Claim: Claim{Term: term, Priority: DefaultPriority, Sender: id}}
}

// granted is the record's grant of the claim (term, priority, id) as the Service's first, at n ms.
func granted(n int, id ID, priority uint8, term uint64) Event {
	return Event{Kind: Granted, Now: ms(n), Claim: Claim{Term: term, Priority: priority, Sender: id}}
}

// step is one event and the exact output expected. send is "" for none, else "term N" with
// " resigning" for a resignation; reason is a substring of Output.Reason ("" means empty).
type step struct {
	ev       Event
	hold     Hold
	send     string
	role     Role
	wake     int
	failover int
	reason   string
	// superseded: Output.Superseded is set (to the event's claim).
	superseded bool
	// atOnce: a standby that reads every advert at once (Queueing false) after a loss.
	atOnce bool
}

func describeSend(a *Advert) string {
	if a == nil {
		return ""
	}
	s := fmt.Sprintf("term %d", a.Term)
	if a.Resigning {
		s += " resigning"
	}
	return s
}

// activeAt315 brings A from start to active (term 1) at 315 ms, hearing nobody.
var activeAt315 = []step{
	{ev: at(Start, 0), hold: Release, role: Standby, wake: 315, reason: "started"},
	{ev: at(Tick, 100), role: Standby, wake: 315},
	{ev: at(Tick, 200), role: Standby, wake: 315},
	{ev: at(Tick, 300), role: Standby, wake: 315},
	{ev: at(Tick, 315), hold: Take, send: "term 1", role: Active, wake: 415, reason: "no advert for the dead interval: active with term 1"},
}

// recordedActiveAt315 is activeAt315 with the record read before the takeover (naming a dead
// replica's claim, term 1), as when the API server answers at start: the takeover is not blind.
var recordedActiveAt315 = []step{
	{ev: at(Start, 0), hold: Release, role: Standby, wake: 315, reason: "started"},
	{ev: record(50, idC, 1), role: Standby, wake: 315},
	{ev: at(Tick, 100), role: Standby, wake: 315},
	{ev: at(Tick, 200), role: Standby, wake: 315},
	{ev: at(Tick, 300), role: Standby, wake: 315},
	{ev: at(Tick, 315), hold: Take, send: "term 2", role: Active, wake: 415, reason: "no advert for the dead interval: active with term 2"},
}

func TestMachine(t *testing.T) {
	tests := map[string]struct {
		cfg   Config
		steps []step
	}{
		"silence: a standby takes over after the dead interval and its skew": {steps: activeAt315},
		"an active advertises every interval": {steps: append(activeAt315[:5:5],
			step{ev: at(Tick, 400), role: Active, wake: 415},
			step{ev: at(Tick, 415), send: "term 1", role: Active, wake: 515},
		)},
		"an advert keeps a standby waiting; its silence makes it take over with the next term": {steps: []step{
			{ev: at(Start, 0), hold: Release, role: Standby, wake: 315, reason: "started"},
			{ev: recv(50, from(idB, 4)), role: Standby, wake: 365},
			{ev: at(Tick, 350), role: Standby, wake: 365},
			{ev: at(Tick, 365), hold: Take, send: "term 5", role: Active, wake: 465, failover: 315, reason: "active with term 5"},
		}},
		"a resignation makes the standby take over after its skew only": {steps: []step{
			{ev: at(Start, 0), hold: Release, role: Standby, wake: 315, reason: "started"},
			{ev: recv(50, from(idB, 2)), role: Standby, wake: 365},
			{ev: recv(120, resigning(from(idB, 2))), role: Standby, wake: 135},
			{ev: at(Tick, 135), hold: Take, send: "term 3", role: Active, wake: 235, failover: 15, reason: "the active resigned: active with term 3"},
		}},
		"repeated resignations do not push the claim back": {cfg: Config{ID: ID{2, 0, 0, 0, 0, 2}}, steps: []step{
			{ev: at(Start, 0), hold: Release, role: Standby, wake: 327, reason: "started"},
			{ev: recv(50, from(idB, 2)), role: Standby, wake: 377},
			{ev: recv(100, resigning(from(idB, 2))), role: Standby, wake: 127},
			{ev: recv(125, resigning(from(idB, 2))), role: Standby, wake: 127},
			{ev: at(Tick, 127), hold: Take, send: "term 3", role: Active, wake: 227, failover: 2, reason: "the active resigned: active with term 3"},
		}},
		"an active answers an older active at once and keeps the addresses": {steps: append(activeAt315[:5:5],
			step{ev: recv(330, from(idB, 0)), send: "term 1", role: Active, wake: 430},
		)},
		"an active steps down for a newer term": {steps: append(activeAt315[:5:5],
			step{ev: recv(330, from(idB, 2)), hold: Release, role: Standby, wake: 645, reason: "02:00:00:00:00:03 is active with term 2 (ours 1): stepping down"},
			step{ev: at(Tick, 430), role: Standby, wake: 645},
			step{ev: at(Tick, 530), role: Standby, wake: 645},
			step{ev: at(Tick, 630), role: Standby, wake: 645},
			step{ev: at(Tick, 645), hold: Take, send: "term 3", role: Active, wake: 745, failover: 315, reason: "no advert for the dead interval: active with term 3"},
		)},
		"same term: the higher priority wins": {cfg: Config{Priority: 99}, steps: []step{
			{ev: at(Start, 0), hold: Release, role: Standby, wake: 315, reason: "started"},
			{ev: at(Tick, 200), role: Standby, wake: 315},
			{ev: at(Tick, 315), hold: Take, send: "term 1", role: Active, wake: 415, reason: "active with term 1"},
			{ev: recv(320, from(idB, 1)), hold: Release, role: Standby, wake: 635, reason: "stepping down"},
		}},
		"same term and priority: the higher ID wins": {steps: append(activeAt315[:5:5],
			step{ev: recv(320, from(idB, 1)), send: "term 1", role: Active, wake: 420},
			step{ev: recv(330, from(ID{2, 0, 0, 0, 0, 6}, 1)), hold: Release, role: Standby, wake: 645, reason: "stepping down"},
		)},
		"frozen active, nothing newer waiting: silent until the queue is read, then keeps the addresses and advertises": {steps: append(activeAt315[:5:5],
			step{ev: at(Tick, 1000), role: Active, wake: 1000},
			step{ev: at(Verified, 1000), send: "term 1", role: Active, wake: 1100, reason: "frozen for 685ms, longer than the dead interval, and no newer claim was waiting: keeping the addresses"},
			step{ev: at(Tick, 1100), send: "term 1", role: Active, wake: 1200},
		)},
		"frozen active, a newer claim waiting: lets go on reading it, sends nothing": {steps: append(activeAt315[:5:5],
			step{ev: at(Tick, 1000), role: Active, wake: 1000},
			step{ev: recv(1000, from(idB, 2)), hold: Release, role: Standby, wake: 1315, reason: "is active with term 2 (ours 1): stepping down"},
			step{ev: at(Verified, 1000), role: Standby, wake: 1315},
		)},
		"frozen active, an older term heard first: does not answer it before the queue is read": {steps: append(activeAt315[:5:5],
			step{ev: recv(700, from(idB, 0)), role: Active, wake: 700},
			step{ev: at(Verified, 700), send: "term 1", role: Active, wake: 800, reason: "frozen for 385ms"},
		)},
		"frozen standby: listens a whole dead interval again before claiming": {steps: []step{
			{ev: at(Start, 0), hold: Release, role: Standby, wake: 315, reason: "started"},
			{ev: at(Tick, 900), role: Standby, wake: 1215},
			{ev: at(Tick, 1200), role: Standby, wake: 1215},
			{ev: at(Tick, 1215), hold: Take, send: "term 1", role: Active, wake: 1315, reason: "active with term 1"},
		}},
		"SIGTERM on the active: resigns, keeps the addresses, lets go on the successor's advert": {steps: append(activeAt315[:5:5],
			step{ev: at(Shutdown, 350), send: "term 1 resigning", role: Resigning, wake: 375, reason: "resigning"},
			step{ev: at(Tick, 375), send: "term 1 resigning", role: Resigning, wake: 400},
			step{ev: recv(380, from(idB, 2)), hold: Release, role: Stopped, wake: 380, reason: "handed over to 02:00:00:00:00:03 (term 2)"},
			step{ev: at(Tick, 400), role: Stopped, wake: 400},
		)},
		"SIGTERM on the active with no successor: lets go after one interval": {steps: append(activeAt315[:5:5],
			step{ev: at(Shutdown, 350), send: "term 1 resigning", role: Resigning, wake: 375, reason: "resigning"},
			step{ev: recv(360, resigning(from(idB, 0))), role: Resigning, wake: 375},
			step{ev: at(Tick, 375), send: "term 1 resigning", role: Resigning, wake: 400},
			step{ev: at(Tick, 400), send: "term 1 resigning", role: Resigning, wake: 425},
			step{ev: at(Tick, 425), send: "term 1 resigning", role: Resigning, wake: 450},
			step{ev: at(Tick, 450), hold: Release, role: Stopped, wake: 450, reason: "resigned: one interval passed"},
		)},
		"SIGTERM on a standby: stops, holds nothing": {steps: []step{
			{ev: at(Start, 0), hold: Release, role: Standby, wake: 315, reason: "started"},
			{ev: at(Shutdown, 10), role: Stopped, wake: 10, reason: "shutting down as standby"},
		}},
		"link down: the active lets go; no claim while down; after link up a whole dead interval": {steps: append(activeAt315[:5:5],
			step{ev: at(LinkDown, 350), hold: Release, role: Standby, wake: 450, reason: "net1 lost its link"},
			step{ev: at(Tick, 700), role: Standby, wake: 800},
			step{ev: at(LinkUp, 750), role: Standby, wake: 1065},
			step{ev: at(Tick, 850), role: Standby, wake: 1065},
			step{ev: at(Tick, 950), role: Standby, wake: 1065},
			step{ev: at(Tick, 1064), role: Standby, wake: 1065},
			step{ev: at(Tick, 1065), hold: Take, send: "term 2", role: Active, wake: 1165, reason: "active with term 2"},
		)},
		"a standby not ready does not claim; it claims at the first tick once ready": {steps: []step{
			{ev: at(Start, 0), hold: Release, role: Standby, wake: 315, reason: "started"},
			{ev: at(NotReady, 1), role: Standby, wake: 101},
			{ev: at(Tick, 101), role: Standby, wake: 201},
			{ev: recv(150, from(idB, 4)), role: Standby, wake: 250},
			{ev: at(Tick, 201), role: Standby, wake: 301},
			{ev: at(Tick, 301), role: Standby, wake: 401},
			{ev: recv(350, resigning(from(idB, 4))), role: Standby, wake: 450},
			{ev: at(Tick, 450), role: Standby, wake: 550},
			{ev: at(Ready, 500), role: Standby, wake: 500},
			{ev: at(Tick, 500), hold: Take, send: "term 5", role: Active, wake: 600, failover: 150, reason: "the active resigned: active with term 5"},
		}},
		"not ready does not make an active step down": {steps: append(activeAt315[:5:5],
			step{ev: at(NotReady, 320), role: Active, wake: 415},
			step{ev: at(Tick, 415), send: "term 1", role: Active, wake: 515},
		)},
		"preempt: a higher priority standby takes over from a lower active": {cfg: Config{Priority: 200, Preempt: true}, steps: []step{
			{ev: at(Start, 0), hold: Release, role: Standby, wake: 305, reason: "started"},
			{ev: recv(50, from(idB, 7)), hold: Take, send: "term 8", role: Active, wake: 150, failover: 0, reason: "preempting 02:00:00:00:00:03 (priority 100 < 200)"},
		}},
		"no preemption by default": {cfg: Config{Priority: 200}, steps: []step{
			{ev: at(Start, 0), hold: Release, role: Standby, wake: 305, reason: "started"},
			{ev: recv(50, from(idB, 7)), role: Standby, wake: 355},
		}},
		"own adverts and other groups are ignored": {steps: []step{
			{ev: at(Start, 0), hold: Release, role: Standby, wake: 315, reason: "started"},
			{ev: recv(50, from(idA, 9)), role: Standby, wake: 315},
			{ev: recv(60, Advert{Group: Group{1}, Term: 9, Sender: idB}), role: Standby, wake: 315},
			{ev: at(Tick, 315), hold: Take, send: "term 1", role: Active, wake: 415, reason: "active with term 1"},
		}},
		"a clock that goes back stands still": {steps: append(activeAt315[:5:5],
			step{ev: at(Tick, 200), role: Active, wake: 415},
		)},
		"a failed renewal: the active lets go at once, resigns, and listens as a standby": {steps: append(activeAt315[:5:5],
			step{ev: at(RenewFailed, 330), hold: Release, send: "term 1 resigning", role: Standby, wake: 645, reason: "kernel lifetime could not be renewed"},
			step{ev: recv(350, from(idB, 2)), role: Standby, wake: 665},
		)},
		"a failed renewal while resigning: lets go at once": {steps: append(activeAt315[:5:5],
			step{ev: at(Shutdown, 350), send: "term 1 resigning", role: Resigning, wake: 375, reason: "resigning"},
			step{ev: at(RenewFailed, 360), hold: Release, role: Stopped, wake: 360, reason: "could not be renewed while resigning"},
		)},
		"a failed renewal on a standby changes nothing": {steps: []step{
			{ev: at(Start, 0), hold: Release, role: Standby, wake: 315, reason: "started"},
			{ev: at(RenewFailed, 10), role: Standby, wake: 315},
		}},
		"superseded through the record: lets go without announcing, waits 30 s more, then claims the next term": {steps: append(recordedActiveAt315[:6:6],
			step{ev: record(400, idB, 3), hold: Release, role: Standby, wake: 30715, superseded: true,
				reason: "the record names 02:00:00:00:00:03 active with term 3 (ours 2), never heard on the underlay: both held the addresses; stepping down, next claim no sooner than 30.315s from now"},
			step{ev: at(Tick, 30714), role: Standby, wake: 30715},
			step{ev: at(Tick, 30715), hold: Take, send: "term 4", role: Active, wake: 30815, reason: "no advert for the dead interval: active with term 4"},
			// Superseded again without hearing anyone: the wait doubles.
			step{ev: record(30800, idB, 5), hold: Release, role: Standby, wake: 91115, superseded: true, reason: "next claim no sooner than 1m0.315s from now"},
		)},
		"superseded through the record: an advert heard ends the wait": {steps: append(recordedActiveAt315[:6:6],
			step{ev: record(400, idB, 3), hold: Release, role: Standby, wake: 30715, superseded: true, reason: "both held the addresses"},
			step{ev: recv(500, from(idB, 3)), role: Standby, wake: 815},
			step{ev: at(Tick, 815), hold: Take, send: "term 4", role: Active, wake: 915, failover: 315, reason: "no advert for the dead interval: active with term 4"},
			// The next supersede starts from 30 s again.
			step{ev: record(1000, idB, 5), hold: Release, role: Standby, wake: 31315, superseded: true, reason: "next claim no sooner than 30.315s from now"},
		)},
		// The API server was unreachable at start: the takeover could not pass the recorded term
		// (a dead pod's claim, say). Stepping down for it left nobody holding for 30 s; the
		// replica takes the next term instead and advertises it at once (the runner records it,
		// which fences that claim's author if it is alive). Once per process: the next newer
		// claim supersedes it as any.
		"a blind takeover keeps the addresses over the record's first claim with the next term, once": {steps: append(activeAt315[:5:5],
			step{ev: record(400, idB, 2), send: "term 3", role: Active, wake: 500,
				reason: "the record, read for the first time, names 02:00:00:00:00:03's claim with term 2, newer than ours (1), taken before the record could be read: keeping the addresses with term 3"},
			step{ev: at(Tick, 500), send: "term 3", role: Active, wake: 600},
			step{ev: record(550, idB, 4), hold: Release, role: Standby, wake: 30865, superseded: true, reason: "the record names 02:00:00:00:00:03 active with term 4 (ours 3)"},
		)},
		"a blind takeover whose first record is its own claim is blind no more": {steps: append(activeAt315[:5:5],
			step{ev: record(400, idA, 1), role: Active, wake: 415},
			step{ev: record(410, idB, 2), hold: Release, role: Standby, wake: 30725, superseded: true, reason: "the record names 02:00:00:00:00:03 active with term 2 (ours 1)"},
		)},
		"a takeover on the record's grant is not blind": {steps: []step{
			{ev: at(Start, 0), hold: Release, role: Standby, wake: 315, reason: "started"},
			{ev: granted(40, idA, DefaultPriority, 1), hold: Take, send: "term 1", role: Active, wake: 140, reason: "granted its first claim: active with term 1"},
			{ev: record(100, idB, 2), hold: Release, role: Standby, wake: 30415, superseded: true, reason: "the record names 02:00:00:00:00:03 active with term 2 (ours 1)"},
		}},
		"the record naming an older claim, the same one or our own changes nothing": {steps: append(activeAt315[:5:5],
			step{ev: record(320, idB, 1), role: Active, wake: 415},
			step{ev: record(330, idB, 0), role: Active, wake: 415},
			step{ev: record(340, idA, 9), role: Active, wake: 415},
			step{ev: Event{Kind: Superseded, Now: ms(350), Claim: Claim{Term: MaxTerm + 1, Sender: idB}}, role: Active, wake: 415},
			step{ev: at(Tick, 415), send: "term 1", role: Active, wake: 515},
		)},
		"the record's claim wins on priority at the same term": {steps: append(recordedActiveAt315[:6:6],
			step{ev: Event{Kind: Superseded, Now: ms(320), Claim: Claim{Term: 2, Priority: 101, Sender: idC}}, hold: Release, role: Standby, wake: 30635, superseded: true, reason: "the record names 02:00:00:00:00:01 active with term 2 (ours 2)"},
		)},
		"a standby learns the term from the record, with no wait added": {steps: []step{
			{ev: at(Start, 0), hold: Release, role: Standby, wake: 315, reason: "started"},
			{ev: record(50, idB, 7), role: Standby, wake: 315},
			{ev: at(Tick, 315), hold: Take, send: "term 8", role: Active, wake: 415, reason: "no advert for the dead interval: active with term 8"},
		}},
		"a restarted replica learns the term from its own earlier claim in the record": {steps: []step{
			{ev: at(Start, 0), hold: Release, role: Standby, wake: 315, reason: "started"},
			{ev: record(50, idA, 7), role: Standby, wake: 315},
			{ev: at(Tick, 315), hold: Take, send: "term 8", role: Active, wake: 415, reason: "no advert for the dead interval: active with term 8"},
		}},
		"resigning and superseded through the record: lets go at once": {steps: append(activeAt315[:5:5],
			step{ev: at(Shutdown, 350), send: "term 1 resigning", role: Resigning, wake: 375, reason: "resigning"},
			step{ev: record(360, idB, 2), hold: Release, role: Stopped, wake: 360, reason: "the record names 02:00:00:00:00:03's newer claim (term 2) while resigning: handed over"},
		)},
		"a slower active's advertised interval sets the dead interval": {steps: []step{
			{ev: at(Start, 0), hold: Release, role: Standby, wake: 315, reason: "started"},
			{ev: recv(50, Advert{Group: group, Term: 1, Priority: 100, Sender: idB, Interval: ms(200)}), role: Standby, wake: 665},
			{ev: at(Tick, 150), role: Standby, wake: 665},
			{ev: at(Tick, 250), role: Standby, wake: 665},
			{ev: at(Tick, 350), role: Standby, wake: 665},
			{ev: at(Tick, 450), role: Standby, wake: 665},
			{ev: at(Tick, 550), role: Standby, wake: 665},
			{ev: at(Tick, 650), role: Standby, wake: 665},
			{ev: at(Tick, 665), hold: Take, send: "term 2", role: Active, wake: 765, failover: 615, reason: "active with term 2"},
		}},
		"the record's grant of the first claim makes a standby active at once": {steps: []step{
			{ev: at(Start, 0), hold: Release, role: Standby, wake: 315, reason: "started"},
			{ev: granted(40, idA, DefaultPriority, 1), hold: Take, send: "term 1", role: Active, wake: 140, reason: "the Service's record granted its first claim: active with term 1"},
		}},
		"the grant after the record already showed it (the watch came first) holds the granted term": {steps: []step{
			{ev: at(Start, 0), hold: Release, role: Standby, wake: 315, reason: "started"},
			{ev: record(30, idA, 1), role: Standby, wake: 315},
			{ev: granted(40, idA, DefaultPriority, 1), hold: Take, send: "term 1", role: Active, wake: 140, reason: "granted its first claim: active with term 1"},
		}},
		"a grant after an advert of another replica is ignored: the dead interval decides": {steps: []step{
			{ev: at(Start, 0), hold: Release, role: Standby, wake: 315, reason: "started"},
			{ev: recv(20, from(idB, 1)), role: Standby, wake: 335},
			{ev: granted(40, idA, DefaultPriority, 2), role: Standby, wake: 335},
		}},
		"a grant after the record named another replica is ignored": {steps: []step{
			{ev: at(Start, 0), hold: Release, role: Standby, wake: 315, reason: "started"},
			{ev: record(20, idB, 1), role: Standby, wake: 315},
			{ev: granted(40, idA, DefaultPriority, 2), role: Standby, wake: 315},
		}},
		"a grant of a claim that is not this replica's next one is ignored": {steps: []step{
			{ev: at(Start, 0), hold: Release, role: Standby, wake: 315, reason: "started"},
			{ev: granted(10, idB, DefaultPriority, 1), role: Standby, wake: 315},
			{ev: granted(20, idA, DefaultPriority+1, 1), role: Standby, wake: 315},
			{ev: granted(30, idA, DefaultPriority, 0), role: Standby, wake: 315},
			{ev: granted(40, idA, DefaultPriority, MaxTerm+1), role: Standby, wake: 315},
			{ev: record(50, idA, 3), role: Standby, wake: 315},
			{ev: granted(60, idA, DefaultPriority, 2), role: Standby, wake: 315},
		}},
		"a grant while the data path is not ready is ignored": {steps: []step{
			{ev: at(Start, 0), hold: Release, role: Standby, wake: 315, reason: "started"},
			{ev: at(NotReady, 1), role: Standby, wake: 101},
			{ev: granted(40, idA, DefaultPriority, 1), role: Standby, wake: 140},
		}},
		// FirstClaims (a record that grants first claims): term 1 is the grant's. A first claim
		// the record holds for a replica that never took over with it (dead, or it heard another
		// first) then loses to a takeover at the dead interval, instead of beating it on the MAC
		// and leaving the addresses with no holder for SupersededBackoff.
		"with first claims, a takeover at the dead interval is term 2, and the record's unheld first claim supersedes nothing": {
			cfg: Config{FirstClaims: true}, steps: []step{
				{ev: at(Start, 0), hold: Release, role: Standby, wake: 315, reason: "started"},
				{ev: at(Tick, 315), hold: Take, send: "term 2", role: Active, wake: 415, reason: "no advert for the dead interval: active with term 2"},
				{ev: Event{Kind: Superseded, Now: ms(320), Claim: Claim{Term: 1, Priority: 255, Sender: idC}}, role: Active, wake: 415},
				{ev: at(Tick, 415), send: "term 2", role: Active, wake: 515},
			}},
		"with first claims, the grant is term 1, and a takeover at the dead interval by a replica that missed it wins on its first advert": {
			cfg: Config{FirstClaims: true}, steps: []step{
				{ev: at(Start, 0), hold: Release, role: Standby, wake: 315, reason: "started"},
				{ev: granted(40, idA, DefaultPriority, 1), hold: Take, send: "term 1", role: Active, wake: 140, reason: "granted its first claim: active with term 1"},
				{ev: recv(60, from(idB, 2)), hold: Release, role: Standby, wake: 375, reason: "02:00:00:00:00:03 is active with term 2 (ours 1): stepping down"},
			}},
		"a grant to an active changes nothing": {steps: append(activeAt315[:5:5],
			step{ev: granted(320, idA, DefaultPriority, 2), role: Active, wake: 415},
		)},
		// Lost: the queue socket missed frames (a flood). A due claim waits one dead interval and
		// the skew from the loss, with the adverts read at once; a second loss with no advert
		// heard in between defers nothing, so a flood that lasts delays a failover once.
		"frames lost in the queue: the due claim is deferred once, then made": {steps: []step{
			{ev: at(Start, 0), hold: Release, role: Standby, wake: 315, reason: "started"},
			{ev: at(Lost, 315), role: Standby, wake: 630, atOnce: true, reason: "frames were lost in the queue socket (a flood?): reading every advert at once, no claim before 315ms from now"},
			{ev: at(Tick, 500), role: Standby, wake: 630, atOnce: true},
			{ev: at(Lost, 630), role: Standby, wake: 630, atOnce: true},
			{ev: at(Tick, 630), hold: Take, send: "term 1", role: Active, wake: 730, reason: "no advert for the dead interval: active with term 1"},
		}},
		"an advert heard after a loss: the standby queues again, and the next loss defers again": {steps: []step{
			{ev: at(Start, 0), hold: Release, role: Standby, wake: 315, reason: "started"},
			{ev: recv(50, from(idB, 4)), role: Standby, wake: 365},
			{ev: at(Lost, 365), role: Standby, wake: 680, atOnce: true, reason: "no claim before 315ms from now"},
			{ev: recv(400, from(idB, 4)), role: Standby, wake: 715},
			{ev: at(Lost, 715), role: Standby, wake: 1030, atOnce: true, reason: "no claim before 315ms from now"},
			{ev: at(Lost, 1030), role: Standby, wake: 1030, atOnce: true},
			{ev: at(Tick, 1030), hold: Take, send: "term 5", role: Active, wake: 1130, failover: 630, reason: "no advert for the dead interval: active with term 5"},
		}},
		"a loss before the deadline: no claim before one dead interval from the loss": {steps: []step{
			{ev: at(Start, 0), hold: Release, role: Standby, wake: 315, reason: "started"},
			{ev: recv(50, from(idB, 4)), role: Standby, wake: 365},
			{ev: at(Lost, 200), role: Standby, wake: 515, atOnce: true, reason: "no claim before 315ms from now"},
			{ev: at(Tick, 515), hold: Take, send: "term 5", role: Active, wake: 615, failover: 465, reason: "active with term 5"},
		}},
		// The runner reads the queue before the resignation that woke it: a loss seen then makes
		// the resignation count from one interval after it, as after a start (listen), by when
		// a live successor's advert, read at once, would have ended the wait.
		"a resignation right after a loss counts from one interval after it": {steps: []step{
			{ev: at(Start, 0), hold: Release, role: Standby, wake: 315, reason: "started"},
			{ev: recv(50, from(idB, 2)), role: Standby, wake: 365},
			{ev: at(Lost, 365), role: Standby, wake: 680, atOnce: true, reason: "no claim before 315ms from now"},
			{ev: recv(370, resigning(from(idB, 2))), role: Standby, wake: 480},
			{ev: at(Tick, 480), hold: Take, send: "term 3", role: Active, wake: 580, failover: 110, reason: "the active resigned: active with term 3"},
		}},
		"a loss after a resignation heard defers nothing": {steps: []step{
			{ev: at(Start, 0), hold: Release, role: Standby, wake: 315, reason: "started"},
			{ev: recv(50, from(idB, 2)), role: Standby, wake: 365},
			{ev: recv(120, resigning(from(idB, 2))), role: Standby, wake: 135},
			{ev: at(Lost, 135), role: Standby, wake: 135},
			{ev: at(Tick, 135), hold: Take, send: "term 3", role: Active, wake: 235, failover: 15, reason: "the active resigned: active with term 3"},
		}},
		"a loss on an active changes nothing; a step-down queues again": {steps: append(activeAt315[:5:5],
			step{ev: at(Lost, 320), role: Active, wake: 415},
			step{ev: recv(330, from(idB, 2)), hold: Release, role: Standby, wake: 645, reason: "stepping down"},
			step{ev: at(Lost, 645), role: Standby, wake: 960, atOnce: true, reason: "no claim before 315ms from now"},
		)},
		// With a key, a version-1 advert of the legacy window (anyone can send one) does not
		// re-arm the deferral.
		"an unauthenticated advert in the legacy window does not re-arm the deferral": {cfg: Config{Authenticated: true, LegacyWindow: time.Minute}, steps: []step{
			{ev: at(Start, 0), hold: Release, role: Standby, wake: 315, reason: "started"},
			{ev: at(Lost, 315), role: Standby, wake: 630, atOnce: true, reason: "no claim before 315ms from now"},
			{ev: recv(400, from(idB, 4)), role: Standby, wake: 765, atOnce: true},
			{ev: at(Lost, 765), role: Standby, wake: 765, atOnce: true},
			{ev: at(Tick, 765), hold: Take, send: "term 5", role: Active, wake: 865, failover: 365, reason: "active with term 5"},
		}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) { runSteps(t, tc.cfg, tc.steps) })
	}
}

// runSteps feeds steps to a machine of cfg (ID idA, priority 100 and the fixed VRRP figures
// unless set) and checks each output exactly.
func runSteps(t *testing.T, cfg Config, steps []step) {
	t.Helper()
	cfg.ID, cfg.Group = cmp.Or(cfg.ID, idA), group
	if cfg.Priority == 0 {
		cfg.Priority = DefaultPriority
	}
	if cfg.MaxSlack == 0 {
		// These cases pin the fixed VRRP figures with inputs far apart; TestSlack covers how
		// lateness stretches them.
		cfg.MaxSlack = -1
	}
	m := NewMachine(cfg)
	for i, s := range steps {
		out := m.Handle(s.ev)
		got := fmt.Sprintf("hold=%s send=%q role=%s wake=%s failover=%s done=%t superseded=%t",
			out.Hold, describeSend(out.Send), out.Role, out.Wake, out.Failover, out.Done, out.Superseded != nil)
		want := fmt.Sprintf("hold=%s send=%q role=%s wake=%s failover=%s done=%t superseded=%t",
			s.hold, s.send, s.role, ms(s.wake), ms(s.failover), s.role == Stopped, s.superseded)
		if s.superseded && out.Superseded != nil && *out.Superseded != s.ev.Claim {
			t.Fatalf("step %d: Superseded %+v, want the record's claim %+v", i, *out.Superseded, s.ev.Claim)
		}
		if got != want {
			t.Fatalf("step %d (%s at %s):\n got %s\nwant %s (reason %q)", i, s.ev.Kind, s.ev.Now, got, want, out.Reason)
		}
		if queueing := out.Role == Standby && !s.atOnce; m.Queueing() != queueing {
			t.Fatalf("step %d (%s at %s): queueing %t, want %t", i, s.ev.Kind, s.ev.Now, m.Queueing(), queueing)
		}
		if (s.reason == "") != (out.Reason == "") || !strings.Contains(out.Reason, s.reason) {
			t.Fatalf("step %d (%s at %s): reason %q, want one containing %q", i, s.ev.Kind, s.ev.Now, out.Reason, s.reason)
		}
		if out.Send != nil && (out.Send.Sender != cfg.ID || out.Send.Group != group || out.Send.Priority != cfg.Priority || out.Send.Interval != DefaultInterval) {
			t.Fatalf("step %d: advert %+v does not carry our ID, group, priority and interval", i, *out.Send)
		}
	}
}

// A resignation moves the deadline only when it comes from the active this replica follows, at
// the newest term it knows of. The case it guards against: active C (term 5) resigns, B takes
// over at term 6, and a capture of C's resignation is replayed within the replay window to a
// replica whose guard has not seen it (one that just started, or follows B). Obeyed, the
// replica claimed after its skew, before B's next advert, and B stepped down: a failover for
// nothing. Here it changes nothing and the dead interval decides. Replayed right after one of
// C's adverts to a replica that just started (which then follows C), it counts only from one
// advert interval after the start, by when B's advert has come and ended the wait. The
// legitimate hand-over is TestMachine's "a resignation makes the standby take over after its skew
// only".
func TestResignationOnlyFromFollowedActive(t *testing.T) {
	for name, steps := range map[string][]step{
		"following B (term 6), C's resignation (term 5): no early claim": {
			{ev: at(Start, 0), hold: Release, role: Standby, wake: 315, reason: "started"},
			{ev: recv(50, from(idB, 6)), role: Standby, wake: 365},
			{ev: recv(120, resigning(from(idC, 5))), role: Standby, wake: 365},
			{ev: at(Tick, 364), role: Standby, wake: 365},
			{ev: at(Tick, 365), hold: Take, send: "term 7", role: Active, wake: 465, failover: 315, reason: "no advert for the dead interval: active with term 7"},
		},
		"following C again after a replay of its advert, its resignation older than B's term: no early claim": {
			{ev: at(Start, 0), hold: Release, role: Standby, wake: 315, reason: "started"},
			{ev: recv(50, from(idB, 6)), role: Standby, wake: 365},
			{ev: recv(60, from(idC, 5)), role: Standby, wake: 375},
			{ev: recv(70, resigning(from(idC, 5))), role: Standby, wake: 375},
			{ev: at(Tick, 375), hold: Take, send: "term 7", role: Active, wake: 475, failover: 315, reason: "no advert for the dead interval: active with term 7"},
		},
		"an active that stepped down for B follows B: B's resignation still hands over after the skew": append(activeAt315[:5:5],
			step{ev: recv(330, from(idB, 2)), hold: Release, role: Standby, wake: 645, reason: "stepping down"},
			step{ev: recv(360, resigning(from(idB, 2))), role: Standby, wake: 375},
			step{ev: at(Tick, 375), hold: Take, send: "term 3", role: Active, wake: 475, failover: 15, reason: "the active resigned: active with term 3"},
		),
		"just started, C's advert and resignation replayed: counted from one interval after the start, and B's advert ends the wait": {
			{ev: at(Start, 0), hold: Release, role: Standby, wake: 315, reason: "started"},
			{ev: recv(10, from(idC, 5)), role: Standby, wake: 325},
			{ev: recv(20, resigning(from(idC, 5))), role: Standby, wake: 115},
			{ev: recv(90, from(idB, 6)), role: Standby, wake: 405},
			{ev: at(Tick, 405), hold: Take, send: "term 7", role: Active, wake: 505, failover: 315, reason: "no advert for the dead interval: active with term 7"},
		},
		"just started, the active's real resignation: a takeover one interval and the skew after the start": {
			{ev: at(Start, 0), hold: Release, role: Standby, wake: 315, reason: "started"},
			{ev: recv(10, from(idC, 5)), role: Standby, wake: 325},
			{ev: recv(20, resigning(from(idC, 5))), role: Standby, wake: 115},
			{ev: at(Tick, 115), hold: Take, send: "term 6", role: Active, wake: 215, failover: 95, reason: "the active resigned: active with term 6"},
		},
		"the link back up: a resignation counts from one interval after, as after a start": {
			{ev: at(Start, 0), hold: Release, role: Standby, wake: 315, reason: "started"},
			{ev: recv(50, from(idB, 2)), role: Standby, wake: 365},
			{ev: at(LinkDown, 100), role: Standby, wake: 200},
			{ev: at(LinkUp, 400), role: Standby, wake: 715},
			{ev: recv(420, resigning(from(idB, 2))), role: Standby, wake: 515},
			{ev: at(Tick, 515), hold: Take, send: "term 3", role: Active, wake: 615, failover: 95, reason: "the active resigned: active with term 3"},
		},
		"a fresh replica that heard nobody: no early claim, it claims after its dead interval": {
			{ev: at(Start, 0), hold: Release, role: Standby, wake: 315, reason: "started"},
			{ev: recv(100, resigning(from(idC, 5))), role: Standby, wake: 315},
			// A second one (the resigning replica repeats it) is no more followed than the first.
			{ev: recv(125, resigning(from(idC, 5))), role: Standby, wake: 315},
			{ev: at(Tick, 314), role: Standby, wake: 315},
			{ev: at(Tick, 315), hold: Take, send: "term 6", role: Active, wake: 415, reason: "no advert for the dead interval: active with term 6"},
		},
	} {
		t.Run(name, func(t *testing.T) { runSteps(t, Config{}, steps) })
	}
}

// TestSlack: lateness stretches the dead interval (on both sides), the active advertises it, the
// slack decays, and a holder still steps down when it was frozen past what it advertised.
func TestSlack(t *testing.T) {
	mustOut := func(t *testing.T, m *Machine, ev Event, role Role, hold Hold, sendInterval int) Output {
		t.Helper()
		out := m.Handle(ev)
		if out.Role != role || out.Hold != hold {
			t.Fatalf("%s at %s: role %s hold %s, want %s %s (reason %q)", ev.Kind, ev.Now, out.Role, out.Hold, role, hold, out.Reason)
		}
		switch {
		case sendInterval == 0 && out.Send != nil:
			t.Fatalf("%s at %s: sent %+v, want nothing", ev.Kind, ev.Now, *out.Send)
		case sendInterval != 0 && (out.Send == nil || out.Send.Interval != ms(sendInterval)):
			t.Fatalf("%s at %s: sent %+v, want an advert with interval %dms", ev.Kind, ev.Now, out.Send, sendInterval)
		}
		return out
	}
	active := func(t *testing.T) *Machine {
		m := NewMachine(Config{ID: idA, Group: group, Priority: DefaultPriority})
		for _, s := range activeAt315 {
			m.Handle(s.ev)
		}
		if m.Role() != Active || m.Slack() != 0 {
			t.Fatalf("setup: role %s slack %s, want active with no slack", m.Role(), m.Slack())
		}
		return m
	}

	t.Run("a late active advertises a longer interval, which decays", func(t *testing.T) {
		m := active(t)
		mustOut(t, m, at(Tick, 415), Active, Keep, 100)
		// 200 ms since the last input: 100 ms late; slack twice that.
		mustOut(t, m, at(Tick, 615), Active, Keep, 167) // 100 + ceil(200/3)
		if m.Slack() != ms(200) || m.HoldFor() != ms(300) {
			t.Fatalf("slack %s hold-for %s, want 200ms and 300ms (the shorter of the last two adverts)", m.Slack(), m.HoldFor())
		}
		mustOut(t, m, at(Tick, 715), Active, Keep, 165) // decayed by 100/20 ms: 195 ms
		if m.HoldFor() != ms(495) {
			t.Fatalf("hold-for %s, want 495ms (3 × 165ms)", m.HoldFor())
		}
		// 485 ms of silence is within what it advertised: it goes on, with more slack.
		mustOut(t, m, at(Tick, 1200), Active, Keep, 357) // slack 2 × 385 = 770 ms
		for now := 1300; now <= 30000; now += 100 {
			m.Handle(at(Tick, now))
		}
		if m.Slack() != 0 {
			t.Fatalf("slack %s after 29 s of on-time adverts, want 0", m.Slack())
		}
		mustOut(t, m, at(Tick, 30100), Active, Keep, 100)
	})

	t.Run("frozen past what it advertised: the active is silent until it has read the queue", func(t *testing.T) {
		m := active(t)
		mustOut(t, m, at(Tick, 415), Active, Keep, 100)
		mustOut(t, m, at(Tick, 615), Active, Keep, 167)
		mustOut(t, m, at(Tick, 715), Active, Keep, 165)
		mustOut(t, m, at(Tick, 1211), Active, Keep, 0) // 496 ms > 3 × 165 ms: frozen
		if !m.Verifying() {
			t.Fatal("not verifying after a freeze")
		}
		out := mustOut(t, m, at(Verified, 1211), Active, Keep, 364) // stretched by the lateness seen
		if !strings.Contains(out.Reason, "frozen for 496ms") {
			t.Fatalf("reason %q, want it to say frozen for 496ms", out.Reason)
		}
	})
	t.Run("just within what it advertised: no freeze", func(t *testing.T) {
		m := active(t)
		mustOut(t, m, at(Tick, 415), Active, Keep, 100)
		mustOut(t, m, at(Tick, 615), Active, Keep, 167)
		mustOut(t, m, at(Tick, 715), Active, Keep, 165)
		mustOut(t, m, at(Tick, 1210), Active, Keep, 364)
		if m.Verifying() {
			t.Fatal("verifying without a freeze")
		}
	})

	t.Run("a standby stretches its wait after gaps between the active's adverts", func(t *testing.T) {
		m := NewMachine(Config{ID: idA, Group: group, Priority: DefaultPriority})
		m.Handle(at(Start, 0))
		for now := 50; now <= 250; now += 100 {
			out := mustOut(t, m, recv(now, from(idB, 1)), Standby, Keep, 0)
			if want := ms(now + 300 + 15); m.deadline != want || out.Wake != want {
				t.Fatalf("at %dms: deadline %s wake %s, want both %s (a standby sleeps until its deadline)", now, m.deadline, out.Wake, want)
			}
		}
		// Ticks on time, then an advert 250 ms after the last: 150 ms late, slack 300 ms.
		m.Handle(at(Tick, 350))
		m.Handle(recv(500, from(idB, 1)))
		if m.Slack() != ms(300) || m.deadline != ms(500+300+300+15) {
			t.Fatalf("slack %s deadline %s, want 300ms and 1.115s", m.Slack(), m.deadline)
		}
		// The active's own stretched interval adds to it.
		a := from(idB, 1)
		a.Interval = ms(200)
		m.Handle(at(Tick, 600))
		m.Handle(recv(650, a))
		if want := ms(650) + 3*ms(200) + m.Slack() + ms(15); m.deadline != want {
			t.Fatalf("deadline %s, want %s", m.deadline, want)
		}
		if m.ClaimDue(m.deadline-time.Millisecond) || !m.ClaimDue(m.deadline) {
			t.Fatalf("ClaimDue around the deadline %s: want false just before, true at it", m.deadline)
		}
		// It wakes every interval (on time: no more slack) and takes over at the deadline.
		now := ms(650)
		for ; now+DefaultInterval < m.deadline; now += DefaultInterval {
			mustOut(t, m, Event{Kind: Tick, Now: now + DefaultInterval}, Standby, Keep, 0)
		}
		d := m.deadline
		out := m.Handle(Event{Kind: Tick, Now: d})
		if out.Role != Active || out.Hold != Take || out.Failover != d-ms(650) {
			t.Fatalf("tick at the deadline %s: %+v, want a takeover with failover %s", d, out, d-ms(650))
		}
	})

	t.Run("MaxSlack bounds it; negative turns it off", func(t *testing.T) {
		// Not ready: it asks to be woken every interval.
		m := NewMachine(Config{ID: idA, Group: group, MaxSlack: ms(500)})
		m.Handle(at(Start, 0))
		m.Handle(at(NotReady, 0))
		m.Handle(at(Tick, 290)) // woken 190 ms after the 100 ms it asked for
		if m.Slack() != ms(380) {
			t.Fatalf("slack %s, want 380ms", m.Slack())
		}
		m.Handle(at(Tick, 790)) // 400 ms late: twice that is 800 ms, bounded to 500 ms
		if m.Slack() != ms(500) {
			t.Fatalf("slack %s, want MaxSlack 500ms", m.Slack())
		}
		off := NewMachine(Config{ID: idA, Group: group, MaxSlack: -1})
		off.Handle(at(Start, 0))
		off.Handle(at(NotReady, 0))
		off.Handle(at(Tick, 290))
		if off.Slack() != 0 {
			t.Fatalf("slack %s with MaxSlack -1, want 0", off.Slack())
		}
	})
}

// TestForgedAdvertOutage replays issue 22 with the real machines of three replicas. The issue's
// frame: the largest term, priority 255 and the longest interval the wire carries, sent twice
// 10 ms apart by a sender that is no replica. Before the machine refused such frames, the active
// stepped down to the made-up sender, the second frame reached it as a standby, and every replica
// then waited 3 × 65.535 s for an advert that never came: more than three minutes with no holder
// (and the term wrapped to 0 at the next takeover). Without a key that frame is refused as
// impossible, but a plausible one (a resignation from a made-up sender) still moved the address.
// With the key every forged or replayed frame is refused, by every replica, for its exact reason:
// the active keeps the addresses, nobody's wait changes, and the term stays what it was.
func TestForgedAdvertOutage(t *testing.T) {
	madeUp := ID{2, 0xba, 0xd0, 0, 0, 1}
	issue := Advert{Group: group, Term: math.MaxUint64, Priority: 255, Sender: madeUp, Interval: MaxInterval}
	resign := Advert{Group: group, Term: 1, Priority: 255, Sender: madeUp, Interval: DefaultInterval, Resigning: true}
	newer := Advert{Group: group, Term: 1000, Priority: 255, Sender: madeUp, Interval: 2 * time.Second}
	wrongKey := func(s *sim, a Advert) []byte {
		return mustKey(t, otherSecret).Seal(a, uint64(s.wall(s.replicas[0]).UnixMicro()))
	}
	for name, tc := range map[string]struct {
		keyless bool
		frames  func(s *sim) [][]byte
		// refused: the refusals, summed over the three replicas (each hears every frame).
		refused map[string]int
	}{
		"without a key: the issue's frame, twice": {keyless: true,
			frames:  func(*sim) [][]byte { return [][]byte{issue.Marshal(), issue.Marshal()} },
			refused: map[string]int{RefusedTerm: 6}},
		"the issue's frame, twice": {
			frames:  func(*sim) [][]byte { return [][]byte{issue.Marshal(), issue.Marshal()} },
			refused: map[string]int{RefusedUnauthenticated: 6}},
		"a resignation and a newer term from a made-up sender": {
			frames:  func(*sim) [][]byte { return [][]byte{resign.Marshal(), newer.Marshal()} },
			refused: map[string]int{RefusedUnauthenticated: 6}},
		"the same, sealed with another key": {
			frames: func(s *sim) [][]byte {
				return [][]byte{wrongKey(s, resign), wrongKey(s, newer), wrongKey(s, issue)}
			},
			refused: map[string]int{RefusedAuth: 9}},
		"the active's advert replayed": {
			// 20 ms old: both standbys have it (deliveries take at most 10 ms); the active ignores
			// its own.
			frames:  func(s *sim) [][]byte { return [][]byte{s.wire[len(s.wire)-1]} },
			refused: map[string]int{RefusedReplay: 2}},
		"the active's first advert, replayed a minute later": {
			frames:  func(s *sim) [][]byte { return [][]byte{s.wire[0]} },
			refused: map[string]int{RefusedStale: 2}},
	} {
		t.Run(name, func(t *testing.T) {
			var keyless []int
			if tc.keyless {
				keyless = []int{0, 1, 2}
			}
			s := newSim(t, 3, 1, DefaultLegacyWindow, keyless...)
			s.run(time.Minute)
			first := s.holder()
			if first < 0 {
				t.Fatalf("no holder after a minute:\n%s", strings.Join(s.log, "\n"))
			}
			term := s.replicas[first].m.Term()
			frames := tc.frames(s)
			s.run(20 * time.Millisecond)
			begin := s.now
			for _, f := range frames {
				s.send(f, true, -1)
				s.run(10 * time.Millisecond)
			}
			outage := s.outage(begin, 4*time.Minute)
			t.Logf("outage after the frames: %s", outage)
			if outage > 0 {
				t.Fatalf("the frames left the Service without a holder for %s:\n%s", outage, strings.Join(s.log[max(0, len(s.log)-20):], "\n"))
			}
			if h := s.holder(); h != first || s.replicas[h].m.Term() != term {
				t.Fatalf("holder r%d term %d after the frames, want r%d still with term %d", h, s.replicas[max(h, 0)].m.Term(), first, term)
			}
			for i, r := range s.replicas {
				if r.m.Term() >= 1<<63 {
					t.Errorf("r%d took term %d from a forged advert", i, r.m.Term())
				}
			}
			if fmt.Sprint(s.refused) != fmt.Sprint(tc.refused) {
				t.Errorf("refused %v, want %v", s.refused, tc.refused)
			}
		})
	}
}

// outage steps the model from begin until the addresses are held again after a gap, or for two
// seconds while they stay held, or until limit passes, and returns the gap.
func (s *sim) outage(begin, limit time.Duration) time.Duration {
	var gapFrom, outage time.Duration = -1, 0
	for end := begin + limit; s.now < end; s.now += time.Millisecond {
		s.step()
		switch h := s.holder(); {
		case h < 0 && gapFrom < 0:
			gapFrom = s.now
		case h >= 0 && gapFrom >= 0:
			return s.now - gapFrom
		}
		if s.now-begin > 2*time.Second && gapFrom < 0 && outage == 0 {
			return 0 // held throughout for two seconds
		}
	}
	if gapFrom >= 0 {
		outage = s.now - gapFrom
	}
	return outage
}

// TestRefused: adverts that no replica of the Service can send are refused, reported, and change
// nothing at all; the edges of what is accepted are accepted.
func TestRefused(t *testing.T) {
	sane := from(idB, 7)
	with := func(f func(a *Advert)) Advert { a := sane; f(&a); return a }
	for name, tc := range map[string]struct {
		cfg  Config
		a    Advert
		want string
	}{
		"the largest term":                   {a: with(func(a *Advert) { a.Term = math.MaxUint64 }), want: RefusedTerm},
		"a term of 2^63":                     {a: with(func(a *Advert) { a.Term = 1 << 63 }), want: RefusedTerm},
		"MaxTerm itself":                     {a: with(func(a *Advert) { a.Term = MaxTerm })},
		"the longest interval of the wire":   {a: with(func(a *Advert) { a.Interval = MaxInterval }), want: RefusedInterval},
		"just above the range":               {a: with(func(a *Advert) { a.Interval = ms(2001) }), want: RefusedInterval},
		"2 s: 1 s stretched by a full slack": {a: with(func(a *Advert) { a.Interval = ms(2000) })},
		"10 ms: the operator's shortest":     {a: with(func(a *Advert) { a.Interval = ms(10) })},
		"9 ms":                               {a: with(func(a *Advert) { a.Interval = ms(9) }), want: RefusedInterval},
		"no interval":                        {a: with(func(a *Advert) { a.Interval = 0 }), want: RefusedInterval},
		"own interval below the range":       {cfg: Config{Interval: ms(5)}, a: with(func(a *Advert) { a.Interval = ms(5) })},
		"own interval above the range":       {cfg: Config{Interval: ms(3000)}, a: with(func(a *Advert) { a.Interval = ms(4000) })},
		"above own interval's stretch":       {cfg: Config{Interval: ms(3000)}, a: with(func(a *Advert) { a.Interval = ms(4001) }), want: RefusedInterval},
		"a configured range":                 {cfg: Config{MinPeerInterval: ms(50), MaxPeerInterval: ms(200)}, a: with(func(a *Advert) { a.Interval = ms(201) }), want: RefusedInterval},
		"a zero sender":                      {a: with(func(a *Advert) { a.Sender = ID{} }), want: RefusedSender},
		"a group MAC as sender":              {a: with(func(a *Advert) { a.Sender = ID{0x03, 0x6c, 0x62, 0x73, 0x76, 0x63} }), want: RefusedSender},
		"a refused resignation":              {a: with(func(a *Advert) { a.Resigning, a.Interval = true, MaxInterval }), want: RefusedInterval},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.ID, cfg.Group, cfg.MaxSlack = idA, group, -1
			// An active and a standby that heard an active: each must come out unchanged.
			active, standby := NewMachine(cfg), NewMachine(cfg)
			for _, s := range activeAt315 {
				active.Handle(s.ev)
			}
			standby.Handle(at(Start, 0))
			standby.Handle(recv(50, from(idC, 3)))
			for _, m := range []*Machine{active, standby} {
				before := *m
				out := m.Handle(recv(330, tc.a))
				if out.Refused != tc.want {
					t.Fatalf("%s: refused %q, want %q", before.role, out.Refused, tc.want)
				}
				if tc.want == "" {
					continue
				}
				if *m != before {
					t.Fatalf("%s: a refused advert changed the machine:\n got %+v\nwant %+v", before.role, *m, before)
				}
				if out.Hold != Keep || out.Send != nil || out.Role != before.role || out.Wake != before.wakeAt || out.Reason != "" {
					t.Fatalf("%s: refused advert's output %+v, want the same role and wake, nothing to do", before.role, out)
				}
			}
		})
	}
}

// TestTermSaturates: a takeover after the highest term accepted stays at MaxTerm instead of
// wrapping to 0 (which every older term would beat).
func TestTermSaturates(t *testing.T) {
	m := NewMachine(Config{ID: idA, Group: group, Priority: DefaultPriority, MaxSlack: -1})
	m.Handle(at(Start, 0))
	m.Handle(recv(10, from(idB, MaxTerm)))
	out := m.Handle(at(Tick, 325))
	if out.Hold != Take || m.Term() != MaxTerm || out.Send == nil || out.Send.Term != MaxTerm {
		t.Fatalf("takeover after term MaxTerm: %+v, term %d; want it active with MaxTerm", out, m.Term())
	}
	if nextTerm(math.MaxUint64) != MaxTerm || nextTerm(1) != 2 {
		t.Fatal("nextTerm does not saturate at MaxTerm")
	}
}
