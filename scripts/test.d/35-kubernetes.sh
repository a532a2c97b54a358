#!/usr/bin/env bash
# The one-node Kubernetes of scripts/cluster.sh (issue 12): up, the checks of
# conformance/k8s/check.sh (a plain pod; a pod with Multus's net1; the guard in front) and
# conformance/k8s/incident.sh (Multus stopped, a pod in the window is refused by the guard, then
# gets eth0 + net1 once Multus is back); then, without the guard in the layout before the seed's
# fix, the incident itself (the pod comes up without net1); then down, and nothing left behind
# (processes, network namespace, mounts, cgroups, files).
#
# Needs root and the binaries scripts/setup.sh builds. Locally without them it skips loudly;
# under CI=true that is a failure.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=scripts/versions.sh
. scripts/versions.sh

skip() {
  if [ "${CI:-}" = true ]; then
    echo "35-kubernetes: FAIL: $1" >&2
    exit 1
  fi
  echo "35-kubernetes: SKIP: $1" >&2
  exit 0
}
[ "$(id -u)" = 0 ] || skip "needs root (network namespaces, containerd, kubelet)"
for b in "$KUBERNETES_BIN/kubelet" "$ETCD_BIN/etcd" "$MULTUS_BIN/multus-daemon"; do
  [ -x "$b" ] || skip "$b is not built (scripts/setup.sh)"
done

CLUSTER_DIR=${CNI_GUARD_CLUSTER_DIR:-/var/lib/cni-guard-cluster}
cargo build --release --locked -p cni-guard

# One node per machine (fixed namespace, addresses, folder): runs from other clones wait here.
exec 9>/run/lock/cni-guard-k8s-test.lock
flock -w 1800 9 || skip "another run of this test held the lock for 30 min"

finish() {
  local rc=$?
  trap - EXIT
  scripts/cluster.sh down || rc=1
  # Nothing may be left behind.
  left=()
  [ ! -e /run/netns/cni-guard-k8s ] || left+=("netns cni-guard-k8s")
  [ ! -e "$CLUSTER_DIR" ] || left+=("$CLUSTER_DIR")
  if awk -v d="$CLUSTER_DIR" 'index($5, d) == 1 { found = 1 } END { exit !found }' /proc/self/mountinfo; then
    left+=("mounts below $CLUSTER_DIR")
  fi
  if compgen -G "/sys/fs/cgroup/*/cni-guard-k8s" >/dev/null; then left+=("cgroups cni-guard-k8s"); fi
  if [ ${#left[@]} -gt 0 ]; then
    echo "35-kubernetes: FAIL: left behind: ${left[*]}" >&2
    rc=1
  fi
  exit "$rc"
}
trap finish EXIT

start=$SECONDS
scripts/cluster.sh up
echo "35-kubernetes: up in $((SECONDS - start))s"
scripts/cluster.sh status
conformance/k8s/check.sh
conformance/k8s/incident.sh
scripts/cluster.sh down
echo "35-kubernetes: the seed's layout with the guard passed in $((SECONDS - start))s"

# The same incident without the guard, in the layout the seed fixed: the pod comes up without net1.
CLUSTER_LAYOUT=before-fix scripts/cluster.sh up
conformance/k8s/incident.sh

# The incident under churn (conformance/k8s/churn.sh): one incident-summary line per layout and
# guard, each run bringing the node up in its layout. Off by default (about 3 min a run); only
# prints, asserts nothing yet: with the guard in the original layout, Multus's auto-config (its
# autoconfig dir is the conf dir) elects 00-cni-guard.conflist as clusterNetwork after its first
# restart, and no new pod gets a network (recovery_s=never).
if [ "${CNI_GUARD_K8S_CHURN:-0}" = 1 ]; then
  for run in "original off" "original on" "seed-fix off" "seed-fix on"; do
    # shellcheck disable=SC2086 # LAYOUT GUARD
    conformance/k8s/churn.sh $run
  done
fi
echo "35-kubernetes: passed in $((SECONDS - start))s"
