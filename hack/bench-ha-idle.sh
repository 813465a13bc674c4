#!/usr/bin/env bash
# Steady-state API writes of standby lb pods, on the running local cluster (make demo): creates N
# Services (default 50) with two lb pods each, waits until every one has an active and a standby,
# then counts for WINDOW seconds (default 60):
#   - the writes of the lb pods: their rights (ClusterRole lbsvc-lbpod, narrowed by the Lease
#     admission policy) allow only creating and updating their Service's Lease, so every write
#     shows as a new resourceVersion of a lb-svc-* Lease;
#   - every write the API server served, from its apiserver_request_total counters, for scale
#     (node heartbeats, the operator's leader election, the scheduler's and controller manager's);
#   - per lb pod process, by role (active: it holds an address on net1): RSS, PSS and private
#     memory, and CPU per minute over the window (from /proc: every node is this machine's);
#   - the CPU of the kubelets (which probe every lb pod) and of the API server over the window.
# With MASS_FAIL=1 it first moves every active lb pod to node 2 (below), and after the window
# fails node 2 (hack/cluster/node.sh fail: frozen, cables pulled) with all of them, while a client
# loop in the client's network namespace (test/bench/probe) opens a TCP connection to every
# Service every 100 ms, and prints
# the longest time without an answer per Service: p50 / p95 / max over the Services whose active
# was on node 2, and the max over the others (the baseline of the same run: what the probe itself
# sees without a failover). The node is recovered afterwards. The Services' backend runs on node 1
# (the control plane's node, which is never failed), so only the lb pods fail over.
# Prints `figure:` lines, then deletes the Services. Not part of `make test`.
#
# Usage: hack/bench-ha-idle.sh [N]   (WINDOW=60, BATCH=10, MASS_FAIL=0)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/cluster/lib.sh"
N=${1:-50}
WINDOW=${WINDOW:-60}
bench_namespace bench-ha
# The client loop of MASS_FAIL, built now: a build between the idle window and the failure took
# both cores for seconds, starved the lb pods into takeovers and stretched every election's slack
# just before the node failed.
[ "${MASS_FAIL:-0}" != 1 ] || (cd "$HERE/.." && go build -o "$CLUSTER_DIR/probe" ./test/bench/probe)
# The backend of every Service, pinned to node 1.
"$K" apply -f - >/dev/null <<EOF
apiVersion: apps/v1
kind: Deployment
metadata: {name: echo, namespace: $NS}
spec:
  replicas: 1
  selector: {matchLabels: {app: dynamic}}
  template:
    metadata: {labels: {app: dynamic}}
    spec:
      nodeSelector: {kubernetes.io/hostname: $(node_name 1)}
      containers: [{name: echo, image: localhost/lbsvc-echo:dev, imagePullPolicy: IfNotPresent}]
EOF
service() {
  cat <<EOF
---
apiVersion: v1
kind: Service
metadata:
  name: ha$1
  namespace: $NS
  annotations:
    ovn.kubernetes.io/attachmentprovider: lb-svc-attachment.kube-system
    lbsvc.io/replicas: "2"
spec:
  type: LoadBalancer
  selector: {app: dynamic}
  ports: [{name: http, port: 80, targetPort: 80, protocol: TCP}]
EOF
}
# settled M: M Services show an active lb pod (their Lease names a holder the operator found).
settled() {
  local n
  n=$("$K" -n "$NS" get service -o jsonpath='{range .items[*]}{.metadata.annotations.lbsvc\.io/active-node}{"\n"}{end}' | grep -c . || true)
  [ "$n" -ge "$1" ]
}
transitions() { "$K" -n "$NS" get lease -o jsonpath='{range .items[*]}{.spec.leaseTransitions}{"\n"}{end}' | awk '{s += $1} END {print s + 0}'; }
calm() {
  local last now since=$SECONDS
  last=$(transitions)
  for _ in $(seq 1 120); do
    sleep 5
    now=$(transitions)
    if [ "$now" != "$last" ]; then last=$now; since=$SECONDS; fi
    if [ $((SECONDS - since)) -ge "${CALM:-20}" ]; then
      echo "batch up to $1: calm at $(cut -d' ' -f1 /proc/loadavg) load, $now Lease transitions so far, $((SECONDS - t0)) s"
      return 0
    fi
  done
  echo "batch up to $1: Leases still changing after 600 s ($now transitions)"
}
# In batches (BATCH, default 10): two lb pods start per Service, and a 2-core machine that
# starts a hundred pods at once starves them all (the elections' 300 ms dead interval with it).
t0=$SECONDS
created=0
while [ "$created" -lt "$N" ]; do
  upto=$((created + ${BATCH:-10}))
  [ "$upto" -le "$N" ] || upto=$N
  for i in $(seq $((created + 1)) "$upto"); do service "$i"; done | "$K" apply -f - >/dev/null
  created=$upto
  for _ in $(seq 1 600); do settled "$created" && break; sleep 1; done
  settled "$created" || { echo "only some of $created Services have an active lb pod after 600 s" >&2; exit 1; }
  # And calm: no Lease written for CALM seconds (default 20), up to 600 s, before the next batch,
  # so that each batch starts on a node that has finished starting the last one.
  calm "$created"
