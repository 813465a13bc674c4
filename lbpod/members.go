package lbpod

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// ReasonPortClash: two members of a shared address have the same port and protocol. The operator
// keeps this from happening; if it happens anyway, the first member by name keeps the port and
// the other is told, while every other port is served (it is not a reason to stop serving).
const ReasonPortClash = "PortClash"

// ReasonNoMembers: the lb pod of a shared address has no member Service (yet, or any more):
// nothing is served, every port of the address is refused.
const ReasonNoMembers = "NoMembers"

// ReasonMemberInvalid: a member of a shared address that cannot be served (no ClusterIP yet, a
// malformed field): left out, the other members served.
const ReasonMemberInvalid = "MemberInvalid"

// member is one Service of the address with the ports it is given: without repeats, without the
// ports an earlier member (by name) has, and without SCTP when the kernel refused it.
type member struct {
	Service
	ports []Port
}

// resolveMembers orders the Services by name and gives each its ports; it reports every clash.
// It is pure.
func resolveMembers(services []Service, noSCTP bool) ([]member, []Problem) {
	sorted := slices.Clone(services)
	slices.SortStableFunc(sorted, func(a, b Service) int { return cmp.Compare(a.Name, b.Name) })
	owner := map[Port]string{}
	var members []member
	var problems []Problem
	for _, s := range sorted {
		m := member{Service: s}
		for _, p := range uniquePorts(s.Ports) {
			if first, taken := owner[p]; taken {
				problems = append(problems, Problem{Reason: ReasonPortClash, Message: fmt.Sprintf(
					"%s %d of Service %s is also a port of Service %s on the same address: %s (the first by name) is served on it, %s is not; give one of them another port",
					p.Protocol, p.Port, s.Name, first, first, s.Name)})
				continue
			}
			owner[p] = s.Name
			if noSCTP && p.Protocol == SCTP {
				continue
			}
			m.ports = append(m.ports, p)
		}
		members = append(members, m)
	}
	return members, problems
}

// target is one member as one family sees it: its ClusterIP of the family (invalid when it has
// none: its ports are then not DNATed in that family), its ports and its source ranges.
type target struct {
	// index is the member's place in name order.
	index     int
	name      string
	clusterIP netip.Addr
	ports     []Port
	ranges    []netip.Prefix
}

func targetsOf(members []member, fam Family) []target {
	var out []target
	for i, m := range members {
		ip, _ := clusterIPOf(m.ClusterIPs, fam)
		out = append(out, target{index: i, name: m.Name, clusterIP: ip, ports: m.ports, ranges: m.SourceRanges})
	}
	return out
}

// serves reports whether a target has anything DNATed in its family.
func (t target) serves() bool { return t.clusterIP.IsValid() && len(t.ports) > 0 }

// sourceKey is what a member's source ranges allow in one family, in a form equal for equal
// policies: "all", or the family's ranges sorted ("" allows nobody of the family: the ranges
// are all of the other one).
func sourceKey(fam Family, ranges []netip.Prefix) string {
	if len(ranges) == 0 {
		return "all"
	}
	var keep []string
	for _, r := range ranges {
		switch {
		case familyOf(r.Addr()) != fam:
		case r.Bits() == 0:
			return "all"
		default:
			keep = append(keep, r.Masked().String())
		}
	}
	slices.Sort(keep)
	return strings.Join(slices.Compact(keep), ",")
}

// sourceGroup is the members of one family that allow the same sources, in member order.
type sourceGroup struct {
	ranges  []netip.Prefix
	targets []target
}

// sourceGroups groups a family's targets by the sources they allow, each group in the order of
// its first member. One group (every member allows the same sources, or there is one member) is
// the single Service's layout: the source check in front of every port, as it always was. Only
// targets that DNAT something count: the others have nothing to restrict. With none, the first
// member's ranges stand for all (what a single Service without a ClusterIP of the family has).
func sourceGroups(fam Family, targets []target) []sourceGroup {
	var groups []sourceGroup
	index := map[string]int{}
	for _, t := range targets {
		if !t.serves() {
			continue
		}
		k := sourceKey(fam, t.ranges)
		i, ok := index[k]
		if !ok {
			i = len(groups)
			index[k] = i
			groups = append(groups, sourceGroup{ranges: t.ranges})
		}
		groups[i].targets = append(groups[i].targets, t)
	}
	if len(groups) == 0 {
		var ranges []netip.Prefix
		if len(targets) > 0 {
			ranges = targets[0].ranges
		}
		return []sourceGroup{{ranges: ranges}}
	}
	return groups
}

// sourceMatch is one allowed source of a family: a range, or everyone (invalid prefix).
type sourceMatch struct{ from netip.Prefix }

// sourceMatches lists the source checks of a family for ranges, in the Service's order, and the
// flow policy's view of them (everyone, or the ranges): empty ranges allow everyone, a /0 of the
// family allows everyone, the other family's ranges are left out (all of them left out: nobody).
// Each range is matched once, where it first appears: a range listed twice, even apart, would
// otherwise be written twice, and a chain that repeats a rule cannot be patched in place.
func sourceMatches(fam Family, ranges []netip.Prefix) (matches []sourceMatch, all bool, allowed []netip.Prefix) {
	if len(ranges) == 0 {
		return []sourceMatch{{}}, true, nil
	}
	seen := map[netip.Prefix]bool{}
	for _, r := range ranges {
		r = r.Masked()
		switch {
		case familyOf(r.Addr()) != fam, seen[r]:
		case r.Bits() == 0:
			matches = append(matches, sourceMatch{})
			all = true
		default:
			matches = append(matches, sourceMatch{from: r})
			allowed = append(allowed, r)
		}
		seen[r] = true
	}
	return matches, all, allowed
}

// groupChain names the nat chain of a source group when members allow different sources
// (LBSVC-SERVICES-S0, ...); its buckets are named after it (LBSVC-SERVICES-S0-TCP-156), within
// iptables' 28 characters up to 99 groups.
func groupChain(i int) string { return ChainServices + "-S" + strconv.Itoa(i) }

// nftGroupChain names the nftables chain of a source group (services_0, ...).
func nftGroupChain(i int) string { return NFTChainServices + "_" + strconv.Itoa(i) }

// familyMismatch is the problem of a member without a ClusterIP of an LB address's family.
func familyMismatch(addr netip.Addr, fam Family, s Service, shared bool) Problem {
	who := "the Service"
	if shared {
		who = "the Service " + s.Name
	}
	return Problem{Reason: ReasonFamilyMismatch, NotReady: true, Message: fmt.Sprintf(
		"LB address %s is %s but %s has no %s ClusterIP (spec.clusterIPs %s): nothing would be forwarded to it; give the Service that family (spec.ipFamilies, spec.ipFamilyPolicy) or use a Subnet of its family",
		addr, fam, who, fam, clusterIPList(s.ClusterIPs))}
}
