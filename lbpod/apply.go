package lbpod

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
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
// verifying, fixed) by Applier.Apply.
type Change struct {
	// Kind is what changed: "address", "lifetime" (an address held for ever given the state's
	// lifetime), "link", "rule", "route", "chain", "jump", "iptables".
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
	// flowsPending is Kernel.FlowsPending: a family is marked before the rules of a plan that
	// forgets its flows run, and cleared once that forget ran. A run that fails after some of
	// the rules went in (the nat table committed and the filter table refused, one family in
	// and the other refused) returns before the forget, and a fresh read then finds those
	// rules as wanted: the mark is all that still asks for the forget. Under pendingMu: the
	// forgets clear it in the background.
	pendingMu    sync.Mutex
	flowsPending map[Family]bool
	// removeOthers is set by RemoveOtherRulesOnceApplied until the removal succeeded.
	removeOthers bool
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
	uplink, err := rtnl().LinkByName(names.Uplink)
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
// read, since someone else may have changed the tables. Once it has succeeded, it removes the
// other back end's leftovers if asked to (RemoveOtherRulesOnceApplied). One goroutine at a
// time: the loop's.
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
	return res, a.removeOthersIfAsked()
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
// where the plan puts them; forgetting waits for them. Their families are marked pending
// (flowsPending) before anything runs, so that a run that stops before them leaves the mark.
func (a *Applier) run(ops []Op) (forgetting func(), err error) {
	var bg sync.WaitGroup
	forgetting = bg.Wait
	for _, op := range ops {
		if o, ok := op.(ForgetFlowsOp); ok {
			a.markFlows(o.Family, true)
		}
	}
	for i := 0; i < len(ops); {
		if o, ok := ops[i].(ForgetFlowsOp); ok {
			bg.Go(func() {
				a.execute(o)
				// Ran, even if it failed: best effort, as it always was (an entry left times out).
				a.markFlows(o.Family, false)
			})
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

// markFlows sets or clears a family's flowsPending mark.
func (a *Applier) markFlows(fam Family, pending bool) {
	a.pendingMu.Lock()
	defer a.pendingMu.Unlock()
	if a.flowsPending == nil {
		a.flowsPending = map[Family]bool{}
	}
	if pending {
		a.flowsPending[fam] = true
	} else {
		delete(a.flowsPending, fam)
	}
}

// pendingFlows is a copy of the flowsPending marks, for a plan.
func (a *Applier) pendingFlows() map[Family]bool {
	a.pendingMu.Lock()
	defer a.pendingMu.Unlock()
	return maps.Clone(a.flowsPending)
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
		link, err := rtnl().LinkByName(o.Name)
		if err == nil {
			err = rtnl().LinkSetUp(link)
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
