//go:build integration

package main

import (
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
	"github.com/lbsvc/lbsvc-operator/lbpod"
)

// failServiceAccounts answers the first left requests for ServiceAccounts with a 503 (an API
// server behind an overloaded etcd), without Retry-After, so that client-go does not retry them
// itself; the rest go through.
type failServiceAccounts struct {
	rt   http.RoundTripper
	mu   sync.Mutex
	left int
}

func (f *failServiceAccounts) RoundTrip(r *http.Request) (*http.Response, error) {
	if strings.Contains(r.URL.Path, "/serviceaccounts") {
		f.mu.Lock()
		fail := f.left > 0
		if fail {
			f.left--
		}
		f.mu.Unlock()
		if fail {
			body := `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"ServiceUnavailable","message":"etcd","code":503}`
			return &http.Response{StatusCode: http.StatusServiceUnavailable, Status: "503 Service Unavailable", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
				Header: http.Header{"Content-Type": {"application/json"}}, Body: io.NopCloser(strings.NewReader(body)), Request: r}, nil
		}
	}
	return f.rt.RoundTrip(r)
}

func (f *failServiceAccounts) failing() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.left
}

// firstPublication records the first set of members a source publishes.
type firstPublication struct {
	once  sync.Once
	first chan []string
}

func (f *firstPublication) SetService(*corev1.Service, error) {}

func (f *firstPublication) SetServices(svcs []*corev1.Service, err error) {
	f.once.Do(func() {
		if err != nil {
			f.first <- []string{"error: " + err.Error()}
			return
		}
		f.first <- names(svcs)
	})
}

// TestSharedSourceRetriesTheServiceAccount: the first three reads of the lb pod's ServiceAccount
// fail with a 503. The source retries them (a passing failure, not a refusal) before it builds
// the first publication, which then holds every member namespace's members: a first publication
// of LBPOD_NAMESPACE's alone would have the loop remove the others' rules (a restarted container)
// or a new replica become ready with their ports refused. The one-shot read fails instead.
func TestSharedSourceRetriesTheServiceAccount(t *testing.T) {
	g := NewWithT(t)
	const nsA, nsB, nsC, podNS, saName = "sa503-a", "sa503-b", "sa503-c", "sa503-lb", "lb-172-18-0-18"
	env, admin, ctx := startAPIServer(t, nsA)
	var role rbacv1.ClusterRole
	readYAML(t, "../../config/rbac/lbpod_role.yaml", &role)
	_, err := admin.RbacV1().ClusterRoles().Create(ctx, &role, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	label := v1alpha1.SharedIPLabelPrefix + "172.18.0.18"
	for _, ns := range []string{nsA, nsB, nsC, podNS} {
		if ns != nsA {
			_, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
			g.Expect(err).NotTo(HaveOccurred())
		}
		bindLBPodRole(ctx, g, admin, ns, role.Name, podNS, saName)
		if ns != podNS {
			svc := createLabelled(ctx, g, admin, ns, "member", label)
			proveMember(svc)
			_, err := admin.CoreV1().Services(ns).UpdateStatus(ctx, svc, metav1.UpdateOptions{})
			g.Expect(err).NotTo(HaveOccurred())
		}
	}
	_, err = admin.CoreV1().ServiceAccounts(podNS).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: saName, Namespace: podNS,
		Annotations: map[string]string{v1alpha1.MemberNamespacesAnnotation: nsB + "," + nsC}}}, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())

	user, err := env.AddUser(envtest.User{Name: "system:serviceaccount:" + podNS + ":" + saName}, nil)
	g.Expect(err).NotTo(HaveOccurred())
	cfg := user.Config()
	flaky := &failServiceAccounts{left: 3}
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { flaky.rt = rt; return flaky }
	podClient := newLBPodClients(t, cfg)
	network, err := lbpod.ParseNetwork("172.18.0.18/16", "172.18.0.1", "172.18.0.0/16")
	g.Expect(err).NotTo(HaveOccurred())
	m, err := newMembership(nsA, "172.18.0.18", network)
	g.Expect(err).NotTo(HaveOccurred())
	src := &sharedSource{client: podClient.api, membership: m, own: nsA, podNamespace: podNS, serviceAccount: saName,
		retryMin: 20 * time.Millisecond, retryMax: 100 * time.Millisecond, log: slog.New(slog.NewTextHandler(os.Stderr, nil))}
	sink := &firstPublication{first: make(chan []string, 1)}
	go src.Run(ctx, sink)

	var first []string
	g.Eventually(sink.first).WithTimeout(20 * time.Second).Should(Receive(&first))
	g.Expect(first).To(Equal([]string{nsA + "/member", nsB + "/member", nsC + "/member"}))
	g.Expect(flaky.failing()).To(BeZero(), "the three 503s were answered")

	// The one-shot read (lbpod init) fails on the same passing failure rather than return
	// LBPOD_NAMESPACE's members alone; once the read goes through, all of them.
	flaky.mu.Lock()
	flaky.left = 1
	flaky.mu.Unlock()
	_, err = src.Get(ctx)
	g.Expect(err).To(MatchError(ContainSubstring("serviceaccount " + podNS + "/" + saName)))
	got, err := src.Get(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(names(got)).To(Equal([]string{nsA + "/member", nsB + "/member", nsC + "/member"}))
}
