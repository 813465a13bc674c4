package controllers

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
)

// Names and values of the lb pod that are ours alone (the shared ones live in apis/v1alpha1).
const (
	// ManagedByLabel / ManagedByValue mark every object the operator creates.
	ManagedByLabel = "app.kubernetes.io/managed-by"
	ManagedByValue = "lbsvc-operator"

	// ServiceUIDAnnotation, on each object the operator builds, names the Service's UID: with
	// the owner reference (same namespace) or the label of the same name, it proves the object is
	// ours even after a hand edit removed one of them.
	ServiceUIDAnnotation = "lbsvc.io/service-uid"

	// NetworksAnnotation is Multus' request for extra interfaces.
	NetworksAnnotation = "k8s.v1.cni.cncf.io/networks"
	// LBInterface is the macvlan interface Multus adds to the lb pod.
	LBInterface = "net1"

	lbpodBinary     = "/usr/local/bin/lbpod"
	probePort       = 8081
	runVolumeName   = "run"
	runMountPath    = "/run"
	initContainer   = "init"
	mainContainer   = "lbpod"
	sysctlIPv6Fwd   = "net.ipv6.conf.all.forwarding"
	sysctlIPv4Fwd   = "net.ipv4.ip_forward"
	cidrSuffix      = "cidr"
	gatewaySuffix   = "gateway"
	serviceKind     = "Service"
	serviceAPIGroup = "v1"
)

// ForwardingSysctls selects which forwarding sysctls the lb pod sets through its securityContext.
// A new network namespace inherits IPv4 forwarding from the node but starts with IPv6 forwarding
// off, and /proc/sys is read-only in an unprivileged container, so the kubelet has to set them.
type ForwardingSysctls string

// The --forwarding-sysctls values.
const (
	ForwardingNone ForwardingSysctls = "none"
	ForwardingIPv6 ForwardingSysctls = "ipv6"
	ForwardingAll  ForwardingSysctls = "all"
)

// ParseForwardingSysctls validates a --forwarding-sysctls value.
func ParseForwardingSysctls(s string) (ForwardingSysctls, error) {
	switch f := ForwardingSysctls(s); f {
	case ForwardingNone, ForwardingIPv6, ForwardingAll:
		return f, nil
	}
	return "", fmt.Errorf("forwarding sysctls %q: want none, ipv6 or all", s)
}

// LBPodParams is everything the per-Service objects are built from: plain data, no client.
type LBPodParams struct {
	ServiceName      string
	ServiceNamespace string
	ServiceUID       types.UID
	// PodNamespace is where the Deployment and ServiceAccount live (--lb-pod-namespace, or the
	// Service's namespace); the Role and RoleBinding stay in the Service's namespace, since they
	// grant reading the Service.
	PodNamespace string
	// Provider is the attachment provider, "<nad name>.<nad namespace>".
	Provider     string
	NADName      string
	NADNamespace string
	SubnetName   string
	// Addresses are the allocated addresses, one per family; CIDRs and Gateways hold the
	// Subnet's prefix and gateway of the same family, index for index.
	Addresses []netip.Addr
	CIDRs     []netip.Prefix
	Gateways  []netip.Addr
	Image     string
	Sysctls   ForwardingSysctls
	// Replicas is the number of lb pods (0 means 1). With more than one, one pod holds the
	// address and the others stand by, spread over nodes.
	Replicas int32
	// HAInterval is the standbys' advert interval (--lb-ha-interval); zero leaves the lb pod's
	// default (100 ms).
	HAInterval time.Duration
	// Rules is the lb pod's rules back end (--lb-rules): empty leaves the lb pod's default
	// (iptables); "nftables" sets LBPOD_RULES.
	Rules string
}

// replicas is p.Replicas with 0 read as 1.
func (p LBPodParams) replicas() int32 {
	if p.Replicas < 1 {
		return 1
	}
	return p.Replicas
}

// ParseReplicas returns the lb pod count of a Service: the ReplicasAnnotation when set, else def.
// A bad value is an error that quotes at most a short prefix of it.
func ParseReplicas(annotations map[string]string, def int32) (int32, error) {
	v, ok := annotations[lbv1.ReplicasAnnotation]
	if !ok {
		return def, nil
	}
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 32)
	if err != nil || n < 1 || n > lbv1.MaxReplicas {
		return 0, fmt.Errorf("annotation %s=%q: want a whole number from 1 to %d", lbv1.ReplicasAnnotation, quotePrefix(v), lbv1.MaxReplicas)
	}
	return int32(n), nil
}

