// Command lbpod runs in the lb pod of a LoadBalancer Service: it gives net1 the LB address and
// installs the policy routes and NAT rules that carry the Service's traffic from the underlay to
// its ClusterIP.
//
//	lbpod init [flags]   apply once and exit (the init container)
//	lbpod [flags]        apply, then keep in sync with the Service and repair drift (main container)
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
	"github.com/lbsvc/lbsvc-operator/lbpod"
	"github.com/lbsvc/lbsvc-operator/lbpod/ha"
	"github.com/lbsvc/lbsvc-operator/lbpod/probe"
)

// options are lbpod's flags; each input defaults to its environment variable.
type options struct {
	namespace, service, serviceFile, kubeconfig string
	// sharedIP is --shared-ip: the IP object name of a shared address, whose members are served.
	sharedIP string
	// podNamespace is --pod-namespace: the lb pod's own namespace (see podNamespace).
	podNamespace                   string
	serviceFilePoll                time.Duration
	addresses, gateways, subnets   string
	iface, uplink                  string
	table                          int
	healthAddr                     string
	resyncPeriod, announceInterval time.Duration
	iptables                       string
	rules                          string
	procSys                        string
	ha                             haOptions
	podName, leaseName             string
	// conflictProbe is --conflict-probe; conflictProbeSet says it was given (flag or env), which
	// --service-file needs to probe at all.
	conflictProbe    string
	conflictProbeSet bool
	// portGate is --port-gate (lbpod.PortGate); off with --service-file unless given.
	portGate bool
}

