package ipam

import (
	"errors"
	"net/netip"
	"reflect"
	"strings"
	"testing"
)

func mustAddrs(t testing.TB, s ...string) []netip.Addr {
	t.Helper()
	out := make([]netip.Addr, len(s))
	for i, a := range s {
		out[i] = netip.MustParseAddr(a)
	}
	return out
}

func mustPrefixes(t testing.TB, s ...string) []netip.Prefix {
	t.Helper()
	out := make([]netip.Prefix, len(s))
	for i, p := range s {
		out[i] = netip.MustParsePrefix(p)
	}
	return out
}

func rng(first, last string) Range {
	return Range{First: netip.MustParseAddr(first), Last: netip.MustParseAddr(last)}
}

// checkParsed compares a parser's result with the wanted value, or its error with the wanted
// message (every parse error wraps ErrInvalid).
func checkParsed[T any](t *testing.T, got T, err error, want T, wantErr string) {
	t.Helper()
	if wantErr != "" {
		if err == nil || err.Error() != wantErr || !errors.Is(err, ErrInvalid) {
			t.Fatalf("error:\n got %v\nwant %s (wrapping ErrInvalid)", err, wantErr)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("\n got %+v\nwant %+v", got, want)
	}
}

func TestParseSubnet(t *testing.T) {
	type in struct {
		protocol, cidrBlock, gateway string
		excludes                     []string
	}
	tests := map[string]struct {
		in      in
		want    SubnetConfig // Name is filled in
		wantErr string       // the whole message; every error wraps ErrInvalid
	}{
		"the seed's subnet": {
			in: in{"IPv4", "172.18.0.0/16", "172.18.0.1", []string{"172.18.0.0..172.18.0.10"}},
			want: SubnetConfig{CIDRs: mustPrefixes(t, "172.18.0.0/16"), Gateways: mustAddrs(t, "172.18.0.1"),
				Excludes: []Range{rng("172.18.0.0", "172.18.0.10")}},
		},
		"protocol follows from the CIDR, gateway defaults to network+1": {
			in:   in{"", "10.0.0.0/8", "", nil},
			want: SubnetConfig{CIDRs: mustPrefixes(t, "10.0.0.0/8"), Gateways: mustAddrs(t, "10.0.0.1")},
		},
		"IPv6 with default gateway and a single exclusion": {
			in: in{"IPv6", "fd00:18::/64", "", []string{"fd00:18::5"}},
			want: SubnetConfig{CIDRs: mustPrefixes(t, "fd00:18::/64"), Gateways: mustAddrs(t, "fd00:18::1"),
				Excludes: []Range{rng("fd00:18::5", "fd00:18::5")}},
		},
		"Dual given IPv6 first comes out IPv4 first, gateways matched by family": {
			in: in{"Dual", " fd00:18::/64 , 172.18.0.0/16 ", "fd00:18::fe, 172.18.0.254", []string{" fd00:18::10..fd00:18::20 ", "172.18.0.2 .. 172.18.0.3"}},
			want: SubnetConfig{CIDRs: mustPrefixes(t, "172.18.0.0/16", "fd00:18::/64"), Gateways: mustAddrs(t, "172.18.0.254", "fd00:18::fe"),
				Excludes: []Range{rng("fd00:18::10", "fd00:18::20"), rng("172.18.0.2", "172.18.0.3")}},
		},
		"Dual with one gateway: the other family gets the default": {
			in:   in{"", "172.18.0.0/16,fd00:18::/64", "fd00:18::fe", nil},
			want: SubnetConfig{CIDRs: mustPrefixes(t, "172.18.0.0/16", "fd00:18::/64"), Gateways: mustAddrs(t, "172.18.0.1", "fd00:18::fe")},
		},
		"/31 (RFC 3021): the first address may be the gateway": {
			in:   in{"", "192.168.77.0/31", "192.168.77.0", nil},
			want: SubnetConfig{CIDRs: mustPrefixes(t, "192.168.77.0/31"), Gateways: mustAddrs(t, "192.168.77.0")},
		},
		"/32 with its only address as gateway": {
			in:   in{"", "192.168.77.5/32", "192.168.77.5", nil},
			want: SubnetConfig{CIDRs: mustPrefixes(t, "192.168.77.5/32"), Gateways: mustAddrs(t, "192.168.77.5")},
		},
		"host bits set": {
			in:      in{"", "172.18.0.5/16", "", nil},
			wantErr: `subnet "s": cidrBlock 172.18.0.5/16 has host bits set (the network is 172.18.0.0/16): invalid subnet configuration`,
		},
		"empty cidrBlock": {
			in:      in{"", " ", "", nil},
			wantErr: `subnet "s": cidrBlock is empty: invalid subnet configuration`,
		},
		"not a CIDR": {
			in:      in{"", "172.18.0.0", "", nil},
			wantErr: `subnet "s": cidrBlock "172.18.0.0" is not a CIDR (no '/'): invalid subnet configuration`,
		},
		"three CIDRs": {
			in:      in{"", "10.0.0.0/8,10.1.0.0/16,fd00::/64", "", nil},
			wantErr: `subnet "s": cidrBlock "10.0.0.0/8,10.1.0.0/16,fd00::/64" has 3 CIDRs; at most two (one IPv4, one IPv6): invalid subnet configuration`,
		},
		"two IPv4 CIDRs": {
			in:      in{"", "10.0.0.0/8,11.0.0.0/8", "", nil},
			wantErr: `subnet "s": cidrBlock "10.0.0.0/8,11.0.0.0/8" has two IPv4 CIDRs; one per family: invalid subnet configuration`,
		},
		"empty CIDR item": {
			in:      in{"", "10.0.0.0/8,", "", nil},
			wantErr: `subnet "s": cidrBlock "10.0.0.0/8," has an empty item: invalid subnet configuration`,
		},
		"CIDR with a zone": {
			in:      in{"", "fd00:18::%net1/64", "", nil},
			wantErr: `subnet "s": cidrBlock "fd00:18::%net1/64" is not a CIDR (IPv6 zones cannot be present in a prefix): invalid subnet configuration`,
		},
		"IPv4-mapped CIDR": {
			in:      in{"", "::ffff:172.18.0.0/112", "", nil},
			wantErr: `subnet "s": cidrBlock ::ffff:172.18.0.0/112 is inside the IPv4-mapped block ::ffff:0.0.0.0/96; write IPv4 CIDRs as IPv4: invalid subnet configuration`,
		},
		"IPv6 CIDR containing the mapped block": {
			in:      in{"", "::/64", "", nil},
			wantErr: `subnet "s": cidrBlock ::/64 overlaps the unspecified address ::/128, which cannot be an underlay address: invalid subnet configuration`,
		},
		"unknown protocol": {
			in:      in{"IPv5", "10.0.0.0/8", "", nil},
			wantErr: `subnet "s": protocol "IPv5" is not IPv4, IPv6 or Dual: invalid subnet configuration`,
		},
		"protocol IPv6 for an IPv4 CIDR": {
			in:      in{"IPv6", "10.0.0.0/8", "", nil},
			wantErr: `subnet "s": protocol IPv6 does not match cidrBlock 10.0.0.0/8: invalid subnet configuration`,
		},
		"protocol Dual with one CIDR": {
			in:      in{"Dual", "10.0.0.0/8", "", nil},
			wantErr: `subnet "s": protocol Dual does not match cidrBlock 10.0.0.0/8: invalid subnet configuration`,
		},
		"protocol IPv4 with two CIDRs": {
			in:      in{"IPv4", "10.0.0.0/8,fd00:1::/64", "", nil},
			wantErr: `subnet "s": protocol IPv4 does not match cidrBlock 10.0.0.0/8,fd00:1::/64: invalid subnet configuration`,
		},
		"gateway outside": {
			in:      in{"", "172.18.0.0/16", "172.19.0.1", nil},
			wantErr: `subnet "s": gateway 172.19.0.1 is outside 172.18.0.0/16: invalid subnet configuration`,
		},
		"gateway is the network address": {
			in:      in{"", "172.18.0.0/16", "172.18.0.0", nil},
			wantErr: `subnet "s": gateway 172.18.0.0 is the network address of 172.18.0.0/16: invalid subnet configuration`,
		},
		"gateway is the broadcast address": {
			in:      in{"", "172.18.0.0/16", "172.18.255.255", nil},
			wantErr: `subnet "s": gateway 172.18.255.255 is the broadcast address of 172.18.0.0/16: invalid subnet configuration`,
		},
		"gateway is the IPv6 subnet-router anycast address": {
			in:      in{"", "fd00:18::/64", "fd00:18::", nil},
			wantErr: `subnet "s": gateway fd00:18:: is the subnet-router anycast address of fd00:18::/64: invalid subnet configuration`,
		},
		"gateway of a family not served": {
			in:      in{"", "172.18.0.0/16", "fd00::1", nil},
			wantErr: `subnet "s": gateway fd00::1 is IPv6 but cidrBlock 172.18.0.0/16 has no IPv6 CIDR: invalid subnet configuration`,
		},
		"two IPv4 gateways": {
			in:      in{"", "172.18.0.0/16,fd00:18::/64", "172.18.0.1,172.18.0.2", nil},
			wantErr: `subnet "s": gateway "172.18.0.1,172.18.0.2" has two IPv4 addresses; one per family: invalid subnet configuration`,
		},
		"gateway not an address": {
			in:      in{"", "172.18.0.0/16", "172.18.0.x", nil},
			wantErr: `subnet "s": gateway "172.18.0.x" is not an IP address (unexpected character (at "x")): invalid subnet configuration`,
		},
		"gateway with a zone": {
			in:      in{"", "fd00:18::/64", "fd00:18::1%eth0", nil},
			wantErr: `subnet "s": gateway "fd00:18::1%eth0" has an IPv6 zone, which an underlay address cannot have: invalid subnet configuration`,
		},
		"gateway IPv4-mapped": {
			in:      in{"", "172.18.0.0/16", "::ffff:172.18.0.1", nil},
			wantErr: `subnet "s": gateway "::ffff:172.18.0.1" is an IPv4-mapped IPv6 address; write it as IPv4 (172.18.0.1): invalid subnet configuration`,
		},
		"/32 has no room for the default gateway": {
			in:      in{"", "192.168.77.5/32", "", nil},
			wantErr: `subnet "s": cidrBlock 192.168.77.5/32 has no room for a default gateway (the first address after the network); set gateway: invalid subnet configuration`,
		},
		"exclusion partly outside": {
			in:      in{"", "172.18.0.0/16", "", []string{"172.17.255.250..172.18.0.10"}},
			wantErr: `subnet "s": exclusion 172.17.255.250..172.18.0.10 is partly outside 172.18.0.0/16: invalid subnet configuration`,
		},
		"exclusion covering more than the whole CIDR": {
			in:      in{"", "172.18.0.0/16", "", []string{"172.17.0.0..172.19.0.0"}},
			wantErr: `subnet "s": exclusion 172.17.0.0..172.19.0.0 is partly outside 172.18.0.0/16: invalid subnet configuration`,
		},
		"exclusion outside": {
			in:      in{"", "172.18.0.0/16", "", []string{"10.0.0.1"}},
			wantErr: `subnet "s": exclusion 10.0.0.1 is outside 172.18.0.0/16: invalid subnet configuration`,
		},
		"exclusion of a family not served": {
			in:      in{"", "172.18.0.0/16", "", []string{"fd00::1"}},
			wantErr: `subnet "s": exclusion fd00::1 is IPv6 but cidrBlock 172.18.0.0/16 has no IPv6 CIDR: invalid subnet configuration`,
		},
		"exclusion backwards": {
			in:      in{"", "172.18.0.0/16", "", []string{"172.18.0.10..172.18.0.1"}},
			wantErr: `subnet "s": exclusion "172.18.0.10..172.18.0.1" starts after it ends (172.18.0.10 > 172.18.0.1): invalid subnet configuration`,
		},
		"long protocol quoted by its prefix only": {
			in:      in{strings.Repeat("v", 100), "172.18.0.0/16", "", nil},
			wantErr: `subnet "s": protocol "` + strings.Repeat("v", 64) + `"... (100 bytes) is not IPv4, IPv6 or Dual: invalid subnet configuration`,
		},
	}
	// Never unicast host addresses on a link: refused whatever the prefix length, named by the
	// first such block the CIDR overlaps.
	for cidr, block := range map[string]string{
		"0.0.0.0/0":          `"this network" block (RFC 1122) 0.0.0.0/8`,
		"0.0.0.0/8":          `"this network" block (RFC 1122) 0.0.0.0/8`,
		"127.0.0.0/8":        "loopback block 127.0.0.0/8",
		"127.0.0.0/30":       "loopback block 127.0.0.0/8",
		"96.0.0.0/3":         "loopback block 127.0.0.0/8",
		"169.254.0.0/16":     "link-local block 169.254.0.0/16",
		"169.254.169.0/24":   "link-local block 169.254.0.0/16",
		"128.0.0.0/1":        "link-local block 169.254.0.0/16",
		"224.0.0.0/24":       "multicast block 224.0.0.0/4",
		"239.255.0.0/16":     "multicast block 224.0.0.0/4",
		"240.0.0.0/4":        "reserved block (RFC 1112, with the broadcast address 255.255.255.255) 240.0.0.0/4",
		"255.255.255.252/30": "reserved block (RFC 1112, with the broadcast address 255.255.255.255) 240.0.0.0/4",
		"::/127":             "unspecified address ::/128",
		"fe80::/64":          "link-local block fe80::/10",
		"fe80::/10":          "link-local block fe80::/10",
		"ff02::/120":         "multicast block ff00::/8",
		"8000::/1":           "link-local block fe80::/10",
		"::ff80:0:0/89":      "IPv4-mapped block ::ffff:0.0.0.0/96", // holds the mapped block, not ::
	} {
		want := "subnet \"s\": cidrBlock " + cidr + " overlaps the " + block + ", which cannot be an underlay address: invalid subnet configuration"
		gateway := ""
		if cidr == "::/127" {
			gateway = "::1"
		}
		tests["not unicast "+cidr] = struct {
			in      in
			want    SubnetConfig
			wantErr string
		}{in: in{"", cidr, gateway, nil}, wantErr: want}
	}
	// Documentation, shared and benchmarking ranges are unicast and allowed (labs use them).
	for _, cidr := range []string{"192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "100.64.0.0/10", "198.18.0.0/15", "2001:db8::/32", "1.0.0.0/8", "223.255.255.0/24", "fec0::/10", "fe00::/9"} {
		p := netip.MustParsePrefix(cidr)
		tests["unicast "+cidr] = struct {
			in      in
			want    SubnetConfig
			wantErr string
		}{in: in{"", cidr, "", nil}, want: SubnetConfig{CIDRs: []netip.Prefix{p}, Gateways: []netip.Addr{p.Addr().Next()}}}
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := ParseSubnet("s", tc.in.protocol, tc.in.cidrBlock, tc.in.gateway, tc.in.excludes)
			if tc.wantErr == "" {
				tc.want.Name = "s"
			}
			checkParsed(t, got, err, tc.want, tc.wantErr)
		})
	}
}

