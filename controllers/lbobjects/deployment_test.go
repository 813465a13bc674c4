package lbobjects

import (
	"maps"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
)

func seedParams() Params {
	return Params{
		ServiceName: "test-service", ServiceNamespace: "default", ServiceUID: "161edee1-7f6e-40f5-9e09-5a52c44267d0",
		Provider: "lb-svc-attachment.kube-system", NADName: "lb-svc-attachment", NADNamespace: "kube-system",
		SubnetName: "attach-subnet",
		Addresses:  []netip.Addr{netip.MustParseAddr("172.18.0.18")},
		CIDRs:      []netip.Prefix{netip.MustParsePrefix("172.18.0.0/16")},
		Gateways:   []netip.Addr{netip.MustParseAddr("172.18.0.1")},
		Image:      "localhost/lbsvc-lbpod:dev", Sysctls: ForwardingIPv6,
	}
}

func dualParams() Params {
	p := seedParams()
	// Given IPv6 first on purpose: every list must still come out IPv4 first.
	p.Addresses = []netip.Addr{netip.MustParseAddr("fd00:18::12"), netip.MustParseAddr("172.18.0.18")}
	p.CIDRs = []netip.Prefix{netip.MustParsePrefix("fd00:18::/64"), netip.MustParsePrefix("172.18.0.0/16")}
	p.Gateways = []netip.Addr{netip.MustParseAddr("fd00:18::1"), netip.MustParseAddr("172.18.0.1")}
	return p
}

