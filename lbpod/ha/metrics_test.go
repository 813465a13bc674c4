package ha

import (
	"regexp"
	"slices"
	"testing"

	"github.com/lbsvc/lbsvc-operator/lbpod/metric"
)

func TestMetricsRegister(t *testing.T) {
	reg := metric.NewRegistry()
	m := NewMetrics()
	for _, c := range m.Collectors() {
		if err := reg.Register(c); err != nil {
			t.Fatal(err)
		}
	}
	m.Transitions.WithLabelValues("active").Inc()
	var names []string
	for _, match := range regexp.MustCompile(`(?m)^# TYPE (\S+) `).FindAllStringSubmatch(string(reg.Text()), -1) {
		names = append(names, match[1])
	}
	want := []string{"lbpod_ha_active", "lbpod_ha_advert_send_errors_total", "lbpod_ha_adverts_received_total",
		"lbpod_ha_adverts_rejected_total", "lbpod_ha_adverts_sent_total", "lbpod_ha_last_failover_seconds",
		"lbpod_ha_lifetime_renewal_failures_total", "lbpod_ha_queue_losses_total", "lbpod_ha_slack_seconds", "lbpod_ha_superseded_total", "lbpod_ha_term", "lbpod_ha_transitions_total"}
	if !slices.Equal(names, want) {
		t.Fatalf("metrics %v, want %v", names, want)
	}
}
