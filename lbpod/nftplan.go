package lbpod

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// NFTKernel is one family's table of ours as read from the kernel (or a model of it), in the
// canonical form PlanNFT compares: plain data, so that the plan is tested without root.
type NFTKernel struct {
	Exists bool
	// Flags are the table's flags: ours has none. Dormant (set by hand with nft) unhooks every
	// base chain of the table while leaving it as it was, which a comparison of chains and sets
	// alone would take for converged.
	Flags uint32
	// Chains maps each chain of the table to its spec (NFTChain.Spec) and the Canon of each rule.
	Chains map[string]NFTKernelChain
	// Sets maps each set of the table to what it holds.
	Sets map[string]NFTKernelSet
}

// NFTKernelChain is a chain as read.
type NFTKernelChain struct {
	Spec  string
	Rules []string
}

// NFTKernelSet is a set as read: its key type ("inet_service" for ours), whether it is an
// interval set, and its elements as ports (sorted).
type NFTKernelSet struct {
	KeyType  string
	Interval bool
	Ports    []uint16
}

// NFTStepKind is what one step of an nftables batch does.
type NFTStepKind int

// The steps of an nftables batch.
const (
	NFTDelTable NFTStepKind = iota
	NFTAddTable
	NFTAddSet
	NFTAddChain
	NFTFlushChain
	NFTAddRule
	NFTAddElements
	NFTDelElements
)

// NFTStep is one message of the nftables batch: on the family's table, a set (Set, Ports) or a
// chain (Chain, and Rule for NFTAddRule).
type NFTStep struct {
	Kind   NFTStepKind
	Family Family
	Set    string
	Ports  []uint16
	Chain  NFTChain
	Rule   NFTRule
}

// String renders the step as the nft command that would do the same.
func (s NFTStep) String() string {
	t := nftFamilyName(s.Family) + " " + NFTTable
	switch s.Kind {
	case NFTDelTable:
		return "delete table " + t
	case NFTAddTable:
		return "add table " + t
	case NFTAddSet:
		if len(s.Ports) == 0 {
			return fmt.Sprintf("add set %s %s { type inet_service; }", t, s.Set)
		}
		return fmt.Sprintf("add set %s %s { type inet_service; elements = { %s } }", t, s.Set, portList(s.Ports))
	case NFTAddChain:
		if s.Chain.Hook == "" {
			return fmt.Sprintf("add chain %s %s", t, s.Chain.Name)
		}
		return fmt.Sprintf("add chain %s %s { type %s hook %s priority %d; }", t, s.Chain.Name, s.Chain.Type, s.Chain.Hook, s.Chain.Priority)
	case NFTFlushChain:
		return fmt.Sprintf("flush chain %s %s", t, s.Chain.Name)
	case NFTAddRule:
		return fmt.Sprintf("add rule %s %s %s", t, s.Chain.Name, s.Rule.Text)
	case NFTAddElements:
		return fmt.Sprintf("add element %s %s { %s }", t, s.Set, portList(s.Ports))
	case NFTDelElements:
		return fmt.Sprintf("delete element %s %s { %s }", t, s.Set, portList(s.Ports))
	}
	return fmt.Sprintf("unknown step %d", s.Kind)
}

// NFTablesOp is one nf_tables netlink batch: every step of every family of one sync, committed
// by the kernel as one transaction (all or nothing).
type NFTablesOp struct {
	Steps []NFTStep
	// Whole lists the families whose table the batch created or whose chains it rewrote:
	// verifying reads those whole. Sets lists, per other family, the sets whose elements it
	// changed: verifying reads back only those.
	Whole map[Family]bool
	Sets  map[Family][]string
}

func (o NFTablesOp) String() string {
	var lines []string
	for _, s := range o.Steps {
		lines = append(lines, s.String())
	}
	return "nft -f - <<" + strconv.Quote(strings.Join(lines, "\n"))
}

// NFTPlan is what it takes to bring one family's table to the wanted one.
type NFTPlan struct {
	Steps   []NFTStep
	Changes []Change
	// Whole is set when the table is (re)built or a chain rewritten; otherwise only the
	// elements of ChangedSets changed.
	Whole       bool
	ChangedSets []string
	// FlowsChanged is set when the nat rules may translate UDP or SCTP differently (see
	// RestorePlan.FlowsChanged).
	FlowsChanged bool
}

