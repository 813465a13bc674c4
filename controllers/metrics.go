package controllers

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/lbsvc/lbsvc-operator/controllers/decide"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/lbsvc/lbsvc-operator/controllers/ipam"
)

// Prometheus metrics of the operator, served on its metrics endpoint next to controller-runtime's
// own (controller_runtime_reconcile_time_seconds{controller="service|subnet|ip"} gives the
// reconcile durations).
var (
	// subnetAddresses: lbsvc_subnet_addresses{subnet,family,state="used|available|draining"}.
	subnetAddresses = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "lbsvc_subnet_addresses",
		Help: "Addresses of a Subnet by family and state: used (bound or draining), available (could be handed out), draining.",
	}, []string{"subnet", "family", "state"})
	// allocations: lbsvc_allocations_total{result="allocated|refused",reason}.
	allocations = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lbsvc_allocations_total",
		Help: "Address claims by result (allocated, refused) and reason.",
	}, []string{"result", "reason"})
	// drains: lbsvc_drain_seconds, from an address let go to the last lb pod gone.
	drains = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "lbsvc_drain_seconds",
		Help:    "Time from an address being let go (IP object deleted) until no lb pod could hold it.",
		Buckets: prometheus.ExponentialBuckets(0.05, 2, 14),
	})
	// addressesHeldTwice: lbsvc_addresses_held_twice_total, one per AddressHeldTwice Warning.
	addressesHeldTwice = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "lbsvc_addresses_held_twice_total",
		Help: "Times two lb pods of a Service held its address at once (their adverts did not reach each other) until the Lease fenced one: one per AddressHeldTwice Warning Event.",
	})
	// addressConflicts: lbsvc_address_conflicts_total, one per IP object put in phase Conflict.
	addressConflicts = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "lbsvc_address_conflicts_total",
		Help: "Addresses found in use on the underlay by the lb pods' probe before their first announcement: one per IP object put in phase Conflict.",
	})
)

func init() {
	metrics.Registry.MustRegister(subnetAddresses, allocations, drains, servicesByCondition, addressesHeldTwice, addressConflicts)
}

// recordSubnet sets a Subnet's gauges.
func recordSubnet(subnet string, u ipam.Usage, draining4, draining6 int64) {
	for _, f := range []struct {
		family                    string
		used, available, draining int64
	}{{"IPv4", u.V4Used, u.V4Available, draining4}, {"IPv6", u.V6Used, u.V6Available, draining6}} {
		subnetAddresses.WithLabelValues(subnet, f.family, "used").Set(float64(f.used))
		subnetAddresses.WithLabelValues(subnet, f.family, "available").Set(float64(f.available))
		subnetAddresses.WithLabelValues(subnet, f.family, "draining").Set(float64(f.draining))
	}
}

// forgetSubnet drops a deleted Subnet's gauges.
func forgetSubnet(subnet string) {
	subnetAddresses.DeletePartialMatch(prometheus.Labels{"subnet": subnet})
}

// servicesByCondition is a collector: lbsvc_services{condition,status,reason} counts the Services
// carrying each of our conditions, read from the manager's cache when scraped (nothing kept in
// between). Setup points it at its manager's cache.
var servicesByCondition = &serviceConditions{desc: prometheus.NewDesc("lbsvc_services",
	"LoadBalancer Services by our condition type, status and reason.", []string{"condition", "status", "reason"}, nil)}

type serviceConditions struct {
	reader atomic.Pointer[client.Reader]
	desc   *prometheus.Desc
}

// use makes the collector read from r.
func (c *serviceConditions) use(r client.Reader) { c.reader.Store(&r) }

// Describe implements prometheus.Collector.
func (c *serviceConditions) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector.
func (c *serviceConditions) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r := c.reader.Load()
	if r == nil {
		return
	}
	var list corev1.ServiceList
	// Read-only: a scrape must not copy every Service of the cluster.
	if err := (*r).List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		return
	}
	type key struct{ cond, status, reason string }
	counts := map[key]int{}
	for i := range list.Items {
		for _, t := range []string{decide.ConditionAddressAllocated, decide.ConditionLBPodAvailable} {
			if cond := meta.FindStatusCondition(list.Items[i].Status.Conditions, t); cond != nil {
				counts[key{t, string(cond.Status), cond.Reason}]++
			}
		}
	}
	for k, n := range counts {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), k.cond, k.status, k.reason)
	}
}
