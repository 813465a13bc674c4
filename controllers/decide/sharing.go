package decide

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
	"github.com/lbsvc/lbsvc-operator/controllers/lbobjects"
)

// Sharing one address between Services (issue 23), the pure rules: who may join whom. Services
// that name the same key in lbsvc.io/allow-shared-ip share an address when no (protocol, port)
// is served by two of them: each port then has exactly one Service to forward to. Across
// namespaces only when each side names the other's namespace (or "*") in
// lbsvc.io/shared-ip-namespaces, as Cilium's sharing-cross-namespace does, and only when the lb
// pods run outside every tenant (--lb-pod-namespace): the lb pod of a shared address forwards
// to every member, so it must belong to none of their namespaces.
//
// A refusal names the port that clashes and, in the joining Service's own namespace, the Service
// holding it; a Service of another namespace is never named (its existence is not the joiner's
// business).

// MaxSharingMembers bounds the Services on one address: each member is one more Service the lb
// pod watches and one more entry in the IP object.
const MaxSharingMembers = 32

// MaxSharingNamespaces bounds the namespaces one Service may name.
const MaxSharingNamespaces = 32

// MaxSharingPorts bounds the protocols and ports of one sharing Service: what the IP object's
// member record holds (spec.members[].ports). The API server allows more on a Service without
// node ports; past the record's bound the claim would fail on every pass, with nothing said.
const MaxSharingPorts = 4096

// AnyNamespace in lbsvc.io/shared-ip-namespaces accepts every namespace.
const AnyNamespace = "*"

// Sharing is what a Service asks of sharing, as its annotations say it.
type Sharing struct {
	// Key is the sharing key: only Services with equal keys share.
	Key string
	// Namespaces are the other namespaces whose Services may share with it (AnyNamespace: all);
	// empty: its own namespace only.
	Namespaces []string
}

// SharingPort is one (protocol, port) a member serves, "TCP/53" in text.
type SharingPort struct {
	Protocol corev1.Protocol
	Port     int32
}

// String renders the port as "TCP/53".
func (p SharingPort) String() string { return string(p.Protocol) + "/" + strconv.Itoa(int(p.Port)) }

// SharingMember is one Service on a shared address, with what the rules compare.
type SharingMember struct {
	Namespace, Name, UID string
	Sharing
	// Ports are sorted by protocol, then port (SharingPortsOf).
	Ports []SharingPort
}

// ParseSharing reads a Service's sharing annotations: nil when it does not share. A key must be a
// valid label value (at most 63 characters, alphanumerics, '-', '_', '.'), since it is compared and
// shown everywhere; namespaces must be valid namespace names or "*". Refused with
// ReasonInvalidSharing.
func ParseSharing(svc *corev1.Service) (*Sharing, *Refusal) {
	key, ok := svc.Annotations[lbv1.AllowSharedIPAnnotation]
	nsList, hasNS := svc.Annotations[lbv1.SharedIPNamespacesAnnotation]
	if !ok {
		if hasNS {
			return nil, refusal(ReasonInvalidSharing, "annotation %s is set without %s: name the sharing key too", lbv1.SharedIPNamespacesAnnotation, lbv1.AllowSharedIPAnnotation)
		}
		return nil, nil
	}
	key = strings.TrimSpace(key)
	if key == "" || len(validation.IsValidLabelValue(key)) > 0 {
		return nil, refusal(ReasonInvalidSharing, "annotation %s=%s: want a key of at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit", lbv1.AllowSharedIPAnnotation, quote(key))
	}
	s := &Sharing{Key: key}
	for _, ns := range strings.Split(nsList, ",") {
		ns = strings.TrimSpace(ns)
		switch {
		case ns == "" || ns == svc.Namespace:
			continue
		case ns != AnyNamespace && len(validation.IsDNS1123Label(ns)) > 0:
			return nil, refusal(ReasonInvalidSharing, "annotation %s: %s is not a namespace name or %q", lbv1.SharedIPNamespacesAnnotation, quote(ns), AnyNamespace)
		}
		if !slices.Contains(s.Namespaces, ns) {
			s.Namespaces = append(s.Namespaces, ns)
		}
	}
	if n := len(SharingPortsOf(svc.Spec.Ports)); n > MaxSharingPorts {
		return nil, refusal(ReasonInvalidSharing, "annotation %s: the Service has %d ports; a Service that shares an address may have at most %d", lbv1.AllowSharedIPAnnotation, n, MaxSharingPorts)
	}
	if len(s.Namespaces) > MaxSharingNamespaces {
		return nil, refusal(ReasonInvalidSharing, "annotation %s names %d namespaces: at most %d (or %q for all)", lbv1.SharedIPNamespacesAnnotation, len(s.Namespaces), MaxSharingNamespaces, AnyNamespace)
	}
	slices.Sort(s.Namespaces)
	return s, nil
}

