package lbpod

import (
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// render lays a state out like the seed's listings, one section per command.
func render(st State) string {
	var b strings.Builder
	for _, fam := range []Family{IPv4, IPv6} {
		six := map[Family]string{IPv4: "", IPv6: " -6"}[fam]
		tables := map[Family]string{IPv4: "iptables", IPv6: "ip6tables"}[fam]
		if RenderRules(st, fam) != "" {
			b.WriteString("# ip" + six + " rule\n" + RenderRules(st, fam))
			b.WriteString("# ip" + six + " route show table 100\n" + RenderRoutes(st, fam))
			b.WriteString("# " + tables + " -t nat -S\n" + RenderIPTables(st, fam, "nat"))
		}
		if f := RenderIPTables(st, fam, "filter"); f != "" {
			b.WriteString("# " + tables + " -t filter -S\n" + f)
		}
	}
	b.WriteString("# addresses on " + st.Interface + "\n")
	for _, a := range st.Addresses {
		b.WriteString(a.String() + "\n")
	}
	for _, p := range st.Problems {
		fmt.Fprintf(&b, "# problem %s (not ready: %t): %s\n", p.Reason, p.NotReady, p.Message)
	}
	return b.String()
}

func mustNetwork(t *testing.T, addresses, gateways, subnets string) Network {
	t.Helper()
	n, err := ParseNetwork(addresses, gateways, subnets)
	if err != nil {
		t.Fatalf("ParseNetwork: %v", err)
	}
	return n
}

func addrs(s ...string) []netip.Addr {
	var out []netip.Addr
	for _, a := range s {
		out = append(out, netip.MustParseAddr(a))
	}
	return out
}

func prefixes(s ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, a := range s {
		out = append(out, netip.MustParsePrefix(a))
	}
	return out
}

func TestDesiredGolden(t *testing.T) {
	v4gw := Gateway{Addr: netip.MustParseAddr("10.16.0.1")}
	v6gw := Gateway{Addr: netip.MustParseAddr("fd00:10:16::1")}
	cases := map[string]struct {
		cfg Config
		obs Observed
	}{
		// The seed: ClusterIP 10.109.201.193, eth0's gateway 10.16.0.1, LB 172.18.0.18/16, TCP 80.
		"seed": {
			cfg: Config{
				Network:  mustNetwork(t, "172.18.0.18/16", "172.18.0.1", "172.18.0.0/16"),
				Services: []Service{{ClusterIPs: addrs("10.109.201.193"), Ports: []Port{{TCP, 80}}}},
			},
			obs: Observed{UplinkGateways: map[Family]Gateway{IPv4: v4gw}},
		},
		"all-protocols-source-ranges": {
			cfg: Config{
				Network: mustNetwork(t, "172.18.0.18/16", "172.18.0.1", "172.18.0.0/16"),
				Services: []Service{{
					ClusterIPs:   addrs("10.109.201.193"),
					Ports:        []Port{{TCP, 80}, {UDP, 53}, {SCTP, 3868}, {TCP, 80}},
					SourceRanges: prefixes("172.18.1.0/24", "192.0.2.7/32", "2001:db8::/64"),
				}},
			},
			obs: Observed{UplinkGateways: map[Family]Gateway{IPv4: v4gw}},
		},
		"dual": {
			cfg: Config{
				Network:  mustNetwork(t, "172.18.0.18/16,fd00:172:18::18/64", "172.18.0.1,fd00:172:18::1", "172.18.0.0/16,fd00:172:18::/64"),
				Services: []Service{{ClusterIPs: addrs("10.109.201.193", "fd00:10:96::c1"), Ports: []Port{{TCP, 80}, {UDP, 53}}}},
			},
			obs: Observed{UplinkGateways: map[Family]Gateway{IPv4: v4gw, IPv6: v6gw}},
		},
		// eth0's default route is a device route (no gateway), or an onlink one (Calico).
		"uplink-without-gateway-and-onlink": {
			cfg: Config{
				Network:  mustNetwork(t, "172.18.0.18/16,fd00:172:18::18/64", "172.18.0.1,fd00:172:18::1", "172.18.0.0/16,fd00:172:18::/64"),
				Services: []Service{{ClusterIPs: addrs("10.109.201.193", "fd00:10:96::c1"), Ports: []Port{{TCP, 80}}}},
			},
			obs: Observed{UplinkGateways: map[Family]Gateway{IPv6: {Addr: netip.MustParseAddr("fe80::1"), OnLink: true}}},
		},
		// Everyone (0.0.0.0/0) written without a source match, so that it converges; a /0 beside
		// narrower ranges makes them redundant.
		"source-range-everyone": {
			cfg: Config{
				Network: mustNetwork(t, "172.18.0.18/16", "172.18.0.1", "172.18.0.0/16"),
				Services: []Service{{
					ClusterIPs:   addrs("10.109.201.193"),
					Ports:        []Port{{TCP, 80}},
					SourceRanges: prefixes("0.0.0.0/0"),
				}},
			},
			obs: Observed{UplinkGateways: map[Family]Gateway{IPv4: v4gw}},
		},
		// Ranges as a user may write them: repeated apart, unmasked, and IPv6 ranges whose
		// address glibc spells with a dotted tail (::1.0.0.0/104, ::0.1.0.0/112 in iptables'
		// listing, ::100:0/104 and ::1:0/112 in Go's): each range matched once, every address
		// written as iptables prints it back (or the chains would never compare equal), the
		// ClusterIP and the DNAT target too.
		"source-ranges-spelled-and-repeated": {
			cfg: Config{
				Network: mustNetwork(t, "172.18.0.18/16,fd00:172:18::18/64", "172.18.0.1,fd00:172:18::1", "172.18.0.0/16,fd00:172:18::/64"),
				Services: []Service{{
					ClusterIPs:   addrs("10.109.201.193", "::a00:c1"),
					Ports:        []Port{{TCP, 80}, {UDP, 53}},
					SourceRanges: prefixes("172.18.0.100/32", "::1.0.0.0/104", "10.1.2.3/8", "172.18.0.100/32", "::1:0/112", "10.0.0.0/8", "::100:0/104"),
				}},
			},
			obs: Observed{UplinkGateways: map[Family]Gateway{IPv4: v4gw, IPv6: v6gw}},
		},
		// SCTP refused by the kernel: the SCTP ports are left out and reported, the rest served.
		"no-sctp": {
			cfg: Config{
				Network:  mustNetwork(t, "fd00:172:18::18/64", "fd00:172:18::1", "fd00:172:18::/64"),
				Services: []Service{{ClusterIPs: addrs("fd00:10:96::c1"), Ports: []Port{{TCP, 80}, {SCTP, 3868}, {SCTP, 3869}, {UDP, 53}}}},
			},
			obs: Observed{UplinkGateways: map[Family]Gateway{IPv6: v6gw}, NoSCTP: true},
		},
		// SCTP refused and nothing else to serve: the pod is not ready (it would otherwise hold
		// and announce an address that answers nothing).
		"no-sctp-only": {
			cfg: Config{
				Network:  mustNetwork(t, "172.18.0.18/16", "172.18.0.1", "172.18.0.0/16"),
				Services: []Service{{ClusterIPs: addrs("10.96.0.77"), Ports: []Port{{SCTP, 3868}}}},
			},
			obs: Observed{UplinkGateways: map[Family]Gateway{IPv4: v4gw}, NoSCTP: true},
		},
		// A dual-stack LB for a single-stack Service: the IPv6 side has no ClusterIP to reach,
		// which is a named problem that keeps the pod not ready.
		"dual-lb-single-stack-service": {
			cfg: Config{
				Network:  mustNetwork(t, "172.18.0.18/16,fd00:172:18::18/64", "172.18.0.1,fd00:172:18::1", "172.18.0.0/16,fd00:172:18::/64"),
				Services: []Service{{ClusterIPs: addrs("10.109.201.193"), Ports: []Port{{TCP, 80}}}},
			},
			obs: Observed{UplinkGateways: map[Family]Gateway{IPv4: v4gw, IPv6: v6gw}},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := render(Desired(tc.cfg, tc.obs, Names{}))
			path := filepath.Join("testdata", name+".golden")
			if *update {
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("read golden (run go test ./lbpod -update to create): %v", err)
			}
			if got != string(want) {
				t.Errorf("desired state differs from %s\n--- got\n%s--- want\n%s", path, got, want)
			}
		})
	}
}

