package lbpod

import (
	"fmt"
	"strings"
)

// RenderRules renders the state's rules of one family the way `ip rule` prints them.
func RenderRules(st State, fam Family) string {
	var b strings.Builder
	for _, r := range st.Rules {
		if r.Family == fam {
			fmt.Fprintf(&b, "%d:\t%s lookup %d\n", r.Priority, r.selector(), r.Table)
		}
	}
	return b.String()
}

// RenderRoutes renders the state's routes of one family the way `ip route show table N` prints
// them for IPv4 (default first, then by destination).
func RenderRoutes(st State, fam Family) string {
	var b strings.Builder
	for _, r := range st.Routes {
		if r.Family != fam {
			continue
		}
		dst := r.Dst.String()
		if r.IsDefault() {
			dst = "default"
		} else if r.Dst.Bits() == r.Dst.Addr().BitLen() {
			dst = r.Dst.Addr().String()
		}
		b.WriteString(dst)
		if r.Gateway.IsValid() {
			fmt.Fprintf(&b, " via %s", r.Gateway)
		}
		fmt.Fprintf(&b, " dev %s", r.Dev)
		if !r.Gateway.IsValid() && fam == IPv4 {
			b.WriteString(" scope link")
		}
		if r.OnLink {
			b.WriteString(" onlink")
		}
		b.WriteString("\n")
	}
	return b.String()
}

// RenderIPTables renders the state's chains of one family and table the way `iptables -t <table>
// -S` prints them (our chains and jumps only).
func RenderIPTables(st State, fam Family, table string) string {
	var b strings.Builder
	for _, t := range st.IPTables {
		if t.Family != fam {
			continue
		}
		for _, c := range t.Chains {
			if c.Table == table {
				fmt.Fprintf(&b, "-N %s\n", c.Name)
			}
		}
		for _, j := range t.Jumps {
			if j.Table == table {
				fmt.Fprintf(&b, "-A %s -j %s\n", j.From, j.To)
			}
		}
		for _, c := range t.Chains {
			if c.Table != table {
				continue
			}
			for _, r := range c.Rules {
				fmt.Fprintf(&b, "-A %s %s\n", c.Name, strings.Join(r, " "))
			}
		}
	}
	return b.String()
}
