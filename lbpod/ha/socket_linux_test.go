package ha

import (
	"net"
	"testing"
)

// The link probe's raw ioctls read what the standard library reads: the index and the up and
// running flags of lo, and nothing for an interface that does not exist or whose name is too long.
func TestLinkProbe(t *testing.T) {
	p, err := newLinkProbe()
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		t.Skip(err)
	}
	index, up := p.state("lo")
	if want := lo.Flags&net.FlagUp != 0 && lo.Flags&net.FlagRunning != 0; index != lo.Index || up != want {
		t.Errorf("state(lo) = %d, %t; want %d, %t", index, up, lo.Index, want)
	}
	for _, name := range []string{"no-such-link", "a-name-longer-than-ifnamsiz"} {
		if index, up := p.state(name); index != 0 || up {
			t.Errorf("state(%q) = %d, %t; want 0, false", name, index, up)
		}
	}
}
