//go:build integration

package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lbsvc/lbsvc-operator/controllers"
	"github.com/lbsvc/lbsvc-operator/controllers/decide"
	"github.com/lbsvc/lbsvc-operator/controllers/lbobjects"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
)

// sharingService is an lb Service with the sharing key (none: "") and the ports ("TCP/53").
func sharingService(f fixture, name, key, static string, ports ...corev1.ServicePort) *corev1.Service {
	s := lbService(f.ns, name, f.provider, "")
	if key != "" {
		s.Annotations[lbv1.AllowSharedIPAnnotation] = key
	}
	if static != "" {
		s.Annotations[lbv1.LoadBalancerIPsAnnotation] = static
	}
	s.Spec.Ports = ports
	return s
}

func svcPort(name string, proto corev1.Protocol, port int32) corev1.ServicePort {
	return corev1.ServicePort{Name: name, Protocol: proto, Port: port, TargetPort: intstr.FromInt32(port)}
}

// members renders an IP object's members as "name:PORT,PORT" in its order.
func members(g Gomega, addr string) []string {
	var out []string
	for _, m := range getIP(g, addr).Spec.Members {
		s := m.Name + ":"
		for i, p := range m.Ports {
			if i > 0 {
				s += ","
			}
			s += p
		}
		out = append(out, s)
	}
	return out
}

// TestSharedAddress: Services with one sharing key share an address while their ports do not
// clash, served by one lb Deployment of the address; a clash gets a dynamic Service another
// address and refuses a static one, naming the port and the Service; another key or an
// unshared Service cannot take it; a member leaving keeps the address for the others, a member's
// changed ports are recorded, and the last member leaving drains it.
func TestSharedAddress(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	f := newFixture(t)
	addr := f.ip("6")
	tcp53, udp53 := svcPort("dns-tcp", corev1.ProtocolTCP, 53), svcPort("dns-udp", corev1.ProtocolUDP, 53)

	create(t, sharingService(f, "dns-tcp", "dns", "", tcp53))
	a := waitAddress(t, f.ns, "dns-tcp", addr)
	create(t, sharingService(f, "dns-udp", "dns", "", udp53))
	b := waitAddress(t, f.ns, "dns-udp", addr)
	g.Eventually(func(g Gomega) {
		ip := getIP(g, addr)
		g.Expect(ip.Spec.SharingKey).To(Equal("dns"))
		g.Expect(ip.Spec.Service.UID).To(Equal(string(a.UID)))
		g.Expect(members(g, addr)).To(Equal([]string{"dns-tcp:TCP/53", "dns-udp:UDP/53"}))
		g.Expect(getIP(g, addr).Status.Members).To(Equal("dns-tcp,dns-udp")) // kubectl get ips
	}, timeout, interval).Should(Succeed())

	// One lb Deployment for the address, none of each member's; both members labelled for it.
	name := lbobjects.SharedObjectName(addr)
	d := &appsv1.Deployment{}
	g.Eventually(func() error { return k8s.Get(ctx, client.ObjectKey{Namespace: f.ns, Name: name}, d) }, timeout, interval).Should(Succeed())
	g.Expect(d.Spec.Selector.MatchLabels).To(Equal(map[string]string{lbv1.ComponentLabel: lbv1.ComponentLBPod, lbv1.SharedIPLabel: addr}))
	g.Expect(d.Labels[lbv1.ServiceUIDLabel]).To(Equal(string(a.UID)))
	env := map[string]string{}
	for _, e := range d.Spec.Template.Spec.Containers[0].Env {
		env[e.Name] = e.Value
	}
	g.Expect(env[lbv1.EnvSharedIP]).To(Equal(addr))
	g.Expect(env).NotTo(HaveKey(lbv1.EnvService))
	assertNoDeployment(t, f.ns, "dns-tcp")
	assertNoDeployment(t, f.ns, "dns-udp")
	for _, s := range []string{"dns-tcp", "dns-udp"} {
		g.Eventually(func(g Gomega) {
			g.Expect(getService(g, f.ns, s).Labels).To(HaveKeyWithValue(lbv1.SharedIPLabelPrefix+addr, ""))
		}, timeout, interval).Should(Succeed())
	}

	// A clash: dynamic gets another address, static is refused naming the port and the Service.
	create(t, sharingService(f, "dns-tcp-2", "dns", "", tcp53))
	waitAddress(t, f.ns, "dns-tcp-2", f.ip("7"))
	create(t, sharingService(f, "static-clash", "dns", addr, tcp53, svcPort("web", corev1.ProtocolTCP, 80)))
	refused := waitRefused(t, f.ns, "static-clash", decide.ReasonSharingConflict)
	g.Expect(findCondition(refused.Status.Conditions, decide.ConditionAddressAllocated).Message).To(Equal(
		"annotation lbsvc.io/loadBalancerIPs " + addr + ": port TCP/53 is served on the address by Service dns-tcp (a shared address serves each protocol and port for one Service)"))
	// Another key, or no key: the address is in use.
	create(t, sharingService(f, "other-key", "web", addr, svcPort("web", corev1.ProtocolTCP, 80)))
	waitRefused(t, f.ns, "other-key", decide.ReasonAddressInUse)
	create(t, sharingService(f, "unshared", "", addr, svcPort("web", corev1.ProtocolTCP, 80)))
	waitRefused(t, f.ns, "unshared", decide.ReasonAddressInUse)
	// A static request of a compatible Service joins.
	create(t, sharingService(f, "web", "dns", addr, svcPort("web", corev1.ProtocolTCP, 80)))
	waitAddress(t, f.ns, "web", addr)
	g.Eventually(func(g Gomega) {
		g.Expect(members(g, addr)).To(Equal([]string{"dns-tcp:TCP/53", "dns-udp:UDP/53", "web:TCP/80"}))
	}, timeout, interval).Should(Succeed())

	// A member leaves: the address stays with the others, its lb Deployment too.
	g.Expect(k8s.Delete(ctx, a)).To(Succeed())
	waitGone(t, a)
	g.Eventually(func() []string { return eventMessages(t, f.ns, "dns-tcp", decide.ReasonCleanedUp) }, timeout, interval).
		Should(ContainElement("left the shared address " + addr + ": its other members keep it"))
	g.Eventually(func(g Gomega) {
		g.Expect(members(g, addr)).To(Equal([]string{"dns-udp:UDP/53", "web:TCP/80"}))
		g.Expect(getIP(g, addr).DeletionTimestamp).To(BeNil())
	}, timeout, interval).Should(Succeed())
	g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: f.ns, Name: name}, d)).To(Succeed())
	g.Expect(d.DeletionTimestamp).To(BeNil())

	// Each member's status lists the ports admitted for it on the address (what its lb pods serve
	// it on: a member cannot take another's port by editing its spec).
	admitted := func(g Gomega, name string) []corev1.PortStatus {
		in := getService(g, f.ns, name).Status.LoadBalancer.Ingress
		g.Expect(in).To(HaveLen(1))
		return in[0].Ports
	}
	g.Expect(admitted(g, "dns-udp")).To(Equal([]corev1.PortStatus{{Port: 53, Protocol: corev1.ProtocolUDP}}))
	g.Expect(admitted(g, "web")).To(Equal([]corev1.PortStatus{{Port: 80, Protocol: corev1.ProtocolTCP}}))

	// A member's new port, free now, is recorded, and admitted.
	update(t, b, func(s *corev1.Service) { s.Spec.Ports = []corev1.ServicePort{udp53, tcp53} })
	g.Eventually(func(g Gomega) {
		g.Expect(members(g, addr)).To(Equal([]string{"dns-udp:TCP/53,UDP/53", "web:TCP/80"}))
		g.Expect(admitted(g, "dns-udp")).To(Equal([]corev1.PortStatus{{Port: 53, Protocol: corev1.ProtocolUDP}, {Port: 53, Protocol: corev1.ProtocolTCP}}))
	}, timeout, interval).Should(Succeed())
	// Its port taken by another member's change: that member moves (dynamic) to another address.
	web := getService(g, f.ns, "web")
	update(t, web, func(s *corev1.Service) {
		delete(s.Annotations, lbv1.LoadBalancerIPsAnnotation)
		s.Spec.Ports = []corev1.ServicePort{svcPort("web", corev1.ProtocolTCP, 80), tcp53}
	})
	g.Eventually(func(g Gomega) {
		g.Expect(members(g, addr)).To(Equal([]string{"dns-udp:TCP/53,UDP/53"}))
		g.Expect(ingressIPs(getService(g, f.ns, "web"))).NotTo(ContainElement(addr))
	}, timeout, interval).Should(Succeed())
	// On its new address (of the same key) both its ports are admitted.
	g.Expect(admitted(g, "web")).To(Equal([]corev1.PortStatus{{Port: 80, Protocol: corev1.ProtocolTCP}, {Port: 53, Protocol: corev1.ProtocolTCP}}))

	// The last member leaves: the address drains (its lb Deployment goes) and is free again; the
	// static Service refused for the clash gets it.
	for _, s := range []string{"dns-udp", "web", "dns-tcp-2", "other-key", "unshared"} {
		g.Expect(k8s.Delete(ctx, getService(g, f.ns, s))).To(Succeed())
	}
	waitGone(t, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name}})
	waitAddress(t, f.ns, "static-clash", addr)
	g.Eventually(func(g Gomega) {
		g.Expect(members(g, addr)).To(Equal([]string{"static-clash:TCP/53,TCP/80"}))
	}, timeout, interval).Should(Succeed())
	waitSubnetCounters(t, f.subnet, 1, 256-2-4-1-1)
}

