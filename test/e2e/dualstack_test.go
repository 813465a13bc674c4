//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
)

// The dual-stack underlay network of the local cluster (hack/cluster/lib.sh): the client namespace
// holds both gateways.
const (
	dualSubnetCIDR = "172.19.0.0/16,fd00:172:19::/64"
	dualGateways   = "172.19.0.1,fd00:172:19::1"
)

// neighbourAdvert is an ICMPv6 neighbour advertisement seen on the wire.
type neighbourAdvert struct {
	srcMAC, dstMAC string
	target         netip.Addr
	override       bool
}

func (na neighbourAdvert) String() string {
	return fmt.Sprintf("NA %s -> %s target %s override %v", na.srcMAC, na.dstMAC, na.target, na.override)
}

// captureNAs reads every IPv6 frame on dev in the network namespace ns (a packet socket opened
// there) and sends each neighbour advertisement, until the end of the test.
func captureNAs(t *testing.T, ns, dev string) <-chan neighbourAdvert {
	t.Helper()
	proto := int(htons(unix.ETH_P_IPV6))
	type result struct {
		fd  int
		err error
	}
	opened := make(chan result, 1)
	// The socket belongs to the namespace it is opened in: open it on a thread of its own that
	// enters ns and is never used again (the goroutine ends with the thread locked, so Go discards it).
	go func() {
		runtime.LockOSThread()
		fd, err := func() (int, error) {
			h, err := netns.GetFromName(ns)
			if err != nil {
				return -1, err
			}
			defer h.Close()
			if err := netns.Set(h); err != nil {
				return -1, err
			}
			ifi, err := net.InterfaceByName(dev)
			if err != nil {
				return -1, err
			}
			fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, proto)
			if err != nil {
				return -1, err
			}
			if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_IPV6), Ifindex: ifi.Index}); err != nil {
				unix.Close(fd)
				return -1, err
			}
			// Reads time out every 100 ms so that the reader notices the end of the test.
			return fd, unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 100000})
		}()
		opened <- result{fd, err}
	}()
	r := <-opened
	if r.err != nil {
		t.Fatalf("packet socket on %s in netns %s: %v", dev, ns, r.err)
	}
	done, stopped := make(chan struct{}), make(chan struct{})
	t.Cleanup(func() { close(done); <-stopped; unix.Close(r.fd) })
	out := make(chan neighbourAdvert, 256)
	go func() {
		defer close(stopped)
		buf := make([]byte, 2048)
		for {
			select {
			case <-done:
				return
			default:
			}
			n, _, err := unix.Recvfrom(r.fd, buf, 0)
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				continue
			}
			if err != nil {
				return
			}
			if na, ok := parseNA(buf[:n]); ok {
				select {
				case out <- na:
				default:
				}
			}
		}
	}()
	return out
}

// parseNA reads an Ethernet frame holding IPv6 + ICMPv6 type 136 (no extension headers: an NA has
// none): Ethernet 14 bytes, IPv6 header 40 (next header at 6), ICMPv6 type at 54, flags at 58
// (router 0x80, solicited 0x40, override 0x20), target address at 62..78.
func parseNA(f []byte) (neighbourAdvert, bool) {
	if len(f) < 78 || f[12] != 0x86 || f[13] != 0xdd || f[14+6] != 58 || f[54] != 136 {
		return neighbourAdvert{}, false
	}
	target, _ := netip.AddrFromSlice(f[62:78])
	return neighbourAdvert{
		srcMAC: net.HardwareAddr(f[6:12]).String(), dstMAC: net.HardwareAddr(f[0:6]).String(),
		target: target, override: f[58]&0x20 != 0,
	}, true
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// curlFromClient6 is curlFromClient for a URL with an IPv6 literal ([addr]:port).
func curlFromClient6(url string) (string, error) {
	out, err := run("nsenter", "--net=/run/netns/"+clientNetns, "curl", "-6", "-g", "-sS", "--fail", "-m", "1", url)
	if err != nil {
		return "", fmt.Errorf("curl %s from netns %s: %w: %s", url, clientNetns, err, out)
	}
	return out, nil
}

// ingressIPs is every status.loadBalancer.ingress address of a Service, in order.
func ingressIPs(ctx context.Context, svc *corev1.Service) ([]string, error) {
	var cur corev1.Service
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(svc), &cur); err != nil {
		return nil, err
	}
	var ips []string
	for _, in := range cur.Status.LoadBalancer.Ingress {
		ips = append(ips, in.IP)
	}
	return ips, nil
}

