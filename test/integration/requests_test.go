//go:build integration

package integration

import (
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/gomega"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/lbsvc/lbsvc-operator/controllers"
)

// requests counts, of an operator, the Service passes of some namespaces and the reads of single
// objects (GET, not a list or a watch) whose path names one of some names: what one test's
// objects cost, whatever the Services and IP objects other tests left behind still do.
type requests struct {
	namespaces, names []string

	mu     sync.Mutex
	gets   map[string]int
	passes int
}

// countRequests replaces the running operator with one run with opts that counts the Service
// passes of namespaces and the GETs naming any of namespaces and names (the usual operator comes
// back when the test ends).
func countRequests(t *testing.T, opts controllers.Options, namespaces []string, names ...string) *requests {
	t.Helper()
	r := &requests{namespaces: namespaces, names: append(slices.Clone(namespaces), names...), gets: map[string]int{}}
	tweak := func(cfg *rest.Config, o *ctrl.Options) {
		cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
			return roundTripper(func(req *http.Request) (*http.Response, error) {
				if req.Method == http.MethodGet && req.URL.Query().Get("watch") == "" && !isList(req.URL.Path) && r.about(req.URL.Path) {
					r.mu.Lock()
					r.gets[req.URL.Path]++
					r.mu.Unlock()
				}
				return rt.RoundTrip(req)
			})
		})
		// controller-runtime logs each pass at V(5) as "Reconciling", with its controller and
		// the request's namespace and name.
		o.Logger = logr.New(&passSink{count: r.pass})
	}
	stopOperator()
	opMu.Lock()
	current = newOperator(opts, tweak)
	opMu.Unlock()
	t.Cleanup(func() { startOperator(true) })
	return r
}

// about tells whether path names one of r's namespaces or names as a whole segment.
func (r *requests) about(path string) bool {
	return slices.ContainsFunc(r.names, func(n string) bool { return strings.Contains(path+"/", "/"+n+"/") })
}

// pass counts one "Reconciling" log line of the Service controller in one of r's namespaces.
func (r *requests) pass(values []any) {
	var controller, namespace string
	for i := 0; i+1 < len(values); i += 2 {
		switch k, v := values[i], values[i+1]; k {
		case "controller":
			controller, _ = v.(string)
		case "namespace":
			namespace, _ = v.(string)
		}
	}
	if controller == "service" && slices.Contains(r.namespaces, namespace) {
		r.mu.Lock()
		r.passes++
		r.mu.Unlock()
	}
}

// passSink is a logr.LogSink that hands the key-value pairs of each "Reconciling" line to count
// and drops everything else.
type passSink struct {
	values []any
	count  func([]any)
}

func (s *passSink) Init(logr.RuntimeInfo)        {}
func (s *passSink) Enabled(int) bool             { return true }
func (s *passSink) Error(error, string, ...any)  {}
func (s *passSink) WithName(string) logr.LogSink { return s }
func (s *passSink) WithValues(kv ...any) logr.LogSink {
	return &passSink{values: append(slices.Clone(s.values), kv...), count: s.count}
}
func (s *passSink) Info(_ int, msg string, kv ...any) {
	if msg == "Reconciling" {
		s.count(append(slices.Clone(s.values), kv...))
	}
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// isList tells a collection's path (/api/v1/namespaces/x/services, /apis/g/v/kinds) from an
// object's (/api/v1/namespaces/x/services/name, /apis/g/v/kinds/name and its subresources).
func isList(path string) bool {
	segs := strings.Split(strings.Trim(path, "/"), "/")
	switch {
	case len(segs) > 2 && segs[0] == "api":
		segs = segs[2:]
	case len(segs) > 3 && segs[0] == "apis":
		segs = segs[3:]
	default:
		return true // discovery and the like: no object
	}
	if len(segs) > 2 && segs[0] == "namespaces" {
		segs = segs[2:]
	}
	return len(segs) < 2
}

// quiet waits until a second went by without a counted pass or GET, and returns the passes and
// the GETs, by path, counted since the previous call.
func (r *requests) quiet(t *testing.T) (int, map[string]int) {
	t.Helper()
	passes, gets := 0, map[string]int{}
	// Quiet means a whole second without a pass or a read: the first poll comes at once, before
	// the passes of a write the test has just made may have started.
	calm := 0
	NewWithT(t).Eventually(func(g Gomega) {
		r.mu.Lock()
		n, now := r.passes, r.gets
		r.passes, r.gets = 0, map[string]int{}
		r.mu.Unlock()
		passes += n
		for p, c := range now {
			gets[p] += c
		}
		if n == 0 && len(now) == 0 {
			calm++
		} else {
			calm = 0
		}
		g.Expect(calm).To(BeNumerically(">=", 2), "a second without passes or reads")
	}, 4*timeout, time.Second).Should(Succeed())
	return passes, gets
}