// TestSharedAddressChurn: many Services of one key join and leave concurrently; every join and
// leave is ordered by the API server: in the end each remaining Service is listed exactly once on
// the address its status shows, no member is listed that is gone, and nothing leaked.
func TestSharedAddressChurn(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	f := newFixture(t)
	const n = 12
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Go(func() {
			create(t, sharingService(f, "m"+string(rune('a'+i)), "k", "", svcPort("p", corev1.ProtocolTCP, int32(1000+i))))
		})
	}
	wg.Wait()
	for i := 0; i < n; i++ {
		waitAddress(t, f.ns, "m"+string(rune('a'+i)), f.ip("6"))
	}
	// Half leave at once.
	for i := 0; i < n; i += 2 {
		wg.Go(func() { g.Expect(k8s.Delete(ctx, getService(g, f.ns, "m"+string(rune('a'+i))))).To(Succeed()) })
	}
	wg.Wait()
	g.Eventually(func(g Gomega) {
		var got []string
		for _, m := range getIP(g, f.ip("6")).Spec.Members {
			got = append(got, m.Name)
		}
		g.Expect(got).To(Equal([]string{"mb", "md", "mf", "mh", "mj", "ml"}))
	}, timeout, interval).Should(Succeed())
	waitSubnetCounters(t, f.subnet, 1, 256-2-4-1-1)
}