done
# MASS_FAIL=1: before the idle window, every active onto node 2, so that the failure takes them
# all: each Service whose active lb pod is on node 1 loses that pod (a graceful delete: it hands
# over to its standby on node 2, and the Deployment's replacement starts on node 1 as a standby),
# 10 Services at a time, each batch followed by calm.
if [ "${MASS_FAIL:-0}" = 1 ]; then
  on_node1() { "$K" -n "$NS" get service -o jsonpath='{range .items[*]}{.metadata.annotations.lbsvc\.io/active-pod} {.metadata.annotations.lbsvc\.io/active-node}{"\n"}{end}' | awk -v n="$(node_name 1)" '$2 == n {sub(".*/", "", $1); print $1}'; }
  for _ in $(seq 1 $((N / 10 + 5))); do
    pods=$(on_node1 | head -10)
    [ -n "$pods" ] || break
    # --ignore-not-found: the active-pod annotation may still name a pod that is gone.
    # shellcheck disable=SC2086 # one argument per pod
    "$K" -n "$NS" delete pod --wait=false --ignore-not-found $pods >/dev/null
    for _ in $(seq 1 60); do
      [ -z "$(comm -12 <(echo "$pods" | sort) <(on_node1 | sort))" ] && break
      sleep 1
    done
    calm "$N (actives moved to $(node_name 2))"
  done
  echo "actives left on $(node_name 1): $(on_node1 | wc -l)"
fi
echo "figure: ha_idle_services=$N lb_pods=$("$K" -n "$NS" get pod -l lbsvc.io/service --no-headers | grep -c Running) settled_in_s=$((SECONDS - t0)) lease_transitions_while_starting=$(transitions)"

