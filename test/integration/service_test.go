//go:build integration

package integration

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/lbsvc/lbsvc-operator/controllers/decide"

	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
)

func loadSample(t *testing.T, file string, into client.Object) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "config", "samples", file))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, into); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
}

// The seed's flow with its objects verbatim (config/samples): address 172.18.0.18 in ingress,
// the Deployment and its pod template as specified, RBAC limited to the Service.
func TestSeedFlow(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	nad, subnet, svc := &nadv1.NetworkAttachmentDefinition{}, &lbv1.Subnet{}, &corev1.Service{}
	loadSample(t, "nad.yaml", nad)
	loadSample(t, "subnet.yaml", subnet)
	loadSample(t, "service.yaml", svc)
	create(t, nad)
	create(t, subnet)
	create(t, svc)

	svc = waitAddress(t, "default", "test-service", "172.18.0.18")
	g.Expect(svc.Annotations[lbv1.AllocatedSubnetAnnotation]).To(Equal("attach-subnet"))
	g.Expect(svc.Finalizers).To(ConsistOf(lbv1.CleanupFinalizer))
	// ipMode is left unset by the operator; the API server shows its default, VIP.
	g.Expect(svc.Status.LoadBalancer.Ingress).To(Equal([]corev1.LoadBalancerIngress{{IP: "172.18.0.18", IPMode: ptr.To(corev1.LoadBalancerIPModeVIP)}}))
	c := findCondition(svc.Status.Conditions, decide.ConditionAddressAllocated)
	g.Expect(c).NotTo(BeNil())
	g.Expect(c.Status).To(Equal(metav1.ConditionTrue))
	g.Expect(c.Reason).To(Equal(decide.ReasonAllocated))
	g.Expect(c.Message).To(Equal("172.18.0.18 from subnet attach-subnet"))
	// One write carried the ingress, the condition, the finalizer and the mirror annotations: the
	// operator's only entry in the Service's managed fields is on the status subresource, and it
	// owns those metadata fields there (the API server keeps metadata written through a
	// Service's status, as Kubernetes' own service controller relies on for this finalizer).
	var ours []metav1.ManagedFieldsEntry
	for _, m := range svc.ManagedFields {
		if m.Manager == "lbsvc-operator" {
			ours = append(ours, m)
		}
	}
	g.Expect(ours).To(HaveLen(1), "the operator's writes on the Service: %+v", ours)
	g.Expect(ours[0].Subresource).To(Equal("status"))
	g.Expect(ours[0].FieldsV1.GetRawString()).To(And(
		ContainSubstring(`"f:finalizers":{`), ContainSubstring(`"v:\"service.kubernetes.io/load-balancer-cleanup\""`),
		ContainSubstring(`"f:lbsvc.io/allocated-ips":{}`), ContainSubstring(`"f:lbsvc.io/subnet":{}`),
		ContainSubstring(`"f:loadBalancer":{`), ContainSubstring(`"f:conditions":{`)))

	// The IP object is Bound without a status write of its own (the CRD's default, filled in as
	// the API server reads it): no pod holds it yet here, so the IP controller has nothing to
	// write, and no manager ever wrote its status subresource.
	ip := &lbv1.IP{}
	g.Consistently(func(g Gomega) {
		g.Expect(k8s.Get(ctx, client.ObjectKey{Name: "172.18.0.18"}, ip)).To(Succeed())
		g.Expect(ip.Status).To(Equal(lbv1.IPStatus{Phase: lbv1.IPBound}))
		for _, m := range ip.ManagedFields {
			g.Expect(m.Subresource).NotTo(Equal("status"), "status written by %s", m.Manager)
		}
	}, 2*time.Second, 200*time.Millisecond).Should(Succeed())

	owner := metav1.OwnerReference{APIVersion: "v1", Kind: "Service", Name: "test-service", UID: svc.UID,
		Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}
	d := &appsv1.Deployment{}
	g.Eventually(func() error {
		return k8s.Get(ctx, client.ObjectKey{Namespace: "default", Name: "lb-svc-test-service"}, d)
	}, timeout, interval).Should(Succeed())
	g.Expect(d.OwnerReferences).To(Equal([]metav1.OwnerReference{owner}))
	g.Expect(d.Labels).To(Equal(map[string]string{"app.kubernetes.io/component": "lb-svc",
		"lbsvc.io/service": "test-service", "app.kubernetes.io/managed-by": "lbsvc-operator",
		"lbsvc.io/service-namespace": "default", "lbsvc.io/service-uid": string(svc.UID), "lbsvc.io/ipv4": "172.18.0.18"}))
	g.Expect(*d.Spec.Replicas).To(Equal(int32(1)))
	g.Expect(d.Spec.Strategy.Type).To(Equal(appsv1.RecreateDeploymentStrategyType))
	tpl := d.Spec.Template
	g.Expect(tpl.Annotations).To(Equal(map[string]string{
		"k8s.v1.cni.cncf.io/networks":                                `[{"name":"lb-svc-attachment","namespace":"kube-system","interface":"net1"}]`,
		"lb-svc-attachment.kube-system.kubernetes.io/ip_address":     "172.18.0.18",
		"lb-svc-attachment.kube-system.kubernetes.io/cidr":           "172.18.0.0/16",
		"lb-svc-attachment.kube-system.kubernetes.io/gateway":        "172.18.0.1",
		"lb-svc-attachment.kube-system.kubernetes.io/logical_switch": "attach-subnet",
	}))
	g.Expect(tpl.Spec.ServiceAccountName).To(Equal("lbsvc-lbpod"))
	g.Expect(*tpl.Spec.AutomountServiceAccountToken).To(BeTrue())
	g.Expect(tpl.Spec.InitContainers).To(BeEmpty())
	g.Expect(tpl.Spec.Containers).To(HaveLen(1))
	mainC := tpl.Spec.Containers[0]
	g.Expect(mainC.Name).To(Equal("lbpod"))
	g.Expect(mainC.Command).To(Equal([]string{"/usr/local/bin/lbpod"}))
	for _, ctr := range []corev1.Container{mainC} {
		g.Expect(ctr.Image).To(Equal(image))
		g.Expect(ctr.Env).To(Equal([]corev1.EnvVar{
			{Name: "LBPOD_NAMESPACE", Value: "default"},
			{Name: "LBPOD_SERVICE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.labels['lbsvc.io/service']"}}},
			{Name: "LBPOD_POD_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "status.podIP"}}},
			{Name: "LBPOD_ADDRESSES", Value: "172.18.0.18/16"},
			{Name: "LBPOD_GATEWAYS", Value: "172.18.0.1"},
			{Name: "LBPOD_SUBNETS", Value: "172.18.0.0/16"},
			{Name: "LBPOD_REPLICAS", Value: "1"},
			{Name: "LBPOD_POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.name"}}},
			{Name: "LBPOD_NODE_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "spec.nodeName"}}},
			{Name: "LBPOD_LEASE", Value: "lb-svc-test-service"},
		}))
		sc := ctr.SecurityContext
		g.Expect(*sc.Privileged).To(BeFalse())
		g.Expect(*sc.AllowPrivilegeEscalation).To(BeFalse())
		g.Expect(*sc.ReadOnlyRootFilesystem).To(BeTrue())
		g.Expect(sc.Capabilities.Drop).To(Equal([]corev1.Capability{"ALL"}))
		g.Expect(sc.Capabilities.Add).To(Equal([]corev1.Capability{"NET_ADMIN", "NET_RAW"}))
		g.Expect(ctr.VolumeMounts).To(Equal([]corev1.VolumeMount{{Name: "run", MountPath: "/run"}}))
	}
	g.Expect(mainC.ReadinessProbe.HTTPGet.Path).To(Equal("/readyz"))
	g.Expect(mainC.ReadinessProbe.HTTPGet.Port).To(Equal(intstr.FromInt32(8081)))
	g.Expect(mainC.LivenessProbe.HTTPGet.Path).To(Equal("/healthz"))
	g.Expect(mainC.LivenessProbe.HTTPGet.Port).To(Equal(intstr.FromInt32(8081)))
	g.Expect(tpl.Spec.SecurityContext.SeccompProfile.Type).To(Equal(corev1.SeccompProfileTypeRuntimeDefault))
	g.Expect(tpl.Spec.SecurityContext.Sysctls).To(BeEmpty()) // IPv4 under --forwarding-sysctls=ipv6

	// No Role, RoleBinding or ServiceAccount per Service: the lb pods of the namespace share the
	// ServiceAccount lbsvc-lbpod, bound to the installed ClusterRole lbsvc-lbpod, owned by no
	// Service.
	for _, o := range []client.Object{&rbacv1.Role{}, &rbacv1.RoleBinding{}, &corev1.ServiceAccount{}} {
		err := k8s.Get(ctx, client.ObjectKey{Namespace: "default", Name: "lb-svc-test-service"}, o)
		g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "%T of the Service's own: %v", o, err)
	}
	identityLabels := map[string]string{"app.kubernetes.io/component": "lb-svc", "app.kubernetes.io/managed-by": "lbsvc-operator",
		"lbsvc.io/identity": "namespace", "lbsvc.io/service-namespace": "default"}
	rb := &rbacv1.RoleBinding{}
	g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: "default", Name: "lbsvc-lbpod"}, rb)).To(Succeed())
	g.Expect(rb.OwnerReferences).To(BeEmpty())
	g.Expect(rb.Labels).To(Equal(identityLabels))
	g.Expect(rb.RoleRef).To(Equal(rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "lbsvc-lbpod"}))
	g.Expect(rb.Subjects).To(Equal([]rbacv1.Subject{{Kind: "ServiceAccount", Name: "lbsvc-lbpod", Namespace: "default"}}))
	sa := &corev1.ServiceAccount{}
	g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: "default", Name: "lbsvc-lbpod"}, sa)).To(Succeed())
	g.Expect(sa.OwnerReferences).To(BeEmpty())
	g.Expect(sa.Labels).To(Equal(identityLabels))

	// The lb pod condition follows the Deployment's Available condition, never a pod.
	c = findCondition(svc.Status.Conditions, decide.ConditionLBPodAvailable)
	g.Expect(c).NotTo(BeNil())
	g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
	g.Expect(c.Reason).To(Equal(decide.ReasonDeploymentPending))
	d.Status.Conditions = []appsv1.DeploymentCondition{{Type: appsv1.DeploymentAvailable, Status: corev1.ConditionTrue,
		Reason: "MinimumReplicasAvailable", Message: "Deployment has minimum availability.", LastUpdateTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
	g.Expect(k8s.Status().Update(ctx, d)).To(Succeed())
	g.Eventually(func(g Gomega) {
		c := findCondition(getService(g, "default", "test-service").Status.Conditions, decide.ConditionLBPodAvailable)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Status).To(Equal(metav1.ConditionTrue))
		g.Expect(c.Reason).To(Equal(decide.ReasonDeploymentAvailable))
		g.Expect(c.Message).To(Equal("deployment default/lb-svc-test-service: Deployment has minimum availability."))
	}, timeout, interval).Should(Succeed())

	// Counters: a /16 less network, broadcast and 172.18.0.0..10 (gateway included) is 65524.
	g.Eventually(func(g Gomega) {
		s := &lbv1.Subnet{}
		g.Expect(k8s.Get(ctx, client.ObjectKey{Name: "attach-subnet"}, s)).To(Succeed())
		g.Expect(s.Status.V4UsingIPs).To(Equal(int64(1)))
		g.Expect(s.Status.V4AvailableIPs).To(Equal(int64(65523)))
		g.Expect(s.Finalizers).To(ConsistOf(lbv1.SubnetFinalizer))
	}, timeout, interval).Should(Succeed())
}

