package lbpod

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Kernel is what the Applier read from the lb pod's network namespace, and the one thing it
// remembers of it (FlowsPending): the other input of Plan, beside the wanted State. It holds
// plain data only, so that Plan is tested without root.
type Kernel struct {
	// Link is the underlay interface (net1).
	Link Link
	// Indexes maps each interface the routes use (net1, eth0) to its index; a missing interface
	// is absent.
	Indexes map[string]int
	// Rules are the policy rules that point at our table, both families.
	Rules []KernelRule
	// Routes are the routes of our table, both families.
	Routes []KernelRoute
	// IPTables holds, per family the state uses, what `iptables-save` printed.
	IPTables map[Family]Saved
	// NFTables holds, per family the state's NFTables use, our table as read.
	NFTables map[Family]NFTKernel
	// FlowsPending marks the families whose stale conntrack entries an earlier run may have left
	// (its rules went in, at least in part, and it failed before forgetting them): the tables
	// read now look as wanted, so only this says the entries are still to be forgotten.
	FlowsPending map[Family]bool
}

// Link is the underlay interface as read.
type Link struct {
	Name   string
	Exists bool
	Up     bool
	// Addresses are its global addresses with their prefix length (link-local ones belong to the
	// kernel and are not listed).
	Addresses []netip.Prefix
	// Permanent are those of Addresses the kernel holds for ever (no lifetime).
	Permanent []netip.Prefix
}

// KernelRule is a policy rule as read, its source in Rule. Plain is false when it has a selector
// or an option we never write (a destination, a mark, an oif, "not", a protocol, ports,
// suppress_prefixlength...): such a rule is never ours.
type KernelRule struct {
	Rule
	Plain bool
	// raw is the kernel's own object, deleted as read (nil in tests).
	raw any
}

// KernelRoute is a route of our table as read. An invalid Gateway is a device route.
type KernelRoute struct {
	Family    Family
	Dst       netip.Prefix
	Gateway   netip.Addr
	LinkIndex int
	OnLink    bool
	// MultiPath is set for a route with several next hops, which we never write.
	MultiPath bool
	// Type and Scope are the kernel's (unix.RTN_*, unix.RT_SCOPE_*): a local, blackhole or
	// unreachable route, or one of another scope, is not ours even with our destination and
	// device.
	Type  int
	Scope int
	// Text is how the route is named in logs.
	Text string
	raw  any
}

// Op is one kernel operation: the Applier executes the list Plan returns, in order, and decides
// nothing itself. String renders it like the command that would do the same.
type Op interface {
	String() string
}

// RestoreOp feeds the payload of one family's changed tables to one `iptables-restore
// --noflush` run; each table is one transaction (its own COMMIT).
type RestoreOp struct {
	Family Family
	// Table names the tables written, comma-separated ("nat,filter").
	Table   string
	Payload string
	// Chains are the chains of ours the payload writes; unless Whole, they are all it changes,
	// so verifying reads back only them.
	Chains []ChainRef
	// Whole is set when the payload also changes a built-in chain or deletes a chain.
	Whole bool
}

// ForgetFlowsOp deletes the UDP and SCTP conntrack entries to the LB address that the new rules
// would not translate the same way: a port that is gone, a source no longer allowed, a target
// that changed, or an entry created before the DNAT rule existed (untranslated). A client that
// keeps sending from one source port would otherwise stay on its old entry until it times out.
type ForgetFlowsOp struct {
	Family Family
	Flows  FlowPolicy
}

// LinkUpOp sets the underlay interface up.
type LinkUpOp struct{ Name string }

// AddressOp adds (Add) or removes an address of the underlay interface. With a Lifetime the add
// replaces the address if it is there, so that it ends up on that lifetime either way.
type AddressOp struct {
	Add      bool
	Name     string
	Prefix   netip.Prefix
	Lifetime time.Duration
}