// TestKillDuringSharingChurn: Services of one sharing key, each with one port from a small set
// (so they clash), are created, deleted and given other ports while the operator binary is
// SIGKILLed and restarted at random moments. Once settled: every shared address lists exactly
// the live Services that show it, no port twice, no member gone, none draining, no address shown
// by two Services that do not share it, and the Subnet's counters are exact.
func TestKillDuringSharingChurn(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	stopOperator()
	t.Cleanup(func() { startOperator(true) })
	op := buildOperator(t)
	op.start(t)
	t.Cleanup(op.kill)
	f := newFixture(t)

	var kills, ops atomic.Int32
	churnCtx, stop := context.WithTimeout(ctx, 15*time.Second)
	defer stop()
	var wg sync.WaitGroup
	for w := 0; w < 3; w++ {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			port := func() corev1.ServicePort {
				return svcPort("p", []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP}[rng.IntN(2)], int32(53+rng.IntN(4)))
			}
			for i := 0; churnCtx.Err() == nil; i++ {
				name := fmt.Sprintf("s%d-%d", w, rng.IntN(8))
				svc := &corev1.Service{}
				switch err := k8s.Get(ctx, client.ObjectKey{Namespace: f.ns, Name: name}, svc); {
				case apierrors.IsNotFound(err):
					_ = k8s.Create(ctx, sharingService(f, name, "k", "", port()))
				case err == nil && rng.IntN(2) == 0:
					_ = k8s.Delete(ctx, svc)
				case err == nil:
					svc.Spec.Ports = []corev1.ServicePort{port()}
					_ = k8s.Update(ctx, svc)
				}
				ops.Add(1)
				time.Sleep(time.Duration(20+rng.IntN(60)) * time.Millisecond)
			}
		})
	}
	rng := rand.New(rand.NewPCG(7, uint64(time.Now().UnixNano())))
	for churnCtx.Err() == nil {
		select {
		case <-churnCtx.Done():
		case <-time.After(time.Duration(300+rng.IntN(1500)) * time.Millisecond):
			op.kill()
			kills.Add(1)
			op.start(t)
		}
	}
	wg.Wait()

	g.Eventually(func(g Gomega) {
		var list corev1.ServiceList
		g.Expect(k8s.List(ctx, &list, client.InNamespace(f.ns))).To(Succeed())
		shownBy := map[string][]string{} // address -> "name:PORT" of the Services showing it
		for _, s := range list.Items {
			g.Expect(s.DeletionTimestamp).To(BeNil(), "%s stuck deleting", s.Name)
			c := findCondition(s.Status.Conditions, decide.ConditionAddressAllocated)
			g.Expect(c).NotTo(BeNil(), s.Name)
			g.Expect(c.Status).To(Equal(metav1.ConditionTrue), "%s: %s %s", s.Name, c.Reason, c.Message)
			for _, a := range ingressIPs(&s) {
				p := s.Spec.Ports[0]
				shownBy[a] = append(shownBy[a], fmt.Sprintf("%s:%s/%d", s.Name, p.Protocol, p.Port))
			}
		}
		var ips lbv1.IPList
		g.Expect(k8s.List(ctx, &ips)).To(Succeed())
		listed := 0
		for _, ip := range ips.Items {
			if ip.Spec.Subnet != f.subnet {
				continue
			}
			listed++
			g.Expect(ip.DeletionTimestamp).To(BeNil(), "%s draining: %s", ip.Name, ip.Status.Message)
			g.Expect(ip.Spec.SharingKey).To(Equal("k"))
			var recorded []string
			ports := map[string]bool{}
			for _, m := range ip.Spec.Members {
				g.Expect(m.Ports).To(HaveLen(1))
				g.Expect(ports[m.Ports[0]]).To(BeFalse(), "%s: port %s twice", ip.Name, m.Ports[0])
				ports[m.Ports[0]] = true
				recorded = append(recorded, m.Name+":"+m.Ports[0])
			}
			g.Expect(recorded).To(ConsistOf(shownBy[ip.Spec.Address]), "%s: members against the Services showing it", ip.Name)
		}
		g.Expect(listed).To(Equal(len(shownBy)), "an address shown without its IP object, or an IP object nobody shows")
	}, 90*time.Second, 500*time.Millisecond).Should(Succeed())
	used := ipsInSubnet(ctx, g, f.subnet)
	waitSubnetCounters(t, f.subnet, int64(used), int64(249-used))
	t.Logf("figure: kill -9 sharing churn: %d operations, %d operator kills (SIGKILL); afterwards %d shared addresses, no port listed twice, no member gone, none draining",
		ops.Load(), kills.Load(), used)
}

// TestConflictOnSharedAddress: a host answering the probe of a shared address (the report on the
// address's Lease, written here as its lb pod would) puts it in phase Conflict; every member is
// told (AddressInUse Warning) and they move on together, to one new shared address.
func TestConflictOnSharedAddress(t *testing.T) {
	g, _, f, a := dnsPair(t)
	first, second := f.ip("6"), f.ip("7")
	reportSharedConflict(t, f.ns, a, first)

	waitAddress(t, f.ns, "dns-tcp", second)
	waitAddress(t, f.ns, "dns-udp", second)
	g.Expect(getIP(g, first).Status.Phase).To(Equal(lbv1.IPConflict))
	g.Eventually(func(g Gomega) {
		g.Expect(members(g, second)).To(Equal([]string{"dns-tcp:TCP/53", "dns-udp:UDP/53"}))
	}, timeout, interval).Should(Succeed())
	for _, s := range []string{"dns-tcp", "dns-udp"} {
		g.Eventually(func() []string { return warningMessages(t, f.ns, s, decide.ReasonAddressInUse) }, timeout, interval).
			Should(HaveLen(1), "AddressInUse Warning on %s", s)
	}
}

// TestConflictOnSharedAddressAcrossNamespaces: members of two namespaces share an address (with
// --lb-pod-namespace) and a host answers its probe: the members of the owner's namespace are told
// which Service does not announce it, those of the other namespace are told the same without
// naming it (a Service of another tenant). Before, every member got the owner's name.
func TestConflictOnSharedAddressAcrossNamespaces(t *testing.T) {
	g, f, system, other, owner := crossNamespacePair(t)
	addr := f.ip("6")
	reportSharedConflict(t, system, owner, addr)

	hint := "it is not handed out again until an admin deletes the IP object (kubectl delete ip " + addr + ")"
	g.Eventually(func() []string { return warningMessages(t, f.ns, "dns-tcp", decide.ReasonAddressInUse) }, timeout, interval).Should(Equal([]string{
		addr + " is in use on the underlay: 02:42:ac:12:00:05 answered the lb pod's probe before the first announcement; the Service " + f.ns + "/dns-tcp does not announce it, and " + hint}))
	g.Eventually(func() []string { return warningMessages(t, other.ns, "dns-udp", decide.ReasonAddressInUse) }, timeout, interval).Should(Equal([]string{
		"the shared address " + addr + " is in use on the underlay: 02:42:ac:12:00:05 answered the lb pod's probe before the first announcement; its lb pods do not announce it, and " + hint}))
	// Both move on together, to one new shared address.
	waitAddress(t, f.ns, "dns-tcp", f.ip("7"))
	waitAddress(t, other.ns, "dns-udp", f.ip("7"))
}

