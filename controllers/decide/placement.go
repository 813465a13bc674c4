package decide

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
	"github.com/lbsvc/lbsvc-operator/controllers/lbobjects"
)

// Placement: a Subnet's spec.nodeSelector says which nodes carry its underlay; the lb pods of its
// Services run only there (lbobjects.NodeAffinity).

// HasNodeSelector tells whether the Subnet restricts its lb pods to some nodes: a selector with at
// least one requirement (an empty one selects every node, as no selector does).
func HasNodeSelector(s *lbv1.Subnet) bool {
	sel := s.Spec.NodeSelector
	return sel != nil && len(sel.MatchLabels)+len(sel.MatchExpressions) > 0
}

// validNodeSelector refuses a nodeSelector that is not a valid label selector: an operator other
// than In, NotIn, Exists and DoesNotExist, In or NotIn without values, Exists or DoesNotExist
// with values, a key or value that is not a valid label key or value.
func validNodeSelector(s *lbv1.Subnet) *Refusal {
	if s.Spec.NodeSelector == nil {
		return nil
	}
	if _, err := metav1.LabelSelectorAsSelector(s.Spec.NodeSelector); err != nil {
		return refusal(ReasonSubnetInvalid, "subnet %q: spec.nodeSelector: %s", s.Name, err)
	}
	return nil
}

// Unplaceable is why no lb pod of the Subnet's Services can be scheduled: its nodeSelector matches
// no node that is Ready, not cordoned and without a taint the lb pod does not tolerate. nil when
// some node fits, or the Subnet has no selector (or an invalid one: ValidateSubnet refuses it).
func Unplaceable(s *lbv1.Subnet, nodes []corev1.Node) *Refusal {
	if !HasNodeSelector(s) {
		return nil
	}
	sel, err := metav1.LabelSelectorAsSelector(s.Spec.NodeSelector)
	if err != nil {
		return nil
	}
	matching := 0
	for i := range nodes {
		if !sel.Matches(labels.Set(nodes[i].Labels)) {
			continue
		}
		if lbobjects.Schedulable(&nodes[i]) {
			return nil
		}
		matching++
	}
	found := "no node"
	if matching > 0 {
		found = fmt.Sprintf("%d node(s), none of them Ready and schedulable (not Ready, cordoned or tainted)", matching)
	}
	return refusal(ReasonNoMatchingNode,
		"subnet %q: spec.nodeSelector %s matches %s: no lb pod can be scheduled (running ones keep running); "+
			"label a node that carries the underlay, or change the selector",
		s.Name, quote(metav1.FormatLabelSelector(s.Spec.NodeSelector)), found)
}
