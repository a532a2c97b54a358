#!/usr/bin/env bash
# The seed's incident on the real node of scripts/cluster.sh. With cni-guard in front (the
# default of scripts/cluster.sh up):
#  1. Multus's pod is taken off the node (a nodeSelector no node has): SIGTERM, and the daemon
#     deletes 00-multus.conf;
#  2. a pod that asks for net1 is created in that window: the guard refuses its sandbox
#     (plugin type="cni-guard" failed (add)), the guard's pod turns NotReady, and no sandbox of
#     that pod is built on the primary network alone;
#  3. Multus comes back (nodeSelector removed), rewrites 00-multus.conf; kubelet's retry builds
#     the sandbox with eth0 and net1.
#
# Without it, in the layout before the seed's fix (CLUSTER_LAYOUT=before-fix scripts/cluster.sh
# up), the incident itself: the pod comes up on 05-cilium.conflist alone, without net1, and stays
# so after Multus is back.
#
#   scripts/cluster.sh up && conformance/k8s/incident.sh
#
# Leaves the cluster up with Multus back in place; removes the pod it made.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=scripts/versions.sh
. scripts/versions.sh

CLUSTER_DIR=${CNI_GUARD_CLUSTER_DIR:-/var/lib/cni-guard-cluster}
NODE=$CLUSTER_DIR/node
export KUBECONFIG=$CLUSTER_DIR/admin.kubeconfig
K=$KUBERNETES_BIN/kubectl
POD=incident

fail() { echo "k8s incident: FAIL: $*" >&2; exit 1; }
ok() { echo "k8s incident: ok: $*"; }

guard=1
deployed=$("$K" -n cni-guard get daemonset cni-guard --ignore-not-found -o name) # an error fails
if [ -z "$deployed" ]; then
  guard=
  [ -e "$NODE/etc/cni/net.d/05-cilium.conflist" ] ||
    fail "neither cni-guard nor the before-fix layout (CLUSTER_LAYOUT=before-fix) is there"
fi

restore() {
  "$K" -n kube-system patch daemonset kube-multus-ds --type=json \
    -p '[{"op":"remove","path":"/spec/template/spec/nodeSelector"}]' >/dev/null 2>&1 || true
  "$K" delete pod "$POD" --ignore-not-found --wait=true --timeout=60s >/dev/null 2>&1 || true
}
trap restore EXIT

# 1. Multus off the node.
"$K" -n kube-system patch daemonset kube-multus-ds --type=merge \
  -p '{"spec":{"template":{"spec":{"nodeSelector":{"cni-guard.test/no-such-label":"x"}}}}}' >/dev/null
for _ in $(seq 60); do [ -e "$NODE/etc/cni/net.d/00-multus.conf" ] || break; sleep 1; done
[ ! -e "$NODE/etc/cni/net.d/00-multus.conf" ] || fail "00-multus.conf is still there 60 s after Multus went"
ok "Multus stopped; it deleted 00-multus.conf (conf dir: $(cd "$NODE/etc/cni/net.d" && echo *))"

# 2. A pod in the window.
sed "s/name: with-net1/name: $POD/" <(scripts/cluster.sh manifest pod-net1.yaml) | "$K" apply -f - >/dev/null
uid=$("$K" get pod "$POD" -o jsonpath='{.metadata.uid}') # this pod's events, not an earlier one's
if [ -z "$guard" ]; then
  # The incident as it was: containerd falls back to 05-cilium.conflist.
  "$K" wait --for=condition=Ready --timeout=120s "pod/$POD" >/dev/null || fail "pod $POD is not Ready"
  addrs=$("$K" exec "$POD" -- ip -o addr)
  if grep -q ' net1 ' <<<"$addrs"; then fail "pod $POD got a net1 without Multus"; fi
  ok "INCIDENT REPRODUCED (no guard, before-fix layout): $POD Running on 05-cilium.conflist alone, no net1"
  "$K" -n kube-system patch daemonset kube-multus-ds --type=json \
    -p '[{"op":"remove","path":"/spec/template/spec/nodeSelector"}]' >/dev/null
  "$K" -n kube-system rollout status daemonset/kube-multus-ds --timeout=120s >/dev/null
  wait_conf=0
  for _ in $(seq 60); do [ -e "$NODE/etc/cni/net.d/00-multus.conf" ] && { wait_conf=1; break; }; sleep 1; done
  [ "$wait_conf" = 1 ] || fail "Multus did not rewrite 00-multus.conf"
  addrs=$("$K" exec "$POD" -- ip -o addr)
  if grep -q ' net1 ' <<<"$addrs"; then fail "pod $POD got a net1 later"; fi
  ok "Multus is back, and $POD still has no net1 (only replacing the pod would help)"
  exit 0
