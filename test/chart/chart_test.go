//go:build chart

// Package chart checks charts/lbsvc-operator with the real helm and kubectl binaries (built by
// hack/build-tools.sh; hack/test-chart.sh passes their paths in HELM and KUBECTL): with default values
// the chart renders what `kubectl kustomize config/default` renders, and each value does what it says.
package chart

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// object is one rendered manifest, kept generic so that the test compares exactly what is applied.
type object map[string]any

func (o object) id() string {
	md, _ := o["metadata"].(map[string]any)
	ns, _ := md["namespace"].(string)
	name, _ := md["name"].(string)
	kind, _ := o["kind"].(string)
	return kind + "/" + ns + "/" + name
}

func root(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

func tool(t *testing.T, env string) string {
	t.Helper()
	p := os.Getenv(env)
	if p == "" {
		t.Fatalf("%s is not set: run hack/test-chart.sh (make test-chart)", env)
	}
	return p
}

func run(t *testing.T, name string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = root(t)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	err := cmd.Run()
	if err != nil {
		return stderr.String(), err
	}
	return out.String(), nil
}

func parse(t *testing.T, text string) map[string]object {
	t.Helper()
	objs := map[string]object{}
	for _, doc := range strings.Split("\n"+text, "\n---") {
		var o object
		if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
			t.Fatalf("parse %q: %v", doc, err)
		}
		if len(o) == 0 {
			continue
		}
		if _, dup := objs[o.id()]; dup {
			t.Fatalf("%s rendered twice", o.id())
		}
		objs[o.id()] = o
	}
	return objs
}

// helmTemplate renders the chart as release "lbsvc-operator" in lbsvc-system, where config/default installs.
func helmTemplate(t *testing.T, set ...string) (map[string]object, string, error) {
	t.Helper()
	args := []string{"template", "lbsvc-operator", "charts/lbsvc-operator", "--namespace", "lbsvc-system"}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	out, err := run(t, tool(t, "HELM"), args...)
	if err != nil {
		return nil, out, err
	}
	return parse(t, out), out, nil
}

func mustTemplate(t *testing.T, set ...string) map[string]object {
	t.Helper()
	objs, msg, err := helmTemplate(t, set...)
	if err != nil {
		t.Fatalf("helm template %v: %v: %s", set, err, msg)
	}
	return objs
}

func get(o object, path ...string) any {
	var cur any = map[string]any(o)
	for _, p := range path {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = m[p]
	}
	return cur
}

func container(t *testing.T, objs map[string]object) map[string]any {
	t.Helper()
	d, ok := objs["Deployment/lbsvc-system/lbsvc-operator"]
	if !ok {
		t.Fatalf("no Deployment lbsvc-system/lbsvc-operator")
	}
	cs, _ := get(d, "spec", "template", "spec", "containers").([]any)
	if len(cs) != 1 {
		t.Fatalf("want 1 container, got %d", len(cs))
	}
	return cs[0].(map[string]any)
}

func args(t *testing.T, objs map[string]object) []string {
	t.Helper()
	var out []string
	for _, a := range container(t, objs)["args"].([]any) {
		out = append(out, a.(string))
	}
	return out
}

func TestHelmLintStrict(t *testing.T) {
	if out, err := run(t, tool(t, "HELM"), "lint", "--strict", "charts/lbsvc-operator"); err != nil {
		t.Fatalf("helm lint --strict: %v\n%s", err, out)
	}
	// The optional parts must lint too.
	if out, err := run(t, tool(t, "HELM"), "lint", "--strict", "charts/lbsvc-operator",
		"--set", "prometheus.serviceMonitor.enabled=true,prometheus.prometheusRule.enabled=true"); err != nil {
		t.Fatalf("helm lint --strict with prometheus parts: %v\n%s", err, out)
	}
}

