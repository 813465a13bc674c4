//go:build integration

package integration

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"

	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"
)

// The suite's operator runs as its own ServiceAccount with exactly the rights the install gives
// it (config/rbac: the generated ClusterRole), and the lb pods' ClusterRole exists as installed,
// so that every test also proves those rights suffice: a request they do not allow fails the
// pass as it would on a cluster.
const (
	operatorSA, operatorNS = "lbsvc-operator", "lbsvc-system"
)

// operatorConfig installs config/rbac/role.yaml (bound to the operator's ServiceAccount),
// config/rbac/lbpod_role.yaml and the admission policies with the admin client c, and returns a client configuration that
// authenticates as that ServiceAccount.
func operatorConfig(ctx context.Context, env *envtest.Environment, c client.Client) (*rest.Config, error) {
	var role, lbpod rbacv1.ClusterRole
	for file, into := range map[string]*rbacv1.ClusterRole{"role.yaml": &role, "lbpod_role.yaml": &lbpod} {
		b, err := os.ReadFile(filepath.Join("..", "..", "config", "rbac", file))
		if err != nil {
			return nil, err
		}
		if err := yaml.Unmarshal([]byte(strings.TrimPrefix(string(b), "---\n")), into); err != nil {
			return nil, fmt.Errorf("config/rbac/%s: %w", file, err)
		}
	}
	for _, obj := range []client.Object{&role, &lbpod,
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: role.Name},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: operatorSA, Namespace: operatorNS}}},
	} {
		if err := c.Create(ctx, obj); err != nil {
			return nil, fmt.Errorf("create %s: %w", obj.GetName(), err)
		}
	}
	// The install's admission policies too, lbsvc-operator-writes above all: every write of the
	// operator in every test passes it, or the test fails as the pass would on a cluster.
	for _, file := range []string{"lbpod_lease_policy.yaml", "lbpod_binding_policy.yaml", "operator_writes_policy.yaml"} {
		b, err := os.ReadFile(filepath.Join("..", "..", "config", "rbac", file))
		if err != nil {
			return nil, err
		}
		d := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
		var policy admissionregistrationv1.ValidatingAdmissionPolicy
		var binding admissionregistrationv1.ValidatingAdmissionPolicyBinding
		for _, into := range []client.Object{&policy, &binding} {
			if err := d.Decode(into); err != nil {
				return nil, fmt.Errorf("config/rbac/%s: %w", file, err)
			}
			if err := c.Create(ctx, into); err != nil {
				return nil, fmt.Errorf("create %s: %w", into.GetName(), err)
			}
		}
	}
	// The admin configuration's client-side rate limit (envtest's: 1000/s), not client-go's default
	// 5/s, which would throttle the operator under the churn test's hundreds of Services.
	user, err := env.AddUser(envtest.User{Name: "system:serviceaccount:" + operatorNS + ":" + operatorSA,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + operatorNS}}, &rest.Config{QPS: env.Config.QPS, Burst: env.Config.Burst})
	if err != nil {
		return nil, err
	}
	// The policies are in force once the API server has loaded them: wait for a write only
	// lbsvc-operator-writes refuses (a Secret not ours, as a dry run) to be refused.
	op, err := client.New(user.Config(), client.Options{})
	if err != nil {
		return nil, err
	}
	var last error
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		last = op.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "not-ours", Namespace: "default"}}, client.DryRunAll)
		return last != nil && strings.Contains(last.Error(), "lbsvc-operator-writes"), nil
	}); err != nil {
		return nil, fmt.Errorf("the policy lbsvc-operator-writes is not in force after 30 s: %v", last)
	}
	return user.Config(), nil
}

