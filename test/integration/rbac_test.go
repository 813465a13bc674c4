//go:build integration

package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lbsvc/lbsvc-operator/controllers/lbobjects"

	. "github.com/onsi/gomega"
	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
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

// operatorConfig installs config/rbac/role.yaml (bound to the operator's ServiceAccount) and
// config/rbac/lbpod_role.yaml with the admin client c, and returns a client configuration that
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
	// The admin configuration's client-side rate limit (envtest's: 1000/s), not client-go's default
	// 5/s, which would throttle the operator under the churn test's hundreds of Services.
	user, err := env.AddUser(envtest.User{Name: "system:serviceaccount:" + operatorNS + ":" + operatorSA,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + operatorNS}}, &rest.Config{QPS: env.Config.QPS, Burst: env.Config.Burst})
	if err != nil {
		return nil, err
	}
	return user.Config(), nil
}

// An upgrade from a release with a Role per Service: the Service's RoleBinding names that Role,
// and a roleRef cannot be changed. The operator (as its own ServiceAccount, which may neither
// write Roles nor grant what it does not hold, only bind lbsvc-lbpod) deletes that binding and
// creates it again bound to the ClusterRole lbsvc-lbpod, with the same subject; the old Role is
// left alone (it goes with the Service, by its owner reference).
func TestUpgradeRebindsToLBPodClusterRole(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	f := newFixture(t)
	stopOperator()
	svc := lbService(f.ns, "up", f.provider, f.ip("90"))
	create(t, svc)
	p := lbobjects.Params{ServiceName: "up", ServiceNamespace: f.ns, ServiceUID: svc.UID}
	old := lbobjects.BuildRoleBinding(p)
	old.RoleRef = rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "lb-svc-up"}
	oldRole := &rbacv1.Role{ObjectMeta: *old.ObjectMeta.DeepCopy(), Rules: []rbacv1.PolicyRule{{APIGroups: []string{""},
		Resources: []string{"services"}, ResourceNames: []string{"up"}, Verbs: []string{"get", "list", "watch"}}}}
	create(t, oldRole)
	create(t, old)
	startOperator(true)
	waitAddress(t, f.ns, "up", f.ip("90"))

	key := client.ObjectKey{Namespace: f.ns, Name: "lb-svc-up"}
	g.Eventually(func(g Gomega) {
		rb := &rbacv1.RoleBinding{}
		g.Expect(k8s.Get(ctx, key, rb)).To(Succeed())
		g.Expect(rb.UID).NotTo(Equal(old.UID), "a new binding")
		g.Expect(rb.RoleRef).To(Equal(rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "lbsvc-lbpod"}))
		g.Expect(rb.Subjects).To(Equal([]rbacv1.Subject{{Kind: "ServiceAccount", Name: "lb-svc-up", Namespace: f.ns}}))
		g.Expect(rb.OwnerReferences).To(HaveLen(1))
		g.Expect(rb.OwnerReferences[0].UID).To(Equal(svc.UID))
	}, timeout, interval).Should(Succeed())
	r := &rbacv1.Role{}
	g.Expect(k8s.Get(ctx, key, r)).To(Succeed())
	g.Expect(r.UID).To(Equal(oldRole.UID), "the old Role is left as it was")

	// The lb pod's ServiceAccount now has exactly the ClusterRole's rights in the namespace.
	sa := "system:serviceaccount:" + f.ns + ":lb-svc-up"
	for _, c := range []struct {
		verb, group, resource, name string
		allowed                     bool
	}{{"get", "", "services", "up", true}, {"update", "coordination.k8s.io", "leases", "lb-svc-up", true},
		{"delete", "coordination.k8s.io", "leases", "lb-svc-up", false}, {"get", "", "secrets", "", false}, {"patch", "", "pods", "", false}} {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: sa,
			Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + f.ns},
			ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: f.ns, Verb: c.verb, Group: c.group, Resource: c.resource, Name: c.name}}}
		g.Eventually(func(g Gomega) {
			g.Expect(k8s.Create(ctx, sar)).To(Succeed())
			g.Expect(sar.Status.Allowed).To(Equal(c.allowed), "%s %s %s", c.verb, c.resource, c.name)
		}, timeout, interval).Should(Succeed())
	}
}
