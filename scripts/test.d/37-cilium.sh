#!/usr/bin/env bash
# The real Cilium in the stack (issue 19): the node of scripts/cluster.sh with
# CLUSTER_PRIMARY=cilium (cilium-agent v1.20.2 as a node process, its own 05-cilium.conflist in
# Multus's autoconfig dir, Multus thick, the guard in front with the agent's socket as a
# `sockets` precondition). Shows, each step failing the part when it does not hold:
#   1. a pod asking for macvlan-net1 gets eth0 from Cilium (an endpoint of the agent, an address
#      of the node's podCIDR) and net1 from Multus;
#   2. the incident under churn on it (conformance/k8s/churn.sh, short): the four
#      incident-summary lines with primary=cilium; with the guard every pod full, without it in
#      the layout before the fix the incident (bare > 0: cilium-cni run by containerd itself
#      reaches the agent, as on a real node) (the others, after step 4, with one Multus restart
#      each); and two node reboots (conformance/k8s/reboot.sh, issue 28): the seed's layout with
#      the guard (every pod full) and the layout before the fix without it (the incident);
#   3. a Cilium agent restart with the guard: the conflist left behind (the agent's own stop) and
#      removed (cni.uninstall): a pod created while it is down is refused at once (11, naming the socket
#      or the attachment), the guard's probe is NotReady, and the pod comes up with eth0 + net1
#      once the agent is back;
#   4. the same restart without the guard (its DaemonSet deleted: Multus's 00-multus.conf is then
#      what containerd runs): cilium-cni holds the ADD ~30 s and fails ("unable to connect to
#      Cilium agent"), then the pod comes up once the agent is back;
#   5. cni.exclusive true in the seed's layout (confPath Multus's folder: the conf dir and
#      00-cni-guard.conflist untouched) and in the one before the fix (confPath the conf dir:
#      00-multus.conf and 00-cni-guard.conflist renamed to *.cilium_bak; what keep and check
#      do about it; a fight of renames is counted and printed, never passed over).
# Prints one `cilium-...` line per step (the README's "The real Cilium" quotes them), the churn's
# incident-summary and the reboots' reboot-summary lines, and each stage's time at the end.
#
# Needs root, the binaries of scripts/setup.sh (Cilium's included) and clang-19. Locally without
# them it skips loudly; under CI=true that is a failure.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=scripts/versions.sh
. scripts/versions.sh
# shellcheck source=conformance/k8s/lib.sh
. conformance/k8s/lib.sh

NAME=37-cilium
skip() {
  if [ "${CI:-}" = true ]; then
    echo "$NAME: FAIL: $1" >&2
    exit 1
  fi
  echo "$NAME: SKIP: $1" >&2
  exit 0
}
fail() { echo "$NAME: FAIL: $*" >&2; exit 1; }
say() { echo "$NAME: $*" >&2; }
[ "$(id -u)" = 0 ] || skip "needs root (network namespaces, containerd, kubelet, bpffs)"
for b in "$KUBERNETES_BIN/kubelet" "$ETCD_BIN/etcd" "$MULTUS_BIN/multus-daemon" \
         "$CILIUM_BIN/cilium-agent" "$CILIUM_BIN/cilium-cni" "$CILIUM_LIB/bpf/bpf_lxc.c"; do
  [ -e "$b" ] || skip "$b is not built (scripts/setup.sh)"
done
"$CILIUM_BIN/clang" --version >/dev/null 2>&1 || skip "$CILIUM_BIN/clang (clang-19) does not run"
command -v ipset >/dev/null || skip "ipset is not installed (scripts/setup.sh)"