// fixture is a namespace with a NAD and one Subnet 10.x.y.0/24 (gateway .1, .2..5 excluded).
type fixture struct {
	ns, provider, subnet, net string
}

func newFixture(t *testing.T) fixture {
	t.Helper()
	ns := newNamespace(t)
	f := fixture{ns: ns, provider: createNAD(t, ns, "attach-"+suffix()), subnet: "sn-" + suffix(), net: nextNet()}
	create(t, subnetObj(f.subnet, f.provider, f.net+".0/24", f.net+".1", []string{f.net + ".2.." + f.net + ".5"}))
	return f
}

func (f fixture) ip(host string) string { return f.net + "." + host }

func TestStaticAddresses(t *testing.T) {
	f := newFixture(t)
	create(t, lbService(f.ns, "inside", f.provider, f.ip("20")))
	waitAddress(t, f.ns, "inside", f.ip("20"))

	for name, tc := range map[string]struct{ ip, reason string }{
		"outside":  {"10.250.0.5", decide.ReasonAddressOutOfRange},
		"excluded": {f.ip("3"), decide.ReasonAddressExcluded},
		"gateway":  {f.ip("1"), decide.ReasonAddressIsGateway},
		"taken":    {f.ip("20"), decide.ReasonAddressInUse},
		"garbage":  {"not-an-ip", decide.ReasonInvalidLoadBalancerIP},
	} {
		t.Run(name, func(t *testing.T) {
			create(t, lbService(f.ns, name, f.provider, tc.ip))
			waitRefused(t, f.ns, name, tc.reason)
			assertNoDeployment(t, f.ns, name)
		})
	}
	// Nothing but "inside" holds an address.
	waitSubnetCounters(t, f.subnet, 1, 256-2-4-1-1)
}

