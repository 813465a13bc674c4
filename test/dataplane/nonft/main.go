// Command nonft runs a command in a process that sees the kernel as one without nf_tables would
// show it: creating a netfilter netlink socket (socket(AF_NETLINK, *, NETLINK_NETFILTER)) fails
// with EPROTONOSUPPORT, what a kernel built without nfnetlink answers. Everything else (iptables-
// legacy's setsockopt interface, rtnetlink) works as before. It is the data-path tests' stand-in
// for a node without nf_tables: nf_tables cannot be taken out of one network namespace of a
// running kernel, and a seccomp filter takes it away from the process and its children, so that
// lbpod's probe fails for real and its fallback runs for real.
//
//	nonft COMMAND [ARG]...
package main

import (
	"fmt"
	"os"
	"os/exec"
	"unsafe"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: nonft COMMAND [ARG]...")
		os.Exit(2)
	}
	path, err := exec.LookPath(os.Args[1])
	if err == nil {
		err = denyNetfilterNetlink()
	}
	if err == nil {
		err = unix.Exec(path, os.Args[1:], os.Environ())
	}
	fmt.Fprintln(os.Stderr, "nonft:", err)
	os.Exit(1)
}

// denyNetfilterNetlink installs the seccomp filter on every thread of the process (the exec'd
// command inherits it). The arguments are compared on their low 32 bits, which is where the
// kernel's seccomp_data puts an int argument on a little-endian machine (amd64, arm64).
func denyNetfilterNetlink() error {
	const (
		offNr   = 0       // seccomp_data.nr
		offArg0 = 16      // seccomp_data.args[0]: the domain
		offArg2 = 16 + 16 // seccomp_data.args[2]: the protocol
	)
	stmt := func(code uint16, k uint32) unix.SockFilter { return unix.SockFilter{Code: code, K: k} }
	jeq := func(k uint32, skipIfNot uint8) unix.SockFilter {
		return unix.SockFilter{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: k, Jf: skipIfNot}
	}
	filter := []unix.SockFilter{
		stmt(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, offNr),
		jeq(unix.SYS_SOCKET, 5),
		stmt(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, offArg0),
		jeq(unix.AF_NETLINK, 3),
		stmt(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, offArg2),
		jeq(unix.NETLINK_NETFILTER, 1),
		stmt(unix.BPF_RET|unix.BPF_K, unix.SECCOMP_RET_ERRNO|uint32(unix.EPROTONOSUPPORT)),
		stmt(unix.BPF_RET|unix.BPF_K, unix.SECCOMP_RET_ALLOW),
	}
	prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	if _, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&prog))); errno != 0 {
		return fmt.Errorf("seccomp: %w", errno)
	}
	return nil
}
