package decide

import (
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lbsvc/lbsvc-operator/controllers/lbobjects"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
	"github.com/lbsvc/lbsvc-operator/controllers/ipam"
)

const planProvider = "nad.kube-system"

func planSubnet(name, cidr string, age int) lbv1.Subnet {
	return lbv1.Subnet{
		ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(time.Unix(int64(1000+age), 0))},
		Spec:       lbv1.SubnetSpec{Provider: planProvider, CIDRBlock: cidr},
	}
}

func planService(mutate ...func(*corev1.Service)) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "team", UID: "u1",
			Annotations: map[string]string{lbv1.AttachmentProviderAnnotation: planProvider}},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer,
			ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10", "fd00:96::10"},
			IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol},
			Ports:      []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}},
	}
	for _, m := range mutate {
		m(s)
	}
	return s
}

func owned(name, addr, subnet string, draining bool) OwnedIP {
	return OwnedIP{Name: name, Addr: netip.MustParseAddr(addr), Subnet: subnet, Draining: draining}
}

// leftLBDeployment is an lb Deployment as the cache shows ours, for the Service of uid.
func leftLBDeployment(uid string) *appsv1.Deployment {
	return &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "lb-svc-web", Labels: map[string]string{
		lbv1.ComponentLabel: lbv1.ComponentLBPod, lbobjects.ManagedByLabel: lbobjects.ManagedByValue, lbv1.ServiceUIDLabel: uid}}}
}

func withCondition(s *corev1.Service) {
	s.Status.Conditions = []metav1.Condition{{Type: ConditionAddressAllocated, Status: metav1.ConditionTrue, Reason: ReasonAllocated}}
}

