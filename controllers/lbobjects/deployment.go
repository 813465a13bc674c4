package lbobjects

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
)

// Failover timing of the lb pods, chosen for standbys (see BuildDeployment).
const (
	// unreachableTolerationSeconds: with a standby on another node, the address has already moved
	// by the time a node is NotReady; the pod left there only has to be replaced so that the
	// Service has a standby again, so it is evicted after 30 s instead of the default 300 s.
	unreachableTolerationSeconds = 30
	// terminationGraceSeconds leaves the active pod time to hand the address over (one advert
	// exchange, well under a second) and to take its rules down.
	terminationGraceSeconds = 10
)

// networkSelection is one entry of the Multus networks annotation.
type networkSelection struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	Interface string `json:"interface"`
}

// BuildDeployment returns the desired lb-svc Deployment of a Service. Ports and the ClusterIP are
// deliberately absent: the lb pod watches its Service, so a port change must not roll the pod.
func BuildDeployment(p Params) (*appsv1.Deployment, error) {
	networks, err := json.Marshal([]networkSelection{{Name: p.NADName, Namespace: p.NADNamespace, Interface: LBInterface}})
	if err != nil {
		return nil, fmt.Errorf("service %s/%s: encode networks annotation: %w", p.ServiceNamespace, p.ServiceName, err)
	}
	addrs, addrPrefixes, cidrs, gateways := p.lists()
	podAnnotations := map[string]string{
		NetworksAnnotation: string(networks),
		lbv1.ProviderAnnotation(p.Provider, lbv1.IPAddressAnnotationSuffix):     addrs,
		lbv1.ProviderAnnotation(p.Provider, cidrSuffix):                         cidrs,
		lbv1.ProviderAnnotation(p.Provider, gatewaySuffix):                      gateways,
		lbv1.ProviderAnnotation(p.Provider, lbv1.LogicalSwitchAnnotationSuffix): p.SubnetName,
	}
	who := corev1.EnvVar{Name: lbv1.EnvService, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels['" + lbv1.ServiceLabel + "']"}}}
	if p.Shared != nil {
		who = corev1.EnvVar{Name: lbv1.EnvSharedIP, Value: p.Shared.Name}
	}
	env := []corev1.EnvVar{
		{Name: lbv1.EnvNamespace, Value: p.ServiceNamespace},
		who,
		{Name: lbv1.EnvPodIP, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
		{Name: lbv1.EnvAddresses, Value: addrPrefixes},
		{Name: lbv1.EnvGateways, Value: gateways},
		{Name: lbv1.EnvSubnets, Value: cidrs},
		{Name: lbv1.EnvReplicas, Value: strconv.Itoa(int(p.LBReplicas()))},
		{Name: lbv1.EnvPodName, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
		{Name: lbv1.EnvNodeName, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
	}
	// The Lease's name, given rather than derived from the pod's: a pod's generated name is cut
	// to 58 characters, so a long Deployment name is not a prefix of it. A single lb pod uses it
	// too: the conflict probe records there what it announced (and what answered).
	env = append(env, corev1.EnvVar{Name: lbv1.EnvLease, Value: p.name()})
	if p.Shared != nil {
		env = append(env, corev1.EnvVar{Name: lbv1.EnvSharedIPUID, Value: string(p.Shared.UID)},
			corev1.EnvVar{Name: lbv1.EnvOwnerUID, Value: string(p.ServiceUID)},
			corev1.EnvVar{Name: lbv1.EnvPodNamespace, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}})
	}
	if p.LBReplicas() > 1 {
		if p.HAInterval > 0 {
			env = append(env, corev1.EnvVar{Name: lbv1.EnvHAInterval, Value: p.HAInterval.String()})
		}
	}
	if p.Rules != "" {
		env = append(env, corev1.EnvVar{Name: lbv1.EnvRules, Value: p.Rules})
	}
	if p.ConflictProbe != "" {
		env = append(env, corev1.EnvVar{Name: lbv1.EnvConflictProbe, Value: p.ConflictProbe})
	}
	mounts := []corev1.VolumeMount{{Name: runVolumeName, MountPath: runMountPath}}
	volumes := []corev1.Volume{{Name: runVolumeName, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	// The election key, for the main container only (init does not elect).
	keyVolumes, keyMounts, keyArgs := p.haKeyVolumes()
	volumes = append(volumes, keyVolumes...)
	resources := corev1.ResourceRequirements{
		Requests: corev1.ResourceList{
			corev1.ResourceCPU:    resource.MustParse("10m"),
			corev1.ResourceMemory: resource.MustParse("32Mi"),
		},
		Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("128Mi")},
	}
	// Every probe field is set (the API server would default the zero ones), so that the current
	// object compares equal to the desired one and an unchanged Service writes nothing. Readiness
	// every 5 s: nothing routes by it (the election holds the address, not the kubelet; it shows
	// in LBPodAvailable and paces rollouts and drains), and every probe costs the lb pod and the
	// kubelet CPU on every node all the time. Measured on the 2-core demo with 40 Services (80 lb
	// pods, 2026-11-28): every second, the kubelets used 0.25 of a core and each lb pod 254 / 184
	// ms a minute (active / standby); every 5 s, 0.15 and 187 / 125. The pod shows Ready up to 5 s
	// after it serves. Liveness is patient (a
	// minute of unanswered probes, 5 s each): the kernel forwards for a starved lbpod, and a
	// restart costs a whole apply and, with standbys, an election. Measured with 100 Services on a
	// 2-core node: with kubelet's 1 s timeout and 3 failures, lb pods were restarted 1 to 5 times
	// each while the node was busy starting them, and every restart made the node busier.
	probe := func(path string, period, timeout, failures int32) *corev1.Probe {
		return &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
			Path: path, Port: intstr.FromInt32(probePort), Scheme: corev1.URISchemeHTTP,
		}}, TimeoutSeconds: timeout, PeriodSeconds: period, SuccessThreshold: 1, FailureThreshold: failures}
	}

	podLabels := p.labels()
	for k, v := range AddressLabels(p.Addresses) {
		podLabels[k] = v
	}
	meta := p.objectMeta(p.podNamespace())
	meta.Labels = podLabels
	if p.HALegacyPeers && p.haKeyed() {
		meta.Annotations[HALegacyPeersAnnotation] = "true"
	}
	// Only on the pods (the Deployment's own labels name what it is, not its pods' wire).
	templateLabels := maps.Clone(podLabels)
	templateLabels[HAWireLabel] = HAWireVersion
	d := &appsv1.Deployment{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: meta,
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(p.LBReplicas()),
			Strategy: p.strategy(),
			Selector: &metav1.LabelSelector{MatchLabels: p.selectorLabels()},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: templateLabels, Annotations: podAnnotations},
				Spec: corev1.PodSpec{
					ServiceAccountName:            p.identityName(),
					AutomountServiceAccountToken:  ptr.To(true),
					TerminationGracePeriodSeconds: ptr.To[int64](terminationGraceSeconds),
					Tolerations:                   failoverTolerations(),
					Affinity:                      NodeAffinity(p.NodeSelector),
					TopologySpreadConstraints:     p.spread(),
					SecurityContext: &corev1.PodSecurityContext{
						SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
						Sysctls:        p.sysctls(),
					},
					// One container: it applies the state, announces and serves. (An init container
					// that applied the state first, as Kube-OVN's lb-svc has, delayed a new Service's
					// first answer by the second container's start, ~400 ms on the demo cluster,
					// and with standbys gave nothing: a standby holds no address.)
					Containers: []corev1.Container{{
						Name:            mainContainer,
						Image:           p.Image,
						Command:         []string{lbpodBinary},
						Args:            keyArgs,
						Env:             env,
						VolumeMounts:    append(slices.Clip(mounts), keyMounts...),
						Resources:       resources,
						SecurityContext: containerSecurityContext(),
						ReadinessProbe:  probe("/readyz", 5, 2, 3),
						LivenessProbe:   probe("/healthz", 10, 5, 6),
					}},
					// iptables takes its lock file under /run, and the root filesystem is read-only.
					Volumes: volumes,
				},
			},
		},
	}
	return d, nil
}

