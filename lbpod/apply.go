package lbpod

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-iptables/iptables"
	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Change is one difference between the desired state and the kernel, found (and, unless
// verifying, fixed) by Applier.Sync.
type Change struct {
	// Kind is what changed: "address", "link", "rule", "route", "chain", "jump", "iptables".
	Kind string
	// Added is true when something was (or must be) added, false when removed.
	Added bool
	// What describes the object, as ip or iptables would show it.
	What string
}

// String renders a change like "+route default via 172.18.0.1 dev net1".
func (c Change) String() string {
	sign := "-"
	if c.Added {
		sign = "+"
	}
	return sign + c.Kind + " " + c.What
}

// Applier brings the network namespace it runs in to a State, with netlink and iptables (or
// nf_tables netlink: Rules).
type Applier struct {
	// Rules is the back end of the packet rules; the zero value is RulesIPTables.
	Rules RulesBackend
	// nft is the nf_tables netlink connection of the nftables back end.
	nft *nftables.Conn
	// nftSaved is, per family, our nftables table as last read or verified: like saved.
	nftSaved map[Family]NFTKernel
	// IPTables holds the iptables handle of each family the state may use.
	IPTables map[Family]*iptables.IPTables
	// Paths names the iptables binaries; their -save and -restore siblings apply the chains.
	Paths IPTablesPaths
	Log   *slog.Logger
	// saved is, per family, what iptables-save printed at the last read: planning a Service
	// change against it saves one iptables-save per family (the cost that grows with the
	// rules). A resync always reads afresh, and a refused transaction starts over from a read.
	saved map[Family]Saved
}

// NewApplier builds an Applier using the iptables binaries at the given paths.
func NewApplier(paths IPTablesPaths, log *slog.Logger) (*Applier, error) {
	a := &Applier{IPTables: map[Family]*iptables.IPTables{}, Paths: paths, Log: log}
	for fam, p := range map[Family]string{IPv4: paths.IPv4, IPv6: paths.IPv6} {
		proto := iptables.ProtocolIPv4
		if fam == IPv6 {
			proto = iptables.ProtocolIPv6
		}
		ipt, err := iptables.New(iptables.IPFamily(proto), iptables.Path(p), iptables.Timeout(5))
		if err != nil {
			return nil, fmt.Errorf("iptables %q for %s: %w", p, fam, err)
		}
		a.IPTables[fam] = ipt
	}
	return a, nil
}

// Observe reads eth0's gateway of each family from the main table's default route.
func (a *Applier) Observe(names Names) (Observed, error) {
	names = names.withDefaults()
	obs := Observed{UplinkGateways: map[Family]Gateway{}}
	uplink, err := netlink.LinkByName(names.Uplink)
	if err != nil {
		return obs, fmt.Errorf("uplink interface %q: %w", names.Uplink, err)
	}
	for _, fam := range []Family{IPv4, IPv6} {
		routes, err := listRoutes(fam, unix.RT_TABLE_MAIN)
		if err != nil {
			return obs, err
		}
		for _, r := range routes {
			if !isDefault(r.Dst) {
				continue
			}
			if r.LinkIndex == uplink.Attrs().Index {
				gw, _ := netip.AddrFromSlice(r.Gw)
				obs.UplinkGateways[fam] = Gateway{Addr: gw.Unmap(), OnLink: r.Flags&int(netlink.FLAG_ONLINK) != 0}
				break
			}
			// A multipath default route: take its first hop through the uplink.
			if i := slices.IndexFunc(r.MultiPath, func(h *netlink.NexthopInfo) bool { return h.LinkIndex == uplink.Attrs().Index }); i >= 0 {
				gw, _ := netip.AddrFromSlice(r.MultiPath[i].Gw)
				obs.UplinkGateways[fam] = Gateway{Addr: gw.Unmap(), OnLink: r.MultiPath[i].Flags&int(netlink.FLAG_ONLINK) != 0}
				break
			}
		}
	}
	return obs, nil
}

// Applied is what Apply did and how long each step took.
type Applied struct {
	// Changes are the differences found and fixed.
	Changes []Change
	// Read, Execute and Verify are the time spent reading the kernel and planning, running the
	// operations, and reading back what changed.
	Read, Execute, Verify time.Duration
	// Saves counts the iptables-save runs, Lists the single-chain listings (iptables -S); with
	// the nftables back end, the whole-table reads and the single-set reads.
	Saves, Lists int
}

// Apply brings the kernel to st and verifies it: it plans against what it reads (with cached
// iptables tables unless fresh), executes the plan, then reads back the families whose tables
// it wrote (and the links, rules and routes) and plans again, which must find nothing. A
// transaction the kernel refuses while planning from the cache is retried once from a fresh
// read, since someone else may have changed the tables. One goroutine at a time: the loop's.
func (a *Applier) Apply(st State, fresh bool) (Applied, error) {
	var res Applied
	st = st.ForRules(a.backend())
	start := time.Now()
	k, err := a.read(st, fresh, nil, nil, &res)
	if err != nil {
		return res, err
	}
	plan, err := PlanSync(k, st)
	res.Read = time.Since(start)
	if err != nil {
		return res, err
	}
	res.Changes = plan.Changes
	start = time.Now()
	forgetting, err := a.run(plan.Ops)
	// The conntrack walk (best effort, after the rules it serves are in) runs on beside the
	// verification; Apply returns only once it is done.
	defer forgetting()
	res.Execute = time.Since(start)
	var refused *RestoreError
	var nftRefused *NFTablesError
	if err != nil && !fresh && (errors.As(err, &refused) || errors.As(err, &nftRefused)) {
		a.Log.Info("a transaction planned from the cached tables was refused; reading them again", "err", err)
		again, err := a.Apply(st, true)
		again.Changes = append(res.Changes, again.Changes...)
		return again, err
	}
	if err != nil {
		a.forget()
		return res, err
	}
	start = time.Now()
	whole, chains := VerifyReads(plan.Ops, a.chainReads())
	nftWhole, nftSets := nftVerifyReads(plan.Ops)
	maps.Copy(whole, nftWhole)
	k, err = a.read(st, false, whole, chains, &res, nftSets)
	if err == nil {
		var check Plan
		if check, err = PlanSync(k, st); err == nil && len(check.Changes) > 0 {
			var what []string
			for _, c := range check.Changes {
				what = append(what, c.String())
			}
			a.forget()
			err = fmt.Errorf("state not converged after applying, still differs: %s", strings.Join(what, "; "))
		}
	}
	res.Verify = time.Since(start)
	if err != nil {
		return res, fmt.Errorf("verify: %w", err)
	}
	return res, nil
}

// NFT reports whether the rules live in nf_tables (the nftables back end, or the iptables
// binaries of the nft flavour), whose changes the kernel announces (legacy and plain iptables:
// not known, so false).
func (a *Applier) NFT() bool {
	return a.backend() == RulesNFTables || strings.HasSuffix(a.Paths.IPv4, "-nft") && strings.HasSuffix(a.Paths.IPv6, "-nft")
}

func (a *Applier) backend() RulesBackend {
	if a.Rules == "" {
		return RulesIPTables
	}
	return a.Rules
}

// forget drops the cached tables: the next Apply reads them.
func (a *Applier) forget() { a.saved, a.nftSaved = nil, nil }

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

// Read reads what PlanSync compares: net1 and its addresses, the interfaces' indexes, the rules
// and routes of our table, and each family's iptables tables (one iptables-save per family).
func (a *Applier) Read(st State) (Kernel, error) {
	return a.read(st.ForRules(a.backend()), true, nil, nil, &Applied{})
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

// read reads the kernel. The iptables tables of a family come from the cache unless fresh, or
// the family is in reread, or nothing is cached for it; the chains listed in relist are read
// from the kernel into the cached tables. The iptables binaries run in parallel: each exec
// waits mostly on its own start-up. res counts the runs.
//
// The nftables tables likewise come from their cache unless fresh or reread; nftSets (one map at
// most) names, per family, the sets whose elements are read back into the cached table.
func (a *Applier) read(st State, fresh bool, reread map[Family]bool, relist map[Family][]ChainRef, res *Applied, nftSets ...map[Family][]string) (Kernel, error) {
	k := Kernel{Link: Link{Name: st.Interface}, Indexes: map[string]int{}, IPTables: map[Family]Saved{}, NFTables: map[Family]NFTKernel{}}
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
		if l, err := netlink.LinkByName(name); err == nil {
			k.Indexes[name] = l.Attrs().Index
		}
	}
	link, err := netlink.LinkByName(st.Interface)
	if err != nil {
		return k, nil // PlanSync names the missing interface
	}
	k.Link.Exists, k.Link.Up = true, link.Attrs().Flags&net.FlagUp != 0
	addrs, err := netlink.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		return k, fmt.Errorf("list addresses of %q: %w", st.Interface, err)
	}
	for _, ad := range addrs {
		if p, ok := prefixOf(ad.IPNet); ok && !p.Addr().IsLinkLocalUnicast() {
			k.Link.Addresses = append(k.Link.Addresses, p)
		}
	}
	for _, fam := range []Family{IPv4, IPv6} {
		rules, err := listRules(fam, st.Table)
		if err != nil {
			return k, err
		}
		for _, r := range rules {
			k.Rules = append(k.Rules, KernelRule{
				Rule:  Rule{Family: fam, Priority: r.Priority, IIF: r.IifName, Table: r.Table},
				Plain: r.Src == nil && r.Dst == nil && r.OifName == "" && r.Mark == 0 && !r.Invert,
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
				Text: r.String(), raw: &r,
			})
		}
	}
	return k, nil
}