// The decisions of the Service reconciler, exact: which addresses are kept, claimed and drained,
// and why a Service is refused.
func TestDecideService(t *testing.T) {
	sn := planSubnet("sn", "10.0.0.0/24", 0)
	dual := planSubnet("dual", "10.1.0.0/24,fd00::/64", 0)
	foreignClass := func(s *corev1.Service) {
		s.Spec.LoadBalancerClass = ptr.To("metallb.io/l2")
		s.Finalizers = []string{lbv1.CleanupFinalizer}
		s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{Hostname: "lb.example"}}
	}
	tests := map[string]struct {
		in   ServiceInputs
		want Plan
	}{
		"new Service claims one address per family": {
			in:   ServiceInputs{Service: planService(), NADFound: true, Subnets: []lbv1.Subnet{dual}},
			want: Plan{Action: PlanServe, Subnet: "dual", Claims: []Claim{{Family: ipam.IPv4}, {Family: ipam.IPv6}}},
		},
		"held address kept, nothing claimed": {
			in: ServiceInputs{Service: planService(), NADFound: true, Subnets: []lbv1.Subnet{sn},
				Owned: []OwnedIP{owned("10.0.0.7", "10.0.0.7", "sn", false)}},
			want: Plan{Action: PlanServe, Subnet: "sn", Keep: []OwnedIP{owned("10.0.0.7", "10.0.0.7", "sn", false)}},
		},
		"two claims for one family (two operators raced): the published one stays, the other drains": {
			in: ServiceInputs{Service: planService(func(s *corev1.Service) {
				s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "10.0.0.9"}}
			}), NADFound: true, Subnets: []lbv1.Subnet{sn},
				Owned: []OwnedIP{owned("10.0.0.7", "10.0.0.7", "sn", false), owned("10.0.0.9", "10.0.0.9", "sn", false)}},
			want: Plan{Action: PlanServe, Subnet: "sn", Keep: []OwnedIP{owned("10.0.0.9", "10.0.0.9", "sn", false)},
				Drain: []OwnedIP{owned("10.0.0.7", "10.0.0.7", "sn", false)}},
		},
		"two claims, none published: the lowest stays": {
			in: ServiceInputs{Service: planService(), NADFound: true, Subnets: []lbv1.Subnet{sn},
				Owned: []OwnedIP{owned("10.0.0.9", "10.0.0.9", "sn", false), owned("10.0.0.7", "10.0.0.7", "sn", false)}},
			want: Plan{Action: PlanServe, Subnet: "sn", Keep: []OwnedIP{owned("10.0.0.7", "10.0.0.7", "sn", false)},
				Drain: []OwnedIP{owned("10.0.0.9", "10.0.0.9", "sn", false)}},
		},
		"static address changed: claim the new one, drain the old after": {
			in: ServiceInputs{Service: planService(static("10.0.0.20")), NADFound: true, Subnets: []lbv1.Subnet{sn},
				Owned: []OwnedIP{owned("10.0.0.7", "10.0.0.7", "sn", false)}},
			want: Plan{Action: PlanServe, Subnet: "sn", Claims: []Claim{{Family: ipam.IPv4, Static: netip.MustParseAddr("10.0.0.20"), From: FromLoadBalancerIP}},
				Drain: []OwnedIP{owned("10.0.0.7", "10.0.0.7", "sn", false)}},
		},
		"annotation changed: claim its address (named by the annotation), drain the old after": {
			in: ServiceInputs{Service: planService(func(s *corev1.Service) { s.Annotations[lbv1.LoadBalancerIPsAnnotation] = "10.0.0.21" }),
				NADFound: true, Subnets: []lbv1.Subnet{sn}, Owned: []OwnedIP{owned("10.0.0.20", "10.0.0.20", "sn", false)}},
			want: Plan{Action: PlanServe, Subnet: "sn", Claims: []Claim{{Family: ipam.IPv4, Static: netip.MustParseAddr("10.0.0.21"), From: FromLoadBalancerIPs}},
				Drain: []OwnedIP{owned("10.0.0.20", "10.0.0.20", "sn", false)}},
		},
		"annotation and field disagree: refused, the held address drains": {
			in: ServiceInputs{Service: planService(static("10.0.0.22"), func(s *corev1.Service) { s.Annotations[lbv1.LoadBalancerIPsAnnotation] = "10.0.0.21" }),
				NADFound: true, Subnets: []lbv1.Subnet{sn}, Owned: []OwnedIP{owned("10.0.0.21", "10.0.0.21", "sn", false)}},
			want: Plan{Action: PlanTeardown, Refusal: &Refusal{ReasonLoadBalancerIPConflict,
				`annotation lbsvc.io/loadBalancerIPs "10.0.0.21" and spec.loadBalancerIP "10.0.0.22" ask for different addresses; remove spec.loadBalancerIP (deprecated upstream; the annotation takes its place)`},
				Drain: []OwnedIP{owned("10.0.0.21", "10.0.0.21", "sn", false)}},
		},
		"a draining address of the Service is neither kept nor drained again": {
			in: ServiceInputs{Service: planService(), NADFound: true, Subnets: []lbv1.Subnet{sn},
				Owned: []OwnedIP{owned("10.0.0.7", "10.0.0.7", "sn", true)}},
			want: Plan{Action: PlanServe, Subnet: "sn", Claims: []Claim{{Family: ipam.IPv4}}},
		},
		"address now excluded by the Subnet: claim another, drain it": {
			in: ServiceInputs{Service: planService(), NADFound: true, Subnets: []lbv1.Subnet{func() lbv1.Subnet {
				s := sn
				s.Spec.ExcludeIPs = []string{"10.0.0.7"}
				return s
			}()}, Owned: []OwnedIP{owned("10.0.0.7", "10.0.0.7", "sn", false)}},
			want: Plan{Action: PlanServe, Subnet: "sn", Claims: []Claim{{Family: ipam.IPv4}},
				Drain: []OwnedIP{owned("10.0.0.7", "10.0.0.7", "sn", false)}},
		},
		"deleted: let go of everything": {
			in: ServiceInputs{Service: planService(deleting), NADFound: true, Subnets: []lbv1.Subnet{sn},
				Owned: []OwnedIP{owned("10.0.0.7", "10.0.0.7", "sn", false)}},
			want: Plan{Action: PlanTeardown, Drain: []OwnedIP{owned("10.0.0.7", "10.0.0.7", "sn", false)}, RemoveFinalizer: true, Deleting: true},
		},
		"foreign class with the cleanup finalizer and a hostname: not ours, untouched": {
			in:   ServiceInputs{Service: planService(foreignClass), Subnets: []lbv1.Subnet{sn}},
			want: Plan{Action: PlanNothing},
		},
		"foreign class, deleted, never ours: untouched": {
			in:   ServiceInputs{Service: planService(foreignClass, deleting), Subnets: []lbv1.Subnet{sn}},
			want: Plan{Action: PlanNothing},
		},
		"unannotated, no default provider, cleanup finalizer from a cloud controller: untouched": {
			in: ServiceInputs{Service: planService(func(s *corev1.Service) {
				delete(s.Annotations, lbv1.AttachmentProviderAnnotation)
				s.Finalizers = []string{lbv1.CleanupFinalizer}
			}), Subnets: []lbv1.Subnet{sn}},
			want: Plan{Action: PlanNothing},
		},
		// Our class without a provider is not served, silently, as README's troubleshooting
		// says: removing the annotation is how a Service of our class leaves (TestCleanup).
		"our class without a provider (none annotated, no default): nothing": {
			in: ServiceInputs{Service: planService(func(s *corev1.Service) {
				delete(s.Annotations, lbv1.AttachmentProviderAnnotation)
				s.Spec.LoadBalancerClass = ptr.To(lbv1.LoadBalancerClass)
			}), Subnets: []lbv1.Subnet{sn}, EnableLBSvc: true},
			want: Plan{Action: PlanNothing},
		},
		"class changed away from us after we served it: let go": {
			in: ServiceInputs{Service: planService(foreignClass, withCondition), Subnets: []lbv1.Subnet{sn},
				Owned: []OwnedIP{owned("10.0.0.7", "10.0.0.7", "sn", false)}},
			want: Plan{Action: PlanTeardown, Drain: []OwnedIP{owned("10.0.0.7", "10.0.0.7", "sn", false)}, RemoveFinalizer: true},
		},
		"not served, nothing of ours on it, but an lb Deployment of ours for it (a late write): torn down, the finalizer left alone": {
			in: ServiceInputs{Service: planService(func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeClusterIP }),
				LBDeployment: leftLBDeployment("u1")},
			want: Plan{Action: PlanTeardown},
		},
		// Another controller's class, and a Deployment forged with our labels at our name: its
		// labels prove nothing, so it costs the Service no finalizer (another load balancer
		// controller puts the same one); the Deployment itself is deleted.
		"another class, its cleanup finalizer, a forged lb Deployment: the Deployment goes, the finalizer stays": {
			in: ServiceInputs{Service: planService(foreignClass, func(s *corev1.Service) { s.Finalizers = []string{lbv1.CleanupFinalizer} }),
				LBDeployment: leftLBDeployment("u1")},
			want: Plan{Action: PlanTeardown},
		},
		"not served, a left lb Deployment already being deleted: nothing": {
			in: ServiceInputs{Service: planService(func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeClusterIP }),
				LBDeployment: func() *appsv1.Deployment {
					d := leftLBDeployment("u1")
					d.DeletionTimestamp = &metav1.Time{Time: time.Unix(1, 0)}
					d.Finalizers = []string{"example.com/hold"}
					return d
				}()},
			want: Plan{Action: PlanNothing},
		},
		"not served, an lb Deployment at its name for another UID (an earlier Service of the name): untouched": {
			in: ServiceInputs{Service: planService(func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeClusterIP }),
				LBDeployment: leftLBDeployment("u0")},
			want: Plan{Action: PlanNothing},
		},
		"flag off, served Service deleted: its deletion completes": {
			in:   ServiceInputs{Service: planService(deleting, withCondition), Owned: []OwnedIP{owned("10.0.0.7", "10.0.0.7", "sn", false)}},
			want: Plan{Action: PlanTeardown, Drain: []OwnedIP{owned("10.0.0.7", "10.0.0.7", "sn", false)}, RemoveFinalizer: true, Deleting: true},
		},
		"flag off, served Service alive: nothing changes": {
			in:   ServiceInputs{Service: planService(withCondition), Owned: []OwnedIP{owned("10.0.0.7", "10.0.0.7", "sn", false)}},
			want: Plan{Action: PlanNothing},
		},
		"namespace no longer allowed: refused, the address drains": {
			in: ServiceInputs{Service: planService(), NADFound: true, Subnets: []lbv1.Subnet{func() lbv1.Subnet {
				s := sn
				s.Spec.Namespaces = []string{"other"}
				return s
			}()}, Owned: []OwnedIP{owned("10.0.0.7", "10.0.0.7", "sn", false)}},
			want: Plan{Action: PlanTeardown, Refusal: &Refusal{ReasonNamespaceNotAllowed, `subnet "sn" does not serve namespace "team" (see the subnet's spec.namespaces)`},
				Drain: []OwnedIP{owned("10.0.0.7", "10.0.0.7", "sn", false)}},
		},
		"NAD gone: refused": {
			in: ServiceInputs{Service: planService(), Subnets: []lbv1.Subnet{sn}},
			want: Plan{Action: PlanTeardown, Refusal: &Refusal{ReasonNADNotFound,
				`network attachment definition kube-system/nad (provider "nad.kube-system") does not exist: create it, or correct the annotation ovn.kubernetes.io/attachmentprovider (<nad name>.<nad namespace>)`}},
		},
		"object in the way: refused before anything is claimed": {
			in: ServiceInputs{Service: planService(), NADFound: true, Subnets: []lbv1.Subnet{sn}, ForeignObject: "Deployment team/lb-svc-web"},
			want: Plan{Action: PlanTeardown, Refusal: &Refusal{ReasonObjectConflict,
				"Deployment team/lb-svc-web exists and was not created by lbsvc-operator for this Service; delete or rename it"}},
		},
		"Subnet became invalid (overlap): what it gave stays bound, nothing new": {
			in: ServiceInputs{Service: planService(func(s *corev1.Service) {
				s.Annotations[planProvider+".kubernetes.io/logical_switch"] = "sn"
			}), NADFound: true,
				Subnets: []lbv1.Subnet{planSubnet("sn", "10.0.0.0/24", 5), planSubnet("older", "10.0.0.0/16", 0)},
				Owned:   []OwnedIP{owned("10.0.0.7", "10.0.0.7", "sn", false)}},
			want: Plan{Action: PlanServe, Subnet: "sn", Keep: []OwnedIP{owned("10.0.0.7", "10.0.0.7", "sn", false)}, HoldObjects: true,
				Refusal: &Refusal{ReasonSubnetNotReady, `subnet "sn": subnet "sn" (10.0.0.0/24) overlaps older subnet(s) older; the Service keeps 10.0.0.7 and nothing new is handed out`}},
		},
		"Subnet unparseable (gateway outside): the address stays, the objects are left as they are (no CIDR to build them from)": {
			in: ServiceInputs{Service: planService(), NADFound: true, Subnets: []lbv1.Subnet{func() lbv1.Subnet {
				s := sn
				s.Spec.Gateway = "10.9.9.1"
				return s
			}()}, Owned: []OwnedIP{owned("10.0.0.7", "10.0.0.7", "sn", false)}},
			want: Plan{Action: PlanServe, Subnet: "sn", Keep: []OwnedIP{owned("10.0.0.7", "10.0.0.7", "sn", false)}, HoldObjects: true,
				Refusal: &Refusal{ReasonSubnetNotReady, `subnet "sn": subnet "sn": gateway 10.9.9.1 is outside 10.0.0.0/24: invalid subnet configuration; the Service keeps 10.0.0.7 and nothing new is handed out`}},
		},
		"Subnet invalid and nothing held: refused": {
			in: ServiceInputs{Service: planService(func(s *corev1.Service) {
				s.Annotations[planProvider+".kubernetes.io/logical_switch"] = "sn"
			}), NADFound: true, Subnets: []lbv1.Subnet{planSubnet("sn", "10.0.0.0/24", 5), planSubnet("older", "10.0.0.0/16", 0)}},
			want: Plan{Action: PlanTeardown, Refusal: &Refusal{ReasonSubnetNotReady, `subnet "sn": subnet "sn" (10.0.0.0/24) overlaps older subnet(s) older`}},
		},
		"static address of the wrong family: refused": {
			in:   ServiceInputs{Service: planService(static("fd00::5")), NADFound: true, Subnets: []lbv1.Subnet{sn}},
			want: Plan{Action: PlanTeardown, Refusal: &Refusal{ReasonAddressFamily, `spec.loadBalancerIP fd00::5 is IPv6 but subnet "sn" serves only IPv4`}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			tc.in.EnableLBSvc = !strings.HasPrefix(name, "flag off")
			got := DecideService(tc.in)
			// The parsed Subnet and NAD names are checked where they matter, not in every row.
			got.SubnetConfig, got.Provider, got.NADName, got.NADNamespace = ipam.SubnetConfig{}, "", "", ""
			// The lb pod parameters have their own test (TestDecideServiceLBPod).
			got.LBPod = lbobjects.Params{}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("plan:\n got %+v\nwant %+v", got, tc.want)
				if got.Refusal != nil {
					t.Logf("refusal: %s", got.Refusal.Message)
				}
			}
		})
	}
}

