//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// TestSeedStory walks the seed's page: the lb pod Running in the Service's namespace, the static
// address under EXTERNAL-IP, net1 / ip rule / table 100 inside the lb pod as the seed prints them,
// the seed's port in the nftables table of the default rules back end (and no iptables chain of
// ours), and curl from the underlay reaching both backend replicas.
func TestSeedStory(t *testing.T) {
	g := NewWithT(t)
	pod := waitLBPod(t, seedNamespace, seedService)

	// kubectl get pod: lb-svc-test-service-<hash>  1/1  Running, in the Service's namespace.
	podLine := regexp.MustCompile(`(?m)^lb-svc-test-service-[a-z0-9]+-[a-z0-9]+\s+1/1\s+Running\s`)
	g.Expect(kube(t, "get", "pod", "-n", seedNamespace)).To(MatchRegexp(podLine.String()))

	// kubectl get svc: the seed's static address under EXTERNAL-IP.
	g.Eventually(externalIPColumn).WithArguments(t, seedNamespace, seedService).
		WithTimeout(time.Minute).Should(Equal(seedAddress))

	var svc corev1.Service
	g.Expect(k8s.Get(context.Background(), client.ObjectKey{Namespace: seedNamespace, Name: seedService}, &svc)).To(Succeed())
	clusterIP := svc.Spec.ClusterIP
	// The lb pod may be on any node: its eth0 gateway is that node's pod bridge.
	podGateway, err := podGatewayOf(pod)
	g.Expect(err).NotTo(HaveOccurred())

	// Inside the lb pod, entered from the node.
	want := lbPodState{
		addresses: []string{seedAddress + "/16"},
		rules:     []string{"from " + seedAddress + " lookup 100", "from all iif eth0 lookup 100", "from all iif net1 lookup 100"},
		table100: []string{
			"default via " + subnetGateway + " dev net1",
			clusterIP + " via " + podGateway + " dev eth0",
			seedSubnetCIDR + " dev net1 scope link",
		},
		// The default rules back end, nftables: the seed's port in the table's TCP set, and no
		// iptables chain of ours (the iptables form of the same rules: docs/lbpod.md).
		nftTable:    true,
		nftTCPPorts: []uint16{80},
	}
	g.Eventually(func() (lbPodState, error) { return readLBPodState(pod) }).
		WithTimeout(30 * time.Second).WithPolling(500 * time.Millisecond).Should(Equal(want))

	// From the underlay: the LB address answers, and kube-proxy spreads requests over both replicas.
	g.Eventually(backendNames, time.Minute).WithArguments(t).Should(HaveLen(backendReplicas))
	backends := backendNames(t)
	seen := map[string]bool{}
	g.Eventually(func() []string {
		if body, err := curlFromClient("http://" + seedAddress + ":80/"); err == nil {
			seen[strings.TrimSpace(body)] = true
		}
		var names []string
		for n := range seen {
			names = append(names, n)
		}
		sort.Strings(names)
		return names
	}).WithTimeout(time.Minute).WithPolling(50 * time.Millisecond).Should(Equal(backends))
}

// lbPodState is what the seed's page shows inside the lb pod, in a comparable form.
type lbPodState struct {
	addresses []string // IPv4 addresses on net1, with prefix
	rules     []string // ip rule lines that look up table 100, without their priority
	table100  []string // ip route show table 100
	nat       []string // our lines of iptables-nft -t nat -S, sorted
	// nftTable and nftTCPPorts: whether table ip lbsvc exists, and its tcp_ports set.
	nftTable    bool
	nftTCPPorts []uint16
}

// String makes gomega's failure output readable.
func (s lbPodState) String() string {
	return fmt.Sprintf("addresses %q\nrules %q\ntable 100 %q\nnat %q\nnftables table %v, tcp_ports %v", s.addresses, s.rules, s.table100, s.nat, s.nftTable, s.nftTCPPorts)
}

