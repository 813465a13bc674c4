//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
)

const (
	// metricsReaderRole is the ClusterRole that lets a token read the operator's /metrics
	// (config/rbac/metrics_reader_role.yaml, the chart's <release>-metrics-reader).
	metricsReaderRole = "lbsvc-operator-metrics-reader"
	operatorMetrics   = "8443"
	lbPodHealthPort   = "8081"
)

// newUnderlaySubnet creates, for one test, a NAD "<name>" in kube-system (macvlan on the nodes'
// eth0, the underlay, like the seed's) and a Subnet "<name>" whose provider it is, and removes both
// at the end of the test. Services reach it with the annotation provider(name).
func newUnderlaySubnet(t *testing.T, name, cidr, gateway string) *lbv1.Subnet {
	t.Helper()
	ctx := context.Background()
	nad := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "k8s.cni.cncf.io/v1",
		"kind":       "NetworkAttachmentDefinition",
		"metadata":   map[string]any{"name": name, "namespace": "kube-system"},
		"spec":       map[string]any{"config": `{"cniVersion": "0.3.0", "type": "macvlan", "master": "eth0", "mode": "bridge"}`},
	}}
	subnet := &lbv1.Subnet{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       lbv1.SubnetSpec{Provider: provider(name), CIDRBlock: cidr, Gateway: gateway},
	}
	for _, o := range []client.Object{nad, subnet} {
		if err := k8s.Create(ctx, o); err != nil {
			t.Fatalf("create %s %s: %v", o.GetObjectKind().GroupVersionKind().Kind, name, err)
		}
	}
	// Cleanups run last in, first out: the Services a test creates afterwards go first, then the
	// Subnet (its finalizer waits for their addresses to drain), then the NAD.
	t.Cleanup(func() {
		for _, o := range []client.Object{subnet, nad} {
			if err := k8s.Delete(ctx, o); err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("delete %s: %v", name, err)
			}
		}
	})
	NewWithT(t).Eventually(func() (string, error) {
		var s lbv1.Subnet
		err := k8s.Get(ctx, client.ObjectKeyFromObject(subnet), &s)
		for _, c := range s.Status.Conditions {
			if c.Type == "Ready" {
				return string(c.Status) + " " + c.Reason, err
			}
		}
		return "", err
	}).WithTimeout(time.Minute).WithPolling(100*time.Millisecond).Should(Equal("True Valid"), "Subnet %s", name)
	return subnet
}

// provider is the attachment provider of the NAD newUnderlaySubnet makes.
func provider(nad string) string { return nad + ".kube-system" }

// scrapeOperator reads the operator's metrics endpoint from the operator's node (inside the
// cluster, where Prometheus would scrape it) with the given bearer token ("" for none), and
// returns the HTTP status and the body.
func scrapeOperator(ctx context.Context, token string) (int, string, error) {
	var pods corev1.PodList
	if err := k8s.List(ctx, &pods, client.InNamespace(operatorNamespace), client.MatchingLabels{"app.kubernetes.io/name": "lbsvc-operator"}); err != nil {
		return 0, "", err
	}
	var pod *corev1.Pod
	for i := range pods.Items {
		if p := &pods.Items[i]; p.DeletionTimestamp == nil && podReady(p) {
			pod = p
		}
	}
	if pod == nil {
		return 0, "", fmt.Errorf("no ready operator pod in %s", operatorNamespace)
	}
	// The certificate is the operator's self-signed one (-k); the status code goes last.
	args := []string{"curl", "-sS", "-k", "-m", "5", "-w", "\n%{http_code}", "https://" + pod.Status.PodIP + ":" + operatorMetrics + "/metrics"}
	if token != "" {
		args = append(args, "-H", "Authorization: Bearer "+token)
	}
	out, err := inNode(pod.Spec.NodeName, args...)
	if err != nil {
		return 0, "", err
	}
	i := strings.LastIndex(out, "\n")
	code, err := strconv.Atoi(strings.TrimSpace(out[i+1:]))
	if err != nil {
		return 0, "", fmt.Errorf("no status code at the end of %.200q", out)
	}
	return code, out[:i], nil
}

