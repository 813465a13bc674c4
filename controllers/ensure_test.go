package controllers

import (
	"context"
	"net/netip"
	"testing"

	"github.com/lbsvc/lbsvc-operator/controllers/lbobjects"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// oneDeployment is a client.Reader that holds one Deployment (nil: none) and counts its reads.
type oneDeployment struct {
	client.Reader
	d     *appsv1.Deployment
	reads int
}

func (o *oneDeployment) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	o.reads++
	if o.d == nil {
		return apierrors.NewNotFound(schema.GroupResource{Group: "apps", Resource: "deployments"}, key.Name)
	}
	o.d.DeepCopyInto(obj.(*appsv1.Deployment))
	return nil
}

// cached is what the cache holds of live: the same object through TrimForCache.
func cached(t *testing.T, live *appsv1.Deployment) *appsv1.Deployment {
	t.Helper()
	out, err := TrimForCache(live.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	d := out.(*appsv1.Deployment)
	if !lbobjects.TemplateTrimmed(d) {
		t.Fatal("the cached Deployment kept its template")
	}
	return d
}

// A Deployment cached without its template is up to date when its live spec was seen to match
// (no read); otherwise it is read once from the API server and compared in full, so that a hand
// edit of the template, a removal included, is still found and reverted.
func TestTrimmedDeploymentUpToDate(t *testing.T) {
	ctx := context.Background()
	desired, err := lbobjects.BuildDeployment(seedParams())
	if err != nil {
		t.Fatal(err)
	}
	live := desired.DeepCopy()
	live.Spec.RevisionHistoryLimit = new(int32) // a server default: not ours, not compared
	api := &oneDeployment{d: live}
	r := &ServiceReconciler{Reader: api, specs: newSpecDigests()}

	ok, err := r.upToDate(ctx, desired, cached(t, live))
	if err != nil || !ok || api.reads != 1 {
		t.Fatalf("first look: up to date %v (%v) after %d reads, want true after 1", ok, err, api.reads)
	}
	ok, err = r.upToDate(ctx, desired, cached(t, live))
	if err != nil || !ok || api.reads != 1 {
		t.Fatalf("second look: up to date %v (%v) after %d reads, want true without a read", ok, err, api.reads)
	}

	// A hand edit that only removes something: no field changes owner, but the spec's digest does.
	edited := live.DeepCopy()
	edited.Spec.Template.Spec.Containers[0].SecurityContext.Capabilities.Drop = nil
	api.d = edited
	ok, err = r.upToDate(ctx, desired, cached(t, edited))
	if err != nil || ok || api.reads != 2 {
		t.Fatalf("after a hand edit: up to date %v (%v) after %d reads, want false after 2", ok, err, api.reads)
	}

	// A new desired spec (the address moved) is compared in full even though the live spec is known.
	api.d = live
	moved := seedParams()
	moved.Image = "lbpod:2"
	next, err := lbobjects.BuildDeployment(moved)
	if err != nil {
		t.Fatal(err)
	}
	ok, err = r.upToDate(ctx, next, cached(t, live))
	if err != nil || ok || api.reads != 3 {
		t.Fatalf("new desired spec: up to date %v (%v) after %d reads, want false after 3", ok, err, api.reads)
	}

	// What the cache keeps is compared without a read: a replica count changed by hand.
	scaled := live.DeepCopy()
	scaled.Spec.Replicas = new(int32)
	ok, err = r.upToDate(ctx, desired, cached(t, scaled))
	if err != nil || ok || api.reads != 3 {
		t.Fatalf("scaled by hand: up to date %v (%v) after %d reads, want false without a read", ok, err, api.reads)
	}

	// Gone from the API server: not up to date (the apply creates it again).
	api.d = nil
	r.specs.forget(client.ObjectKeyFromObject(live))
	if ok, err := r.upToDate(ctx, desired, cached(t, live)); err != nil || ok {
		t.Fatalf("gone: up to date %v (%v), want false", ok, err)
	}

	// Objects other than Deployments are compared as they are.
	sa := &corev1.ServiceAccount{}
	if ok, err := r.upToDate(ctx, sa, sa.DeepCopy()); err != nil || !ok {
		t.Fatalf("service account: %v %v", ok, err)
	}
}

// rememberSpec takes only a full Deployment that matches what we want: a mutating webhook that
// changed our create is compared in full on the next pass, as before.
func TestRememberSpecOnlyWhatMatches(t *testing.T) {
	desired, err := lbobjects.BuildDeployment(seedParams())
	if err != nil {
		t.Fatal(err)
	}
	r := &ServiceReconciler{specs: newSpecDigests()}
	mutated := desired.DeepCopy()
	mutated.Spec.Template.Spec.Containers[0].Image = "mirror.example/lbpod:dev"
	r.rememberSpec(desired, mutated)
	if len(r.specs.seen) != 0 {
		t.Fatalf("remembered a Deployment that does not match: %v", r.specs.seen)
	}
	r.rememberSpec(desired, desired.DeepCopy())
	key := client.ObjectKeyFromObject(desired)
	if !r.specs.matches(key, lbobjects.SpecDigest(&desired.Spec), lbobjects.SpecDigest(&desired.Spec)) {
		t.Fatal("a matching Deployment was not remembered")
	}
	r.specs.forget(key)
	if r.specs.matches(key, lbobjects.SpecDigest(&desired.Spec), lbobjects.SpecDigest(&desired.Spec)) {
		t.Fatal("forget kept it")
	}
}

// seedParams is the seed's Service (the lbobjects tests build the same one).
func seedParams() lbobjects.Params {
	return lbobjects.Params{ServiceName: "test-service", ServiceNamespace: "default", ServiceUID: "161edee1-7f6e-40f5-9e09-5a52c44267d0",
		Provider: "lb-svc-attachment.kube-system", NADName: "lb-svc-attachment", NADNamespace: "kube-system", SubnetName: "attach-subnet",
		Addresses: []netip.Addr{netip.MustParseAddr("172.18.0.18")}, CIDRs: []netip.Prefix{netip.MustParsePrefix("172.18.0.0/16")},
		Gateways: []netip.Addr{netip.MustParseAddr("172.18.0.1")}, Image: "localhost/lbsvc-lbpod:dev", Sysctls: lbobjects.ForwardingIPv6}
}