// reportSharedConflict writes, as the lb pod of the shared address addr would, that 02:42:ac:12:00:05
// answered its probe now, on the address's Lease in namespace, where its lb pods run (the owner's
// namespace, or the --lb-pod-namespace), and waits for the IP object's phase Conflict.
func reportSharedConflict(t *testing.T, namespace string, owner *corev1.Service, addr string) {
	t.Helper()
	g := NewWithT(t)
	ip := getIP(g, addr)
	lease := lbobjects.BuildSharedLease(lbobjects.SharedObjectName(addr), namespace, owner.Namespace, owner.UID, lbobjects.IPRef{Name: ip.Name, UID: ip.UID})
	at := time.Now().UTC().Truncate(time.Second)
	lease.Annotations = map[string]string{lbv1.AddressConflictAnnotation: fmt.Sprintf("%s 02:42:ac:12:00:05 %s", addr, at.Format(time.RFC3339))}
	create(t, lease)
	g.Eventually(func(g Gomega) { g.Expect(getIP(g, addr).Status.Phase).To(Equal(lbv1.IPConflict)) }, timeout, interval).Should(Succeed())
}

// crossNamespacePair runs the operator with --lb-pod-namespace (opts change its other options)
// and has dns-tcp (TCP/53) of a new fixture and dns-udp (UDP/53) of another namespace share the
// fixture's first address; it returns the fixture, the lb pod namespace, the other namespace's
// fixture and dns-tcp, the address's owner.
func crossNamespacePair(t *testing.T, opts ...func(*controllers.Options)) (Gomega, fixture, string, fixture, *corev1.Service) {
	t.Helper()
	g := NewWithT(t)
	f, system, more := withLBPodNamespace(t, 1, opts...)
	other, addr := more[0], f.ip("6")
	create(t, accepting(sharingService(f, "dns-tcp", "dns", "", svcPort("dns", corev1.ProtocolTCP, 53)), other.ns))
	owner := waitAddress(t, f.ns, "dns-tcp", addr)
	create(t, accepting(sharingService(other, "dns-udp", "dns", "", svcPort("dns", corev1.ProtocolUDP, 53)), f.ns))
	waitAddress(t, other.ns, "dns-udp", addr)
	g.Eventually(func(g Gomega) { g.Expect(members(g, addr)).To(ConsistOf("dns-tcp:TCP/53", "dns-udp:UDP/53")) }, timeout, interval).Should(Succeed())
	return g, f, system, other, owner
}

