package lbpod

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"time"
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
	// conns is how many connections from other sources than the node are served at once, and
	// perSource how many of them one source address may hold. A connection beyond either is
	// closed at once rather than left in the kernel's accept queue: a queue is first come,
	// first served, so one pod that kept a few hundred connections queued (it was so before)
	// kept the kubelet's probes waiting past their timeout until the kubelet restarted the lb
	// pod, and with it moved the address.
	//
	// The legitimate clients need few at once: the kubelet's readiness and liveness probes
	// open one connection each and close it after the answer (kubelet probes disable
	// keep-alive), and a Prometheus scrape holds one keep-alive connection per scraper. 32 (in
	// all, 4 per source) is several times that, with room for a second scraper, a retry and a
	// port-forward; 32 served connections (a goroutine and its buffers, some tens of KiB each:
	// about 1 MiB) stay far below the memory limit.
	conns, perSource int
	// nodeConns is how many connections the node's addresses (node) may hold besides: the
	// kubelet probes from the node, so a tenant's pods that fill conns cannot fail its probes.
	nodeConns int
}

var defaultHealthLimits = healthLimits{
	idle: 30 * time.Second, readHeader: 5 * time.Second, read: 10 * time.Second, write: 10 * time.Second,
	conns: 32, perSource: 4, nodeConns: 8,
}

// fairListener hands each connection to the server as soon as the kernel has it, within
// healthLimits: per source address, in all, and for the node apart. What it closes at once
// costs nothing but the handshake.
type fairListener struct {
	net.Listener
	lim healthLimits
	// node says whether a source address is the node's (the kubelet's): the pod's gateways on
	// its cluster interface, which is where the node's side of the pod's link is for the
	// bridge, ptp and most CNIs. Where the kubelet probes from another address, it competes
	// with the rest within perSource.
	node func(netip.Addr) bool

	mu             sync.Mutex
	bySource       map[netip.Addr]int
	others, byNode int
}

func (l *fairListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		src := netip.Addr{}
		if ta, ok := c.RemoteAddr().(*net.TCPAddr); ok {
			src = ta.AddrPort().Addr().Unmap()
		}
		fromNode := l.node != nil && src.IsValid() && l.node(src)
		if l.admit(src, fromNode) {
			return &fairConn{Conn: c, l: l, src: src, fromNode: fromNode}, nil
		}
		c.Close()
	}
}

// admit counts a connection from src (the node's when fromNode), or says it is one too many.
func (l *fairListener) admit(src netip.Addr, fromNode bool) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if fromNode {
		if l.byNode >= l.lim.nodeConns {
			return false
		}
		l.byNode++
		return true
	}
	if l.others >= l.lim.conns || l.bySource[src] >= l.lim.perSource {
		return false
	}
	l.others++
	l.bySource[src]++
	return true
}

// release uncounts a connection admit counted.
func (l *fairListener) release(src netip.Addr, fromNode bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if fromNode {
		l.byNode--
		return
	}
	l.others--
	if l.bySource[src]--; l.bySource[src] <= 0 {
		delete(l.bySource, src)
	}
}

// fairConn releases its place in the fairListener once, when it is closed.
type fairConn struct {
	net.Conn
	l        *fairListener
	src      netip.Addr
	fromNode bool
	once     sync.Once
}

func (c *fairConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.release(c.src, c.fromNode) })
	return err
}

// ServeHealth serves h on addr (from HealthAddr) until the returned server is shut down. node
// are the node's addresses as the pod sees them (its gateways on the cluster interface), which
// get connections of their own (healthLimits.nodeConns).
func ServeHealth(addr string, h http.Handler, node []netip.Addr, log *slog.Logger) (*http.Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("health-addr %q: %w", addr, err)
	}
	return serveHealthOn(ln, h, log, defaultHealthLimits, func(a netip.Addr) bool { return slices.Contains(node, a) }), nil
}

// serveHealthOn serves h on ln within lim until the returned server is shut down; node tells the
// node's addresses (nil: none).
func serveHealthOn(ln net.Listener, h http.Handler, log *slog.Logger, lim healthLimits, node func(netip.Addr) bool) *http.Server {
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: lim.readHeader,
		ReadTimeout:       lim.read,
		WriteTimeout:      lim.write,
		IdleTimeout:       lim.idle,
	}
	go func() {
		fair := &fairListener{Listener: ln, lim: lim, node: node, bySource: map[netip.Addr]int{}}
		if err := srv.Serve(fair); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("health server", "err", err)
		}
	}()
	return srv
}
