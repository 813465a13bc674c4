#!/usr/bin/env bash
# End-to-end tests on the local cluster: bring it up (unless it is up already) with the operator
# installed, run test/e2e (build tag e2e), and always tear the cluster down afterwards, also when a
# step fails. Exits with the tests' status. Called by hack/test.sh (stage e2e).
#   env NODES            how many nodes (default 2, at most 3); the multi-node tests need 2 or more
#   env KEEP_CLUSTER=1   leave the cluster up afterwards (for debugging)
#   env E2E_RUN=REGEXP   run only the tests it matches (go test -run)
#   env GOTESTSUM, TEST_LOGDIR  set by hack/test.sh: run through gotestsum, JSON log to TEST_LOGDIR/e2e.json
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
. "$HERE/lib.sh"

# The cluster must never change how the host itself forwards (it lives in its own namespaces).
host_forwarding() { echo "$(sysctl -n net.ipv4.ip_forward) $(sysctl -n net.ipv6.conf.all.forwarding)"; }
forwarding_before=$(host_forwarding)

cleanup() {
  local rc=$?
  if [ "${KEEP_CLUSTER:-0}" = 1 ]; then
    log "KEEP_CLUSTER=1: cluster left up (hack/cluster/down.sh removes it)"
  else
    "$HERE/down.sh" || rc=1
  fi
  if [ "$(host_forwarding)" != "$forwarding_before" ]; then
    log "FAIL: the host's forwarding sysctls changed from '$forwarding_before' to '$(host_forwarding)'"
    rc=1
  fi
  exit $rc
}
trap cleanup EXIT

T0=$SECONDS
"$HERE/up.sh" >/dev/null
# The e2e run installs the operator with the Helm chart (make demo uses kustomize; test/chart keeps
# the two equal), with what the overlay in hack/cluster/operator sets for this cluster.
"$ROOT/hack/build-tools.sh" helm >/dev/null
"$BIN/helm" --kubeconfig "$KUBECONFIG_PATH" install lbsvc-operator "$ROOT/charts/lbsvc-operator" \
  --namespace lbsvc-system --create-namespace --set forwardingSysctls=all \
  --set-string 'nodeSelector.kubernetes\.io/hostname=lbsvc-node1' --wait --timeout 3m >/dev/null
kc wait --for=condition=Established --timeout=60s crd/subnets.lbsvc.io crd/ips.lbsvc.io >/dev/null
kc -n lbsvc-system rollout status deployment --timeout=120s >/dev/null
log "cluster ($NODES nodes) and operator (Helm release lbsvc-operator) ready in $((SECONDS - T0))s; running test/e2e"

cd "$ROOT"
export KUBECONFIG=$KUBECONFIG_PATH LBSVC_E2E_ROOT=$ROOT PATH=$BIN:$PATH
args=(-tags e2e -count=1 -timeout 20m ./test/e2e/...)
if [ -n "${E2E_RUN:-}" ]; then args+=(-run "$E2E_RUN"); fi
if [ -n "${GOTESTSUM:-}" ]; then
  "$GOTESTSUM" --format standard-verbose --jsonfile "${TEST_LOGDIR:-/tmp}/e2e.json" -- "${args[@]}"
else
  go test -v "${args[@]}"
fi
