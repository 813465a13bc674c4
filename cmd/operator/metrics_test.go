package main

import (
	"crypto/tls"
	"testing"
)

// The metrics endpoint is never served in plain HTTP nor without the authentication and
// authorization filter, and never speaks HTTP/2.
func TestMetricsOptions(t *testing.T) {
	o := metricsOptions(":8443")
	if o.BindAddress != ":8443" || !o.SecureServing || o.FilterProvider == nil {
		t.Fatalf("metricsOptions: bind %q, secure %v, filter set %v; want :8443, true, true", o.BindAddress, o.SecureServing, o.FilterProvider != nil)
	}
	c := &tls.Config{NextProtos: []string{"h2"}}
	for _, f := range o.TLSOpts {
		f(c)
	}
	if len(c.NextProtos) != 1 || c.NextProtos[0] != "http/1.1" {
		t.Errorf("NextProtos %q, want [http/1.1]", c.NextProtos)
	}
	if off := metricsOptions("0"); off.BindAddress != "0" {
		t.Errorf("metricsOptions(\"0\").BindAddress = %q, want 0 (disabled)", off.BindAddress)
	}
}
