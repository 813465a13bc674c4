package main

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/lbsvc/lbsvc-operator/controllers/lbobjects"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// rbacProbe measures what one RoleBinding create costs the API server as the operator's
// ServiceAccount (which holds `bind` on the lb pods' ClusterRole, so the escalation check is one
// authorization of that verb; before, with a Role per Service, the requester had to hold every
// permission it granted, which the API server works out by listing the RoleBindings of the
// namespace) against the same creates as system:masters (no check), while the namespace
// already holds 0, 1000, ... up to n RoleBindings (one per served Service, as the operator leaves
// them). Each step times 10 creates of each kind one at a time (rbac_create_sequential_ms), then
// makes k at once and gives their mean latency and kube-apiserver's CPU time per create.
func rbacProbe(ctx context.Context, env *envtest.Environment, admin client.Client, cfg config, fig func(string, string, ...any)) error {
	const ns, k = "rbac-probe", 50
	user, err := operatorUser(ctx, env, admin)
	if err != nil {
		return err
	}
	rc := user.Config()
	rc.QPS, rc.Burst = -1, 0 // as the bench's own client: no client-side limit
	asOperator, err := client.New(rc, client.Options{Scheme: admin.Scheme()})
	if err != nil {
		return err
	}
	if err := admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		return err
	}
	cp := findControlPlane()
	filled := 0
	steps := []int{0}
	for s := 1000; s < cfg.n; s *= 2 {
		steps = append(steps, s)
	}
	steps = append(steps, cfg.n)
	objects := func(prefix string, i int) (*rbacv1.RoleBinding, error) {
		p := lbobjects.Params{ServiceName: prefix + strconv.Itoa(i), ServiceNamespace: ns, ServiceUID: "00000000-0000-0000-0000-000000000001", Replicas: 2}
		return lbobjects.BuildRoleBinding(p), nil
	}
	// create makes the i-th RoleBinding of a series as who.
	create := func(c client.Client, who, kind, series string, i int) error {
		o, err := objects("probe-"+who+"-"+series, i)
		if err != nil {
			return err
		}
		if err := c.Create(ctx, o); err != nil {
			return fmt.Errorf("rbac probe: create %s %s as %s: %w", kind, o.GetName(), who, err)
		}
		return nil
	}
	for _, size := range steps {
		// The RoleBindings a namespace with size served Services holds (as masters: quick).
		if err := parallel(ctx, size-filled, cfg.workers, func(i int) error {
			rb, err := objects("filler-", filled+i)
			if err != nil {
				return err
			}
			return admin.Create(ctx, rb)
		}); err != nil {
			return fmt.Errorf("rbac probe: fill to %d: %w", size, err)
		}
		filled = size
		for _, who := range []struct {
			name string
			c    client.Client
		}{{"operator", asOperator}, {"masters", admin}} {
			for _, kind := range []string{"rolebinding"} {
				// One at a time first: the latency of a create on a quiet API server.
				const seq = 10
				seqStart := time.Now()
				for i := range seq {
					if err := create(who.c, who.name, kind, "seq-"+strconv.Itoa(size)+"-", i); err != nil {
						return err
					}
				}
				seqMean := time.Since(seqStart) / seq
				// All k at once: each create's own time is its latency, and the API server's CPU
				// over the short window is theirs, not its idle work's.
				var mu sync.Mutex
				var total time.Duration
				cpu0 := cp.cpu(nil)["kube-apiserver"]
				if err := parallel(ctx, k, k, func(i int) error {
					start := time.Now()
					if err := create(who.c, who.name, kind, strconv.Itoa(size)+"-", i); err != nil {
						return err
					}
					mu.Lock()
					total += time.Since(start)
					mu.Unlock()
					return nil
				}); err != nil {
					return err
				}
				cpu := (cp.cpu(nil)["kube-apiserver"] - cpu0) / k
				mean := total / k
				labels := fmt.Sprintf("{kind=%s,as=%s,rolebindings_in_namespace=%d}", kind, who.name, size)
				fig("rbac_create_sequential_ms"+labels, "%.1f", ms(seqMean))
				fig("rbac_create_ms"+labels, "%.1f", ms(mean))
				fig("rbac_create_apiserver_cpu_ms"+labels, "%.1f", cpu*1000)
			}
		}
	}
	return nil
}
