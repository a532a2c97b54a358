#!/usr/bin/env bash
# How soon a pod runs once Multus is back, by the guard's --wait-seconds, on the real node of
# scripts/cluster.sh (issue 18):
#
#   conformance/k8s/recovery.sh WAIT_SECONDS [ROUNDS]
#
# Redeploys the guard (deploy/multus-cilium) with --wait-seconds=WAIT_SECONDS, then ROUNDS times
# (default 3): the Multus DaemonSet pod is deleted (SIGTERM: the daemon removes 00-multus.conf;
# its replacement waits $RECOVERY_MULTUS_DELAY s, default 5, in an init container, as churn.sh's
# does, standing in for a production restart), a pod asking for net1 is created while
# 00-multus.conf is gone, and the time from 00-multus.conf reappearing to that pod Ready is
# measured (the file polled every 50 ms, the pod every 100 ms). A pod Ready before Multus is
# back, or without net1, fails the run. Prints
#
#   recovery-summary kubernetes=.. multus=.. wait_seconds=N rounds=R median_ms=.. max_ms=..
#
# With 0 the guard refuses at once and kubelet's back-off decides (its sandbox retry); with a
# wait the guard's ADD is woken by inotify the moment the file is back. Leaves the cluster up
# with the guard at the manifest's own --wait-seconds.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=scripts/versions.sh
. scripts/versions.sh
# shellcheck source=conformance/k8s/lib.sh
. conformance/k8s/lib.sh

WAIT=${1:?usage: $0 WAIT_SECONDS [ROUNDS]}
ROUNDS=${2:-3}
[[ $WAIT =~ ^[0-9]+$ && $ROUNDS =~ ^[1-9][0-9]*$ ]] || { echo "usage: $0 WAIT_SECONDS [ROUNDS]" >&2; exit 2; }
DELAY=${RECOVERY_MULTUS_DELAY:-5}

CLUSTER_DIR=${CNI_GUARD_CLUSTER_DIR:-/var/lib/cni-guard-cluster}
NODE=$CLUSTER_DIR/node
export KUBECONFIG=$CLUSTER_DIR/admin.kubeconfig
K=$KUBERNETES_BIN/kubectl
CONF=$NODE/etc/cni/net.d/00-multus.conf
GUARD_CONF=$NODE/etc/cni/net.d/00-cni-guard.conflist
POD=recovery

say() { echo "k8s recovery: $*" >&2; }
fail() { echo "k8s recovery: FAIL: $*" >&2; exit 1; }
now_ms() { date +%s%3N; }

"$K" -n cni-guard get daemonset cni-guard >/dev/null || fail "the guard is not deployed (scripts/cluster.sh up)"

# The guard with the asked wait; back to the manifest's own when done.
deploy_guard() { # WAIT (empty: the manifest's)
  CLUSTER_GUARD_WAIT=$1 scripts/cluster.sh manifest guard | "$K" apply -f - >/dev/null
  "$K" -n cni-guard rollout status daemonset/cni-guard --timeout=120s >/dev/null
}
restore() {
  "$K" delete pod "$POD" --ignore-not-found --wait=true --timeout=60s >/dev/null 2>&1 || true
  deploy_guard "" 2>/dev/null || true
}
trap restore EXIT
deploy_guard "$WAIT"
for _ in $(seq 100); do
  grep -q "\"waitSeconds\": $WAIT," "$GUARD_CONF" 2>/dev/null && break
  sleep 0.2
done
grep -q "\"waitSeconds\": $WAIT," "$GUARD_CONF" || fail "00-cni-guard.conflist does not say waitSeconds $WAIT: $(cat "$GUARD_CONF")"

# The Multus restart's stand-in delay (the same init container churn.sh adds).
start_delay kube-system kube-multus-ds "$DELAY"
image=$("$K" -n kube-system get daemonset kube-multus-ds -o jsonpath='{.spec.template.spec.containers[0].image}')
for _ in $(seq 300); do [ -s "$CONF" ] && break; sleep 0.2; done
[ -s "$CONF" ] || fail "00-multus.conf is not there before the first round"

k8s_version=$("$K" version -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["serverVersion"]["gitVersion"])')
multus_version=${image##*:}

pod_ready() { # the pod's Ready condition is True
  [ "$("$K" get pod "$POD" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]
}

times=()
for ((r = 1; r <= ROUNDS; r++)); do
  "$K" -n kube-system delete pod -l app=multus --wait=false >/dev/null
  gone=0
  for _ in $(seq 300); do [ -e "$CONF" ] || { gone=1; break; }; sleep 0.05; done
  [ "$gone" = 1 ] || fail "round $r: 00-multus.conf still there 15 s after Multus was deleted"
  sed "s/name: with-net1/name: $POD/" <(scripts/cluster.sh manifest pod-net1.yaml) | "$K" apply -f - >/dev/null
  back=
  for _ in $(seq 2400); do
    if [ -e "$CONF" ]; then back=$(now_ms); break; fi
    sleep 0.05
  done
  [ -n "$back" ] || fail "round $r: Multus did not come back within 120 s"
  ready=
  for _ in $(seq 1800); do
    if pod_ready; then ready=$(now_ms); break; fi
    sleep 0.1
  done
  [ -n "$ready" ] || fail "round $r: $POD not Ready 180 s after Multus was back"
  # Ready only after Multus was back (the condition's time has whole seconds).
  became=$("$K" get pod "$POD" -o jsonpath='{.status.conditions[?(@.type=="Ready")].lastTransitionTime}')
  became_s=$(date -d "$became" +%s) || fail "round $r: no Ready time ($became)"
  [ "$became_s" -ge $((back / 1000 - 1)) ] || fail "round $r: $POD Ready at $became, before 00-multus.conf was back"
  addrs=$("$K" exec "$POD" -- ip -o addr) || fail "round $r: cannot read $POD's addresses"
  grep -q ' net1 .*inet ' <<<"$addrs" || fail "round $r: $POD is Ready without net1: $addrs"
  times+=($((ready - back)))
  say "round $r: wait_seconds=$WAIT pod Ready $((ready - back)) ms after 00-multus.conf was back"
  "$K" delete pod "$POD" --wait=true --timeout=60s >/dev/null
  "$K" -n kube-system rollout status daemonset/kube-multus-ds --timeout=120s >/dev/null
done

read -r median max < <(printf '%s\n' "${times[@]}" | sort -n |
  awk '{ v[NR] = $1 } END { m = (NR % 2) ? v[(NR + 1) / 2] : int((v[NR / 2] + v[NR / 2 + 1]) / 2); print m, v[NR] }')
echo "recovery-summary kubernetes=$k8s_version multus=$multus_version wait_seconds=$WAIT rounds=$ROUNDS median_ms=$median max_ms=$max"
