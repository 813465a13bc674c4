package lbpod

import "github.com/prometheus/client_golang/prometheus"

// Registerer is the registry /metrics serves, for collectors that live beside the loop (the
// election's, package lbpod/ha).
func (l *Loop) Registerer() prometheus.Registerer { return l.metrics.registry }