// A plan never keeps and drains the same address, and what it keeps is always a bound address
// the Service owns in the chosen Subnet; with sharing (share's low bit: the Service has key "k";
// other bits: which owned addresses are shared, under "k" or "j", with another member whose port
// may clash), it keeps only addresses of its own key whose other members it does not clash with,
// rejoins only kept ones, and claims as a member exactly when it shares.
func FuzzDecideService(f *testing.F) {
	f.Add("10.0.0.0/24", "", uint8(3), uint8(1), false, "", uint8(0))
	f.Add("10.1.0.0/24,fd00::/64", "10.1.0.9", uint8(7), uint8(2), true, "10.0.0.0/24", uint8(0))
	f.Add("10.0.0.0/24", "", uint8(4), uint8(0), false, "", uint8(0xff))
	f.Fuzz(func(t *testing.T, cidr, lbIP string, nOwned, mask uint8, del bool, other string, share uint8) {
		subnets := []lbv1.Subnet{planSubnet("sn", cidr, 1)}
		if other != "" {
			subnets = append(subnets, planSubnet("other", other, 0))
		}
		svc := planService(static(lbIP))
		svc.Annotations[planProvider+".kubernetes.io/logical_switch"] = "sn"
		key := ""
		if share&1 != 0 {
			key = "k"
			svc.Annotations[lbv1.AllowSharedIPAnnotation] = key
		}
		me := MemberRecord(MemberOf(svc, Sharing{Key: "k"}))
		if del {
			deleting(svc)
		}
		var own []OwnedIP
		for i := 0; i < int(nOwned%8); i++ {
			a := netip.AddrFrom4([4]byte{10, byte(i % 2), 0, byte(i + 5)})
			sub := "sn"
			if mask&(1<<i) != 0 {
				sub = "other"
			}
			o := OwnedIP{Name: a.String(), Addr: a, Subnet: sub, Draining: i == 6}
			if i == 4 || i == 5 {
				o.Conflict = &lbv1.IPConflictStatus{MAC: "02:00:00:00:00:09"}
			}
			if share&(1<<(i%7+1)) != 0 {
				o.SharingKey, o.Member = "k", string(svc.UID)
				if i%3 == 0 {
					o.SharingKey = "j"
				}
				port := []string{"TCP/80", "UDP/80", "TCP/443"}[i%3] // TCP/80 clashes with the Service's
				o.Members = []lbv1.IPMember{me, {Namespace: svc.Namespace, Name: "other", UID: "u-other", Ports: []string{port}}}
			}
			own = append(own, o)
		}
		p := DecideService(ServiceInputs{Service: svc, EnableLBSvc: true, NADFound: true, Subnets: subnets, Owned: own})
		for _, k := range p.Keep {
			if k.Draining || k.Conflict != nil || k.Subnet != p.Subnet {
				t.Fatalf("kept %+v (subnet %q)", k, p.Subnet)
			}
			for _, d := range p.Drain {
				if d.Name == k.Name {
					t.Fatalf("%s both kept and drained", k.Name)
				}
			}
		}
		for _, d := range p.Drain {
			if d.Draining || d.Conflict != nil {
				t.Fatalf("drains %s (draining %v, conflict %v)", d.Name, d.Draining, d.Conflict != nil)
			}
		}
		for _, k := range p.Keep {
			if p.HoldObjects {
				break // an invalid Subnet: the Service keeps what it holds, whatever its kind
			}
			if k.SharingKey != key {
				t.Fatalf("a Service of key %q kept %s of key %q", key, k.Name, k.SharingKey)
			}
			if key != "" && SharingClash(key, MembersOf(key, k.Members), *p.Share, false) != nil {
				t.Fatalf("kept %s whose other member clashes: %+v", k.Name, k.Members)
			}
		}
		for _, r := range p.Rejoin {
			if !slices.ContainsFunc(p.Keep, func(k OwnedIP) bool { return k.Name == r.Name }) {
				t.Fatalf("rejoins %s, which it does not keep", r.Name)
			}
		}
		for _, c := range p.Claims {
			if (c.Share != nil) != (key != "") {
				t.Fatalf("claim %+v of a Service of key %q", c, key)
			}
		}
		if p.Action != PlanServe && (len(p.Keep) > 0 || len(p.Claims) > 0) {
			t.Fatalf("action %v keeps or claims", p.Action)
		}
		if p.Refusal != nil && len(p.Refusal.Message) > 4096 {
			t.Fatalf("refusal message of %d bytes", len(p.Refusal.Message))
		}
	})
}

