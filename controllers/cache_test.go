package controllers

import (
	"reflect"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
	"github.com/lbsvc/lbsvc-operator/controllers/lbobjects"
)

func TestTrimForCache(t *testing.T) {
	managed := []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationApply}}
	now := metav1.Now()
	for name, tc := range map[string]struct {
		in, want any
	}{
		"service keeps every annotation but kubectl's copy": {
			in: &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web", ManagedFields: managed, Annotations: map[string]string{
				lastAppliedAnnotation: "{...}", lbv1.AttachmentProviderAnnotation: "lb-svc-attachment.kube-system"}},
				Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer}},
			want: &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web", Annotations: map[string]string{
				lbv1.AttachmentProviderAnnotation: "lb-svc-attachment.kube-system"}},
				Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer}},
		},
		"only kubectl's copy: no annotations left": {
			in:   &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "sa", Annotations: map[string]string{lastAppliedAnnotation: "{}"}}},
			want: &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "sa"}},
		},
		"deployment keeps status and all of its spec but the template, which its digest stands for": {
			in: &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "lb-svc-web", ManagedFields: managed},
				Spec:   deploySpec(),
				Status: appsv1.DeploymentStatus{Conditions: []appsv1.DeploymentCondition{{Type: appsv1.DeploymentAvailable, Status: corev1.ConditionTrue}}}},
			want: &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "lb-svc-web"},
				Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](2), Strategy: appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType},
					Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{
						lbobjects.CachedSpecDigestKey: lbobjects.SpecDigest(ptr.To(deploySpec()))}}}},
				Status: appsv1.DeploymentStatus{Conditions: []appsv1.DeploymentCondition{{Type: appsv1.DeploymentAvailable, Status: corev1.ConditionTrue}}}},
		},
		"lb pod: identity, labels and node only": {
			in: &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: "lb-svc-web-1", Namespace: "default", UID: "u1", ResourceVersion: "7",
					DeletionTimestamp: &now, Labels: map[string]string{lbv1.IPv4Label: "172.18.0.18"}, ManagedFields: managed,
					Annotations: map[string]string{"k8s.v1.cni.cncf.io/network-status": "[...]"}},
				Spec:   corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: "lbpod", Image: "lbpod:dev"}}},
				Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.244.0.5"},
			},
			want: &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: "lb-svc-web-1", Namespace: "default", UID: "u1", ResourceVersion: "7",
					DeletionTimestamp: &now, Labels: map[string]string{lbv1.IPv4Label: "172.18.0.18"}},
				Spec:   corev1.PodSpec{NodeName: "node-1"},
				Status: corev1.PodStatus{Phase: corev1.PodRunning},
			},
		},
		"node: labels, cordon, taints and the Ready condition's status only": {
			in: &corev1.Node{
				ObjectMeta: metav1.ObjectMeta{Name: "node-1", UID: "n1", ResourceVersion: "9", ManagedFields: managed,
					Labels: map[string]string{"vlan/100": "true"}, Annotations: map[string]string{"node.alpha.kubernetes.io/ttl": "0"}},
				Spec: corev1.NodeSpec{PodCIDR: "10.244.1.0/24", Unschedulable: true,
					Taints: []corev1.Taint{{Key: "dedicated", Effect: corev1.TaintEffectNoSchedule}}},
				Status: corev1.NodeStatus{
					Conditions: []corev1.NodeCondition{
						{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse, LastHeartbeatTime: now},
						{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: now, Reason: "KubeletReady", Message: "kubelet is posting ready status"},
					},
					Images:    []corev1.ContainerImage{{Names: []string{"lbpod:dev"}, SizeBytes: 1 << 20}},
					Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.250.1.1"}},
				},
			},
			want: &corev1.Node{
				ObjectMeta: metav1.ObjectMeta{Name: "node-1", UID: "n1", ResourceVersion: "9", Labels: map[string]string{"vlan/100": "true"}},
				Spec:       corev1.NodeSpec{Unschedulable: true, Taints: []corev1.Taint{{Key: "dedicated", Effect: corev1.TaintEffectNoSchedule}}},
				Status:     corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}},
			},
		},
		"not an object: unchanged": {in: "tombstone", want: "tombstone"},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := TrimForCache(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got  %#v\nwant %#v", got, tc.want)
			}
			again, err := TrimForCache(got)
			if err != nil || !reflect.DeepEqual(again, tc.want) {
				t.Errorf("a second pass changed the object: %#v, %v", again, err)
			}
		})
	}
}

func deploySpec() appsv1.DeploymentSpec {
	return appsv1.DeploymentSpec{Replicas: ptr.To[int32](2), Strategy: appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType},
		Template: corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "web"}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "lbpod", Image: "lbpod:dev"}}},
		}}
}

// FuzzTrimForCache: whatever the labels and annotations, the trimmed Service keeps every label
// and every annotation but kubectl's copy, and holds no managedFields.
func FuzzTrimForCache(f *testing.F) {
	f.Add("ovn.kubernetes.io/attachmentprovider", "lb-svc-attachment.kube-system", "app", "web")
	f.Add(lastAppliedAnnotation, "{}", "", "")
	f.Fuzz(func(t *testing.T, annKey, annValue, labelKey, labelValue string) {
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{
			Annotations:   map[string]string{annKey: annValue, lastAppliedAnnotation: "{}"},
			Labels:        map[string]string{labelKey: labelValue},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "m"}},
		}}
		out, err := TrimForCache(svc)
		if err != nil {
			t.Fatal(err)
		}
		got := out.(*corev1.Service)
		if got.ManagedFields != nil {
			t.Fatalf("managedFields kept: %v", got.ManagedFields)
		}
		if _, ok := got.Annotations[lastAppliedAnnotation]; ok {
			t.Fatalf("last-applied kept")
		}
		if annKey != lastAppliedAnnotation && got.Annotations[annKey] != annValue {
			t.Fatalf("annotation %q: got %q, want %q", annKey, got.Annotations[annKey], annValue)
		}
		if got.Labels[labelKey] != labelValue {
			t.Fatalf("label %q lost", labelKey)
		}
	})
}
