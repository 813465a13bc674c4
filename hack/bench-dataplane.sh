#!/usr/bin/env bash
# Data-path figures for lbpod, on the netns topology of test/dataplane (root; iperf3 needed):
# iperf3 throughput and new TCP connections per second through the LB address (DNAT +
# MASQUERADE) vs straight through the same lb pod by routing (with --rules iptables: the baseline
# needs an ACCEPT before lbpod's forward filter), the time lbpod takes to apply 1, 100 and 1000
# ports from scratch and to change one port among 1000 with the default rules back end (nftables)
# and with --rules iptables in each variant (beside the floor: bare netlink transactions, or the
# back end's own binaries on the same rules), the CPU an idle lbpod uses in 60 s, and what one
# standby election advert costs a node with 100 and 200 other lb pods (group addresses against
# the one shared address of the release before, in the same run).
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
go test -tags dataplane -p 1 -count=1 -run '^$' -bench '^Benchmark(Throughput|ConnRate|Apply|IdleCPU|AdvertFanout)$' -benchtime=1x \
	-timeout 10m ./test/dataplane/ | tee "$out"

# Pick "<value> <unit>" pairs off the benchmark lines.
metric() { # benchmark-name-regex unit
	awk -v re="$1" -v unit="$2" '$1 ~ re { for (i = 2; i < NF; i++) if ($(i+1) == unit) print $i }' "$out" | head -1
}
echo
echo "== lbpod data path ($(uname -r), $(nproc) cores, $(iptables -V)); default rules back end: nftables"
printf '%-66s %s\n' \
	"throughput via LB address (Gbit/s, --rules iptables)" "$(metric '^BenchmarkThroughput' lb-Gbit/s)" \
	"  baseline: straight through the pod, routed (Gbit/s)" "$(metric '^BenchmarkThroughput' straight-Gbit/s)" \
	"  ratio (target >= 0.95)" "$(metric '^BenchmarkThroughput' ratio)" \
	"new TCP connections/s via LB address (--rules iptables)" "$(metric '^BenchmarkConnRate' lb-conn/s)" \
	"  baseline: straight through the pod, routed" "$(metric '^BenchmarkConnRate' straight-conn/s)" \
	"  ratio (target >= 0.90)" "$(metric '^BenchmarkConnRate' ratio)" \
	"idle CPU of one lbpod over 60 s (ms, 10 ports; default: nftables)" "$(metric '^BenchmarkIdleCPU/rules=nftables' idle-cpu-ms-per-60s)" \
	"  the same with --rules iptables" "$(metric '^BenchmarkIdleCPU/rules=iptables' idle-cpu-ms-per-60s)"
# rows LABEL BACKEND FLOOR-WRITE FLOOR-READ FLOOR-CHANGE: BenchmarkApply's figures of one back end,
# the floors named as that back end measures them.
rows() {
	local label=$1 b="^BenchmarkApply/backend=$2/ports="
	printf '%-66s %s\n' \
		"[$label] apply 1 port from scratch (ms)" "$(metric "${b}1-" from-scratch-ms)" \
		"[$label] apply 100 ports from scratch (ms)" "$(metric "${b}100-" from-scratch-ms)" \
		"[$label] apply 1000 ports from scratch (ms, target < 100)" "$(metric "${b}1000-" from-scratch-ms)" \
		"[$label]   floor: $3 (ms)" "$(metric "${b}1000-" floor-restore-1000-ms)" \
		"[$label]   floor: $4 (ms)" "$(metric "${b}1000-" floor-save-1000-ms)" \
		"[$label] change one port among 1000 (ms, target < 10)" "$(metric "${b}1000-" change-one-of-1000-ms)" \
		"[$label]   of which until the rules are in the kernel (ms)" "$(metric "${b}1000-" change-one-of-1000-in-kernel-ms)" \
		"[$label]   floor: $5 (ms)" "$(metric "${b}1000-" floor-change-one-ms)"
}
rows "nftables, the default" nftables "one transaction, table + set of 1000" "read the set of 1000 back" "one transaction deleting and adding one element"
for backend in nft legacy; do
	rows "--rules iptables, $backend" "$backend" "bare iptables-restore of those rules" "bare iptables-save of them" "bare iptables-restore deleting and adding one rule"
done
printf '%-66s %s\n' \
	"one advert, sender's node with 100 other lb pods (cpu ns)" "$(metric '^BenchmarkAdvertFanout/neighbours=100/group' cpu-ns/advert)" \
	"  baseline: one address shared by every Service (the release before)" "$(metric '^BenchmarkAdvertFanout/neighbours=100/shared' cpu-ns/advert)" \
	"  with 200 other lb pods (cpu ns)" "$(metric '^BenchmarkAdvertFanout/neighbours=200/group' cpu-ns/advert)" \
	"  baseline: shared address, 200 other lb pods (cpu ns)" "$(metric '^BenchmarkAdvertFanout/neighbours=200/shared' cpu-ns/advert)" \
	"  200 actives' adverts on that node (ms of CPU a second)" "$(metric '^BenchmarkAdvertFanout/neighbours=200/group' node-cpu-ms/s)" \
	"  baseline: shared address (ms of CPU a second)" "$(metric '^BenchmarkAdvertFanout/neighbours=200/shared' node-cpu-ms/s)"
echo "(apply times: medians of 5 runs of lbpod's own, from its log: read and plan, execute, and the verifying read-back;"
echo " the floors are, for nftables (lbpod without --rules), bare google/nftables netlink transactions in a"
echo " fresh namespace, and for iptables the back end's binaries alone on the same 1000 rules, timed in the same run)"