// SharingPortsOf are the (protocol, port) pairs of a Service, sorted, empty protocol read as TCP.
func SharingPortsOf(ports []corev1.ServicePort) []SharingPort {
	out := make([]SharingPort, 0, len(ports))
	for _, p := range ports {
		proto := p.Protocol
		if proto == "" {
			proto = corev1.ProtocolTCP
		}
		out = append(out, SharingPort{Protocol: proto, Port: p.Port})
	}
	slices.SortFunc(out, compareSharingPorts)
	return slices.Compact(out)
}

func compareSharingPorts(a, b SharingPort) int {
	return cmp.Or(cmp.Compare(a.Protocol, b.Protocol), cmp.Compare(a.Port, b.Port))
}

// MemberOf is the SharingMember of a Service that shares (s from ParseSharing).
func MemberOf(svc *corev1.Service, s Sharing) SharingMember {
	return SharingMember{Namespace: svc.Namespace, Name: svc.Name, UID: string(svc.UID), Sharing: s, Ports: SharingPortsOf(svc.Spec.Ports)}
}

// accepts tells whether s lets Services of namespace ns share with it.
func (s Sharing) accepts(ns string) bool {
	return slices.Contains(s.Namespaces, AnyNamespace) || slices.Contains(s.Namespaces, ns)
}

// SharingClash is why m may not join the members of an address shared under key (nil: it may).
// m itself among members (same UID) is ignored: a member whose ports changed is checked against
// the others. crossNamespace is whether lb pods run outside every tenant (--lb-pod-namespace).
// It is pure and total: any input gives an answer.
func SharingClash(key string, members []SharingMember, m SharingMember, crossNamespace bool) *Refusal {
	if m.Key != key {
		return refusal(ReasonSharingConflict, "the address is shared under another key than %s", quote(m.Key))
	}
	others := 0
	for _, o := range members {
		if o.UID == m.UID {
			continue
		}
		others++
		if o.Namespace != m.Namespace {
			if !crossNamespace {
				return refusal(ReasonSharingConflict, "the address is shared with a Service of another namespace, which needs --lb-pod-namespace (lb pods outside every tenant)")
			}
			if !m.accepts(o.Namespace) {
				return refusal(ReasonSharingConflict, "the address is shared with a Service of namespace %s, which annotation %s does not name", o.Namespace, lbv1.SharedIPNamespacesAnnotation)
			}
			if !o.accepts(m.Namespace) {
				return refusal(ReasonSharingConflict, "a Service of namespace %s shares the address and does not accept namespace %s", o.Namespace, m.Namespace)
			}
		}
		if clash := commonPorts(o.Ports, m.Ports); len(clash) > 0 {
			who := "a Service of another namespace"
			if o.Namespace == m.Namespace {
				who = "Service " + o.Name
			}
			return refusal(ReasonSharingConflict, "port %s is served on the address by %s (a shared address serves each protocol and port for one Service)", joinPorts(clash, 8), who)
		}
	}
	if others >= MaxSharingMembers {
		return refusal(ReasonSharingConflict, "the address is already shared by %d Services, the most one address serves", others)
	}
	return nil
}

// commonPorts are the ports in both sorted lists.
func commonPorts(a, b []SharingPort) []SharingPort {
	var out []SharingPort
	for i, j := 0, 0; i < len(a) && j < len(b); {
		switch c := compareSharingPorts(a[i], b[j]); {
		case c < 0:
			i++
		case c > 0:
			j++
		default:
			out = append(out, a[i])
			i++
			j++
		}
	}
	return out
}

// joinPorts renders at most max ports, then how many more.
func joinPorts(ports []SharingPort, max int) string {
	var s []string
	for i, p := range ports {
		if i == max {
			s = append(s, fmt.Sprintf("and %d more", len(ports)-max))
			break
		}
		s = append(s, p.String())
	}
	return strings.Join(s, ", ")
}

// MemberRecord is how the IP object lists m.
func MemberRecord(m SharingMember) lbv1.IPMember {
	ports := make([]string, len(m.Ports))
	for i, p := range m.Ports {
		ports[i] = p.String()
	}
	return lbv1.IPMember{Namespace: m.Namespace, Name: m.Name, UID: m.UID, Ports: ports, Namespaces: slices.Clone(m.Namespaces)}
}

