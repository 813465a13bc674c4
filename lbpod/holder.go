package lbpod

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordinationclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
)

// HolderRecord writes to the Service's Lease that this lb pod holds the address, once per
// takeover. It is a record, not a lock: the lb pods settle who holds the address on the underlay
// and never wait for the API server, which may be unreachable while they do. The record is never
// renewed, so an idle Service costs no API write; the operator reads it to show the holder
// (role labels, the Service's AddressActive condition and annotations, the IP object).
type HolderRecord struct {
	// Leases reads and updates Leases in the Service's namespace (the lb pod's Role allows get and
	// update on this one Lease only).
	Leases coordinationclient.LeaseInterface
	// Name is the Lease's name; Identity is the pod's name.
	Name, Identity string
	Log            *slog.Logger
	// Backoff is the first wait after a failed write (doubled up to 10 s); 0 means 200 ms.
	Backoff time.Duration

	held chan bool
}

// NewHolderRecord returns a record writer; call Run, then Held from the loop's OnHeld.
func NewHolderRecord(leases coordinationclient.LeaseInterface, name, identity string, log *slog.Logger) *HolderRecord {
	if log == nil {
		log = slog.Default()
	}
	return &HolderRecord{Leases: leases, Name: name, Identity: identity, Log: log, held: make(chan bool, 1)}
}

// Held tells the writer whether the pod now holds the address. It never blocks: only the newest
// value counts.
func (h *HolderRecord) Held(held bool) {
	for {
		select {
		case h.held <- held:
			return
		default:
			select {
			case <-h.held:
			default:
			}
		}
	}
}

// NextLeaseSpec returns the Lease spec that records identity as the holder at now, and whether
// it differs from cur. A takeover counts one transition; the same pod again (a restarted
// container) writes nothing.
func NextLeaseSpec(cur coordinationv1.LeaseSpec, identity string, now time.Time) (coordinationv1.LeaseSpec, bool) {
	if cur.HolderIdentity != nil && *cur.HolderIdentity == identity {
		return cur, false
	}
	next := *cur.DeepCopy()
	next.HolderIdentity = &identity
	t := metav1.NewMicroTime(now)
	next.AcquireTime = &t
	next.RenewTime = &t
	var n int32
	if cur.LeaseTransitions != nil {
		n = *cur.LeaseTransitions
	}
	if cur.HolderIdentity != nil && *cur.HolderIdentity != "" {
		n++
	}
	next.LeaseTransitions = &n
	return next, true
}

// Run writes the record each time the pod starts holding the address, retrying with backoff
// while it still holds it, until ctx ends.
func (h *HolderRecord) Run(ctx context.Context) {
	first := h.Backoff
	if first <= 0 {
		first = 200 * time.Millisecond
	}
	for {
		var held bool
		select {
		case <-ctx.Done():
			return
		case held = <-h.held:
		}
		wait := first
		for held {
			err := h.write(ctx)
			if err == nil {
				break
			}
			h.Log.Warn("recording the holder in the Lease failed; retrying (the address is held regardless)", "lease", h.Name, "err", err, "in", wait)
			select {
			case <-ctx.Done():
				return
			case held = <-h.held:
				wait = first
			case <-time.After(wait):
				wait = min(2*wait, 10*time.Second)
			}
		}
	}
}

// write records the holder, re-reading on a conflict.
func (h *HolderRecord) write(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for range 3 {
		cur, err := h.Leases.Get(ctx, h.Name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("get lease %s: %w", h.Name, err)
		}
		next, changed := NextLeaseSpec(cur.Spec, h.Identity, time.Now())
		if !changed {
			return nil
		}
		cur.Spec = next
		_, err = h.Leases.Update(ctx, cur, metav1.UpdateOptions{FieldManager: "lbpod"})
		if err == nil {
			h.Log.Info("recorded as the holder", "lease", h.Name, "transitions", *next.LeaseTransitions)
			return nil
		}
		if !apierrors.IsConflict(err) {
			return fmt.Errorf("update lease %s: %w", h.Name, err)
		}
	}
	return fmt.Errorf("update lease %s: conflicts", h.Name)
}
