package main

import (
	"crypto/tls"

	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// The metrics endpoint asks the API server who a scraper is (TokenReview) and whether it may read
// /metrics (SubjectAccessReview), so the operator's ClusterRole needs to create both. Scrapers need
// the ClusterRole lbsvc-operator-metrics-reader (config/rbac/metrics_reader_role.yaml).
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

// metricsOptions serves the metrics on addr ("0" disables them) the way kubebuilder scaffolds it:
// HTTPS (a self-signed certificate unless one is mounted at the controller-runtime default
// directory), and every request authenticated with its bearer token and authorized for
// `get` on the non-resource URL /metrics, so that the Subnets' usage and the Services' conditions
// are not readable by whoever reaches the pod. HTTP/2 is off: its rapid-reset and stream
// exhaustion attacks (CVE-2023-44487, CVE-2023-39325) need no credentials.
func metricsOptions(addr string) metricsserver.Options {
	return metricsserver.Options{
		BindAddress:    addr,
		SecureServing:  true,
		FilterProvider: metricsAuthFilter,
		TLSOpts:        []func(*tls.Config){func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} }},
	}
}