func deleting(s *corev1.Service) {
	s.DeletionTimestamp = ptr.To(metav1.Now())
	s.Finalizers = []string{lbv1.CleanupFinalizer}
}

func static(ip string) func(*corev1.Service) {
	return func(s *corev1.Service) { s.Spec.LoadBalancerIP = ip }
}

// The Service's own inputs are checked with the Subnet: a Dual Subnet gives an IPv4-only Service
// only its IPv4 address, and garbage source ranges refuse it with a bounded message.
func TestDecideServiceInputs(t *testing.T) {
	dual := planSubnet("dual", "10.1.0.0/24,fd00::/64", 0)
	v4only := func(s *corev1.Service) {
		s.Spec.ClusterIPs, s.Spec.IPFamilies = []string{"10.96.0.10"}, []corev1.IPFamily{corev1.IPv4Protocol}
	}
	p := DecideService(ServiceInputs{Service: planService(v4only), EnableLBSvc: true, NADFound: true, Subnets: []lbv1.Subnet{dual}})
	if p.Action != PlanServe || !reflect.DeepEqual(p.Claims, []Claim{{Family: ipam.IPv4}}) {
		t.Errorf("IPv4-only Service on a Dual Subnet: %+v", p)
	}
	bad := func(s *corev1.Service) { s.Spec.LoadBalancerSourceRanges = []string{strings.Repeat("x", 20000)} }
	p = DecideService(ServiceInputs{Service: planService(bad), EnableLBSvc: true, NADFound: true, Subnets: []lbv1.Subnet{dual},
		Owned: []OwnedIP{owned("10.1.0.7", "10.1.0.7", "dual", false)}})
	if p.Action != PlanTeardown || p.Refusal == nil || p.Refusal.Reason != ReasonInvalidSourceRanges || len(p.Refusal.Message) > MaxMessageBytes {
		t.Fatalf("garbage source ranges: %+v", p)
	}
	if len(p.Drain) != 1 {
		t.Errorf("the refused Service's address must drain: %+v", p.Drain)
	}
}

