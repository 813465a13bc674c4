package lbobjects

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func required(reqs ...corev1.NodeSelectorRequirement) *corev1.Affinity {
	return &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
		NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: reqs}}}}}
}

// A Subnet's label selector becomes one required node selector term: matchLabels as In with the
// one value (sorted by key), matchExpressions after them, in order, operators unchanged.
func TestNodeAffinity(t *testing.T) {
	for name, tc := range map[string]struct {
		sel  *metav1.LabelSelector
		want *corev1.Affinity
	}{
		"no selector: no affinity":             {nil, nil},
		"empty selector (every node): none":    {&metav1.LabelSelector{}, nil},
		"empty lists and maps: none":           {&metav1.LabelSelector{MatchLabels: map[string]string{}, MatchExpressions: []metav1.LabelSelectorRequirement{}}, nil},
		"one label: In with one value":         {&metav1.LabelSelector{MatchLabels: map[string]string{"vlan/100": "true"}}, required(corev1.NodeSelectorRequirement{Key: "vlan/100", Operator: "In", Values: []string{"true"}})},
		"labels sorted by key, whatever order": {&metav1.LabelSelector{MatchLabels: map[string]string{"z": "1", "a": "2", "m": "3"}}, required(corev1.NodeSelectorRequirement{Key: "a", Operator: "In", Values: []string{"2"}}, corev1.NodeSelectorRequirement{Key: "m", Operator: "In", Values: []string{"3"}}, corev1.NodeSelectorRequirement{Key: "z", Operator: "In", Values: []string{"1"}})},
		"every operator, 1:1, after the labels": {
			&metav1.LabelSelector{MatchLabels: map[string]string{"rack": "r1"}, MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: "zone", Operator: metav1.LabelSelectorOpIn, Values: []string{"b", "a"}},
				{Key: "role", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"edge"}},
				{Key: "uplink", Operator: metav1.LabelSelectorOpExists},
				{Key: "no-vlan", Operator: metav1.LabelSelectorOpDoesNotExist},
			}},
			required(
				corev1.NodeSelectorRequirement{Key: "rack", Operator: corev1.NodeSelectorOpIn, Values: []string{"r1"}},
				corev1.NodeSelectorRequirement{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"b", "a"}},
				corev1.NodeSelectorRequirement{Key: "role", Operator: corev1.NodeSelectorOpNotIn, Values: []string{"edge"}},
				corev1.NodeSelectorRequirement{Key: "uplink", Operator: corev1.NodeSelectorOpExists},
				corev1.NodeSelectorRequirement{Key: "no-vlan", Operator: corev1.NodeSelectorOpDoesNotExist},
			)},
	} {
		t.Run(name, func(t *testing.T) {
			got := NodeAffinity(tc.sel)
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("\n got %+v\nwant %+v", got, tc.want)
			}
		})
	}
	// The values are copied: the Subnet (a cached object) is never shared with the template.
	sel := &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "k", Operator: "In", Values: []string{"v"}}}}
	a := NodeAffinity(sel)
	a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchExpressions[0].Values[0] = "x"
	if sel.MatchExpressions[0].Values[0] != "v" {
		t.Error("the affinity shares the selector's values")
	}
}

// The Deployment carries the affinity, and keeps its spread with NodeAffinityPolicy Honor: the
// spread counts only the nodes the selector matches. Without a selector there is no affinity.
func TestBuildDeploymentPlacement(t *testing.T) {
	p := seedParams()
	p.Replicas = 2
	d, err := BuildDeployment(p)
	if err != nil {
		t.Fatal(err)
	}
	if d.Spec.Template.Spec.Affinity != nil {
		t.Fatalf("no selector: affinity %+v", d.Spec.Template.Spec.Affinity)
	}
	p.NodeSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"vlan/100": "true"}}
	d, err = BuildDeployment(p)
	if err != nil {
		t.Fatal(err)
	}
	want := required(corev1.NodeSelectorRequirement{Key: "vlan/100", Operator: "In", Values: []string{"true"}})
	if got := d.Spec.Template.Spec.Affinity; !reflect.DeepEqual(got, want) {
		t.Errorf("affinity\n got %+v\nwant %+v", got, want)
	}
	spread := d.Spec.Template.Spec.TopologySpreadConstraints
	if len(spread) != 1 || spread[0].NodeAffinityPolicy == nil || *spread[0].NodeAffinityPolicy != corev1.NodeInclusionPolicyHonor ||
		spread[0].WhenUnsatisfiable != corev1.DoNotSchedule {
		t.Errorf("spread %+v", spread)
	}
}

