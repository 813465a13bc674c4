package lbpod

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// A run whose IPv6 restore fails after the IPv4 one went in stops before the forgets, and
// leaves both families marked pending: the next plan forgets the IPv4 flows, which a fresh read
// alone would not ask for (the IPv4 rules read as wanted). The iptables binaries are stand-ins
// that only read their input: nothing touches the kernel.
func TestRunLeavesFlowsPending(t *testing.T) {
	dir := t.TempDir()
	for name, code := range map[string]string{"ipt4-restore": "0", "ipt6-restore": "1"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/sh\ncat >/dev/null\nexit "+code+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	a := &Applier{Paths: IPTablesPaths{IPv4: filepath.Join(dir, "ipt4"), IPv6: filepath.Join(dir, "ipt6")}, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	err := a.Execute([]Op{
		RestoreOp{Family: IPv4, Table: "nat", Payload: "*nat\nCOMMIT\n"},
		RestoreOp{Family: IPv6, Table: "nat", Payload: "*nat\nCOMMIT\n"},
		ForgetFlowsOp{Family: IPv4},
		ForgetFlowsOp{Family: IPv6},
	})
	if err == nil {
		t.Fatal("the IPv6 restore's failure was not returned")
	}
	if got, want := a.pendingFlows(), map[Family]bool{IPv4: true, IPv6: true}; !reflect.DeepEqual(got, want) {
		t.Fatalf("pending %v, want %v", got, want)
	}
}