// lifetimeSeconds is a lifetime in the kernel's unit, whole seconds, rounded up.
func lifetimeSeconds(d time.Duration) int { return int((d + time.Second - 1) / time.Second) }

// RuleOp adds the rule (Add) or deletes the one read (Old).
type RuleOp struct {
	Add  bool
	Rule Rule
	Old  KernelRule
}

// RouteOp adds (replaces) the route (Add, with the index of its device) or deletes the one read.
type RouteOp struct {
	Add       bool
	Table     int
	Route     Route
	LinkIndex int
	Old       KernelRoute
}

func (o RestoreOp) String() string {
	return fmt.Sprintf("%s-restore --noflush <<%q", iptablesCmd(o.Family), o.Payload)
}

func (o ForgetFlowsOp) String() string {
	return fmt.Sprintf("conntrack -D (%s) to %s: keep %s", o.Family, o.Flows.LB, o.Flows)
}

func (o LinkUpOp) String() string { return "ip link set " + o.Name + " up" }

func (o AddressOp) String() string {
	if o.Add && o.Lifetime > 0 {
		secs := lifetimeSeconds(o.Lifetime)
		return fmt.Sprintf("ip addr replace %s dev %s valid_lft %d preferred_lft %d", o.Prefix, o.Name, secs, secs)
	}
	return fmt.Sprintf("ip addr %s %s dev %s", addOrDel(o.Add), o.Prefix, o.Name)
}

func (o RuleOp) String() string {
	r := o.Rule
	if !o.Add {
		r = o.Old.Rule
	}
	return fmt.Sprintf("ip %srule %s pref %d %s lookup %d", familyFlag(r.Family), addOrDel(o.Add), r.Priority, r.args(), r.Table)
}

func (o RouteOp) String() string {
	if !o.Add {
		return fmt.Sprintf("ip %sroute del table %d %s", familyFlag(o.Old.Family), o.Table, o.Old.Text)
	}
	return fmt.Sprintf("ip %sroute replace table %d %s", familyFlag(o.Route.Family), o.Table, routeText(o.Route))
}

func addOrDel(add bool) string {
	if add {
		return "add"
	}
	return "del"
}

func familyFlag(f Family) string {
	if f == IPv6 {
		return "-6 "
	}
	return ""
}

func iptablesCmd(f Family) string {
	if f == IPv6 {
		return "ip6tables"
	}
	return "iptables"
}

// routeText renders one route as `ip route` does.
func routeText(r Route) string {
	return strings.TrimSpace(RenderRoutes(State{Routes: []Route{r}}, r.Family))
}

// Plan is what it takes to bring the kernel to a state: the operations in the order they must
// run, and the differences they fix (for the log, and for verifying: a plan without changes
// means the kernel holds the state).
type Plan struct {
	Ops     []Op
	Changes []Change
}

