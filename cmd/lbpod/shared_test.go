package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/utils/ptr"

	"sigs.k8s.io/yaml"

	"github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
	"github.com/lbsvc/lbsvc-operator/lbpod"
)

const sharedLabel = v1alpha1.SharedIPLabelPrefix + "172.18.0.18"

func sharedNetwork(t *testing.T) lbpod.Network {
	t.Helper()
	n, err := lbpod.ParseNetwork("172.18.0.18/16,fd18::18/64", "172.18.0.1,fd18::1", "172.18.0.0/16,fd18::/64")
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// svcFor builds a Service of namespace ns: a LoadBalancer unless typ says otherwise, labelled
// when labelled, with ingress in its status.
func svcFor(ns, name string, typ corev1.ServiceType, labelled bool, ingress ...string) *corev1.Service {
	s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: corev1.ServiceSpec{Type: typ}}
	if labelled {
		s.Labels = map[string]string{sharedLabel: "", "app": name}
	}
	for _, ip := range ingress {
		s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip})
	}
	if len(ingress) > 0 {
		// What the operator writes with the ingress of a member.
		s.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionAddressAllocated, Status: metav1.ConditionTrue, Reason: "Allocated"}}
	}
	return s
}

func names(svcs []*corev1.Service) []string {
	var out []string
	for _, s := range svcs {
		out = append(out, s.Namespace+"/"+s.Name)
	}
	return out
}

// Only the status proves membership: the label (which anyone who may edit the Service can set)
// without the address in status.loadBalancer.ingress is not enough, nor is a status of another
// address, another type or another namespace; the members come sorted by namespace/name.
func TestMembership(t *testing.T) {
	m, err := newMembership("tenant", "172.18.0.18", sharedNetwork(t))
	if err != nil {
		t.Fatal(err)
	}
	lb := corev1.ServiceTypeLoadBalancer
	got := m.members([]*corev1.Service{
		svcFor("tenant", "zeta", lb, true, "172.18.0.18"),
		svcFor("tenant", "label-only", lb, true),
		svcFor("tenant", "status-only", lb, false, "172.18.0.18"),
		svcFor("tenant", "other-address", lb, true, "172.18.0.19"),
		svcFor("tenant", "cluster-ip", corev1.ServiceTypeClusterIP, true, "172.18.0.18"),
		svcFor("elsewhere", "other-namespace", lb, true, "172.18.0.18"),
		svcFor("tenant", "v6-only", lb, true, "fd18::18"),
		svcFor("tenant", "alpha", lb, true, "10.0.0.1", "172.18.0.18"),
	})
	if want := []string{"tenant/alpha", "tenant/v6-only", "tenant/zeta"}; !slices.Equal(names(got), want) {
		t.Fatalf("members %v, want %v", names(got), want)
	}

	// Another writer of status (a load balancer controller whose pool overlaps the Subnet) proves
	// nothing: the status must carry our AddressAllocated condition, True, and the Service our
	// class or none.
	noCondition := svcFor("tenant", "no-condition", lb, true, "172.18.0.18")
	noCondition.Status.Conditions = nil
	refused := svcFor("tenant", "refused", lb, true, "172.18.0.18")
	refused.Status.Conditions[0].Status = metav1.ConditionFalse
	metallb := svcFor("tenant", "metallb", lb, true, "172.18.0.18")
	metallb.Spec.LoadBalancerClass = ptr.To("metallb.io/metallb")
	ours := svcFor("tenant", "our-class", lb, true, "172.18.0.18")
	ours.Spec.LoadBalancerClass = ptr.To(v1alpha1.LoadBalancerClass)
	if got := names(m.members([]*corev1.Service{noCondition, refused, metallb, ours})); !slices.Equal(got, []string{"tenant/our-class"}) {
		t.Fatalf("members %v, want [tenant/our-class]", got)
	}

	_, err = newMembership("tenant", "172.18.0.19", sharedNetwork(t))
	if want := `shared-ip "172.18.0.19": not the IP object name of an address of this lb pod (want one of 172.18.0.18, fd18-0000-0000-0000-0000-0000-0000-0018)`; err == nil || err.Error() != want {
		t.Fatalf("got %v, want %q", err, want)
	}
}

