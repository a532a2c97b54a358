#!/usr/bin/env bash
# A rolling reboot of three nodes, as a Talos upgrade does it, with the guard and under churn
# (scripts/cluster.sh CLUSTER_NODES=3):
#
#   conformance/k8s/rolling-reboot.sh LAYOUT ETC_CNI     LAYOUT original|seed-fix, ETC_CNI disk|tmpfs
#
# The cluster comes up in LAYOUT (original: 05-cilium.conflist in the conf dir, Multus's
# autoconfig dir the conf dir; seed-fix: 05-cilium.conflist in /etc/cni/multus/net.d) with the
# primary as a DaemonSet that writes its file when ready (conformance/k8s/manifests/
# primary-daemonset.yaml, as Cilium's agent does after a boot) and the guard in front
# (deploy/multus-cilium at the manifest's wait). A Deployment with net1 spread over the nodes and
# a DaemonSet with net1 (standing in for Rook's OSDs) have a pod deleted every few seconds
# throughout. Then one node at a time: cordon, drain (DaemonSets stay), reboot (scripts/cluster.sh
# reboot: the pods stopped through the CRI, /run wiped, with ETC_CNI tmpfs /etc/cni emptied as on
# Talos 1.14; CLUSTER_REBOOT_ETC_CNI), the node Ready again, uncordon, every pod Running with the
# verdict of its current sandbox. Every sandbox seen running is classified once (lib.sh's
# spread_classify: full, or bare when it runs without net1), the DaemonSet's pods again on their
# new sandboxes after the reboot. Prints
#
#   rolling-reboot-summary nodes=3 layout=LAYOUT guard=on etc_cni=ETC_CNI pods=N bare=B
#     stuck_teardowns=S max_notready_nodes=M duration_s=D full=F refused=R held=H first_conf=A,B,C
#
#   pods, full, bare    the sandboxes classified in the run
#   stuck_teardowns     sandboxes whose network teardown failed at least once in the run (the
#                       nodes' kubelet logs: "failed to destroy network for sandbox")
#   max_notready_nodes  the most nodes not seen Ready in one poll (one a second)
#   duration_s          from the first cordon to the last node's pods settled
#   refused, held       the guard's own log lines on every node in the run
#   teardowns_untrusted, teardowns_other, teardowns_unfinished   of the stuck teardowns: DELs
#                       inside Multus when it stopped (their result not trusted by the guard,
#                       retried by kubelet), the other failures, the ones not torn down yet
#                       (lib.sh's nodes_teardowns, 120 s given)
#   first_conf          per node, the first file in its conf dir after the boot, in name order
#                       (with etc_cni=disk what the reboot left; with tmpfs the first writer's)
#
# Brings its own cluster up (down first) and leaves it up; scripts/cluster.sh down removes it.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=scripts/versions.sh
. scripts/versions.sh
# shellcheck source=conformance/k8s/lib.sh
. conformance/k8s/lib.sh

LAYOUT=${1:-}
ETC_CNI=${2:-}
case "$LAYOUT $ETC_CNI" in
  original\ disk | original\ tmpfs | seed-fix\ disk | seed-fix\ tmpfs) ;;
  *) echo "usage: $0 original|seed-fix disk|tmpfs" >&2; exit 2 ;;
esac
cl=seed
[ "$LAYOUT" = seed-fix ] || cl="before-fix"
NODES=3
DEPLOY_PODS=${ROLLING_PODS:-6}
SETTLE_TIMEOUT=${ROLLING_SETTLE_TIMEOUT:-240}

CLUSTER_DIR=${CNI_GUARD_CLUSTER_DIR:-/var/lib/cni-guard-cluster}
export KUBECONFIG=$CLUSTER_DIR/admin.kubeconfig
K=$KUBERNETES_BIN/kubectl
say() { echo "k8s rolling-reboot: $*" >&2; }
fail() { echo "k8s rolling-reboot: FAIL: $*" >&2; exit 1; }

