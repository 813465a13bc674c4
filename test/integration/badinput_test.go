//go:build integration

package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/lbsvc/lbsvc-operator/controllers/decide"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
)

// Hostile and careless input, on a real API server: each case ends with the exact reason (or
// served, or refused at admission), no crash, bounded messages, and no leaked or duplicated
// address.
func TestBadInputTable(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	f := newFixture(t) // 10.x.y.0/24, gateway .1, .2..5 excluded

	type svcCase struct {
		name   string
		mutate func(*corev1.Service)
		reason string // "" = served
	}
	lbip := func(v string) func(*corev1.Service) { return func(s *corev1.Service) { s.Spec.LoadBalancerIP = v } }
	provider := func(v string) func(*corev1.Service) {
		return func(s *corev1.Service) { s.Annotations[lbv1.AttachmentProviderAnnotation] = v }
	}
	ports := func(p ...corev1.ServicePort) func(*corev1.Service) {
		return func(s *corev1.Service) { s.Spec.Ports = p }
	}
	port := func(n int32, proto corev1.Protocol) corev1.ServicePort {
		return corev1.ServicePort{Name: fmt.Sprintf("p%d-%s", n, strings.ToLower(string(proto))), Port: n, Protocol: proto, TargetPort: intstr.FromInt32(n)}
	}
	cases := []svcCase{
		{"served", nil, ""},
		{"provider-two-dots", provider("a..b"), decide.ReasonNADNotFound},
		{"provider-no-dot", provider("nodot"), decide.ReasonInvalidProvider},
		{"provider-trailing-dot", provider("nad."), decide.ReasonInvalidProvider},
		{"provider-whitespace", provider("  " + f.provider + "  "), ""},
		{"provider-unicode", provider("nä∂.kube-system"), decide.ReasonNADNotFound},
		{"provider-missing-nad", provider("ghost." + f.ns), decide.ReasonNADNotFound},
		{strings.Repeat("n", 63), nil, ""},
		{"lbip-spaces", lbip("  " + f.ip("20") + "  "), ""},
		{"lbip-two-v4", lbip(f.ip("21") + ", " + f.ip("22")), decide.ReasonInvalidLoadBalancerIP},
		{"lbip-commas", lbip(",,"), decide.ReasonInvalidLoadBalancerIP},
		{"lbip-leading-zeros", lbip("010.100.001.030"), decide.ReasonInvalidLoadBalancerIP},
		{"lbip-mapped", lbip("::ffff:" + f.ip("23")), decide.ReasonInvalidLoadBalancerIP},
		{"lbip-zoned", lbip("fe80::1%eth0"), decide.ReasonInvalidLoadBalancerIP},
		{"lbip-huge", lbip(strings.Repeat("9", 20000)), decide.ReasonInvalidLoadBalancerIP},
		{"lbip-out-of-range", lbip("10.250.250.250"), decide.ReasonAddressOutOfRange},
		{"lbip-excluded", lbip(f.ip("3")), decide.ReasonAddressExcluded},
		{"lbip-gateway", lbip(f.ip("1")), decide.ReasonAddressIsGateway},
		{"lbip-broadcast", lbip(f.ip("255")), decide.ReasonAddressReserved},
		{"lbip-v6-in-v4", lbip("fd00::20"), decide.ReasonAddressFamily},
		{"lbip-taken", lbip(f.ip("20")), decide.ReasonAddressInUse},
		{"mixed-protocols", ports(port(53, corev1.ProtocolTCP), port(53, corev1.ProtocolUDP)), ""},
		{"sctp", ports(port(9999, corev1.ProtocolSCTP)), ""},
		// The API server itself refuses garbage in the field; the annotation is ours to check.
		{"ranges-garbage", func(s *corev1.Service) { s.Spec.LoadBalancerSourceRanges = []string{"not-a-cidr"} }, "admission:must be a valid CIDR"},
		{"ranges-bare-address", func(s *corev1.Service) {
			s.Annotations["service.beta.kubernetes.io/load-balancer-source-ranges"] = "192.0.2.1"
		}, "admission:must be a valid CIDR"},
		{"duplicate-ports", ports(port(80, corev1.ProtocolTCP), corev1.ServicePort{Name: "again", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(81)}), "admission:Duplicate value"},
		{"ranges-annotation-garbage", func(s *corev1.Service) {
			s.Annotations["service.beta.kubernetes.io/load-balancer-source-ranges"] = "10.0.0.0/8,,💥"
		}, "admission:must be a valid CIDR"},
		{"ranges-annotation-spaces", func(s *corev1.Service) {
			s.Annotations["service.beta.kubernetes.io/load-balancer-source-ranges"] = " 10.0.0.0/8 , 192.0.2.0/24 "
		}, ""},
		{"ranges-everyone", func(s *corev1.Service) { s.Spec.LoadBalancerSourceRanges = []string{"0.0.0.0/0"} }, ""},
		{"ranges-host-bits", func(s *corev1.Service) { s.Spec.LoadBalancerSourceRanges = []string{"192.0.2.77/24"} }, "admission:must not have bits set"},
		{"logical-switch-ghost", func(s *corev1.Service) {
			s.Annotations[f.provider+".kubernetes.io/logical_switch"] = "no-such-subnet"
		}, decide.ReasonSubnetNotFound},
		{"logical-switch-unicode", func(s *corev1.Service) {
			s.Annotations[f.provider+".kubernetes.io/logical_switch"] = "ünïcode"
		}, decide.ReasonSubnetNotFound},
	}
	for _, c := range cases {
		svc := lbService(f.ns, c.name, f.provider, "")
		if c.mutate != nil {
			c.mutate(svc)
		}
		if want, ok := strings.CutPrefix(c.reason, "admission:"); ok {
			err := k8s.Create(ctx, svc)
			if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), want) {
				t.Errorf("%s: want the API server to refuse it (%q), got %v", c.name, want, err)
			}
			continue
		}
		create(t, svc)
		if c.name == "lbip-spaces" {
			// Served first, so that lbip-taken (later) finds .20 held.
			waitAddress(t, f.ns, c.name, f.ip("20"))
		}
	}
	served := 0
	for _, c := range cases {
		if strings.HasPrefix(c.reason, "admission:") {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			if c.reason == "" {
				served++
				NewWithT(t).Eventually(func(g Gomega) {
					s := getService(g, f.ns, c.name)
					g.Expect(ingressIPs(s)).To(HaveLen(1))
					cond := findCondition(s.Status.Conditions, decide.ConditionAddressAllocated)
					g.Expect(cond).NotTo(BeNil())
					g.Expect(cond.Reason).To(Equal(decide.ReasonAllocated))
				}, timeout, interval).Should(Succeed())
				return
			}
			s := waitRefused(t, f.ns, c.name, c.reason)
			cond := findCondition(s.Status.Conditions, decide.ConditionAddressAllocated)
			NewWithT(t).Expect(len(cond.Message)).To(BeNumerically("<=", decide.MaxMessageBytes))
			NewWithT(t).Expect(utf8.ValidString(cond.Message)).To(BeTrue())
			t.Logf("%s: %s", cond.Reason, cond.Message)
		})
	}
	// No leak, no duplicate: exactly one bound IP object per served Service, none for the others.
	g.Eventually(func(g Gomega) {
		var ips lbv1.IPList
		g.Expect(k8s.List(ctx, &ips)).To(Succeed())
		owners := map[string]int{}
		for _, ip := range ips.Items {
			if ip.Spec.Service.Namespace == f.ns && ip.DeletionTimestamp == nil {
				owners[ip.Spec.Service.Name]++
			}
		}
		g.Expect(owners).To(HaveLen(served))
		for name, n := range owners {
			g.Expect(n).To(Equal(1), name)
		}
	}, timeout, interval).Should(Succeed())
	waitSubnetCounters(t, f.subnet, int64(served), int64(249-served))

	// ExternalName and ClusterIP Services with our annotation: not ours, untouched.
	ext := lbService(f.ns, "external", f.provider, "")
	ext.Spec = corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "example.com"}
	create(t, ext)
	g.Consistently(func(g Gomega) {
		s := getService(g, f.ns, "external")
		g.Expect(s.Finalizers).To(BeEmpty())
		g.Expect(s.Status.Conditions).To(BeEmpty())
	}, time.Second, 250*time.Millisecond).Should(Succeed())
}

