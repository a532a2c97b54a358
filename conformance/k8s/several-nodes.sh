#!/usr/bin/env bash
# The suites of three nodes, one after the other, each line judged:
#   conformance/k8s/nodes.sh          every node whole (fails itself otherwise)
#   conformance/k8s/cutover.sh        the seed's cutover, both orders, without and with the guard:
#                                     guard=on lines must show bare=0 and stuck_teardowns=0;
#                                     guard=off lines are what the layout change does alone
#   conformance/k8s/rolling-reboot.sh a rolling reboot with the guard, both layouts, /etc/cni on
#                                     disk and as a tmpfs: bare=0, at most one node NotReady at a
#                                     time, and with disk no stuck teardown
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
CLUSTER_DIR=${CNI_GUARD_CLUSTER_DIR:-/var/lib/cni-guard-cluster}
cargo build --release --locked -p cni-guard -p cni-guard-agent
exec 9>/run/lock/cni-guard-node.lock
flock -w 1800 9 || skip "another user of the node held its lock for 30 min"
export CLUSTER_OWNER_PID=$$
stage_done "release build, the node lock"

finish() {
  local rc=$? left=()
  trap - EXIT
  if pkill -TERM -P $$ 2>/dev/null; then sleep 2; pkill -KILL -P $$ 2>/dev/null || true; fi
  scripts/cluster.sh down >/dev/null 2>&1 || rc=1
  [ ! -e "$CLUSTER_DIR" ] || left+=("$CLUSTER_DIR")
  ! compgen -G '/run/netns/cni-guard-k8s*' >/dev/null || left+=("network namespaces $(ls -d /run/netns/cni-guard-k8s* | tr '\n' ' ')")
  ! ip link show cgk8s-br >/dev/null 2>&1 || left+=("bridge cgk8s-br")
  ! compgen -G '/sys/fs/cgroup/*/cni-guard-k8s*' >/dev/null || left+=("cgroups cni-guard-k8s*")
  if pgrep -f "$CLUSTER_DIR/" >/dev/null; then left+=("processes naming $CLUSTER_DIR"); fi
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
          if [ "$guard" = on ] && { [ "$bare" -ne 0 ] || [ "$stuck" -ne 0 ]; }; then
            fail "cutover $order with the guard: want bare=0 stuck_teardowns=0: $line"
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
          [ "$etc" = tmpfs ] || [ "$stuck" -eq 0 ] || fail "rolling reboot $layout $etc: want stuck_teardowns=0: $line"
          stage_done "rolling-reboot.sh $layout $etc"
        done
      done ;;
    *) fail "no part $part (cutover, rolling-reboot)" ;;
  esac
done
printf '%s\n' "${lines[@]}" >"${CNI_GUARD_NODES_SUMMARY:-/tmp/cni-guard-several-nodes-summary.txt}"
