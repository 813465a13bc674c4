// Command hatest runs the lbpod/ha election on an interface with a minimal data path of its own,
// for the dataplane tests of the election before (and apart from) lbpod: the active adds the LB
// addresses to the interface and announces them three times, one interval apart; a UDP echo on
// --echo-port answers "<name>: <payload>" so a client can tell which replica served it.
//
//	hatest --name a --interface net1 --addresses 172.18.0.18/16 --echo-port 7
//
// It prints "role=<role>" on stdout at every change of role; SIGTERM resigns and exits.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/lbsvc/lbsvc-operator/lbpod"
	"github.com/lbsvc/lbsvc-operator/lbpod/ha"
)

func main() {
	name := flag.String("name", "", "replica name, in the echo replies")
	iface := flag.String("interface", "net1", "underlay interface")
	addrList := flag.String("addresses", "", "LB addresses with prefix, comma-separated")
	echoPort := flag.Int("echo-port", 7, "UDP echo port")
	priority := flag.Uint("priority", ha.DefaultPriority, "election priority (0-255)")
	lease := flag.Duration("lease", 0, "keep the addresses on this kernel lifetime (whole seconds), renewed at every advert; 0: permanent")
	interval := flag.Duration("interval", ha.DefaultInterval, "advert interval")
	record := flag.String("record", "", "a file shared by the replicas that stands in for the Service's Lease (fileRecord); none when empty")
	flag.Parse()
	if err := run(*name, *iface, *addrList, *echoPort, uint8(*priority), *interval, *lease, *record); err != nil {
		fmt.Fprintln(os.Stderr, "hatest:", err)
		os.Exit(1)
	}
}

func run(name, iface, addrList string, echoPort int, priority uint8, interval, lease time.Duration, record string) error {
	var prefixes []netip.Prefix
	var addrs []netip.Addr
	for s := range strings.SplitSeq(addrList, ",") {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("--addresses: %w", err)
		}
		prefixes, addrs = append(prefixes, p), append(addrs, p.Addr())
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("replica", name)
	pc, err := net.ListenPacket("udp", fmt.Sprintf(":%d", echoPort))
	if err != nil {
		return err
	}
	defer pc.Close()
	go echo(pc, name)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	h := &holder{iface: iface, prefixes: prefixes, interval: interval, lease: lease, log: log}
	opts := ha.Options{
		Interface: iface,
		Config:    ha.Config{Group: ha.GroupOf(addrs), Priority: priority, Interval: interval},
		Log:       log,
		OnChange:  func(role ha.Role, _ string) { fmt.Printf("role=%s\n", role) },
	}
	if record != "" {
		opts.Record = newFileRecord(record, name, log)
	}
	return ha.Run(ctx, opts, h)
}

func echo(pc net.PacketConn, name string) {
	buf := make([]byte, 1500)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		_, _ = pc.WriteTo([]byte(name+": "+string(buf[:n])), from)
	}
}

// holder adds and removes the addresses with netlink, as lbpod's data path does; with --lease it
// keeps them on a kernel lifetime that Renew extends (ha.Leaser).
type holder struct {
	iface    string
	prefixes []netip.Prefix
	interval time.Duration
	lease    time.Duration
	log      *slog.Logger
	mu       sync.Mutex
	gen      int // bumped at every change, to stop a burst that outlived its activation
	// confirmed is when the election last confirmed us active (SetActive(true), Renew): a burst
	// resumed after SIGSTOP must not announce before the election noticed the freeze.
	confirmed time.Time
}

var _ ha.Leaser = (*holder)(nil)

// Renew confirms the role and extends the addresses' kernel lifetime (ha.Leaser); a failure makes
// the election step down. This harness keeps its fixed lease: its runs are short and never
// starved long enough to stretch holdFor.
func (h *holder) Renew(time.Duration) error {
	h.mu.Lock()
	h.confirmed = time.Now()
	h.mu.Unlock()
	if h.lease > 0 {
		return h.apply(true)
	}
	return nil
}

// apply adds (replacing, which renews a lifetime) or removes the addresses, and returns the last
// error.
func (h *holder) apply(active bool) error {
	link, err := netlink.LinkByName(h.iface)
	if err != nil {
		h.log.Error("set active", "active", active, "err", err)
		return err
	}
	var last error
	for _, p := range h.prefixes {
		a := &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}}
		if p.Addr().Is6() {
			a.Flags = unix.IFA_F_NODAD
		}
		if h.lease > 0 {
			secs := int(max(h.lease/time.Second, 1))
			a.ValidLft, a.PreferedLft = secs, secs
		}
		if active {
			err = netlink.AddrReplace(link, a)
		} else if err = netlink.AddrDel(link, a); errors.Is(err, unix.EADDRNOTAVAIL) {
			err = nil
		}
		if err != nil {
			h.log.Error("set active", "active", active, "addr", p, "err", err)
			last = err
		}
	}
	return last
}

func (h *holder) SetActive(active bool) {
	h.mu.Lock()
	h.gen++
	gen := h.gen
	h.confirmed = time.Now()
	h.mu.Unlock()
	_ = h.apply(active) // logged; a failed take shows at the first Renew
	if !active {
		return
	}
	// The announcement burst: now and twice more, one interval apart, unless released meanwhile.
	go func() {
		var stats lbpod.AnnounceStats
		for i := range 3 {
			if i > 0 {
				time.Sleep(h.interval)
			}
			// Under the lock, so that a release cannot slip between the check and the send.
			h.mu.Lock()
			if h.gen != gen || time.Since(h.confirmed) >= ha.DefaultDeadAdverts*h.interval {
				h.mu.Unlock()
				return
			}
			if err := lbpod.Announce(h.iface, h.prefixes, &stats); err != nil {
				h.log.Warn("announce", "err", err)
			}
			h.mu.Unlock()
		}
	}()
}
