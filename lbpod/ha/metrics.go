package ha

import "github.com/lbsvc/lbsvc-operator/lbpod/metric"

// Metrics are the election's counters and gauges. NewMetrics does not register them: the caller
// registers Collectors() with its registry (one Run per process, so one set).
type Metrics struct {
	Active          *metric.Gauge
	Term            *metric.Gauge
	Transitions     *metric.CounterVec
	AdvertsSent     *metric.Counter
	AdvertsReceived *metric.Counter
	SendErrors      *metric.Counter
	LastFailover    *metric.Gauge
	Slack           *metric.Gauge
	// AdvertsRejected counts the adverts the machine refused, by reason (RefusalReasons).
	AdvertsRejected *metric.CounterVec
	// RenewalFailures counts the failed renewals of the addresses' kernel lifetime; each made the
	// active step down.
	RenewalFailures *metric.Counter
	// Superseded counts the step-downs on a newer claim read from the record (the Lease) and never
	// heard on the underlay: each is a time two replicas held the addresses.
	Superseded *metric.Counter
	// QueueLosses counts the reads of a standby's queue socket that missed frames (Lost).
	QueueLosses *metric.Counter
}

// NewMetrics builds the metrics, all at zero.
func NewMetrics() *Metrics {
	m := &Metrics{
		Active: metric.NewGauge(metric.Opts{Name: "lbpod_ha_active",
			Help: "1 while this replica holds the LB addresses (active or resigning), else 0."}),
		Term: metric.NewGauge(metric.Opts{Name: "lbpod_ha_term",
			Help: "The election term this replica holds, or the highest it has seen."}),
		Transitions: metric.NewCounterVec(metric.Opts{Name: "lbpod_ha_transitions_total",
			Help: "Changes of role, by the role entered."}, []string{"to"}),
		AdvertsSent: metric.NewCounter(metric.Opts{Name: "lbpod_ha_adverts_sent_total",
			Help: "Adverts multicast on the underlay (resignations included)."}),
		AdvertsReceived: metric.NewCounter(metric.Opts{Name: "lbpod_ha_adverts_received_total",
			Help: "Adverts of this Service's group received from other replicas."}),
		SendErrors: metric.NewCounter(metric.Opts{Name: "lbpod_ha_advert_send_errors_total",
			Help: "Adverts that could not be sent (net1 down or missing)."}),
		LastFailover: metric.NewGauge(metric.Opts{Name: "lbpod_ha_last_failover_seconds",
			Help: "At the last takeover: seconds from the previous active's last advert (or resignation) to this replica becoming active."}),
		Slack: metric.NewGauge(metric.Opts{Name: "lbpod_ha_slack_seconds",
			Help: "How far the dead interval is stretched now because this replica or its active ran late (a starved node); 0 on a calm one."}),
		AdvertsRejected: metric.NewCounterVec(metric.Opts{Name: "lbpod_ha_adverts_rejected_total",
			Help: "Adverts of this Service's group refused, by reason: auth (tag does not verify with the Service's key), replay (sequence not above the sender's last), stale (sequence outside the replay window around our clock), unauthenticated (version 1 where the key requires version 2), interval (outside the accepted range), term (above 2^63-1), sender (zero or a group MAC). They change nothing."},
			[]string{"reason"}),
		RenewalFailures: metric.NewCounter(metric.Opts{Name: "lbpod_ha_lifetime_renewal_failures_total",
			Help: "Renewals of the held addresses' kernel lifetime that failed; each made the active release the addresses and resign."}),
		Superseded: metric.NewCounter(metric.Opts{Name: "lbpod_ha_superseded_total",
			Help: "Times this replica let go of the addresses because the Service's Lease named a newer claim of another replica whose adverts it never heard: both held them meanwhile."}),
		QueueLosses: metric.NewCounter(metric.Opts{Name: "lbpod_ha_queue_losses_total",
			Help: "Reads of a standby's advert queue that missed frames: the kernel dropped some (its buffer full: a flood on the underlay) or the read stopped at its cap. The standby then reads every advert at once and defers its claim by one dead interval, at most once per advert heard."}),
	}
	for _, r := range RefusalReasons {
		m.AdvertsRejected.WithLabelValues(r)
	}
	return m
}

// Collectors lists the metrics for registration.
func (m *Metrics) Collectors() []metric.Collector {
	return []metric.Collector{m.Active, m.Term, m.Transitions, m.AdvertsSent, m.AdvertsReceived, m.SendErrors, m.LastFailover, m.Slack,
		m.AdvertsRejected, m.RenewalFailures, m.Superseded, m.QueueLosses}
}
