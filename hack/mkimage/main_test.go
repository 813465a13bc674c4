package main

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseEntry(t *testing.T) {
	tests := map[string]struct {
		spec    string
		want    Entry
		wantErr string
	}{
		"file with mode":    {spec: "file:/tmp/a:/usr/bin/a:755", want: Entry{Kind: kindFile, Src: "/tmp/a", Dst: "/usr/bin/a", Mode: 0o755}},
		"file without mode": {spec: "file:/tmp/a:/a", want: Entry{Kind: kindFile, Src: "/tmp/a", Dst: "/a"}},
		"link":              {spec: "link:xtables-nft-multi:/usr/sbin/iptables", want: Entry{Kind: kindLink, Src: "xtables-nft-multi", Dst: "/usr/sbin/iptables"}},
		"dir default mode":  {spec: "dir:/run", want: Entry{Kind: kindDir, Dst: "/run", Mode: 0o755}},
		"dir sticky":        {spec: "dir:/tmp:1777", want: Entry{Kind: kindDir, Dst: "/tmp", Mode: 0o1777}},
		"unknown kind":      {spec: "dev:/dev/null", wantErr: `unknown kind "dev"`},
		"relative dst":      {spec: "file:/tmp/a:usr/a", wantErr: `destination "usr/a" must be a clean absolute path`},
		"unclean dst":       {spec: "file:/tmp/a:/usr/../a", wantErr: `destination "/usr/../a" must be a clean absolute path`},
		"root dst":          {spec: "dir:/", wantErr: `destination "/" must be`},
		"bad mode":          {spec: "file:/tmp/a:/a:9z", wantErr: `mode "9z" is not octal`},
		"too many fields":   {spec: "file:/a:/b:755:x", wantErr: "want file:SRC:DST[:MODE]"},
		"link missing dst":  {spec: "link:target", wantErr: "want link:TARGET:DST"},
		"empty source":      {spec: "file::/a", wantErr: "empty source"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := parseEntry(tc.spec)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("parseEntry(%q) error = %v, want one containing %q", tc.spec, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("parseEntry(%q): %v", tc.spec, err)
			}
			if got != tc.want {
				t.Fatalf("parseEntry(%q) = %+v, want %+v", tc.spec, got, tc.want)
			}
		})
	}
}

func TestParentDirs(t *testing.T) {
	entries := []Entry{
		{Kind: kindFile, Src: "x", Dst: "/usr/local/bin/lbpod"},
		{Kind: kindLink, Src: "x", Dst: "/usr/sbin/iptables"},
		{Kind: kindDir, Dst: "/usr/local", Mode: 0o755},
		{Kind: kindFile, Src: "x", Dst: "/pause"},
	}
	want := []string{"/usr", "/usr/local/bin", "/usr/sbin"}
	if got := parentDirs(entries); !reflect.DeepEqual(got, want) {
		t.Fatalf("parentDirs = %v, want %v", got, want)
	}
}
