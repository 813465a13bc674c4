//go:build dataplane

package dataplane

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
)

// cpuTicks returns a process's user+system CPU time in clock ticks, from /proc/<pid>/stat.
func cpuTicks(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the ")" that closes the command name: state is field 3, utime 14, stime 15.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	u, err := strconv.ParseInt(f[11], 10, 64)
	if err != nil {
		return 0, err
	}
	s, err := strconv.ParseInt(f[12], 10, 64)
	return u + s, err
}

// memory is a process's memory in KiB, from /proc/<pid>/smaps_rollup. RSS counts the binary's clean
// file pages in every process that maps them, PSS shares them out among those processes, private
// (clean and dirty) is what one more process costs: its anonymous memory (heap, stacks, written
// data: anon) and the binary's pages that no other process maps.
type memory struct{ rss, pss, private, anon int64 }

func memoryOf(pid int) (memory, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return memory{}, err
	}
	var m memory
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 || f[2] != "kB" {
			continue
		}
		n, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			return memory{}, fmt.Errorf("/proc/%d/smaps_rollup: %q: %w", pid, line, err)
		}
		switch f[0] {
		case "Rss:":
			m.rss = n
		case "Pss:":
			m.pss = n
		case "Private_Clean:", "Private_Dirty:":
			m.private += n
		case "Anonymous:":
			m.anon = n
		}
	}
	if m.rss == 0 {
		return memory{}, fmt.Errorf("/proc/%d/smaps_rollup: no Rss", pid)
	}
	return m, nil
}

// reportMemory reports a process's memory (memoryOf) as benchmark metrics named after who.
func reportMemory(b *testing.B, who string, pid int) {
	m, err := memoryOf(pid)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(m.rss), who+"-rss-KiB")
	b.ReportMetric(float64(m.pss), who+"-pss-KiB")
	b.ReportMetric(float64(m.private), who+"-private-KiB")
	b.ReportMetric(float64(m.anon), who+"-anon-KiB")
}

// BenchmarkIdleCPU: CPU time one ready lbpod (10 ports, default resync and announce periods)
// uses over 60 s with nothing changing. Ticks are 10 ms (USER_HZ 100). With iptables-nft the
// resyncs read no iptables table unless the kernel announced a ruleset change.
func BenchmarkIdleCPU(b *testing.B) {
	for _, rules := range []struct {
		name  string
		flags []string
	}{{"iptables", iptRules}, {"nftables", nil}} {
		b.Run("rules="+rules.name, func(b *testing.B) { benchIdleCPU(b, rules.flags) })
	}
}

func benchIdleCPU(b *testing.B, rules []string) {
	for range b.N {
		g := NewWithT(b)
		tp := newTopology(b)
		svc := filepath.Join(b.TempDir(), "svc.yaml")
		writeService(b, svc, []string{clusterIPv4}, tcpPorts(10000, 10), nil)
		// The file source's polling is the test harness's, not the lb pod's (in a cluster the
		// Service comes from a watch that is silent while it does not change): slowed down here
		// so that the figure is the loop's own cost.
		p := tp.startLBPod(svc, "v4", append([]string{"--service-file-poll", "1h"}, rules...)...)
		g.Eventually(func() []time.Duration { return appliedTimes(p.logs.String()) }).
			WithTimeout(30 * time.Second).WithPolling(20 * time.Millisecond).Should(HaveLen(1))
		pid := p.cmd.Process.Pid
		before, err := cpuTicks(pid)
		g.Expect(err).NotTo(HaveOccurred())
		time.Sleep(60 * time.Second) // the measurement window itself, not a wait for a condition
		after, err := cpuTicks(pid)
		g.Expect(err).NotTo(HaveOccurred())
		b.ReportMetric(float64(after-before)*10, "idle-cpu-ms-per-60s")
	}
}