// quotePrefix cuts a user-given value to a short prefix for messages.
func quotePrefix(v string) string {
	const max = 32
	if len(v) <= max {
		return v
	}
	return strings.ToValidUTF8(v[:max], "") + "..."
}

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

// ObjectName is the name of the Deployment, ServiceAccount, Role and RoleBinding of a Service
// whose lb pod runs in its own namespace.
func ObjectName(service string) string { return lbv1.DeploymentPrefix + service }

// ObjectNameIn is the per-Service object name when lb pods of many namespaces share one
// (--lb-pod-namespace): "lb-svc-<namespace>-<service>" cut to 40 characters, then a digest of
// "<namespace>/<service>", since namespace names may hold dashes too ("a-b"/"c" and "a"/"b-c"
// must not meet).
func ObjectNameIn(podNamespace, namespace, service string) string {
	if podNamespace == "" || podNamespace == namespace {
		return ObjectName(service)
	}
	readable := namespace + "-" + service
	if len(readable) > 40 {
		readable = strings.TrimRight(readable[:40], "-.")
	}
	sum := sha256.Sum256([]byte(namespace + "/" + service))
	return lbv1.DeploymentPrefix + readable + "-" + hex.EncodeToString(sum[:4])
}

// name is the Service's per-Service object name.
func (p LBPodParams) name() string {
	return ObjectNameIn(p.PodNamespace, p.ServiceNamespace, p.ServiceName)
}

// podNamespace is where the Deployment and ServiceAccount live.
func (p LBPodParams) podNamespace() string {
	if p.PodNamespace == "" {
		return p.ServiceNamespace
	}
	return p.PodNamespace
}

// shared tells whether the lb pod lives outside the Service's namespace.
func (p LBPodParams) shared() bool { return p.podNamespace() != p.ServiceNamespace }

// AddressLabels are the labels naming the IP objects of addrs (lbsvc.io/ipv4, lbsvc.io/ipv6).
func AddressLabels(addrs []netip.Addr) map[string]string {
	out := map[string]string{}
	for _, a := range addrs {
		if a.Is4() {
			out[lbv1.IPv4Label] = lbv1.IPName(a)
		} else {
			out[lbv1.IPv6Label] = lbv1.IPName(a)
		}
	}
	return out
}

// familyOrdered returns the indices of p.Addresses with IPv4 first, so that every
// comma-separated list the lb pod reads is in the same, predictable order.
func (p LBPodParams) familyOrdered() []int {
	idx := make([]int, len(p.Addresses))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool {
		return p.Addresses[idx[a]].Is4() && !p.Addresses[idx[b]].Is4()
	})
	return idx
}

// lists renders the address, address/prefix, CIDR and gateway lists, IPv4 first.
func (p LBPodParams) lists() (addrs, addrPrefixes, cidrs, gateways string) {
	var a, ap, c, g []string
	for _, i := range p.familyOrdered() {
		a = append(a, p.Addresses[i].String())
		if i < len(p.CIDRs) {
			ap = append(ap, netip.PrefixFrom(p.Addresses[i], p.CIDRs[i].Bits()).String())
			c = append(c, p.CIDRs[i].Masked().String())
		}
		if i < len(p.Gateways) {
			g = append(g, p.Gateways[i].String())
		}
	}
	return strings.Join(a, ","), strings.Join(ap, ","), strings.Join(c, ","), strings.Join(g, ",")
}

func (p LBPodParams) ownerReference() metav1.OwnerReference {
	return metav1.OwnerReference{
		APIVersion:         serviceAPIGroup,
		Kind:               serviceKind,
		Name:               p.ServiceName,
		UID:                p.ServiceUID,
		Controller:         ptr.To(true),
		BlockOwnerDeletion: ptr.To(true),
	}
}

// Labels are the labels of every object built for the Service (and of its lb pod).
func Labels(service string) map[string]string {
	return map[string]string{
		lbv1.ComponentLabel: lbv1.ComponentLBPod,
		lbv1.ServiceLabel:   service,
		ManagedByLabel:      ManagedByValue,
	}
}

// labels are Labels plus the Service's namespace and UID.
func (p LBPodParams) labels() map[string]string {
	l := Labels(p.ServiceName)
	l[lbv1.ServiceNamespaceLabel] = p.ServiceNamespace
	l[lbv1.ServiceUIDLabel] = string(p.ServiceUID)
	return l
}

