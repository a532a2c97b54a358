#!/usr/bin/env bash
# Multus's auto-config electing the guard, on the real node of scripts/cluster.sh (issue 12).
# In the layout before the seed's fix Multus's multusAutoconfigDir is the conf dir containerd
# reads; left on auto (no multusMasterCNI), Multus elects the first file there not named
# 00-multus*, which is 00-cni-guard.conflist once the guard is installed. After its next restart
# Multus writes that file as clusterNetwork into 00-multus.conf. The guard must name this:
#  1. a pod's sandbox is refused with code 7 quoting clusterNetwork and the fix (multusMasterCNI);
#  2. the guard's readiness probe fails on its recursion line.
# Brings the node up in that layout (CLUSTER_LAYOUT=before-fix CLUSTER_GUARD=1
# CLUSTER_MULTUS_MASTER=auto); leaves it up.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=scripts/versions.sh
. scripts/versions.sh

CLUSTER_DIR=${CNI_GUARD_CLUSTER_DIR:-/var/lib/cni-guard-cluster}
NODE=$CLUSTER_DIR/node
export KUBECONFIG=$CLUSTER_DIR/admin.kubeconfig
K=$KUBERNETES_BIN/kubectl
CONF=$NODE/etc/cni/net.d/00-multus.conf
POD=elected
SEL='app.kubernetes.io/name=cni-guard'

fail() { echo "k8s autoconfig: FAIL: $*" >&2; exit 1; }
ok() { echo "k8s autoconfig: ok: $*"; }

scripts/cluster.sh down >/dev/null 2>&1 || true
CLUSTER_LAYOUT=before-fix CLUSTER_GUARD=1 CLUSTER_MULTUS_MASTER=auto scripts/cluster.sh up >/dev/null
trap '"$K" delete pod "$POD" --ignore-not-found --wait=false >/dev/null 2>&1 || true' EXIT

grep -q '"clusterNetwork":"[^"]*/05-cilium.conflist"' "$CONF" ||
  fail "at its first start Multus should elect 05-cilium.conflist: $(cat "$CONF")"
ok "first start: Multus elected 05-cilium.conflist (the guard was not there yet)"
"$K" -n kube-system delete pod -l app=multus --wait=true --timeout=60s >/dev/null
"$K" -n kube-system rollout status daemonset/kube-multus-ds --timeout=120s >/dev/null
for _ in $(seq 60); do grep -q '"clusterNetwork":"[^"]*/00-cni-guard.conflist"' "$CONF" 2>/dev/null && break; sleep 1; done
grep -q '"clusterNetwork":"[^"]*/00-cni-guard.conflist"' "$CONF" ||
  fail "after a restart Multus should elect 00-cni-guard.conflist: $(cat "$CONF" 2>/dev/null)"
ok "after a restart: Multus elected 00-cni-guard.conflist as its cluster network"

sed "s/name: with-net1/name: $POD/" <(scripts/cluster.sh manifest pod-net1.yaml) | "$K" apply -f - >/dev/null
uid=$("$K" get pod "$POD" -o jsonpath='{.metadata.uid}')
msg=
for _ in $(seq 60); do
  msg=$("$K" get events --field-selector "involvedObject.uid=$uid,reason=FailedCreatePodSandBox" \
    -o jsonpath='{.items[0].message}' 2>/dev/null || true)
  [ -n "$msg" ] && break
  sleep 1
done
echo "event: $msg"
grep -q 'plugin type="cni-guard" failed (add): cni-guard is misconfigured: .*clusterNetwork.*00-cni-guard.conflist.*multusMasterCNI' <<<"$msg" ||
  fail "the refusal does not name Multus's clusterNetwork and the fix"
ok "the guard refused $POD's sandbox naming clusterNetwork and multusMasterCNI"
"$K" -n cni-guard wait --for=condition=Ready=false pod -l "$SEL" --timeout=40s >/dev/null ||
  fail "the guard's pod stayed Ready"
# The pod's events from the first failed probe on: an earlier failure (00-multus.conf missing
# during Multus's restart) may come first, so the whole section is searched.
probe=
for _ in $(seq 30); do
  probe=$("$K" -n cni-guard describe pod -l "$SEL" | sed -n '/Readiness probe failed/,$p')
  grep -q '✗ recursion' <<<"$probe" && break
  sleep 1
done
echo "$probe"
grep -q '✗ recursion' <<<"$probe" || fail "the probe's output has no failing recursion line"
ok "the guard's readiness probe fails on its recursion line"
