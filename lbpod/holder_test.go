package lbpod

import (
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/utils/ptr"
)

func TestNextLeaseSpec(t *testing.T) {
	now := time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name        string
		cur         coordinationv1.LeaseSpec
		changed     bool
		transitions int32
	}{
		{"empty lease: first holder, no transition", coordinationv1.LeaseSpec{}, true, 0},
		{"empty holder string", coordinationv1.LeaseSpec{HolderIdentity: ptr.To(""), LeaseTransitions: ptr.To[int32](2)}, true, 2},
		{"takeover from another pod", coordinationv1.LeaseSpec{HolderIdentity: ptr.To("lb-a"), LeaseTransitions: ptr.To[int32](4)}, true, 5},
		{"takeover, transitions unset", coordinationv1.LeaseSpec{HolderIdentity: ptr.To("lb-a")}, true, 1},
		{"already ours: no write", coordinationv1.LeaseSpec{HolderIdentity: ptr.To("lb-b"), LeaseTransitions: ptr.To[int32](7)}, false, 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			next, changed := NextLeaseSpec(tc.cur, "lb-b", now)
			if changed != tc.changed || *next.HolderIdentity != "lb-b" || *next.LeaseTransitions != tc.transitions {
				t.Fatalf("got %+v changed %v", next, changed)
			}
			if changed && (!next.AcquireTime.Time.Equal(now) || !next.RenewTime.Time.Equal(now)) {
				t.Fatalf("times %v %v", next.AcquireTime, next.RenewTime)
			}
		})
	}
}

// Held never blocks and keeps only the newest value.
func TestHolderRecordHeldKeepsNewest(t *testing.T) {
	h := NewHolderRecord(nil, "l", "p", nil)
	for _, v := range []bool{true, false, true, false} {
		h.Held(v)
	}
	if got := <-h.held; got != false {
		t.Fatalf("got %v", got)
	}
	select {
	case v := <-h.held:
		t.Fatalf("a second value %v", v)
	default:
	}
}
