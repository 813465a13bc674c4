#!/usr/bin/env bash
# Brings up the single-node demo / e2e cluster (topology in lib.sh): builds what it needs (cached),
# creates the network namespaces and the underlay, starts etcd, the control plane, containerd,
# kubelet and kube-proxy inside netns lbsvc-node, imports the project's images, and installs the
# NetworkAttachmentDefinition CRD. Idempotent: on a cluster that is already up it only re-imports
# the images. After a failure, hack/cluster/down.sh removes whatever was made.
# Prints the kubeconfig path on stdout (the last line).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
. "$HERE/lib.sh"
T0=$SECONDS

[ "$(id -u)" = 0 ] || { echo "up.sh needs root (network namespaces, mounts, cgroups)" >&2; exit 1; }
# Debian packages: containerd runc containernetworking-plugins iptables conntrack util-linux
# (nsenter) iproute2 openssl curl. On a fresh machine, hack/install-deps.sh installs them.
deps_present() {
  local cmd
  for cmd in containerd runc ctr conntrack iptables nsenter ip openssl curl; do
    command -v $cmd >/dev/null || { echo "missing command: $cmd" >&2; return 1; }
  done
  [ -x /usr/lib/cni/bridge ] && [ -x /usr/lib/cni/macvlan ] && [ -x /usr/lib/cni/host-local ] ||
    { echo "missing CNI plugins in /usr/lib/cni" >&2; return 1; }
}
if ! deps_present; then
  log "installing the Debian packages the cluster needs (hack/install-deps.sh)"
  "$ROOT/hack/install-deps.sh" >&2
  deps_present
fi

# --- build (cached: a second run rebuilds nothing)
bindir=$("$ROOT/hack/build-tools.sh" cluster | tail -1)
[ "$bindir" = "$BIN" ] || { echo "build-tools.sh put binaries in $bindir, expected $BIN" >&2; exit 1; }
imagedir=$("$ROOT/hack/images.sh" | tail -1)
log "binaries and images ready ($((SECONDS - T0))s)"

