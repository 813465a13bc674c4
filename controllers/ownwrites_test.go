package controllers

import (
	"context"
	"errors"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
)

func svcAt(ns, name, rv string) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, ResourceVersion: rv}}
}

func TestOwnWritesPredicate(t *testing.T) {
	own := newOwnWrites()
	p := own.notOwn()
	own.record(svcAt("a", "web", "10")) // status patch
	own.record(svcAt("a", "web", "11")) // metadata patch of the same pass
	own.record(svcAt("a", "other", "12"))
	own.record(svcAt("a", "web", "")) // a write without a version records nothing
	for name, tc := range map[string]struct {
		ev   func() bool
		pass bool
	}{
		"echo of our status patch":      {func() bool { return p.Update(event.UpdateEvent{ObjectNew: svcAt("a", "web", "10")}) }, false},
		"echo of our metadata patch":    {func() bool { return p.Update(event.UpdateEvent{ObjectNew: svcAt("a", "web", "11")}) }, false},
		"someone else's later write":    {func() bool { return p.Update(event.UpdateEvent{ObjectNew: svcAt("a", "web", "13")}) }, true},
		"our version of another object": {func() bool { return p.Update(event.UpdateEvent{ObjectNew: svcAt("a", "web", "12")}) }, true},
		"same name, another namespace":  {func() bool { return p.Update(event.UpdateEvent{ObjectNew: svcAt("b", "web", "10")}) }, true},
		"same name and version, another kind": {func() bool {
			d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "web", ResourceVersion: "10"}}
			return p.Create(event.CreateEvent{Object: d})
		}, true},
		"creation we made":      {func() bool { return p.Create(event.CreateEvent{Object: svcAt("a", "other", "12")}) }, false},
		"generic always passes": {func() bool { return p.Generic(event.GenericEvent{Object: svcAt("a", "web", "10")}) }, true},
	} {
		if got := tc.ev(); got != tc.pass {
			t.Errorf("%s: passes=%v, want %v", name, got, tc.pass)
		}
	}
	// A deletion passes and forgets the object's versions.
	if !p.Delete(event.DeleteEvent{Object: svcAt("a", "web", "11")}) {
		t.Error("deletion did not pass")
	}
	if own.isOwn(svcAt("a", "web", "11")) {
		t.Error("versions of a deleted object kept")
	}
}

func TestOwnWritesKeepsTheLastFew(t *testing.T) {
	own := newOwnWrites()
	for rv := 1; rv <= ownWritesKept+2; rv++ {
		own.record(svcAt("a", "web", string(rune('0'+rv))))
	}
	for rv, want := range map[string]bool{"1": false, "2": false, "3": true, string(rune('0' + ownWritesKept + 2)): true} {
		if got := own.isOwn(svcAt("a", "web", rv)); got != want {
			t.Errorf("version %s kept=%v, want %v", rv, got, want)
		}
	}
	if n := len(own.rvs[keyOf(svcAt("a", "web", ""))]); n != ownWritesKept {
		t.Errorf("%d versions kept, want %d", n, ownWritesKept)
	}
}

// The echo of a write is let through the filter's check once: the version is then dropped, so
// that the versions of every object written are not kept for its whole life.
func TestOwnWritesEchoConsumed(t *testing.T) {
	own := newOwnWrites()
	p := own.notOwn()
	own.record(svcAt("a", "web", "10"))
	own.record(svcAt("a", "web", "11"))
	if p.Update(event.UpdateEvent{ObjectNew: svcAt("a", "web", "11")}) {
		t.Fatal("echo of our write passed")
	}
	if got := own.rvs[keyOf(svcAt("a", "web", ""))]; len(got) != 1 || got[0] != "10" {
		t.Fatalf("kept %v after the echo of 11, want [10]", got)
	}
	if p.Update(event.UpdateEvent{ObjectNew: svcAt("a", "web", "10")}) {
		t.Fatal("echo of our earlier write passed")
	}
	if len(own.rvs) != 0 {
		t.Fatalf("kept %v after every echo came back, want nothing", own.rvs)
	}
	// A second event at the same version (a re-list) is not ours any more: it passes.
	if !p.Update(event.UpdateEvent{ObjectNew: svcAt("a", "web", "10")}) {
		t.Fatal("a repeated event was filtered")
	}
}

// versioning is a client.Client whose writes give the object the next resourceVersion, or fail.
type versioning struct {
	client.Client
	next string
	err  error
}

func (v *versioning) Create(_ context.Context, obj client.Object, _ ...client.CreateOption) error {
	if v.err != nil {
		return v.err
	}
	obj.SetResourceVersion(v.next)
	return nil
}

func (v *versioning) Patch(_ context.Context, obj client.Object, _ client.Patch, _ ...client.PatchOption) error {
	return v.Create(context.Background(), obj)
}

func (v *versioning) Status() client.SubResourceWriter { return versioningStatus{v: v} }

// versioningStatus implements only Patch (the one status write we make).
type versioningStatus struct {
	client.SubResourceWriter
	v *versioning
}

func (s versioningStatus) Patch(_ context.Context, obj client.Object, _ client.Patch, _ ...client.SubResourcePatchOption) error {
	return s.v.Create(context.Background(), obj)
}

func TestRecordingClient(t *testing.T) {
	own := newOwnWrites()
	under := &versioning{}
	c := recordingClient{Client: under, own: own}
	ctx := context.Background()
	under.next = "5"
	if err := c.Create(ctx, svcAt("a", "created", "")); err != nil {
		t.Fatal(err)
	}
	under.next = "6"
	if err := c.Patch(ctx, svcAt("a", "patched", "1"), client.MergeFrom(svcAt("a", "patched", "1"))); err != nil {
		t.Fatal(err)
	}
	under.next = "7"
	if err := c.Status().Patch(ctx, svcAt("a", "status", "1"), client.MergeFrom(svcAt("a", "status", "1"))); err != nil {
		t.Fatal(err)
	}
	under.next, under.err = "8", errors.New("conflict")
	if err := c.Patch(ctx, svcAt("a", "failed", "1"), client.MergeFrom(svcAt("a", "failed", "1"))); err == nil {
		t.Fatal("the failed write did not fail")
	}
	for key, want := range map[[2]string]bool{
		{"created", "5"}: true, {"patched", "6"}: true, {"status", "7"}: true,
		{"failed", "8"}: false, {"failed", "1"}: false, {"patched", "1"}: false,
	} {
		if got := own.isOwn(svcAt("a", key[0], key[1])); got != want {
			t.Errorf("%s at %s recorded=%v, want %v", key[0], key[1], got, want)
		}
	}
}
