#!/usr/bin/env bash
# See the guard hold a pod while Multus is away from one node, then give it its network.
#
#   scripts/hold-test.sh --node NODE [options]
#
#   --node NODE              the node to test (required)
#   --namespace NS           where the test pod and its network go [default]; yours, not the
#                            guard's
#   --image IMAGE            the test pod's image: one with /bin/sleep [busybox:1.36]
#   --hold SECONDS           how long to keep Multus away once the pod is created [20]
#   --network NAME           a NetworkAttachmentDefinition of yours in NS for the pod's net1;
#                            without it the test makes its own, cni-guard-hold-test (ptp with
#                            host-local in 198.51.100.0/24), and removes it afterwards
#   --multus-namespace NS    where Multus's DaemonSet is [kube-system]
#   --multus-daemonset NAME  its name [kube-multus-ds]
#
# What it does, with kubectl (and python3 for reading its JSON):
#   1. checks that the guard's pod on NODE is Ready (the guard is installed and ADD would proceed);
#   2. keeps Multus off NODE: a node affinity on Multus's DaemonSet that excludes NODE (its pods
#      on the other nodes restart once for the changed template, one at a time, as the
#      DaemonSet's update strategy says), and waits until the guard on NODE sees Multus gone;
#   3. creates a pod pinned to NODE that asks for the network, in NS;
#   4. for --hold seconds, checks that the pod is held: no container started, Pending, while
#      the guard refuses its sandbox (an event naming cni-guard) or holds its ADD;
#   5. puts Multus's DaemonSet back as it was, and checks that the pod becomes Ready with eth0
#      and net1 (Multus's network-status), then removes what it made.
# Multus's DaemonSet is put back whatever happens (also on Ctrl-C). Prints at the end
#
#   hold-test-summary node=.. namespace=.. held_s=H refused=R ready_after_multus_s=T net1=yes result=pass
#
# and exits 0; on any miss it says what and exits 1.
set -euo pipefail

NODE='' NS=default IMAGE=busybox:1.36 HOLD=20 NETWORK='' MULTUS_NS=kube-system MULTUS_DS=kube-multus-ds
while [ $# -gt 0 ]; do
  case $1 in
    --node) NODE=$2; shift ;;
    --namespace) NS=$2; shift ;;
    --image) IMAGE=$2; shift ;;
    --hold) HOLD=$2; shift ;;
    --network) NETWORK=$2; shift ;;
    --multus-namespace) MULTUS_NS=$2; shift ;;
    --multus-daemonset) MULTUS_DS=$2; shift ;;
    -h | --help) sed -n '2,31p' "$0"; exit 0 ;;
    *) echo "hold-test: unknown argument $1 (--help)" >&2; exit 2 ;;
  esac
  shift
done
[ -n "$NODE" ] || { echo "hold-test: --node is required (--help)" >&2; exit 2; }
[[ $HOLD =~ ^[0-9]+$ ]] || { echo "hold-test: --hold takes whole seconds" >&2; exit 2; }
K=${KUBECTL:-kubectl}
POD=cni-guard-hold-test
say() { echo "hold-test: $*" >&2; }
fail() { echo "hold-test: FAIL: $*" >&2; exit 1; }

# --- what is there -------------------------------------------------------------------------------
"$K" get node "$NODE" >/dev/null || fail "no node $NODE"
guard_pod() { # the guard's pod on NODE, as NAMESPACE/NAME, whatever its release is called
  "$K" get pods -A -l app.kubernetes.io/name=cni-guard --field-selector "spec.nodeName=$NODE" \
    -o jsonpath='{range .items[*]}{.metadata.namespace}/{.metadata.name}{"\n"}{end}' | head -n 1
}
guard_ready() { # True or False: the guard's pod on NODE
  local g
  g=$(guard_pod)
  [ -n "$g" ] || { echo none; return; }
  "$K" -n "${g%%/*}" get pod "${g#*/}" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}'
}
[ -n "$(guard_pod)" ] || fail "no cni-guard pod on $NODE (label app.kubernetes.io/name=cni-guard)"
[ "$(guard_ready)" = True ] ||
  fail "the guard's pod on $NODE ($(guard_pod)) is not Ready: ADD would not proceed there now, before the test (kubectl describe it)"