func TestParseExcludes(t *testing.T) {
	tests := map[string]struct {
		in      []string
		want    []Range
		wantErr string
	}{
		"none":                {in: nil, want: []Range{}},
		"single and range":    {in: []string{"10.0.0.1", " 10.0.0.5 .. 10.0.0.9 "}, want: []Range{rng("10.0.0.1", "10.0.0.1"), rng("10.0.0.5", "10.0.0.9")}},
		"range of one":        {in: []string{"10.0.0.5..10.0.0.5"}, want: []Range{rng("10.0.0.5", "10.0.0.5")}},
		"IPv6 range":          {in: []string{"fd00::1..fd00::ff"}, want: []Range{rng("fd00::1", "fd00::ff")}},
		"overlapping kept":    {in: []string{"10.0.0.1..10.0.0.9", "10.0.0.5"}, want: []Range{rng("10.0.0.1", "10.0.0.9"), rng("10.0.0.5", "10.0.0.5")}},
		"empty item":          {in: []string{" "}, wantErr: `exclusion " " is empty: invalid subnet configuration`},
		"mixed families":      {in: []string{"10.0.0.1..fd00::1"}, wantErr: `exclusion "10.0.0.1..fd00::1" mixes IPv4 and IPv6: invalid subnet configuration`},
		"backwards":           {in: []string{"fd00::9..fd00::1"}, wantErr: `exclusion "fd00::9..fd00::1" starts after it ends (fd00::9 > fd00::1): invalid subnet configuration`},
		"open-ended":          {in: []string{"10.0.0.1.."}, wantErr: `exclusion "10.0.0.1..": "" is not an IP address (unable to parse IP): invalid subnet configuration`},
		"three dots":          {in: []string{"10.0.0.1...10.0.0.2"}, wantErr: `exclusion "10.0.0.1...10.0.0.2": ".10.0.0.2" is not an IP address (IPv4 field must have at least one digit (at ".10.0.0.2")): invalid subnet configuration`},
		"leading zero":        {in: []string{"10.0.0.01"}, wantErr: `exclusion "10.0.0.01": "10.0.0.01" is not an IP address (IPv4 field has octet with leading zero): invalid subnet configuration`},
		"mapped":              {in: []string{"::ffff:10.0.0.1"}, wantErr: `exclusion "::ffff:10.0.0.1": "::ffff:10.0.0.1" is an IPv4-mapped IPv6 address; write it as IPv4 (10.0.0.1): invalid subnet configuration`},
		"zone":                {in: []string{"fe80::1%eth0"}, wantErr: `exclusion "fe80::1%eth0": "fe80::1%eth0" has an IPv6 zone, which an underlay address cannot have: invalid subnet configuration`},
		"a CIDR is not valid": {in: []string{"10.0.0.0/24"}, wantErr: `exclusion "10.0.0.0/24": "10.0.0.0/24" is not an IP address (unexpected character (at "/24")): invalid subnet configuration`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := ParseExcludes(tc.in)
			checkParsed(t, got, err, tc.want, tc.wantErr)
		})
	}
}

