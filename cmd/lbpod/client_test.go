package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
)

// request is what fakeAPI saw of one request.
type request struct {
	Method, Path, Query, Accept, ContentType, UserAgent string
	Body                                                []byte
}

// fakeAPI answers as an API server would, from canned JSON: each GET of a Service or a Lease with
// the object, a list with one item, a watch with one ADDED event; a Lease named "absent" is not
// found, an Update of one named "stale" conflicts, a Create echoes a Lease. It records every
// request.
type fakeAPI struct {
	mu   sync.Mutex
	seen []request
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.seen = append(f.seen, request{r.Method, r.URL.Path, r.URL.RawQuery, r.Header.Get("Accept"), r.Header.Get("Content-Type"), r.Header.Get("User-Agent"), body})
	f.mu.Unlock()
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/") // api/v1 or apis/<group>/v1, namespaces/<ns>/<resource>[/<name>]
	base := 3
	if parts[0] == "api" {
		base = 2
	}
	resource, name := parts[base+2], ""
	if len(parts) > base+3 {
		name = parts[base+3]
	}
	kind, apiVersion := map[string]string{"services": "Service", "serviceaccounts": "ServiceAccount", "leases": "Lease"}[resource], "v1"
	if resource == "leases" {
		apiVersion = "coordination.k8s.io/v1"
	}
	status := func(code int, reason metav1.StatusReason) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(&metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure, Code: int32(code), Reason: reason,
			Message: fmt.Sprintf("%s %q: %s", resource, name, reason), Details: &metav1.StatusDetails{Name: name, Kind: resource}})
	}
	object := fmt.Sprintf(`{"kind":%q,"apiVersion":%q,"metadata":{"name":%q,"namespace":"ns","resourceVersion":"7"}}`, kind, apiVersion, "one")
	w.Header().Set("Content-Type", "application/json")
	switch {
	case name == "absent":
		status(http.StatusNotFound, metav1.StatusReasonNotFound)
	case name == "stale" && r.Method == http.MethodPut:
		status(http.StatusConflict, metav1.StatusReasonConflict)
	case r.Method == http.MethodPost:
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, object)
	case name != "":
		_, _ = io.WriteString(w, object)
	case r.URL.Query().Get("watch") == "true":
		_, _ = fmt.Fprintf(w, `{"type":"ADDED","object":%s}`+"\n", object)
	default:
		_, _ = fmt.Fprintf(w, `{"kind":%q,"apiVersion":%q,"metadata":{"resourceVersion":"8"},"items":[%s]}`, kind+"List", apiVersion, object)
	}
}

