package lbpod

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"

	"github.com/google/nftables"
)

// RemoveOtherRules deletes, in the network namespace the process runs in, what the rules back
// end the Applier does not use left there: a container of the same pod that ran with the other
// back end (an upgrade that changed the default, an lbpod restarted with another --rules). Its
// rules would otherwise stay in force beside ours: ports no longer in the Service forwarded,
// sources outside loadBalancerSourceRanges let in. A fresh namespace costs two netlink dumps and
// two small /proc reads; an iptables binary runs only where chains of ours were found. It
// returns what it removed.
func (a *Applier) RemoveOtherRules() ([]Change, error) {
	if a.backend() == RulesNFTables {
		return removeIPTablesLeftovers(a.nft)
	}
	return removeNFTablesLeftovers()
}

// RemoveOtherRulesOnceApplied makes the next Apply that succeeds remove what the other back end
// left (RemoveOtherRules) before it returns, logging each removal; when the removal fails, that
// Apply returns its error and the next one tries again. Removed at start instead, a restart
// that could not apply at once (the Service unreadable: the API server down) left the LB address
// on net1 with no rules at all: ports refused, nothing filtered, the pod an open router.
// Meanwhile both back ends' rules are in force, which is safe: the nat hooks stop at the first
// chain that translates a new connection (no double DNAT, and both translate to the
// ClusterIP), and each back end's filter lets through from net1 only what a DNAT created, so
// a packet must satisfy both.
func (a *Applier) RemoveOtherRulesOnceApplied() { a.removeOthers = true }

// removeOthersIfAsked does what RemoveOtherRulesOnceApplied asked for, once.
func (a *Applier) removeOthersIfAsked() error {
	if !a.removeOthers {
		return nil
	}
	removed, err := a.RemoveOtherRules()
	for _, c := range removed {
		a.Log.Info("removed what the other rules back end left", "change", c.String())
	}
	if err != nil {
		return err
	}
	a.removeOthers = false
	return nil
}

// removeIPTablesLeftovers deletes our chains written by iptables-nft (seen over nf_tables
// netlink, as tables named like iptables' in families ip and ip6) and by iptables-legacy (only
// where /proc/net lists legacy tables, which a namespace gets on first use).
func removeIPTablesLeftovers(conn *nftables.Conn) ([]Change, error) {
	var all []Change
	for _, fam := range []Family{IPv4, IPv6} {
		var flavours []Flavour
		if conn != nil {
			chains, err := conn.ListChainsOfTableFamily(nftFamily(fam))
			if err != nil {
				return all, fmt.Errorf("list %s nf_tables chains (iptables-nft's rules of a previous run): %w", fam, err)
			}
			if slices.ContainsFunc(chains, func(c *nftables.Chain) bool {
				return c.Table.Name != NFTTable && strings.HasPrefix(c.Name, chainPrefix)
			}) {
				flavours = append(flavours, FlavourNFT)
			}
		}
		names := "/proc/net/ip_tables_names"
		if fam == IPv6 {
			names = "/proc/net/ip6_tables_names"
		}
		if b, err := os.ReadFile(names); err == nil && len(strings.TrimSpace(string(b))) > 0 {
			flavours = append(flavours, FlavourLegacy)
		}
		for _, f := range flavours {
			bin := PathsFor(f).IPv4
			if fam == IPv6 {
				bin = PathsFor(f).IPv6
			}
			if _, err := exec.LookPath(bin + "-save"); err != nil {
				if f == FlavourLegacy {
					continue // tables someone else's legacy iptables made; ours need the binary
				}
				return all, fmt.Errorf("chains of ours left by %s, which is not installed to remove them: %w", bin, err)
			}
			saved, err := iptablesSave(bin)
			if err != nil {
				return all, err
			}
			payload, changes := PlanRemoveIPTables(saved, bin)
			if payload == "" {
				continue
			}
			if err := iptablesRestore(bin, payload); err != nil {
				return all, fmt.Errorf("remove the chains of a previous run: %w", err)
			}
			all = append(all, changes...)
		}
	}
	return all, nil
}

// removeNFTablesLeftovers deletes our nftables tables (ip lbsvc, ip6 lbsvc) in one batch. A
// kernel without nf_tables holds none.
func removeNFTablesLeftovers() ([]Change, error) {
	conn, err := nftables.New()
	if err != nil {
		return nil, err
	}
	var changes []Change
	for _, fam := range []Family{IPv4, IPv6} {
		tables, err := conn.ListTablesOfFamily(nftFamily(fam))
		if NFTablesMissing(err) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("list %s nftables tables (the nftables back end's of a previous run): %w", nftFamilyName(fam), err)
		}
		if slices.ContainsFunc(tables, func(t *nftables.Table) bool { return t.Name == NFTTable }) {
			conn.DelTable(&nftables.Table{Family: nftFamily(fam), Name: NFTTable})
			changes = append(changes, Change{Kind: "nftables", What: "table " + nftFamilyName(fam) + " " + NFTTable})
		}
	}
	if len(changes) == 0 {
		return nil, nil
	}
	if err := conn.Flush(); err != nil {
		return nil, fmt.Errorf("remove the nftables tables of a previous run: %w", err)
	}
	return changes, nil
}

// PlanRemoveIPTables returns the iptables-restore payload that deletes every chain of ours
// (LBSVC-*) from one family's tables as saved, and every rule of a built-in or foreign chain
// that jumps to one of them, with a Change for each: what the iptables back end left behind
// when the nftables back end takes over the namespace (a container restarted with another
// back end). Empty when nothing is ours. Each table is one transaction: the jumps go first,
// then every chain of ours is flushed, then deleted (they jump to each other). It is pure.
func PlanRemoveIPTables(saved Saved, cmd string) (payload string, changes []Change) {
	var b strings.Builder
	for _, table := range sortedKeys(saved) {
		chains := saved[table]
		var ours []string
		var body strings.Builder
		for _, name := range sortedKeys(chains) {
			if strings.HasPrefix(name, chainPrefix) {
				ours = append(ours, name)
				continue
			}
			for _, spec := range chains[name] {
				if to, ok := jumpTarget(spec); ok && strings.HasPrefix(to, chainPrefix) {
					fmt.Fprintf(&body, "-D %s %s\n", name, spec)
					changes = append(changes, Change{Kind: "jump", What: fmt.Sprintf("%s -t %s -A %s %s", cmd, table, name, spec)})
				}
			}
		}
		if len(ours) == 0 && body.Len() == 0 {
			continue
		}
		for _, name := range ours {
			fmt.Fprintf(&body, "-F %s\n", name)
		}
		for _, name := range ours {
			fmt.Fprintf(&body, "-X %s\n", name)
			changes = append(changes, Change{Kind: "chain", What: fmt.Sprintf("%s -t %s -X %s", cmd, table, name)})
		}
		fmt.Fprintf(&b, "*%s\n%sCOMMIT\n", table, body.String())
	}
	return b.String(), changes
}

// chainPrefix starts the name of every iptables chain of ours.
const chainPrefix = "LBSVC-"

// jumpTarget returns the chain a rule jumps or goes to ("-j X", "-g X").
func jumpTarget(spec string) (string, bool) {
	f := strings.Fields(spec)
	for i := 0; i+1 < len(f); i++ {
		if f[i] == "-j" || f[i] == "-g" || f[i] == "--jump" || f[i] == "--goto" {
			return f[i+1], true
		}
	}
	return "", false
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