// MembersOf reads the members an IP object of key lists. A port that does not parse (the API
// server bounds the field, nothing else writes it) is skipped: it can clash with nothing.
func MembersOf(key string, recs []lbv1.IPMember) []SharingMember {
	out := make([]SharingMember, 0, len(recs))
	for _, r := range recs {
		m := SharingMember{Namespace: r.Namespace, Name: r.Name, UID: r.UID, Sharing: Sharing{Key: key, Namespaces: r.Namespaces}}
		for _, s := range r.Ports {
			proto, port, ok := strings.Cut(s, "/")
			n, err := strconv.ParseInt(port, 10, 32)
			if ok && err == nil {
				m.Ports = append(m.Ports, SharingPort{Protocol: corev1.Protocol(proto), Port: int32(n)})
			}
		}
		slices.SortFunc(m.Ports, compareSharingPorts)
		out = append(out, m)
	}
	return out
}

// WithMember is recs with rec in place of the entry of its UID, or added, sorted by namespace
// and name; changed tells whether that differs from recs.
func WithMember(recs []lbv1.IPMember, rec lbv1.IPMember) (out []lbv1.IPMember, changed bool) {
	out = slices.Clone(recs)
	i := slices.IndexFunc(out, func(r lbv1.IPMember) bool { return r.UID == rec.UID })
	if i >= 0 {
		if equalMember(out[i], rec) {
			return recs, false
		}
		out[i] = rec
	} else {
		out = append(out, rec)
	}
	slices.SortFunc(out, func(a, b lbv1.IPMember) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name), cmp.Compare(a.UID, b.UID))
	})
	return out, true
}

// WithoutMember is recs without the entry of uid; found tells whether there was one.
func WithoutMember(recs []lbv1.IPMember, uid string) (out []lbv1.IPMember, found bool) {
	i := slices.IndexFunc(recs, func(r lbv1.IPMember) bool { return r.UID == uid })
	if i < 0 {
		return recs, false
	}
	return slices.Delete(slices.Clone(recs), i, i+1), true
}

func equalMember(a, b lbv1.IPMember) bool {
	return a.Namespace == b.Namespace && a.Name == b.Name && a.UID == b.UID &&
		slices.Equal(a.Ports, b.Ports) && slices.Equal(a.Namespaces, b.Namespaces)
}

// JoinRefusal is the refusal of a Service that may not join the shared address addr (from names
// where it asked for it).
func JoinRefusal(from string, addr netip.Addr, ref *Refusal) *Refusal {
	return refusal(ref.Reason, "%s %s: %s", from, addr, ref.Message)
}

// MaxMemberNamesBytes bounds IPStatus.Members.
const MaxMemberNamesBytes = 256

// MemberNames renders the members of a shared address for `kubectl get ips`: their names,
// comma-separated, those of another namespace than ownerNS as namespace/name, cut to
// MaxMemberNamesBytes with the count of the rest ("+3").
func MemberNames(ownerNS string, recs []lbv1.IPMember) string {
	var b strings.Builder
	for i, r := range recs {
		name := r.Name
		if r.Namespace != ownerNS {
			name = r.Namespace + "/" + r.Name
		}
		sep, rest := ",", ""
		if i == 0 {
			sep = ""
		}
		if i < len(recs)-1 {
			rest = fmt.Sprintf(",+%d", len(recs)-i-1) // room for the count, should the next not fit
		}
		if b.Len()+len(sep)+len(name)+len(rest) > MaxMemberNamesBytes {
			fmt.Fprintf(&b, "%s+%d", sep, len(recs)-i)
			break
		}
		b.WriteString(sep + name)
	}
	return b.String()
}

// MembersToWake are the members of a shared address (owner: its IP object's spec.service;
// members: its spec.members) that a change of obj, an object labelled with the address
// (SharedIPLabel), concerns. Only an object provably the address's counts, by what a tenant
// cannot write: in the namespace where the address's lb objects live (the owner's lb pod
// namespace) it concerns every member; in a member's namespace (the address's RoleBinding there)
// only the members of that namespace, whose passes put it back; and our labels with the owner's
// UID either way. Anything else wakes no one: whoever may create objects in some namespace could
// otherwise send every member of every shared address, of any namespace, a pass per write.
func MembersToWake(obj metav1.Object, owner lbv1.IPOwner, members []lbv1.IPMember, lbPodNamespace string) []lbv1.IPMember {
	if !labelledFor(obj, owner.UID) {
		return nil
	}
	ns := obj.GetNamespace()
	if ns == lbobjects.PodNamespace(lbPodNamespace, owner.Namespace) {
		return members
	}
	var out []lbv1.IPMember
	for _, m := range members {
		if m.Namespace == ns {
			out = append(out, m)
		}
	}
	return out
}