// --shared-ip excludes --service, needs a namespace from the API, and is read from the env.
func TestParseFlagsSharedIP(t *testing.T) {
	t.Setenv(v1alpha1.EnvNamespace, "")
	t.Setenv(v1alpha1.EnvService, "")
	t.Setenv(v1alpha1.EnvSharedIP, "172.18.0.18")
	o, err := parseFlags("lbpod", []string{"--service-file", "/x"})
	if err != nil || o.sharedIP != "172.18.0.18" {
		t.Fatalf("env: %v %+v", err, o)
	}
	for args, want := range map[string]string{
		"--service web": `service "web", shared-ip "172.18.0.18": one or the other (env LBPOD_SERVICE, LBPOD_SHARED_IP): an lb pod serves one Service or the members of a shared address`,
		"":              `namespace "": needed with shared-ip "172.18.0.18" (env LBPOD_NAMESPACE) unless --service-file is given`,
	} {
		var a []string
		if args != "" {
			a = []string{"--service", "web"}
		}
		if _, err := parseFlags("lbpod", a); err == nil || err.Error() != want {
			t.Errorf("%q: got %v, want %q", args, err, want)
		}
	}
	if _, err := parseFlags("lbpod", []string{"--namespace", "tenant"}); err != nil {
		t.Fatalf("namespace and shared-ip: %v", err)
	}
}

// A --service-file holds several Services as a List or as documents; without --shared-ip it must
// hold exactly one.
func TestDecodeServices(t *testing.T) {
	list := "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Service, metadata: {name: a, namespace: ns}}\n- {apiVersion: v1, kind: Service, metadata: {name: b, namespace: ns}}\n"
	docs := "---\napiVersion: v1\nkind: Service\nmetadata: {name: a, namespace: ns}\n---\n{\"kind\": \"Service\", \"metadata\": {\"name\": \"b\", \"namespace\": \"ns\"}}\n---\n"
	for name, data := range map[string]string{"list": list, "documents": docs} {
		svcs, err := decodeServices("f", []byte(data))
		if err != nil || !slices.Equal(names(svcs), []string{"ns/a", "ns/b"}) {
			t.Errorf("%s: %v %v", name, names(svcs), err)
		}
	}
	f := &fileSource{path: "f"}
	if _, err := f.decode([]byte(list)); err == nil || err.Error() != `service-file "f": 2 Services, want one (several only with --shared-ip)` {
		t.Errorf("single mode with two: %v", err)
	}
	if _, err := decodeServices("f", []byte("kind: List\nitems:\n- {kind: ConfigMap}\n")); err == nil || err.Error() != `service-file "f": kind "ConfigMap", want Service` {
		t.Errorf("a ConfigMap item: %v", err)
	}
}

// With --shared-ip the file source publishes the members, as the API source would: a member
// leaving, one joining, and a labelled Service without the status proof ignored.
func TestFileSourceSharedMembers(t *testing.T) {
	path := filepath.Join(t.TempDir(), "svcs.yaml")
	write := func(svcs ...*corev1.Service) {
		t.Helper()
		var data []byte
		for _, s := range svcs {
			s.APIVersion, s.Kind = "v1", "Service"
			b, err := yaml.Marshal(s)
			if err != nil {
				t.Fatal(err)
			}
			data = append(append(data, "---\n"...), b...)
		}
		if err := os.WriteFile(path+".tmp", data, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".tmp", path); err != nil {
			t.Fatal(err)
		}
	}
	lb := corev1.ServiceTypeLoadBalancer
	a, b := svcFor("n", "a", lb, true, "172.18.0.18"), svcFor("n", "b", lb, true, "172.18.0.18")
	intruder := svcFor("n", "intruder", lb, true)
	write(b, a, intruder)
	m, err := newMembership("", "172.18.0.18", sharedNetwork(t))
	if err != nil {
		t.Fatal(err)
	}
	box := runSource(t, &fileSource{path: path, poll: 10 * time.Millisecond, shared: &m})
	wait := func(want ...string) {
		t.Helper()
		deadline := time.After(2 * time.Second)
		for {
			if got, err := box.members(); err == nil && slices.Equal(got, want) {
				return
			}
			select {
			case <-box.changed:
			case <-deadline:
				got, err := box.members()
				t.Fatalf("members never became %v: last %v, %v", want, got, err)
			}
		}
	}
	wait("n/a", "n/b")
	write(a, intruder)
	wait("n/a")
	write(a, b)
	wait("n/a", "n/b")
	write()
	wait()
}

// The ServiceAccount's annotation lists the other member namespaces: own dropped (always
// watched), duplicates and empty items dropped, what is no namespace name set aside.
func TestMemberNamespaces(t *testing.T) {
	for _, tc := range []struct {
		annotation      string
		want, malformed []string
	}{
		{"", nil, nil},
		{" , ,", nil, nil},
		{"b,a", []string{"a", "b"}, nil},
		{"tenant", nil, nil},
		{"a, tenant ,a,b,a", []string{"a", "b"}, nil},
		{"a,Upper,b/c,-x,*," + strings.Repeat("n", 64) + ",ok-1", []string{"a", "ok-1"}, []string{"Upper", "b/c", "-x", "*", strings.Repeat("n", 64)}},
	} {
		got, malformed := memberNamespaces(tc.annotation, "tenant")
		if !slices.Equal(got, tc.want) || !slices.Equal(malformed, tc.malformed) {
			t.Errorf("%q: got %q malformed %q, want %q malformed %q", tc.annotation, got, malformed, tc.want, tc.malformed)
		}
	}
}