func TestBuildDeploymentSeed(t *testing.T) {
	d, err := BuildDeployment(seedParams())
	if err != nil {
		t.Fatal(err)
	}
	wantMeta := metav1.ObjectMeta{
		Name: "lb-svc-test-service", Namespace: "default",
		Labels: map[string]string{"app.kubernetes.io/component": "lb-svc", "lbsvc.io/service": "test-service",
			"app.kubernetes.io/managed-by": "lbsvc-operator", "lbsvc.io/service-namespace": "default",
			"lbsvc.io/service-uid": "161edee1-7f6e-40f5-9e09-5a52c44267d0", "lbsvc.io/ipv4": "172.18.0.18"},
		Annotations: map[string]string{"lbsvc.io/service-uid": "161edee1-7f6e-40f5-9e09-5a52c44267d0"},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: "test-service",
			UID: "161edee1-7f6e-40f5-9e09-5a52c44267d0", Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}},
	}
	if !reflect.DeepEqual(d.ObjectMeta, wantMeta) {
		t.Errorf("metadata:\n got %+v\nwant %+v", d.ObjectMeta, wantMeta)
	}
	if *d.Spec.Replicas != 1 || d.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
		t.Errorf("replicas %d strategy %q", *d.Spec.Replicas, d.Spec.Strategy.Type)
	}
	wantSel := map[string]string{"app.kubernetes.io/component": "lb-svc", "lbsvc.io/service": "test-service"}
	if !reflect.DeepEqual(d.Spec.Selector.MatchLabels, wantSel) {
		t.Errorf("selector %v", d.Spec.Selector.MatchLabels)
	}
	wantPodAnn := map[string]string{
		"k8s.v1.cni.cncf.io/networks":                                `[{"name":"lb-svc-attachment","namespace":"kube-system","interface":"net1"}]`,
		"lb-svc-attachment.kube-system.kubernetes.io/ip_address":     "172.18.0.18",
		"lb-svc-attachment.kube-system.kubernetes.io/cidr":           "172.18.0.0/16",
		"lb-svc-attachment.kube-system.kubernetes.io/gateway":        "172.18.0.1",
		"lb-svc-attachment.kube-system.kubernetes.io/logical_switch": "attach-subnet",
	}
	if !reflect.DeepEqual(d.Spec.Template.Annotations, wantPodAnn) {
		t.Errorf("pod annotations:\n got %v\nwant %v", d.Spec.Template.Annotations, wantPodAnn)
	}
	// The pods' labels are the Deployment's and the wire version of their adverts.
	wantPodLabels := maps.Clone(d.Labels)
	wantPodLabels["lbsvc.io/ha-wire"] = "2"
	if !reflect.DeepEqual(d.Spec.Template.Labels, wantPodLabels) {
		t.Errorf("pod labels %v, want %v", d.Spec.Template.Labels, wantPodLabels)
	}
	spec := d.Spec.Template.Spec
	if spec.ServiceAccountName != "lbsvc-lbpod" || !*spec.AutomountServiceAccountToken {
		t.Errorf("service account %q automount %v", spec.ServiceAccountName, *spec.AutomountServiceAccountToken)
	}
	wantPodSC := &corev1.PodSecurityContext{SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}}
	if !reflect.DeepEqual(spec.SecurityContext, wantPodSC) {
		t.Errorf("pod securityContext %+v (IPv4 service, ipv6 mode: no sysctls)", spec.SecurityContext)
	}
	wantEnv := []corev1.EnvVar{
		{Name: "LBPOD_NAMESPACE", Value: "default"},
		{Name: "LBPOD_SERVICE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels['lbsvc.io/service']"}}},
		{Name: "LBPOD_POD_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
		{Name: "LBPOD_ADDRESSES", Value: "172.18.0.18/16"},
		{Name: "LBPOD_GATEWAYS", Value: "172.18.0.1"},
		{Name: "LBPOD_SUBNETS", Value: "172.18.0.0/16"},
		{Name: "LBPOD_REPLICAS", Value: "1"},
		{Name: "LBPOD_POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
		{Name: "LBPOD_NODE_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
		{Name: "LBPOD_LEASE", Value: "lb-svc-test-service"},
	}
	wantSC := &corev1.SecurityContext{
		Privileged: ptr.To(false), AllowPrivilegeEscalation: ptr.To(false), ReadOnlyRootFilesystem: ptr.To(true),
		Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: []corev1.Capability{"NET_ADMIN", "NET_RAW"}},
	}
	wantRes := corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("32Mi")},
		Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("128Mi")},
	}
	mounts := []corev1.VolumeMount{{Name: "run", MountPath: "/run"}}
	probe := func(path string, period, timeout, failures int32) *corev1.Probe {
		return &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromInt32(8081), Scheme: "HTTP"}},
			TimeoutSeconds: timeout, PeriodSeconds: period, SuccessThreshold: 1, FailureThreshold: failures}
	}
	wantMain := []corev1.Container{{Name: "lbpod", Image: "localhost/lbsvc-lbpod:dev", Command: []string{"/usr/local/bin/lbpod"},
		Env: wantEnv, VolumeMounts: mounts, Resources: wantRes, SecurityContext: wantSC,
		ReadinessProbe: probe("/readyz", 5, 2, 3), LivenessProbe: probe("/healthz", 10, 5, 6)}}
	// No init container: the one container applies and announces (a second container's start
	// delayed the first answer).
	if len(spec.InitContainers) != 0 {
		t.Errorf("init containers %+v, want none", spec.InitContainers)
	}
	if !reflect.DeepEqual(spec.Containers, wantMain) {
		t.Errorf("containers:\n got %+v\nwant %+v", spec.Containers, wantMain)
	}
	wantVol := []corev1.Volume{{Name: "run", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	if !reflect.DeepEqual(spec.Volumes, wantVol) {
		t.Errorf("volumes %+v", spec.Volumes)
	}
}

func TestBuildDeploymentVariants(t *testing.T) {
	long := strings.Repeat("a", 30) + "-" + strings.Repeat("b", 32) // 63 characters, a dash inside
	tests := map[string]struct {
		params       func() Params
		wantName     string
		wantAddrEnv  string
		wantGwEnv    string
		wantSubEnv   string
		wantIPAnn    string
		wantSysctls  []corev1.Sysctl
		wantNetworks string
	}{
		"dual stack, ipv6 sysctl, IPv4 listed first": {
			params: dualParams, wantName: "lb-svc-test-service",
			wantAddrEnv: "172.18.0.18/16,fd00:18::12/64", wantGwEnv: "172.18.0.1,fd00:18::1",
			wantSubEnv: "172.18.0.0/16,fd00:18::/64", wantIPAnn: "172.18.0.18,fd00:18::12",
			wantSysctls: []corev1.Sysctl{{Name: "net.ipv6.conf.all.forwarding", Value: "1"}},
		},
		"dual stack, all sysctls": {
			params:   func() Params { p := dualParams(); p.Sysctls = ForwardingAll; return p },
			wantName: "lb-svc-test-service", wantAddrEnv: "172.18.0.18/16,fd00:18::12/64", wantGwEnv: "172.18.0.1,fd00:18::1",
			wantSubEnv: "172.18.0.0/16,fd00:18::/64", wantIPAnn: "172.18.0.18,fd00:18::12",
			wantSysctls: []corev1.Sysctl{{Name: "net.ipv4.ip_forward", Value: "1"}, {Name: "net.ipv6.conf.all.forwarding", Value: "1"}},
		},
		"dual stack, no sysctls": {
			params:   func() Params { p := dualParams(); p.Sysctls = ForwardingNone; return p },
			wantName: "lb-svc-test-service", wantAddrEnv: "172.18.0.18/16,fd00:18::12/64", wantGwEnv: "172.18.0.1,fd00:18::1",
			wantSubEnv: "172.18.0.0/16,fd00:18::/64", wantIPAnn: "172.18.0.18,fd00:18::12",
		},
		"IPv4 only, all sysctls": {
			params:   func() Params { p := seedParams(); p.Sysctls = ForwardingAll; return p },
			wantName: "lb-svc-test-service", wantAddrEnv: "172.18.0.18/16", wantGwEnv: "172.18.0.1", wantSubEnv: "172.18.0.0/16",
			wantIPAnn: "172.18.0.18", wantSysctls: []corev1.Sysctl{{Name: "net.ipv4.ip_forward", Value: "1"}},
		},
		"IPv6 only, unmasked CIDR is masked": {
			params: func() Params {
				p := seedParams()
				p.Addresses = []netip.Addr{netip.MustParseAddr("2001:db8::5")}
				p.CIDRs = []netip.Prefix{netip.MustParsePrefix("2001:db8::7/120")}
				p.Gateways = []netip.Addr{netip.MustParseAddr("2001:db8::1")}
				return p
			},
			wantName: "lb-svc-test-service", wantAddrEnv: "2001:db8::5/120", wantGwEnv: "2001:db8::1", wantSubEnv: "2001:db8::/120",
			wantIPAnn: "2001:db8::5", wantSysctls: []corev1.Sysctl{{Name: "net.ipv6.conf.all.forwarding", Value: "1"}},
		},
		"63-character service name, dotted NAD name": {
			params: func() Params {
				p := seedParams()
				p.ServiceName = long
				p.NADName, p.NADNamespace, p.Provider = "my.nad", "net-ns", "my.nad.net-ns"
				return p
			},
			wantName: "lb-svc-" + long, wantAddrEnv: "172.18.0.18/16", wantGwEnv: "172.18.0.1", wantSubEnv: "172.18.0.0/16",
			wantIPAnn:    "172.18.0.18",
			wantNetworks: `[{"name":"my.nad","namespace":"net-ns","interface":"net1"}]`,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p := tc.params()
			d, err := BuildDeployment(p)
			if err != nil {
				t.Fatal(err)
			}
			if d.Name != tc.wantName || d.Spec.Template.Spec.ServiceAccountName != "lbsvc-lbpod" {
				t.Errorf("name %q sa %q, want %q and the namespace's lbsvc-lbpod", d.Name, d.Spec.Template.Spec.ServiceAccountName, tc.wantName)
			}
			if d.Labels["lbsvc.io/service"] != p.ServiceName || d.Spec.Selector.MatchLabels["lbsvc.io/service"] != p.ServiceName {
				t.Errorf("service label %q", d.Labels["lbsvc.io/service"])
			}
			for _, c := range append(d.Spec.Template.Spec.InitContainers, d.Spec.Template.Spec.Containers...) {
				got := map[string]string{}
				for _, e := range c.Env {
					got[e.Name] = e.Value
				}
				if got["LBPOD_ADDRESSES"] != tc.wantAddrEnv || got["LBPOD_GATEWAYS"] != tc.wantGwEnv || got["LBPOD_SUBNETS"] != tc.wantSubEnv {
					t.Errorf("container %s env %v", c.Name, got)
				}
			}
			if got := d.Spec.Template.Annotations[p.Provider+".kubernetes.io/ip_address"]; got != tc.wantIPAnn {
				t.Errorf("ip_address annotation %q, want %q", got, tc.wantIPAnn)
			}
			if tc.wantNetworks != "" && d.Spec.Template.Annotations[NetworksAnnotation] != tc.wantNetworks {
				t.Errorf("networks %q", d.Spec.Template.Annotations[NetworksAnnotation])
			}
			if got := d.Spec.Template.Spec.SecurityContext.Sysctls; !reflect.DeepEqual(got, tc.wantSysctls) {
				t.Errorf("sysctls %v, want %v", got, tc.wantSysctls)
			}
		})
	}
}

