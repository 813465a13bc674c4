//go:build integration

package main

import (
	"log/slog"
	"os"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/lbsvc/lbsvc-operator/controllers"
	"github.com/lbsvc/lbsvc-operator/lbpod"
)

// The holder record against a real kube-apiserver, with exactly the Role the operator builds for
// a Service with standbys: each takeover writes the Lease once (holder, one transition more), the
// same pod again writes nothing, and the Role allows nothing beyond that one Lease.
func TestHolderRecordWithOperatorRole(t *testing.T) {
	g := NewWithT(t)
	env, admin, ctx := startAPIServer(t)
	var err error

	const ns = "lbpod-holder"
	_, err = admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	p := controllers.LBPodParams{ServiceName: "web", ServiceNamespace: ns, ServiceUID: "uid-1", Replicas: 2}
	role, err := controllers.BuildRole(p)
	g.Expect(err).NotTo(HaveOccurred())
	role.OwnerReferences = nil
	_, err = admin.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	rb, err := controllers.BuildRoleBinding(p)
	g.Expect(err).NotTo(HaveOccurred())
	rb.OwnerReferences = nil
	_, err = admin.RbacV1().RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	lease := controllers.BuildLease(p)
	lease.OwnerReferences = nil
	_, err = admin.CoordinationV1().Leases(ns).Create(ctx, lease, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	_, err = admin.CoordinationV1().Leases(ns).Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "other", Namespace: ns}}, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())

	// The lb pod's ServiceAccount, as envtest can authenticate it.
	user, err := env.AddUser(envtest.User{Name: "system:serviceaccount:" + ns + ":lb-svc-web", Groups: []string{"system:serviceaccounts"}}, nil)
	g.Expect(err).NotTo(HaveOccurred())
	pod := kubernetes.NewForConfigOrDie(user.Config()).CoordinationV1().Leases(ns)

	// Nothing beyond the one Lease: not another, not create, not list.
	other, err := admin.CoordinationV1().Leases(ns).Get(ctx, "other", metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	_, err = pod.Update(ctx, other, metav1.UpdateOptions{})
	g.Expect(apierrors.IsForbidden(err)).To(BeTrue(), "update other: %v", err)
	_, err = pod.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "mine", Namespace: ns}}, metav1.CreateOptions{})
	g.Expect(apierrors.IsForbidden(err)).To(BeTrue(), "create: %v", err)
	_, err = pod.List(ctx, metav1.ListOptions{})
	g.Expect(apierrors.IsForbidden(err)).To(BeTrue(), "list: %v", err)

	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	holder := func() (string, int32) {
		l, err := admin.CoordinationV1().Leases(ns).Get(ctx, "lb-svc-web", metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil || l.Spec.LeaseTransitions == nil {
			return "", -1
		}
		return *l.Spec.HolderIdentity, *l.Spec.LeaseTransitions
	}
	a := lbpod.NewHolderRecord(pod, "lb-svc-web", "lb-svc-web-a", log)
	go a.Run(ctx)
	a.Held(true)
	g.Eventually(func(g Gomega) {
		id, n := holder()
		g.Expect(id).To(Equal("lb-svc-web-a"))
		g.Expect(n).To(Equal(int32(0)))
	}).WithTimeout(10 * time.Second).WithPolling(20 * time.Millisecond).Should(Succeed())

	b := lbpod.NewHolderRecord(pod, "lb-svc-web", "lb-svc-web-b", log)
	go b.Run(ctx)
	a.Held(false)
	b.Held(true)
	g.Eventually(func(g Gomega) {
		id, n := holder()
		g.Expect(id).To(Equal("lb-svc-web-b"))
		g.Expect(n).To(Equal(int32(1)))
	}).WithTimeout(10 * time.Second).WithPolling(20 * time.Millisecond).Should(Succeed())
	before, err := admin.CoordinationV1().Leases(ns).Get(ctx, "lb-svc-web", metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())

	// The same pod reporting again (a restarted container) writes nothing.
	b.Held(false)
	b.Held(true)
	g.Consistently(func() string {
		l, err := admin.CoordinationV1().Leases(ns).Get(ctx, "lb-svc-web", metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		return l.ResourceVersion
	}).WithTimeout(time.Second).WithPolling(50 * time.Millisecond).Should(Equal(before.ResourceVersion))
}
