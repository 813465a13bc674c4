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
