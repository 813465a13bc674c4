#!/usr/bin/env bash
# Steady-state API writes of standby lb pods, on the running local cluster (make demo): creates N
# Services (default 50) with two lb pods each, waits until every one has an active and a standby,
# then counts for WINDOW seconds (default 60):
#   - the writes of the lb pods: their Role allows exactly one write, an update of their
#     Service's Lease, so every write shows as a new resourceVersion of a lb-svc-* Lease;
#   - every write the API server served, from its apiserver_request_total counters, for scale
#     (node heartbeats, the operator's leader election, the scheduler's and controller manager's).
# Prints `figure:` lines, then deletes the Services. Not part of `make test`.
#
# Usage: hack/bench-ha-idle.sh [N]   (WINDOW=60)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/cluster/lib.sh"
[ -f "$CLUSTER_DIR/nodes" ] || { echo "no cluster is up: run make demo first" >&2; exit 1; }
N=${1:-50}
WINDOW=${WINDOW:-60}
NS=bench-ha-$$
export KUBECONFIG=$KUBECONFIG_PATH
K="$BIN/kubectl"

cleanup() { "$K" delete namespace "$NS" --wait=false >/dev/null 2>&1 || true; }
trap cleanup EXIT
"$K" create namespace "$NS" >/dev/null
for i in $(seq 1 "$N"); do
  cat <<EOF
---
apiVersion: v1
kind: Service
metadata:
  name: ha$i
  namespace: $NS
  annotations:
    ovn.kubernetes.io/attachmentprovider: lb-svc-attachment.kube-system
    lbsvc.io/replicas: "2"
spec:
  type: LoadBalancer
  selector: {app: dynamic}
  ports: [{name: http, port: 80, targetPort: 80, protocol: TCP}]
EOF
done | "$K" apply -f - >/dev/null
t0=$SECONDS
# Every Service settled: its Lease names a holder and the Service shows it.
settled() {
  local n
  n=$("$K" -n "$NS" get service -o jsonpath='{range .items[*]}{.metadata.annotations.lbsvc\.io/active-node}{"\n"}{end}' | grep -c . || true)
  [ "$n" -eq "$N" ]
}
for _ in $(seq 1 600); do settled && break; sleep 1; done
settled || { echo "not all $N Services have an active lb pod after 600 s" >&2; exit 1; }
echo "figure: ha_idle_services=$N lb_pods=$("$K" -n "$NS" get pod --no-headers | grep -c Running) settled_in_s=$((SECONDS - t0))"

leases() { "$K" -n "$NS" get lease -o jsonpath='{range .items[*]}{.metadata.name}={.metadata.resourceVersion}{"\n"}{end}' | sort; }
writes() {
  "$K" get --raw /metrics | awk '/^apiserver_request_total\{/ && /verb="(POST|PUT|PATCH|DELETE|APPLY)"/ {s += $NF} END {printf "%d\n", s}'
}
before_leases=$(leases)
before_writes=$(writes)
sleep "$WINDOW"
after_leases=$(leases)
after_writes=$(writes)
changed=$(diff <(echo "$before_leases") <(echo "$after_leases") | grep -c '^>' || true)
all=$((after_writes - before_writes))
echo "figure: ha_idle_lbpod_writes_per_service_per_s=$(awk -v c="$changed" -v n="$N" -v w="$WINDOW" 'BEGIN {printf "%.4f", c / n / w}') (Leases written in ${WINDOW}s: $changed of $N)"
echo "figure: ha_idle_apiserver_writes_per_s=$(awk -v a="$all" -v w="$WINDOW" 'BEGIN {printf "%.2f", a / w}') (all clients; $all writes in ${WINDOW}s with $N Services and $((2 * N)) lb pods)"
