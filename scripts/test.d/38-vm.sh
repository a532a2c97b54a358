#!/usr/bin/env bash
# A real reboot (issue 28, item 4): a virtual-machine node (scripts/vm-image.sh, scripts/vm-node.sh:
# Debian with its own kernel, systemd, containerd and kubelet as units) joins the control plane of
# `CLUSTER_NODE=none scripts/cluster.sh up` over a bridge in its namespace; Multus and, for the
# second run, the guard run on it as DaemonSets; conformance/vm/reboot.sh reboots it with
# `systemctl reboot` inside, in the layout before the seed's fix without and with the guard, and
# prints a reboot-summary line each. What each line must show:
#   original off   the incident, caused by the reboot: bare > 0 (pods back on 05-cilium alone)
#   original on    bare = 0, stuck_teardowns = 0, full = pods, all_full_s a number, and the
#                  guard's log shows the window reached the pods (refused + held > 0)
# Then the VM and the control plane go, and nothing is left (qemu, namespace, bridge and tap,
# the run's folders).
#
# Needs root, the binaries of scripts/setup.sh and its VM image. Locally without them it skips
# loudly; under CI=true that is a failure.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=scripts/versions.sh
. scripts/versions.sh
# shellcheck source=conformance/k8s/lib.sh
. conformance/k8s/lib.sh

skip() {
  if [ "${CI:-}" = true ]; then
    echo "38-vm: FAIL: $1" >&2
    exit 1
  fi
  echo "38-vm: SKIP: $1" >&2
  exit 0
}
[ "$(id -u)" = 0 ] || skip "needs root (network namespaces, qemu)"
for b in "$KUBERNETES_BIN/kubelet" "$ETCD_BIN/etcd" "$MULTUS_BIN/multus-daemon" "$CONTAINERD2_BIN/containerd"; do
  [ -x "$b" ] || skip "$b is not built (scripts/setup.sh)"
done
command -v qemu-system-x86_64 >/dev/null || skip "qemu-system-x86_64 is missing (scripts/setup.sh)"
image=$(scripts/vm-image.sh path 2>/dev/null) || skip "the VM image is not built (scripts/setup.sh, or scripts/vm-image.sh build)"
echo "38-vm: image $image"

CLUSTER_DIR=${CNI_GUARD_CLUSTER_DIR:-/var/lib/cni-guard-cluster}
VM_DIR=${CNI_GUARD_VM_DIR:-/var/lib/cni-guard-vm}
cargo build --release --locked -p cni-guard

# The one node of this machine (scripts/cluster.sh's namespace, addresses and folder) is shared:
# every user holds this lock.
exec 9>/run/lock/cni-guard-node.lock
flock -w 1800 9 || skip "another run held the node's lock for 30 min"
export CLUSTER_OWNER_PID=$$

finish() {
  local rc=$? left=()
  trap - EXIT
  if pkill -TERM -P $$ 2>/dev/null; then sleep 2; pkill -KILL -P $$ 2>/dev/null || true; fi
  scripts/vm-node.sh down || rc=1
  scripts/cluster.sh down || rc=1
  if pgrep -f "qemu-system-x86_64 -name cni-guard-vm" >/dev/null; then left+=("qemu"); fi
  [ ! -e "$VM_DIR" ] || left+=("$VM_DIR")
  [ ! -e /run/netns/cni-guard-k8s ] || left+=("netns cni-guard-k8s")
  [ ! -e "$CLUSTER_DIR" ] || left+=("$CLUSTER_DIR")
  ! ip link show cgvm-tap0 >/dev/null 2>&1 || left+=("tap cgvm-tap0")
  if [ ${#left[@]} -gt 0 ]; then
    echo "38-vm: FAIL: left behind: ${left[*]}" >&2
    rc=1
  fi
  exit "$rc"
}
trap finish EXIT

field() { tr ' ' '\n' <<<"$1" | sed -n "s/^$2=//p"; }
num() {
  local v
  v=$(field "$1" "$2" | head -n 1)
  [[ $v =~ ^[0-9]+$ ]] || { echo "38-vm: FAIL: $2=\"$v\" is not a number in: $1" >&2; exit 1; }
  echo "$v"
}

start=$SECONDS
CLUSTER_NODE=none scripts/cluster.sh up
echo "38-vm: control plane up in $((SECONDS - start))s"
t=$SECONDS
scripts/vm-node.sh up
echo "38-vm: VM node Ready in $((SECONDS - t))s"

pods=${VM_REBOOT_PODS:-3}
summaries=()
for run in "original off" "original on"; do
  t=$SECONDS
  # shellcheck disable=SC2086 # LAYOUT GUARD
  line=$(conformance/vm/reboot.sh $run "$pods")
  echo "$line"
  echo "38-vm: $run in $((SECONDS - t))s"
  summaries+=("$line")
  n=$(num "$line" pods)
  full=$(num "$line" full)
  bare=$(num "$line" bare)
  stuck=$(num "$line" stuck_teardowns)
  num "$line" notready_s >/dev/null
  refused=$(num "$line" refused)
  held=$(num "$line" held)
  [ "$n" = "$pods" ] && [ $((full + bare)) = "$n" ] ||
    { echo "38-vm: FAIL: $run: want pods=$pods = full + bare: $line" >&2; exit 1; }
  # What every reboot-summary line must show, the netns node's rules (conformance/k8s/lib.sh),
  # then this suite's own, stricter ones.
  reboot_check "$line" || { echo "38-vm: FAIL: $run: $line" >&2; exit 1; }
  case "$run" in
    "original off")
      [ "$bare" -gt 0 ] ||
        { echo "38-vm: FAIL: original off: the reboot left no pod bare (want bare > 0, the incident): $line" >&2; exit 1; } ;;
    "original on")
      if [ "$bare" != 0 ] || [ "$stuck" != 0 ] || [ "$full" != "$n" ]; then
        echo "38-vm: FAIL: original on: want bare=0 stuck_teardowns=0 full=$n: $line" >&2
        exit 1
      fi
      num "$line" all_full_s >/dev/null
      [ $((refused + held)) -gt 0 ] ||
        { echo "38-vm: FAIL: original on: the guard neither refused nor held an ADD after the boot (the window reached no pod): $line" >&2; exit 1; } ;;
  esac
done
printf '%s\n' "${summaries[@]}" >"${CNI_GUARD_VM_SUMMARY:-/tmp/cni-guard-vm-reboot-summary.txt}"
echo "38-vm: passed in $((SECONDS - start))s"
