#!/usr/bin/env bash
# The seed's cutover on three nodes, under churn (scripts/cluster.sh CLUSTER_NODES=3):
#
#   conformance/k8s/cutover.sh ORDER GUARD     ORDER primary-first|multus-first, GUARD on|off
#
# The cluster comes up in the layout before the fix (05-cilium.conflist in the conf dir, written
# by the primary's DaemonSet, conformance/k8s/manifests/primary-daemonset.yaml, which behaves as
# Cilium's chart: the file written when ready, removed by its preStop with `uninstall`, rolled one
# node at a time; Multus's multusAutoconfigDir the conf dir), with stakater/Reloader running and,
# with GUARD on, the guard in front (deploy/multus-cilium, its attachment the conf dir's
# 05-cilium.conflist). Then the seed's change is applied as its commit does, through ConfigMaps
# that Reloader turns into rollouts:
#   primary   primary-config's conf-path moves to /etc/cni/multus/net.d (Cilium's cni.confPath);
#             with the guard, the guard's manifest for that layout is applied with it (its
#             attachment is the primary's file, and moves with it)
#   Multus    multus-daemon-config's multusAutoconfigDir moves to that folder
# in ORDER: the first rolled out on every node before the second is changed. Meanwhile a
# Deployment with net1 spread over the nodes and a DaemonSet with net1 (standing in for Rook's
# OSDs) have pods deleted every few seconds, so new sandboxes are built all through it. Every pod
# seen Running is classified once: full (network-status and `ip addr` inside show eth0 and net1)
# or bare (Running without net1). Prints
#
#   cutover-summary nodes=3 primary=daemonset guard=on|off order=ORDER pods=N full=F bare=B
#     refused=R stuck_teardowns=S notready_s=X duration_s=D held=H
#
#   refused, held     the guard's own log lines on every node in the run: ADDs refused (code 11),
#                     ADDs held until the network was complete and then run
#   stuck_teardowns   sandboxes whose network teardown failed at least once in the run (the
#                     nodes' kubelet logs: "failed to destroy network for sandbox"); the pod
#                     cannot get a new sandbox meanwhile
#   teardowns_untrusted, teardowns_other, teardowns_unfinished   (with the guard; "-" without)
#                     of those sandboxes: the ones whose DEL was inside Multus when it stopped, so
#                     that the guard did not trust its result and, Multus away past the DEL's
#                     budget, answered 11 for kubelet to retry; the ones that failed otherwise;
#                     the ones not torn down yet (lib.sh's nodes_teardowns, 120 s given)
#   notready_s        the most seconds any node's Ready condition was not seen True (one poll a
#                     second of every node; a failed poll counts as not True)
#   duration_s        from the first ConfigMap change to every node in the new layout (both
#                     rollouts done, 00-multus.conf written again, the guard's file there) and
#                     every churn pod Running with its verdict
#
# Brings its own cluster up (down first) and leaves it up; scripts/cluster.sh down removes it.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=scripts/versions.sh
. scripts/versions.sh
# shellcheck source=conformance/k8s/lib.sh
. conformance/k8s/lib.sh

ORDER=${1:-}
GUARD=${2:-}
case "$ORDER $GUARD" in
  primary-first\ on | primary-first\ off | multus-first\ on | multus-first\ off) ;;
  *) echo "usage: $0 primary-first|multus-first on|off" >&2; exit 2 ;;
esac
NODES=3
DEPLOY_PODS=${CUTOVER_PODS:-6}
SETTLE_TIMEOUT=${CUTOVER_SETTLE_TIMEOUT:-240}

CLUSTER_DIR=${CNI_GUARD_CLUSTER_DIR:-/var/lib/cni-guard-cluster}
export KUBECONFIG=$CLUSTER_DIR/admin.kubeconfig
K=$KUBERNETES_BIN/kubectl
say() { echo "k8s cutover: $*" >&2; }
fail() { echo "k8s cutover: FAIL: $*" >&2; exit 1; }
g=0
[ "$GUARD" = off ] || g=1