// The pod template follows the address, Subnet and image, and only them: the same input (which
// has no ports) builds the same template, so a port change never rolls the pod.
func TestDeploymentTemplateInputs(t *testing.T) {
	tmpl := func(p Params) corev1.PodTemplateSpec {
		d, err := BuildDeployment(p)
		if err != nil {
			t.Fatal(err)
		}
		return d.Spec.Template
	}
	base := tmpl(seedParams())
	if again := tmpl(seedParams()); !reflect.DeepEqual(again, base) {
		t.Errorf("same input, different template")
	}
	moved := seedParams()
	moved.Addresses = []netip.Addr{netip.MustParseAddr("172.18.0.19")}
	otherSubnet := seedParams()
	otherSubnet.SubnetName = "other"
	otherImage := seedParams()
	otherImage.Image = "localhost/lbsvc-lbpod:v2"
	for name, p := range map[string]Params{"address": moved, "subnet": otherSubnet, "image": otherImage} {
		if reflect.DeepEqual(tmpl(p), base) {
			t.Errorf("%s changed but the template did not", name)
		}
	}
	if got := tmpl(moved).Labels[lbv1.IPv4Label]; got != "172.18.0.19" {
		t.Errorf("address label %q, want 172.18.0.19", got)
	}
}

// With --lb-pod-namespace the Deployment and ServiceAccount move there, named after the Service's
// namespace too, without owner references; the RoleBinding stays beside the Service. The
// ServiceAccount is the one every lb pod of the Service's namespace shares there.
func TestSharedPodNamespace(t *testing.T) {
	p := seedParams()
	p.PodNamespace = "lbsvc-system"
	d, _ := BuildDeployment(p)
	sa := BuildServiceAccount(p)
	rb := BuildRoleBinding(p)
	if d.Namespace != "lbsvc-system" || !strings.HasPrefix(d.Name, "lb-svc-default-test-service-") || len(d.OwnerReferences) != 0 {
		t.Errorf("deployment %s/%s owners %v", d.Namespace, d.Name, d.OwnerReferences)
	}
	if sa.Namespace != "lbsvc-system" || d.Spec.Template.Spec.ServiceAccountName != sa.Name {
		t.Errorf("service account %s/%s, pod uses %q", sa.Namespace, sa.Name, d.Spec.Template.Spec.ServiceAccountName)
	}
	if sa.Name != "lbsvc-lbpod-default" {
		t.Errorf("service account %q, want lbsvc-lbpod-default", sa.Name)
	}
	if rb.Namespace != "default" || len(rb.OwnerReferences) != 0 || rb.Name != sa.Name {
		t.Errorf("binding %s/%s, owners %v", rb.Namespace, rb.Name, rb.OwnerReferences)
	}
	if s := rb.Subjects[0]; s.Namespace != "lbsvc-system" || s.Name != sa.Name {
		t.Errorf("binding subject %+v", s)
	}
	if d.Spec.Selector.MatchLabels[lbv1.ServiceNamespaceLabel] != "default" {
		t.Errorf("selector %v must name the Service's namespace", d.Spec.Selector.MatchLabels)
	}
	for _, e := range d.Spec.Template.Spec.Containers[0].Env {
		if e.Name == lbv1.EnvNamespace && (e.Value != "default" || e.ValueFrom != nil) {
			t.Errorf("%s = %+v, want the Service's namespace", e.Name, e)
		}
	}
	long := ObjectNameIn("lbsvc-system", strings.Repeat("n", 63), strings.Repeat("s", 63))
	if len(long) > 56 || long != ObjectNameIn("lbsvc-system", strings.Repeat("n", 63), strings.Repeat("s", 63)) {
		t.Errorf("long name %q (%d)", long, len(long))
	}
	if a, b := ObjectNameIn("lbsvc-system", "a-b", "c"), ObjectNameIn("lbsvc-system", "a", "b-c"); a == b {
		t.Errorf("a-b/c and a/b-c share the name %q", a)
	}
}