func TestParseAddrs(t *testing.T) {
	tests := map[string]struct {
		in      string
		want    []netip.Addr
		wantErr string
	}{
		"empty":     {in: "", want: nil},
		"blank":     {in: "  ", want: nil},
		"one":       {in: "172.18.0.18", want: mustAddrs(t, "172.18.0.18")},
		"dual":      {in: " fd00::18 , 172.18.0.18", want: mustAddrs(t, "fd00::18", "172.18.0.18")},
		"empty gap": {in: "172.18.0.18,", wantErr: `address list "172.18.0.18," has an empty item: invalid subnet configuration`},
		"twice":     {in: "172.18.0.18,172.18.0.18", wantErr: `address list "172.18.0.18,172.18.0.18" names 172.18.0.18 twice: invalid subnet configuration`},
		"garbage":   {in: "lb", wantErr: `"lb" is not an IP address (unable to parse IP): invalid subnet configuration`},
		"mapped":    {in: "::ffff:172.18.0.18", wantErr: `"::ffff:172.18.0.18" is an IPv4-mapped IPv6 address; write it as IPv4 (172.18.0.18): invalid subnet configuration`},
		"zone":      {in: "fd00::1%net1", wantErr: `"fd00::1%net1" has an IPv6 zone, which an underlay address cannot have: invalid subnet configuration`},
		// A value as long as a Service field allows is quoted by its first 64 bytes, and netip's
		// own detail (which quotes the unparsed rest) is cut too.
		"20,000 characters":     {in: strings.Repeat("1", 20000), wantErr: `"` + strings.Repeat("1", 64) + `"... (20000 bytes) is not an IP address (unable to parse IP): invalid subnet configuration`},
		"long list, empty item": {in: "10.0.0.1,10.0.0.2,10.0.0.3,10.0.0.4,10.0.0.5,10.0.0.6,10.0.0.7,10.0.0.8,", wantErr: `address list "10.0.0.1,10.0.0.2,10.0.0.3,10.0.0.4,10.0.0.5,10.0.0.6,10.0.0.7,1"... (72 bytes) has 9 items; at most 2, one per family: invalid subnet configuration`},
		// Refused by its count before any item is parsed: checked for repeats item by item,
		// such a list took half a second.
		"37,000 items":           {in: strings.Repeat("::1,", 37000) + "::2", wantErr: `address list "` + strings.Repeat("::1,", 16) + `"... (148003 bytes) has 37001 items; at most 2, one per family: invalid subnet configuration`},
		"empty item":             {in: "10.0.0.1,", wantErr: `address list "10.0.0.1," has an empty item: invalid subnet configuration`},
		"long detail cut":        {in: "10.0.0.1" + strings.Repeat("x", 200), wantErr: `"10.0.0.1` + strings.Repeat("x", 56) + `"... (208 bytes) is not an IP address (unexpected character (at "` + strings.Repeat("x", 70) + `...): invalid subnet configuration`},
		"cut inside a character": {in: "10.0.0.1" + strings.Repeat("é", 40), wantErr: `"10.0.0.1` + strings.Repeat("é", 28) + `"... (88 bytes) is not an IP address (unexpected character (at "` + strings.Repeat("é", 35) + `...): invalid subnet configuration`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := ParseAddrs(tc.in)
			checkParsed(t, got, err, tc.want, tc.wantErr)
		})
	}
}

