//go:build integration

package main

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
	"github.com/lbsvc/lbsvc-operator/lbpod"
)

// The API source against a real kube-apiserver, with the lb pod's RBAC: get/list/watch on its one
// Service (resourceNames). List and watch only pass because they carry the field selector on the
// name; the Service's changes and deletion reach the box.
func TestAPISourceWithSingleServiceRBAC(t *testing.T) {
	g := NewWithT(t)
	const ns, name = "lbpod-source", "web"
	env, admin, ctx := startAPIServer(t, ns)
	var err error
	for _, svcName := range []string{name, "other"} {
		_, err = admin.CoreV1().Services(ns).Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: svcName, Namespace: ns},
			Spec: corev1.ServiceSpec{
				Type:  corev1.ServiceTypeLoadBalancer,
				Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}},
			},
		}, metav1.CreateOptions{})
		g.Expect(err).NotTo(HaveOccurred())
	}
	_, err = admin.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "lb-svc-" + name, Namespace: ns},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"services"}, ResourceNames: []string{name}, Verbs: []string{"get", "list", "watch"}}},
	}, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	_, err = admin.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "lb-svc-" + name, Namespace: ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "lb-svc-" + name},
		Subjects:   []rbacv1.Subject{{Kind: "User", Name: "lb-svc-" + name}},
	}, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())

	user, err := env.AddUser(envtest.User{Name: "lb-svc-" + name}, nil)
	g.Expect(err).NotTo(HaveOccurred())
	podClient := newLBPodClients(t, user.Config())
	src := &apiSource{client: podClient.api, namespace: ns, name: name, log: slog.New(slog.NewTextHandler(os.Stderr, nil))}

	// The RBAC is as narrow as meant: the other Service, and a list without the selector, are refused.
	_, err = podClient.CoreV1().Services(ns).Get(ctx, "other", metav1.GetOptions{})
	g.Expect(apierrors.IsForbidden(err)).To(BeTrue(), "get other: %v", err)
	_, err = podClient.CoreV1().Services(ns).List(ctx, metav1.ListOptions{})
	g.Expect(apierrors.IsForbidden(err)).To(BeTrue(), "list without selector: %v", err)

	got, err := src.Get(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got).To(HaveLen(1))
	g.Expect(got[0].Name).To(Equal(name))

	box := newServiceBox()
	go src.Run(ctx, box)
	ports := func() []int32 {
		svc, err := box.get()
		if err != nil || svc == nil {
			return nil
		}
		var ps []int32
		for _, p := range svc.Spec.Ports {
			ps = append(ps, p.Port)
		}
		return ps
	}
	g.Eventually(ports).WithTimeout(10 * time.Second).WithPolling(20 * time.Millisecond).Should(Equal([]int32{80}))

	svc, err := admin.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Name: "https", Port: 443, Protocol: corev1.ProtocolTCP})
	_, err = admin.CoreV1().Services(ns).Update(ctx, svc, metav1.UpdateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Eventually(ports).WithTimeout(time.Second).WithPolling(10 * time.Millisecond).Should(Equal([]int32{80, 443}))

	// A change to the other Service is not seen (nor allowed to be).
	g.Expect(admin.CoreV1().Services(ns).Delete(ctx, "other", metav1.DeleteOptions{})).To(Succeed())
	g.Expect(admin.CoreV1().Services(ns).Delete(ctx, name, metav1.DeleteOptions{})).To(Succeed())
	g.Eventually(func() string {
		_, err := box.get()
		if err == nil {
			return ""
		}
		return err.Error()
	}).WithTimeout(5 * time.Second).WithPolling(20 * time.Millisecond).Should(Equal("service lbpod-source/web was deleted"))
}

