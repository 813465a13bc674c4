//go:build integration

package main

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/lbsvc/lbsvc-operator/controllers/lbobjects"

	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"
)

// installLBPodRBAC creates, as admin, what the operator's install gives lb pods: the ClusterRole
// lbsvc-lbpod and the Lease admission policy, read from config/rbac as shipped. It returns once
// the policy is enforced (the API server loads it asynchronously): a dry-run create by the pod
// of a Lease not its own is denied by it.
func installLBPodRBAC(t *testing.T, admin, pod kubernetes.Interface, ns string) {
	t.Helper()
	g := NewWithT(t)
	ctx := context.Background()
	var role rbacv1.ClusterRole
	readYAML(t, "../../config/rbac/lbpod_role.yaml", &role)
	_, err := admin.RbacV1().ClusterRoles().Create(ctx, &role, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	var policy admissionregistrationv1.ValidatingAdmissionPolicy
	var binding admissionregistrationv1.ValidatingAdmissionPolicyBinding
	readYAML(t, "../../config/rbac/lbpod_lease_policy.yaml", &policy, &binding)
	_, err = admin.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, &policy, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	_, err = admin.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, &binding, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	probe := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "lb-svc-probe", Namespace: ns,
		Labels: map[string]string{"app.kubernetes.io/component": "lb-svc"}}}
	g.Eventually(func() string {
		_, err := pod.CoordinationV1().Leases(ns).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return errString(err)
	}).WithTimeout(20 * time.Second).WithPolling(100 * time.Millisecond).Should(ContainSubstring(
		"ValidatingAdmissionPolicy 'lbsvc-lbpod-lease' with binding 'lbsvc-lbpod-lease' denied request"))
}

