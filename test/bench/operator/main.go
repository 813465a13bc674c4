// Command operator-bench measures the operator against a real kube-apiserver and etcd: the time
// until N annotated LoadBalancer Services all show an address, the operator's peak RSS, and, as a
// floor, the time the API server alone takes to create and list N Services.
//
// Run by hack/bench-operator.sh (make bench-operator); needs KUBEBUILDER_ASSETS.
package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
	"github.com/lbsvc/lbsvc-operator/controllers"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "operator-bench:", err)
		os.Exit(1)
	}
}

func run() error {
	operatorBin := flag.String("operator", "bin/lbsvc-operator", "operator binary to run")
	n := flag.Int("n", 1000, "number of Services")
	workers := flag.Int("workers", 16, "parallel creators")
	deadline := flag.Duration("timeout", 10*time.Minute, "give up after this long")
	flag.Parse()
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		return fmt.Errorf("KUBEBUILDER_ASSETS is not set (make bench-operator sets it)")
	}

	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("config", "crd", "bases"), filepath.Join("test", "integration", "testdata")},
		ErrorIfCRDPathMissing: true,
	}
	// Room for 2N ClusterIPs (the default /24 holds 254).
	env.ControlPlane.GetAPIServer().Configure().Set("service-cluster-ip-range", "10.96.0.0/12")
	cfg, err := env.Start()
	if err != nil {
		return fmt.Errorf("start kube-apiserver and etcd: %w", err)
	}
	defer func() { _ = env.Stop() }()
	scheme, err := controllers.NewScheme()
	if err != nil {
		return err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), *deadline)
	defer cancel()

	// Floor: the API server alone creating N Services and listing them back.
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "bench-floor"}}); err != nil {
		return err
	}
	start := time.Now()
	if err := createServices(ctx, c, "bench-floor", "", *n, *workers); err != nil {
		return err
	}
	var list corev1.ServiceList
	if err := c.List(ctx, &list, client.InNamespace("bench-floor")); err != nil {
		return err
	}
	if len(list.Items) != *n {
		return fmt.Errorf("floor: listed %d services, want %d", len(list.Items), *n)
	}
	floor := time.Since(start)

	// The operator, as a separate process with its own kubeconfig.
	user, err := env.AddUser(envtest.User{Name: "bench-operator", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return err
	}
	kubeconfig, err := user.KubeConfig()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "operator-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	kcPath := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kcPath, kubeconfig, 0o600); err != nil {
		return err
	}
	for _, obj := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "bench"}},
		&nadv1.NetworkAttachmentDefinition{ObjectMeta: metav1.ObjectMeta{Name: "lb-svc-attachment", Namespace: "bench"},
			Spec: nadv1.NetworkAttachmentDefinitionSpec{Config: `{"cniVersion":"0.3.0","type":"macvlan","master":"eth0","mode":"bridge"}`}},
		&lbv1.Subnet{ObjectMeta: metav1.ObjectMeta{Name: "bench-subnet"}, Spec: lbv1.SubnetSpec{
			Protocol: lbv1.ProtocolIPv4, Provider: "lb-svc-attachment.bench", CIDRBlock: "172.18.0.0/16", Gateway: "172.18.0.1"}},
	} {
		if err := c.Create(ctx, obj); err != nil {
			return fmt.Errorf("create %s: %w", obj.GetName(), err)
		}
	}
	logFile, err := os.Create(filepath.Join(dir, "operator.log"))
	if err != nil {
		return err
	}
	op := exec.Command(*operatorBin, "--kubeconfig", kcPath, "--enable-lb-svc=true",
		"--metrics-bind-address=0", "--health-probe-bind-address=0")
	op.Stdout, op.Stderr = logFile, logFile
	if err := op.Start(); err != nil {
		return fmt.Errorf("start %s: %w", *operatorBin, err)
	}
	defer func() { _ = op.Process.Kill(); _, _ = op.Process.Wait() }()

	var peakMu sync.Mutex
	peak := int64(0)
	sample := func() {
		if v, err := vmHWM(op.Process.Pid); err == nil {
			peakMu.Lock()
			peak = max(peak, v)
			peakMu.Unlock()
		}
	}
	writesBefore, err := apiWrites(ctx, cfg)
	if err != nil {
		return err
	}
	start = time.Now()
	if err := createServices(ctx, c, "bench", "lb-svc-attachment.bench", *n, *workers); err != nil {
		return err
	}
	created := time.Since(start)
	for {
		sample()
		var l corev1.ServiceList
		if err := c.List(ctx, &l, client.InNamespace("bench")); err != nil {
			return err
		}
		done := 0
		for _, s := range l.Items {
			if len(s.Status.LoadBalancer.Ingress) > 0 {
				done++
			}
		}
		if done == *n {
			break
		}
		if ctx.Err() != nil {
			return fmt.Errorf("only %d of %d services got an address before the timeout (log: %s)", done, *n, logFile.Name())
		}
		time.Sleep(100 * time.Millisecond)
	}
	all := time.Since(start)
	sample()
	// The operator still finishes its per-Service objects after the last address shows: count
	// its writes once they stop changing.
	var writes map[string]float64
	for stable, last := 0, -1.0; stable < 3 && ctx.Err() == nil; {
		time.Sleep(time.Second)
		w, err := apiWrites(ctx, cfg)
		if err != nil {
			return err
		}
		total := 0.0
		for _, v := range w {
			total += v
		}
		if total == last {
			stable++
		} else {
			stable = 0
		}
		last, writes = total, w
	}
	fmt.Printf("services:                          %d\n", *n)
	fmt.Printf("API floor (create + list, no op):  %s\n", floor.Round(time.Millisecond))
	fmt.Printf("create with operator running:      %s\n", created.Round(time.Millisecond))
	fmt.Printf("all %d with an address:           %s\n", *n, all.Round(time.Millisecond))
	fmt.Printf("ratio to the API floor:            %.2f\n", all.Seconds()/floor.Seconds())
	fmt.Printf("operator peak RSS (VmHWM):         %.1f MiB\n", float64(peak)/1024)
	// The bench itself created the n Services (POST services): not the operator's.
	writesBefore["POST services"] += float64(*n)
	keys := make([]string, 0, len(writes))
	total := 0.0
	for k, v := range writes {
		if d := v - writesBefore[k]; d > 0 {
			keys = append(keys, k)
			total += d
		}
	}
	sort.Strings(keys)
	fmt.Printf("API writes per Service (apiserver_request_total, operator's): %.2f\n", total/float64(*n))
	for _, k := range keys {
		fmt.Printf("  %-40s %.2f\n", k, (writes[k]-writesBefore[k])/float64(*n))
	}
	return nil
}

