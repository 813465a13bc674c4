package ha

import (
	"strings"
	"testing"
)

func TestClaimOrder(t *testing.T) {
	base := Claim{Term: 4, Priority: 100, Sender: idB}
	for _, tc := range []struct {
		name string
		c    Claim
		want int
	}{
		{"newer term wins whatever the priority and ID", Claim{Term: 5, Priority: 0, Sender: idC}, 1},
		{"older term loses", Claim{Term: 3, Priority: 255, Sender: idA}, -1},
		{"same term: higher priority wins", Claim{Term: 4, Priority: 101, Sender: idC}, 1},
		{"same term and priority: higher ID wins", Claim{Term: 4, Priority: 100, Sender: idA}, 1},
		{"same term and priority: lower ID loses", Claim{Term: 4, Priority: 100, Sender: idC}, -1},
		{"the same claim", base, 0},
	} {
		if got := tc.c.Compare(base); got != tc.want {
			t.Errorf("%s: %v.Compare(%v) = %d, want %d", tc.name, tc.c, base, got, tc.want)
		}
		if got := base.Compare(tc.c); got != -tc.want {
			t.Errorf("%s: reversed = %d, want %d", tc.name, got, -tc.want)
		}
	}
}

func TestParseClaim(t *testing.T) {
	c := Claim{Term: 12, Priority: 100, Sender: idA}
	if s := c.String(); s != "12 100 02:00:00:00:00:05" {
		t.Fatalf("String = %q", s)
	}
	got, err := ParseClaim(" 12  100 02:00:00:00:00:05 ")
	if err != nil || got != c {
		t.Fatalf("ParseClaim = %+v, %v; want %+v", got, err, c)
	}
	if got, err := ParseClaim("9223372036854775807 255 02:00:00:00:00:05"); err != nil || got.Term != MaxTerm || got.Priority != 255 {
		t.Fatalf("MaxTerm, 255: %+v, %v", got, err)
	}
	for in, want := range map[string]string{
		"":                          "want",
		"1 100":                     "want",
		"1 100 02:00:00:00:00:05 x": "want",
		"-1 100 02:00:00:00:00:05":  "term",
		"9223372036854775808 100 02:00:00:00:00:05":  "term",
		"18446744073709551615 100 02:00:00:00:00:05": "term",
		"1 256 02:00:00:00:00:05":                    "priority",
		"1 100 nope":                                 "not a MAC",
		"1 100 02:00:00:00:00:00:00:05":              "not a MAC",
		"1 100 00:00:00:00:00:00":                    "not a unicast MAC",
		"1 100 03:6c:62:73:76:63":                    "not a unicast MAC",
	} {
		if _, err := ParseClaim(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseClaim(%q) = %v, want an error containing %q", in, err, want)
		}
	}
}
