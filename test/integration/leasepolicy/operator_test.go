//go:build integration

package leasepolicy

import (
	"net/netip"
	"testing"
	"time"

	"github.com/lbsvc/lbsvc-operator/controllers/lbobjects"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

const deniedWrite = "ValidatingAdmissionPolicy 'lbsvc-operator-writes' with binding 'lbsvc-operator-writes' denied request: "

// TestOperatorWritesPolicy: the operator's own token, with the ClusterRole as shipped, writes
// what the operator builds (an lb Deployment, budget, ServiceAccount, RoleBindings and election
// key, for a Service of its namespace, one with --lb-pod-namespace and a shared address) and
// nothing else its RBAC would let it: no bootstrap or ServiceAccount token Secret (a credential
// of its choosing), no binding of its own ClusterRole, no Deployment whose pods run as another
// ServiceAccount or with host access, privilege, other capabilities or another Secret, no
// change to or delete of a Deployment not ours, no budget over other pods. Each refusal is
// checked for the rule that made it. An admin is not matched.
func TestOperatorWritesPolicy(t *testing.T) {
	g, ctx, admin, cfg := apiServer(t, "team-a", "lbpods", "lbsvc-system", "kube-system")
	var role rbacv1.ClusterRole
	var binding rbacv1.ClusterRoleBinding
	var sa corev1.ServiceAccount
	decodeFile(t, "../../../config/rbac/role.yaml", &role)
	decodeFile(t, "../../../config/rbac/role_binding.yaml", &binding)
	decodeFile(t, "../../../config/rbac/service_account.yaml", &sa)
	_, err := admin.RbacV1().ClusterRoles().Create(ctx, &role, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	_, err = admin.RbacV1().ClusterRoleBindings().Create(ctx, &binding, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	_, err = admin.CoreV1().ServiceAccounts(sa.Namespace).Create(ctx, &sa, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	op := tokenClient(t, admin, cfg, sa.Namespace, sa.Name, nil)
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}

	// A bootstrap token whose secret the token's holder chose: a login from outside the cluster.
	bootstrap := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "bootstrap-token-abcdef", Namespace: "kube-system"},
		Type: corev1.SecretTypeBootstrapToken, StringData: map[string]string{"token-id": "abcdef", "token-secret": "0123456789abcdef",
			"usage-bootstrap-authentication": "true", "auth-extra-groups": "system:bootstrappers:kubeadm:default-node-token"}}
	g.Eventually(func() error { _, err := op.CoreV1().Secrets("kube-system").Create(ctx, bootstrap, dry); return err }).
		WithTimeout(20*time.Second).WithPolling(100*time.Millisecond).
		Should(MatchError(HaveSuffix(deniedWrite+"the operator may write only objects named lb-svc-* or lbsvc-lbpod*, not bootstrap-token-abcdef")), "the policy is enforced")
	_, err = admin.CoreV1().Secrets("kube-system").Create(ctx, bootstrap, dry)
	g.Expect(err).NotTo(HaveOccurred(), "an admin is not matched")

	// What the operator builds passes: created, changed, deleted.
	ip := lbobjects.IPRef{Name: "172.18.0.12", UID: "ip-uid"}
	base := lbobjects.Params{ServiceName: "web", ServiceNamespace: "team-a", ServiceUID: "uid-web",
		Provider: "lb-svc-attachment.kube-system", NADName: "lb-svc-attachment", NADNamespace: "kube-system", SubnetName: "attach-subnet",
		Addresses: []netip.Addr{netip.MustParseAddr("172.18.0.12")}, CIDRs: []netip.Prefix{netip.MustParsePrefix("172.18.0.0/16")},
		Gateways: []netip.Addr{netip.MustParseAddr("172.18.0.1")}, Image: "localhost/lbsvc-lbpod:dev", Sysctls: lbobjects.ForwardingIPv6,
		Replicas: 2, Claim: []lbobjects.IPRef{ip}}
	moved, shared := base, base
	moved.PodNamespace = "lbpods"
	shared.PodNamespace, shared.ServiceName, shared.Shared, shared.MemberNamespaces = "lbpods", "dns", &ip, []string{"kube-system"}
	var built *appsv1.Deployment
	for _, p := range []lbobjects.Params{base, moved, shared} {
		set, err := lbobjects.Build(p)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(set.HAKeySecret).NotTo(BeNil())
		g.Expect(set.PodDisruptionBudget).NotTo(BeNil())
		podNS := lbobjects.PodNamespace(p.PodNamespace, p.ServiceNamespace)
		_, err = op.CoreV1().ServiceAccounts(podNS).Create(ctx, set.ServiceAccount, metav1.CreateOptions{})
		g.Expect(err).NotTo(HaveOccurred(), "%s: ServiceAccount", p.ServiceName)
		for _, rb := range append([]*rbacv1.RoleBinding{set.RoleBinding}, set.MemberRoleBindings...) {
			_, err = op.RbacV1().RoleBindings(rb.Namespace).Create(ctx, rb, metav1.CreateOptions{})
			g.Expect(err).NotTo(HaveOccurred(), "%s: RoleBinding %s/%s", p.ServiceName, rb.Namespace, rb.Name)
		}
		_, err = op.CoreV1().Secrets(podNS).Create(ctx, set.HAKeySecret, metav1.CreateOptions{})
		g.Expect(err).NotTo(HaveOccurred(), "%s: key Secret", p.ServiceName)
		_, err = op.PolicyV1().PodDisruptionBudgets(podNS).Create(ctx, set.PodDisruptionBudget, metav1.CreateOptions{})
		g.Expect(err).NotTo(HaveOccurred(), "%s: budget", p.ServiceName)
		d, err := op.AppsV1().Deployments(podNS).Create(ctx, set.Deployment, metav1.CreateOptions{})
		g.Expect(err).NotTo(HaveOccurred(), "%s: Deployment", p.ServiceName)
		d, err = op.AppsV1().Deployments(podNS).Patch(ctx, d.Name, types.MergePatchType, []byte(`{"spec":{"replicas":3}}`), metav1.PatchOptions{})
		g.Expect(err).NotTo(HaveOccurred(), "%s: Deployment changed", p.ServiceName)
		built = d
	}
	// One of ours whose component label an admin removed (the cache no longer sees it): the
	// operator may still change it, as it does to put the label back (its Service UID label,
	// annotation and owner reference say it built it).
	_, err = admin.AppsV1().Deployments(built.Namespace).Patch(ctx, built.Name, types.JSONPatchType,
		[]byte(`[{"op":"remove","path":"/metadata/labels/app.kubernetes.io~1component"}]`), metav1.PatchOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	_, err = op.AppsV1().Deployments(built.Namespace).Patch(ctx, built.Name, types.MergePatchType,
		[]byte(`{"metadata":{"labels":{"app.kubernetes.io/component":"lb-svc"}}}`), metav1.PatchOptions{})
	g.Expect(err).NotTo(HaveOccurred(), "our Deployment, its label removed by hand, given it back")
	g.Expect(op.AppsV1().Deployments(built.Namespace).Delete(ctx, built.Name, metav1.DeleteOptions{})).To(Succeed())
	g.Expect(op.PolicyV1().PodDisruptionBudgets(built.Namespace).Delete(ctx, built.Name, metav1.DeleteOptions{})).To(Succeed())
	g.Expect(op.CoreV1().ServiceAccounts(built.Namespace).Delete(ctx, built.Name, metav1.DeleteOptions{})).To(Succeed())
	g.Expect(op.RbacV1().RoleBindings("kube-system").Delete(ctx, built.Name, metav1.DeleteOptions{})).To(Succeed())
	// A RoleBinding of an earlier release, to the Service's own Role, is deleted when retired
	// (labelled and annotated as that release built it: lbobjects' objectMeta then).
	old := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "lb-svc-old", Namespace: "team-a",
		Labels:      map[string]string{"app.kubernetes.io/component": "lb-svc", "app.kubernetes.io/managed-by": "lbsvc-operator"},
		Annotations: map[string]string{"lbsvc.io/service-uid": "9f3c1b7e-0000-4000-8000-000000000001"}},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "lb-svc-old"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "lb-svc-old", Namespace: "team-a"}}}
	_, err = admin.RbacV1().RoleBindings("team-a").Create(ctx, old, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(op.RbacV1().RoleBindings("team-a").Delete(ctx, old.Name, metav1.DeleteOptions{})).To(Succeed())

	// Objects of others, as an admin made them: neither changed nor deleted by the operator.
	foreign := lbPodDeployment(t, base, nil)
	foreign.Name, foreign.Namespace, foreign.Labels = "coredns", "kube-system", map[string]string{"k8s-app": "kube-dns"}
	foreign.ResourceVersion, foreign.Annotations, foreign.OwnerReferences = "", nil, nil
	_, err = admin.AppsV1().Deployments("kube-system").Create(ctx, foreign, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	unlabelled := foreign.DeepCopy()
	unlabelled.Name = "lb-svc-someone-elses"
	_, err = admin.AppsV1().Deployments("kube-system").Create(ctx, unlabelled, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())

	const (
		named    = "the operator may write only objects named lb-svc-* or lbsvc-lbpod*, not "
		labelled = "the operator may create only objects labelled app.kubernetes.io/component=lb-svc, and change or delete only those it built (that label, our Service UID, shared-ip label or owner reference)"
		keys     = "the operator may create only election key Secrets (immutable, Opaque, named lb-svc-*-ha-*)"
		binds    = "the operator may bind only the ClusterRole lbsvc-lbpod"
		budgets  = "the operator may budget only pods labelled app.kubernetes.io/component=lb-svc"
		lbPods   = "the operator may run only lb pods (named lb-svc-*, labelled app.kubernetes.io/component=lb-svc, under an lb pod ServiceAccount)"
		host     = "an lb pod may use no host namespace and no volume but emptyDir and its election key"
		caps     = "an lb pod's containers may not be privileged or escalate, add no capability but NET_ADMIN and NET_RAW, open no host port and read no Secret through the environment"
	)
	key, _ := lbobjects.Build(base)
	secret := func(mutate func(*corev1.Secret)) func(kubernetes.Interface) error {
		s := key.HAKeySecret.DeepCopy()
		s.Name += "-x"
		mutate(s)
		return func(c kubernetes.Interface) error {
			_, err := c.CoreV1().Secrets(s.Namespace).Create(ctx, s, dry)
			return err
		}
	}
	deployment := func(mutate func(*appsv1.Deployment)) func(kubernetes.Interface) error {
		d := lbPodDeployment(t, base, mutate)
		return func(c kubernetes.Interface) error {
			_, err := c.AppsV1().Deployments(d.Namespace).Create(ctx, d, dry)
			return err
		}
	}
	pod := func(mutate func(*corev1.PodSpec)) func(kubernetes.Interface) error {
		return deployment(func(d *appsv1.Deployment) { mutate(&d.Spec.Template.Spec) })
	}
	main := func(mutate func(*corev1.Container)) func(kubernetes.Interface) error {
		return pod(func(s *corev1.PodSpec) { mutate(&s.Containers[0]) })
	}
	for _, c := range []struct {
		name  string
		write func(kubernetes.Interface) error
		rule  string
	}{
		{"a ServiceAccount token Secret of another identity", secret(func(s *corev1.Secret) {
			s.Type, s.Annotations = corev1.SecretTypeServiceAccountToken, map[string]string{corev1.ServiceAccountNameKey: "default"}
		}), keys},
		{"a mutable key Secret", secret(func(s *corev1.Secret) { s.Immutable = nil }), keys},
		{"a Secret named like ours without the key's name", secret(func(s *corev1.Secret) { s.Name = "lb-svc-web" }), keys},
		{"a Secret without our label", secret(func(s *corev1.Secret) { s.Labels = nil }), labelled},
		{"a binding of the operator's own ClusterRole to every user", func(c kubernetes.Interface) error {
			rb := key.RoleBinding.DeepCopy()
			rb.Namespace, rb.RoleRef.Name = "kube-system", "lbsvc-operator"
			rb.Subjects = []rbacv1.Subject{{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "system:authenticated"}}
			_, err := c.RbacV1().RoleBindings(rb.Namespace).Create(ctx, rb, dry)
			return err
		}, binds},
		{"a ServiceAccount not ours", func(c kubernetes.Interface) error {
			_, err := c.CoreV1().ServiceAccounts("kube-system").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "replicaset-controller"}}, dry)
			return err
		}, named + "replicaset-controller"},
		{"a budget over other pods", func(c kubernetes.Interface) error {
			b := key.PodDisruptionBudget.DeepCopy()
			b.Namespace, b.Spec.Selector = "kube-system", &metav1.LabelSelector{MatchLabels: map[string]string{"k8s-app": "kube-dns"}}
			_, err := c.PolicyV1().PodDisruptionBudgets(b.Namespace).Create(ctx, b, dry)
			return err
		}, budgets},
		{"a Deployment not named ours", deployment(func(d *appsv1.Deployment) { d.Name = "coredns-2" }), named + "coredns-2"},
		{"pods under another ServiceAccount", pod(func(s *corev1.PodSpec) { s.ServiceAccountName = "replicaset-controller" }), lbPods},
		{"pods without our label", deployment(func(d *appsv1.Deployment) {
			delete(d.Spec.Template.Labels, "app.kubernetes.io/component")
			d.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"lbsvc.io/service": "web"}}
		}), lbPods},
		{"the host's network", pod(func(s *corev1.PodSpec) { s.HostNetwork = true }), host},
		{"the host's processes", pod(func(s *corev1.PodSpec) { s.HostPID = true }), host},
		{"a host path", pod(func(s *corev1.PodSpec) {
			s.Volumes = append(s.Volumes, corev1.Volume{Name: "root", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}})
		}), host},
		{"another Secret as a volume", pod(func(s *corev1.PodSpec) {
			s.Volumes = append(s.Volumes, corev1.Volume{Name: "token", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "admin-token"}}})
		}), host},
		{"a privileged container", main(func(c *corev1.Container) {
			c.SecurityContext.Privileged, c.SecurityContext.AllowPrivilegeEscalation = ptr.To(true), nil
		}), caps},
		{"privilege escalation", main(func(c *corev1.Container) { c.SecurityContext.AllowPrivilegeEscalation = nil }), caps},
		{"another capability", main(func(c *corev1.Container) {
			c.SecurityContext.Capabilities.Add = append(c.SecurityContext.Capabilities.Add, "SYS_ADMIN")
		}), caps},
		{"a host port", main(func(c *corev1.Container) { c.Ports = []corev1.ContainerPort{{ContainerPort: 22, HostPort: 22}} }), caps},
		{"a Secret in the environment", main(func(c *corev1.Container) {
			c.Env = append(c.Env, corev1.EnvVar{Name: "T", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: "admin-token"}, Key: "token"}}})
		}), caps},
		{"an init container with another capability", pod(func(s *corev1.PodSpec) {
			init := s.Containers[0].DeepCopy()
			init.Name, init.SecurityContext.Capabilities.Add = "init", []corev1.Capability{"SYS_PTRACE"}
			init.ReadinessProbe, init.LivenessProbe = nil, nil
			s.InitContainers = []corev1.Container{*init}
		}), caps},
		{"a change to another's Deployment", func(c kubernetes.Interface) error {
			_, err := c.AppsV1().Deployments("kube-system").Patch(ctx, unlabelled.Name, types.MergePatchType,
				[]byte(`{"metadata":{"labels":{"app.kubernetes.io/component":"lb-svc"}}}`), metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
			return err
		}, labelled},
		{"a delete of another's Deployment named like ours", func(c kubernetes.Interface) error {
			return c.AppsV1().Deployments("kube-system").Delete(ctx, unlabelled.Name, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
		}, labelled},
		{"a delete of another's Deployment", func(c kubernetes.Interface) error {
			return c.AppsV1().Deployments("kube-system").Delete(ctx, "coredns", metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
		}, named + "coredns"},
	} {
		err := c.write(op)
		g.Expect(apierrors.IsForbidden(err)).To(BeTrue(), "%s: %v", c.name, err)
		g.Expect(err.Error()).To(HaveSuffix(deniedWrite+c.rule), c.name)
	}
	// The policy is the only thing that refused them: the same writes as an admin pass.
	g.Expect(deployment(func(d *appsv1.Deployment) { d.Name, d.Spec.Template.Spec.HostNetwork = "lb-svc-admin", true })(admin)).To(Succeed())
	g.Expect(secret(func(s *corev1.Secret) { s.Immutable = nil })(admin)).To(Succeed())
}

// lbPodDeployment is the Deployment the operator builds for p, changed by mutate (nil: none).
func lbPodDeployment(t *testing.T, p lbobjects.Params, mutate func(*appsv1.Deployment)) *appsv1.Deployment {
	t.Helper()
	d, err := lbobjects.BuildDeployment(p)
	if err != nil {
		t.Fatal(err)
	}
	if mutate != nil {
		mutate(d)
	}
	return d
}
