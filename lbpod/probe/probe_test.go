package probe

import (
	"net"
	"net/netip"
	"reflect"
	"testing"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/ndp"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"

	"github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
)

var (
	own   = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x01}
	other = net.HardwareAddr{0x02, 0x42, 0xac, 0x12, 0, 0x05}
	v4    = netip.MustParseAddr("172.18.0.77")
	v6    = netip.MustParseAddr("fd00:172:19::77")
)

func TestNeeded(t *testing.T) {
	both := []netip.Addr{v4, v6}
	for name, tc := range map[string]struct {
		ann   map[string]string
		found bool
		want  []netip.Addr
	}{
		"no Lease: never announced, probe all":              {found: false, want: both},
		"a Lease without either annotation (just created)":  {ann: map[string]string{}, found: true, want: both},
		"announced lists one family":                        {ann: map[string]string{v1alpha1.AnnouncedAnnotation: "172.18.0.77"}, found: true, want: []netip.Addr{v6}},
		"announced lists both":                              {ann: map[string]string{v1alpha1.AnnouncedAnnotation: "172.18.0.77,fd00:172:19::77"}, found: true},
		"a claim of a release without the probe: no probe":  {ann: map[string]string{v1alpha1.HAClaimAnnotation: "3 100 02:00:00:00:00:01"}, found: true},
		"a claim and an empty list (a conflict): probe all": {ann: map[string]string{v1alpha1.HAClaimAnnotation: "3 100 02:00:00:00:00:01", v1alpha1.AnnouncedAnnotation: ""}, found: true, want: both},
		"a list of another address (the Service moved)":     {ann: map[string]string{v1alpha1.AnnouncedAnnotation: "172.18.0.20"}, found: true, want: both},
	} {
		if got := Needed(both, tc.ann, tc.found); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: %v, want %v", name, got, tc.want)
		}
	}
	if got := Announced(map[string]string{v1alpha1.AnnouncedAnnotation: "172.18.0.20"}, []netip.Addr{v6, v4}); got != "172.18.0.20,172.18.0.77,fd00:172:19::77" {
		t.Errorf("announced %q", got)
	}
}

func TestTimingFor(t *testing.T) {
	for mode, want := range map[string]Timing{"": Fast, "fast": Fast, "rfc": RFC} {
		if got, on, err := TimingFor(mode); err != nil || !on || got != want {
			t.Errorf("%q: %+v %v %v", mode, got, on, err)
		}
	}
	if _, on, err := TimingFor("off"); on || err != nil {
		t.Errorf("off: %v %v", on, err)
	}
	if _, _, err := TimingFor("slow"); err == nil || err.Error() != `conflict probe "slow": want fast, rfc or off` {
		t.Errorf("slow: %v", err)
	}
	if Fast.Total().Milliseconds() != 100 || RFC.Total().Milliseconds() != 6000 {
		t.Errorf("totals %s %s", Fast.Total(), RFC.Total())
	}
}

func arpFrame(t *testing.T, op arp.Operation, srcHW net.HardwareAddr, srcIP, dstIP netip.Addr) []byte {
	t.Helper()
	p, err := arp.NewPacket(op, srcHW, srcIP, make(net.HardwareAddr, 6), dstIP)
	if err != nil {
		t.Fatal(err)
	}
	pb, _ := p.MarshalBinary()
	b, _ := (&ethernet.Frame{Destination: ethernet.Broadcast, Source: srcHW, EtherType: ethernet.EtherTypeARP, Payload: pb}).MarshalBinary()
	return b
}

func mustDAD(t *testing.T, from net.HardwareAddr, target netip.Addr) []byte {
	t.Helper()
	b, err := DADProbe(from, target)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func naFrame(t *testing.T, from net.HardwareAddr, target netip.Addr) []byte {
	t.Helper()
	body, err := ndp.MarshalMessageChecksum(&ndp.NeighborAdvertisement{Override: true, TargetAddress: target,
		Options: []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Target, Addr: from}}}, target, netip.IPv6LinkLocalAllNodes())
	if err != nil {
		t.Fatal(err)
	}
	ip := make([]byte, 40+len(body))
	ip[0], ip[5], ip[6], ip[7] = 6<<4, byte(len(body)), 58, 255
	copy(ip[40:], body)
	b, _ := (&ethernet.Frame{Destination: net.HardwareAddr{0x33, 0x33, 0, 0, 0, 1}, Source: from, EtherType: ethernet.EtherTypeIPv6, Payload: ip}).MarshalBinary()
	return b
}

