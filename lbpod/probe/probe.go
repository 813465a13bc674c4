// Package probe asks the underlay, before an lb pod first announces an address its Service never
// announced, whether a host already uses it: ARP probes from 0.0.0.0 for IPv4 (RFC 5227: the
// sender address is unspecified, so no neighbour cache is changed) and Duplicate Address
// Detection for IPv6 (RFC 4862: a Neighbor Solicitation from ::). The decisions are pure (which
// addresses to probe, the schedule, whether a frame is an answer); Run is the thin runner on a
// raw socket of the interface.
package probe

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/ndp"

	"github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
)

// Timing is when the probes go out and how long the runner listens.
type Timing struct {
	// MaxWait bounds a random wait before the first probe (RFC 5227's PROBE_WAIT: hosts that
	// start together do not probe in lockstep).
	MaxWait time.Duration
	// Probes is how many probes go out per address, Spacing apart.
	Probes  int
	Spacing time.Duration
	// Listen is how long, after the last probe, an answer still counts.
	Listen time.Duration
}

// Total is the longest a probe takes.
func (t Timing) Total() time.Duration {
	return t.MaxWait + time.Duration(max(t.Probes-1, 0))*t.Spacing + t.Listen
}

// The timings of v1alpha1.EnvConflictProbe's values.
var (
	// Fast: an L2 host answers ARP and DAD from its kernel within a millisecond; three probes
	// 25 ms apart cover one or two lost frames, and 50 ms after the last covers a busy host.
	// About 0.1 s in all, against a creation-to-first-answer target of 1.5 s.
	Fast = Timing{Probes: 3, Spacing: 25 * time.Millisecond, Listen: 50 * time.Millisecond}
	// RFC is RFC 5227's PROBE_WAIT (1 s), PROBE_NUM (3), PROBE_MIN..PROBE_MAX (1-2 s: 1.5 s here)
	// and ANNOUNCE_WAIT (2 s): up to 6 s.
	RFC = Timing{MaxWait: time.Second, Probes: 3, Spacing: 1500 * time.Millisecond, Listen: 2 * time.Second}
)

// TimingFor is the timing of a --conflict-probe value; enabled is false for "off". Empty is the
// default, fast.
func TimingFor(mode string) (t Timing, enabled bool, err error) {
	switch mode {
	case "", v1alpha1.ConflictProbeFast:
		return Fast, true, nil
	case v1alpha1.ConflictProbeRFC:
		return RFC, true, nil
	case v1alpha1.ConflictProbeOff:
		return Timing{}, false, nil
	}
	return Timing{}, false, fmt.Errorf("conflict probe %q: want fast, rfc or off", mode)
}

// Needed lists the addresses to probe: those the Service's Lease does not record as announced.
// No Lease (found false) means nothing was ever announced. A Lease with a claim and no
// AnnouncedAnnotation was written by a release without the probe: everything counts as
// announced (its addresses were held, and a probe would find our own earlier holder).
func Needed(addrs []netip.Addr, ann map[string]string, found bool) []netip.Addr {
	if !found {
		return slices.Clone(addrs)
	}
	list, ok := ann[v1alpha1.AnnouncedAnnotation]
	if !ok && ann[v1alpha1.HAClaimAnnotation] != "" {
		return nil
	}
	announced := v1alpha1.ParseAnnounced(list)
	var out []netip.Addr
	for _, a := range addrs {
		if !slices.Contains(announced, a.Unmap()) {
			out = append(out, a)
		}
	}
	return out
}

// Announced is the AnnouncedAnnotation value once addrs were announced beside what the Lease
// already lists.
func Announced(ann map[string]string, addrs []netip.Addr) string {
	return v1alpha1.FormatAnnounced(append(v1alpha1.ParseAnnounced(ann[v1alpha1.AnnouncedAnnotation]), addrs...))
}

// ARPProbe is the Ethernet frame of an RFC 5227 probe for target from own: an ARP request,
// broadcast, sender address 0.0.0.0, target hardware address zero.
func ARPProbe(own net.HardwareAddr, target netip.Addr) ([]byte, error) {
	p, err := arp.NewPacket(arp.OperationRequest, own, netip.IPv4Unspecified(), make(net.HardwareAddr, 6), target)
	if err != nil {
		return nil, err
	}
	pb, err := p.MarshalBinary()
	if err != nil {
		return nil, err
	}
	f := ethernet.Frame{Destination: ethernet.Broadcast, Source: own, EtherType: ethernet.EtherTypeARP, Payload: pb}
	return f.MarshalBinary()
}