func assertNoDeployment(t *testing.T, ns, svc string) {
	t.Helper()
	err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "lb-svc-" + svc}, &appsv1.Deployment{})
	NewWithT(t).Expect(apierrors.IsNotFound(err)).To(BeTrue(), "deployment lb-svc-%s: %v", svc, err)
}

func waitSubnetCounters(t *testing.T, subnet string, using, available int64) {
	t.Helper()
	NewWithT(t).Eventually(func(g Gomega) {
		s := &lbv1.Subnet{}
		g.Expect(k8s.Get(context.Background(), client.ObjectKey{Name: subnet}, s)).To(Succeed())
		g.Expect(s.Status.V4UsingIPs).To(Equal(using))
		g.Expect(s.Status.V4AvailableIPs).To(Equal(available))
	}, timeout, interval).Should(Succeed())
}

func TestExhaustionAndRelease(t *testing.T) {
	ns := newNamespace(t)
	provider := createNAD(t, ns, "attach")
	net, subnet := nextNet(), "tiny-"+suffix()
	// A /30: network .0, gateway .1, broadcast .3: one address to hand out.
	create(t, subnetObj(subnet, provider, net+".0/30", net+".1", nil))
	create(t, lbService(ns, "first", provider, ""))
	waitAddress(t, ns, "first", net+".2")
	create(t, lbService(ns, "second", provider, ""))
	waitRefused(t, ns, "second", decide.ReasonSubnetExhausted)
	waitSubnetCounters(t, subnet, 1, 0)

	// Freeing the address wakes the waiting Service.
	first := getService(NewWithT(t), ns, "first")
	NewWithT(t).Expect(k8s.Delete(context.Background(), first)).To(Succeed())
	waitAddress(t, ns, "second", net+".2")
	waitGone(t, first)
}

