//go:build integration

package integration

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lbsvc/lbsvc-operator/controllers/decide"
	"github.com/lbsvc/lbsvc-operator/controllers/lbobjects"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
	"github.com/lbsvc/lbsvc-operator/controllers"
)

// lbPodObject stands in for an lb pod of svc that still holds addr: envtest has no kubelet, so a
// pod object with the labels of svc's lb pods (ours, svc's UID, the address) in svc's namespace
// is what the drain must wait for (the operator reads pods only). With node set the pod is bound
// there, so that deleting it waits for a kubelet that never comes (like a pod on a powered-off
// node) until it is force-deleted.
func lbPodObject(t *testing.T, svc *corev1.Service, name, addr, node string) *corev1.Pod {
	t.Helper()
	return lbPodObjectIn(t, svc.Namespace, svc, name, addr, node)
}

// lbPodObjectIn is lbPodObject in namespace ns (an lb pod namespace).
func lbPodObjectIn(t *testing.T, ns string, svc *corev1.Service, name, addr, node string) *corev1.Pod {
	t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{
			lbv1.ComponentLabel: lbv1.ComponentLBPod, lbobjects.ManagedByLabel: lbobjects.ManagedByValue,
			lbv1.ServiceUIDLabel: string(svc.UID), lbv1.IPv4Label: addr}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: image}}},
	}
	create(t, p)
	return p
}

func getIP(g Gomega, name string) *lbv1.IP {
	ip := &lbv1.IP{}
	g.Expect(k8s.Get(context.Background(), client.ObjectKey{Name: name}, ip)).To(Succeed())
	return ip
}

// waitDraining waits until the IP object of addr is Draining (deleted, held by its finalizer).
func waitDraining(t *testing.T, addr string) *lbv1.IP {
	t.Helper()
	var ip *lbv1.IP
	NewWithT(t).Eventually(func(g Gomega) {
		ip = getIP(g, addr)
		g.Expect(ip.DeletionTimestamp).NotTo(BeNil())
		g.Expect(ip.Status.Phase).To(Equal(lbv1.IPDraining))
	}, timeout, interval).Should(Succeed())
	return ip
}

func forceDelete(t *testing.T, obj client.Object) {
	t.Helper()
	if err := k8s.Delete(context.Background(), obj, client.GracePeriodSeconds(0)); err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("delete %s: %v", obj.GetName(), err)
	}
	waitGone(t, obj)
}

// An address is handed out again only when no lb pod that could hold it exists: after the
// Service is deleted, after it moves to another address, and after it is refused.
func TestDrainBeforeRelease(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	f := newFixture(t)

	t.Run("service deleted", func(t *testing.T) {
		first := lbService(f.ns, "first", f.provider, f.ip("50"))
		create(t, first)
		waitAddress(t, f.ns, "first", f.ip("50"))
		pod := lbPodObject(t, first, "lb-first-pod", f.ip("50"), "")
		g.Expect(k8s.Delete(ctx, getService(g, f.ns, "first"))).To(Succeed())
		ip := waitDraining(t, f.ip("50"))
		g.Eventually(func(g Gomega) {
			g.Expect(getIP(g, ip.Name).Status.Holders).To(Equal([]lbv1.IPHolder{{Pod: f.ns + "/lb-first-pod"}}))
		}, timeout, interval).Should(Succeed())

		create(t, lbService(f.ns, "next", f.provider, f.ip("50")))
		waitRefused(t, f.ns, "next", decide.ReasonAddressDraining)
		g.Consistently(func(g Gomega) {
			g.Expect(ingressIPs(getService(g, f.ns, "next"))).To(BeEmpty())
		}, time.Second, 200*time.Millisecond).Should(Succeed())

		forceDelete(t, pod)
		waitAddress(t, f.ns, "next", f.ip("50"))
		g.Expect(getIP(g, f.ip("50")).Spec.Service.Name).To(Equal("next"))
	})

	t.Run("address moved", func(t *testing.T) {
		mover := lbService(f.ns, "mover", f.provider, f.ip("60"))
		create(t, mover)
		waitAddress(t, f.ns, "mover", f.ip("60"))
		pod := lbPodObject(t, mover, "lb-mover-old", f.ip("60"), "")
		update(t, mover, func(s *corev1.Service) { s.Spec.LoadBalancerIP = f.ip("61") })
		waitAddress(t, f.ns, "mover", f.ip("61"))
		waitDraining(t, f.ip("60"))
		create(t, lbService(f.ns, "taker", f.provider, f.ip("60")))
		waitRefused(t, f.ns, "taker", decide.ReasonAddressDraining)
		forceDelete(t, pod)
		waitAddress(t, f.ns, "taker", f.ip("60"))
	})

	t.Run("refused, holder on a NotReady node", func(t *testing.T) {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "dead-" + suffix()}}
		create(t, node)
		t.Cleanup(func() { _ = k8s.Delete(context.Background(), node) })
		node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionUnknown,
			Reason: "NodeStatusUnknown", LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
		g.Expect(k8s.Status().Update(ctx, node)).To(Succeed())

		victim := lbService(f.ns, "victim", f.provider, f.ip("70"))
		create(t, victim)
		waitAddress(t, f.ns, "victim", f.ip("70"))
		pod := lbPodObject(t, victim, "lb-victim-pod", f.ip("70"), node.Name)
		// Deleting a pod bound to a node waits for its kubelet: it stays Terminating, as on a
		// powered-off node.
		g.Expect(k8s.Delete(ctx, pod)).To(Succeed())

		// The Service is refused (its namespace is no longer allowed): the address drains.
		sn := &lbv1.Subnet{}
		g.Expect(k8s.Get(ctx, client.ObjectKey{Name: f.subnet}, sn)).To(Succeed())
		update(t, sn, func(s *lbv1.Subnet) { s.Spec.Namespaces = []string{"somewhere-else"} })
		waitRefused(t, f.ns, "victim", decide.ReasonNamespaceNotAllowed)
		g.Eventually(func(g Gomega) {
			err := k8s.Get(ctx, client.ObjectKey{Namespace: f.ns, Name: "lb-svc-victim"}, &appsv1.Deployment{})
			g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "the refused Service's Deployment must go: %v", err)
		}, timeout, interval).Should(Succeed())
		ip := waitDraining(t, f.ip("70"))
		g.Eventually(func(g Gomega) {
			ip = getIP(g, ip.Name)
			g.Expect(ip.Status.Node).To(Equal(node.Name))
			g.Expect(ip.Status.Message).To(ContainSubstring("pod " + f.ns + "/lb-victim-pod on node " + node.Name + ", which is not Ready"))
			g.Expect(ip.Status.Message).To(ContainSubstring("--force --grace-period=0"))
		}, timeout, interval).Should(Succeed())
		g.Eventually(func() []string { return warningReasons(t, "default", ip.Name) }, timeout, interval).
			Should(ContainElement(decide.ReasonDrainBlocked))
		update(t, sn, func(s *lbv1.Subnet) { s.Spec.Namespaces = nil })
		// Allowed again, the Service asks for its address back: it is still draining.
		waitRefused(t, f.ns, "victim", decide.ReasonAddressDraining)
		g.Consistently(func(g Gomega) {
			g.Expect(getIP(g, ip.Name).DeletionTimestamp).NotTo(BeNil())
		}, 2*time.Second, 250*time.Millisecond).Should(Succeed())

		forceDelete(t, pod)
		waitAddress(t, f.ns, "victim", f.ip("70"))
	})
}

