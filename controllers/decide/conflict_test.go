package decide

import (
	"reflect"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
)

func TestDecideIPConflict(t *testing.T) {
	const (
		mac    = "02:42:ac:12:00:05"
		report = "172.18.0.18 02:42:ac:12:00:05 2026-11-25T01:02:03Z"
		msg    = "in use on the underlay: 02:42:ac:12:00:05 answered the probe at 2026-11-25T01:02:03Z; it is not handed out again until an admin deletes the IP object (kubectl delete ip 172.18.0.18)"
		event  = "172.18.0.18 is in use on the underlay: 02:42:ac:12:00:05 answered the lb pod's probe before the first announcement; the Service default/web does not announce it, and it is not handed out again until an admin deletes the IP object (kubectl delete ip 172.18.0.18)"
	)
	at := metav1.NewTime(time.Date(2026, 11, 25, 1, 2, 3, 0, time.UTC))
	conflict := &lbv1.IPConflictStatus{MAC: mac, Since: at}
	ip := func(phase lbv1.IPPhase, announced bool, c *lbv1.IPConflictStatus) *lbv1.IP {
		o := &lbv1.IP{Spec: lbv1.IPSpec{Address: "172.18.0.18", Subnet: "s", Service: lbv1.IPOwner{Namespace: "default", Name: "web", UID: "u1"}}}
		o.Name = "172.18.0.18"
		o.Status.Phase, o.Status.Announced, o.Status.Conflict = phase, announced, c
		return o
	}
	created := func(o *lbv1.IP, t time.Time) *lbv1.IP { o.CreationTimestamp = metav1.NewTime(t); return o }
	lease := func(kv ...string) *coordinationv1.Lease {
		l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "lb-svc-web", Annotations: map[string]string{}}}
		for i := 0; i+1 < len(kv); i += 2 {
			l.Annotations[kv[i]] = kv[i+1]
		}
		return l
	}
	for _, tc := range []struct {
		name string
		in   IPConflictInputs
		want IPConflictPlan
	}{{
		name: "no Lease yet: Bound, not announced",
		in:   IPConflictInputs{IP: ip(lbv1.IPBound, false, nil)},
		want: IPConflictPlan{Phase: lbv1.IPBound},
	}, {
		name: "the Lease lists the address as announced: announced for good",
		in:   IPConflictInputs{IP: ip(lbv1.IPBound, false, nil), Lease: lease(lbv1.AnnouncedAnnotation, "172.18.0.18,fd00::18")},
		want: IPConflictPlan{Phase: lbv1.IPBound, Announced: true},
	}, {
		name: "a Lease of a release without the probe (a claim, no list): announced",
		in:   IPConflictInputs{IP: ip(lbv1.IPBound, false, nil), Lease: lease(lbv1.HAClaimAnnotation, "3 100 02:00:00:00:00:01")},
		want: IPConflictPlan{Phase: lbv1.IPBound, Announced: true},
	}, {
		name: "a list without the address: not announced",
		in:   IPConflictInputs{IP: ip(lbv1.IPBound, false, nil), Lease: lease(lbv1.HAClaimAnnotation, "3 100 02:00:00:00:00:01", lbv1.AnnouncedAnnotation, "172.18.0.17")},
		want: IPConflictPlan{Phase: lbv1.IPBound},
	}, {
		name: "announced stays, whatever the Lease says later",
		in:   IPConflictInputs{IP: ip(lbv1.IPBound, true, nil), Lease: lease(lbv1.AnnouncedAnnotation, "")},
		want: IPConflictPlan{Phase: lbv1.IPBound, Announced: true},
	}, {
		name: "a report for a never-announced address: Conflict, one Warning",
		in:   IPConflictInputs{IP: ip(lbv1.IPBound, false, nil), Lease: lease(lbv1.AddressConflictAnnotation, report)},
		want: IPConflictPlan{Phase: lbv1.IPConflict, Conflict: conflict, Message: msg, Event: event},
	}, {
		name: "a report with fewer than MaxConflictsPerNamespace addresses of the namespace in Conflict: Conflict",
		in:   IPConflictInputs{IP: ip(lbv1.IPBound, false, nil), Lease: lease(lbv1.AddressConflictAnnotation, report), NamespaceConflicts: MaxConflictsPerNamespace - 1},
		want: IPConflictPlan{Phase: lbv1.IPConflict, Conflict: conflict, Message: msg, Event: event},
	}, {
		// The namespace's tenants may write the Lease too: what they can lock is bounded.
		name: "a report when the namespace already holds MaxConflictsPerNamespace addresses in Conflict: not believed",
		in:   IPConflictInputs{IP: ip(lbv1.IPBound, false, nil), Lease: lease(lbv1.AddressConflictAnnotation, report), NamespaceConflicts: MaxConflictsPerNamespace},
		want: IPConflictPlan{Phase: lbv1.IPBound,
			Ignored: "a conflict reported for 172.18.0.18 is not believed: namespace default already holds 3 addresses of its family in phase Conflict (at most 3; an admin clears one by deleting its IP object)"},
	}, {
		// An admin deleted the IP object in Conflict; the Service claimed the address again.
		name: "a report older than the IP object (beyond the clock skew allowed): not believed",
		in:   IPConflictInputs{IP: created(ip(lbv1.IPBound, false, nil), at.Add(ConflictReportSkew+time.Second)), Lease: lease(lbv1.AddressConflictAnnotation, report)},
		want: IPConflictPlan{Phase: lbv1.IPBound,
			Ignored: "a conflict reported for 172.18.0.18 at 2026-11-25T01:02:03Z is not believed: it predates this IP object (created 2026-11-25T01:02:09Z), so it was about an earlier claim of the address"},
	}, {
		name: "a report dated a little before the IP object (the lb pod's clock behind): Conflict",
		in:   IPConflictInputs{IP: created(ip(lbv1.IPBound, false, nil), at.Add(ConflictReportSkew)), Lease: lease(lbv1.AddressConflictAnnotation, report)},
		want: IPConflictPlan{Phase: lbv1.IPConflict, Conflict: conflict, Message: msg, Event: event},
	}, {
		name: "a report for the other family's address only: Bound",
		in:   IPConflictInputs{IP: ip(lbv1.IPBound, false, nil), Lease: lease(lbv1.AddressConflictAnnotation, "fd00::18 02:42:ac:12:00:05 2026-11-25T01:02:03Z")},
		want: IPConflictPlan{Phase: lbv1.IPBound},
	}, {
		name: "already in Conflict: kept, no second Warning, even when the Lease is cleared",
		in:   IPConflictInputs{IP: ip(lbv1.IPConflict, false, conflict), Lease: lease()},
		want: IPConflictPlan{Phase: lbv1.IPConflict, Conflict: conflict, Message: msg},
	}, {
		name: "a report after the address was announced (the status says so): ignored",
		in:   IPConflictInputs{IP: ip(lbv1.IPBound, true, nil), Lease: lease(lbv1.AddressConflictAnnotation, report)},
		want: IPConflictPlan{Phase: lbv1.IPBound, Announced: true,
			Ignored: "a conflict reported for 172.18.0.18 after it was announced is not believed (the probe runs only before the first announcement)"},
	}, {
		name: "a report beside the Lease's own announced list: ignored",
		in:   IPConflictInputs{IP: ip(lbv1.IPBound, false, nil), Lease: lease(lbv1.AnnouncedAnnotation, "172.18.0.18", lbv1.AddressConflictAnnotation, report)},
		want: IPConflictPlan{Phase: lbv1.IPBound, Announced: true,
			Ignored: "a conflict reported for 172.18.0.18 after it was announced is not believed (the probe runs only before the first announcement)"},
	}, {
		name: "a malformed report: ignored, with a bounded reason",
		in:   IPConflictInputs{IP: ip(lbv1.IPBound, false, nil), Lease: lease(lbv1.AddressConflictAnnotation, "172.18.0.18 "+strings.Repeat("z", 5000)+" now")},
		want: IPConflictPlan{Phase: lbv1.IPBound,
			Ignored: `annotation lbsvc.io/address-conflict on Lease default/lb-svc-web does not parse: entry "172.18.0.18 zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz...": "zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz..." is not a MAC address`},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got := DecideIPConflict(tc.in)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}

	// A shared address: its members of another namespace than the owner's are told without the
	// owner Service's name; those of the owner's namespace get the Event that names it.
	shared := ip(lbv1.IPBound, false, nil)
	shared.Spec.SharingKey = "dns"
	got := DecideIPConflict(IPConflictInputs{IP: shared, Lease: lease(lbv1.AddressConflictAnnotation, report)})
	const member = "the shared address 172.18.0.18 is in use on the underlay: 02:42:ac:12:00:05 answered the lb pod's probe before the first announcement; its lb pods do not announce it, and it is not handed out again until an admin deletes the IP object (kubectl delete ip 172.18.0.18)"
	if want := (IPConflictPlan{Phase: lbv1.IPConflict, Conflict: conflict, Message: msg, Event: event, MemberEvent: member}); !reflect.DeepEqual(got, want) {
		t.Errorf("shared: got  %+v\nwant %+v", got, want)
	}
	if e := got.EventFor(shared, "default"); e != event {
		t.Errorf("to the owner's namespace: %q", e)
	}
	if e := got.EventFor(shared, "team-b"); e != member {
		t.Errorf("to another namespace: %q", e)
	}
}