func waitGone(t *testing.T, obj client.Object) {
	t.Helper()
	NewWithT(t).Eventually(func() bool {
		err := k8s.Get(context.Background(), client.ObjectKeyFromObject(obj), obj)
		return apierrors.IsNotFound(err)
	}, timeout, interval).Should(BeTrue(), "%T %s still exists", obj, obj.GetName())
}

func TestLateNADHeals(t *testing.T) {
	ns := newNamespace(t)
	provider := "late-nad." + ns
	net, subnet := nextNet(), "late-nad-"+suffix()
	create(t, subnetObj(subnet, provider, net+".0/24", "", nil))
	create(t, lbService(ns, "svc", provider, ""))
	waitRefused(t, ns, "svc", decide.ReasonNADNotFound)
	createNAD(t, ns, "late-nad")
	waitAddress(t, ns, "svc", net+".2") // gateway defaults to .1
}

func TestLateSubnetHeals(t *testing.T) {
	ns := newNamespace(t)
	provider := createNAD(t, ns, "attach")
	create(t, lbService(ns, "svc", provider, ""))
	waitRefused(t, ns, "svc", decide.ReasonSubnetNotFound)
	net := nextNet()
	create(t, subnetObj("late-sn-"+suffix(), provider, net+".0/24", net+".1", []string{net + ".2"}))
	waitAddress(t, ns, "svc", net+".3")
}

