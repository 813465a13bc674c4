// Command probe is the client loop of the mass-failover benchmark (hack/bench-ha-idle.sh with
// MASS_FAIL=1): run in the client's network namespace, it opens a TCP connection to each address
// every --period (a handshake through the lb pod's DNAT to a backend is an answer; anything else,
// including no handshake within --timeout, is not), until it receives SIGTERM or SIGINT. It then
// prints one line per address:
//
//	<address> longest_gap_ms=<ms> failed=<n> probes=<n> gap_end=<RFC 3339 time>
//
// where the longest gap is the longest time between two answers, or from the first answer to the
// end, in which no probe was answered: the outage a client saw, to within one period; gap_end is
// when the probe that ended it started (the first answered after the outage; "-" when none).
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"
)

func main() {
	period := flag.Duration("period", 100*time.Millisecond, "time between two probes of one address")
	timeout := flag.Duration("timeout", 250*time.Millisecond, "how long one probe waits for the handshake")
	flag.Parse()
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: probe [--period D] [--timeout D] host:port...")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	results := make([]result, flag.NArg())
	var wg sync.WaitGroup
	for i, addr := range flag.Args() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Stagger the loops across one period, so the probes do not arrive in bursts.
			offset := time.Duration(i) * *period / time.Duration(flag.NArg())
			results[i] = probe(ctx, addr, *period, *timeout, offset)
		}()
	}
	wg.Wait()
	for _, r := range results {
		end := "-"
		if !r.gapEnd.IsZero() {
			end = r.gapEnd.UTC().Format(time.RFC3339Nano)
		}
		fmt.Printf("%s longest_gap_ms=%d failed=%d probes=%d gap_end=%s\n", r.addr, r.longestGap.Milliseconds(), r.failed, r.probes, end)
	}
}

// result is what one address's loop saw.
type result struct {
	addr       string
	longestGap time.Duration
	gapEnd     time.Time // when the answered probe that ended the longest gap started
	failed     int
	probes     int
}

func probe(ctx context.Context, addr string, period, timeout, offset time.Duration) result {
	r := result{addr: addr}
	select {
	case <-ctx.Done():
		return r
	case <-time.After(offset):
	}
	tick := time.NewTicker(period)
	defer tick.Stop()
	var last time.Time // the last answer; zero until the first
	d := net.Dialer{Timeout: timeout}
	for {
		start := time.Now()
		c, err := d.DialContext(ctx, "tcp", addr)
		if ctx.Err() != nil {
			break
		}
		r.probes++
		if err != nil {
			r.failed++
		} else {
			_ = c.Close()
			if gap := start.Sub(last); !last.IsZero() && gap > r.longestGap {
				r.longestGap, r.gapEnd = gap, start
			}
			last = start
		}
		select {
		case <-ctx.Done():
		case <-tick.C:
			continue
		}
		break
	}
	if !last.IsZero() {
		if gap := time.Since(last); gap > r.longestGap {
			r.longestGap, r.gapEnd = gap, time.Time{} // no answer until the end
		}
	}
	return r
}
