package lbpod

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// ForwardingSysctl returns the sysctl that turns forwarding on for a family.
func ForwardingSysctl(fam Family) string {
	if fam == IPv6 {
		return "net.ipv6.conf.all.forwarding"
	}
	return "net.ipv4.ip_forward"
}

// ErrForwarding explains a forwarding sysctl the lb pod needs but may not set.
type ErrForwarding struct {
	Sysctl string
	Err    error
}

func (e *ErrForwarding) Error() string {
	flag := "--forwarding-sysctls=all"
	if strings.HasPrefix(e.Sysctl, "net.ipv6") {
		flag = "--forwarding-sysctls=ipv6 (or all)"
	}
	return fmt.Sprintf("%s is 0 and cannot be set here (%v): run the operator with %s, and allow that unsafe sysctl on the kubelet (--allowed-unsafe-sysctls=%s)",
		e.Sysctl, e.Err, flag, e.Sysctl)
}

// EnsureForwarding reads the forwarding sysctl of each family under procSys (normally
// /proc/sys) and tries to turn it on when it is off. A namespace inherits IPv4 forwarding from
// the host but starts with IPv6 forwarding off; in a pod /proc/sys is read-only, so the operator
// sets them through the pod's securityContext instead, and this only verifies.
func EnsureForwarding(procSys string, families []Family) (changed []string, err error) {
	for _, fam := range families {
		name := ForwardingSysctl(fam)
		path := filepath.Join(procSys, strings.ReplaceAll(name, ".", "/"))
		cur, rerr := os.ReadFile(path)
		if rerr != nil {
			return changed, fmt.Errorf("read %s: %w", name, rerr)
		}
		if strings.TrimSpace(string(cur)) == "1" {
			continue
		}
		if werr := os.WriteFile(path, []byte("1\n"), 0o644); werr != nil {
			return changed, &ErrForwarding{Sysctl: name, Err: werr}
		}
		changed = append(changed, name+"=1")
	}
	return changed, nil
}
