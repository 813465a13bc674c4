package lbpod

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// FlowPolicy is how the nat rules of one family translate UDP and SCTP traffic to the LB
// address: which sources are allowed and where each port goes. It decides which conntrack
// entries are stale after a change (Stale); TCP is left alone, as kube-proxy does: no new
// connection is translated the old way, and established ones may finish.
type FlowPolicy struct {
	LB netip.Addr
	// AllSources is set when every source is allowed; otherwise only Sources are.
	AllSources bool
	Sources    []netip.Prefix
	// Targets maps each UDP and SCTP Service port to the ClusterIP:port it is DNATed to. Without
	// a ClusterIP of the family it is empty: nothing is translated.
	Targets map[Port]netip.AddrPort
	// PortSources, when not nil, replaces AllSources and Sources port by port: the members of a
	// shared address that allow different sources. A port not in it is not translated.
	PortSources map[Port]FlowSources
}

// FlowSources is who may reach one port of a member: everyone, or the ranges.
type FlowSources struct {
	All    bool
	Ranges []netip.Prefix
}

func (s FlowSources) allows(a netip.Addr) bool {
	return s.All || slices.ContainsFunc(s.Ranges, func(p netip.Prefix) bool { return p.Contains(a) })
}

func (s FlowSources) String() string {
	if s.All {
		return "all sources"
	}
	var r []string
	for _, p := range s.Ranges {
		r = append(r, p.String())
	}
	return "sources " + strings.Join(r, ",")
}

// Flow is the part of a conntrack entry FlowPolicy looks at: the original direction's protocol,
// source and destination, and the source of the reply direction (the DNAT target when the entry
// was translated, the LB address itself when it was not).
type Flow struct {
	Protocol Protocol
	Src      netip.Addr
	Dst      netip.AddrPort
	ReplySrc netip.AddrPort
}

// Stale reports whether an entry must be deleted: it is UDP or SCTP to the LB address, and the
// rules in place now would not translate its next packet to the same ClusterIP:port (its port
// is gone, its source is no longer allowed, its target changed, or it was made before the DNAT
// rule existed and is not translated at all).
func (f FlowPolicy) Stale(fl Flow) bool {
	if fl.Protocol != UDP && fl.Protocol != SCTP {
		return false
	}
	if fl.Dst.Addr().Unmap() != f.LB {
		return false
	}
	if fl.Protocol == SCTP && fl.Dst.Port() == 0 {
		// An SCTP entry without its ports (vishvananda/netlink's parser read those of TCP and UDP
		// only; the walk's own, parseConntrackFlow, reads them, so this is for an entry the
		// kernel sent without them). Called stale for its port, every SCTP association to the
		// address was deleted at every change of the rules, allowed ones too. Without the port,
		// it is kept while some SCTP port allows its source and translates to its target; an
		// entry of a port gone to a target other ports still have lives on until it ends.
		reply := fl.ReplySrc.Addr().Unmap()
		for port, target := range f.Targets {
			if port.Protocol == SCTP && target.Addr() == reply && f.sources(port).allows(fl.Src.Unmap()) {
				return false
			}
		}
		return true
	}
	port := Port{Protocol: fl.Protocol, Port: int32(fl.Dst.Port())}
	if !f.sources(port).allows(fl.Src.Unmap()) {
		return true
	}
	target, ok := f.Targets[port]
	return !ok || target != netip.AddrPortFrom(fl.ReplySrc.Addr().Unmap(), fl.ReplySrc.Port())
}

// sources are the sources allowed to port: its own where members differ, else everyone's.
func (f FlowPolicy) sources(port Port) FlowSources {
	if f.PortSources != nil {
		return f.PortSources[port]
	}
	return FlowSources{All: f.AllSources, Ranges: f.Sources}
}

// String lists the policy briefly, for the log.
func (f FlowPolicy) String() string {
	var ports []string
	for p, t := range f.Targets {
		s := fmt.Sprintf("%s/%d->%s", strings.ToLower(string(p.Protocol)), p.Port, t)
		if f.PortSources != nil {
			s += " (" + f.PortSources[p].String() + ")"
		}
		ports = append(ports, s)
	}
	slices.Sort(ports)
	if f.PortSources != nil {
		return fmt.Sprintf("ports [%s]", strings.Join(ports, " "))
	}
	return fmt.Sprintf("%s, ports [%s]", FlowSources{All: f.AllSources, Ranges: f.Sources}, strings.Join(ports, " "))
}

// flowPolicyOf returns the flow policy of one family's tables; false when the family has no LB
// address (nothing to forget).
func flowPolicyOf(t Tables) (FlowPolicy, bool) {
	return t.Flows, t.Flows.LB.IsValid()
}
