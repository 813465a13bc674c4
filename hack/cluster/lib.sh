# Shared names, paths and helpers of the demo / e2e cluster. Sourced by up.sh, down.sh, demo.sh
# and e2e.sh; the Go e2e tests use the same names (test/e2e/cluster_test.go).
#
# Topology (everything in network namespaces of its own; nothing routes to the outside world):
#   host netns       lbsvc-h 10.250.0.1/30  (only to reach the API server; host forwarding untouched)
#   netns lbsvc-node lbsvc-n 10.250.0.2/30  etcd, kube-apiserver :6443, controller-manager, scheduler,
#                                           containerd, kubelet, kube-proxy; pods on bridge lbsvc-br0
#                                           10.212.0.0/24; Services 10.211.0.0/16; NO default route
#                    eth0 (veth)            the macvlan master the seed's NAD names (master: eth0)
#   netns lbsvc-ul   br0                    the underlay L2 segment: ports ul-node, ul-client
#   netns lbsvc-client eth0 172.18.0.1/16   "the outside world": the Subnet's gateway; curl runs here

K8S_VERSION=${K8S_VERSION:-v1.36.3}
LBSVC_CACHE=${LBSVC_CACHE:-$HOME/.cache/lbsvc-operator}
BIN=$LBSVC_CACHE/bin/$K8S_VERSION
CLUSTER_DIR=$LBSVC_CACHE/cluster
KUBECONFIG_PATH=$CLUSTER_DIR/kubeconfig
PKI=$CLUSTER_DIR/pki
LOGS=$CLUSTER_DIR/logs
PIDS=$CLUSTER_DIR/pids

NODE_NS=lbsvc-node
UL_NS=lbsvc-ul
CLIENT_NS=lbsvc-client
NODE_NAME=lbsvc-node
HOST_VETH=lbsvc-h
NODE_VETH=lbsvc-n
HOST_IP=10.250.0.1
NODE_IP=10.250.0.2
POD_CIDR=10.212.0.0/24
POD_GW=10.212.0.1
POD_BRIDGE=lbsvc-br0
SERVICE_CIDR=10.211.0.0/16
CLIENT_ADDR=172.18.0.1/16
# The kubelet's cgroupRoot, created in every cgroup v1 hierarchy (no systemd here).
CGROUP_ROOT=lbsvc-cluster

IN_NODE="nsenter --net=/run/netns/$NODE_NS"
IN_UL="nsenter --net=/run/netns/$UL_NS"
IN_CLIENT="nsenter --net=/run/netns/$CLIENT_NS"
CONTAINERD_SOCK=$CLUSTER_DIR/containerd/containerd.sock
CTR="ctr --address $CONTAINERD_SOCK -n k8s.io"

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

# Host paths that kubelet (device plugins), containerd 1.6 (shim sockets) and libcni (result cache)
# use whatever they are configured with, and the kubelet's container log links.
FIXED_HOST_DIRS="/var/lib/kubelet /run/containerd /var/lib/cni /var/log/containers"
