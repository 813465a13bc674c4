#!/usr/bin/env bash
# The project's test command (README: `make test`). Stages run in order and all must pass:
#   lint        gofmt, go vet, staticcheck; generated code and manifests up to date
#   unit        pure packages (allocator, builders, desired state, parsers), with -race; the Helm chart
#   fuzz        every fuzz target for a short smoke run (FUZZTIME, default 5s)
#   integration controllers against a real kube-apiserver + etcd (envtest)
#   dataplane   the lb pod in real network namespaces with real traffic (root)
#   e2e         the seed's story on a real local cluster (root)
# Usage: hack/test.sh [all|lint|unit|fuzz|integration|dataplane|e2e]...
set -euo pipefail
cd "$(dirname "$0")/.."

GOTESTSUM_VERSION=v1.13.0
TOOLBIN=$PWD/bin/tools
GOTESTSUM=$TOOLBIN/gotestsum-$GOTESTSUM_VERSION
LOGDIR=${TEST_LOGDIR:-$PWD/bin/test-logs}
mkdir -p "$LOGDIR" "$TOOLBIN"
if [ ! -x "$GOTESTSUM" ]; then
  GOBIN=$TOOLBIN go install "gotest.tools/gotestsum@$GOTESTSUM_VERSION"
  mv "$TOOLBIN/gotestsum" "$GOTESTSUM"
fi

# gotest runs `go test` through gotestsum, keeping a JSON log per stage for the final count.
gotest() {
  local stage=$1; shift
  "$GOTESTSUM" --format pkgname-and-test-fails --jsonfile "$LOGDIR/$stage.json" -- "$@"
}

stage_lint() {
  make --no-print-directory lint
  make --no-print-directory verify-generated
}
stage_unit() {
  gotest unit -count=1 -race ./...
  GOTESTSUM="$GOTESTSUM" TEST_LOGDIR="$LOGDIR" hack/test-chart.sh
}
stage_fuzz() { hack/fuzz.sh "${FUZZTIME:-5s}"; }
stage_integration() {
  local assets
  assets=$(hack/build-tools.sh envtest | tail -n1)
  KUBEBUILDER_ASSETS=$assets gotest integration -count=1 -tags integration -timeout 20m ./test/integration/... ./cmd/lbpod/...
}
stage_dataplane() { gotest dataplane -count=1 -p 1 -tags dataplane -timeout 20m ./test/dataplane/...; }
stage_e2e() { GOTESTSUM="$GOTESTSUM" TEST_LOGDIR="$LOGDIR" hack/cluster/e2e.sh; }

stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(all)
if [ "${stages[0]}" = all ]; then
  stages=(lint unit fuzz integration dataplane e2e)
fi
rm -f "$LOGDIR"/*.json
for s in "${stages[@]}"; do
  echo "=== stage $s"
  start=$(date +%s)
  "stage_$s"
  echo "=== stage $s passed in $(( $(date +%s) - start ))s"
done

# One closing line over every stage: count top-level and sub-tests that passed or failed.
passed=0 failed=0 skipped=0
for f in "$LOGDIR"/*.json; do
  [ -e "$f" ] || continue
  passed=$(( passed + $(grep -c '"Action":"pass","Package":"[^"]*","Test":' "$f" || true) ))
  failed=$(( failed + $(grep -c '"Action":"fail","Package":"[^"]*","Test":' "$f" || true) ))
  skipped=$(( skipped + $(grep -c '"Action":"skip","Package":"[^"]*","Test":' "$f" || true) ))
done
echo "tests: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
