#!/usr/bin/env bash
# The guard's DaemonSet on the real node of scripts/cluster.sh (issue 12), as an operator runs it
# (deploy/multus-cilium, deploy/uninstall; rendered for the node's folders by
# `scripts/cluster.sh manifest guard|guard-uninstall`):
#  1. stopping the guard's pod leaves 00-cni-guard.conflist in place (nothing deletes it on
#     shutdown), and the init container of a new pod installs the conflist and the binary;
#  2. `keep` puts a deleted conflist back;
#  3. the uninstall overlay removes the conflist, then the binary; containerd falls back to the
#     next file (00-multus.conf) and a pod that asks for net1 gets eth0 and net1 from Multus
#     directly; then the guard is applied again.
# Prints one line:
#   daemonset-summary install=ok shutdown_kept=ok keep_restore_ms=N uninstall=ok fallback=00-multus.conf
#
#   scripts/cluster.sh up && conformance/k8s/daemonset.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=scripts/versions.sh
. scripts/versions.sh

CLUSTER_DIR=${CNI_GUARD_CLUSTER_DIR:-/var/lib/cni-guard-cluster}
NODE=$CLUSTER_DIR/node
export KUBECONFIG=$CLUSTER_DIR/admin.kubeconfig
K=$KUBERNETES_BIN/kubectl
CONFDIR=$NODE/etc/cni/net.d
CONFLIST=$CONFDIR/00-cni-guard.conflist
BIN=$NODE/opt/cni/bin/cni-guard
GUARD_BIN=${CNI_GUARD_BIN:-target/release/cni-guard}
POD=after-uninstall
SEL='app.kubernetes.io/name=cni-guard'

fail() { echo "k8s daemonset: FAIL: $*" >&2; exit 1; }
ok() { echo "k8s daemonset: ok: $*"; }
now_ms() { date +%s%3N; }

"$K" -n cni-guard get daemonset cni-guard >/dev/null 2>&1 || fail "the guard is not deployed (scripts/cluster.sh up)"

cleanup() {
  "$K" delete pod "$POD" --ignore-not-found --wait=true --timeout=60s >/dev/null 2>&1 || true
  "$K" -n cni-guard patch daemonset cni-guard --type=json \
    -p '[{"op":"remove","path":"/spec/template/spec/nodeSelector"}]' >/dev/null 2>&1 || true
}
trap cleanup EXIT

# 1. The guard's pod off the node: keep gets SIGTERM and leaves the conflist where it is.
"$K" -n cni-guard patch daemonset cni-guard --type=merge \
  -p '{"spec":{"template":{"spec":{"nodeSelector":{"cni-guard.test/no-such-label":"x"}}}}}' >/dev/null
missing=0
for _ in $(seq 300); do
  [ -e "$CONFLIST" ] || missing=$((missing + 1))
  [ -z "$("$K" -n cni-guard get pod -l "$SEL" -o name 2>/dev/null)" ] && break
  sleep 0.1
done
[ -z "$("$K" -n cni-guard get pod -l "$SEL" -o name)" ] || fail "the guard's pod did not go"
[ "$missing" = 0 ] && [ -s "$CONFLIST" ] || fail "00-cni-guard.conflist went missing while the guard's pod stopped"
ok "the guard's pod stopped (SIGTERM) and 00-cni-guard.conflist stayed"
shutdown_kept=ok

# ... and the init container of a new pod installs what is missing.
rm -f "$CONFLIST" "$BIN"
"$K" -n cni-guard patch daemonset cni-guard --type=json \
  -p '[{"op":"remove","path":"/spec/template/spec/nodeSelector"}]' >/dev/null
"$K" -n cni-guard rollout status daemonset/cni-guard --timeout=120s >/dev/null
"$K" -n cni-guard wait --for=condition=Ready pod -l "$SEL" --timeout=120s >/dev/null ||
  fail "the new guard pod is not Ready"
