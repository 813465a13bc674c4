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

// An event that arrives while our write to the object is in flight is held until the write's
// answer: the echo of our version is dropped, any other version wakes the Service.
func TestOwnWritesHoldsEventsDuringAWrite(t *testing.T) {
	var woken []string
	own := newOwnWrites()
	own.wake = func(o client.Object) { woken = append(woken, o.GetName()+"@"+o.GetResourceVersion()) }
	p := own.notOwn()
	update := func(rv string) bool { return p.Update(event.UpdateEvent{ObjectNew: svcAt("a", "web", rv)}) }

	// The echo came before the answer (the common case): held, then dropped.
	k := own.begin(svcAt("a", "web", "9"))
	if update("10") {
		t.Fatal("an event during our write passed")
	}
	own.end(k, svcAt("a", "web", "10"), true)
	if len(woken) != 0 {
		t.Fatalf("the echo of our own write woke %v", woken)
	}
	if own.isOwn(svcAt("a", "web", "10")) {
		t.Error("a version whose echo was already seen is still kept")
	}

	// Someone else's version came during our write: it wakes the Service once we are answered.
	k = own.begin(svcAt("a", "web", "10"))
	if update("11") {
		t.Fatal("an event during our write passed")
	}
	own.end(k, svcAt("a", "web", "12"), true)
	if len(woken) != 1 || woken[0] != "web@11" {
		t.Fatalf("woken %v, want [web@11]", woken)
	}
	// Our echo, arriving after the answer, is still recognised.
	if update("12") {
		t.Error("the echo of our write, after its answer, passed")
	}

	// Our write failed: whatever came meanwhile is someone else's.
	woken = nil
	k = own.begin(svcAt("a", "web", "12"))
	update("13")
	own.end(k, svcAt("a", "web", "12"), false)
	if len(woken) != 1 || woken[0] != "web@13" {
		t.Fatalf("after a failed write: woken %v, want [web@13]", woken)
	}

	// Two writes to one object in flight: nothing is settled before the last answer.
	woken = nil
	k1 := own.begin(svcAt("a", "web", "13"))
	k2 := own.begin(svcAt("a", "web", "13"))
	update("14")
	update("15")
	own.end(k1, svcAt("a", "web", "14"), true)
	if len(woken) != 0 {
		t.Fatalf("settled with a write still in flight: woken %v", woken)
	}
	own.end(k2, svcAt("a", "web", "15"), true)
	if len(woken) != 0 {
		t.Fatalf("both held events were echoes of our writes, yet woken %v", woken)
	}

	// No write in flight: events pass as before, and other objects are never held.
	k = own.begin(svcAt("a", "other", "1"))
	if !update("16") {
		t.Error("an event for an object with no write in flight was held")
	}
	own.end(k, svcAt("a", "other", "2"), true)
	if len(own.inFlight) != 0 || len(own.held) != 0 {
		t.Errorf("left behind: in flight %v, held %v", own.inFlight, own.held)
	}
}