// Services of another load balancer (a foreign class, or class-less without our annotation),
// carrying the cloud-provider cleanup finalizer and a hostname ingress, are never touched: not
// on create, update, our restart, nor deletion.
func TestForeignServicesUntouched(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	f := newFixture(t)
	foreign := lbService(f.ns, "metallb", f.provider, "")
	foreign.Spec.LoadBalancerClass = ptr.To("metallb.io/l2")
	plain := lbService(f.ns, "cloud", "", "")
	for _, s := range []*corev1.Service{foreign, plain} {
		s.Finalizers = []string{lbv1.CleanupFinalizer}
		create(t, s)
		s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{Hostname: "lb.example.com"}, {IP: f.ip("200")}}
		g.Expect(k8s.Status().Update(ctx, s)).To(Succeed())
	}
	check := func(g Gomega) {
		for _, n := range []string{"metallb", "cloud"} {
			s := getService(g, f.ns, n)
			g.Expect(s.Finalizers).To(Equal([]string{lbv1.CleanupFinalizer}), n)
			g.Expect(s.Status.LoadBalancer.Ingress).To(HaveLen(2), n)
			g.Expect(s.Status.Conditions).To(BeEmpty(), n)
			g.Expect(s.Annotations).NotTo(HaveKey(lbv1.AllocatedIPsAnnotation), n)
		}
	}
	g.Consistently(check, time.Second, 200*time.Millisecond).Should(Succeed())
	update(t, foreign, func(s *corev1.Service) { s.Spec.Ports[0].Port = 81 })
	startOperator(true)
	for _, s := range []*corev1.Service{foreign, plain} {
		g.Expect(k8s.Delete(ctx, s)).To(Succeed())
	}
	g.Consistently(check, 2*time.Second, 250*time.Millisecond).Should(Succeed())
	g.Expect(events(t, f.ns, "metallb")).To(BeEmpty())
	g.Expect(events(t, f.ns, "cloud")).To(BeEmpty())
	for _, s := range []*corev1.Service{foreign, plain} {
		update(t, s, func(s *corev1.Service) { s.Finalizers = nil })
		waitGone(t, s)
	}
}

// A tenant's Deployment at our name for a Service of another load balancer, carrying our labels
// and that Service's UID (what a Deployment a killed operator left behind carries): the operator
// deletes that Deployment (at our name, in the tenant's own namespace), but its labels prove
// nothing about the Service, whose cleanup finalizer (the same one any load balancer controller
// puts) stays.
func TestForgedLeftDeploymentTakesNoFinalizer(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	f := newFixture(t)
	_, real := servedWeb(t, f, f.ip("94"))
	foreign := lbService(f.ns, "metallb", f.provider, "")
	foreign.Spec.LoadBalancerClass = ptr.To("metallb.io/l2")
	foreign.Finalizers = []string{lbv1.CleanupFinalizer}
	create(t, foreign)

	forged := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: lbobjects.ObjectNameIn("", f.ns, "metallb"),
		Labels: map[string]string{}}, Spec: *real.Spec.DeepCopy()}
	for k, v := range real.Labels {
		forged.Labels[k] = v
	}
	forged.Labels[lbv1.ServiceUIDLabel] = string(foreign.UID)
	forged.Labels[lbv1.ServiceLabel] = "metallb"
	create(t, forged)
	waitGone(t, forged)

	s := getService(g, f.ns, "metallb")
	g.Expect(s.Finalizers).To(Equal([]string{lbv1.CleanupFinalizer}))
	g.Expect(s.Status.Conditions).To(BeEmpty())
	g.Expect(k8s.Delete(ctx, s)).To(Succeed())
	g.Consistently(func(g Gomega) {
		g.Expect(getService(g, f.ns, "metallb").Finalizers).To(Equal([]string{lbv1.CleanupFinalizer}))
	}, time.Second, 200*time.Millisecond).Should(Succeed())
	update(t, s, func(s *corev1.Service) { s.Finalizers = nil })
	waitGone(t, s)
}

