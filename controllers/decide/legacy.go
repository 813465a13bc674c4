package decide

import (
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
	"github.com/lbsvc/lbsvc-operator/controllers/lbobjects"
)

// LegacyPeers tells whether lb pods from before authenticated adverts may still run beside a
// Service's new ones, so that the new ones must give them the legacy window (lbobjects.
// HALegacyWindow) instead of refusing their unauthenticated adverts from the start:
//   - its Deployment already says so (HALegacyPeersAnnotation): the decision stands for the
//     Deployment's life, since turning the window off once the old pods are gone would roll
//     every upgraded Deployment a second time for nothing;
//   - or one of its lb pods (ours: our labels, in the lb pod namespace, not finished) lacks the
//     wire label that every lb pod of this version carries: an upgrade's rollout is about to
//     replace it.
//
// A fresh claim (no Deployment, no pod) has none, and its replicas refuse unauthenticated
// adverts from their first moment: a forger on the underlay cannot delay its first claim.
func LegacyPeers(deploy *appsv1.Deployment, pods []corev1.Pod, podNamespace string) bool {
	if deploy != nil && deploy.Annotations[lbobjects.HALegacyPeersAnnotation] == "true" {
		return true
	}
	for i := range pods {
		p := &pods[i]
		l := p.Labels
		if p.Namespace != podNamespace || l[lbobjects.ManagedByLabel] != lbobjects.ManagedByValue ||
			l[lbv1.ComponentLabel] != lbv1.ComponentLBPod || !podHolds(p) {
			continue
		}
		if l[lbobjects.HAWireLabel] != lbobjects.HAWireVersion {
			return true
		}
	}
	return false
}
