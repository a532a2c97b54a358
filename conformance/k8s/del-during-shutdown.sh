#!/usr/bin/env bash
# A DEL inside Multus's daemon when the daemon is SIGTERMed, on the real node of
# scripts/cluster.sh, in the seed's layout (05-cilium.conflist in Multus's folder):
#
#   conformance/k8s/del-during-shutdown.sh GUARD        GUARD on|off
#
# Multus v4.3.0 cuts such a DEL off: on SIGTERM its daemon removes 00-multus.conf and exits at
# once, without finishing the requests under way (its children die with it), and multus-shim
# answers success for a DEL whatever its request gave ("No error in DEL"). The runtime then
# forgets the sandbox, and whatever the DEL had not freed yet (net1's host-local lease) leaks.
#
# Made deterministic with a slow attachment: the NetworkAttachmentDefinition `slow-net1` is
# macvlan + host-local behind a wrapper (`cni-guard-test-slow` in the node's bin dir, run by
# Multus's daemon) that, while armed, marks that a DEL reached it and sleeps before it execs
# macvlan. $DELS pods with slow-net1 are deleted at once; when every one of their DELs is inside
# the daemon, the Multus pod is deleted (SIGTERM) and the wrapper disarmed. Once the pods are
# gone (kubelet's StopPodSandbox succeeded) and Multus is back, the leases of slow-net1 that
# name one of their sandboxes are the leaks. Prints
#
#   del-during-shutdown-summary layout=seed-fix guard=on|off dels=N leaked=L retried=R
#
#   dels     the DELs that were inside the daemon at its SIGTERM (every pod's)
#   leaked   slow-net1 leases left naming one of those sandboxes
#   retried  the guard's runs of a DEL again after its delegate went away mid-run (the sum of
#            `reran=` in its log lines for those sandboxes; 0 without the guard)
#
# Removes its pods, NetworkAttachmentDefinition, wrapper, and what the cut-off DELs left (the
# leases, Multus's cache entries, the guard's records), so later runs on this node start clean.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=scripts/versions.sh
. scripts/versions.sh
# shellcheck source=conformance/k8s/lib.sh
. conformance/k8s/lib.sh

GUARD=${1:-}
case "$GUARD" in on | off) ;; *) echo "usage: $0 on|off" >&2; exit 2 ;; esac
DELS=${DEL_SHUTDOWN_PODS:-3}

CLUSTER_DIR=${CNI_GUARD_CLUSTER_DIR:-/var/lib/cni-guard-cluster}
NODE=$CLUSTER_DIR/node
export KUBECONFIG=$CLUSTER_DIR/admin.kubeconfig
K=$KUBERNETES_BIN/kubectl
CONF=$NODE/etc/cni/net.d/00-multus.conf
NET=slow-net1
LEASES=$NODE/var/lib/cni/networks/$NET
MARKS=$NODE/var/lib/cni/del-shutdown # in the daemon at the same path (the node's /var/lib/cni)
SLOW=$NODE/opt/cni/bin/cni-guard-test-slow
GUARD_LOG=$CLUSTER_DIR/logs/guard-syslog.log

say() { echo "k8s del-during-shutdown: $*" >&2; }
fail() { echo "k8s del-during-shutdown: FAIL: $*" >&2; exit 1; }
crictl() { "$CRICTL_BIN/crictl" --config "$W/crictl.yaml" "$@"; }
# leases ID: the slow-net1 lease files naming sandbox ID (host-local: the owner on the first line).
leases() { grep -l "^$1" "$LEASES"/[0-9]* 2>/dev/null || true; }

node_in_layout seed-fix "$GUARD"
W=$(mktemp -d /tmp/cni-guard-del-shutdown.XXXXXX)
printf 'runtime-endpoint: unix://%s\ntimeout: 20\n' "$NODE/run/containerd/containerd.sock" >"$W/crictl.yaml"
pods=()
for ((i = 1; i <= DELS; i++)); do pods+=("del-shutdown-$i"); done
cleanup() {
  rm -f "$MARKS/armed"
  "$K" delete pod "${pods[@]}" --ignore-not-found --wait=true --timeout=90s >/dev/null 2>&1 || true
  "$K" delete network-attachment-definition "$NET" --ignore-not-found >/dev/null 2>&1 || true
  local id
  for id in $(cat "$W/sandboxes" 2>/dev/null); do
    leases "$id" | xargs -r rm -f
    rm -f "$NODE/var/lib/cni/multus/$id" "$NODE/var/lib/cni/cni-guard/"*/"$id":*.json
  done
  rm -rf "$MARKS" "$SLOW" "$W"
}
trap cleanup EXIT

# Multus's restart as in production, a few seconds (start_delay: an init container's sleep).
start_delay kube-system kube-multus-ds 5
multus_ready() {
  [ -s "$CONF" ] &&
    [ "$("$K" -n kube-system get pod -l app=multus -o jsonpath='{range .items[*]}{.metadata.deletionTimestamp}{"|"}{.status.containerStatuses[0].ready}{"\n"}{end}' 2>/dev/null)" = "|true" ]
}
for _ in $(seq 120); do multus_ready && break; sleep 1; done
multus_ready || fail "Multus is not ready"
if [ "$GUARD" = on ]; then
  "$K" -n cni-guard wait --for=condition=Ready pod -l app.kubernetes.io/name=cni-guard --timeout=120s >/dev/null ||
    fail "the guard is not Ready"
