package lbpod

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/coreos/go-iptables/iptables"
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

// Applier brings the network namespace it runs in to a State, with netlink and iptables.
type Applier struct {
	// IPTables holds the iptables handle of each family the state may use.
	IPTables map[Family]*iptables.IPTables
	// Paths names the iptables binaries; their -save and -restore siblings apply the chains.
	Paths IPTablesPaths
	Log   *slog.Logger
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

// Sync compares the kernel with st and, unless dryRun, changes what differs: it adds what is
// missing and removes what is stale, and never touches a rule outside its own chains but the one
// jump per built-in chain. It returns the differences found.
func (a *Applier) Sync(st State, dryRun bool) ([]Change, error) {
	var changes []Change
	// The rules go first, so that the LB address never sits on net1 without its filtering.
	steps := []func(State, bool) ([]Change, error){a.syncIPTables, a.syncLink, a.syncRules, a.syncRoutes}
	for _, step := range steps {
		c, err := step(st, dryRun)
		changes = append(changes, c...)
		if err != nil {
			return changes, err
		}
	}
	return changes, nil
}

// syncLink brings net1 up with exactly the desired global addresses.
func (a *Applier) syncLink(st State, dryRun bool) ([]Change, error) {
	var changes []Change
	link, err := netlink.LinkByName(st.Interface)
	if err != nil {
		return nil, fmt.Errorf("interface %q not found (is the NetworkAttachmentDefinition attached?): %w", st.Interface, err)
	}
	if link.Attrs().Flags&net.FlagUp == 0 {
		changes = append(changes, Change{Kind: "link", Added: true, What: st.Interface + " up"})
		if !dryRun {
			if err := netlink.LinkSetUp(link); err != nil {
				return changes, fmt.Errorf("set %q up: %w", st.Interface, err)
			}
		}
	}
	existing, err := netlink.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		return changes, fmt.Errorf("list addresses of %q: %w", st.Interface, err)
	}
	have := map[netip.Prefix]bool{}
	for _, ad := range existing {
		p, ok := prefixOf(ad.IPNet)
		if !ok || p.Addr().IsLinkLocalUnicast() {
			continue // link-local addresses belong to the kernel
		}
		have[p] = true
		if slices.Contains(st.Addresses, p) {
			continue
		}
		changes = append(changes, Change{Kind: "address", What: p.String() + " dev " + st.Interface})
		if !dryRun {
			if err := netlink.AddrDel(link, &ad); err != nil {
				return changes, fmt.Errorf("remove stale address %s from %q: %w", p, st.Interface, err)
			}
		}
	}
	for _, p := range st.Addresses {
		if have[p] {
			continue
		}
		changes = append(changes, Change{Kind: "address", Added: true, What: p.String() + " dev " + st.Interface})
		if dryRun {
			continue
		}
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}}
		if familyOf(p.Addr()) == IPv6 {
			// Usable at once: duplicate address detection would hold it "tentative" for about a
			// second, and the operator's IPAM already guarantees it is unique.
			addr.Flags = unix.IFA_F_NODAD
		}
		if err := netlink.AddrAdd(link, addr); err != nil && !errors.Is(err, unix.EEXIST) {
			return changes, fmt.Errorf("add address %s to %q: %w", p, st.Interface, err)
		}
	}
	return changes, nil
}

