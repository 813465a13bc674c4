package lbpod

import "github.com/lbsvc/lbsvc-operator/lbpod/metric"

// Registerer is the registry /metrics serves, for collectors that live beside the loop (the
// election's, package lbpod/ha).
func (l *Loop) Registerer() *metric.Registry { return l.metrics.registry }
