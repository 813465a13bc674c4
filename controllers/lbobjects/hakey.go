package lbobjects

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"time"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// The election key of a Service's replicas: lbpod/ha authenticates every advert with it, so a host
// on the underlay or another tenant's pod that knows the address cannot make the replicas move,
// drop or give up the address. It lives in a Secret of the lb pods' namespace that the kubelet
// mounts into the lb pods; nothing else reads it (the lb pod's ServiceAccount has no Secret
// rights, the operator may only create Secrets).
const (
	// HAKeyFile is the key's file name in the Secret (its data key) and in the mount.
	HAKeyFile = "ha.key"
	// HAKeyDir is where the lb pods mount the Secret.
	HAKeyDir = "/etc/lbsvc/ha"
	// HAKeyLen is how many random bytes the operator puts in a new key: a full HMAC-SHA256 key.
	HAKeyLen = 32
	// HAKeyFileFlag is lbpod's flag naming the key file.
	HAKeyFileFlag = "--ha-key-file"
	// HALegacyWindowFlag is lbpod's flag for how long after its start a replica with the key still
	// accepts the unauthenticated adverts of replicas from before authentication (lbpod/ha doc).
	HALegacyWindowFlag = "--ha-legacy-window"
	// HALegacyWindow is the window given while such replicas may still run: long enough for a
	// Deployment's rollout to replace them (lbpod's own default, see lbpod/ha).
	HALegacyWindow = 2 * time.Minute

	// HAWireLabel, on every lb pod of this version, says that its lbpod seals its adverts (wire
	// version 2). An lb pod of the Service without it is from before authentication: a legacy peer.
	HAWireLabel = "lbsvc.io/ha-wire"
	// HAWireVersion is HAWireLabel's value.
	HAWireVersion = "2"
	// HALegacyPeersAnnotation, on the lb Deployment, keeps the legacy window open for its pods from
	// the pass that found legacy peers on: the decision may not flip back once they are gone, or the
	// Deployment would roll a second time for nothing (see Params.HALegacyPeers).
	HALegacyPeersAnnotation = "lbsvc.io/ha-legacy-peers"

	haKeyVolume = "ha-key"
	ipKind      = "IP"
)

// IPRef names one IP object of a Service's claim: the key belongs to the claim, so the Secret is
// named after the IP objects' UIDs and owned by them.
type IPRef struct {
	Name string
	UID  types.UID
}

// claimDigest identifies the claim: the IP objects' UIDs, in any order. A UID is new each time an
// address is claimed (the IP object of a released address is deleted once drained), so a claim
// made again gets a new Secret name, hence a new key, and a replica of an earlier claim that still
// has the old key cannot take part in the new claim's election.
func (p Params) claimDigest() string {
	uids := make([]string, 0, len(p.Claim))
	for _, r := range p.Claim {
		uids = append(uids, string(r.UID))
	}
	slices.Sort(uids)
	h := sha256.New()
	for _, u := range uids {
		h.Write([]byte(u))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil)[:4])
}

// HAKeySecretName is the name of the Service's key Secret: the per-Service name and the claim.
func (p Params) HAKeySecretName() string { return p.name() + "-ha-" + p.claimDigest() }

// haKeyed tells whether the lb pods elect with a key: with standbys, once the claim is known.
func (p Params) haKeyed() bool { return p.LBReplicas() > 1 && len(p.Claim) > 0 }

// BuildHAKeySecret returns the Service's key Secret without its key, or nil when the lb pods do not
// elect (a single lb pod) or the claim is not known. The shell puts HAKeyLen random bytes under
// HAKeyFile when it creates it, and never reads, compares or updates it (the Secret is immutable,
// which also spares the kubelet a watch per Secret). Its owners are the claim's IP objects, so the
// garbage collector removes it when the last of them goes, after the address was drained; not the
// Service, which may go while its address still drains and its lb pods still run.
func BuildHAKeySecret(p Params) *corev1.Secret {
	if !p.haKeyed() {
		return nil
	}
	owners := make([]metav1.OwnerReference, 0, len(p.Claim))
	for _, r := range p.Claim {
		owners = append(owners, metav1.OwnerReference{APIVersion: lbv1.GroupVersion.String(), Kind: ipKind, Name: r.Name, UID: r.UID})
	}
	return &corev1.Secret{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{
			Name:            p.HAKeySecretName(),
			Namespace:       p.podNamespace(),
			Labels:          p.labels(),
			Annotations:     map[string]string{ServiceUIDAnnotation: string(p.ServiceUID)},
			OwnerReferences: owners,
		},
		Immutable: ptr.To(true),
		Type:      corev1.SecretTypeOpaque,
	}
}

// haKeyVolumes mounts the key Secret read-only for the owner (lbpod runs as root with every
// capability but NET_ADMIN and NET_RAW dropped: the owner bits are what let it read).
func (p Params) haKeyVolumes() ([]corev1.Volume, []corev1.VolumeMount, []string) {
	if !p.haKeyed() {
		return nil, nil, nil
	}
	v := corev1.Volume{Name: haKeyVolume, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
		SecretName: p.HAKeySecretName(), DefaultMode: ptr.To[int32](0o400), Optional: ptr.To(false),
	}}}
	m := corev1.VolumeMount{Name: haKeyVolume, MountPath: HAKeyDir, ReadOnly: true}
	window := time.Duration(0)
	if p.HALegacyPeers {
		window = HALegacyWindow
	}
	return []corev1.Volume{v}, []corev1.VolumeMount{m},
		[]string{HAKeyFileFlag + "=" + HAKeyDir + "/" + HAKeyFile, HALegacyWindowFlag + "=" + window.String()}
}
