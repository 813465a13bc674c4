package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// ingressWatch records when each watched Service first showed an ingress.
type ingressWatch struct {
	mu      sync.Mutex
	at      map[string]time.Time
	changed chan struct{}
}

func newIngressWatch() *ingressWatch {
	return &ingressWatch{at: map[string]time.Time{}, changed: make(chan struct{})}
}

// start watches the Services of ns until ctx ends, reopening the watch where the server closed it.
func (w *ingressWatch) start(ctx context.Context, c client.WithWatch, ns string) error {
	var list corev1.ServiceList
	if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return err
	}
	rv := list.ResourceVersion
	open := func() (watch.Interface, error) {
		return c.Watch(ctx, &corev1.ServiceList{}, client.InNamespace(ns), &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv}})
	}
	wi, err := open()
	if err != nil {
		return fmt.Errorf("watch services in %s: %w", ns, err)
	}
	go func() {
		for {
			for ev := range wi.ResultChan() {
				svc, ok := ev.Object.(*corev1.Service)
				if !ok {
					continue
				}
				rv = svc.ResourceVersion
				if len(svc.Status.LoadBalancer.Ingress) > 0 {
					w.record(ns+"/"+svc.Name, time.Now())
				}
			}
			if ctx.Err() != nil {
				return
			}
			for {
				if wi, err = open(); err == nil {
					break
				}
				select {
				case <-ctx.Done():
					return
				case <-time.After(100 * time.Millisecond):
				}
			}
		}
	}()
	return nil
}

func (w *ingressWatch) record(key string, at time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.at[key]; ok {
		return
	}
	w.at[key] = at
	close(w.changed)
	w.changed = make(chan struct{})
}

// wait returns when key first showed an ingress.
func (w *ingressWatch) wait(ctx context.Context, key string) (time.Time, error) {
	for {
		w.mu.Lock()
		at, ok := w.at[key]
		ch := w.changed
		w.mu.Unlock()
		if ok {
			return at, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return time.Time{}, fmt.Errorf("service %s has no ingress: %w", key, ctx.Err())
		}
	}
}

func (w *ingressWatch) count(prefix string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for k := range w.at {
		if strings.HasPrefix(k, prefix) {
			n++
		}
	}
	return n
}
