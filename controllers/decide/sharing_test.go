package decide

import (
	"fmt"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/lbsvc/lbsvc-operator/controllers/ipam"
	"github.com/lbsvc/lbsvc-operator/controllers/lbobjects"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
)

func sharingService(ns, name string, ann map[string]string, ports ...corev1.ServicePort) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(ns + "-" + name), Annotations: ann},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Ports: ports},
	}
}

func port(proto corev1.Protocol, n int32) corev1.ServicePort {
	return corev1.ServicePort{Protocol: proto, Port: n}
}

func TestParseSharing(t *testing.T) {
	for _, tc := range []struct {
		name   string
		ann    map[string]string
		want   *Sharing
		reason string
		msg    string
	}{
		{name: "not sharing", ann: nil},
		{name: "key", ann: map[string]string{lbv1.AllowSharedIPAnnotation: " dns "}, want: &Sharing{Key: "dns"}},
		{name: "empty key", ann: map[string]string{lbv1.AllowSharedIPAnnotation: ""}, reason: ReasonInvalidSharing, msg: `annotation lbsvc.io/allow-shared-ip="": want a key`},
		{name: "key with a slash", ann: map[string]string{lbv1.AllowSharedIPAnnotation: "a/b"}, reason: ReasonInvalidSharing, msg: `"a/b"`},
		{name: "key too long", ann: map[string]string{lbv1.AllowSharedIPAnnotation: strings.Repeat("k", 64)}, reason: ReasonInvalidSharing},
		{name: "namespaces, own dropped, sorted, deduplicated",
			ann:  map[string]string{lbv1.AllowSharedIPAnnotation: "dns", lbv1.SharedIPNamespacesAnnotation: "team-b, team-a,team-b,,team-x"},
			want: &Sharing{Key: "dns", Namespaces: []string{"team-a", "team-b"}}},
		{name: "any namespace", ann: map[string]string{lbv1.AllowSharedIPAnnotation: "dns", lbv1.SharedIPNamespacesAnnotation: "*"},
			want: &Sharing{Key: "dns", Namespaces: []string{"*"}}},
		{name: "bad namespace", ann: map[string]string{lbv1.AllowSharedIPAnnotation: "dns", lbv1.SharedIPNamespacesAnnotation: "Team_B"},
			reason: ReasonInvalidSharing, msg: `"Team_B" is not a namespace name`},
		{name: "namespaces without a key", ann: map[string]string{lbv1.SharedIPNamespacesAnnotation: "team-b"},
			reason: ReasonInvalidSharing, msg: "is set without lbsvc.io/allow-shared-ip"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ref := ParseSharing(sharingService("team-x", "web", tc.ann))
			if tc.reason != "" {
				if ref == nil || ref.Reason != tc.reason || !strings.Contains(ref.Message, tc.msg) {
					t.Fatalf("ParseSharing = %v, %v; want refusal %s containing %q", got, ref, tc.reason, tc.msg)
				}
				return
			}
			if ref != nil {
				t.Fatalf("refused: %v", ref)
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("ParseSharing = %+v, want %+v", got, tc.want)
			}
		})
	}
	many := strings.Repeat("ns,", 0)
	for i := 0; i <= MaxSharingNamespaces; i++ {
		many += fmt.Sprintf("ns-%d,", i)
	}
	_, ref := ParseSharing(sharingService("a", "web", map[string]string{lbv1.AllowSharedIPAnnotation: "k", lbv1.SharedIPNamespacesAnnotation: many}))
	if ref == nil || !strings.Contains(ref.Message, "names 33 namespaces: at most 32") {
		t.Fatalf("33 namespaces: %v", ref)
	}
	// More ports than a member record holds (the API server allows them without node ports):
	// refused with a reason, not a claim failing on every pass. The bound itself passes.
	ports := func(n int) *corev1.Service {
		svc := sharingService("a", "web", map[string]string{lbv1.AllowSharedIPAnnotation: "k"})
		svc.Spec.Ports = nil
		for i := range n {
			svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Protocol: corev1.ProtocolUDP, Port: int32(1 + i)})
		}
		return svc
	}
	if _, ref := ParseSharing(ports(MaxSharingPorts)); ref != nil {
		t.Fatalf("%d ports: %v", MaxSharingPorts, ref)
	}
	if _, ref := ParseSharing(ports(MaxSharingPorts + 1)); ref == nil || ref.Reason != ReasonInvalidSharing ||
		ref.Message != "annotation lbsvc.io/allow-shared-ip: the Service has 4097 ports; a Service that shares an address may have at most 4096" {
		t.Fatalf("4097 ports: %v", ref)
	}
}

