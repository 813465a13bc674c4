#!/usr/bin/env bash
# Data-path figures for lbpod, on the netns topology of test/dataplane (root; iperf3 needed):
# iperf3 throughput and new TCP connections per second through the LB address (DNAT +
# MASQUERADE) vs straight through the same lb pod by routing, the time lbpod takes to apply 1,
# 100 and 1000 ports from scratch and to change one port among 1000 with each iptables back end
# and with --rules nftables (beside the floor: the back end's own binaries on the same rules, or
# bare netlink transactions), and the CPU an idle lbpod
# uses in 60 s.
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
printf '%-66s %s\n' \
	"throughput via LB address (Gbit/s)" "$(metric '^BenchmarkThroughput' lb-Gbit/s)" \
	"  baseline: straight through the pod, routed (Gbit/s)" "$(metric '^BenchmarkThroughput' straight-Gbit/s)" \
	"  ratio (target >= 0.95)" "$(metric '^BenchmarkThroughput' ratio)" \
	"new TCP connections/s via LB address" "$(metric '^BenchmarkConnRate' lb-conn/s)" \
	"  baseline: straight through the pod, routed" "$(metric '^BenchmarkConnRate' straight-conn/s)" \
	"  ratio (target >= 0.90)" "$(metric '^BenchmarkConnRate' ratio)" \
	"idle CPU of one lbpod over 60 s (ms, 10 ports)" "$(metric '^BenchmarkIdleCPU' idle-cpu-ms-per-60s)"
for backend in nft legacy; do
	printf '%-66s %s\n' \
		"[$backend] apply 1 port from scratch (ms)" "$(metric "^BenchmarkApply/backend=$backend/ports=1-" from-scratch-ms)" \
		"[$backend] apply 100 ports from scratch (ms)" "$(metric "^BenchmarkApply/backend=$backend/ports=100-" from-scratch-ms)" \
		"[$backend] apply 1000 ports from scratch (ms, target < 100)" "$(metric "^BenchmarkApply/backend=$backend/ports=1000-" from-scratch-ms)" \
		"[$backend]   floor: bare iptables-restore of those rules (ms)" "$(metric "^BenchmarkApply/backend=$backend/ports=1000-" floor-restore-1000-ms)" \
		"[$backend]   floor: bare iptables-save of them (ms)" "$(metric "^BenchmarkApply/backend=$backend/ports=1000-" floor-save-1000-ms)" \
		"[$backend] change one port among 1000 (ms, target < 10)" "$(metric "^BenchmarkApply/backend=$backend/ports=1000-" change-one-of-1000-ms)" \
		"[$backend]   of which until the rules are in the kernel (ms)" "$(metric "^BenchmarkApply/backend=$backend/ports=1000-" change-one-of-1000-in-kernel-ms)" \
		"[$backend]   floor: bare iptables-restore deleting and adding one rule (ms)" "$(metric "^BenchmarkApply/backend=$backend/ports=1000-" floor-change-one-ms)"
done
backend=nftables
printf '%-66s %s\n' \
	"[lbpod --rules nftables] apply 1 port from scratch (ms)" "$(metric "^BenchmarkApply/backend=$backend/ports=1-" from-scratch-ms)" \
	"[lbpod --rules nftables] apply 100 ports from scratch (ms)" "$(metric "^BenchmarkApply/backend=$backend/ports=100-" from-scratch-ms)" \
	"[lbpod --rules nftables] apply 1000 ports from scratch (ms, target < 100)" "$(metric "^BenchmarkApply/backend=$backend/ports=1000-" from-scratch-ms)" \
	"[lbpod --rules nftables]   floor: one transaction, table + set of 1000 (ms)" "$(metric "^BenchmarkApply/backend=$backend/ports=1000-" floor-restore-1000-ms)" \
	"[lbpod --rules nftables]   floor: read the set of 1000 back (ms)" "$(metric "^BenchmarkApply/backend=$backend/ports=1000-" floor-save-1000-ms)" \
	"[lbpod --rules nftables] change one port among 1000 (ms, target < 10)" "$(metric "^BenchmarkApply/backend=$backend/ports=1000-" change-one-of-1000-ms)" \
	"[lbpod --rules nftables]   of which until the rules are in the kernel (ms)" "$(metric "^BenchmarkApply/backend=$backend/ports=1000-" change-one-of-1000-in-kernel-ms)" \
	"[lbpod --rules nftables]   floor: one transaction deleting and adding one element (ms)" "$(metric "^BenchmarkApply/backend=$backend/ports=1000-" floor-change-one-ms)"
echo "(apply times: medians of 5 runs of lbpod's own, from its log: read and plan, execute, and the verifying read-back;"
echo " the floors are the back end's binaries alone on the same 1000 rules, timed in the same run; for"
echo " --rules nftables, bare google/nftables netlink transactions in a fresh namespace)"