// Hand edits to the fields we own are reverted; an object in the way that is not ours is reported
// and left alone.
func TestDesiredStateEnforced(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	f := newFixture(t)
	create(t, lbService(f.ns, "web", f.provider, ""))
	waitAddress(t, f.ns, "web", f.ip("6"))
	key := client.ObjectKey{Namespace: f.ns, Name: "lb-svc-web"}
	d := &appsv1.Deployment{}
	g.Eventually(func() error { return k8s.Get(ctx, key, d) }, timeout, interval).Should(Succeed())
	want := d.Spec.Template.Spec.Containers[0]

	update(t, d, func(d *appsv1.Deployment) {
		c := &d.Spec.Template.Spec.Containers[0]
		c.Image = "evil/image:latest"
		c.SecurityContext.Capabilities.Add = append(c.SecurityContext.Capabilities.Add, "SYS_ADMIN")
		for i := range c.Env {
			if c.Env[i].Name == lbv1.EnvAddresses {
				c.Env[i].Value = f.ip("99") + "/24"
			}
		}
		delete(d.Labels, lbv1.ComponentLabel)
	})
	g.Eventually(func(g Gomega) {
		cur := &appsv1.Deployment{}
		g.Expect(k8s.Get(ctx, key, cur)).To(Succeed())
		c := cur.Spec.Template.Spec.Containers[0]
		g.Expect(c.Image).To(Equal(want.Image))
		g.Expect(c.SecurityContext.Capabilities.Add).To(ConsistOf(corev1.Capability("NET_ADMIN"), corev1.Capability("NET_RAW")))
		g.Expect(c.Env).To(ContainElement(corev1.EnvVar{Name: lbv1.EnvAddresses, Value: f.ip("6") + "/24"}))
		g.Expect(cur.Labels).To(HaveKeyWithValue(lbv1.ComponentLabel, lbv1.ComponentLBPod))
	}, timeout, interval).Should(Succeed())

	// Additions alone (nothing we own changed): server-side apply would keep them, as it keeps
	// fields other managers own; the pod template is replaced whole.
	update(t, d, func(d *appsv1.Deployment) {
		c := &d.Spec.Template.Spec.Containers[0]
		c.SecurityContext.Capabilities.Add = append(c.SecurityContext.Capabilities.Add, "SYS_ADMIN")
		c.Env = append(c.Env, corev1.EnvVar{Name: "EXTRA", Value: "1"})
		d.Spec.Template.Spec.HostNetwork = true
	})
	g.Eventually(func(g Gomega) {
		cur := &appsv1.Deployment{}
		g.Expect(k8s.Get(ctx, key, cur)).To(Succeed())
		c := cur.Spec.Template.Spec.Containers[0]
		g.Expect(c.SecurityContext.Capabilities.Add).To(ConsistOf(corev1.Capability("NET_ADMIN"), corev1.Capability("NET_RAW")))
		g.Expect(c.Env).To(HaveLen(len(want.Env)))
		g.Expect(cur.Spec.Template.Spec.HostNetwork).To(BeFalse())
	}, timeout, interval).Should(Succeed())

	// A Deployment named like ours but not ours: reported, never taken over.
	other := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "lb-svc-squatted", Namespace: f.ns},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "mine"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "mine"}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "mine:1"}}},
			},
		},
	}
	create(t, other)
	create(t, lbService(f.ns, "squatted", f.provider, ""))
	svc := waitRefused(t, f.ns, "squatted", decide.ReasonObjectConflict)
	g.Expect(findCondition(svc.Status.Conditions, decide.ConditionAddressAllocated).Message).
		To(Equal("Deployment " + f.ns + "/lb-svc-squatted exists and was not created by lbsvc-operator for this Service; delete or rename it"))
	cur := &appsv1.Deployment{}
	g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(other), cur)).To(Succeed())
	g.Expect(cur.Spec.Template.Spec.Containers[0].Image).To(Equal("mine:1"))
	g.Expect(cur.Generation).To(Equal(int64(1)))
	// Its claim drained: no IP object names it.
	g.Eventually(func(g Gomega) {
		var ips lbv1.IPList
		g.Expect(k8s.List(ctx, &ips)).To(Succeed())
		for _, ip := range ips.Items {
			g.Expect(ip.Spec.Service.Name == "squatted" && ip.DeletionTimestamp == nil).To(BeFalse(), "bound claim %s", ip.Name)
		}
	}, timeout, interval).Should(Succeed())
	// Once the squatter is gone, the Service is served.
	g.Expect(k8s.Delete(ctx, other)).To(Succeed())
	g.Eventually(func(g Gomega) {
		g.Expect(ingressIPs(getService(g, f.ns, "squatted"))).To(HaveLen(1))
	}, 2*timeout, interval).Should(Succeed())
}

// Two operator processes running at once without leader election, 100 Services created at once
// with overlapping static requests: the API server arbitrates every address, so no address is
// held or published by two Services, and every IP object has exactly one owner.
func TestTwoOperatorsNoLeaderElection(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	f := newFixture(t)
	second := newOperator(controllers.Options{EnableLBSvc: true})
	t.Cleanup(second.stop)

	const n = 100
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			ip := ""
			if i%2 == 0 {
				ip = f.ip(fmt.Sprint(100 + i%30)) // 50 Services ask for 15 addresses
			}
			create(t, lbService(f.ns, fmt.Sprintf("s%03d", i), f.provider, ip))
		}(i)
	}
	wg.Wait()
	g.Eventually(func(g Gomega) {
		var list corev1.ServiceList
		g.Expect(k8s.List(ctx, &list, client.InNamespace(f.ns))).To(Succeed())
		settled := 0
		for _, s := range list.Items {
			c := findCondition(s.Status.Conditions, decide.ConditionAddressAllocated)
			if c != nil && (c.Status == metav1.ConditionTrue || c.Reason == decide.ReasonAddressInUse) {
				settled++
			}
		}
		g.Expect(settled).To(Equal(n))
	}, 60*time.Second, 250*time.Millisecond).Should(Succeed())
	// Let both operators settle any double claim they raced into.
	g.Eventually(func(g Gomega) { checkOneHolder(g, f, n) }, 30*time.Second, 500*time.Millisecond).Should(Succeed())
	g.Consistently(func(g Gomega) { checkOneHolder(g, f, n) }, 2*time.Second, 500*time.Millisecond).Should(Succeed())
}

// checkOneHolder: every published address is published once, by the owner of its bound IP
// object; every bound IP object's owner exists and publishes it; 50 dynamic + 15 static winners.
func checkOneHolder(g Gomega, f fixture, n int) {
	ctx := context.Background()
	var list corev1.ServiceList
	g.Expect(k8s.List(ctx, &list, client.InNamespace(f.ns))).To(Succeed())
	var ips lbv1.IPList
	g.Expect(k8s.List(ctx, &ips)).To(Succeed())
	bound := map[string]string{}
	for _, ip := range ips.Items {
		if ip.Spec.Service.Namespace != f.ns || ip.DeletionTimestamp != nil {
			continue
		}
		bound[ip.Spec.Address] = ip.Spec.Service.Name
	}
	published := map[string]string{}
	served := 0
	for _, s := range list.Items {
		addrs := ingressIPs(&s)
		g.Expect(len(addrs)).To(BeNumerically("<=", 1), s.Name)
		for _, a := range addrs {
			g.Expect(published).NotTo(HaveKey(a), "%s published by %s and %s", a, published[a], s.Name)
			published[a] = s.Name
			g.Expect(bound[a]).To(Equal(s.Name), "%s published by %s but bound to %q", a, s.Name, bound[a])
			served++
		}
	}
	g.Expect(len(bound)).To(Equal(served), "bound IP objects %d, published addresses %d", len(bound), served)
	g.Expect(served).To(Equal(n/2 + 15))
}

// A Subnet's namespace rule holds for everything the operator hands out or adopts, even when a
// tenant forges our annotations on an old Service and the operator restarts.
func TestForgedAnnotationsAdoptNothing(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	f := newFixture(t)
	create(t, lbService(f.ns, "victim", f.provider, ""))
	waitAddress(t, f.ns, "victim", f.ip("6"))

	// A tenant elsewhere, older than nothing but with our annotations written by hand, its
	// Subnet restricted away from it.
	other := newNamespace(t)
	forger := lbService(other, "forger", f.provider, "")
	forger.Spec.Type = corev1.ServiceTypeClusterIP
	forger.Annotations[lbv1.AllocatedIPsAnnotation] = f.ip("6")
	forger.Annotations[lbv1.AllocatedSubnetAnnotation] = f.subnet
	create(t, forger)
	sn := &lbv1.Subnet{}
	g.Expect(k8s.Get(ctx, client.ObjectKey{Name: f.subnet}, sn)).To(Succeed())
	update(t, sn, func(s *lbv1.Subnet) { s.Spec.Namespaces = []string{f.ns} })

	stopOperator()
	startOperator(true)
	update(t, forger, func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeLoadBalancer })
	waitRefused(t, other, "forger", decide.ReasonNamespaceNotAllowed)
	g.Consistently(func(g Gomega) {
		g.Expect(ingressIPs(getService(g, f.ns, "victim"))).To(Equal([]string{f.ip("6")}))
		g.Expect(getIP(g, f.ip("6")).Spec.Service.Name).To(Equal("victim"))
		g.Expect(getService(g, other, "forger").Status.LoadBalancer.Ingress).To(BeEmpty())
	}, 2*time.Second, 250*time.Millisecond).Should(Succeed())
	// Nor does the forged annotation keep the Subnet alive: deleting it waits only for victim.
	g.Expect(k8s.Delete(ctx, getService(g, f.ns, "victim"))).To(Succeed())
	g.Expect(k8s.Delete(ctx, sn)).To(Succeed())
	waitGone(t, sn)
}