// TestDualStack: from a Dual Subnet (172.19.0.0/16 and fd00:172:19::/64 on the underlay), an
// IPv6-only Service gets one IPv6 address and a RequireDualStack Service one of each family (IPv4
// first, in the ingress and under EXTERNAL-IP); curl from the client reaches the backend through
// every one of them, over its family; and the client sees each lb pod's unsolicited neighbour
// advertisements for its IPv6 address (override flag, from its net1 MAC, to all nodes).
func TestDualStack(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	id := suffix()
	nas := captureNAs(t, clientNetns, "eth0")
	subnet := newUnderlaySubnet(t, "e2e-dual-"+id, dualSubnetCIDR, dualGateways)
	prefix6 := netip.MustParsePrefix(strings.Split(dualSubnetCIDR, ",")[1])
	prefix4 := netip.MustParsePrefix(strings.Split(dualSubnetCIDR, ",")[0])
	g.Eventually(backendNames, time.Minute).WithArguments(t).Should(HaveLen(backendReplicas))
	backends := backendNames(t)

	single, dual := corev1.IPFamilyPolicySingleStack, corev1.IPFamilyPolicyRequireDualStack
	v6 := newLBService("e2e-v6-"+id, "", 80)
	v6.Spec.IPFamilyPolicy, v6.Spec.IPFamilies = &single, []corev1.IPFamily{corev1.IPv6Protocol}
	ds := newLBService("e2e-dual-"+id, "", 80)
	ds.Spec.IPFamilyPolicy, ds.Spec.IPFamilies = &dual, []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
	for _, svc := range []*corev1.Service{v6, ds} {
		svc.Annotations[lbv1.AttachmentProviderAnnotation] = provider(subnet.Name)
		g.Expect(k8s.Create(ctx, svc)).To(Succeed())
		deleteServiceOnCleanup(t, svc)
	}

	var v6IPs, dsIPs []string
	g.Eventually(func() ([]string, error) {
		var err error
		v6IPs, err = ingressIPs(ctx, v6)
		return v6IPs, err
	}).WithTimeout(time.Minute).WithPolling(100 * time.Millisecond).Should(HaveLen(1))
	g.Eventually(func() ([]string, error) {
		var err error
		dsIPs, err = ingressIPs(ctx, ds)
		return dsIPs, err
	}).WithTimeout(time.Minute).WithPolling(100 * time.Millisecond).Should(HaveLen(2))
	a6 := netip.MustParseAddr(v6IPs[0])
	g.Expect(prefix6.Contains(a6)).To(BeTrue(), "%s outside %s", a6, prefix6)
	d4, d6 := netip.MustParseAddr(dsIPs[0]), netip.MustParseAddr(dsIPs[1])
	g.Expect(prefix4.Contains(d4)).To(BeTrue(), "%s outside %s (IPv4 first)", d4, prefix4)
	g.Expect(prefix6.Contains(d6)).To(BeTrue(), "%s outside %s", d6, prefix6)
	g.Expect(externalIPColumn(t, ds.Namespace, ds.Name)).To(Equal(d4.String() + "," + d6.String()))
	g.Expect(externalIPColumn(t, v6.Namespace, v6.Name)).To(Equal(a6.String()))

	// What an admin sees: the Subnet's usage per family and why it is (not) Ready, and each
	// address's owner (kubectl get subnet / ips, printer columns of apis/v1alpha1).
	g.Eventually(func() []string {
		// NAME PROVIDER CIDR GATEWAY V4USED V4AVAILABLE V6USED V6AVAILABLE READY REASON AGE
		f := strings.Fields(kube(t, "get", "subnet", subnet.Name, "--no-headers"))
		if len(f) != 11 {
			return f
		}
		return append(f[1:3], f[4], f[6], f[8], f[9])
	}).WithTimeout(30*time.Second).WithPolling(200*time.Millisecond).Should(Equal(
		[]string{provider(subnet.Name), dualSubnetCIDR, "1", "2", "True", "Valid"}), "kubectl get subnet %s", subnet.Name)
	for _, c := range []struct {
		svc  *corev1.Service
		addr netip.Addr
	}{{v6, a6}, {ds, d4}, {ds, d6}} {
		// NAME ADDRESS SUBNET NAMESPACE SERVICE PHASE NODE AGE
		g.Eventually(func() []string {
			var ips lbv1.IPList
			if err := k8s.List(ctx, &ips); err != nil {
				return []string{err.Error()}
			}
			for _, ip := range ips.Items {
				if ip.Spec.Address == c.addr.String() {
					f := strings.Fields(kube(t, "get", "ip", ip.Name, "--no-headers"))
					if len(f) == 8 {
						f = f[1:6]
					}
					return f
				}
			}
			return nil
		}).WithTimeout(30*time.Second).WithPolling(200*time.Millisecond).Should(Equal(
			[]string{c.addr.String(), subnet.Name, c.svc.Namespace, c.svc.Name, "Bound"}), "kubectl get ip for %s", c.addr)
	}

	url6 := func(a netip.Addr) string { return "http://[" + a.String() + "]:80/" }
	g.Eventually(func() (string, error) {
		out, err := curlFromClient6(url6(a6))
		return strings.TrimSpace(out), err
	}).WithTimeout(2 * time.Minute).WithPolling(50 * time.Millisecond).Should(BeElementOf(backends))
	g.Eventually(func() (string, error) {
		out, err := curlFromClient6(url6(d6))
		return strings.TrimSpace(out), err
	}).WithTimeout(2 * time.Minute).WithPolling(50 * time.Millisecond).Should(BeElementOf(backends))
	g.Eventually(func() (string, error) {
		out, err := curlFromClient("http://" + d4.String() + ":80/")
		return strings.TrimSpace(out), err
	}).WithTimeout(2 * time.Minute).WithPolling(50 * time.Millisecond).Should(BeElementOf(backends))

	// The announcements: each lb pod's net1 MAC, for its IPv6 address, override set, to all nodes
	// (ff02::1 is 33:33:00:00:00:01 on Ethernet).
	want := map[netip.Addr]neighbourAdvert{}
	for _, c := range []struct {
		svc  *corev1.Service
		addr netip.Addr
	}{{v6, a6}, {ds, d6}} {
		pod := waitLBPod(t, c.svc.Namespace, c.svc.Name)
		mac, err := net1MAC(pod)
		g.Expect(err).NotTo(HaveOccurred())
		want[c.addr] = neighbourAdvert{srcMAC: mac, dstMAC: "33:33:00:00:00:01", target: c.addr, override: true}
	}
	seen := map[netip.Addr]neighbourAdvert{}
	gateway6 := netip.MustParseAddr(strings.Split(dualGateways, ",")[1])
	var others []string
	g.Eventually(func() map[netip.Addr]neighbourAdvert {
		for {
			select {
			case na := <-nas:
				_, ours := want[na.target]
				switch {
				case ours && na.dstMAC == "33:33:00:00:00:01":
					seen[na.target] = na
				case ours:
					// A solicited answer to the client's own neighbour solicitation.
				case prefix6.Contains(na.target) && na.target != gateway6:
					others = append(others, na.String())
				}
			default:
				return seen
			}
		}
	}).WithTimeout(time.Minute).WithPolling(100*time.Millisecond).Should(Equal(want), "unsolicited NAs on the client")
	// Nobody else claims an address of the Subnet (the client answers for its gateway only).
	g.Expect(others).To(BeEmpty(), "NAs for other addresses of the Subnet")

	// Two dual-stack Services sharing: both families shared, one lb Deployment per address (each
	// serves one family, to each member's ClusterIP of that family), TCP and UDP on both.
	shared := func(name string, proto corev1.Protocol) *corev1.Service {
		s := newLBService(name, "", 80)
		s.Spec.IPFamilyPolicy, s.Spec.IPFamilies = &dual, []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
		s.Spec.Ports[0].Protocol = proto
		s.Annotations[lbv1.AttachmentProviderAnnotation] = provider(subnet.Name)
		s.Annotations[lbv1.AllowSharedIPAnnotation] = "web-" + id
		g.Expect(k8s.Create(ctx, s)).To(Succeed())
		deleteServiceOnCleanup(t, s)
		return s
	}
	st, su := shared("e2e-dual-tcp-"+id, corev1.ProtocolTCP), shared("e2e-dual-udp-"+id, corev1.ProtocolUDP)
	var sharedIPs []string
	g.Eventually(func() ([]string, error) {
		var err error
		sharedIPs, err = ingressIPs(ctx, st)
		return sharedIPs, err
	}).WithTimeout(time.Minute).WithPolling(100 * time.Millisecond).Should(HaveLen(2))
	g.Eventually(ingressIPs).WithArguments(ctx, su).WithTimeout(time.Minute).WithPolling(100 * time.Millisecond).Should(Equal(sharedIPs))
	s4, s6 := netip.MustParseAddr(sharedIPs[0]), netip.MustParseAddr(sharedIPs[1])
	lbDeployments := func(a netip.Addr) ([]appsv1.Deployment, error) {
		var deps appsv1.DeploymentList
		err := k8s.List(ctx, &deps, client.InNamespace(seedNamespace), client.MatchingLabels{lbv1.SharedIPLabel: lbv1.IPName(a)})
		return deps.Items, err
	}
	for _, a := range []netip.Addr{s4, s6} {
		// The pass writes the status before it creates the address's objects: the ingress may show
		// a moment before the Deployment exists. Then one, not one for each member.
		g.Eventually(lbDeployments).WithArguments(a).WithTimeout(time.Minute).WithPolling(100*time.Millisecond).Should(HaveLen(1), "lb Deployments of %s", a)
		g.Consistently(lbDeployments).WithArguments(a).WithTimeout(time.Second).WithPolling(100*time.Millisecond).Should(HaveLen(1), "lb Deployments of %s", a)
	}
	g.Eventually(func() (string, error) {
		out, err := curlFromClient6(url6(s6))
		return strings.TrimSpace(out), err
	}).WithTimeout(2 * time.Minute).WithPolling(50 * time.Millisecond).Should(BeElementOf(backends))
	g.Eventually(func() (string, error) {
		out, err := curlFromClient("http://" + s4.String() + ":80/")
		return strings.TrimSpace(out), err
	}).WithTimeout(2 * time.Minute).WithPolling(50 * time.Millisecond).Should(BeElementOf(backends))
	for _, a := range []string{s4.String(), s6.String()} {
		g.Eventually(udpFromClient).WithArguments(a, 80).WithTimeout(time.Minute).WithPolling(100*time.Millisecond).
			Should(BeElementOf(backends), "UDP 80 on %s", a)
	}
}
