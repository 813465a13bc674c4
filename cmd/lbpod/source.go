package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/lbsvc/lbsvc-operator/lbpod"
)

// serviceSink receives the newest Service, or why there is none (lbpod.Loop is one); with a
// shared address, the newest whole set of members.
type serviceSink interface {
	SetService(svc *corev1.Service, err error)
	SetServices(svcs []*corev1.Service, err error)
}

// serviceSource yields the Services once (init: the one Service, or the members of a shared
// address) or keeps a sink up to date (main).
type serviceSource interface {
	Get(ctx context.Context) ([]*corev1.Service, error)
	Run(ctx context.Context, sink serviceSink)
}

func newServiceSource(o options, network lbpod.Network, log *slog.Logger) (serviceSource, error) {
	var shared *membership
	if o.sharedIP != "" {
		m, err := newMembership(o.namespace, o.sharedIP, network)
		if err != nil {
			return nil, err
		}
		shared = &m
	}
	if o.serviceFile != "" {
		return &fileSource{path: o.serviceFile, poll: o.serviceFilePoll, log: log, shared: shared}, nil
	}
	cs, err := newClient(o)
	if err != nil {
		return nil, err
	}
	if shared != nil {
		return &sharedSource{client: cs, membership: *shared, own: o.namespace, log: log,
			podNamespace: podNamespace(o, os.ReadFile), serviceAccount: o.leaseName}, nil
	}
	return &apiSource{client: cs, namespace: o.namespace, name: o.service, log: log}, nil
}

// serviceAccountNamespaceFile is where Kubernetes mounts the pod's namespace with its token.
const serviceAccountNamespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// podNamespace is the lb pod's own namespace, where its ServiceAccount is: LBPOD_POD_NAMESPACE
// (--pod-namespace), else (an older Deployment) the service account's namespace file, else
// LBPOD_NAMESPACE.
func podNamespace(o options, readFile func(string) ([]byte, error)) string {
	if o.podNamespace != "" {
		return o.podNamespace
	}
	if data, err := readFile(serviceAccountNamespaceFile); err == nil && len(bytes.TrimSpace(data)) > 0 {
		return string(bytes.TrimSpace(data))
	}
	return o.namespace
}

// newClient is the API client of the lb pod (in-cluster, or --kubeconfig).
func newClient(o options) (apiClient, error) {
	var cfg *rest.Config
	var err error
	if o.kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("API client config: %w", err)
	}
	cfg.UserAgent = "lbpod"
	cs, err := newAPIClient(cfg)
	if err != nil {
		return nil, fmt.Errorf("API client: %w", err)
	}
	return cs, nil
}

// fileSource reads a Service object (YAML or JSON) from a file and polls it for changes, for
// tests and for running outside a cluster. With a shared address (shared set) the file holds
// any number of Services, as a `kind: List` with items or as YAML documents separated by `---`,
// and the members among them are chosen as from the API, so that tests drive membership (and
// its proof) by rewriting the file.
type fileSource struct {
	path   string
	poll   time.Duration
	log    *slog.Logger
	shared *membership
}

func (f *fileSource) Get(context.Context) ([]*corev1.Service, error) {
	data, err := os.ReadFile(f.path)
	if err != nil {
		return nil, fmt.Errorf("service-file %q: %w", f.path, err)
	}
	return f.decode(data)
}

// decode reads the file's Services: the members among them with a shared address, else the one
// Service it must hold.
func (f *fileSource) decode(data []byte) ([]*corev1.Service, error) {
	svcs, err := decodeServices(f.path, data)
	if err != nil {
		return nil, err
	}
	if f.shared != nil {
		return f.shared.members(svcs), nil
	}
	if len(svcs) != 1 {
		return nil, fmt.Errorf("service-file %q: %d Services, want one (several only with --shared-ip)", f.path, len(svcs))
	}
	return svcs, nil
}