// TestDefaultsMatchKustomize is the drift check: same objects, same CRDs, same RBAC rules, same
// Deployment pod spec as config/default. Only labels differ (Helm adds its own) and the Namespace
// (Helm leaves it to --create-namespace).
func TestDefaultsMatchKustomize(t *testing.T) {
	kout, err := run(t, tool(t, "KUBECTL"), "kustomize", "config/default")
	if err != nil {
		t.Fatalf("kubectl kustomize: %v: %s", err, kout)
	}
	kust := parse(t, kout)
	delete(kust, "Namespace//lbsvc-system")
	chart := mustTemplate(t)

	ids := func(m map[string]object) []string {
		var s []string
		for k := range m {
			s = append(s, k)
		}
		sort.Strings(s)
		return s
	}
	if got, want := ids(chart), ids(kust); !reflect.DeepEqual(got, want) {
		t.Fatalf("objects differ:\nchart:     %v\nkustomize: %v", got, want)
	}
	for id, k := range kust {
		c := chart[id]
		switch k["kind"] {
		case "CustomResourceDefinition":
			if !reflect.DeepEqual(c["spec"], k["spec"]) {
				t.Errorf("%s: spec differs from config/crd/bases (run make manifests)", id)
			}
		case "ClusterRole", "Role":
			if !reflect.DeepEqual(c["rules"], k["rules"]) {
				t.Errorf("%s: rules differ:\nchart:     %v\nkustomize: %v", id, c["rules"], k["rules"])
			}
		case "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding":
			if !reflect.DeepEqual(c["spec"], k["spec"]) {
				t.Errorf("%s: spec differs:\nchart:     %v\nkustomize: %v", id, c["spec"], k["spec"])
			}
		case "ClusterRoleBinding", "RoleBinding":
			for _, f := range []string{"roleRef", "subjects"} {
				if !reflect.DeepEqual(c[f], k[f]) {
					t.Errorf("%s: %s differs:\nchart:     %v\nkustomize: %v", id, f, c[f], k[f])
				}
			}
		case "Deployment":
			for _, p := range [][]string{{"spec", "replicas"}, {"spec", "selector"}, {"spec", "template", "spec"}} {
				if g, w := get(c, p...), get(k, p...); !reflect.DeepEqual(g, w) {
					t.Errorf("%s: %s differs:\nchart:     %v\nkustomize: %v", id, strings.Join(p, "."), g, w)
				}
			}
		}
	}
}