func TestTwoSubnetsOneProvider(t *testing.T) {
	ns := newNamespace(t)
	provider := createNAD(t, ns, "attach")
	netA, netB := nextNet(), nextNet()
	a, b := "two-a-"+suffix(), "two-b-"+suffix()
	create(t, subnetObj(a, provider, netA+".0/24", netA+".1", nil))
	create(t, subnetObj(b, provider, netB+".0/24", netB+".1", nil))
	svc := lbService(ns, "svc", provider, "")
	create(t, svc)
	waitRefused(t, ns, "svc", decide.ReasonSubnetAmbiguous)

	update(t, svc, func(s *corev1.Service) { s.Annotations[provider+".kubernetes.io/logical_switch"] = b })
	waitAddress(t, ns, "svc", netB+".2")

	// Moving to the other Subnet moves the address and frees the old one.
	update(t, svc, func(s *corev1.Service) { s.Annotations[provider+".kubernetes.io/logical_switch"] = a })
	got := waitAddress(t, ns, "svc", netA+".2")
	NewWithT(t).Expect(got.Annotations[lbv1.AllocatedSubnetAnnotation]).To(Equal(a))
	waitSubnetCounters(t, b, 0, 253)
	waitSubnetCounters(t, a, 1, 252)
	waitPodAnnotation(t, ns, "svc", provider, netA+".2")
}

func waitPodAnnotation(t *testing.T, ns, svc, provider, want string) {
	t.Helper()
	NewWithT(t).Eventually(func(g Gomega) {
		d := &appsv1.Deployment{}
		g.Expect(k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "lb-svc-" + svc}, d)).To(Succeed())
		g.Expect(d.Spec.Template.Annotations[provider+".kubernetes.io/ip_address"]).To(Equal(want))
	}, timeout, interval).Should(Succeed())
}

func TestNamespaceRestriction(t *testing.T) {
	ns := newNamespace(t)
	provider := createNAD(t, ns, "attach")
	net := nextNet()
	sn := subnetObj("restricted-"+suffix(), provider, net+".0/24", net+".1", nil)
	sn.Spec.Namespaces = []string{"somewhere-else"}
	create(t, sn)
	create(t, lbService(ns, "svc", provider, ""))
	waitRefused(t, ns, "svc", decide.ReasonNamespaceNotAllowed)
	update(t, sn, func(s *lbv1.Subnet) { s.Spec.Namespaces = append(s.Spec.Namespaces, ns) })
	waitAddress(t, ns, "svc", net+".2")
}