// readYAML decodes the documents of file (separated by ---) into objs, in order.
func readYAML(t *testing.T, file string, objs ...any) {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var docs []string
	for _, d := range strings.Split(string(b), "\n---\n") {
		if strings.Contains(d, "kind:") {
			docs = append(docs, d)
		}
	}
	if len(docs) != len(objs) {
		t.Fatalf("%s: %d documents, want %d", file, len(docs), len(objs))
	}
	for i, d := range docs {
		if err := yaml.UnmarshalStrict([]byte(d), objs[i]); err != nil {
			t.Fatalf("%s document %d: %v", file, i, err)
		}
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// The Lease recorder against a real kube-apiserver with exactly the rights the operator gives an
// lb pod of a Service with standbys (its RoleBinding to the ClusterRole lbsvc-lbpod, and the Lease
// admission policy, both as shipped in config/rbac): the first takeover creates the Lease, with
// our labels and the Service as owner; each later takeover is one write naming the new holder, a
// repeated takeover by the same pod writes nothing, and the pod can write no other Lease: not
// another one in its namespace (admission), not its own name elsewhere (RBAC), not one without
// our label, and it cannot change its Lease's labels.
func TestLeaseRecorderWithOperatorRBAC(t *testing.T) {
	g := NewWithT(t)
	const ns, other = "lbpod-lease", "lbpod-lease-other"
	env, admin, ctx := startAPIServer(t, ns)
	_, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: other}}, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	svc, err := admin.CoreV1().Services(ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}}, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	params := lbobjects.Params{ServiceName: "web", ServiceNamespace: ns, ServiceUID: svc.UID, Replicas: 2}
	_, err = admin.RbacV1().RoleBindings(ns).Create(ctx, lbobjects.BuildRoleBinding(params), metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	// The pod's own identity: the username of its ServiceAccount, which the RoleBinding names.
	name := lbobjects.BuildServiceAccount(params).Name // also what the operator gives the pod in LBPOD_LEASE
	user, err := env.AddUser(envtest.User{Name: "system:serviceaccount:" + ns + ":" + name}, nil)
	g.Expect(err).NotTo(HaveOccurred())
	podClient := kubernetes.NewForConfigOrDie(user.Config())
	installLBPodRBAC(t, admin, podClient, ns)
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))

	holder := func() (string, int32) {
		l, err := admin.CoordinationV1().Leases(ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return "(none)", -1
		}
		g.Expect(err).NotTo(HaveOccurred())
		return ptr.Deref(l.Spec.HolderIdentity, ""), ptr.Deref(l.Spec.LeaseTransitions, -1)
	}
	h, _ := holder()
	g.Expect(h).To(Equal("(none)"), "no Lease before the first takeover")
	a := newLeaseRecorder(podClient, ns, "web", name, "lb-svc-web-7d9f8b6c5d-aaaaa", log)
	b := newLeaseRecorder(podClient, ns, "web", name, "lb-svc-web-7d9f8b6c5d-bbbbb", log)
	go a.run(ctx)
	go b.run(ctx)

	a.onRole(true)
	g.Eventually(func() []any { h, n := holder(); return []any{h, n} }).WithTimeout(5 * time.Second).WithPolling(20 * time.Millisecond).
		Should(Equal([]any{"lb-svc-web-7d9f8b6c5d-aaaaa", int32(0)}))
	created, err := admin.CoordinationV1().Leases(ns).Get(ctx, name, metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(created.Labels).To(Equal(map[string]string{"app.kubernetes.io/component": "lb-svc", "app.kubernetes.io/managed-by": "lbsvc-operator",
		"lbsvc.io/service": "web", "lbsvc.io/service-namespace": ns, "lbsvc.io/service-uid": string(svc.UID)}))
	g.Expect(created.OwnerReferences).To(Equal([]metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: "web", UID: svc.UID, Controller: ptr.To(true)}}))

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

	// Another Lease of the namespace, ours by its labels, is out of reach: neither created nor
	// updated (the admission policy).
	denied := "ValidatingAdmissionPolicy 'lbsvc-lbpod-lease' with binding 'lbsvc-lbpod-lease' denied request: an lb pod may write only its own Service's Lease " + name + ", not lb-svc-other"
	err = newLeaseRecorder(podClient, ns, "web", "lb-svc-other", "lb-svc-web-7d9f8b6c5d-aaaaa", log).write(ctx)
	g.Expect(apierrors.IsForbidden(err)).To(BeTrue(), "create another Lease: %v", err)
	g.Expect(err.Error()).To(Equal("leases.coordination.k8s.io \"lb-svc-other\" is forbidden: " + denied))
	otherLease := lbobjects.BuildLease("lb-svc-other", svc)
	_, err = admin.CoordinationV1().Leases(ns).Create(ctx, otherLease, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	err = newLeaseRecorder(podClient, ns, "web", "lb-svc-other", "lb-svc-web-7d9f8b6c5d-aaaaa", log).write(ctx)
	g.Expect(apierrors.IsForbidden(err)).To(BeTrue(), "update another Lease: %v", err)
	g.Expect(err.Error()).To(Equal("leases.coordination.k8s.io \"lb-svc-other\" is forbidden: " + denied))

	// Its own Lease's labels stay as they are.
	own, err := podClient.CoordinationV1().Leases(ns).Get(ctx, name, metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	delete(own.Labels, "lbsvc.io/service-uid")
	_, err = podClient.CoordinationV1().Leases(ns).Update(ctx, own, metav1.UpdateOptions{})
	g.Expect(apierrors.IsForbidden(err)).To(BeTrue(), "relabel its Lease: %v", err)
	g.Expect(err.Error()).To(HaveSuffix("denied request: an lb pod may not change the labels of its Lease"))

	// A Lease of its own name without our component label (dry run: the name is taken here).
	bare := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}
	_, err = podClient.CoordinationV1().Leases(ns).Create(ctx, bare, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	g.Expect(apierrors.IsForbidden(err)).To(BeTrue(), "create an unlabelled Lease: %v", err)
	g.Expect(err.Error()).To(HaveSuffix("denied request: an lb pod may write only a Lease labelled app.kubernetes.io/component=lb-svc"))

	// Its own name in another namespace: no RoleBinding there (RBAC).
	elsewhere := lbobjects.BuildLease(name, svc)
	elsewhere.Namespace, elsewhere.OwnerReferences = other, nil
	_, err = podClient.CoordinationV1().Leases(other).Create(ctx, elsewhere, metav1.CreateOptions{})
	g.Expect(apierrors.IsForbidden(err)).To(BeTrue(), "create a Lease in another namespace: %v", err)
	g.Expect(err.Error()).To(ContainSubstring("cannot create resource \"leases\" in API group \"coordination.k8s.io\" in the namespace \"" + other + "\""))
	// Nor delete its own.
	err = podClient.CoordinationV1().Leases(ns).Delete(ctx, name, metav1.DeleteOptions{})
	g.Expect(apierrors.IsForbidden(err)).To(BeTrue(), "delete its Lease: %v", err)
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
