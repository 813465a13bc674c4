// Command operator-bench measures the operator against a real kube-apiserver and etcd, the
// operator running as its own process:
//
//   - the time until N annotated LoadBalancer Services created at once all show an address, and,
//     as a floor from the same run, the time the API server alone takes to create and list N
//     Services, and the time it alone takes to also create one IP object per Service and patch each
//     Service's status with its address (the writes an operator of this design cannot skip);
//   - the operator's peak RSS (VmHWM), after the burst and after the latency phase;
//   - the API writes per Service by kind (verb, resource, response code), counted by the API
//     server itself (apiserver_request_total), with their mean server-side latency;
//   - p50/p99 of one Service's creation → ingress over sequential creations while the N others
//     are served.
//
// Every result is printed as a `figure: name=value` line. With -unrelated K the cluster also
// holds K unrelated ConfigMaps, pods and Deployments each (memory must not grow with them).
// With -profile DIR a CPU profile of the burst and a heap profile after it are written there.
//
// Run by hack/bench-operator.sh (make bench-operator); needs KUBEBUILDER_ASSETS.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/lbsvc/lbsvc-operator/controllers"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "operator-bench:", err)
		os.Exit(1)
	}
}

// provider is the attachment provider of the bench's Services (NAD lb-svc-attachment in "bench").
const provider = "lb-svc-attachment.bench"

type config struct {
	operatorBin  string
	operatorArgs string
	goMemLimit   string
	goGC         string
	n            int
	workers      int
	latencyRuns  int
	unrelated    int
	profileDir   string
	profileSecs  int
	rbacProbe    bool
	deadline     time.Duration
}