// strategy: a single lb pod is replaced with Recreate, since two pods that both believe they
// are alone must never hold the address at once. With standbys, the pods elect one holder among
// themselves, so a RollingUpdate that adds the new pod first (maxSurge 1) and never takes a ready
// one away (maxUnavailable 0) hands the address over from an old active to a new standby.
func (p Params) strategy() appsv1.DeploymentStrategy {
	if p.LBReplicas() == 1 {
		return appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType}
	}
	return appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType,
		RollingUpdate: &appsv1.RollingUpdateDeployment{
			MaxUnavailable: ptr.To(intstr.FromInt32(0)),
			MaxSurge:       ptr.To(intstr.FromInt32(1)),
		}}
}

// FromSingle returns desired, or a copy of it with the Recreate strategy, when desired has
// standbys and a RollingUpdate would run old and new lb pods that do not elect together:
//   - cur, the live Deployment, still runs a single lb pod. It holds its addresses outside the
//     election (no adverts, no kernel lifetime): the new replicas would hear no active, claim the
//     addresses after the dead interval and hold them beside it until the rollout took it away,
//     two holders for seconds.
//   - cur's pods elect in another group or with another key than desired's (election: an address
//     family added or removed, the Service moved to new addresses; each makes a new claim, hence a
//     new key Secret). Old and new pods never hear each other but write the same Lease: they
//     supersede each other through it, held-twice Warnings, and the addresses of whichever lost
//     unheld for its 30 s backoff until the rollout ends.
//   - cur is still rolling out with Recreate (from either): until that rollout is complete.
//
// Recreate takes the old pods away first: the addresses are down once, until a new replica claims
// them. When the rollout is complete the next pass applies RollingUpdate, which changes no pod.
// Pure.
func FromSingle(desired, cur *appsv1.Deployment) *appsv1.Deployment {
	if cur == nil || cur.Name == "" || ptr.Deref(desired.Spec.Replicas, 1) <= 1 ||
		desired.Spec.Strategy.Type == appsv1.RecreateDeploymentStrategyType {
		return desired
	}
	single := ptr.Deref(cur.Spec.Replicas, 1) == 1
	rolling := cur.Spec.Strategy.Type == appsv1.RecreateDeploymentStrategyType && !rolledOut(cur)
	if !single && !rolling && !electionChanged(desired, cur) {
		return desired
	}
	d := desired.DeepCopy()
	d.Spec.Strategy = appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType}
	return d
}

