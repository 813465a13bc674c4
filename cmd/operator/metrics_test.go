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

func TestLBPodChoice(t *testing.T) {
	for _, tc := range []struct{ value, want, err string }{
		{"fast", "", ""},
		{"rfc", "rfc", ""},
		{"off", "off", ""},
		{"RFC", "", `--lb-conflict-probe "RFC": want fast, rfc or off`},
		{"", "", `--lb-conflict-probe "": want fast, rfc or off`},
	} {
		got, err := lbPodChoice("lb-conflict-probe", tc.value, "fast", "rfc", "off")
		if got != tc.want || (err == nil) != (tc.err == "") || (err != nil && err.Error() != tc.err) {
			t.Errorf("%q: got %q, %v; want %q, %q", tc.value, got, err, tc.want, tc.err)
		}
	}
}
