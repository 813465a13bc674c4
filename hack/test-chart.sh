#!/usr/bin/env bash
# Chart checks (test stage "unit"): builds the pinned helm and kubectl (cached after the first run) and
# runs test/chart: helm lint --strict, defaults against `kubectl kustomize config/default`, each value,
# and every rendered object sent to a real kube-apiserver (envtest).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(hack/build-tools.sh helm | tail -n1)
hack/build-tools.sh envtest >/dev/null
export HELM=$bin/helm KUBECTL=$bin/kubectl KUBEBUILDER_ASSETS=$bin
if [ -n "${GOTESTSUM:-}" ]; then
  "$GOTESTSUM" --format pkgname-and-test-fails --jsonfile "${TEST_LOGDIR:-bin/test-logs}/chart.json" -- -count=1 -tags chart ./test/chart/...
else
  go test -count=1 -tags chart ./test/chart/...
fi