// TestSharedAddressInLBPodNamespace: with --lb-pod-namespace a shared address's lb objects live
// there, and members may come from several namespaces when each side names the other's in
// lbsvc.io/shared-ip-namespaces: the lb pods are then bound in every member namespace and in their
// own, and their ServiceAccount lists the member namespaces; a member namespace left empty loses
// its RoleBinding. A namespace not named is refused without naming the Service it clashes with.
// A standing lb pod keeps the address draining after the last member left; the drain deletes the
// objects, and a Service that waited for the address gets it.
func TestSharedAddressInLBPodNamespace(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	f, system, more := withLBPodNamespace(t, 2)
	other, stranger := more[0], more[1]
	addr := f.ip("6")
	create(t, accepting(sharingService(f, "dns-tcp", "dns", "", svcPort("dns", corev1.ProtocolTCP, 53)), other.ns))
	a := waitAddress(t, f.ns, "dns-tcp", addr)
	create(t, accepting(sharingService(f, "dns-udp", "dns", "", svcPort("dns", corev1.ProtocolUDP, 53)), other.ns))
	waitAddress(t, f.ns, "dns-udp", addr)
	create(t, accepting(sharingService(other, "mdns", "dns", "", svcPort("mdns", corev1.ProtocolUDP, 5353)), f.ns))
	waitAddress(t, other.ns, "mdns", addr)
	g.Eventually(func(g Gomega) {
		g.Expect(members(g, addr)).To(ConsistOf("dns-tcp:TCP/53", "dns-udp:UDP/53", "mdns:UDP/5353"))
		g.Expect(strings.Split(getIP(g, addr).Status.Members, ",")).To(ConsistOf("dns-tcp", "dns-udp", other.ns+"/mdns"))
	}, timeout, interval).Should(Succeed())

	name := lbobjects.SharedObjectName(addr)
	g.Eventually(func() error {
		return k8s.Get(ctx, client.ObjectKey{Namespace: system, Name: name}, &appsv1.Deployment{})
	}, timeout, interval).Should(Succeed())
	bindings := func(g Gomega) []string {
		var rbs rbacv1.RoleBindingList
		g.Expect(k8s.List(ctx, &rbs, client.MatchingLabels{lbv1.SharedIPLabel: addr})).To(Succeed())
		var out []string
		for _, rb := range rbs.Items {
			g.Expect(rb.Subjects).To(Equal([]rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: system}}))
			out = append(out, rb.Namespace)
		}
		return out
	}
	saNote := func(g Gomega) string {
		sa := &corev1.ServiceAccount{}
		g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: system, Name: name}, sa)).To(Succeed())
		return sa.Annotations[lbv1.MemberNamespacesAnnotation]
	}
	g.Eventually(func(g Gomega) {
		g.Expect(bindings(g)).To(ConsistOf(f.ns, other.ns, system))
		g.Expect(saNote(g)).To(Equal(other.ns))
	}, timeout, interval).Should(Succeed())

	// A namespace the members do not name: an address of its own; asking for the shared one is
	// refused, naming no Service there.
	create(t, accepting(sharingService(stranger, "dns-c", "dns", "", svcPort("dns", corev1.ProtocolTCP, 5354)), "*"))
	waitAddress(t, stranger.ns, "dns-c", f.ip("7"))
	create(t, accepting(sharingService(stranger, "dns-d", "dns", addr, svcPort("dns", corev1.ProtocolTCP, 5355)), "*"))
	refused := waitRefused(t, stranger.ns, "dns-d", decide.ReasonSharingConflict)
	msg := findCondition(refused.Status.Conditions, decide.ConditionAddressAllocated).Message
	g.Expect(msg).To(MatchRegexp(": a Service of namespace (" + f.ns + "|" + other.ns + ") shares the address and does not accept namespace " + stranger.ns + "$"))
	g.Expect(msg).NotTo(ContainSubstring("dns-tcp"))

	// The ServiceAccount deleted by hand comes back, created with the list (the field then
	// belongs to the create, not to the operator's applies, which cannot remove it).
	sa := &corev1.ServiceAccount{}
	g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: system, Name: name}, sa)).To(Succeed())
	g.Expect(k8s.Delete(ctx, sa)).To(Succeed())
	update(t, getService(g, f.ns, "dns-tcp"), func(s *corev1.Service) { s.Labels["touch"] = "1" })
	g.Eventually(func(g Gomega) {
		again := &corev1.ServiceAccount{}
		g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: system, Name: name}, again)).To(Succeed())
		g.Expect(again.UID).NotTo(Equal(sa.UID))
		g.Expect(again.Annotations[lbv1.MemberNamespacesAnnotation]).To(Equal(other.ns))
	}, timeout, interval).Should(Succeed())

	// The other namespace's member leaves: its RoleBinding goes, and the ServiceAccount's list.
	g.Expect(k8s.Delete(ctx, getService(g, other.ns, "mdns"))).To(Succeed())
	g.Eventually(func(g Gomega) {
		g.Expect(bindings(g)).To(ConsistOf(f.ns, system))
		g.Expect(saNote(g)).To(BeEmpty())
	}, timeout, interval).Should(Succeed())

	// A standing lb pod of the address (no kubelet here: a pod object stands in) keeps it draining
	// after the last member left; the drain deletes the objects in the lb pod namespace.
	pod := lbPodObjectIn(t, system, a, "lb-shared", addr, "")
	update(t, pod, func(p *corev1.Pod) { p.Labels[lbv1.SharedIPLabel] = addr })
	for _, s := range []string{"dns-tcp", "dns-udp"} {
		g.Expect(k8s.Delete(ctx, getService(g, f.ns, s))).To(Succeed())
	}
	waitDraining(t, addr)
	waitGone(t, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: system, Name: name}})
	g.Eventually(bindings, timeout, interval).Should(BeEmpty())
	g.Consistently(func(g Gomega) { g.Expect(getIP(g, addr).DeletionTimestamp).NotTo(BeNil()) }, time.Second, interval).Should(Succeed())
	forceDelete(t, pod)
	// Drained: the Service that asked for it gets it.
	waitAddress(t, stranger.ns, "dns-d", addr)
	g.Expect(getIP(g, addr).Spec.Service.Namespace).To(Equal(stranger.ns))
}

// The admin of one member's namespace replaces the address's RoleBinding there with one of their
// own (our labels gone; RoleBindings are theirs to write): only their own Service is refused
// (ObjectConflict: the object is in its namespace) and leaves the address. The members of the
// other namespace keep it (while that namespace is still a member, a Warning on their Service
// names the RoleBinding).
// Before, every member's pass met the foreign RoleBinding and was refused, and the address was
// drained: one namespace's admin took a shared address from the tenants of the others.
func TestForeignRoleBindingInAnotherMemberNamespaceRefusesOnlyThatMember(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	f, system, more := withLBPodNamespace(t, 1)
	other := more[0]
	addr := f.ip("6")
	create(t, accepting(sharingService(f, "dns-tcp", "dns", "", svcPort("dns", corev1.ProtocolTCP, 53)), other.ns))
	waitAddress(t, f.ns, "dns-tcp", addr)
	create(t, accepting(sharingService(other, "mdns", "dns", addr, svcPort("mdns", corev1.ProtocolUDP, 5353)), f.ns))
	waitAddress(t, other.ns, "mdns", addr)
	name := lbobjects.SharedObjectName(addr)
	key := client.ObjectKey{Namespace: other.ns, Name: name}
	rb := &rbacv1.RoleBinding{}
	g.Eventually(func() error { return k8s.Get(ctx, key, rb) }, timeout, interval).Should(Succeed())

	// The other namespace's admin: the same name, bound to nothing of ours (written while the
	// operator is stopped, which would otherwise put ours back between the delete and the create).
	stopOperator()
	g.Expect(k8s.Delete(ctx, rb)).To(Succeed())
	waitGone(t, rb)
	create(t, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: other.ns, Name: name},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "view"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "default", Namespace: other.ns}}})
	restartWithLBPodNamespace(t, system)

	waitRefused(t, other.ns, "mdns", decide.ReasonObjectConflict)
	g.Eventually(func(g Gomega) {
		g.Expect(members(g, addr)).To(Equal([]string{"dns-tcp:TCP/53"}))
	}, timeout, interval).Should(Succeed())
	g.Consistently(func(g Gomega) {
		g.Expect(ingressIPs(getService(g, f.ns, "dns-tcp"))).To(Equal([]string{addr}))
		g.Expect(getIP(g, addr).DeletionTimestamp).To(BeNil())
	}, time.Second, 200*time.Millisecond).Should(Succeed())
	// The RoleBinding is the admin's: left as they wrote it.
	g.Expect(k8s.Get(ctx, key, rb)).To(Succeed())
	g.Expect(rb.RoleRef.Name).To(Equal("view"))
}