CLUSTER_DIR=${CNI_GUARD_CLUSTER_DIR:-/var/lib/cni-guard-cluster}
NODE=$CLUSTER_DIR/node
export KUBECONFIG=$CLUSTER_DIR/admin.kubeconfig
export CLUSTER_PRIMARY=cilium
# The agent restarts here are about the refusal itself (within 15 s, naming the agent's socket):
# the guard refuses at once (--wait-seconds=0), as in 35-kubernetes.sh's refusal scenarios; the
# manifest's wait (60) would hold the pod's ADD until the agent is back instead. DEL still waits
# for Multus (delWaitSeconds, 60, as install writes it whatever ADD's wait): churn.sh's leaks
# check after every guard-on run fails on a net1 lease left by a DEL that ran past an absent Multus.
export CLUSTER_GUARD_WAIT=0
K=$KUBERNETES_BIN/kubectl
# The guard image's operator binary (install, keep, check), as the manifests run it.
GUARD_AGENT=${CNI_GUARD_AGENT:-/cni-guard-agent}
SOCK=/run/cilium/cilium.sock # the agent's (scripts/cluster.sh: CILIUM_RUN)
cargo build --release --locked -p cni-guard

# One node per machine: the same lock as 35-kubernetes.sh.
exec 9>/run/lock/cni-guard-node.lock
flock -w 1800 9 || skip "another run of a node test held the lock for 30 min"
stage_done "release build, waiting for the node lock"

