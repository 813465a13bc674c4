package controllers

import (
	"os/exec"
	"strings"
	"testing"
)

// The packages that decide are pure: they turn plain inputs into plans and objects, and the
// compiler keeps them so. None of them may depend on controller-runtime, client-go or the
// libraries that change the kernel: a change that reaches for a client there fails this test, and
// belongs in a reconciler (or the lb pod's apply) instead. (net/http cannot be on the list: the
// Kubernetes API types themselves pull it in through apimachinery.)
var purePackages = []string{
	"github.com/lbsvc/lbsvc-operator/controllers/decide",
	"github.com/lbsvc/lbsvc-operator/controllers/lbobjects",
	"github.com/lbsvc/lbsvc-operator/controllers/ipam",
	"github.com/lbsvc/lbsvc-operator/lbpod/ha",
}

// forbiddenImports are import path prefixes no pure package may depend on, even indirectly.
var forbiddenImports = []string{
	"sigs.k8s.io/controller-runtime",
	"k8s.io/client-go",
	"github.com/vishvananda/netlink",
	"github.com/google/nftables",
	"github.com/coreos/go-iptables",
	"github.com/mdlayher",
}

func TestPurePackages(t *testing.T) {
	for _, pkg := range purePackages {
		out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
		}
		deps := strings.Fields(string(out))
		if len(deps) < 2 || deps[len(deps)-1] != pkg {
			t.Fatalf("go list -deps %s listed %d packages, the last %q: not a dependency list", pkg, len(deps), deps[len(deps)-1])
		}
		for _, dep := range deps {
			for _, bad := range forbiddenImports {
				if dep == bad || strings.HasPrefix(dep, bad+"/") {
					t.Errorf("%s depends on %s: pure packages may not import %s", pkg, dep, bad)
				}
			}
		}
	}
}