// PlanSync compares what was read with the wanted state and returns the operations that close
// the gap. It is pure. The iptables rules come first, so that the LB address never sits on
// net1 without its filtering and DNAT (a UDP packet in that gap would make a conntrack entry
// without NAT that a steady sender keeps alive); then the link, its addresses, the rules and
// the routes. Stale objects are removed, missing ones added, nothing else is touched.
func PlanSync(k Kernel, st State) (Plan, error) {
	var p Plan
	var forget []Op
	for _, t := range st.IPTables {
		saved, ok := k.IPTables[t.Family]
		if !ok {
			return p, fmt.Errorf("no %s rules were read", iptablesCmd(t.Family))
		}
		rp := PlanRestore(saved, t, iptablesCmd(t.Family))
		p.Changes = append(p.Changes, rp.Changes...)
		if len(rp.Tables) > 0 {
			// One iptables-restore run for all the family's tables: each table still commits as
			// its own transaction, and one exec less is a few milliseconds less.
			var payload strings.Builder
			for _, table := range rp.Tables {
				payload.WriteString(rp.Payloads[table])
			}
			p.Ops = append(p.Ops, RestoreOp{Family: t.Family, Table: strings.Join(rp.Tables, ","), Payload: payload.String(), Chains: rp.Written, Whole: rp.Whole})
		}
		if rp.FlowsChanged || k.FlowsPending[t.Family] {
			if fp, ok := flowPolicyOf(t); ok {
				forget = append(forget, ForgetFlowsOp{Family: t.Family, Flows: fp})
			}
		}
	}
	// Every family's nftables changes go in one batch: one transaction for the whole sync.
	nft := NFTablesOp{Whole: map[Family]bool{}, Sets: map[Family][]string{}}
	for _, t := range st.NFTables {
		have, ok := k.NFTables[t.Family]
		if !ok {
			return p, fmt.Errorf("no %s nftables table was read", t.Family)
		}
		np := PlanNFT(have, t)
		p.Changes = append(p.Changes, np.Changes...)
		nft.Steps = append(nft.Steps, np.Steps...)
		if np.Whole {
			nft.Whole[t.Family] = true
		} else if len(np.ChangedSets) > 0 {
			nft.Sets[t.Family] = np.ChangedSets
		}
		if np.FlowsChanged || k.FlowsPending[t.Family] {
			if fp, ok := flowPolicyOf(Tables{Flows: t.Flows}); ok {
				forget = append(forget, ForgetFlowsOp{Family: t.Family, Flows: fp})
			}
		}
	}
	if len(nft.Steps) > 0 {
		p.Ops = append(p.Ops, nft)
	}
	// Each family's flows are forgotten after all the restores: the restores then follow one
	// another, and the Applier runs them side by side (one per family, independent).
	p.Ops = append(p.Ops, forget...)
	if !k.Link.Exists {
		return p, fmt.Errorf("interface %q not found (is the NetworkAttachmentDefinition attached?)", st.Interface)
	}
	planLink(&p, k.Link, st)
	planRules(&p, k.Rules, st)
	if err := planRoutes(&p, k, st); err != nil {
		return p, err
	}
	return p, nil
}

func planLink(p *Plan, l Link, st State) {
	if !l.Up {
		p.Ops = append(p.Ops, LinkUpOp{Name: st.Interface})
		p.Changes = append(p.Changes, Change{Kind: "link", Added: true, What: st.Interface + " up"})
	}
	for _, a := range l.Addresses {
		lapsing := slices.Contains(st.Lapsing, a) && !slices.Contains(l.Permanent, a)
		if !slices.Contains(st.Addresses, a) && !lapsing {
			p.Ops = append(p.Ops, AddressOp{Name: st.Interface, Prefix: a})
			p.Changes = append(p.Changes, Change{Kind: "address", What: a.String() + " dev " + st.Interface})
		}
	}
	// A missing address is added on the state's lifetime, whoever removed it (a lapsed lifetime,
	// a hand, net1 recreated); one held for ever while the state wants a lifetime (added by hand,
	// or by a lb pod without one) is given it. A finite lifetime is never renewed here: that is
	// the election's (its Leaser), and a loop that renewed it would keep the fence from lapsing
	// when the election stopped.
	for _, a := range st.Addresses {
		switch {
		case !slices.Contains(l.Addresses, a):
			p.Ops = append(p.Ops, AddressOp{Add: true, Name: st.Interface, Prefix: a, Lifetime: st.AddressLifetime})
			p.Changes = append(p.Changes, Change{Kind: "address", Added: true, What: a.String() + " dev " + st.Interface})
		case st.AddressLifetime > 0 && slices.Contains(l.Permanent, a):
			p.Ops = append(p.Ops, AddressOp{Add: true, Name: st.Interface, Prefix: a, Lifetime: st.AddressLifetime})
			p.Changes = append(p.Changes, Change{Kind: "lifetime", Added: true,
				What: fmt.Sprintf("%s dev %s valid_lft %ds (was forever)", a, st.Interface, lifetimeSeconds(st.AddressLifetime))})
		}
	}
}