// The lb pods of a namespace's Services share one ServiceAccount and RoleBinding, which carry no
// Service's UID or owner (they outlive any one Service) and are the same for every Service there;
// the Service's own pair of earlier releases is retired.
func TestBuildRBAC(t *testing.T) {
	p := seedParams()
	sa := BuildServiceAccount(p)
	rb := BuildRoleBinding(p)
	wantLabels := map[string]string{"app.kubernetes.io/component": "lb-svc", "app.kubernetes.io/managed-by": "lbsvc-operator",
		"lbsvc.io/identity": "namespace", "lbsvc.io/service-namespace": "default"}
	for _, m := range []metav1.ObjectMeta{sa.ObjectMeta, rb.ObjectMeta} {
		if m.Name != "lbsvc-lbpod" || m.Namespace != "default" || len(m.OwnerReferences) != 0 ||
			!reflect.DeepEqual(m.Labels, wantLabels) || len(m.Annotations) != 0 {
			t.Errorf("metadata %+v", m)
		}
	}
	if !IsIdentity(sa) || !IsIdentity(rb) {
		t.Errorf("IsIdentity false on the namespace's identity")
	}
	wantRef := rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "lbsvc-lbpod"}
	wantSubj := []rbacv1.Subject{{Kind: "ServiceAccount", Name: "lbsvc-lbpod", Namespace: "default"}}
	if rb.RoleRef != wantRef || !reflect.DeepEqual(rb.Subjects, wantSubj) {
		t.Errorf("binding %+v %+v", rb.RoleRef, rb.Subjects)
	}
	other := seedParams()
	other.ServiceName, other.ServiceUID = "other", "uid-other"
	if !reflect.DeepEqual(BuildServiceAccount(other), sa) || !reflect.DeepEqual(BuildRoleBinding(other), rb) {
		t.Errorf("another Service of the namespace has another identity")
	}
	set, err := Build(p)
	if err != nil {
		t.Fatal(err)
	}
	if len(set.Retired) != 2 || KindOf(set.Retired[0]) != "ServiceAccount" || KindOf(set.Retired[1]) != "RoleBinding" ||
		set.Retired[0].GetName() != "lb-svc-test-service" || set.Retired[1].GetName() != "lb-svc-test-service" ||
		set.Retired[0].GetNamespace() != "default" || set.Retired[1].GetNamespace() != "default" {
		t.Errorf("retired %v", set.Retired)
	}
	if IsIdentity(set.Retired[0]) {
		t.Errorf("a retired per-Service ServiceAccount taken for the namespace's identity")
	}
}

func TestParseForwardingSysctls(t *testing.T) {
	for in, want := range map[string]ForwardingSysctls{"none": ForwardingNone, "ipv6": ForwardingIPv6, "all": ForwardingAll} {
		if got, err := ParseForwardingSysctls(in); err != nil || got != want {
			t.Errorf("%q: %q %v", in, got, err)
		}
	}
	if _, err := ParseForwardingSysctls("ipv4"); err == nil || err.Error() != `forwarding sysctls "ipv4": want none, ipv6 or all` {
		t.Errorf("ipv4: %v", err)
	}
}

// What the API server defaults must already be in what we build, or every pass would apply the
// Deployment again: UpToDate compares the desired object with the current one as a derivative.
func TestDesiredDeploymentSurvivesDefaults(t *testing.T) {
	d, err := BuildDeployment(seedParams())
	if err != nil {
		t.Fatal(err)
	}
	cur := d.DeepCopy()
	// What the API server fills in for this Deployment (the fields it defaults when unset).
	cur.Spec.RevisionHistoryLimit = ptr.To[int32](10)
	cur.Spec.ProgressDeadlineSeconds = ptr.To[int32](600)
	pod := &cur.Spec.Template.Spec
	pod.RestartPolicy, pod.DNSPolicy, pod.SchedulerName = corev1.RestartPolicyAlways, corev1.DNSClusterFirst, "default-scheduler"
	for _, cs := range [][]corev1.Container{pod.InitContainers, pod.Containers} {
		for i := range cs {
			cs[i].TerminationMessagePath, cs[i].TerminationMessagePolicy = "/dev/termination-log", corev1.TerminationMessageReadFile
			cs[i].ImagePullPolicy = corev1.PullIfNotPresent
			for j := range cs[i].Env {
				if f := cs[i].Env[j].ValueFrom; f != nil && f.FieldRef != nil {
					f.FieldRef.APIVersion = "v1"
				}
			}
		}
	}
	pod.Volumes[0].EmptyDir.Medium = ""
	if !UpToDate(d, cur) {
		t.Fatal("a defaulted copy of the desired Deployment is not up to date")
	}
	cur.Spec.Template.Spec.Containers[0].Image = "evil:1"
	if UpToDate(d, cur) {
		t.Fatal("a changed image is up to date")
	}
	cur.Spec.Template.Spec.Containers[0].Image = d.Spec.Template.Spec.Containers[0].Image

	// What DeepDerivative alone let through: something added to the live object that the
	// desired one does not have (by hand, or left by an operator flag set back to its default).
	for name, edit := range map[string]func(*corev1.PodSpec){
		"an environment variable no longer desired": func(p *corev1.PodSpec) {
			p.Containers[0].Env = append(p.Containers[0].Env, corev1.EnvVar{Name: "LBPOD_RULES", Value: "nftables"})
		},
		"a capability added": func(p *corev1.PodSpec) {
			c := p.Containers[0].SecurityContext.Capabilities
			c.Add = append(c.Add, "SYS_ADMIN")
		},
		"a capability drop removed": func(p *corev1.PodSpec) {
			p.Containers[0].SecurityContext.Capabilities.Drop = nil
		},
		"an argument added": func(p *corev1.PodSpec) { p.Containers[0].Args = append(p.Containers[0].Args, "--iptables=legacy") },
		"an envFrom added":  func(p *corev1.PodSpec) { p.Containers[0].EnvFrom = []corev1.EnvFromSource{{Prefix: "X"}} },
		"a container added": func(p *corev1.PodSpec) { p.Containers = append(p.Containers, corev1.Container{Name: "sidecar"}) },
		// A Deployment built before the init container went: replaced on upgrade.
		"an init container left": func(p *corev1.PodSpec) {
			p.InitContainers = []corev1.Container{{Name: "init", Image: p.Containers[0].Image, Command: []string{"/usr/local/bin/lbpod", "init"}}}
		},
		"a volume added": func(p *corev1.PodSpec) {
			p.Volumes = append(p.Volumes, corev1.Volume{Name: "host", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}})
		},
		"a volume mount added": func(p *corev1.PodSpec) {
			p.Containers[0].VolumeMounts = append(p.Containers[0].VolumeMounts, corev1.VolumeMount{Name: "host", MountPath: "/host"})
		},
		"host networking":  func(p *corev1.PodSpec) { p.HostNetwork = true },
		"the host's pids":  func(p *corev1.PodSpec) { p.HostPID = true },
		"host users unset": func(p *corev1.PodSpec) { p.HostUsers = ptr.To(true) },
	} {
		edited := cur.DeepCopy()
		edit(&edited.Spec.Template.Spec)
		if UpToDate(d, edited) {
			t.Errorf("%s: up to date", name)
		}
	}
}

