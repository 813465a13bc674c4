// Package metric is the lb pod's metrics page: counters, gauges and one histogram, rendered in
// the Prometheus text exposition format (version 0.0.4), with the few Go runtime and process
// figures an lb pod is watched by.
//
// It stands for prometheus/client_golang in the lb pod only (the operator keeps client_golang).
// That library, its data model and the protobuf runtime under it are about 2.8 MB of binary and
// 2.8 MiB of resident memory in a process that serves one page of a dozen series (measured with an
// HTTP server alone and with the library's registry, Go and process collectors: docs/benchmarks.md),
// and every Service runs two lb pods. The page is what client_golang writes for the same series:
// families sorted by name, series by label values, HELP and TYPE lines, the same escaping and
// number format (TestTextParses reads it back with the Prometheus parser).
package metric

import (
	"bytes"
	"fmt"
	"maps"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// Opts names a metric family and says what it measures.
type Opts struct {
	Name, Help string
}

// Collector is a metric family a Registry renders.
type Collector interface {
	opts() Opts
	// write appends the family's series (without HELP and TYPE) to b.
	write(b *bytes.Buffer)
	kind() string
}

// Registry is the set of families one /metrics page shows.
type Registry struct {
	mu         sync.Mutex
	collectors map[string]Collector
}

// NewRegistry is an empty registry.
func NewRegistry() *Registry {
	return &Registry{collectors: map[string]Collector{}}
}

// Register adds a family; a second family of the same name, or a name Prometheus would refuse,
// is an error.
func (r *Registry) Register(c Collector) error {
	name := c.opts().Name
	if !validName(name) {
		return fmt.Errorf("metric name %q is not valid", name)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.collectors[name]; dup {
		return fmt.Errorf("metric %q is already registered", name)
	}
	r.collectors[name] = c
	return nil
}

// MustRegister registers each family and panics on the first error (a programming error: the
// families are fixed at start).
func (r *Registry) MustRegister(cs ...Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

// Text renders every family, sorted by name.
func (r *Registry) Text() []byte {
	r.mu.Lock()
	cs := make([]Collector, 0, len(r.collectors))
	for _, c := range r.collectors {
		cs = append(cs, c)
	}
	r.mu.Unlock()
	slices.SortFunc(cs, func(a, b Collector) int { return strings.Compare(a.opts().Name, b.opts().Name) })
	var b bytes.Buffer
	for _, c := range cs {
		o := c.opts()
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s %s\n", o.Name, escapeHelp(o.Help), o.Name, c.kind())
		c.write(&b)
	}
	return b.Bytes()
}

// ServeHTTP serves the page as Prometheus scrapes it.
func (r *Registry) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	_, _ = w.Write(r.Text())
}

// value is a float64 updated atomically.
type value struct{ bits atomic.Uint64 }

func (v *value) load() float64 { return math.Float64frombits(v.bits.Load()) }

func (v *value) store(f float64) { v.bits.Store(math.Float64bits(f)) }

func (v *value) add(f float64) {
	for {
		old := v.bits.Load()
		if v.bits.CompareAndSwap(old, math.Float64bits(math.Float64frombits(old)+f)) {
			return
		}
	}
}

// Counter only goes up.
type Counter struct {
	o Opts
	v value
}

// NewCounter is a counter at zero.
func NewCounter(o Opts) *Counter { return &Counter{o: o} }

// Inc adds one.
func (c *Counter) Inc() { c.v.add(1) }

// Add adds f; a negative f panics, as a counter that went down would read as a restart.
func (c *Counter) Add(f float64) {
	if f < 0 {
		panic(fmt.Sprintf("counter %s cannot decrease (%g)", c.o.Name, f))
	}
	c.v.add(f)
}

// Value is the count.
func (c *Counter) Value() float64 { return c.v.load() }

func (c *Counter) opts() Opts            { return c.o }
func (c *Counter) kind() string          { return "counter" }
func (c *Counter) write(b *bytes.Buffer) { sample(b, c.o.Name, "", c.v.load()) }

// Gauge goes up and down.
type Gauge struct {
	o Opts
	v value
}

// NewGauge is a gauge at zero.
func NewGauge(o Opts) *Gauge { return &Gauge{o: o} }

// Set sets the value.
func (g *Gauge) Set(f float64) { g.v.store(f) }

// Inc adds one.
func (g *Gauge) Inc() { g.v.add(1) }

// Dec subtracts one.
func (g *Gauge) Dec() { g.v.add(-1) }

// Add adds f.
func (g *Gauge) Add(f float64) { g.v.add(f) }

// Value is the value.
func (g *Gauge) Value() float64 { return g.v.load() }

func (g *Gauge) opts() Opts            { return g.o }
func (g *Gauge) kind() string          { return "gauge" }
func (g *Gauge) write(b *bytes.Buffer) { sample(b, g.o.Name, "", g.v.load()) }

// vec is a family of series told apart by label values, each created on first use.
type vec[T any] struct {
	o      Opts
	labels []string
	mu     sync.Mutex
	series map[string]*T // by their rendered label pairs
	create func() *T
	read   func(*T) float64
}

func newVec[T any](o Opts, labels []string, create func() *T, read func(*T) float64) vec[T] {
	return vec[T]{o: o, labels: labels, series: map[string]*T{}, create: create, read: read}
}

func (v *vec[T]) with(values []string) *T {
	if len(values) != len(v.labels) {
		panic(fmt.Sprintf("metric %s: %d label values for labels %v", v.o.Name, len(values), v.labels))
	}
	pairs := make([]string, len(values))
	for i, l := range v.labels {
		pairs[i] = l + `="` + escapeLabel(values[i]) + `"`
	}
	key := strings.Join(pairs, ",")
	v.mu.Lock()
	defer v.mu.Unlock()
	s, ok := v.series[key]
	if !ok {
		s = v.create()
		v.series[key] = s
	}
	return s
}

func (v *vec[T]) opts() Opts { return v.o }

func (v *vec[T]) write(b *bytes.Buffer) {
	v.mu.Lock()
	keys := slices.Sorted(maps.Keys(v.series))
	values := make([]float64, len(keys))
	for i, k := range keys {
		values[i] = v.read(v.series[k])
	}
	v.mu.Unlock()
	for i, k := range keys {
		sample(b, v.o.Name, k, values[i])
	}
}

// CounterVec is counters told apart by labels.
type CounterVec struct{ vec[Counter] }

// NewCounterVec is a family with no series yet; WithLabelValues makes them.
func NewCounterVec(o Opts, labels []string) *CounterVec {
	return &CounterVec{newVec(o, labels, func() *Counter { return &Counter{o: o} }, (*Counter).Value)}
}

// WithLabelValues is the counter of these label values (in the labels' order).
func (c *CounterVec) WithLabelValues(values ...string) *Counter { return c.with(values) }

func (c *CounterVec) kind() string { return "counter" }

// GaugeVec is gauges told apart by labels.
type GaugeVec struct{ vec[Gauge] }

// NewGaugeVec is a family with no series yet; WithLabelValues makes them.
func NewGaugeVec(o Opts, labels []string) *GaugeVec {
	return &GaugeVec{newVec(o, labels, func() *Gauge { return &Gauge{o: o} }, (*Gauge).Value)}
}

// WithLabelValues is the gauge of these label values (in the labels' order).
func (g *GaugeVec) WithLabelValues(values ...string) *Gauge { return g.with(values) }

func (g *GaugeVec) kind() string { return "gauge" }

// Func is a counter or gauge whose value is read when the page is rendered.
type Func struct {
	o    Opts
	typ  string
	read func() float64
}

// NewCounterFunc is a counter read from f (which must never go down).
func NewCounterFunc(o Opts, f func() float64) *Func { return &Func{o: o, typ: "counter", read: f} }

// NewGaugeFunc is a gauge read from f.
func NewGaugeFunc(o Opts, f func() float64) *Func { return &Func{o: o, typ: "gauge", read: f} }

func (f *Func) opts() Opts            { return f.o }
func (f *Func) kind() string          { return f.typ }
func (f *Func) write(b *bytes.Buffer) { sample(b, f.o.Name, "", f.read()) }

// Histogram counts observations in cumulative buckets, with their sum.
type Histogram struct {
	o       Opts
	bounds  []float64
	mu      sync.Mutex
	buckets []uint64 // not cumulative; the last is above every bound
	sum     float64
	count   uint64
}

// NewHistogram is a histogram with these upper bounds (sorted, +Inf implied).
func NewHistogram(o Opts, bounds []float64) *Histogram {
	if !slices.IsSorted(bounds) {
		panic(fmt.Sprintf("histogram %s: bounds %v are not sorted", o.Name, bounds))
	}
	return &Histogram{o: o, bounds: slices.Clone(bounds), buckets: make([]uint64, len(bounds)+1)}
}

// Observe counts f in the first bucket whose bound is at least f.
func (h *Histogram) Observe(f float64) {
	i, _ := slices.BinarySearch(h.bounds, f)
	h.mu.Lock()
	h.buckets[i]++
	h.sum += f
	h.count++
	h.mu.Unlock()
}

// Count is how many observations were made.
func (h *Histogram) Count() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.count
}

func (h *Histogram) opts() Opts   { return h.o }
func (h *Histogram) kind() string { return "histogram" }

func (h *Histogram) write(b *bytes.Buffer) {
	h.mu.Lock()
	buckets, sum, count := slices.Clone(h.buckets), h.sum, h.count
	h.mu.Unlock()
	var cum uint64
	for i, bound := range h.bounds {
		cum += buckets[i]
		sample(b, h.o.Name+"_bucket", `le="`+formatFloat(bound)+`"`, float64(cum))
	}
	sample(b, h.o.Name+"_bucket", `le="+Inf"`, float64(count))
	sample(b, h.o.Name+"_sum", "", sum)
	sample(b, h.o.Name+"_count", "", float64(count))
}

// sample writes one line: name{labels} value.
func sample(b *bytes.Buffer, name, labels string, f float64) {
	b.WriteString(name)
	if labels != "" {
		b.WriteString("{" + labels + "}")
	}
	b.WriteString(" " + formatFloat(f) + "\n")
}

// formatFloat writes numbers as the text format (and client_golang) does.
func formatFloat(f float64) string {
	switch {
	case math.IsInf(f, 1):
		return "+Inf"
	case math.IsInf(f, -1):
		return "-Inf"
	case math.IsNaN(f):
		return "NaN"
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}

var (
	helpEscaper  = strings.NewReplacer(`\`, `\\`, "\n", `\n`)
	labelEscaper = strings.NewReplacer(`\`, `\\`, "\n", `\n`, `"`, `\"`)
)

func escapeHelp(s string) string  { return helpEscaper.Replace(s) }
func escapeLabel(s string) string { return labelEscaper.Replace(s) }

// validName is the text format's metric name: [a-zA-Z_:][a-zA-Z0-9_:]*.
func validName(s string) bool {
	if s == "" {
		return false
	}
	for i, r := range s {
		ok := r == '_' || r == ':' || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || (i > 0 && r >= '0' && r <= '9')
		if !ok {
			return false
		}
	}
	return true
}