// The plan carries everything the lb pods are built from: the Service's identity, the attachment,
// the Subnet and the replica count; a bad replicas annotation keeps the default and says why.
// Once the claims are answered, Objects builds every object from it with no other input.
func TestDecideServiceLBPod(t *testing.T) {
	sn := planSubnet("dual", "10.1.0.0/24,fd00::/64", 0)
	settings := lbobjects.Params{Image: "img:1", PodNamespace: "lb-pods", Replicas: 2, Rules: "nftables"}
	for name, tc := range map[string]struct {
		annotation   string
		wantReplicas int32
		wantWarning  string
	}{
		"no annotation: the operator's default":  {"", 2, ""},
		"annotation 1 wins over the default":     {"1", 1, ""},
		"annotation out of range: default, said": {"9", 2, `annotation lbsvc.io/replicas="9": want a whole number from 1 to 5; using 2`},
	} {
		t.Run(name, func(t *testing.T) {
			svc := planService(func(s *corev1.Service) {
				if tc.annotation != "" {
					s.Annotations["lbsvc.io/replicas"] = tc.annotation
				}
			})
			p := DecideService(ServiceInputs{Service: svc, EnableLBSvc: true, NADFound: true, Subnets: []lbv1.Subnet{sn}, LBPod: settings})
			want := lbobjects.Params{ServiceName: "web", ServiceNamespace: "team", ServiceUID: "u1", PodNamespace: "lb-pods",
				Provider: "nad.kube-system", NADName: "nad", NADNamespace: "kube-system", SubnetName: "dual",
				Image: "img:1", Replicas: tc.wantReplicas, Rules: "nftables"}
			if !reflect.DeepEqual(p.LBPod, want) || p.ReplicasWarning != tc.wantWarning {
				t.Fatalf("lb pod params:\n got %+v %q\nwant %+v %q", p.LBPod, p.ReplicasWarning, want, tc.wantWarning)
			}
			// What the address book holds after the claims: both addresses, and an older one
			// still draining, which is not part of the claim the key belongs to.
			owned := []OwnedIP{
				{Name: "10.1.0.5", UID: "ip-old", Addr: netip.MustParseAddr("10.1.0.5"), Subnet: "dual", Draining: true},
				{Name: "10.1.0.7", UID: "ip-v4", Addr: netip.MustParseAddr("10.1.0.7"), Subnet: "dual"},
				{Name: "fd00--7", UID: "ip-v6", Addr: netip.MustParseAddr("fd00::7"), Subnet: "dual"},
			}
			set, err := p.Objects([]netip.Addr{netip.MustParseAddr("fd00::7"), netip.MustParseAddr("10.1.0.7")}, owned)
			if err != nil {
				t.Fatal(err)
			}
			if tc.wantReplicas > 1 {
				wantOwners := []string{"ip-v4", "ip-v6"}
				var got []string
				for _, o := range set.HAKeySecret.OwnerReferences {
					got = append(got, string(o.UID))
				}
				if !reflect.DeepEqual(got, wantOwners) {
					t.Errorf("key Secret owned by %v, want the claim's IP objects %v", got, wantOwners)
				}
			} else if set.HAKeySecret != nil {
				t.Errorf("one lb pod: key Secret %s, want none", set.HAKeySecret.Name)
			}
			env := map[string]string{}
			for _, e := range set.Deployment.Spec.Template.Spec.Containers[0].Env {
				env[e.Name] = e.Value
			}
			if got := env["LBPOD_ADDRESSES"]; got != "10.1.0.7/24,fd00::7/64" {
				t.Errorf("addresses, IPv4 first with their Subnet prefixes: %q", got)
			}
			if got := env["LBPOD_GATEWAYS"]; got != "10.1.0.1,fd00::1" {
				t.Errorf("gateways: %q", got)
			}
			if got := *set.Deployment.Spec.Replicas; got != tc.wantReplicas {
				t.Errorf("Deployment replicas %d, want %d", got, tc.wantReplicas)
			}
			if (set.PodDisruptionBudget != nil) != (tc.wantReplicas > 1) {
				t.Errorf("the budget exists only with standbys: %v", set.PodDisruptionBudget != nil)
			}
		})
	}
}

