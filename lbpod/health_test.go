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
// idle timeout, and attacks it as a pod of the cluster can: from one address (127.0.0.2) it
// opens a hundred idle keep-alive connections, from eight more (127.0.0.3-10) four each, the
// most each source may hold, which fill the 32 shared connections. Every connection beyond a
// limit is closed at once (nothing waits behind the attacker in the accept queue, as it did
// with a queue); the node (127.0.0.254, the kubelet's source) is still answered at once, and a
// new source is answered once idle ones have been closed.
func TestHealthServerBoundsConnections(t *testing.T) {
	lim := defaultHealthLimits
	lim.idle = 2 * time.Second
	h := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	node := netip.MustParseAddr("127.0.0.254")
	srv := serveHealthOn(ln, h, slog.New(slog.DiscardHandler), lim, func(a netip.Addr) bool { return a == node })
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
	// ask opens a connection from src and sends one request on it.
	ask := func(src string) (net.Conn, *bufio.Reader) {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := io.WriteString(c, request); err != nil {
			t.Fatal(err)
		}
		return c, bufio.NewReader(c)
	}
	// closed says whether the server closed c without an answer (EOF or a reset).
	closed := func(c net.Conn, br *bufio.Reader) (bool, error) {
		ok, err := answer(c, br, 5*time.Second)
		return !ok && err != nil && !errors.Is(err, os.ErrDeadlineExceeded), err
	}

	start := time.Now()
	// One source: its first four are served, the rest closed at once.
	for i := range 100 {
		c, br := ask("127.0.0.2")
		if i < lim.perSource {
			if ok, err := answer(c, br, 5*time.Second); !ok {
				t.Fatalf("connection %d of one source: no answer: %v", i, err)
			}
			continue
		}
		if shut, err := closed(c, br); !shut {
			t.Fatalf("connection %d of one source, beyond %d: %v; want it closed unanswered", i, lim.perSource, err)
		}
	}
	// Seven more sources fill the shared connections (4 + 7 × 4 = 32); a ninth is closed.
	for s := 3; s <= 9; s++ {
		for i := range lim.perSource {
			c, br := ask(fmt.Sprintf("127.0.0.%d", s))
			if ok, err := answer(c, br, 5*time.Second); !ok {
				t.Fatalf("source 127.0.0.%d, connection %d: no answer: %v", s, i, err)
			}
		}
	}
	late, lateR := ask("127.0.0.10")
	if shut, err := closed(late, lateR); !shut {
		t.Fatalf("a new source beyond %d connections in all: %v; want it closed unanswered", lim.conns, err)
	}
	// The node is answered at once, up to its own limit.
	for i := range lim.nodeConns {
		c, br := ask(node.String())
		if ok, err := answer(c, br, 5*time.Second); !ok {
			t.Fatalf("the node's connection %d while the others are full: no answer: %v", i, err)
		}
	}
	c, br := ask(node.String())
	if shut, err := closed(c, br); !shut {
		t.Fatalf("the node's connection beyond %d: %v; want it closed", lim.nodeConns, err)
	}
	if d := time.Since(start); d >= lim.idle {
		t.Fatalf("setting up took %v, not less than the idle timeout %v: the checks above prove nothing", d, lim.idle)
	}
	// Once the idle ones are closed (after the idle timeout), a new source is served.
	waitFor := time.Now().Add(10 * time.Second)
	for {
		c, br := ask("127.0.0.11")
		ok, err := answer(c, br, time.Second)
		if ok {
			if d := time.Since(start); d < lim.idle {
				t.Fatalf("served after %v, before the idle timeout %v closed anything", d, lim.idle)
			}
			break
		}
		if time.Now().After(waitFor) {
			t.Fatalf("a new source is not served 10 s after the idle ones should have closed: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
