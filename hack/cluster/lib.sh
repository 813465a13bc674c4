# Shared names, paths and helpers of the demo / e2e cluster. Sourced by up.sh, down.sh, demo.sh,
# e2e.sh, node.sh and mem.sh; the Go e2e tests use the same names (test/e2e/cluster_test.go).
#
# Topology (docs/demo-cluster.md "Topology"; everything in network namespaces of its own, nothing routes to the
# outside world). NODES nodes (default 2, at most 3), node i = netns lbsvc-node<i>:
#   host netns          lbsvc-h 10.250.0.1/30   only to reach the API server (host forwarding untouched)
#   netns lbsvc-node1   lbsvc-n 10.250.0.2/30   + the control plane: etcd, kube-apiserver :6443,
#                                               controller-manager, scheduler
#   netns lbsvc-node<i> eth1 10.250.1.<i>/24    node-to-node link (the cluster network), routes to
#                                               the other nodes' pod CIDRs over it
#                       eth0                    the macvlan master the seed's NAD names (master: eth0)
#                       lbsvc-br0 10.212.<i>.1/24  pods; containerd, kubelet, kube-proxy, Multus
#   netns lbsvc-ul      br0 (underlay L2: ul-node<i>, ul-client), cn0 (cluster network: cn-node<i>)
#   netns lbsvc-client  eth0 172.18.0.1/16       "the outside world": the Subnet's gateway; curl runs here
#                            172.19.0.1/16, fd00:172:19::1/64  gateways of the dual-stack underlay network
# Dual stack: Services 10.211.0.0/16 and fd00:10:211::/112, pods 10.212.<i>.0/24 and
# fd00:10:212:<i>::/64, cluster network 10.250.1.<i> and fd00:10:250:1::<i>; kube-proxy serves both.
# Each node's containerd and kubelet also share a mount namespace of their own ($MNTNS_DIR/node<i>)
# in which the host paths they cannot be told to move (shim sockets, CNI result cache, device-plugin
# socket, container log links) are bind mounts of the node's own directories: nodes never collide.

K8S_VERSION=${K8S_VERSION:-v1.36.3}
LBSVC_CACHE=${LBSVC_CACHE:-$HOME/.cache/lbsvc-operator}
BIN=$LBSVC_CACHE/bin/$K8S_VERSION
CLUSTER_DIR=$LBSVC_CACHE/cluster
KUBECONFIG_PATH=$CLUSTER_DIR/kubeconfig
# The nodes' components reach the API server over the cluster network, not the host link.
NODE_KUBECONFIG=$CLUSTER_DIR/node-kubeconfig
PKI=$CLUSTER_DIR/pki
LOGS=$CLUSTER_DIR/logs
PIDS=$CLUSTER_DIR/pids
MNTNS_DIR=$CLUSTER_DIR/mntns

NODES=${NODES:-2}
MAX_NODES=3
UL_NS=lbsvc-ul
CLIENT_NS=lbsvc-client
HOST_VETH=lbsvc-h
CP_VETH=lbsvc-n
HOST_IP=10.250.0.1
# The API server as the host sees it (node 1's end of the host link) and as the cluster sees it.
CP_HOST_IP=10.250.0.2
API_IP=10.250.1.1
CLUSTER_NET=10.250.1.0/24
POD_SUPERNET=10.212.0.0/16
POD_BRIDGE=lbsvc-br0
SERVICE_CIDR=10.211.0.0/16
# The IPv6 Service range: /112, well within what kube-apiserver accepts for a family.
SERVICE_CIDR6=fd00:10:211::/112
POD_SUPERNET6=fd00:10:212::/48
CLIENT_ADDR=172.18.0.1/16
# The client also holds the gateways of a dual-stack underlay network beside the seed's IPv4 one, for
# Dual Subnets (172.19.0.0/16,fd00:172:19::/64): the IPv6 underlay of docs/demo-cluster.md "Dual stack walk-through".
CLIENT_ADDR_DUAL4=172.19.0.1/16
CLIENT_ADDR6=fd00:172:19::1/64
# Every node's cgroups live under this root, in every cgroup v1 hierarchy (no systemd here):
# <root>/node<i> is node i's kubelet cgroupRoot, <root>/node<i>/daemons (freezer) holds its
# containerd (and so the shims), kubelet and kube-proxy, so that one freezer write stops the node.
CGROUP_ROOT=lbsvc-cluster

