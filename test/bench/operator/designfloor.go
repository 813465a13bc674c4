package main

import (
	"context"
	"fmt"
	"net/netip"
	"strconv"
	"time"

	"github.com/lbsvc/lbsvc-operator/controllers/lbobjects"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
)

// measureDesignFloor is the API server alone doing, for each of n Services, every write the
// operator makes for a new Service with two lb pods, with the objects the operator's own builders
// return: create the Service and its IP object and patch the Service's status and mirror
// annotations in one write (createAddressed); create the election key's Secret, the namespace's
// ServiceAccount and RoleBinding (the first Service only), Deployment, PodDisruptionBudget and
// Event (the IP's status is Bound by its CRD default; the Lease is the lb pods'). No operator runs,
// no reads or watches are served, and the writes go as the bench's admin (system:masters: no RBAC
// or escalation checks, no priority and fairness), so it is a lower bound on what any operator
// making these objects costs the API server here. It ends with the same list as measureFloor;
// timed is called as the time is taken. Everything is deleted afterwards, before the operator
// starts (no finalizers are set, so the deletes are immediate; the Service finalizer rides on the
// operator's status patch, which the annotations stand for).
func measureDesignFloor(ctx context.Context, c client.Client, cfg config, timed func()) (time.Duration, error) {
	const ns = "bench-floor-design"
	return timeFloor(ctx, c, cfg, ns, func(i int) error {
		svc, _, err := createAddressed(ctx, c, ns, i, true)
		if err != nil {
			return err
		}
		objs, err := designObjects(ns, i, svc.UID)
		if err != nil {
			return err
		}
		for _, o := range objs {
			if err := c.Create(ctx, o); err != nil {
				return fmt.Errorf("create %T %s: %w", o, o.GetName(), err)
			}
		}
		return nil
	}, func(i int) []client.Object {
		objs, _ := designObjects(ns, i, "") // built before without error: same inputs
		return append(objs, floorService(ns, i), &lbv1.IP{ObjectMeta: metav1.ObjectMeta{Name: lbv1.IPName(floorAddr(i))}})
	}, timed)
}

// designObjects returns what the operator creates for the i-th Service of ns with two lb pods, in
// its order: the election key's Secret, the namespace's ServiceAccount and RoleBinding (for the
// first Service only: the rest share them), Deployment, PodDisruptionBudget, and the Event it
// records.
func designObjects(ns string, i int, uid types.UID) ([]client.Object, error) {
	name := "svc-" + strconv.Itoa(i)
	addr := floorAddr(i)
	p := lbobjects.Params{
		ServiceName: name, ServiceNamespace: ns, ServiceUID: uid,
		Provider: provider, NADName: "lb-svc-attachment", NADNamespace: "bench", SubnetName: "bench-floor",
		Addresses: []netip.Addr{addr}, CIDRs: []netip.Prefix{netip.MustParsePrefix("100.64.0.0/10")},
		Gateways: []netip.Addr{netip.MustParseAddr("100.64.0.1")}, Image: "lbsvc-lbpod:bench", Replicas: 2,
	}
	set, err := lbobjects.Build(p)
	if err != nil {
		return nil, err
	}
	now := metav1.Now()
	event := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Namespace: ns, Name: name + ".design-floor"},
		InvolvedObject: corev1.ObjectReference{Kind: "Service", APIVersion: "v1", Namespace: ns, Name: name, UID: uid},
		Type:           corev1.EventTypeNormal, Reason: "Allocated", Message: addr.String() + " from subnet bench-floor",
		Source: corev1.EventSource{Component: "lbsvc-operator"}, Count: 1, FirstTimestamp: now, LastTimestamp: now,
	}
	// The election key as the operator writes it (BuildHAKeySecret's, which names it after the
	// claim's IP objects, with its 32 random bytes).
	key := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-ha"}, Immutable: ptr.To(true),
		Data: map[string][]byte{"key": make([]byte, 32)}}
	objs := []client.Object{key}
	for _, stage := range set.Stages() {
		for _, o := range stage {
			if i == 0 || !lbobjects.IsIdentity(o) {
				objs = append(objs, o)
			}
		}
	}
	return append(objs, event), nil
}
