package main

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/client-go/rest"
)

// requestStat is what the API server counted for one kind of request.
type requestStat struct {
	count   float64
	seconds float64 // summed server-side duration
}

// apiMetrics reads the API server's request counters and durations by
// "VERB resource[/subresource] code" (durations by "VERB resource[/subresource]").
func apiMetrics(ctx context.Context, cfg *rest.Config) (map[string]requestStat, error) {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(cfg.Host, "/")+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape apiserver metrics: %w", err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("parse apiserver metrics: %w", err)
	}
	out := map[string]requestStat{}
	key := func(l map[string]string) (string, bool) {
		// The API server's own writes (ClusterIP IPAddress objects), leader election's renewals
		// and the bench's namespaces are not the operator's per-Service work. A Lease created is:
		// each Service with standby lb pods gets one.
		switch l["resource"] {
		case "", "namespaces", "ipaddresses":
			return "", false
		case "leases":
			if l["verb"] != "POST" {
				return "", false
			}
		}
		k := l["verb"] + " " + l["resource"]
		if l["subresource"] != "" {
			k += "/" + l["subresource"]
		}
		return k, true
	}
	if mf := mfs["apiserver_request_total"]; mf != nil {
		for _, m := range mf.GetMetric() {
			l := labelsOf(m)
			if k, ok := key(l); ok {
				s := out[k+" "+l["code"]]
				s.count += m.GetCounter().GetValue()
				out[k+" "+l["code"]] = s
			}
		}
	}
	if mf := mfs["apiserver_request_duration_seconds"]; mf != nil {
		for _, m := range mf.GetMetric() {
			if k, ok := key(labelsOf(m)); ok {
				s := out[k]
				s.seconds += m.GetHistogram().GetSampleSum()
				s.count += float64(m.GetHistogram().GetSampleCount())
				out[k] = s
			}
		}
	}
	return out, nil
}

func labelsOf(m *dto.Metric) map[string]string {
	l := map[string]string{}
	for _, p := range m.GetLabel() {
		l[p.GetName()] = p.GetValue()
	}
	return l
}

// isWrite tells whether a "VERB resource code" or "VERB resource" key is a write.
func isWrite(k string) bool {
	verb, _, _ := strings.Cut(k, " ")
	switch verb {
	case "POST", "PUT", "PATCH", "DELETE", "APPLY":
		return true
	}
	return false
}

// settle waits until the API server's write counters stop moving for 3 s in a row.
func settle(ctx context.Context, rc *rest.Config) (map[string]requestStat, error) {
	var cur map[string]requestStat
	for stable, last := 0, -1.0; stable < 3; {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Second):
		}
		m, err := apiMetrics(ctx, rc)
		if err != nil {
			return nil, err
		}
		total := 0.0
		for k, v := range m {
			if isWrite(k) && strings.Count(k, " ") == 2 {
				total += v.count
			}
		}
		if total == last {
			stable++
		} else {
			stable = 0
		}
		last, cur = total, m
	}
	return cur, nil
}

// writesBetween is the number of write requests the API server answered between two apiMetrics
// readings.
func writesBetween(before, after map[string]requestStat) float64 {
	total := 0.0
	for k, v := range after {
		if isWrite(k) && strings.Count(k, " ") == 2 {
			total += v.count - before[k].count
		}
	}
	return total
}

// report prints the operator's writes per Service by kind and response code, the mean
// server-side latency of each write kind, and the reads per Service.
func report(fig func(string, string, ...any), before, after map[string]requestStat, n int, bench map[string]float64) {
	var writes, reads []string
	totalWrites, totalReads := 0.0, 0.0
	delta := map[string]float64{}
	for k, v := range after {
		if strings.Count(k, " ") != 2 {
			continue
		}
		d := v.count - before[k].count - bench[k]
		if d <= 0 {
			continue
		}
		delta[k] = d
		if isWrite(k) {
			writes = append(writes, k)
			totalWrites += d
		} else {
			reads = append(reads, k)
			totalReads += d
		}
	}
	sort.Strings(writes)
	sort.Strings(reads)
	fig("writes_per_service", "%.2f", totalWrites/float64(n))
	for _, k := range writes {
		kind, code := k[:strings.LastIndex(k, " ")], k[strings.LastIndex(k, " ")+1:]
		mean := 0.0
		if d := after[kind].count - before[kind].count; d > 0 {
			mean = (after[kind].seconds - before[kind].seconds) / d * 1000
		}
		fig("writes_per_service{"+strings.ReplaceAll(kind, " ", ":")+",code="+code+"}", "%.2f", delta[k]/float64(n))
		fmt.Printf("  %-40s %s  %.2f per Service, mean %.1f ms in the API server\n", kind, code, delta[k]/float64(n), mean)
	}
	fig("reads_per_service", "%.2f", totalReads/float64(n))
	for _, k := range reads {
		fmt.Printf("  %-40s %.2f per Service\n", k, delta[k]/float64(n))
	}
}