node_name() { echo "lbsvc-node$1"; }
node_ns() { echo "lbsvc-node$1"; }
node_ip() { echo "10.250.1.$1"; }
node_ip6() { echo "fd00:10:250:1::$1"; }
pod_cidr() { echo "10.212.$1.0/24"; }
pod_gw() { echo "10.212.$1.1"; }
pod_cidr6() { echo "fd00:10:212:$1::/64"; }
pod_gw6() { echo "fd00:10:212:$1::1"; }
node_dir() { echo "$CLUSTER_DIR/node$1"; }
containerd_sock() { echo "$CLUSTER_DIR/node$1/containerd/containerd.sock"; }
freezer_dir() { echo "/sys/fs/cgroup/freezer/$CGROUP_ROOT/node$1"; }

# in_node I CMD...: run CMD in node I's network namespace (and its mount namespace once it exists).
in_node() {
  local i=$1; shift
  if [ -e "$MNTNS_DIR/node$i" ] && grep -q " $MNTNS_DIR/node$i " /proc/self/mounts; then
    nsenter --net="/run/netns/$(node_ns "$i")" --mount="$MNTNS_DIR/node$i" "$@"
  else
    nsenter --net="/run/netns/$(node_ns "$i")" "$@"
  fi
}
ctr_node() { local i=$1; shift; in_node "$i" ctr --address "$(containerd_sock "$i")" -n k8s.io "$@"; }
IN_UL="nsenter --net=/run/netns/$UL_NS"
IN_CLIENT="nsenter --net=/run/netns/$CLIENT_NS"

check_nodes() {
  case $NODES in
    1 | 2 | 3) ;;
    *) echo "NODES=$NODES: must be 1, 2 or $MAX_NODES" >&2; return 1 ;;
  esac
}

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# wait_for DESCRIPTION SECONDS CMD...: poll CMD every 0.2 s, fail loudly after SECONDS.
wait_for() {
  local what=$1 secs=$2; shift 2
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    if [ $SECONDS -ge $deadline ]; then
      log "timed out after ${secs}s waiting for $what"
      return 1
    fi
    sleep 0.2
  done
}

kc() { "$BIN/kubectl" --kubeconfig "$KUBECONFIG_PATH" "$@"; }

node_ready() {
  [ "$(kc get node "$(node_name "$1")" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]
}

# Host paths that kubelet (device plugins), containerd 1.6 (shim sockets) and libcni (result cache)
# use whatever they are configured with, and the kubelet's container log links. Inside a node's
# mount namespace each is a bind mount of $(node_dir I)/fixed/<name>; on the host only the empty
# mount points exist (up.sh creates them when absent, down.sh removes what it created).
FIXED_HOST_PATHS="/var/lib/kubelet/device-plugins /run/containerd/s /var/lib/cni /var/log/containers"
FIXED_HOST_DIRS="/var/lib/kubelet /run/containerd /var/lib/cni /var/log/containers"

# ticks PID...: the CPU ticks (utime + stime, getconf CLK_TCK a second) the given processes used so
# far, for the bench scripts (every node of the cluster is this machine's, so /proc sees them all).
ticks() {
  local t=0 p
  for p in "$@"; do
    if [ -r "/proc/$p/stat" ]; then t=$((t + $(awk '{print $14+$15}' "/proc/$p/stat" 2>/dev/null || echo 0))); fi
  done
  echo "$t"
}

# bench_namespace PREFIX, for the bench scripts that run on the cluster make demo left up: stops
# when no cluster is up, exports KUBECONFIG, sets K (kubectl) and NS (PREFIX-<pid>), creates NS,
# and deletes it without waiting when the script exits (cleanup, which a later trap may call too).
bench_namespace() {
  [ -f "$CLUSTER_DIR/nodes" ] || { echo "no cluster is up: run make demo first" >&2; exit 1; }
  export KUBECONFIG=$KUBECONFIG_PATH
  K="$BIN/kubectl"
  NS=$1-$$
  cleanup() { "$K" delete namespace "$NS" --wait=false >/dev/null 2>&1 || true; }
  trap cleanup EXIT
  "$K" create namespace "$NS" >/dev/null
}
