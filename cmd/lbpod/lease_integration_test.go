//go:build integration

package main

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
	"github.com/lbsvc/lbsvc-operator/controllers/lbobjects"
	"github.com/lbsvc/lbsvc-operator/lbpod/ha"
	"github.com/lbsvc/lbsvc-operator/test/apiserver"

	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"
)

var (
	macA = ha.ID{2, 0, 0, 0, 0, 0xa}
	macB = ha.ID{2, 0, 0, 0, 0, 0xb}
)

const (
	podA = "lb-svc-web-7d9f8b6c5d-aaaaa"
	podB = "lb-svc-web-7d9f8b6c5d-bbbbb"
)

// The Lease recorder against a real kube-apiserver with exactly the rights the operator gives an
// lb pod of a Service with standbys (its RoleBinding to the ClusterRole lbsvc-lbpod, and the Lease
// admission policy, both as shipped in config/rbac): the first takeover creates the Lease (our
// labels, the Service as owner); each newer claim is one write naming the new holder; an older or
// equal claim writes nothing and is told the newer one (the fence); a superseded replica's note is
// written once; and the pod can write no other Lease: not another one in its namespace
// (admission), not its own name elsewhere (RBAC), not one without our label, and it cannot change
// its Lease's labels or delete it.
func TestLeaseRecorderWithOperatorRBAC(t *testing.T) {
	g := NewWithT(t)
	const ns, other = "lbpod-lease", "lbpod-lease-other"
	admin, ctx, params, podClient := startWithService(t, ns)
	_, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: other}}, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	svc := serviceOf(params)
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	name := lbobjects.LeaseName("", ns, "web") // what the operator gives the pod in LBPOD_LEASE
	lease := func() *coordinationv1.Lease {
		l, err := admin.CoordinationV1().Leases(ns).Get(ctx, name, metav1.GetOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		return l
	}
	record := func() []any {
		l, err := admin.CoordinationV1().Leases(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return []any{err.Error()}
		}
		return []any{ptr.Deref(l.Spec.HolderIdentity, ""), ptr.Deref(l.Spec.LeaseTransitions, -1), l.Annotations[v1alpha1.HAClaimAnnotation]}
	}
	a := newLeaseRecorder(podClient.api, ns, "web", name, podA, log)
	b := newLeaseRecorder(podClient.api, ns, "web", name, podB, log)
	go a.run(ctx)
	go b.run(ctx)

	// No Lease: the first takeover creates it, as the operator would have.
	a.Claimed(ha.Claim{Term: 1, Priority: 100, Sender: macA})
	g.Eventually(record).WithTimeout(5 * time.Second).WithPolling(20 * time.Millisecond).
		Should(Equal([]any{podA, int32(0), "1 100 02:00:00:00:00:0a"}))
	created := lease()
	g.Expect(created.Labels).To(Equal(map[string]string{"app.kubernetes.io/component": "lb-svc", "app.kubernetes.io/managed-by": "lbsvc-operator",
		"lbsvc.io/service": "web", "lbsvc.io/service-namespace": ns, "lbsvc.io/service-uid": string(params.ServiceUID)}))
	g.Expect(created.OwnerReferences).To(Equal([]metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: "web", UID: params.ServiceUID, Controller: ptr.To(true)}}))

	// Deleted while a holds (the garbage collector taking a Lease of an earlier owner of the
	// name): a creates it again at once, with its claim.
	g.Expect(admin.CoordinationV1().Leases(ns).Delete(ctx, name, metav1.DeleteOptions{})).To(Succeed())
	g.Eventually(func() ([]any, error) {
		l, err := admin.CoordinationV1().Leases(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		return []any{ptr.Deref(l.Spec.HolderIdentity, ""), l.Annotations[v1alpha1.HAClaimAnnotation], l.UID != created.UID}, nil
	}).WithTimeout(5 * time.Second).WithPolling(20 * time.Millisecond).Should(Equal([]any{podA, "1 100 02:00:00:00:00:0a", true}))

	// A newer claim by the other pod: one write, one transition; the old holder is told.
	b.Claimed(ha.Claim{Term: 2, Priority: 100, Sender: macB})
	g.Eventually(record).WithTimeout(5 * time.Second).WithPolling(20 * time.Millisecond).
		Should(Equal([]any{podB, int32(1), "2 100 02:00:00:00:00:0b"}))
	g.Eventually(a.Claims()).WithTimeout(5 * time.Second).Should(Receive(Equal(ha.Claim{Term: 2, Priority: 100, Sender: macB})))

	// Never over a newer claim: a's older claim (an active that has not let go yet) and b's same
	// claim again write nothing; a is told b's claim once more.
	before := lease().ResourceVersion
	a.mu.Lock()
	a.told = ha.Claim{} // as if it had not been told yet
	a.mu.Unlock()
	a.Claimed(ha.Claim{Term: 1, Priority: 100, Sender: macA})
	g.Expect(a.sync(ctx)).To(Succeed())
	g.Expect(b.sync(ctx)).To(Succeed())
	g.Expect(lease().ResourceVersion).To(Equal(before))
	g.Eventually(a.Claims()).WithTimeout(5 * time.Second).Should(Receive(Equal(ha.Claim{Term: 2, Priority: 100, Sender: macB})))
	// The same term and priority, a higher MAC than b's would win; a lower one does not.
	a.Claimed(ha.Claim{Term: 2, Priority: 100, Sender: ha.ID{2, 0, 0, 0, 0, 1}})
	g.Expect(a.sync(ctx)).To(Succeed())
	g.Expect(lease().ResourceVersion).To(Equal(before))

	// The superseded replica's note names both pods, its term, the other's and when; it is
	// written once (a second sync has nothing to write).
	a.Claimed(ha.Claim{})
	a.now = func() time.Time { return time.Date(2026, 11, 24, 17, 0, 0, 0, time.UTC) }
	a.Superseded(ha.Claim{Term: 1, Priority: 100, Sender: macA}, ha.Claim{Term: 2, Priority: 100, Sender: macB})
	g.Eventually(func() string { return lease().Annotations[v1alpha1.HeldTwiceAnnotation] }).WithTimeout(5 * time.Second).WithPolling(20 * time.Millisecond).
		Should(Equal(podA + " 2026-11-24T17:00:00Z 1 " + podB + " 2"))
	noted := lease().ResourceVersion
	g.Expect(a.sync(ctx)).To(Succeed())
	g.Expect(lease().ResourceVersion).To(Equal(noted))
	g.Expect(record()).To(Equal([]any{podB, int32(1), "2 100 02:00:00:00:00:0b"}))

	// Another Lease of the namespace, ours by its labels, is out of reach: neither created nor
	// updated (the admission policy).
	otherRecorder := func() *leaseRecorder {
		r := newLeaseRecorder(podClient.api, ns, "web", "lb-svc-other", podA, log)
		r.Claimed(ha.Claim{Term: 9, Priority: 100, Sender: macA})
		return r
	}
	denied := "ValidatingAdmissionPolicy 'lbsvc-lbpod-lease' with binding 'lbsvc-lbpod-lease' denied request: an lb pod may write only its own Service's Lease (the one its pod name " + podA + " begins with), not lb-svc-other"
	err = otherRecorder().sync(ctx)
	g.Expect(apierrors.IsForbidden(err)).To(BeTrue(), "create another Lease: %v", err)
	g.Expect(err.Error()).To(Equal("leases.coordination.k8s.io \"lb-svc-other\" is forbidden: " + denied))
	otherLease := lbobjects.BuildLease("lb-svc-other", svc)
	_, err = admin.CoordinationV1().Leases(ns).Create(ctx, otherLease, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	err = otherRecorder().sync(ctx)
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

// A write that lands between the recorder's read and its Update (another replica's claim) makes
// the Update conflict; the recorder reads again and compares again: it never writes over the
// newer claim, it writes over an older one, and it is told the newer one.
func TestLeaseRecorderConflict(t *testing.T) {
	g := NewWithT(t)
	const ns = "lbpod-conflict"
	admin, ctx, params, podClient := startWithService(t, ns)
	name := lbobjects.LeaseName("", ns, "web")
	_, err := admin.CoordinationV1().Leases(ns).Create(ctx, lbobjects.BuildLease(name, serviceOf(params)), metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	b := newLeaseRecorder(podClient.api, ns, "web", name, podB, log)

	for _, tc := range []struct {
		name     string
		ours     uint64 // a's term
		between  uint64 // b's term, written between a's read and a's Update
		want     string // the recorded claim in the end
		wantTold uint64 // the last term a is told (the election ignores it when older than ours)
	}{
		{"a newer claim lands in between: ours is not written", 3, 4, "4 100 02:00:00:00:00:0b", 4},
		{"an older claim lands in between: ours is written over it", 7, 6, "7 100 02:00:00:00:00:0a", 6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			updates := 0
			hooked := &hookedClient{apiClient: podClient.api, beforeUpdate: func() {
				if updates++; updates == 1 {
					b.Claimed(ha.Claim{Term: tc.between, Priority: 100, Sender: macB})
					g.Expect(b.sync(ctx)).To(Succeed())
					b.Claimed(ha.Claim{})
				}
			}}
			a := newLeaseRecorder(hooked, ns, "web", name, podA, log)
			a.Claimed(ha.Claim{Term: tc.ours, Priority: 100, Sender: macA})
			err := a.sync(ctx)
			g.Expect(apierrors.IsConflict(err)).To(BeTrue(), "the first attempt conflicts: %v", err)
			g.Expect(a.sync(ctx)).To(Succeed())
			l, err := admin.CoordinationV1().Leases(ns).Get(ctx, name, metav1.GetOptions{})
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(l.Annotations[v1alpha1.HAClaimAnnotation]).To(Equal(tc.want))
			g.Expect(a.Claims()).To(Receive(Equal(ha.Claim{Term: tc.wantTold, Priority: 100, Sender: macB})))
		})
	}
}

// hookedClient runs beforeUpdate before each Lease Update, to land another write in between.
type hookedClient struct {
	apiClient
	beforeUpdate func()
}

func (c *hookedClient) Leases(ns string) objectClient[*coordinationv1.Lease, *coordinationv1.LeaseList] {
	return hookedLeases{c.apiClient.Leases(ns), c.beforeUpdate}
}

type hookedLeases struct {
	objectClient[*coordinationv1.Lease, *coordinationv1.LeaseList]
	beforeUpdate func()
}

func (l hookedLeases) Update(ctx context.Context, lease *coordinationv1.Lease, o metav1.UpdateOptions) (*coordinationv1.Lease, error) {
	l.beforeUpdate()
	return l.objectClient.Update(ctx, lease, o)
}

// lbPodClients are two clients with one identity (an lb pod's): api, the client the lb pod itself
// uses, for the code under test; and a clientset, for the checks of what that identity may do.
type lbPodClients struct {
	kubernetes.Interface
	api apiClient
}

func newLBPodClients(t *testing.T, cfg *rest.Config) lbPodClients {
	t.Helper()
	api, err := newAPIClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return lbPodClients{Interface: kubernetes.NewForConfigOrDie(cfg), api: api}
}

// leaseTest is startWithService with what a test of web's Lease writes also needs: a Gomega, a
// log, and the Lease's name.
func leaseTest(t *testing.T, ns string) (Gomega, kubernetes.Interface, context.Context, lbobjects.Params, lbPodClients, *slog.Logger, string) {
	t.Helper()
	admin, ctx, params, podClient := startWithService(t, ns)
	return NewWithT(t), admin, ctx, params, podClient, slog.New(slog.NewTextHandler(os.Stderr, nil)), lbobjects.LeaseName("", ns, "web")
}

// startWithService starts the API server with Service "web" in namespace ns, and returns an admin
// client, the Service's Params (two lb pods) and a client as its lb pod (lbPodClient).
func startWithService(t *testing.T, ns string) (kubernetes.Interface, context.Context, lbobjects.Params, lbPodClients) {
	t.Helper()
	g := NewWithT(t)
	env, admin, ctx := startAPIServer(t, ns)
	svc, err := admin.CoreV1().Services(ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}}, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	params := lbobjects.Params{ServiceName: "web", ServiceNamespace: ns, ServiceUID: svc.UID, Replicas: 2}
	return admin, ctx, params, lbPodClient(t, env, admin, ctx, params)
}

// lbPodClient is a client as the lb pod's ServiceAccount (its username, which the RoleBinding
// names) with what the operator gives it: the RoleBinding to the ClusterRole lbsvc-lbpod, and the
// Lease admission policy, both as shipped (installLBPodRBAC).
func lbPodClient(t *testing.T, env *envtest.Environment, admin kubernetes.Interface, ctx context.Context, params lbobjects.Params) lbPodClients {
	t.Helper()
	g := NewWithT(t)
	ns := params.ServiceNamespace
	_, err := admin.RbacV1().RoleBindings(ns).Create(ctx, lbobjects.BuildRoleBinding(params), metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	// As the namespace's lb pod ServiceAccount, with the pod name its token carries (the API server
	// puts it in the user's extra; here impersonation does, from the admin's credentials:
	// test/integration/leasepolicy holds the policy to real tokens bound to pods).
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + ns + ":" + lbobjects.BuildServiceAccount(params).Name,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
		Extra:  map[string][]string{"authentication.kubernetes.io/pod-name": {podA}}}
	pod := newLBPodClients(t, cfg)
	installLBPodRBAC(t, admin, pod, ns)
	return pod
}

// serviceOf is the Service of params, as far as the Lease's labels and owner need it.
func serviceOf(params lbobjects.Params) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: params.ServiceName, Namespace: params.ServiceNamespace, UID: params.ServiceUID}}
}

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

// startAPIServer starts a kube-apiserver and etcd (envtest), creates namespace ns, and returns the
// environment (to add users), an admin client and a context that ends with the test.
func startAPIServer(t *testing.T, ns string) (*envtest.Environment, kubernetes.Interface, context.Context) {
	t.Helper()
	env, _, admin := apiserver.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	_, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	NewWithT(t).Expect(err).NotTo(HaveOccurred())
	return env, admin, ctx
}