fi

# The slow attachment: the wrapper runs in Multus's container (busybox there), macvlan after it.
mkdir -p "$MARKS"
cat >"$SLOW.tmp" <<EOF
#!/bin/sh
# cni-guard's test of a DEL cut off by Multus's shutdown: while armed, a DEL marks that it is
# inside Multus's daemon and sleeps; then (and for every other verb) macvlan runs.
if [ "\$CNI_COMMAND" = DEL ] && [ -e "$MARKS/armed" ]; then
  touch "$MARKS/inside.\$CNI_CONTAINERID"
  sleep 60
fi
exec "$NODE/opt/cni/bin/macvlan" "\$@"
EOF
chmod 0755 "$SLOW.tmp"
mv -f "$SLOW.tmp" "$SLOW"
"$K" apply -f - >/dev/null <<EOF
apiVersion: k8s.cni.cncf.io/v1
kind: NetworkAttachmentDefinition
metadata:
  name: $NET
  namespace: default
spec:
  config: |
    {"cniVersion": "0.3.1", "name": "$NET", "type": "cni-guard-test-slow", "master": "net1-parent",
     "mode": "bridge", "ipam": {"type": "host-local", "subnet": "10.98.0.0/24", "dataDir": "$NODE/var/lib/cni/networks"}}
EOF
for p in "${pods[@]}"; do
  scripts/cluster.sh manifest pod-net1.yaml |
    sed -e "s/name: with-net1/name: $p/" -e "s/networks: macvlan-net1/networks: $NET/" | "$K" apply -f - >/dev/null
done
"$K" wait --for=condition=Ready --timeout=120s "${pods[@]/#/pod/}" >/dev/null || fail "the pods did not come up"
: >"$W/sandboxes"
for p in "${pods[@]}"; do
  "$K" exec "$p" -- ip -o addr show net1 2>/dev/null | grep -q 'inet ' || fail "$p has no net1"
  id=$(crictl pods --namespace default --name "^$p\$" --state ready -q)
  [ -n "$id" ] || fail "no ready sandbox for $p"
  echo "$id" >>"$W/sandboxes"
  [ -n "$(leases "$id")" ] || fail "no $NET lease names $p's sandbox $id"
done
say "guard=$GUARD: $DELS pods up with net1 on $NET ($(tr '\n' ' ' <"$W/sandboxes"))"

# Every DEL inside the daemon, then the daemon SIGTERMed.
guard_from=$(stat -c %s "$GUARD_LOG" 2>/dev/null || echo 0)
touch "$MARKS/armed"
"$K" delete pod --wait=false "${pods[@]}" >/dev/null
inside() { local id n=0; for id in $(cat "$W/sandboxes"); do [ -e "$MARKS/inside.$id" ] && n=$((n + 1)); done; echo "$n"; }
for _ in $(seq 600); do [ "$(inside)" -eq "$DELS" ] && break; sleep 0.1; done
dels=$(inside)
[ "$dels" -eq "$DELS" ] || fail "only $dels of $DELS DELs reached Multus's daemon within 60 s"
"$K" -n kube-system delete pod -l app=multus --wait=false >/dev/null
rm -f "$MARKS/armed"
for _ in $(seq 100); do [ -e "$CONF" ] || break; sleep 0.1; done
[ ! -e "$CONF" ] || fail "00-multus.conf still there 10 s after the Multus pod's deletion: the daemon did not stop"
say "Multus SIGTERMed with $dels DELs inside its daemon; 00-multus.conf gone"

# The pods gone (their sandboxes' DEL answered success to kubelet), Multus back.
"$K" wait --for=delete --timeout=180s "${pods[@]/#/pod/}" >/dev/null 2>&1 || fail "the pods were not gone within 180 s"
for _ in $(seq 180); do multus_ready && break; sleep 1; done
multus_ready || fail "Multus did not come back"
leaked=0
for id in $(cat "$W/sandboxes"); do
  leases "$id" >"$W/left"
  if [ -s "$W/left" ]; then
    say "leaked: $(tr '\n' ' ' <"$W/left")names sandbox ${id:0:13}, which is gone"
    leaked=$((leaked + $(wc -l <"$W/left")))
  fi
done
retried=0
if [ "$GUARD" = on ]; then
  retried=$(tail -c +"$((guard_from + 1))" "$GUARD_LOG" | grep -F -f "$W/sandboxes" |
    awk '/verb=DEL / { for (i = 1; i <= NF; i++) if ($i ~ /^reran=[0-9]+$/) { sub("reran=", "", $i); n += $i } } END { print n + 0 }')
fi
echo "del-during-shutdown-summary layout=seed-fix guard=$GUARD dels=$dels leaked=$leaked retried=$retried"