// Adoption at start (the allocations of a release without IP objects) takes only Services we
// serve whose annotation equals the ingress, from a Subnet that holds the address: another
// controller's Service with our annotations copied beside its ingress keeps its ingress and
// finalizer, and a Subnet name no IP object could carry does not stop the operator's start (it
// did: the refused create failed the address book, and with it the manager, at every start).
func TestAdoptionTakesOnlyOurs(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	f := newFixture(t)
	stopOperator()
	withStatus := func(svc *corev1.Service, ip, subnet string) *corev1.Service {
		svc.Annotations[lbv1.AllocatedIPsAnnotation], svc.Annotations[lbv1.AllocatedSubnetAnnotation] = ip, subnet
		create(t, svc)
		svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: ip}}
		g.Expect(k8s.Status().Update(ctx, svc)).To(Succeed())
		return svc
	}
	// Served by the release before IP objects: adopted.
	old := withStatus(lbService(f.ns, "old", f.provider, ""), f.ip("20"), f.subnet)
	// Another load balancer's (MetalLB's class): its ingress and finalizer are not ours.
	foreign := lbService(f.ns, "foreign", f.provider, "")
	foreign.Spec.LoadBalancerClass = ptr.To("metallb.io/l2")
	foreign.Finalizers = []string{"service.kubernetes.io/load-balancer-cleanup"}
	foreign = withStatus(foreign, f.ip("21"), f.subnet)
	// Ours, but the Subnet it names is one no IP object can carry.
	withStatus(lbService(f.ns, "long", f.provider, ""), f.ip("22"), strings.Repeat("n", 254))

	startOperator(true)
	g.Eventually(func(g Gomega) {
		g.Expect(getIP(g, f.ip("20")).Spec.Service.UID).To(Equal(string(old.UID)))
	}, timeout, interval).Should(Succeed())
	// Running: a new Service is served, and long gets an address of its own.
	create(t, lbService(f.ns, "new", f.provider, ""))
	g.Eventually(func(g Gomega) {
		g.Expect(ingressIPs(getService(g, f.ns, "new"))).To(HaveLen(1))
		g.Expect(ingressIPs(getService(g, f.ns, "long"))).To(HaveLen(1))
	}, timeout, interval).Should(Succeed())
	g.Consistently(func(g Gomega) {
		s := getService(g, f.ns, "foreign")
		g.Expect(ingressIPs(s)).To(Equal([]string{f.ip("21")}))
		g.Expect(s.Finalizers).To(Equal([]string{"service.kubernetes.io/load-balancer-cleanup"}))
		g.Expect(apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKey{Name: f.ip("21")}, &lbv1.IP{}))).To(BeTrue(), "an IP object for another controller's address")
		g.Expect(ingressIPs(getService(g, f.ns, "old"))).To(Equal([]string{f.ip("20")}))
	}, 2*time.Second, 250*time.Millisecond).Should(Succeed())
	g.Expect(k8s.Delete(ctx, foreign)).To(Succeed())
	g.Expect(k8s.Patch(ctx, foreign, client.RawPatch(types.JSONPatchType, []byte(`[{"op":"remove","path":"/metadata/finalizers"}]`)))).To(Succeed())
}

// --lb-pod-namespace: the Deployment and ServiceAccount live in the system namespace (tenants
// cannot edit or exec into the pod that holds an address), the RoleBinding beside the
// Service; cleanup works without owner references.
func TestLBPodNamespace(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	system := newNamespace(t)

	// A Service served beside itself first; its lb pod (a pod object here) still runs when the
	// operator comes back with --lb-pod-namespace.
	pre := newFixture(t)
	create(t, lbService(pre.ns, "moved", pre.provider, ""))
	moved := waitAddress(t, pre.ns, "moved", pre.ip("6"))
	old := &appsv1.Deployment{}
	g.Eventually(func() error {
		return k8s.Get(ctx, client.ObjectKey{Namespace: pre.ns, Name: "lb-svc-moved"}, old)
	}, timeout, interval).Should(Succeed())
	oldPod := lbPodObject(t, moved, "lb-moved-old", pre.ip("6"), "")

	restartWithLBPodNamespace(t, system)
	f := newFixture(t)
	svc := lbService(f.ns, "web", f.provider, "")
	create(t, svc)
	svc = waitAddress(t, f.ns, "web", f.ip("6"))
	name := lbobjects.ObjectNameIn(system, f.ns, "web")
	d := &appsv1.Deployment{}
	g.Eventually(func() error { return k8s.Get(ctx, client.ObjectKey{Namespace: system, Name: name}, d) }, timeout, interval).Should(Succeed())
	g.Expect(d.OwnerReferences).To(BeEmpty())
	// The lb pods of f.ns's Services share the ServiceAccount lbsvc-lbpod-<f.ns> in the lb pod
	// namespace, bound in f.ns only, owned by no Service.
	identity := lbobjects.IdentityName(system, f.ns)
	g.Expect(identity).To(Equal("lbsvc-lbpod-" + f.ns))
	g.Expect(d.Spec.Template.Spec.ServiceAccountName).To(Equal(identity))
	g.Expect(d.Spec.Template.Labels).To(HaveKeyWithValue(lbv1.IPv4Label, f.ip("6")))
	g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: system, Name: identity}, &corev1.ServiceAccount{})).To(Succeed())
	rb := &rbacv1.RoleBinding{}
	g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: f.ns, Name: identity}, rb)).To(Succeed())
	g.Expect(rb.Subjects).To(Equal([]rbacv1.Subject{{Kind: "ServiceAccount", Name: identity, Namespace: system}}))
	g.Expect(rb.OwnerReferences).To(BeEmpty())
	g.Expect(apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKey{Namespace: system, Name: name}, &corev1.ServiceAccount{}))).
		To(BeTrue(), "no ServiceAccount of the Service's own")

	// The moved Service: its old Deployment goes, and the new one waits until the old pod is
	// gone, since both would hold the same address.
	newName := lbobjects.ObjectNameIn(system, pre.ns, "moved")
	g.Eventually(func() bool {
		return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKeyFromObject(old), &appsv1.Deployment{}))
	}, timeout, interval).Should(BeTrue())
	g.Consistently(func() bool {
		return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKey{Namespace: system, Name: newName}, &appsv1.Deployment{}))
	}, time.Second, 200*time.Millisecond).Should(BeTrue())
	forceDelete(t, oldPod)
	g.Eventually(func() error {
		return k8s.Get(ctx, client.ObjectKey{Namespace: system, Name: newName}, &appsv1.Deployment{})
	}, timeout, interval).Should(Succeed())

	g.Expect(k8s.Delete(ctx, svc)).To(Succeed())
	waitGone(t, svc)
	g.Eventually(func(g Gomega) {
		err := k8s.Get(ctx, client.ObjectKey{Namespace: system, Name: name}, &appsv1.Deployment{})
		g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "deployment: %v", err)
	}, timeout, interval).Should(Succeed())
	// The namespace's identity stays for its next Service.
	g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: system, Name: identity}, &corev1.ServiceAccount{})).To(Succeed())
}