func parseFlags(name string, args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.StringVar(&o.namespace, "namespace", os.Getenv(v1alpha1.EnvNamespace), "namespace of the Service (env "+v1alpha1.EnvNamespace+")")
	fs.StringVar(&o.service, "service", os.Getenv(v1alpha1.EnvService), "name of the Service (env "+v1alpha1.EnvService+")")
	fs.StringVar(&o.sharedIP, "shared-ip", os.Getenv(v1alpha1.EnvSharedIP), "serve the Services sharing this address (its IP object name): those of the namespace labelled "+v1alpha1.SharedIPLabelPrefix+"<it> whose status.loadBalancer.ingress lists the address; excludes --service (env "+v1alpha1.EnvSharedIP+")")
	fs.StringVar(&o.podNamespace, "pod-namespace", os.Getenv(v1alpha1.EnvPodNamespace), "the lb pod's own namespace, where its ServiceAccount (named --lease-name) lists a shared address's other member namespaces; default: the service account's namespace file, else --namespace (env "+v1alpha1.EnvPodNamespace+")")
	fs.StringVar(&o.serviceFile, "service-file", "", "read the Service from this YAML/JSON file (re-read when it changes) instead of the API; with --shared-ip, any number of Services (a List, or documents separated by ---)")
	fs.DurationVar(&o.serviceFilePoll, "service-file-poll", 150*time.Millisecond, "how often --service-file is re-read")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig to reach the API from outside a cluster (default: in-cluster config)")
	fs.StringVar(&o.addresses, "addresses", os.Getenv(v1alpha1.EnvAddresses), "LB address(es) with the subnet prefix, IPv4 first (env "+v1alpha1.EnvAddresses+")")
	fs.StringVar(&o.gateways, "gateways", os.Getenv(v1alpha1.EnvGateways), "subnet gateway(s), in the addresses' order (env "+v1alpha1.EnvGateways+")")
	fs.StringVar(&o.subnets, "subnets", os.Getenv(v1alpha1.EnvSubnets), "subnet CIDR(s), in the addresses' order (env "+v1alpha1.EnvSubnets+")")
	fs.StringVar(&o.iface, "interface", lbpod.DefaultInterface, "the underlay (macvlan) interface")
	fs.StringVar(&o.uplink, "uplink", lbpod.DefaultUplink, "the cluster network interface")
	fs.IntVar(&o.table, "table", lbpod.DefaultTable, "policy routing table")
	fs.StringVar(&o.healthAddr, "health-addr", "", "address of the /healthz, /readyz and /metrics server (main mode); default: the pod IP (env "+lbpod.EnvPodIP+") port 8081, never a wildcard")
	fs.DurationVar(&o.resyncPeriod, "resync-period", time.Minute, "how often the whole state is compared with the kernel and repaired (give or take a tenth); link, address, route and rule changes are repaired at once, from netlink events")
	fs.DurationVar(&o.announceInterval, "announce-interval", 30*time.Second, "how often the addresses are announced (gratuitous ARP / unsolicited NA)")
	fs.StringVar(&o.iptables, "iptables", "auto", `iptables back end: "auto" (the one the host uses), "nft", "legacy" or "plain" (iptables/ip6tables)`)
	fs.StringVar(&o.rules, "rules", envOr(v1alpha1.EnvRules, lbpod.RulesAuto), `rules back end: "auto" (nftables, or iptables where the kernel has no nf_tables), "nftables" (nf_tables netlink, the Service ports in sets; an error where nf_tables is missing) or "iptables" (iptables-restore; --iptables picks the variant) (env `+v1alpha1.EnvRules+`; empty: auto)`)
	fs.StringVar(&o.procSys, "proc-sys", "/proc/sys", "where the sysctls are")
	replicas := envOr(v1alpha1.EnvReplicas, "1")
	fs.StringVar(&replicas, "replicas", replicas, "how many lb pods serve the Service; with more than one they elect the holder of the addresses over net1 (env "+v1alpha1.EnvReplicas+")")
	haInterval := envOr(v1alpha1.EnvHAInterval, ha.DefaultInterval.String())
	fs.StringVar(&haInterval, "ha-interval", haInterval, "election: advert interval (the dead interval is 3 of them) (env "+v1alpha1.EnvHAInterval+")")
	fs.UintVar(&o.ha.priority, "ha-priority", ha.DefaultPriority, "election: priority, 0 to 255 (ties with an older active are not preempted)")
	fs.StringVar(&o.podName, "pod-name", os.Getenv(v1alpha1.EnvPodName), "this pod's name, recorded in the Service's Lease when it takes the addresses over (env "+v1alpha1.EnvPodName+")")
	fs.StringVar(&o.leaseName, "lease-name", os.Getenv(v1alpha1.EnvLease), "the Service's Lease (in the Service's namespace), where a takeover is recorded (env "+v1alpha1.EnvLease+")")
	fs.DurationVar(&o.ha.lease, "ha-lease", time.Second, "election: kernel lifetime of the held addresses, renewed with every advert, so that they lapse when this process stops (0: permanent)")
	fs.StringVar(&o.ha.keyFile, "ha-key-file", "", "election: the Service's key (at least 16 bytes); every advert is authenticated with it. Empty: unauthenticated adverts (wire version 1, as before), with a warning")
	fs.DurationVar(&o.ha.replayWindow, "ha-replay-window", ha.DefaultReplayWindow, "election: an authenticated advert is refused when its sender's clock is further than this from ours (bounds replays; the nodes' clocks must agree within it)")
	fs.DurationVar(&o.ha.legacyWindow, "ha-legacy-window", ha.DefaultLegacyWindow, "election, with a key: how long after start unauthenticated adverts of replicas without a key are still obeyed (an upgrade), until an authenticated one is heard or this replica was active (0: never)")
	fs.DurationVar(&o.ha.copyWindow, "ha-copy-window", ha.DefaultCopyWindow, "election: how long after a replica that listens only on the shared multicast address was last heard (lbpod before group addresses; its adverts authenticated when there is a key) adverts are also copied there, whatever --ha-legacy-window says (0: never)")
	fs.BoolVar(&o.ha.groupAddress, "ha-group-address", true, "election: send adverts to the Service's own multicast address (03:6c:62 and three bytes of its group), so that net1 passes up only its own Service's adverts, and copy them to the shared 03:6c:62:73:76:63 for --ha-copy-window after a replica that listens only there was heard (an upgrade). false: the shared address only, as lbpod before group addresses (an underlay that passes only that multicast address)")
	fs.StringVar(&o.conflictProbe, "conflict-probe", os.Getenv(v1alpha1.EnvConflictProbe), `before the first announcement of an address its Service never announced (the Lease's `+v1alpha1.AnnouncedAnnotation+`): ask the underlay whether a host uses it (ARP from 0.0.0.0, IPv6 DAD): "fast" (about 0.1 s), "rfc" (RFC 5227 timings, up to 6 s) or "off" (env `+v1alpha1.EnvConflictProbe+`; empty: fast; with --service-file only when given)`)
	fs.BoolVar(&o.portGate, "port-gate", true, "hold a TCP port added to the running Service back (refused) until its ClusterIP answers, at most "+lbpod.GateBound.String()+": kube-proxy may not serve it yet, and a SYN DNATed there is lost (the client retries after about 1 s); with --service-file only when given")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if o.serviceFile != "" && !given["port-gate"] {
		o.portGate = false
	}
	o.conflictProbeSet = given["conflict-probe"] || os.Getenv(v1alpha1.EnvConflictProbe) != ""
	if _, _, err := probe.TimingFor(o.conflictProbe); err != nil {
		return o, err
	}
	var err error
	if o.ha.replicas, err = strconv.Atoi(replicas); err != nil {
		return o, fmt.Errorf("replicas %q: not a number", replicas)
	}
	if o.ha.interval, err = time.ParseDuration(haInterval); err != nil {
		return o, fmt.Errorf("ha-interval %q: not a duration (like 100ms)", haInterval)
	}
	if err := o.ha.validate(); err != nil {
		return o, err
	}
	if err := lbpod.ParseRules(o.rules); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if o.sharedIP != "" && o.service != "" {
		return o, fmt.Errorf("service %q, shared-ip %q: one or the other (env %s, %s): an lb pod serves one Service or the members of a shared address",
			o.service, o.sharedIP, v1alpha1.EnvService, v1alpha1.EnvSharedIP)
	}
	if o.sharedIP != "" && o.serviceFile == "" && o.namespace == "" {
		return o, fmt.Errorf("namespace %q: needed with shared-ip %q (env %s) unless --service-file is given", o.namespace, o.sharedIP, v1alpha1.EnvNamespace)
	}
	if o.sharedIP == "" && o.serviceFile == "" && (o.namespace == "" || o.service == "") {
		return o, fmt.Errorf("namespace %q, service %q: both are needed (env %s, %s) unless --service-file is given",
			o.namespace, o.service, v1alpha1.EnvNamespace, v1alpha1.EnvService)
	}
	if o.resyncPeriod <= 0 || o.announceInterval <= 0 || o.serviceFilePoll <= 0 {
		return o, fmt.Errorf("resync-period %s, announce-interval %s, service-file-poll %s: all must be positive", o.resyncPeriod, o.announceInterval, o.serviceFilePoll)
	}
	return o, nil
}

