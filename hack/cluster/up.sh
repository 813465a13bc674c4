#!/usr/bin/env bash
# Brings up the demo / e2e cluster with NODES nodes (default 2, at most 3; topology in lib.sh):
# builds what it needs (cached), creates the network namespaces, the underlay and the node-to-node
# link, starts etcd and the control plane in node 1, and in every node containerd, kubelet,
# kube-proxy and Multus; imports the project's images, and installs the NetworkAttachmentDefinition
# CRD. Idempotent: on a cluster that is already up it only re-imports the images. After a failure,
# hack/cluster/down.sh removes whatever was made.
# Prints the kubeconfig path on stdout (the last line).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
. "$HERE/lib.sh"
T0=$SECONDS

[ "$(id -u)" = 0 ] || { echo "up.sh needs root (network namespaces, mounts, cgroups)" >&2; exit 1; }
check_nodes
# Debian packages: containerd runc containernetworking-plugins iptables conntrack util-linux
# (nsenter, unshare) iproute2 openssl curl. On a fresh machine, hack/install-deps.sh installs them.
deps_present() {
  local cmd
  for cmd in containerd runc ctr conntrack iptables nsenter unshare ip openssl curl; do
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

# import_images I: every image tarball into node I's containerd.
import_images() {
  local img
  for img in "$imagedir"/*.tar; do
    ctr_node "$1" images import --no-unpack=false "$img" >/dev/null
  done
}

# in_parallel FUNC: FUNC 1 .. FUNC NODES at once; fails if any failed. If up.sh is interrupted
# meanwhile, the subshells go with it (down.sh then removes the rest).
PARALLEL_PIDS=()
trap '[ ${#PARALLEL_PIDS[@]} -eq 0 ] || kill "${PARALLEL_PIDS[@]}" 2>/dev/null; exit 130' INT TERM
in_parallel() {
  local i rc=0
  PARALLEL_PIDS=()
  for i in $(seq "$NODES"); do "$1" "$i" & PARALLEL_PIDS+=($!); done
  for i in "${PARALLEL_PIDS[@]}"; do wait "$i" || rc=1; done
  PARALLEL_PIDS=()
  return $rc
}

all_nodes_ready() { local i; for i in $(seq "$NODES"); do node_ready "$i" || return 1; done; }

if [ -f "$CLUSTER_DIR/nodes" ] && [ -f "$PIDS/node1-kubelet.pid" ] && kill -0 "$(cat "$PIDS/node1-kubelet.pid")" 2>/dev/null; then
  up_nodes=$(cat "$CLUSTER_DIR/nodes")
  if [ "$up_nodes" = "$NODES" ] && all_nodes_ready; then
    log "cluster already up ($NODES nodes)"
    in_parallel import_images
    echo "$KUBECONFIG_PATH"
    exit 0
  fi
  log "a cluster with $up_nodes nodes (or not Ready) is up; NODES=$NODES: replacing it"
fi
if [ -e "$CLUSTER_DIR" ] || [ -e /run/netns/$UL_NS ] || [ -e /run/netns/$(node_ns 1) ]; then
  log "leftovers of an earlier cluster: tearing them down first"
  "$HERE/down.sh"
fi

on_error() {
  log "up failed; logs are in $LOGS (tails below). Run hack/cluster/down.sh to remove what was made."
  tail -n 5 "$LOGS"/*.log 2>/dev/null >&2 || true
}
trap on_error ERR

mkdir -p "$PKI" "$LOGS" "$PIDS" "$CLUSTER_DIR/manifests" "$MNTNS_DIR"
echo "$NODES" >"$CLUSTER_DIR/nodes"
# containerd names pod network namespaces /run/netns/cni-<uuid>: remember the ones that are not ours.
mkdir -p /run/netns
ls /run/netns | grep '^cni-' >"$CLUSTER_DIR/netns.before" || true
# Mount points of the fixed host paths: created when absent, and then removed by down.sh.
for d in $FIXED_HOST_DIRS; do [ -e "$d" ] || echo "$d"; done >"$CLUSTER_DIR/hostdirs.created"
for d in $FIXED_HOST_PATHS; do mkdir -p "$d"; done

# --- PKI: CA, API server serving cert, one system:masters client cert, service-account keys
(
  cd "$PKI"
  ossl() { openssl "$@" 2>/dev/null; }
  ossl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 30 -subj "/CN=lbsvc-demo-ca"
  ossl req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr -subj "/CN=kube-apiserver"
  printf 'subjectAltName=DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,IP:127.0.0.1,IP:%s,IP:%s,IP:%s\nextendedKeyUsage=serverAuth\n' \
    "$CP_HOST_IP" "$API_IP" "${SERVICE_CIDR%.0/16}.1" >san.ext
  ossl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out apiserver.crt -days 30 -extfile san.ext
  ossl req -newkey rsa:2048 -nodes -keyout admin.key -out admin.csr -subj "/O=system:masters/CN=lbsvc-admin"
  printf 'extendedKeyUsage=clientAuth\n' >client.ext
  ossl x509 -req -in admin.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out admin.crt -days 30 -extfile client.ext
  ossl genrsa -out sa.key 2048
  ossl rsa -in sa.key -pubout -out sa.pub
  rm -f ./*.csr
)
kubeconfig() { # kubeconfig SERVER-IP
  cat <<KC
apiVersion: v1
kind: Config
clusters:
- name: lbsvc-demo
  cluster: {server: "https://$1:6443", certificate-authority: "$PKI/ca.crt"}
users:
- name: lbsvc-admin
  user: {client-certificate: "$PKI/admin.crt", client-key: "$PKI/admin.key"}
contexts:
- name: lbsvc-demo
  context: {cluster: lbsvc-demo, user: lbsvc-admin}
current-context: lbsvc-demo
KC
}
kubeconfig "$CP_HOST_IP" >"$KUBECONFIG_PATH"
kubeconfig "$API_IP" >"$NODE_KUBECONFIG"

# --- network namespaces, links, addresses
ip netns add $UL_NS
ip netns add $CLIENT_NS
# Underlay and cluster network: two bridges in one "switch" namespace. A node's cables are its
# ports there (ul-node<i>, cn-node<i>); node.sh fail pulls them.
$IN_UL ip link set lo up
# Dumb switches: no multicast snooping, so IPv6 neighbour discovery (solicited-node multicast) and
# unsolicited NAs reach every port whether or not an MLD report was seen there.
for br in br0 cn0; do
  $IN_UL ip link add $br type bridge mcast_snooping 0
  $IN_UL ip link set $br up
done
$IN_UL ip link add ul-client type veth peer name eth0 netns $CLIENT_NS
$IN_UL ip link set ul-client master br0 up
$IN_CLIENT ip link set lo up
$IN_CLIENT ip addr add $CLIENT_ADDR dev eth0
$IN_CLIENT ip addr add $CLIENT_ADDR_DUAL4 dev eth0
# nodad: usable at once (nothing else on the underlay claims it).
$IN_CLIENT ip addr add $CLIENT_ADDR6 dev eth0 nodad
$IN_CLIENT ip link set eth0 up
for i in $(seq "$NODES"); do
  ns=$(node_ns "$i")
  ip netns add "$ns"
  in_node "$i" ip link set lo up
  # No default route in any node: a node reaches the other nodes, (node 1) the host's veth
  # address, and nothing else, so no packet of the cluster can leave this machine (and the host's
  # own forwarding stays as it is).
  in_node "$i" sysctl -qw net.ipv4.ip_forward=1
  in_node "$i" sysctl -qw net.ipv6.conf.all.forwarding=1
  in_node "$i" sysctl -qw net.bridge.bridge-nf-call-iptables=1
  in_node "$i" sysctl -qw net.bridge.bridge-nf-call-ip6tables=1
  $IN_UL ip link add "ul-node$i" type veth peer name eth0 netns "$ns"
  $IN_UL ip link add "cn-node$i" type veth peer name eth1 netns "$ns"
  $IN_UL ip link set "ul-node$i" master br0 up
  $IN_UL ip link set "cn-node$i" master cn0 up
  in_node "$i" ip link set eth0 up
  in_node "$i" ip addr add "$(node_ip "$i")/24" dev eth1
  in_node "$i" ip addr add "$(node_ip6 "$i")/64" dev eth1 nodad
  in_node "$i" ip link set eth1 up
  for j in $(seq "$NODES"); do
    [ "$j" = "$i" ] && continue
    in_node "$i" ip route add "$(pod_cidr "$j")" via "$(node_ip "$j")" dev eth1
    in_node "$i" ip -6 route add "$(pod_cidr6 "$j")" via "$(node_ip6 "$j")" dev eth1
  done
done
ip link add $HOST_VETH type veth peer name $CP_VETH netns "$(node_ns 1)"
ip addr add $HOST_IP/30 dev $HOST_VETH
ip link set $HOST_VETH up
in_node 1 ip addr add $CP_HOST_IP/30 dev $CP_VETH
in_node 1 ip link set $CP_VETH up
log "network namespaces ready: $(ip netns list | awk '/^lbsvc-/ {print $1}' | sort | tr '\n' ' ')"

# --- mount namespaces: one per node, holding the node's own copies of the fixed host paths. The
# namespace files need a mount whose propagation is not shared.
mount --bind "$MNTNS_DIR" "$MNTNS_DIR"
mount --make-private "$MNTNS_DIR"
for i in $(seq "$NODES"); do
  nd=$(node_dir "$i")
  binds=""
  for d in $FIXED_HOST_PATHS; do
    src=$nd/fixed/$(basename "$d")
    mkdir -p "$src"
    binds="$binds mount --bind '$src' '$d' &&"
  done
  touch "$MNTNS_DIR/node$i"
  # slave: mounts made in the node (pod netns, volumes, container rootfs) stay in it and vanish
  # with it; the host's later mounts still reach it.
  unshare --mount="$MNTNS_DIR/node$i" --propagation slave sh -c "$binds true"
done

# --- configuration files (per node)
write_node_config() {
  local i=$1 nd name ip
  nd=$(node_dir "$i") name=$(node_name "$i") ip=$(node_ip "$i")
  mkdir -p "$nd"/{cni/net.d,cni/bin,cni/ipam,cni/multus,kubelet,pod-logs,containerd}
  cp /usr/lib/cni/* "$nd/cni/bin/"
  cp "$BIN/multus" "$nd/cni/bin/multus"
  local bridge_conf
  bridge_conf=$(cat <<JSON
{
  "cniVersion": "1.0.0",
  "name": "lbsvc-podnet",
  "plugins": [
    {"type": "bridge", "bridge": "$POD_BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local",
              "ranges": [[{"subnet": "$(pod_cidr "$i")", "gateway": "$(pod_gw "$i")"}],
                         [{"subnet": "$(pod_cidr6 "$i")", "gateway": "$(pod_gw6 "$i")"}]],
              "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}], "dataDir": "$nd/cni/ipam"}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
JSON
)
  # Multus (thin plugin) as the node's CNI: the bridge is the primary network, NADs add net1.
  cat >"$nd/cni/net.d/00-multus.conf" <<JSON
{
  "cniVersion": "1.0.0",
  "name": "multus-cni-network",
  "type": "multus",
  "kubeconfig": "$NODE_KUBECONFIG",
  "cniDir": "$nd/cni/multus",
  "binDir": "$nd/cni/bin",
  "confDir": "$nd/cni/net.d",
  "logFile": "$LOGS/node$i-multus.log",
  "logLevel": "verbose",
  "delegates": [ $bridge_conf ]
}
JSON
  cat >"$nd/containerd.toml" <<TOML
version = 2
root = "$nd/containerd/root"
state = "$nd/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "$(containerd_sock "$i")"
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
          Root = "$nd/containerd/runc"
          BinaryName = "$(command -v runc)"
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "$nd/cni/bin"
      conf_dir = "$nd/cni/net.d"
  [plugins."io.containerd.internal.v1.opt"]
    path = "$nd/containerd/opt"
TOML
  cat >"$nd/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
# Each node its own cgroupRoot: a kubelet removes pod cgroups it does not know under its root.
cgroupRoot: /$CGROUP_ROOT/node$i
# This host is cgroup v1 without systemd.
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://$(containerd_sock "$i")
address: $ip
readOnlyPort: 0
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
clusterDomain: cluster.local
clusterDNS: [${SERVICE_CIDR%.0/16}.10]
resolvConf: /etc/resolv.conf
podLogsDir: $nd/pod-logs
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
  cat >"$nd/kube-proxy.yaml" <<YAML
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $NODE_KUBECONFIG}
mode: iptables
clusterCIDR: $POD_SUPERNET,$POD_SUPERNET6
hostnameOverride: $name
bindAddress: $ip
healthzBindAddress: $ip:10256
metricsBindAddress: $ip:10249
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
# A changed Service port reaches the node's rules promptly (the e2e tests want it live within 1 s).
iptables: {minSyncPeriod: 100ms}
YAML
}
for i in $(seq "$NODES"); do write_node_config "$i"; done

# start NAME CMD...: run CMD in node 1's netns (the control plane) in the background.
start() {
  local name=$1; shift
  nsenter --net="/run/netns/$(node_ns 1)" "$@" >"$LOGS/$name.log" 2>&1 &
  echo $! >"$PIDS/$name.pid"
}
# start_on I NAME CMD...: run CMD in node I's network and mount namespaces, inside the node's
# freezer cgroup (node.sh fail freezes it), in the background; log and pid under the run dir.
start_on() {
  local i=$1 name=$2; shift 2
  # shellcheck disable=SC2016 # $$ and $@ belong to the inner shell
  sh -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$(freezer_dir "$i")/daemons" \
    nsenter --net="/run/netns/$(node_ns "$i")" --mount="$MNTNS_DIR/node$i" "$@" >"$LOGS/node$i-$name.log" 2>&1 &
  echo $! >"$PIDS/node$i-$name.pid"
}

# --- cgroups: the kubelets' cgroupRoots must exist beforehand in every v1 hierarchy (cpuset
# values copied down); the daemons' freezer cgroups beside them.
for h in /sys/fs/cgroup/*/; do
  [ -f "$h/cgroup.procs" ] || continue
  for d in "$CGROUP_ROOT" $(for i in $(seq "$NODES"); do echo "$CGROUP_ROOT/node$i"; done); do
    mkdir -p "$h/$d"
    if [ -f "$h/cpuset.cpus" ] && [ ! -s "$h/$d/cpuset.cpus" ]; then
      cat "$h/cpuset.cpus" >"$h/$d/cpuset.cpus"
      cat "$h/cpuset.mems" >"$h/$d/cpuset.mems"
    fi
  done
done
for i in $(seq "$NODES"); do mkdir -p "$(freezer_dir "$i")/daemons"; done

# --- control plane (node 1)
start etcd "$BIN/etcd" --data-dir "$CLUSTER_DIR/etcd" --name default --unsafe-no-fsync=true \
  --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
  --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
  --initial-cluster default=http://127.0.0.1:2380 --listen-metrics-urls=
# containerd of every node meanwhile: importing the images takes a few seconds per node.
for i in $(seq "$NODES"); do start_on "$i" containerd containerd --config "$(node_dir "$i")/containerd.toml"; done
wait_for "etcd" 60 in_node 1 curl -sf http://127.0.0.1:2379/health
log "etcd up ($((SECONDS - T0))s)"
start apiserver "$BIN/kube-apiserver" --etcd-servers=http://127.0.0.1:2379 \
  --bind-address=0.0.0.0 --secure-port=6443 --advertise-address=$API_IP \
  --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" --client-ca-file="$PKI/ca.crt" \
  --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --service-cluster-ip-range=$SERVICE_CIDR,$SERVICE_CIDR6 --authorization-mode=Node,RBAC --allow-privileged=true \
  --kubelet-client-certificate="$PKI/admin.crt" --kubelet-client-key="$PKI/admin.key" \
  --kubelet-preferred-address-types=InternalIP,Hostname
node_images() {
  wait_for "containerd of node $1" 60 ctr_node "$1" version
  import_images "$1"
}
in_parallel node_images
log "containerd up and images imported on $NODES nodes: $(ctr_node 1 images ls -q | grep -v '^sha256:' | tr '\n' ' ')"
wait_for "kube-apiserver /readyz" 120 curl -sf --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" "https://$CP_HOST_IP:6443/readyz"
log "kube-apiserver ready ($((SECONDS - T0))s)"
start controller-manager "$BIN/kube-controller-manager" --kubeconfig="$KUBECONFIG_PATH" \
  --authentication-kubeconfig="$KUBECONFIG_PATH" --authorization-kubeconfig="$KUBECONFIG_PATH" \
  --leader-elect=false --service-account-private-key-file="$PKI/sa.key" --root-ca-file="$PKI/ca.crt" \
  --cluster-signing-cert-file="$PKI/ca.crt" --cluster-signing-key-file="$PKI/ca.key" \
  --use-service-account-credentials=false --bind-address=127.0.0.1 --secure-port=10257
start scheduler "$BIN/kube-scheduler" --kubeconfig="$KUBECONFIG_PATH" \
  --authentication-kubeconfig="$KUBECONFIG_PATH" --authorization-kubeconfig="$KUBECONFIG_PATH" \
  --leader-elect=false --bind-address=127.0.0.1 --secure-port=10259

# --- kubelet and kube-proxy of every node
for i in $(seq "$NODES"); do
  nd=$(node_dir "$i")
  start_on "$i" kubelet "$BIN/kubelet" --config="$nd/kubelet.yaml" --kubeconfig="$NODE_KUBECONFIG" \
    --root-dir="$nd/kubelet" --cert-dir="$nd/kubelet/pki" --hostname-override="$(node_name "$i")" \
    --node-ip="$(node_ip "$i"),$(node_ip6 "$i")" --v=1
  start_on "$i" kube-proxy "$BIN/kube-proxy" --config="$nd/kube-proxy.yaml"
done
wait_node() { wait_for "node $(node_name "$1") Ready" 120 node_ready "$1"; }
in_parallel wait_node
log "$NODES nodes Ready ($((SECONDS - T0))s)"
wait_for "default ServiceAccount" 60 kc -n default get serviceaccount default
kc apply -f "$HERE/manifests/nad-crd.yaml" >/dev/null
kc wait --for=condition=Established --timeout=60s crd/network-attachment-definitions.k8s.cni.cncf.io >/dev/null
log "cluster up with $NODES nodes in $((SECONDS - T0))s; export KUBECONFIG=$KUBECONFIG_PATH"
echo "$KUBECONFIG_PATH"