func TestParseNetworkErrors(t *testing.T) {
	cases := map[string]struct {
		addresses, gateways, subnets string
		want                         string
	}{
		"bad address": {"172.18.0.300/16", "172.18.0.1", "172.18.0.0/16",
			`addresses "172.18.0.300/16": "172.18.0.300/16" is not an address with a prefix length (like 172.18.0.18/16)`},
		"no prefix": {"172.18.0.18", "172.18.0.1", "172.18.0.0/16",
			`addresses "172.18.0.18": "172.18.0.18" is not an address with a prefix length (like 172.18.0.18/16)`},
		"empty":       {"", "", "", `addresses "": want one address, or two (IPv4,IPv6) for dual stack`},
		"bad gateway": {"172.18.0.18/16", "gw", "172.18.0.0/16", `gateways "gw": "gw" is not an IP address`},
		"unmasked subnet": {"172.18.0.18/16", "172.18.0.1", "172.18.0.5/16",
			`subnets "172.18.0.5/16": "172.18.0.5/16" is not a CIDR (like 172.18.0.0/16)`},
		"count mismatch": {"172.18.0.18/16", "172.18.0.1,fd00::1", "172.18.0.0/16",
			`gateways "172.18.0.1,fd00::1": want 1 entries, one per address in "172.18.0.18/16"`},
		"outside subnet": {"172.19.0.18/16", "172.18.0.1", "172.18.0.0/16",
			`addresses "172.19.0.18/16": 172.19.0.18 is outside subnet 172.18.0.0/16`},
		"prefix mismatch": {"172.18.0.18/24", "172.18.0.1", "172.18.0.0/16",
			`addresses "172.18.0.18/24": 172.18.0.18/24 has prefix length 24 but its subnet 172.18.0.0/16 has 16`},
		"gateway outside": {"172.18.0.18/16", "10.0.0.1", "172.18.0.0/16",
			`gateways "10.0.0.1": 10.0.0.1 is outside subnet 172.18.0.0/16`},
		"gateway is LB": {"172.18.0.18/16", "172.18.0.18", "172.18.0.0/16",
			`gateways "172.18.0.18": 172.18.0.18 is also the LB address`},
		"IPv6 first": {"fd00::18/64,172.18.0.18/16", "fd00::1,172.18.0.1", "fd00::/64,172.18.0.0/16",
			`addresses "fd00::18/64,172.18.0.18/16": dual stack wants the IPv4 address first, then the IPv6 one`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := ParseNetwork(tc.addresses, tc.gateways, tc.subnets)
			if err == nil || err.Error() != tc.want {
				t.Fatalf("got error %v, want %q", err, tc.want)
			}
		})
	}
}

