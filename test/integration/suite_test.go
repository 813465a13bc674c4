//go:build integration

// Package integration runs the operator in-process against a real kube-apiserver and etcd
// (controller-runtime's envtest, binaries from KUBEBUILDER_ASSETS).
package integration

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lbsvc/lbsvc-operator/controllers/decide"
	"github.com/lbsvc/lbsvc-operator/controllers/lbobjects"

	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	. "github.com/onsi/gomega"
	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
	"github.com/lbsvc/lbsvc-operator/controllers"
)

const (
	timeout  = 20 * time.Second
	interval = 100 * time.Millisecond
	image    = "localhost/lbsvc-lbpod:dev"
)

var (
	testEnv *envtest.Environment
	restCfg *rest.Config
	// operatorCfg authenticates as the operator's ServiceAccount, with the install's RBAC.
	operatorCfg *rest.Config
	k8s         client.Client

	opMu    sync.Mutex
	current *operator
)

func TestMain(m *testing.M) {
	os.Exit(runSuite(m))
}

func runSuite(m *testing.M) int {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		// Fail loudly: a skipped suite would read as a pass.
		fmt.Fprintln(os.Stderr, "KUBEBUILDER_ASSETS is not set: run `make test-integration` (it builds kube-apiserver and etcd)")
		return 1
	}
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.UseDevMode(false), zap.Level(zapLevel())))
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("..", "..", "config", "crd", "bases"), filepath.Join("testdata")},
		ErrorIfCRDPathMissing: true,
	}
	// Room for the churn test's hundreds of Services (the default range holds 254 ClusterIPs).
	env.ControlPlane.GetAPIServer().Configure().Set("service-cluster-ip-range", "10.96.0.0/16")
	cfg, err := env.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "start envtest:", err)
		return 1
	}
	testEnv = env
	defer func() {
		stopOperator()
		if err := env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stop envtest:", err)
		}
	}()
	restCfg = cfg
	scheme, err := controllers.NewScheme()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	k8s, err = client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		fmt.Fprintln(os.Stderr, "client:", err)
		return 1
	}
	if operatorCfg, err = operatorConfig(context.Background(), env, k8s); err != nil {
		fmt.Fprintln(os.Stderr, "operator identity:", err)
		return 1
	}
	startOperator(true)
	return m.Run()
}

// zapLevel keeps the operator's logs quiet unless LBSVC_TEST_VERBOSE is set.
func zapLevel() zapcore.Level {
	if os.Getenv("LBSVC_TEST_VERBOSE") != "" {
		return zapcore.DebugLevel
	}
	return zapcore.ErrorLevel
}

// operator is one in-process manager; tests stop it and start a new one to check restarts and
// the --enable-lb-svc=false mode.
type operator struct {
	cancel context.CancelFunc
	done   chan error
}

// startOperator replaces the running operator (if any) with a new manager on the same API server.
func startOperator(enable bool) {
	stopOperator()
	opMu.Lock()
	defer opMu.Unlock()
	current = newOperator(controllers.Options{EnableLBSvc: enable})
}

// newOperator starts one manager with opts (image, sysctls and concurrency filled in); tweak,
// when given, changes its API client's config and the manager's options (countRequests).
func newOperator(opts controllers.Options, tweak ...func(*rest.Config, *ctrl.Options)) *operator {
	scheme, err := controllers.NewScheme()
	if err != nil {
		panic(err)
	}
	cfg := rest.CopyConfig(operatorCfg)
	mgrOpts := ctrl.Options{
		Scheme:                 scheme,
		Cache:                  controllers.CacheOptions(),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
	}
	for _, t := range tweak {
		t(cfg, &mgrOpts)
	}
	mgr, err := ctrl.NewManager(cfg, mgrOpts)
	if err != nil {
		panic(fmt.Sprintf("new manager: %v", err))
	}
	opts.LBSvcImage, opts.ForwardingSysctls = image, lbobjects.ForwardingIPv6
	opts.MaxConcurrentReconciles, opts.SkipNameValidation = 4, true
	if err := controllers.Setup(mgr, opts); err != nil {
		panic(fmt.Sprintf("setup: %v", err))
	}
	ctx, cancel := context.WithCancel(context.Background())
	op := &operator{cancel: cancel, done: make(chan error, 1)}
	go func() { op.done <- mgr.Start(ctx) }()
	return op
}

// stop ends one manager started by newOperator.
func (op *operator) stop() {
	op.cancel()
	select {
	case <-op.done:
	case <-time.After(30 * time.Second):
		fmt.Fprintln(os.Stderr, "operator did not stop within 30s")
	}
}

func stopOperator() {
	opMu.Lock()
	defer opMu.Unlock()
	if current == nil {
		return
	}
	current.cancel()
	select {
	case err := <-current.done:
		if err != nil {
			fmt.Fprintln(os.Stderr, "operator stopped with:", err)
		}
	case <-time.After(30 * time.Second):
		fmt.Fprintln(os.Stderr, "operator did not stop within 30s")
	}
	current = nil
}

// ---- helpers ----

