package main

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/lbsvc/lbsvc-operator/lbpod/ha"
)

// fileRecord stands in for the Service's Lease (cmd/lbpod's leaseRecorder) where there is no API
// server: the replicas of one test share a file, on the host's file system that every network
// namespace sees. Its first line is the recorded claim; each write (a claim, or a note that two
// held) appends a line to <path>.writes, which the test counts. The rules are the recorder's: a
// claim is written only when newer than the recorded one (under flock, the stand-in for the
// resourceVersion), every recorded claim goes to the election, and a note is written once per
// step-down on the record. The file is polled every pollEvery, about an API server's write plus
// watch latency.
type fileRecord struct {
	path, name string
	log        *slog.Logger
	claims     chan ha.Claim
	work       chan func()
}

const pollEvery = 20 * time.Millisecond

func newFileRecord(path, name string, log *slog.Logger) *fileRecord {
	r := &fileRecord{path: path, name: name, log: log, claims: make(chan ha.Claim, 1), work: make(chan func(), 16)}
	go r.poll()
	go func() {
		for f := range r.work {
			f()
		}
	}()
	return r
}

var _ ha.Record = (*fileRecord)(nil)

// Claims implements ha.Record.
func (r *fileRecord) Claims() <-chan ha.Claim { return r.claims }

// Claimed implements ha.Record: a takeover writes its claim when it is newer than the recorded one.
func (r *fileRecord) Claimed(c ha.Claim) {
	if c == (ha.Claim{}) {
		return
	}
	r.work <- func() {
		if err := r.locked(func(recorded ha.Claim) (string, bool) {
			if c.Compare(recorded) <= 0 {
				return "", false
			}
			return c.String(), true
		}); err != nil {
			r.log.Warn("record", "err", err)
		}
	}
}

// Superseded implements ha.Record: the note, once.
func (r *fileRecord) Superseded(held, by ha.Claim) {
	r.work <- func() {
		if err := r.locked(func(ha.Claim) (string, bool) {
			return fmt.Sprintf("note %s %s %d %s %d", r.name, time.Now().UTC().Format(time.RFC3339), held.Term, by.Sender, by.Term), true
		}); err != nil {
			r.log.Warn("record", "err", err)
		}
	}
}

// locked reads the recorded claim under an exclusive flock and, when decide says so, writes: a
// claim line replaces the record, a note only goes to the writes log.
func (r *fileRecord) locked(decide func(recorded ha.Claim) (line string, write bool)) error {
	f, err := os.OpenFile(r.path+".lock", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		return err
	}
	line, write := decide(r.read())
	if !write {
		return nil
	}
	if !strings.HasPrefix(line, "note ") {
		tmp := r.path + ".tmp." + r.name
		if err := os.WriteFile(tmp, []byte(line+"\n"), 0o644); err != nil {
			return err
		}
		if err := os.Rename(tmp, r.path); err != nil {
			return err
		}
	}
	w, err := os.OpenFile(r.path+".writes", os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer w.Close()
	_, err = fmt.Fprintf(w, "%s %s %s\n", time.Now().UTC().Format(time.RFC3339Nano), r.name, line)
	return err
}

// read is the recorded claim, the zero Claim when none.
func (r *fileRecord) read() ha.Claim {
	b, err := os.ReadFile(r.path)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			r.log.Warn("record", "err", err)
		}
		return ha.Claim{}
	}
	c, err := ha.ParseClaim(strings.TrimSpace(string(b)))
	if err != nil {
		return ha.Claim{}
	}
	return c
}

// poll hands every new recorded claim to the election (the watch).
func (r *fileRecord) poll() {
	var last ha.Claim
	for range time.Tick(pollEvery) {
		c := r.read()
		if c == last || c == (ha.Claim{}) {
			continue
		}
		last = c
		select {
		case <-r.claims:
		default:
		}
		r.claims <- c
	}
}
