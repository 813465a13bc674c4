package decide

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
	"github.com/lbsvc/lbsvc-operator/controllers/ipam"
)

func withSelector(s lbv1.Subnet, sel *metav1.LabelSelector) lbv1.Subnet {
	s.Spec.NodeSelector = sel
	return s
}

func vlanSelector() *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchLabels: map[string]string{"vlan/100": "true"}}
}

func placeNode(name string, labels map[string]string, mutate ...func(*corev1.Node)) corev1.Node {
	n := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
	for _, m := range mutate {
		m(&n)
	}
	return n
}

func notReady(n *corev1.Node) { n.Status.Conditions[0].Status = corev1.ConditionFalse }
func cordoned(n *corev1.Node) { n.Spec.Unschedulable = true }

// An invalid nodeSelector makes the Subnet invalid (InvalidSpec), with what is wrong; a valid one
// changes nothing.
func TestValidateSubnetNodeSelector(t *testing.T) {
	expr := func(key string, op metav1.LabelSelectorOperator, values ...string) *metav1.LabelSelector {
		return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: key, Operator: op, Values: values}}}
	}
	for name, tc := range map[string]struct {
		sel     *metav1.LabelSelector
		wantMsg string // empty: valid
	}{
		"none":                  {nil, ""},
		"empty: every node":     {&metav1.LabelSelector{}, ""},
		"matchLabels":           {vlanSelector(), ""},
		"every operator":        {&metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "a", Operator: "In", Values: []string{"1"}}, {Key: "b", Operator: "NotIn", Values: []string{"2"}}, {Key: "c", Operator: "Exists"}, {Key: "d", Operator: "DoesNotExist"}}}, ""},
		"bad operator":          {expr("a", "Gt", "1"), `subnet "sn": spec.nodeSelector: "Gt" is not a valid label selector operator`},
		"In without values":     {expr("a", "In"), "for 'in', 'notin' operators, values set can't be empty"},
		"Exists with values":    {expr("a", "Exists", "x"), `subnet "sn": spec.nodeSelector: values: Invalid value: ["x"]: values set must be empty for exists and does not exist`},
		"bad key":               {expr("-a", "Exists"), "spec.nodeSelector: key: Invalid value: \"-a\""},
		"bad matchLabels value": {&metav1.LabelSelector{MatchLabels: map[string]string{"a": "not valid"}}, `spec.nodeSelector: values[0][a]: Invalid value: "not valid"`},
	} {
		t.Run(name, func(t *testing.T) {
			s := withSelector(planSubnet("sn", "10.0.0.0/24", 0), tc.sel)
			_, err := ValidateSubnet(&s, []lbv1.Subnet{s})
			if tc.wantMsg == "" {
				if err != nil {
					t.Fatalf("valid selector refused: %v", err)
				}
				return
			}
			var ref *Refusal
			if !errors.As(err, &ref) || ref.Reason != ReasonSubnetInvalid || !strings.Contains(ref.Message, tc.wantMsg) {
				t.Fatalf("got %v, want InvalidSpec containing %q", err, tc.wantMsg)
			}
		})
	}
}

// Whether any node can take an lb pod of the Subnet: one that matches, is Ready, not cordoned and
// not tainted.
func TestUnplaceable(t *testing.T) {
	vlan := map[string]string{"vlan/100": "true"}
	other := map[string]string{"vlan/200": "true"}
	for name, tc := range map[string]struct {
		sel       *metav1.LabelSelector
		nodes     []corev1.Node
		wantNodes int // -1: placeable (nil); else the count of matching nodes the message names
	}{
		"no selector, no node":            {nil, nil, -1},
		"empty selector, no node":         {&metav1.LabelSelector{}, nil, -1},
		"a matching Ready node":           {vlanSelector(), []corev1.Node{placeNode("a", other), placeNode("b", vlan)}, -1},
		"no node at all":                  {vlanSelector(), nil, 0},
		"no node matches":                 {vlanSelector(), []corev1.Node{placeNode("a", other), placeNode("b", nil)}, 0},
		"the matching node is not Ready":  {vlanSelector(), []corev1.Node{placeNode("a", other), placeNode("b", vlan, notReady)}, 1},
		"the matching nodes are cordoned": {vlanSelector(), []corev1.Node{placeNode("a", vlan, cordoned), placeNode("b", vlan, notReady)}, 2},
		"one of two matching nodes fits":  {vlanSelector(), []corev1.Node{placeNode("a", vlan, cordoned), placeNode("b", vlan)}, -1},
		"DoesNotExist matches the unlabelled": {&metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "vlan/100", Operator: "DoesNotExist"}}},
			[]corev1.Node{placeNode("a", vlan), placeNode("b", nil)}, -1},
		"tainted NoSchedule": {vlanSelector(), []corev1.Node{placeNode("a", vlan, func(n *corev1.Node) {
			n.Spec.Taints = []corev1.Taint{{Key: "node-role.kubernetes.io/control-plane", Effect: corev1.TaintEffectNoSchedule}}
		})}, 1},
	} {
		t.Run(name, func(t *testing.T) {
			s := withSelector(planSubnet("sn", "10.0.0.0/24", 0), tc.sel)
			got := Unplaceable(&s, tc.nodes)
			if tc.wantNodes < 0 {
				if got != nil {
					t.Fatalf("got %+v, want placeable", got)
				}
				return
			}
			found := "no node"
			if tc.wantNodes > 0 {
				found = string(rune('0'+tc.wantNodes)) + " node(s), none of them Ready and schedulable (not Ready, cordoned or tainted)"
			}
			want := &Refusal{ReasonNoMatchingNode, `subnet "sn": spec.nodeSelector "vlan/100=true" matches ` + found +
				`: no lb pod can be scheduled (running ones keep running); label a node that carries the underlay, or change the selector`}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("\n got %+v\nwant %+v", got, want)
			}
		})
	}
	// A long selector is quoted by its prefix: the message stays bounded and keeps its advice.
	long := &metav1.LabelSelector{MatchLabels: map[string]string{}}
	for i := 0; i < 200; i++ {
		long.MatchLabels[strings.Repeat("k", 50)+string(rune('a'+i%26))+strings.Repeat("x", i/26)] = strings.Repeat("v", 60)
	}
	s := withSelector(planSubnet("sn", "10.0.0.0/24", 0), long)
	got := Unplaceable(&s, nil)
	if got == nil || len(got.Message) > 400 || !strings.HasSuffix(got.Message, "or change the selector") {
		t.Fatalf("long selector: %d bytes: %+v", len(got.Message), got)
	}
}

