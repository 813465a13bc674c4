package v1alpha1

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"
)

// The conflict probe: before the first announcement of an address its Service has never
// announced, the lb pod that is to hold it asks the underlay whether a host already uses it
// (IPv4: ARP probes from 0.0.0.0, RFC 5227; IPv6: Duplicate Address Detection, a Neighbor
// Solicitation from ::, RFC 4862). Both sides of it meet on the Service's Lease, the one object an
// lb pod may write (only its own Service's, by admission): the lb pod records there what it has
// announced and what answered, and the operator reads it.
const (
	// AnnouncedAnnotation, on the Service's Lease, lists the addresses (canonical, comma-separated,
	// IPv4 first) the Service's lb pods have announced: probed clean, or held before the probe
	// existed. An address listed there is never probed again (a failover, a restart or a new lb
	// pod of the same Service takes it at once). A Lease that records a claim
	// (HAClaimAnnotation) but no AnnouncedAnnotation was written by a release without the probe:
	// every address of the lb pod counts as announced.
	AnnouncedAnnotation = "lbsvc.io/announced"
	// AddressConflictAnnotation, on the Service's Lease, is what the probe heard: one entry per
	// address (FormatAddressConflicts). The lb pod writes it instead of announcing; the operator
	// then puts the IP object in phase Conflict, moves a dynamic Service to another address and
	// refuses a static one (AddressInUse).
	AddressConflictAnnotation = "lbsvc.io/address-conflict"

	// EnvConflictProbe is the lb pod's probe timing (lbpod --conflict-probe, the operator's
	// --lb-conflict-probe): ConflictProbeFast (the default, also when unset or empty),
	// ConflictProbeRFC or ConflictProbeOff. The operator sets it only when not the default.
	EnvConflictProbe = "LBPOD_CONFLICT_PROBE"
	// ConflictProbeFast probes for a fraction of a second: an L2 host answers ARP and DAD from its
	// kernel within a millisecond, so a few probes close together cover lost frames.
	ConflictProbeFast = "fast"
	// ConflictProbeRFC uses RFC 5227's timings (PROBE_WAIT, PROBE_NUM, PROBE_MIN/MAX, ANNOUNCE_WAIT:
	// several seconds) and RFC 4862's for IPv6.
	ConflictProbeRFC = "rfc"
	// ConflictProbeOff announces without asking (and reports no conflict).
	ConflictProbeOff = "off"
)

// MaxAddressConflicts bounds AddressConflictAnnotation: one entry per family.
const MaxAddressConflicts = 2

// AddressConflict is one address the conflict probe found in use on the underlay.
//
// +kubebuilder:object:generate=false
type AddressConflict struct {
	// Address is the probed address.
	Address netip.Addr
	// MAC is the hardware address that answered (the ARP reply's sender, the NA's target
	// link-layer address or source).
	MAC net.HardwareAddr
	// At is when the answer came (second precision).
	At time.Time
}

// FormatAddressConflicts is AddressConflictAnnotation's value: "<address> <MAC> <RFC3339 time>"
// entries, comma-separated, in the order given.
func FormatAddressConflicts(cs []AddressConflict) string {
	parts := make([]string, 0, len(cs))
	for _, c := range cs {
		parts = append(parts, fmt.Sprintf("%s %s %s", c.Address.WithZone("").Unmap(), c.MAC, c.At.UTC().Format(time.RFC3339)))
	}
	return strings.Join(parts, ", ")
}

// ParseAddressConflicts reads AddressConflictAnnotation. It refuses more than
// MaxAddressConflicts entries, a repeated address, and any entry that is not exactly an address,
// a 6-byte MAC and an RFC3339 time: the value comes from an lb pod, which a tenant may control.
func ParseAddressConflicts(s string) ([]AddressConflict, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	entries := strings.Split(s, ",")
	if len(entries) > MaxAddressConflicts {
		return nil, fmt.Errorf("%d entries, at most %d", len(entries), MaxAddressConflicts)
	}
	var out []AddressConflict
	for _, e := range entries {
		f := strings.Fields(e)
		if len(f) != 3 {
			return nil, fmt.Errorf("entry %q: want \"<address> <MAC> <RFC3339 time>\"", bounded(e))
		}
		a, err := netip.ParseAddr(f[0])
		if err != nil || a.Zone() != "" || a.Is4In6() {
			return nil, fmt.Errorf("entry %q: %q is not an address", bounded(e), bounded(f[0]))
		}
		mac, err := net.ParseMAC(f[1])
		if err != nil || len(mac) != 6 {
			return nil, fmt.Errorf("entry %q: %q is not a MAC address", bounded(e), bounded(f[1]))
		}
		at, err := time.Parse(time.RFC3339, f[2])
		if err != nil {
			return nil, fmt.Errorf("entry %q: %q is not an RFC3339 time", bounded(e), bounded(f[2]))
		}
		if slices.ContainsFunc(out, func(c AddressConflict) bool { return c.Address == a }) {
			return nil, fmt.Errorf("address %s listed twice", a)
		}
		out = append(out, AddressConflict{Address: a, MAC: mac, At: at})
	}
	return out, nil
}

// FormatAnnounced is AnnouncedAnnotation's value for addrs: canonical, IPv4 first, no repeats.
func FormatAnnounced(addrs []netip.Addr) string {
	s := slices.Clone(addrs)
	for i := range s {
		s[i] = s[i].WithZone("").Unmap()
	}
	slices.SortFunc(s, func(a, b netip.Addr) int {
		if a.Is4() != b.Is4() {
			if a.Is4() {
				return -1
			}
			return 1
		}
		return a.Compare(b)
	})
	s = slices.Compact(s)
	parts := make([]string, len(s))
	for i, a := range s {
		parts[i] = a.String()
	}
	return strings.Join(parts, ",")
}

// ParseAnnounced reads AnnouncedAnnotation; entries that are not addresses are skipped (an
// address not listed is probed, which is the safe side).
func ParseAnnounced(s string) []netip.Addr {
	var out []netip.Addr
	for _, p := range strings.Split(s, ",") {
		if a, err := netip.ParseAddr(strings.TrimSpace(p)); err == nil && a.Zone() == "" {
			out = append(out, a.Unmap())
		}
	}
	return out
}

// bounded cuts what a parse error quotes from an untrusted value.
func bounded(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