// The operator's metrics follow the story: a Subnet's used, available and draining gauges, the
// allocations counter.
func TestOperatorMetrics(t *testing.T) {
	g := NewWithT(t)
	f := newFixture(t)
	create(t, lbService(f.ns, "m1", f.provider, ""))
	m1 := waitAddress(t, f.ns, "m1", f.ip("6"))
	gauge := func(g Gomega, state string) float64 {
		mfs, err := metrics.Registry.Gather()
		g.Expect(err).NotTo(HaveOccurred())
		for _, mf := range mfs {
			if mf.GetName() != "lbsvc_subnet_addresses" {
				continue
			}
			for _, m := range mf.GetMetric() {
				l := map[string]string{}
				for _, p := range m.GetLabel() {
					l[p.GetName()] = p.GetValue()
				}
				if l["subnet"] == f.subnet && l["family"] == "IPv4" && l["state"] == state {
					return m.GetGauge().GetValue()
				}
			}
		}
		return -1
	}
	g.Eventually(func(g Gomega) {
		g.Expect(gauge(g, "used")).To(Equal(1.0))
		g.Expect(gauge(g, "available")).To(Equal(248.0))
		g.Expect(gauge(g, "draining")).To(Equal(0.0))
	}, timeout, interval).Should(Succeed())
	mfs, err := metrics.Registry.Gather()
	g.Expect(err).NotTo(HaveOccurred())
	names := map[string]bool{}
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}
	g.Expect(names).To(HaveKey("lbsvc_allocations_total"))
	g.Expect(names).To(HaveKey("lbsvc_services"))
	g.Expect(names).To(HaveKey("lbsvc_drain_seconds"))
	pod := lbPodObject(t, m1, "lb-m1-pod", f.ip("6"), "")
	g.Expect(k8s.Delete(context.Background(), getService(g, f.ns, "m1"))).To(Succeed())
	g.Eventually(func(g Gomega) { g.Expect(gauge(g, "draining")).To(Equal(1.0)) }, timeout, interval).Should(Succeed())
	forceDelete(t, pod)
	g.Eventually(func(g Gomega) {
		g.Expect(gauge(g, "used")).To(Equal(0.0))
		g.Expect(gauge(g, "draining")).To(Equal(0.0))
		g.Expect(gauge(g, "available")).To(Equal(249.0))
	}, timeout, interval).Should(Succeed())
}

// Issue 22, drain squatting: a tenant of another namespace (team-b) puts a Service's address
// label on a zero-replica Deployment and on a pod, with our component and managed-by labels and
// the victim Service's own UID (the strongest forgery a tenant can write). None of it holds the
// address: the victim's IP object lists only its own lb pod, the drain waits for that pod alone,
// the address is released and handed to the next Service that asks for it, and a Warning Event
// on the IP object names team-b's objects. The operator leaves them alone.
func TestSquattersInAnotherNamespaceHoldNoAddress(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	f := newFixture(t)
	addr := f.ip("80")
	seen := watchIPStatus(t, addr)

	web := lbService(f.ns, "web", f.provider, addr)
	create(t, web)
	waitAddress(t, f.ns, "web", addr)
	// The Service's pass has applied its objects: no later pass of it is under way.
	g.Eventually(func() error {
		return k8s.Get(ctx, client.ObjectKey{Namespace: f.ns, Name: "lb-svc-web"}, &appsv1.Deployment{})
	}, timeout, interval).Should(Succeed())
	ourPod := lbPodObject(t, web, "lb-web-pod", addr, "")
	ours := []lbv1.IPHolder{{Pod: f.ns + "/lb-web-pod"}}
	victim := &lbv1.IP{}
	g.Eventually(func(g Gomega) {
		victim = getIP(g, addr)
		g.Expect(victim.Status.Holders).To(Equal(ours))
	}, timeout, interval).Should(Succeed())

	const teamB = "team-b"
	if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: teamB}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create namespace %s: %v", teamB, err)
	}
	squat := "squat-" + suffix()
	forged := func() map[string]string {
		return map[string]string{
			lbv1.ComponentLabel: lbv1.ComponentLBPod, lbobjects.ManagedByLabel: lbobjects.ManagedByValue,
			lbv1.ServiceUIDLabel: string(web.UID), lbv1.IPv4Label: addr,
		}
	}
	squatDeploy := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: squat, Namespace: teamB, Labels: forged()},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](0),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{lbv1.ComponentLabel: lbv1.ComponentLBPod, "squat": squat}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: func() map[string]string { l := forged(); l["squat"] = squat; return l }()},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: image}}},
			},
		},
	}
	create(t, squatDeploy)
	// It even claims to be the active holder.
	podLabels := forged()
	podLabels["lbsvc.io/role"] = lbv1.RoleActive // the role label of earlier releases
	squatPod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: squat, Namespace: teamB, Labels: podLabels},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: image}}},
	}
	create(t, squatPod)

	note := func(svc string, names ...string) string {
		return fmt.Sprintf("%s: ignored %d object(s) carrying its address label that are not lb pods of service %s/%s "+
			"(not our labels, another UID, or outside the namespace its lb pods live in); they neither hold it nor delay its release: %s",
			addr, len(names), f.ns, svc, strings.Join(names, ", "))
	}
	boundNote := note("web", "pod "+teamB+"/"+squat)
	g.Eventually(func() []string { return ignoredNotes(t, victim.UID) }, timeout, interval).Should(Equal([]string{boundNote}))
	g.Consistently(func(g Gomega) {
		ip := getIP(g, addr)
		g.Expect(ip.Status.Holders).To(Equal(ours))
		g.Expect(ip.Status.Active).To(BeEmpty())
	}, time.Second, 200*time.Millisecond).Should(Succeed())

	// The Service goes: its address drains while its own lb pod exists, and only that long.
	g.Expect(k8s.Delete(ctx, getService(g, f.ns, "web"))).To(Succeed())
	waitDraining(t, addr)
	g.Consistently(func(g Gomega) {
		ip := getIP(g, addr)
		g.Expect(ip.Status.Phase).To(Equal(lbv1.IPDraining))
		g.Expect(ip.Status.Holders).To(Equal(ours))
	}, time.Second, 200*time.Millisecond).Should(Succeed())
	forceDelete(t, ourPod)
	g.Eventually(func() bool {
		return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKey{Name: addr}, &lbv1.IP{}))
	}, timeout, interval).Should(BeTrue(), "the address must be released while team-b's objects carry its label")
	// The release looked at every kind and named all of team-b's objects.
	drainNote := note("web", "deployment "+teamB+"/"+squat, "pod "+teamB+"/"+squat)
	g.Eventually(func() []string { return ignoredNotes(t, victim.UID) }, timeout, interval).Should(ConsistOf(boundNote, drainNote))

	// The next Service that asks for that exact address gets it; the squatters hold nothing of it
	// either.
	next := lbService(f.ns, "next", f.provider, addr)
	create(t, next)
	waitAddress(t, f.ns, "next", addr)
	claimed := getIP(g, addr)
	g.Expect(claimed.Spec.Service).To(Equal(lbv1.IPOwner{Namespace: f.ns, Name: "next", UID: string(next.UID)}))
	g.Eventually(func() []string { return ignoredNotes(t, claimed.UID) }, timeout, interval).
		Should(Equal([]string{note("next", "pod "+teamB+"/"+squat)}))
	g.Consistently(func(g Gomega) {
		ip := getIP(g, addr)
		g.Expect(ip.Status.Holders).To(BeEmpty())
		g.Expect(ip.Status.Active).To(BeEmpty())
	}, time.Second, 200*time.Millisecond).Should(Succeed())

	// team-b's objects are its own business: still there, untouched.
	for _, o := range []client.Object{squatDeploy, squatPod} {
		cur := o.DeepCopyObject().(client.Object)
		g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(o), cur)).To(Succeed())
		g.Expect(cur.GetUID()).To(Equal(o.GetUID()))
		g.Expect(cur.GetDeletionTimestamp()).To(BeNil())
	}
	// Every status the IP objects of addr ever had: the squatter never showed as a holder.
	g.Expect(seen.stop()).To(ConsistOf(lbv1.IPStatus{}, lbv1.IPStatus{Holders: ours}),
		"every status of %s's IP objects lists no holder, or exactly the victim's lb pod, and no active one", addr)
}

