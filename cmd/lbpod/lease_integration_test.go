//go:build integration

package main

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/lbsvc/lbsvc-operator/controllers/lbobjects"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// The Lease recorder against a real kube-apiserver with exactly the Role and Lease the operator
// builds for a Service with standbys: each takeover is one write naming the new holder, a repeated
// takeover by the same pod writes nothing, and the pod can touch no other Lease.
func TestLeaseRecorderWithOperatorRBAC(t *testing.T) {
	g := NewWithT(t)
	const ns = "lbpod-lease"
	env, admin, ctx := startAPIServer(t, ns)
	params := lbobjects.Params{ServiceName: "web", ServiceNamespace: ns, ServiceUID: "uid-web", Replicas: 2}
	role := lbobjects.BuildRole(params)
	_, err := admin.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	_, err = admin.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name, Namespace: ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: "User", Name: "lb-pod"}},
	}, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	lease := lbobjects.BuildLease(params)
	lease.OwnerReferences = nil // no Service object here to own it
	_, err = admin.CoordinationV1().Leases(ns).Create(ctx, lease, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	user, err := env.AddUser(envtest.User{Name: "lb-pod"}, nil)
	g.Expect(err).NotTo(HaveOccurred())
	podClient := kubernetes.NewForConfigOrDie(user.Config())
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))

	name := lease.Name // what the operator gives the pod in LBPOD_LEASE

	holder := func() (string, int32) {
		l, err := admin.CoordinationV1().Leases(ns).Get(ctx, name, metav1.GetOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		return ptr.Deref(l.Spec.HolderIdentity, ""), ptr.Deref(l.Spec.LeaseTransitions, -1)
	}
	a := newLeaseRecorder(podClient, ns, name, "lb-svc-web-7d9f8b6c5d-aaaaa", log)
	b := newLeaseRecorder(podClient, ns, name, "lb-svc-web-7d9f8b6c5d-bbbbb", log)
	go a.run(ctx)
	go b.run(ctx)

	a.onRole(true)
	g.Eventually(func() []any { h, n := holder(); return []any{h, n} }).WithTimeout(5 * time.Second).WithPolling(20 * time.Millisecond).
		Should(Equal([]any{"lb-svc-web-7d9f8b6c5d-aaaaa", int32(0)}))
	a.onRole(false)
	b.onRole(true)
	g.Eventually(func() []any { h, n := holder(); return []any{h, n} }).WithTimeout(5 * time.Second).WithPolling(20 * time.Millisecond).
		Should(Equal([]any{"lb-svc-web-7d9f8b6c5d-bbbbb", int32(1)}))

	// The same pod again: nothing to write (b is active, so it is also not asked to).
	before, err := admin.CoordinationV1().Leases(ns).Get(ctx, name, metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(b.write(ctx)).To(Succeed())
	after, err := admin.CoordinationV1().Leases(ns).Get(ctx, name, metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(after.ResourceVersion).To(Equal(before.ResourceVersion))

	// A losing claimant's late write (a, no longer active, writes itself in): b, still active,
	// sees it through its watch and writes itself back.
	g.Expect(a.write(ctx)).To(Succeed())
	g.Eventually(func() []any { h, n := holder(); return []any{h, n} }).WithTimeout(5 * time.Second).WithPolling(20 * time.Millisecond).
		Should(Equal([]any{"lb-svc-web-7d9f8b6c5d-bbbbb", int32(3)}))

	// Another Lease is out of reach.
	other := newLeaseRecorder(podClient, ns, "lb-svc-other", "lb-svc-web-7d9f8b6c5d-aaaaa", log)
	err = other.write(ctx)
	g.Expect(apierrors.IsForbidden(err)).To(BeTrue(), "write another Lease: %v", err)
}

// startAPIServer starts a kube-apiserver and etcd (envtest), creates namespace ns, and returns the
// environment (to add users), an admin client and a context that ends with the test.
func startAPIServer(t *testing.T, ns string) (*envtest.Environment, kubernetes.Interface, context.Context) {
	t.Helper()
	g := NewWithT(t)
	env := &envtest.Environment{}
	cfg, err := env.Start()
	g.Expect(err).NotTo(HaveOccurred(), "envtest (set KUBEBUILDER_ASSETS, see make envtest-assets)")
	t.Cleanup(func() { _ = env.Stop() })
	admin := kubernetes.NewForConfigOrDie(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	_, err = admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	return env, admin, ctx
}