"$K" -n "$MULTUS_NS" get daemonset "$MULTUS_DS" >/dev/null ||
  fail "no DaemonSet $MULTUS_NS/$MULTUS_DS (--multus-namespace, --multus-daemonset)"
selector=$("$K" -n "$MULTUS_NS" get daemonset "$MULTUS_DS" -o json |
  python3 -c 'import json,sys; print(",".join(f"{k}={v}" for k, v in json.load(sys.stdin)["spec"]["selector"]["matchLabels"].items()))')
multus_on_node() { # Multus's pods on NODE: "name ready" lines
  "$K" -n "$MULTUS_NS" get pods -l "$selector" --field-selector "spec.nodeName=$NODE" \
    -o jsonpath='{range .items[*]}{.metadata.name} {.status.containerStatuses[0].ready}{"\n"}{end}'
}
WORK=$(mktemp -d)
original_affinity=$("$K" -n "$MULTUS_NS" get daemonset "$MULTUS_DS" -o jsonpath='{.spec.template.spec.affinity}')
echo "$original_affinity" >"$WORK/affinity"

# Multus's DaemonSet's affinity as it was before the test (none: removed).
put_back_affinity() {
  if [ -s "$WORK/affinity" ]; then
    "$K" -n "$MULTUS_NS" patch daemonset "$MULTUS_DS" --type=json \
      -p "[{\"op\":\"replace\",\"path\":\"/spec/template/spec/affinity\",\"value\":$(cat "$WORK/affinity")}]" >/dev/null
  else
    "$K" -n "$MULTUS_NS" patch daemonset "$MULTUS_DS" --type=json \
      -p '[{"op":"remove","path":"/spec/template/spec/affinity"}]' >/dev/null
  fi
}
restore() {
  local rc=$?
  trap - EXIT INT TERM
  if [ -e "$WORK/excluded" ]; then
    if put_back_affinity; then say "Multus's DaemonSet put back as it was"
    else say "could not put Multus's DaemonSet back: do it by hand"; rc=1; fi
  fi
  "$K" -n "$NS" delete pod "$POD" --ignore-not-found --wait=false >/dev/null 2>&1 || true
  [ -n "$NETWORK" ] || "$K" -n "$NS" delete network-attachment-definition cni-guard-hold-test --ignore-not-found >/dev/null 2>&1 || true
  rm -rf "$WORK"
  exit "$rc"
}
trap restore EXIT
trap 'exit 130' INT TERM

# --- the network ---------------------------------------------------------------------------------
if [ -z "$NETWORK" ]; then
  NETWORK=cni-guard-hold-test
  "$K" apply -f - >/dev/null <<EOF
apiVersion: k8s.cni.cncf.io/v1
kind: NetworkAttachmentDefinition
metadata:
  name: $NETWORK
  namespace: $NS
spec:
  config: |
    {"cniVersion": "0.3.1", "name": "cni-guard-hold-test", "type": "ptp",
     "ipam": {"type": "host-local", "subnet": "198.51.100.0/24"}}
EOF
  say "made the NetworkAttachmentDefinition $NS/$NETWORK (ptp, host-local 198.51.100.0/24)"
else
  "$K" -n "$NS" get network-attachment-definition "$NETWORK" >/dev/null ||
    fail "no NetworkAttachmentDefinition $NS/$NETWORK"
fi

