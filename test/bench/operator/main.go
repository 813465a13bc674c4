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
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
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
	flag.IntVar(&cfg.profileSecs, "profile-seconds", 30, "length of the CPU profile from the start of the burst")
	flag.DurationVar(&cfg.deadline, "timeout", 15*time.Minute, "give up after this long")
	flag.BoolVar(&cfg.rbacProbe, "rbac-probe", false, "only time Role and RoleBinding creates as the operator and as system:masters in a namespace holding up to -n RoleBindings")
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
		fmt.Printf("profiles: %s/cpu.pprof and %s/kube-apiserver-cpu.pprof (first %d s of the burst), %s/heap.pprof\n", cfg.profileDir, cfg.profileDir, cfg.profileSecs, cfg.profileDir)
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

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// percentile is the nearest-rank percentile p (0 < p <= 100) of ds.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	rank := int(math.Ceil(p / 100 * float64(len(s))))
	return s[max(rank, 1)-1]
}

// timeFloor times one floor: in namespace ns (created here), each of n Services gets its writes
// from each (in parallel, cfg.workers at a time), then the Services are listed back; timed is
// called as the time is taken. Everything objectsOf(i) names is deleted afterwards, before the
// operator starts, so that it never sees them.
func timeFloor(ctx context.Context, c client.Client, cfg config, ns string, each func(i int) error,
	objectsOf func(i int) []client.Object, timed func()) (time.Duration, error) {
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		return 0, err
	}
	start := time.Now()
	if err := parallel(ctx, cfg.n, cfg.workers, each); err != nil {
		return 0, fmt.Errorf("%s: %w", ns, err)
	}
	if err := listBack(ctx, c, ns, cfg.n); err != nil {
		return 0, fmt.Errorf("%s: %w", ns, err)
	}
	took := time.Since(start)
	if timed != nil {
		timed()
	}
	if err := deleteEach(ctx, c, cfg, objectsOf); err != nil {
		return 0, fmt.Errorf("%s: %w", ns, err)
	}
	return took, nil
}

// floorService is the i-th Service of a floor in ns, by name only (for deletes).
func floorService(ns string, i int) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "svc-" + strconv.Itoa(i)}}
}

// measureFloor is the API server alone creating n LoadBalancer Services and listing them back.
func measureFloor(ctx context.Context, c client.Client, cfg config, timed func()) (time.Duration, error) {
	const ns = "bench-floor"
	return timeFloor(ctx, c, cfg, ns,
		func(i int) error { return createService(ctx, c, ns, "svc-"+strconv.Itoa(i), "") },
		func(i int) []client.Object { return []client.Object{floorService(ns, i)} }, timed)
}

// deleteEach deletes objectsOf(i) for i in 0..n-1, one by one in parallel: a collection delete of
// 10,000 Services outlasts the API server's request timeout.
func deleteEach(ctx context.Context, c client.Client, cfg config, objectsOf func(int) []client.Object) error {
	return parallel(ctx, cfg.n, cfg.workers, func(i int) error {
		for _, o := range objectsOf(i) {
			if err := c.Delete(ctx, o); err != nil {
				return fmt.Errorf("delete %T %s: %w", o, o.GetName(), err)
			}
		}
		return nil
	})
}

// measureAddressedFloor is the API server alone doing, for each of n Services, the writes that
// any design holding one API object per address needs before the address shows
// (createAddressed), ending with the same list as measureFloor. The addresses (100.64.0.0/10) are
// outside the bench's Subnet.
func measureAddressedFloor(ctx context.Context, c client.Client, cfg config) (time.Duration, error) {
	const ns = "bench-floor-addressed"
	return timeFloor(ctx, c, cfg, ns,
		func(i int) error { _, _, err := createAddressed(ctx, c, ns, i); return err },
		func(i int) []client.Object {
			return []client.Object{floorService(ns, i), &lbv1.IP{ObjectMeta: metav1.ObjectMeta{Name: lbv1.IPName(floorAddr(i))}}}
		}, nil)
}

// floorAddr is the address the floors give their i-th Service: outside the bench's Subnet.
func floorAddr(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{100, 64 + byte(i>>16), byte(i >> 8), byte(i)})
}