var rulePriority = regexp.MustCompile(`^\d+:\s+`)

func readLBPodState(pod *corev1.Pod) (lbPodState, error) {
	var s lbPodState
	out, err := inNetnsOfPod(pod, "ip", "-4", "-o", "addr", "show", "dev", lbInterface)
	if err != nil {
		return s, err
	}
	for _, line := range nonEmptyLines(out) {
		f := strings.Fields(line)
		for i := range f {
			if f[i] == "inet" && i+1 < len(f) {
				s.addresses = append(s.addresses, f[i+1])
			}
		}
	}
	if out, err = inNetnsOfPod(pod, "ip", "rule"); err != nil {
		return s, err
	}
	for _, line := range nonEmptyLines(out) {
		if strings.HasSuffix(line, "lookup 100") {
			s.rules = append(s.rules, rulePriority.ReplaceAllString(line, ""))
		}
	}
	if out, err = inNetnsOfPod(pod, "ip", "route", "show", "table", "100"); err != nil {
		return s, err
	}
	s.table100 = nonEmptyLines(out)
	// iptables-nft only: iptables-legacy-save would create the legacy nat table in the pod's
	// namespace, which the lb pod never does with the nftables back end.
	if out, err = inNetnsOfPod(pod, "iptables-nft", "-t", "nat", "-S"); err != nil {
		return s, err
	}
	for _, line := range nonEmptyLines(out) {
		if strings.Contains(line, "LBSVC") {
			s.nat = append(s.nat, line)
		}
	}
	sort.Strings(s.nat)
	s.nftTable, s.nftTCPPorts, err = nftPorts(pod)
	return s, err
}

// externalIPColumn is the EXTERNAL-IP column of `kubectl get svc`, as a user reads it.
func externalIPColumn(t *testing.T, namespace, name string) string {
	fields := strings.Fields(kube(t, "get", "svc", name, "-n", namespace, "--no-headers"))
	// NAME TYPE CLUSTER-IP EXTERNAL-IP PORT(S) AGE
	if len(fields) != 6 || fields[0] != name || fields[1] != "LoadBalancer" {
		t.Fatalf("kubectl get svc %s/%s: unexpected columns %q", namespace, name, fields)
	}
	return fields[3]
}

func nonEmptyLines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}

// TestClusterIsolated checks that nothing of the cluster can send a packet off this machine: no
// node, nor the underlay's client, has a default route of either family, so an outside address is
// unroutable from all of them.
func TestClusterIsolated(t *testing.T) {
	g := NewWithT(t)
	nodes := multiNode(t)
	netns := []string{clientNetns, underlayNetns}
	netns = append(netns, nodes...)
	for _, ns := range netns {
		out, err := run("nsenter", "--net=/run/netns/"+ns, "ip", "route", "show", "default")
		g.Expect(err).NotTo(HaveOccurred(), out)
		g.Expect(out).To(BeEmpty(), "default route in netns %s", ns)
		// 192.0.2.1 is on the host's own network: it must be unreachable from the cluster.
		out, err = run("nsenter", "--net=/run/netns/"+ns, "ip", "route", "get", "192.0.2.1")
		g.Expect(err).To(HaveOccurred(), "netns %s routes to 192.0.2.1: %s", ns, out)
		// The same for IPv6 (the cluster is dual stack): 2001:db8::1 is a documentation address.
		out, err = run("nsenter", "--net=/run/netns/"+ns, "ip", "-6", "route", "show", "default")
		g.Expect(err).NotTo(HaveOccurred(), out)
		g.Expect(out).To(BeEmpty(), "IPv6 default route in netns %s", ns)
		out, err = run("nsenter", "--net=/run/netns/"+ns, "ip", "-6", "route", "get", "2001:db8::1")
		g.Expect(err).To(HaveOccurred(), "netns %s routes to 2001:db8::1: %s", ns, out)
	}
}