// syncRules keeps exactly the desired rules pointing at our table.
func (a *Applier) syncRules(st State, dryRun bool) ([]Change, error) {
	var changes []Change
	for _, fam := range []Family{IPv4, IPv6} {
		var want []Rule
		for _, r := range st.Rules {
			if r.Family == fam {
				want = append(want, r)
			}
		}
		existing, err := listRules(fam, st.Table)
		if err != nil {
			return changes, err
		}
		found := map[Rule]bool{}
		for _, r := range existing {
			key := Rule{Family: fam, Priority: r.Priority, IIF: r.IifName, Table: r.Table}
			plain := r.Src == nil && r.Dst == nil && r.OifName == "" && r.Mark == 0 && !r.Invert
			if plain && slices.Contains(want, key) && !found[key] {
				found[key] = true
				continue
			}
			changes = append(changes, Change{Kind: "rule", What: fmt.Sprintf("%s %d: iif %q lookup %d", fam, r.Priority, r.IifName, r.Table)})
			if !dryRun {
				if err := netlink.RuleDel(&r); err != nil && !errors.Is(err, unix.ENOENT) {
					return changes, fmt.Errorf("remove stale %s rule %d (lookup %d): %w", fam, r.Priority, r.Table, err)
				}
			}
		}
		for _, r := range want {
			if found[r] {
				continue
			}
			changes = append(changes, Change{Kind: "rule", Added: true, What: fmt.Sprintf("%s %d: iif %s lookup %d", fam, r.Priority, r.IIF, r.Table)})
			if dryRun {
				continue
			}
			nr := netlink.NewRule()
			nr.Family = netlinkFamily(fam)
			nr.Priority = r.Priority
			nr.IifName = r.IIF
			nr.Table = r.Table
			if err := netlink.RuleAdd(nr); err != nil && !errors.Is(err, unix.EEXIST) {
				return changes, fmt.Errorf("add %s rule %d: iif %s lookup %d: %w", fam, r.Priority, r.IIF, r.Table, err)
			}
		}
	}
	return changes, nil
}

// routeKey is what makes two routes the same for us.
type routeKey struct {
	dst    netip.Prefix
	gw     netip.Addr
	link   int
	onLink bool
}

// syncRoutes keeps exactly the desired routes in our table.
func (a *Applier) syncRoutes(st State, dryRun bool) ([]Change, error) {
	var changes []Change
	links := map[string]int{}
	for _, name := range []string{st.Interface, st.Uplink} {
		l, err := netlink.LinkByName(name)
		if err != nil {
			return nil, fmt.Errorf("interface %q: %w", name, err)
		}
		links[name] = l.Attrs().Index
	}
	for _, fam := range []Family{IPv4, IPv6} {
		want := map[routeKey]Route{}
		for _, r := range st.Routes {
			if r.Family == fam {
				want[routeKey{dst: r.Dst, gw: r.Gateway, link: links[r.Dev], onLink: r.OnLink}] = r
			}
		}
		existing, err := listRoutes(fam, st.Table)
		if err != nil {
			return changes, err
		}
		found := map[routeKey]bool{}
		for _, r := range existing {
			dst, ok := prefixOf(r.Dst)
			if !ok {
				dst = netip.PrefixFrom(zeroAddr(fam), 0)
			}
			gw, _ := netip.AddrFromSlice(r.Gw)
			key := routeKey{dst: dst, gw: gw.Unmap(), link: r.LinkIndex, onLink: r.Flags&int(netlink.FLAG_ONLINK) != 0}
			if _, ok := want[key]; ok && !found[key] && len(r.MultiPath) == 0 {
				found[key] = true
				continue
			}
			changes = append(changes, Change{Kind: "route", What: fmt.Sprintf("table %d %s", st.Table, r)})
			if !dryRun {
				if err := netlink.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) {
					return changes, fmt.Errorf("remove stale route %s from table %d: %w", r, st.Table, err)
				}
			}
		}
		// Add in the order Desired lists them: the default route last matters for nothing, but a
		// stable order keeps the log readable.
		for _, r := range st.Routes {
			key := routeKey{dst: r.Dst, gw: r.Gateway, link: links[r.Dev], onLink: r.OnLink}
			if r.Family != fam || found[key] {
				continue
			}
			found[key] = true
			changes = append(changes, Change{Kind: "route", Added: true, What: fmt.Sprintf("table %d %s", st.Table, strings.TrimSpace(RenderRoutes(State{Routes: []Route{r}}, fam)))})
			if dryRun {
				continue
			}
			nr := &netlink.Route{
				Family:    netlinkFamily(fam),
				Table:     st.Table,
				LinkIndex: key.link,
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
				return changes, fmt.Errorf("add route %s to table %d: %w", strings.TrimSpace(RenderRoutes(State{Routes: []Route{r}}, fam)), st.Table, err)
			}
		}
	}
	return changes, nil
}

