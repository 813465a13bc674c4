package lbpod

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// LoopConfig is what the main container's loop needs; cmd/lbpod fills it from flags.
type LoopConfig struct {
	Network Network
	Names   Names
	Applier *Applier
	// ProcSys is where the sysctls are (/proc/sys).
	ProcSys string
	// ResyncPeriod is how often the whole state is compared with the kernel and repaired.
	ResyncPeriod time.Duration
	// AnnounceInterval is how often the held addresses are announced after the first burst.
	AnnounceInterval time.Duration
	Log              *slog.Logger
	// OnHeld, when set, is called from the loop's goroutine each time the LB addresses start
	// (true) or stop (false) being held: held means active, every address on net1 and the whole
	// state verified. A failover controller waits for true before it reports itself the holder.
	OnHeld func(held bool)
	// Announce sends the announcements; nil means Announce (tests may count instead, and the
	// election withholds a burst it has not confirmed lately).
	Announce func(ifname string, addrs []netip.Prefix) error
	// AddressLifetime, when set, says at each apply the kernel lifetime the active loop adds the
	// LB addresses with, and gives one the kernel holds for ever (State.AddressLifetime): with
	// standbys, the election's lease. Nil or 0: for ever.
	AddressLifetime func() time.Duration
	// Confirmed, when set, says at each apply whether the owner of the role still stands by it
	// (with standbys: the election advertised as active within the dead interval). An active
	// loop that is not confirmed neither adds nor repairs the LB addresses: it leaves those on a
	// kernel lifetime to lapse (State.Lapse; without AddressLifetime it takes them away, as a
	// standby), as the election was stopped or starved past the time a standby may claim, or
	// hangs. Otherwise, after a SIGSTOP longer than the lease, the loop could put the lapsed
	// addresses back before the election noticed the freeze, and with an election that hangs it
	// would keep putting them back. Nil: always confirmed.
	Confirmed func() bool
	// Gate, when set, holds back TCP ports added to a running Service until the ClusterIP serves
	// them (PortGate).
	Gate *PortGate
}

// Loop keeps the lb pod's network namespace in the desired state: it applies the state when the
// Service changes, repairs what the kernel watch or the periodic resync finds changed, announces
// the addresses, and reports readiness and metrics.
//
// Failover seam: a Loop starts active, holding the LB address (what a single lb pod does).
// SetActive(false) makes it a standby: net1 stays up with every rule and route installed, but
// without the LB address, and no announcement is sent; SetActive(true) adds the address at once,
// then announces it (a burst of three a second apart, then every AnnounceInterval). OnHeld says
// when the address is really on the link.
type Loop struct {
	cfg     LoopConfig
	metrics *metrics
	stats   AnnounceStats

	mu sync.Mutex
	// svcs are the Services served: one, or the members of a shared address (by name).
	svcs   []*corev1.Service
	svcErr error
	svcGen uint64 // counts SetServices calls
	// standing is the svcGen of the last apply as a standby that converged and was ready, or
	// ^0 (see TakeOver).
	standing uint64
	ready    bool
	reason   string
	changed  chan struct{} // a new Service
	// applying is held by Run for each apply, and by TakeOver: a takeover never runs beside an
	// apply planned for the other role.
	applying sync.Mutex
	// activeChanged signals a new active flag.
	activeChanged chan struct{}

	active atomic.Bool
	// blocked is Block's reason, nil until then.
	blocked atomic.Pointer[string]
	// runCtx is Run's context, for the port gate's checks.
	runCtx atomic.Pointer[context.Context]
	held   bool // last value given to OnHeld
	// noSCTP is set once the kernel refused our SCTP rules while taking the others; it stays
	// set for the pod's life (the message says to restart it once the modules are loaded).
	noSCTP atomic.Bool
}