// Execute runs the operations in order and stops at the first that fails. It decides nothing:
// PlanSync did. Consecutive restores of different families run side by side: they touch
// separate tables, and each costs mostly its binary's start-up and parsing.
func (a *Applier) Execute(ops []Op) error {
	forgetting, err := a.run(ops)
	forgetting()
	return err
}

// run is Execute, except that the conntrack deletions (ForgetFlowsOp: best effort, and a walk
// of the whole conntrack table that takes ~10 ms on a busy host) run in the background from
// where the plan puts them; forgetting waits for them.
func (a *Applier) run(ops []Op) (forgetting func(), err error) {
	var bg sync.WaitGroup
	forgetting = bg.Wait
	for i := 0; i < len(ops); {
		if o, ok := ops[i].(ForgetFlowsOp); ok {
			bg.Go(func() { a.execute(o) })
			i++
			continue
		}
		n := parallelRestores(ops[i:])
		if n < 2 {
			if err := a.execute(ops[i]); err != nil {
				return forgetting, err
			}
			i++
			continue
		}
		errs := make([]error, n)
		var wg sync.WaitGroup
		for j, op := range ops[i : i+n] {
			wg.Go(func() { errs[j] = a.execute(op) })
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				return forgetting, err
			}
		}
		i += n
	}
	return forgetting, nil
}