func planRules(p *Plan, have []KernelRule, st State) {
	for _, fam := range []Family{IPv4, IPv6} {
		found := map[Rule]bool{}
		for _, r := range have {
			if r.Family != fam {
				continue
			}
			if r.Plain && slices.Contains(st.Rules, r.Rule) && !found[r.Rule] {
				found[r.Rule] = true
				continue
			}
			p.Ops = append(p.Ops, RuleOp{Old: r})
			p.Changes = append(p.Changes, Change{Kind: "rule", What: fmt.Sprintf("%s %d: %s lookup %d", fam, r.Priority, r.selector(), r.Table)})
		}
		for _, r := range st.Rules {
			if r.Family != fam || found[r] {
				continue
			}
			found[r] = true
			p.Ops = append(p.Ops, RuleOp{Add: true, Rule: r})
			p.Changes = append(p.Changes, Change{Kind: "rule", Added: true, What: fmt.Sprintf("%s %d: %s lookup %d", fam, r.Priority, r.selector(), r.Table)})
		}
	}
}

// routeKey is what makes two routes the same for us.
type routeKey struct {
	dst    netip.Prefix
	gw     netip.Addr
	link   int
	onLink bool
	typ    int
	scope  int
}

// wantKey is the key of a route we write, as the kernel reads it back: unicast, scope link for
// an IPv4 device route and universe otherwise (the kernel gives every IPv6 route that scope).
func wantKey(r Route, link int) routeKey {
	scope := unix.RT_SCOPE_UNIVERSE
	if r.Family == IPv4 && !r.Gateway.IsValid() {
		scope = unix.RT_SCOPE_LINK
	}
	return routeKey{dst: r.Dst, gw: r.Gateway, link: link, onLink: r.OnLink, typ: unix.RTN_UNICAST, scope: scope}
}

func planRoutes(p *Plan, k Kernel, st State) error {
	for _, dev := range []string{st.Interface, st.Uplink} {
		if _, ok := k.Indexes[dev]; !ok {
			return fmt.Errorf("interface %q not found", dev)
		}
	}
	for _, fam := range []Family{IPv4, IPv6} {
		want := map[routeKey]bool{}
		for _, r := range st.Routes {
			if r.Family == fam {
				want[wantKey(r, k.Indexes[r.Dev])] = true
			}
		}
		found := map[routeKey]bool{}
		for _, r := range k.Routes {
			if r.Family != fam {
				continue
			}
			key := routeKey{dst: r.Dst, gw: r.Gateway, link: r.LinkIndex, onLink: r.OnLink, typ: r.Type, scope: r.Scope}
			if want[key] && !found[key] && !r.MultiPath {
				found[key] = true
				continue
			}
			p.Ops = append(p.Ops, RouteOp{Table: st.Table, Old: r})
			p.Changes = append(p.Changes, Change{Kind: "route", What: fmt.Sprintf("table %d %s", st.Table, r.Text)})
		}
		// Device routes first: a standby's net1 has no address, and the kernel accepts a
		// gateway only once a route of the table reaches it. Otherwise in the order Desired
		// lists them, so that the log reads the same every time.
		adds := slices.Clone(st.Routes)
		slices.SortStableFunc(adds, func(a, b Route) int { return boolInt(a.Gateway.IsValid()) - boolInt(b.Gateway.IsValid()) })
		for _, r := range adds {
			key := wantKey(r, k.Indexes[r.Dev])
			if r.Family != fam || found[key] {
				continue
			}
			found[key] = true
			p.Ops = append(p.Ops, RouteOp{Add: true, Table: st.Table, Route: r, LinkIndex: key.link})
			p.Changes = append(p.Changes, Change{Kind: "route", Added: true, What: fmt.Sprintf("table %d %s", st.Table, routeText(r))})
		}
	}
	return nil
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