// PlanNFT compares one family's table as read with the wanted one. It is pure. A Service port
// change is an element added to or deleted from its protocol's set, nothing else; a chain whose
// rules differ is flushed and refilled (one transaction: no packet sees it half written); a
// table whose shape differs (a chain or set missing, extra, or of another kind: drift, or a
// source range's family appearing) is deleted and built again in the same transaction.
func PlanNFT(have NFTKernel, want NFTable) NFTPlan {
	var p NFTPlan
	fam := want.Family
	if reason := nftShapeDiffers(have, want); reason != "" {
		p.Whole, p.FlowsChanged = true, true
		what := "table " + nftFamilyName(fam) + " " + NFTTable
		if have.Exists {
			p.Steps = append(p.Steps, NFTStep{Kind: NFTDelTable, Family: fam})
			p.Changes = append(p.Changes, Change{Kind: "nftables", What: what + " (" + reason + ")"})
		}
		p.Changes = append(p.Changes, Change{Kind: "nftables", Added: true, What: what})
		p.Steps = append(p.Steps, NFTStep{Kind: NFTAddTable, Family: fam})
		for _, s := range want.Sets {
			p.Steps = append(p.Steps, NFTStep{Kind: NFTAddSet, Family: fam, Set: s.Name, Ports: s.Ports})
		}
		for _, c := range want.Chains {
			p.Steps = append(p.Steps, NFTStep{Kind: NFTAddChain, Family: fam, Chain: c})
		}
		for _, c := range want.Chains {
			for _, r := range c.Rules {
				p.Steps = append(p.Steps, NFTStep{Kind: NFTAddRule, Family: fam, Chain: c, Rule: r})
			}
		}
		return p
	}
	for _, c := range want.Chains {
		var canon []string
		for _, r := range c.Rules {
			canon = append(canon, Canon(r.Exprs))
		}
		if slices.Equal(canon, have.Chains[c.Name].Rules) {
			continue
		}
		p.Whole = true
		if c.Type != "filter" {
			p.FlowsChanged = true
		}
		p.Steps = append(p.Steps, NFTStep{Kind: NFTFlushChain, Family: fam, Chain: c})
		var texts []string
		for _, r := range c.Rules {
			p.Steps = append(p.Steps, NFTStep{Kind: NFTAddRule, Family: fam, Chain: c, Rule: r})
			texts = append(texts, r.Text)
		}
		p.Changes = append(p.Changes, Change{Kind: "nftables", Added: true, What: fmt.Sprintf("chain %s %s %s: %s", nftFamilyName(fam), NFTTable, c.Name, strings.Join(texts, "; "))})
	}
	for _, s := range want.Sets {
		had := have.Sets[s.Name].Ports
		gone := slices.DeleteFunc(slices.Clone(had), func(p uint16) bool { _, found := slices.BinarySearch(s.Ports, p); return found })
		added := slices.DeleteFunc(slices.Clone(s.Ports), func(p uint16) bool { _, found := slices.BinarySearch(had, p); return found })
		if len(gone) == 0 && len(added) == 0 {
			continue
		}
		p.ChangedSets = append(p.ChangedSets, s.Name)
		if s.Protocol != TCP {
			p.FlowsChanged = true
		}
		where := fmt.Sprintf("element %s %s %s", nftFamilyName(fam), NFTTable, s.Name)
		if len(gone) > 0 {
			p.Steps = append(p.Steps, NFTStep{Kind: NFTDelElements, Family: fam, Set: s.Name, Ports: gone})
			p.Changes = append(p.Changes, Change{Kind: "nftables", What: where + " { " + portList(gone) + " }"})
		}
		if len(added) > 0 {
			p.Steps = append(p.Steps, NFTStep{Kind: NFTAddElements, Family: fam, Set: s.Name, Ports: added})
			p.Changes = append(p.Changes, Change{Kind: "nftables", Added: true, What: where + " { " + portList(added) + " }"})
		}
	}
	return p
}