func TestSharingPortsOf(t *testing.T) {
	got := SharingPortsOf([]corev1.ServicePort{port(corev1.ProtocolUDP, 53), port("", 53), port(corev1.ProtocolTCP, 22), port(corev1.ProtocolTCP, 53)})
	if fmt.Sprint(got) != "[TCP/22 TCP/53 UDP/53]" {
		t.Fatalf("SharingPortsOf = %v", got)
	}
}

func member(ns, name string, s Sharing, ports ...corev1.ServicePort) SharingMember {
	return MemberOf(sharingService(ns, name, nil, ports...), s)
}

func TestSharingClash(t *testing.T) {
	dns := Sharing{Key: "dns"}
	tcp53, udp53, tcp80 := port(corev1.ProtocolTCP, 53), port(corev1.ProtocolUDP, 53), port(corev1.ProtocolTCP, 80)
	a := member("team-a", "dns-tcp", dns, tcp53)
	for _, tc := range []struct {
		name    string
		members []SharingMember
		m       SharingMember
		cross   bool
		msg     string // empty: may join
	}{
		{name: "TCP and UDP on one port number", members: []SharingMember{a}, m: member("team-a", "dns-udp", dns, udp53)},
		{name: "the same port and protocol", members: []SharingMember{a}, m: member("team-a", "dns-2", dns, tcp53, tcp80),
			msg: "port TCP/53 is served on the address by Service dns-tcp"},
		{name: "itself with changed ports", members: []SharingMember{a, member("team-a", "web", dns, tcp80)},
			m: member("team-a", "dns-tcp", dns, tcp53, udp53)},
		{name: "itself with a port of another", members: []SharingMember{a, member("team-a", "web", dns, tcp80)},
			m: member("team-a", "dns-tcp", dns, tcp80), msg: "port TCP/80 is served on the address by Service web"},
		{name: "another key", members: []SharingMember{a}, m: member("team-a", "x", Sharing{Key: "web"}, tcp80),
			msg: `shared under another key than "web"`},
		{name: "another namespace without --lb-pod-namespace",
			members: []SharingMember{member("team-a", "dns-tcp", Sharing{Key: "dns", Namespaces: []string{"*"}}, tcp53)},
			m:       member("team-b", "dns-udp", Sharing{Key: "dns", Namespaces: []string{"*"}}, udp53),
			msg:     "needs --lb-pod-namespace"},
		{name: "namespaces named both ways", cross: true,
			members: []SharingMember{member("team-a", "dns-tcp", Sharing{Key: "dns", Namespaces: []string{"team-b"}}, tcp53)},
			m:       member("team-b", "dns-udp", Sharing{Key: "dns", Namespaces: []string{"team-a"}}, udp53)},
		{name: "the joiner does not name the member's namespace", cross: true,
			members: []SharingMember{member("team-a", "dns-tcp", Sharing{Key: "dns", Namespaces: []string{"*"}}, tcp53)},
			m:       member("team-b", "dns-udp", dns, udp53),
			msg:     "a Service of namespace team-a, which annotation lbsvc.io/shared-ip-namespaces does not name"},
		{name: "the member does not accept the joiner's namespace", cross: true,
			members: []SharingMember{member("team-a", "dns-tcp", Sharing{Key: "dns", Namespaces: []string{"team-c"}}, tcp53)},
			m:       member("team-b", "dns-udp", Sharing{Key: "dns", Namespaces: []string{"team-a"}}, udp53),
			msg:     "a Service of namespace team-a shares the address and does not accept namespace team-b"},
		{name: "a clash across namespaces does not name the other Service", cross: true,
			members: []SharingMember{member("team-a", "secret-name", Sharing{Key: "dns", Namespaces: []string{"*"}}, tcp53)},
			m:       member("team-b", "dns", Sharing{Key: "dns", Namespaces: []string{"*"}}, tcp53),
			msg:     "port TCP/53 is served on the address by a Service of another namespace"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ref := SharingClash("dns", tc.members, tc.m, tc.cross)
			if tc.msg == "" {
				if ref != nil {
					t.Fatalf("refused: %v", ref)
				}
				return
			}
			if ref == nil || ref.Reason != ReasonSharingConflict || !strings.Contains(ref.Message, tc.msg) {
				t.Fatalf("SharingClash = %v, want %s containing %q", ref, ReasonSharingConflict, tc.msg)
			}
			if strings.Contains(ref.Message, "secret-name") {
				t.Fatalf("names a Service of another namespace: %s", ref.Message)
			}
		})
	}
}

