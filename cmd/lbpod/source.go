package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"
)

// serviceSink receives the newest Service, or why there is none (lbpod.Loop is one).
type serviceSink interface {
	SetService(svc *corev1.Service, err error)
}

// serviceSource yields the Service once (init) or keeps a sink up to date (main).
type serviceSource interface {
	Get(ctx context.Context) (*corev1.Service, error)
	Run(ctx context.Context, sink serviceSink)
}

func newServiceSource(o options, log *slog.Logger) (serviceSource, error) {
	if o.serviceFile != "" {
		return &fileSource{path: o.serviceFile, poll: o.serviceFilePoll, log: log}, nil
	}
	cs, err := newClient(o)
	if err != nil {
		return nil, err
	}
	return &apiSource{client: cs, namespace: o.namespace, name: o.service, log: log}, nil
}

// newClient is the API client of the lb pod (in-cluster, or --kubeconfig).
func newClient(o options) (kubernetes.Interface, error) {
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
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("API client: %w", err)
	}
	return cs, nil
}

// fileSource reads a Service object (YAML or JSON) from a file and polls it for changes, for
// tests and for running outside a cluster.
type fileSource struct {
	path string
	poll time.Duration
	log  *slog.Logger
}

func (f *fileSource) Get(context.Context) (*corev1.Service, error) {
	data, err := os.ReadFile(f.path)
	if err != nil {
		return nil, fmt.Errorf("service-file %q: %w", f.path, err)
	}
	return decodeService(f.path, data)
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
				sink.SetService(nil, fmt.Errorf("service-file %q: %w", f.path, err))
			}
			last = nil
		case first || !bytes.Equal(data, last):
			last = data
			sink.SetService(decodeService(f.path, data))
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
	client          kubernetes.Interface
	namespace, name string
	log             *slog.Logger
}

func (a *apiSource) Get(ctx context.Context) (*corev1.Service, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	svc, err := a.client.CoreV1().Services(a.namespace).Get(ctx, a.name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("service %s/%s: %w", a.namespace, a.name, err)
	}
	return svc, nil
}

func (a *apiSource) Run(ctx context.Context, sink serviceSink) {
	services := a.client.CoreV1().Services(a.namespace)
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
