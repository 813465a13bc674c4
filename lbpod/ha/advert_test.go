package ha

import (
	"bytes"
	"encoding/hex"
	"net/netip"
	"strings"
	"testing"
	"time"
)

func TestAdvertWire(t *testing.T) {
	a := Advert{Group: Group{1, 2, 3, 4, 5, 6, 7, 8}, Term: 0x0102030405060708, Priority: 200,
		Sender: ID{0x02, 0xaa, 0xbb, 0xcc, 0xdd, 0xee}, Resigning: true, Interval: 100 * time.Millisecond}
	const want = "4c424841" + "01" + "01" + "c8" + "00" + "0102030405060708" + "0102030405060708" + "02aabbccddee" + "0064"
	if got := hex.EncodeToString(a.Marshal()); got != want {
		t.Fatalf("Marshal = %s, want %s", got, want)
	}
	// Ethernet padding after the advert is ignored.
	back, err := ParseAdvert(append(a.Marshal(), make([]byte, 14)...))
	if err != nil || back != a {
		t.Fatalf("ParseAdvert = %+v, %v; want %+v", back, err, a)
	}
	for name, tc := range map[string]struct {
		b   []byte
		err string
	}{
		"short":       {a.Marshal()[:31], "not an lbsvc advert: 31 bytes, want 32"},
		"bad magic":   {append([]byte("ARP!"), a.Marshal()[4:]...), `not an lbsvc advert: magic "ARP!"`},
		"new version": {append(append([]byte("LBHA"), 2), a.Marshal()[5:]...), "not an lbsvc advert: version 2, want 1"},
	} {
		if _, err := ParseAdvert(tc.b); err == nil || err.Error() != tc.err {
			t.Errorf("%s: err = %v, want %q", name, err, tc.err)
		}
	}
	// The interval saturates at what 16 bits of milliseconds carry.
	if b := (Advert{Interval: time.Hour}).Marshal(); !bytes.Equal(b[30:], []byte{0xff, 0xff}) {
		t.Errorf("an hour's interval encodes as %x, want ffff", b[30:])
	}
}

func TestGroupOf(t *testing.T) {
	v4, v6 := netip.MustParseAddr("172.18.0.18"), netip.MustParseAddr("fd18::18")
	dual := GroupOf([]netip.Addr{v4, v6})
	if GroupOf([]netip.Addr{v6, v4}) != dual || GroupOf([]netip.Addr{v4, v6, v4}) != dual {
		t.Error("the group depends on the order or repetition of the addresses")
	}
	if GroupOf([]netip.Addr{netip.MustParseAddr("::ffff:172.18.0.18")}) != GroupOf([]netip.Addr{v4}) {
		t.Error("a v4-mapped address is another group than the IPv4 address")
	}
	if GroupOf([]netip.Addr{v4}) == dual || GroupOf([]netip.Addr{netip.MustParseAddr("172.18.0.19")}) == GroupOf([]netip.Addr{v4}) {
		t.Error("different addresses share a group")
	}
	if got := GroupOf([]netip.Addr{v4}).String(); len(got) != 16 || strings.Trim(got, "0123456789abcdef") != "" {
		t.Errorf("Group.String() = %q, want 16 hex digits", got)
	}
}

func FuzzParseAdvert(f *testing.F) {
	f.Add(Advert{Term: 3, Priority: 100, Interval: 100 * time.Millisecond}.Marshal())
	f.Add([]byte("LBHA"))
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := ParseAdvert(b)
		if err != nil {
			return
		}
		// What parses re-encodes to the same 32 bytes, except the reserved byte and unknown flags.
		re := a.Marshal()
		orig := append([]byte(nil), b[:advertLen]...)
		orig[5] &= flagResigning
		orig[7] = 0
		if !bytes.Equal(re, orig) {
			t.Fatalf("re-encoded %x, want %x", re, orig)
		}
	})
}

// Each group has its own multicast address: locally administered and group (03:6c:62 and the
// group's first three bytes), never the shared MulticastMAC, even for a group whose bytes spell it.
func TestGroupMAC(t *testing.T) {
	g := GroupOf([]netip.Addr{netip.MustParseAddr("172.18.0.10")})
	if got, want := g.MAC().String(), "03:6c:62:"+hex.EncodeToString(g[0:1])+":"+hex.EncodeToString(g[1:2])+":"+hex.EncodeToString(g[2:3]); got != want {
		t.Errorf("MAC = %s, want %s", got, want)
	}
	other := GroupOf([]netip.Addr{netip.MustParseAddr("172.18.0.11")})
	if g.MAC().String() == other.MAC().String() {
		t.Errorf("172.18.0.10 and .11 share the address %s", g.MAC())
	}
	spelled := Group{0x73, 0x76, 0x63, 1, 2, 3, 4, 5}
	if got := spelled.MAC().String(); got != "03:6c:62:73:76:62" {
		t.Errorf("a group spelling the shared address gets %s, want 03:6c:62:73:76:62", got)
	}
}

// The wire flags of group addresses: set by marshal and seal, read by ParseFrame, covered by the
// tag (a flag flipped on the wire fails authentication), ignored by ParseAdvert (as by replicas
// before them).
func TestWireFlags(t *testing.T) {
	a := Advert{Group: Group{1, 2, 3, 4, 5, 6, 7, 8}, Term: 3, Priority: 100, Sender: ID{0x02, 1, 2, 3, 4, 5}, Interval: 100 * time.Millisecond}
	for _, tc := range []struct {
		flags byte
		want  bool
	}{{0, false}, {flagGroupAddressed, true}, {flagGroupAddressed | flagLegacyCopy, true}} {
		v1 := a.marshal(tc.flags)
		if f, err := ParseFrame(v1); err != nil || f.GroupAddressed != tc.want || f.Advert != a {
			t.Errorf("version 1, flags %b: %+v, %v; want GroupAddressed %t and the advert", tc.flags, f, err, tc.want)
		}
		if old, err := ParseAdvert(v1); err != nil || old != a {
			t.Errorf("version 1, flags %b, read as before: %+v, %v; want the advert", tc.flags, old, err)
		}
		k, _ := NewKey(bytes.Repeat([]byte{7}, MinKeyLen))
		sealed := k.seal(a, 42, tc.flags)
		f, err := ParseFrame(sealed)
		if err != nil || f.GroupAddressed != tc.want || f.Advert != a || !k.verify(&f) {
			t.Errorf("version 2, flags %b: %+v, %v; want GroupAddressed %t, the advert, a valid tag", tc.flags, f, err, tc.want)
		}
		sealed[5] ^= flagGroupAddressed
		if f, _ := ParseFrame(sealed); k.verify(&f) {
			t.Errorf("version 2, flags %b with bit 1 flipped on the wire: the tag still verifies", tc.flags)
		}
	}
}