// createAddressed creates the i-th Service of ns and its IP object (floorAddr(i)), and patches the
// Service's status with the ingress and a condition as the operator's merge patch does: the writes
// any design that keeps one API object per address makes before the address shows.
func createAddressed(ctx context.Context, c client.Client, ns string, i int) (*corev1.Service, *lbv1.IP, error) {
	svc := serviceObject(ns, "svc-"+strconv.Itoa(i), "")
	if err := c.Create(ctx, svc); err != nil {
		return nil, nil, fmt.Errorf("create service %s: %w", svc.Name, err)
	}
	addr := floorAddr(i)
	ip := &lbv1.IP{
		ObjectMeta: metav1.ObjectMeta{Name: lbv1.IPName(addr), Labels: map[string]string{"bench": ns}},
		Spec: lbv1.IPSpec{Address: addr.String(), Subnet: "bench-floor",
			Service: lbv1.IPOwner{Namespace: ns, Name: svc.Name, UID: string(svc.UID)}},
	}
	if err := c.Create(ctx, ip); err != nil {
		return nil, nil, fmt.Errorf("create IP %s: %w", ip.Name, err)
	}
	before := svc.DeepCopy()
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: addr.String()}}
	meta.SetStatusCondition(&svc.Status.Conditions, metav1.Condition{Type: controllers.ConditionAddressAllocated, Status: metav1.ConditionTrue,
		Reason: controllers.ReasonAllocated, Message: addr.String() + " from subnet bench-floor", ObservedGeneration: svc.Generation})
	if err := c.Status().Patch(ctx, svc, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		return nil, nil, fmt.Errorf("patch status of %s: %w", svc.Name, err)
	}
	return svc, ip, nil
}

// operator is the operator process under test.
type operator struct {
	cmd         *exec.Cmd
	logPath     string
	pprofAddr   string
	metricsAddr string
	// metricsToken is the bearer token the metrics endpoint accepts (metricsToken).
	metricsToken string
	exited       chan error
}

func startOperator(ctx context.Context, env *envtest.Environment, c client.Client, cfg config) (*operator, error) {
	user, err := operatorUser(ctx, env, c)
	if err != nil {
		return nil, err
	}
	kubeconfig, err := user.KubeConfig()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "operator-bench-")
	if err != nil {
		return nil, err
	}
	kcPath := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kcPath, kubeconfig, 0o600); err != nil {
		return nil, err
	}
	for _, obj := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "bench"}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "bench-latency"}},
		&nadv1.NetworkAttachmentDefinition{ObjectMeta: metav1.ObjectMeta{Name: "lb-svc-attachment", Namespace: "bench"},
			Spec: nadv1.NetworkAttachmentDefinitionSpec{Config: `{"cniVersion":"0.3.0","type":"macvlan","master":"eth0","mode":"bridge"}`}},
		// A /14 holds the 10,000-Service variant with room to spare.
		&lbv1.Subnet{ObjectMeta: metav1.ObjectMeta{Name: "bench-subnet"}, Spec: lbv1.SubnetSpec{
			Protocol: lbv1.ProtocolIPv4, Provider: provider, CIDRBlock: "172.16.0.0/14", Gateway: "172.16.0.1"}},
	} {
		if err := c.Create(ctx, obj); err != nil {
			return nil, fmt.Errorf("create %s: %w", obj.GetName(), err)
		}
	}
	token, err := metricsToken(ctx, c, env.Config)
	if err != nil {
		return nil, err
	}
	metricsAddr, err := freeLocalAddr()
	if err != nil {
		return nil, err
	}
	pprofAddr := "0"
	if cfg.profileDir != "" {
		if pprofAddr, err = freeLocalAddr(); err != nil {
			return nil, err
		}
		if err := os.MkdirAll(cfg.profileDir, 0o755); err != nil {
			return nil, err
		}
	}
	logFile, err := os.Create(filepath.Join(dir, "operator.log"))
	if err != nil {
		return nil, err
	}
	args := []string{"--kubeconfig", kcPath, "--enable-lb-svc=true",
		"--metrics-bind-address=" + metricsAddr, "--health-probe-bind-address=0", "--pprof-bind-address=" + pprofAddr}
	args = append(args, strings.Fields(cfg.operatorArgs)...)
	cmd := exec.Command(cfg.operatorBin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Only the operator gets the soft limit, not the bench process measuring it.
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "GOMEMLIMIT=") || strings.HasPrefix(kv, "GOGC=")
	})
	if cfg.goMemLimit != "" {
		cmd.Env = append(cmd.Env, "GOMEMLIMIT="+cfg.goMemLimit)
	}
	if cfg.goGC != "" {
		cmd.Env = append(cmd.Env, "GOGC="+cfg.goGC)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", cfg.operatorBin, err)
	}
	op := &operator{cmd: cmd, logPath: logFile.Name(), pprofAddr: pprofAddr, metricsAddr: metricsAddr, metricsToken: token, exited: make(chan error, 1)}
	go func() { op.exited <- cmd.Wait(); _ = logFile.Close() }()
	fmt.Printf("operator: GOMEMLIMIT=%s GOGC=%s %s %s\n", cfg.goMemLimit, cfg.goGC, cfg.operatorBin, strings.Join(args[2:], " "))
	fmt.Printf("figure: operator_gomemlimit=%s\n", orUnset(cfg.goMemLimit))
	fmt.Printf("figure: operator_gogc=%s\n", orUnset(cfg.goGC))
	return op, nil
}

