//go:build dataplane

package dataplane

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The kill -9 fence: with standbys the LB addresses live on a kernel lifetime that the election
// renews, so that they lapse from a kernel whose lb pod was killed or frozen. Neither the loop's
// repair nor a failed renewal may take that fence away.

// forever is the valid lifetime `ip -j addr` prints for an address without one.
const forever = math.MaxUint32

// lifetimes reads `ip -j addr show dev net1` in ns: the valid lifetime in seconds of each global
// address (forever when it has none).
func lifetimes(t testing.TB, ns string) map[string]uint32 {
	t.Helper()
	var links []struct {
		AddrInfo []struct {
			Local string `json:"local"`
			Scope string `json:"scope"`
			Valid uint32 `json:"valid_life_time"`
		} `json:"addr_info"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, "ip", "-n", ns, "-j", "addr", "show", "dev", "net1")), &links); err != nil {
		t.Fatalf("ip -j addr: %v", err)
	}
	out := map[string]uint32{}
	for _, l := range links {
		for _, a := range l.AddrInfo {
			if a.Scope == "global" {
				out[a.Local] = a.Valid
			}
		}
	}
	return out
}

// onLifetime says whether every one of addrs is in got with a finite lifetime of at most limit
// seconds, and describes got.
func onLifetime(got map[string]uint32, limit uint32, addrs ...string) (bool, string) {
	ok := true
	for _, a := range addrs {
		if v, held := got[a]; !held || v == forever || v > limit {
			ok = false
		}
	}
	return ok, fmt.Sprint(got)
}

// TestRepairKeepsLifetime runs lbpod.Loop (loopdriver) active with a 30 s address lifetime and
// nothing that renews it, so every lifetime seen is the loop's own: it adds the addresses on it;
// an address deleted by hand comes back on it (before, the repair added it for ever, and the
// fence was gone for good); one made permanent by hand is given it again at the next resync
// (counted as lbpod_repairs_total{cause="lifetime"}). Then its role stops being confirmed (an
// election that froze or hangs): it repairs nothing and leaves the addresses on a lifetime to
// lapse, takes a permanent one away, and holds again once the role is confirmed.
func TestRepairKeepsLifetime(t *testing.T) {
	tp := newTopology(t)
	svc := filepath.Join(t.TempDir(), "svc.yaml")
	writeService(t, svc, []string{clusterIPv4, clusterIPv6}, basePorts, nil)
	cmd := exec.Command("ip", append([]string{"netns", "exec", tp.lb, loopDriverBin, "--service-file", svc,
		"--lifetime", "30s", "--resync-period", "500ms"}, stackArgs("dual")...)...)
	stdin, logs := startLoopDriver(t, cmd)
	waitFor(t, 10*time.Second, "the loop holds the addresses", func() bool { return strings.Contains(logs.String(), "held true\n") })
	lbs := []string{lbIPv4, lbIPv6}
	if ok, got := onLifetime(lifetimes(t, tp.lb), 30, lbs...); !ok {
		t.Fatalf("added: lifetimes %s, want both addresses on at most 30 s", got)
	}

	tp.ip(tp.lb, "addr", "del", lbIPv4+"/16", "dev", "net1")
	tp.ip(tp.lb, "addr", "del", lbIPv6+"/64", "dev", "net1")
	var got string
	waitFor(t, 5*time.Second, "the repair puts both addresses back on a lifetime", func() bool {
		var ok bool
		ok, got = onLifetime(lifetimes(t, tp.lb), 30, lbs...)
		return ok
	})
	t.Logf("repaired: lifetimes %s", got)

	tp.ip(tp.lb, "addr", "replace", lbIPv4+"/16", "dev", "net1")
	tp.ip(tp.lb, "addr", "replace", lbIPv6+"/64", "dev", "net1", "nodad")
	if v := lifetimes(t, tp.lb)[lbIPv4]; v != forever {
		t.Fatalf("ip addr replace without a lifetime left %d s, want forever (the test's premise)", v)
	}
	waitFor(t, 5*time.Second, "the resync gives the permanent addresses the lifetime", func() bool {
		var ok bool
		ok, got = onLifetime(lifetimes(t, tp.lb), 30, lbs...)
		return ok
	})
	t.Logf("made permanent by hand, then resynced: lifetimes %s", got)
	if !strings.Contains(logs.String(), "+lifetime "+lbIPv4+"/16 dev net1 valid_lft 30s (was forever)") {
		t.Errorf("the log does not name the lifetime repair")
	}
	_, metrics := tp.healthGet("/metrics")
	if !regexp.MustCompile(`\nlbpod_repairs_total\{cause="lifetime"\} [1-9]`).MatchString(metrics) {
		t.Errorf(`lbpod_repairs_total{cause="lifetime"} not counted:\n%s`, metrics)
	}

	if _, err := io.WriteString(stdin, "unconfirmed\n"); err != nil {
		t.Fatal(err)
	}
	// Unconfirmed, the loop lapses: the addresses on the lifetime stay through two resyncs (none
	// renewed: the lifetime only counts down), one deleted by hand is not put back, one made
	// permanent by hand goes (no lifetime fences it).
	before := lifetimes(t, tp.lb)
	tp.ip(tp.lb, "addr", "del", lbIPv4+"/16", "dev", "net1")
	tp.ip(tp.lb, "addr", "replace", lbIPv6+"/64", "dev", "net1", "nodad")
	waitFor(t, 5*time.Second, "an unconfirmed loop takes the permanent address away at the next resync", func() bool { return len(lifetimes(t, tp.lb)) == 0 })
	tp.ip(tp.lb, "addr", "replace", lbIPv6+"/64", "dev", "net1", "nodad", "valid_lft", "20", "preferred_lft", "20")
	syncs := syncsTotal(t, tp)
	waitFor(t, 5*time.Second, "two more resyncs", func() bool { return syncsTotal(t, tp) >= syncs+2 })
	left := lifetimes(t, tp.lb)
	got = fmt.Sprint(left)
	if v, held := left[lbIPv6]; !held || v == forever || v > 20 {
		t.Fatalf("unconfirmed: lifetimes %s, want %s left on its own lifetime of at most 20 s (before: %v)", got, lbIPv6, before)
	}
	if _, held := left[lbIPv4]; held {
		t.Fatalf("unconfirmed: %s came back (lifetimes %s)", lbIPv4, got)
	}
	t.Logf("unconfirmed, after two resyncs: lifetimes %s", got)
	if _, err := io.WriteString(stdin, "confirmed\n"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "confirmed again, the addresses come back on the lifetime", func() bool {
		ok, _ := onLifetime(lifetimes(t, tp.lb), 30, lbs...)
		return ok
	})
}

// syncsTotal is the sum of lbpod_syncs_total over its results: how many reconciles the loop ran.
func syncsTotal(t *testing.T, tp *topology) int {
	t.Helper()
	_, metrics := tp.healthGet("/metrics")
	n := 0
	for _, m := range regexp.MustCompile(`\nlbpod_syncs_total\{result="[a-z]+"\} (\d+)`).FindAllStringSubmatch(metrics, -1) {
		v, _ := strconv.Atoi(m[1])
		n += v
	}
	if n == 0 {
		t.Fatalf("no lbpod_syncs_total in the metrics:\n%s", metrics)
	}
	return n
}

// TestHALBPodRenewalFailure: two lbpod replicas of a dual-stack Service; the active's renewal of
// the lifetime starts to fail (IPv6 turned off on its net1: the kernel refuses the IPv6 address).
// It does not hold on to addresses it cannot fence: it releases both and resigns, the standby
// takes over after its skew, and the old active's log and metrics say why.
func TestHALBPodRenewalFailure(t *testing.T) {
	tp, a, b := startDualHA(t)
	leaseSecs := uint32(haLease / time.Second)
	if ok, got := onLifetime(lifetimes(t, tp.pod["a"]), leaseSecs, haLB, lbIPv6); !ok {
		t.Fatalf("a's lifetimes %s, want both addresses on the %s lease", got, haLease)
	}

	begin := time.Now()
	mustRun(t, "ip", "netns", "exec", tp.pod["a"], "sysctl", "-qw", "net.ipv6.conf.net1.disable_ipv6=1")
	waitFor(t, 5*time.Second, "b takes over", func() bool {
		return b.role() == "active" && tp.holdsAddr("b", haLB) && tp.holdsAddr("b", lbIPv6)
	})
	took := time.Since(begin)
	waitFor(t, 5*time.Second, "a lets go of the IPv4 address", func() bool { return !tp.holdsAddr("a", haLB) && a.role() == "standby" })
	if !strings.Contains(a.logs.String(), "kernel lifetime could not be renewed: released them and resigned") {
		t.Errorf("a's log does not say why it stepped down")
	}
	if m := tp.metrics("a"); !regexp.MustCompile(`\nlbpod_ha_lifetime_renewal_failures_total [1-9]`).MatchString(m) {
		t.Errorf("lbpod_ha_lifetime_renewal_failures_total not counted on a:\n%s", m)
	}
	if !strings.Contains(b.logs.String(), "the active resigned: active with term 2") {
		t.Errorf("b did not take over on a resignation (after its skew, not the dead interval)")
	}
	if ok, got := onLifetime(lifetimes(t, tp.pod["b"]), leaseSecs, haLB, lbIPv6); !ok {
		t.Errorf("b's lifetimes %s, want both addresses on the %s lease", got, haLease)
	}
	t.Logf("figure: ha_renewal_failure_to_standby_holding_ms=%d", took.Milliseconds())
}

// startStallPair starts two replicas with a 1 s lease: a active, then b standby; extra are more
// flags for both.
func startStallPair(t *testing.T, extra ...string) (*haTopology, *haReplica, *haReplica) {
	svc := filepath.Join(t.TempDir(), "svc.yaml")
	writeService(t, svc, []string{clusterIPv4}, []servicePort{{Protocol: "UDP", Port: haEchoPort, TargetPort: haEchoPort}}, nil)
	tp := newHATopology(t)
	tp.addClusterSide()
	start := func(r string) *haReplica {
		return tp.startProcess(r, append([]string{lbpodBin, "--service-file", svc, "--health-addr", "127.0.0.1:8081",
			"--addresses", haLB + "/16", "--gateways", gatewayV4, "--subnets", subnetV4,
			"--replicas", "2", "--ha-interval", haInterval.String(), "--ha-lease", haLease.String()}, extra...)...)
	}
	a := start("a")
	waitFor(t, 10*time.Second, "a active", func() bool { return a.role() == "active" && tp.holds("a") })
	b := start("b")
	waitFor(t, 10*time.Second, "b standby", func() bool { return b.role() == "standby" })
	return tp, a, b
}

// TestHAStallFence stops the active lbpod (SIGSTOP) for two seconds and measures, from the
// stop, when the standby holds the address and when the stopped replica's kernel drops it by
// itself (the lease lapses: renewed every quarter lease, a 1 s lifetime, and the kernel's own
// lifetime timer). Until then both kernels hold it (the stopped one still answers ARP and
// forwards; the successor's announcements move the clients). After SIGCONT the stopped replica
// steps down before it sends anything, and its loop does not put the address back (it holds the
// addresses only while the election confirmed the role within the dead interval).
func TestHAStallFence(t *testing.T) {
	tp, a, _ := startStallPair(t)
	time.Sleep(time.Second) // a few renewals in steady state: the stop lands anywhere between two

	stopped := time.Now()
	_ = a.cmd.Process.Signal(syscall.SIGSTOP)
	var claimed, lapsed time.Duration
	waitFor(t, 5*time.Second, "b holds and a's kernel dropped the address", func() bool {
		if claimed == 0 && tp.holds("b") {
			claimed = time.Since(stopped)
		}
		if lapsed == 0 && !tp.holds("a") {
			lapsed = time.Since(stopped)
		}
		return claimed > 0 && lapsed > 0
	})
	time.Sleep(2*time.Second - time.Since(stopped))
	logged := len(a.logs.String())
	_ = a.cmd.Process.Signal(syscall.SIGCONT)
	waitFor(t, 5*time.Second, "a steps down after SIGCONT", func() bool { return a.role() == "standby" })
	time.Sleep(500 * time.Millisecond)
	if tp.holds("a") || !tp.holds("b") {
		t.Errorf("after SIGCONT: a holds=%t b holds=%t, want b alone", tp.holds("a"), tp.holds("b"))
	}
	if after := a.logs.String()[logged:]; strings.Contains(after, "+address "+haLB) {
		t.Errorf("a's loop put the address back after SIGCONT:\n%s", after)
	}
	if lapsed > haLease+time.Second/2 {
		t.Errorf("a's kernel kept the address %s after the stop, want at most the %s lease and the kernel's timer", lapsed, haLease)
	}
	t.Logf("figure: ha_stall_standby_holds_ms=%d ha_stall_fence_lapses_ms=%d ha_stall_overlap_ms=%d (from SIGSTOP; lease %s, interval %s)",
		claimed.Milliseconds(), lapsed.Milliseconds(), (lapsed - claimed).Milliseconds(), haLease, haInterval)
}

// TestHAStallAlone is TestHAStallFence with nobody to take over: the standby was killed first
// (its node died; or, on one starved node, it is as late). The active stays stopped until its
// kernel drops the address (the 1 s lease lapsed, so it was stopped past the dead interval too);
// after SIGCONT
// it reads what waited in its socket (nothing newer), keeps the active role, advertises at once
// and puts the address back, where it used to step down and leave the address unheld for a dead
// interval and more. The figure is SIGCONT until net1 holds the address again.
func TestHAStallAlone(t *testing.T) {
	tp, a, b := startStallPair(t)
	_ = b.cmd.Process.Kill()
	select {
	case <-b.done:
	case <-time.After(5 * time.Second):
		t.Fatal("b did not exit within 5 s of kill -9")
	}

	_ = a.cmd.Process.Signal(syscall.SIGSTOP)
	waitFor(t, 5*time.Second, "a's kernel dropped the address (lease lapsed)", func() bool { return !tp.holds("a") })
	logged := len(a.logs.String())
	_ = a.cmd.Process.Signal(syscall.SIGCONT)
	resumed := time.Now()
	var back time.Duration
	waitFor(t, 5*time.Second, "a holds the address again", func() bool {
		if tp.holds("a") {
			back = time.Since(resumed)
			return true
		}
		return false
	})
	waitFor(t, 5*time.Second, "a logs that it kept the addresses", func() bool {
		return strings.Contains(a.logs.String()[logged:], "no newer claim was waiting: keeping the addresses")
	})
	if after := a.logs.String()[logged:]; a.role() != "active" || strings.Contains(after, "stepping down") || strings.Contains(after, "-address "+haLB) {
		t.Errorf("after SIGCONT: role %s, want active throughout; log:\n%s", a.role(), after)
	}
	t.Logf("figure: ha_stall_alone_back_ms=%d (SIGCONT -> the address on net1 again; stopped past the dead interval and the %s lease, no standby left)", back.Milliseconds(), haLease)
}

// TestHARenewalAfterNet1Recreated: the active renews its addresses' lifetime on the net1 it
// looked up once. net1 is deleted in the active's pod: its election sees the link gone and steps
// down, and the standby takes over. net1 is made again (a new interface index); when the standby
// resigns, the first replica takes the addresses on the new net1, and its renewals keep them
// there on the lease: the first renewal, on the old index, fails and is made again on the new
// one, so no renewal failure is counted from its takeover on, and it stays active. (Deleted and made again at once,
// net1 may come back between two of the election's link polls: which of the two paths follows
// is then a race, so the test waits for the step-down before it makes net1 again.)
func TestHARenewalAfterNet1Recreated(t *testing.T) {
	tp, a, b := startStallPair(t)
	index := func() string {
		out := mustRun(t, "ip", "-n", tp.pod["a"], "-o", "link", "show", "net1")
		m := regexp.MustCompile(`(?m)^(\d+): net1`).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("no net1 in %q", out)
		}
		return m[1]
	}
	before := index()
	mustRun(t, "ip", "-n", tp.pod["a"], "link", "del", "net1")
	waitFor(t, 5*time.Second, "b takes over from a, whose net1 is gone", func() bool {
		return a.role() == "standby" && b.role() == "active" && tp.holds("b")
	})
	mustRun(t, "ip", "-n", tp.node["a"], "link", "add", "link", "up0", "name", "net1", "type", "macvlan", "mode", "bridge")
	mustRun(t, "ip", "-n", tp.node["a"], "link", "set", "net1", "netns", tp.pod["a"])
	mustRun(t, "ip", "-n", tp.pod["a"], "link", "set", "net1", "up")
	if after := index(); after == before {
		t.Fatalf("net1 kept its index %s", before)
	}
	waitFor(t, 10*time.Second, "a is a ready standby on the new net1", func() bool {
		return a.role() == "standby" && strings.Contains(tp.metrics("a"), "\nlbpod_ready 1\n")
	})
	failures := regexp.MustCompile(`\nlbpod_ha_lifetime_renewal_failures_total (\d+)\n`)
	failed := func() string {
		m := failures.FindStringSubmatch(tp.metrics("a"))
		if m == nil {
			t.Fatalf("no lbpod_ha_lifetime_renewal_failures_total on a")
		}
		return m[1]
	}
	// A renewal that came before the election saw net1 gone failed, rightly: counted from here.
	failedBefore := failed()
	_ = b.cmd.Process.Signal(syscall.SIGTERM)
	leaseSecs := uint32(haLease / time.Second)
	waitFor(t, 5*time.Second, "a holds the address again, on the lease", func() bool {
		ok, _ := onLifetime(lifetimes(t, tp.pod["a"]), leaseSecs, haLB)
		return a.role() == "active" && ok
	})
	// Several renewals (one per quarter lease): the address stays, on the lease, and a stays active.
	for deadline := time.Now().Add(2 * haLease); time.Now().Before(deadline); time.Sleep(haLease / 8) { // bounded sampling
		if ok, got := onLifetime(lifetimes(t, tp.pod["a"]), leaseSecs, haLB); !ok || a.role() != "active" {
			t.Fatalf("a's lifetimes %s, role %s: want the address on the %s lease, active", got, a.role(), haLease)
		}
	}
	if got := failed(); got != failedBefore {
		t.Errorf("renewal failures on a on the new net1: %s, before it took over %s", got, failedBefore)
	}
}