func TestServiceFromObject(t *testing.T) {
	base := func(mut func(*corev1.Service)) *corev1.Service {
		s := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "test-svc"},
			Spec: corev1.ServiceSpec{
				ClusterIPs: []string{"fd00:10:96::c1", "10.109.201.193"},
				Ports: []corev1.ServicePort{
					{Port: 80, Protocol: corev1.ProtocolTCP},
					{Port: 53, Protocol: corev1.ProtocolUDP},
					{Port: 3868, Protocol: corev1.ProtocolSCTP},
					{Port: 8080},
				},
			},
		}
		if mut != nil {
			mut(s)
		}
		return s
	}
	got, err := ServiceFromObject(base(nil))
	if err != nil {
		t.Fatal(err)
	}
	want := Service{
		ClusterIPs: addrs("10.109.201.193", "fd00:10:96::c1"),
		Ports:      []Port{{TCP, 80}, {UDP, 53}, {SCTP, 3868}, {TCP, 8080}},
	}
	if !equalService(got, want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}

	got, err = ServiceFromObject(base(func(s *corev1.Service) {
		s.Annotations = map[string]string{corev1.AnnotationLoadBalancerSourceRangesKey: "10.0.0.0/8, 192.0.2.1/32"}
	}))
	if err != nil {
		t.Fatal(err)
	}
	if want := prefixes("10.0.0.0/8", "192.0.2.1/32"); !equalPrefixes(got.SourceRanges, want) {
		t.Fatalf("annotation source ranges: got %v, want %v", got.SourceRanges, want)
	}

	// IPv4-mapped IPv6 ranges are the IPv4 ranges they map (a prefix of the mapped form that is
	// shorter than 96 bits covers more than IPv4 and stays IPv6).
	got, err = ServiceFromObject(base(func(s *corev1.Service) {
		s.Spec.LoadBalancerSourceRanges = []string{"::ffff:10.0.0.0/104", "::ffff:192.0.2.1/128", "::ffff:0:0/80"}
	}))
	if err != nil {
		t.Fatal(err)
	}
	if want := prefixes("10.0.0.0/8", "192.0.2.1/32", "::/80"); !equalPrefixes(got.SourceRanges, want) {
		t.Fatalf("IPv4-mapped source ranges: got %v, want %v", got.SourceRanges, want)
	}

	errCases := map[string]struct {
		mut  func(*corev1.Service)
		want string
	}{
		"headless": {func(s *corev1.Service) { s.Spec.ClusterIPs = []string{"None"} },
			`service default/test-svc: spec.clusterIPs "None": a headless Service has no ClusterIP to forward to`},
		"no clusterIP": {func(s *corev1.Service) { s.Spec.ClusterIPs = nil },
			`service default/test-svc: spec.clusterIPs is empty (not allocated yet)`},
		"bad protocol": {func(s *corev1.Service) { s.Spec.Ports[1].Protocol = "QUIC" },
			`service default/test-svc: spec.ports[1].protocol "QUIC": want TCP, UDP or SCTP`},
		"bad range": {func(s *corev1.Service) { s.Spec.LoadBalancerSourceRanges = []string{"10.0.0.0/33"} },
			`service default/test-svc: spec.loadBalancerSourceRanges "10.0.0.0/33": not a CIDR`},
		"bad annotation range": {func(s *corev1.Service) {
			s.Annotations = map[string]string{corev1.AnnotationLoadBalancerSourceRangesKey: "10.0.0.0/8, 192.168.1.1/40\nx"}
		}, `service default/test-svc: annotation service.beta.kubernetes.io/load-balancer-source-ranges "192.168.1.1/40\nx": not a CIDR`},
		"long bad range is bounded": {func(s *corev1.Service) { s.Spec.LoadBalancerSourceRanges = []string{strings.Repeat("9", 500)} },
			`service default/test-svc: spec.loadBalancerSourceRanges "` + strings.Repeat("9", 64) + `": not a CIDR`},
	}
	for name, tc := range errCases {
		t.Run(name, func(t *testing.T) {
			_, err := ServiceFromObject(base(tc.mut))
			if err == nil || err.Error() != tc.want {
				t.Fatalf("got error %v, want %q", err, tc.want)
			}
		})
	}
}