// One lb pod keeps Recreate and no spread, budget or surge: two pods that each think they are
// alone must never overlap.
func TestBuildSingleReplica(t *testing.T) {
	p := seedParams()
	d, err := BuildDeployment(p)
	if err != nil {
		t.Fatal(err)
	}
	spec := d.Spec.Template.Spec
	if *d.Spec.Replicas != 1 || d.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType || d.Spec.Strategy.RollingUpdate != nil {
		t.Errorf("replicas %d strategy %+v", *d.Spec.Replicas, d.Spec.Strategy)
	}
	if spec.TopologySpreadConstraints != nil {
		t.Errorf("spread %+v", spec.TopologySpreadConstraints)
	}
	if pdb := BuildPodDisruptionBudget(p); pdb != nil {
		t.Errorf("budget for one pod: %+v", pdb)
	}
	wantTol := []corev1.Toleration{
		{Key: "node.kubernetes.io/not-ready", Operator: "Exists", Effect: "NoExecute", TolerationSeconds: ptr.To[int64](30)},
		{Key: "node.kubernetes.io/unreachable", Operator: "Exists", Effect: "NoExecute", TolerationSeconds: ptr.To[int64](30)},
	}
	if !reflect.DeepEqual(spec.Tolerations, wantTol) || *spec.TerminationGracePeriodSeconds != 10 {
		t.Errorf("tolerations %+v grace %d", spec.Tolerations, *spec.TerminationGracePeriodSeconds)
	}
}

// live is from as the API server reports it: at generation, its status at observed with replicas
// pods, updated of them of the current template.
func live(from *appsv1.Deployment, generation, observed int64, replicas, updated int32) *appsv1.Deployment {
	d := from.DeepCopy()
	d.Generation, d.Status.ObservedGeneration, d.Status.Replicas, d.Status.UpdatedReplicas = generation, observed, replicas, updated
	return d
}

// fromSingleCase is a desired and a live Deployment, and whether FromSingle must make desired's
// strategy Recreate.
type fromSingleCase struct {
	name     string
	desired  *appsv1.Deployment
	cur      *appsv1.Deployment
	recreate bool
}

func checkFromSingle(t *testing.T, cases []fromSingleCase) {
	t.Helper()
	for _, tc := range cases {
		got := FromSingle(tc.desired, tc.cur)
		if recreate := got.Spec.Strategy.Type == appsv1.RecreateDeploymentStrategyType; recreate != tc.recreate {
			t.Errorf("%s: strategy %+v, want Recreate %t", tc.name, got.Spec.Strategy, tc.recreate)
		}
		if got.Spec.Strategy.Type == appsv1.RecreateDeploymentStrategyType && got.Spec.Strategy.RollingUpdate != nil {
			t.Errorf("%s: Recreate with rollingUpdate %+v (the API server refuses it)", tc.name, got.Spec.Strategy.RollingUpdate)
		}
	}
}

// From one lb pod to standbys: Recreate while the live Deployment runs the single pod or is still
// rolling out from it (the single pod holds its addresses outside the election: a new replica of
// a RollingUpdate would claim them beside it), the desired RollingUpdate once the rollout is
// complete, and for a Deployment that had standbys already.
func TestFromSingle(t *testing.T) {
	p := seedParams()
	single, err := BuildDeployment(p)
	if err != nil {
		t.Fatal(err)
	}
	p.Replicas = 2
	standbys, err := BuildDeployment(p)
	if err != nil {
		t.Fatal(err)
	}
	mid := standbys.DeepCopy()
	mid.Spec.Strategy = appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType}
	checkFromSingle(t, []fromSingleCase{
		{"no live Deployment", standbys, &appsv1.Deployment{}, false},
		{"one lb pod running, standbys desired", standbys, live(single, 1, 1, 1, 1), true},
		{"rolling out from one: not yet seen", standbys, live(mid, 2, 1, 1, 1), true},
		{"rolling out from one: new pods not all there", standbys, live(mid, 2, 2, 1, 1), true},
		{"rolling out from one: an old pod left", standbys, live(mid, 2, 2, 3, 2), true},
		{"rolled out", standbys, live(mid, 2, 2, 2, 2), false},
		{"standbys already, rolling", standbys, live(standbys, 3, 2, 3, 1), false},
		{"one lb pod desired", single, live(standbys, 1, 1, 2, 2), true},
	})
	if standbys.Spec.Strategy.Type != appsv1.RollingUpdateDeploymentStrategyType {
		t.Fatal("FromSingle changed the desired object it was given")
	}
}