// NewLoop returns an active loop waiting for its Service.
func NewLoop(cfg LoopConfig) *Loop {
	if cfg.ProcSys == "" {
		cfg.ProcSys = "/proc/sys"
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	cfg.Names = cfg.Names.withDefaults()
	l := &Loop{cfg: cfg, svcErr: errors.New("waiting for the Service"), reason: "starting", standing: ^uint64(0), changed: make(chan struct{}, 1), activeChanged: make(chan struct{}, 1)}
	l.metrics = newMetrics(&l.stats)
	l.active.Store(true)
	l.metrics.active.Set(1)
	return l
}

// SetService gives the loop the newest Service, or why there is none (deleted, unreadable). It
// never blocks: the loop only ever needs the newest one.
func (l *Loop) SetService(svc *corev1.Service, err error) {
	var svcs []*corev1.Service
	if svc != nil {
		svcs = []*corev1.Service{svc}
	}
	l.SetServices(svcs, err)
}

// SetServices gives the loop the newest whole set of Services served on the address (the members
// of a shared address), or why it cannot be known (err: what is installed stays). An empty set
// without an error is applied: nothing is served, every port refused (ReasonNoMembers). A member
// joining or leaving changes only its own rules: the other members' connections and UDP flows
// go on. It never blocks.
func (l *Loop) SetServices(svcs []*corev1.Service, err error) {
	l.mu.Lock()
	l.svcs, l.svcErr = slices.Clone(svcs), err
	l.svcGen++
	l.mu.Unlock()
	notify(l.changed)
}

// notify signals ch without blocking: one pending signal is enough, the loop reads the newest
// state when it wakes.
func notify(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// SetActive switches between holding the LB address (true, the default) and standing by with
// everything else installed (false). The change is applied at once by the running loop.
func (l *Loop) SetActive(active bool) {
	if l.active.Swap(active) != active {
		if active {
			l.metrics.active.Set(1)
		} else {
			l.metrics.active.Set(0)
		}
		notify(l.activeChanged)
	}
}

// poke makes the running loop apply again (a held-back port was admitted).
func (l *Loop) poke() { notify(l.changed) }

// gateCtx is Run's context (Background before Run: lbpod init, tests).
func (l *Loop) gateCtx() context.Context {
	if c := l.runCtx.Load(); c != nil {
		return *c
	}
	return context.Background()
}

// Active reports whether the loop is to hold the LB address.
func (l *Loop) Active() bool { return l.active.Load() }

// Block keeps the loop from holding the LB addresses until Unblock, and /readyz says reason: the
// conflict probe found them in use on the underlay.
func (l *Loop) Block(reason string) {
	l.blocked.Store(&reason)
	l.setReady(false, reason)
	notify(l.activeChanged)
}

// Unblock lifts Block: the Service announced the addresses all the same (another replica did,
// and the operator kept the Service on them). The next apply plans the role anew and sets
// readiness.
func (l *Loop) Unblock() {
	if l.blocked.Swap(nil) != nil {
		notify(l.activeChanged)
	}
}

// TakeOver is a takeover in one address add. When the loop stands by ready (its last apply was as
// a standby, converged, verified and ready, and no Service change came since) and is not applying
// now, every rule, route and the link are in place and only the LB addresses are missing: TakeOver
// then runs put, which puts them on net1, and makes the loop active, so that the loop's next
// apply (right after) is planned as active and finds them there. It reports whether put ran and
// succeeded; otherwise nothing changed and the caller takes over through SetActive(true), which
// the loop applies. Through the loop, a takeover reads the kernel, applies and verifies before its
// first announcement (ten or more netlink requests), which on a node taking over many Services
// at once was most of the takeover's time. A kernel change the watch reported that the loop has
// not looked at yet is not seen here: the loop's own apply, which follows, repairs it.
func (l *Loop) TakeOver(put func() error) (bool, error) {
	if !l.applying.TryLock() {
		return false, nil // an apply runs, planned for the role it read: let it end first
	}
	defer l.applying.Unlock()
	l.mu.Lock()
	standing := l.standing == l.svcGen
	l.mu.Unlock()
	if !standing || l.blocked.Load() != nil || l.Active() {
		return false, nil
	}
	if err := put(); err != nil {
		return false, err
	}
	l.SetActive(true)
	return true, nil
}

// Blocked is the reason given to Block, "" when not blocked.
func (l *Loop) Blocked() string {
	if r := l.blocked.Load(); r != nil {
		return *r
	}
	return ""
}

// role is what the loop applies for the LB addresses.
type role int

const (
	// roleStandby: the addresses off net1 (a standby, or blocked).
	roleStandby role = iota
	// roleHolding: the addresses on net1, added and repaired on their lifetime.
	roleHolding
	// roleLapsing: active, but the election has not confirmed the role within the dead interval;
	// the addresses on a kernel lifetime stay until it lapses, none is added or repaired
	// (State.Lapse). Without a lifetime to fence them (no AddressLifetime), a standby.
	roleLapsing
)

// role says what the loop applies now: holding when active, not blocked and confirmed
// (LoopConfig.Confirmed); lapsing when only the confirmation is missing and the addresses have
// a lifetime; standby otherwise.
func (l *Loop) role() role {
	switch {
	case !l.Active() || l.blocked.Load() != nil:
		return roleStandby
	case l.cfg.Confirmed == nil || l.cfg.Confirmed():
		return roleHolding
	case l.cfg.AddressLifetime != nil:
		return roleLapsing
	}
	return roleStandby
}

// holding says whether the loop holds the LB addresses now (roleHolding).
func (l *Loop) holding() bool {
	return l.role() == roleHolding
}

// Held reports whether the LB addresses are held now (what OnHeld last reported).
func (l *Loop) Held() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.held
}

// Ready reports what /readyz says: whether the state is applied and verified, and why not.
func (l *Loop) Ready() (bool, string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ready, l.reason
}

// setReady records readiness and reports whether it changed.
func (l *Loop) setReady(ready bool, reason string) bool {
	if r := l.blocked.Load(); r != nil {
		ready, reason = false, *r
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	changed := l.ready != ready || l.reason != reason
	l.ready, l.reason = ready, reason
	if ready {
		l.metrics.ready.Set(1)
	} else {
		l.metrics.ready.Set(0)
	}
	return changed
}

// Result is what one reconcile did.
type Result struct {
	Changes      []Change
	AddressAdded bool
	Took         time.Duration
	Err          error
	// Applied says where the time went (read and plan, execute, verify).
	Applied Applied
	// Problems are what of the Service the applied state does not serve (Desired's).
	Problems []Problem
}

// NotReady returns the first problem that makes the pod not ready, if any.
func (r Result) NotReady() (Problem, bool) {
	for _, p := range r.Problems {
		if p.NotReady {
			return p, true
		}
	}
	return Problem{}, false
}

// Reconcile applies the state for svc (without the LB addresses when the loop is not active, or
// not confirmed), then verifies that nothing differs any more. lbpod init runs it once; Run runs
// it on every trigger.
func (l *Loop) Reconcile(svc *corev1.Service) Result {
	return l.ReconcileServices([]*corev1.Service{svc})
}

// ReconcileServices is Reconcile for the members of a shared address.
func (l *Loop) ReconcileServices(svcs []*corev1.Service) Result {
	return l.reconcileTimed(svcs, true, l.role())
}

// reconcileTimed reconciles and records the metrics. fresh reads every iptables table; a
// Service change, a new active flag or a link event may plan against the tables read last time.
// r says what the state does with the LB addresses.
func (l *Loop) reconcileTimed(svcs []*corev1.Service, fresh bool, r role) Result {
	start := time.Now()
	res := l.reconcile(svcs, fresh, r)
	res.Took = time.Since(start)
	l.metrics.syncDuration.Observe(res.Took.Seconds())
	switch {
	case res.Err != nil:
		l.metrics.syncs.WithLabelValues(SyncError).Inc()
	case len(res.Changes) > 0:
		l.metrics.syncs.WithLabelValues(SyncChanged).Inc()
	default:
		l.metrics.syncs.WithLabelValues(SyncUnchanged).Inc()
	}
	return res
}

func (l *Loop) reconcile(svcs []*corev1.Service, fresh bool, r role) Result {
	var res Result
	services, problems, err := servicesFromObjects(svcs)
	if err != nil {
		res.Err = err
		return res
	}
	if l.cfg.Gate != nil {
		services = l.cfg.Gate.filterAll(l.gateCtx(), services, l.poke)
	}
	a := l.cfg.Applier
	obs, err := a.Observe(l.cfg.Names)
	if err != nil {
		res.Err = err
		return res
	}
	if _, err := os.Stat(filepath.Join(l.cfg.ProcSys, "net/ipv6")); err != nil {
		obs.NoIPv6 = true
	}
	obs.NoSCTP = l.noSCTP.Load()
	desired := func(obs Observed) State {
		st := Desired(Config{Network: l.cfg.Network, Services: services}, obs, l.cfg.Names)
		st.Problems = slices.Concat(problems, st.Problems)
		switch {
		case r == roleStandby:
			st = st.Standby()
		case r == roleLapsing:
			st = st.Lapse()
		case l.cfg.AddressLifetime != nil:
			st = st.WithAddressLifetime(l.cfg.AddressLifetime())
		}
		return st
	}
	st := desired(obs)
	set, fwdErr := EnsureForwarding(l.cfg.ProcSys, st.Forwarding)
	for _, s := range set {
		l.cfg.Log.Info("forwarding turned on", "sysctl", s)
	}
	applied, err := a.Apply(st, fresh)
	var refused *RestoreError
	if err != nil && errors.As(err, &refused) && !obs.NoSCTP && slices.ContainsFunc(services, func(s Service) bool {
		return slices.ContainsFunc(s.Ports, func(p Port) bool { return p.Protocol == SCTP })
	}) {
		// The kernel refused a transaction of a state with SCTP ports: when the same state
		// without them goes in and the state with them is refused once more, SCTP is what it
		// lacks, for the pod's life: serve the other ports. A refusal that does not come back
		// (the xtables lock held past its wait, a timeout) turns nothing off.
		obs.NoSCTP = true
		sctpless := desired(obs)
		more, err2 := a.Apply(sctpless, true)
		if err2 == nil {
			more.Changes = append(applied.Changes, more.Changes...)
			applied = more
			again, err3 := a.Apply(st, true)
			if err3 == nil {
				l.cfg.Log.Warn("a transaction with the SCTP rules was refused once, then went in: SCTP is served", "err", err)
				again.Changes = append(applied.Changes, again.Changes...)
				applied, err = again, nil
			} else {
				l.noSCTP.Store(true)
				l.cfg.Log.Warn("the kernel refused the SCTP rules; serving the other ports", "err", err)
				st, err = sctpless, nil
			}
		}
	}
	res.Applied = applied
	res.Changes = applied.Changes
	res.Problems = st.Problems
	l.metrics.unservedPorts.WithLabelValues(string(SCTP)).Set(float64(len(st.Unserved)))
	for _, c := range res.Changes {
		if c.Kind == "address" && c.Added {
			res.AddressAdded = true
		}
		l.cfg.Log.Info("changed", "change", c.String())
	}
	if err != nil {
		res.Err = err
		return res
	}
	res.Err = fwdErr
	return res
}

// servicesFromObjects reads the Services served. One Service that cannot be read is an error, as
// it always was; among the members of a shared address, one that cannot be read is left out
// with a problem, so that it does not take the others down (not ready only when no member is
// left). None: ReasonNoMembers.
func servicesFromObjects(svcs []*corev1.Service) ([]Service, []Problem, error) {
	if len(svcs) == 1 {
		s, err := ServiceFromObject(svcs[0])
		if err != nil {
			return nil, nil, err
		}
		return []Service{s}, nil, nil
	}
	if len(svcs) == 0 {
		return nil, []Problem{{Reason: ReasonNoMembers, NotReady: true, Message: "no Service is a member of this address (none lists it in status.loadBalancer.ingress): every port is refused"}}, nil
	}
	var out []Service
	var problems []Problem
	for _, o := range svcs {
		s, err := ServiceFromObject(o)
		if err != nil {
			// Not a reason to be not ready while another member is served: the election would
			// then keep every replica from taking the address over, and one tenant's Service
			// would stop the failover of every other member's.
			problems = append(problems, Problem{Reason: ReasonMemberInvalid, Message: err.Error() + ": its ports are not served, the other members' are"})
			continue
		}
		out = append(out, s)
	}
	if len(out) == 0 {
		for i := range problems {
			problems[i].NotReady = true // no member left to serve
		}
	}
	return out, problems, nil
}

// Handler serves /healthz (200 while the process runs), /readyz (200 only while the state is
// applied and verified, 503 with the reason otherwise) and /metrics (Prometheus).
func (l *Loop) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		ok, reason := l.Ready()
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, "not ready:", reason)
			return
		}
		if reason != "" {
			fmt.Fprintln(w, "ok:", reason)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.Handle("/metrics", l.metrics.registry)
	return mux
}

