package decide

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
)

// When the underlay stops carrying the lb pods' adverts between two of them (a switch dropping
// their EtherType or multicast, a one-way link), each takes the address; the Lease then fences the
// older claim, and the lb pod that let go writes a note into the Lease (lbsvc.io/held-twice). The
// operator turns each new note into one Warning Event on the Service and on its IP objects, the
// AddressHeldTwice condition, and lbsvc_addresses_held_twice_total.

// HeldTwiceQuiet is how long the AddressHeldTwice condition stays True after the last report: long
// enough to be seen by whoever looks after an alert, short enough that a fixed switch clears it.
const HeldTwiceQuiet = 10 * time.Minute

// HeldTwiceInputs is what the decision reads.
type HeldTwiceInputs struct {
	// Note is the Lease's lbsvc.io/held-twice annotation ("" for none or no Lease).
	Note string
	// Current is the Service's AddressHeldTwice condition (nil: none).
	Current *metav1.Condition
	// Pods are the Service's lb pods: the note counts only when the pod that wrote it is one of them.
	Pods []corev1.Pod
	// Addresses is the Service's recorded address list ("a,b").
	Addresses string
	Now       time.Time
}

// HeldTwicePlan is what to show.
type HeldTwicePlan struct {
	// Condition is the wanted AddressHeldTwice condition; nil leaves the Service as it is.
	Condition *metav1.Condition
	// Warning, when set, is the message of the Warning Event to send on the Service and on the
	// IP objects, and one more count: a note not reported before.
	Warning string
	// IPObjects are the names of the Service's IP objects.
	IPObjects []string
	// RecheckAfter, when positive, is when the condition is due to clear.
	RecheckAfter time.Duration
}

// heldTwiceNote is a parsed note: "<pod> <RFC3339 time> <term> <other pod> <other term>".
type heldTwiceNote struct {
	pod, other      string
	at              time.Time
	term, otherTerm uint64
}

func parseHeldTwice(s string) (heldTwiceNote, bool) {
	f := strings.Fields(s)
	if len(f) != 5 {
		return heldTwiceNote{}, false
	}
	at, err := time.Parse(time.RFC3339, f[1])
	if err != nil {
		return heldTwiceNote{}, false
	}
	term, err1 := strconv.ParseUint(f[2], 10, 64)
	other, err2 := strconv.ParseUint(f[4], 10, 64)
	if err1 != nil || err2 != nil {
		return heldTwiceNote{}, false
	}
	return heldTwiceNote{pod: f[0], at: at, term: term, other: f[3], otherTerm: other}, true
}

// DecideHeldTwice maps the Lease's note to the condition and the Warning. Pure.
//
// A note is reported once: the condition's message is a function of the note alone, so a note
// whose message the condition already carries (True, or False after the quiet period) was
// reported, by this operator or an earlier one. A note older than HeldTwiceQuiet that was never
// reported (the operator was down meanwhile) only sets the condition False: an alert long after
// the fact would point at a switch that may be fixed. A note that does not parse, or whose writer
// is not one of the Service's lb pods (the Lease lives in the Service's namespace, where its
// tenant may write), is ignored.
func DecideHeldTwice(in HeldTwiceInputs) HeldTwicePlan {
	plan := HeldTwicePlan{IPObjects: ipObjectNames(in.Addresses)}
	n, ok := parseHeldTwice(in.Note)
	if !ok || !slices.ContainsFunc(in.Pods, func(p corev1.Pod) bool { return p.Name == n.pod }) {
		return plan
	}
	when := n.at.UTC().Format(time.RFC3339)
	held := BoundedMessage(fmt.Sprintf("%s was held by two lb pods at once: %s (term %d) and %s (term %d); at %s the Lease fenced %s, "+
		"whose adverts and the other's did not reach each other: check that the underlay carries EtherType 0x88B5 multicast between their nodes",
		in.Addresses, quote(n.pod), n.term, quote(n.other), n.otherTerm, when, quote(n.pod)))
	quiet := BoundedMessage(fmt.Sprintf("one holder since %s, when %s and %s both held %s", when, quote(n.pod), quote(n.other), in.Addresses))
	reported := in.Current != nil && (in.Current.Message == held || in.Current.Message == quiet)
	if left := n.at.Add(HeldTwiceQuiet).Sub(in.Now); left > 0 {
		plan.Condition = &metav1.Condition{Type: ConditionAddressHeldTwice, Status: metav1.ConditionTrue, Reason: ReasonAddressHeldTwice, Message: held}
		plan.RecheckAfter = left
		if !reported {
			plan.Warning = held
		}
		return plan
	}
	plan.Condition = &metav1.Condition{Type: ConditionAddressHeldTwice, Status: metav1.ConditionFalse, Reason: ReasonSingleHolder, Message: quiet}
	return plan
}

// ipObjectNames are the IP object names of an address list ("a,b"); what does not parse is left out.
func ipObjectNames(addresses string) []string {
	var out []string
	for _, s := range strings.Split(addresses, ",") {
		if a, err := netip.ParseAddr(strings.TrimSpace(s)); err == nil {
			out = append(out, lbv1.IPName(a))
		}
	}
	return out
}
