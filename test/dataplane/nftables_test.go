//go:build dataplane

package dataplane

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	. "github.com/onsi/gomega"
	"github.com/vishvananda/netns"

	"github.com/lbsvc/lbsvc-operator/lbpod"
)

// nftRules are lbpod's flags asking for the nftables back end explicitly (no fallback).
var nftRules = []string{"--rules", "nftables"}

// iptRules are lbpod's flags for the iptables back end, no longer the default: the tests that
// read iptables rules (counters, iptables-save) pin it.
var iptRules = []string{"--rules", "iptables"}

// forEachRules runs a test once per rules back end: iptables with the flag that picks it, and
// nftables as the default (no flag), which also keeps the default covered.
func forEachRules(t *testing.T, test func(t *testing.T, rules []string)) {
	for _, b := range []struct {
		name  string
		flags []string
	}{{"iptables", iptRules}, {"nftables", nil}} {
		t.Run("rules="+b.name, func(t *testing.T) { test(t, b.flags) })
	}
}

// nftConn is an nf_tables netlink connection into a namespace of the test; closed at cleanup.
func nftConn(t testing.TB, ns string) *nftables.Conn {
	t.Helper()
	h, err := netns.GetFromName(ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	conn, err := nftables.New(nftables.WithNetNSFd(int(h)), nftables.AsLasting())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.CloseLasting() })
	return conn
}

// nftDesired is what lbpod must hold with the test's network for a Service.
func nftDesired(stack string, clusterIPs []string, ports []servicePort, ranges []string) lbpod.State {
	net := lbpod.Network{}
	if stack != "v6" {
		net.Addresses = append(net.Addresses, netip.MustParsePrefix(lbIPv4+"/16"))
		net.Gateways = append(net.Gateways, netip.MustParseAddr(gatewayV4))
		net.Subnets = append(net.Subnets, netip.MustParsePrefix(subnetV4))
	}
	if stack != "v4" {
		net.Addresses = append(net.Addresses, netip.MustParsePrefix(lbIPv6+"/64"))
		net.Gateways = append(net.Gateways, netip.MustParseAddr(gatewayV6))
		net.Subnets = append(net.Subnets, netip.MustParsePrefix(subnetV6))
	}
	svc := lbpod.Service{}
	for _, c := range clusterIPs {
		svc.ClusterIPs = append(svc.ClusterIPs, netip.MustParseAddr(c))
	}
	for _, p := range ports {
		svc.Ports = append(svc.Ports, lbpod.Port{Protocol: lbpod.Protocol(p.Protocol), Port: int32(p.Port)})
	}
	for _, r := range ranges {
		svc.SourceRanges = append(svc.SourceRanges, netip.MustParsePrefix(r))
	}
	return lbpod.Desired(lbpod.Config{Network: net, Services: []lbpod.Service{svc}}, lbpod.Observed{}, lbpod.Names{})
}

