#!/usr/bin/env bash
# Per-pod awareness (issue 18) on the real node of scripts/cluster.sh, with the real Multus:
#
#   conformance/k8s/perpod.sh [PLAIN_PODS]
#
# The guard is redeployed with --per-pod-primary (Multus's clusterNetwork file, the node's
# 05-cilium.conflist) and --wait-seconds=0 (so that a refusal shows as one, at once). Then, while
# Multus is off the node (a nodeSelector no node has: its daemon removes 00-multus.conf):
#  1. PLAIN_PODS pods (default 3) that ask for no Multus network start at once on the primary:
#     Running with eth0 only, no network-status annotation (Multus never saw them);
#  2. a pod asking for net1 (k8s.v1.cni.cncf.io/networks) and one replacing its default network
#     (v1.multus-cni.io/default-network) are refused, their events naming why;
#  3. with the guard told of Multus defaultNetworks, a plain pod in `default` is refused and one
#     in kube-system (Multus's systemNamespaces) starts on the primary.
# Then Multus comes back: the networked pod gets eth0 and net1, the default-network pod its
# network; a bypassed pod's DEL runs the primary's DEL from the guard's record (the guard's log
# says deleted-recorded, and its host-local lease is freed). Every test pod deleted, no lease of
# theirs is left in the primary's or net1's IPAM folder and no record in the guard's cache. Prints
#
#   perpod-summary kubernetes=.. multus=.. plain_started_during_outage=N/N networked_bare=0 leaked=0
#
# Leaves the cluster up with Multus back and the guard as the manifest has it.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=scripts/versions.sh
. scripts/versions.sh

PLAIN=${1:-3}
[[ $PLAIN =~ ^[1-9][0-9]*$ ]] || { echo "usage: $0 [PLAIN_PODS]" >&2; exit 2; }

CLUSTER_DIR=${CNI_GUARD_CLUSTER_DIR:-/var/lib/cni-guard-cluster}
NODE=$CLUSTER_DIR/node
export KUBECONFIG=$CLUSTER_DIR/admin.kubeconfig
K=$KUBERNETES_BIN/kubectl
CONF=$NODE/etc/cni/net.d/00-multus.conf
GUARD_CONF=$NODE/etc/cni/net.d/00-cni-guard.conflist
PRIMARY=/etc/cni/multus/net.d/05-cilium.conflist
LEASES=$NODE/var/lib/cni/networks
CACHE=$NODE/var/lib/cni/cni-guard
GUARD_LOG=$CLUSTER_DIR/logs/guard-syslog.log # the guard's log on the node (scripts/cluster.sh)
crictl() {
  "$CRICTL_BIN/crictl" --runtime-endpoint "unix://$NODE/run/containerd/containerd.sock" --timeout 20s "$@"
}

say() { echo "k8s perpod: $*" >&2; }
ok() { echo "k8s perpod: ok: $*" >&2; }
fail() { echo "k8s perpod: FAIL: $*" >&2; exit 1; }

"$K" -n cni-guard get daemonset cni-guard >/dev/null || fail "the guard is not deployed (scripts/cluster.sh up)"
[ -s "$NODE$PRIMARY" ] || fail "no primary at $NODE$PRIMARY (the seed's layout)"

W=$(mktemp -d /tmp/cni-guard-perpod.XXXXXX)
multus_back() {
  "$K" -n kube-system patch daemonset kube-multus-ds --type=json \
    -p '[{"op":"remove","path":"/spec/template/spec/nodeSelector"}]' >/dev/null 2>&1 || true
}
cleanup() {
  multus_back
  "$K" delete pod -A -l cni-guard.test/perpod --ignore-not-found --wait=true --timeout=90s >/dev/null 2>&1 || true
  scripts/cluster.sh manifest guard | "$K" apply -f - >/dev/null 2>&1 || true
  # Until the manifest's guard has rewritten its conflist (no per-pod keys, its own wait): the
  # next script reads that file.
  "$K" -n cni-guard rollout status daemonset/cni-guard --timeout=120s >/dev/null 2>&1 || true
  for _ in $(seq 300); do
    grep -q '"perPodPrimary"' "$GUARD_CONF" 2>/dev/null || break
    sleep 0.2
  done
  rm -rf "$W"
}
trap cleanup EXIT