// accepting is s accepting members from namespaces (SharedIPNamespacesAnnotation).
func accepting(s *corev1.Service, namespaces string) *corev1.Service {
	s.Annotations[lbv1.SharedIPNamespacesAnnotation] = namespaces
	return s
}

// withLBPodNamespace runs the operator with --lb-pod-namespace set to a new namespace (the usual
// one comes back when the test ends) and returns a fixture, that namespace, and n more fixtures of
// new namespaces on the same Subnet; opts change the operator's other options.
func withLBPodNamespace(t *testing.T, n int, opts ...func(*controllers.Options)) (fixture, string, []fixture) {
	t.Helper()
	f := newFixture(t)
	system := newNamespace(t)
	restartWithLBPodNamespace(t, system, opts...)
	var more []fixture
	for range n {
		more = append(more, fixture{ns: newNamespace(t), provider: f.provider, subnet: f.subnet, net: f.net})
	}
	return f, system, more
}

// TestSharedAddressLeftWhenTheSubnetNoLongerAllowsIt: an admin excludes a shared address from its
// Subnet. Its members move together to one new shared address, as an unshared Service moves off
// an excluded one, a new member of the key is given the new one, and the old address drains.
// Before, every member's claim joined the excluded address again and its drain never came.
func TestSharedAddressLeftWhenTheSubnetNoLongerAllowsIt(t *testing.T) {
	g, ctx, f, _ := dnsPair(t)
	old, next := f.ip("6"), f.ip("7")

	sn := &lbv1.Subnet{}
	g.Expect(k8s.Get(ctx, client.ObjectKey{Name: f.subnet}, sn)).To(Succeed())
	update(t, sn, func(s *lbv1.Subnet) { s.Spec.ExcludeIPs = append(s.Spec.ExcludeIPs, old) })
	waitAddress(t, f.ns, "dns-tcp", next)
	waitAddress(t, f.ns, "dns-udp", next)
	g.Eventually(func(g Gomega) {
		g.Expect(members(g, next)).To(ConsistOf("dns-tcp:TCP/53", "dns-udp:UDP/53"))
	}, timeout, interval).Should(Succeed())
	create(t, sharingService(f, "dns-alt", "dns", "", svcPort("dns", corev1.ProtocolTCP, 5353)))
	waitAddress(t, f.ns, "dns-alt", next)
	waitGone(t, &lbv1.IP{ObjectMeta: metav1.ObjectMeta{Name: old}})
}

// TestSharedAddressServedWhileItsSubnetIsDeleted: the Subnet of a shared address is deleted (its
// finalizer keeps it while the address is held). Its members keep the address, as any Service
// whose Subnet is not Ready does, and stay members exactly as before: the label the address's lb
// pods select them by, the ports admitted on their ingress, the IP object's member list. A port a
// member adds meanwhile is not admitted (nothing is joined while the Subnet is not Ready). Before,
// each pass took the labels and admitted ports off: the lb pods dropped every member.
func TestSharedAddressServedWhileItsSubnetIsDeleted(t *testing.T) {
	g, ctx, f, _ := dnsPair(t)
	addr := f.ip("6")
	label := lbv1.SharedIPLabelPrefix + addr
	ports := map[string][]corev1.PortStatus{
		"dns-tcp": {{Port: 53, Protocol: corev1.ProtocolTCP}},
		"dns-udp": {{Port: 53, Protocol: corev1.ProtocolUDP}},
	}
	served := func(g Gomega, reason string) {
		for name, want := range ports {
			s := getService(g, f.ns, name)
			g.Expect(s.Labels).To(HaveKeyWithValue(label, ""), name)
			g.Expect(s.Status.LoadBalancer.Ingress).To(Equal([]corev1.LoadBalancerIngress{{IP: addr, IPMode: ptr.To(corev1.LoadBalancerIPModeVIP), Ports: want}}), name)
			c := findCondition(s.Status.Conditions, decide.ConditionAddressAllocated)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Status).To(Equal(metav1.ConditionTrue), name)
			g.Expect(c.Reason).To(Equal(reason), name)
		}
		g.Expect(members(g, addr)).To(Equal([]string{"dns-tcp:TCP/53", "dns-udp:UDP/53"}))
	}
	g.Eventually(func(g Gomega) { served(g, decide.ReasonAllocated) }, timeout, interval).Should(Succeed())

	sn := &lbv1.Subnet{}
	g.Expect(k8s.Get(ctx, client.ObjectKey{Name: f.subnet}, sn)).To(Succeed())
	g.Expect(k8s.Delete(ctx, sn)).To(Succeed())
	g.Eventually(func(g Gomega) { served(g, decide.ReasonSubnetNotReady) }, timeout, interval).Should(Succeed())
	g.Expect(findCondition(getService(g, f.ns, "dns-tcp").Status.Conditions, decide.ConditionAddressAllocated).Message).To(Equal(
		`subnet "` + f.subnet + `" is being deleted; the Service keeps ` + addr + " and nothing new is handed out"))
	update(t, getService(g, f.ns, "dns-udp"), func(s *corev1.Service) {
		s.Spec.Ports = []corev1.ServicePort{svcPort("dns", corev1.ProtocolUDP, 53), svcPort("mdns", corev1.ProtocolUDP, 5353)}
	})
	g.Consistently(func(g Gomega) { served(g, decide.ReasonSubnetNotReady) }, 2*time.Second, 200*time.Millisecond).Should(Succeed())

	// The members let go: the Subnet goes.
	for name := range ports {
		g.Expect(k8s.Delete(ctx, getService(g, f.ns, name))).To(Succeed())
	}
	waitGone(t, sn)
}

