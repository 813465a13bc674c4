// Command lbsvc-operator gives LoadBalancer Services an address from an underlay Subnet and a
// dedicated lb pod (Deployment "lb-svc-<service>") that carries it on a macvlan interface.
package main

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/lbsvc/lbsvc-operator/controllers/decide"
	"github.com/lbsvc/lbsvc-operator/controllers/lbobjects"
	"github.com/lbsvc/lbsvc-operator/lbpod/ha"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
	"github.com/lbsvc/lbsvc-operator/controllers"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "lbsvc-operator:", err)
		os.Exit(1)
	}
}

// Defaults sized on make bench-operator (1000 Services created at once against a real API server;
// docs/benchmarks.md "The operator"):
//   - 64 Services in parallel: a pass spends nearly all its time waiting for its API round trips
//     (measured when each Service also had a Role, whose create and its RoleBinding's waited
//     107-145 ms each for the API server's escalation check; the RoleBinding to the ClusterRole
//     lbsvc-lbpod now passes by the bind verb, not re-measured). With 16 workers a burst of 1000
//     Services waited in the queue for a worker: creation -> ingress p50 9.5 s, p99 16.6 s; with
//     64: 0.65 s and 1.3 s, the same writes per Service (11.03) and no create answered 409.
//   - the client-side limit is a guard against a reconcile loop gone wrong, not a pacer (the API
//     server's priority and fairness is). controller-runtime gives each resource kind its own
//     client, so it applies per kind; a Service costs at most 2 requests of one kind (Service
//     status and metadata; IP create and status), so 200/s lets through 100 Services a second,
//     above the 50-60 a second the bench's API server sustains: the operator keeps its pace.
const (
	defaultMaxConcurrentReconciles = 64
	defaultKubeAPIQPS              = 200
	defaultKubeAPIBurst            = 400
)