// restartWithLBPodNamespace replaces the running operator with one run with
// --lb-pod-namespace=ns (and the options more changes); the usual one comes back when the test
// ends.
func restartWithLBPodNamespace(t *testing.T, ns string, more ...func(*controllers.Options)) {
	t.Helper()
	stopOperator()
	opMu.Lock()
	opts := controllers.Options{EnableLBSvc: true, LBPodNamespace: ns}
	for _, m := range more {
		m(&opts)
	}
	current = newOperator(opts)
	opMu.Unlock()
	t.Cleanup(func() { startOperator(true) })
}

// servedFromLBPodNamespace runs the operator with --lb-pod-namespace set to a new namespace
// (the usual operator comes back when the test ends), creates Service "web" of f asking for addr,
// waits for its Deployment there, and stands an lb pod object "lb-web-old" there in for its lb pod
// (envtest has no kubelet) until the IP object lists it as a holder: what keeps that namespace
// provably the Service's once it is no longer the lb pod namespace (decide.StrayOurs). It returns
// the Deployment's key and the pod.
func servedFromLBPodNamespace(t *testing.T, f fixture, addr string) (client.ObjectKey, *corev1.Pod) {
	t.Helper()
	g := NewWithT(t)
	system := newNamespace(t)
	restartWithLBPodNamespace(t, system)
	web := lbService(f.ns, "web", f.provider, addr)
	create(t, web)
	waitAddress(t, f.ns, "web", addr)
	key := client.ObjectKey{Namespace: system, Name: lbobjects.ObjectNameIn(system, f.ns, "web")}
	g.Eventually(func() error { return k8s.Get(context.Background(), key, &appsv1.Deployment{}) }, timeout, interval).Should(Succeed())
	pod := lbPodObjectIn(t, system, web, "lb-web-old", addr, "")
	g.Eventually(func(g Gomega) {
		g.Expect(getIP(g, addr).Status.Holders).To(Equal([]lbv1.IPHolder{{Pod: system + "/lb-web-old"}}))
	}, timeout, interval).Should(Succeed())
	return key, pod
}

// --lb-pod-namespace changed while a Service's lb pod still ran in the old one: that namespace
// is neither the Service's nor the lb pod namespace any more, but the IP object's status.holders
// lists it, so the pod there still holds the address after the Service is deleted, and the
// address drains until that pod is gone.
func TestDrainWaitsForLBPodLeftInPreviousLBPodNamespace(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	f := newFixture(t)
	addr := f.ip("90")
	deploy, pod := servedFromLBPodNamespace(t, f, addr)
	system := deploy.Namespace
	old := []lbv1.IPHolder{{Pod: system + "/lb-web-old"}}

	// The operator comes back with lb pods beside their Service: the old Deployment goes, the
	// old pod is left to go (here it stays: no kubelet, no garbage collector).
	startOperator(true)
	g.Eventually(func() bool {
		return apierrors.IsNotFound(k8s.Get(ctx, deploy, &appsv1.Deployment{}))
	}, timeout, interval).Should(BeTrue())
	g.Expect(k8s.Delete(ctx, getService(g, f.ns, "web"))).To(Succeed())
	ip := waitDraining(t, addr)
	g.Consistently(func(g Gomega) {
		cur := getIP(g, addr)
		g.Expect(cur.Status.Phase).To(Equal(lbv1.IPDraining))
		g.Expect(cur.Status.Holders).To(Equal(old))
	}, 2*time.Second, 200*time.Millisecond).Should(Succeed())

	forceDelete(t, pod)
	g.Eventually(func() bool {
		return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKey{Name: addr}, &lbv1.IP{}))
	}, timeout, interval).Should(BeTrue())
	g.Expect(ignoredNotes(t, ip.UID)).To(BeEmpty())
}