// With standbys, a change of what the lb pods elect with (an address family added or removed,
// new addresses: a new claim, hence a new key Secret, and a new election group) rolls out with
// Recreate too: old and new pods would never hear each other but write the same Lease. Also when
// the live Deployment comes from the cache, without its template. A change the old and new pods
// elect through (no key before: the legacy window; anything else in the template) keeps the
// RollingUpdate.
func TestFromSingleElectionChange(t *testing.T) {
	build := func(p Params) *appsv1.Deployment {
		t.Helper()
		d, err := BuildDeployment(p)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	rolledOut := func(d *appsv1.Deployment) *appsv1.Deployment { return live(d, 2, 2, 2, 2) }
	trimmed := func(d *appsv1.Deployment) *appsv1.Deployment {
		d = d.DeepCopy()
		TrimDeployment(d)
		return d
	}
	v4 := seedParams()
	v4.Replicas = 2
	v4.Claim = []IPRef{{Name: "172.18.0.18", UID: "uid-v4"}}
	dual := dualParams()
	dual.Replicas = 2
	dual.Claim = []IPRef{{Name: "172.18.0.18", UID: "uid-v4"}, {Name: "fd00-18--12", UID: "uid-v6"}}
	rekeyed := v4
	rekeyed.Claim = []IPRef{{Name: "172.18.0.18", UID: "uid-v4-again"}}
	keyless := v4
	keyless.Claim = nil
	image := v4
	image.Image = "localhost/lbsvc-lbpod:next"
	mid := build(dual)
	mid.Spec.Strategy = appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType}
	checkFromSingle(t, []fromSingleCase{
		{"IPv6 added", build(dual), rolledOut(build(v4)), true},
		{"IPv6 added, the live Deployment from the cache", build(dual), trimmed(rolledOut(build(v4))), true},
		{"IPv6 removed", build(v4), rolledOut(build(dual)), true},
		{"IPv6 removed, from the cache", build(v4), trimmed(rolledOut(build(dual))), true},
		{"the same addresses, a new key", build(rekeyed), trimmed(rolledOut(build(v4))), true},
		{"rolling out the new family", build(dual), live(mid, 3, 3, 3, 2), true},
		{"the new family rolled out", build(dual), trimmed(rolledOut(mid)), false},
		{"the same election, another image", build(image), trimmed(rolledOut(build(v4))), false},
		{"the same election, the keyed pods in the cache", build(v4), trimmed(rolledOut(build(v4))), false},
		{"no key before (an earlier release): the legacy window", build(v4), trimmed(rolledOut(build(keyless))), false},
	})
	// The cache keeps what the pods elect with in the emptied template, as election reads it from
	// the full one.
	d := build(dual)
	key, addrs := election(d)
	if key != dual.HAKeySecretName() || addrs != "172.18.0.18,fd00:18::12" {
		t.Errorf("election of the full template: %q %q", key, addrs)
	}
	if k, a := election(trimmed(d)); k != key || a != addrs {
		t.Errorf("election of the cached Deployment: %q %q, want %q %q", k, a, key, addrs)
	}
}

// Standbys: a rolling update that adds before it removes, pods spread over nodes, a budget of one.
func TestBuildStandbys(t *testing.T) {
	p := seedParams()
	p.Replicas = 2
	d, err := BuildDeployment(p)
	if err != nil {
		t.Fatal(err)
	}
	wantStrategy := appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType,
		RollingUpdate: &appsv1.RollingUpdateDeployment{MaxUnavailable: ptr.To(intstr.FromInt32(0)), MaxSurge: ptr.To(intstr.FromInt32(1))}}
	if *d.Spec.Replicas != 2 || !reflect.DeepEqual(d.Spec.Strategy, wantStrategy) {
		t.Errorf("replicas %d strategy %+v", *d.Spec.Replicas, d.Spec.Strategy)
	}
	sel := map[string]string{"app.kubernetes.io/component": "lb-svc", "lbsvc.io/service": "test-service"}
	wantSpread := []corev1.TopologySpreadConstraint{{MaxSkew: 1, TopologyKey: "kubernetes.io/hostname",
		WhenUnsatisfiable: corev1.DoNotSchedule, LabelSelector: &metav1.LabelSelector{MatchLabels: sel},
		MatchLabelKeys:     []string{"pod-template-hash"},
		NodeAffinityPolicy: ptr.To(corev1.NodeInclusionPolicyHonor), NodeTaintsPolicy: ptr.To(corev1.NodeInclusionPolicyHonor)}}
	if got := d.Spec.Template.Spec.TopologySpreadConstraints; !reflect.DeepEqual(got, wantSpread) {
		t.Errorf("spread\n got %+v\nwant %+v", got, wantSpread)
	}
	if env := d.Spec.Template.Spec.Containers[0].Env; env[6].Name != "LBPOD_REPLICAS" || env[6].Value != "2" ||
		env[len(env)-1] != (corev1.EnvVar{Name: "LBPOD_LEASE", Value: "lb-svc-test-service"}) {
		t.Errorf("replicas env %+v, lease env %+v", env[6], env[len(env)-1])
	}
	// --lb-ha-interval reaches the lb pods with standbys only.
	p.HAInterval = 250 * time.Millisecond
	if d, err = BuildDeployment(p); err != nil {
		t.Fatal(err)
	}
	if env := d.Spec.Template.Spec.Containers[0].Env; env[len(env)-1] != (corev1.EnvVar{Name: "LBPOD_HA_INTERVAL", Value: "250ms"}) {
		t.Errorf("ha interval env %+v", env[len(env)-1])
	}
	one := p
	one.Replicas = 1
	if d1, err := BuildDeployment(one); err != nil {
		t.Fatal(err)
	} else {
		lease := ""
		for _, e := range d1.Spec.Template.Spec.Containers[0].Env {
			if e.Name == "LBPOD_HA_INTERVAL" {
				t.Errorf("one lb pod: env %+v, want no election settings", e)
			}
			if e.Name == "LBPOD_LEASE" {
				lease = e.Value
			}
		}
		// The conflict probe records what a single lb pod announced on the Lease too.
		if lease != "lb-svc-test-service" {
			t.Errorf("one lb pod: LBPOD_LEASE %q, want lb-svc-test-service", lease)
		}
	}
	p.HAInterval = 0
	// --lb-rules=nftables or iptables reaches every lb pod; the default (empty: auto) sets nothing,
	// so that Deployments written before auto became the default are not rolled for it.
	for _, e := range d.Spec.Template.Spec.Containers[0].Env {
		if e.Name == "LBPOD_RULES" || e.Name == "LBPOD_CONFLICT_PROBE" {
			t.Errorf("default rules back end and probe: env %+v, want none", e)
		}
	}
	// --lb-conflict-probe=rfc or off reaches every lb pod; the default (fast) sets nothing.
	withProbe := p
	withProbe.ConflictProbe = "off"
	if dp, err := BuildDeployment(withProbe); err != nil {
		t.Fatal(err)
	} else if env := dp.Spec.Template.Spec.Containers[0].Env; env[len(env)-1] != (corev1.EnvVar{Name: "LBPOD_CONFLICT_PROBE", Value: "off"}) {
		t.Errorf("conflict probe env %+v", env[len(env)-1])
	}
	for _, rules := range []string{"nftables", "iptables"} {
		for _, nft := range []Params{p, one} {
			nft.Rules = rules
			dn, err := BuildDeployment(nft)
			if err != nil {
				t.Fatal(err)
			}
			if env := dn.Spec.Template.Spec.Containers[0].Env; env[len(env)-1] != (corev1.EnvVar{Name: "LBPOD_RULES", Value: rules}) {
				t.Errorf("%d lb pods, %s: rules env %+v", nft.Replicas, rules, env[len(env)-1])
			}
		}
	}
	if got := LeaseName("", "default", "test-service"); got != "lb-svc-test-service" || got != d.Name {
		t.Errorf("lease name %q, want the Deployment's, lb-svc-test-service", got)
	}
	pdb := BuildPodDisruptionBudget(p)
	if pdb == nil || pdb.Name != "lb-svc-test-service" || pdb.Namespace != "default" ||
		*pdb.Spec.MaxUnavailable != intstr.FromInt32(1) || pdb.Spec.MinAvailable != nil ||
		!reflect.DeepEqual(pdb.Spec.Selector.MatchLabels, sel) || *pdb.Spec.UnhealthyPodEvictionPolicy != policyv1.AlwaysAllow {
		t.Errorf("budget %+v", pdb)
	}
}