// A changed, narrowed or removed selector is not up to date: the template is replaced whole, since
// DeepDerivative alone would keep a live affinity the desired template no longer has.
func TestNodeAffinityUpToDate(t *testing.T) {
	build := func(sel *metav1.LabelSelector) *Params {
		p := seedParams()
		p.NodeSelector = sel
		return &p
	}
	two := &metav1.LabelSelector{MatchLabels: map[string]string{"a": "1"}, MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "b", Operator: "Exists"}}}
	for name, tc := range map[string]struct {
		desired, live *metav1.LabelSelector
		upToDate      bool
	}{
		"none, none":                       {nil, nil, true},
		"same":                             {two, two, true},
		"selector removed":                 {nil, two, false},
		"selector added":                   {two, nil, false},
		"a requirement removed":            {&metav1.LabelSelector{MatchLabels: map[string]string{"a": "1"}}, two, false},
		"a value changed":                  {&metav1.LabelSelector{MatchLabels: map[string]string{"a": "2"}}, &metav1.LabelSelector{MatchLabels: map[string]string{"a": "1"}}, false},
		"an empty selector is no selector": {&metav1.LabelSelector{}, nil, true},
	} {
		t.Run(name, func(t *testing.T) {
			want, err := BuildDeployment(*build(tc.desired))
			if err != nil {
				t.Fatal(err)
			}
			live, err := BuildDeployment(*build(tc.live))
			if err != nil {
				t.Fatal(err)
			}
			if got := UpToDate(want, live); got != tc.upToDate {
				t.Errorf("up to date %v, want %v", got, tc.upToDate)
			}
		})
	}
	// Another affinity added by hand (pod anti-affinity, a preferred node term) is left alone.
	want, _ := BuildDeployment(*build(two))
	live := want.DeepCopy()
	live.Spec.Template.Spec.Affinity.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution = []corev1.PreferredSchedulingTerm{{Weight: 1}}
	live.Spec.Template.Spec.Affinity.PodAntiAffinity = &corev1.PodAntiAffinity{}
	if !UpToDate(want, live) {
		t.Error("a preferred term and a pod anti-affinity added by hand: not up to date")
	}
}

func node(mutate ...func(*corev1.Node)) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
	for _, m := range mutate {
		m(n)
	}
	return n
}

func taint(key string, effect corev1.TaintEffect) func(*corev1.Node) {
	return func(n *corev1.Node) { n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: key, Effect: effect}) }
}

// Where the scheduler may put an lb pod, its affinity aside: Ready, not cordoned, no taint it
// does not tolerate.
func TestSchedulable(t *testing.T) {
	for name, tc := range map[string]struct {
		node *corev1.Node
		want bool
	}{
		"ready":        {node(), true},
		"no condition": {node(func(n *corev1.Node) { n.Status.Conditions = nil }), false},
		"not ready": {node(func(n *corev1.Node) {
			n.Status.Conditions[0].Status = corev1.ConditionFalse
		}), false},
		"ready unknown": {node(func(n *corev1.Node) {
			n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse}, {Type: corev1.NodeReady, Status: corev1.ConditionUnknown}}
		}), false},
		"cordoned":                             {node(func(n *corev1.Node) { n.Spec.Unschedulable = true }), false},
		"control plane NoSchedule":             {node(taint("node-role.kubernetes.io/control-plane", corev1.TaintEffectNoSchedule)), false},
		"a NoExecute taint":                    {node(taint("dedicated", corev1.TaintEffectNoExecute)), false},
		"PreferNoSchedule only":                {node(taint("dedicated", corev1.TaintEffectPreferNoSchedule)), true},
		"unreachable NoExecute (tolerated)":    {node(taint(corev1.TaintNodeUnreachable, corev1.TaintEffectNoExecute)), true},
		"not-ready NoSchedule (not tolerated)": {node(taint(corev1.TaintNodeNotReady, corev1.TaintEffectNoSchedule)), false},
	} {
		t.Run(name, func(t *testing.T) {
			if got := Schedulable(tc.node); got != tc.want {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}