func TestSharingClashBounds(t *testing.T) {
	dns := Sharing{Key: "dns"}
	var members []SharingMember
	for i := 0; i < MaxSharingMembers; i++ {
		members = append(members, member("a", fmt.Sprintf("s%d", i), dns, port(corev1.ProtocolTCP, int32(1000+i))))
	}
	ref := SharingClash("dns", members, member("a", "late", dns, port(corev1.ProtocolTCP, 80)), false)
	if ref == nil || !strings.Contains(ref.Message, "already shared by 32 Services") {
		t.Fatalf("33rd member: %v", ref)
	}
	// A member already in (same UID) is not counted against itself.
	if ref := SharingClash("dns", members, members[3], false); ref != nil {
		t.Fatalf("a member of a full address refused: %v", ref)
	}
	// Many clashing ports: the message lists eight and counts the rest.
	var ports []corev1.ServicePort
	for i := int32(1); i <= 100; i++ {
		ports = append(ports, port(corev1.ProtocolUDP, i))
	}
	ref = SharingClash("dns", []SharingMember{member("a", "x", dns, ports...)}, member("a", "y", dns, ports...), false)
	if ref == nil || !strings.Contains(ref.Message, "UDP/8, and 92 more") {
		t.Fatalf("100 clashing ports: %v", ref)
	}
}

// FuzzSharingClash holds the rules against any members: the answer is nil exactly when the
// joiner's key matches, no other member serves one of its ports, namespaces accept each other
// (with cross-namespace allowed), and there is room; a refusal is bounded and never names a
// Service of another namespace.
func FuzzSharingClash(f *testing.F) {
	f.Add([]byte{1, 2, 3}, uint8(0), true, true)
	f.Add([]byte{53, 53, 0, 80}, uint8(3), false, false)
	f.Fuzz(func(t *testing.T, data []byte, nsBits uint8, cross, sameKey bool) {
		nss := []string{"a", "b", "c"}
		var members []SharingMember
		for i := 0; i+1 < len(data) && len(members) < MaxSharingMembers+2; i += 2 {
			ns := nss[int(data[i])%3]
			s := Sharing{Key: "k"}
			if nsBits&(1<<(i%8)) != 0 {
				s.Namespaces = []string{nss[int(data[i+1])%3]}
			}
			if data[i]%7 == 0 {
				s.Namespaces = []string{AnyNamespace}
			}
			proto := []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP}[int(data[i+1])%3]
			members = append(members, member(ns, fmt.Sprintf("m%d", i), s, port(proto, int32(data[i+1]%5)+1)))
		}
		if len(members) == 0 {
			return
		}
		m := members[len(members)-1]
		members = members[:len(members)-1]
		if !sameKey {
			m.Key = "other"
		}
		ref := SharingClash("k", members, m, cross)
		want := sameKey
		for _, o := range members {
			if o.Namespace != m.Namespace && (!cross || !m.accepts(o.Namespace) || !o.accepts(m.Namespace)) {
				want = false
			}
			if len(commonPorts(o.Ports, m.Ports)) > 0 {
				want = false
			}
		}
		if len(members) >= MaxSharingMembers {
			want = false
		}
		if (ref == nil) != want {
			t.Fatalf("SharingClash = %v, want allowed=%v (members %v, joiner %v, cross %v)", ref, want, members, m, cross)
		}
		if ref != nil {
			if len(ref.Message) > MaxMessageBytes {
				t.Fatalf("message of %d bytes", len(ref.Message))
			}
			for _, o := range members {
				if o.Namespace != m.Namespace && strings.Contains(ref.Message, "Service "+o.Name+" (") {
					t.Fatalf("names %s/%s of another namespace: %s", o.Namespace, o.Name, ref.Message)
				}
			}
		}
	})
}

