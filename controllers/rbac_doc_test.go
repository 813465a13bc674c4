package controllers

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"
)

// rbacGrant is one right of a rule: a verb on a resource of a group, on one name or (name "") on
// all. Non-resource URLs have the group "(non-resource)".
type rbacGrant struct{ group, resource, verb, name string }

const nonResource = "(non-resource)"

// grantsOfRules expands RBAC rules into their single rights.
func grantsOfRules(rules []rbacv1.PolicyRule) []rbacGrant {
	var out []rbacGrant
	for _, r := range rules {
		names := r.ResourceNames
		if len(names) == 0 {
			names = []string{""}
		}
		for _, v := range r.Verbs {
			for _, u := range r.NonResourceURLs {
				out = append(out, rbacGrant{nonResource, u, v, ""})
			}
			for _, g := range r.APIGroups {
				for _, res := range r.Resources {
					for _, n := range names {
						out = append(out, rbacGrant{g, res, v, n})
					}
				}
			}
		}
	}
	return sortedGrants(out)
}

func sortedGrants(g []rbacGrant) []rbacGrant {
	slices.SortFunc(g, func(a, b rbacGrant) int {
		return strings.Compare(a.group+"\x00"+a.resource+"\x00"+a.verb+"\x00"+a.name, b.group+"\x00"+b.resource+"\x00"+b.verb+"\x00"+b.name)
	})
	return slices.Compact(g)
}

// grantsOfTable reads the table of docs/security.md under the heading that contains heading: columns API group
// (core for ""; several comma-separated), resources (backquoted, comma-separated), verbs, only
// these names, why.
func grantsOfTable(t *testing.T, readme, heading string) []rbacGrant {
	t.Helper()
	lines := strings.Split(readme, "\n")
	start := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, "### ") && strings.Contains(l, heading) })
	if start < 0 {
		t.Fatalf("docs/security.md: no heading with %q", heading)
	}
	split := func(cell string) []string {
		var out []string
		for _, f := range strings.Split(cell, ",") {
			if f = strings.Trim(strings.TrimSpace(f), "`"); f != "" {
				out = append(out, f)
			}
		}
		return out
	}
	var out []rbacGrant
	rows := 0
	for _, l := range lines[start+1:] {
		if strings.HasPrefix(l, "#") {
			break
		}
		if !strings.HasPrefix(l, "| ") || strings.HasPrefix(l, "| API group") || strings.HasPrefix(l, "| ---") {
			if rows > 0 && !strings.HasPrefix(l, "|") {
				break // the table ended
			}
			continue
		}
		cells := strings.Split(strings.Trim(l, "|"), "|")
		if len(cells) != 5 {
			t.Fatalf("docs/security.md %q: row %q has %d cells, want 5", heading, l, len(cells))
		}
		rows++
		names := split(cells[3])
		if len(names) == 0 {
			names = []string{""}
		}
		for _, g := range split(cells[0]) {
			if g == "core" {
				g = ""
			}
			for _, res := range split(cells[1]) {
				for _, v := range split(cells[2]) {
					for _, n := range names {
						out = append(out, rbacGrant{g, res, v, n})
					}
				}
			}
		}
	}
	if rows == 0 {
		t.Fatalf("docs/security.md %q: no table rows", heading)
	}
	return sortedGrants(out)
}

// TestRBACDocTables: docs/security.md (linked from the README's Security section) states exactly
// the rules of every role the install creates (config/rbac, from which the chart is generated):
// the operator's generated ClusterRole, its leader election Role, the lb pods' ClusterRole and the
// metrics readers'. A marker, a YAML or a doc change that is not made in the other place fails.
func TestRBACDocTables(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "docs", "security.md"))
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	for _, tc := range []struct{ heading, file, name string }{
		{"ClusterRole `lbsvc-operator`", "role.yaml", "lbsvc-operator"},
		{"Role `lbsvc-operator-leader-election`", "leader_election_role.yaml", "lbsvc-operator-leader-election"},
		{"ClusterRole `lbsvc-lbpod`", "lbpod_role.yaml", "lbsvc-lbpod"},
		{"ClusterRole `lbsvc-operator-metrics-reader`", "metrics_reader_role.yaml", "lbsvc-operator-metrics-reader"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join("..", "config", "rbac", tc.file))
			if err != nil {
				t.Fatal(err)
			}
			var rules []rbacv1.PolicyRule
			found := false
			for _, doc := range strings.Split(string(data), "\n---\n") {
				var role rbacv1.ClusterRole // a Role's fields are the same
				if err := yaml.Unmarshal([]byte(doc), &role); err != nil {
					t.Fatalf("config/rbac/%s: %v", tc.file, err)
				}
				if role.Name == tc.name && (role.Kind == "Role" || role.Kind == "ClusterRole") {
					rules, found = role.Rules, true
				}
			}
			if !found {
				t.Fatalf("config/rbac/%s: no role %s", tc.file, tc.name)
			}
			want, got := grantsOfRules(rules), grantsOfTable(t, readme, tc.heading)
			for _, g := range got {
				if !slices.Contains(want, g) {
					t.Errorf("docs/security.md grants %+v, config/rbac/%s does not", g, tc.file)
				}
			}
			for _, g := range want {
				if !slices.Contains(got, g) {
					t.Errorf("config/rbac/%s grants %+v, docs/security.md does not say so", tc.file, g)
				}
			}
		})
	}
}
