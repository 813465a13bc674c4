#!/usr/bin/env bash
# Prints the memory the running cluster uses: the summed RSS of every process of it (those in the
# node's network namespace: control plane, containerd and its shims, kubelet, kube-proxy; and every
# container process, found through the kubelet's cgroup root), and the pods' cgroup peak.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
node_ns=$(stat -Lc %i /run/netns/$NODE_NS)
declare -A pids=()
for p in /proc/[0-9]*; do
  [ "$(stat -Lc %i "$p/ns/net" 2>/dev/null)" = "$node_ns" ] && pids[${p#/proc/}]=1
done
for f in $(find /sys/fs/cgroup/memory/$CGROUP_ROOT -name cgroup.procs 2>/dev/null); do
  for p in $(cat "$f"); do pids[$p]=1; done
done
total=0
for p in "${!pids[@]}"; do
  kb=$(awk '/^VmRSS:/ {print $2}' /proc/$p/status 2>/dev/null || true)
  total=$((total + ${kb:-0}))
done
echo "processes: ${#pids[@]}  summed RSS: $((total / 1024)) MiB"
peak=/sys/fs/cgroup/memory/$CGROUP_ROOT/memory.max_usage_in_bytes
[ -f $peak ] && echo "pods' cgroup ($CGROUP_ROOT) peak: $(($(cat $peak) / 1024 / 1024)) MiB"