finish() {
  local rc=$? left=()
  trap - EXIT
  if pkill -TERM -P $$ 2>/dev/null; then sleep 2; pkill -KILL -P $$ 2>/dev/null || true; fi
  scripts/cluster.sh down || rc=1
  [ ! -e /run/netns/cni-guard-k8s ] || left+=("netns cni-guard-k8s")
  [ ! -e "$CLUSTER_DIR" ] || left+=("$CLUSTER_DIR")
  [ ! -e /run/cilium ] || left+=("/run/cilium")
  if pgrep -f "$CLUSTER_DIR/" >/dev/null; then left+=("processes naming $CLUSTER_DIR"); fi
  if awk -v d="$CLUSTER_DIR" '$5 == d || index($5, d "/") == 1 { f = 1 } END { exit !f }' /proc/self/mountinfo; then
    left+=("mounts below $CLUSTER_DIR")
  fi
  if [ ${#left[@]} -gt 0 ]; then
    echo "$NAME: FAIL: left behind: ${left[*]}" >&2
    rc=1
  fi
  stage_done down
  echo "$NAME: time per stage"
  stage_table
  exit "$rc"
}
trap finish EXIT

field() { tr ' ' '\n' <<<"$1" | sed -n "s/^$2=//p" | head -n 1; }

# pod NAME: a pod asking for net1, created without waiting.
pod() {
  "$K" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: $1
  annotations:
    k8s.v1.cni.cncf.io/networks: macvlan-net1
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: main
      image: localhost/cni-guard-test/busybox:1
      imagePullPolicy: Never
      command: ["/bin/sleep", "3600"]
EOF
}
# two_nets NAME: the pod's eth0 is a Cilium endpoint's address in the node's podCIDR, its net1 an
# address of the NetworkAttachmentDefinition's subnet; prints "eth0=A net1=B endpoint=ID".
two_nets() {
  local addrs eth0 net1 cidr ep
  addrs=$("$K" exec "$1" -- ip -o -4 addr) || fail "$1: ip addr failed"
  eth0=$(awk '$2 == "eth0" { sub(/\/.*/, "", $4); print $4 }' <<<"$addrs")
  net1=$(awk '$2 == "net1" { sub(/\/.*/, "", $4); print $4 }' <<<"$addrs")
  cidr=$("$K" get node cni-guard-node -o jsonpath='{.spec.podCIDR}')
  python3 -c 'import ipaddress,sys; sys.exit(not ipaddress.ip_address(sys.argv[1]) in ipaddress.ip_network(sys.argv[2]))' \
    "${eth0:-none}" "$cidr" 2>/dev/null || fail "$1: eth0 ${eth0:-none} is not in the node's podCIDR $cidr: $addrs"
  [[ $net1 == 10.99.0.* ]] || fail "$1: no net1 address in 10.99.0.0/24: $addrs"
  # Cilium's view: the pod's CiliumEndpoint (written by the agent) holds that address, and the
  # agent's API lists an endpoint with it.
  ep=$("$K" get ciliumendpoint "$1" -o jsonpath='{.status.networking.addressing[0].ipv4} {.status.state} {.status.id}' 2>/dev/null) || true
  [ "$ep" != "${ep#"$eth0 ready "}" ] || fail "$1: its CiliumEndpoint is not ready with $eth0: ${ep:-none}"
  ep=${ep##* }
  curl -sf --unix-socket "$SOCK" "http://localhost/v1/endpoint/$ep" | grep -qF "\"$eth0\"" ||
    fail "$1: the agent's endpoint $ep does not hold $eth0"
  # Packets go through Cilium's datapath: the node's API server, directly and as the Service.
  "$K" exec "$1" -- nc -w 3 10.77.0.2 6443 </dev/null >/dev/null 2>&1 || fail "$1: cannot reach 10.77.0.2:6443"
  "$K" exec "$1" -- nc -w 3 10.96.0.1 443 </dev/null >/dev/null 2>&1 || fail "$1: cannot reach 10.96.0.1:443"
  echo "eth0=$eth0 net1=$net1 endpoint=$ep"
}
# guard_ready: the guard pod's Ready condition.
guard_ready() {
  "$K" -n cni-guard get pod -l app.kubernetes.io/name=cni-guard \
    -o jsonpath='{.items[0].status.conditions[?(@.type=="Ready")].status}' 2>/dev/null
}
# events NAME: the pod's event messages, one a line.
events() {
  "$K" get events --field-selector "involvedObject.name=$1" -o jsonpath='{range .items[*]}{.message}{"\n"}{end}' 2>/dev/null
}
wait_ready() { # NAME SECONDS
  "$K" wait --for=condition=Ready "pod/$1" --timeout="${2}s" >/dev/null 2>&1
}

t0=$SECONDS
# --- 1. up, a pod with eth0 from Cilium and net1 from Multus ---------------------------------
scripts/cluster.sh down >/dev/null 2>&1 # a node left in another layout or primary
t0=$SECONDS
scripts/cluster.sh up >/dev/null
up_s=$((SECONDS - t0))
conf=$NODE/etc/cni/multus/net.d/05-cilium.conflist
grep -q '"type": *"cilium-cni"' "$conf" || fail "the agent's $conf names no cilium-cni: $(cat "$conf")"
grep -q -- "--socket=$SOCK" <("$K" -n cni-guard get daemonset cni-guard -o jsonpath='{.spec.template.spec.containers[0].args}' | tr ',' '\n' | tr -d '[]"') ||
  fail "the guard's keep has no --socket=$SOCK"
pod cilium-old
pod cilium-net1
wait_ready cilium-net1 120 || fail "cilium-net1 not Ready: $(events cilium-net1 | tail -n 3)"
nets=$(two_nets cilium-net1)
status=$("$K" get pod cilium-net1 -o jsonpath='{.metadata.annotations.k8s\.v1\.cni\.cncf\.io/network-status}')
python3 -c '
import json, sys
s = {i.get("interface"): i.get("name") for i in json.loads(sys.argv[1])}
sys.exit(not (s.get("eth0") == "cilium" and s.get("net1") == "default/macvlan-net1"))' "$status" ||
  fail "network-status does not say eth0 from cilium and net1 from macvlan-net1: $status"
echo "cilium-pod version=$CILIUM_VERSION up_s=$up_s $nets network_status=eth0:cilium,net1:default/macvlan-net1"
"$K" delete pod cilium-net1 --wait=true --timeout=60s >/dev/null
wait_ready cilium-old 60 || fail "cilium-old not Ready"
stage_done "1. up, a pod with eth0 from Cilium and net1"

# --- 2. the incident under churn, short ------------------------------------------------------
line=$(CHURN_PODS=${CILIUM_CHURN_PODS:-6} CHURN_RESTARTS=${CILIUM_CHURN_RESTARTS:-2} conformance/k8s/churn.sh seed-fix on)
echo "$line"
[ "$(field "$line" primary)" = cilium ] || fail "the churn line does not say primary=cilium: $line"
[ "$(field "$line" bare)" = 0 ] && [ "$(field "$line" full)" = "$(field "$line" pods)" ] &&
  [ "$(field "$line" pods)" -gt 0 ] || fail "with the guard every churn pod must be full: $line"
stage_done "2. churn.sh seed-fix on"

# --- 2c. a node reboot with the guard, the real Cilium the primary --------------------------------
# (reboot.sh: the agent stopped with the node's pods and started again at boot, its conflist kept
# on disk; lib.sh's reboot_check: bare 0, no stuck teardown, the guard reached). cilium-old comes
# back on a new sandbox too.
line=$(REBOOT_PODS=${CILIUM_REBOOT_PODS:-4} conformance/k8s/reboot.sh seed-fix on disk)
echo "$line"
[ "$(field "$line" primary)" = cilium ] || fail "the reboot line does not say primary=cilium: $line"
wait_ready cilium-old 120 || fail "cilium-old not Ready after the reboot"
stage_done "2c. reboot.sh seed-fix on disk"

# --- 3. a Cilium agent restart with the guard ------------------------------------------------
# restart NAME MODE HOLD: stops the agent (MODE stop: conflist left; uninstall: removed), creates
# pod NAME, waits HOLD s, starts the agent, waits for the pod; prints what was seen. HOLD: 20 s
# where the refusal comes at once (the guard: within 15 s asserted, its probe NotReady within a
# 10 s period; no guard and no conflist: Multus fails at once), 40 s where cilium-cni holds the
# ADD for its 30 s first (no guard, the conflist left).
HOLD_SHORT=${CILIUM_DOWN_SECONDS_SHORT:-20}
HOLD_LONG=${CILIUM_DOWN_SECONDS:-40}
restart() {
  local name=$1 mode=$2 HOLD=$3 t_pod t_first='' first_msg='' notready=0 t_start ready_s i msg
  if [ "$mode" = uninstall ]; then scripts/cluster.sh cilium stop --uninstall >/dev/null 2>&1
  else scripts/cluster.sh cilium stop >/dev/null 2>&1; fi
  pod "$name"
  t_pod=$SECONDS
  for ((i = 0; i < HOLD; i++)); do
    if [ -z "$t_first" ]; then
      msg=$(events "$name" | grep -m1 'Failed to create pod sandbox' || true)
      if [ -n "$msg" ]; then t_first=$((SECONDS - t_pod)); first_msg=$msg; fi
    fi
    if [ "$(guard_ready)" = False ]; then notready=1; fi
    sleep 1
  done
  [ "$("$K" get pod "$name" -o jsonpath='{.status.phase}')" != Running ] ||
    fail "$name Running while the agent was down"
  t_start=$SECONDS
  scripts/cluster.sh cilium start >/dev/null 2>&1 || fail "the agent did not come back: $(tail -n 5 "$CLUSTER_DIR/logs/cilium-agent.log")"
  local agent_s=$((SECONDS - t_start)) t_ready=''
  # Still watching for the first failure: without the guard it may come only now (cilium-cni's
  # DEL after its failed ADD waits for the agent too).
  for ((i = 0; i < 180; i++)); do
    if [ -z "$t_first" ]; then
      msg=$(events "$name" | grep -m1 'Failed to create pod sandbox' || true)
      if [ -n "$msg" ]; then t_first=$((SECONDS - t_pod)); first_msg=$msg; fi
    fi
    if [ "$("$K" get pod "$name" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" = True ]; then
      t_ready=$SECONDS
      break
    fi
    sleep 1
  done
  [ -n "$t_ready" ] || fail "$name not Ready after the agent came back: $(events "$name" | tail -n 3)"
  ready_s=$((t_ready - t_start))
  nets=$(two_nets "$name")
  local agent_named=no
  if grep -qi 'connect to Cilium' <<<"$first_msg"; then agent_named=yes; fi
  first_msg=$(tr -s ' \n' ' ' <<<"$first_msg" | sed 's/.*failed (add): //' | cut -c1-300)
  echo "mode=$mode down_s=$((t_start - t_pod)) first_refusal_s=${t_first:-none} cilium_unreachable_named=$agent_named guard_notready=$notready agent_back_s=$agent_s pod_ready_after_agent_s=$ready_s $nets error=\"$first_msg\""
  "$K" delete pod "$name" --wait=true --timeout=60s >/dev/null
}
for mode in stop uninstall; do
  line=$(restart "restart-guard-$mode" "$mode" "$HOLD_SHORT")
  echo "cilium-restart guard=on $line"
  [ "$(field "$line" guard_notready)" = 1 ] || fail "the guard stayed Ready with the agent down ($mode)"
  first=$(field "$line" first_refusal_s)
  [[ $first =~ ^[0-9]+$ ]] && [ "$first" -lt 15 ] || fail "no refusal within 15 s with the agent down ($mode): $line"
  case "$mode" in
    # SIGTERM: the agent removes its socket ("does not exist"); a SIGKILLed one leaves it behind
    # ("does not accept connections").
    stop) grep -q "socket $SOCK does not" <<<"$line" ||
      fail "the guard's refusal does not name the agent's socket: $line" ;;
    uninstall) grep -q "05-cilium.conflist" <<<"$line" ||
      fail "the guard's refusal does not name the missing 05-cilium.conflist: $line" ;;
  esac
done

# A pod that was running before the restarts still reaches the node through Cilium.
"$K" exec cilium-old -- nc -w 3 10.77.0.2 6443 </dev/null >/dev/null 2>&1 ||
  fail "cilium-old lost its network across the agent's restarts"
echo "cilium-restart existing_pod=cilium-old reachable_after_restarts=yes"
stage_done "3. agent restarts with the guard (stop, uninstall)"

# --- 5a. cni.exclusive true in the seed's layout ------------------------------------------------
# confPath is Multus's folder: the agent renames what else is there (nothing), never the conf dir.
N_CONF=$NODE/etc/cni/net.d
renames() { grep -c 'Renaming non-Cilium CNI configuration file' "$CLUSTER_DIR/logs/cilium-agent.log" || true; }
scripts/cluster.sh cilium stop >/dev/null 2>&1
CLUSTER_CILIUM_EXCLUSIVE=true scripts/cluster.sh cilium start >/dev/null 2>&1
grep -q -- "--cni-exclusive='true'" "$CLUSTER_DIR/logs/cilium-agent.log" || fail "the agent did not take --cni-exclusive=true"
sleep 10
files=$(cd "$N_CONF" && ls | tr '\n' ' ')
[ -f "$N_CONF/00-cni-guard.conflist" ] && [ -f "$N_CONF/00-multus.conf" ] && [ "$(renames)" = 0 ] ||
  fail "cni.exclusive in Multus's folder touched the conf dir: $files renames=$(renames)"
[ "$(guard_ready)" = True ] || fail "the guard is not Ready with cni.exclusive in Multus's folder"
echo "cilium-exclusive layout=seed confPath=etc/cni/multus/net.d renames=$(renames) conf_dir=\"$files\" guard_ready=True"
pod exclusive-seed
wait_ready exclusive-seed 120 || fail "exclusive-seed not Ready: $(events exclusive-seed | tail -n 3)"
echo "cilium-exclusive layout=seed pod $(two_nets exclusive-seed)"
"$K" delete pod exclusive-seed --wait=true --timeout=60s >/dev/null
scripts/cluster.sh cilium stop >/dev/null 2>&1
scripts/cluster.sh cilium start >/dev/null 2>&1
stage_done "5a. cni.exclusive in the seed's layout"

# --- 4. the same restart without the guard -----------------------------------------------------
"$K" -n cni-guard delete daemonset cni-guard --cascade=foreground --wait=true --timeout=60s >/dev/null
"$K" -n cni-guard wait --for=delete pod -l app.kubernetes.io/name=cni-guard --timeout=60s >/dev/null 2>&1 || true
[ -z "$("$K" -n cni-guard get pod -o name 2>/dev/null)" ] || fail "the guard's pod is still there"
rm -f "$NODE/etc/cni/net.d/00-cni-guard.conflist" # `keep` leaves it on SIGTERM (by design)
for mode in stop uninstall; do
  line=$(restart "restart-noguard-$mode" "$mode" "$([ "$mode" = stop ] && echo "$HOLD_LONG" || echo "$HOLD_SHORT")")
  echo "cilium-restart guard=off $line"
  if [ "$mode" = stop ]; then
    # The agent's conflist left behind: cilium-cni itself holds the ADD (it polls the socket for
    # 30 s) and fails, then Multus's DEL of it waits for the agent too: nothing refuses at once,
    # and the sandbox's error comes after 30 s at the earliest.
    first=$(field "$line" first_refusal_s)
    [[ $first =~ ^[0-9]+$ ]] && [ "$first" -ge 25 ] && [ "$(field "$line" cilium_unreachable_named)" = yes ] ||
      fail "without the guard cilium-cni did not hold the ADD ~30 s and fail naming the agent: $line"
  fi
done
stage_done "4. agent restarts without the guard (stop, uninstall)"

# --- 2b. the other three churn lines, shorter (each brings the node up in its layout) -----------
# With the guard no pod may be bare; without it in the layout before the fix bare pods are the
# incident itself, and they must be there (the seed's exact pair: Cilium's conflist first in the
# conf dir, cilium-cni reaching the agent at /var/run/cilium as on a real node). After that
# churn, on the same node, the seed's trigger itself: a reboot (reboot.sh, its line checked by
# lib.sh's reboot_check: bare > 0).
for lg in "seed-fix off" "original off" "original on"; do
  # shellcheck disable=SC2086 # two words: layout and guard
  line=$(CHURN_PODS=${CILIUM_CHURN_PODS:-6} CHURN_RESTARTS=1 conformance/k8s/churn.sh $lg)
  echo "$line"
  [ "$(field "$line" primary)" = cilium ] && [ "$(field "$line" pods)" -gt 0 ] ||
    fail "the churn line does not say primary=cilium or saw no pod: $line"
  case "$lg" in
    *" on") [ "$(field "$line" bare)" = 0 ] || fail "with the guard no churn pod may be bare: $line" ;;
    "original off") [ "$(field "$line" bare)" -gt 0 ] ||
      fail "the layout before the fix without the guard, the real Cilium: the incident did not happen (bare=0): $line" ;;
  esac
  stage_done "2b. churn.sh $lg"
  if [ "$lg" = "original off" ]; then
    line=$(REBOOT_PODS=${CILIUM_REBOOT_PODS:-4} conformance/k8s/reboot.sh original off disk)
    echo "$line"
    [ "$(field "$line" primary)" = cilium ] || fail "the reboot line does not say primary=cilium: $line"
    stage_done "2d. reboot.sh original off disk"
  fi
