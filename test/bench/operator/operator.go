package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
)

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
