#!/usr/bin/env bash
# Checks the running node of scripts/cluster.sh (issue 12): a plain pod gets the primary network
# (eth0 in 05-cilium.conflist's subnet), and a pod annotated
# k8s.v1.cni.cncf.io/networks: macvlan-net1 gets eth0 and net1 through Multus, both in its
# k8s.v1.cni.cncf.io/network-status annotation and in `ip addr` inside it. When cni-guard's
# DaemonSet is there (scripts/cluster.sh deploys it unless CLUSTER_GUARD=0): it is Ready,
# containerd's network is the guard's, and the guard recorded the annotated pod's ADD.
#
#   scripts/cluster.sh up && conformance/k8s/check.sh
#
# Leaves the cluster up; removes the pods it made.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=scripts/versions.sh
. scripts/versions.sh

CLUSTER_DIR=${CNI_GUARD_CLUSTER_DIR:-/var/lib/cni-guard-cluster}
export KUBECONFIG=$CLUSTER_DIR/admin.kubeconfig
K=$KUBERNETES_BIN/kubectl
POD_PREFIX=10.88.
NET1_PREFIX=10.99.0.

fail() { echo "k8s check: FAIL: $*" >&2; exit 1; }
ok() { echo "k8s check: ok: $*"; }

[ -f "$KUBECONFIG" ] || fail "no cluster ($KUBECONFIG missing): run scripts/cluster.sh up"
manifest() { scripts/cluster.sh manifest "$1"; }

cleanup() { "$K" delete pod plain with-net1 --ignore-not-found --wait=true --timeout=60s >/dev/null 2>&1 || true; }
trap cleanup EXIT

NODE=$CLUSTER_DIR/node
crictl() {
  "$CRICTL_BIN/crictl" --runtime-endpoint "unix://$NODE/run/containerd/containerd.sock" "$@" 2>/dev/null
}

"$K" get node -o wide
"$K" -n kube-system rollout status daemonset/kube-multus-ds --timeout=120s
# Is the guard deployed? (A failed call fails the check: --ignore-not-found makes "not found" the
# only empty answer.)
deployed=$("$K" -n cni-guard get daemonset cni-guard --ignore-not-found -o name)
guard=
if [ -n "$deployed" ]; then
  guard=1
  "$K" -n cni-guard rollout status daemonset/cni-guard --timeout=120s
  "$K" -n cni-guard wait --for=condition=Ready pod -l app.kubernetes.io/name=cni-guard --timeout=60s >/dev/null ||
    fail "the guard's readiness probe (cni-guard-agent check) does not pass"
  networks=$(crictl info | python3 -c 'import json, sys; print(" ".join(n["Config"]["Name"] for n in json.load(sys.stdin)["cniconfig"]["Networks"]))')
  [ "$networks" = "cni-loopback guarded-pod-network" ] || fail "containerd's networks are '$networks'"
  ok "cni-guard Ready; containerd builds sandboxes on guarded-pod-network (00-cni-guard.conflist)"
fi

# A plain pod: eth0 only.
manifest pod-plain.yaml | "$K" apply -f - >/dev/null
"$K" wait --for=condition=Ready --timeout=120s pod/plain >/dev/null ||
  { "$K" describe pod plain | tail -n 4 | cut -c1-700; fail "pod plain is not Ready"; }
ip=$("$K" get pod plain -o jsonpath='{.status.podIP}')
case "$ip" in "$POD_PREFIX"*) ok "pod plain Running, IP $ip (primary network)" ;; *) fail "pod plain has IP '$ip'" ;; esac
addrs=$("$K" exec plain -- ip -o addr)
grep -q " eth0 .*inet $ip/" <<<"$addrs" || fail "eth0 in pod plain does not hold $ip: $addrs"
if grep -q ' net1 ' <<<"$addrs"; then fail "pod plain has a net1: $addrs"; fi
ok "pod plain: eth0 $ip, no net1"

# A pod asking for net1.
manifest pod-net1.yaml | "$K" apply -f - >/dev/null
"$K" wait --for=condition=Ready --timeout=120s pod/with-net1 >/dev/null ||
  { "$K" describe pod with-net1 | tail -n 4 | cut -c1-700; fail "pod with-net1 is not Ready"; }
status=$("$K" get pod with-net1 -o jsonpath='{.metadata.annotations.k8s\.v1\.cni\.cncf\.io/network-status}')
echo "network-status: $status"
python3 - "$status" "$POD_PREFIX" "$NET1_PREFIX" <<'PY'
import json, sys
status, pod_prefix, net1_prefix = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
by_if = {s.get("interface"): s for s in status}
assert set(by_if) >= {"eth0", "net1"}, f"interfaces {sorted(map(str, by_if))}"
eth0, net1 = by_if["eth0"], by_if["net1"]
assert eth0.get("default") is True and eth0["ips"][0].startswith(pod_prefix), eth0
assert net1["name"] == "default/macvlan-net1" and net1["ips"][0].startswith(net1_prefix), net1
PY
ok "network-status lists eth0 (default, primary) and net1 (default/macvlan-net1)"
addrs=$("$K" exec with-net1 -- ip -o addr)
echo "$addrs" | grep -E ' (eth0|net1) .*inet ' || true
grep -q " eth0 .*inet $POD_PREFIX" <<<"$addrs" || fail "no eth0 address in with-net1: $addrs"
grep -q " net1 .*inet $NET1_PREFIX" <<<"$addrs" || fail "no net1 address in with-net1: $addrs"
ok "pod with-net1: eth0 and net1 inside the pod"
if [ -n "$guard" ]; then
  sandbox=$(crictl pods -q --name with-net1 --state ready | head -n1)
  record=$NODE/var/lib/cni/cni-guard/guarded-pod-network/$sandbox:eth0.json
  if [ -z "$sandbox" ] || [ ! -f "$record" ]; then fail "no ADD record of the guard for with-net1 ($record)"; fi
  ok "the guard ran with-net1's ADD (record $record)"
fi
