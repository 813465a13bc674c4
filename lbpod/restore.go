package lbpod

import (
	"bufio"
	"fmt"
	"slices"
	"strings"
)

// Saved is what one `iptables-save` (or ip6tables-save) printed, split by table: for each table,
// the chains it declares and the rules of each chain in order ("-A <chain> " cut off).
type Saved map[string]map[string][]string

// ParseSave reads iptables-save output. Lines it does not know (comments, COMMIT) are skipped;
// a rule line outside a table is an error, since then the text is not iptables-save output.
func ParseSave(text string) (Saved, error) {
	s := Saved{}
	table := ""
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, "*"):
			table = line[1:]
			if s[table] == nil {
				s[table] = map[string][]string{}
			}
		case strings.HasPrefix(line, ":"):
			if table == "" {
				return nil, fmt.Errorf("iptables-save line %d: chain outside a table", n)
			}
			name, _, _ := strings.Cut(line[1:], " ")
			if _, ok := s[table][name]; !ok {
				s[table][name] = nil
			}
		case strings.HasPrefix(line, "-A "):
			if table == "" {
				return nil, fmt.Errorf("iptables-save line %d: rule outside a table", n)
			}
			name, spec, _ := strings.Cut(line[3:], " ")
			s[table][name] = append(s[table][name], spec)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read iptables-save output: %w", err)
	}
	return s, nil
}

// RestorePlan is what it takes to bring one family's tables to the desired state.
type RestorePlan struct {
	// Payloads holds, per table that needs a change, the input of one `iptables-restore
	// --noflush` run. Each changed chain is declared (which empties it) and refilled inside
	// one transaction, so the kernel swaps the whole chain at once: no packet sees it half
	// written. Chains that are already right are not mentioned, so their counters stay.
	Payloads map[string]string
	// Tables lists the keys of Payloads in a stable order.
	Tables []string
	// Changes describes each difference, for the log and the dry run.
	Changes []Change
	// FlowsChanged is set when a nat change may translate UDP or SCTP differently: the caller
	// then forgets the conntrack entries the new rules would not translate the same way. A
	// change of TCP DNAT rules only does not set it: FlowPolicy.Stale never deletes TCP
	// entries, and walking the conntrack table costs ~10 ms on a busy host.
	FlowsChanged bool
	// Written lists the chains the payloads declare, patch or refill, in payload order.
	Written []ChainRef
	// Whole is set when the payloads also change a built-in chain (a jump) or delete a chain:
	// then reading back only the Written chains would not show all of the change.
	Whole bool
}

// ChainRef names one chain of one table.
type ChainRef struct {
	Table string
	Chain string
}