// TestSharedAddressWokenOnlyByItsOwnObjects: a tenant of another namespace puts a shared address's
// labels, its owner's UID too, on an object of theirs and updates it 50 times: no member's pass
// runs and the operator reads nothing. A member's own pass reads nothing from the API server
// either (a member never has per-Service objects, and the cache would show one). The address's
// own lb objects still wake the members: its Deployment, deleted, comes back. Before, each update
// woke the 8 members, and each pass made 4 GETs for per-Service objects no member has.
func TestSharedAddressWokenOnlyByItsOwnObjects(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	f := newFixture(t)
	attacker := newNamespace(t)
	addr := f.ip("6")
	reqs := countRequests(t, controllers.Options{EnableLBSvc: true}, []string{f.ns, attacker}, addr)
	var owner *corev1.Service
	for i := range 8 {
		name := fmt.Sprintf("m%d", i)
		create(t, sharingService(f, name, "k", "", svcPort("p", corev1.ProtocolTCP, int32(1000+i))))
		if s := waitAddress(t, f.ns, name, addr); i == 0 {
			owner = s
		}
	}
	name := lbobjects.SharedObjectName(addr)
	d := &appsv1.Deployment{}
	g.Eventually(func(g Gomega) {
		g.Expect(getIP(g, addr).Spec.Members).To(HaveLen(8))
		g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: f.ns, Name: name}, d)).To(Succeed())
	}, timeout, interval).Should(Succeed())
	reqs.quiet(t)

	forged := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: attacker, Name: name, Labels: map[string]string{
		lbv1.ComponentLabel: lbv1.ComponentLBPod, lbobjects.ManagedByLabel: lbobjects.ManagedByValue, lbv1.SharedIPLabel: addr,
		lbv1.ServiceNamespaceLabel: f.ns, lbv1.ServiceUIDLabel: string(owner.UID)}}}
	create(t, forged)
	for i := range 50 {
		update(t, forged, func(sa *corev1.ServiceAccount) { sa.Annotations = map[string]string{"n": fmt.Sprint(i)} })
	}
	passes, gets := reqs.quiet(t)
	g.Expect(passes).To(Equal(0), "Service passes woken by the forged object")
	g.Expect(gets).To(BeEmpty())

	update(t, getService(g, f.ns, "m3"), func(s *corev1.Service) { s.Labels["touch"] = "1" })
	passes, gets = reqs.quiet(t)
	g.Expect(passes).To(Equal(1), "passes after one member's change")
	g.Expect(gets).To(BeEmpty())

	g.Expect(k8s.Delete(ctx, d)).To(Succeed())
	g.Eventually(func(g Gomega) {
		again := &appsv1.Deployment{}
		g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: f.ns, Name: name}, again)).To(Succeed())
		g.Expect(again.UID).NotTo(Equal(d.UID))
	}, timeout, interval).Should(Succeed(), "the address's Deployment, deleted, comes back")
}

// TestDynamicServiceStartsSharing: a served Service without a static request is given a sharing
// key: it joins a shared address of the key, its own lb Deployment is deleted and its old address
// drains (a member's pass asks the API server for its own objects only while it still owns an
// unshared address).
func TestDynamicServiceStartsSharing(t *testing.T) {
	g, _, f, _ := dnsPair(t)
	create(t, sharingService(f, "solo", "", "", svcPort("web", corev1.ProtocolTCP, 80)))
	waitAddress(t, f.ns, "solo", f.ip("7"))
	g.Eventually(func() error {
		return k8s.Get(context.Background(), client.ObjectKey{Namespace: f.ns, Name: "lb-svc-solo"}, &appsv1.Deployment{})
	}, timeout, interval).Should(Succeed())
	update(t, getService(g, f.ns, "solo"), func(s *corev1.Service) { s.Annotations[lbv1.AllowSharedIPAnnotation] = "dns" })
	waitAddress(t, f.ns, "solo", f.ip("6"))
	g.Eventually(func(g Gomega) {
		g.Expect(members(g, f.ip("6"))).To(Equal([]string{"dns-tcp:TCP/53", "dns-udp:UDP/53", "solo:TCP/80"}))
	}, timeout, interval).Should(Succeed())
	waitGone(t, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "lb-svc-solo"}})
	waitGone(t, &lbv1.IP{ObjectMeta: metav1.ObjectMeta{Name: f.ip("7")}})
}

// TestStaticServiceStartsAndStopsSharing: a Service with a static address starts sharing it
// (lbsvc.io/allow-shared-ip added), then stops. Its unshared lb Deployment and the address's
// shared one are different Deployments, which must not hold the address at once: each time it
// drains from the lb pods that hold it (AddressDraining, saying why), then the Service claims it
// again, as the other kind. It is never refused as in use "by another Service" (itself), as it
// was before.
func TestStaticServiceStartsAndStopsSharing(t *testing.T) {
	g := NewWithT(t)
	f := newFixture(t)
	addr := f.ip("9")
	create(t, sharingService(f, "solo", "", addr, svcPort("web", corev1.ProtocolTCP, 80)))
	waitAddress(t, f.ns, "solo", addr)
	g.Eventually(func() error {
		return k8s.Get(context.Background(), client.ObjectKey{Namespace: f.ns, Name: "lb-svc-solo"}, &appsv1.Deployment{})
	}, timeout, interval).Should(Succeed())

	update(t, getService(g, f.ns, "solo"), func(s *corev1.Service) { s.Annotations[lbv1.AllowSharedIPAnnotation] = "dns" })
	g.Eventually(func(g Gomega) {
		g.Expect(getIP(g, addr).Spec.SharingKey).To(Equal("dns"))
		g.Expect(members(g, addr)).To(Equal([]string{"solo:TCP/80"}))
	}, timeout, interval).Should(Succeed())
	waitAddress(t, f.ns, "solo", addr)
	waitGone(t, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "lb-svc-solo"}})
	g.Expect(warningMessages(t, f.ns, "solo", decide.ReasonAddressInUse)).To(BeEmpty())
	g.Eventually(func() []string { return warningMessages(t, f.ns, "solo", decide.ReasonAddressDraining) }, timeout, interval).Should(ContainElement(
		addr + `, held unshared, is asked for shared under the key "dns": it drains from the lb pods that hold it now, then this Service claims it again (kubectl get ip ` + addr + ")"))

	update(t, getService(g, f.ns, "solo"), func(s *corev1.Service) { delete(s.Annotations, lbv1.AllowSharedIPAnnotation) })
	g.Eventually(func(g Gomega) { g.Expect(getIP(g, addr).Spec.SharingKey).To(BeEmpty()) }, timeout, interval).Should(Succeed())
	waitAddress(t, f.ns, "solo", addr)
	g.Eventually(func() error {
		return k8s.Get(context.Background(), client.ObjectKey{Namespace: f.ns, Name: "lb-svc-solo"}, &appsv1.Deployment{})
	}, timeout, interval).Should(Succeed())
	g.Expect(warningMessages(t, f.ns, "solo", decide.ReasonAddressInUse)).To(BeEmpty())
}