// A refusal met while the plan is carried out (a claim refused, an object in the way) is a
// teardown that drains every bound address the Service owns, claims of the same pass included.
func TestRefuse(t *testing.T) {
	owns := []OwnedIP{owned("10.0.0.7", "10.0.0.7", "sn", false), owned("10.0.0.8", "10.0.0.8", "sn", true), owned("10.0.0.9", "10.0.0.9", "sn", false)}
	ref := ObjectConflict("Deployment team/lb-svc-web")
	got := Refuse(ref, owns)
	want := Plan{Action: PlanTeardown, Refusal: &Refusal{ReasonObjectConflict,
		"Deployment team/lb-svc-web exists and was not created by lbsvc-operator for this Service; delete or rename it"},
		Drain: []OwnedIP{owned("10.0.0.7", "10.0.0.7", "sn", false), owned("10.0.0.9", "10.0.0.9", "sn", false)}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("refused:\n got %+v\nwant %+v", got, want)
	}
	if c := RefusedCondition(ref); c.Status != metav1.ConditionFalse || c.Reason != ReasonObjectConflict || c.Message != ref.Message {
		t.Errorf("condition %+v", c)
	}
}

// TestIngressAddrs: the addresses come from the status, IPv4 first, never from the mirror
// annotation a tenant may edit; what is not an IP is skipped.
func TestIngressAddrs(t *testing.T) {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{lbv1.AllocatedIPsAnnotation: "10.9.9.9"}}}
	if got := IngressAddrs(svc); got != "" {
		t.Errorf("no ingress: %q, want none (the annotation is not read)", got)
	}
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "fd00::7"}, {Hostname: "lb.example"}, {IP: "172.18.0.7"}, {IP: "172.18.0.7"}}
	if got := IngressAddrs(svc); got != "172.18.0.7,fd00::7" {
		t.Errorf("IngressAddrs = %q, want 172.18.0.7,fd00::7", got)
	}
}