// PlanRestore compares what iptables-save printed with the wanted chains and jumps of one family.
// It is pure: the caller runs the payloads and reads the result back once to verify.
func PlanRestore(saved Saved, want Tables, cmd string) RestorePlan {
	p := RestorePlan{Payloads: map[string]string{}}
	// All chain declarations of a table come before its rules: a rule may jump to a chain
	// declared later in the same transaction.
	decls, bodies := map[string]*strings.Builder{}, map[string]*strings.Builder{}
	body := func(table string) *strings.Builder {
		b := bodies[table]
		if b == nil {
			b = &strings.Builder{}
			bodies[table] = b
			decls[table] = &strings.Builder{}
			p.Tables = append(p.Tables, table)
		}
		return b
	}
	for _, c := range want.Chains {
		have, exists := saved[c.Table][c.Name]
		wantSpecs := make([]string, len(c.Rules))
		for i, r := range c.Rules {
			wantSpecs[i] = strings.Join(r, " ")
		}
		if exists && slices.Equal(have, wantSpecs) {
			continue
		}
		if c.Table == "nat" && !tcpOnly(c.Name, have, wantSpecs) {
			p.FlowsChanged = true
		}
		p.Written = append(p.Written, ChainRef{Table: c.Table, Chain: c.Name})
		b := body(c.Table)
		haveSet, wantSet := setOf(have), setOf(wantSpecs)
		patch := exists && patchable(have, wantSpecs)
		if !patch {
			fmt.Fprintf(decls[c.Table], ":%s - [0:0]\n", c.Name)
		}
		before := len(p.Changes)
		if !exists {
			p.Changes = append(p.Changes, Change{Kind: "chain", Added: true, What: fmt.Sprintf("%s -t %s -N %s", cmd, c.Table, c.Name)})
		}
		for _, spec := range have {
			if patch && !wantSet[spec] {
				fmt.Fprintf(b, "-D %s %s\n", c.Name, spec)
			}
		}
		for _, spec := range wantSpecs {
			added := !haveSet[spec]
			if !patch || added {
				fmt.Fprintf(b, "-A %s %s\n", c.Name, spec)
			}
			if added {
				p.Changes = append(p.Changes, Change{Kind: "iptables", Added: true, What: fmt.Sprintf("%s -t %s -A %s %s", cmd, c.Table, c.Name, spec)})
			}
		}
		for _, spec := range have {
			if wantSet[spec] {
				continue
			}
			p.Changes = append(p.Changes, Change{Kind: "iptables", What: fmt.Sprintf("%s -t %s -A %s %s", cmd, c.Table, c.Name, spec)})
		}
		if len(p.Changes) == before {
			// Same rules, another order: still a difference (order decides which rule matches).
			p.Changes = append(p.Changes, Change{Kind: "chain", Added: true, What: fmt.Sprintf("%s -t %s -S %s (reordered)", cmd, c.Table, c.Name)})
		}
	}
	for _, j := range want.Jumps {
		spec := "-j " + j.To
		count := 0
		for _, r := range saved[j.Table][j.From] {
			if r == spec {
				count++
			}
		}
		// First, so that no rule added by anyone else to the built-in chain shadows it: one that
		// drifted behind another rule is moved back to the front.
		misplaced := count == 1 && saved[j.Table][j.From][0] != spec
		line := fmt.Sprintf("-A %s -j %s", j.From, j.To)
		if (count != 1 || misplaced) && j.Table == "nat" {
			p.FlowsChanged = true
		}
		if count != 1 || misplaced {
			p.Whole = true
		}
		switch {
		case count == 0:
			fmt.Fprintf(body(j.Table), "-I %s 1 -j %s\n", j.From, j.To)
			p.Changes = append(p.Changes, Change{Kind: "jump", Added: true, What: fmt.Sprintf("%s -t %s %s", cmd, j.Table, line)})
		case misplaced:
			fmt.Fprintf(body(j.Table), "-D %s -j %s\n-I %s 1 -j %s\n", j.From, j.To, j.From, j.To)
			p.Changes = append(p.Changes, Change{Kind: "jump", Added: true, What: fmt.Sprintf("%s -t %s %s (moved to the front)", cmd, j.Table, line)})
		case count > 1:
			// All of them deleted and one put back in front: the one kept is where it belongs.
			for range count {
				fmt.Fprintf(body(j.Table), "-D %s -j %s\n", j.From, j.To)
			}
			fmt.Fprintf(body(j.Table), "-I %s 1 -j %s\n", j.From, j.To)
			for range count - 1 {
				p.Changes = append(p.Changes, Change{Kind: "jump", What: fmt.Sprintf("%s -t %s %s (duplicate)", cmd, j.Table, line)})
			}
		}
	}
	// Bucket chains no longer wanted (a bucket emptied, or the Service went back to a flat
	// LBSVC-SERVICES): emptied and deleted last, after the rules that jumped to them were
	// rewritten in the same transaction, so nothing ever jumps to a missing chain.
	wanted := map[ChainRef]bool{}
	for _, c := range want.Chains {
		wanted[ChainRef{Table: c.Table, Chain: c.Name}] = true
	}
	var stale []string
	for name := range saved["nat"] {
		if !wanted[ChainRef{Table: "nat", Chain: ChainServices}] {
			break // LBSVC-SERVICES, which may jump to them, is not ours to rewrite here
		}
		if strings.HasPrefix(name, ChainServices+"-") && !wanted[ChainRef{Table: "nat", Chain: name}] {
			stale = append(stale, name)
		}
	}
	slices.Sort(stale)
	for _, name := range stale {
		fmt.Fprintf(body("nat"), "-F %s\n-X %s\n", name, name)
		p.Changes = append(p.Changes, Change{Kind: "chain", What: fmt.Sprintf("%s -t nat -X %s", cmd, name)})
		p.Whole = true
		if !tcpOnly(name, saved["nat"][name], nil) {
			p.FlowsChanged = true
		}
	}
	for _, t := range p.Tables {
		p.Payloads[t] = "*" + t + "\n" + decls[t].String() + bodies[t].String() + "COMMIT\n"
	}
	return p
}

// tcpOnly reports whether changing a nat chain from have to want touches TCP DNAT only: the
// chain is LBSVC-SERVICES or a bucket, and every rule added or removed matches -p tcp (a mere
// reorder changes nothing there: the rules match disjoint ports). It is pure.
func tcpOnly(chain string, have, want []string) bool {
	if chain != ChainServices && !strings.HasPrefix(chain, ChainServices+"-") {
		return false
	}
	haveSet, wantSet := setOf(have), setOf(want)
	for _, side := range [][]string{have, want} {
		for _, spec := range side {
			if haveSet[spec] && wantSet[spec] {
				continue
			}
			if !strings.Contains(" "+spec+" ", " -p tcp ") {
				return false
			}
		}
	}
	return true
}

// ParseChain reads what `iptables -t <table> -S <chain>` printed: the chain's rules in order,
// as ParseSave keeps them ("-A <chain> " cut off). Lines for other chains are an error, since
// then the text is not that chain's listing.
func ParseChain(chain, text string) ([]string, error) {
	var rules []string
	for n, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "", line == "-N "+chain, strings.HasPrefix(line, "-P "+chain+" "):
		case strings.HasPrefix(line, "-A "+chain+" "):
			rules = append(rules, strings.TrimPrefix(line, "-A "+chain+" "))
		default:
			return nil, fmt.Errorf("iptables -S %s line %d: not a rule of that chain: %q", chain, n+1, firstLine(line))
		}
	}
	return rules, nil
}

// patchable reports whether want is have with some rules deleted and new ones appended at the
// end, no rule repeated: then deleting and appending just those, still in one transaction,
// gives the same chain as rewriting it whole, and is much cheaper for a long chain.
func patchable(have, want []string) bool {
	seen := make(map[string]bool, len(have))
	for _, h := range have {
		if seen[h] {
			return false
		}
		seen[h] = true
	}
	wanted := make(map[string]bool, len(want))
	for _, w := range want {
		if wanted[w] {
			return false
		}
		wanted[w] = true
	}
	i := 0
	for _, h := range have {
		if !wanted[h] {
			continue
		}
		if i >= len(want) || want[i] != h {
			return false
		}
		i++
	}
	for _, w := range want[i:] {
		if seen[w] {
			return false
		}
	}
	return true
}

// setOf returns the rules of a chain as a set: a chain of thousands of rules is compared in
// linear time.
func setOf(specs []string) map[string]bool {
	set := make(map[string]bool, len(specs))
	for _, s := range specs {
		set[s] = true
	}
	return set
}
