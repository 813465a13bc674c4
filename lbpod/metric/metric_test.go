package metric

import (
	"bytes"
	"fmt"
	"math"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// TestSameAsClientGolang renders the same families, with awkward label values and help texts,
// here and with client_golang: the pages must be the same bytes.
func TestSameAsClientGolang(t *testing.T) {
	ours, theirs := NewRegistry(), prometheus.NewPedanticRegistry()
	help := "Help with a \\ backslash,\na newline and \"quotes\"."
	bounds := []float64{.001, .0025, .01, .5, 1, 2.5, 10}

	c := NewCounter(Opts{Name: "t_counter_total", Help: help})
	pc := prometheus.NewCounter(prometheus.CounterOpts{Name: "t_counter_total", Help: help})
	g := NewGauge(Opts{Name: "t_gauge", Help: "g"})
	pg := prometheus.NewGauge(prometheus.GaugeOpts{Name: "t_gauge", Help: "g"})
	cv := NewCounterVec(Opts{Name: "t_by_total", Help: "by"}, []string{"cause", "why"})
	pcv := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "t_by_total", Help: "by"}, []string{"cause", "why"})
	gv := NewGaugeVec(Opts{Name: "t_gauges", Help: "gs"}, []string{"protocol"})
	pgv := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "t_gauges", Help: "gs"}, []string{"protocol"})
	h := NewHistogram(Opts{Name: "t_seconds", Help: "h"}, bounds)
	ph := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "t_seconds", Help: "h", Buckets: bounds})
	var n float64 = 7
	f := NewCounterFunc(Opts{Name: "t_func_total", Help: "f"}, func() float64 { return n })
	pf := prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "t_func_total", Help: "f"}, func() float64 { return n })
	ours.MustRegister(h, gv, c, cv, f, g) // any order: the page sorts them
	theirs.MustRegister(pc, pg, pcv, pgv, ph, pf)

	c.Add(3.5)
	pc.Add(3.5)
	g.Set(-2.25e-7)
	pg.Set(-2.25e-7)
	for _, lv := range [][2]string{{"link_missing", "a"}, {"a\"b\\c\nd", ""}, {"address", "z"}, {"link_missing", "a"}} {
		cv.WithLabelValues(lv[0], lv[1]).Inc()
		pcv.WithLabelValues(lv[0], lv[1]).Inc()
	}
	gv.WithLabelValues("SCTP").Set(math.Inf(1))
	pgv.WithLabelValues("SCTP").Set(math.Inf(1))
	gv.WithLabelValues("TCP").Set(1e21)
	pgv.WithLabelValues("TCP").Set(1e21)
	for _, o := range []float64{0, .001, .0011, .3, 3, 11, 1e-9} {
		h.Observe(o)
		ph.Observe(o)
	}

	var want bytes.Buffer
	families, err := theirs.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range families {
		if _, err := expfmt.MetricFamilyToText(&want, mf); err != nil {
			t.Fatal(err)
		}
	}
	if got := ours.Text(); string(got) != want.String() {
		t.Fatalf("page differs from client_golang's:\n--- ours\n%s--- client_golang\n%s", got, want.String())
	}
	if c.Value() != 3.5 || g.Value() != -2.25e-7 || h.Count() != 7 {
		t.Fatalf("values %v %v %v", c.Value(), g.Value(), h.Count())
	}
}

// TestRuntimeParses serves the Go and process families and reads them back with the Prometheus
// parser; the values are this test process's own.
func TestRuntimeParses(t *testing.T) {
	reg := NewRegistry()
	reg.MustRegister(Runtime()...)
	rec := httptest.NewRecorder()
	reg.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if ct := rec.Header().Get("Content-Type"); ct != "text/plain; version=0.0.4; charset=utf-8" {
		t.Fatalf("content type %q", ct)
	}
	parser := expfmt.NewTextParser(model.LegacyValidation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(rec.Body.String()))
	if err != nil {
		t.Fatalf("%v\n%s", err, rec.Body.String())
	}
	get := func(name string) float64 {
		mf, ok := families[name]
		if !ok {
			t.Fatalf("no %s in\n%s", name, rec.Body.String())
		}
		m := mf.GetMetric()[0]
		if m.Counter != nil {
			return m.Counter.GetValue()
		}
		return m.Gauge.GetValue()
	}
	var rss float64
	if data, err := os.ReadFile("/proc/self/status"); err == nil {
		for line := range strings.SplitSeq(string(data), "\n") {
			if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				var kib float64
				if _, err := fmt.Sscan(v, &kib); err == nil {
					rss = kib * 1024
				}
			}
		}
	}
	if got := get("process_resident_memory_bytes"); rss == 0 || math.Abs(got-rss) > 4<<20 {
		t.Errorf("process_resident_memory_bytes %v, /proc/self/status says %v", got, rss)
	}
	if got := get("process_start_time_seconds"); math.Abs(got-float64(time.Now().Unix())) > 3600 {
		t.Errorf("process_start_time_seconds %v, now %v: this test process did not start within the hour", got, time.Now().Unix())
	}
	if get("go_goroutines") < 1 || get("go_memstats_heap_alloc_bytes") <= 0 || get("process_open_fds") < 3 || get("process_max_fds") < 3 {
		t.Errorf("implausible runtime figures:\n%s", rec.Body.String())
	}
	if get("go_gc_gogc_percent") != 100 && os.Getenv("GOGC") == "" {
		t.Errorf("go_gc_gogc_percent %v, want 100", get("go_gc_gogc_percent"))
	}
}

func TestRegisterRefuses(t *testing.T) {
	reg := NewRegistry()
	if err := reg.Register(NewGauge(Opts{Name: "a_b"})); err != nil {
		t.Fatal(err)
	}
	if err := reg.Register(NewCounter(Opts{Name: "a_b"})); err == nil || !strings.Contains(err.Error(), "already registered") {
		t.Errorf("a second a_b: %v", err)
	}
	if err := reg.Register(NewGauge(Opts{Name: "1a"})); err == nil || !strings.Contains(err.Error(), "not valid") {
		t.Errorf("name 1a: %v", err)
	}
}