# --- Multus off the node -------------------------------------------------------------------------
"$K" -n "$MULTUS_NS" get daemonset "$MULTUS_DS" -o json | python3 -c '
import json, sys
node = sys.argv[1]
spec = json.load(sys.stdin)["spec"]["template"]["spec"]
aff = spec.get("affinity") or {}
req = aff.setdefault("nodeAffinity", {}).setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
terms = req.get("nodeSelectorTerms") or [{}]
away = {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": [node]}
for t in terms:  # the terms are ORed: each one excludes the node
    t.setdefault("matchExpressions", []).append(away)
req["nodeSelectorTerms"] = terms
print(json.dumps([{"op": "add", "path": "/spec/template/spec/affinity", "value": aff}]))
' "$NODE" >"$WORK/patch"
touch "$WORK/excluded"
"$K" -n "$MULTUS_NS" patch daemonset "$MULTUS_DS" --type=json -p "$(cat "$WORK/patch")" >/dev/null
say "Multus's DaemonSet excludes $NODE (node affinity); waiting for its pod there to go"
for _ in $(seq 180); do [ -z "$(multus_on_node)" ] && break; sleep 1; done
[ -z "$(multus_on_node)" ] || fail "Multus's pod on $NODE did not go within 180 s"
for _ in $(seq 60); do [ "$(guard_ready)" = False ] && break; sleep 1; done
[ "$(guard_ready)" = False ] ||
  fail "Multus is off $NODE, but the guard's pod there stayed Ready: the guard does not see it gone (is its delegate Multus's file?)"
say "Multus is off $NODE; the guard's pod there is not Ready (ADD would be refused or held)"

# --- the pod, held -------------------------------------------------------------------------------
"$K" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: $POD
  namespace: $NS
  annotations:
    k8s.v1.cni.cncf.io/networks: $NETWORK
spec:
  nodeName: $NODE
  terminationGracePeriodSeconds: 1
  containers:
    - name: main
      image: $IMAGE
      command: ["/bin/sleep", "3600"]
EOF
uid=$("$K" -n "$NS" get pod "$POD" -o jsonpath='{.metadata.uid}')
say "created $NS/$POD on $NODE; holding Multus away for $HOLD s"
start=$SECONDS
while ((SECONDS - start < HOLD)); do
  state=$("$K" -n "$NS" get pod "$POD" -o jsonpath='{.status.phase} {.status.containerStatuses[0].state}')
  case $state in
    Pending*running* | Running*) fail "$POD started while Multus was away from $NODE: not held ($state)" ;;
  esac
  sleep 1
done
held=$((SECONDS - start))
events=$("$K" -n "$NS" get events --field-selector "involvedObject.uid=$uid,reason=FailedCreatePodSandBox" \
  -o jsonpath='{range .items[*]}{.count} {.message}{"\n"}{end}')
refused=$(awk '/cni-guard/ { n += $1 } END { print n + 0 }' <<<"$events")
other=$(grep -v 'cni-guard' <<<"$events" | grep -c . || true)
[ "$other" = 0 ] || fail "a sandbox of $POD failed for another reason than the guard's: $(grep -v cni-guard <<<"$events" | head -n 1)"
if [ "$refused" -gt 0 ]; then
  say "held $held s: the guard refused the sandbox $refused times ($(grep -m1 -o 'cni-guard: [^;]*' <<<"$events" | head -c 200))"
else
  say "held $held s: the guard holds the sandbox's ADD (its waitSeconds), no sandbox was built"
fi

# --- Multus back ---------------------------------------------------------------------------------
back=$SECONDS
put_back_affinity
rm -f "$WORK/excluded"
say "Multus's DaemonSet put back as it was; waiting for $POD"
"$K" -n "$NS" wait --for=condition=Ready --timeout=300s "pod/$POD" >/dev/null ||
  fail "$POD is not Ready within 300 s of Multus's return"
ready_after=$((SECONDS - back))
status=$("$K" -n "$NS" get pod "$POD" -o jsonpath='{.metadata.annotations.k8s\.v1\.cni\.cncf\.io/network-status}')
python3 - "$status" <<'PY' || fail "$POD is Ready but Multus's network-status lacks eth0 or net1: $status"
import json, sys
ifs = {s.get("interface") for s in json.loads(sys.argv[1])}
sys.exit(not {"eth0", "net1"} <= ifs)
PY
say "$POD Ready with eth0 and net1, $ready_after s after Multus was put back"
echo "hold-test-summary node=$NODE namespace=$NS held_s=$held refused=$refused ready_after_multus_s=$ready_after net1=yes result=pass"