# --- the cluster before the change ----------------------------------------------------------------
t_up=$SECONDS
scripts/cluster.sh down >/dev/null 2>&1 || true
CLUSTER_NODES=$NODES CLUSTER_PRIMARY=daemonset CLUSTER_RELOADER=1 CLUSTER_LAYOUT=before-fix CLUSTER_GUARD=$g \
  scripts/cluster.sh up >/dev/null
say "$NODES nodes up in the layout before the fix, guard=$GUARD ($((SECONDS - t_up))s)"
mapfile -t NODE_DIRS < <(scripts/cluster.sh nodes | awk '{ print $4 }')
mapfile -t NODE_NAMES < <(scripts/cluster.sh nodes | awk '{ print $2 }')
[ ${#NODE_DIRS[@]} -eq "$NODES" ] || fail "scripts/cluster.sh nodes lists ${#NODE_DIRS[@]} nodes, not $NODES"

W=$(mktemp -d /tmp/cni-guard-cutover.XXXXXX)
BG=()
cleanup() {
  local p
  for p in "${BG[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  spread_remove
  rm -rf "$W"
}
trap cleanup EXIT

# --- the churn's workloads, the observers, the churn -----------------------------------------------
spread_workloads "$DEPLOY_PODS" || fail "the churn's workloads did not come up before the cutover"
spread=$("$K" get pod -l app=spread -o jsonpath='{range .items[*]}{.spec.nodeName}{"\n"}{end}' | sort -u | wc -l)
[ "$spread" -eq "$NODES" ] || fail "the Deployment's pods are on $spread nodes, not $NODES"
nodes_ready_polls "$W/ready-polls"
BG+=($!)
spread_classify
[ -s "$W/class" ] || fail "no pod was classified before the cutover"
if grep -q ' bare$' "$W/class"; then fail "pods were bare before the cutover: $(grep ' bare$' "$W/class" | tr '\n' ' ')"; fi
(while kill -0 $$ 2>/dev/null; do spread_classify; sleep 1; done) >/dev/null 9>&- &
BG+=($!)
spread_churn 2
CHURN=$!
BG+=("$CHURN")

nodes_log_marks "$NODES"

# --- the change -------------------------------------------------------------------------------------
new_conf=/host/etc/cni/multus/net.d
# The guard's attachment is the primary's file: it moves with the primary's confPath, in the same
# change (the guard's manifest for the new layout, which rolls the guard's DaemonSet).
change_primary() {
  local also=
  [ "$g" = 0 ] || also="; the guard's manifest for the new layout applied with it"
  say "primary: conf-path -> $new_conf (Reloader rolls it)$also"
  "$K" -n kube-system patch configmap primary-config --type=merge -p "{\"data\":{\"conf-path\":\"$new_conf\"}}" >/dev/null
  if [ "$g" = 1 ]; then CLUSTER_LAYOUT=seed scripts/cluster.sh manifest guard | "$K" apply -f - >/dev/null; fi
}
change_multus() {
  say "Multus: multusAutoconfigDir -> /etc/cni/multus/net.d (Reloader rolls it)"
  CLUSTER_LAYOUT=seed CLUSTER_GUARD=$g scripts/cluster.sh manifest multus.yaml | "$K" apply -f - >/dev/null
}
# rolled DAEMONSET: Reloader changed its pod template (its env var names the ConfigMap) and every
# node runs the new template.
rolled() {
  for _ in $(seq 60); do
    "$K" -n kube-system get daemonset "$1" -o jsonpath='{.spec.template.spec.containers[0].env[*].name}' |
      grep -q 'STAKATER_.*_CONFIGMAP' && break
    sleep 1
  done
  "$K" -n kube-system get daemonset "$1" -o jsonpath='{.spec.template.spec.containers[0].env[*].name}' |
    grep -q 'STAKATER_.*_CONFIGMAP' || fail "Reloader did not roll daemonset/$1 within 60 s ($(tail -n 3 "$CLUSTER_DIR/logs/reloader.log"))"
  "$K" -n kube-system rollout status "daemonset/$1" --timeout=300s >/dev/null || fail "daemonset/$1 did not roll out"
  say "$1 rolled out on every node ($((SECONDS - t_change))s into the cutover)"
}
# Every node in the new layout: the primary's file in Multus's folder and not in the conf dir,
# 00-multus.conf written again (and the guard's file, with the guard), Multus Ready everywhere.
settled() {
  local d
  for d in "${NODE_DIRS[@]}"; do
    [ -s "$d/etc/cni/multus/net.d/05-cilium.conflist" ] && [ ! -e "$d/etc/cni/net.d/05-cilium.conflist" ] &&
      [ -s "$d/etc/cni/net.d/00-multus.conf" ] || return 1
    [ "$g" = 0 ] || [ -s "$d/etc/cni/net.d/00-cni-guard.conflist" ] || return 1
  done
  [ "$("$K" -n kube-system get pod -l app=multus -o jsonpath='{range .items[*]}{.status.containerStatuses[0].ready}{"\n"}{end}' | grep -c true)" -eq "$NODES" ]
}
t_change=$SECONDS
case "$ORDER" in
  primary-first) change_primary; rolled primary; change_multus; rolled kube-multus-ds ;;
  multus-first) change_multus; rolled kube-multus-ds; change_primary; rolled primary ;;
