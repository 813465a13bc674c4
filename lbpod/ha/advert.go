package ha

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"
)

// EtherType is the IEEE "local experimental" EtherType the adverts travel in. It is never routed
// and no stack on the underlay parses it, so an advert cannot be mistaken for anything else; a
// frame of it reaches exactly the hosts that ARP reaches.
const EtherType = 0x88B5

// MulticastMAC is the one address every advert of every Service went to before each group had an
// address of its own (Group.MAC): a locally administered group address (first octet 0x03),
// spelling "lbsvc". Replicas still join it, to hear replicas of that release during an upgrade
// (see doc.go, "Upgrade to group addresses"); nothing is sent to it otherwise.
var MulticastMAC = net.HardwareAddr{0x03, 0x6c, 0x62, 0x73, 0x76, 0x63}

// MAC is the group's own multicast address, where its adverts go: 03:6c:62 ("lb", locally
// administered, group) and the group's first three bytes. The underlay floods it like ARP
// broadcasts, so an advert crosses exactly the L2 that the replicas' ARP replies cross; but a
// macvlan (net1) passes up only the multicast addresses joined on it, so an advert reaches the
// sockets of its own group's replicas and not those of every lb pod on the node. With one address
// for all, each advert was copied to every lb pod's net1 on the parent and dropped there by the
// socket filter: per node, a cost that grew with the square of its lb pods (BenchmarkAdvertFanout).
// Two groups may share an address (one chance in 2^24); the socket filter still tells them apart.
func (g Group) MAC() net.HardwareAddr {
	m := net.HardwareAddr{0x03, 0x6c, 0x62, g[0], g[1], g[2]}
	if bytes.Equal(m, MulticastMAC) {
		m[5] ^= 1 // never the shared address: a group must not get every old replica's adverts
	}
	return m
}

// ID names a replica on the underlay: its net1 MAC. MACs are unique on a working L2 (ARP needs
// it), and the same value in an advert and in an ARP reply ties the two together when debugging.
type ID [6]byte

// String is the MAC notation.
func (id ID) String() string { return net.HardwareAddr(id[:]).String() }

// Group is the election group: a digest of the LB addresses, so the replicas of one Service (and
// only they) elect among themselves, whatever else advertises on the same L2.
type Group [8]byte

// String is the group in hex.
func (g Group) String() string { return fmt.Sprintf("%x", g[:]) }

// GroupOf derives the group from the LB addresses, in any order.
func GroupOf(addrs []netip.Addr) Group {
	s := make([]string, 0, len(addrs))
	for _, a := range addrs {
		s = append(s, a.Unmap().String())
	}
	slices.Sort(s)
	sum := sha256.Sum256([]byte("lbsvc-ha\x00" + strings.Join(slices.Compact(s), ",")))
	var g Group
	copy(g[:], sum[:])
	return g
}

// Advert is what the active replica multicasts every interval, and a resigning one as it leaves.
type Advert struct {
	Group Group
	// Term grows by one with every takeover in the group; the newest active wins a conflict, so
	// a replica that was frozen or cut off and comes back with an old term steps down.
	Term     uint64
	Priority uint8
	Sender   ID
	// Resigning: the sender is shutting down; a standby takes over at once, without waiting for
	// the dead interval.
	Resigning bool
	// Interval is the sender's advert interval: standbys derive the dead interval from it, so
	// replicas started with different settings still agree on when the active is dead.
	Interval time.Duration
}

// Wire format version 1 (unauthenticated; version 2 in auth.go adds a sequence and a tag),
// big-endian, 32 bytes (Ethernet pads to its minimum):
//
//	0  magic "LBHA"       4  version (1)      5  flags (below)
//	6  priority           7  reserved (0)     8  group (8 bytes)
//	16 term (uint64)      24 sender (6 bytes) 30 interval in ms (uint16)
//
// Flags: bit 0 resigning; bit 1 (flagGroupAddressed) the sender sends to its group's address
// (Group.MAC) and listens there; bit 2 (flagLegacyCopy) this frame is the copy such a sender also
// sends to MulticastMAC for replicas that listen only there. Replicas before bits 1 and 2 ignore
// them.
const (
	advertLen          = 32
	advertVersion      = 1
	flagResigning      = 1
	flagGroupAddressed = 2
	flagLegacyCopy     = 4
)

var advertMagic = [4]byte{'L', 'B', 'H', 'A'}

// MaxInterval is the longest advert interval the wire can carry.
const MaxInterval = 65535 * time.Millisecond

// Marshal encodes the advert as an unauthenticated version-1 frame (Key.Seal makes version 2).
// The interval is carried in whole milliseconds.
func (a Advert) Marshal() []byte { return a.marshal(0) }

// marshal is Marshal with the wire flags (flagGroupAddressed, flagLegacyCopy) set.
func (a Advert) marshal(flags byte) []byte {
	b := make([]byte, advertLen)
	copy(b[0:4], advertMagic[:])
	b[4] = advertVersion
	b[5] = flags
	if a.Resigning {
		b[5] |= flagResigning
	}
	b[6] = a.Priority
	copy(b[8:16], a.Group[:])
	binary.BigEndian.PutUint64(b[16:24], a.Term)
	copy(b[24:30], a.Sender[:])
	ms := min(a.Interval.Milliseconds(), int64(MaxInterval/time.Millisecond))
	binary.BigEndian.PutUint16(b[30:32], uint16(max(ms, 0)))
	return b
}

// errNotAdvert is returned for frames that are not ours (wrong magic or version, too short).
var errNotAdvert = errors.New("not an lbsvc advert")

// ParseAdvert decodes a version-1 advert; trailing bytes (Ethernet padding) are ignored.
// ParseFrame reads both versions.
func ParseAdvert(b []byte) (Advert, error) {
	if len(b) < advertLen {
		return Advert{}, fmt.Errorf("%w: %d bytes, want %d", errNotAdvert, len(b), advertLen)
	}
	if [4]byte(b[0:4]) != advertMagic {
		return Advert{}, fmt.Errorf("%w: magic %q", errNotAdvert, b[0:4])
	}
	if b[4] != advertVersion {
		return Advert{}, fmt.Errorf("%w: version %d, want %d", errNotAdvert, b[4], advertVersion)
	}
	return decodeHeader(b), nil
}

// decodeHeader reads the fields of the 32-byte header (both wire versions share it).
func decodeHeader(b []byte) Advert {
	a := Advert{
		Resigning: b[5]&flagResigning != 0,
		Priority:  b[6],
		Term:      binary.BigEndian.Uint64(b[16:24]),
		Interval:  time.Duration(binary.BigEndian.Uint16(b[30:32])) * time.Millisecond,
	}
	copy(a.Group[:], b[8:16])
	copy(a.Sender[:], b[24:30])
	return a
}