// electionChanged tells whether cur's lb pods cannot elect together with desired's: another
// key Secret, or other addresses (the election group is a digest of them, prefix lengths and
// order aside). A cur whose pods have no key (a release before the key, upgraded: the legacy
// window lets the new pods defer to the old), or whose addresses cannot be read, is no change.
func electionChanged(desired, cur *appsv1.Deployment) bool {
	wantKey, wantAddrs := election(desired)
	curKey, curAddrs := election(cur)
	return (curKey != "" && curKey != wantKey) || (curAddrs != "" && curAddrs != wantAddrs)
}

// election is what d's lb pods elect with: the name of the key Secret they mount ("" for none)
// and their addresses, without prefix lengths, sorted and comma-separated. A Deployment from the
// cache (TemplateTrimmed) carries it in its emptied template (CachedElectionKey).
func election(d *appsv1.Deployment) (keySecret, addrs string) {
	if TemplateTrimmed(d) {
		keySecret, addrs, _ = strings.Cut(d.Spec.Template.Annotations[CachedElectionKey], " ")
		return keySecret, addrs
	}
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.Name == haKeyVolume && v.Secret != nil {
			keySecret = v.Secret.SecretName
		}
	}
	for _, c := range d.Spec.Template.Spec.Containers {
		if c.Name != mainContainer {
			continue
		}
		for _, e := range c.Env {
			if e.Name != lbv1.EnvAddresses || e.Value == "" {
				continue
			}
			var list []string
			for _, a := range strings.Split(e.Value, ",") {
				addr, _, _ := strings.Cut(a, "/")
				list = append(list, addr)
			}
			slices.Sort(list)
			addrs = strings.Join(slices.Compact(list), ",")
		}
	}
	return keySecret, addrs
}