// serviceAccountToken creates a ServiceAccount in the seed's namespace (removed at the end of the
// test), binds it to clusterRole unless that is empty, and returns a short-lived token of it.
func serviceAccountToken(t *testing.T, name, clusterRole string) string {
	t.Helper()
	ctx := context.Background()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: seedNamespace}}
	objs := []client.Object{sa}
	if clusterRole != "" {
		objs = append(objs, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: clusterRole},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: seedNamespace}},
		})
	}
	for _, o := range objs {
		if err := k8s.Create(ctx, o); err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
		t.Cleanup(func() {
			if err := k8s.Delete(context.Background(), o); err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("delete %s: %v", name, err)
			}
		})
	}
	return strings.TrimSpace(kube(t, "create", "token", name, "-n", seedNamespace, "--duration=10m"))
}

var sampleLine = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$`)
var labelPair = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"`)

// samples returns the values of every sample of metric name in a Prometheus text page whose
// labels include want.
func samples(page, name string, want map[string]string) []float64 {
	var out []float64
	for _, line := range strings.Split(page, "\n") {
		m := sampleLine.FindStringSubmatch(strings.TrimSpace(line))
		if m == nil || m[1] != name {
			continue
		}
		labels := map[string]string{}
		for _, p := range labelPair.FindAllStringSubmatch(m[2], -1) {
			labels[p[1]] = p[2]
		}
		match := true
		for k, v := range want {
			match = match && labels[k] == v
		}
		if v, err := strconv.ParseFloat(m[3], 64); err == nil && match {
			out = append(out, v)
		}
	}
	return out
}

// sample is the one sample of name with exactly the labels want has (among others), or an error.
func sample(page, name string, want map[string]string) (float64, error) {
	s := samples(page, name, want)
	if len(s) != 1 {
		return 0, fmt.Errorf("%d samples of %s%v, want 1", len(s), name, want)
	}
	return s[0], nil
}