// parallelRestores is how many operations at the start of ops are restores of distinct
// families, which may run at the same time. It is pure.
func parallelRestores(ops []Op) int {
	seen := map[Family]bool{}
	for n, op := range ops {
		r, ok := op.(RestoreOp)
		if !ok || seen[r.Family] {
			return n
		}
		seen[r.Family] = true
	}
	return len(ops)
}

func (a *Applier) execute(op Op) error {
	switch o := op.(type) {
	case RestoreOp:
		bin, err := a.binary(o.Family)
		if err != nil {
			return err
		}
		if err := iptablesRestore(bin, o.Payload); err != nil {
			return &RestoreError{Family: o.Family, Table: o.Table, Err: fmt.Errorf("%s -t %s: %w", bin, o.Table, err)}
		}
	case NFTablesOp:
		if err := executeNFT(a.nft, o.Steps); err != nil {
			var refused *NFTablesError
			if !errors.As(err, &refused) && a.nft != nil {
				// The batch could not be built: drop what was queued with a new connection.
				_ = a.nft.CloseLasting()
				if conn, cerr := nftables.New(nftables.AsLasting()); cerr == nil {
					a.nft = conn
				}
			}
			return err
		}
	case ForgetFlowsOp:
		// Best effort: a failure leaves entries that time out on their own.
		if n, err := forgetFlows(o); err != nil {
			a.Log.Warn("could not delete stale conntrack entries", "family", o.Family, "keep", o.Flows.String(), "err", err)
		} else if n > 0 {
			a.Log.Info("deleted stale conntrack entries", "family", o.Family, "keep", o.Flows.String(), "entries", n)
		}
	case LinkUpOp:
		link, err := netlink.LinkByName(o.Name)
		if err == nil {
			err = netlink.LinkSetUp(link)
		}
		if err != nil {
			return fmt.Errorf("set %q up: %w", o.Name, err)
		}
	case AddressOp:
		return addressOp(o)
	case RuleOp:
		return ruleOp(o)
	case RouteOp:
		return routeOp(o)
	default:
		return fmt.Errorf("unknown operation %T", op)
	}
	return nil
}

func addressOp(o AddressOp) error {
	link, err := netlink.LinkByName(o.Name)
	if err != nil {
		return fmt.Errorf("interface %q: %w", o.Name, err)
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: o.Prefix.Addr().AsSlice(), Mask: net.CIDRMask(o.Prefix.Bits(), o.Prefix.Addr().BitLen())}}
	if !o.Add {
		if err := netlink.AddrDel(link, addr); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
			return fmt.Errorf("remove stale address %s from %q: %w", o.Prefix, o.Name, err)
		}
		return nil
	}
	if familyOf(o.Prefix.Addr()) == IPv6 {
		// Usable at once: duplicate address detection would hold it "tentative" for about a
		// second, and the operator's IPAM already guarantees it is unique.
		addr.Flags = unix.IFA_F_NODAD
	}
	if err := netlink.AddrAdd(link, addr); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("add address %s to %q: %w", o.Prefix, o.Name, err)
	}
	return nil
}