// envOr is the environment variable's value, or def when it is unset or empty.
func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// ensureSbinInPath appends the sbin directories to PATH: iptables lives there, and an image
// built without a PATH in its config may start us with a short one.
func ensureSbinInPath() {
	path := os.Getenv("PATH")
	dirs := filepath.SplitList(path)
	for _, d := range []string{"/usr/local/sbin", "/usr/sbin", "/sbin"} {
		if !slices.Contains(dirs, d) {
			dirs = append(dirs, d)
		}
	}
	_ = os.Setenv("PATH", strings.Join(dirs, string(filepath.ListSeparator)))
}

func main() {
	// One P unless the environment says otherwise: lbpod's work is small and serial (a sync, an
	// advert), and with several Ps every wake-up is handed between OS threads (futex wake-ups were
	// its largest syscall cost with 180 lb pods on a 2-core node), paid by every lb pod on the node.
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(1)
	}
	ensureSbinInPath()
	args := os.Args[1:]
	mode := "lbpod"
	if len(args) > 0 && args[0] == "init" {
		mode, args = "lbpod init", args[1:]
	}
	opts, err := parseFlags(mode, args)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", mode, err)
		os.Exit(2)
	}
	network, err := lbpod.ParseNetwork(opts.addresses, opts.gateways, opts.subnets)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", mode, err)
		os.Exit(2)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	if mode == "lbpod init" {
		if err := runInit(ctx, opts, network, log); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", mode, err)
			os.Exit(1)
		}
		return
	}
	if err := run(ctx, opts, network, log); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", mode, err)
		os.Exit(1)
	}
}

func (o options) names() lbpod.Names {
	return lbpod.Names{Interface: o.iface, Uplink: o.uplink, Table: o.table}
}

