package ha

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"hash"
	"time"
)

// Authenticated adverts, wire version 2: the version 1 header (same fields, version byte 2), then
//
//	32 sequence (uint64, the sender's wall clock in microseconds since the Unix epoch, strictly
//	   increasing per sender)
//	40 tag: HMAC-SHA256 over macContext and bytes 0 to 39, truncated to 16 bytes
//
// 56 bytes in all. The tag covers the group (a key authenticates its own group's adverts only,
// even were it shared by mistake) and the fixed context (the key can never be made to authenticate
// anything but a version-2 advert: no other message uses that prefix). Truncated to 128 bits, as
// RFC 2104 allows (at least half the hash): a forger gets one guess per frame sent on the wire,
// and 2^128 guesses are out of reach, so the other 16 bytes would only lengthen every advert.
const (
	authVersion = 2
	seqLen      = 8
	tagLen      = 16
	sealedLen   = advertLen + seqLen + tagLen
	// MinKeyLen is the shortest key accepted: 128 bits. The operator's Secret has 32 random bytes.
	MinKeyLen = 16
)

// macContext separates our MACs from any other use of the key.
const macContext = "lbsvc.io/ha advert v2\x00"

// Why an authenticated (or would-be authenticated) advert is refused; see Guard.Open. With
// RefusedUnauthenticated (machine.go) they are the reason label of
// lbpod_ha_adverts_rejected_total.
const (
	// RefusedAuth: a version-2 frame whose tag does not verify with our key (a forger, or a
	// replica of another claim with another key).
	RefusedAuth = "auth"
	// RefusedReplay: an authenticated frame whose sequence is not above the last one accepted from
	// its sender: a copy replayed from the wire.
	RefusedReplay = "replay"
	// RefusedStale: an authenticated frame whose sequence is further than Config.ReplayWindow from
	// our wall clock: an old capture replayed to a receiver that never heard its sender, or a
	// sender whose clock is that far off.
	RefusedStale = "stale"
)

// Default windows (Config.ReplayWindow, Config.LegacyWindow); doc.go says why these values.
const (
	DefaultReplayWindow = 10 * time.Second
	DefaultLegacyWindow = 2 * time.Minute
)

// DefaultCopyWindow is Config.CopyWindow's flag default (--ha-copy-window): as long as a rollout
// runs, as the legacy window.
const DefaultCopyWindow = 2 * time.Minute

// replayCap bounds the senders a Replay remembers: a Service has at most 5 replicas, and a
// rollout or a few pod replacements add some (each pod's net1 has its own MAC).
const replayCap = 32

// Frame is an advert as read off the wire, of either version.
type Frame struct {
	Advert Advert
	// Version is 1 (unauthenticated) or 2 (sealed: Seq and the tag follow the header).
	Version uint8
	Seq     uint64
	// GroupAddressed: the sender sends to its group's address (flagGroupAddressed). A frame
	// without it comes from a replica that listens only on MulticastMAC.
	GroupAddressed bool
	// sealed is the version-2 frame as received (header, sequence, tag), for Key.verify.
	sealed [sealedLen]byte
}

// ParseFrame decodes an advert of wire version 1 or 2; trailing bytes (Ethernet padding) are
// ignored. A version-2 frame is not verified here (Guard.Open does).
func ParseFrame(b []byte) (Frame, error) {
	if len(b) > 4 && b[4] == authVersion && [4]byte(b[0:4]) == advertMagic {
		if len(b) < sealedLen {
			return Frame{}, fmt.Errorf("%w: %d bytes, want %d for version %d", errNotAdvert, len(b), sealedLen, authVersion)
		}
		f := Frame{Advert: decodeHeader(b), Version: authVersion, Seq: binary.BigEndian.Uint64(b[advertLen:]),
			GroupAddressed: b[5]&flagGroupAddressed != 0}
		copy(f.sealed[:], b)
		return f, nil
	}
	a, err := ParseAdvert(b)
	return Frame{Advert: a, Version: advertVersion, GroupAddressed: err == nil && b[5]&flagGroupAddressed != 0}, err
}