func orUnset(s string) string {
	if s == "" {
		return "unset"
	}
	return s
}

func (o *operator) stop() {
	_ = o.cmd.Process.Kill()
	<-o.exited
	o.exited <- errors.New("stopped")
}

// alive fails when the operator exited during the bench.
func (o *operator) alive() error {
	select {
	case err := <-o.exited:
		o.exited <- err
		return fmt.Errorf("the operator exited during the bench (%v); log: %s", err, o.logPath)
	default:
		return nil
	}
}

func (o *operator) peakKiB() int64 { return procStatus(o.cmd.Process.Pid, "VmHWM:") }
func (o *operator) rssKiB() int64  { return procStatus(o.cmd.Process.Pid, "VmRSS:") }

// cpuSeconds is the CPU time (user + system) the operator process has used so far.
func (o *operator) cpuSeconds() float64 { return cpuSecondsOf(o.cmd.Process.Pid) }

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

// metricsToken returns a bearer token that the operator's metrics endpoint accepts (it asks the
// API server with a TokenReview and a SubjectAccessReview): a ServiceAccount's, bound to a
// ClusterRole that may get /metrics, as a Prometheus' would be.
func metricsToken(ctx context.Context, c client.Client, rc *rest.Config) (string, error) {
	const name, ns = "bench-metrics-scraper", "bench"
	for _, obj := range []client.Object{
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}},
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name},
			Rules: []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: ns}}},
	} {
		if err := c.Create(ctx, obj); err != nil {
			return "", fmt.Errorf("create %s: %w", obj.GetName(), err)
		}
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return "", err
	}
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](24 * 3600)}}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("token for %s: %w", name, err)
	}
	return tr.Status.Token, nil
}

// operatorUser is the identity the operator runs as: its ServiceAccount's user name and groups,
// bound to the ClusterRole generated from the kubebuilder markers (config/rbac/role.yaml), as in
// a cluster. Every request pays RBAC as there, API priority and fairness classes the operator as
// a ServiceAccount (workload-low) rather than exempt, and a rule missing fails the bench.
func operatorUser(ctx context.Context, env *envtest.Environment, c client.Client) (*envtest.AuthenticatedUser, error) {
	const name, ns = "lbsvc-operator", "lbsvc-system"
	data, err := os.ReadFile(filepath.Join("config", "rbac", "role.yaml"))
	if err != nil {
		return nil, err
	}
	var role rbacv1.ClusterRole
	if err := yaml.Unmarshal(data, &role); err != nil {
		return nil, fmt.Errorf("config/rbac/role.yaml: %w", err)
	}
	if len(role.Rules) == 0 {
		return nil, fmt.Errorf("config/rbac/role.yaml: no rules")
	}
	role.ObjectMeta = metav1.ObjectMeta{Name: "bench-" + name}
	for _, obj := range []client.Object{
		&role,
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: role.Name},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: ns}}},
	} {
		if err := c.Create(ctx, obj); err != nil {
			return nil, fmt.Errorf("create %s: %w", obj.GetName(), err)
		}
	}
	return env.AddUser(envtest.User{Name: "system:serviceaccount:" + ns + ":" + name,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns}}, nil)
}