func TestParseReplicas(t *testing.T) {
	for _, tc := range []struct {
		ann     map[string]string
		want    int32
		wantErr string
	}{
		{nil, 2, ""},
		{map[string]string{"lbsvc.io/replicas": "1"}, 1, ""},
		{map[string]string{"lbsvc.io/replicas": " 3 "}, 3, ""},
		{map[string]string{"lbsvc.io/replicas": "5"}, 5, ""},
		{map[string]string{"lbsvc.io/replicas": "0"}, 0, `annotation lbsvc.io/replicas="0": want a whole number from 1 to 5`},
		{map[string]string{"lbsvc.io/replicas": "6"}, 0, `annotation lbsvc.io/replicas="6": want a whole number from 1 to 5`},
		{map[string]string{"lbsvc.io/replicas": "-1"}, 0, `annotation lbsvc.io/replicas="-1": want a whole number from 1 to 5`},
		{map[string]string{"lbsvc.io/replicas": "two"}, 0, `annotation lbsvc.io/replicas="two": want a whole number from 1 to 5`},
		{map[string]string{"lbsvc.io/replicas": strings.Repeat("9", 100)}, 0,
			`annotation lbsvc.io/replicas="` + strings.Repeat("9", 32) + `...": want a whole number from 1 to 5`},
	} {
		got, err := ParseReplicas(tc.ann, 2)
		gotErr := ""
		if err != nil {
			gotErr = err.Error()
		}
		if got != tc.want || gotErr != tc.wantErr {
			t.Errorf("%v: got %d %q, want %d %q", tc.ann, got, gotErr, tc.want, tc.wantErr)
		}
	}
}

// TestBuildSharedAddress: the lb objects of a shared address are named and selected by the
// address, carry its owner's UID (the drain counts them) but no Service name, are owned by the
// IP object, and their lb pods watch the members (EnvSharedIP) instead of one Service.
func TestBuildSharedAddress(t *testing.T) {
	p := seedParams()
	p.Replicas = 2
	ip := IPRef{Name: "172.18.0.12", UID: "ip-uid"}
	p.Shared, p.Claim = &ip, []IPRef{ip}
	p.Addresses = []netip.Addr{netip.MustParseAddr("172.18.0.12")}
	set, err := Build(p)
	if err != nil {
		t.Fatal(err)
	}
	d := set.Deployment
	if d.Name != "lb-svc-4-172-18-0-12" || set.ServiceAccount.Name != d.Name || set.RoleBinding.Name != d.Name || set.PodDisruptionBudget.Name != d.Name {
		t.Fatalf("names: deployment %s, sa %s, rb %s, pdb %s", d.Name, set.ServiceAccount.Name, set.RoleBinding.Name, set.PodDisruptionBudget.Name)
	}
	if got := SharedObjectName("fd00-0000-0000-0000-0000-0000-0000-0018"); got != "lb-svc-6-fd00-0000-0000-0000-0000-0000-0000-0018" {
		t.Fatalf("IPv6 name %s", got)
	}
	want := map[string]string{lbv1.ComponentLabel: lbv1.ComponentLBPod, lbv1.SharedIPLabel: "172.18.0.12"}
	if !reflect.DeepEqual(d.Spec.Selector.MatchLabels, want) || !reflect.DeepEqual(set.PodDisruptionBudget.Spec.Selector.MatchLabels, want) {
		t.Fatalf("selector %v, budget %v, want %v", d.Spec.Selector.MatchLabels, set.PodDisruptionBudget.Spec.Selector.MatchLabels, want)
	}
	pl := d.Spec.Template.Labels
	if _, ok := pl[lbv1.ServiceLabel]; ok || pl[lbv1.ServiceUIDLabel] != string(p.ServiceUID) || pl[lbv1.IPv4Label] != "172.18.0.12" {
		t.Fatalf("pod labels %v", pl)
	}
	for _, o := range []Object{d, set.ServiceAccount, set.RoleBinding, set.PodDisruptionBudget, set.HAKeySecret} {
		refs := o.GetOwnerReferences()
		if len(refs) != 1 || refs[0].Kind != "IP" || refs[0].Name != "172.18.0.12" || refs[0].UID != "ip-uid" || refs[0].BlockOwnerDeletion != nil {
			t.Fatalf("%s %s: owner references %+v", KindOf(o), o.GetName(), refs)
		}
	}
	env := map[string]corev1.EnvVar{}
	for _, e := range d.Spec.Template.Spec.Containers[0].Env {
		env[e.Name] = e
	}
	if _, ok := env[lbv1.EnvService]; ok {
		t.Fatalf("%s set for a shared address", lbv1.EnvService)
	}
	if env[lbv1.EnvSharedIP].Value != "172.18.0.12" || env[lbv1.EnvSharedIPUID].Value != "ip-uid" ||
		env[lbv1.EnvOwnerUID].Value != string(p.ServiceUID) || env[lbv1.EnvLease].Value != d.Name {
		t.Fatalf("env %v", env)
	}
	lease := BuildSharedLease(d.Name, p.ServiceNamespace, p.ServiceNamespace, p.ServiceUID, ip)
	if lease.Labels[lbv1.SharedIPLabel] != "172.18.0.12" || lease.Labels[lbv1.ServiceUIDLabel] != string(p.ServiceUID) ||
		len(lease.OwnerReferences) != 1 || lease.OwnerReferences[0].UID != "ip-uid" {
		t.Fatalf("lease %+v", lease.ObjectMeta)
	}
}