// TestOperatorMetrics: the operator's metrics endpoint answers only authenticated and authorized
// scrapers (401 without a token, 403 with the token of a ServiceAccount without the
// metrics-reader role), and its values follow the story: a Subnet of its own (a /28: 16 addresses,
// minus network, broadcast and gateway) with one Service has used 1 and available 12, and 0 and 13
// once the Service is gone and its address drained; the seed's Subnet counts as many used
// addresses as it has IP objects.
func TestOperatorMetrics(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	id := suffix()
	reader := serviceAccountToken(t, "e2e-metrics-"+id, metricsReaderRole)
	stranger := serviceAccountToken(t, "e2e-nometrics-"+id, "")

	code, _, err := scrapeOperator(ctx, "")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(code).To(Equal(401), "scrape without a token")
	code, _, err = scrapeOperator(ctx, stranger)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(code).To(Equal(403), "scrape with a token not bound to %s", metricsReaderRole)
	// The binding reaches the API server's authorizer within moments.
	page := func() (string, error) {
		code, body, err := scrapeOperator(ctx, reader)
		if err == nil && code != 200 {
			err = fmt.Errorf("HTTP %d: %.200s", code, body)
		}
		return body, err
	}
	g.Eventually(page).WithTimeout(30 * time.Second).WithPolling(500 * time.Millisecond).Should(ContainSubstring("lbsvc_subnet_addresses"))

	subnet := newUnderlaySubnet(t, "e2e-metrics-"+id, "172.30.0.0/28", "172.30.0.1")
	gauge := func(state string) func() (float64, error) {
		return func() (float64, error) {
			body, err := page()
			if err != nil {
				return 0, err
			}
			return sample(body, "lbsvc_subnet_addresses", map[string]string{"subnet": subnet.Name, "family": "IPv4", "state": state})
		}
	}
	g.Eventually(gauge("available")).WithTimeout(time.Minute).WithPolling(time.Second).Should(Equal(13.0))

	svc := newLBService("e2e-metrics-"+id, "", 80)
	svc.Annotations[lbv1.AttachmentProviderAnnotation] = provider(subnet.Name)
	g.Expect(k8s.Create(ctx, svc)).To(Succeed())
	deleteServiceOnCleanup(t, svc)
	waitIngress(t, svc.Namespace, svc.Name)
	g.Eventually(gauge("used")).WithTimeout(time.Minute).WithPolling(time.Second).Should(Equal(1.0))
	g.Expect(gauge("available")()).To(Equal(12.0))

	// The seed's Subnet: used = its IP objects (bound or draining), read from the API.
	g.Eventually(func() error {
		var ips lbv1.IPList
		if err := k8s.List(ctx, &ips); err != nil {
			return err
		}
		n := 0
		for _, ip := range ips.Items {
			if ip.Spec.Subnet == "attach-subnet" {
				n++
			}
		}
		body, err := page()
		if err != nil {
			return err
		}
		used, err := sample(body, "lbsvc_subnet_addresses", map[string]string{"subnet": "attach-subnet", "family": "IPv4", "state": "used"})
		if err == nil && used != float64(n) {
			err = fmt.Errorf("attach-subnet: metric used %v, IP objects %d", used, n)
		}
		return err
	}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())

	g.Expect(k8s.Delete(ctx, svc)).To(Succeed())
	g.Eventually(gauge("used")).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(Equal(0.0))
	g.Expect(gauge("draining")()).To(Equal(0.0))
	g.Expect(gauge("available")()).To(Equal(13.0))
	body, err := page()
	g.Expect(err).NotTo(HaveOccurred())
	allocated := samples(body, "lbsvc_allocations_total", map[string]string{"result": "allocated"})
	g.Expect(allocated).NotTo(BeEmpty())
	g.Expect(allocated[0]).To(BeNumerically(">=", 1))
}

// TestLBPodMetrics scrapes the seed's lb pod's /metrics from inside the cluster, through the API
// server's pod proxy (the API server reaches the pod IP; the underlay never can, see
// TestLBAddressServesOnlyServicePorts): it has announced its address (the start burst is three
// announcements, a second apart) and none failed.
func TestLBPodMetrics(t *testing.T) {
	g := NewWithT(t)
	pod := waitLBPod(t, seedNamespace, seedService)
	path := "/api/v1/namespaces/" + pod.Namespace + "/pods/" + pod.Name + ":" + lbPodHealthPort + "/proxy/metrics"
	sum := func(page string, match func(string) bool) float64 {
		total := 0.0
		for _, line := range strings.Split(page, "\n") {
			if m := sampleLine.FindStringSubmatch(strings.TrimSpace(line)); m != nil && match(m[1]) {
				v, _ := strconv.ParseFloat(m[3], 64)
				total += v
			}
		}
		return total
	}
	// The counters' names: lbpod_announcements_total and lbpod_announce_failures_total, whatever
	// labels split them.
	announced := func(name string) bool {
		return strings.HasPrefix(name, "lbpod_announce") && !strings.Contains(name, "fail")
	}
	failed := func(name string) bool {
		return strings.HasPrefix(name, "lbpod_announce") && strings.Contains(name, "fail")
	}
	var page string
	g.Eventually(func() (float64, error) {
		var err error
		page, err = run(kubectl, "get", "--raw", path)
		return sum(page, announced), err
	}).WithTimeout(30*time.Second).WithPolling(500*time.Millisecond).Should(BeNumerically(">=", 3), "announcements of %s", pod.Name)
	g.Expect(sum(page, failed)).To(BeZero(), "failed announcements:\n%s", page)
}