// Key seals and verifies adverts with the Service's secret. It keeps one HMAC state: not safe
// for concurrent use (Run uses it on the election's goroutine only).
type Key struct{ mac hash.Hash }

// NewKey returns the key for secret, which must have at least MinKeyLen bytes.
func NewKey(secret []byte) (*Key, error) {
	if len(secret) < MinKeyLen {
		return nil, fmt.Errorf("ha key: %d bytes, want at least %d", len(secret), MinKeyLen)
	}
	return &Key{mac: hmac.New(sha256.New, secret)}, nil
}

// tag computes the tag of the first advertLen+seqLen bytes of b into dst.
func (k *Key) tag(dst, b []byte) {
	k.mac.Reset()
	k.mac.Write([]byte(macContext))
	k.mac.Write(b[:advertLen+seqLen])
	var sum [sha256.Size]byte
	copy(dst, k.mac.Sum(sum[:0]))
}

// Seal encodes a as a version-2 frame with sequence seq.
func (k *Key) Seal(a Advert, seq uint64) []byte { return k.seal(a, seq, 0) }

// seal is Seal with the wire flags set (the tag covers them).
func (k *Key) seal(a Advert, seq uint64, flags byte) []byte {
	b := make([]byte, sealedLen)
	copy(b, a.marshal(flags))
	b[4] = authVersion
	binary.BigEndian.PutUint64(b[advertLen:], seq)
	k.tag(b[advertLen+seqLen:], b)
	return b
}

// verify says whether f is a version-2 frame sealed with this key.
func (k *Key) verify(f *Frame) bool {
	if f.Version != authVersion {
		return false
	}
	var want [tagLen]byte
	k.tag(want[:], f.sealed[:])
	return hmac.Equal(want[:], f.sealed[advertLen+seqLen:])
}

// Sequencer numbers one sender's sealed frames: its wall clock in microseconds, or one more
// than the last number when the clock has not moved on (or went back a little). A process that
// restarts in the same pod (same net1 MAC, so the same sender for the receivers) starts again
// from its wall clock, which is past every number it sent before.
type Sequencer struct{ last uint64 }

// Next is the sequence number for a frame sent at wall, received with the replay window window
// (DefaultReplayWindow when not positive). When the last number is more than half the window
// ahead of the clock, the clock stepped back that far: counting on from the last number would
// leave every frame further ahead of the receivers' clocks (which took the same step) than the
// window, refused as stale until the clock caught up. It starts again from the clock instead;
// receivers whose clock stepped back by more than a quarter of the window have forgotten the
// old numbers (Replay.Check), so they accept the new ones at once.
func (s *Sequencer) Next(wall time.Time, window time.Duration) uint64 {
	if window <= 0 {
		window = DefaultReplayWindow
	}
	now := uint64(max(wall.UnixMicro(), 0))
	if s.last > now+uint64(window.Microseconds()/2) {
		s.last = 0
	}
	n := max(now, s.last+1)
	s.last = n
	return n
}

// Replay remembers the last sequence accepted from each authenticated sender and refuses what
// is not newer, or lies outside the window around the receiver's wall clock. It is pure: the
// caller passes the wall time. Only senders whose frames verified are stored, at most replayCap;
// beyond that the one heard longest ago (lowest sequence) is forgotten, and its old frames are
// then kept out by the window alone. When the wall clock steps back by more than a quarter of
// the window, it forgets every sender: their numbers from before the step would refuse as
// replays the restarted numbers of senders whose clock took the same step (Sequencer.Next
// restarts beyond half the window; the quarter leaves room for the time between two checks).
// Until the senders' new numbers are recorded, the window alone keeps captures out.
type Replay struct {
	window time.Duration
	last   map[ID]uint64
	// seen is the latest wall time checked, in microseconds.
	seen int64
}

// NewReplay returns an empty Replay with the given window (DefaultReplayWindow when not
// positive).
func NewReplay(window time.Duration) *Replay {
	if window <= 0 {
		window = DefaultReplayWindow
	}
	return &Replay{window: window, last: map[ID]uint64{}}
}

