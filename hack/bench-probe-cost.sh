#!/usr/bin/env bash
# What the kubelet spends on probing pods the way it probes lb pods (an HTTP readiness probe), on
# the running local cluster (make demo): N echo pods (default 80) with a readiness probe every 1 s,
# then every 5 s, then none; after each rollout it waits 20 s and reads the CPU of both kubelets
# (and of every lbpod process) over WINDOW seconds (default 60) from /proc (every node is this
# machine's). Prints `figure:` lines, then deletes its namespace. Not part of `make test`.
#
# Usage: hack/bench-probe-cost.sh [N]   (WINDOW=60)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/cluster/lib.sh"
N=${1:-80}
WINDOW=${WINDOW:-60}
bench_namespace bench-probe

HZ=$(getconf CLK_TCK) # ticks (lib.sh) counts these a second

# deploy applies the echo Deployment with the readiness probe $1 (a YAML flow mapping, or null).
deploy() {
  "$K" -n "$NS" apply -f - >/dev/null <<EOF
apiVersion: apps/v1
kind: Deployment
metadata: {name: echo}
spec:
  replicas: $N
  selector: {matchLabels: {app: probe-cost}}
  template:
    metadata: {labels: {app: probe-cost}}
    spec:
      containers:
      - name: echo
        image: localhost/lbsvc-echo:dev
        imagePullPolicy: IfNotPresent
        readinessProbe: $1
        resources: {requests: {cpu: 1m, memory: 8Mi}}
EOF
  "$K" -n "$NS" rollout status deployment/echo --timeout=300s >/dev/null
}

measure() {
  local name=$1 kubelets lbpods k0 l0
  kubelets=$(pgrep -x kubelet || true)
  lbpods=$(pgrep -x lbpod || true)
  sleep 20 # the rollout's own work settles; then the window
  # shellcheck disable=SC2086 # word splitting of the pid lists is meant
  k0=$(ticks $kubelets); l0=$(ticks $lbpods)
  sleep "$WINDOW"
  # shellcheck disable=SC2086
  echo "figure: probe_cost pods=$N readiness=$name kubelet_cpu_ms_per_min=$(( ($(ticks $kubelets) - k0) * 60000 / (HZ * WINDOW) )) lbpod_cpu_ms_per_min=$(( ($(ticks $lbpods) - l0) * 60000 / (HZ * WINDOW) )) (kubelets: $(echo $kubelets | wc -w), lbpods: $(echo $lbpods | wc -w))"
}

deploy "{httpGet: {path: /, port: 80}, periodSeconds: 1, timeoutSeconds: 2, failureThreshold: 3}"
measure every_1s
deploy "{httpGet: {path: /, port: 80}, periodSeconds: 5, timeoutSeconds: 2, failureThreshold: 3}"
measure every_5s
deploy null
measure none
