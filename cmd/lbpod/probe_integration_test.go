//go:build integration

package main

import (
	"context"
	"maps"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
	"github.com/lbsvc/lbsvc-operator/lbpod"
	"github.com/lbsvc/lbsvc-operator/lbpod/ha"
	"github.com/lbsvc/lbsvc-operator/lbpod/metric"
)

// The conflict probe's record on the Lease, as the lb pod's ServiceAccount writes it (shipped
// RBAC and admission policy): with standbys, the takeover's claim waits for the probe and goes in
// the same write as the announced addresses (one write, counted on a watch); a conflict is
// written with the claim; a Lease of a release without the probe (a claim, no list) gets every
// address listed at the next claim; a single lb pod (no recorder running) creates the Lease with
// the list itself; and what the watch saw is what annotations returns.
func TestLeaseRecordsProbe(t *testing.T) {
	const ns = "lbpod-probe"
	g, admin, ctx, _, podClient, log, name := leaseTest(t, ns)
	addr := netip.MustParseAddr("172.18.0.18")
	get := func() (*coordinationv1.Lease, error) {
		return admin.CoordinationV1().Leases(ns).Get(ctx, name, metav1.GetOptions{})
	}
	// probeAnn is a Lease's annotations without the one every per-Service object carries.
	probeAnn := func(l *coordinationv1.Lease) map[string]string {
		m := maps.Clone(l.Annotations)
		delete(m, v1alpha1.ServiceUIDLabel)
		return m
	}

	// A single lb pod: nothing running, it writes the outcome itself.
	single := newLeaseRecorder(podClient.api, ns, "web", name, podA, log)
	single.addrs = []netip.Addr{addr}
	ann, found, err := single.annotations(ctx)
	g.Expect([]any{ann, found, err}).To(Equal([]any{map[string]string(nil), false, nil}))
	single.startProbe()
	g.Expect(single.probed(ctx, []netip.Addr{addr}, nil)).To(Succeed())
	l, err := get()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(probeAnn(l)).To(Equal(map[string]string{v1alpha1.AnnouncedAnnotation: "172.18.0.18"}))
	g.Expect(admin.CoordinationV1().Leases(ns).Delete(ctx, name, metav1.DeleteOptions{})).To(Succeed())

	// Standbys: the claim waits for the probe; one write carries both.
	w, err := admin.CoordinationV1().Leases(ns).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name})
	g.Expect(err).NotTo(HaveOccurred())
	defer w.Stop()
	a := newLeaseRecorder(podClient.api, ns, "web", name, podA, log)
	a.addrs = []netip.Addr{addr}
	go a.run(ctx)
	a.startProbe()
	a.Claimed(ha.Claim{Term: 1, Priority: 100, Sender: macA})
	g.Consistently(func() bool { _, err := get(); return apierrors.IsNotFound(err) }).
		WithTimeout(300*time.Millisecond).WithPolling(20*time.Millisecond).Should(BeTrue(), "nothing written while the probe runs")
	g.Expect(a.probed(ctx, []netip.Addr{addr}, nil)).To(Succeed())
	var ev watch.Event
	g.Eventually(w.ResultChan()).WithTimeout(5 * time.Second).Should(Receive(&ev))
	g.Expect(ev.Type).To(Equal(watch.Added))
	g.Expect(probeAnn(ev.Object.(*coordinationv1.Lease))).To(Equal(map[string]string{
		v1alpha1.HAClaimAnnotation: "1 100 02:00:00:00:00:0a", v1alpha1.AnnouncedAnnotation: "172.18.0.18"}))
	g.Consistently(w.ResultChan()).WithTimeout(500*time.Millisecond).ShouldNot(Receive(), "one write for claim and outcome")
	// What the watch saw is what a later takeover reads: no probe then.
	g.Eventually(func() []any {
		ann, found, err := a.annotations(ctx)
		return []any{ann[v1alpha1.AnnouncedAnnotation], found, err}
	}).
		WithTimeout(5 * time.Second).Should(Equal([]any{"172.18.0.18", true, nil}))

	// A conflict goes with the claim too, and the list stays as it was.
	mac, _ := net.ParseMAC("02:42:ac:12:00:05")
	at := time.Date(2026, 11, 25, 1, 2, 3, 0, time.UTC)
	b := newLeaseRecorder(podClient.api, ns, "web", name, podB, log)
	b.addrs = []netip.Addr{addr}
	go b.run(ctx)
	b.startProbe()
	b.Claimed(ha.Claim{Term: 2, Priority: 100, Sender: macB})
	g.Expect(b.probed(ctx, nil, []v1alpha1.AddressConflict{{Address: addr, MAC: mac, At: at}})).To(Succeed())
	g.Eventually(w.ResultChan()).WithTimeout(5 * time.Second).Should(Receive(&ev))
	g.Expect(probeAnn(ev.Object.(*coordinationv1.Lease))).To(Equal(map[string]string{
		v1alpha1.HAClaimAnnotation: "2 100 02:00:00:00:00:0b", v1alpha1.AnnouncedAnnotation: "172.18.0.18",
		v1alpha1.AddressConflictAnnotation: "172.18.0.18 02:42:ac:12:00:05 2026-11-25T01:02:03Z"}))

	// A Lease of a release without the probe: a claim, no list. The next claim lists every
	// address (they were held), so that no later takeover probes its own earlier holder.
	l, err = get()
	g.Expect(err).NotTo(HaveOccurred())
	delete(l.Annotations, v1alpha1.AnnouncedAnnotation)
	delete(l.Annotations, v1alpha1.AddressConflictAnnotation)
	_, err = admin.CoordinationV1().Leases(ns).Update(ctx, l, metav1.UpdateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	a.Claimed(ha.Claim{Term: 3, Priority: 100, Sender: macA})
	g.Eventually(func() map[string]string { l, _ := get(); return probeAnn(l) }).WithTimeout(5 * time.Second).Should(Equal(map[string]string{
		v1alpha1.HAClaimAnnotation: "3 100 02:00:00:00:00:0a", v1alpha1.AnnouncedAnnotation: "172.18.0.18"}))
}