done

# --- 5b. cni.exclusive true in the layout before the fix ----------------------------------------
# confPath is the conf dir itself: the agent renames 00-multus.conf and 00-cni-guard.conflist to
# *.cilium_bak, and on every fsnotify event after; keep restores its file each time: a fight.
# (The node is up in that layout with the guard: `original on` above.)
[ -e "$NODE/etc/cni/net.d/05-cilium.conflist" ] && "$K" -n cni-guard get daemonset cni-guard >/dev/null ||
  fail "the node is not in the layout before the fix with the guard"
scripts/cluster.sh cilium stop >/dev/null 2>&1
CLUSTER_CILIUM_EXCLUSIVE=true scripts/cluster.sh cilium start >/dev/null 2>&1
pod exclusive-fight
FIGHT=${CILIUM_FIGHT_SECONDS:-15}
sleep "$FIGHT"
n_renames=$(renames)
n_guard=$(grep -c 'Renaming non-Cilium.*source=00-cni-guard.conflist' "$CLUSTER_DIR/logs/cilium-agent.log" || true)
n_restored=$("$K" -n cni-guard logs daemonset/cni-guard -c keep 2>/dev/null | grep -c 'restored .*00-cni-guard.conflist: it was missing' || true)
files=$(cd "$N_CONF" && ls | tr '\n' ' ')
ready=$(guard_ready)
phase=$("$K" get pod exclusive-fight -o jsonpath='{.status.phase}')
check=$("$K" -n cni-guard exec daemonset/cni-guard -c keep -- "$GUARD_AGENT" check \
  --config="/host$N_CONF/00-cni-guard.conflist" --host-root=/host --cni-path=/opt/cni/bin 2>&1 | grep '^not ready' | head -n 1 || true)