// nftShapeDiffers says why the table as read cannot be brought to the wanted one by refilling
// chains and changing set elements; "" when it can.
func nftShapeDiffers(have NFTKernel, want NFTable) string {
	if !have.Exists {
		return "missing"
	}
	if have.Flags != 0 {
		// As google/nftables reads them (dormant, 1 on the wire, reads 0x1000000): any flag is one
		// ours does not have.
		return fmt.Sprintf("table flags %#x as read: ours has none (dormant unhooks it)", have.Flags)
	}
	var wantChains, wantSets []string
	for _, c := range want.Chains {
		wantChains = append(wantChains, c.Name)
		if hc, ok := have.Chains[c.Name]; ok && hc.Spec != c.Spec() {
			return fmt.Sprintf("chain %s is %q", c.Name, hc.Spec)
		}
	}
	for _, s := range want.Sets {
		wantSets = append(wantSets, s.Name)
		if hs, ok := have.Sets[s.Name]; ok && (hs.KeyType != "inet_service" || hs.Interval) {
			return fmt.Sprintf("set %s is of type %s", s.Name, hs.KeyType)
		}
	}
	slices.Sort(wantChains)
	slices.Sort(wantSets)
	if got := slices.Sorted(maps.Keys(have.Chains)); !slices.Equal(got, wantChains) {
		return fmt.Sprintf("chains %v, want %v", got, wantChains)
	}
	if got := slices.Sorted(maps.Keys(have.Sets)); !slices.Equal(got, wantSets) {
		return fmt.Sprintf("sets %v, want %v", got, wantSets)
	}
	return ""
}

// ApplyNFT is the kernel's part of executing steps, on a model: what the table holds after the
// batch. The fuzz test checks plans against it; it is pure.
func ApplyNFT(k NFTKernel, steps []NFTStep) NFTKernel {
	k = cloneNFTKernel(k)
	for _, s := range steps {
		switch s.Kind {
		case NFTDelTable:
			k = NFTKernel{}
		case NFTAddTable:
			if !k.Exists {
				k = NFTKernel{Exists: true, Chains: map[string]NFTKernelChain{}, Sets: map[string]NFTKernelSet{}}
			}
		case NFTAddSet:
			k.Sets[s.Set] = NFTKernelSet{KeyType: "inet_service", Ports: slices.Clone(s.Ports)}
		case NFTAddChain:
			k.Chains[s.Chain.Name] = NFTKernelChain{Spec: s.Chain.Spec()}
		case NFTFlushChain:
			c := k.Chains[s.Chain.Name]
			c.Rules = nil
			k.Chains[s.Chain.Name] = c
		case NFTAddRule:
			c := k.Chains[s.Chain.Name]
			c.Rules = append(c.Rules, Canon(s.Rule.Exprs))
			k.Chains[s.Chain.Name] = c
		case NFTAddElements, NFTDelElements:
			set := k.Sets[s.Set]
			for _, port := range s.Ports {
				i, found := slices.BinarySearch(set.Ports, port)
				switch {
				case s.Kind == NFTAddElements && !found:
					set.Ports = slices.Insert(set.Ports, i, port)
				case s.Kind == NFTDelElements && found:
					set.Ports = slices.Delete(set.Ports, i, i+1)
				}
			}
			k.Sets[s.Set] = set
		}
	}
	return k
}

func cloneNFTKernel(k NFTKernel) NFTKernel {
	out := NFTKernel{Exists: k.Exists, Flags: k.Flags, Chains: map[string]NFTKernelChain{}, Sets: map[string]NFTKernelSet{}}
	for n, c := range k.Chains {
		out.Chains[n] = NFTKernelChain{Spec: c.Spec, Rules: slices.Clone(c.Rules)}
	}
	for n, s := range k.Sets {
		s.Ports = slices.Clone(s.Ports)
		out.Sets[n] = s
	}
	return out
}

func nftFamilyName(f Family) string {
	if f == IPv6 {
		return "ip6"
	}
	return "ip"
}

// portList renders ports as nft prints set elements: "80, 443".
func portList(ports []uint16) string {
	var s []string
	for _, p := range ports {
		s = append(s, strconv.Itoa(int(p)))
	}
	return strings.Join(s, ", ")
}
