//go:build dataplane

package dataplane

import (
	"fmt"
	"net"
	"path/filepath"
	"testing"
)

// TestHALBPod runs the failover cases with the real lbpod binary, two replicas elected over net1
// (--replicas 2): each pod also has its cluster side (eth0 to its node, the ClusterIP on the
// node's lo, a UDP backend there that answers with the node's name), and the Service has one UDP
// port, so the client's replies say which replica forwarded them.
func TestHALBPod(t *testing.T) {
	svc := filepath.Join(t.TempDir(), "svc.yaml")
	writeService(t, svc, []string{clusterIPv4}, []servicePort{{Protocol: "UDP", Port: haEchoPort, TargetPort: haEchoPort}}, nil)
	runHAFailover(t, "ha_lbpod_outage", (*haTopology).addClusterSide, func(tp *haTopology, r string) *haReplica {
		return tp.startProcess(r, lbpodBin, "--service-file", svc, "--health-addr", "127.0.0.1:8081",
			"--addresses", haLB+"/16", "--gateways", gatewayV4, "--subnets", subnetV4,
			"--replicas", "2", "--ha-interval", haInterval.String(), "--ha-lease", haLease.String())
	})
}

// addClusterSide gives each replica's pod an eth0 to its node, as the harness's topology does,
// the ClusterIP on the node, a UDP backend that answers "<replica>: <payload>", and the subnet
// gateway on the underlay bridge.
func (tp *haTopology) addClusterSide() {
	t := tp.t
	mustRun(t, "ip", "-n", tp.underlay, "addr", "add", gatewayV4+"/16", "dev", "br0")
	for _, r := range []string{"a", "b"} {
		node, pod := tp.node[r], tp.pod[r]
		ip := func(ns string, args ...string) { mustRun(t, "ip", append([]string{"-n", ns}, args...)...) }
		ip(node, "link", "add", "nodeveth", "type", "veth", "peer", "name", "eth0", "netns", pod)
		ip(node, "link", "set", "nodeveth", "up")
		ip(node, "addr", "add", nodeV4+"/16", "dev", "nodeveth")
		ip(pod, "link", "set", "eth0", "up")
		ip(pod, "addr", "add", podV4+"/16", "dev", "eth0")
		ip(pod, "route", "add", "default", "via", nodeV4, "dev", "eth0")
		ip(node, "addr", "add", clusterIPv4+"/32", "dev", "lo")
		var pc net.PacketConn
		if err := inNS(t, node, func() (err error) {
			pc, err = net.ListenPacket("udp", net.JoinHostPort(clusterIPv4, fmt.Sprint(haEchoPort)))
			return err
		}); err != nil {
			t.Fatalf("backend in %s: %v", node, err)
		}
		t.Cleanup(func() { pc.Close() })
		go func() {
			buf := make([]byte, 1500)
			for {
				n, from, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				_, _ = pc.WriteTo([]byte(r+": "+string(buf[:n])), from)
			}
		}()
	}
}
