#!/usr/bin/env bash
# Operator benchmark against a real kube-apiserver + etcd, the operator (bin/lbsvc-operator) as a
# separate process. Prints `figure:` lines: time until N Services created at once all have an
# address, the API-server floor from the same run and the ratio, peak RSS, API writes per Service
# by kind, and p50/p99 creation -> ingress of 100 sequential Services while the N are served.
# Not part of `make test`.
#
# Usage: KUBEBUILDER_ASSETS=<dir with kube-apiserver, etcd> hack/bench-operator.sh [operator-bench flags]
#   BENCH_SERVICES=10000   Services created at once (default 1000)
#   BENCH_UNRELATED=5000   also 5000 unrelated ConfigMaps, pods and Deployments (each)
#   BENCH_PROFILE=dir      CPU profiles of the burst (the operator's, the API server's) and of the API
#                          server in the design floor, and a heap profile after the burst, into dir
#                          (-profile-seconds N sets their length; default 30)
#   BENCH_GOMEMLIMIT=512MiB the operator's GOMEMLIMIT, as the shipped Deployment sets it from its
#                          memory limit (unset by default; GOMEMLIMIT of this shell is not passed on)
#   BENCH_GOGC=50          the operator's GOGC, as the shipped Deployment sets it (unset by default:
#                          the runtime's 100; GOGC of this shell is not passed on)
set -euo pipefail
cd "$(dirname "$0")/.."
: "${KUBEBUILDER_ASSETS:?set KUBEBUILDER_ASSETS (make bench-operator does)}"
args=(-n "${BENCH_SERVICES:-1000}" -unrelated "${BENCH_UNRELATED:-0}")
if [ -n "${BENCH_PROFILE:-}" ]; then
  args+=(-profile "$BENCH_PROFILE")
fi
if [ -n "${BENCH_GOGC:-}" ]; then
  args+=(-gogc "$BENCH_GOGC")
fi
if [ -n "${BENCH_GOMEMLIMIT:-}" ]; then
  args+=(-gomemlimit "$BENCH_GOMEMLIMIT")
fi
if [ "${BENCH_SERVICES:-1000}" -gt 2000 ]; then
  args+=(-timeout 90m)
fi
mkdir -p bin
CGO_ENABLED=0 go build -trimpath -o bin/lbsvc-operator ./cmd/operator
go build -o bin/operator-bench ./test/bench/operator
exec bin/operator-bench -operator bin/lbsvc-operator "${args[@]}" "$@"
