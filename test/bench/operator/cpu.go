package main

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// controlPlane is the kube-apiserver and etcd processes envtest started for this bench, found as
// this process' children by name, so that the CPU each uses in a phase can be told apart from the
// operator's and the bench's own: on a small machine they share the same cores.
type controlPlane map[string]int

func findControlPlane() controlPlane {
	cp := controlPlane{}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return cp
	}
	self := strconv.Itoa(os.Getpid())
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		name, rest, ok := strings.Cut(string(b), ") ")
		if !ok {
			continue
		}
		_, comm, _ := strings.Cut(name, " (")
		f := strings.Fields(rest)
		if len(f) < 2 || f[1] != self {
			continue
		}
		if comm == "kube-apiserver" || comm == "etcd" {
			cp[comm] = pid
		}
	}
	return cp
}

// cpu returns the CPU seconds used so far by each control-plane process, the operator (when not
// nil) and the bench itself, and the machine's busy and steal time (machineBusy, machineSteal).
func (cp controlPlane) cpu(op *operator) map[string]float64 {
	out := map[string]float64{"bench": cpuSecondsOf(os.Getpid())}
	for name, pid := range cp {
		out[name] = cpuSecondsOf(pid)
	}
	if op != nil {
		out["operator"] = op.cpuSeconds()
	}
	busy, steal := machineCPU()
	out[machineBusy], out[machineSteal] = busy, steal
	return out
}

// The machine's own counters in cpu's map (not processes): all CPU time spent busy, by anyone,
// and the time the hypervisor gave to other guests while this one wanted to run (steal). A phase
// that ran slow with the same work shows where the time went: others on this machine, or none
// given to it.
const (
	machineBusy  = "machine:busy"
	machineSteal = "machine:steal"
)

// machineCPU reads /proc/stat's first line: busy (user, nice, system, irq, softirq) and steal,
// in seconds (0 when unreadable).
func machineCPU() (busy, steal float64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0, 0
	}
	v := func(i int) float64 { x, _ := strconv.ParseFloat(f[i], 64); return x / 100 } // USER_HZ
	return v(1) + v(2) + v(3) + v(6) + v(7), v(8)
}

// cpuSecondsOf is the CPU time (user + system) process pid has used so far (0 when unreadable).
func cpuSecondsOf(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command name (field 2) may hold spaces: count fields after its closing parenthesis.
	_, rest, _ := strings.Cut(string(b), ") ")
	f := strings.Fields(rest)
	if len(f) < 13 {
		return 0
	}
	utime, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	return (utime + stime) / 100 // USER_HZ
}

// reportCPU prints the CPU seconds each process used between two cpu() readings.
func reportCPU(fig func(string, string, ...any), phase string, before, after map[string]float64) {
	names := make([]string, 0, len(after))
	for k := range after {
		names = append(names, k)
	}
	sort.Strings(names)
	total := 0.0
	for _, k := range names {
		if strings.HasPrefix(k, "machine:") {
			continue
		}
		d := after[k] - before[k]
		total += d
		fig(phase+"_cpu_seconds{process="+k+"}", "%.2f", d)
	}
	fig(phase+"_cpu_seconds{process=all}", "%.2f", total)
	// Busy time not ours: other processes of this machine (a build, a leftover cluster).
	fig(phase+"_machine_cpu_seconds{kind=others}", "%.2f", max(0, after[machineBusy]-before[machineBusy]-total))
	fig(phase+"_machine_cpu_seconds{kind=steal}", "%.2f", after[machineSteal]-before[machineSteal])
}

// saveAPIServerProfile writes a CPU profile of the kube-apiserver over the next secs seconds
// (its /debug/pprof, on by default, as the bench's admin).
func saveAPIServerProfile(ctx context.Context, rc *rest.Config, secs int, file string) error {
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	b, err := cs.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").
		Param("seconds", strconv.Itoa(secs)).Timeout(time.Duration(secs+60) * time.Second).DoRaw(ctx)
	if err != nil {
		return fmt.Errorf("kube-apiserver profile: %w", err)
	}
	return os.WriteFile(file, b, 0o644)
}
