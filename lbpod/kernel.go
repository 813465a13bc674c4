package lbpod

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"net"
	"net/netip"
	"os/exec"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Read reads what PlanSync compares: net1 and its addresses, the interfaces' indexes, the rules
// and routes of our table, and each family's iptables tables (one iptables-save per family).
func (a *Applier) Read(st State) (Kernel, error) {
	return a.read(st.ForRules(a.backend()), true, nil, nil, &Applied{})
}

// read reads the kernel. The iptables tables of a family come from the cache unless fresh, or
// the family is in reread, or nothing is cached for it; the chains listed in relist are read
// from the kernel into the cached tables. The iptables binaries run in parallel: each exec
// waits mostly on its own start-up. res counts the runs.
//
// The nftables tables likewise come from their cache unless fresh or reread; nftSets (one map at
// most) names, per family, the sets whose elements are read back into the cached table.
func (a *Applier) read(st State, fresh bool, reread map[Family]bool, relist map[Family][]ChainRef, res *Applied, nftSets ...map[Family][]string) (Kernel, error) {
	k := Kernel{Link: Link{Name: st.Interface}, Indexes: map[string]int{}, IPTables: map[Family]Saved{}, NFTables: map[Family]NFTKernel{},
		FlowsPending: a.pendingFlows()}
	if a.saved == nil {
		a.saved = map[Family]Saved{}
	}
	if a.nftSaved == nil {
		a.nftSaved = map[Family]NFTKernel{}
	}
	for _, t := range st.NFTables {
		cached, ok := a.nftSaved[t.Family]
		var sets []string
		if len(nftSets) > 0 {
			sets = nftSets[0][t.Family]
		}
		var err error
		switch {
		case ok && !fresh && !reread[t.Family] && len(sets) == 0:
			k.NFTables[t.Family] = cached
			continue
		case ok && !fresh && !reread[t.Family]:
			res.Lists += len(sets)
			cached, err = ReadNFT(a.nft, t.Family, cached, sets)
		default:
			res.Saves++
			cached, err = ReadNFT(a.nft, t.Family, NFTKernel{}, nil)
		}
		if err != nil {
			delete(a.nftSaved, t.Family)
			return k, err
		}
		k.NFTables[t.Family], a.nftSaved[t.Family] = cached, cached
	}
	type job struct {
		fam   Family
		bin   string
		chain ChainRef // zero: the whole family (iptables-save)
		saved Saved
		rules []string
		err   error
	}
	var jobs []*job
	for _, t := range st.IPTables {
		cached, ok := a.saved[t.Family]
		if ok && !fresh && !reread[t.Family] {
			k.IPTables[t.Family] = cached
			if len(relist[t.Family]) == 0 {
				continue
			}
		}
		bin, err := a.binary(t.Family)
		if err != nil {
			return k, err
		}
		if _, listed := k.IPTables[t.Family]; !listed {
			res.Saves++
			jobs = append(jobs, &job{fam: t.Family, bin: bin})
			continue
		}
		for _, c := range relist[t.Family] {
			res.Lists++
			jobs = append(jobs, &job{fam: t.Family, bin: bin, chain: c})
		}
	}
	var wg sync.WaitGroup
	for _, j := range jobs {
		wg.Go(func() {
			if j.chain == (ChainRef{}) {
				j.saved, j.err = iptablesSave(j.bin)
			} else {
				j.rules, j.err = iptablesList(j.bin, j.chain)
			}
		})
	}
	wg.Wait()
	for _, j := range jobs {
		if j.err != nil {
			delete(a.saved, j.fam)
			return k, j.err
		}
		if j.chain == (ChainRef{}) {
			k.IPTables[j.fam], a.saved[j.fam] = j.saved, j.saved
		}
	}
	// The listed chains replace their cached copies, in a copy: a Saved already handed out
	// (a plan's input) never changes under its reader.
	for _, j := range jobs {
		if j.chain == (ChainRef{}) {
			continue
		}
		saved := maps.Clone(k.IPTables[j.fam])
		saved[j.chain.Table] = maps.Clone(saved[j.chain.Table])
		if saved[j.chain.Table] == nil {
			saved[j.chain.Table] = map[string][]string{}
		}
		saved[j.chain.Table][j.chain.Chain] = j.rules
		k.IPTables[j.fam], a.saved[j.fam] = saved, saved
	}
	for _, name := range []string{st.Interface, st.Uplink} {
		if l, err := rtnl().LinkByName(name); err == nil {
			k.Indexes[name] = l.Attrs().Index
		}
	}
	link, err := rtnl().LinkByName(st.Interface)
	if err != nil {
		return k, nil // PlanSync names the missing interface
	}
	k.Link.Exists, k.Link.Up = true, link.Attrs().Flags&net.FlagUp != 0
	addrs, err := rtnl().AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		return k, fmt.Errorf("list addresses of %q: %w", st.Interface, err)
	}
	for _, ad := range addrs {
		if p, ok := prefixOf(ad.IPNet); ok && !p.Addr().IsLinkLocalUnicast() {
			k.Link.Addresses = append(k.Link.Addresses, p)
			if permanent(ad) {
				k.Link.Permanent = append(k.Link.Permanent, p)
			}
		}
	}
	for _, fam := range []Family{IPv4, IPv6} {
		rules, err := listRules(fam, st.Table)
		if err != nil {
			return k, err
		}
		for _, r := range rules {
			src, _ := prefixOf(r.Src)
			k.Rules = append(k.Rules, KernelRule{
				Rule:  Rule{Family: fam, Priority: r.Priority, IIF: r.IifName, Src: src, Table: r.Table},
				Plain: plainRule(r),
				raw:   &r,
			})
		}
		routes, err := listRoutes(fam, st.Table)
		if err != nil {
			return k, err
		}
		for _, r := range routes {
			dst, ok := prefixOf(r.Dst)
			if !ok {
				dst = netip.PrefixFrom(zeroAddr(fam), 0)
			}
			gw, _ := netip.AddrFromSlice(r.Gw)
			k.Routes = append(k.Routes, KernelRoute{
				Family: fam, Dst: dst, Gateway: gw.Unmap(), LinkIndex: r.LinkIndex,
				OnLink: r.Flags&int(netlink.FLAG_ONLINK) != 0, MultiPath: len(r.MultiPath) > 0,
				Type: r.Type, Scope: int(r.Scope), Text: r.String(), raw: &r,
			})
		}
	}
	return k, nil
}