// Members come from every watched namespace, each with the status proof, sorted by
// namespace/name; a Service of a namespace not watched is none.
func TestMembershipAcrossNamespaces(t *testing.T) {
	m, err := newMembership("tenant", "172.18.0.18", sharedNetwork(t))
	if err != nil {
		t.Fatal(err)
	}
	lb := corev1.ServiceTypeLoadBalancer
	svcs := []*corev1.Service{
		svcFor("tenant", "z", lb, true, "172.18.0.18"),
		svcFor("b", "y", lb, true, "172.18.0.18"),
		svcFor("b", "label-only", lb, true),
		svcFor("a", "x", lb, true, "fd18::18"),
		svcFor("c", "not-watched", lb, true, "172.18.0.18"),
	}
	if got, want := names(m.members(svcs)), []string{"tenant/z"}; !slices.Equal(got, want) {
		t.Fatalf("own namespace only: %v, want %v", got, want)
	}
	got := names(m.in(sets.New("tenant", "a", "b")).members(svcs))
	if want := []string{"a/x", "b/y", "tenant/z"}; !slices.Equal(got, want) {
		t.Fatalf("three namespaces: %v, want %v", got, want)
	}
	if got := names(m.members(svcs)); !slices.Equal(got, []string{"tenant/z"}) {
		t.Fatalf("in changed m: %v", got)
	}
}

// The ServiceAccount's namespace: LBPOD_POD_NAMESPACE, else the mounted namespace file, else
// LBPOD_NAMESPACE.
func TestPodNamespace(t *testing.T) {
	file := func(data string, err error) func(string) ([]byte, error) {
		return func(path string) ([]byte, error) {
			if path != serviceAccountNamespaceFile {
				t.Fatalf("read %s", path)
			}
			return []byte(data), err
		}
	}
	o := options{namespace: "tenant", podNamespace: "lbsvc-system"}
	if got := podNamespace(o, file("other", nil)); got != "lbsvc-system" {
		t.Errorf("env: %q", got)
	}
	o.podNamespace = ""
	if got := podNamespace(o, file("lbsvc-system\n", nil)); got != "lbsvc-system" {
		t.Errorf("file: %q", got)
	}
	if got := podNamespace(o, file("", os.ErrNotExist)); got != "tenant" {
		t.Errorf("no file: %q", got)
	}
	t.Setenv(v1alpha1.EnvPodNamespace, "lbsvc-system")
	if o, err := parseFlags("lbpod", []string{"--service-file", "/x"}); err != nil || o.podNamespace != "lbsvc-system" {
		t.Errorf("env: %v %q", err, o.podNamespace)
	}
}

// A shared address's Lease is where its lb pods run, not in the owner's namespace (which may
// leave the address while it stays); any other Service's in its own namespace.
func TestLeaseNamespace(t *testing.T) {
	lbPods := func(string) ([]byte, error) { return []byte("lbpods\n"), nil }
	o := options{namespace: "team-a", sharedIP: "172.18.0.12"}
	if got := leaseNamespace(o, lbPods); got != "lbpods" {
		t.Errorf("shared: %q, want lbpods", got)
	}
	if got := leaseNamespace(o, func(string) ([]byte, error) { return nil, os.ErrNotExist }); got != "team-a" {
		t.Errorf("shared, lb pods beside the owner: %q, want team-a", got)
	}
	o.sharedIP = ""
	if got := leaseNamespace(o, lbPods); got != "team-a" {
		t.Errorf("not shared: %q, want team-a", got)
	}
}

