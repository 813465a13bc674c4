package controllers

import (
	"strings"
	"testing"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
	"github.com/lbsvc/lbsvc-operator/controllers/decide"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
)

// The ForeignHolderIgnored Warning Event goes out once per set of ignored objects: not again
// for the same set, again when it changes, and again once the IP object was gone.
func TestForeignHolderEventOnlyWhenTheSetChanges(t *testing.T) {
	rec := events.NewFakeRecorder(10)
	r := &IPReconciler{Recorder: rec}
	ip := &lbv1.IP{ObjectMeta: metav1.ObjectMeta{Name: "10.0.0.7"}, Spec: lbv1.IPSpec{Address: "10.0.0.7", Subnet: "sn",
		Service: lbv1.IPOwner{Namespace: "team-a", Name: "web", UID: "victim-uid"}}}
	sent := func() []string {
		var out []string
		for {
			select {
			case e := <-rec.Events:
				out = append(out, e)
			default:
				return out
			}
		}
	}
	want := func(step string, n int) {
		t.Helper()
		got := sent()
		if len(got) != n {
			t.Fatalf("%s: %d Events %q, want %d", step, len(got), got, n)
		}
		for _, e := range got {
			if !strings.HasPrefix(e, corev1.EventTypeWarning+" "+decide.ReasonForeignHolderIgnored+" ") {
				t.Errorf("%s: Event %q, want a %s Warning", step, e, decide.ReasonForeignHolderIgnored)
			}
		}
	}
	r.reportForeign(ip, []string{"pod team-b/squat"})
	want("first squatter", 1)
	r.reportForeign(ip, []string{"pod team-b/squat"})
	r.reportForeign(ip, []string{"pod team-b/squat"})
	want("same squatter again", 0)
	r.reportForeign(ip, []string{"pod team-b/squat", "deployment team-b/squat"})
	want("a second squatter", 1)
	r.reportForeign(ip, []string{"deployment team-b/squat", "pod team-b/squat"})
	want("same two, other order", 0)
	r.reportForeign(ip, nil)
	want("squatters gone", 0)
	r.reportForeign(ip, []string{"pod team-b/squat"})
	want("a squatter back", 1)
	r.forgetForeign(ip.Name)
	if len(r.reported) != 0 {
		t.Errorf("after forget, %d IP objects remembered, want 0", len(r.reported))
	}
	r.reportForeign(ip, []string{"pod team-b/squat"})
	want("same name, after the IP object was gone", 1)
}

// The holder list is cut to 16 after the active one is put first: with more pods than that (a
// rollout of many replicas, or leftovers), the active one is still shown.
func TestHolderListKeepsTheActiveOne(t *testing.T) {
	var pods []corev1.Pod
	for i := range 20 {
		pods = append(pods, corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p" + strings.Repeat("x", i)}, Spec: corev1.PodSpec{NodeName: "n"}})
	}
	active := decide.PodKey(&pods[19])
	got := holderList(pods, active, nil)
	if len(got) != 16 || got[0].Pod != active || got[0].Role != lbv1.RoleActive {
		t.Fatalf("holders %d, first %+v; want 16, the active %s first", len(got), got[0], active)
	}
	for _, h := range got[1:] {
		if h.Role != lbv1.RoleStandby {
			t.Fatalf("holder %+v: want a standby", h)
		}
	}
}

// A pass that reads the IP object from the cache before the cache shows the phase Conflict it
// wrote decides the same transition again: noted, it is neither counted nor announced twice
// (lbsvc_address_conflicts_total counted 2 for one conflict in a CI run). A new object of the
// name (the admin deleted the old one) is not the one noted.
func TestConflictNotedOncePerObject(t *testing.T) {
	var c conflictWrites
	ip := &lbv1.IP{ObjectMeta: metav1.ObjectMeta{Name: "10.0.0.6", UID: "u1"}, Spec: lbv1.IPSpec{Address: "10.0.0.6",
		Service: lbv1.IPOwner{Namespace: "team-a", Name: "web", UID: "s1"}}}
	if c.noted(ip) {
		t.Fatal("noted before it was written")
	}
	c.note(ip)
	if !c.noted(ip) {
		t.Fatal("not noted after it was written")
	}
	again := ip.DeepCopy()
	again.UID = "u2"
	if c.noted(again) {
		t.Fatal("a new object of the name counts as the one noted")
	}
}
