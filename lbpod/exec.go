package lbpod

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"time"
)

// binary is the iptables binary of a family.
func (a *Applier) binary(fam Family) (string, error) {
	bin := a.Paths.IPv4
	if fam == IPv6 {
		bin = a.Paths.IPv6
	}
	if bin == "" {
		return "", fmt.Errorf("no iptables for %s", fam)
	}
	return bin, nil
}

// iptablesRestore feeds one payload to `<bin>-restore --noflush`, waiting for the xtables lock
// (legacy back end) rather than failing when another writer holds it.
func iptablesRestore(bin, payload string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, bin+"-restore", "--noflush", "--wait=5")
	cmd.Stdin = strings.NewReader(payload)
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s-restore --noflush: %w: %s", bin, err, firstLine(stderr.String()))
	}
	return nil
}

// RestoreError is an iptables-restore run that failed: the table it failed on applied nothing,
// but the tables committed before it in the same run (each its own COMMIT) stay.
type RestoreError struct {
	Family Family
	Table  string
	Err    error
}

func (e *RestoreError) Error() string { return e.Err.Error() }

// Unwrap returns the underlying error.
func (e *RestoreError) Unwrap() error { return e.Err }

// firstLine keeps an error message to one bounded line.
func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return s
}
