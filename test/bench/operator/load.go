package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
)

type namedAt struct {
	name    string
	created time.Time
}

func serviceObject(ns, name, provider string) *corev1.Service {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.ServiceSpec{
			Type:                          corev1.ServiceTypeLoadBalancer,
			AllocateLoadBalancerNodePorts: ptr.To(false),
			Selector:                      map[string]string{"app": "bench"},
			Ports:                         []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(80)}},
		},
	}
	if provider != "" {
		svc.Annotations = map[string]string{lbv1.AttachmentProviderAnnotation: provider}
	}
	return svc
}

func createService(ctx context.Context, c client.Client, ns, name, provider string) error {
	if err := c.Create(ctx, serviceObject(ns, name, provider)); err != nil {
		return fmt.Errorf("create service %s/%s: %w", ns, name, err)
	}
	return nil
}

// createServices creates n LoadBalancer Services (annotated when provider is set) with a few
// parallel writers and returns their names with the moment each creation was sent.
func createServices(ctx context.Context, c client.Client, ns, provider string, n, workers int) ([]namedAt, error) {
	out := make([]namedAt, n)
	err := parallel(ctx, n, workers, func(i int) error {
		name := "svc-" + strconv.Itoa(i)
		out[i] = namedAt{name: name, created: time.Now()}
		return createService(ctx, c, ns, name, provider)
	})
	return out, err
}

// createUnrelated fills namespace bench-unrelated with k ConfigMaps, k pods and k Deployments,
// none of them the operator's, each carrying the managedFields and last-applied annotation that
// kubectl apply leaves (the operator must not pay for them).
func createUnrelated(ctx context.Context, c client.Client, k, workers int) error {
	const ns = "bench-unrelated"
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		return err
	}
	payload := strings.Repeat("x", 1024)
	tmpl := corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "unrelated"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "app", Image: "registry.example/app:1", Args: []string{"--serve", "--port=8080"},
			Env: []corev1.EnvVar{{Name: "MODE", Value: "production"}, {Name: "PAYLOAD", Value: payload[:256]}},
		}}},
	}
	meta := func(kind string, i int) metav1.ObjectMeta {
		return metav1.ObjectMeta{Name: kind + "-" + strconv.Itoa(i), Namespace: ns, Labels: map[string]string{"app": "unrelated"},
			Annotations: map[string]string{"kubectl.kubernetes.io/last-applied-configuration": payload}}
	}
	return parallel(ctx, k, workers, func(i int) error {
		objs := []client.Object{
			&corev1.ConfigMap{ObjectMeta: meta("cm", i), Data: map[string]string{"config": payload}},
			&corev1.Pod{ObjectMeta: meta("pod", i), Spec: tmpl.Spec},
			&appsv1.Deployment{ObjectMeta: meta("deploy", i), Spec: appsv1.DeploymentSpec{
				Replicas: ptr.To[int32](1), Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "unrelated"}}, Template: tmpl}},
		}
		for _, o := range objs {
			if err := c.Create(ctx, o, client.FieldOwner("kubectl-client-side-apply")); err != nil {
				return fmt.Errorf("create unrelated %s: %w", o.GetName(), err)
			}
		}
		return nil
	})
}

// parallel runs f(0..n-1) on a few workers and returns the first error.
func parallel(ctx context.Context, n, workers int, f func(int) error) error {
	jobs := make(chan int)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				if err := f(i); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	var err error
	for i := 0; i < n && err == nil; i++ {
		select {
		case jobs <- i:
		case err = <-errs:
		case <-ctx.Done():
			err = ctx.Err()
		}
	}
	close(jobs)
	wg.Wait()
	if err != nil {
		return err
	}
	select {
	case err = <-errs:
	default:
	}
	return err
}