func ruleOp(o RuleOp) error {
	if !o.Add {
		r, ok := o.Old.raw.(*netlink.Rule)
		if !ok {
			return fmt.Errorf("%s: not read from the kernel", o)
		}
		if err := netlink.RuleDel(r); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("remove stale rule (%s): %w", o, err)
		}
		return nil
	}
	nr := netlink.NewRule()
	nr.Family = netlinkFamily(o.Rule.Family)
	nr.Priority = o.Rule.Priority
	nr.IifName = o.Rule.IIF
	nr.Table = o.Rule.Table
	if err := netlink.RuleAdd(nr); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("%s: %w", o, err)
	}
	return nil
}

func routeOp(o RouteOp) error {
	if !o.Add {
		r, ok := o.Old.raw.(*netlink.Route)
		if !ok {
			return fmt.Errorf("%s: not read from the kernel", o)
		}
		if err := netlink.RouteDel(r); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("remove stale route (%s): %w", o, err)
		}
		return nil
	}
	r := o.Route
	nr := &netlink.Route{
		Family:    netlinkFamily(r.Family),
		Table:     o.Table,
		LinkIndex: o.LinkIndex,
		Dst:       &net.IPNet{IP: r.Dst.Addr().AsSlice(), Mask: net.CIDRMask(r.Dst.Bits(), r.Dst.Addr().BitLen())},
	}
	if r.Gateway.IsValid() {
		nr.Gw = r.Gateway.AsSlice()
	} else {
		nr.Scope = netlink.SCOPE_LINK
	}
	if r.OnLink {
		nr.Flags = int(netlink.FLAG_ONLINK)
	}
	if err := netlink.RouteReplace(nr); err != nil {
		return fmt.Errorf("%s: %w", o, err)
	}
	return nil
}

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

// RestoreError is an iptables-restore transaction the kernel refused (nothing of it applied).
type RestoreError struct {
	Family Family
	Table  string
	Err    error
}

func (e *RestoreError) Error() string { return e.Err.Error() }

// Unwrap returns the underlying error.
func (e *RestoreError) Unwrap() error { return e.Err }

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

// firstLine keeps an error message to one bounded line.
func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return s
}

// forgetFlows deletes the conntrack entries the flow policy calls stale.
func forgetFlows(o ForgetFlowsOp) (uint, error) {
	family := netlink.InetFamily(unix.AF_INET)
	if o.Family == IPv6 {
		family = netlink.InetFamily(unix.AF_INET6)
	}
	return netlink.ConntrackDeleteFilters(netlink.ConntrackTable, family, staleFilter{o.Flows})
}

// staleFilter matches the conntrack entries FlowPolicy.Stale calls stale.
type staleFilter struct{ policy FlowPolicy }

func (f staleFilter) MatchConntrackFlow(c *netlink.ConntrackFlow) bool {
	proto := map[uint8]Protocol{unix.IPPROTO_UDP: UDP, unix.IPPROTO_SCTP: SCTP, unix.IPPROTO_TCP: TCP}[c.Forward.Protocol]
	src, _ := netip.AddrFromSlice(c.Forward.SrcIP)
	dst, _ := netip.AddrFromSlice(c.Forward.DstIP)
	replySrc, _ := netip.AddrFromSlice(c.Reverse.SrcIP)
	return f.policy.Stale(Flow{
		Protocol: proto,
		Src:      src.Unmap(),
		Dst:      netip.AddrPortFrom(dst.Unmap(), c.Forward.DstPort),
		ReplySrc: netip.AddrPortFrom(replySrc.Unmap(), c.Reverse.SrcPort),
	})
}

func listRoutes(fam Family, table int) ([]netlink.Route, error) {
	filter := &netlink.Route{Table: table}
	routes, err := netlink.RouteListFiltered(netlinkFamily(fam), filter, netlink.RT_FILTER_TABLE)
	if errors.Is(err, netlink.ErrDumpInterrupted) {
		// The table changed while being dumped: read it again.
		routes, err = netlink.RouteListFiltered(netlinkFamily(fam), filter, netlink.RT_FILTER_TABLE)
	}
	if err != nil {
		return nil, fmt.Errorf("list %s routes of table %d: %w", fam, table, err)
	}
	return routes, nil
}

func listRules(fam Family, table int) ([]netlink.Rule, error) {
	filter := &netlink.Rule{Table: table}
	rules, err := netlink.RuleListFiltered(netlinkFamily(fam), filter, netlink.RT_FILTER_TABLE)
	if errors.Is(err, netlink.ErrDumpInterrupted) {
		rules, err = netlink.RuleListFiltered(netlinkFamily(fam), filter, netlink.RT_FILTER_TABLE)
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
