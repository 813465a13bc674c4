package lbpod

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"time"
)

// A TCP port added to a running Service is DNATed to ClusterIP:port, which kube-proxy on the node
// serves only once it has caught up with the same change. Before that, a client's SYN is DNATed
// and lost on the node, and the client waits for its retransmission (about 1 s); refused by the
// lb pod instead (a reset: the port is not served yet), it tries again at once. So a TCP port
// added after the lb pod's first apply is held back, still refused, until a connection from the
// lb pod to ClusterIP:port is accepted, or GateBound has passed (then it is served as before:
// never held back for good). A refusal does not count: kube-proxy's nftables mode rejects a
// ClusterIP port it does not serve yet, and so does a node for a Service without endpoints
// (that one waits the bound, and is then served: it refuses either way); nor do a timeout or a
// "network unreachable" from a node that has no rule for the port yet. The check opens one short
// connection to a backend per port added, closed at once with a reset. Ports of the first apply
// (a new Service: the sandbox's start already gave kube-proxy its time, and a Service of 1000
// ports must not open 1000 connections), UDP and SCTP ports (no answer to wait for) are served
// at once.

// GateBound is how long an added TCP port may be held back; GateTry bounds each connection try;
// GateDials is how many tries run at once: ports added by the hundred (one edit of a large
// Service) are checked a few at a time rather than as hundreds of simultaneous connections to
// the backends, each port still within GateBound of when it was held.
const (
	GateBound = 2 * time.Second
	GateTry   = 50 * time.Millisecond
	GateDials = 8
)

// GatePorts is the gate's decision: of ports, those to serve now and the TCP ports to check
// first. Before the first apply (started false) every port is served.
func GatePorts(ports []Port, admitted map[Port]bool, started bool) (serve, check []Port) {
	for _, p := range ports {
		switch {
		case !started, p.Protocol != TCP, admitted[p]:
			serve = append(serve, p)
		default:
			check = append(check, p)
		}
	}
	return serve, check
}

// PortGate holds back TCP ports added to a running Service until kube-proxy serves them (see
// above). Its zero value is not usable: NewPortGate.
type PortGate struct {
	log *slog.Logger
	// dial is the connection try (net.Dialer with GateTry); tests replace it.
	dial func(ctx context.Context, addr string) error
	wake func()
	// dials holds a token per try running (GateDials).
	dials chan struct{}

	mu       sync.Mutex
	started  bool
	admitted map[gateKey]bool
	checking map[gateKey]bool
}

// gateKey is a port at the ClusterIP it is checked at: a port that moves to another member of a
// shared address (another ClusterIP) is checked again there.
type gateKey struct {
	Port
	at netip.Addr
}

// NewPortGate returns a gate that tries connections from this network namespace.
func NewPortGate(log *slog.Logger) *PortGate {
	return &PortGate{log: log, dial: dialOnce, dials: make(chan struct{}, GateDials), admitted: map[gateKey]bool{}, checking: map[gateKey]bool{}}
}

// filter returns svc with only the ports to serve now, and starts a check for each TCP port that
// waits; wake is called when a check ends (the loop applies again).
func (g *PortGate) filter(ctx context.Context, svc Service, wake func()) Service {
	return g.filterAll(ctx, []Service{svc}, wake)[0]
}

// filterAll is filter for the members of a shared address: each member's ports are checked at
// that member's own ClusterIP (the first, IPv4 when it has one), since that is where they go.
func (g *PortGate) filterAll(ctx context.Context, services []Service, wake func()) []Service {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.wake = wake
	started := g.started
	g.started = true
	current := map[gateKey]bool{}
	out := make([]Service, len(services))
	for i, svc := range services {
		var at netip.Addr
		if len(svc.ClusterIPs) > 0 {
			at = svc.ClusterIPs[0]
		}
		admitted := map[Port]bool{}
		for _, p := range svc.Ports {
			k := gateKey{p, at}
			current[k] = true
			admitted[p] = g.admitted[k]
		}
		serve, check := GatePorts(svc.Ports, admitted, started)
		for _, p := range serve {
			g.admitted[gateKey{p, at}] = true
		}
		if !at.IsValid() {
			// Nothing to check against (and nothing is DNATed): serve.
			for _, p := range check {
				g.admitted[gateKey{p, at}] = true
			}
			svc.Ports = append(serve, check...)
			out[i] = svc
			continue
		}
		for _, p := range check {
			k := gateKey{p, at}
			if !g.checking[k] {
				g.checking[k] = true
				g.log.Info("port held back (refused) until the ClusterIP serves it", "port", p.Port, "protocol", p.Protocol, "clusterIP", at, "service", svc.Name)
				go g.check(ctx, at, p)
			}
		}
		svc.Ports = serve
		out[i] = svc
	}
	for k := range g.admitted {
		if !current[k] {
			delete(g.admitted, k) // removed: added again later, it is checked again
		}
	}
	return out
}

// check tries ClusterIP:port until a connection is accepted or GateBound passed, then admits the
// port.
func (g *PortGate) check(ctx context.Context, clusterIP netip.Addr, p Port) {
	start := time.Now()
	addr := net.JoinHostPort(clusterIP.String(), strconv.Itoa(int(p.Port)))
	answered := false
	for time.Since(start) < GateBound && ctx.Err() == nil {
		try := time.Now()
		if g.try(ctx, addr, start.Add(GateBound)) {
			answered = true
			break
		}
		// Refused, a timeout, or the node's "unreachable" for a ClusterIP port it has no rule
		// for yet (which then often sends no answer to the client's SYN: ICMP errors are
		// rate-limited per destination): try again, at most every GateTry.
		if wait := GateTry - time.Since(try); wait > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(wait):
			}
		}
	}
	took := time.Since(start).Round(time.Millisecond)
	if answered {
		g.log.Info("port served by the ClusterIP: serving it", "port", p.Port, "protocol", p.Protocol, "waited", took)
	} else {
		g.log.Warn("port not answered by the ClusterIP within the bound: serving it anyway", "port", p.Port, "protocol", p.Protocol, "waited", took)
	}
	g.mu.Lock()
	g.admitted[gateKey{p, clusterIP}] = true
	delete(g.checking, gateKey{p, clusterIP})
	wake := g.wake
	g.mu.Unlock()
	if wake != nil {
		wake()
	}
}

// try makes one connection try when a token is free before deadline (GateDials), and says
// whether it was accepted.
func (g *PortGate) try(ctx context.Context, addr string, deadline time.Time) bool {
	wait := time.NewTimer(time.Until(deadline))
	defer wait.Stop()
	select {
	case g.dials <- struct{}{}:
	case <-wait.C:
		return false
	case <-ctx.Done():
		return false
	}
	defer func() { <-g.dials }()
	return g.dial(ctx, addr) == nil
}

// dialOnce tries one connection; an accepted one is closed at once with a reset (SO_LINGER 0).
func dialOnce(ctx context.Context, addr string) error {
	d := net.Dialer{Timeout: GateTry}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	return c.Close()
}