[ -s "$CONFLIST" ] || fail "the init container did not write 00-cni-guard.conflist"
cmp -s "$BIN" "$GUARD_BIN" || fail "the init container did not install the image's binary at $BIN"
[ "$(cd "$CONFDIR" && find . -maxdepth 1 \( -name '*.conf' -o -name '*.conflist' -o -name '*.json' \) -printf '%f\n' | LC_ALL=C sort | head -n1)" = 00-cni-guard.conflist ] ||
  fail "00-cni-guard.conflist is not the first file of the conf dir"
"$K" -n cni-guard logs -l "$SEL" -c install --tail=5 | sed 's/^/  install: /'
ok "a new pod's init container installed the conflist (first in the conf dir) and the binary"

# 2. keep restores a deleted conflist.
want=$(cat "$CONFLIST")
t0=$(now_ms)
rm -f "$CONFLIST"
back=
for _ in $(seq 200); do
  if [ -s "$CONFLIST" ]; then back=$(($(now_ms) - t0)); break; fi
  sleep 0.05
done
[ -n "$back" ] || fail "keep did not restore 00-cni-guard.conflist within 10 s"
[ "$(cat "$CONFLIST")" = "$want" ] || fail "keep restored different bytes"
ok "keep restored the deleted conflist in ${back} ms, the same bytes"

# 3. The uninstall overlay.
scripts/cluster.sh manifest guard-uninstall | "$K" apply -f - >/dev/null
"$K" -n cni-guard rollout status daemonset/cni-guard --timeout=120s >/dev/null
for _ in $(seq 60); do [ -e "$CONFLIST" ] || [ -e "$BIN" ] || break; sleep 1; done
[ ! -e "$CONFLIST" ] || fail "the uninstall overlay left 00-cni-guard.conflist"
[ ! -e "$BIN" ] || fail "the uninstall overlay left the binary"
for _ in $(seq 60); do
  [ "$("$K" -n cni-guard get pod -l "$SEL" -o jsonpath='{.items[*].spec.containers[*].name}')" = uninstall ] && break
  sleep 1
done
logs=$("$K" -n cni-guard logs -l "$SEL" -c uninstall --tail=20)
echo "${logs//$'\n'/$'\n'  uninstall: }" | sed '1s/^/  uninstall: /'
grep -q "^removed .*00-cni-guard.conflist" <<<"$logs" || fail "the uninstaller's log does not say it removed the conflist"
first=$(cd "$CONFDIR" && find . -maxdepth 1 \( -name '*.conf' -o -name '*.conflist' -o -name '*.json' \) -printf '%f\n' | LC_ALL=C sort | head -n1)
[ "$first" = 00-multus.conf ] || fail "after uninstall the conf dir's first file is '$first'"
sed "s/name: with-net1/name: $POD/" <(scripts/cluster.sh manifest pod-net1.yaml) | "$K" apply -f - >/dev/null
"$K" wait --for=condition=Ready --timeout=120s "pod/$POD" >/dev/null || fail "pod $POD is not Ready without the guard"
"$K" exec "$POD" -- ip -o addr | grep -q ' net1 .*inet ' || fail "no net1 in $POD after the guard was uninstalled"
ok "uninstalled: containerd uses 00-multus.conf directly; $POD has eth0 and net1"
"$K" delete pod "$POD" --wait=true --timeout=60s >/dev/null
scripts/cluster.sh manifest guard-uninstall | "$K" delete -f - --wait=true --timeout=60s >/dev/null

# The guard back, as scripts/cluster.sh up leaves it.
scripts/cluster.sh manifest guard | "$K" apply -f - >/dev/null
"$K" -n cni-guard rollout status daemonset/cni-guard --timeout=120s >/dev/null
"$K" -n cni-guard wait --for=condition=Ready pod -l "$SEL" --timeout=120s >/dev/null ||
  fail "the guard is not Ready after it was applied again"
ok "the guard applied again and Ready"
echo "daemonset-summary install=ok shutdown_kept=$shutdown_kept keep_restore_ms=$back uninstall=ok fallback=$first"
