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
# Usage: hack/bench-ha-idle.sh [N]   (WINDOW=60, BATCH=10)
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
service() {
  cat <<EOF
---
apiVersion: v1
kind: Service
metadata:
  name: ha$1
  namespace: $NS
  annotations:
    ovn.kubernetes.io/attachmentprovider: lb-svc-attachment.kube-system
    lbsvc.io/replicas: "2"
spec:
  type: LoadBalancer
  selector: {app: dynamic}
  ports: [{name: http, port: 80, targetPort: 80, protocol: TCP}]
EOF
}
# settled M: M Services show an active lb pod (their Lease names a holder the operator found).
settled() {
  local n
  n=$("$K" -n "$NS" get service -o jsonpath='{range .items[*]}{.metadata.annotations.lbsvc\.io/active-node}{"\n"}{end}' | grep -c . || true)
  [ "$n" -ge "$1" ]
}
transitions() { "$K" -n "$NS" get lease -o jsonpath='{range .items[*]}{.spec.leaseTransitions}{"\n"}{end}' | awk '{s += $1} END {print s + 0}'; }
calm() {
  local last now since=$SECONDS
  last=$(transitions)
  for _ in $(seq 1 120); do
    sleep 5
    now=$(transitions)
    if [ "$now" != "$last" ]; then last=$now; since=$SECONDS; fi
    if [ $((SECONDS - since)) -ge "${CALM:-20}" ]; then
      echo "batch up to $1: calm at $(cut -d' ' -f1 /proc/loadavg) load, $now Lease transitions so far, $((SECONDS - t0)) s"
      return 0
    fi
  done
  echo "batch up to $1: Leases still changing after 600 s ($now transitions)"
}
# In batches (BATCH, default 10): two lb pods start per Service, and a 2-core machine that
# starts a hundred pods at once starves them all (the elections' 300 ms dead interval with it).
t0=$SECONDS
created=0
while [ "$created" -lt "$N" ]; do
  upto=$((created + ${BATCH:-10}))
  [ "$upto" -le "$N" ] || upto=$N
  for i in $(seq $((created + 1)) "$upto"); do service "$i"; done | "$K" apply -f - >/dev/null
  created=$upto
  for _ in $(seq 1 600); do settled "$created" && break; sleep 1; done
  settled "$created" || { echo "only some of $created Services have an active lb pod after 600 s" >&2; exit 1; }
  # And calm: no Lease written for CALM seconds (default 20), up to 600 s, before the next batch,
  # so that each batch starts on a node that has finished starting the last one.
  calm "$created"
done
echo "figure: ha_idle_services=$N lb_pods=$("$K" -n "$NS" get pod --no-headers | grep -c Running) settled_in_s=$((SECONDS - t0)) lease_transitions_while_starting=$(transitions)"

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
