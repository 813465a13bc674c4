//go:build dataplane

package dataplane

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestHASplitBrainRecord: two hatest replicas (the real election and runner, real AF_PACKET
// sockets) whose adverts the underlay bridge drops (ebtables on br0: every frame of EtherType
// 0x88B5, then only those entering from the active's port), sharing a record. The record is a
// stand-in for the Service's Lease (hatest's fileRecord: a shared file, written only with a newer
// claim under flock, polled every 20 ms): the lb pod's recorder needs an API server, which the
// pods' network namespaces here cannot reach; the Lease itself is tested against a real one in
// cmd/lbpod's integration test and on the cluster (TestSplitBrainBounded).
//
// With every advert dropped for 20 s both replicas take the address (the fenced one's note says
// so), the record fences the older claim within a few polls, the fenced replica waits 30 s and so
// does not claim again, the record is written 2 times (the claim and the note), and once the
// bridge is fixed one replica holds. With
// only the active's adverts dropped, the standby takes over and its adverts reach the old active,
// which steps down on the underlay: one write, no note.
func TestHASplitBrainRecord(t *testing.T) {
	bin := buildHATest(t)
	tp := newHATopology(t)
	record := filepath.Join(t.TempDir(), "record")
	start := func(r string) *haReplica {
		return tp.startProcess(r, bin, "--name", r, "--interface", "net1", "--addresses", haLB+"/16",
			"--echo-port", fmt.Sprint(haEchoPort), "--interval", haInterval.String(), "--lease", haLease.String(), "--record", record)
	}
	a := start("a")
	waitFor(t, 5*time.Second, "a active", func() bool { return a.role() == "active" && tp.holds("a") })
	b := start("b")
	waitFor(t, 5*time.Second, "b standby", func() bool { return b.role() == "standby" })
	writes := func() []string {
		data, err := os.ReadFile(record + ".writes")
		if err != nil {
			return nil
		}
		return strings.Split(strings.TrimSpace(string(data)), "\n")
	}
	waitFor(t, 5*time.Second, "a's claim recorded", func() bool { return len(writes()) == 1 })

	ebt := func(op string, rule ...string) {
		mustRun(t, "ip", append([]string{"netns", "exec", tp.underlay, "ebtables", op, "FORWARD"}, rule...)...)
	}
	// loss drops the frames matching rule for d, sampling who holds every 20 ms or so (two
	// ip(8) runs a sample); then it fixes the bridge and waits (bounded) for exactly one holder.
	// both counts the samples in which both held; afterNote those among them read after the
	// fenced replica's note was in the record (it let go before writing it: none may).
	loss := func(name string, rule []string, d time.Duration) (both, afterNote, samples int, oneAfterFix time.Duration, w []string) {
		before := len(writes())
		ebt("-A", rule...)
		fixed := false
		t.Cleanup(func() {
			if !fixed {
				ebt("-D", rule...)
			}
		})
		noted := false
		for end := time.Now().Add(d); time.Now().Before(end); samples++ {
			<-time.After(20 * time.Millisecond) // the sampling period
			noted = noted || len(writes()) > before+1
			if tp.holds("a") && tp.holds("b") {
				both++
				if noted {
					afterNote++
				}
			}
		}
		ebt("-D", rule...)
		fixed = true
		healed := time.Now()
		waitFor(t, 5*time.Second, "one holder after the fix", func() bool { return tp.holds("a") != tp.holds("b") })
		oneAfterFix = time.Since(healed)
		w = writes()[before:]
		t.Logf("figure: ha_split_brain_%s record_writes=%d samples_both_held=%d of %d (after the note: %d) one_holder_after_fix_ms=%d (writes: %s)",
			name, len(w), both, samples, afterNote, oneAfterFix.Milliseconds(), strings.Join(w, "; "))
		return both, afterNote, samples, oneAfterFix, w
	}

	both, after, samples, _, w := loss("symmetric_20s", []string{"-p", "0x88b5", "-j", "DROP"}, 20*time.Second)
	if len(w) != 2 || !strings.Contains(w[1], " note ") {
		t.Fatalf("symmetric loss: record writes %q, want the standby's claim and the old active's note (it held when the claim fenced it)", w)
	}
	// The note proves both held; the fence is faster than the sampling can see (a poll of the
	// record), so its time is read off the writes: the claim, then the fenced replica's note.
	claimed, err1 := time.Parse(time.RFC3339Nano, strings.Fields(w[0])[0])
	noted, err2 := time.Parse(time.RFC3339Nano, strings.Fields(w[1])[0])
	if err1 != nil || err2 != nil {
		t.Fatalf("record writes %q: %v %v", w, err1, err2)
	}
	t.Logf("figure: ha_split_brain_fenced_ms=%d (from the newer claim written to the fenced replica's note)", noted.Sub(claimed).Milliseconds())
	if fenced := noted.Sub(claimed); fenced > 200*time.Millisecond {
		t.Errorf("symmetric loss: the note came %s after the claim, want within a few polls of the record (20 ms)", fenced)
	}
	if after > 0 || both > 5 {
		t.Errorf("symmetric loss: both held in %d of %d samples, %d after the note, want none after it (and a few at most before)", both, samples, after)
	}

	active := "a"
	if tp.holds("b") {
		active = "b"
	}
	both, _, samples, _, w = loss("one_way_20s", []string{"-i", "p" + active, "-p", "0x88b5", "-j", "DROP"}, 20*time.Second)
	if len(w) != 1 || strings.Contains(w[0], " note ") {
		t.Errorf("one-way loss: record writes %q, want the standby's claim only", w)
	}
	if both > 1 {
		t.Errorf("one-way loss: both held in %d of %d samples, want the underlay to settle it at the standby's first advert", both, samples)
	}
}