// Check says why sequence seq from sender is refused at wall time wall (RefusedStale,
// RefusedReplay), or "" when it is accepted, and then records it.
func (r *Replay) Check(sender ID, seq uint64, wall time.Time) string {
	now, w := wall.UnixMicro(), r.window.Microseconds()
	if now < r.seen-w/4 {
		clear(r.last)
		r.seen = now
	}
	r.seen = max(r.seen, now)
	if s := int64(min(seq, 1<<63-1)); s < now-w || s > now+w {
		return RefusedStale
	}
	if last, ok := r.last[sender]; ok && seq <= last {
		return RefusedReplay
	}
	if _, ok := r.last[sender]; !ok && len(r.last) >= replayCap {
		var oldest ID
		first := true
		for id, s := range r.last {
			if first || s < r.last[oldest] {
				oldest, first = id, false
			}
		}
		delete(r.last, oldest)
	}
	r.last[sender] = seq
	return ""
}

// Guard is the receiving half of the authentication for one replica: it verifies a frame's
// tag with the key and its sequence with a Replay. The machine does the rest: the legacy rule
// for version-1 frames (Config.LegacyWindow) and the refusals of impossible ones.
type Guard struct {
	key    *Key
	self   ID
	group  Group
	replay *Replay
}

// NewGuard returns the guard of the replica cfg (its ID, group and ReplayWindow) with key.
func NewGuard(cfg Config, key *Key) *Guard {
	return &Guard{key: key, self: cfg.ID, group: cfg.Group, replay: NewReplay(cfg.ReplayWindow)}
}

// Open checks a frame received at wall time wall. refused is the reason it must not reach the
// machine (and be counted); otherwise authenticated says whether it goes to the machine as
// authenticated (Event.Authenticated). A version-1 frame is not refused here: whether it is
// accepted is the machine's legacy rule. Our own frames (looped back, or forged with our ID) and
// other groups' are passed through untouched: the machine ignores them.
func (g *Guard) Open(f Frame, wall time.Time) (authenticated bool, refused string) {
	if f.Advert.Sender == g.self || f.Advert.Group != g.group || f.Version != authVersion {
		return false, ""
	}
	if !g.key.verify(&f) {
		return false, RefusedAuth
	}
	if why := g.replay.Check(f.Advert.Sender, f.Seq, wall); why != "" {
		return false, why
	}
	return true, ""
}

// legacyOpen says whether an unauthenticated advert may still be accepted by a replica that
// requires authentication: during an upgrade from replicas without a key (they send version 1
// and cannot read version 2), a new replica defers to the old active and takes over at its
// resignation, so the address never has two holders. Only while all of these hold:
//   - the replica has heard no authenticated advert of its group: once one has come, the group
//     has a replica with the key, and version-1 frames can only be old replicas' or forged;
//   - it has never been active: an active that obeyed a forged resignation or newer term would
//     hand the address to nobody;
//   - it started less than Config.LegacyWindow ago: long enough for a rollout, and the bound on
//     how long a forger can keep a brand-new group from its first claim (doc.go).
func (m *Machine) legacyOpen(now time.Duration) bool {
	return m.started && !m.heardAuth && !m.everActive && now < m.startedAt+m.cfg.LegacyWindow
}

// legacyDelay is what a standby adds to its wait when the advert that set it was accepted
// unauthenticated (legacy): half an interval, more than any skew of the same interval (at most
// 0.425 of it: a quarter for priority 0, 7/40 for the last slot). During an upgrade an old replica cannot
// read our adverts: were we to claim first after the old active resigned or went silent, an old
// standby would claim too, never hear us, and both would hold. With the delay the old standby
// claims first, and we defer to its adverts. It stays below the one interval a resigning old
// active keeps the addresses for a successor, so a hand-over to us alone leaves no gap.
func (m *Machine) legacyDelay(legacy bool) time.Duration {
	if !legacy {
		return 0
	}
	return m.cfg.Interval / 2
}
