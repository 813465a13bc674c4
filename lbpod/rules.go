package lbpod

import (
	"errors"
	"fmt"
	"slices"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
)

// RulesAuto is the --rules value meaning "the default": nftables where the kernel offers
// nf_tables, iptables where it does not. It is lbpod's default, and what an empty LBPOD_RULES
// means, so that the operator sets nothing for the default and a Deployment written without the
// variable stays as it was.
const RulesAuto = v1alpha1.RulesAuto

// Why a rules back end was chosen (RulesChoice.Why, the "why" label of lbpod_rules_backend).
const (
	// RulesWhyFlag: --rules (or LBPOD_RULES) named the back end.
	RulesWhyFlag = "flag"
	// RulesWhyDefault: --rules auto, and nf_tables works.
	RulesWhyDefault = "default"
	// RulesWhyFallback: --rules auto, and this kernel (or sandbox) offers no nf_tables.
	RulesWhyFallback = "fallback"
)

// RulesChoice is the rules back end lbpod runs, and why.
type RulesChoice struct {
	Backend RulesBackend
	// Why is RulesWhyFlag, RulesWhyDefault or RulesWhyFallback.
	Why string
	// Probe is the nf_tables probe's error behind a fallback (nil otherwise), for the log.
	Probe error
}

// ParseRules checks a --rules value: "auto" (or empty), "iptables" or "nftables".
func ParseRules(s string) error {
	switch s {
	case "", RulesAuto, string(RulesIPTables), string(RulesNFTables):
		return nil
	}
	return fmt.Errorf("rules %q: want %s, %s or %s", s, RulesAuto, RulesNFTables, RulesIPTables)
}

// RulesNeedProbe reports whether ChooseRules needs the nf_tables probe's result for the flag:
// not for an explicit iptables, which never touches nf_tables through this back end.
func RulesNeedProbe(flag string) bool { return flag != string(RulesIPTables) }

// ChooseRules decides the rules back end from the --rules flag and the nf_tables probe's error
// (nil: nf_tables works; ignored for iptables). It is pure.
//
//   - iptables: iptables.
//   - nftables: nftables, and an error if the probe failed, whatever the reason: asked for
//     explicitly, a missing nf_tables must not turn silently into another back end.
//   - auto or empty: nftables when the probe succeeded; iptables when it failed because the
//     kernel offers no nf_tables (NFTablesMissing); an error for any other failure (no
//     NET_ADMIN, say), which iptables would meet as well, so that the pod says why at once.
func ChooseRules(flag string, probe error) (RulesChoice, error) {
	if err := ParseRules(flag); err != nil {
		return RulesChoice{}, err
	}
	switch {
	case flag == string(RulesIPTables):
		return RulesChoice{Backend: RulesIPTables, Why: RulesWhyFlag}, nil
	case flag == string(RulesNFTables) && probe != nil:
		return RulesChoice{}, fmt.Errorf("rules nftables: nf_tables cannot be used in this network namespace (%v): run with --rules %s (LBPOD_RULES; the operator's --lb-rules) to use iptables instead, or with --rules %s to fall back to it by itself", probe, RulesIPTables, RulesAuto)
	case flag == string(RulesNFTables):
		return RulesChoice{Backend: RulesNFTables, Why: RulesWhyFlag}, nil
	case probe == nil:
		return RulesChoice{Backend: RulesNFTables, Why: RulesWhyDefault}, nil
	case NFTablesMissing(probe):
		return RulesChoice{Backend: RulesIPTables, Why: RulesWhyFallback, Probe: probe}, nil
	}
	return RulesChoice{}, fmt.Errorf("rules auto: the nf_tables probe failed (%v), not because nf_tables is missing, so iptables would fail too: does the container have NET_ADMIN?", probe)
}

// nftMissingErrnos are the errors the kernel answers with when it has no nf_tables to offer:
// EPROTONOSUPPORT (no nfnetlink: the netlink socket cannot be created), EAFNOSUPPORT (the
// family's tables are not built in), EOPNOTSUPP (nfnetlink without the nf_tables subsystem, in
// a batch), EINVAL (the same, in a request outside a batch), ENOENT (no nat chain type: the
// nft_chain_nat module is missing), ENOSYS (a sandbox without the call).
var nftMissingErrnos = []unix.Errno{unix.EPROTONOSUPPORT, unix.EAFNOSUPPORT, unix.EOPNOTSUPP, unix.EINVAL, unix.ENOENT, unix.ENOSYS}

// NFTablesMissing reports whether an error of the nf_tables probe means that this kernel (or
// the sandbox the pod runs in) offers no nf_tables, rather than that it was refused to us.
func NFTablesMissing(err error) bool {
	var errno unix.Errno
	return errors.As(err, &errno) && slices.Contains(nftMissingErrnos, errno)
}

// ProbeNFTables asks the kernel, in the network namespace the process runs in, for what the
// nftables back end needs: one batch that adds a table with a nat base chain (the chain type
// that needs the most of the kernel) and deletes it again, so nothing stays. Its error says why
// nf_tables cannot be used; NFTablesMissing tells a kernel without nf_tables from a refusal.
func ProbeNFTables() error {
	conn, err := nftables.New()
	if err != nil {
		return err
	}
	t := conn.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: NFTTable + "-probe"})
	conn.AddChain(&nftables.Chain{Table: t, Name: "probe", Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest})
	conn.DelTable(t)
	return conn.Flush()
}
