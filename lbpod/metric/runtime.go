package metric

import (
	"bytes"
	"os"
	"runtime"
	"runtime/metrics"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Runtime is the Go runtime's and the process's families under the names client_golang's Go and
// process collectors give them, those an lb pod is watched by: goroutines, heap, memory from the
// OS, the GC's goal and settings; CPU, resident and virtual memory, file descriptors, start time.
func Runtime() []Collector {
	read := func(name string) func() float64 {
		return func() float64 {
			s := []metrics.Sample{{Name: name}}
			metrics.Read(s)
			switch s[0].Value.Kind() {
			case metrics.KindUint64:
				return float64(s[0].Value.Uint64())
			case metrics.KindFloat64:
				return s[0].Value.Float64()
			}
			return 0
		}
	}
	heapObjects := read("/memory/classes/heap/objects:bytes")
	heapUnused := read("/memory/classes/heap/unused:bytes")
	info := NewGaugeVec(Opts{Name: "go_info", Help: "Information about the Go environment."}, []string{"version"})
	info.WithLabelValues(runtime.Version()).Set(1)
	start := processStart()
	return []Collector{
		info,
		NewGaugeFunc(Opts{Name: "go_goroutines", Help: "Number of goroutines that currently exist."},
			func() float64 { return float64(runtime.NumGoroutine()) }),
		NewGaugeFunc(Opts{Name: "go_memstats_heap_alloc_bytes", Help: "Number of heap bytes allocated and currently in use."}, heapObjects),
		NewGaugeFunc(Opts{Name: "go_memstats_heap_inuse_bytes", Help: "Number of heap bytes that are in use."},
			func() float64 { return heapObjects() + heapUnused() }),
		NewGaugeFunc(Opts{Name: "go_memstats_sys_bytes", Help: "Number of bytes obtained from system."}, read("/memory/classes/total:bytes")),
		NewGaugeFunc(Opts{Name: "go_memstats_next_gc_bytes", Help: "Number of heap bytes when next garbage collection will take place."}, read("/gc/heap/goal:bytes")),
		NewGaugeFunc(Opts{Name: "go_gc_gogc_percent", Help: "Heap size target percentage configured by the user, otherwise 100."}, read("/gc/gogc:percent")),
		NewGaugeFunc(Opts{Name: "go_gc_gomemlimit_bytes", Help: "Go runtime memory limit configured by the user, otherwise math.MaxInt64."}, read("/gc/gomemlimit:bytes")),
		NewCounterFunc(Opts{Name: "go_gc_cycles_total", Help: "Garbage collection cycles completed."}, read("/gc/cycles/total:gc-cycles")),
		NewCounterFunc(Opts{Name: "process_cpu_seconds_total", Help: "Total user and system CPU time spent in seconds."}, func() float64 {
			var ru syscall.Rusage
			if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
				return 0
			}
			return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
		}),
		NewGaugeFunc(Opts{Name: "process_resident_memory_bytes", Help: "Resident memory size in bytes."}, func() float64 { return statm(1) }),
		NewGaugeFunc(Opts{Name: "process_virtual_memory_bytes", Help: "Virtual memory size in bytes."}, func() float64 { return statm(0) }),
		NewGaugeFunc(Opts{Name: "process_open_fds", Help: "Number of open file descriptors."}, func() float64 {
			fds, err := os.ReadDir("/proc/self/fd")
			if err != nil {
				return 0
			}
			return float64(len(fds))
		}),
		NewGaugeFunc(Opts{Name: "process_max_fds", Help: "Maximum number of open file descriptors."}, func() float64 {
			var l syscall.Rlimit
			if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l) != nil {
				return 0
			}
			return float64(l.Cur)
		}),
		NewGaugeFunc(Opts{Name: "process_start_time_seconds", Help: "Start time of the process since unix epoch in seconds."},
			func() float64 { return start }),
	}
}

// statm is field i of /proc/self/statm (0: size, 1: resident) in bytes.
func statm(i int) float64 {
	data, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	fields := strings.Fields(string(data))
	if len(fields) <= i {
		return 0
	}
	pages, err := strconv.ParseFloat(fields[i], 64)
	if err != nil {
		return 0
	}
	return pages * float64(os.Getpagesize())
}

// processStart is when this process started, in seconds since the epoch: its start in clock ticks
// after boot (/proc/self/stat, field 22; USER_HZ is 100 on Linux) plus the boot time (/proc/stat
// btime). Zero when either cannot be read.
func processStart() float64 {
	stat, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return 0
	}
	// The command name (field 2) is in parentheses and may hold spaces: count from its end.
	rest := stat[bytes.LastIndexByte(stat, ')')+1:]
	fields := strings.Fields(string(rest))
	if len(fields) < 20 { // fields 3 onwards: starttime is the 20th of them
		return 0
	}
	ticks, err := strconv.ParseFloat(fields[19], 64)
	if err != nil {
		return 0
	}
	sys, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(sys), "\n") {
		if v, ok := strings.CutPrefix(line, "btime "); ok {
			btime, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				return 0
			}
			return btime + ticks/100
		}
	}
	return 0
}
