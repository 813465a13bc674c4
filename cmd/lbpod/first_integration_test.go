//go:build integration

package main

import (
	"net/netip"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
	"github.com/lbsvc/lbsvc-operator/controllers/lbobjects"
	"github.com/lbsvc/lbsvc-operator/lbpod/ha"
)

// readyHolder stands in for the election's holder (loopHolder, which needs a loop and net1): the
// data path ready, not active, no other replica heard, unless set.
type readyHolder struct{ active, peer bool }

func (h readyHolder) Ready() bool     { return true }
func (h readyHolder) isActive() bool  { return h.active }
func (h readyHolder) heardPeer() bool { return h.peer }

// The Service's first claim against a real API server, with the rights the operator gives an lb
// pod: two replicas offer theirs at once on a Lease that names no holder, and
// the API server lets exactly one write through: the Lease names that pod, its claim and the
// address announced, and only that replica is granted; the other writes nothing. Then nothing is
// granted any more: the Lease has named a holder, and a write from a copy read before is refused.
// Where the Lease is absent, the first claim creates it, once. A replica that heard another one,
// or whose election took over meanwhile, offers nothing.
func TestFirstClaimGrantedToOne(t *testing.T) {
	const ns = "lbpod-first"
	g, admin, ctx, params, podClient, log, name := leaseTest(t, ns)
	leases := admin.CoordinationV1().Leases(ns)
	_, err := leases.Create(ctx, lbobjects.BuildLease(name, serviceOf(params)), metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	addr := netip.MustParseAddr("172.18.0.77")
	claims := map[string]ha.Claim{podA: {Term: 1, Priority: 100, Sender: macA}, podB: {Term: 1, Priority: 100, Sender: macB}}

	// offerBoth runs both replicas' first claims at once and returns who was granted what.
	offerBoth := func(holder firstHolder) map[string]ha.Claim {
		granted := map[string]ha.Claim{}
		var mu sync.Mutex
		var wg sync.WaitGroup
		for _, pod := range []string{podA, podB} {
			rec := newLeaseRecorder(podClient.api, ns, "web", name, pod, log)
			rec.addrs = []netip.Addr{addr}
			go rec.run(ctx)
			f := newFirstClaim(rec, nil, holder, 5*time.Second, log.With("pod", pod))
			wg.Add(1)
			go func() {
				defer wg.Done()
				f.Offer(claims[pod])
				f.run(ctx)
				select {
				case c := <-f.Grants():
					mu.Lock()
					granted[pod] = c
					mu.Unlock()
				default:
				}
			}()
		}
		wg.Wait()
		return granted
	}
	holderOf := func() []any {
		l, err := leases.Get(ctx, name, metav1.GetOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		return []any{ptr.Deref(l.Spec.HolderIdentity, ""), ptr.Deref(l.Spec.LeaseTransitions, -1), l.Annotations[v1alpha1.HAClaimAnnotation],
			l.Annotations[v1alpha1.AnnouncedAnnotation]}
	}

	granted := offerBoth(readyHolder{})
	g.Expect(granted).To(HaveLen(1), "exactly one replica is granted the first claim")
	var winner string
	for pod, c := range granted {
		winner = pod
		g.Expect(c).To(Equal(claims[pod]))
	}
	// Without the probe (no prober here) the address is not listed as announced yet.
	g.Expect(holderOf()).To(Equal([]any{winner, int32(0), claims[winner].String(), ""}))
	rv := func() string {
		l, err := leases.Get(ctx, name, metav1.GetOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		return l.ResourceVersion
	}
	written := rv()

	// The Lease has named a holder: nobody is granted, nothing is written.
	g.Expect(offerBoth(readyHolder{})).To(BeEmpty())
	g.Expect(rv()).To(Equal(written))
	// A write from a copy read while it named none is refused by the API server.
	stale := lbobjects.BuildLease(name, serviceOf(params))
	stale.ResourceVersion = "1"
	rec := newLeaseRecorder(podClient.api, ns, "web", name, podB, log)
	took, err := rec.grant(ctx, stale, claims[podB], []netip.Addr{addr})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(took).To(BeFalse())
	g.Expect(rv()).To(Equal(written))

	// Absent: the first claim creates the Lease (our labels, the Service as owner), once; with the
	// probe's outcome the address is listed as announced.
	g.Expect(leases.Delete(ctx, name, metav1.DeleteOptions{})).To(Succeed())
	type result struct {
		took bool
		err  error
	}
	results := make(chan result, 2)
	for _, pod := range []string{podA, podB} {
		rec := newLeaseRecorder(podClient.api, ns, "web", name, pod, log)
		go func() {
			took, err := rec.grant(ctx, nil, claims[pod], []netip.Addr{addr})
			results <- result{took, err}
		}()
	}
	g.Expect([]result{<-results, <-results}).To(ConsistOf(result{true, nil}, result{false, nil}))
	created, err := leases.Get(ctx, name, metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(created.Labels[v1alpha1.ServiceUIDLabel]).To(Equal(string(params.ServiceUID)))
	g.Expect(created.OwnerReferences).To(HaveLen(1))
	g.Expect(created.Annotations[v1alpha1.AnnouncedAnnotation]).To(Equal("172.18.0.77"))
	g.Expect(neverHeld(created)).To(BeFalse())

	// A replica that heard another one, or was made active, offers nothing (on a fresh Lease).
	g.Expect(leases.Delete(ctx, name, metav1.DeleteOptions{})).To(Succeed())
	_, err = leases.Create(ctx, lbobjects.BuildLease(name, serviceOf(params)), metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(offerBoth(readyHolder{peer: true})).To(BeEmpty())
	g.Expect(offerBoth(readyHolder{active: true})).To(BeEmpty())
	l, err := leases.Get(ctx, name, metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(neverHeld(l)).To(BeTrue(), "nothing was written")
}
