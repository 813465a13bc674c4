package lbobjects

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Placement of the lb pods: a Subnet's spec.nodeSelector (only some nodes carry the underlay)
// becomes the pods' required node affinity.

// NodeAffinity is the lb pods' affinity for a Subnet's node selector: one required node selector
// term that holds every requirement of sel (a label selector ANDs its requirements, and so do the
// expressions of one term). matchLabels become In with the one value, sorted by key so that the
// same selector always builds the same template; matchExpressions follow in their order, their
// operators (In, NotIn, Exists, DoesNotExist) unchanged. nil, or a selector without requirements
// (which selects every node), gives nil: no affinity at all. sel is taken as valid (the Subnet
// reconciler and DecideService refuse an invalid one).
func NodeAffinity(sel *metav1.LabelSelector) *corev1.Affinity {
	if sel == nil || len(sel.MatchLabels)+len(sel.MatchExpressions) == 0 {
		return nil
	}
	var reqs []corev1.NodeSelectorRequirement
	keys := make([]string, 0, len(sel.MatchLabels))
	for k := range sel.MatchLabels {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		reqs = append(reqs, corev1.NodeSelectorRequirement{Key: k, Operator: corev1.NodeSelectorOpIn, Values: []string{sel.MatchLabels[k]}})
	}
	for _, e := range sel.MatchExpressions {
		reqs = append(reqs, corev1.NodeSelectorRequirement{Key: e.Key, Operator: corev1.NodeSelectorOperator(e.Operator),
			Values: slices.Clone(e.Values)})
	}
	return &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
			NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: reqs}},
		},
	}}
}

// Schedulable tells whether the scheduler may put an lb pod on node, its node affinity aside: the
// node is Ready, not cordoned, and has no NoSchedule or NoExecute taint that the lb pod does not
// tolerate.
func Schedulable(node *corev1.Node) bool {
	if node.Spec.Unschedulable || !NodeReady(node) {
		return false
	}
	tolerations := failoverTolerations()
	for i := range node.Spec.Taints {
		t := &node.Spec.Taints[i]
		if t.Effect == corev1.TaintEffectPreferNoSchedule {
			continue
		}
		if !slices.ContainsFunc(tolerations, func(tol corev1.Toleration) bool {
			// The lb pod's tolerations are all of the form "key Exists, effect E".
			return tol.Key == t.Key && tol.Operator == corev1.TolerationOpExists && (tol.Effect == "" || tol.Effect == t.Effect)
		}) {
			return false
		}
	}
	return true
}

// NodeReady tells whether node's Ready condition is True.
func NodeReady(node *corev1.Node) bool {
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