// TestDecideServiceSharing: the plan of a Service that shares, exact: it keeps only addresses of
// its key whose other members it does not clash with, asks for a rejoin when its record is out of
// date, and claims as a member.
func TestDecideServiceSharing(t *testing.T) {
	sn := planSubnet("sn", "10.0.0.0/24", 0)
	shares := func(key string) func(*corev1.Service) {
		return func(s *corev1.Service) {
			s.Annotations[lbv1.AllowSharedIPAnnotation] = key
			s.Spec.ClusterIPs, s.Spec.IPFamilies = s.Spec.ClusterIPs[:1], s.Spec.IPFamilies[:1]
		}
	}
	me := MemberOf(planService(shares("dns")), Sharing{Key: "dns"})
	other := lbv1.IPMember{Namespace: "team", Name: "dns-udp", UID: "u2", Ports: []string{"UDP/53"}}
	clashing := lbv1.IPMember{Namespace: "team", Name: "web-2", UID: "u3", Ports: []string{"TCP/80"}}
	sharedIP := func(key string, members ...lbv1.IPMember) OwnedIP {
		o := owned("10.0.0.7", "10.0.0.7", "sn", false)
		o.SharingKey, o.Members, o.Member = key, members, "u1"
		return o
	}
	for name, tc := range map[string]struct {
		svc   *corev1.Service
		owned []OwnedIP
		want  Plan
	}{
		"a new member claims as one": {
			svc:  planService(shares("dns")),
			want: Plan{Claims: []Claim{{Family: ipam.IPv4, Share: &me}}},
		},
		"its shared address kept, record current": {
			svc:   planService(shares("dns")),
			owned: []OwnedIP{sharedIP("dns", MemberRecord(me), other)},
			want:  Plan{Keep: []OwnedIP{sharedIP("dns", MemberRecord(me), other)}},
		},
		"its ports changed: kept, and joined again": {
			svc:   planService(shares("dns")),
			owned: []OwnedIP{sharedIP("dns", lbv1.IPMember{Namespace: "team", Name: "web", UID: "u1", Ports: []string{"TCP/8080"}}, other)},
			want: Plan{Keep: []OwnedIP{sharedIP("dns", lbv1.IPMember{Namespace: "team", Name: "web", UID: "u1", Ports: []string{"TCP/8080"}}, other)},
				Rejoin: []OwnedIP{sharedIP("dns", lbv1.IPMember{Namespace: "team", Name: "web", UID: "u1", Ports: []string{"TCP/8080"}}, other)}},
		},
		"its ports now clash with another member's: it leaves and claims again": {
			svc:   planService(shares("dns")),
			owned: []OwnedIP{sharedIP("dns", MemberRecord(me), clashing)},
			want:  Plan{Claims: []Claim{{Family: ipam.IPv4, Share: &me}}, Drain: []OwnedIP{sharedIP("dns", MemberRecord(me), clashing)}},
		},
		"its key changed: it leaves and claims under the new one": {
			svc:   planService(shares("dns")),
			owned: []OwnedIP{sharedIP("web", MemberRecord(me))},
			want:  Plan{Claims: []Claim{{Family: ipam.IPv4, Share: &me}}, Drain: []OwnedIP{sharedIP("web", MemberRecord(me))}},
		},
		"it stopped sharing: its shared address drains (it leaves), an own one is claimed": {
			svc:   planService(shares("dns"), func(s *corev1.Service) { delete(s.Annotations, lbv1.AllowSharedIPAnnotation) }),
			owned: []OwnedIP{sharedIP("dns", MemberRecord(me))},
			want:  Plan{Claims: []Claim{{Family: ipam.IPv4}}, Drain: []OwnedIP{sharedIP("dns", MemberRecord(me))}},
		},
		"an unshared address is not kept by a sharing Service": {
			svc:   planService(shares("dns")),
			owned: []OwnedIP{owned("10.0.0.7", "10.0.0.7", "sn", false)},
			want:  Plan{Claims: []Claim{{Family: ipam.IPv4, Share: &me}}, Drain: []OwnedIP{owned("10.0.0.7", "10.0.0.7", "sn", false)}},
		},
		"its own address asked for with a key it holds it without: it drains first (two Deployments must not hold it), then is claimed again": {
			svc:   planService(shares("dns"), func(s *corev1.Service) { s.Annotations[lbv1.LoadBalancerIPsAnnotation] = "10.0.0.7" }),
			owned: []OwnedIP{owned("10.0.0.7", "10.0.0.7", "sn", false)},
			want: Plan{Action: PlanTeardown, Drain: []OwnedIP{owned("10.0.0.7", "10.0.0.7", "sn", false)}, Refusal: &Refusal{ReasonAddressDraining,
				`10.0.0.7, held unshared, is asked for shared under the key "dns": it drains from the lb pods that hold it now, then this Service claims it again (kubectl get ip 10.0.0.7)`}},
		},
		"its own shared address asked for without a key: the same, the other way": {
			svc: planService(shares("dns"), func(s *corev1.Service) {
				delete(s.Annotations, lbv1.AllowSharedIPAnnotation)
				s.Annotations[lbv1.LoadBalancerIPsAnnotation] = "10.0.0.7"
			}),
			owned: []OwnedIP{sharedIP("dns", MemberRecord(me))},
			want: Plan{Action: PlanTeardown, Drain: []OwnedIP{sharedIP("dns", MemberRecord(me))}, Refusal: &Refusal{ReasonAddressDraining,
				`10.0.0.7, held shared under the key "dns", is asked for unshared: it drains from the lb pods that hold it now, then this Service claims it again (kubectl get ip 10.0.0.7)`}},
		},
		"its shared address asked for without a key while another member shares it: it leaves, and its claim meets the other member": {
			svc: planService(shares("dns"), func(s *corev1.Service) {
				delete(s.Annotations, lbv1.AllowSharedIPAnnotation)
				s.Annotations[lbv1.LoadBalancerIPsAnnotation] = "10.0.0.7"
			}),
			owned: []OwnedIP{sharedIP("dns", MemberRecord(me), other)},
			want:  Plan{Claims: []Claim{{Family: ipam.IPv4, Static: netip.MustParseAddr("10.0.0.7"), From: "annotation lbsvc.io/loadBalancerIPs"}}, Drain: []OwnedIP{sharedIP("dns", MemberRecord(me), other)}},
		},
		"lbsvc.io/replicas on a member: not read, and said so": {
			svc: planService(shares("dns"), func(s *corev1.Service) { s.Annotations[lbv1.ReplicasAnnotation] = "1" }),
			want: Plan{Claims: []Claim{{Family: ipam.IPv4, Share: &me}},
				ReplicasWarning: "annotation lbsvc.io/replicas is not read on a Service that shares its address: its lb pods are the address's, 1 of them (--lb-replicas)"},
		},
		"a bad key: refused": {
			svc: planService(shares("a/b")),
			want: Plan{Action: PlanTeardown, Refusal: &Refusal{ReasonInvalidSharing,
				`annotation lbsvc.io/allow-shared-ip="a/b": want a key of at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit`}},
		},
	} {
		t.Run(name, func(t *testing.T) {
			got := DecideService(ServiceInputs{Service: tc.svc, EnableLBSvc: true, NADFound: true, Subnets: []lbv1.Subnet{sn}, Owned: tc.owned})
			if tc.want.Action == 0 {
				tc.want.Action, tc.want.Subnet = PlanServe, "sn"
				if tc.want.Claims != nil && tc.want.Claims[0].Share != nil || tc.want.Keep != nil && tc.svc.Annotations[lbv1.AllowSharedIPAnnotation] != "" {
					tc.want.Share, tc.want.SharedReplicas = &me, 1
				}
			}
			got.SubnetConfig, got.Provider, got.NADName, got.NADNamespace, got.LBPod = ipam.SubnetConfig{}, "", "", "", lbobjects.Params{}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("plan:\n got %+v\nwant %+v", got, tc.want)
				if got.Refusal != nil {
					t.Logf("refusal: %s", got.Refusal.Message)
				}
			}
		})
	}
}

