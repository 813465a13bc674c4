package controllers

import (
	"context"
	"fmt"
	"net/netip"
	"sort"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
	"github.com/lbsvc/lbsvc-operator/controllers/decide"
	"github.com/lbsvc/lbsvc-operator/controllers/ipam"
)

// Shared addresses in the address book: joining and leaving one. The members are the IP object's
// spec.members, and each change is an update of the object read from the API server at its
// resourceVersion: two passes that both want the last free port of an address, or one leaving
// as the last member while another joins, are ordered by the API server (the loser's write
// fails with a conflict, and it reads again). The last member's leave is a delete on that same
// resourceVersion, so an address is never drained under a member that joined a moment before.

// Join makes c.Share a member of the shared address name, or says why not (the address is
// draining, in use on the underlay, not shared, or SharingClash refuses). joined is false with
// neither a refusal nor an error when the IP object is gone.
func (b *AddressBook) Join(ctx context.Context, name string, c decide.Claim) (joined bool, ref *decide.Refusal, err error) {
	m := *c.Share
	for try := 0; try < maxClaimTries; try++ {
		cur := &lbv1.IP{}
		if err := b.reader.Get(ctx, client.ObjectKey{Name: name}, cur); err != nil {
			if apierrors.IsNotFound(err) {
				return false, nil, nil
			}
			return false, nil, fmt.Errorf("join %s: get IP: %w", name, err)
		}
		b.Observe(cur)
		addr, _ := netip.ParseAddr(cur.Spec.Address)
		switch {
		case cur.Status.Phase == lbv1.IPConflict && cur.Status.Conflict != nil:
			return false, decide.InUseOnUnderlay(fromOr(c.From), addr, *cur.Status.Conflict), nil
		case !cur.DeletionTimestamp.IsZero():
			return false, decide.InUse(fromOr(c.From), addr, true), nil
		case cur.Spec.SharingKey == "":
			return false, decide.InUse(fromOr(c.From), addr, false), nil
		}
		if ref := decide.SharingClash(cur.Spec.SharingKey, decide.MembersOf(cur.Spec.SharingKey, cur.Spec.Members), m, c.CrossNamespace); ref != nil {
			return false, decide.JoinRefusal(fromOr(c.From), addr, ref), nil
		}
		members, changed := decide.WithMember(cur.Spec.Members, decide.MemberRecord(m))
		if !changed {
			return true, nil, nil
		}
		switch retry, gone, err := b.updateMembers(ctx, cur, members); {
		case err != nil:
			return false, nil, fmt.Errorf("join %s: %w", name, err)
		case retry:
			continue
		default:
			return !gone, nil, nil
		}
	}
	return false, nil, fmt.Errorf("join %s: lost %d races for the IP object", name, maxClaimTries)
}

// fromOr names where a dynamic claim's address came from in a refusal.
func fromOr(from string) string {
	if from == "" {
		return "the shared address"
	}
	return from
}

// joinAny joins the lowest address of c's Subnet, family and sharing key that takes it.
func (b *AddressBook) joinAny(ctx context.Context, subnet string, c decide.Claim) (netip.Addr, bool, error) {
	for _, name := range b.sharedCandidates(subnet, c.Family, c.Share.Key) {
		joined, _, err := b.Join(ctx, name, c)
		if err != nil {
			return netip.Addr{}, false, err
		}
		if joined {
			b.mu.Lock()
			addr := b.ips[name].addr
			b.mu.Unlock()
			return addr, true, nil
		}
	}
	return netip.Addr{}, false, nil
}

// sharedCandidates are the IP objects the mirror shows shared under key in subnet and family,
// neither draining nor in use on the underlay, and still a valid address of the Subnet as it is
// now, lowest address first. An address the Subnet no longer allows (excluded, made the gateway,
// outside a narrowed CIDR) is one its members must leave, as an unshared Service moves off one:
// offered here, every member's claim joined it again and its drain never came, and new members
// of the key were handed it too.
func (b *AddressBook) sharedCandidates(subnet string, fam ipam.Family, key string) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	cfg, configured := b.subnets[subnet]
	var out []string
	for name, r := range b.ips {
		if r.sharingKey == key && r.subnet == subnet && ipam.FamilyOf(r.addr) == fam && !r.draining && r.conflict == nil &&
			(!configured || ipam.CheckAddr(cfg, r.addr) == nil) {
			out = append(out, name)
		}
	}
	sort.Slice(out, func(i, j int) bool { return b.ips[out[i]].addr.Less(b.ips[out[j]].addr) })
	return out
}

// leave takes o.Member off the shared address o; the last member's leave deletes the IP object
// (it drains as any other), conditional on the version read, so that a join in between wins.
func (b *AddressBook) leave(ctx context.Context, o decide.OwnedIP) error {
	for try := 0; try < maxClaimTries; try++ {
		cur := &lbv1.IP{}
		if err := b.reader.Get(ctx, client.ObjectKey{Name: o.Name}, cur); err != nil {
			if apierrors.IsNotFound(err) {
				return nil
			}
			return fmt.Errorf("leave %s: get IP: %w", o.Addr, err)
		}
		if cur.UID != o.UID || !cur.DeletionTimestamp.IsZero() {
			b.Observe(cur)
			return nil
		}
		members, found := decide.WithoutMember(cur.Spec.Members, o.Member)
		if !found {
			b.Observe(cur)
			return nil
		}
		if len(members) == 0 {
			uid, rv := cur.UID, cur.ResourceVersion
			err := b.writer.Delete(ctx, cur, client.Preconditions{UID: &uid, ResourceVersion: &rv})
			switch {
			case apierrors.IsConflict(err):
				continue
			case err != nil && !apierrors.IsNotFound(err):
				return fmt.Errorf("drain %s: %w", o.Addr, err)
			}
			b.markDraining(o.Name, uid)
			return nil
		}
		switch retry, _, err := b.updateMembers(ctx, cur, members); {
		case err != nil:
			return fmt.Errorf("leave %s: %w", o.Addr, err)
		case !retry:
			return nil
		}
	}
	return fmt.Errorf("leave %s: lost %d races for the IP object", o.Addr, maxClaimTries)
}

// Shared is the owner (spec.service) and the members of the shared address name as the mirror
// has them.
func (b *AddressBook) Shared(name string) (lbv1.IPOwner, []lbv1.IPMember) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ips[name].owner, b.ips[name].members
}

// updateMembers writes members into cur, as read at its resourceVersion: retry when another
// write came first, gone when the object is.
func (b *AddressBook) updateMembers(ctx context.Context, cur *lbv1.IP, members []lbv1.IPMember) (retry, gone bool, err error) {
	cur.Spec.Members = members
	switch err := b.writer.Update(ctx, cur, client.FieldOwner(FieldOwner)); {
	case err == nil:
		b.Observe(cur)
		return false, false, nil
	case apierrors.IsConflict(err):
		return true, false, nil
	case apierrors.IsNotFound(err):
		return false, true, nil
	default:
		return false, false, fmt.Errorf("update IP %s: %w", cur.Name, err)
	}
}

// lockShare locks the claims of a sharing key and returns the unlock.
func (b *AddressBook) lockShare(key string) func() { return b.shareLocks.lock(key) }
