#!/usr/bin/env bash
# The suites of three nodes, one after the other, each line judged:
#   conformance/k8s/nodes.sh          every node whole (fails itself otherwise)
#   conformance/k8s/cutover.sh        the seed's cutover, both orders, without and with the guard:
#                                     guard=on lines must show bare=0 and no stuck teardown but
#                                     DELs cut off by Multus's stop, retried and all done;
#                                     guard=off lines are what the layout change does alone
#   conformance/k8s/rolling-reboot.sh a rolling reboot with the guard, both layouts, /etc/cni on
#                                     disk and as a tmpfs: bare=0, at most one node NotReady at a
#                                     time, every teardown done, and with disk none stuck
#                                     but DELs cut off by Multus's stop
# then scripts/cluster.sh down, and nothing of the cluster left. Prints the lines, then each
# stage's time. Needs root and scripts/setup.sh's binaries (Reloader included); without them it
# skips loudly, and under CI=true that is a failure.
#
#   conformance/k8s/several-nodes.sh [cutover|rolling-reboot]...   (default: all of them)
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=scripts/versions.sh
. scripts/versions.sh
# shellcheck source=conformance/k8s/lib.sh
. conformance/k8s/lib.sh

skip() {
  if [ "${CI:-}" = true ]; then echo "several-nodes: FAIL: $1" >&2; exit 1; fi
  echo "several-nodes: SKIP: $1" >&2
  exit 0
}
fail() { echo "several-nodes: FAIL: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || skip "needs root (network namespaces, containerd, kubelet)"
for b in "$KUBERNETES_BIN/kubelet" "$ETCD_BIN/etcd" "$MULTUS_BIN/multus-daemon" "$RELOADER_BIN/reloader"; do
  [ -x "$b" ] || skip "$b is not built (scripts/setup.sh)"
done
parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(cutover rolling-reboot)
# CLUSTER_INSTANCE=K (scripts/cluster.sh) runs the nodes as a cluster of their own beside
# instance 0's (35-kubernetes.sh's, say); the caller exports the instance's CNI_GUARD_CLUSTER_DIR
# with it.
INSTANCE=${CLUSTER_INSTANCE:-0}
if [ "$INSTANCE" = 0 ]; then
  LOCK=/run/lock/cni-guard-node.lock
else
  [ -n "${CNI_GUARD_CLUSTER_DIR:-}" ] || fail "CLUSTER_INSTANCE=$INSTANCE without its CNI_GUARD_CLUSTER_DIR"
  LOCK=/run/lock/cni-guard-node-$INSTANCE.lock
fi
cargo build --release --locked -p cni-guard -p cni-guard-agent
exec 9>"$LOCK"
flock -w 1800 9 || skip "another user of the node held its lock for 30 min"
export CLUSTER_OWNER_PID=$$
stage_done "release build, the node lock"

finish() {
  local rc=$? left=()
  trap - EXIT
  if pkill -TERM -P $$ 2>/dev/null; then sleep 2; pkill -KILL -P $$ 2>/dev/null || true; fi
  scripts/cluster.sh down >/dev/null 2>&1 || rc=1
  mapfile -t left < <(scripts/cluster.sh leftovers)
  if [ ${#left[@]} -gt 0 ]; then echo "several-nodes: FAIL: left behind: ${left[*]}" >&2; rc=1; fi
  stage_done down
  echo "several-nodes: time per stage"
  stage_table
  exit "$rc"
}
trap finish EXIT

num() { # LINE KEY: KEY's value, a whole number (a missing or garbled field fails)
  local v
  v=$(reboot_field "$1" "$2")
  [[ $v =~ ^[0-9]+$ ]] || fail "$2=\"$v\" is not a number in: $1"
  echo "$v"
}
lines=()

CLUSTER_NODES=3 scripts/cluster.sh up >/dev/null
line=$(conformance/k8s/nodes.sh | grep '^nodes-summary') || fail "conformance/k8s/nodes.sh failed"
echo "$line"
lines+=("$line")
stage_done "up, nodes.sh"

for part in "${parts[@]}"; do
  case "$part" in
    cutover)
      for order in multus-first primary-first; do
        for guard in off on; do
          line=$(conformance/k8s/cutover.sh "$order" "$guard")
          echo "$line"
          lines+=("$line")
          pods=$(num "$line" pods) full=$(num "$line" full) bare=$(num "$line" bare)
          stuck=$(num "$line" stuck_teardowns)
          [ "$pods" -gt 0 ] && [ $((full + bare)) -eq "$pods" ] || fail "cutover $order $guard: no pods, or full + bare is not pods: $line"
          # With the guard: no pod bare, and no teardown stuck but the ones whose DEL was inside
          # Multus when it stopped (Multus first: the old daemon stops, and its new one waits
          # for the primary's file): the guard trusts no result of such a run and, Multus away
          # past the DEL's budget, answers 11; kubelet retries, and each must be torn down
          # within 120 s of the end.
          if [ "$guard" = on ]; then
            untrusted=$(num "$line" teardowns_untrusted) other=$(num "$line" teardowns_other)
            unfinished=$(num "$line" teardowns_unfinished)
            if [ "$bare" -ne 0 ] || [ "$other" -ne 0 ] || [ "$unfinished" -ne 0 ] || [ "$stuck" -gt "$untrusted" ]; then
              fail "cutover $order with the guard: want bare=0 and no stuck teardown but untrusted DELs, all torn down: $line"
            fi
          fi
          stage_done "cutover.sh $order $guard"
        done
      done ;;
    rolling-reboot)
      for layout in seed-fix original; do
        for etc in disk tmpfs; do
          line=$(conformance/k8s/rolling-reboot.sh "$layout" "$etc")
          echo "$line"
          lines+=("$line")
          pods=$(num "$line" pods) bare=$(num "$line" bare) stuck=$(num "$line" stuck_teardowns)
          most=$(num "$line" max_notready_nodes)
          [ "$pods" -gt 0 ] || fail "rolling reboot $layout $etc: no pods: $line"
          [ "$bare" -eq 0 ] || fail "rolling reboot $layout $etc with the guard: want bare=0: $line"
          [ "$most" -le 1 ] || fail "rolling reboot $layout $etc: more than one node NotReady at once: $line"
          other=$(num "$line" teardowns_other) unfinished=$(num "$line" teardowns_unfinished)
          [ "$unfinished" -eq 0 ] || fail "rolling reboot $layout $etc: teardowns not done 120 s after the end: $line"
          [ "$etc" = tmpfs ] || [ "$other" -eq 0 ] ||
            fail "rolling reboot $layout $etc: want no stuck teardown but DELs inside Multus when it stopped: $line"
          stage_done "rolling-reboot.sh $layout $etc"
        done
      done ;;
    *) fail "no part $part (cutover, rolling-reboot)" ;;
  esac
done
printf '%s\n' "${lines[@]}" >"${CNI_GUARD_NODES_SUMMARY:-/tmp/cni-guard-several-nodes-summary.txt}"