// TestDecideServiceSharingSubnetNotReady: a member whose Subnet is being deleted (or became
// invalid) keeps its shared address and stays a member as its IP object records it, so its lb
// pods keep serving it (labels and admitted ports follow Plan.Share): on the recorded ports its
// spec still has, whatever its annotations say meanwhile. Before, the plan had no Share: the
// pass took the member labels and admitted ports off, and the address's lb pods dropped it.
func TestDecideServiceSharingSubnetNotReady(t *testing.T) {
	sn := planSubnet("sn", "10.0.0.0/24", 0)
	sn.DeletionTimestamp = ptr.To(metav1.Now())
	shares := func(s *corev1.Service) {
		s.Annotations[lbv1.AllowSharedIPAnnotation] = "dns"
		s.Annotations[lbv1.ReplicasAnnotation] = "3"
		s.Spec.ClusterIPs, s.Spec.IPFamilies = s.Spec.ClusterIPs[:1], s.Spec.IPFamilies[:1]
	}
	me := MemberOf(planService(shares), Sharing{Key: "dns"}) // TCP/80
	other := lbv1.IPMember{Namespace: "team", Name: "dns-udp", UID: "u2", Ports: []string{"UDP/53"}}
	held := owned("10.0.0.7", "10.0.0.7", "sn", false)
	held.SharingKey, held.Members, held.Member = "dns", []lbv1.IPMember{MemberRecord(me), other}, "u1"
	const kept = `subnet "sn" is being deleted; the Service keeps 10.0.0.7 and nothing new is handed out`
	const warning = "annotation lbsvc.io/replicas is not read on a Service that shares its address: its lb pods are the address's, 2 of them (--lb-replicas)"
	for name, tc := range map[string]struct {
		svc  *corev1.Service
		want *SharingMember
	}{
		"a member keeps serving as recorded": {svc: planService(shares), want: &me},
		"a port added since is not admitted": {
			svc: planService(shares, func(s *corev1.Service) {
				s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Port: 53, Protocol: corev1.ProtocolUDP})
			}),
			want: &me,
		},
		"its key removed meanwhile: still the member recorded": {
			svc:  planService(shares, func(s *corev1.Service) { delete(s.Annotations, lbv1.AllowSharedIPAnnotation) }),
			want: &me,
		},
		"no recorded port left in its spec: no member to serve": {
			svc: planService(shares, func(s *corev1.Service) { s.Spec.Ports[0].Port = 8080 }),
		},
	} {
		t.Run(name, func(t *testing.T) {
			got := DecideService(ServiceInputs{Service: tc.svc, EnableLBSvc: true, NADFound: true, Subnets: []lbv1.Subnet{sn},
				Owned: []OwnedIP{held}, LBPod: lbobjects.Params{Replicas: 2}})
			want := Plan{Action: PlanServe, Subnet: "sn", Keep: []OwnedIP{held}, HoldObjects: true,
				Refusal: &Refusal{ReasonSubnetNotReady, kept}, ReplicasWarning: warning, Share: tc.want, SharedReplicas: 2}
			if tc.want == nil {
				want.ReplicasWarning, want.SharedReplicas = "", 0
			}
			got.SubnetConfig, got.Provider, got.NADName, got.NADNamespace, got.LBPod = ipam.SubnetConfig{}, "", "", "", lbobjects.Params{}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("plan:\n got %+v\nwant %+v", got, want)
				if got.Share != nil {
					t.Logf("share: %+v", *got.Share)
				}
			}
		})
	}
}