// dnsPair is a new fixture whose Services dns-tcp (TCP/53) and dns-udp (UDP/53) share the
// Subnet's first address under the key "dns"; it returns dns-tcp, the address's owner.
func dnsPair(t *testing.T) (Gomega, context.Context, fixture, *corev1.Service) {
	t.Helper()
	f := newFixture(t)
	create(t, sharingService(f, "dns-tcp", "dns", "", svcPort("dns", corev1.ProtocolTCP, 53)))
	a := waitAddress(t, f.ns, "dns-tcp", f.ip("6"))
	create(t, sharingService(f, "dns-udp", "dns", "", svcPort("dns", corev1.ProtocolUDP, 53)))
	waitAddress(t, f.ns, "dns-udp", f.ip("6"))
	return NewWithT(t), context.Background(), f, a
}

// TestSharedAddressMovesToTheLBPodNamespace: a shared address served by a run without
// --lb-pod-namespace, then by one with it. The address's lb objects left in the owner's namespace
// are deleted, and its lb Deployment in the lb pod namespace is created only once its pods there
// are gone (a pod object stands in: no kubelet here), as for a Service's own lb pods: two sets of
// lb pods, with keys of their own, would hold the address at once.
func TestSharedAddressMovesToTheLBPodNamespace(t *testing.T) {
	g, ctx, f, owner := dnsPair(t)
	addr := f.ip("6")
	name := lbobjects.SharedObjectName(addr)
	old := client.ObjectKey{Namespace: f.ns, Name: name}
	g.Eventually(func() error { return k8s.Get(ctx, old, &appsv1.Deployment{}) }, timeout, interval).Should(Succeed())
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-x", Namespace: f.ns, Labels: map[string]string{
			lbv1.ComponentLabel: lbv1.ComponentLBPod, lbobjects.ManagedByLabel: lbobjects.ManagedByValue,
			lbv1.SharedIPLabel: addr, lbv1.ServiceNamespaceLabel: f.ns, lbv1.ServiceUIDLabel: string(owner.UID), lbv1.IPv4Label: addr}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: image}}},
	}
	create(t, pod)
	g.Eventually(func(g Gomega) {
		g.Expect(getIP(g, addr).Status.Holders).To(ContainElement(HaveField("Pod", f.ns+"/"+pod.Name)))
	}, timeout, interval).Should(Succeed(), "the IP object lists the lb pod as a holder")

	system := newNamespace(t)
	restartWithLBPodNamespace(t, system)
	moved := client.ObjectKey{Namespace: system, Name: name}
	g.Eventually(func() bool { return apierrors.IsNotFound(k8s.Get(ctx, old, &appsv1.Deployment{})) }, timeout, interval).Should(BeTrue())
	g.Consistently(func() bool { return apierrors.IsNotFound(k8s.Get(ctx, moved, &appsv1.Deployment{})) }, 2*time.Second, interval).
		Should(BeTrue(), "the lb Deployment in the lb pod namespace while the address's lb pod still runs in the old one")
	g.Expect(k8s.Delete(ctx, pod, client.GracePeriodSeconds(0))).To(Succeed())
	g.Eventually(func() error { return k8s.Get(ctx, moved, &appsv1.Deployment{}) }, timeout, interval).Should(Succeed())
	g.Expect(ingressIPs(getService(g, f.ns, "dns-tcp"))).To(Equal([]string{addr}))
	g.Expect(ingressIPs(getService(g, f.ns, "dns-udp"))).To(Equal([]string{addr}))

	// Once the IP object no longer lists the owner's namespace, a pod forged there by its tenant
	// (our labels, the address, the owner's UID) holds nothing back: the address's Deployment,
	// deleted, comes back.
	g.Eventually(func(g Gomega) {
		g.Expect(getIP(g, addr).Status.Holders).NotTo(ContainElement(HaveField("Pod", HavePrefix(f.ns+"/"))))
	}, timeout, interval).Should(Succeed())
	forged := pod.DeepCopy()
	forged.ObjectMeta = metav1.ObjectMeta{Name: "forged", Namespace: f.ns, Labels: pod.Labels}
	create(t, forged)
	d := &appsv1.Deployment{}
	g.Expect(k8s.Get(ctx, moved, d)).To(Succeed())
	g.Expect(k8s.Delete(ctx, d)).To(Succeed())
	update(t, getService(g, f.ns, "dns-udp"), func(s *corev1.Service) { s.Labels["touch"] = "1" })
	g.Eventually(func(g Gomega) {
		again := &appsv1.Deployment{}
		g.Expect(k8s.Get(ctx, moved, again)).To(Succeed())
		g.Expect(again.UID).NotTo(Equal(d.UID))
	}, timeout, interval).Should(Succeed(), "the address's Deployment recreated despite the forged pod")
}
