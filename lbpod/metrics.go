package lbpod

import "github.com/lbsvc/lbsvc-operator/lbpod/metric"

// Sync results (the "result" label of lbpod_syncs_total).
const (
	// SyncUnchanged: the kernel already held the state.
	SyncUnchanged = "unchanged"
	// SyncChanged: something was changed and the state verified.
	SyncChanged = "changed"
	// SyncError: the sync failed, or the state still differed after it.
	SyncError = "error"
)

// metrics are the lb pod's Prometheus metrics (package metric, not client_golang: see there), in
// a registry of their own (no global state, so that several loops can live in one test process).
type metrics struct {
	registry      *metric.Registry
	syncs         *metric.CounterVec
	syncDuration  *metric.Histogram
	repairs       *metric.CounterVec
	active, ready *metric.Gauge
	unservedPorts *metric.GaugeVec
}

func newMetrics(announce *AnnounceStats) *metrics {
	m := &metrics{
		registry: metric.NewRegistry(),
		syncs: metric.NewCounterVec(metric.Opts{
			Name: "lbpod_syncs_total",
			Help: "Syncs of the kernel with the desired state, by result: unchanged, changed, error.",
		}, []string{"result"}),
		syncDuration: metric.NewHistogram(metric.Opts{
			Name: "lbpod_sync_duration_seconds",
			Help: "Time a sync takes: read the kernel, apply the differences, verify.",
		},
			// From a sync that finds nothing (a few ms) to one that rewrites thousands of rules.
			[]float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 10}),
		repairs: metric.NewCounterVec(metric.Opts{
			Name: "lbpod_repairs_total",
			Help: "Repairs of drift nobody asked for, by cause: what the kernel watch saw change (link_missing, link_recreated, mac_changed, link_down, addresses_changed, link_changed) or what a resync found changed (iptables, chain, jump, rule, route, address, link).",
		}, []string{"cause"}),
		active: metric.NewGauge(metric.Opts{
			Name: "lbpod_active",
			Help: "1 while this lb pod is to hold the LB address (0 on a standby).",
		}),
		ready: metric.NewGauge(metric.Opts{
			Name: "lbpod_ready",
			Help: "1 while the desired state is applied and verified (what /readyz reports).",
		}),
		unservedPorts: metric.NewGaugeVec(metric.Opts{
			Name: "lbpod_unserved_ports",
			Help: "Service ports not served, by protocol (SCTP when the kernel lacks SCTP support).",
		}, []string{"protocol"}),
	}
	for _, r := range []string{SyncUnchanged, SyncChanged, SyncError} {
		m.syncs.WithLabelValues(r)
	}
	m.registry.MustRegister(m.syncs, m.syncDuration, m.repairs, m.active, m.ready, m.unservedPorts,
		metric.NewCounterFunc(metric.Opts{
			Name: "lbpod_announcements_sent_total",
			Help: "Gratuitous ARPs and unsolicited neighbour advertisements sent.",
		}, func() float64 { return float64(announce.Sent.Load()) }),
		metric.NewCounterFunc(metric.Opts{
			Name: "lbpod_announcements_failed_total",
			Help: "Announcements that could not be sent.",
		}, func() float64 { return float64(announce.Failures.Load()) }),
	)
	m.registry.MustRegister(metric.Runtime()...)
	return m
}

// RulesBackendInfo is the metric lbpod_rules_backend{backend, why}, 1 for the rules back end
// this lb pod runs and why (RulesChoice.Why): a fallback to iptables on a node without
// nf_tables shows as why="fallback".
func RulesBackendInfo(c RulesChoice) metric.Collector {
	g := metric.NewGaugeVec(metric.Opts{
		Name: "lbpod_rules_backend",
		Help: "1 for the rules back end this lb pod runs (iptables, nftables) and why: flag (--rules named it), default (--rules auto, nf_tables works), fallback (--rules auto, no nf_tables: iptables).",
	}, []string{"backend", "why"})
	g.WithLabelValues(string(c.Backend), c.Why).Set(1)
	return g
}
