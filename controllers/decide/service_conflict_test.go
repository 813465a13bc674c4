package decide

import (
	"net/netip"
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
	"github.com/lbsvc/lbsvc-operator/controllers/ipam"
)

// What the Service pass does with addresses the conflict probe found in use: a dynamic Service
// claims another, a static one is refused AddressInUse, and after MaxConflictsPerFamily a dynamic
// one too; an address in phase Conflict is never kept and never drained.
func TestDecideServiceConflict(t *testing.T) {
	sn := planSubnet("sn", "10.0.0.0/24", 0)
	at := metav1.NewTime(time.Date(2026, 11, 25, 1, 2, 3, 0, time.UTC))
	conflicted := func(addr string) OwnedIP {
		o := owned(addr, addr, "sn", false)
		o.Conflict = &lbv1.IPConflictStatus{MAC: "02:42:ac:12:00:05", Since: at}
		return o
	}
	v4 := func(s *corev1.Service) {
		s.Spec.ClusterIPs, s.Spec.IPFamilies = []string{"10.96.0.10"}, []corev1.IPFamily{corev1.IPv4Protocol}
	}
	for name, tc := range map[string]struct {
		in   ServiceInputs
		want Plan
	}{
		"dynamic, its address answered: claims another, the one in Conflict neither kept nor drained": {
			in:   ServiceInputs{Service: planService(v4), NADFound: true, Subnets: []lbv1.Subnet{sn}, Owned: []OwnedIP{conflicted("10.0.0.2")}},
			want: Plan{Action: PlanServe, Subnet: "sn", Claims: []Claim{{Family: ipam.IPv4}}},
		},
		"dynamic, two answered, a third claimed already: kept": {
			in: ServiceInputs{Service: planService(v4), NADFound: true, Subnets: []lbv1.Subnet{sn},
				Owned: []OwnedIP{conflicted("10.0.0.2"), conflicted("10.0.0.3"), owned("10.0.0.4", "10.0.0.4", "sn", false)}},
			want: Plan{Action: PlanServe, Subnet: "sn", Keep: []OwnedIP{owned("10.0.0.4", "10.0.0.4", "sn", false)}},
		},
		"dynamic, three answered: refused, the others drain, the three stay": {
			in: ServiceInputs{Service: planService(v4), NADFound: true, Subnets: []lbv1.Subnet{sn},
				Owned: []OwnedIP{conflicted("10.0.0.2"), conflicted("10.0.0.3"), conflicted("10.0.0.4"), owned("10.0.0.5", "10.0.0.5", "sn", false)}},
			want: Plan{Action: PlanTeardown, Drain: []OwnedIP{owned("10.0.0.5", "10.0.0.5", "sn", false)}, Refusal: &Refusal{ReasonAddressInUse,
				"3 IPv4 addresses given to this Service were in use on the underlay before their first announcement: 10.0.0.2 (02:42:ac:12:00:05), 10.0.0.3 (02:42:ac:12:00:05), 10.0.0.4 (02:42:ac:12:00:05); no further address is tried: check the underlay for a host answering for every address (kubectl get ips), then delete those IP objects"}},
		},
		"static, the address answered: refused AddressInUse, naming the MAC": {
			in: ServiceInputs{Service: planService(v4, static("10.0.0.2")), NADFound: true, Subnets: []lbv1.Subnet{sn},
				Owned: []OwnedIP{conflicted("10.0.0.2")}},
			want: Plan{Action: PlanTeardown, Refusal: &Refusal{ReasonAddressInUse,
				"spec.loadBalancerIP 10.0.0.2 is in use on the underlay: 02:42:ac:12:00:05 answered the lb pod's probe at 2026-11-25T01:02:03Z; it is not announced, and is not handed out again until an admin deletes the IP object (kubectl delete ip 10.0.0.2)"}},
		},
		"static moved to another address after a conflict: claims it": {
			in: ServiceInputs{Service: planService(v4, static("10.0.0.9")), NADFound: true, Subnets: []lbv1.Subnet{sn},
				Owned: []OwnedIP{conflicted("10.0.0.2"), conflicted("10.0.0.3"), conflicted("10.0.0.4")}},
			want: Plan{Action: PlanServe, Subnet: "sn", Claims: []Claim{{Family: ipam.IPv4, Static: netip.MustParseAddr("10.0.0.9"), From: "spec.loadBalancerIP"}}},
		},
		"deleted: nothing in Conflict is drained": {
			in: ServiceInputs{Service: planService(v4, deleting), NADFound: true, Subnets: []lbv1.Subnet{sn},
				Owned: []OwnedIP{conflicted("10.0.0.2"), owned("10.0.0.3", "10.0.0.3", "sn", false)}},
			want: Plan{Action: PlanTeardown, Drain: []OwnedIP{owned("10.0.0.3", "10.0.0.3", "sn", false)}, RemoveFinalizer: true, Deleting: true},
		},
	} {
		t.Run(name, func(t *testing.T) {
			tc.in.EnableLBSvc = true
			got := DecideService(tc.in)
			// Only the decision is compared: the lb pod parameters and Subnet config have tests of
			// their own.
			got.LBPod, got.SubnetConfig, got.Provider, got.NADName, got.NADNamespace = tc.want.LBPod, tc.want.SubnetConfig, "", "", ""
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}