deploy_guard() { # EXTRA_ARGS...: the guard with per-pod awareness (and these flags)
  CLUSTER_GUARD_WAIT=0 CLUSTER_GUARD_ARGS="--per-pod-primary=$PRIMARY $*" scripts/cluster.sh manifest guard |
    "$K" apply -f - >/dev/null
  # While Multus is away the guard's pod is NotReady by design (its probe): a rollout never
  # completes then, so what counts is the conflist its install container writes.
  if [ -e "$CONF" ]; then
    "$K" -n cni-guard rollout status daemonset/cni-guard --timeout=120s >/dev/null
  fi
  local defaults=0
  case " $* " in *" --multus-default-network="*) defaults=1 ;; esac
  for _ in $(seq 300); do
    if grep -q '"perPodPrimary"' "$GUARD_CONF" 2>/dev/null; then
      if grep -q '"multusDefaultNetworks"' "$GUARD_CONF"; then has=1; else has=0; fi
      [ "$has" = "$defaults" ] && return 0
    fi
    sleep 0.2
  done
  fail "00-cni-guard.conflist does not have the per-pod keys asked for ($*): $(cat "$GUARD_CONF")"
}

pod() { # NAME NAMESPACE [ANNOTATION=VALUE]: a test pod
  local name=$1 ns=$2 ann=${3:-}
  {
    echo "apiVersion: v1"
    echo "kind: Pod"
    echo "metadata:"
    echo "  name: $name"
    echo "  namespace: $ns"
    echo "  labels: {cni-guard.test/perpod: \"1\"}"
    if [ -n "$ann" ]; then
      echo "  annotations:"
      echo "    ${ann%%=*}: \"${ann#*=}\""
    fi
    echo "spec:"
    echo "  terminationGracePeriodSeconds: 1"
    echo "  containers:"
    echo "    - name: main"
    echo "      image: localhost/cni-guard-test/busybox:1"
    echo "      imagePullPolicy: Never"
    echo "      command: [\"/bin/sleep\", \"3600\"]"
  } | "$K" apply -f - >/dev/null
}
ready() { # NAME NAMESPACE
  [ "$("$K" -n "$2" get pod "$1" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]
}
wait_ready() { # NAME NAMESPACE SECONDS
  local i
  for ((i = 0; i < $3 * 2; i++)); do ready "$1" "$2" && return 0; sleep 0.5; done
  return 1
}
refusal() { # NAME NAMESPACE: the first FailedCreatePodSandBox message of the pod (waits 60 s)
  local uid msg=
  uid=$("$K" -n "$2" get pod "$1" -o jsonpath='{.metadata.uid}')
  for _ in $(seq 60); do
    # (range, not items[0]: jsonpath fails on an index into an empty list, before the first event)
    msg=$("$K" -n "$2" get events --field-selector "involvedObject.uid=$uid,reason=FailedCreatePodSandBox" \
      -o jsonpath='{range .items[*]}{.message}{"\n"}{end}') || fail "cannot read the events of $1"
    msg=$(head -n 1 <<<"$msg")
    [ -n "$msg" ] && break
    sleep 1
  done
  echo "$msg"
}
interfaces() { # NAME NAMESPACE: the pod's interfaces with an IPv4 address
  "$K" -n "$2" exec "$1" -- ip -o -4 addr | awk '{print $2}' | sort | tr '\n' ' '
}
sandbox() { # NAME NAMESPACE: the pod's ready sandbox id
  crictl pods --namespace "$2" --name "^$1\$" --state ready -q | head -n 1
}

k8s_version=$("$K" version -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["serverVersion"]["gitVersion"])')
image=$("$K" -n kube-system get daemonset kube-multus-ds -o jsonpath='{.spec.template.spec.containers[0].image}')
multus_version=${image##*:}
log_from=$(($(stat -c %s "$GUARD_LOG") + 1))

deploy_guard
ok "the guard runs with --per-pod-primary=$PRIMARY"

# --- the outage ----------------------------------------------------------------------------------
"$K" -n kube-system patch daemonset kube-multus-ds --type=merge \
  -p '{"spec":{"template":{"spec":{"nodeSelector":{"cni-guard.test/no-such-label":"x"}}}}}' >/dev/null
for _ in $(seq 60); do [ -e "$CONF" ] || break; sleep 1; done
[ ! -e "$CONF" ] || fail "00-multus.conf is still there 60 s after Multus went"
ok "Multus is off the node; 00-multus.conf is gone"

# 1. Plain pods start at once on the primary.
for ((i = 1; i <= PLAIN; i++)); do pod "plain-$i" default; done
pod networked default "k8s.v1.cni.cncf.io/networks=macvlan-net1"
# Multus resolves a default-network NAD without a namespace in its own (kube-system).
pod own-default default "v1.multus-cni.io/default-network=default/macvlan-net1"
started=0
for ((i = 1; i <= PLAIN; i++)); do
  if wait_ready "plain-$i" default 60; then
    ifs=$(interfaces "plain-$i" default)
    [ "$ifs" = "eth0 lo " ] || fail "plain-$i started with interfaces: $ifs"
    st=$("$K" get pod "plain-$i" -o jsonpath='{.metadata.annotations.k8s\.v1\.cni\.cncf\.io/network-status}')
    [ -z "$st" ] || fail "plain-$i has a network-status while Multus was away: $st"
    started=$((started + 1))
  else
    say "plain-$i not Ready during the outage: $(refusal "plain-$i" default)"
  fi
done
[ -e "$CONF" ] && fail "Multus came back during the outage"
ok "$started/$PLAIN plain pods started on the primary alone during the outage"

# 2. The pods that need Multus are refused, saying why, and stay without a sandbox.
m=$(refusal networked default)
say "networked: ${m:0:300}"
grep -q 'cni-guard.*00-multus.conf.*per-pod: the pod asks for networks' <<<"$m" || fail "networked was not refused for its networks: $m"
m=$(refusal own-default default)
say "own-default: ${m:0:300}"
grep -q 'cni-guard.*per-pod: the pod replaces its default network' <<<"$m" || fail "own-default was not refused for its default network: $m"
for p in networked own-default; do
  [ "$("$K" get pod "$p" -o jsonpath='{.status.phase}')" = Pending ] || fail "$p is not Pending while Multus is away"
done
ok "the pods that need Multus were refused, naming why"

# 3. Multus defaultNetworks: every pod but those of its systemNamespaces needs Multus.
deploy_guard --multus-default-network=macvlan-net1 --multus-system-namespace=kube-system
pod defaults-user default
pod defaults-system kube-system
m=$(refusal defaults-user default)
grep -q 'per-pod: Multus adds its defaultNetworks to pods of namespace "default"' <<<"$m" ||
  fail "defaults-user was not refused for Multus's defaultNetworks: $m"
wait_ready defaults-system kube-system 60 || fail "defaults-system (kube-system) did not start on the primary: $(refusal defaults-system kube-system)"
ok "with defaultNetworks only the kube-system pod started"
"$K" delete pod defaults-user --wait=true --timeout=60s >/dev/null
deploy_guard

# --- Multus back ---------------------------------------------------------------------------------
multus_back
"$K" -n kube-system rollout status daemonset/kube-multus-ds --timeout=120s >/dev/null
for _ in $(seq 120); do [ -s "$CONF" ] && break; sleep 1; done
[ -s "$CONF" ] || fail "Multus did not rewrite 00-multus.conf"
bare=0
wait_ready networked default 180 || fail "networked not Ready after Multus came back"
ifs=$(interfaces networked default)
if [ "$ifs" != "eth0 lo net1 " ]; then bare=$((bare + 1)); say "networked came up with: $ifs"; fi
wait_ready own-default default 180 || fail "own-default not Ready after Multus came back"
st=$("$K" get pod own-default -o jsonpath='{.metadata.annotations.k8s\.v1\.cni\.cncf\.io/network-status}')
python3 -c 'import json,sys; s=json.loads(sys.argv[1]); assert any(n.get("interface")=="eth0" and "macvlan-net1" in n.get("name","") for n in s), s' "$st" ||
  { bare=$((bare + 1)); say "own-default's eth0 is not macvlan-net1: $st"; }
ok "after Multus came back: networked has eth0 and net1, own-default has its own default network"

# A bypassed pod's DEL after Multus is back: the primary's, from the guard's record.
sb=$(sandbox plain-1 default)
[ -n "$sb" ] || fail "no sandbox for plain-1"
ip=$("$K" get pod plain-1 -o jsonpath='{.status.podIP}')
grep -qx "$sb" "$LEASES/cilium/$ip" 2>/dev/null || grep -q "$sb" "$LEASES/cilium/$ip" ||
  fail "plain-1's lease $LEASES/cilium/$ip does not name its sandbox"
"$K" delete pod plain-1 --wait=true --timeout=60s >/dev/null
for _ in $(seq 30); do [ -e "$LEASES/cilium/$ip" ] || break; sleep 1; done
[ ! -e "$LEASES/cilium/$ip" ] || fail "plain-1's lease $ip was not freed by its DEL"
tail -c +"$log_from" "$GUARD_LOG" | grep "cni-guard" | grep "verb=DEL container=$sb" | grep -q 'decision=deleted-recorded' ||
  fail "the guard did not tear plain-1 down from its record: $(tail -c +"$log_from" "$GUARD_LOG" | grep "container=$sb" | tail -n 3)"
ok "plain-1's DEL ran the primary's DEL from the record and freed $ip"

# --- leaks ---------------------------------------------------------------------------------------
# The bypassed pods (run on the primary by the guard) must leave no lease at all; every pod no
# net1 lease and no guard record. (The primary's lease of a pod Multus set up is Multus's to
# free, and Multus v4.3.0 does not free it on this node: see the README; it is counted apart.)
mapfile -t bypassed < <(for ((i = 2; i <= PLAIN; i++)); do sandbox "plain-$i" default; done
  sandbox defaults-system kube-system)
mapfile -t sandboxes < <(crictl pods --label cni-guard.test/perpod=1 -q)
"$K" delete pod -A -l cni-guard.test/perpod --wait=true --timeout=120s >/dev/null
for _ in $(seq 30); do
  [ -z "$(crictl pods --label cni-guard.test/perpod=1 -q)" ] && break
  sleep 1
done
[ "${#bypassed[@]}" -eq "$started" ] || fail "found ${#bypassed[@]} sandboxes of bypassed pods, want $started (plain-1 gone, defaults-system in)"
leaked=0 multus_primary=0
for sb in "${bypassed[@]}"; do
  if grep -rlq "$sb" "$LEASES" 2>/dev/null; then
    leaked=$((leaked + 1)); say "a lease names bypassed sandbox $sb: $(grep -rl "$sb" "$LEASES")"
  fi
done
for sb in "${sandboxes[@]}"; do
  if grep -rlq "$sb" "$LEASES/macvlan-net1" 2>/dev/null; then
    leaked=$((leaked + 1)); say "a net1 lease names $sb"
  fi
  if ls "$CACHE"/*/"$sb":* >/dev/null 2>&1; then
    leaked=$((leaked + 1)); say "a guard record is left for $sb"
  fi
  grep -rlq "$sb" "$LEASES/cilium" 2>/dev/null && multus_primary=$((multus_primary + 1))
done
[ "${#sandboxes[@]}" -gt 0 ] || fail "no sandbox of the test pods was seen"
say "primary leases Multus left for pods it set up: $multus_primary"
say "guard decisions in the run: $(tail -c +"$log_from" "$GUARD_LOG" | grep -o 'perpod=[a-z-]*' | sort | uniq -c | tr -s ' \n' ' ')"
echo "perpod-summary kubernetes=$k8s_version multus=$multus_version plain_started_during_outage=$started/$PLAIN networked_bare=$bare leaked=$leaked"