// Which frames show another host using a probed address, exactly.
func TestAnswer(t *testing.T) {
	targets := []netip.Addr{v4, v6}
	myProbe, err := ARPProbe(own, v4)
	if err != nil {
		t.Fatal(err)
	}
	myDAD, err := DADProbe(own, v6)
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		frame []byte
		addr  netip.Addr
		mac   net.HardwareAddr
	}{
		"the owner's ARP reply":                       {frame: arpFrame(t, arp.OperationReply, other, v4, netip.IPv4Unspecified()), addr: v4, mac: other},
		"the owner's gratuitous ARP":                  {frame: arpFrame(t, arp.OperationRequest, other, v4, v4), addr: v4, mac: other},
		"another replica probing at the same moment":  {frame: arpFrame(t, arp.OperationRequest, other, netip.IPv4Unspecified(), v4)},
		"another replica's DAD probe":                 {frame: mustDAD(t, other, v6)},
		"the owner's Neighbor Advertisement":          {frame: naFrame(t, other, v6), addr: v6, mac: other},
		"our own probe, looped back":                  {frame: myProbe},
		"our own DAD probe, looped back":              {frame: myDAD},
		"an ARP reply for another address":            {frame: arpFrame(t, arp.OperationReply, other, netip.MustParseAddr("172.18.0.1"), v4)},
		"someone asking for the address (not owning)": {frame: arpFrame(t, arp.OperationRequest, other, netip.MustParseAddr("172.18.0.1"), v4)},
		"an NA for another address":                   {frame: naFrame(t, other, netip.MustParseAddr("fd00:172:19::1"))},
		"garbage":                                     {frame: []byte{1, 2, 3}},
		"a truncated IPv6 frame":                      {frame: naFrame(t, other, v6)[:60]},
	} {
		addr, mac, ok := Answer(tc.frame, targets, own)
		if ok != tc.addr.IsValid() || addr != tc.addr || mac.String() != tc.mac.String() {
			t.Errorf("%s: %v %v %v, want %v %v", name, addr, mac, ok, tc.addr, tc.mac)
		}
	}
}

// A sibling replica's answer does not count, and does not end the listening: the foreign host
// heard after it is the answer. Without ignore the first answer per address stands.
func TestAnswersIgnorePeers(t *testing.T) {
	peer := net.HardwareAddr{0x3a, 0xf9, 0xb2, 0x96, 0x02, 0x8b}
	isPeer := func(mac net.HardwareAddr) bool { return mac.String() == peer.String() }
	at := time.Date(2026, 11, 28, 21, 43, 7, 500, time.UTC)
	frames := [][]byte{
		arpFrame(t, arp.OperationRequest, peer, v4, v4),                     // the sibling's gratuitous ARP
		naFrame(t, peer, v6),                                                // and its unsolicited NA
		arpFrame(t, arp.OperationReply, other, v4, netip.IPv4Unspecified()), // the host using v4
		arpFrame(t, arp.OperationReply, peer, v4, netip.IPv4Unspecified()),  // the sibling again
	}

	s := NewAnswers([]netip.Addr{v4, v6}, own, isPeer)
	var all []bool
	for _, f := range frames {
		all = append(all, s.Add(f, at))
	}
	want := []v1alpha1.AddressConflict{{Address: v4, MAC: other, At: at.Truncate(time.Second)}}
	if got := s.List(); !reflect.DeepEqual(got, want) {
		t.Errorf("with the peer ignored: %v, want %v", got, want)
	}
	if !reflect.DeepEqual(all, []bool{false, false, false, false}) {
		t.Errorf("every address answered after each frame: %v, want never (v6 only heard from the peer)", all)
	}

	s = NewAnswers([]netip.Addr{v4, v6}, own, nil)
	all = all[:0]
	for _, f := range frames {
		all = append(all, s.Add(f, at))
	}
	want = []v1alpha1.AddressConflict{{Address: v4, MAC: peer, At: at.Truncate(time.Second)}, {Address: v6, MAC: peer, At: at.Truncate(time.Second)}}
	if got := s.List(); !reflect.DeepEqual(got, want) {
		t.Errorf("without ignore: %v, want the first answers %v", got, want)
	}
	if !reflect.DeepEqual(all, []bool{false, true, true, true}) {
		t.Errorf("every address answered after each frame: %v, want from the second frame on", all)
	}
}