// selectorLabels is the Deployment's (immutable) selector: stable for the Service's lifetime.
// In a shared lb pod namespace it also names the Service's namespace, since Services of two
// namespaces may share a name.
func (p LBPodParams) selectorLabels() map[string]string {
	l := map[string]string{
		lbv1.ComponentLabel: lbv1.ComponentLBPod,
		lbv1.ServiceLabel:   p.ServiceName,
	}
	if p.shared() {
		l[lbv1.ServiceNamespaceLabel] = p.ServiceNamespace
	}
	return l
}

// objectMeta is the metadata of an object in namespace ns: an owner reference to the Service
// where the namespaces allow one (garbage collection then follows the Service).
func (p LBPodParams) objectMeta(ns string) metav1.ObjectMeta {
	m := metav1.ObjectMeta{
		Name:        p.name(),
		Namespace:   ns,
		Labels:      p.labels(),
		Annotations: map[string]string{ServiceUIDAnnotation: string(p.ServiceUID)},
	}
	if ns == p.ServiceNamespace {
		m.OwnerReferences = []metav1.OwnerReference{p.ownerReference()}
	}
	return m
}

// networkSelection is one entry of the Multus networks annotation.
type networkSelection struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	Interface string `json:"interface"`
}

// BuildDeployment returns the desired lb-svc Deployment of a Service. Ports and the ClusterIP are
// deliberately absent: the lb pod watches its Service, so a port change must not roll the pod.
func BuildDeployment(p LBPodParams) (*appsv1.Deployment, error) {
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
	env := []corev1.EnvVar{
		{Name: lbv1.EnvNamespace, Value: p.ServiceNamespace},
		{Name: lbv1.EnvService, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels['" + lbv1.ServiceLabel + "']"}}},
		{Name: lbv1.EnvPodIP, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
		{Name: lbv1.EnvAddresses, Value: addrPrefixes},
		{Name: lbv1.EnvGateways, Value: gateways},
		{Name: lbv1.EnvSubnets, Value: cidrs},
		{Name: lbv1.EnvReplicas, Value: strconv.Itoa(int(p.replicas()))},
		{Name: lbv1.EnvPodName, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
		{Name: lbv1.EnvNodeName, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
	}
	if p.replicas() > 1 {
		// The Lease's name, given rather than derived from the pod's: a pod's generated name is
		// cut to 58 characters, so a long Deployment name is not a prefix of it.
		env = append(env, corev1.EnvVar{Name: lbv1.EnvLease, Value: p.name()})
		if p.HAInterval > 0 {
			env = append(env, corev1.EnvVar{Name: lbv1.EnvHAInterval, Value: p.HAInterval.String()})
		}
	}
	if p.Rules != "" {
		env = append(env, corev1.EnvVar{Name: lbv1.EnvRules, Value: p.Rules})
	}
	mounts := []corev1.VolumeMount{{Name: runVolumeName, MountPath: runMountPath}}
	resources := corev1.ResourceRequirements{
		Requests: corev1.ResourceList{
			corev1.ResourceCPU:    resource.MustParse("10m"),
			corev1.ResourceMemory: resource.MustParse("32Mi"),
		},
		Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("128Mi")},
	}
	// Every probe field is set (the API server would default the zero ones), so that the current
	// object compares equal to the desired one and an unchanged Service writes nothing. Readiness
	// every second: the pod shows Ready about a second after it serves. Liveness is patient (a
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
	d := &appsv1.Deployment{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: meta,
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(p.replicas()),
			Strategy: p.strategy(),
			Selector: &metav1.LabelSelector{MatchLabels: p.selectorLabels()},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: podLabels, Annotations: podAnnotations},
				Spec: corev1.PodSpec{
					ServiceAccountName:            p.name(),
					AutomountServiceAccountToken:  ptr.To(true),
					TerminationGracePeriodSeconds: ptr.To[int64](terminationGraceSeconds),
					Tolerations:                   failoverTolerations(),
					TopologySpreadConstraints:     p.spread(),
					SecurityContext: &corev1.PodSecurityContext{
						SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
						Sysctls:        p.sysctls(),
					},
					InitContainers: []corev1.Container{{
						Name:            initContainer,
						Image:           p.Image,
						Command:         []string{lbpodBinary, "init"},
						Env:             env,
						VolumeMounts:    mounts,
						Resources:       resources,
						SecurityContext: containerSecurityContext(),
					}},
					Containers: []corev1.Container{{
						Name:            mainContainer,
						Image:           p.Image,
						Command:         []string{lbpodBinary},
						Env:             env,
						VolumeMounts:    mounts,
						Resources:       resources,
						SecurityContext: containerSecurityContext(),
						ReadinessProbe:  probe("/readyz", 1, 2, 3),
						LivenessProbe:   probe("/healthz", 10, 5, 6),
					}},
					// iptables takes its lock file under /run, and the root filesystem is read-only.
					Volumes: []corev1.Volume{{Name: runVolumeName, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
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
func (p LBPodParams) strategy() appsv1.DeploymentStrategy {
	if p.replicas() == 1 {
		return appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType}
	}
	return appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType,
		RollingUpdate: &appsv1.RollingUpdateDeployment{
			MaxUnavailable: ptr.To(intstr.FromInt32(0)),
			MaxSurge:       ptr.To(intstr.FromInt32(1)),
		}}
}

// spread keeps the lb pods of one Service on different nodes. DoNotSchedule on the hostname makes
// it required wherever enough nodes exist, yet a one-node cluster still runs every replica, since
// the skew among a single domain is 0; nodes whose taints the pod does not tolerate (NotReady,
// cordoned) do not count as domains. pod-template-hash keeps a rollout's old and new pods apart.
func (p LBPodParams) spread() []corev1.TopologySpreadConstraint {
	if p.replicas() == 1 {
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
func BuildPodDisruptionBudget(p LBPodParams) *policyv1.PodDisruptionBudget {
	if p.replicas() == 1 {
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
func (p LBPodParams) sysctls() []corev1.Sysctl {
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

// BuildServiceAccount returns the lb pod's ServiceAccount.
func BuildServiceAccount(p LBPodParams) (*corev1.ServiceAccount, error) {
	sa := &corev1.ServiceAccount{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ServiceAccount"},
		ObjectMeta: p.objectMeta(p.podNamespace()),
	}
	return sa, nil
}

// BuildRole returns the Role that lets the lb pod read its own Service and nothing else; with
// standbys, also read, watch and update (never create or delete) its own Lease, where the pod that
// takes the address over records itself (list and watch only pass with a field selector on that
// one name).
func BuildRole(p LBPodParams) (*rbacv1.Role, error) {
	r := &rbacv1.Role{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "Role"},
		ObjectMeta: p.objectMeta(p.ServiceNamespace),
		Rules: []rbacv1.PolicyRule{{
			APIGroups:     []string{""},
			Resources:     []string{"services"},
			ResourceNames: []string{p.ServiceName},
			Verbs:         []string{"get", "list", "watch"},
		}},
	}
	if p.replicas() > 1 {
		r.Rules = append(r.Rules, rbacv1.PolicyRule{
			APIGroups:     []string{coordinationv1.GroupName},
			Resources:     []string{"leases"},
			ResourceNames: []string{p.name()},
			Verbs:         []string{"get", "list", "watch", "update"},
		})
	}
	return r, nil
}

// BuildLease returns the Service's Lease, or nil for a single lb pod. The operator writes only
// its metadata: the spec belongs to the lb pods, which write it once per takeover (holder and
// transitions), never to renew it, so an idle Service costs no write. It is a record for people
// and for the operator's AddressActive condition, not a lock: who holds the address is settled on
// the underlay by the lb pods' election.
func BuildLease(p LBPodParams) *coordinationv1.Lease {
	if p.replicas() == 1 {
		return nil
	}
	return &coordinationv1.Lease{
		TypeMeta:   metav1.TypeMeta{APIVersion: "coordination.k8s.io/v1", Kind: "Lease"},
		ObjectMeta: p.objectMeta(p.ServiceNamespace),
	}
}

// BuildRoleBinding binds the lb pod's ServiceAccount to its Role.
func BuildRoleBinding(p LBPodParams) (*rbacv1.RoleBinding, error) {
	rb := &rbacv1.RoleBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "RoleBinding"},
		ObjectMeta: p.objectMeta(p.ServiceNamespace),
		RoleRef: rbacv1.RoleRef{
			APIGroup: rbacv1.GroupName,
			Kind:     "Role",
			Name:     p.name(),
		},
		Subjects: []rbacv1.Subject{{
			Kind:      rbacv1.ServiceAccountKind,
			Name:      p.name(),
			Namespace: p.podNamespace(),
		}},
	}
	return rb, nil
}