// The shared address's source against a real kube-apiserver: the lb pod (list/watch of the
// namespace's Services) sees as members only the labelled Services whose status lists its
// address. A tenant who may edit Services labels its own Service but cannot write its status, so
// it gets nothing; the status the operator writes makes a member, a deletion unmakes it.
func TestSharedSourceStatusIsTheProof(t *testing.T) {
	g := NewWithT(t)
	const ns = "lbpod-shared"
	env, admin, ctx := startAPIServer(t, ns)
	network, err := lbpod.ParseNetwork("172.18.0.18/16", "172.18.0.1", "172.18.0.0/16")
	g.Expect(err).NotTo(HaveOccurred())
	label := v1alpha1.SharedIPLabelPrefix + "172.18.0.18"
	for _, u := range []struct {
		name  string
		verbs []string
	}{{"lb-pod", []string{"get", "list", "watch"}}, {"tenant", []string{"get", "list", "watch", "create", "update", "patch"}}} {
		_, err = admin.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Name: u.name, Namespace: ns},
			// As the edit role: services, not services/status.
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"services"}, Verbs: u.verbs}},
		}, metav1.CreateOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		_, err = admin.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: u.name, Namespace: ns},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: u.name},
			Subjects:   []rbacv1.Subject{{Kind: "User", Name: u.name}},
		}, metav1.CreateOptions{})
		g.Expect(err).NotTo(HaveOccurred())
	}
	client := func(name string) *rest.Config {
		user, err := env.AddUser(envtest.User{Name: name}, nil)
		g.Expect(err).NotTo(HaveOccurred())
		return user.Config()
	}
	podClient, tenant := newLBPodClients(t, client("lb-pod")), kubernetes.NewForConfigOrDie(client("tenant"))
	create := func(c kubernetes.Interface, name string) *corev1.Service {
		return createLabelled(ctx, g, c, ns, name, label)
	}
	prove := func(c kubernetes.Interface, svc *corev1.Service) error {
		svc = svc.DeepCopy()
		proveMember(svc)
		_, err := c.CoreV1().Services(ns).UpdateStatus(ctx, svc, metav1.UpdateOptions{})
		return err
	}
	a, b, intruder := create(admin, "a"), create(admin, "b"), create(tenant, "intruder")
	g.Expect(prove(admin, a)).To(Succeed())
	err = prove(tenant, intruder)
	g.Expect(apierrors.IsForbidden(err)).To(BeTrue(), "a tenant writes its status: %v", err)

	m, err := newMembership(ns, "172.18.0.18", network)
	g.Expect(err).NotTo(HaveOccurred())
	src := &sharedSource{client: podClient.api, membership: m, own: ns, log: slog.New(slog.NewTextHandler(os.Stderr, nil))}
	got, err := src.Get(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(names(got)).To(Equal([]string{ns + "/a"}))

	box := newServiceBox()
	go src.Run(ctx, box)
	members := func() []string { n, _ := box.members(); return n }
	g.Eventually(members).WithTimeout(10 * time.Second).WithPolling(20 * time.Millisecond).Should(Equal([]string{ns + "/a"}))
	b, err = admin.CoreV1().Services(ns).Get(ctx, b.Name, metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(prove(admin, b)).To(Succeed())
	g.Eventually(members).WithTimeout(5 * time.Second).WithPolling(10 * time.Millisecond).Should(Equal([]string{ns + "/a", ns + "/b"}))
	g.Expect(admin.CoreV1().Services(ns).Delete(ctx, "a", metav1.DeleteOptions{})).To(Succeed())
	g.Eventually(members).WithTimeout(5 * time.Second).WithPolling(10 * time.Millisecond).Should(Equal([]string{ns + "/b"}))
	g.Consistently(members).WithTimeout(300*time.Millisecond).WithPolling(20*time.Millisecond).Should(Equal([]string{ns + "/b"}), "the intruder never joins")
}

// A shared address with members in several namespaces, against a real kube-apiserver, with the
// RBAC the lb pods get: the ClusterRole lbsvc-lbpod as shipped, bound by RoleBindings to the
// address's ServiceAccount (in the lb pod namespace) where the operator binds it. The namespaces
// watched are LBPOD_NAMESPACE and those the ServiceAccount's annotation lists; a namespace not yet
// bound holds nothing back and joins when its RoleBinding comes; a ServiceAccount the pod cannot
// read yet leaves it with LBPOD_NAMESPACE alone; the annotation dropping a namespace drops its
// members; a bound namespace the annotation does not list, and a labelled Service without the
// status proof, give no member.
func TestSharedSourceAcrossNamespaces(t *testing.T) {
	g := NewWithT(t)
	const nsA, nsB, nsC, podNS, saName = "xns-a", "xns-b", "xns-c", "xns-lb", "lb-172-18-0-18"
	env, admin, ctx := startAPIServer(t, nsA)
	for _, ns := range []string{nsB, nsC, podNS} {
		_, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		g.Expect(err).NotTo(HaveOccurred())
	}
	var role rbacv1.ClusterRole
	readYAML(t, "../../config/rbac/lbpod_role.yaml", &role)
	_, err := admin.RbacV1().ClusterRoles().Create(ctx, &role, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	bind := func(ns string) { bindLBPodRole(ctx, g, admin, ns, role.Name, podNS, saName) }
	_, err = admin.CoreV1().ServiceAccounts(podNS).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: saName, Namespace: podNS,
		Annotations: map[string]string{v1alpha1.MemberNamespacesAnnotation: nsB + ",Not_A_Namespace"}}}, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	label := v1alpha1.SharedIPLabelPrefix + "172.18.0.18"
	service := func(ns, name string, proven bool) {
		t.Helper()
		svc := createLabelled(ctx, g, admin, ns, name, label)
		if proven {
			proveMember(svc)
			_, err := admin.CoreV1().Services(ns).UpdateStatus(ctx, svc, metav1.UpdateOptions{})
			g.Expect(err).NotTo(HaveOccurred())
		}
	}
	for _, ns := range []string{nsA, nsB, nsC} {
		service(ns, "member", true)
		service(ns, "label-only", false)
	}
	bind(nsA)
	bind(nsC)
	user, err := env.AddUser(envtest.User{Name: "system:serviceaccount:" + podNS + ":" + saName}, nil)
	g.Expect(err).NotTo(HaveOccurred())
	podClient := newLBPodClients(t, user.Config())
	network, err := lbpod.ParseNetwork("172.18.0.18/16", "172.18.0.1", "172.18.0.0/16")
	g.Expect(err).NotTo(HaveOccurred())
	m, err := newMembership(nsA, "172.18.0.18", network)
	g.Expect(err).NotTo(HaveOccurred())
	start := func() func() []string {
		src := &sharedSource{client: podClient.api, membership: m, own: nsA, podNamespace: podNS, serviceAccount: saName,
			log: slog.New(slog.NewTextHandler(os.Stderr, nil))}
		box := newServiceBox()
		go src.Run(ctx, box)
		return func() []string { n, _ := box.members(); return n }
	}
	const a, b, c = nsA + "/member", nsB + "/member", nsC + "/member"

	// No RoleBinding in the lb pod namespace yet: the ServiceAccount cannot be read, and the lb
	// pod serves LBPOD_NAMESPACE's members.
	_, err = podClient.CoreV1().ServiceAccounts(podNS).Get(ctx, saName, metav1.GetOptions{})
	g.Expect(apierrors.IsForbidden(err)).To(BeTrue(), "read the ServiceAccount unbound: %v", err)
	unreadSA := start()
	g.Eventually(unreadSA).WithTimeout(5 * time.Second).WithPolling(20 * time.Millisecond).Should(Equal([]string{a}))

	// Bound in the lb pod namespace: a source started now reads B in the annotation, may not list
	// B's Services yet, and publishes A's members at once all the same.
	bind(podNS)
	g.Eventually(func() error {
		_, err := podClient.CoreV1().ServiceAccounts(podNS).Get(ctx, saName, metav1.GetOptions{})
		return err
	}).WithTimeout(5 * time.Second).WithPolling(20 * time.Millisecond).Should(Succeed())
	_, err = podClient.CoreV1().Services(nsB).List(ctx, metav1.ListOptions{LabelSelector: label})
	g.Expect(apierrors.IsForbidden(err)).To(BeTrue(), "list B's Services unbound: %v", err)
	members := start()
	g.Eventually(members).WithTimeout(5 * time.Second).WithPolling(20 * time.Millisecond).Should(Equal([]string{a}))
	g.Consistently(members).WithTimeout(300*time.Millisecond).WithPolling(20*time.Millisecond).Should(Equal([]string{a}), "C is bound but not listed")

	// B's RoleBinding: its member joins, on both (the first now reads the ServiceAccount too).
	bind(nsB)
	for _, src := range []func() []string{members, unreadSA} {
		g.Eventually(src).WithTimeout(20 * time.Second).WithPolling(20 * time.Millisecond).Should(Equal([]string{a, b}))
	}

	// The annotation lists C instead of B: B's member leaves, C's joins (its RoleBinding is there).
	sa, err := admin.CoreV1().ServiceAccounts(podNS).Get(ctx, saName, metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	sa.Annotations[v1alpha1.MemberNamespacesAnnotation] = nsC
	sa, err = admin.CoreV1().ServiceAccounts(podNS).Update(ctx, sa, metav1.UpdateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	for _, src := range []func() []string{members, unreadSA} {
		g.Eventually(src).WithTimeout(5 * time.Second).WithPolling(20 * time.Millisecond).Should(Equal([]string{a, c}))
	}

	// No annotation: A alone again.
	delete(sa.Annotations, v1alpha1.MemberNamespacesAnnotation)
	_, err = admin.CoreV1().ServiceAccounts(podNS).Update(ctx, sa, metav1.UpdateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	for _, src := range []func() []string{members, unreadSA} {
		g.Eventually(src).WithTimeout(5 * time.Second).WithPolling(20 * time.Millisecond).Should(Equal([]string{a}))
	}
	g.Consistently(members).WithTimeout(300 * time.Millisecond).WithPolling(20 * time.Millisecond).Should(Equal([]string{a}))
}

// bindLBPodRole binds, in namespace ns, the ClusterRole role to the ServiceAccount podNS/saName,
// as the operator binds lbsvc-lbpod for a shared address.
func bindLBPodRole(ctx context.Context, g Gomega, c kubernetes.Interface, ns, role, podNS, saName string) {
	_, err := c.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: saName, Namespace: ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: podNS, Name: saName}},
	}, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
}

// createLabelled creates, as c, a LoadBalancer Service (TCP 53) carrying label, without status.
func createLabelled(ctx context.Context, g Gomega, c kubernetes.Interface, ns, name, label string) *corev1.Service {
	svc, err := c.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{label: ""}},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer,
			Ports: []corev1.ServicePort{{Name: "dns", Port: 53, Protocol: corev1.ProtocolTCP}}},
	}, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	return svc
}

// proveMember writes into svc's status what the operator writes for a member of the shared
// address 172.18.0.18: the address as an ingress entry, and our AddressAllocated condition.
func proveMember(svc *corev1.Service) {
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "172.18.0.18"}}
	svc.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionAddressAllocated, Status: metav1.ConditionTrue,
		Reason: "Allocated", LastTransitionTime: metav1.Now()}}
}
