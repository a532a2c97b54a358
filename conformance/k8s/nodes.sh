#!/usr/bin/env bash
# Checks a cluster of several nodes (CLUSTER_NODES=N scripts/cluster.sh up): every node Ready,
# with Multus's and the guard's pods; on each node a pod with eth0 from that node's range and
# net1; a pod on node 1 reaches the pods of every other node over eth0; each node has its own
# machine-id and hostname. Prints
#
#   nodes-summary nodes=N ready=R multus=M guard=G pods=P full=F reached=C/N-1 machine_ids=distinct|shared
#
# and fails unless every count is N (reached N-1) and the machine-ids are distinct.
#
#   CLUSTER_NODES=3 scripts/cluster.sh up && conformance/k8s/nodes.sh
#
# Leaves the cluster up; removes the pods it made.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=scripts/versions.sh
. scripts/versions.sh

CLUSTER_DIR=${CNI_GUARD_CLUSTER_DIR:-/var/lib/cni-guard-cluster}
export KUBECONFIG=$CLUSTER_DIR/admin.kubeconfig
K=$KUBERNETES_BIN/kubectl

fail() { echo "k8s nodes: FAIL: $*" >&2; exit 1; }
say() { echo "k8s nodes: $*"; }

[ -f "$KUBECONFIG" ] || fail "no cluster ($KUBECONFIG missing): run scripts/cluster.sh up"
mapfile -t nodes < <(scripts/cluster.sh nodes)
n=${#nodes[@]}
[ "$n" -ge 2 ] || fail "the cluster has $n node: CLUSTER_NODES=3 scripts/cluster.sh up"

cleanup() { "$K" delete pod -l cni-guard-test=nodes --ignore-not-found --wait=true --timeout=60s >/dev/null 2>&1 || true; }
trap cleanup EXIT

"$K" get nodes -o wide
running() { # NAMESPACE LABEL NODE: a Ready pod of it on NODE
  [ -n "$("$K" -n "$1" get pod -l "$2" --field-selector "spec.nodeName=$3" -o name)" ] &&
    "$K" -n "$1" wait --for=condition=Ready --timeout=120s pod -l "$2" --field-selector "spec.nodeName=$3" >/dev/null 2>&1
}
ready=0 multus=0 guard=0
for line in "${nodes[@]}"; do
  read -r _ name _ _ <<<"$line"
  if "$K" wait --for=condition=Ready --timeout=120s "node/$name" >/dev/null; then ready=$((ready + 1)); fi
  if running kube-system app=multus "$name"; then multus=$((multus + 1)); fi
  if running cni-guard app.kubernetes.io/name=cni-guard "$name"; then guard=$((guard + 1)); fi
done

# One pod a node, asking for net1.
for line in "${nodes[@]}"; do
  read -r i name _ _ <<<"$line"
  scripts/cluster.sh manifest pod-net1.yaml |
    sed -e "s/^  name: with-net1$/  name: nodes-$i\n  labels: {cni-guard-test: nodes}/" \
      -e "s/^spec:$/spec:\n  nodeName: $name/" | "$K" apply -f - >/dev/null
done
pods=0 full=0
declare -A ip_of
for line in "${nodes[@]}"; do
  read -r i name _ _ <<<"$line"
  "$K" wait --for=condition=Ready --timeout=180s "pod/nodes-$i" >/dev/null ||
    { "$K" describe pod "nodes-$i" | tail -n 5 | cut -c1-600; fail "pod nodes-$i on $name is not Ready"; }
  pods=$((pods + 1))
  status=$("$K" get pod "nodes-$i" -o jsonpath='{.metadata.annotations.k8s\.v1\.cni\.cncf\.io/network-status}')
  addrs=$("$K" exec "nodes-$i" -- ip -o addr) || addrs=
  ip=$("$K" get pod "nodes-$i" -o jsonpath='{.status.podIP}')
  ip_of[$i]=$ip
  if python3 -c 'import json, sys
s = {x.get("interface"): x for x in json.loads(sys.argv[1])}
sys.exit(0 if {"eth0", "net1"} <= set(s) else 1)' "$status" && grep -q " net1 .*inet " <<<"$addrs" &&
    [[ $ip == 10.88.$i.* ]]; then
    full=$((full + 1))
    say "pod nodes-$i on $name: eth0 $ip (the node's range 10.88.$i.0/24) and net1"
  else
    say "pod nodes-$i on $name: not full: eth0 $ip, network-status $status"
  fi
done

# From node 1's pod to every other node's pod, over eth0.
reached=0
for line in "${nodes[@]:1}"; do
  read -r i name _ _ <<<"$line"
  if "$K" exec nodes-1 -- ping -c 2 -W 2 "${ip_of[$i]}" >/dev/null 2>&1; then
    reached=$((reached + 1))
    say "nodes-1 (node 1) reaches nodes-$i ($name, ${ip_of[$i]}) over eth0"
  else
    say "nodes-1 (node 1) does not reach nodes-$i ($name, ${ip_of[$i]})"
  fi
done

# Each node's own machine-id and hostname (node 1 is the host's).
mapfile -t ids < <(for line in "${nodes[@]}"; do
  read -r i _ _ _ <<<"$line"
  scripts/cluster.sh in-node "$i" cat /etc/machine-id
done)
machine_ids=distinct
[ "$(printf '%s\n' "${ids[@]}" | sort -u | wc -l)" = "$n" ] || machine_ids=shared
for line in "${nodes[@]:1}"; do
  read -r i name _ _ <<<"$line"
  h=$(scripts/cluster.sh in-node "$i" hostname)
  [ "$h" = "$name" ] || fail "node $i's hostname is $h, not $name"
done

echo "nodes-summary nodes=$n ready=$ready multus=$multus guard=$guard pods=$pods full=$full reached=$reached/$((n - 1)) machine_ids=$machine_ids"
if ! { [ "$ready" = "$n" ] && [ "$multus" = "$n" ] && [ "$guard" = "$n" ] && [ "$pods" = "$n" ] &&
  [ "$full" = "$n" ] && [ "$reached" = "$((n - 1))" ] && [ "$machine_ids" = distinct ]; }; then
  fail "not every node is whole (nodes-summary above)"
fi
say "ok"