// A replica blocked by its probe, against the real API server with the lb pod's rights: its
// recorder wrote the conflict with its claim and nothing announced, and reading the Lease again
// lifts nothing; once the other replica claims and announces the address (its recorder's write),
// the blocked replica's next read finds it announced and lifts the conflict.
func TestBlockedReplicaReadsTheLease(t *testing.T) {
	const ns = "lbpod-unblock"
	g, admin, ctx, _, podClient, log, name := leaseTest(t, ns)
	addr := netip.MustParseAddr("172.18.0.18")
	mac, _ := net.ParseMAC("02:42:ac:12:00:05")
	lease := func() map[string]string {
		l, err := admin.CoordinationV1().Leases(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil
		}
		return l.Annotations
	}

	b := newLeaseRecorder(podClient.api, ns, "web", name, podB, log)
	b.addrs = []netip.Addr{addr}
	go b.run(ctx)
	b.startProbe()
	b.Claimed(ha.Claim{Term: 1, Priority: 100, Sender: macB})
	conflict := []v1alpha1.AddressConflict{{Address: addr, MAC: mac, At: time.Date(2026, 11, 29, 1, 0, 0, 0, time.UTC)}}
	g.Expect(b.probed(ctx, nil, conflict)).To(Succeed())
	g.Eventually(lease).WithTimeout(5 * time.Second).Should(And(
		HaveKeyWithValue(v1alpha1.AnnouncedAnnotation, ""), HaveKey(v1alpha1.AddressConflictAnnotation)))

	p, err := newProber(options{conflictProbe: "fast", iface: "lbsvc-test-none"}, lbpod.Network{Addresses: []netip.Prefix{netip.PrefixFrom(addr, 16)}}, b, metric.NewRegistry(), log)
	g.Expect(err).NotTo(HaveOccurred())
	const reason = "in use on the underlay: 172.18.0.18 answered by 02:42:ac:12:00:05; not announced"
	p.reason, p.conflicts = reason, conflict
	p.done.Store(true)
	// Its own recorder's view has caught up with its write: still nothing announced.
	g.Eventually(func() string { ann, _, _ := b.annotations(ctx); return ann[v1alpha1.AddressConflictAnnotation] }).
		WithTimeout(5 * time.Second).ShouldNot(BeEmpty())
	g.Expect(p.announcedSince(ctx)).To(BeFalse())
	g.Expect(p.check(ctx)).To(Equal(reason))

	a := newLeaseRecorder(podClient.api, ns, "web", name, podA, log)
	a.addrs = []netip.Addr{addr}
	go a.run(ctx)
	a.startProbe()
	a.Claimed(ha.Claim{Term: 2, Priority: 100, Sender: macA})
	g.Expect(a.probed(ctx, []netip.Addr{addr}, nil)).To(Succeed())
	g.Eventually(lease).WithTimeout(5 * time.Second).Should(HaveKeyWithValue(v1alpha1.AnnouncedAnnotation, "172.18.0.18"))
	g.Eventually(func() bool { return p.announcedSince(ctx) }).WithTimeout(5 * time.Second).Should(BeTrue())
	g.Expect(p.check(ctx)).To(BeEmpty())
}