// The probes are what the RFCs say: an ARP request from 0.0.0.0 with a zero target hardware
// address, broadcast; an NS from :: to the solicited-node group, no source link-layer option.
func TestProbeFrames(t *testing.T) {
	b, err := ARPProbe(own, v4)
	if err != nil {
		t.Fatal(err)
	}
	var f ethernet.Frame
	if err := f.UnmarshalBinary(b); err != nil || f.Destination.String() != "ff:ff:ff:ff:ff:ff" || f.EtherType != ethernet.EtherTypeARP {
		t.Fatalf("arp frame %+v %v", f, err)
	}
	var p arp.Packet
	if err := p.UnmarshalBinary(f.Payload); err != nil || p.Operation != arp.OperationRequest || p.SenderIP != netip.IPv4Unspecified() ||
		p.TargetIP != v4 || p.SenderHardwareAddr.String() != own.String() || p.TargetHardwareAddr.String() != "00:00:00:00:00:00" {
		t.Fatalf("arp packet %+v %v", p, err)
	}
	b, err = DADProbe(own, v6)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.UnmarshalBinary(b); err != nil || f.Destination.String() != "33:33:ff:00:00:77" || f.EtherType != ethernet.EtherTypeIPv6 {
		t.Fatalf("dad frame %+v %v", f, err)
	}
	ip := f.Payload
	if src := netip.AddrFrom16([16]byte(ip[8:24])); src != netip.IPv6Unspecified() {
		t.Fatalf("source %s", src)
	}
	if dst := netip.AddrFrom16([16]byte(ip[24:40])); dst != netip.MustParseAddr("ff02::1:ff00:77") {
		t.Fatalf("destination %s", dst)
	}
	m, err := ndp.ParseMessage(ip[40:])
	ns, ok := m.(*ndp.NeighborSolicitation)
	if err != nil || !ok || ns.TargetAddress != v6 || len(ns.Options) != 0 || ip[7] != 255 {
		t.Fatalf("ns %+v %v", m, err)
	}
}

func FuzzAnswer(f *testing.F) {
	t := &testing.T{}
	f.Add(arpFrame(t, arp.OperationReply, other, v4, v4))
	f.Add(naFrame(t, other, v6))
	f.Fuzz(func(t *testing.T, b []byte) {
		addr, mac, ok := Answer(b, []netip.Addr{v4, v6}, own)
		if ok && ((addr != v4 && addr != v6) || len(mac) != 6 || mac.String() == own.String()) {
			t.Fatalf("answer %v from %v", addr, mac)
		}
	})
}

// The probe sockets' filter drops PACKET_OTHERHOST and keeps every other packet type. The bpf
// package's VM cannot read the packet type (an ancillary load the kernel fills in), so the test
// holds the assembled program to the kernel's encoding, and runs the rest of it in the VM with
// the packet type read from the frame's first byte instead.
func TestSocketFilter(t *testing.T) {
	// linux/filter.h: SKF_AD_OFF (-0x1000) + SKF_AD_PKTTYPE (4), the ancillary load of the type.
	const pktType = 0xfffff000 + 4
	want := []bpf.RawInstruction{
		{Op: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: pktType},
		{Op: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 1, Jf: 0, K: unix.PACKET_OTHERHOST},
		{Op: unix.BPF_RET | unix.BPF_K, K: 0xffffffff},
		{Op: unix.BPF_RET | unix.BPF_K, K: 0},
	}
	if !reflect.DeepEqual(socketFilter, want) {
		t.Fatalf("socketFilter = %+v, want %+v", socketFilter, want)
	}
	prog, ok := bpf.Disassemble(socketFilter)
	if !ok || prog[0] != (bpf.LoadExtension{Num: bpf.ExtType}) {
		t.Fatalf("the filter does not start with a load of the packet type: %#v", prog)
	}
	prog[0] = bpf.LoadAbsolute{Off: 0, Size: 1}
	vm, err := bpf.NewVM(prog)
	if err != nil {
		t.Fatal(err)
	}
	for typ, kept := range map[uint8]bool{
		unix.PACKET_HOST: true, unix.PACKET_BROADCAST: true, unix.PACKET_MULTICAST: true,
		unix.PACKET_OTHERHOST: false, unix.PACKET_OUTGOING: true, unix.PACKET_LOOPBACK: true,
	} {
		frame := make([]byte, 60)
		frame[0] = typ
		n, err := vm.Run(frame)
		// The kernel keeps min(the return, the frame's length) bytes; 0 drops the frame.
		if err != nil || (n >= len(frame)) != kept || (n == 0) == kept {
			t.Errorf("packet type %d: the filter returns %d for %d bytes (%v); want kept %t", typ, n, len(frame), err, kept)
		}
	}
}