func TestOverlaps(t *testing.T) {
	cfg := func(cidrs ...string) SubnetConfig { return SubnetConfig{CIDRs: mustPrefixes(t, cidrs...)} }
	tests := []struct {
		a, b SubnetConfig
		want bool
	}{
		{cfg("172.18.0.0/16"), cfg("172.18.5.0/24"), true},
		{cfg("172.18.0.0/16"), cfg("172.19.0.0/16"), false},
		{cfg("172.18.0.0/16", "fd00::/64"), cfg("fd00::/120"), true},
		{cfg("172.18.0.0/16"), cfg("fd00::/64"), false},
		{cfg(), cfg("10.0.0.0/8"), false},
	}
	for _, tc := range tests {
		name := prefixList(tc.a.CIDRs) + " vs " + prefixList(tc.b.CIDRs)
		if got := Overlaps(tc.a, tc.b); got != tc.want {
			t.Errorf("%s: got %v, want %v", name, got, tc.want)
		}
		if got := Overlaps(tc.b, tc.a); got != tc.want {
			t.Errorf("%s (swapped): got %v, want %v", name, got, tc.want)
		}
	}
}

func TestReservedAddrs(t *testing.T) {
	tests := map[string]string{
		"172.18.0.0/16":   "172.18.0.0 172.18.255.255",
		"10.0.0.0/30":     "10.0.0.0 10.0.0.3",
		"10.0.0.0/31":     "",
		"10.0.0.5/32":     "",
		"fd00:18::/64":    "fd00:18::",
		"fd00:18::/127":   "fd00:18::",
		"fd00:18::5/128":  "fd00:18::5",
		"0.0.0.0/0":       "0.0.0.0 255.255.255.255",
		"2001:db8::/32":   "2001:db8::",
		"192.168.77.0/24": "192.168.77.0 192.168.77.255",
	}
	for prefix, want := range tests {
		var got []string
		for _, a := range reservedAddrs(netip.MustParsePrefix(prefix)) {
			got = append(got, a.String())
		}
		if strings.Join(got, " ") != want {
			t.Errorf("%s: got %q, want %q", prefix, strings.Join(got, " "), want)
		}
	}
}