// scrapeClient talks to the operator's metrics endpoint on loopback, whose certificate is
// self-signed.
var scrapeClient = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
	TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // loopback, self-signed, bench only
}}

// reconciles reads the operator's controller_runtime_reconcile_total by "controller result"
// (HTTPS on loopback, with the bench scraper's token).
func (o *operator) reconciles(ctx context.Context) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+o.metricsAddr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+o.metricsToken)
	resp, err := scrapeClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("operator metrics: %s", resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	if mf := mfs["controller_runtime_reconcile_total"]; mf != nil {
		for _, m := range mf.GetMetric() {
			l := labelsOf(m)
			out[l["controller"]+" "+l["result"]] += m.GetCounter().GetValue()
		}
	}
	return out, nil
}

func (o *operator) saveProfile(ctx context.Context, path, file string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+o.pprofAddr+path, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("profile %s: %w", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("profile %s: %s", path, resp.Status)
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// freeLocalAddr returns a loopback address with a port free right now.
func freeLocalAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// procStatus reads one KiB field of /proc/<pid>/status (0 when unreadable).
func procStatus(pid int, field string) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return n
		}
	}
	return 0
}

// ingressWatch records when each watched Service first showed an ingress.
type ingressWatch struct {
	mu      sync.Mutex
	at      map[string]time.Time
	changed chan struct{}
}

func newIngressWatch() *ingressWatch {
	return &ingressWatch{at: map[string]time.Time{}, changed: make(chan struct{})}
}

// start watches the Services of ns until ctx ends, reopening the watch where the server closed it.
func (w *ingressWatch) start(ctx context.Context, c client.WithWatch, ns string) error {
	var list corev1.ServiceList
	if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return err
	}
	rv := list.ResourceVersion
	open := func() (watch.Interface, error) {
		return c.Watch(ctx, &corev1.ServiceList{}, client.InNamespace(ns), &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv}})
	}
	wi, err := open()
	if err != nil {
		return fmt.Errorf("watch services in %s: %w", ns, err)
	}
	go func() {
		for {
			for ev := range wi.ResultChan() {
				svc, ok := ev.Object.(*corev1.Service)
				if !ok {
					continue
				}
				rv = svc.ResourceVersion
				if len(svc.Status.LoadBalancer.Ingress) > 0 {
					w.record(ns+"/"+svc.Name, time.Now())
				}
			}
			if ctx.Err() != nil {
				return
			}
			for {
				if wi, err = open(); err == nil {
					break
				}
				select {
				case <-ctx.Done():
					return
				case <-time.After(100 * time.Millisecond):
				}
			}
		}
	}()
	return nil
}

func (w *ingressWatch) record(key string, at time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.at[key]; ok {
		return
	}
	w.at[key] = at
	close(w.changed)
	w.changed = make(chan struct{})
}

// wait returns when key first showed an ingress.
func (w *ingressWatch) wait(ctx context.Context, key string) (time.Time, error) {
	for {
		w.mu.Lock()
		at, ok := w.at[key]
		ch := w.changed
		w.mu.Unlock()
		if ok {
			return at, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return time.Time{}, fmt.Errorf("service %s has no ingress: %w", key, ctx.Err())
		}
	}
}

func (w *ingressWatch) count(prefix string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for k := range w.at {
		if strings.HasPrefix(k, prefix) {
			n++
		}
	}
	return n
}

// requestStat is what the API server counted for one kind of request.
type requestStat struct {
	count   float64
	seconds float64 // summed server-side duration
}