func TestMemberNames(t *testing.T) {
	rec := func(ns, name string) lbv1.IPMember { return lbv1.IPMember{Namespace: ns, Name: name} }
	if got := MemberNames("a", []lbv1.IPMember{rec("a", "dns-tcp"), rec("a", "dns-udp"), rec("b", "web")}); got != "dns-tcp,dns-udp,b/web" {
		t.Fatalf("MemberNames = %q", got)
	}
	if got := MemberNames("a", nil); got != "" {
		t.Fatalf("no members: %q", got)
	}
	var many []lbv1.IPMember
	for i := 0; i < MaxSharingMembers; i++ {
		many = append(many, rec("a", fmt.Sprintf("service-with-a-long-name-%02d", i)))
	}
	got := MemberNames("a", many)
	if len(got) > MaxMemberNamesBytes || !strings.HasSuffix(got, ",+23") || !strings.HasPrefix(got, "service-with-a-long-name-00,") {
		t.Fatalf("32 long names: %q (%d bytes)", got, len(got))
	}
}

// TestMembersToWake: an object labelled with a shared address wakes its members only when it is
// provably the address's: every member from the owner's lb pod namespace, the members of its own
// namespace from a member namespace, none from anywhere else or without our labels and the
// owner's UID (a tenant's forgery in another namespace wakes no one).
func TestMembersToWake(t *testing.T) {
	owner := lbv1.IPOwner{Namespace: "a", Name: "dns", UID: "u-dns"}
	members := []lbv1.IPMember{{Namespace: "a", Name: "dns", UID: "u-dns"}, {Namespace: "a", Name: "web", UID: "u-web"}, {Namespace: "b", Name: "mdns", UID: "u-mdns"}}
	obj := func(ns, uid string) *corev1.ServiceAccount {
		return &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Labels: map[string]string{
			lbv1.ComponentLabel: lbv1.ComponentLBPod, lbobjects.ManagedByLabel: lbobjects.ManagedByValue,
			lbv1.SharedIPLabel: "10.0.0.7", lbv1.ServiceUIDLabel: uid}}}
	}
	unlabelled := obj("a", "u-dns")
	delete(unlabelled.Labels, lbobjects.ManagedByLabel)
	for name, tc := range map[string]struct {
		obj            *corev1.ServiceAccount
		lbPodNamespace string
		want           []lbv1.IPMember
	}{
		"in the owner's namespace, the lb pods' without the flag: every member": {obj: obj("a", "u-dns"), want: members},
		"in the lb pod namespace: every member":                                 {obj: obj("lbsvc-system", "u-dns"), lbPodNamespace: "lbsvc-system", want: members},
		"in a member namespace: its members":                                    {obj: obj("b", "u-dns"), lbPodNamespace: "lbsvc-system", want: members[2:]},
		"in the owner's namespace with the flag: its members":                   {obj: obj("a", "u-dns"), lbPodNamespace: "lbsvc-system", want: members[:2]},
		"in another namespace: no one":                                          {obj: obj("c", "u-dns")},
		"another UID: no one":                                                   {obj: obj("a", "u-web")},
		"without our labels: no one":                                            {obj: unlabelled},
	} {
		t.Run(name, func(t *testing.T) {
			if got := MembersToWake(tc.obj, owner, members, tc.lbPodNamespace); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("MembersToWake = %+v, want %+v", got, tc.want)
			}
		})
	}
}