// With --lb-pod-namespace no lb pod of ours lives in a tenant's namespace. A tenant who deleted
// their Service (its UID and address are in its status and labels) and runs a pod there with our
// labels, that UID and the address does not hold the address: the drain waits for the lb pod in
// the lb pod namespace alone, the address is released, and a Warning on the IP object names the
// pod. Trusted, such pods would keep every address the tenant once had draining for ever, one
// Service of quota at a time.
func TestSquatterInTheServiceNamespaceWithLBPodNamespaceHoldsNoAddress(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	f := newFixture(t)
	addr := f.ip("95")
	_, pod := servedFromLBPodNamespace(t, f, addr)
	web := getService(g, f.ns, "web")
	ipUID := getIP(g, addr).UID

	g.Expect(k8s.Delete(ctx, web)).To(Succeed())
	waitDraining(t, addr)
	squat := lbPodObject(t, web, "squat", addr, "")
	g.Eventually(func() []string { return ignoredNotes(t, ipUID) }, timeout, interval).Should(ContainElement(HaveSuffix("pod " + f.ns + "/squat")))
	g.Expect(getIP(g, addr).Status.Holders).To(Equal([]lbv1.IPHolder{{Pod: pod.Namespace + "/lb-web-old"}}))

	forceDelete(t, pod)
	waitGone(t, &lbv1.IP{ObjectMeta: metav1.ObjectMeta{Name: addr}})
	g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(squat), &corev1.Pod{})).To(Succeed(), "the tenant's pod is theirs: left alone")
}

// --lb-pod-namespace changed while no operator ran, and the Service stopped being ours meanwhile
// (type ClusterIP): the first pass of the new operator is a teardown, which must delete the
// Deployment and ServiceAccount left in the previous lb pod namespace too (they carry no owner
// reference there, so no garbage collector ever would, and the Deployment's pods would hold the
// address for ever).
func TestTeardownRemovesObjectsInPreviousLBPodNamespace(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	f := newFixture(t)
	addr := f.ip("91")
	key, pod := servedFromLBPodNamespace(t, f, addr)
	g.Eventually(func() error { return k8s.Get(ctx, key, &appsv1.Deployment{}) }, timeout, interval).Should(Succeed())
	// A ServiceAccount of the Service's own, as an earlier release left it there.
	create(t, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace, Labels: map[string]string{
		lbv1.ComponentLabel: lbv1.ComponentLBPod, lbobjects.ManagedByLabel: lbobjects.ManagedByValue,
		lbv1.ServiceUIDLabel: string(getService(g, f.ns, "web").UID), lbv1.ServiceNamespaceLabel: f.ns, lbv1.ServiceLabel: "web"}}})

	stopOperator()
	update(t, getService(g, f.ns, "web"), func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeClusterIP
		s.Spec.LoadBalancerIP = ""
	})
	startOperator(true)
	for _, o := range []client.Object{&appsv1.Deployment{}, &corev1.ServiceAccount{}} {
		g.Eventually(func() bool {
			return apierrors.IsNotFound(k8s.Get(ctx, key, o))
		}, timeout, interval).Should(BeTrue(), "%T %s left in the previous lb pod namespace", o, key)
	}
	// Its pod (no kubelet or garbage collector here to end it) is what the drain waits for.
	forceDelete(t, pod)
	g.Eventually(func() bool {
		return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKey{Name: addr}, &lbv1.IP{}))
	}, timeout, interval).Should(BeTrue(), "%s released", addr)
}

// ignoredNotes are the notes of the ForeignHolderIgnored Warning Events about the IP object
// with uid.
func ignoredNotes(t *testing.T, uid types.UID) []string {
	t.Helper()
	return ipWarnings(t, uid, decide.ReasonForeignHolderIgnored)
}

// ipWarnings are the notes of the Warning Events with reason about the IP object with uid
// (Events about a cluster-scoped object live in "default").
func ipWarnings(t *testing.T, uid types.UID, reason string) []string {
	t.Helper()
	var list corev1.EventList
	if err := k8s.List(context.Background(), &list, client.InNamespace("default")); err != nil {
		t.Fatalf("list events: %v", err)
	}
	var out []string
	for _, e := range list.Items {
		if e.InvolvedObject.UID == uid && e.Reason == reason && e.Type == corev1.EventTypeWarning {
			out = append(out, e.Message)
		}
	}
	return out
}

// ipStatuses records, from a watch, each distinct status the IP objects named addr had.
type ipStatuses struct {
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	seen   []lbv1.IPStatus
	ended  error
}

// watchIPStatus starts recording the statuses of the IP objects named addr (none exists yet).
func watchIPStatus(t *testing.T, addr string) *ipStatuses {
	t.Helper()
	scheme, err := controllers.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	wc, err := client.NewWithWatch(restCfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatalf("watch client: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w, err := wc.Watch(ctx, &lbv1.IPList{}, client.MatchingFields{"metadata.name": addr})
	if err != nil {
		cancel()
		t.Fatalf("watch IP %s: %v", addr, err)
	}
	s := &ipStatuses{cancel: cancel, done: make(chan struct{})}
	t.Cleanup(func() { _ = s.stop() })
	go func() {
		defer close(s.done)
		defer w.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-w.ResultChan():
				if !ok {
					s.mu.Lock()
					s.ended = fmt.Errorf("watch of IP %s ended before the test did", addr)
					s.mu.Unlock()
					return
				}
				ip, isIP := ev.Object.(*lbv1.IP)
				if !isIP {
					continue
				}
				s.mu.Lock()
				st := lbv1.IPStatus{Holders: ip.Status.Holders, Active: ip.Status.Active}
				if len(st.Holders) == 0 {
					st.Holders = nil
				}
				if !containsStatus(s.seen, st) {
					s.seen = append(s.seen, st)
				}
				s.mu.Unlock()
			}
		}
	}()
	return s
}

// stop ends the watch and returns the distinct (holders, active) pairs seen. A watch that
// ended early returns nothing, so the caller's assertion fails.
func (s *ipStatuses) stop() []lbv1.IPStatus {
	s.cancel()
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended != nil {
		return []lbv1.IPStatus{{Message: s.ended.Error()}}
	}
	return s.seen
}

func containsStatus(list []lbv1.IPStatus, st lbv1.IPStatus) bool {
	return slices.ContainsFunc(list, func(o lbv1.IPStatus) bool {
		return o.Active == st.Active && slices.Equal(o.Holders, st.Holders)
	})
}