func TestChooseFlavour(t *testing.T) {
	ok := func(n int) RuleCount { return RuleCount{OK: true, Rules: n} }
	broken := RuleCount{}
	cases := map[string]struct {
		nft, legacy RuleCount
		want        Flavour
	}{
		"both empty":         {ok(0), ok(0), FlavourNFT},
		"tie":                {ok(5), ok(5), FlavourNFT},
		"legacy has more":    {ok(3), ok(10), FlavourLegacy},
		"nft has more":       {ok(10), ok(3), FlavourNFT},
		"nft cannot list":    {broken, ok(0), FlavourLegacy},
		"legacy cannot list": {ok(0), broken, FlavourNFT},
		"neither can list":   {broken, broken, FlavourNFT},
	}
	for name, tc := range cases {
		if got := ChooseFlavour(tc.nft, tc.legacy); got != tc.want {
			t.Errorf("%s: ChooseFlavour(%+v, %+v) = %s, want %s", name, tc.nft, tc.legacy, got, tc.want)
		}
	}
}

func equalPrefixes(a, b []netip.Prefix) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func equalService(a, b Service) bool {
	if len(a.ClusterIPs) != len(b.ClusterIPs) || len(a.Ports) != len(b.Ports) || !equalPrefixes(a.SourceRanges, b.SourceRanges) {
		return false
	}
	for i := range a.ClusterIPs {
		if a.ClusterIPs[i] != b.ClusterIPs[i] {
			return false
		}
	}
	for i := range a.Ports {
		if a.Ports[i] != b.Ports[i] {
			return false
		}
	}
	return true
}

// A standby holds no address, so no lifetime either; an active's state carries the lifetime.
func TestStateAddressLifetime(t *testing.T) {
	st := seedState(t).WithAddressLifetime(time.Second)
	if st.AddressLifetime != time.Second || len(st.Addresses) != 1 {
		t.Fatalf("WithAddressLifetime: %s on %v, want 1s on the LB address", st.AddressLifetime, st.Addresses)
	}
	if sb := st.Standby(); sb.AddressLifetime != 0 || sb.Addresses != nil || sb.Lapsing != nil {
		t.Fatalf("Standby: %s on %v (lapsing %v), want no address and no lifetime", sb.AddressLifetime, sb.Addresses, sb.Lapsing)
	}
	lapse := st.Lapse()
	if lapse.AddressLifetime != 0 || lapse.Addresses != nil || !slices.Equal(lapse.Lapsing, st.Addresses) {
		t.Fatalf("Lapse: %s on %v, lapsing %v; want no address to add, no lifetime, %v lapsing", lapse.AddressLifetime, lapse.Addresses, lapse.Lapsing, st.Addresses)
	}
	if sb := lapse.Standby(); sb.Lapsing != nil {
		t.Fatalf("Standby of a lapsing state keeps %v", sb.Lapsing)
	}
}