// apiWrites reads the API server's own request counters: writes by "VERB resource[/subresource]".
func apiWrites(ctx context.Context, cfg *rest.Config) (map[string]float64, error) {
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
	out := map[string]float64{}
	mf := mfs["apiserver_request_total"]
	if mf == nil {
		return out, nil
	}
	for _, m := range mf.GetMetric() {
		l := map[string]string{}
		for _, p := range m.GetLabel() {
			l[p.GetName()] = p.GetValue()
		}
		switch l["verb"] {
		case "POST", "PUT", "PATCH", "DELETE", "APPLY":
		default:
			continue
		}
		// The API server's own writes (ClusterIP IPAddress objects) and leader election are not
		// the operator's per-Service work.
		if l["resource"] == "" || l["resource"] == "namespaces" || l["resource"] == "leases" || l["resource"] == "ipaddresses" {
			continue
		}
		k := l["verb"] + " " + l["resource"]
		if l["subresource"] != "" {
			k += "/" + l["subresource"]
		}
		out[k] += m.GetCounter().GetValue()
	}
	return out, nil
}

// createServices creates n annotated LoadBalancer Services with a few parallel writers.
func createServices(ctx context.Context, c client.Client, ns, provider string, n, workers int) error {
	jobs := make(chan int)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				svc := &corev1.Service{
					ObjectMeta: metav1.ObjectMeta{Name: "svc-" + strconv.Itoa(i), Namespace: ns},
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
				if err := c.Create(ctx, svc); err != nil {
					errs <- fmt.Errorf("create service %s/%s: %w", ns, svc.Name, err)
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

// vmHWM reads a process's peak resident set size in KiB.
func vmHWM(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			return strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
		}
	}
	return 0, fmt.Errorf("no VmHWM in /proc/%d/status", pid)
}