fight=no
# The fight is detected here and said, never passed over: renames of the guard's file by the
# agent and restores by keep, each many times in $FIGHT s.
if [ "$n_guard" -ge 10 ] && [ "$n_restored" -ge 10 ]; then fight=yes; fi
echo "cilium-exclusive layout=before-fix confPath=etc/cni/net.d seconds=$FIGHT renames=$n_renames guard_file_renames=$n_guard keep_restores=$n_restored rename_fight=$fight guard_ready=$ready pod_phase=$phase conf_dir=\"$files\" check=\"$(cut -c1-200 <<<"$check")\""
[ "$fight" = yes ] || fail "expected a rename fight between cni.exclusive and keep, saw renames=$n_guard restores=$n_restored"
[ -e "$N_CONF/00-multus.conf.cilium_bak" ] || fail "the agent did not rename 00-multus.conf: $files"
[ "$ready" = False ] || fail "the guard stayed Ready during the rename fight"
# Not asserted, printed: whether a pod started meanwhile (containerd may catch the conf dir
# between a rename and a restore, 05-cilium.conflist then first) and with what (2026-12-06: it
# did, with eth0 from Cilium alone).
if [ "$phase" = Running ]; then
  echo "cilium-exclusive layout=before-fix pod_during_fight: $("$K" exec exclusive-fight -- ip -o -4 addr 2>&1 | awk '{print $2 "=" $4}' | tr '\n' ' ')"
fi
echo "$NAME: RENAME FIGHT: Cilium (cni.exclusive, confPath the conf dir) renamed 00-cni-guard.conflist $n_guard times in ${FIGHT}s and keep restored it $n_restored times; the delegate 00-multus.conf is renamed too, so a pod either waits or starts on Cilium alone. Use confPath /etc/cni/multus/net.d or cni.exclusive false." >&2
# End the fight before the node goes down (containerd reloads its CNI config on every round, and
# cilium-cni's DEL waits for an agent): the agent again with cni.exclusive false, Multus's file
# moved back, as an operator would.
scripts/cluster.sh cilium stop >/dev/null 2>&1
scripts/cluster.sh cilium start >/dev/null 2>&1
mv -f "$N_CONF/00-multus.conf.cilium_bak" "$N_CONF/00-multus.conf"
"$K" delete pod exclusive-fight --wait=true --timeout=90s >/dev/null 2>&1 || true
stage_done "5b. cni.exclusive in the layout before the fix (the rename fight)"

echo "$NAME: done in $((SECONDS - t0))s"
