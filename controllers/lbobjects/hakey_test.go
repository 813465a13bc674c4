package lbobjects

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func keyedParams() Params {
	p := dualParams()
	p.Replicas = 2
	p.Claim = []IPRef{{Name: "172-18-0-18", UID: "uid-v4"}, {Name: "fd00-18--12", UID: "uid-v6"}}
	return p
}

// The key Secret: named after the claim, owned by its IP objects only, immutable, no key in the
// built object (the shell fills it), in the lb pods' namespace.
func TestBuildHAKeySecret(t *testing.T) {
	p := keyedParams()
	s := BuildHAKeySecret(p)
	if s == nil {
		t.Fatal("no Secret for a Service with standbys and a claim")
	}
	const wantName = "lb-svc-test-service-ha-632b4612"
	if s.Name != wantName || s.Namespace != "default" {
		t.Errorf("Secret at %s/%s, want default/%s", s.Namespace, s.Name, wantName)
	}
	wantOwners := []metav1.OwnerReference{
		{APIVersion: "lbsvc.io/v1alpha1", Kind: "IP", Name: "172-18-0-18", UID: "uid-v4"},
		{APIVersion: "lbsvc.io/v1alpha1", Kind: "IP", Name: "fd00-18--12", UID: "uid-v6"},
	}
	if !reflect.DeepEqual(s.OwnerReferences, wantOwners) {
		t.Errorf("owners %+v, want %+v", s.OwnerReferences, wantOwners)
	}
	if !ptr.Deref(s.Immutable, false) || s.Type != corev1.SecretTypeOpaque || s.Data != nil || s.StringData != nil {
		t.Errorf("immutable %v, type %q, data %v %v: want immutable Opaque with no data", s.Immutable, s.Type, s.Data, s.StringData)
	}
	if s.Labels[ManagedByLabel] != ManagedByValue || s.Annotations[ServiceUIDAnnotation] != string(p.ServiceUID) {
		t.Errorf("labels %v annotations %v: not marked ours", s.Labels, s.Annotations)
	}

	// The claim in another order is the same claim; another UID (the address claimed again) is not.
	swapped := p
	swapped.Claim = []IPRef{p.Claim[1], p.Claim[0]}
	if got := swapped.HAKeySecretName(); got != wantName {
		t.Errorf("claim in another order: %s, want %s", got, wantName)
	}
	again := p
	again.Claim = []IPRef{p.Claim[0], {Name: "fd00-18--12", UID: "uid-v6-again"}}
	if got := again.HAKeySecretName(); got == wantName {
		t.Errorf("a new claim kept the Secret name %s: its key would not rotate", got)
	}

	shared := p
	shared.PodNamespace = "lbsvc-pods"
	if s := BuildHAKeySecret(shared); s.Namespace != "lbsvc-pods" {
		t.Errorf("with --lb-pod-namespace the Secret is in %s, want lbsvc-pods (where the pods mount it)", s.Namespace)
	}

	one := p
	one.Replicas = 1
	noClaim := p
	noClaim.Claim = nil
	for name, q := range map[string]Params{"one lb pod": one, "no claim": noClaim} {
		if s := BuildHAKeySecret(q); s != nil {
			t.Errorf("%s: Secret %s, want none", name, s.Name)
		}
	}
}

// The lb pods mount the key read-only in the main container only and are told where it is; a
// single lb pod, which does not elect, has neither.
func TestDeploymentMountsHAKey(t *testing.T) {
	p := keyedParams()
	d, err := BuildDeployment(p)
	if err != nil {
		t.Fatal(err)
	}
	spec := d.Spec.Template.Spec
	wantVol := corev1.Volume{Name: "ha-key", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
		SecretName: "lb-svc-test-service-ha-632b4612", DefaultMode: ptr.To[int32](0o400), Optional: ptr.To(false)}}}
	if len(spec.Volumes) != 2 || !reflect.DeepEqual(spec.Volumes[1], wantVol) {
		t.Errorf("volumes %+v, want run and %+v", spec.Volumes, wantVol)
	}
	main := spec.Containers[0]
	// A fresh claim: no legacy peers, so no legacy window (a forged unauthenticated advert is
	// refused from the start), and no annotation.
	if want := []string{"--ha-key-file=/etc/lbsvc/ha/ha.key", "--ha-legacy-window=0s"}; !reflect.DeepEqual(main.Args, want) {
		t.Errorf("args %q, want %q", main.Args, want)
	}
	if _, ok := d.Annotations[HALegacyPeersAnnotation]; ok {
		t.Errorf("annotations %v: no legacy peers", d.Annotations)
	}
	wantMount := corev1.VolumeMount{Name: "ha-key", MountPath: "/etc/lbsvc/ha", ReadOnly: true}
	if len(main.VolumeMounts) != 2 || !reflect.DeepEqual(main.VolumeMounts[1], wantMount) {
		t.Errorf("main mounts %+v, want run and %+v", main.VolumeMounts, wantMount)
	}

	one := p
	one.Replicas = 1
	d, err = BuildDeployment(one)
	if err != nil {
		t.Fatal(err)
	}
	if spec := d.Spec.Template.Spec; len(spec.Volumes) != 1 || spec.Containers[0].Args != nil || len(spec.Containers[0].VolumeMounts) != 1 {
		t.Errorf("one lb pod: volumes %+v args %q: want no key", spec.Volumes, spec.Containers[0].Args)
	}
}

// An upgrade from lb pods without authentication: the new pods get the legacy window, and the
// Deployment says so (the window then stays for its life: see HALegacyPeersAnnotation).
func TestDeploymentLegacyPeers(t *testing.T) {
	p := keyedParams()
	p.HALegacyPeers = true
	d, err := BuildDeployment(p)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"--ha-key-file=/etc/lbsvc/ha/ha.key", "--ha-legacy-window=2m0s"}; !reflect.DeepEqual(d.Spec.Template.Spec.Containers[0].Args, want) {
		t.Errorf("args %q, want %q", d.Spec.Template.Spec.Containers[0].Args, want)
	}
	if got := d.Annotations[HALegacyPeersAnnotation]; got != "true" {
		t.Errorf("annotation %s=%q, want true", HALegacyPeersAnnotation, got)
	}
	if got := d.Spec.Template.Labels[HAWireLabel]; got != HAWireVersion {
		t.Errorf("pod label %s=%q, want %s", HAWireLabel, got, HAWireVersion)
	}
	// One lb pod does not elect: neither window nor annotation.
	p.Replicas = 1
	if d, _ = BuildDeployment(p); d.Spec.Template.Spec.Containers[0].Args != nil || d.Annotations[HALegacyPeersAnnotation] != "" {
		t.Errorf("one lb pod: args %q annotations %v", d.Spec.Template.Spec.Containers[0].Args, d.Annotations)
	}
}
