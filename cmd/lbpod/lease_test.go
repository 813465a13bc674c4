package main

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"

	"github.com/lbsvc/lbsvc-operator/lbpod/ha"
)

// The election is told the newest recorded claim: a claim older than one told already (a sync
// that read the Lease before the watch saw a newer write) does not replace the newer one still
// waiting to be read, nor does the same one go again. Tellers racing each other leave the newest.
func TestTellKeepsTheNewestClaim(t *testing.T) {
	claim := func(term uint64, sender byte) ha.Claim {
		return ha.Claim{Term: term, Priority: 100, Sender: ha.ID{2, 0, 0, 0, 0, sender}}
	}
	r := &leaseRecorder{claims: make(chan ha.Claim, 1)}
	r.tell(claim(6, 0x0b))
	r.tell(claim(5, 0x0a)) // our own, older, from a read made before the newer write
	if got := <-r.claims; got != claim(6, 0x0b) {
		t.Fatalf("the election reads %+v, want the newer claim", got)
	}
	r.tell(claim(6, 0x0b))
	select {
	case c := <-r.claims:
		t.Fatalf("told again: %+v", c)
	default:
	}
	var wg sync.WaitGroup
	for term := uint64(7); term < 57; term++ {
		wg.Add(1)
		go func() { defer wg.Done(); r.tell(claim(term, 0x0c)) }()
	}
	wg.Wait()
	if got := <-r.claims; got != claim(56, 0x0c) {
		t.Fatalf("after racing tellers the election reads %+v, want term 56", got)
	}
}

// A read of the Lease that a takeover's probe waits for gives up after leaseReadTimeout when the
// API server does not answer (here one that holds every request), instead of its own timeout:
// meanwhile this replica is the elected active, holding nothing, and its adverts keep the
// standbys from claiming. With the watch running but not yet listed, its wait and the read that
// follows share the one bound (they took one each, 4 s in all, before). (An HTTP server of the
// test's own: a real API server cannot be made to hold a request.)
func TestLeaseReadIsBounded(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-release }))
	t.Cleanup(srv.Close) // after the subtests, which run in parallel
	t.Cleanup(func() { close(release) })
	client, err := newAPIClient(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		hasSynced func() bool
	}{
		{"no watch", nil},
		{"a watch not yet listed", func() bool { return false }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := &leaseRecorder{client: client, namespace: "default", name: "lb-svc-web", hasSynced: tc.hasSynced}
			start := time.Now()
			// The client has no timeout of its own: only the read's deadline ends it.
			if _, _, err := r.annotations(context.Background()); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("err %v, want the read's deadline", err)
			}
			// At the bound, not at twice it; the half bound is room for a slow test machine.
			if took := time.Since(start); took < leaseReadTimeout || took > leaseReadTimeout*3/2 {
				t.Errorf("the read gave up after %v, want %v", took, leaseReadTimeout)
			}
		})
	}
}

// A single lb pod's write of its probe's outcome (probed, without the recorder running) gives up
// after leaseReadTimeout when the API server does not answer, and goes on in the background:
// the pod holds its addresses only once probed returns (holdSingle). Before, the write waited for
// the API server's own timeout, the addresses off net1 all that time. (An HTTP server of the
// test's own: a real API server cannot be made to hold a request.)
func TestSingleRecordIsBounded(t *testing.T) {
	release := make(chan struct{})
	var requests atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		<-release
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) })
	client, err := newAPIClient(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	r := newLeaseRecorder(client, "default", "web", "lb-svc-web", "lb-svc-web-5b8d6c7f9d-abcde", slog.New(slog.DiscardHandler))
	r.retryMax = 100 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel) // before the server closes: ends the background retries
	start := time.Now()
	err = r.probed(ctx, []netip.Addr{netip.MustParseAddr("172.18.0.18")}, nil)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err %v, want the write's deadline", err)
	}
	if took := time.Since(start); took < leaseReadTimeout || took > leaseReadTimeout*3/2 {
		t.Errorf("probed returned after %v, want %v", took, leaseReadTimeout)
	}
	// The background goes on: another request reaches the server.
	seen := requests.Load()
	if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		return requests.Load() > seen, nil
	}); err != nil {
		t.Fatal("no write tried again in the background")
	}
}