// decodeServices reads every Service of a file: YAML documents separated by `---` (or one JSON
// object), each a Service or a List of Services. Empty documents are skipped.
func decodeServices(path string, data []byte) ([]*corev1.Service, error) {
	var out []*corev1.Service
	docs := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := docs.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("service-file %q: %w", path, err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		var list corev1.List
		if err := yaml.Unmarshal(doc, &list); err != nil {
			return nil, fmt.Errorf("service-file %q: %w", path, err)
		}
		if list.Kind != "List" && list.Kind != "ServiceList" {
			svc, err := decodeService(path, doc)
			if err != nil {
				return nil, err
			}
			out = append(out, svc)
			continue
		}
		for _, item := range list.Items {
			svc, err := decodeService(path, item.Raw)
			if err != nil {
				return nil, err
			}
			out = append(out, svc)
		}
	}
}

func decodeService(path string, data []byte) (*corev1.Service, error) {
	svc := &corev1.Service{}
	if err := yaml.Unmarshal(data, svc); err != nil {
		return nil, fmt.Errorf("service-file %q: %w", path, err)
	}
	if svc.Kind != "" && svc.Kind != "Service" {
		return nil, fmt.Errorf("service-file %q: kind %q, want Service", path, svc.Kind)
	}
	return svc, nil
}

// publish gives the sink what the file holds now, or why it cannot be read.
func (f *fileSource) publish(sink serviceSink, svcs []*corev1.Service, err error) {
	if f.shared != nil {
		sink.SetServices(svcs, err)
		return
	}
	var svc *corev1.Service
	if len(svcs) == 1 {
		svc = svcs[0]
	}
	sink.SetService(svc, err)
}

// Run re-reads the file every poll interval and publishes it when its content changed. Reading
// a small file is cheaper than trusting mtimes, whose granularity can hide quick edits.
func (f *fileSource) Run(ctx context.Context, sink serviceSink) {
	var last []byte
	first := true
	t := time.NewTicker(f.poll)
	defer t.Stop()
	for {
		data, err := os.ReadFile(f.path)
		switch {
		case err != nil:
			if first || last != nil {
				f.publish(sink, nil, fmt.Errorf("service-file %q: %w", f.path, err))
			}
			last = nil
		case first || !bytes.Equal(data, last):
			last = data
			svcs, err := f.decode(data)
			f.publish(sink, svcs, err)
		}
		first = false
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// apiSource reads the Service from the API. The pod's RBAC allows get/list/watch on this one
// Service only, so list and watch are narrowed by a field selector on its name; the informer
// relists when a watch expires.
type apiSource struct {
	client          apiClient
	namespace, name string
	log             *slog.Logger
}

func (a *apiSource) Get(ctx context.Context) ([]*corev1.Service, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	svc, err := a.client.Services(a.namespace).Get(ctx, a.name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("service %s/%s: %w", a.namespace, a.name, err)
	}
	return []*corev1.Service{svc}, nil
}

func (a *apiSource) Run(ctx context.Context, sink serviceSink) {
	services := a.client.Services(a.namespace)
	lw := oneByName(a.name, func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
		return services.List(ctx, o)
	}, services.Watch)
	publish := func(obj any) {
		if svc, ok := obj.(*corev1.Service); ok {
			sink.SetService(svc.DeepCopy(), nil)
		}
	}
	_, ctrl := cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: lw,
		ObjectType:    &corev1.Service{},
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    publish,
			UpdateFunc: func(_, obj any) { publish(obj) },
			DeleteFunc: func(any) {
				// The Deployment goes with its Service; until then keep what is installed.
				sink.SetService(nil, fmt.Errorf("service %s/%s was deleted", a.namespace, a.name))
			},
		},
	})
	ctrl.RunWithContext(ctx)
}

// oneByName lists and watches the one object called name: with the field selector on the name, a
// Role that names that object in resourceNames would allow the list and the watch, and no more
// than that one object is ever sent.
func oneByName(name string, list func(context.Context, metav1.ListOptions) (runtime.Object, error),
	watchFn func(context.Context, metav1.ListOptions) (watch.Interface, error)) *cache.ListWatch {
	selector := fields.OneTermEqualSelector("metadata.name", name).String()
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = selector
			return list(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = selector
			return watchFn(ctx, o)
		},
	}
}