// rolledOut tells whether d's status shows its spec rolled out: seen by the Deployment controller,
// every pod of the current template, none of an older one left.
func rolledOut(d *appsv1.Deployment) bool {
	want := ptr.Deref(d.Spec.Replicas, 1)
	return d.Status.ObservedGeneration >= d.Generation && d.Status.UpdatedReplicas == want && d.Status.Replicas == want
}

// spread keeps the lb pods of one Service on different nodes. DoNotSchedule on the hostname makes
// it required wherever enough nodes exist, yet a one-node cluster still runs every replica, since
// the skew among a single domain is 0; nodes whose taints the pod does not tolerate (NotReady,
// cordoned) do not count as domains, nor (NodeAffinityPolicy Honor) nodes outside the Subnet's
// nodeSelector. pod-template-hash keeps a rollout's old and new pods apart.
func (p Params) spread() []corev1.TopologySpreadConstraint {
	if p.LBReplicas() == 1 {
		return nil
	}
	return []corev1.TopologySpreadConstraint{{
		MaxSkew:            1,
		TopologyKey:        corev1.LabelHostname,
		WhenUnsatisfiable:  corev1.DoNotSchedule,
		LabelSelector:      &metav1.LabelSelector{MatchLabels: p.selectorLabels()},
		MatchLabelKeys:     []string{appsv1.DefaultDeploymentUniqueLabelKey},
		NodeAffinityPolicy: ptr.To(corev1.NodeInclusionPolicyHonor),
		NodeTaintsPolicy:   ptr.To(corev1.NodeInclusionPolicyHonor),
	}}
}

// failoverTolerations shorten the default 300 s tolerations of an unreachable or NotReady node
// (see unreachableTolerationSeconds). Set in full, so that the stored object equals the built one.
func failoverTolerations() []corev1.Toleration {
	var out []corev1.Toleration
	for _, key := range []string{corev1.TaintNodeNotReady, corev1.TaintNodeUnreachable} {
		out = append(out, corev1.Toleration{Key: key, Operator: corev1.TolerationOpExists,
			Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr.To[int64](unreachableTolerationSeconds)})
	}
	return out
}

// BuildPodDisruptionBudget returns the lb pods' budget, or nil for a single lb pod (a budget of
// zero disruptions would block every node drain). One pod at a time may be evicted, and an
// unhealthy pod may always be, so a broken standby never blocks a drain.
func BuildPodDisruptionBudget(p Params) *policyv1.PodDisruptionBudget {
	if p.LBReplicas() == 1 {
		return nil
	}
	return &policyv1.PodDisruptionBudget{
		TypeMeta:   metav1.TypeMeta{APIVersion: "policy/v1", Kind: "PodDisruptionBudget"},
		ObjectMeta: p.objectMeta(p.podNamespace()),
		Spec: policyv1.PodDisruptionBudgetSpec{
			MaxUnavailable:             ptr.To(intstr.FromInt32(1)),
			Selector:                   &metav1.LabelSelector{MatchLabels: p.selectorLabels()},
			UnhealthyPodEvictionPolicy: ptr.To(policyv1.AlwaysAllow),
		},
	}
}

// sysctls returns the forwarding sysctls for the families the Service has, sorted by name.
func (p Params) sysctls() []corev1.Sysctl {
	var has4, has6 bool
	for _, a := range p.Addresses {
		if a.Is4() {
			has4 = true
		} else {
			has6 = true
		}
	}
	var out []corev1.Sysctl
	if p.Sysctls == ForwardingAll && has4 {
		out = append(out, corev1.Sysctl{Name: sysctlIPv4Fwd, Value: "1"})
	}
	if (p.Sysctls == ForwardingAll || p.Sysctls == ForwardingIPv6) && has6 {
		out = append(out, corev1.Sysctl{Name: sysctlIPv6Fwd, Value: "1"})
	}
	return out
}

func containerSecurityContext() *corev1.SecurityContext {
	return &corev1.SecurityContext{
		Privileged:               ptr.To(false),
		AllowPrivilegeEscalation: ptr.To(false),
		ReadOnlyRootFilesystem:   ptr.To(true),
		Capabilities: &corev1.Capabilities{
			Drop: []corev1.Capability{"ALL"},
			Add:  []corev1.Capability{"NET_ADMIN", "NET_RAW"},
		},
	}
}