// A port change reaches the lb pod through its Service watch, so the Deployment must not change.
func TestPortChangeKeepsPodTemplate(t *testing.T) {
	f := newFixture(t)
	svc := lbService(f.ns, "ports", f.provider, "")
	create(t, svc)
	waitAddress(t, f.ns, "ports", f.ip("6"))
	g := NewWithT(t)
	d := &appsv1.Deployment{}
	key := client.ObjectKey{Namespace: f.ns, Name: "lb-svc-ports"}
	g.Eventually(func() error { return k8s.Get(context.Background(), key, d) }, timeout, interval).Should(Succeed())
	tpl, gen, rv := d.Spec.Template.DeepCopy(), d.Generation, d.ResourceVersion

	for _, mutate := range []func(*corev1.Service){
		func(s *corev1.Service) {
			s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: "https", Protocol: corev1.ProtocolTCP, Port: 443, TargetPort: intstr.FromString("https")})
		},
		func(s *corev1.Service) { s.Spec.Ports = s.Spec.Ports[1:] },
		func(s *corev1.Service) { s.Spec.Ports[0].Name = "" },
	} {
		update(t, svc, mutate)
		// Wait until the operator has seen this generation (its condition says so).
		g.Eventually(func(g Gomega) {
			s := getService(g, f.ns, "ports")
			c := findCondition(s.Status.Conditions, decide.ConditionAddressAllocated)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.ObservedGeneration).To(Equal(s.Generation))
		}, timeout, interval).Should(Succeed())
		g.Consistently(func(g Gomega) {
			cur := &appsv1.Deployment{}
			g.Expect(k8s.Get(context.Background(), key, cur)).To(Succeed())
			g.Expect(cur.Generation).To(Equal(gen))
			g.Expect(cur.ResourceVersion).To(Equal(rv))
			g.Expect(cur.Spec.Template).To(Equal(*tpl))
		}, 500*time.Millisecond, interval).Should(Succeed())
	}
}

// A changed spec.loadBalancerIP moves the address (the template follows: that one rolls).
func TestChangedLoadBalancerIPMoves(t *testing.T) {
	f := newFixture(t)
	svc := lbService(f.ns, "mover", f.provider, f.ip("30"))
	create(t, svc)
	waitAddress(t, f.ns, "mover", f.ip("30"))
	update(t, svc, func(s *corev1.Service) { s.Spec.LoadBalancerIP = f.ip("31") })
	waitAddress(t, f.ns, "mover", f.ip("31"))
	waitPodAnnotation(t, f.ns, "mover", f.provider, f.ip("31"))
	NewWithT(t).Eventually(func() []string {
		var reasons []string
		for _, e := range events(t, f.ns, "mover") {
			reasons = append(reasons, e.Reason)
		}
		return reasons
	}, timeout, interval).Should(ContainElement(decide.ReasonAddressMoved))
	// The old address is free again.
	create(t, lbService(f.ns, "taker", f.provider, f.ip("30")))
	waitAddress(t, f.ns, "taker", f.ip("30"))
}