// DADProbe is the Ethernet frame of an RFC 4862 Duplicate Address Detection probe for target
// from own: a Neighbor Solicitation from :: to target's solicited-node multicast group, with no
// source link-layer address option (RFC 4861 forbids it with an unspecified source).
func DADProbe(own net.HardwareAddr, target netip.Addr) ([]byte, error) {
	group, err := ndp.SolicitedNodeMulticast(target)
	if err != nil {
		return nil, err
	}
	body, err := ndp.MarshalMessageChecksum(&ndp.NeighborSolicitation{TargetAddress: target}, netip.IPv6Unspecified(), group)
	if err != nil {
		return nil, err
	}
	ip := make([]byte, 40+len(body))
	ip[0] = 6 << 4
	binary.BigEndian.PutUint16(ip[4:6], uint16(len(body)))
	ip[6], ip[7] = 58, ndp.HopLimit // ICMPv6, hop limit 255
	src, dst := netip.IPv6Unspecified().As16(), group.As16()
	copy(ip[8:24], src[:])
	copy(ip[24:40], dst[:])
	copy(ip[40:], body)
	g := group.As16()
	f := ethernet.Frame{Destination: net.HardwareAddr{0x33, 0x33, g[12], g[13], g[14], g[15]}, Source: own,
		EtherType: ethernet.EtherTypeIPv6, Payload: ip}
	return f.MarshalBinary()
}

// Answer reads one Ethernet frame seen on the interface and says whether it shows another host
// using one of targets, and which, from which hardware address: an ARP packet whose sender is a
// target (a reply, a request or a gratuitous ARP from its owner), or an IPv6 Neighbor
// Advertisement for a target. Frames from own (our own probes, looped back) and anything
// unparseable are no answer. Nor is another host's probe for a target (RFC 5227 2.1.1 counts it):
// here that host is, nearly always, another replica of the same Service that took the address over
// at the same moment (the election settles which one keeps it), and an unrelated host probing the
// same address in the same 0.1 s would find our announcement in its own check.
func Answer(frame []byte, targets []netip.Addr, own net.HardwareAddr) (netip.Addr, net.HardwareAddr, bool) {
	var f ethernet.Frame
	if err := f.UnmarshalBinary(frame); err != nil {
		return netip.Addr{}, nil, false
	}
	if len(f.Source) != 6 || slices.Equal(f.Source, own) {
		return netip.Addr{}, nil, false
	}
	switch f.EtherType {
	case ethernet.EtherTypeARP:
		var p arp.Packet
		if err := p.UnmarshalBinary(f.Payload); err != nil || slices.Equal(p.SenderHardwareAddr, own) {
			return netip.Addr{}, nil, false
		}
		if slices.Contains(targets, p.SenderIP) {
			return p.SenderIP, f.Source, true
		}
	case ethernet.EtherTypeIPv6:
		b := f.Payload
		if len(b) < 40 || b[0]>>4 != 6 || b[6] != 58 || int(binary.BigEndian.Uint16(b[4:6])) > len(b)-40 {
			return netip.Addr{}, nil, false
		}
		m, err := ndp.ParseMessage(b[40 : 40+int(binary.BigEndian.Uint16(b[4:6]))])
		if err != nil {
			return netip.Addr{}, nil, false
		}
		if na, ok := m.(*ndp.NeighborAdvertisement); ok && slices.Contains(targets, na.TargetAddress) {
			return na.TargetAddress, f.Source, true
		}
	}
	return netip.Addr{}, nil, false
}

// Answers gathers what a probe heard: the first answer (Answer) per target from a host that
// ignore does not name. Not safe for concurrent use.
type Answers struct {
	targets []netip.Addr
	own     net.HardwareAddr
	// ignore, when set, names the hosts whose answers are no conflict: the Service's other
	// replicas. It is asked before an answer counts, not after the probe: two replicas that take
	// over at once hear each other's ARP replies and announcements, and a sibling's answer counted
	// first would complete its address and end the listening before a host that really uses the
	// address is heard.
	ignore func(net.HardwareAddr) bool
	found  map[netip.Addr]v1alpha1.AddressConflict
}

// NewAnswers gathers the answers for targets heard on the interface whose MAC is own.
func NewAnswers(targets []netip.Addr, own net.HardwareAddr, ignore func(net.HardwareAddr) bool) *Answers {
	return &Answers{targets: targets, own: own, ignore: ignore, found: map[netip.Addr]v1alpha1.AddressConflict{}}
}

// Add reads one frame, heard at at, and says whether every target has an answer now (the
// listening can end).
func (s *Answers) Add(frame []byte, at time.Time) (all bool) {
	if a, mac, ok := Answer(frame, s.targets, s.own); ok {
		if _, seen := s.found[a]; !seen && (s.ignore == nil || !s.ignore(mac)) {
			s.found[a] = v1alpha1.AddressConflict{Address: a, MAC: slices.Clone(mac), At: at.UTC().Truncate(time.Second)}
		}
	}
	return s.All()
}

// All says whether every target has an answer.
func (s *Answers) All() bool { return len(s.found) == len(s.targets) }

// List is the answers, one per target at most, in the targets' order.
func (s *Answers) List() []v1alpha1.AddressConflict {
	var out []v1alpha1.AddressConflict
	for _, a := range s.targets {
		if c, ok := s.found[a]; ok {
			out = append(out, c)
		}
	}
	return out
}