// newApplier picks the rules back end (and the iptables variant) and builds the applier, which
// removes what the other back end left in the namespace (a container restarted with another
// back end) once its own first apply went in. The choice is logged once, with the probe's error
// behind a fallback.
func newApplier(ctx context.Context, o options, log *slog.Logger) (*lbpod.Applier, lbpod.RulesChoice, error) {
	var probe error
	if lbpod.RulesNeedProbe(o.rules) {
		probe = lbpod.ProbeNFTables()
	}
	choice, err := lbpod.ChooseRules(o.rules, probe)
	if err != nil {
		return nil, choice, err
	}
	applier, err := applierFor(ctx, o, choice, log)
	if err != nil {
		return nil, choice, err
	}
	applier.RemoveOtherRulesOnceApplied()
	return applier, choice, nil
}

// applierFor builds the applier of the chosen back end.
func applierFor(ctx context.Context, o options, choice lbpod.RulesChoice, log *slog.Logger) (*lbpod.Applier, error) {
	if choice.Backend == lbpod.RulesNFTables {
		log.Info("rules back end", "rules", choice.Backend, "why", choice.Why, "tables", "ip "+lbpod.NFTTable+", ip6 "+lbpod.NFTTable)
		return lbpod.NewNFTablesApplier(log)
	}
	if choice.Probe != nil {
		log.Warn("rules back end", "rules", choice.Backend, "why", choice.Why, "nftables", choice.Probe.Error())
	} else {
		log.Info("rules back end", "rules", choice.Backend, "why", choice.Why)
	}
	var paths lbpod.IPTablesPaths
	switch o.iptables {
	case "auto":
		var why string
		paths, why = lbpod.DetectIPTables(ctx)
		log.Info("iptables back end", "iptables", paths.IPv4, "ip6tables", paths.IPv6, "why", why)
	case "nft", "legacy":
		paths = lbpod.PathsFor(lbpod.Flavour(o.iptables))
	case "plain":
		paths = lbpod.IPTablesPaths{IPv4: "iptables", IPv6: "ip6tables"}
	default:
		return nil, fmt.Errorf("iptables %q: want auto, nft, legacy or plain", o.iptables)
	}
	return lbpod.NewApplier(paths, log)
}

// requireInterface fails with one line naming the likely cause when the pod has no such
// interface: Multus did not attach the NetworkAttachmentDefinition. Checked first, so that this
// is the line `kubectl logs` shows (the lb pod restarts until the attachment is fixed).
func requireInterface(name string) error {
	if _, err := net.InterfaceByName(name); err != nil {
		return fmt.Errorf("interface %q not found: is the NetworkAttachmentDefinition attached to this pod (Multus)? (%v)", name, err)
	}
	return nil
}

// runInit applies the state once, verifies it, and announces the addresses once.
func runInit(ctx context.Context, o options, network lbpod.Network, log *slog.Logger) error {
	start := time.Now()
	if err := requireInterface(o.iface); err != nil {
		return err
	}
	src, err := newServiceSource(o, network, log)
	if err != nil {
		return err
	}
	svcs, err := src.Get(ctx)
	if err != nil {
		return err
	}
	if o.sharedIP == "" {
		if _, err := lbpod.ServiceFromObject(svcs[0]); err != nil {
			return err // before anything is logged: one line for a bad Service
		}
	}
	applier, _, err := newApplier(ctx, o, log)
	if err != nil {
		return err
	}
	loop := lbpod.NewLoop(loopConfig(o, network, applier, log))
	// A replica starts as a standby: only the election may add the addresses.
	loop.SetActive(!o.haEnabled())
	res := loop.ReconcileServices(svcs)
	if res.Err != nil {
		return res.Err
	}
	// Problems are the main container's to report (/readyz): failing here would leave the pod
	// in Init with nobody to say why.
	for _, p := range res.Problems {
		log.Warn("problem", "reason", p.Reason, "message", p.Message, "notReady", p.NotReady)
	}
	if !o.haEnabled() {
		if err := lbpod.Announce(o.iface, network.Addresses, loop.AnnounceStats()); err != nil {
			log.Warn("announcement failed (not fatal)", "err", err)
		}
	}
	log.Info("applied", "changes", len(res.Changes), "took", time.Since(start).Round(time.Millisecond))
	return nil
}
