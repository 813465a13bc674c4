package controllers

import (
	"context"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/lbsvc/lbsvc-operator/controllers/decide"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
	"github.com/lbsvc/lbsvc-operator/controllers/ipam"
)

// oneAddressBook is an AddressBook whose only Subnet has one usable address, held by Service a.
// It has no cache, reader or writer: a refused claim never reaches the API server.
func oneAddressBook(t *testing.T) (*AddressBook, *lbv1.IP) {
	t.Helper()
	cfg, err := ipam.ParseSubnet("tiny", "IPv4", "192.0.2.0/30", "192.0.2.1", nil)
	if err != nil {
		t.Fatal(err)
	}
	b := NewAddressBook(nil, nil, nil)
	b.EnsureSubnet(cfg)
	ip := &lbv1.IP{
		ObjectMeta: metav1.ObjectMeta{Name: "192.0.2.2", UID: "ip-uid"},
		Spec:       lbv1.IPSpec{Address: "192.0.2.2", Subnet: "tiny", Service: lbv1.IPOwner{Namespace: "ns", Name: "a", UID: "uid-a"}},
	}
	b.Observe(ip)
	return b, ip
}

// woken drains the Wake channel and returns the Services in it.
func woken(b *AddressBook) []types.NamespacedName {
	var out []types.NamespacedName
	for {
		select {
		case ev := <-b.Wake:
			out = append(out, types.NamespacedName{Namespace: ev.Object.GetNamespace(), Name: ev.Object.GetName()})
		default:
			return out
		}
	}
}

func TestClaimRefusedWaitsAndIsWoken(t *testing.T) {
	b, ip := oneAddressBook(t)
	svcB := types.NamespacedName{Namespace: "ns", Name: "b"}
	_, ref, err := b.Claim(context.Background(), "tiny", decide.Claim{Family: ipam.IPv4}, lbv1.IPOwner{Namespace: "ns", Name: "b", UID: "uid-b"})
	if err != nil || ref == nil || ref.Reason != decide.ReasonSubnetExhausted {
		t.Fatalf("claim in a full Subnet: refusal %+v, err %v; want %s", ref, err, decide.ReasonSubnetExhausted)
	}
	if !b.IsWaiting(svcB) {
		t.Fatalf("a refused claim must leave its Service waiting")
	}
	if got := woken(b); len(got) != 0 {
		t.Fatalf("nothing was released, yet %v were woken", got)
	}
	b.forget(ip.Name, ip.UID)
	if got := woken(b); len(got) != 1 || got[0] != svcB {
		t.Fatalf("after the address was released: woken %v, want [%v]", got, svcB)
	}
}

// A static address held by another Service is refused naming where this Service asked for it
// (here the annotation), as the pure decision named it in the claim.
func TestClaimStaticInUseNamesItsSource(t *testing.T) {
	b, _ := oneAddressBook(t)
	c := decide.Claim{Family: ipam.IPv4, Static: netip.MustParseAddr("192.0.2.2"), From: decide.FromLoadBalancerIPs}
	_, ref, err := b.Claim(context.Background(), "tiny", c, lbv1.IPOwner{Namespace: "ns", Name: "b", UID: "uid-b"})
	want := decide.Refusal{Reason: decide.ReasonAddressInUse,
		Message: "annotation lbsvc.io/loadBalancerIPs 192.0.2.2 is held by another Service (kubectl get ip 192.0.2.2)"}
	if err != nil || ref == nil || *ref != want {
		t.Fatalf("claim of a held address: refusal %v, err %v; want %v", ref, err, &want)
	}
}