// Bad Subnets: refused at admission where the schema can tell, else not Ready with the reason;
// never a source of addresses.
func TestBadSubnetTable(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	provider := createNAD(t, ns, "attach")
	admission := []struct{ name, protocol, cidr, gateway, want string }{
		{"all-v4", "IPv4", "0.0.0.0/0", "", "cidrBlock must be unicast"},
		{"loopback", "IPv4", "127.0.0.0/8", "", "cidrBlock must be unicast"},
		{"multicast", "IPv4", "224.0.0.0/24", "", "cidrBlock must be unicast"},
		{"link-local", "IPv4", "169.254.0.0/16", "", "cidrBlock must be unicast"},
		{"all-v6", "IPv6", "::/0", "", "cidrBlock must be unicast"},
		{"link-local-v6", "IPv6", "fe80::/64", "", "cidrBlock must be unicast"},
		{"dual-wrong-order-types", "Dual", "fd00:1::/64,10.77.0.0/24,10.78.0.0/24", "", "protocol Dual needs one IPv4 and one IPv6 CIDR"},
		{"garbage", "IPv4", "10.1.2.300/24", "", "cidrBlock must be one CIDR"},
		{"gateway-garbage", "IPv4", "10.77.1.0/24", "gw", "gateway must be an IP address"},
	}
	for _, c := range admission {
		s := &lbv1.Subnet{ObjectMeta: metav1.ObjectMeta{Name: "bad-" + c.name + "-" + suffix()},
			Spec: lbv1.SubnetSpec{Protocol: lbv1.Protocol(c.protocol), Provider: provider, CIDRBlock: c.cidr, Gateway: c.gateway}}
		err := k8s.Create(ctx, s)
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s (%s): want an admission refusal containing %q, got %v", c.name, c.cidr, c.want, err)
		}
	}
	net := nextNet()
	ready := []struct {
		name     string
		subnet   *lbv1.Subnet
		reason   string
		excludes []string
	}{
		{"gateway-network-address", subnetObj("gwnet-"+suffix(), provider, nextNet()+".0/24", "", nil), decide.ReasonSubnetValid, nil},
		{"reversed-exclusion", subnetObj("rev-"+suffix(), provider, net+".0/24", net+".1", []string{net + ".50.." + net + ".10"}), decide.ReasonSubnetInvalid, nil},
		{"slash-31", subnetObj("s31-"+suffix(), provider, nextNet()+".0/31", "", nil), decide.ReasonSubnetValid, nil},
		{"slash-127", &lbv1.Subnet{ObjectMeta: metav1.ObjectMeta{Name: "s127-" + suffix()},
			Spec: lbv1.SubnetSpec{Protocol: lbv1.ProtocolIPv6, Provider: provider, CIDRBlock: "fd00:127::/127"}}, decide.ReasonSubnetValid, nil},
		{"huge-exclusions", subnetObj("huge-"+suffix(), provider, "10.200.0.0/16", "10.200.0.1", func() []string {
			var ex []string
			for i := 0; i < 1024; i++ {
				ex = append(ex, fmt.Sprintf("10.200.%d.%d", i/250, i%250+2))
			}
			return ex
		}()), decide.ReasonSubnetValid, nil},
	}
	for _, c := range ready {
		create(t, c.subnet)
		waitReady(t, c.subnet.Name, map[bool]metav1.ConditionStatus{true: metav1.ConditionTrue, false: metav1.ConditionFalse}[c.reason == decide.ReasonSubnetValid], c.reason)
	}
	// A gateway at the network address is refused (InvalidSpec), with the reason in the message.
	gwAtNet := nextNet()
	bad := subnetObj("gw0-"+suffix(), provider, gwAtNet+".0/24", gwAtNet+".0", nil)
	create(t, bad)
	waitReady(t, bad.Name, metav1.ConditionFalse, decide.ReasonSubnetInvalid)
	s := &lbv1.Subnet{}
	NewWithT(t).Expect(k8s.Get(ctx, client.ObjectKey{Name: bad.Name}, s)).To(Succeed())
	NewWithT(t).Expect(findCondition(s.Status.Conditions, decide.ConditionSubnetReady).Message).
		To(ContainSubstring("gateway " + gwAtNet + ".0 is the network address of " + gwAtNet + ".0/24"))
}

// Every change that can unblock a waiting Service wakes it: the older of two overlapping Subnets
// deleted, a Subnet that appears with a free address.
func TestWakeUps(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	provider := createNAD(t, ns, "attach")
	net := nextNet()
	older := subnetObj("wake-a-"+suffix(), "other."+ns, net+".0/24", net+".1", nil)
	create(t, older)
	waitReady(t, older.Name, metav1.ConditionTrue, decide.ReasonSubnetValid)
	newer := subnetObj("wake-b-"+suffix(), provider, net+".0/25", net+".1", nil)
	create(t, newer)
	waitReady(t, newer.Name, metav1.ConditionFalse, decide.ReasonSubnetOverlap)
	create(t, lbService(ns, "waiting", provider, ""))
	waitRefused(t, ns, "waiting", decide.ReasonSubnetNotReady)
	// Deleting the older Subnet (another provider's) resolves the overlap: the Service is woken.
	g.Expect(k8s.Delete(ctx, older)).To(Succeed())
	waitAddress(t, ns, "waiting", net+".2")
}