// TestBuildSharedAcrossNamespaces: with members in other namespaces (lb pods in
// --lb-pod-namespace), the address's lb pods are bound in each of them and in the lb pod
// namespace, and their ServiceAccount lists the member namespaces.
func TestBuildSharedAcrossNamespaces(t *testing.T) {
	p := seedParams()
	ip := IPRef{Name: "172.18.0.12", UID: "ip-uid"}
	p.Shared, p.Claim, p.Addresses = &ip, []IPRef{ip}, []netip.Addr{netip.MustParseAddr("172.18.0.12")}
	p.PodNamespace, p.MemberNamespaces = "lbsvc-system", []string{"team-b", "team-c"}
	set, err := Build(p)
	if err != nil {
		t.Fatal(err)
	}
	if set.Deployment.Namespace != "lbsvc-system" || set.ServiceAccount.Namespace != "lbsvc-system" || set.RoleBinding.Namespace != "default" {
		t.Fatalf("namespaces: deployment %s, sa %s, rb %s", set.Deployment.Namespace, set.ServiceAccount.Namespace, set.RoleBinding.Namespace)
	}
	var got []string
	for _, rb := range set.MemberRoleBindings {
		if rb.Name != set.Deployment.Name || rb.RoleRef.Name != LBPodClusterRole || len(rb.Subjects) != 1 ||
			rb.Subjects[0] != (rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: set.Deployment.Name, Namespace: "lbsvc-system"}) ||
			rb.OwnerReferences[0].UID != "ip-uid" {
			t.Fatalf("member RoleBinding %+v", rb)
		}
		got = append(got, rb.Namespace)
	}
	if !reflect.DeepEqual(got, []string{"lbsvc-system", "team-b", "team-c"}) {
		t.Fatalf("member RoleBindings in %v", got)
	}
	// The address's Lease is in the lb pod namespace, where they are bound (to write it), and no
	// member namespace's tenant writes Leases; labelled with the owner's namespace.
	if ns := SharedLeaseNamespace(p.PodNamespace, p.ServiceNamespace); ns != "lbsvc-system" {
		t.Fatalf("the Lease in %s", ns)
	}
	if l := BuildSharedLease(set.Deployment.Name, "lbsvc-system", p.ServiceNamespace, p.ServiceUID, ip); l.Namespace != "lbsvc-system" ||
		l.Labels[lbv1.ServiceNamespaceLabel] != "default" || l.Labels[lbv1.SharedIPLabel] != ip.Name {
		t.Fatalf("lease %+v", l.ObjectMeta)
	}
	if a := set.ServiceAccount.Annotations[lbv1.MemberNamespacesAnnotation]; a != "team-b,team-c" {
		t.Fatalf("ServiceAccount annotation %q", a)
	}
	if len(set.Stages()[0]) != 3+len(set.MemberRoleBindings) {
		t.Fatalf("stage %d objects", len(set.Stages()[0]))
	}
	// Each object of the address, as the API server keeps it, is up to date (owned by the IP
	// object without the controller flag: each was applied again at every member's pass), and
	// stays so only while it lists the member namespaces: once the last member of another
	// namespace leaves, the ServiceAccount's annotation must go.
	for _, o := range set.Stages()[0] {
		if !UpToDate(o, o.DeepCopyObject().(Object)) {
			t.Errorf("%T %s: a copy is not up to date", o, o.GetName())
		}
	}
	live := set.ServiceAccount.DeepCopy()
	p.MemberNamespaces = nil
	if UpToDate(BuildServiceAccount(p), live) {
		t.Error("a ServiceAccount still listing member namespaces is up to date with none desired")
	}
	if UpToDate(set.ServiceAccount, BuildServiceAccount(p)) {
		t.Error("a ServiceAccount listing no member namespaces is up to date with some desired")
	}
	other := set.Deployment.DeepCopy()
	other.OwnerReferences[0].UID = "another-ip"
	if UpToDate(set.Deployment, other) {
		t.Error("a Deployment owned by another IP object is up to date")
	}
	// Without standbys and members elsewhere, in the Service's namespace: nothing extra.
	p.PodNamespace, p.MemberNamespaces = "", nil
	set, _ = Build(p)
	if set.MemberRoleBindings != nil || set.ServiceAccount.Annotations[lbv1.MemberNamespacesAnnotation] != "" {
		t.Fatalf("same namespace: %v, %q", set.MemberRoleBindings, set.ServiceAccount.Annotations)
	}
}