// A member is served only on the ports its ingress entry for the address lists (what the operator
// admitted, free of clashes): a tenant who adds another member's port to their Service's spec gets
// nothing on it before the operator refuses the Service. An entry without ports (written by a
// release that listed none) leaves every port, as before; a protocol left out means TCP.
func TestMembershipAdmittedPorts(t *testing.T) {
	m, err := newMembership("tenant", "172.18.0.18", sharedNetwork(t))
	if err != nil {
		t.Fatal(err)
	}
	lb := corev1.ServiceTypeLoadBalancer
	dns := svcFor("tenant", "dns", lb, true, "172.18.0.18")
	dns.Spec.Ports = []corev1.ServicePort{{Protocol: corev1.ProtocolUDP, Port: 53}, {Protocol: corev1.ProtocolTCP, Port: 443}, {Port: 853}}
	dns.Status.LoadBalancer.Ingress[0].Ports = []corev1.PortStatus{{Protocol: corev1.ProtocolUDP, Port: 53}, {Protocol: corev1.ProtocolTCP, Port: 853}}
	legacy := svcFor("tenant", "legacy", lb, true, "172.18.0.18")
	legacy.Spec.Ports = []corev1.ServicePort{{Protocol: corev1.ProtocolTCP, Port: 80}}
	got := m.members([]*corev1.Service{dns, legacy})
	ports := func(s *corev1.Service) []string {
		var out []string
		for _, p := range s.Spec.Ports {
			out = append(out, fmt.Sprintf("%s/%d", p.Protocol, p.Port))
		}
		return out
	}
	if len(got) != 2 || !slices.Equal(ports(got[0]), []string{"UDP/53", "/853"}) || !slices.Equal(ports(got[1]), []string{"TCP/80"}) {
		t.Fatalf("members %v: ports %v, %v", names(got), ports(got[0]), ports(got[1]))
	}
	if len(dns.Spec.Ports) != 3 {
		t.Fatalf("the Service read was changed: %v", ports(dns))
	}
}

// The shared informers keep of a Service only what the lb pod reads: anyone of a member namespace
// may label any Service there, and large ones, cached whole, took the lb pods past their memory
// limit. A member keeps its ports, source ranges and their annotation, loses the other annotations,
// labels and managed fields, and is a member still; a labelled Service that is not one keeps
// no ports, ranges or annotations.
func TestTrimService(t *testing.T) {
	m, err := newMembership("tenant", "172.18.0.18", sharedNetwork(t))
	if err != nil {
		t.Fatal(err)
	}
	s := &sharedSource{membership: m}
	big := func(s *corev1.Service) *corev1.Service {
		s.Annotations = map[string]string{"junk": strings.Repeat("x", 256<<10), corev1.AnnotationLoadBalancerSourceRangesKey: "172.18.0.0/24"}
		s.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}
		s.Spec.LoadBalancerSourceRanges = []string{"172.18.0.0/24"}
		for p := range 5000 {
			s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Protocol: corev1.ProtocolTCP, Port: int32(10000 + p)})
		}
		return s
	}
	lb := corev1.ServiceTypeLoadBalancer
	member, err := s.trimService(big(svcFor("tenant", "member", lb, true, "172.18.0.18")))
	if err != nil {
		t.Fatal(err)
	}
	got := member.(*corev1.Service)
	if len(got.Spec.Ports) != 5000 || len(got.Spec.LoadBalancerSourceRanges) != 1 || got.ManagedFields != nil ||
		len(got.Annotations) != 1 || got.Annotations[corev1.AnnotationLoadBalancerSourceRangesKey] != "172.18.0.0/24" ||
		len(got.Labels) != 1 || !m.isMember(got) {
		t.Fatalf("member trimmed to %d ports, ranges %v, annotations %d, labels %v, managed fields %v, member %t",
			len(got.Spec.Ports), got.Spec.LoadBalancerSourceRanges, len(got.Annotations), got.Labels, got.ManagedFields, m.isMember(got))
	}
	// A member of another namespace (its informer runs only when the ServiceAccount lists it).
	elsewhere, err := s.trimService(big(svcFor("team-b", "member", lb, true, "172.18.0.18")))
	if err != nil {
		t.Fatal(err)
	}
	if got := elsewhere.(*corev1.Service); len(got.Spec.Ports) != 5000 || len(got.Spec.LoadBalancerSourceRanges) != 1 {
		t.Fatalf("a member of another namespace trimmed to %d ports, ranges %v", len(got.Spec.Ports), got.Spec.LoadBalancerSourceRanges)
	}
	other, err := s.trimService(big(svcFor("tenant", "label-only", lb, true)))
	if err != nil {
		t.Fatal(err)
	}
	got = other.(*corev1.Service)
	if got.Spec.Ports != nil || got.Spec.LoadBalancerSourceRanges != nil || got.Annotations != nil || got.ManagedFields != nil {
		t.Fatalf("a Service labelled but not a member keeps %d ports, ranges %v, annotations %d", len(got.Spec.Ports), got.Spec.LoadBalancerSourceRanges, len(got.Annotations))
	}
}

// Only a refusal settles a member namespace for the first publication; a passing failure does not.
func TestSettles(t *testing.T) {
	gr := schema.GroupResource{Resource: "services"}
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{apierrors.NewForbidden(gr, "", errors.New("no RoleBinding")), true},
		{apierrors.NewServiceUnavailable("etcd"), false},
		{apierrors.NewTooManyRequests("slow down", 1), false},
		{apierrors.NewTimeoutError("list", 1), false},
		{context.DeadlineExceeded, false},
	} {
		if got := settles(tc.err); got != tc.want {
			t.Errorf("settles(%v) = %t, want %t", tc.err, got, tc.want)
		}
	}
}
