package main

import (
	"context"
	"fmt"
	"net/netip"
	"strconv"
	"time"

	"github.com/lbsvc/lbsvc-operator/controllers/decide"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
)

// timeFloor times one floor: in namespace ns (created here), each of n Services gets its writes
// from each (in parallel, cfg.workers at a time), then the Services are listed back; timed is
// called as the time is taken. Everything objectsOf(i) names is deleted afterwards, before the
// operator starts, so that it never sees them.
func timeFloor(ctx context.Context, c client.Client, cfg config, ns string, each func(i int) error,
	objectsOf func(i int) []client.Object, timed func()) (time.Duration, error) {
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		return 0, err
	}
	start := time.Now()
	if err := parallel(ctx, cfg.n, cfg.workers, each); err != nil {
		return 0, fmt.Errorf("%s: %w", ns, err)
	}
	if err := listBack(ctx, c, ns, cfg.n); err != nil {
		return 0, fmt.Errorf("%s: %w", ns, err)
	}
	took := time.Since(start)
	if timed != nil {
		timed()
	}
	if err := deleteEach(ctx, c, cfg, objectsOf); err != nil {
		return 0, fmt.Errorf("%s: %w", ns, err)
	}
	return took, nil
}

// floorService is the i-th Service of a floor in ns, by name only (for deletes).
func floorService(ns string, i int) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "svc-" + strconv.Itoa(i)}}
}

// measureFloor is the API server alone creating n LoadBalancer Services and listing them back.
func measureFloor(ctx context.Context, c client.Client, cfg config, timed func()) (time.Duration, error) {
	const ns = "bench-floor"
	return timeFloor(ctx, c, cfg, ns,
		func(i int) error { return createService(ctx, c, ns, "svc-"+strconv.Itoa(i), "") },
		func(i int) []client.Object { return []client.Object{floorService(ns, i)} }, timed)
}

// deleteEach deletes objectsOf(i) for i in 0..n-1, one by one in parallel: a collection delete of
// 10,000 Services outlasts the API server's request timeout.
func deleteEach(ctx context.Context, c client.Client, cfg config, objectsOf func(int) []client.Object) error {
	return parallel(ctx, cfg.n, cfg.workers, func(i int) error {
		for _, o := range objectsOf(i) {
			if err := c.Delete(ctx, o); err != nil {
				return fmt.Errorf("delete %T %s: %w", o, o.GetName(), err)
			}
		}
		return nil
	})
}

// listBack lists the Services of ns, as each floor ends, and checks that all n are there.
func listBack(ctx context.Context, c client.Client, ns string, n int) error {
	var list corev1.ServiceList
	if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return err
	}
	if len(list.Items) != n {
		return fmt.Errorf("listed %d services, want %d", len(list.Items), n)
	}
	return nil
}

// measureAddressedFloor is the API server alone doing, for each of n Services, the writes that
// any design holding one API object per address needs before the address shows
// (createAddressed), ending with the same list as measureFloor. The addresses (100.64.0.0/10) are
// outside the bench's Subnet.
func measureAddressedFloor(ctx context.Context, c client.Client, cfg config) (time.Duration, error) {
	const ns = "bench-floor-addressed"
	return timeFloor(ctx, c, cfg, ns,
		func(i int) error { _, _, err := createAddressed(ctx, c, ns, i, false); return err },
		func(i int) []client.Object {
			return []client.Object{floorService(ns, i), &lbv1.IP{ObjectMeta: metav1.ObjectMeta{Name: lbv1.IPName(floorAddr(i))}}}
		}, nil)
}

// floorAddr is the address the floors give their i-th Service: outside the bench's Subnet.
func floorAddr(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{100, 64 + byte(i>>16), byte(i >> 8), byte(i)})
}

// createAddressed creates the i-th Service of ns and its IP object (floorAddr(i)), and patches the
// Service's status with the ingress and a condition as the operator's merge patch does: the writes
// any design that keeps one API object per address makes before the address shows; with mirror,
// the mirror annotations go in the same patch, as the operator's do.
func createAddressed(ctx context.Context, c client.Client, ns string, i int, mirror bool) (*corev1.Service, *lbv1.IP, error) {
	svc := serviceObject(ns, "svc-"+strconv.Itoa(i), "")
	if err := c.Create(ctx, svc); err != nil {
		return nil, nil, fmt.Errorf("create service %s: %w", svc.Name, err)
	}
	addr := floorAddr(i)
	ip := &lbv1.IP{
		ObjectMeta: metav1.ObjectMeta{Name: lbv1.IPName(addr), Labels: map[string]string{"bench": ns}},
		Spec: lbv1.IPSpec{Address: addr.String(), Subnet: "bench-floor",
			Service: lbv1.IPOwner{Namespace: ns, Name: svc.Name, UID: string(svc.UID)}},
	}
	if err := c.Create(ctx, ip); err != nil {
		return nil, nil, fmt.Errorf("create IP %s: %w", ip.Name, err)
	}
	before := svc.DeepCopy()
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: addr.String()}}
	meta.SetStatusCondition(&svc.Status.Conditions, metav1.Condition{Type: decide.ConditionAddressAllocated, Status: metav1.ConditionTrue,
		Reason: decide.ReasonAllocated, Message: addr.String() + " from subnet bench-floor", ObservedGeneration: svc.Generation})
	if mirror {
		// The operator's mirror annotations ride on the same patch of the status subresource, as
		// the operator's do (the finalizer too; left out here so that the deletes are immediate).
		svc.Annotations = map[string]string{lbv1.AllocatedIPsAnnotation: addr.String(), lbv1.AllocatedSubnetAnnotation: "bench-floor"}
	}
	if err := c.Status().Patch(ctx, svc, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		return nil, nil, fmt.Errorf("patch status of %s: %w", svc.Name, err)
	}
	return svc, ip, nil
}
