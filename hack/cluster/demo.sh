#!/usr/bin/env bash
# `make demo` / `make demo-down`: the seed's whole story on a local cluster.
#   demo.sh up    build (cached), bring the cluster up, install the operator (hack/cluster/operator:
#                 config/default + the demo's adaptations), apply config/samples, wait until the
#                 LB address answers from the client namespace, print how to look at it.
#   demo.sh down  remove everything (hack/cluster/down.sh).
#   env NODES     how many nodes (default 2, at most 3); node 1 also holds the control plane.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
. "$HERE/lib.sh"

# install_operator: the operator and the seed's objects; waits (bounded) for the operator to run.
install_operator() {
  kc apply -k "$HERE/operator" >/dev/null
  kc wait --for=condition=Established --timeout=60s crd/subnets.lbsvc.io >/dev/null
  kc -n lbsvc-system rollout status deployment --timeout=120s >/dev/null
  log "operator running in lbsvc-system"
}

apply_samples() {
  if [ -f "$ROOT/config/samples/kustomization.yaml" ]; then
    kc apply -k "$ROOT/config/samples" >/dev/null
  else
    kc apply -f "$ROOT/config/samples" >/dev/null
  fi
  log "config/samples applied"
}

lb_ip() { kc -n default get service test-service -o jsonpath='{.status.loadBalancer.ingress[0].ip}'; }
has_lb_ip() { [ -n "$(lb_ip)" ]; }
# lb_pod_ready: the seed's lb pod as `kubectl get pod` shows it: 1/1 Running (one ready container,
# phase Running, not being deleted). The traffic flows as soon as the lb pod has added the address,
# a moment before that; the demo returns only when the listing tells the truth.
lb_pod_ready() {
  kc -n default get pod -l lbsvc.io/service=test-service \
    -o jsonpath='{range .items[*]}{.metadata.deletionTimestamp}/{.status.phase}/{.status.containerStatuses[*].ready}{"\n"}{end}' |
    grep -qx '/Running/true'
}
# now_ms: wall clock in milliseconds, for the figures printed below.
now_ms() { date +%s%3N; }
# seconds FROM_MS TO_MS: the interval in seconds with milliseconds (12.345).
seconds() { local d=$(($2 - $1)); printf '%d.%03d' $((d / 1000)) $((d % 1000)); }

up() {
  local t0 t0ms served_ms ready_ms ip
  t0=$SECONDS t0ms=$(now_ms)
  "$HERE/up.sh" >/dev/null
  install_operator
  apply_samples
  wait_for "test-service to get an EXTERNAL-IP" 120 has_lb_ip || true
  ip=$(lb_ip)
  [ -n "$ip" ] || { kc -n default describe service test-service >&2; exit 1; }
  if ! wait_for "curl http://$ip:80 from netns $CLIENT_NS" 180 $IN_CLIENT curl -sf -m 2 "http://$ip:80/"; then
    kc get pods -A -o wide >&2
    kc -n default describe service test-service >&2
    exit 1
  fi
  served_ms=$(now_ms)
  if ! wait_for "the lb pod of test-service to show 1/1 Running" 60 lb_pod_ready; then
    kc -n default get pod -o wide >&2
    kc -n default describe pod -l lbsvc.io/service=test-service >&2
    exit 1
  fi
  ready_ms=$(now_ms)
  log "demo up with $NODES nodes in $((SECONDS - t0))s; the LB address $ip answers from the client namespace and its lb pod is 1/1 Running"
  # Figures (docs/benchmarks.md "Measured on the demo cluster"): the whole demo, and how long `kubectl get pod` lagged behind the
  # first answer through the LB address (both polled every 0.2 s).
  echo "figure: demo_up_seconds=$(seconds "$t0ms" "$ready_ms")"
  echo "figure: demo_first_curl_to_lb_pod_ready_seconds=$(seconds "$served_ms" "$ready_ms")"
  cat <<TXT

The seed's story is up. Look at it:
  export KUBECONFIG=$KUBECONFIG_PATH
  export PATH=$BIN:\$PATH
  kubectl get nodes                        # $(for i in $(seq "$NODES"); do printf '%s ' "$(node_name "$i")"; done)
  kubectl get pod -o wide                  # lb-svc-test-service-...  1/1 Running, dynamic-... x2; NODE column
  kubectl get svc test-service             # EXTERNAL-IP $ip
  kubectl get subnets
  kubectl -n lbsvc-system logs deploy/lbsvc-operator

Curl the LB address from the underlay's client namespace ($CLIENT_NS holds ${CLIENT_ADDR}, the Subnet's gateway):
  nsenter --net=/run/netns/$CLIENT_NS curl -s http://$ip:80/
  (or: ip netns exec $CLIENT_NS curl -s http://$ip:80/)

Dual stack: the client also holds 172.19.0.1 and fd00:172:19::1 (an IPv6 underlay); docs/demo-cluster.md "Dual stack
walk-through" adds a Dual Subnet and IPv6 / RequireDualStack Services.

Fail a node like a power-off, bring it back, drain it (each prints the moment, RFC 3339 with ms):
  hack/cluster/node.sh fail 2;  hack/cluster/node.sh recover 2;  hack/cluster/node.sh drain 2

Tear it all down:  make demo-down
TXT
  echo "first answer: $($IN_CLIENT curl -s -m 2 "http://$ip:80/")"
}

case ${1:-} in
  up) up ;;
  down) "$HERE/down.sh" ;;
  *) echo "usage: $0 up|down" >&2; exit 2 ;;
esac