func TestQuote(t *testing.T) {
	tests := map[string]struct{ in, want string }{
		"short":             {"lb", `"lb"`},
		"control bytes":     {"a\x00\n", `"a\x00\n"`},
		"exactly 64":        {strings.Repeat("a", 64), `"` + strings.Repeat("a", 64) + `"`},
		"65":                {strings.Repeat("a", 65), `"` + strings.Repeat("a", 64) + `"... (65 bytes)`},
		"cut before a rune": {strings.Repeat("a", 63) + "é", `"` + strings.Repeat("a", 63) + `"... (65 bytes)`},
		"invalid UTF-8":     {strings.Repeat("\xff", 70), `"` + strings.Repeat(`\xff`, 64) + `"... (70 bytes)`},
		"4-byte runes":      {strings.Repeat("😀", 17), `"` + strings.Repeat("😀", 16) + `"... (68 bytes)`},
	}
	for name, tc := range tests {
		if got := Quote(tc.in); got != tc.want {
			t.Errorf("%s: Quote = %s, want %s", name, got, tc.want)
		}
	}
}

func TestTruncateUTF8(t *testing.T) {
	tests := []struct {
		in   string
		n    int
		want string
	}{
		{"abc", 5, "abc"},
		{"abc", 0, ""},
		{"abc", -1, ""},
		{"aé", 2, "a"},
		{"aé", 3, "aé"},
		{"a😀", 4, "a"},
		{"\x80\x80\x80\x80\x80", 3, "\x80\x80\x80"}, // no character start to step back to
	}
	for _, tc := range tests {
		if got := TruncateUTF8(tc.in, tc.n); got != tc.want {
			t.Errorf("TruncateUTF8(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
	}
}

// TestCheckUnicastLoopback6 covers ::1/128, which ParseSubnet cannot reach: a /128 needs its one
// address as gateway, and that is its subnet-router anycast address.
func TestCheckUnicastLoopback6(t *testing.T) {
	err := checkUnicast(mustPrefixes(t, "fd00::/64", "::1/128"))
	want := "cidrBlock ::1/128 overlaps the loopback address ::1/128, which cannot be an underlay address: invalid subnet configuration"
	if err == nil || err.Error() != want || !errors.Is(err, ErrInvalid) {
		t.Fatalf("got %v, want %s", err, want)
	}
}
