package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// forbiddenDeps are import path prefixes the lb pod may not depend on, even indirectly. client-go's
// clientset (k8s.io/client-go/kubernetes, its scheme and typed clients) registers every API group
// when the program starts: some 55 packages of k8s.io/api, which made the binary 44 MB instead of
// 28 and the RSS of every lb pod 29.8 MiB. The lb pod uses apiClient (client.go) instead; the
// informers and listers of the clientset come with the same groups. Its metrics page is package
// metric's: client_golang and the protobuf runtime under it were another 2.1 MB of binary and
// 1.6-2.1 MiB of RSS per lb pod.
var forbiddenDeps = []string{
	"github.com/prometheus",
	"google.golang.org/protobuf",
	"k8s.io/client-go/kubernetes",
	"k8s.io/client-go/informers",
	"k8s.io/client-go/listers",
	"sigs.k8s.io/controller-runtime",
}

func TestNoClientset(t *testing.T) {
	const pkg = "github.com/lbsvc/lbsvc-operator/cmd/lbpod"
	out, err := exec.Command("go", "list", "-f", `{{join .Deps "\n"}}`, pkg).CombinedOutput()
	deps := strings.Split(strings.TrimSpace(string(out)), "\n")
	// A list without k8s.io/api/core/v1 is no list of the lb pod's dependencies (a failed go list).
	if err != nil || !slices.Contains(deps, "k8s.io/api/core/v1") {
		t.Fatalf("go list %s: %v\n%s", pkg, err, out)
	}
	for _, dep := range deps {
		if i := slices.IndexFunc(forbiddenDeps, func(bad string) bool { return dep == bad || strings.HasPrefix(dep, bad+"/") }); i >= 0 {
			t.Errorf("the lb pod depends on %s: it may not import %s (see apiClient)", dep, forbiddenDeps[i])
		}
	}
}