node_ready() {
  [ "$(kc get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]
}

import_images() {
  local img
  for img in "$imagedir"/*.tar; do
    $IN_NODE $CTR images import --no-unpack=false "$img" >/dev/null
  done
  log "images: $($IN_NODE $CTR images ls -q | grep -v '^sha256:' | tr '\n' ' ')"
}

if [ -f "$PIDS/kubelet.pid" ] && kill -0 "$(cat "$PIDS/kubelet.pid")" 2>/dev/null && node_ready; then
  log "cluster already up"
  import_images
  echo "$KUBECONFIG_PATH"
  exit 0
fi
if [ -e "$CLUSTER_DIR" ] || [ -e /run/netns/$NODE_NS ]; then
  log "leftovers of an earlier cluster: tearing them down first"
  "$HERE/down.sh"
fi

on_error() {
  log "up failed; logs are in $LOGS (tails below). Run hack/cluster/down.sh to remove what was made."
  tail -n 5 "$LOGS"/*.log 2>/dev/null >&2 || true
}
trap on_error ERR

mkdir -p "$PKI" "$LOGS" "$PIDS" "$CLUSTER_DIR"/{cni/net.d,cni/bin,cni/ipam,cni/multus,manifests,kubelet,pod-logs,containerd}
# containerd names pod network namespaces /run/netns/cni-<uuid>: remember the ones that are not ours.
mkdir -p /run/netns
ls /run/netns | grep '^cni-' >"$CLUSTER_DIR/netns.before" || true
# A few host paths are fixed in kubelet, containerd 1.6 and libcni whatever the configuration; down.sh
# removes those directories only if they did not exist before.
for d in $FIXED_HOST_DIRS; do [ -e "$d" ] || echo "$d"; done >"$CLUSTER_DIR/hostdirs.created"

# --- PKI: CA, API server serving cert, one system:masters client cert, service-account keys
(
  cd "$PKI"
  ossl() { openssl "$@" 2>/dev/null; }
  ossl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 30 -subj "/CN=lbsvc-demo-ca"
  ossl req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr -subj "/CN=kube-apiserver"
  printf 'subjectAltName=DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,IP:127.0.0.1,IP:%s,IP:%s\nextendedKeyUsage=serverAuth\n' \
    "$NODE_IP" "${SERVICE_CIDR%.0/16}.1" >san.ext
  ossl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out apiserver.crt -days 30 -extfile san.ext
  ossl req -newkey rsa:2048 -nodes -keyout admin.key -out admin.csr -subj "/O=system:masters/CN=lbsvc-admin"
  printf 'extendedKeyUsage=clientAuth\n' >client.ext
  ossl x509 -req -in admin.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out admin.crt -days 30 -extfile client.ext
  ossl genrsa -out sa.key 2048
  ossl rsa -in sa.key -pubout -out sa.pub
  rm -f ./*.csr
)
cat >"$KUBECONFIG_PATH" <<KC
apiVersion: v1
kind: Config
clusters:
- name: lbsvc-demo
  cluster: {server: "https://$NODE_IP:6443", certificate-authority: "$PKI/ca.crt"}
users:
- name: lbsvc-admin
  user: {client-certificate: "$PKI/admin.crt", client-key: "$PKI/admin.key"}
contexts:
- name: lbsvc-demo
  context: {cluster: lbsvc-demo, user: lbsvc-admin}
current-context: lbsvc-demo
KC

# --- network namespaces, links, addresses
ip netns add $NODE_NS
ip netns add $UL_NS
ip netns add $CLIENT_NS
ip link add $HOST_VETH type veth peer name $NODE_VETH netns $NODE_NS
ip addr add $HOST_IP/30 dev $HOST_VETH
ip link set $HOST_VETH up
$IN_NODE ip link set lo up
$IN_NODE ip addr add $NODE_IP/30 dev $NODE_VETH
$IN_NODE ip link set $NODE_VETH up
# No default route in the node: it can reach the host's veth address and nothing else, so no
# packet of the cluster can leave this machine (and the host's own forwarding stays as it is).
$IN_NODE sysctl -qw net.ipv4.ip_forward=1
$IN_NODE sysctl -qw net.bridge.bridge-nf-call-iptables=1
$IN_NODE sysctl -qw net.bridge.bridge-nf-call-ip6tables=1
# Underlay: a bridge in its own netns; the node's "eth0" (macvlan master) and the client hang on it.
$IN_UL ip link set lo up
$IN_UL ip link add br0 type bridge
$IN_UL ip link set br0 up
$IN_UL ip link add ul-node type veth peer name eth0 netns $NODE_NS
$IN_UL ip link add ul-client type veth peer name eth0 netns $CLIENT_NS
for p in ul-node ul-client; do $IN_UL ip link set $p master br0 up; done
$IN_NODE ip link set eth0 up
$IN_CLIENT ip link set lo up
$IN_CLIENT ip addr add $CLIENT_ADDR dev eth0
$IN_CLIENT ip link set eth0 up
log "network namespaces $NODE_NS, $UL_NS, $CLIENT_NS ready"

# --- configuration files
cp /usr/lib/cni/* "$CLUSTER_DIR/cni/bin/"
cp "$BIN/multus" "$CLUSTER_DIR/cni/bin/multus"
bridge_conf=$(cat <<JSON
{
  "cniVersion": "1.0.0",
  "name": "lbsvc-podnet",
  "plugins": [
    {"type": "bridge", "bridge": "$POD_BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$POD_GW"}]],
              "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "$CLUSTER_DIR/cni/ipam"}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
JSON
)
# Multus (thin plugin) as the node's CNI: the bridge is the primary network, NADs add net1.
cat >"$CLUSTER_DIR/cni/net.d/00-multus.conf" <<JSON
{
  "cniVersion": "1.0.0",
  "name": "multus-cni-network",
  "type": "multus",
  "kubeconfig": "$KUBECONFIG_PATH",
  "cniDir": "$CLUSTER_DIR/cni/multus",
  "binDir": "$CLUSTER_DIR/cni/bin",
  "confDir": "$CLUSTER_DIR/cni/net.d",
  "logFile": "$LOGS/multus.log",
  "logLevel": "verbose",
  "delegates": [ $bridge_conf ]
}
JSON
cat >"$CLUSTER_DIR/containerd.toml" <<TOML
version = 2
root = "$CLUSTER_DIR/containerd/root"
state = "$CLUSTER_DIR/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "$CONTAINERD_SOCK"
[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "localhost/lbsvc-pause:dev"
    enable_cdi = false
    # No CAP_SYS_RESOURCE here: the sandbox's default oom_score_adj (-998) cannot be set, and
    # runc then fails every sandbox with "can't get final child's PID from pipe".
    restrict_oom_score_adj = true
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "overlayfs"
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          SystemdCgroup = false
          Root = "$CLUSTER_DIR/containerd/runc"
          BinaryName = "$(command -v runc)"
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "$CLUSTER_DIR/cni/bin"
      conf_dir = "$CLUSTER_DIR/cni/net.d"
  [plugins."io.containerd.internal.v1.opt"]
    path = "$CLUSTER_DIR/containerd/opt"
TOML
cat >"$CLUSTER_DIR/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
cgroupRoot: /$CGROUP_ROOT
# This host is cgroup v1 without systemd.
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://$CONTAINERD_SOCK
address: $NODE_IP
readOnlyPort: 0
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
clusterDomain: cluster.local
clusterDNS: [${SERVICE_CIDR%.0/16}.10]
resolvConf: /etc/resolv.conf
podLogsDir: $CLUSTER_DIR/pod-logs
staticPodPath: $CLUSTER_DIR/manifests
# Pod network namespaces inherit IPv4 forwarding=0 from this host and their /proc/sys is
# read-only: the lb pod sets forwarding through its securityContext, which needs these allowed.
allowedUnsafeSysctls: ["net.ipv4.ip_forward", "net.ipv6.conf.all.forwarding"]
evictionHard: {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%", "nodefs.inodesFree": "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
syncFrequency: 10s
fileCheckFrequency: 5s
nodeStatusUpdateFrequency: 5s
YAML
cat >"$CLUSTER_DIR/kube-proxy.yaml" <<YAML
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $KUBECONFIG_PATH}
mode: iptables
clusterCIDR: $POD_CIDR
hostnameOverride: $NODE_NAME
bindAddress: $NODE_IP
healthzBindAddress: $NODE_IP:10256
metricsBindAddress: $NODE_IP:10249
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
# A changed Service port reaches the node's rules promptly (the e2e tests want it live within 1 s).
iptables: {minSyncPeriod: 100ms}
YAML

# start NAME CMD...: run CMD in the node netns in the background, log and pid under the run dir.
start() {
  local name=$1; shift
  $IN_NODE "$@" >"$LOGS/$name.log" 2>&1 &
  echo $! >"$PIDS/$name.pid"
}

# --- control plane
start etcd "$BIN/etcd" --data-dir "$CLUSTER_DIR/etcd" --name default --unsafe-no-fsync=true \
  --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
  --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
  --initial-cluster default=http://127.0.0.1:2380 --listen-metrics-urls=
wait_for "etcd" 60 $IN_NODE curl -sf http://127.0.0.1:2379/health
log "etcd up ($((SECONDS - T0))s)"
start apiserver "$BIN/kube-apiserver" --etcd-servers=http://127.0.0.1:2379 \
  --bind-address=0.0.0.0 --secure-port=6443 --advertise-address=$NODE_IP \
  --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" --client-ca-file="$PKI/ca.crt" \
  --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --service-cluster-ip-range=$SERVICE_CIDR --authorization-mode=Node,RBAC --allow-privileged=true \
  --kubelet-client-certificate="$PKI/admin.crt" --kubelet-client-key="$PKI/admin.key" \
  --kubelet-preferred-address-types=InternalIP,Hostname
wait_for "kube-apiserver /readyz" 120 curl -sf --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" "https://$NODE_IP:6443/readyz"
log "kube-apiserver ready ($((SECONDS - T0))s)"
start controller-manager "$BIN/kube-controller-manager" --kubeconfig="$KUBECONFIG_PATH" \
  --authentication-kubeconfig="$KUBECONFIG_PATH" --authorization-kubeconfig="$KUBECONFIG_PATH" \
  --leader-elect=false --service-account-private-key-file="$PKI/sa.key" --root-ca-file="$PKI/ca.crt" \
  --cluster-signing-cert-file="$PKI/ca.crt" --cluster-signing-key-file="$PKI/ca.key" \
  --use-service-account-credentials=false --bind-address=127.0.0.1 --secure-port=10257
start scheduler "$BIN/kube-scheduler" --kubeconfig="$KUBECONFIG_PATH" \
  --authentication-kubeconfig="$KUBECONFIG_PATH" --authorization-kubeconfig="$KUBECONFIG_PATH" \
  --leader-elect=false --bind-address=127.0.0.1 --secure-port=10259

# --- containerd, images
start containerd containerd --config "$CLUSTER_DIR/containerd.toml"
wait_for "containerd" 60 $IN_NODE $CTR version
import_images

# --- kubelet: its cgroupRoot must exist beforehand in every v1 hierarchy (cpuset values copied)
for h in /sys/fs/cgroup/*/; do
  [ -f "$h/cgroup.procs" ] || continue
  mkdir -p "$h/$CGROUP_ROOT"
  if [ -f "$h/cpuset.cpus" ] && [ ! -s "$h/$CGROUP_ROOT/cpuset.cpus" ]; then
    cat "$h/cpuset.cpus" >"$h/$CGROUP_ROOT/cpuset.cpus"
    cat "$h/cpuset.mems" >"$h/$CGROUP_ROOT/cpuset.mems"
  fi
done
start kubelet "$BIN/kubelet" --config="$CLUSTER_DIR/kubelet.yaml" --kubeconfig="$KUBECONFIG_PATH" \
  --root-dir="$CLUSTER_DIR/kubelet" --cert-dir="$CLUSTER_DIR/kubelet/pki" --hostname-override=$NODE_NAME --node-ip=$NODE_IP --v=1
start kube-proxy "$BIN/kube-proxy" --config="$CLUSTER_DIR/kube-proxy.yaml"
wait_for "node $NODE_NAME Ready" 120 node_ready
log "node $NODE_NAME Ready ($((SECONDS - T0))s)"
wait_for "default ServiceAccount" 60 kc -n default get serviceaccount default
kc apply -f "$HERE/manifests/nad-crd.yaml" >/dev/null
kc wait --for=condition=Established --timeout=60s crd/network-attachment-definitions.k8s.cni.cncf.io >/dev/null
log "cluster up in $((SECONDS - T0))s; export KUBECONFIG=$KUBECONFIG_PATH"
echo "$KUBECONFIG_PATH"