// What a served Service's spec does to traffic through its address without saying so ends the
// AddressAllocated message and goes out as one Warning (the first warning's reason): Local
// internal traffic, ClientIP affinity (every client is the lb pod to kube-proxy), and source
// ranges that name none of a family the address has (every client of that family is refused).
func TestDecideServiceTrafficWarnings(t *testing.T) {
	dual := planSubnet("dual", "10.1.0.0/24,fd00::/64", 0)
	const (
		local    = "spec.internalTrafficPolicy is Local: the lb pod reaches the Service as a pod of its node, so traffic through the address reaches only endpoints on the lb pod's node and is dropped where it has none; set it to Cluster"
		affinity = "spec.sessionAffinity is ClientIP: kube-proxy sees every client of the address as the lb pod, so all of them go to one endpoint"
		noV6     = "spec.loadBalancerSourceRanges name no IPv6 range: every IPv6 client is refused; add one (::/0 for all)"
		noV4     = "spec.loadBalancerSourceRanges name no IPv4 range: every IPv4 client is refused; add one (0.0.0.0/0 for all)"
	)
	ranges := func(r ...string) func(*corev1.Service) {
		return func(s *corev1.Service) { s.Spec.LoadBalancerSourceRanges = r }
	}
	for name, tc := range map[string]struct {
		mutate         []func(*corev1.Service)
		reason, wanted string
	}{
		"none":                    {},
		"ranges of both families": {mutate: []func(*corev1.Service){ranges("192.0.2.0/24", "2001:db8::/32")}},
		"a /0 of one family, a range of the other": {mutate: []func(*corev1.Service){ranges("0.0.0.0/0", "2001:db8::/32")}},
		"IPv4 ranges only, a dual-stack address":   {mutate: []func(*corev1.Service){ranges("192.0.2.0/24")}, reason: ReasonSourceRangesOmitFamily, wanted: noV6},
		"IPv6 ranges only":                         {mutate: []func(*corev1.Service){ranges("2001:db8::/32")}, reason: ReasonSourceRangesOmitFamily, wanted: noV4},
		"ClientIP affinity":                        {mutate: []func(*corev1.Service){func(s *corev1.Service) { s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP }}, reason: ReasonSessionAffinityClientIP, wanted: affinity},
		"all three, the first reason named": {mutate: []func(*corev1.Service){ranges("192.0.2.0/24"), func(s *corev1.Service) {
			s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
			s.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyLocal)
		}}, reason: ReasonInternalTrafficPolicyLocal, wanted: local + "; " + affinity + "; " + noV6},
	} {
		p := DecideService(ServiceInputs{Service: planService(tc.mutate...), NADFound: true, Subnets: []lbv1.Subnet{dual}, EnableLBSvc: true})
		reason := ""
		if len(p.TrafficWarnings) > 0 {
			reason = p.TrafficWarnings[0].Reason
		}
		if p.Action != PlanServe || reason != tc.reason || p.TrafficWarning() != tc.wanted {
			t.Errorf("%s: action %v, warning %q (%s); want served, %q (%s)", name, p.Action, p.TrafficWarning(), reason, tc.wanted, tc.reason)
		}
		if name == "all three, the first reason named" {
			// One Event each, under its own reason: the recorder folds Events of one reason.
			want := []Warning{{ReasonInternalTrafficPolicyLocal, local}, {ReasonSessionAffinityClientIP, affinity}, {ReasonSourceRangesOmitFamily, noV6}}
			if !reflect.DeepEqual(p.TrafficWarnings, want) {
				t.Errorf("warnings %+v, want %+v", p.TrafficWarnings, want)
			}
		}
	}
}
