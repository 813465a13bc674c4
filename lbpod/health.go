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

// ServeHealth serves h on addr (from HealthAddr) until the returned server is shut down.
func ServeHealth(addr string, h http.Handler, log *slog.Logger) (*http.Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("health-addr %q: %w", addr, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("health server", "err", err)
		}
	}()
	return srv, nil
}