func run() error {
	var (
		enableLBSvc       bool
		opts              controllers.Options
		forwarding        string
		leaderElect       bool
		metricsAddr       string
		probeAddr         string
		leaderElectionNS  string
		maxConcurrentRecs int
		pprofAddr         string
		apiQPS            float64
		apiBurst          int
		lbReplicas        int
		lbHAInterval      time.Duration
		lbRules           string
		lbConflictProbe   string
	)
	flag.BoolVar(&enableLBSvc, "enable-lb-svc", false, "Serve LoadBalancer Services. When false the operator creates nothing for Services and only lets the deletion of Services it served complete.")
	flag.StringVar(&opts.LBPodNamespace, "lb-pod-namespace", "", "Run every lb pod in this namespace (empty: in the Service's namespace).")
	flag.IntVar(&lbReplicas, "lb-replicas", 2,
		"lb pods per Service (1 to 5), unless its lbsvc.io/replicas annotation says otherwise. With more than one, one holds the address and the others stand by on other nodes, taking it over in well under a second.")
	flag.DurationVar(&lbHAInterval, "lb-ha-interval", 100*time.Millisecond,
		"With standbys: how often the active lb pod advertises (10ms to 1s); a standby takes over after 3 missed adverts. Longer costs the lb pods less CPU and a slower failover (about 3.3 intervals on a node failure).")
	flag.StringVar(&lbRules, "lb-rules", "auto",
		"The lb pods' rules back end: auto (nftables, or iptables on a node whose kernel has no nf_tables), nftables (nf_tables over netlink, the Service ports in sets: 1000 ports applied in about 30 ms and one changed in about 7; an lb pod without nf_tables fails at start) or iptables (iptables-restore, the variant the node uses).")
	flag.StringVar(&lbConflictProbe, "lb-conflict-probe", lbv1.ConflictProbeFast,
		"Before the first announcement of an address, the lb pod asks the underlay whether a host already uses it (ARP probes from 0.0.0.0, IPv6 DAD): fast (a few probes, about 0.1 s), rfc (RFC 5227 timings, several seconds) or off. An address that answers is not announced: its IP object goes to phase Conflict.")
	flag.StringVar(&opts.LBSvcImage, "lb-svc-image", "localhost/lbsvc-lbpod:dev", "Image of the lb pod.")
	flag.StringVar(&opts.DefaultAttachmentProvider, "default-attachment-provider", "",
		"When set (<nad name>.<nad namespace>), serve LoadBalancer Services without the ovn.kubernetes.io/attachmentprovider annotation and without a foreign loadBalancerClass through this provider.")
	flag.StringVar(&forwarding, "forwarding-sysctls", string(lbobjects.ForwardingIPv6),
		"Forwarding sysctls set on the lb pod: none, ipv6 (net.ipv6.conf.all.forwarding=1 for IPv6/Dual Services) or all (also net.ipv4.ip_forward=1). The kubelet must allow them with --allowed-unsafe-sysctls.")
	flag.BoolVar(&leaderElect, "leader-elect", false, "Elect a leader, so that only one replica hands out addresses.")
	flag.StringVar(&leaderElectionNS, "leader-election-namespace", "", "Namespace of the leader election lease (default: the pod's namespace).")
	flag.StringVar(&metricsAddr, "metrics-bind-address", ":8443", "Address of the metrics endpoint, HTTPS with authentication and authorization (0 disables it).")
	flag.StringVar(&probeAddr, "health-probe-bind-address", ":8081", "Address of the /healthz and /readyz endpoints.")
	flag.IntVar(&maxConcurrentRecs, "max-concurrent-reconciles", defaultMaxConcurrentReconciles, "Services reconciled in parallel.")
	flag.Float64Var(&apiQPS, "kube-api-qps", defaultKubeAPIQPS, "Requests per second the operator may sustain to one resource kind (client-side limit, per kind; negative: none, leaving it all to the API server's priority and fairness).")
	flag.IntVar(&apiBurst, "kube-api-burst", defaultKubeAPIBurst, "Requests the operator may send at once to one resource kind above --kube-api-qps.")
	flag.StringVar(&pprofAddr, "pprof-bind-address", "", "Address of the Go pprof endpoints under /debug/pprof (empty or 0: off). For profiling, never on an untrusted network.")
	zapOpts := zap.Options{}
	zapOpts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))

	sysctls, err := lbobjects.ParseForwardingSysctls(forwarding)
	if err != nil {
		return err
	}
	if maxConcurrentRecs < 1 {
		return fmt.Errorf("--max-concurrent-reconciles %d: want at least 1", maxConcurrentRecs)
	}
	if apiQPS >= 0 && apiBurst < 1 {
		return fmt.Errorf("--kube-api-burst %d: want at least 1 when --kube-api-qps is not negative", apiBurst)
	}
	if p := opts.DefaultAttachmentProvider; p != "" {
		if _, _, err := decide.SplitProvider(p); err != nil {
			return fmt.Errorf("--default-attachment-provider: %w", err)
		}
	}
	if lbReplicas < 1 || lbReplicas > lbv1.MaxReplicas {
		return fmt.Errorf("--lb-replicas %d: want 1 to %d", lbReplicas, lbv1.MaxReplicas)
	}
	opts.LBReplicas = int32(lbReplicas)
	// The lb pods accept each other's adverts across this whole range (ha.Config.MaxPeerInterval),
	// so that a rollout changing the interval converges: one pair of constants for both.
	if lbHAInterval < ha.MinConfigInterval || lbHAInterval > ha.MaxConfigInterval || lbHAInterval%time.Millisecond != 0 {
		return fmt.Errorf("--lb-ha-interval %s: want %s to %s in whole milliseconds", lbHAInterval, ha.MinConfigInterval, ha.MaxConfigInterval)
	}
	if lbHAInterval != 100*time.Millisecond { // the lb pod's default: no env, so that Deployments stay as they were
		opts.LBHAInterval = lbHAInterval
	}
	if opts.LBRules, err = lbPodChoice("lb-rules", lbRules, lbv1.RulesAuto, lbv1.RulesNFTables, lbv1.RulesIPTables); err != nil {
		return err
	}
	if opts.LBConflictProbe, err = lbPodChoice("lb-conflict-probe", lbConflictProbe, lbv1.ConflictProbeFast, lbv1.ConflictProbeRFC, lbv1.ConflictProbeOff); err != nil {
		return err
	}
	opts.ForwardingSysctls = sysctls
	opts.MaxConcurrentReconciles = maxConcurrentRecs
	opts.EnableLBSvc = enableLBSvc

	scheme, err := controllers.NewScheme()
	if err != nil {
		return err
	}
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	cfg.QPS, cfg.Burst = float32(apiQPS), apiBurst
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                  scheme,
		Cache:                   controllers.CacheOptions(),
		Metrics:                 metricsOptions(metricsAddr),
		HealthProbeBindAddress:  probeAddr,
		PprofBindAddress:        pprofAddr,
		LeaderElection:          leaderElect,
		LeaderElectionID:        "lbsvc-operator.lbsvc.io",
		LeaderElectionNamespace: leaderElectionNS,
		// Give the lease up on a clean stop so that a new replica takes over at once.
		LeaderElectionReleaseOnCancel: true,
	})
	if err != nil {
		return fmt.Errorf("create manager: %w", err)
	}
	if err := controllers.Setup(mgr, opts); err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return fmt.Errorf("add healthz check: %w", err)
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return fmt.Errorf("add readyz check: %w", err)
	}
	ctrl.Log.WithName("setup").Info("starting manager", "enableLBSvc", enableLBSvc, "leaderElect", leaderElect)
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		return fmt.Errorf("manager: %w", err)
	}
	return nil
}

// lbPodChoice checks a flag that reaches the lb pods as a variable: the lb pod's own default
// (def) gives "" (no variable, so that Deployments written before stay as they were), another
// allowed value itself, anything else an error naming the choices.
func lbPodChoice(flag, value, def string, others ...string) (string, error) {
	if value == def {
		return "", nil
	}
	if slices.Contains(others, value) {
		return value, nil
	}
	all := append([]string{def}, others...)
	return "", fmt.Errorf("--%s %q: want %s or %s", flag, value, strings.Join(all[:len(all)-1], ", "), all[len(all)-1])
}