// A tenant's objects in another namespace that forge a Service's labels and UID (as stray lb
// pods of a previous --lb-pod-namespace would look) neither freeze the Service's pass nor get
// deleted by the operator: the Service still follows its own changes.
func TestForgedStrayFreezesNothing(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	f := newFixture(t)
	addr := f.ip("90")
	web := lbService(f.ns, "web", f.provider, addr)
	create(t, web)
	web = waitAddress(t, f.ns, "web", addr)

	const teamB = "team-b"
	if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: teamB}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create namespace %s: %v", teamB, err)
	}
	forged := map[string]string{
		lbv1.ComponentLabel: lbv1.ComponentLBPod, lbobjects.ManagedByLabel: lbobjects.ManagedByValue,
		lbv1.ServiceLabel: "web", lbv1.ServiceNamespaceLabel: f.ns, lbv1.ServiceUIDLabel: string(web.UID),
	}
	name := "stray-" + suffix()
	squatDeploy := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: teamB, Labels: forged},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](0),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"stray": name}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"stray": name}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: image}}},
			},
		},
	}
	create(t, squatDeploy)
	create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: teamB, Labels: forged},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: image}}}})

	// The Service asks for standbys: its pass must still apply its Deployment (a stray pod it
	// waited for would hold the pass at errStrayPods for ever).
	update(t, getService(g, f.ns, "web"), func(s *corev1.Service) { s.Annotations[lbv1.ReplicasAnnotation] = "2" })
	g.Eventually(func(g Gomega) {
		d := &appsv1.Deployment{}
		g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: f.ns, Name: "lb-svc-web"}, d)).To(Succeed())
		g.Expect(d.Spec.Replicas).To(Equal(ptr.To[int32](2)))
	}, timeout, interval).Should(Succeed())
	g.Consistently(func(g Gomega) {
		d := &appsv1.Deployment{}
		g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(squatDeploy), d)).To(Succeed())
		g.Expect(d.DeletionTimestamp).To(BeNil(), "the operator deleted a tenant's Deployment")
	}, time.Second, 200*time.Millisecond).Should(Succeed())
}

// servedWeb creates Service "web" of f asking for addr, and returns its lb Deployment's key and the
// Deployment once the address is in its status and the Deployment exists.
func servedWeb(t *testing.T, f fixture, addr string) (client.ObjectKey, *appsv1.Deployment) {
	t.Helper()
	create(t, lbService(f.ns, "web", f.provider, addr))
	waitAddress(t, f.ns, "web", addr)
	key := client.ObjectKey{Namespace: f.ns, Name: lbobjects.ObjectNameIn("", f.ns, "web")}
	d := &appsv1.Deployment{}
	NewWithT(t).Eventually(func() error { return k8s.Get(context.Background(), key, d) }, timeout, interval).Should(Succeed())
	return key, d
}

// A Service let go while a Deployment of ours for it still exists: one write of a killed operator
// that reached the API server after its successor had let the Service go (seen in
// TestKillDuringChurn under load); here the operator is stopped and our finalizer taken off by
// hand. Without a garbage collector (envtest has none, like a cluster whose controller manager is
// down, or the lb pod namespace layout, where nothing points the collector at the Service) the
// drain would wait for that Deployment for ever. The IP controller deletes it, says so in a
// CleanedUp Event on the IP object, and releases the address.
func TestDrainDeletesTheDeploymentOfAGoneService(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	f := newFixture(t)
	addr := f.ip("91")
	key, _ := servedWeb(t, f, addr)
	ipUID := getIP(g, addr).UID

	stopOperator()
	t.Cleanup(func() { startOperator(true) })
	svc := getService(g, f.ns, "web")
	update(t, svc, func(s *corev1.Service) { s.Finalizers = nil })
	g.Expect(k8s.Delete(ctx, svc)).To(Succeed())
	waitGone(t, svc)
	g.Expect(k8s.Get(ctx, key, &appsv1.Deployment{})).To(Succeed(), "the Deployment outlived its Service")

	startOperator(true)
	waitGone(t, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}})
	waitGone(t, &lbv1.IP{ObjectMeta: metav1.ObjectMeta{Name: addr}})
	var list corev1.EventList
	g.Expect(k8s.List(ctx, &list, client.InNamespace("default"))).To(Succeed())
	var notes []string
	for _, e := range list.Items {
		if e.InvolvedObject.UID == ipUID && e.Reason == decide.ReasonCleanedUp && e.Type == corev1.EventTypeNormal {
			notes = append(notes, e.Message)
		}
	}
	g.Expect(notes).To(Equal([]string{fmt.Sprintf("deleted deployment %s/%s: it still asked for %s, and its Service %s/web is gone", f.ns, key.Name, addr, f.ns)}))
}

// The same, with an lb pod of that Deployment still running (a pod object: envtest has no
// ReplicaSet controller or kubelet). The pod is the reason the drain waits, and it would wait for
// ever: the Deployment would replace the pod whenever it went. The IP controller deletes the
// Deployment although a pod holds the address, and the address goes only once the pod is gone.
func TestDrainDeletesTheDeploymentOfAGoneServiceWhileItsPodRuns(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	f := newFixture(t)
	addr := f.ip("93")
	key, _ := servedWeb(t, f, addr)

	stopOperator()
	t.Cleanup(func() { startOperator(true) })
	svc := getService(g, f.ns, "web")
	update(t, svc, func(s *corev1.Service) { s.Finalizers = nil })
	g.Expect(k8s.Delete(ctx, svc)).To(Succeed())
	waitGone(t, svc)
	pod := lbPodObject(t, svc, "lb-svc-web-1", addr, "")

	startOperator(true)
	waitGone(t, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}})
	ip := waitDraining(t, addr)
	g.Expect(ip.Status.Message).To(Equal(fmt.Sprintf("waiting for pod %s/lb-svc-web-1 to be gone", f.ns)))
	g.Expect(ip.Status.Holders).To(Equal([]lbv1.IPHolder{{Pod: f.ns + "/lb-svc-web-1"}}))

	forceDelete(t, pod)
	waitGone(t, &lbv1.IP{ObjectMeta: metav1.ObjectMeta{Name: addr}})
}

// A Service let go by a type change, whose lb Deployment a write of a killed operator put back
// afterwards (here: the operator stopped, the Deployment created again as it was): the Service
// still exists, so no garbage collector would ever delete it, its pods would run for a Service
// that is no longer served, and its address would drain for ever. The next pass over the Service
// deletes it.
func TestLeftDeploymentOfARetypedServiceIsDeleted(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	f := newFixture(t)
	addr := f.ip("92")
	key, left := servedWeb(t, f, addr)

	update(t, getService(g, f.ns, "web"), func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeClusterIP })
	waitGone(t, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}})
	waitGone(t, &lbv1.IP{ObjectMeta: metav1.ObjectMeta{Name: addr}})
	g.Eventually(func(g Gomega) {
		s := getService(g, f.ns, "web")
		g.Expect(s.Finalizers).To(BeEmpty())
		g.Expect(s.Status.Conditions).To(BeEmpty())
	}, timeout, interval).Should(Succeed())

	stopOperator()
	t.Cleanup(func() { startOperator(true) })
	left.ResourceVersion, left.UID, left.CreationTimestamp, left.ManagedFields = "", "", metav1.Time{}, nil
	left.Status = appsv1.DeploymentStatus{}
	g.Expect(k8s.Create(ctx, left)).To(Succeed())

	startOperator(true)
	waitGone(t, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}})
	s := getService(g, f.ns, "web")
	g.Expect(s.Finalizers).To(BeEmpty())
	g.Expect(s.Status.Conditions).To(BeEmpty())
	g.Expect(k8s.Get(ctx, client.ObjectKey{Name: addr}, &lbv1.IP{})).NotTo(Succeed())
}