t_up=$SECONDS
scripts/cluster.sh down >/dev/null 2>&1 || true
CLUSTER_NODES=$NODES CLUSTER_PRIMARY=daemonset CLUSTER_LAYOUT=$cl CLUSTER_GUARD=1 scripts/cluster.sh up >/dev/null
say "$NODES nodes up in layout $LAYOUT with the guard ($((SECONDS - t_up))s)"
mapfile -t NODE_DIRS < <(scripts/cluster.sh nodes | awk '{ print $4 }')
mapfile -t NODE_NAMES < <(scripts/cluster.sh nodes | awk '{ print $2 }')
[ ${#NODE_DIRS[@]} -eq "$NODES" ] || fail "scripts/cluster.sh nodes lists ${#NODE_DIRS[@]} nodes, not $NODES"

W=$(mktemp -d /tmp/cni-guard-rolling.XXXXXX)
BG=()
cleanup() {
  local p
  for p in "${BG[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  spread_remove
  rm -rf "$W"
}
trap cleanup EXIT

# Multus starts $ROLLING_MULTUS_DELAY s (default 8) later than it does here, as in production
# (its image pulled again after a boot, the API server's first list; lib.sh's start_delay): the
# window a reboot opens must reach the pods.
start_delay kube-system kube-multus-ds "${ROLLING_MULTUS_DELAY:-8}" || fail "Multus's start delay did not roll out"
spread_workloads "$DEPLOY_PODS" || fail "the churn's workloads did not come up"
nodes_ready_polls "$W/ready-polls"
BG+=($!)
spread_classify
[ -s "$W/class" ] || fail "no pod was classified before the first reboot"
if grep -q ' bare$' "$W/class"; then fail "pods were bare before the first reboot: $(grep ' bare$' "$W/class" | tr '\n' ' ')"; fi
(while kill -0 $$ 2>/dev/null; do spread_classify; sleep 1; done) >/dev/null 9>&- &
BG+=($!)
spread_churn 3
BG+=($!)
nodes_log_marks "$NODES"

want=$((DEPLOY_PODS + NODES))
first_confs=()
t_run=$SECONDS
for ((i = 1; i <= NODES; i++)); do
  name=${NODE_NAMES[$((i - 1))]} dir=${NODE_DIRS[$((i - 1))]}
  t_node=$SECONDS
  "$K" cordon "$name" >/dev/null
  # (Talos retries a drain that fails; so does this, once: the churn may delete a pod the drain
  # is evicting.)
  if ! "$K" drain "$name" --ignore-daemonsets --delete-emptydir-data --timeout=180s >"$W/drain-$i.log" 2>&1; then
    say "draining $name failed, once: $(grep -v '^evicting\|^pod/.* evicted\|^node/.* cordoned' "$W/drain-$i.log" | tail -n 3 | tr '\n' ' ')"
    "$K" drain "$name" --ignore-daemonsets --delete-emptydir-data --timeout=180s >"$W/drain-$i.log" 2>&1 ||
      fail "draining $name failed: $(tail -n 5 "$W/drain-$i.log" | tr '\n' ' ')"
  fi
  # The first configuration containerd can see after the boot: the conf dir's first file in name
  # order the first time, from the reboot's start, that the folder is not empty (with disk, what
  # the reboot left there).
  (
    rm -f "$W/first-$i"
    for _ in $(seq 1200); do
      f=$(find "$dir/etc/cni/net.d" -maxdepth 1 -type f \( -name '*.conf' -o -name '*.conflist' -o -name '*.json' \) -printf '%f\n' 2>/dev/null | sort | head -n 1)
      if [ -n "$f" ] && [ -e "$W/booted-$i" ]; then echo "$f" >"$W/first-$i"; exit 0; fi
      sleep 0.1
    done
  ) >/dev/null 9>&- &
  watcher=$!
  CLUSTER_NODE_INDEX=$i CLUSTER_REBOOT_ETC_CNI=$ETC_CNI scripts/cluster.sh reboot >"$W/reboot-$i.log" 2>&1 &
  reboot_pid=$!
  # "booted" once the node's containerd was started again (cluster.sh writes the boot time then).
  boot_ms=$CLUSTER_DIR/boot-ms
  [ "$i" = 1 ] || boot_ms=$CLUSTER_DIR/node$i-boot-ms
  before=$(cat "$boot_ms" 2>/dev/null || echo 0)
  for _ in $(seq 600); do
    [ "$(cat "$boot_ms" 2>/dev/null || echo 0)" = "$before" ] || break
    kill -0 "$reboot_pid" 2>/dev/null || break
    sleep 0.1
  done
  touch "$W/booted-$i"
  wait "$reboot_pid" || fail "rebooting $name failed: $(tail -n 5 "$W/reboot-$i.log")"
  "$K" wait --for=condition=Ready --timeout=180s "node/$name" >/dev/null || fail "$name did not come back Ready"
  "$K" uncordon "$name" >/dev/null
  wait "$watcher" || true
  first_confs+=("$(cat "$W/first-$i" 2>/dev/null || echo none)")
  # The churn pauses while the pods settle (else some pod is always on its way up).
  touch "$W/churn-paused"
  for _ in $(seq "$SETTLE_TIMEOUT"); do spread_settled "$want" && break; sleep 1; done
  rm -f "$W/churn-paused"
  spread_settled "$want" ||
    fail "after $name's reboot the churn's $want pods were not all Running and looked at within $SETTLE_TIMEOUT s: $(spread_pods | tr '\n' ' ')"
  say "$name: cordoned, drained, rebooted (first file after the boot: ${first_confs[-1]}), uncordoned, every pod settled in $((SECONDS - t_node))s"
done
duration=$((SECONDS - t_run))
for p in "${BG[@]}"; do kill "$p" 2>/dev/null || true; done
wait 2>/dev/null || true
BG=()

pods=$(wc -l <"$W/class")
full=$(awk '$3 == "full"' "$W/class" | wc -l)
bare=$(awk '$3 == "bare"' "$W/class" | wc -l)
read -r refused held stuck < <(nodes_tally "${NODE_NAMES[@]}")
read -r untrusted other unfinished < <(nodes_teardowns 120)
[ -s "$W/ready-polls" ] || fail "the nodes' Ready conditions were never polled"
read -r _ most < <(nodes_notready "$W/ready-polls" "${NODE_NAMES[@]}")
echo "rolling-reboot-summary nodes=$NODES layout=$LAYOUT guard=on etc_cni=$ETC_CNI pods=$pods bare=$bare stuck_teardowns=$stuck max_notready_nodes=$most duration_s=$duration full=$full refused=$refused held=$held teardowns_untrusted=$untrusted teardowns_other=$other teardowns_unfinished=$unfinished first_conf=$(IFS=,; echo "${first_confs[*]}")"