// nftDiff reads lbpod's tables in the lb namespace and returns what PlanNFT would still change
// to reach st: nothing once lbpod converged.
func nftDiff(t testing.TB, conn *nftables.Conn, st lbpod.State) []string {
	t.Helper()
	var out []string
	for _, want := range st.NFTables {
		have, err := lbpod.ReadNFT(conn, want.Family, lbpod.NFTKernel{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range lbpod.PlanNFT(have, want).Steps {
			out = append(out, s.String())
		}
	}
	return out
}

// The nftables back end writes the tables Desired describes, read back equal (no change left,
// and resyncs find nothing to do), serves TCP and UDP on IPv4 and IPv6, and writes no
// iptables rule.
func TestNFTablesConvergesAndServes(t *testing.T) {
	g, tp, _ := servedTopology(t, "dual", []string{clusterIPv4, clusterIPv6}, nil, append([]string{"--resync-period", "200ms"}, nftRules...)...)
	expectServed(g, tp, tp.client, lbIPv4, clusterIPv4)
	expectServed(g, tp, tp.client, lbIPv6, clusterIPv6)
	conn := nftConn(t, tp.lb)
	g.Expect(nftDiff(t, conn, nftDesired("dual", []string{clusterIPv4, clusterIPv6}, basePorts, nil))).To(BeEmpty())
	// Resyncs (every 200 ms) read everything afresh and find nothing to change.
	resyncs := func() int { return strings.Count(tp.lbpod.logs.String(), "trigger=resync") }
	g.Eventually(func() string { return tp.lbpod.logs.String() }).WithTimeout(3 * time.Second).WithPolling(50 * time.Millisecond).
		Should(ContainSubstring(`msg="rules back end" rules=nftables`))
	g.Consistently(resyncs).WithTimeout(time.Second).WithPolling(100 * time.Millisecond).Should(BeZero())
	g.Expect(tp.exec(tp.lb, "iptables-save")).NotTo(ContainSubstring("LBSVC"))
	g.Expect(tp.exec(tp.lb, "ip6tables-save")).NotTo(ContainSubstring("LBSVC"))
}

// Drift is repaired at the next resync: a port deleted from its set by netlink, the whole table
// deleted, a stray chain added to it, the table made dormant.
func TestNFTablesDriftIsRepaired(t *testing.T) {
	const resync = time.Second
	g, tp, _ := servedTopology(t, "v4", []string{clusterIPv4}, nil, append([]string{"--resync-period", resync.String()}, nftRules...)...)
	expectServed(g, tp, tp.client, lbIPv4, clusterIPv4)
	conn := nftConn(t, tp.lb)
	table := &nftables.Table{Family: nftables.TableFamilyIPv4, Name: lbpod.NFTTable}
	set := &nftables.Set{Table: table, Name: "tcp_ports", KeyType: nftables.TypeInetService}
	for i, drift := range []struct {
		do      func() error
		changed string // the change lbpod logs, as a regular expression
	}{
		{func() error { return conn.SetDeleteElements(set, []nftables.SetElement{{Key: []byte{0, httpPort}}}) }, `\+nftables element ip lbsvc tcp_ports \{ 80 \}`},
		{func() error { conn.DelTable(table); return nil }, `\+nftables table ip lbsvc`},
		// A chain of someone else's in our table: the table is deleted and built again in one
		// batch (so the HTTP check below sees no gap, only the repair).
		{func() error { conn.AddChain(&nftables.Chain{Table: table, Name: "stray"}); return nil }, `-nftables table ip lbsvc \(chains \[forward input postrouting prerouting services stray\], want \[forward input postrouting prerouting services\]\)"\n.*msg=changed change="\+nftables table ip lbsvc`},
		// Made dormant by hand: every chain and set as they were, none hooked (no DNAT, no
		// reject, no drop: an open router from net1).
		{func() error {
			tp.exec(tp.lb, "nft", "add", "table", "ip", lbpod.NFTTable, "{", "flags", "dormant", ";", "}")
			return nil
		}, `-nftables table ip lbsvc \(table flags 0x[0-9a-f]+ as read: ours has none \(dormant unhooks it\)\)"\n.*msg=changed change="\+nftables table ip lbsvc`},
	} {
		g.Expect(drift.do()).To(Succeed())
		g.Expect(conn.Flush()).To(Succeed())
		// The stray chain stops no traffic: only the log says when it was repaired.
		if i != 2 {
			g.Expect(httpGet(t, tp.client, lbHTTPv4)).Error().To(Satisfy(isRefused))
		}
		g.Eventually(func() (string, error) { return httpGet(t, tp.client, lbHTTPv4) }).
			WithTimeout(resync + time.Second).WithPolling(50 * time.Millisecond).Should(Equal(httpReply(clusterIPv4, httpPort)))
		g.Eventually(tp.lbpod.logs.String).WithTimeout(resync + time.Second).WithPolling(20 * time.Millisecond).
			Should(MatchRegexp(`msg=changed change="`+drift.changed+`"\n.*msg=applied trigger=resync changes=%d `, 1+i/2))
	}
	g.Expect(nftDiff(t, conn, nftDesired("v4", []string{clusterIPv4}, basePorts, nil))).To(BeEmpty())
	_, metrics := tp.healthGet("/metrics")
	g.Expect(metrics).To(MatchRegexp(`\nlbpod_repairs_total\{cause="nftables"\} [3-9]\d*\n`))
}

// 1000 ports (what the iptables back end puts in bucket chains): traffic reaches the ports
// through the sets, one port changed is one element deleted and one added in one batch,
// verified by reading back only that set, while a held connection keeps working.
func TestNFTablesThousandPorts(t *testing.T) {
	many := append(append([]servicePort{}, basePorts...), tcpPorts(10000, 996)...)
	g, tp, svc, exchange := manyPortsServed(t, many, nftRules...)

	changed := append(append([]servicePort{}, many[:len(many)-1]...), servicePort{Protocol: "TCP", Port: extraHTTPPort})
	writeService(t, svc, []string{clusterIPv4}, changed, nil)
	g.Eventually(func() (string, error) { return httpGet(t, tp.client, lbAddr(lbIPv4, extraHTTPPort)) }).
		WithTimeout(time.Second).WithPolling(20 * time.Millisecond).Should(Equal(httpReply(clusterIPv4, extraHTTPPort)))
	g.Eventually(tp.lbpod.logs.String).WithTimeout(time.Second).WithPolling(20 * time.Millisecond).Should(MatchRegexp(
		`msg=changed change="-nftables element ip lbsvc tcp_ports \{ 10995 \}"\n.*msg=changed change="\+nftables element ip lbsvc tcp_ports \{ 8443 \}"\n` +
			`.*msg=applied trigger=service changes=2 took=\S+ read=\S+ execute=\S+ verify=\S+ saves=0 lists=1\n`))
	exchange("after the change")
	conn := nftConn(t, tp.lb)
	g.Expect(nftDiff(t, conn, nftDesired("v4", []string{clusterIPv4}, changed, nil))).To(BeEmpty())
	have, err := lbpod.ReadNFT(conn, lbpod.IPv4, lbpod.NFTKernel{}, nil)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(have.Sets["tcp_ports"].Ports).To(HaveLen(998)) // 80, the echo port, 995 of the range and 8443
}

// 6000 ports in one set (a media Service's port range): more elements than one netlink message
// can carry (its element list's length field has 16 bits, which 4096 of them wrapped), so they go
// in several messages of the one batch. The set holds them all, traffic reaches the ports, resyncs
// every 100 ms find nothing to change, and 5000 of them removed at once are removed.
func TestNFTablesPortsBeyondOneMessage(t *testing.T) {
	many := append(append([]servicePort{}, basePorts...), tcpPorts(20000, 6000)...)
	g, tp, svc, exchange := manyPortsServed(t, many, append([]string{"--resync-period", "100ms"}, nftRules...)...)
	conn := nftConn(t, tp.lb)
	tcpSet := func() []uint16 {
		have, err := lbpod.ReadNFT(conn, lbpod.IPv4, lbpod.NFTKernel{}, nil)
		g.Expect(err).NotTo(HaveOccurred())
		return have.Sets["tcp_ports"].Ports
	}
	g.Expect(tcpSet()).To(HaveLen(6002)) // 80, the echo port and the 6000
	changed := strings.Count(tp.lbpod.logs.String(), "msg=changed")
	g.Consistently(func() int { return strings.Count(tp.lbpod.logs.String(), "msg=changed") }).
		WithTimeout(600 * time.Millisecond).WithPolling(100 * time.Millisecond).Should(Equal(changed))

	fewer := many[:len(many)-5000]
	writeService(t, svc, []string{clusterIPv4}, fewer, nil)
	g.Eventually(func() int { return len(tcpSet()) }).WithTimeout(2 * time.Second).WithPolling(20 * time.Millisecond).Should(Equal(1002))
	g.Expect(nftDiff(t, conn, nftDesired("v4", []string{clusterIPv4}, fewer, nil))).To(BeEmpty())
	exchange("after 5000 ports went")
	code, body := tp.readyz()
	g.Expect(code).To(Equal(200), body)
}

// nftFloor is iptablesFloor for the nftables back end, with bare google/nftables calls in a
// fresh namespace: one transaction creating a table with a set of the 1000 ports (create), one
// read of that set (read), and the smallest transaction that changes one port: one element
// deleted and another added (change). What lbpod's apply and verify cannot go below.
func (tp *topology) nftFloor() (create, read, change time.Duration) {
	tp.t.Helper()
	ns := "lbt-f-" + tp.suffix
	mustRun(tp.t, "ip", "netns", "add", ns)
	defer mustRun(tp.t, "ip", "netns", "del", ns)
	conn := nftConn(tp.t, ns)
	table := conn.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: lbpod.NFTTable})
	set := &nftables.Set{Table: table, Name: "tcp_ports", KeyType: nftables.TypeInetService}
	var elems []nftables.SetElement
	for p := 10000; p < 11000; p++ {
		elems = append(elems, nftables.SetElement{Key: []byte{byte(p >> 8), byte(p)}})
	}
	if err := conn.AddSet(set, elems); err != nil {
		tp.t.Fatal(err)
	}
	start := time.Now()
	if err := conn.Flush(); err != nil {
		tp.t.Fatal(err)
	}
	create = time.Since(start)
	start = time.Now()
	if got, err := conn.GetSetElements(set); err != nil || len(got) != 1000 {
		tp.t.Fatalf("read back %d elements: %v", len(got), err)
	}
	read = time.Since(start)
	if err := conn.SetDeleteElements(set, elems[998:999]); err != nil {
		tp.t.Fatal(err)
	}
	if err := conn.SetAddElements(set, []nftables.SetElement{{Key: []byte{20000 >> 8, 20000 & 0xff}}}); err != nil {
		tp.t.Fatal(err)
	}
	start = time.Now()
	if err := conn.Flush(); err != nil {
		tp.t.Fatal(err)
	}
	return create, read, time.Since(start)
}