// The Subnet's selector flows into the plan's lb pod parameters, and from there into the
// Deployment; no matching node keeps the address and the Deployment, and shows NoMatchingNode.
func TestDecideServicePlacement(t *testing.T) {
	sn := withSelector(planSubnet("sn", "10.0.0.0/24", 0), vlanSelector())
	in := ServiceInputs{Service: planService(), EnableLBSvc: true, NADFound: true, Subnets: []lbv1.Subnet{sn},
		Nodes: []corev1.Node{placeNode("a", nil), placeNode("b", map[string]string{"vlan/100": "true"})}}
	p := DecideService(in)
	if p.Action != PlanServe || !reflect.DeepEqual(p.Claims, []Claim{{Family: ipam.IPv4}}) || p.Unplaceable != nil || p.HoldObjects {
		t.Fatalf("placeable: %+v", p)
	}
	if !reflect.DeepEqual(p.LBPod.NodeSelector, vlanSelector()) || p.LBPod.NodeSelector == sn.Spec.NodeSelector {
		t.Fatalf("lb pod node selector %+v (a copy of the Subnet's)", p.LBPod.NodeSelector)
	}
	set, err := p.Objects(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	aff := set.Deployment.Spec.Template.Spec.Affinity
	if aff == nil || aff.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchExpressions[0].Key != "vlan/100" {
		t.Fatalf("deployment affinity %+v", aff)
	}
	if c := p.LBPodCondition(&appsv1.Deployment{}); c.Reason != ReasonDeploymentPending {
		t.Errorf("placeable: condition %+v", c)
	}

	// The matching node loses its label: the address is still claimed (and the Deployment
	// applied), the lb pod condition says why nothing runs.
	in.Nodes[1].Labels = nil
	p = DecideService(in)
	if p.Action != PlanServe || len(p.Claims) != 1 || p.Unplaceable == nil || p.Unplaceable.Reason != ReasonNoMatchingNode || p.HoldObjects {
		t.Fatalf("no matching node: %+v", p)
	}
	available := &appsv1.Deployment{Status: appsv1.DeploymentStatus{Conditions: []appsv1.DeploymentCondition{{Type: appsv1.DeploymentAvailable, Status: corev1.ConditionTrue}}}}
	c := p.LBPodCondition(available)
	if c.Type != ConditionLBPodAvailable || c.Status != metav1.ConditionFalse || c.Reason != ReasonNoMatchingNode ||
		!strings.HasPrefix(c.Message, `subnet "sn": spec.nodeSelector "vlan/100=true" matches no node: no lb pod can be scheduled`) {
		t.Errorf("condition %+v", c)
	}
	if AllocatedCondition := p.AllocatedCondition(nil); AllocatedCondition.Reason != ReasonAllocated {
		t.Errorf("the address stays allocated: %+v", AllocatedCondition)
	}

	// An invalid selector: the Subnet is not Ready. A new Service is refused; one that holds an
	// address keeps it, and its objects are left as they are (no placement to build them from).
	bad := withSelector(planSubnet("sn", "10.0.0.0/24", 0), &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "vlan/100", Operator: "Equals", Values: []string{"true"}}}})
	in.Subnets = []lbv1.Subnet{bad}
	p = DecideService(in)
	if p.Action != PlanTeardown || p.Refusal == nil || p.Refusal.Reason != ReasonSubnetNotReady ||
		p.Refusal.Message != `subnet "sn": subnet "sn": spec.nodeSelector: "Equals" is not a valid label selector operator` {
		t.Fatalf("invalid selector, nothing held: %+v", p)
	}
	in.Owned = []OwnedIP{owned("10.0.0.7", "10.0.0.7", "sn", false)}
	p = DecideService(in)
	if p.Action != PlanServe || !p.HoldObjects || p.Refusal == nil || p.Refusal.Reason != ReasonSubnetNotReady || len(p.Keep) != 1 || p.Unplaceable != nil {
		t.Fatalf("invalid selector, address held: %+v", p)
	}
}