// syncIPTables keeps our chains holding exactly the desired rules, and one jump to each. Each
// family's tables are read once with iptables-save, every changed table is written in one
// `iptables-restore --noflush` transaction (a chain is swapped whole, never seen half filled,
// and rules outside our chains are untouched). The caller verifies with a dry run, which reads
// each family's tables once more.
func (a *Applier) syncIPTables(st State, dryRun bool) ([]Change, error) {
	var changes []Change
	for _, t := range st.IPTables {
		bin, ok := map[Family]string{IPv4: a.Paths.IPv4, IPv6: a.Paths.IPv6}[t.Family]
		if !ok || bin == "" {
			return changes, fmt.Errorf("no iptables for %s", t.Family)
		}
		saved, err := iptablesSave(bin)
		if err != nil {
			return changes, err
		}
		cmd := "iptables"
		if t.Family == IPv6 {
			cmd = "ip6tables"
		}
		plan := PlanRestore(saved, t, cmd)
		changes = append(changes, plan.Changes...)
		if dryRun || len(plan.Tables) == 0 {
			continue
		}
		for _, table := range plan.Tables {
			if err := iptablesRestore(bin, plan.Payloads[table]); err != nil {
				return changes, fmt.Errorf("%s -t %s: %w", bin, table, err)
			}
		}
		for _, spec := range plan.RemovedDNAT {
			if n, err := forgetFlows(spec); err != nil {
				a.Log.Warn("could not delete the conntrack entries of a removed port", "rule", strings.Join(spec, " "), "err", err)
			} else if n > 0 {
				a.Log.Info("deleted the conntrack entries of a removed port", "rule", strings.Join(spec, " "), "entries", n)
			}
		}
	}
	return changes, nil
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

// forgetFlows deletes the conntrack entries of a removed UDP or SCTP Service port (spec is its
// DNAT rule): a client that keeps sending from the same source port would otherwise stay
// translated to the ClusterIP until the entry times out. TCP is left alone, as kube-proxy does:
// no new connection is translated, and established ones may finish.
func forgetFlows(spec []string) (uint, error) {
	var dst, proto, dport string
	for i := 0; i+1 < len(spec); i++ {
		switch spec[i] {
		case "-d":
			dst = spec[i+1]
		case "-p":
			proto = spec[i+1]
		case "--dport":
			dport = spec[i+1]
		}
	}
	protoNum := map[string]uint8{"udp": unix.IPPROTO_UDP, "sctp": unix.IPPROTO_SCTP}[proto]
	if protoNum == 0 {
		return 0, nil
	}
	lb, err := netip.ParsePrefix(dst)
	if err != nil {
		return 0, fmt.Errorf("destination %q: %w", dst, err)
	}
	port, err := strconv.ParseUint(dport, 10, 16)
	if err != nil {
		return 0, fmt.Errorf("port %q: %w", dport, err)
	}
	filter := &netlink.ConntrackFilter{}
	if err := filter.AddIP(netlink.ConntrackOrigDstIP, lb.Addr().AsSlice()); err != nil {
		return 0, err
	}
	if err := filter.AddProtocol(protoNum); err != nil {
		return 0, err
	}
	if err := filter.AddPort(netlink.ConntrackOrigDstPort, uint16(port)); err != nil {
		return 0, err
	}
	family := netlink.InetFamily(unix.AF_INET)
	if familyOf(lb.Addr()) == IPv6 {
		family = netlink.InetFamily(unix.AF_INET6)
	}
	return netlink.ConntrackDeleteFilters(netlink.ConntrackTable, family, filter)
}

// splitRule splits a rule as iptables -S prints it into arguments, honouring double quotes
// (comments written by someone else).
func splitRule(spec string) []string {
	var out []string
	var cur strings.Builder
	inQuote, started := false, false
	for i := 0; i < len(spec); i++ {
		ch := spec[i]
		switch {
		case ch == '\\' && inQuote && i+1 < len(spec):
			i++
			cur.WriteByte(spec[i])
		case ch == '"':
			inQuote, started = !inQuote, true
		case ch == ' ' && !inQuote:
			if started {
				out = append(out, cur.String())
				cur.Reset()
				started = false
			}
		default:
			cur.WriteByte(ch)
			started = true
		}
	}
	if started {
		out = append(out, cur.String())
	}
	return out
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
