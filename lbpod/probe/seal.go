package probe

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"net/netip"
	"slices"

	"github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
)

// Seal proves that the list of announced addresses on a Service's Lease was written by that
// Service's lb pods since the current claim of its addresses: an HMAC-SHA256 of the list, under
// the claim's key (the election key Secret the operator creates with each claim and mounts into
// the lb pods only), beside it in v1alpha1.AnnouncedSealAnnotation.
//
// The list decides whether an address is probed before it is held, and anyone who may write
// Leases in the Lease's namespace can write it: a tenant whose lb pods run in --lb-pod-namespace
// (it cannot touch them) but who was granted Lease writes in its own namespace listed a host's
// address as announced, asked for it, and its lb pod announced it over the host without a probe.
// Under a seal a list that does not verify counts as nothing announced: the address is probed.
// A new claim of the address brings a new key, so a list sealed for an earlier claim is probed
// again too, as a newly claimed address should be.
type Seal struct {
	key   []byte
	lease string
}

// NewSeal returns the seal of the Lease namespace/name under key; nil without a key (a Service
// whose lb pods have none: the list is believed as written, as before seals).
func NewSeal(key []byte, namespace, name string) *Seal {
	if len(key) == 0 {
		return nil
	}
	return &Seal{key: slices.Clone(key), lease: namespace + "/" + name}
}

// tag is the seal of list (AnnouncedAnnotation's value) on this Lease: bound to its name, so a
// list and its seal copied to another Lease under the same key prove nothing there.
func (s *Seal) tag(list string) string {
	m := hmac.New(sha256.New, s.key)
	m.Write([]byte("lbsvc.io/announced\x00" + s.lease + "\x00" + list))
	return hex.EncodeToString(m.Sum(nil))
}

// proves says whether ann's announced list is sealed by s.
func (s *Seal) proves(ann map[string]string) bool {
	list, ok := ann[v1alpha1.AnnouncedAnnotation]
	if !ok {
		return false
	}
	got, err := hex.DecodeString(ann[v1alpha1.AnnouncedSealAnnotation])
	if err != nil {
		return false
	}
	want, _ := hex.DecodeString(s.tag(list))
	return hmac.Equal(got, want)
}

// Proven lists the addresses ann proves announced, and whether it proves a list at all (an
// empty one included). Without a seal the list is taken as written.
func (s *Seal) Proven(ann map[string]string) ([]netip.Addr, bool) {
	list, ok := ann[v1alpha1.AnnouncedAnnotation]
	if s != nil && !s.proves(ann) {
		return nil, false
	}
	return v1alpha1.ParseAnnounced(list), ok
}

// Record sets ann's announced list to what it proves announced plus addrs (none: what it proves,
// which is nothing when it proves no list), and seals it.
func (s *Seal) Record(ann map[string]string, addrs []netip.Addr) {
	proven, _ := s.Proven(ann)
	list := v1alpha1.FormatAnnounced(append(proven, addrs...))
	ann[v1alpha1.AnnouncedAnnotation] = list
	if s != nil {
		ann[v1alpha1.AnnouncedSealAnnotation] = s.tag(list)
	}
}