// AnnounceStats returns the counters of the announcements sent so far.
func (l *Loop) AnnounceStats() *AnnounceStats { return &l.stats }

// Run applies the state, then follows the Service, the active flag, the kernel and the clock
// until ctx ends. It leaves the state in place when it returns (the pod's namespace goes with
// the pod).
func (l *Loop) Run(ctx context.Context) error {
	l.runCtx.Store(&ctx)
	cfg := l.cfg
	log := cfg.Log
	ifaces := []string{cfg.Names.Interface, cfg.Names.Uplink}
	kernel, routes := watchKernel(ctx, log, cfg.Names.Table, cfg.Network.Addresses, ifaces...)
	// With iptables-nft the kernel announces every ruleset change: a resync reads the iptables
	// tables only after one (idle, it reads nothing but the links, rules and routes). Otherwise
	// every resync reads them.
	var tables <-chan struct{}
	tablesKnown := false
	if cfg.Applier.NFT() {
		tables, tablesKnown = watchNFTables(ctx, log)
	}
	tablesDirty := true
	send := cfg.Announce
	if send == nil {
		send = func(ifname string, addrs []netip.Prefix) error { return Announce(ifname, addrs, &l.stats) }
	}
	ann := &announcer{iface: cfg.Names.Interface, addrs: cfg.Network.Addresses, interval: cfg.AnnounceInterval,
		burst: make(chan struct{}, 1), holding: l.Held, send: send, log: log}
	go ann.run(ctx)

	// Every lb pod of a batch starts within a second or so: each resync is drawn from ±10 % of the
	// period, so that theirs do not stay in step (a node's lb pods resyncing at once starve its
	// elections for that moment).
	resync := time.NewTimer(jittered(cfg.ResyncPeriod))
	defer resync.Stop()
	maxRetry := min(cfg.ResyncPeriod, maxRetryBackoff)
	var (
		lastSeen []LinkSnapshot // the links after the last reconcile
		debounce <-chan time.Time
		// A failed reconcile (an xtables lock held too long, net1 not there yet) is retried
		// sooner than the resync, backing off from 1 s up to maxRetry.
		retry   <-chan time.Time
		backoff = time.Second
		// routesDirty: a route of the lb pod's table or a rule changed since the last look.
		routesDirty = false
		announced   = false // the start burst was sent
		wasActive   = l.holding()
	)
	// reconcile reports whether the apply failed.
	reconcile := func(trigger string, causes []string) (failed bool) {
		l.applying.Lock()
		defer l.applying.Unlock()
		l.mu.Lock()
		svcs, svcErr, gen := l.svcs, l.svcErr, l.svcGen
		l.mu.Unlock()
		if svcErr != nil {
			l.setStanding(false, gen)
			if l.setReady(false, svcErr.Error()) {
				log.Error("not ready", "reason", svcErr.Error())
			}
			l.setHeld(false)
			return false
		}
		r := l.role()
		active := r == roleHolding
		fresh := trigger == "retry" || (trigger == "resync" && (tablesDirty || !tablesKnown))
		if fresh {
			tablesDirty = false // events from now on mark the tables read now
		}
		res := l.reconcileTimed(svcs, fresh, r)
		if len(res.Changes) > 0 {
			a := res.Applied
			log.Info("applied", "trigger", trigger, "changes", len(res.Changes), "took", res.Took.Round(time.Microsecond),
				"read", a.Read.Round(time.Microsecond), "execute", a.Execute.Round(time.Microsecond), "verify", a.Verify.Round(time.Microsecond), "saves", a.Saves, "lists", a.Lists)
			if trigger == "resync" || trigger == "routes" {
				for _, c := range res.Changes {
					causes = append(causes, c.Kind)
				}
			}
			for _, c := range slicesCompactSorted(causes) {
				l.metrics.repairs.WithLabelValues(c).Inc()
			}
		}
		// A failed apply is retried sooner than the resync; a problem of the Service is not (only
		// a change of the Service or of the operator's choice of address can fix it).
		if res.Err != nil {
			retry = time.After(backoff)
			backoff = min(2*backoff, maxRetry)
		} else {
			retry, backoff = nil, time.Second
		}
		ready, reason := Verdict(res, active, r == roleLapsing)
		if l.setReady(ready, reason) {
			if ready {
				log.Info("ready", "trigger", trigger, "active", active)
				for _, p := range res.Problems {
					log.Warn("serving with a problem", "reason", p.Reason, "message", p.Message)
				}
			} else {
				log.Error("not ready", "reason", reason)
			}
		}
		l.setHeld(active && res.Err == nil)
		l.setStanding(r == roleStandby && ready && res.Err == nil, gen)
		now := snapshotLinks(ifaces...)
		if ShouldAnnounce(res, active, wasActive, announced, lastSeen, now) {
			ann.trigger()
			announced = true
		}
		wasActive = active
		lastSeen = now
		return res.Err != nil
	}
	for {
		select {
		case <-ctx.Done():
			log.Info("stopping", "signal", context.Cause(ctx))
			return nil
		case <-l.changed:
			reconcile("service", nil)
		case <-l.activeChanged:
			if reconcile("active", nil) {
				// Letting go of the last IPv4 address makes the kernel flush net1's IPv4 routes
				// (table 100 too) just after the plan ran: put them back at once rather than after
				// the retry's backoff, so that the new standby is ready to take over again.
				reconcile("retry", nil)
			}
		case <-kernel:
			// Our own changes echo back as events: wait for the burst to end, then look once.
			if debounce == nil {
				debounce = time.After(50 * time.Millisecond)
			}
		case <-routes:
			routesDirty = true
			if debounce == nil {
				debounce = time.After(50 * time.Millisecond)
			}
		case <-debounce:
			debounce = nil
			// Most events echo our own changes: look again only when the links or their
			// addresses differ from what the last reconcile left, or a route of our table or a
			// rule changed (rare: an apply that changed none makes none; one that did is looked
			// at once more, finding nothing).
			now := snapshotLinks(ifaces...)
			if causes := SnapshotCauses(lastSeen, now); len(causes) > 0 {
				routesDirty = false
				reconcile("netlink", causes)
			} else if routesDirty {
				routesDirty = false
				reconcile("routes", nil)
			}
		case _, ok := <-tables:
			tablesDirty = true
			if !ok {
				tables, tablesKnown = nil, false
			}
		case <-resync.C:
			reconcile("resync", nil)
			resync.Reset(jittered(cfg.ResyncPeriod))
		case <-retry:
			reconcile("retry", nil)
		}
	}
}