esac
[ "$g" = 0 ] || "$K" -n cni-guard rollout status daemonset/cni-guard --timeout=180s >/dev/null || fail "the guard did not roll out"
for _ in $(seq "$SETTLE_TIMEOUT"); do settled && break; sleep 1; done
settled || fail "the nodes did not settle in the new layout within $SETTLE_TIMEOUT s: $(for d in "${NODE_DIRS[@]}"; do echo "[$(ls "$d/etc/cni/net.d" | tr '\n' ' ')| $(ls "$d/etc/cni/multus/net.d" | tr '\n' ' ')]"; done)"
say "every node in the new layout $((SECONDS - t_change))s after the first change; churn stopped"
kill "$CHURN" 2>/dev/null || true

# --- recovery: every churn pod Running with its verdict ---------------------------------------------
want=$((DEPLOY_PODS + NODES))
for _ in $(seq "$SETTLE_TIMEOUT"); do spread_settled "$want" && break; sleep 1; done
spread_settled "$want" ||
  fail "the churn's $want pods were not all Running and looked at within $SETTLE_TIMEOUT s after the cutover: $(spread_pods | tr '\n' ' ')"
duration=$((SECONDS - t_change))
for p in "${BG[@]}"; do kill "$p" 2>/dev/null || true; done
wait 2>/dev/null || true
BG=()

# --- the numbers ------------------------------------------------------------------------------------
awk '!seen[$1]++' "$W/class" >"$W/verdicts"
pods=$(wc -l <"$W/verdicts")
full=$(awk '$3 == "full"' "$W/verdicts" | wc -l)
bare=$(awk '$3 == "bare"' "$W/verdicts" | wc -l)
read -r refused held stuck < <(nodes_tally "${NODE_NAMES[@]}")
untrusted=- other=- unfinished=-
[ "$g" = 0 ] || read -r untrusted other unfinished < <(nodes_teardowns 120)
[ -s "$W/ready-polls" ] || fail "the nodes' Ready conditions were never polled"
read -r notready _ < <(nodes_notready "$W/ready-polls" "${NODE_NAMES[@]}")
echo "cutover-summary nodes=$NODES primary=$(cat "$CLUSTER_DIR/primary") guard=$GUARD order=$ORDER pods=$pods full=$full bare=$bare refused=$refused stuck_teardowns=$stuck notready_s=$notready duration_s=$duration held=$held teardowns_untrusted=$untrusted teardowns_other=$other teardowns_unfinished=$unfinished"