func suffix() string {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// newNamespace creates a namespace of its own for one test.
func newNamespace(t *testing.T) string {
	t.Helper()
	name := "it-" + strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-"))
	if len(name) > 50 {
		name = name[:50]
	}
	name = strings.Trim(name, "-") + "-" + suffix()
	name = strings.ReplaceAll(name, "_", "-")
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := k8s.Create(context.Background(), ns); err != nil {
		t.Fatalf("create namespace %s: %v", name, err)
	}
	return name
}

var cidrCounter atomic.Int32

// nextNet returns a /24 no other test uses, as "10.<n>.<m>": every Subnet of the suite is
// disjoint from the others, so overlap checks never cross tests.
func nextNet() string {
	n := cidrCounter.Add(1)
	return fmt.Sprintf("10.%d.%d", 100+n/250, n%250)
}

func createNAD(t *testing.T, ns, name string) string {
	t.Helper()
	nad := &nadv1.NetworkAttachmentDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec:       nadv1.NetworkAttachmentDefinitionSpec{Config: `{"cniVersion":"0.3.0","type":"macvlan","master":"eth0","mode":"bridge"}`},
	}
	if err := k8s.Create(context.Background(), nad); err != nil {
		t.Fatalf("create nad %s/%s: %v", ns, name, err)
	}
	return name + "." + ns
}

func subnetObj(name, provider, cidr, gateway string, excludes []string) *lbv1.Subnet {
	return &lbv1.Subnet{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       lbv1.SubnetSpec{Protocol: lbv1.ProtocolIPv4, Provider: provider, CIDRBlock: cidr, Gateway: gateway, ExcludeIPs: excludes},
	}
}

func create(t *testing.T, obj client.Object) {
	t.Helper()
	if err := k8s.Create(context.Background(), obj); err != nil {
		t.Fatalf("create %T %s: %v", obj, obj.GetName(), err)
	}
}

func lbService(ns, name, provider, lbIP string) *corev1.Service {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": "dynamic"}},
		Spec: corev1.ServiceSpec{
			Type:           corev1.ServiceTypeLoadBalancer,
			LoadBalancerIP: lbIP,
			Selector:       map[string]string{"app": "dynamic"},
			Ports:          []corev1.ServicePort{{Name: "test", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(80)}},
		},
	}
	if provider != "" {
		svc.Annotations = map[string]string{lbv1.AttachmentProviderAnnotation: provider}
	}
	return svc
}

func getService(g Gomega, ns, name string) *corev1.Service {
	svc := &corev1.Service{}
	g.Expect(k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, svc)).To(Succeed())
	return svc
}

func ingressIPs(svc *corev1.Service) []string {
	var out []string
	for _, i := range svc.Status.LoadBalancer.Ingress {
		out = append(out, i.IP)
	}
	return out
}

// waitAddress waits for the Service to show exactly want in ingress and in its annotation.
func waitAddress(t *testing.T, ns, name, want string) *corev1.Service {
	t.Helper()
	var svc *corev1.Service
	NewWithT(t).Eventually(func(g Gomega) {
		svc = getService(g, ns, name)
		g.Expect(svc.Annotations[lbv1.AllocatedIPsAnnotation]).To(Equal(want))
		g.Expect(strings.Join(ingressIPs(svc), ",")).To(Equal(want))
	}, timeout, interval).Should(Succeed())
	return svc
}

// waitRefused waits for the AddressAllocated=False condition with reason, and checks that
// nothing was allocated or created.
func waitRefused(t *testing.T, ns, name, reason string) *corev1.Service {
	t.Helper()
	g := NewWithT(t)
	var svc *corev1.Service
	g.Eventually(func(g Gomega) {
		svc = getService(g, ns, name)
		c := findCondition(svc.Status.Conditions, decide.ConditionAddressAllocated)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
		g.Expect(c.Reason).To(Equal(reason))
	}, timeout, interval).Should(Succeed())
	g.Expect(svc.Annotations).NotTo(HaveKey(lbv1.AllocatedIPsAnnotation))
	g.Expect(svc.Status.LoadBalancer.Ingress).To(BeEmpty())
	g.Eventually(func() []string { return warningReasons(t, ns, name) }, timeout, interval).Should(ContainElement(reason))
	return svc
}

func findCondition(conds []metav1.Condition, t string) *metav1.Condition {
	for i := range conds {
		if conds[i].Type == t {
			return &conds[i]
		}
	}
	return nil
}

// events returns the Events about one object (core/v1 view of events.k8s.io Events).
func events(t *testing.T, ns, name string) []corev1.Event {
	t.Helper()
	var list corev1.EventList
	if err := k8s.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		t.Fatalf("list events in %s: %v", ns, err)
	}
	var out []corev1.Event
	for _, e := range list.Items {
		if e.InvolvedObject.Name == name {
			out = append(out, e)
		}
	}
	return out
}

func warningReasons(t *testing.T, ns, name string) []string {
	var out []string
	for _, e := range events(t, ns, name) {
		if e.Type == corev1.EventTypeWarning {
			out = append(out, e.Reason)
		}
	}
	return out
}

func update[T client.Object](t *testing.T, obj T, mutate func(T)) {
	t.Helper()
	NewWithT(t).Eventually(func(g Gomega) {
		g.Expect(k8s.Get(context.Background(), client.ObjectKeyFromObject(obj), obj)).To(Succeed())
		mutate(obj)
		g.Expect(k8s.Update(context.Background(), obj)).To(Succeed())
	}, timeout, interval).Should(Succeed())
}