// Every way out of being served releases the address and leaves no trace of the operator.
func TestCleanup(t *testing.T) {
	cases := map[string]func(t *testing.T, svc *corev1.Service){
		"deleted": func(t *testing.T, svc *corev1.Service) {
			NewWithT(t).Expect(k8s.Delete(context.Background(), svc)).To(Succeed())
		},
		"type changed": func(t *testing.T, svc *corev1.Service) {
			update(t, svc, func(s *corev1.Service) {
				s.Spec.Type = corev1.ServiceTypeClusterIP
				s.Spec.LoadBalancerIP = ""
				s.Spec.LoadBalancerClass = nil
				s.Spec.AllocateLoadBalancerNodePorts = nil
				s.Spec.ExternalTrafficPolicy = ""
				for i := range s.Spec.Ports {
					s.Spec.Ports[i].NodePort = 0
				}
			})
		},
		"annotation removed": func(t *testing.T, svc *corev1.Service) {
			update(t, svc, func(s *corev1.Service) { delete(s.Annotations, lbv1.AttachmentProviderAnnotation) })
		},
		// spec.loadBalancerClass is immutable while the type stays LoadBalancer, so a class change
		// goes through another type: to NodePort (class cleared), then back with a foreign class.
		"class changed": func(t *testing.T, svc *corev1.Service) {
			update(t, svc, func(s *corev1.Service) {
				s.Spec.Type = corev1.ServiceTypeNodePort
				s.Spec.LoadBalancerClass = nil
				s.Spec.LoadBalancerIP = ""
				s.Spec.AllocateLoadBalancerNodePorts = nil
			})
			update(t, svc, func(s *corev1.Service) {
				s.Spec.Type = corev1.ServiceTypeLoadBalancer
				s.Spec.LoadBalancerClass = ptr.To("example.com/other-lb")
			})
		},
	}
	for name, leave := range cases {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			f := newFixture(t)
			svc := lbService(f.ns, "gone", f.provider, f.ip("40"))
			svc.Spec.LoadBalancerClass = ptr.To(lbv1.LoadBalancerClass)
			create(t, svc)
			svc = waitAddress(t, f.ns, "gone", f.ip("40"))
			owned := []client.Object{&appsv1.Deployment{}}
			for _, o := range owned {
				g.Eventually(func(g Gomega) {
					g.Expect(k8s.Get(context.Background(), client.ObjectKey{Namespace: f.ns, Name: "lb-svc-gone"}, o)).To(Succeed())
					g.Expect(o.GetOwnerReferences()).To(HaveLen(1))
					ref := o.GetOwnerReferences()[0]
					g.Expect(ref.UID).To(Equal(svc.UID))
					g.Expect(*ref.Controller && *ref.BlockOwnerDeletion).To(BeTrue())
				}, timeout, interval).Should(Succeed())
			}
			waitSubnetCounters(t, f.subnet, 1, 248)

			leave(t, svc)

			for _, o := range owned {
				waitGone(t, o)
			}
			// The namespace's lb pod identity is no one Service's: it stays for the next.
			for _, o := range []client.Object{&corev1.ServiceAccount{}, &rbacv1.RoleBinding{}} {
				g.Expect(k8s.Get(context.Background(), client.ObjectKey{Namespace: f.ns, Name: "lbsvc-lbpod"}, o)).To(Succeed())
				g.Expect(o.GetOwnerReferences()).To(BeEmpty())
			}
			waitSubnetCounters(t, f.subnet, 0, 249)
			if name == "deleted" {
				waitGone(t, svc)
			} else {
				g.Eventually(func(g Gomega) {
					s := getService(g, f.ns, "gone")
					g.Expect(s.Finalizers).NotTo(ContainElement(lbv1.CleanupFinalizer))
					g.Expect(s.Annotations).NotTo(HaveKey(lbv1.AllocatedIPsAnnotation))
					g.Expect(s.Annotations).NotTo(HaveKey(lbv1.AllocatedSubnetAnnotation))
					g.Expect(s.Status.LoadBalancer.Ingress).To(BeEmpty())
					g.Expect(findCondition(s.Status.Conditions, decide.ConditionAddressAllocated)).To(BeNil())
					g.Expect(findCondition(s.Status.Conditions, decide.ConditionLBPodAvailable)).To(BeNil())
				}, timeout, interval).Should(Succeed())
			}
			// The address is free for another Service.
			create(t, lbService(f.ns, "next", f.provider, f.ip("40")))
			waitAddress(t, f.ns, "next", f.ip("40"))
		})
	}
}

