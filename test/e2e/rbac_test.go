//go:build e2e

package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lbsvc/lbsvc-operator/controllers/lbobjects"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
)

// operatorUser is the operator's ServiceAccount as the Helm release of e2e.sh installs it.
const operatorUser = "system:serviceaccount:lbsvc-system:lbsvc-operator"

// canI is `kubectl auth can-i` as user: "yes" or "no" (can-i exits 1 on "no": the answer is the
// output, not the status). kubectl's warnings (a cluster-scoped resource asked with -n, as bind
// on a ClusterRole is: the binding's namespace is where it is checked) are not the answer.
func canI(user, namespace string, args ...string) string {
	out, _ := run(kubectl, append(append([]string{"auth", "can-i"}, args...), "-n", namespace, "--as="+user)...)
	for _, l := range nonEmptyLines(out) {
		if !strings.HasPrefix(l, "Warning: ") {
			return l
		}
	}
	return out
}

// TestRBACTable: what the operator's ServiceAccount and an lb pod's ServiceAccount may do on the
// real cluster, as the README's Security section states it (`kubectl auth can-i`, which asks the
// authorizer only), and, where admission decides or the answer must be seen on a real request,
// server-side dry runs as those identities.
func TestRBACTable(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	// Every lb pod of the namespace's Services runs as its one identity.
	lbPodSA := "system:serviceaccount:" + seedNamespace + ":" + lbobjects.IdentityName("", seedNamespace)
	// The seed is up (the test may run alone, first): its lb pod and its backends.
	seedPod := waitLBPod(t, seedNamespace, seedService)
	g.Expect(seedPod.Spec.ServiceAccountName).To(Equal("lbsvc-lbpod"))
	g.Eventually(backendNames, time.Minute).WithArguments(t).Should(HaveLen(backendReplicas))
	backends := backendNames(t)
	other := "e2e-rbac-" + suffix()
	kube(t, "create", "namespace", other)
	t.Cleanup(func() { _, _ = run(kubectl, "delete", "namespace", other, "--wait=false") })

	for _, c := range []struct {
		who, user, ns string
		args          []string
		want          string
	}{
		{"operator", operatorUser, seedNamespace, []string{"patch", "pods/" + backends[0]}, "no"},
		{"operator", operatorUser, seedNamespace, []string{"get", "pods"}, "yes"},
		{"operator", operatorUser, seedNamespace, []string{"delete", "pods"}, "no"},
		{"operator", operatorUser, "kube-system", []string{"create", "leases.coordination.k8s.io"}, "no"},
		{"operator", operatorUser, "kube-system", []string{"update", "leases.coordination.k8s.io"}, "no"},
		{"operator", operatorUser, "kube-system", []string{"delete", "leases.coordination.k8s.io"}, "no"},
		{"operator", operatorUser, seedNamespace, []string{"update", "leases.coordination.k8s.io"}, "no"},
		{"operator", operatorUser, seedNamespace, []string{"watch", "leases.coordination.k8s.io"}, "yes"},
		{"operator", operatorUser, "lbsvc-system", []string{"update", "leases.coordination.k8s.io/lbsvc-operator.lbsvc.io"}, "yes"},
		{"operator", operatorUser, "lbsvc-system", []string{"update", "leases.coordination.k8s.io/another"}, "no"},
		{"operator", operatorUser, "lbsvc-system", []string{"delete", "leases.coordination.k8s.io/lbsvc-operator.lbsvc.io"}, "no"},
		{"operator", operatorUser, seedNamespace, []string{"create", "roles.rbac.authorization.k8s.io"}, "no"},
		{"operator", operatorUser, seedNamespace, []string{"escalate", "roles.rbac.authorization.k8s.io"}, "no"},
		{"operator", operatorUser, seedNamespace, []string{"create", "rolebindings.rbac.authorization.k8s.io"}, "yes"},
		{"operator", operatorUser, seedNamespace, []string{"bind", "clusterroles.rbac.authorization.k8s.io/lbsvc-lbpod"}, "yes"},
		{"operator", operatorUser, seedNamespace, []string{"bind", "clusterroles.rbac.authorization.k8s.io/admin"}, "no"},
		{"operator", operatorUser, seedNamespace, []string{"get", "secrets"}, "no"},
		// No Service writes but through status (with the metadata it carries): a stolen token
		// cannot repoint a Service's selector or ports.
		{"operator", operatorUser, seedNamespace, []string{"patch", "services/" + seedService}, "no"},
		{"operator", operatorUser, "kube-system", []string{"update", "services"}, "no"},
		{"operator", operatorUser, seedNamespace, []string{"patch", "services/" + seedService, "--subresource=status"}, "yes"},
		{"operator", operatorUser, seedNamespace, []string{"create", "pods/exec"}, "no"},
		{"lb pod", lbPodSA, seedNamespace, []string{"get", "services/" + seedService}, "yes"},
		{"lb pod", lbPodSA, seedNamespace, []string{"update", "services/" + seedService}, "no"},
		{"lb pod", lbPodSA, seedNamespace, []string{"get", "secrets"}, "no"},
		{"lb pod", lbPodSA, seedNamespace, []string{"create", "pods/exec"}, "no"},
		{"lb pod", lbPodSA, seedNamespace, []string{"patch", "pods"}, "no"},
		{"lb pod", lbPodSA, seedNamespace, []string{"get", "pods"}, "no"},
		{"lb pod", lbPodSA, seedNamespace, []string{"update", "leases.coordination.k8s.io/" + lbobjects.ObjectName(seedService)}, "yes"},
		{"lb pod", lbPodSA, seedNamespace, []string{"delete", "leases.coordination.k8s.io"}, "no"},
		{"lb pod", lbPodSA, other, []string{"create", "leases.coordination.k8s.io"}, "no"},
		{"lb pod", lbPodSA, "kube-system", []string{"update", "leases.coordination.k8s.io"}, "no"},
		{"lb pod", lbPodSA, other, []string{"get", "services"}, "no"},
		// Its own ServiceAccount (a shared address's lists the member namespaces), only where bound.
		{"lb pod", lbPodSA, seedNamespace, []string{"watch", "serviceaccounts"}, "yes"},
		{"lb pod", lbPodSA, seedNamespace, []string{"update", "serviceaccounts"}, "no"},
		{"lb pod", lbPodSA, other, []string{"get", "serviceaccounts"}, "no"},
		{"operator", operatorUser, seedNamespace, []string{"update", "ips.lbsvc.io"}, "yes"},
	} {
		got := canI(c.user, c.ns, c.args...)
		t.Logf("%-8s -n %-12s can-i %-70s %s", c.who, c.ns, strings.Join(c.args, " "), got)
		g.Expect(got).To(Equal(c.want), "%s -n %s can-i %s", c.who, c.ns, strings.Join(c.args, " "))
	}

	// Real requests, server-side dry runs: the operator may not relabel a backend pod, create a
	// Lease in kube-system, nor grant rights it does not hold.
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		g.Expect(os.WriteFile(p, []byte(content), 0o600)).To(Succeed())
		return p
	}
	asOperator := "--as=" + operatorUser
	out, err := run(kubectl, "label", "pod", backends[0], "-n", seedNamespace, "e2e-rbac=1", "--dry-run=server", asOperator)
	g.Expect(err).To(HaveOccurred())
	g.Expect(out).To(ContainSubstring(`cannot patch resource "pods" in API group "" in the namespace "` + seedNamespace + `"`))
	leaseYAML := func(ns, name string) string {
		return "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata:\n  name: " + name + "\n  namespace: " + ns +
			"\n  labels:\n    " + lbv1.ComponentLabel + ": " + lbv1.ComponentLBPod + "\n"
	}
	out, err = run(kubectl, "create", "-f", write("ks.yaml", leaseYAML("kube-system", "e2e-rbac")), "--dry-run=server", asOperator)
	g.Expect(err).To(HaveOccurred())
	g.Expect(out).To(ContainSubstring(`cannot create resource "leases" in API group "coordination.k8s.io" in the namespace "kube-system"`))
	out, err = run(kubectl, "create", "rolebinding", "e2e-rbac", "--clusterrole=admin", "--serviceaccount="+seedNamespace+":default",
		"-n", seedNamespace, "--dry-run=server", asOperator)
	g.Expect(err).To(HaveOccurred())
	g.Expect(out).To(ContainSubstring("is attempting to grant RBAC permissions not currently held"))
	// A RoleBinding as the operator builds them (named and labelled ours), to lbsvc-lbpod only
	// and only for an lb pod identity (the ValidatingAdmissionPolicy lbsvc-lbpod-binding): bound
	// to any other subject (its own ServiceAccount here), it would write any Lease there.
	bindingYAML := func(ns, role, subject string) string {
		kind, name, _ := strings.Cut(subject, "/")
		who := "kind: Group\n  apiGroup: rbac.authorization.k8s.io\n  name: " + name
		if kind != "group" {
			who = "kind: ServiceAccount\n  namespace: " + kind + "\n  name: " + name
		}
		return "apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata:\n  name: lbsvc-lbpod-e2e-rbac\n  namespace: " + ns +
			"\n  labels:\n    " + lbv1.ComponentLabel + ": " + lbv1.ComponentLBPod +
			"\nroleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: ClusterRole\n  name: " + role + "\nsubjects:\n- " + who + "\n"
	}
	out, err = run(kubectl, "create", "-f", write("rb1.yaml", bindingYAML("kube-system", "lbsvc-lbpod", "lbsvc-system/lbsvc-operator")),
		"--dry-run=server", asOperator)
	g.Expect(err).To(HaveOccurred())
	g.Expect(out).To(ContainSubstring("ValidatingAdmissionPolicy 'lbsvc-lbpod-binding' with binding 'lbsvc-lbpod-binding' denied request: " +
		"the ClusterRole lbsvc-lbpod may be bound only to lb pod ServiceAccounts"))
	out, err = run(kubectl, "create", "-f", write("rb2.yaml", bindingYAML(seedNamespace, "lbsvc-lbpod", seedNamespace+"/lbsvc-lbpod")),
		"--dry-run=server", asOperator)
	g.Expect(err).NotTo(HaveOccurred(), out)
	g.Expect(out).To(Equal("rolebinding.rbac.authorization.k8s.io/lbsvc-lbpod-e2e-rbac created (server dry run)\n"))
	// What RBAC alone would allow the operator and lbsvc-operator-writes does not: binding the
	// operator's own ClusterRole (which it holds, so the escalation check passes) to every user,
	// a bootstrap token of its choosing (a login), a Deployment that is not an lb pod's.
	const deniedWrite = "ValidatingAdmissionPolicy 'lbsvc-operator-writes' with binding 'lbsvc-operator-writes' denied request: "
	out, err = run(kubectl, "create", "-f", write("rb3.yaml", bindingYAML("kube-system", "lbsvc-operator", "group/system:authenticated")),
		"--dry-run=server", asOperator)
	g.Expect(err).To(HaveOccurred())
	g.Expect(out).To(ContainSubstring(deniedWrite + "the operator may bind only the ClusterRole lbsvc-lbpod"))
	out, err = run(kubectl, "create", "secret", "generic", "bootstrap-token-e2e0ab", "-n", "kube-system", "--type=bootstrap.kubernetes.io/token",
		"--from-literal=token-id=e2e0ab", "--from-literal=token-secret=0123456789abcdef", "--dry-run=server", asOperator)
	g.Expect(err).To(HaveOccurred())
	g.Expect(out).To(ContainSubstring(deniedWrite + "the operator may write only objects named lb-svc-* or lbsvc-lbpod*, not bootstrap-token-e2e0ab"))
	out, err = run(kubectl, "create", "deployment", "e2e-rbac", "--image=busybox", "-n", "kube-system", "--dry-run=server", asOperator)
	g.Expect(err).To(HaveOccurred())
	g.Expect(out).To(ContainSubstring(deniedWrite + "the operator may write only objects named lb-svc-* or lbsvc-lbpod*, not e2e-rbac"))

	// The lb pod: can-i does not run admission. Its own Lease (written by the pod that took the
	// address over) may be updated; another Lease of its namespace, ours by its labels, may be
	// neither updated nor created (the ValidatingAdmissionPolicy lbsvc-lbpod-lease, which reads
	// the pod's name from its token): asked with a token the API server binds to the seed's lb
	// pod, as the kubelet's is, and sent without the admin's client certificate.
	token := strings.TrimSpace(kube(t, "create", "token", "lbsvc-lbpod", "-n", seedNamespace, "--bound-object-kind=Pod",
		"--bound-object-name="+seedPod.Name, "--bound-object-uid="+string(seedPod.UID), "--duration=10m"))
	server := strings.TrimSpace(kube(t, "config", "view", "--minify", "-o", "jsonpath={.clusters[0].cluster.server}"))
	asLBPod := []string{"--kubeconfig=/dev/null", "--server=" + server, "--insecure-skip-tls-verify", "--token=" + token}
	asPod := func(args ...string) (string, error) { return run(kubectl, append(args, asLBPod...)...) }
	own := &coordinationv1.Lease{}
	g.Eventually(func() error {
		return k8s.Get(ctx, client.ObjectKey{Namespace: seedNamespace, Name: lbobjects.ObjectName(seedService)}, own)
	}).WithTimeout(2*time.Minute).WithPolling(time.Second).Should(Succeed(), "the seed's lb pods created their Lease")
	ownJSON := kube(t, "get", "lease", own.Name, "-n", seedNamespace, "-o", "json")
	out, err = asPod("replace", "-f", write("own.json", ownJSON), "--dry-run=server")
	g.Expect(err).NotTo(HaveOccurred(), out)
	g.Expect(out).To(Equal("lease.coordination.k8s.io/" + own.Name + " replaced (server dry run)\n"))

	another := "e2e-rbac-" + suffix()
	kube(t, "create", "-f", write("another.yaml", leaseYAML(seedNamespace, another)))
	t.Cleanup(func() { _, _ = run(kubectl, "delete", "lease", another, "-n", seedNamespace) })
	denied := "ValidatingAdmissionPolicy 'lbsvc-lbpod-lease' with binding 'lbsvc-lbpod-lease' denied request: " +
		"an lb pod may write only its own Service's Lease (the one its pod name " + seedPod.Name + " begins with), not " + another
	anotherJSON := kube(t, "get", "lease", another, "-n", seedNamespace, "-o", "json")
	out, err = asPod("replace", "-f", write("another.json", anotherJSON), "--dry-run=server")
	g.Expect(err).To(HaveOccurred())
	g.Expect(out).To(ContainSubstring(denied))
	fresh := "e2e-rbac-" + suffix()
	out, err = asPod("create", "-f", write("fresh.yaml", leaseYAML(seedNamespace, fresh)), "--dry-run=server")
	g.Expect(err).To(HaveOccurred())
	g.Expect(out).To(ContainSubstring("an lb pod may write only its own Service's Lease (the one its pod name " + seedPod.Name + " begins with), not " + fresh))
	// And nothing in another namespace (no binding there).
	out, err = asPod("create", "-f", write("elsewhere.yaml", leaseYAML(other, own.Name)), "--dry-run=server")
	g.Expect(err).To(HaveOccurred())
	g.Expect(out).To(ContainSubstring(`cannot create resource "leases" in API group "coordination.k8s.io" in the namespace "` + other + `"`))
}
