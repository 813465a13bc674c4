#!/usr/bin/env bash
# Tears down everything hack/cluster/up.sh made, for any number of nodes, also after a failed or
# partial up and with a node frozen by node.sh fail: pods (so CNI releases their links), processes,
# containerd shims and containers, mount namespaces, pod network namespaces, our network namespaces
# and links, cgroups, and the run directory. Safe to repeat. Exits non-zero if anything of ours is
# still there afterwards.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
[ "$(id -u)" = 0 ] || { echo "down.sh needs root" >&2; exit 1; }

# Whatever NODES says, remove every node that may exist.
ALL_NODES=$(seq $MAX_NODES)

alive() { [ -f "$PIDS/$1.pid" ] && kill -0 "$(cat "$PIDS/$1.pid")" 2>/dev/null; }

any_alive() { local p; for p in "$@"; do kill -0 "$p" 2>/dev/null && return 0; done; return 1; }

# stop NAME...: SIGTERM the processes recorded in NAME.pid together (each takes a second or two to
# shut down), SIGKILL whatever still runs after 10 s.
stop() {
  local name pids=() i
  for name in "$@"; do
    [ -f "$PIDS/$name.pid" ] || continue
    pids+=("$(cat "$PIDS/$name.pid")")
    rm -f "$PIDS/$name.pid"
  done
  [ ${#pids[@]} -gt 0 ] || return 0
  kill "${pids[@]}" 2>/dev/null
  for i in $(seq 100); do any_alive "${pids[@]}" || break; sleep 0.1; done
  kill -9 "${pids[@]}" 2>/dev/null
}

# A node failed with node.sh fail is frozen and cut off: thaw it and plug it in again first, so
# that its processes can be stopped and its pods deleted like the others'.
for i in $ALL_NODES; do
  f=$(freezer_dir "$i")/freezer.state
  [ -f "$f" ] && echo THAWED >"$f" 2>/dev/null
  for p in "ul-node$i" "cn-node$i"; do $IN_UL ip link set "$p" up 2>/dev/null; done
done

# Delete pods while kubelets and containerd still run, so CNI DEL removes their links and addresses.
if alive node1-kubelet && alive apiserver; then
  kc delete deployments,daemonsets,statefulsets,replicasets --all -A --wait=false --request-timeout=5s >/dev/null 2>&1
  kc delete pods --all -A --grace-period=1 --wait=true --timeout=30s --request-timeout=35s >/dev/null 2>&1
fi
stop $(for i in $ALL_NODES; do echo "node$i-kube-proxy node$i-kubelet"; done)

# Every container and sandbox left: kill through containerd, then the shims it started (their pids
# are recorded in containerd's state dir) and anything still in our cgroups.
kill_tasks() {
  local i=$1 t
  alive "node$i-containerd" || return 0
  for t in $(ctr_node "$i" tasks ls -q 2>/dev/null); do ctr_node "$i" tasks kill -s SIGKILL "$t" >/dev/null 2>&1; done
  for t in $(ctr_node "$i" tasks ls -q 2>/dev/null); do ctr_node "$i" tasks delete -f "$t" >/dev/null 2>&1; done
}
for i in $ALL_NODES; do kill_tasks "$i" & done
wait
stop $(for i in $ALL_NODES; do echo "node$i-containerd"; done)
for f in "$CLUSTER_DIR"/node*/containerd/state/io.containerd.runtime.v2.task/*/*/shim.pid; do
  [ -f "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null
done
for c in /sys/fs/cgroup/*/$CGROUP_ROOT; do
  [ -d "$c" ] || continue
  find "$c" -name cgroup.procs -exec cat {} + 2>/dev/null | xargs -r kill -9 2>/dev/null
done
stop scheduler controller-manager apiserver
stop etcd

# The nodes' mount namespaces (their container rootfs, volumes and pod netns mounts go with
# them once no process is left in them), then anything else mounted under the run dir.
for i in $ALL_NODES; do umount "$MNTNS_DIR/node$i" 2>/dev/null; done
umount "$MNTNS_DIR" 2>/dev/null
if [ -d "$CLUSTER_DIR" ]; then
  awk -v d="$CLUSTER_DIR/" 'index($2, d) == 1 {print $2}' /proc/self/mounts | sort -r | xargs -r -n1 umount -l 2>/dev/null
fi
# The mount points up.sh made for the fixed host paths (our entries there lived only inside the
# nodes' mount namespaces), removed if up.sh found them absent; also entries a cluster of an older
# layout (no mount namespaces) left: log links into our run dir.
for l in /var/log/containers/*.log; do
  [ -L "$l" ] && case $(readlink "$l") in "$CLUSTER_DIR"/*) rm -f "$l" ;; esac
done
if [ -f "$CLUSTER_DIR/hostdirs.created" ]; then
  while read -r d; do
    [ -n "$d" ] && [ -d "$d" ] || continue
    find "$d" -depth -type d -empty -delete
  done <"$CLUSTER_DIR/hostdirs.created"
fi
# Pod network namespaces containerd made (all cni-* that were not there before up). Their mounts
# lived in the nodes' mount namespaces; on the host only the file names are left.
if [ -f "$CLUSTER_DIR/netns.before" ]; then
  for n in $(ls /run/netns 2>/dev/null | grep '^cni-'); do
    grep -qx "$n" "$CLUSTER_DIR/netns.before" || ip netns del "$n" 2>/dev/null || rm -f "/run/netns/$n"
  done
fi
ip link del $HOST_VETH 2>/dev/null
# (lbsvc-node: the one node of the layout before NODES, in case such a cluster was left over.)
for n in $(for i in $ALL_NODES; do node_ns "$i"; done) lbsvc-node $UL_NS $CLIENT_NS; do ip netns del "$n" 2>/dev/null; done
for i in 1 2 3 4 5; do
  left=0
  for c in /sys/fs/cgroup/*/$CGROUP_ROOT; do
    [ -d "$c" ] || continue
    find "$c" -depth -type d -exec rmdir {} \; 2>/dev/null
    [ -d "$c" ] && left=1
  done
  [ $left = 0 ] && break
  sleep 0.5
done
rm -rf "$CLUSTER_DIR"

# Check: nothing of ours remains.
bad=0
for n in $(for i in $ALL_NODES; do node_ns "$i"; done) $UL_NS $CLIENT_NS; do
  [ -e /run/netns/$n ] && { echo "left over: netns $n" >&2; bad=1; }
done
ip link show $HOST_VETH >/dev/null 2>&1 && { echo "left over: link $HOST_VETH" >&2; bad=1; }
for c in /sys/fs/cgroup/*/$CGROUP_ROOT; do [ -d "$c" ] && { echo "left over: cgroup $c" >&2; bad=1; }; done
grep -q " $CLUSTER_DIR/" /proc/self/mounts && { echo "left over: mounts under $CLUSTER_DIR" >&2; bad=1; }
[ -e "$CLUSTER_DIR" ] && { echo "left over: $CLUSTER_DIR" >&2; bad=1; }
[ $bad = 0 ] && log "cluster down: nothing left"
exit $bad