// plainRule reports whether a rule as read selects and acts by nothing but what ours have (iif,
// source, priority, table): a rule that also matches a destination, a mark, a protocol or ports, or that
// suppresses some of the table's routes (suppress_prefixlength 0 skips its default route),
// looks like ours in `ip rule` but does not steer what ours steer. vishvananda/netlink (v1.3.1)
// reads an attribute the kernel did not send as NewRule has it: -1 for the suppressors, goto
// and realms, nil for the mask and the port and uid ranges, 0 for the rest. It is pure.
func plainRule(r netlink.Rule) bool {
	return r.Dst == nil && r.OifName == "" && !r.Invert &&
		r.Mark == 0 && r.Mask == nil && r.Tos == 0 && r.TunID == 0 && r.IPProto == 0 &&
		r.Dport == nil && r.Sport == nil && r.UIDRange == nil &&
		r.SuppressPrefixlen < 0 && r.SuppressIfgroup < 0 && r.Goto < 0 && r.Flow < 0
}

// VerifyReads decides what verifying a plan reads back of the iptables tables: a family whose
// transaction changed a built-in chain, deleted a chain or wrote more than maxChains chains is
// read whole (whole); otherwise only the chains it wrote are listed (chains), which for one
// port changed among 1000 in buckets is one to three small chains instead of every rule.
// Families not written are not read. It is pure.
func VerifyReads(ops []Op, maxChains int) (whole map[Family]bool, chains map[Family][]ChainRef) {
	whole, chains = map[Family]bool{}, map[Family][]ChainRef{}
	for _, op := range ops {
		r, ok := op.(RestoreOp)
		if !ok {
			continue
		}
		chains[r.Family] = append(chains[r.Family], r.Chains...)
		if r.Whole || len(chains[r.Family]) > maxChains {
			whole[r.Family] = true
		}
	}
	for fam := range whole {
		delete(chains, fam)
	}
	return whole, chains
}

