package decide

import (
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestDecideHeldTwice(t *testing.T) {
	const (
		note  = "lb-a 2026-11-24T17:00:00Z 3 lb-b 4"
		held  = `172.18.0.18 was held by two lb pods at once: "lb-a" (term 3) and "lb-b" (term 4); at 2026-11-24T17:00:00Z the Lease fenced "lb-a", whose adverts and the other's did not reach each other: check that the underlay carries EtherType 0x88B5 multicast between their nodes`
		quiet = `one holder since 2026-11-24T17:00:00Z, when "lb-a" and "lb-b" both held 172.18.0.18`
	)
	at := time.Date(2026, 11, 24, 17, 0, 0, 0, time.UTC)
	pods := []corev1.Pod{lbPod("lb-a", "n1", true, ""), lbPod("lb-b", "n2", true, "")}
	cond := func(status metav1.ConditionStatus, reason, msg string) *metav1.Condition {
		return &metav1.Condition{Type: "lbsvc.io/AddressHeldTwice", Status: status, Reason: reason, Message: msg}
	}
	ips := []string{"172.18.0.18"}
	for _, tc := range []struct {
		name string
		in   HeldTwiceInputs
		want HeldTwicePlan
	}{{
		name: "no note: nothing to show, no condition",
		in:   HeldTwiceInputs{Pods: pods, Addresses: "172.18.0.18", Now: at},
		want: HeldTwicePlan{IPObjects: ips},
	}, {
		name: "a new note: condition True, one Warning, recheck when the quiet period ends",
		in:   HeldTwiceInputs{Note: note, Pods: pods, Addresses: "172.18.0.18", Now: at.Add(2 * time.Second)},
		want: HeldTwicePlan{Condition: cond("True", "AddressHeldTwice", held), Warning: held, IPObjects: ips, RecheckAfter: 9*time.Minute + 58*time.Second},
	}, {
		name: "the same note again (a later pass, a restarted operator): no second Warning",
		in:   HeldTwiceInputs{Note: note, Current: cond("True", "AddressHeldTwice", held), Pods: pods, Addresses: "172.18.0.18", Now: at.Add(time.Minute)},
		want: HeldTwicePlan{Condition: cond("True", "AddressHeldTwice", held), IPObjects: ips, RecheckAfter: 9 * time.Minute},
	}, {
		name: "a newer note while True: another Warning",
		in: HeldTwiceInputs{Note: "lb-b 2026-11-24T17:00:30Z 4 lb-a 5", Current: cond("True", "AddressHeldTwice", held), Pods: pods,
			Addresses: "172.18.0.18", Now: at.Add(31 * time.Second)},
		want: HeldTwicePlan{Condition: cond("True", "AddressHeldTwice",
			`172.18.0.18 was held by two lb pods at once: "lb-b" (term 4) and "lb-a" (term 5); at 2026-11-24T17:00:30Z the Lease fenced "lb-b", whose adverts and the other's did not reach each other: check that the underlay carries EtherType 0x88B5 multicast between their nodes`),
			Warning:   `172.18.0.18 was held by two lb pods at once: "lb-b" (term 4) and "lb-a" (term 5); at 2026-11-24T17:00:30Z the Lease fenced "lb-b", whose adverts and the other's did not reach each other: check that the underlay carries EtherType 0x88B5 multicast between their nodes`,
			IPObjects: ips, RecheckAfter: 9*time.Minute + 59*time.Second},
	}, {
		name: "the quiet period over: condition False, no Warning",
		in:   HeldTwiceInputs{Note: note, Current: cond("True", "AddressHeldTwice", held), Pods: pods, Addresses: "172.18.0.18", Now: at.Add(HeldTwiceQuiet)},
		want: HeldTwicePlan{Condition: cond("False", "SingleHolder", quiet), IPObjects: ips},
	}, {
		name: "a note older than the quiet period never reported: condition False, no Warning",
		in:   HeldTwiceInputs{Note: note, Pods: pods, Addresses: "172.18.0.18", Now: at.Add(time.Hour)},
		want: HeldTwicePlan{Condition: cond("False", "SingleHolder", quiet), IPObjects: ips},
	}, {
		name: "a note by a pod that is none of the Service's lb pods is ignored",
		in:   HeldTwiceInputs{Note: "lb-x 2026-11-24T17:00:00Z 3 lb-b 4", Pods: pods, Addresses: "172.18.0.18", Now: at},
		want: HeldTwicePlan{IPObjects: ips},
	}, {
		name: "a note that does not parse is ignored",
		in:   HeldTwiceInputs{Note: "lb-a yesterday 3 lb-b 4", Pods: pods, Addresses: "172.18.0.18", Now: at},
		want: HeldTwicePlan{IPObjects: ips},
	}, {
		name: "dual stack: both IP objects",
		in:   HeldTwiceInputs{Pods: pods, Addresses: "172.18.0.18,fd00::18", Now: at},
		want: HeldTwicePlan{IPObjects: []string{"172.18.0.18", "fd00-0000-0000-0000-0000-0000-0000-0018"}},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			if got := DecideHeldTwice(tc.in); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestParseHeldTwice(t *testing.T) {
	got, ok := parseHeldTwice(" lb-a  2026-11-24T17:00:00Z 3 02:00:00:00:00:0b 18446744073709551615 ")
	want := heldTwiceNote{pod: "lb-a", at: time.Date(2026, 11, 24, 17, 0, 0, 0, time.UTC), term: 3, other: "02:00:00:00:00:0b", otherTerm: 18446744073709551615}
	if !ok || got != want {
		t.Fatalf("got %+v %t, want %+v", got, ok, want)
	}
	for _, bad := range []string{"", "lb-a 2026-11-24T17:00:00Z 3 lb-b", "lb-a 2026-11-24T17:00:00Z x lb-b 4", "lb-a 2026-11-24T17:00:00Z 3 lb-b -4", "lb-a 17:00 3 lb-b 4 extra"} {
		if _, ok := parseHeldTwice(bad); ok {
			t.Errorf("parseHeldTwice(%q) parsed", bad)
		}
	}
}
