package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
)

func TestParseFlagsEnvAndOverrides(t *testing.T) {
	t.Setenv(v1alpha1.EnvNamespace, "default")
	t.Setenv(v1alpha1.EnvService, "test-svc")
	t.Setenv(v1alpha1.EnvAddresses, "172.18.0.18/16")
	t.Setenv(v1alpha1.EnvGateways, "172.18.0.1")
	t.Setenv(v1alpha1.EnvSubnets, "172.18.0.0/16")

	o, err := parseFlags("lbpod", nil)
	if err != nil {
		t.Fatal(err)
	}
	if o.namespace != "default" || o.service != "test-svc" || o.addresses != "172.18.0.18/16" || o.gateways != "172.18.0.1" || o.subnets != "172.18.0.0/16" {
		t.Fatalf("environment not read: %+v", o)
	}
	if o.healthAddr != "" || o.resyncPeriod != time.Minute || o.announceInterval != 30*time.Second || o.iface != "net1" || o.uplink != "eth0" || o.table != 100 {
		t.Fatalf("defaults: %+v", o)
	}

	o, err = parseFlags("lbpod", []string{"--addresses", "172.18.0.19/16", "--resync-period", "1s"})
	if err != nil {
		t.Fatal(err)
	}
	if o.addresses != "172.18.0.19/16" || o.resyncPeriod != time.Second {
		t.Fatalf("flags do not override: %+v", o)
	}

	t.Setenv(v1alpha1.EnvService, "")
	_, err = parseFlags("lbpod", nil)
	want := `namespace "default", service "": both are needed (env LBPOD_NAMESPACE, LBPOD_SERVICE) unless --service-file is given`
	if err == nil || err.Error() != want {
		t.Fatalf("got %v, want %q", err, want)
	}
	if _, err := parseFlags("lbpod", []string{"--service-file", "/x", "extra"}); err == nil || err.Error() != `unexpected argument "extra"` {
		t.Fatalf("got %v", err)
	}
}

func TestParseFlagsRules(t *testing.T) {
	t.Setenv(v1alpha1.EnvRules, "")
	o, err := parseFlags("lbpod", []string{"--service-file", "/x"})
	if err != nil || o.rules != "auto" {
		t.Fatalf("default: %q, %v", o.rules, err)
	}
	t.Setenv(v1alpha1.EnvRules, "nftables")
	if o, err = parseFlags("lbpod", []string{"--service-file", "/x"}); err != nil || o.rules != "nftables" {
		t.Fatalf("from the environment: %q, %v", o.rules, err)
	}
	if o, err = parseFlags("lbpod", []string{"--service-file", "/x", "--rules", "iptables"}); err != nil || o.rules != "iptables" {
		t.Fatalf("flag over the environment: %q, %v", o.rules, err)
	}
	_, err = parseFlags("lbpod", []string{"--service-file", "/x", "--rules", "nft"})
	if want := `rules "nft": want auto, nftables or iptables`; err == nil || err.Error() != want {
		t.Fatalf("got %v, want %q", err, want)
	}
}

// The file source publishes the Service, then each change of the file's content.
func TestFileSourceFollowsEdits(t *testing.T) {
	path := filepath.Join(t.TempDir(), "svc.yaml")
	write := func(ports string) {
		t.Helper()
		data := "apiVersion: v1\nkind: Service\nmetadata: {name: s, namespace: n}\nspec:\n  clusterIPs: [10.0.0.1]\n  ports: [" + ports + "]\n"
		if err := os.WriteFile(path+".tmp", []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".tmp", path); err != nil {
			t.Fatal(err)
		}
	}
	write("{port: 80}")
	box := runSource(t, &fileSource{path: path, poll: 10 * time.Millisecond})

	waitPorts := func(want ...int32) {
		t.Helper()
		deadline := time.After(2 * time.Second)
		for {
			select {
			case <-box.changed:
				svc, err := box.get()
				if err == nil && len(svc.Spec.Ports) == len(want) {
					match := true
					for i, p := range svc.Spec.Ports {
						match = match && p.Port == want[i]
					}
					if match {
						return
					}
				}
			case <-deadline:
				svc, err := box.get()
				t.Fatalf("ports never became %v: last %v, %v", want, svc, err)
			}
		}
	}
	waitPorts(80)
	write("{port: 80}, {port: 443}")
	waitPorts(80, 443)

	// Written whole (a new file renamed over it), as a kubelet's projected file changes: written in
	// place, the poll could read it empty in between and report that instead (seen in CI).
	if err := os.WriteFile(path+".tmp", []byte("kind: ConfigMap\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(2 * time.Second)
	for {
		select {
		case <-box.changed:
			if _, err := box.get(); err != nil {
				if want := `service-file "` + path + `": kind "ConfigMap", want Service`; err.Error() != want {
					t.Fatalf("got %v, want %q", err, want)
				}
				return
			}
		case <-deadline:
			t.Fatal("a file that is not a Service was not reported")
		}
	}
}

// serviceBox is a serviceSink for tests: it holds the latest Service (or why there is none), or
// the latest set of members, and signals each change.
type serviceBox struct {
	mu      sync.Mutex
	svc     *corev1.Service
	svcs    []*corev1.Service
	err     error
	changed chan struct{}
}

// runSource runs src into a new box until the test ends.
func runSource(t *testing.T, src serviceSource) *serviceBox {
	box := newServiceBox()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go src.Run(ctx, box)
	return box
}

func newServiceBox() *serviceBox {
	return &serviceBox{err: errors.New("waiting for the Service"), changed: make(chan struct{}, 1)}
}

func (b *serviceBox) SetService(svc *corev1.Service, err error) {
	b.mu.Lock()
	b.svc, b.err = svc, err
	b.mu.Unlock()
	select {
	case b.changed <- struct{}{}:
	default:
	}
}

func (b *serviceBox) SetServices(svcs []*corev1.Service, err error) {
	b.mu.Lock()
	b.svc, b.svcs, b.err = nil, svcs, err
	if len(svcs) > 0 {
		b.svc = svcs[0]
	}
	b.mu.Unlock()
	select {
	case b.changed <- struct{}{}:
	default:
	}
}

// members returns the names (namespace/name) of the latest set of members, or the error.
func (b *serviceBox) members() ([]string, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var names []string
	for _, s := range b.svcs {
		names = append(names, s.Namespace+"/"+s.Name)
	}
	return names, b.err
}

func (b *serviceBox) get() (*corev1.Service, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.svc, b.err
}
