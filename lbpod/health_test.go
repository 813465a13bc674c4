package lbpod

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"
)

func TestHealthAddr(t *testing.T) {
	uplink := []netip.Addr{netip.MustParseAddr("fe80::1"), netip.MustParseAddr("10.244.1.7"), netip.MustParseAddr("fd00::7")}
	tests := []struct {
		name, flag, podIP string
		uplink            []netip.Addr
		addr, err         string
	}{
		{name: "flag wins", flag: "127.0.0.1:9000", podIP: "10.244.1.7", addr: "127.0.0.1:9000"},
		{name: "pod IP v4", podIP: "10.244.1.7", addr: "10.244.1.7:8081"},
		{name: "pod IP v6", podIP: "fd00::7", addr: "[fd00::7]:8081"},
		{name: "mapped v4 unmapped", podIP: "::ffff:10.244.1.7", addr: "10.244.1.7:8081"},
		{name: "bad pod IP", podIP: "10.244.1.x", err: `LBPOD_POD_IP="10.244.1.x" is not an IP address`},
		{name: "zone refused", podIP: "fe80::1%eth0", err: "is not an IP address"},
		{name: "unset: uplink's first global, link-local skipped", uplink: uplink, addr: "10.244.1.7:8081"},
		{name: "unset, no uplink address: error, never a wildcard", uplink: []netip.Addr{netip.MustParseAddr("fe80::1")}, err: "no address for the health server"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			addr, _, err := HealthAddr(tc.flag, tc.podIP, tc.uplink)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || addr != tc.addr {
				t.Fatalf("HealthAddr = %q, %v; want %q", addr, err, tc.addr)
			}
		})
	}
	long := strings.Repeat("x", 1000)
	if _, _, err := HealthAddr("", long, nil); err == nil || len(err.Error()) > 120 {
		t.Fatalf("a long bad value must give a bounded message, got %d chars", len(err.Error()))
	}
}

// TestHealthServerBoundsConnections starts the health server as ServeHealth does, with a short
// idle timeout, and holds more idle keep-alive connections than the limit: the connections
// beyond it wait unserved (they hold no slot) and every idle one is closed after the idle
// timeout, which lets the waiting ones in.
func TestHealthServerBoundsConnections(t *testing.T) {
	lim := defaultHealthLimits
	lim.idle = time.Second
	h := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := serveHealthOn(ln, h, slog.New(slog.DiscardHandler), lim)
	t.Cleanup(func() { srv.Close() })
	addr := ln.Addr().String()

	const request = "GET /healthz HTTP/1.1\r\nHost: lbpod\r\n\r\n"
	// answer reads one response on c within d; it says whether one came.
	answer := func(c net.Conn, br *bufio.Reader, d time.Duration) (bool, error) {
		c.SetReadDeadline(time.Now().Add(d))
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return false, err
		}
		defer resp.Body.Close()
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			return false, err
		}
		return resp.StatusCode == http.StatusOK, nil
	}

	// ask opens a connection and sends one request on it.
	ask := func() (net.Conn, *bufio.Reader) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := io.WriteString(c, request); err != nil {
			t.Fatal(err)
		}
		return c, bufio.NewReader(c)
	}

	served := make([]net.Conn, lim.conns)
	readers := make([]*bufio.Reader, lim.conns)
	start := time.Now()
	for i := range served {
		c, br := ask()
		served[i], readers[i] = c, br
		if ok, err := answer(c, readers[i], 5*time.Second); !ok {
			t.Fatalf("connection %d: no answer: %v", i, err)
		}
	}

	// Beyond the limit: the kernel completes the handshake, but the server does not accept, so
	// the request waits unanswered while the served connections sit idle.
	const extra = 4
	waiting := make([]net.Conn, extra)
	waitingR := make([]*bufio.Reader, extra)
	for i := range waiting {
		waiting[i], waitingR[i] = ask()
	}
	for i, c := range waiting {
		ok, err := answer(c, waitingR[i], 100*time.Millisecond)
		if ok || !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("connection %d beyond the limit: answered %t, %v; want it waiting", lim.conns+i, ok, err)
		}
	}
	if time.Since(start) >= lim.idle {
		t.Fatalf("setting up took %v, not less than the idle timeout %v: the check above proves nothing", time.Since(start), lim.idle)
	}

	// The idle ones are closed by the server after the idle timeout (EOF on our side), not
	// before it.
	for i, c := range served {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if n, err := readers[i].Read(make([]byte, 1)); n != 0 || err != io.EOF {
			t.Fatalf("idle connection %d: read %d, %v; want EOF", i, n, err)
		}
	}
	if d := time.Since(start); d < lim.idle {
		t.Fatalf("idle connections closed after %v, before the idle timeout %v", d, lim.idle)
	}
	// And the waiting ones are then served.
	for i, c := range waiting {
		if ok, err := answer(c, waitingR[i], 5*time.Second); !ok {
			t.Fatalf("connection %d beyond the limit: not served once slots freed: %v", lim.conns+i, err)
		}
	}
}
