#!/usr/bin/env bash
# Operator benchmark: 1000 annotated LoadBalancer Services against a real kube-apiserver + etcd,
# the operator (bin/lbsvc-operator) as a separate process. Prints the time until all have an
# address, the operator's peak RSS (VmHWM), and the API-server floor for the same Services.
# Usage: KUBEBUILDER_ASSETS=<dir with kube-apiserver, etcd> hack/bench-operator.sh [-n 1000]
set -euo pipefail
cd "$(dirname "$0")/.."
: "${KUBEBUILDER_ASSETS:?set KUBEBUILDER_ASSETS (make bench-operator does)}"
mkdir -p bin
CGO_ENABLED=0 go build -trimpath -o bin/lbsvc-operator ./cmd/operator
go build -o bin/operator-bench ./test/bench/operator
exec bin/operator-bench -operator bin/lbsvc-operator "$@"