// A release between a claim's look (which found nothing free) and its registration as waiting
// used to be lost: the release woke the Services waiting then, which did not include this one.
func TestReleaseBeforeRefusalRegisteredWakes(t *testing.T) {
	b, ip := oneAddressBook(t)
	svcB := types.NamespacedName{Namespace: "ns", Name: "b"}
	seen := b.releaseCount() // the claim looks: nothing free
	b.forget(ip.Name, ip.UID)
	if got := woken(b); len(got) != 0 {
		t.Fatalf("no Service was waiting yet, yet %v were woken", got)
	}
	b.waitAfter(svcB, seen) // the claim registers its refusal
	if got := woken(b); len(got) != 1 || got[0] != svcB {
		t.Fatalf("a release between the look and the registration: woken %v, want [%v]", got, svcB)
	}
	if !b.IsWaiting(svcB) {
		t.Fatalf("the Service stays waiting until a pass clears it")
	}

	// Nothing released since the look: no wake.
	svcC := types.NamespacedName{Namespace: "ns", Name: "c"}
	b.waitAfter(svcC, b.releaseCount())
	if got := woken(b); len(got) != 0 {
		t.Fatalf("nothing released since the look, yet %v were woken", got)
	}

	// A Subnet change counts as a release too (it may widen the range).
	seen = b.releaseCount()
	cfg, err := ipam.ParseSubnet("tiny", "IPv4", "192.0.2.0/29", "192.0.2.1", nil)
	if err != nil {
		t.Fatal(err)
	}
	b.mu.Lock()
	delete(b.waiting, svcC) // only the registration below may wake it
	b.mu.Unlock()
	b.EnsureSubnet(cfg)
	b.waitAfter(svcC, seen)
	if got := woken(b); !containsName(got, svcC) {
		t.Fatalf("a Subnet change between the look and the registration: woken %v, want %v among them", got, svcC)
	}
}

func containsName(list []types.NamespacedName, k types.NamespacedName) bool {
	for _, x := range list {
		if x == k {
			return true
		}
	}
	return false
}

// TestShareLocks: a key's claims run one at a time, another key's beside them, and a key's lock
// goes once nobody holds or waits for it (keys come and go with Services).
func TestShareLocks(t *testing.T) {
	b := &AddressBook{}
	locks := func() int {
		b.shareLocks.mu.Lock()
		defer b.shareLocks.mu.Unlock()
		return len(b.shareLocks.locks)
	}
	unlock := b.lockShare("dns")
	acquired := make(chan func())
	go func() { acquired <- b.lockShare("dns") }()
	// The waiter counts as a user: the key's lock stays while it waits.
	for deadline := time.Now().Add(5 * time.Second); ; {
		b.shareLocks.mu.Lock()
		users := b.shareLocks.locks["dns"].users
		b.shareLocks.mu.Unlock()
		if users == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the second claim of dns never waited (users %d)", users)
		}
		runtime.Gosched()
	}
	b.lockShare("web")() // another key is not held up
	select {
	case <-acquired:
		t.Fatal("a second claim of dns ran while the first held it")
	default:
	}
	if n := locks(); n != 1 {
		t.Errorf("%d locks while dns is held and web is done, want 1", n)
	}
	unlock()
	second := <-acquired
	if n := locks(); n != 1 {
		t.Errorf("%d locks while the second claim of dns holds it, want 1", n)
	}
	second()
	if n := locks(); n != 0 {
		t.Errorf("%d locks after every claim ended, want 0", n)
	}
}

// The mirror keeps the newest object of a name: an event of the object drained before it (an
// address claimed again with another sharing key), delivered after the claim observed the new
// one, changes nothing, and neither does its deletion; a later version of the new one does.
func TestObserveKeepsTheNewerObjectOfAName(t *testing.T) {
	b, old := oneAddressBook(t)
	old.ResourceVersion = "100"
	b.Observe(old)
	owner := old.Spec.Service
	shared := &lbv1.IP{
		ObjectMeta: metav1.ObjectMeta{Name: old.Name, UID: "ip-uid-2", ResourceVersion: "200"},
		Spec: lbv1.IPSpec{Address: old.Spec.Address, Subnet: "tiny", Service: owner, SharingKey: "dns",
			Members: []lbv1.IPMember{{Namespace: owner.Namespace, Name: owner.Name, UID: owner.UID}}},
	}
	b.Observe(shared)
	drained := old.DeepCopy()
	drained.ResourceVersion, drained.DeletionTimestamp, drained.Finalizers = "150", &metav1.Time{Time: time.Now()}, nil
	b.Observe(drained)
	b.forget(drained.Name, drained.UID)
	owned := b.OwnedBy(types.UID(owner.UID))
	if len(owned) != 1 || owned[0].SharingKey != "dns" || owned[0].Draining {
		t.Fatalf("owned %+v after the drained object's late events; want the shared one, not draining", owned)
	}
	later := shared.DeepCopy()
	later.ResourceVersion, later.Spec.SharingKey, later.Spec.Members = "300", "", nil
	b.Observe(later)
	if owned := b.OwnedBy(types.UID(owner.UID)); len(owned) != 1 || owned[0].SharingKey != "" {
		t.Fatalf("owned %+v after a later version; want it", owned)
	}
}