// A single lb pod whose write of the probe's outcome fails (the API server unavailable: 503)
// writes it once the API server takes writes again, in the background: until the Lease lists the
// address as announced, the operator would believe a later probe's report for it (a replacement
// pod's) and move the Service off an address it has held. Before, the outcome was written a few
// times at once on a conflict only, and a 503 left it unwritten for the pod's life.
func TestSingleLBPodRecordsTheProbeAfterFailedWrites(t *testing.T) {
	const ns = "lbpod-probe-retry"
	g, admin, ctx, _, podClient, log, name := leaseTest(t, ns)
	addr := netip.MustParseAddr("172.18.0.18")
	failing := &atomic.Int32{}
	failing.Store(3)
	single := newLeaseRecorder(flakyLeaseWrites{apiClient: podClient.api, failing: failing}, ns, "web", name, podA, log)
	single.addrs = []netip.Addr{addr}
	single.startProbe()
	err := single.probed(ctx, []netip.Addr{addr}, nil)
	g.Expect(apierrors.IsServiceUnavailable(err)).To(BeTrue(), "the first write fails: %v", err)
	g.Eventually(func(g Gomega) {
		l, err := admin.CoordinationV1().Leases(ns).Get(ctx, name, metav1.GetOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(l.Annotations).To(HaveKeyWithValue(v1alpha1.AnnouncedAnnotation, "172.18.0.18"))
	}).WithTimeout(10 * time.Second).WithPolling(50 * time.Millisecond).Should(Succeed())
	g.Expect(failing.Load()).To(BeNumerically("<=", 0), "every injected failure was met")
}

// flakyLeaseWrites is the lb pod's API client with Lease creates and updates answered 503 while
// failing is above zero: a real API server does not refuse one client's writes on demand (the
// reads and every other write go to the real one).
type flakyLeaseWrites struct {
	apiClient
	failing *atomic.Int32
}

func (f flakyLeaseWrites) Leases(namespace string) objectClient[*coordinationv1.Lease, *coordinationv1.LeaseList] {
	return flakyLeaseClient{objectClient: f.apiClient.Leases(namespace), failing: f.failing}
}

type flakyLeaseClient struct {
	objectClient[*coordinationv1.Lease, *coordinationv1.LeaseList]
	failing *atomic.Int32
}

func (c flakyLeaseClient) Create(ctx context.Context, l *coordinationv1.Lease, opts metav1.CreateOptions) (*coordinationv1.Lease, error) {
	if c.failing.Add(-1) >= 0 {
		return nil, apierrors.NewServiceUnavailable("injected")
	}
	return c.objectClient.Create(ctx, l, opts)
}

func (c flakyLeaseClient) Update(ctx context.Context, l *coordinationv1.Lease, opts metav1.UpdateOptions) (*coordinationv1.Lease, error) {
	if c.failing.Add(-1) >= 0 {
		return nil, apierrors.NewServiceUnavailable("injected")
	}
	return c.objectClient.Update(ctx, l, opts)
}