// apiMetrics reads the API server's request counters and durations by
// "VERB resource[/subresource] code" (durations by "VERB resource[/subresource]").
func apiMetrics(ctx context.Context, cfg *rest.Config) (map[string]requestStat, error) {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(cfg.Host, "/")+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape apiserver metrics: %w", err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("parse apiserver metrics: %w", err)
	}
	out := map[string]requestStat{}
	key := func(l map[string]string) (string, bool) {
		// The API server's own writes (ClusterIP IPAddress objects), leader election's renewals
		// and the bench's namespaces are not the operator's per-Service work. A Lease created is:
		// each Service with standby lb pods gets one.
		switch l["resource"] {
		case "", "namespaces", "ipaddresses":
			return "", false
		case "leases":
			if l["verb"] != "POST" {
				return "", false
			}
		}
		k := l["verb"] + " " + l["resource"]
		if l["subresource"] != "" {
			k += "/" + l["subresource"]
		}
		return k, true
	}
	if mf := mfs["apiserver_request_total"]; mf != nil {
		for _, m := range mf.GetMetric() {
			l := labelsOf(m)
			if k, ok := key(l); ok {
				s := out[k+" "+l["code"]]
				s.count += m.GetCounter().GetValue()
				out[k+" "+l["code"]] = s
			}
		}
	}
	if mf := mfs["apiserver_request_duration_seconds"]; mf != nil {
		for _, m := range mf.GetMetric() {
			if k, ok := key(labelsOf(m)); ok {
				s := out[k]
				s.seconds += m.GetHistogram().GetSampleSum()
				s.count += float64(m.GetHistogram().GetSampleCount())
				out[k] = s
			}
		}
	}
	return out, nil
}

func labelsOf(m *dto.Metric) map[string]string {
	l := map[string]string{}
	for _, p := range m.GetLabel() {
		l[p.GetName()] = p.GetValue()
	}
	return l
}

// isWrite tells whether a "VERB resource code" or "VERB resource" key is a write.
func isWrite(k string) bool {
	verb, _, _ := strings.Cut(k, " ")
	switch verb {
	case "POST", "PUT", "PATCH", "DELETE", "APPLY":
		return true
	}
	return false
}

// settle waits until the API server's write counters stop moving for 3 s in a row.
func settle(ctx context.Context, rc *rest.Config) (map[string]requestStat, error) {
	var cur map[string]requestStat
	for stable, last := 0, -1.0; stable < 3; {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Second):
		}
		m, err := apiMetrics(ctx, rc)
		if err != nil {
			return nil, err
		}
		total := 0.0
		for k, v := range m {
			if isWrite(k) && strings.Count(k, " ") == 2 {
				total += v.count
			}
		}
		if total == last {
			stable++
		} else {
			stable = 0
		}
		last, cur = total, m
	}
	return cur, nil
}

// writesBetween is the number of write requests the API server answered between two apiMetrics
// readings.
func writesBetween(before, after map[string]requestStat) float64 {
	total := 0.0
	for k, v := range after {
		if isWrite(k) && strings.Count(k, " ") == 2 {
			total += v.count - before[k].count
		}
	}
	return total
}

// report prints the operator's writes per Service by kind and response code, the mean
// server-side latency of each write kind, and the reads per Service.
func report(fig func(string, string, ...any), before, after map[string]requestStat, n int, bench map[string]float64) {
	var writes, reads []string
	totalWrites, totalReads := 0.0, 0.0
	delta := map[string]float64{}
	for k, v := range after {
		if strings.Count(k, " ") != 2 {
			continue
		}
		d := v.count - before[k].count - bench[k]
		if d <= 0 {
			continue
		}
		delta[k] = d
		if isWrite(k) {
			writes = append(writes, k)
			totalWrites += d
		} else {
			reads = append(reads, k)
			totalReads += d
		}
	}
	sort.Strings(writes)
	sort.Strings(reads)
	fig("writes_per_service", "%.2f", totalWrites/float64(n))
	for _, k := range writes {
		kind, code := k[:strings.LastIndex(k, " ")], k[strings.LastIndex(k, " ")+1:]
		mean := 0.0
		if d := after[kind].count - before[kind].count; d > 0 {
			mean = (after[kind].seconds - before[kind].seconds) / d * 1000
		}
		fig("writes_per_service{"+strings.ReplaceAll(kind, " ", ":")+",code="+code+"}", "%.2f", delta[k]/float64(n))
		fmt.Printf("  %-40s %s  %.2f per Service, mean %.1f ms in the API server\n", kind, code, delta[k]/float64(n), mean)
	}
	fig("reads_per_service", "%.2f", totalReads/float64(n))
	for _, k := range reads {
		fmt.Printf("  %-40s %.2f per Service\n", k, delta[k]/float64(n))
	}
}

type namedAt struct {
	name    string
	created time.Time
}

func serviceObject(ns, name, provider string) *corev1.Service {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.ServiceSpec{
			Type:                          corev1.ServiceTypeLoadBalancer,
			AllocateLoadBalancerNodePorts: ptr.To(false),
			Selector:                      map[string]string{"app": "bench"},
			Ports:                         []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(80)}},
		},
	}
	if provider != "" {
		svc.Annotations = map[string]string{lbv1.AttachmentProviderAnnotation: provider}
	}
	return svc
}