// The lb pod's client makes the clientset's requests, byte for byte (method, path, query, the
// content types offered and sent, the body), and reads the answers and errors as it does: the
// same objects, NotFound and Conflict as apierrors knows them. A fake API server here, as what is
// compared is the client; the integration tests run both against a real one.
func TestAPIClientAsClientset(t *testing.T) {
	g := NewWithT(t)
	api := &fakeAPI{}
	srv := httptest.NewServer(api)
	defer srv.Close()
	cfg := &rest.Config{Host: srv.URL, UserAgent: "lbpod"}
	ours, err := newAPIClient(cfg)
	g.Expect(err).NotTo(HaveOccurred())
	theirs, err := kubernetes.NewForConfig(cfg)
	g.Expect(err).NotTo(HaveOccurred())
	ctx := context.Background()
	byName := fields.OneTermEqualSelector("metadata.name", "web").String()
	listOpts := metav1.ListOptions{FieldSelector: byName, LabelSelector: "lbsvc.io/shared-ip-x", ResourceVersion: "5", Limit: 1, TimeoutSeconds: ptr.To[int64](30)}
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "stale", Namespace: "ns", ResourceVersion: "6",
		Annotations: map[string]string{"lbsvc.io/ha-claim": "1 100 02:00:00:00:00:0a"}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("pod-a"), LeaseTransitions: ptr.To[int32](1)}}
	newLease := lease.DeepCopy()
	newLease.Name = "new"

	// Each call is made by both clients; what it returns is kept as text to compare.
	type call struct {
		name        string
		ours, their func() (any, error)
	}
	watched := func(w watch.Interface, err error) (any, error) {
		if err != nil {
			return nil, err
		}
		defer w.Stop()
		ev := <-w.ResultChan()
		return ev, nil
	}
	calls := []call{
		{"get a Service",
			func() (any, error) {
				return ours.Services("ns").Get(ctx, "web", metav1.GetOptions{ResourceVersion: "3"})
			},
			func() (any, error) {
				return theirs.CoreV1().Services("ns").Get(ctx, "web", metav1.GetOptions{ResourceVersion: "3"})
			}},
		{"list Services",
			func() (any, error) { return ours.Services("ns").List(ctx, listOpts) },
			func() (any, error) { return theirs.CoreV1().Services("ns").List(ctx, listOpts) }},
		{"watch Services",
			func() (any, error) {
				return watched(ours.Services("ns").Watch(ctx, metav1.ListOptions{FieldSelector: byName, ResourceVersion: "8", AllowWatchBookmarks: true}))
			},
			func() (any, error) {
				return watched(theirs.CoreV1().Services("ns").Watch(ctx, metav1.ListOptions{FieldSelector: byName, ResourceVersion: "8", AllowWatchBookmarks: true}))
			}},
		{"list ServiceAccounts",
			func() (any, error) {
				return ours.ServiceAccounts("pods").List(ctx, metav1.ListOptions{FieldSelector: byName})
			},
			func() (any, error) {
				return theirs.CoreV1().ServiceAccounts("pods").List(ctx, metav1.ListOptions{FieldSelector: byName})
			}},
		{"watch ServiceAccounts",
			func() (any, error) {
				return watched(ours.ServiceAccounts("pods").Watch(ctx, metav1.ListOptions{FieldSelector: byName}))
			},
			func() (any, error) {
				return watched(theirs.CoreV1().ServiceAccounts("pods").Watch(ctx, metav1.ListOptions{FieldSelector: byName}))
			}},
		{"get a Lease",
			func() (any, error) { return ours.Leases("ns").Get(ctx, "lease", metav1.GetOptions{}) },
			func() (any, error) {
				return theirs.CoordinationV1().Leases("ns").Get(ctx, "lease", metav1.GetOptions{})
			}},
		{"get an absent Lease",
			func() (any, error) { return ours.Leases("ns").Get(ctx, "absent", metav1.GetOptions{}) },
			func() (any, error) {
				return theirs.CoordinationV1().Leases("ns").Get(ctx, "absent", metav1.GetOptions{})
			}},
		{"list Leases",
			func() (any, error) { return ours.Leases("ns").List(ctx, listOpts) },
			func() (any, error) { return theirs.CoordinationV1().Leases("ns").List(ctx, listOpts) }},
		{"watch Leases",
			func() (any, error) { return watched(ours.Leases("ns").Watch(ctx, listOpts)) },
			func() (any, error) { return watched(theirs.CoordinationV1().Leases("ns").Watch(ctx, listOpts)) }},
		{"create a Lease",
			func() (any, error) { return ours.Leases("ns").Create(ctx, newLease, metav1.CreateOptions{}) },
			func() (any, error) {
				return theirs.CoordinationV1().Leases("ns").Create(ctx, newLease, metav1.CreateOptions{})
			}},
		{"create a Lease, dry run",
			func() (any, error) {
				return ours.Leases("ns").Create(ctx, newLease, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			},
			func() (any, error) {
				return theirs.CoordinationV1().Leases("ns").Create(ctx, newLease, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			}},
		{"update a stale Lease",
			func() (any, error) { return ours.Leases("ns").Update(ctx, lease, metav1.UpdateOptions{}) },
			func() (any, error) {
				return theirs.CoordinationV1().Leases("ns").Update(ctx, lease, metav1.UpdateOptions{})
			}},
	}
	for _, c := range calls {
		t.Run(c.name, func(t *testing.T) {
			g := NewWithT(t)
			got, err := c.ours()
			api.mu.Lock()
			ourReqs := api.seen
			api.seen = nil
			api.mu.Unlock()
			want, wantErr := c.their()
			api.mu.Lock()
			theirReqs := api.seen
			api.seen = nil
			api.mu.Unlock()
			g.Expect(ourReqs).To(HaveLen(1))
			g.Expect(ourReqs).To(Equal(theirReqs))
			g.Expect(got).To(Equal(want))
			g.Expect(fmt.Sprint(err)).To(Equal(fmt.Sprint(wantErr)))
			g.Expect([]bool{apierrors.IsNotFound(err), apierrors.IsConflict(err)}).To(Equal([]bool{apierrors.IsNotFound(wantErr), apierrors.IsConflict(wantErr)}))
			switch c.name {
			case "get an absent Lease":
				g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "%v", err)
			case "update a stale Lease":
				g.Expect(apierrors.IsConflict(err)).To(BeTrue(), "%v", err)
			default:
				g.Expect(err).NotTo(HaveOccurred())
			}
		})
	}
	// The objects decoded are the kinds asked for.
	svc, err := ours.Services("ns").Get(ctx, "web", metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(svc).To(Equal(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "one", Namespace: "ns", ResourceVersion: "7"}}))
	list, err := ours.Leases("ns").List(ctx, metav1.ListOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(list.ResourceVersion).To(Equal("8"))
	g.Expect(list.Items).To(HaveLen(1))
	g.Expect(list.Items[0].Name).To(Equal("one"))
}