// 50 Services asking at once for one static address: exactly one gets it, 49 get a Warning.
func TestFiftyServicesOneStaticAddress(t *testing.T) {
	f := newFixture(t)
	want := f.ip("50")
	errs := make(chan error, 50)
	for i := 0; i < 50; i++ {
		go func(i int) {
			errs <- k8s.Create(context.Background(), lbService(f.ns, "race-"+strconv.Itoa(i), f.provider, want))
		}(i)
	}
	g := NewWithT(t)
	for i := 0; i < 50; i++ {
		g.Expect(<-errs).To(Succeed())
	}
	g.Eventually(func(g Gomega) {
		var list corev1.ServiceList
		g.Expect(k8s.List(context.Background(), &list, client.InNamespace(f.ns))).To(Succeed())
		holders, refused := 0, 0
		for _, s := range list.Items {
			c := findCondition(s.Status.Conditions, decide.ConditionAddressAllocated)
			g.Expect(c).NotTo(BeNil(), "service %s has no condition yet", s.Name)
			switch {
			case c.Status == metav1.ConditionTrue:
				g.Expect(ingressIPs(&s)).To(Equal([]string{want}))
				holders++
			case c.Reason == decide.ReasonAddressInUse:
				g.Expect(s.Status.LoadBalancer.Ingress).To(BeEmpty())
				g.Expect(s.Annotations).NotTo(HaveKey(lbv1.AllocatedIPsAnnotation))
				refused++
			}
		}
		g.Expect(holders).To(Equal(1))
		g.Expect(refused).To(Equal(49))
	}, 60*time.Second, 250*time.Millisecond).Should(Succeed())
	g.Eventually(func(g Gomega) {
		var list corev1.EventList
		g.Expect(k8s.List(context.Background(), &list, client.InNamespace(f.ns))).To(Succeed())
		warned := map[string]int{}
		for _, e := range list.Items {
			if e.Type == corev1.EventTypeWarning && e.Reason == decide.ReasonAddressInUse {
				warned[e.InvolvedObject.Name]++
			}
		}
		g.Expect(warned).To(HaveLen(49))
		for name, n := range warned {
			g.Expect(n).To(Equal(1), "service %s", name)
		}
	}, timeout, interval).Should(Succeed())
	waitSubnetCounters(t, f.subnet, 1, 248)
}

// spec.internalTrafficPolicy Local: the Service is served (its lb pod may run beside an
// endpoint), but the AddressAllocated message ends with why traffic may be dropped (the lb pod
// reaches the Service as a pod of its node), and one Warning Event says so; set back to Cluster,
// the message loses it.
func TestInternalTrafficPolicyLocalWarned(t *testing.T) {
	g := NewWithT(t)
	f := newFixture(t)
	svc := lbService(f.ns, "local", f.provider, "")
	svc.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyLocal)
	create(t, svc)
	addr := f.ip("6")
	waitAddress(t, f.ns, "local", addr)
	const warning = "spec.internalTrafficPolicy is Local: the lb pod reaches the Service as a pod of its node, so traffic through the address reaches only endpoints on the lb pod's node and is dropped where it has none; set it to Cluster"
	message := func(g Gomega) string {
		c := findCondition(getService(g, f.ns, "local").Status.Conditions, decide.ConditionAddressAllocated)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Status).To(Equal(metav1.ConditionTrue))
		return c.Message
	}
	g.Eventually(message, timeout, interval).Should(Equal(addr + " from subnet " + f.subnet + "; " + warning))
	g.Eventually(func() []string { return warningMessages(t, f.ns, "local", decide.ReasonInternalTrafficPolicyLocal) }, timeout, interval).
		Should(Equal([]string{warning}))
	update(t, getService(g, f.ns, "local"), func(s *corev1.Service) { s.Labels = map[string]string{"touch": "1"} })
	update(t, getService(g, f.ns, "local"), func(s *corev1.Service) {
		s.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyCluster)
	})
	g.Eventually(message, timeout, interval).Should(Equal(addr + " from subnet " + f.subnet))
	g.Expect(warningMessages(t, f.ns, "local", decide.ReasonInternalTrafficPolicyLocal)).To(Equal([]string{warning}))
}