// maxRetryBackoff bounds the retry of a failed apply when the resync period is longer.
const maxRetryBackoff = 10 * time.Second

// jittered is d give or take a tenth, at random.
func jittered(d time.Duration) time.Duration {
	return d - d/10 + rand.N(d/5+1)
}

// setStanding records whether the apply of the Services of generation gen left the loop standing
// by ready (TakeOver).
func (l *Loop) setStanding(standing bool, gen uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if standing {
		l.standing = gen
	} else {
		l.standing = ^uint64(0)
	}
}

// setHeld records whether the addresses are held and tells OnHeld about a change.
func (l *Loop) setHeld(held bool) {
	l.mu.Lock()
	changed := l.held != held
	l.held = held
	l.mu.Unlock()
	if changed && l.cfg.OnHeld != nil {
		l.cfg.OnHeld(held)
	}
}

// slicesCompactSorted returns the distinct values of s, sorted.
func slicesCompactSorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return slices.Compact(s)
}

// Verdict decides what /readyz says after a reconcile: not ready with the error, or with the
// first problem that makes the pod not ready (FamilyMismatch); otherwise ready, with notes for a
// standby, for an active whose role the election has not confirmed (lapsing: its addresses stay
// only until their lifetime ends), and for what is not served (SCTPUnavailable). It is pure.
func Verdict(res Result, active, lapsing bool) (ready bool, reason string) {
	if res.Err != nil {
		return false, res.Err.Error()
	}
	if p, bad := res.NotReady(); bad {
		return false, p.Reason + ": " + p.Message
	}
	var notes []string
	switch {
	case lapsing:
		notes = append(notes, "active, not confirmed by the election: the LB address lapses with its lifetime")
	case !active:
		notes = append(notes, "standby, not holding the LB address")
	}
	for _, p := range res.Problems {
		notes = append(notes, p.Reason+": "+p.Message)
	}
	return true, strings.Join(notes, "; ")
}

// ShouldAnnounce decides whether a reconcile starts a burst of announcements: only while active
// and applied, and then after the first apply, on becoming active, after adding an address, and
// when net1's MAC changed (a recreated net1, or a MAC changed by hand), so that neighbours and
// switches learn the address at once. before and now are the snapshots of net1 (first) and the
// uplink, before and after the reconcile. It is pure.
func ShouldAnnounce(res Result, active, wasActive, announced bool, before, now []LinkSnapshot) bool {
	if !active || res.Err != nil {
		return false
	}
	macChanged := len(before) > 0 && len(now) > 0 && before[0].MAC != "" && now[0].MAC != "" && before[0].MAC != now[0].MAC
	return !announced || !wasActive || res.AddressAdded || macChanged
}
