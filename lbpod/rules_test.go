package lbpod

import (
	"fmt"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// The decision table of ChooseRules: every flag against a working nf_tables, a missing one
// (as the kernel says it, wrapped as google/nftables wraps it) and a refusal.
func TestChooseRules(t *testing.T) {
	missing := fmt.Errorf("conn.Receive: %w", &os.SyscallError{Syscall: "socket", Err: unix.EPROTONOSUPPORT})
	noNAT := fmt.Errorf("conn.Receive: %w", unix.ENOENT)
	refused := fmt.Errorf("conn.Receive: %w", unix.EPERM)
	for _, c := range []struct {
		flag    string
		probe   error
		want    RulesChoice
		wantErr string
	}{
		{flag: "", probe: nil, want: RulesChoice{Backend: RulesNFTables, Why: RulesWhyDefault}},
		{flag: "auto", probe: nil, want: RulesChoice{Backend: RulesNFTables, Why: RulesWhyDefault}},
		{flag: "auto", probe: missing, want: RulesChoice{Backend: RulesIPTables, Why: RulesWhyFallback, Probe: missing}},
		{flag: "", probe: noNAT, want: RulesChoice{Backend: RulesIPTables, Why: RulesWhyFallback, Probe: noNAT}},
		{flag: "auto", probe: refused, wantErr: "rules auto: the nf_tables probe failed (conn.Receive: operation not permitted), not because nf_tables is missing, so iptables would fail too: does the container have NET_ADMIN?"},
		{flag: "nftables", probe: nil, want: RulesChoice{Backend: RulesNFTables, Why: RulesWhyFlag}},
		{flag: "nftables", probe: missing, wantErr: "rules nftables: nf_tables cannot be used in this network namespace (conn.Receive: socket: protocol not supported): run with --rules iptables (LBPOD_RULES; the operator's --lb-rules) to use iptables instead, or with --rules auto to fall back to it by itself"},
		{flag: "nftables", probe: refused, wantErr: "rules nftables: nf_tables cannot be used in this network namespace (conn.Receive: operation not permitted): run with --rules iptables (LBPOD_RULES; the operator's --lb-rules) to use iptables instead, or with --rules auto to fall back to it by itself"},
		{flag: "iptables", probe: nil, want: RulesChoice{Backend: RulesIPTables, Why: RulesWhyFlag}},
		{flag: "iptables", probe: missing, want: RulesChoice{Backend: RulesIPTables, Why: RulesWhyFlag}},
		{flag: "nft", probe: nil, wantErr: `rules "nft": want auto, nftables or iptables`},
	} {
		got, err := ChooseRules(c.flag, c.probe)
		if c.wantErr != "" {
			if err == nil || err.Error() != c.wantErr {
				t.Errorf("ChooseRules(%q, %v): error %v, want %q", c.flag, c.probe, err, c.wantErr)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("ChooseRules(%q, %v) = %+v, %v; want %+v", c.flag, c.probe, got, err, c.want)
		}
	}
}

func TestRulesNeedProbe(t *testing.T) {
	for flag, want := range map[string]bool{"": true, "auto": true, "nftables": true, "iptables": false} {
		if got := RulesNeedProbe(flag); got != want {
			t.Errorf("RulesNeedProbe(%q) = %v, want %v", flag, got, want)
		}
	}
}

func TestNFTablesMissing(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("x: %w", unix.EPROTONOSUPPORT), true},
		{fmt.Errorf("x: %w", unix.EOPNOTSUPP), true},
		{fmt.Errorf("x: %w", unix.ENOENT), true},
		{fmt.Errorf("x: %w", unix.EPERM), false},
		{fmt.Errorf("x: %w", unix.ENOBUFS), false},
		{fmt.Errorf("no errno"), false},
		{nil, false},
	} {
		if got := NFTablesMissing(c.err); got != c.want {
			t.Errorf("NFTablesMissing(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