func createService(ctx context.Context, c client.Client, ns, name, provider string) error {
	if err := c.Create(ctx, serviceObject(ns, name, provider)); err != nil {
		return fmt.Errorf("create service %s/%s: %w", ns, name, err)
	}
	return nil
}

// createServices creates n LoadBalancer Services (annotated when provider is set) with a few
// parallel writers and returns their names with the moment each creation was sent.
func createServices(ctx context.Context, c client.Client, ns, provider string, n, workers int) ([]namedAt, error) {
	out := make([]namedAt, n)
	err := parallel(ctx, n, workers, func(i int) error {
		name := "svc-" + strconv.Itoa(i)
		out[i] = namedAt{name: name, created: time.Now()}
		return createService(ctx, c, ns, name, provider)
	})
	return out, err
}

// createUnrelated fills namespace bench-unrelated with k ConfigMaps, k pods and k Deployments,
// none of them the operator's, each carrying the managedFields and last-applied annotation that
// kubectl apply leaves (the operator must not pay for them).
func createUnrelated(ctx context.Context, c client.Client, k, workers int) error {
	const ns = "bench-unrelated"
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		return err
	}
	payload := strings.Repeat("x", 1024)
	tmpl := corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "unrelated"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "app", Image: "registry.example/app:1", Args: []string{"--serve", "--port=8080"},
			Env: []corev1.EnvVar{{Name: "MODE", Value: "production"}, {Name: "PAYLOAD", Value: payload[:256]}},
		}}},
	}
	meta := func(kind string, i int) metav1.ObjectMeta {
		return metav1.ObjectMeta{Name: kind + "-" + strconv.Itoa(i), Namespace: ns, Labels: map[string]string{"app": "unrelated"},
			Annotations: map[string]string{"kubectl.kubernetes.io/last-applied-configuration": payload}}
	}
	return parallel(ctx, k, workers, func(i int) error {
		objs := []client.Object{
			&corev1.ConfigMap{ObjectMeta: meta("cm", i), Data: map[string]string{"config": payload}},
			&corev1.Pod{ObjectMeta: meta("pod", i), Spec: tmpl.Spec},
			&appsv1.Deployment{ObjectMeta: meta("deploy", i), Spec: appsv1.DeploymentSpec{
				Replicas: ptr.To[int32](1), Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "unrelated"}}, Template: tmpl}},
		}
		for _, o := range objs {
			if err := c.Create(ctx, o, client.FieldOwner("kubectl-client-side-apply")); err != nil {
				return fmt.Errorf("create unrelated %s: %w", o.GetName(), err)
			}
		}
		return nil
	})
}

// parallel runs f(0..n-1) on a few workers and returns the first error.
func parallel(ctx context.Context, n, workers int, f func(int) error) error {
	jobs := make(chan int)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				if err := f(i); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	var err error
	for i := 0; i < n && err == nil; i++ {
		select {
		case jobs <- i:
		case err = <-errs:
		case <-ctx.Done():
			err = ctx.Err()
		}
	}
	close(jobs)
	wg.Wait()
	if err != nil {
		return err
	}
	select {
	case err = <-errs:
	default:
	}
	return err
}

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
// nil) and the bench itself.
func (cp controlPlane) cpu(op *operator) map[string]float64 {
	out := map[string]float64{"bench": cpuSecondsOf(os.Getpid())}
	for name, pid := range cp {
		out[name] = cpuSecondsOf(pid)
	}
	if op != nil {
		out["operator"] = op.cpuSeconds()
	}
	return out
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
		d := after[k] - before[k]
		total += d
		fig(phase+"_cpu_seconds{process="+k+"}", "%.2f", d)
	}
	fig(phase+"_cpu_seconds{process=all}", "%.2f", total)
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

// listBack lists the Services of ns, as each floor ends, and checks that all n are there.
func listBack(ctx context.Context, c client.Client, ns string, n int) error {
	var list corev1.ServiceList
	if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return err
	}
	if len(list.Items) != n {
		return fmt.Errorf("listed %d services, want %d", len(list.Items), n)
	}
	return nil
}
