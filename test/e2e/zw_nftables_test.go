//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
	"github.com/lbsvc/lbsvc-operator/lbpod"
)

const nftablesFlag = "--lb-rules=nftables"

// nftPorts reads, in the network namespace of pod, the TCP port set of our IPv4 nftables table,
// and whether the table exists, with the kernel's own answer (nf_tables netlink, no nft binary).
func nftPorts(pod *corev1.Pod) (exists bool, ports []uint16, err error) {
	pid, err := pidOfPod(pod)
	if err != nil {
		return false, nil, err
	}
	ns, err := os.Open("/proc/" + pid + "/ns/net")
	if err != nil {
		return false, nil, err
	}
	defer func() { _ = ns.Close() }()
	conn, err := nftables.New(nftables.WithNetNSFd(int(ns.Fd())))
	if err != nil {
		return false, nil, err
	}
	k, err := lbpod.ReadNFT(conn, lbpod.IPv4, lbpod.NFTKernel{}, nil)
	if err != nil {
		return false, nil, err
	}
	return k.Exists, k.Sets["tcp_ports"].Ports, nil
}

// dialFromClient opens a TCP connection to addr from the client network namespace and returns
// the error of the dial (nil: connected, then closed).
func dialFromClient(addr string) error {
	errc := make(chan error, 1)
	go func() {
		if err := enterNetns(clientNetns); err != nil {
			errc <- fmt.Errorf("enter netns %s: %w", clientNetns, err)
			return
		}
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = c.Close()
		}
		errc <- err
	}()
	return <-errc
}

// TestNFTablesRules: with --lb-rules=nftables every lb pod (the active and its standby) writes
// the Service's rules as an nftables table, the Service ports as set elements, and none as
// iptables; the address serves, a port added answers, and a port removed is refused with a
// reset (ECONNREFUSED), not a timeout.
func TestNFTablesRules(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	setOperatorArg(t, nftablesFlag, true)
	t.Cleanup(func() {
		setOperatorArg(t, nftablesFlag, false)
		// The seed's lb pods go back to the default (no LBPOD_RULES) for the tests that follow.
		waitLBPod(t, seedNamespace, seedService)
	})

	svc := newLBService("e2e-nft-"+suffix(), "", 8080)
	g.Expect(k8s.Create(ctx, svc)).To(Succeed())
	deleteServiceOnCleanup(t, svc)
	ip := waitIngress(t, svc.Namespace, svc.Name)
	timeUntilCurl(t, "http://"+ip+":8080/", time.Now(), 2*time.Minute)

	// Every live lb pod of the Service: env, table and set, and no iptables chain of ours.
	want := func(ports ...uint16) {
		t.Helper()
		g.Eventually(func() error {
			pods, _, err := lbPodsOf(ctx, svc.Namespace, svc.Name)
			if err != nil {
				return err
			}
			if len(pods) != 2 {
				return fmt.Errorf("%d ready lb pods, want 2 (active and standby)", len(pods))
			}
			for _, p := range pods {
				if !slices.Contains(p.Spec.Containers[0].Env, corev1.EnvVar{Name: lbv1.EnvRules, Value: "nftables"}) {
					return fmt.Errorf("pod %s: env %v lacks %s=nftables", p.Name, p.Spec.Containers[0].Env, lbv1.EnvRules)
				}
				exists, got, err := nftPorts(p)
				if err != nil {
					return fmt.Errorf("pod %s: %w", p.Name, err)
				}
				if !exists || !slices.Equal(got, ports) {
					return fmt.Errorf("pod %s: table ip %s exists %v, tcp_ports %v; want %v", p.Name, lbpod.NFTTable, exists, got, ports)
				}
				// iptables-nft only: iptables-legacy-save would create the legacy nat table in
				// the pod's namespace, which the lb pod never does with this back end.
				if out, err := inNetnsOfPod(p, "iptables-nft-save", "-t", "nat"); err != nil || strings.Contains(out, "LBSVC") {
					return fmt.Errorf("pod %s: iptables rules of ours with the nftables back end: %v %s", p.Name, err, out)
				}
			}
			return nil
		}).WithTimeout(time.Minute).WithPolling(250 * time.Millisecond).Should(Succeed())
	}
	want(8080)

	changed := time.Now()
	updateService(t, svc, func(s *corev1.Service) { s.Spec.Ports = append(s.Spec.Ports, servicePort(8090)) })
	added := timeUntilCurl(t, "http://"+ip+":8090/", changed, 10*time.Second)
	// End to end: it includes kube-proxy programming the new ClusterIP port on the lb pod's node.
	// The lb pod DNATs the first SYN within ~0.1 s, but while kube-proxy has not caught up that
	// SYN is lost and curl's attempt times out after 1 s (conntrack in the lb pod's namespace
	// shows it translated and [UNREPLIED]), so this reads ~0.2 s or ~1.2 s.
	t.Logf("figure: nftables_port_added_to_answering_ms=%d", added.Milliseconds())
	want(8080, 8090)

	updateService(t, svc, func(s *corev1.Service) { s.Spec.Ports = s.Spec.Ports[1:] })
	// curl says "Couldn't connect to server" for a refusal and an unreachable host alike: dial
	// from Go to tell a reset (the lb pod's reject rule) from anything else.
	var last error
	g.Eventually(func() bool {
		last = dialFromClient(net.JoinHostPort(ip, "8080"))
		return isErrno(last, syscall.ECONNREFUSED)
	}).WithTimeout(5*time.Second).WithPolling(100*time.Millisecond).Should(BeTrue(),
		func() string {
			return fmt.Sprintf("a removed port is refused by the lb pod's reject rule; last dial: %v", last)
		})
	_, err := curlFromClient("http://" + ip + ":8090/")
	g.Expect(err).NotTo(HaveOccurred())
	want(8090)
}
