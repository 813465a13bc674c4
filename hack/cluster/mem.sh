#!/usr/bin/env bash
# Prints the memory the running cluster uses: the summed RSS of every process of it (those in the
# nodes' network namespaces: control plane, containerd and its shims, kubelets, kube-proxies; and
# every container process, found through the kubelets' cgroup root), per node and in total, and
# the pods' cgroup peak.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
rss_kb() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status" 2>/dev/null || true; }
declare -A seen=()
total=0 count=0 line=""
for i in $(seq $MAX_NODES); do
  [ -e "/run/netns/$(node_ns "$i")" ] || continue
  ns=$(stat -Lc %i "/run/netns/$(node_ns "$i")")
  declare -A pids=()
  for p in /proc/[0-9]*; do
    [ "$(stat -Lc %i "$p/ns/net" 2>/dev/null)" = "$ns" ] && pids[${p#/proc/}]=1
  done
  for f in $(find "/sys/fs/cgroup/memory/$CGROUP_ROOT/node$i" -name cgroup.procs 2>/dev/null); do
    for p in $(cat "$f"); do pids[$p]=1; done
  done
  node_kb=0
  for p in "${!pids[@]}"; do
    [ -z "${seen[$p]:-}" ] || continue
    seen[$p]=1
    kb=$(rss_kb "$p")
    node_kb=$((node_kb + ${kb:-0}))
    count=$((count + 1))
  done
  unset pids
  total=$((total + node_kb))
  line="$line $(node_name "$i"): $((node_kb / 1024)) MiB"
done
echo "processes: $count  summed RSS: $((total / 1024)) MiB ($line )"
peak=/sys/fs/cgroup/memory/$CGROUP_ROOT/memory.max_usage_in_bytes
[ -f $peak ] && echo "pods' cgroup ($CGROUP_ROOT) peak: $(($(cat $peak) / 1024 / 1024)) MiB"