func TestValues(t *testing.T) {
	has := func(list []string, s string) bool {
		for _, x := range list {
			if x == s {
				return true
			}
		}
		return false
	}
	defaults := args(t, mustTemplate(t))
	for _, flag := range []string{"--lb-replicas", "--lb-pod-namespace", "--default-attachment-provider", "--forwarding-sysctls", "--max-concurrent-reconciles", "--lb-rules"} {
		for _, a := range defaults {
			if strings.HasPrefix(a, flag) {
				t.Errorf("default values pass %s, want it absent so older operators still start", a)
			}
		}
	}

	tests := []struct {
		name string
		set  []string
		want []string
	}{
		{"lb replicas", []string{"lbReplicas=2"}, []string{"--lb-replicas=2"}},
		{"lb ha interval", []string{"lbHAInterval=200ms"}, []string{"--lb-ha-interval=200ms"}},
		{"lb rules", []string{"lbRules=nftables"}, []string{"--lb-rules=nftables"}},
		{"lb conflict probe", []string{"lbConflictProbe=rfc"}, []string{"--lb-conflict-probe=rfc"}},
		{"lb pod namespace", []string{"lbPodNamespace=lbsvc-lb"}, []string{"--lb-pod-namespace=lbsvc-lb"}},
		{"attachment provider", []string{"defaultAttachmentProvider=underlay.default"}, []string{"--default-attachment-provider=underlay.default"}},
		{"forwarding", []string{"forwardingSysctls=all"}, []string{"--forwarding-sysctls=all"}},
		{"disabled", []string{"enableLbSvc=false"}, []string{"--enable-lb-svc=false"}},
		{"lb pod image", []string{"lbPodImage=reg.example/lbpod:v1"}, []string{"--lb-svc-image=reg.example/lbpod:v1"}},
		{"extra args", []string{"extraArgs={--zap-log-level=debug}"}, []string{"--zap-log-level=debug"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := args(t, mustTemplate(t, tc.set...))
			for _, w := range tc.want {
				if !has(got, w) {
					t.Errorf("args %v lack %s", got, w)
				}
			}
		})
	}

	t.Run("no leader election", func(t *testing.T) {
		objs := mustTemplate(t, "leaderElection.enabled=false")
		if has(args(t, objs), "--leader-elect") {
			t.Error("--leader-elect passed with leaderElection.enabled=false")
		}
		if _, ok := objs["Role/lbsvc-system/lbsvc-operator-leader-election"]; ok {
			t.Error("leader election Role rendered with leaderElection.enabled=false")
		}
	})
	t.Run("pod placement and image", func(t *testing.T) {
		objs := mustTemplate(t, "image.repository=reg.example/op", "image.tag=v9", "priorityClassName=system-cluster-critical",
			"nodeSelector.role=infra", "tolerations[0].operator=Exists", "replicas=2")
		d := objs["Deployment/lbsvc-system/lbsvc-operator"]
		if got := container(t, objs)["image"]; got != "reg.example/op:v9" {
			t.Errorf("image %v", got)
		}
		if got := get(d, "spec", "replicas"); got != float64(2) {
			t.Errorf("replicas %v", got)
		}
		ps := get(d, "spec", "template", "spec").(map[string]any)
		if ps["priorityClassName"] != "system-cluster-critical" || !reflect.DeepEqual(ps["nodeSelector"], map[string]any{"role": "infra"}) ||
			!reflect.DeepEqual(ps["tolerations"], []any{map[string]any{"operator": "Exists"}}) {
			t.Errorf("pod spec placement: %v %v %v", ps["priorityClassName"], ps["nodeSelector"], ps["tolerations"])
		}
	})
	t.Run("service monitor endpoint overrides", func(t *testing.T) {
		objs := mustTemplate(t, "prometheus.serviceMonitor.enabled=true", "prometheus.serviceMonitor.endpoint.tlsConfig.insecureSkipVerify=false",
			"prometheus.serviceMonitor.endpoint.tlsConfig.serverName=lbsvc-operator-metrics.lbsvc-system.svc")
		want := []any{map[string]any{"port": "metrics", "interval": "30s", "scheme": "https",
			"bearerTokenFile": "/var/run/secrets/kubernetes.io/serviceaccount/token",
			"tlsConfig":       map[string]any{"insecureSkipVerify": false, "serverName": "lbsvc-operator-metrics.lbsvc-system.svc"}}}
		if got := get(objs["ServiceMonitor/lbsvc-system/lbsvc-operator"], "spec", "endpoints"); !reflect.DeepEqual(got, want) {
			t.Errorf("ServiceMonitor endpoints %v, want %v", got, want)
		}
	})
	t.Run("metrics readers", func(t *testing.T) {
		if _, ok := mustTemplate(t)["ClusterRoleBinding//lbsvc-operator-metrics-reader"]; ok {
			t.Error("metrics-reader ClusterRoleBinding rendered without metrics.readerServiceAccounts")
		}
		objs := mustTemplate(t, "metrics.readerServiceAccounts[0].name=prometheus-k8s", "metrics.readerServiceAccounts[0].namespace=monitoring")
		b, ok := objs["ClusterRoleBinding//lbsvc-operator-metrics-reader"]
		if !ok {
			t.Fatal("no metrics-reader ClusterRoleBinding")
		}
		wantRef := map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "lbsvc-operator-metrics-reader"}
		wantSubjects := []any{map[string]any{"kind": "ServiceAccount", "name": "prometheus-k8s", "namespace": "monitoring"}}
		if !reflect.DeepEqual(b["roleRef"], wantRef) || !reflect.DeepEqual(b["subjects"], wantSubjects) {
			t.Errorf("metrics-reader binding: roleRef %v subjects %v", b["roleRef"], b["subjects"])
		}
	})
	t.Run("crds off", func(t *testing.T) {
		for id := range mustTemplate(t, "crds.enabled=false") {
			if strings.HasPrefix(id, "CustomResourceDefinition/") {
				t.Errorf("%s rendered with crds.enabled=false", id)
			}
		}
	})
	t.Run("crds kept on uninstall", func(t *testing.T) {
		objs := mustTemplate(t)
		for _, id := range []string{"CustomResourceDefinition//subnets.lbsvc.io", "CustomResourceDefinition//ips.lbsvc.io"} {
			if got := get(objs[id], "metadata", "annotations", "helm.sh/resource-policy"); got != "keep" {
				t.Errorf("%s: resource-policy %v, want keep", id, got)
			}
		}
	})
	t.Run("prometheus", func(t *testing.T) {
		objs := mustTemplate(t, "prometheus.serviceMonitor.enabled=true", "prometheus.prometheusRule.enabled=true")
		sm, ok := objs["ServiceMonitor/lbsvc-system/lbsvc-operator"]
		if !ok {
			t.Fatal("no ServiceMonitor")
		}
		// HTTPS with Prometheus' own token, the operator's self-signed certificate not checked.
		wantEndpoints := []any{map[string]any{"port": "metrics", "interval": "30s", "scheme": "https",
			"bearerTokenFile": "/var/run/secrets/kubernetes.io/serviceaccount/token",
			"tlsConfig":       map[string]any{"insecureSkipVerify": true}}}
		if got := get(sm, "spec", "endpoints"); !reflect.DeepEqual(got, wantEndpoints) {
			t.Errorf("ServiceMonitor endpoints %v, want %v", got, wantEndpoints)
		}
		if got := get(objs["Service/lbsvc-system/lbsvc-operator-metrics"], "spec", "ports"); !reflect.DeepEqual(got,
			[]any{map[string]any{"name": "metrics", "port": float64(8443), "targetPort": "metrics"}}) {
			t.Errorf("metrics Service ports %v", got)
		}
		rule, ok := objs["PrometheusRule/lbsvc-system/lbsvc-operator"]
		if !ok {
			t.Fatal("no PrometheusRule")
		}
		got := map[string]string{}
		for _, g := range get(rule, "spec", "groups").([]any) {
			for _, r := range g.(map[string]any)["rules"].([]any) {
				r := r.(map[string]any)
				got[r["alert"].(string)] = r["expr"].(string)
			}
		}
		usage := `100 * sum by (subnet, family) (lbsvc_subnet_addresses{state=~"used|draining"}) / sum by (subnet, family) (lbsvc_subnet_addresses) >= `
		want := map[string]string{
			"LbsvcSubnetExhausted":     `sum by (subnet, family) (lbsvc_subnet_addresses{state="available"}) == 0`,
			"LbsvcSubnetUsageInfo":     usage + "75",
			"LbsvcSubnetUsageWarning":  usage + "85",
			"LbsvcSubnetUsageCritical": usage + "95",
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("alerts:\ngot  %v\nwant %v", got, want)
		}
	})

	bad := []struct {
		name, set, msg string
	}{
		{"forwarding", "forwardingSysctls=ipv4", "forwardingSysctls must be one of"},
		{"replicas without election", "replicas=2,leaderElection.enabled=false", "replicas > 1 needs leaderElection.enabled=true"},
		{"foreign class", "loadBalancerClass=metallb", "serves lbsvc.io/lb-svc only"},
	}
	for _, tc := range bad {
		t.Run("rejects "+tc.name, func(t *testing.T) {
			_, msg, err := helmTemplate(t, tc.set)
			if err == nil || !strings.Contains(msg, tc.msg) {
				t.Errorf("helm template --set %s: err %v, output %q; want an error saying %q", tc.set, err, msg, tc.msg)
			}
		})
	}
}