# lbpod_stats: one line per lb pod process of the cluster (all nodes are this machine's network
# namespaces): pid, role (active: a global address on its net1), RSS, PSS and private kB (the
# binary's clean pages are shared by every lb pod of a node: RSS counts them in each, PSS shares
# them out, private is what one more lb pod costs), and CPU ticks used so far (utime + stime).
lbpod_stats() {
  local p role
  for p in $(pgrep -f '^/usr/local/bin/lbpod'); do
    role=standby
    if nsenter -t "$p" -n ip -o addr show dev net1 2>/dev/null | grep -q 'scope global'; then role=active; fi
    awk -v p="$p" -v role="$role" '/^Rss:/ {r = $2} /^Pss:/ {s = $2} /^Private_(Clean|Dirty):/ {v += $2}
      END {printf "%s %s %d %d %d ", p, role, r, s, v}' "/proc/$p/smaps_rollup" 2>/dev/null || continue
    ticks "$p"
  done
}
# role_figures BEFORE AFTER SECONDS: per role, the mean memory (from AFTER) and CPU per minute.
role_figures() {
  awk -v secs="$3" -v hz="$(getconf CLK_TCK)" 'NR == FNR {t[$1] = $6; next}
    ($1 in t) {n[$2]++; rss[$2] += $3; pss[$2] += $4; priv[$2] += $5; cpu[$2] += $6 - t[$1]}
    END {for (k in n) printf "figure: lbpod_%s n=%d rss_mib=%.1f pss_mib=%.1f private_mib=%.1f cpu_ms_per_min=%.0f\n",
      k, n[k], rss[k] / n[k] / 1024, pss[k] / n[k] / 1024, priv[k] / n[k] / 1024, cpu[k] / n[k] * 1000 / hz * 60 / secs}' "$1" "$2" | sort
}
leases() { "$K" -n "$NS" get lease -o jsonpath='{range .items[*]}{.metadata.name}={.metadata.resourceVersion}{"\n"}{end}' | sort; }
# writes_by: the API server's writes so far by resource (group/resource[/subresource]), one
# "resource count" per line: who wrote in the window shows in what was written (the lb pods may
# write only their Lease; the operator its IPs, Subnets, Services' status, Deployments, budgets,
# Secrets, Events and identities; the nodes their Leases and status).
writes_by() {
  "$K" get --raw /metrics | awk '/^apiserver_request_total\{/ && /verb="(POST|PUT|PATCH|DELETE|APPLY)"/ {
    g = ""; r = ""; sr = ""
    if (match($0, /group="[^"]*"/)) g = substr($0, RSTART + 7, RLENGTH - 8)
    if (match($0, /resource="[^"]*"/)) r = substr($0, RSTART + 10, RLENGTH - 11)
    if (match($0, /subresource="[^"]*"/)) sr = substr($0, RSTART + 13, RLENGTH - 14)
    k = (g == "" ? "core" : g) "/" r (sr == "" ? "" : "/" sr); s[k] += $NF
  } END {for (k in s) printf "%s %d\n", k, s[k]}' | sort
}
before_leases=$(leases)
before_by=$(writes_by)
# shellcheck disable=SC2046 # one argument per pid
before_kubelets=$(ticks $(pgrep -x kubelet)) before_apiserver=$(ticks $(pgrep -x kube-apiserver))
lbpod_stats >"$CLUSTER_DIR/lbpods.before"
sleep "$WINDOW"
lbpod_stats >"$CLUSTER_DIR/lbpods.after"
# shellcheck disable=SC2046 # one argument per pid
after_kubelets=$(ticks $(pgrep -x kubelet)) after_apiserver=$(ticks $(pgrep -x kube-apiserver))
after_leases=$(leases)
after_by=$(writes_by)
role_figures "$CLUSTER_DIR/lbpods.before" "$CLUSTER_DIR/lbpods.after" "$WINDOW"
# The kubelets probe every lb pod (its readiness and liveness): their CPU grows with the lb pods.
awk -v k="$((after_kubelets - before_kubelets))" -v a="$((after_apiserver - before_apiserver))" -v w="$WINDOW" -v hz="$(getconf CLK_TCK)" \
  'BEGIN {printf "figure: ha_idle_cores kubelets=%.3f apiserver=%.3f (CPU over the window, in cores)\n", k / hz / w, a / hz / w}'
changed=$(diff <(echo "$before_leases") <(echo "$after_leases") | grep -c '^>' || true)
# All writes in the window, the sum over the resources.
total() { awk '{s += $2} END {printf "%d\n", s}'; }
all=$(($(echo "$after_by" | total) - $(echo "$before_by" | total)))
echo "figure: ha_idle_lbpod_writes_per_service_per_s=$(awk -v c="$changed" -v n="$N" -v w="$WINDOW" 'BEGIN {printf "%.4f", c / n / w}') (Leases written in ${WINDOW}s: $changed of $N)"
echo "figure: ha_idle_apiserver_writes_per_s=$(awk -v a="$all" -v w="$WINDOW" 'BEGIN {printf "%.2f", a / w}') (all clients; $all writes in ${WINDOW}s with $N Services and $((2 * N)) lb pods)"
echo "figure: ha_idle_apiserver_writes_by_resource $(join -a 2 -e 0 -o 2.1,1.2,2.2 <(echo "$before_by") <(echo "$after_by") |
  awk '$3 - $2 > 0 {printf "%s%s=%d", sep, $1, $3 - $2; sep = " "}') (in the ${WINDOW}s window)"

[ "${MASS_FAIL:-0}" = 1 ] || exit 0

# Mass failover: every Service's address and the node of its active lb pod.
victim=$(node_name 2)
active_nodes() { "$K" -n "$NS" get service -o jsonpath='{range .items[*]}{.status.loadBalancer.ingress[0].ip} {.metadata.annotations.lbsvc\.io/active-node} {.metadata.name}{"\n"}{end}'; }
active_nodes >"$CLUSTER_DIR/actives"
on_victim=$(awk -v v="$victim" '$2 == v' "$CLUSTER_DIR/actives" | wc -l)
# shellcheck disable=SC2046 # one argument per address
$IN_CLIENT "$CLUSTER_DIR/probe" $(awk '{print $1 ":80"}' "$CLUSTER_DIR/actives") >"$CLUSTER_DIR/probe.out" &
probe=$!
recover() { "$HERE/cluster/node.sh" recover 2 >/dev/null 2>&1 || true; }
trap 'kill -TERM $probe 2>/dev/null || true; recover; cleanup' EXIT
# Each lb pod's election slack (lbpod_ha_slack_seconds: how much lateness it saw lately stretches
# the dead interval, at most 3 s, decaying by 1 s in 20 s): what the takeovers will wait on top of
# the dead interval. Read from each process' /metrics, on its pod IP.
slack() {
  local p ip role
  for p in $(pgrep -f '^/usr/local/bin/lbpod'); do
    role=standby
    if nsenter -t "$p" -n ip -o addr show dev net1 2>/dev/null | grep -q 'scope global'; then role=active; fi
    ip=$(tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | sed -n 's/^LBPOD_POD_IP=//p')
    [ -n "$ip" ] || continue
    nsenter -t "$p" -n curl -s --max-time 2 "http://$ip:8081/metrics" 2>/dev/null | awk -v r="$role" '/^lbpod_ha_slack_seconds / {print r, $2}'
  done | awk '{n[$1]++; if ($2 > 0) z[$1]++; s[$1] += $2; if ($2 > m[$1]) m[$1] = $2}
    END {for (r in n) printf "figure: mass_failover_slack_s role=%s n=%d stretched=%d mean=%.2f max=%.2f (before the failure)\n", r, n[r], z[r], s[r] / n[r], m[r]}' | sort
}
slack
sleep 5 # the probes' baseline before the failure
"$HERE/cluster/node.sh" fail 2 | tee "$CLUSTER_DIR/fail.out"
# Until every Service's active is on node 1 (bounded), then 5 s more of probes.
moved=0
for _ in $(seq 1 120); do
  moved=$(active_nodes | awk -v n="$(node_name 1)" '$2 == n' | wc -l)
  [ "$moved" -ge "$N" ] && break
  sleep 1
done
sleep 5
kill -TERM "$probe"
wait "$probe" || true
# What the lb pods on node 1 (the survivors) said about the takeovers, for the tail's causes: each
# line after its Service's name.
for pod in $("$K" -n "$NS" get pod -l lbsvc.io/service --field-selector "spec.nodeName=$(node_name 1)" \
    -o jsonpath='{range .items[*]}{.metadata.name}={.metadata.labels.lbsvc\.io/service}{"\n"}{end}'); do
  "$K" -n "$NS" logs --request-timeout=5s --since=60s "${pod%%=*}" 2>/dev/null | sed "s/^/${pod#*=} /" || true
done >"$CLUSTER_DIR/survivors.log"
recover
# gaps victim|other: the longest_gap_ms of the Services whose active was on node 2, or of the others.
gaps() {
  awk -v v="$victim" -v which="$1" 'NR == FNR { node[$1] = $2; next }
    { split($1, a, ":"); g = $2; sub("longest_gap_ms=", "", g)
      if ((node[a[1]] == v) == (which == "victim")) print g }' "$CLUSTER_DIR/actives" "$CLUSTER_DIR/probe.out" | sort -n
}
pct() { awk -v p="$1" '{ v[NR] = $1 } END { if (NR == 0) { print "-"; exit } i = int((NR - 1) * p / 100) + 1; print v[i] }'; }
echo "figure: mass_failover_services=$N actives_on_failed_node=$on_victim active_on_node1_after=$moved"
echo "figure: mass_failover_outage_ms p50=$(gaps victim | pct 50) p95=$(gaps victim | pct 95) max=$(gaps victim | pct 100) (longest time without a TCP answer, probes every 100 ms, over the $on_victim Services whose active was on $victim)"
echo "figure: mass_failover_baseline_ms max=$(gaps other | pct 100) (the same over the $((N - on_victim)) Services whose active stayed on node 1)"
echo "lb pods on node 1 in the last minute: $(grep -c 'msg=role role=active' "$CLUSTER_DIR/survivors.log" || true) turned active, $(grep -c 'announcement withheld' "$CLUSTER_DIR/survivors.log" || true) announcements withheld, $(grep -c 'sent the withheld' "$CLUSTER_DIR/survivors.log" || true) sent later, $(grep -c 'stepping down' "$CLUSTER_DIR/survivors.log" || true) stepped down, $(grep -c 'keeping the addresses' "$CLUSTER_DIR/survivors.log" || true) kept the address after a stall (frozen, nobody newer)"
# When the survivors took over, from their log lines' own times (this machine's clock), against the
# moment node 2 was frozen.
frozen_at=$(head -1 "$CLUSTER_DIR/fail.out" | cut -d' ' -f1)
grep 'msg=role role=active' "$CLUSTER_DIR/survivors.log" | sed -n 's/^[^ ]* time=\([^ ]*\) .*/\1/p' |
  python3 -c 'import sys, datetime as d
t0 = d.datetime.fromisoformat(sys.argv[1].replace("Z", "+00:00"))
ms = sorted((d.datetime.fromisoformat(l.strip().replace("Z", "+00:00")) - t0).total_seconds() * 1000 for l in sys.stdin if l.strip())
ms = [m for m in ms if m >= 0]
print("figure: mass_failover_takeovers=%d first_ms=%s last_ms=%s (after node 2 was frozen, from the survivors logs)" % (len(ms), round(ms[0]) if ms else "-", round(ms[-1]) if ms else "-"))' "$frozen_at"
echo "failed probes: $(awk '{ f = $3; sub("failed=", "", f); s += f } END { print s + 0 }' "$CLUSTER_DIR/probe.out") of $(awk '{ p = $4; sub("probes=", "", p); s += p } END { print s + 0 }' "$CLUSTER_DIR/probe.out")"
# Where each failed-over Service's outage went, from the same clock: node 2 frozen → its survivor
# turned active (log) → the address on net1 (the survivor's loop applied the change, or, when its
# loop stood ready, the election's holder put the address on itself: "took over", logged before
# the role line, and then both steps are that line; the announcement follows at once, unlogged) →
# the client's first answer (the probe's gap_end).
python3 - "$frozen_at" "$victim" "$CLUSTER_DIR/actives" "$CLUSTER_DIR/survivors.log" "$CLUSTER_DIR/probe.out" <<'PY'
import re, sys, datetime as d
t = lambda s: d.datetime.fromisoformat(s.replace("Z", "+00:00"))
frozen, victim = t(sys.argv[1]), sys.argv[2]
svc_of = {}  # address -> Service, for the Services whose active was on the victim
for line in open(sys.argv[3]):
    f = line.split()
    if len(f) == 3 and f[1] == victim:
        svc_of[f[0]] = f[2]
active, applied = {}, {}
for line in open(sys.argv[4]):
    m = re.match(r'(\S+) time=(\S+) .*msg=(role role=active|applied|"took over)', line)
    if not m or t(m.group(2)) < frozen:
        continue
    svc, at = m.group(1), t(m.group(2))
    if m.group(3).startswith("role"):
        active.setdefault(svc, at)
    elif m.group(3).startswith('"took'):
        active.setdefault(svc, at)
        applied.setdefault(svc, at)
    elif svc in active:
        applied.setdefault(svc, at)
ms = lambda a, b: round((b - a).total_seconds() * 1000) if a and b else None
rows = []
for line in open(sys.argv[5]):
    f = line.split()
    addr = f[0].rsplit(":", 1)[0]
    if addr not in svc_of:
        continue
    svc, end = svc_of[addr], f[4].removeprefix("gap_end=")
    a, p, e = active.get(svc), applied.get(svc), (t(end) if end != "-" else None)
    rows.append((ms(frozen, e) if e else 10**9, svc, ms(frozen, a), ms(a, p), ms(p, e)))
def q(v, p):
    v = sorted(x for x in v if x is not None)
    return "-" if not v else v[min(len(v) - 1, int((len(v) - 1) * p / 100 + 0.5))]
for i, name in ((2, "frozen_to_active"), (3, "active_to_applied"), (4, "applied_to_answer")):
    v = [r[i] for r in rows]
    print("figure: mass_failover_step_ms step=%s p50=%s p95=%s max=%s (n=%d)" % (name, q(v, 50), q(v, 95), q(v, 100), sum(x is not None for x in v)))
for r in sorted(rows, reverse=True)[:5]:
    print("slowest: %s answered %s ms after the freeze: active +%s, applied +%s, answered +%s" % (r[1], r[0] if r[0] < 10**9 else "never", r[2], r[3], r[4]))
PY