fi
msg=
for _ in $(seq 60); do
  msg=$("$K" get events --field-selector "involvedObject.uid=$uid,reason=FailedCreatePodSandBox" \
    -o jsonpath='{.items[0].message}' 2>/dev/null || true)
  [ -n "$msg" ] && break
  sleep 1
done
echo "event: ${msg:0:400}"
grep -q 'plugin type="cni-guard" failed (add): .*00-multus.conf' <<<"$msg" ||
  fail "no sandbox refusal by cni-guard naming 00-multus.conf for $POD"
phase=$("$K" get pod "$POD" -o jsonpath='{.status.phase}')
[ "$phase" = Pending ] || fail "pod $POD is $phase while Multus is away"
ok "the guard refused $POD's sandbox while 00-multus.conf was missing (pod Pending)"
"$K" -n cni-guard wait --for=condition=Ready=false pod -l app.kubernetes.io/name=cni-guard --timeout=40s >/dev/null ||
  fail "the guard's pod stayed Ready without 00-multus.conf"
ok "the guard's readiness probe reports the node unguarded"
# What an operator sees during the outage, kept for the README's troubleshooting section.
CAPTURE=${CNI_GUARD_K8S_CAPTURE:-/tmp/cni-guard-k8s-operator}
mkdir -p "$CAPTURE"
"$K" -n cni-guard get pods >"$CAPTURE/get-pods-outage.txt"
"$K" describe pod "$POD" | sed -n '/^Events:/,$p' >"$CAPTURE/describe-events.txt"
"$K" get pod "$POD" >"$CAPTURE/get-pod-outage.txt"
"$K" -n cni-guard describe pod -l app.kubernetes.io/name=cni-guard | sed -n '/^Events:/,$p' >"$CAPTURE/guard-events.txt"
for f in get-pods-outage get-pod-outage describe-events guard-events; do
  echo "--- kubectl output during the outage: $f"
  cat "$CAPTURE/$f.txt"
done
grep -Eq '^cni-guard-[a-z0-9]+ +0/1 +Running' "$CAPTURE/get-pods-outage.txt" ||
  fail "kubectl get pods -n cni-guard does not show 0/1 Running during the outage"
grep -q 'FailedCreatePodSandBox' "$CAPTURE/describe-events.txt" ||
  fail "kubectl describe pod shows no FailedCreatePodSandBox event"

# 3. Multus back.
"$K" -n kube-system patch daemonset kube-multus-ds --type=json \
  -p '[{"op":"remove","path":"/spec/template/spec/nodeSelector"}]' >/dev/null
"$K" -n kube-system rollout status daemonset/kube-multus-ds --timeout=120s >/dev/null
"$K" wait --for=condition=Ready --timeout=300s "pod/$POD" >/dev/null || fail "pod $POD is not Ready after Multus came back"
status=$("$K" get pod "$POD" -o jsonpath='{.metadata.annotations.k8s\.v1\.cni\.cncf\.io/network-status}')
python3 - "$status" <<'PY'
import json, sys
ifs = {s.get("interface") for s in json.loads(sys.argv[1])}
assert {"eth0", "net1"} <= ifs, ifs
PY
"$K" exec "$POD" -- ip -o addr | grep -q ' net1 .*inet ' || fail "no net1 inside $POD"
ok "after Multus came back, kubelet's retry gave $POD eth0 and net1"
"$K" -n cni-guard wait --for=condition=Ready pod -l app.kubernetes.io/name=cni-guard --timeout=60s >/dev/null ||
  fail "the guard's pod is not Ready again"
ok "the guard's pod is Ready again"
"$K" -n cni-guard get pods | tee "$CAPTURE/get-pods-after.txt"
grep -Eq '^cni-guard-[a-z0-9]+ +1/1 +Running' "$CAPTURE/get-pods-after.txt" ||
  fail "kubectl get pods -n cni-guard does not show 1/1 Running after the outage"
