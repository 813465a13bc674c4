#!/usr/bin/env bash
# Data-path figures for lbpod, on the netns topology of test/dataplane (root; iperf3 needed):
# iperf3 throughput and new TCP connections per second through the LB address (DNAT +
# MASQUERADE) vs straight through the same lb pod by routing, and the time lbpod takes to apply
# 1, 100 and 1000 ports from scratch and to change one port among 1000.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ $(id -u) -ne 0 ]]; then
	echo "bench-dataplane: run as root (network namespaces, iptables)" >&2
	exit 1
fi
for tool in ip iptables iperf3; do
	command -v "$tool" >/dev/null || { echo "bench-dataplane: $tool is missing (apt-get install iproute2 iptables iperf3)" >&2; exit 1; }
done

out=$(mktemp)
trap 'rm -f "$out"' EXIT
go test -tags dataplane -p 1 -count=1 -run '^$' -bench '^Benchmark(Throughput|ConnRate|Apply|IdleCPU)$' -benchtime=1x \
	-timeout 10m ./test/dataplane/ | tee "$out"

# Pick "<value> <unit>" pairs off the benchmark lines.
metric() { # benchmark-name-regex unit
	awk -v re="$1" -v unit="$2" '$1 ~ re { for (i = 2; i < NF; i++) if ($(i+1) == unit) print $i }' "$out" | head -1
}
echo
echo "== lbpod data path ($(uname -r), $(nproc) cores, $(iptables -V))"
printf '%-44s %s\n' \
	"throughput via LB address (Gbit/s)" "$(metric '^BenchmarkThroughput' lb-Gbit/s)" \
	"throughput straight, routed (Gbit/s)" "$(metric '^BenchmarkThroughput' straight-Gbit/s)" \
	"throughput ratio (bar >= 0.95)" "$(metric '^BenchmarkThroughput' ratio)" \
	"new TCP connections/s via LB address" "$(metric '^BenchmarkConnRate' lb-conn/s)" \
	"new TCP connections/s straight" "$(metric '^BenchmarkConnRate' straight-conn/s)" \
	"connection rate ratio (bar >= 0.90)" "$(metric '^BenchmarkConnRate' ratio)" \
	"apply 1 port from scratch (ms)" "$(metric '^BenchmarkApply/ports=1-' from-scratch-ms)" \
	"apply 100 ports from scratch (ms)" "$(metric '^BenchmarkApply/ports=100-' from-scratch-ms)" \
	"apply 1000 ports from scratch (ms, target < 100)" "$(metric '^BenchmarkApply/ports=1000-' from-scratch-ms)" \
	"change one port among 1000 (ms, target < 10)" "$(metric '^BenchmarkApply/ports=1000-' change-one-of-1000-ms)" \
	"idle CPU of one lbpod over 60 s (ms)" "$(metric '^BenchmarkIdleCPU' idle-cpu-ms-per-60s)"
echo "(apply times are lbpod's own: apply plus verification, from its log)"