// chainReads is how many chains of a family the verification lists one by one rather than
// reading the whole family with one iptables-save: iptables-nft fetches only the listed
// chain's rules (2 ms of CPU against 10 ms for a save of 1000 rules; the listings run side by
// side), while iptables-legacy gets the whole table from the kernel for a listing too, so there
// one save of everything costs about what one listing does.
func (a *Applier) chainReads() int {
	if a.NFT() {
		return 4
	}
	return 1
}

// nftVerifyReads decides what verifying a plan reads back of the nftables tables: the families
// whose table was built or whose chains were rewritten, whole; of the others, only the sets
// whose elements changed (one set of 1000 ports for one port changed). It is pure.
func nftVerifyReads(ops []Op) (whole map[Family]bool, sets map[Family][]string) {
	whole, sets = map[Family]bool{}, map[Family][]string{}
	for _, op := range ops {
		if o, ok := op.(NFTablesOp); ok {
			maps.Copy(whole, o.Whole)
			for f, s := range o.Sets {
				sets[f] = append(sets[f], s...)
			}
		}
	}
	return whole, sets
}

// iptablesSave runs `<bin>-save` once and parses all its tables.
func iptablesSave(bin string) (Saved, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, bin+"-save")
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s-save: %w: %s", bin, err, firstLine(stderr.String()))
	}
	return ParseSave(string(out))
}

// iptablesList runs `<bin> -t <table> -S <chain>` once: the rules of one chain, read from the
// kernel without the rest of the table (iptables-nft fetches only that chain's rules).
func iptablesList(bin string, c ChainRef) ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, "-w", "5", "-t", c.Table, "-S", c.Chain)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s -t %s -S %s: %w: %s", bin, c.Table, c.Chain, err, firstLine(stderr.String()))
	}
	return ParseChain(c.Chain, string(out))
}

func listRoutes(fam Family, table int) ([]netlink.Route, error) {
	filter := &netlink.Route{Table: table}
	routes, err := rtnl().RouteListFiltered(netlinkFamily(fam), filter, netlink.RT_FILTER_TABLE)
	if errors.Is(err, netlink.ErrDumpInterrupted) {
		// The table changed while being dumped: read it again.
		routes, err = rtnl().RouteListFiltered(netlinkFamily(fam), filter, netlink.RT_FILTER_TABLE)
	}
	if err != nil {
		return nil, fmt.Errorf("list %s routes of table %d: %w", fam, table, err)
	}
	return routes, nil
}

func listRules(fam Family, table int) ([]netlink.Rule, error) {
	filter := &netlink.Rule{Table: table}
	rules, err := rtnl().RuleListFiltered(netlinkFamily(fam), filter, netlink.RT_FILTER_TABLE)
	if errors.Is(err, netlink.ErrDumpInterrupted) {
		rules, err = rtnl().RuleListFiltered(netlinkFamily(fam), filter, netlink.RT_FILTER_TABLE)
	}
	if err != nil {
		return nil, fmt.Errorf("list %s rules of table %d: %w", fam, table, err)
	}
	return rules, nil
}

func netlinkFamily(fam Family) int {
	if fam == IPv6 {
		return netlink.FAMILY_V6
	}
	return netlink.FAMILY_V4
}

// permanent says whether the kernel holds the address for ever: it marks such an address
// IFA_F_PERMANENT ("valid_lft forever" in ip addr), and its valid lifetime is all ones.
func permanent(ad netlink.Addr) bool {
	return ad.Flags&unix.IFA_F_PERMANENT != 0 || uint32(ad.ValidLft) == math.MaxUint32
}

func prefixOf(n *net.IPNet) (netip.Prefix, bool) {
	if n == nil {
		return netip.Prefix{}, false
	}
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), ones), true
}

func isDefault(n *net.IPNet) bool {
	if n == nil {
		return true
	}
	ones, _ := n.Mask.Size()
	return ones == 0
}