// An upgrade from a release with a ServiceAccount and RoleBinding per Service (here bound to a
// Role per Service, as the release before that did): the Deployment moves to the namespace's
// identity at once; the Service's own ServiceAccount and RoleBinding stay while the Deployment has
// not rolled out (its old pods still run under them) and go, as the operator's own
// ServiceAccount, once it has. The old Role is left alone (it goes with the Service, by its owner
// reference). The identity has exactly the ClusterRole's rights, in the namespace only.
func TestUpgradeToNamespaceIdentity(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	f := newFixture(t)
	stopOperator()
	svc := lbService(f.ns, "up", f.provider, f.ip("90"))
	create(t, svc)
	own := metav1.ObjectMeta{Name: "lb-svc-up", Namespace: f.ns, Labels: map[string]string{lbv1.ComponentLabel: lbv1.ComponentLBPod,
		lbv1.ServiceLabel: "up", lbv1.ServiceNamespaceLabel: f.ns, lbv1.ServiceUIDLabel: string(svc.UID)},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: "up", UID: svc.UID, Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}}}
	oldSA := &corev1.ServiceAccount{ObjectMeta: *own.DeepCopy()}
	oldRole := &rbacv1.Role{ObjectMeta: *own.DeepCopy(), Rules: []rbacv1.PolicyRule{{APIGroups: []string{""},
		Resources: []string{"services"}, ResourceNames: []string{"up"}, Verbs: []string{"get", "list", "watch"}}}}
	oldRB := &rbacv1.RoleBinding{ObjectMeta: *own.DeepCopy(), RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "lb-svc-up"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "lb-svc-up", Namespace: f.ns}}}
	for _, o := range []client.Object{oldSA, oldRole, oldRB} {
		create(t, o)
	}
	startOperator(true)
	waitAddress(t, f.ns, "up", f.ip("90"))

	key := client.ObjectKey{Namespace: f.ns, Name: "lb-svc-up"}
	identity := client.ObjectKey{Namespace: f.ns, Name: "lbsvc-lbpod"}
	d := &appsv1.Deployment{}
	g.Eventually(func(g Gomega) {
		g.Expect(k8s.Get(ctx, key, d)).To(Succeed())
		g.Expect(d.Spec.Template.Spec.ServiceAccountName).To(Equal("lbsvc-lbpod"))
		rb := &rbacv1.RoleBinding{}
		g.Expect(k8s.Get(ctx, identity, rb)).To(Succeed())
		g.Expect(rb.RoleRef).To(Equal(rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "lbsvc-lbpod"}))
		g.Expect(rb.Subjects).To(Equal([]rbacv1.Subject{{Kind: "ServiceAccount", Name: "lbsvc-lbpod", Namespace: f.ns}}))
		g.Expect(k8s.Get(ctx, identity, &corev1.ServiceAccount{})).To(Succeed())
	}, timeout, interval).Should(Succeed())
	// No Deployment controller runs here: the Deployment has not rolled out, the old pair stays.
	g.Consistently(func(g Gomega) {
		g.Expect(k8s.Get(ctx, key, &corev1.ServiceAccount{})).To(Succeed())
		g.Expect(k8s.Get(ctx, key, &rbacv1.RoleBinding{})).To(Succeed())
	}, 2*time.Second, 200*time.Millisecond).Should(Succeed())

	// The Deployment controller's report of a finished rollout.
	g.Expect(k8s.Get(ctx, key, d)).To(Succeed())
	n := *d.Spec.Replicas
	d.Status = appsv1.DeploymentStatus{ObservedGeneration: d.Generation, Replicas: n, UpdatedReplicas: n, ReadyReplicas: n, AvailableReplicas: n}
	g.Expect(k8s.Status().Update(ctx, d)).To(Succeed())
	for _, o := range []client.Object{&corev1.ServiceAccount{}, &rbacv1.RoleBinding{}} {
		g.Eventually(func() bool { return apierrors.IsNotFound(k8s.Get(ctx, key, o)) }, timeout, interval).Should(BeTrue(), "%T retired", o)
	}
	r := &rbacv1.Role{}
	g.Expect(k8s.Get(ctx, key, r)).To(Succeed())
	g.Expect(r.UID).To(Equal(oldRole.UID), "the old Role is left as it was")
	g.Expect(k8s.Get(ctx, identity, &corev1.ServiceAccount{})).To(Succeed())

	// The namespace's binding deleted by hand wakes the Services it serves: it is back.
	gone := &rbacv1.RoleBinding{}
	g.Expect(k8s.Get(ctx, identity, gone)).To(Succeed())
	g.Expect(k8s.Delete(ctx, gone)).To(Succeed())
	g.Eventually(func(g Gomega) {
		rb := &rbacv1.RoleBinding{}
		g.Expect(k8s.Get(ctx, identity, rb)).To(Succeed())
		g.Expect(rb.UID).NotTo(Equal(gone.UID))
	}, timeout, interval).Should(Succeed())

	// The identity now has exactly the ClusterRole's rights in the namespace, and none elsewhere.
	sa := "system:serviceaccount:" + f.ns + ":lbsvc-lbpod"
	for _, c := range []struct {
		ns, verb, group, resource, name string
		allowed                         bool
	}{{f.ns, "get", "", "services", "up", true}, {f.ns, "update", "coordination.k8s.io", "leases", "lb-svc-up", true},
		{f.ns, "delete", "coordination.k8s.io", "leases", "lb-svc-up", false}, {f.ns, "get", "", "secrets", "", false},
		{f.ns, "patch", "", "pods", "", false}, {"default", "get", "", "services", "", false}} {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: sa,
			Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + f.ns},
			ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: c.ns, Verb: c.verb, Group: c.group, Resource: c.resource, Name: c.name}}}
		g.Eventually(func(g Gomega) {
			g.Expect(k8s.Create(ctx, sar)).To(Succeed())
			g.Expect(sar.Status.Allowed).To(Equal(c.allowed), "%s %s %s in %s", c.verb, c.resource, c.name, c.ns)
		}, timeout, interval).Should(Succeed())
	}
}