func run() error {
	var cfg config
	flag.StringVar(&cfg.operatorBin, "operator", "bin/lbsvc-operator", "operator binary to run")
	flag.StringVar(&cfg.operatorArgs, "operator-args", "", "more operator flags, space-separated")
	flag.StringVar(&cfg.goGC, "gogc", "", "GOGC of the operator process, as the shipped Deployment sets it (empty: unset, the runtime's 100)")
	flag.StringVar(&cfg.goMemLimit, "gomemlimit", "", "GOMEMLIMIT of the operator process, as the shipped Deployment sets it from its memory limit (e.g. 512MiB; empty: unset)")
	flag.IntVar(&cfg.n, "n", 1000, "number of Services created at once")
	flag.IntVar(&cfg.workers, "workers", 16, "parallel creators")
	flag.IntVar(&cfg.latencyRuns, "latency", 100, "sequential creations timed after the burst (0: skip)")
	flag.IntVar(&cfg.unrelated, "unrelated", 0, "unrelated ConfigMaps, pods and Deployments (each) created before the operator starts")
	flag.StringVar(&cfg.profileDir, "profile", "", "write cpu.pprof (the burst) and heap.pprof (after it) of the operator here")
	flag.IntVar(&cfg.profileSecs, "profile-seconds", 30, "length of the CPU profiles from the start of the burst, and of the API server's from the start of the design floor (kube-apiserver-designfloor-cpu.pprof; shorter than both phases to compare them)")
	flag.DurationVar(&cfg.deadline, "timeout", 15*time.Minute, "give up after this long")
	flag.BoolVar(&cfg.rbacProbe, "rbac-probe", false, "only time RoleBinding creates as the operator and as system:masters in a namespace holding up to -n RoleBindings")
	flag.Parse()
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		return fmt.Errorf("KUBEBUILDER_ASSETS is not set (make bench-operator sets it)")
	}

	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("config", "crd", "bases"), filepath.Join("test", "integration", "testdata")},
		ErrorIfCRDPathMissing: true,
	}
	// Room for the ClusterIPs of every Service (the default /24 holds 254).
	env.ControlPlane.GetAPIServer().Configure().Set("service-cluster-ip-range", "10.96.0.0/12")
	rc, err := env.Start()
	if err != nil {
		return fmt.Errorf("start kube-apiserver and etcd: %w", err)
	}
	defer func() { _ = env.Stop() }()
	// The bench's own client must never be the bottleneck it measures.
	rc.QPS, rc.Burst = -1, 0
	scheme, err := controllers.NewScheme()
	if err != nil {
		return err
	}
	c, err := client.NewWithWatch(rc, client.Options{Scheme: scheme})
	if err != nil {
		return err
	}
	// Interrupted or terminated, the bench ends its requests and returns, so that the deferred
	// stops take the operator, kube-apiserver and etcd down with it.
	sigCtx, stopSignals := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stopSignals()
	ctx, cancel := context.WithTimeout(sigCtx, cfg.deadline)
	defer cancel()
	fig := func(name string, format string, args ...any) {
		fmt.Printf("figure: %s=%s\n", name, fmt.Sprintf(format, args...))
	}
	if cfg.rbacProbe {
		return rbacProbe(ctx, env, c, cfg, fig)
	}
	if cfg.profileDir != "" {
		if err := os.MkdirAll(cfg.profileDir, 0o755); err != nil {
			return err
		}
	}
	fig("services", "%d", cfg.n)

	cp := findControlPlane()
	if len(cp) != 2 {
		fmt.Printf("kube-apiserver and etcd not found among this process' children (%v): no CPU split\n", cp)
	}
	cpuFloor0 := cp.cpu(nil)
	var cpuFloor1 map[string]float64
	floor, err := measureFloor(ctx, c, cfg, func() { cpuFloor1 = cp.cpu(nil) })
	if err != nil {
		return err
	}
	fig("floor_seconds", "%.2f", floor.Seconds())
	reportCPU(fig, "floor", cpuFloor0, cpuFloor1)
	// The writes any design that keeps one API object per address adds at the least, done by the
	// same run's API server alone for every Service: what is left of the target for the rest.
	addressed, err := measureAddressedFloor(ctx, c, cfg)
	if err != nil {
		return err
	}
	fig("addressed_floor_seconds", "%.2f", addressed.Seconds())
	fig("addressed_floor_ratio_to_floor", "%.2f", addressed.Seconds()/floor.Seconds())
	// Every write the operator makes per Service, done by the API server alone: the least an
	// operator making these objects can cost here, whatever it does between them.
	designBefore, err := apiMetrics(ctx, rc)
	if err != nil {
		return err
	}
	// The API server's profile of the design floor, to set beside the burst's: what it does for
	// the operator beyond the same writes.
	var designProf chan error
	if cfg.profileDir != "" {
		designProf = make(chan error, 1)
		go func() {
			designProf <- saveAPIServerProfile(ctx, rc, cfg.profileSecs, filepath.Join(cfg.profileDir, "kube-apiserver-designfloor-cpu.pprof"))
		}()
	}
	cpuDesign0 := cp.cpu(nil)
	var cpuDesign1 map[string]float64
	var designAfter map[string]requestStat
	var designErr error
	design, err := measureDesignFloor(ctx, c, cfg, func() {
		cpuDesign1 = cp.cpu(nil)
		designAfter, designErr = apiMetrics(ctx, rc)
	})
	if err != nil {
		return err
	}
	if designErr != nil {
		return designErr
	}
	if designProf != nil {
		if err := <-designProf; err != nil {
			return err
		}
	}
	// The API server's count, less each Service's create.
	fig("design_floor_writes_per_service", "%.2f", (writesBetween(designBefore, designAfter)-float64(cfg.n))/float64(cfg.n))
	fig("design_floor_seconds", "%.2f", design.Seconds())
	fig("design_floor_ratio_to_floor", "%.2f", design.Seconds()/floor.Seconds())
	reportCPU(fig, "design_floor", cpuDesign0, cpuDesign1)
	// What the target allows on this machine: all its cores for 2.5 floors.
	fig("cpu_seconds_within_target", "%.2f", 2.5*floor.Seconds()*float64(runtime.NumCPU()))

	if cfg.unrelated > 0 {
		start := time.Now()
		if err := createUnrelated(ctx, c, cfg.unrelated, cfg.workers); err != nil {
			return err
		}
		fig("unrelated_objects", "%d", 3*cfg.unrelated)
		fmt.Printf("created %d unrelated ConfigMaps, pods and Deployments in %s\n", 3*cfg.unrelated, time.Since(start).Round(time.Millisecond))
	}

	op, err := startOperator(ctx, env, c, cfg)
	if err != nil {
		return err
	}
	defer op.stop()

	// Every Service of the bench is watched from before its creation: the moment its ingress
	// first shows is taken from the watch, never from polling (which would load the API server
	// the bench measures).
	seen := newIngressWatch()
	for _, ns := range []string{"bench", "bench-latency"} {
		if err := seen.start(ctx, c, ns); err != nil {
			return err
		}
	}
	// The operator is ready once the seed Service it was given before the burst is served.
	if err := createService(ctx, c, "bench", "warmup", provider); err != nil {
		return err
	}
	if _, err := seen.wait(ctx, "bench/warmup"); err != nil {
		return fmt.Errorf("operator never served the warm-up Service (log: %s): %w", op.logPath, err)
	}

	// Scraped before the API server's counters are read: the scrape's TokenReview and
	// SubjectAccessReview are not the operator's work.
	recBefore, recErr := op.reconciles(ctx)
	before, err := apiMetrics(ctx, rc)
	if err != nil {
		return err
	}
	var profDone chan error
	if cfg.profileDir != "" {
		profDone = make(chan error, 2)
		go func() {
			profDone <- op.saveProfile(ctx, fmt.Sprintf("/debug/pprof/profile?seconds=%d", cfg.profileSecs), filepath.Join(cfg.profileDir, "cpu.pprof"))
		}()
		go func() {
			profDone <- saveAPIServerProfile(ctx, rc, cfg.profileSecs, filepath.Join(cfg.profileDir, "kube-apiserver-cpu.pprof"))
		}()
	}
	cpuBurst0 := cp.cpu(op)
	start := time.Now()
	names, err := createServices(ctx, c, "bench", provider, cfg.n, cfg.workers)
	if err != nil {
		return err
	}
	created := time.Since(start)
	var last time.Time
	lat := make([]time.Duration, 0, len(names))
	for _, name := range names {
		at, err := seen.wait(ctx, "bench/"+name.name)
		if err != nil {
			return fmt.Errorf("only %d of %d Services got an address (log: %s): %w", seen.count("bench/"), cfg.n, op.logPath, err)
		}
		if at.After(last) {
			last = at
		}
		lat = append(lat, at.Sub(name.created))
	}
	all := last.Sub(start)
	fig("create_seconds", "%.2f", created.Seconds())
	fig("all_addressed_seconds", "%.2f", all.Seconds())
	fig("ratio_to_floor", "%.2f", all.Seconds()/floor.Seconds())
	// The figure: against the design floor measured in the same run (which itself moves
	// by a third between runs on this machine: compare several runs, not one).
	fig("all_addressed_ratio_to_design_floor", "%.2f", all.Seconds()/design.Seconds())
	fig("burst_create_to_ingress_p50_ms", "%.0f", ms(percentile(lat, 50)))
	fig("burst_create_to_ingress_p99_ms", "%.0f", ms(percentile(lat, 99)))
	fig("peak_rss_after_burst_mib", "%.1f", float64(op.peakKiB())/1024)
	cpuBurst1 := cp.cpu(op)
	fig("operator_cpu_seconds_burst", "%.2f", cpuBurst1["operator"]-cpuBurst0["operator"])
	reportCPU(fig, "burst", cpuBurst0, cpuBurst1)

	// The operator finishes its per-Service objects after the last address shows: count its
	// writes once they stop changing.
	after, err := settle(ctx, rc)
	if err != nil {
		return err
	}
	settled := time.Since(start)
	fig("all_settled_seconds", "%.2f", settled.Seconds())
	fig("rss_settled_mib", "%.1f", float64(op.rssKiB())/1024)
	// The file-backed part is the binary's pages in use, which no GC setting changes.
	fig("rss_settled_anon_mib", "%.1f", float64(procStatus(op.cmd.Process.Pid, "RssAnon:"))/1024)
	fig("rss_settled_file_mib", "%.1f", float64(procStatus(op.cmd.Process.Pid, "RssFile:"))/1024)
	if cfg.profileDir != "" {
		if err := op.saveProfile(ctx, "/debug/pprof/heap?gc=1", filepath.Join(cfg.profileDir, "heap.pprof")); err != nil {
			return err
		}
		for range 2 {
			if err := <-profDone; err != nil {
				return err
			}
		}
		fmt.Printf("profiles: %s/cpu.pprof and %s/kube-apiserver-cpu.pprof (first %d s of the burst), %s/kube-apiserver-designfloor-cpu.pprof (of the design floor), %s/heap.pprof\n", cfg.profileDir, cfg.profileDir, cfg.profileSecs, cfg.profileDir, cfg.profileDir)
	}
	// The bench itself created the n Services: not the operator's writes.
	report(fig, before, after, cfg.n, map[string]float64{"POST services 201": float64(cfg.n)})
	if recAfter, err := op.reconciles(ctx); err == nil && recErr == nil {
		keys := make([]string, 0, len(recAfter))
		for k := range recAfter {
			if recAfter[k] > recBefore[k] {
				keys = append(keys, k)
			}
		}
		sort.Strings(keys)
		for _, k := range keys {
			controller, result, _ := strings.Cut(k, " ")
			fig("reconciles_per_service{controller="+controller+",result="+result+"}", "%.2f", (recAfter[k]-recBefore[k])/float64(cfg.n))
		}
	} else {
		fmt.Printf("reconcile counts unavailable (operator metrics endpoint): %v %v\n", recErr, err)
	}

	if cfg.latencyRuns > 0 {
		lat := make([]time.Duration, 0, cfg.latencyRuns)
		for i := 0; i < cfg.latencyRuns; i++ {
			name := "lat-" + strconv.Itoa(i)
			t0 := time.Now()
			if err := createService(ctx, c, "bench-latency", name, provider); err != nil {
				return err
			}
			at, err := seen.wait(ctx, "bench-latency/"+name)
			if err != nil {
				return fmt.Errorf("latency Service %s (log: %s): %w", name, op.logPath, err)
			}
			lat = append(lat, at.Sub(t0))
		}
		fig("served_while_timing", "%d", cfg.n)
		fig("create_to_ingress_runs", "%d", len(lat))
		fig("create_to_ingress_p50_ms", "%.1f", ms(percentile(lat, 50)))
		fig("create_to_ingress_p99_ms", "%.1f", ms(percentile(lat, 99)))
		fig("create_to_ingress_max_ms", "%.1f", ms(percentile(lat, 100)))
	}
	fig("peak_rss_mib", "%.1f", float64(op.peakKiB())/1024)
	if err := op.alive(); err != nil {
		return err
	}
	fmt.Printf("operator log: %s (kept)\n", op.logPath)
	return nil
}
