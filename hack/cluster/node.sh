#!/usr/bin/env bash
# Node failure on demand, for outage measurements. Each action prints one line per step, starting
# with the exact moment it was done (RFC 3339, UTC, milliseconds):
#   node.sh fail N     node N dies the way a powered-off machine does: its kubelet, containerd,
#                      shims, kube-proxy and every container are frozen at once (one write to the
#                      node's cgroup v1 freezer), then its cables are pulled (its switch ports on
#                      the underlay and the cluster network go down). No API call, no graceful
#                      deletion: the control plane finds out on its own, as it would.
#   node.sh recover N  thaw it, plug it in again, and uncordon it if it was cordoned (drain).
#   node.sh drain N    kubectl drain (cordon, evict every pod but DaemonSets').
# Node 1 holds the control plane and cannot be failed (the cluster would have no API server left).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"

usage() { echo "usage: $0 fail|recover|drain N   (N: a node of the running cluster, 1..$(cat "$CLUSTER_DIR/nodes" 2>/dev/null || echo "$NODES"))" >&2; exit 2; }
[ $# = 2 ] || usage
action=$1 n=$2
[ -f "$CLUSTER_DIR/nodes" ] || { echo "no cluster is up ($CLUSTER_DIR/nodes missing)" >&2; exit 1; }
case $n in [1-9]) ;; *) usage ;; esac
[ "$n" -le "$(cat "$CLUSTER_DIR/nodes")" ] || usage
[ "$(id -u)" = 0 ] || { echo "node.sh needs root" >&2; exit 1; }
name=$(node_name "$n")
freezer=$(freezer_dir "$n")

# say WHAT: the moment (taken right after the step) and what was done.
say() { echo "$(date -u +%Y-%m-%dT%H:%M:%S.%3NZ) $action $name: $*"; }

frozen() { [ "$(cat "$freezer/freezer.state")" = FROZEN ]; }
procs() { find "$freezer" -name cgroup.procs -exec cat {} + | wc -l; }

case $action in
  fail)
    [ "$n" != 1 ] || { echo "node 1 holds the control plane: fail another node" >&2; exit 1; }
    echo FROZEN >"$freezer/freezer.state"
    # FREEZING until every task stopped; bounded.
    wait_for "freezer of $name to report FROZEN" 10 frozen
    say "froze kubelet, containerd, shims, kube-proxy and pods ($(procs) processes)"
    $IN_UL ip link set "ul-node$n" down
    $IN_UL ip link set "cn-node$n" down
    say "pulled its cables (ul-node$n, cn-node$n down)"
    ;;
  recover)
    $IN_UL ip link set "ul-node$n" up
    $IN_UL ip link set "cn-node$n" up
    say "plugged in (ul-node$n, cn-node$n up)"
    echo THAWED >"$freezer/freezer.state"
    say "thawed ($(procs) processes)"
    if [ "$(kc get node "$name" -o jsonpath='{.spec.unschedulable}')" = true ]; then
      kc uncordon "$name" >/dev/null
      say "uncordoned"
    fi
    ;;
  drain)
    say "draining"
    kc drain "$name" --ignore-daemonsets --delete-emptydir-data --force --timeout=120s >&2
    say "drained"
    ;;
  *) usage ;;
esac
