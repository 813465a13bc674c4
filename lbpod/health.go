package lbpod

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"time"

	"golang.org/x/net/netutil"
)

// EnvPodIP names the environment variable holding the pod's cluster address (the operator sets
// it from the downward API, status.podIP). The health and metrics server listens there only, so
// it cannot be reached from the underlay through net1 on any address or family.
const EnvPodIP = "LBPOD_POD_IP"

// DefaultHealthPort is the port of the /healthz, /readyz and /metrics server.
const DefaultHealthPort = 8081

// HealthAddr decides where the health server listens: the --health-addr flag when given, else
// the pod IP from EnvPodIP, else the first global unicast address of the uplink (eth0, the
// pod's cluster interface). It never falls back to a wildcard address, which would also listen
// on net1. why says which rule chose, for the log.
func HealthAddr(flag, podIP string, uplinkAddrs []netip.Addr) (addr, why string, err error) {
	if flag != "" {
		return flag, "--health-addr", nil
	}
	port := strconv.Itoa(DefaultHealthPort)
	if podIP != "" {
		ip, err := netip.ParseAddr(podIP)
		if err != nil || ip.Zone() != "" {
			return "", "", fmt.Errorf("%s=%.64q is not an IP address", EnvPodIP, podIP)
		}
		return net.JoinHostPort(ip.Unmap().String(), port), EnvPodIP, nil
	}
	for _, a := range uplinkAddrs {
		if a.IsGlobalUnicast() {
			return net.JoinHostPort(a.Unmap().String(), port), EnvPodIP + " unset: first global address of the uplink", nil
		}
	}
	return "", "", fmt.Errorf("no address for the health server: %s unset and the uplink has no global address", EnvPodIP)
}

// healthLimits bounds what the health server's clients can hold. Any pod that reaches the pod
// IP can connect, and the lb pod's memory limit is small (128 Mi): idle keep-alive connections
// without an end would pile up until the container is OOM-killed, and with it the address.
type healthLimits struct {
	// idle closes a keep-alive connection that sends no next request within it.
	idle time.Duration
	// readHeader, read and write bound one request: a client that never finishes its request,
	// or never reads the answer, frees its connection after them.
	readHeader, read, write time.Duration
	// conns is how many connections are served at once. Those beyond it wait in the kernel's
	// accept queue (no goroutine, no buffers) until a served one closes.
	//
	// The legitimate clients need few at once: the kubelet's readiness and liveness probes
	// open one connection each and close it after the answer (kubelet probes disable
	// keep-alive), and a Prometheus scrape holds one keep-alive connection per scraper. 32 is
	// several times that, with room for a second scraper, a retry and a port-forward, so the
	// limit is reached only by a client opening connections on purpose; 32 served connections
	// (a goroutine and its buffers, some tens of KiB each: about 1 MiB) stay far below the
	// memory limit. Even then a waiting probe is served once a slot frees: within idle of an
	// idle connection, within read and write of a busy one. A client that keeps all 32 busy on
	// purpose can still delay the probes; bounding memory is what the limit buys.
	conns int
}

var defaultHealthLimits = healthLimits{
	idle: 30 * time.Second, readHeader: 5 * time.Second, read: 10 * time.Second, write: 10 * time.Second,
	conns: 32,
}

// ServeHealth serves h on addr (from HealthAddr) until the returned server is shut down.
func ServeHealth(addr string, h http.Handler, log *slog.Logger) (*http.Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("health-addr %q: %w", addr, err)
	}
	return serveHealthOn(ln, h, log, defaultHealthLimits), nil
}

// serveHealthOn serves h on ln within lim until the returned server is shut down.
func serveHealthOn(ln net.Listener, h http.Handler, log *slog.Logger, lim healthLimits) *http.Server {
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: lim.readHeader,
		ReadTimeout:       lim.read,
		WriteTimeout:      lim.write,
		IdleTimeout:       lim.idle,
	}
	go func() {
		if err := srv.Serve(netutil.LimitListener(ln, lim.conns)); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("health server", "err", err)
		}
	}()
	return srv
}
