#!/usr/bin/env bash
# A real reboot of the virtual-machine node (scripts/vm-node.sh): `systemctl reboot` inside the
# guest, with pods asking Multus for net1 on it.
#
#   conformance/vm/reboot.sh LAYOUT GUARD [PODS]     LAYOUT original; GUARD off|on; PODS (3)
#
# `original` is the layout before the seed's fix: 05-cilium.conflist (the bridge + host-local
# stand-in of scripts/cluster.sh) in /etc/cni/net.d next to Multus's 00-multus.conf, Multus's
# multusAutoconfigDir that folder, its multusMasterCNI pinned to 05-cilium.conflist (what auto
# elects there without the guard; with the guard in that folder it must be pinned). GUARD on
# applies deploy/multus-cilium with its attachment in the conf dir; off removes the guard (its
# DaemonSet, then its conflist and binary, which nothing else removes).
#
# The run: the layout; PODS pods with net1, each checked to have eth0 and net1; the node's Ready
# condition polled from here; `systemctl reboot` in the guest. Everything in the guest goes
# down as systemd takes it down (Multus's daemon gets SIGTERM and removes 00-multus.conf), the
# kernel boots again, containerd and kubelet start, and kubelet makes a new sandbox for every
# pod. Then, once the node, Multus and every pod are Ready again (each pod on a new sandbox: its
# restart count up, Ready since the boot), each pod is classified from inside (`ip addr`): full
# (eth0 and net1) or bare (eth0 alone). A bare pod is looked at again 30 s later (it stays so:
# nothing replaces its sandbox). Prints one line
#
#   reboot-summary kubernetes=V containerd=V multus=V primary=bridge node=vm etc_cni=disk
#     layout=L guard=G pods=N full=F bare=B notready_s=X stuck_teardowns=S all_full_s=T
#     refused=R held=H
#
#   notready_s       seconds the node's Ready condition was seen not True from the reboot to the
#                    classification (polled about once a second from the host; a failed poll
#                    counts as not True)
#   stuck_teardowns  the pods' sandboxes from before the reboot whose network teardown failed and
#                    had not succeeded by the end (containerd's journal of the new boot)
#   all_full_s       from the boot (the guest's clock: its kernel's start) to the last pod Ready
#                    with all its interfaces (its Ready condition, set by kubelet with the
#                    guest's clock); `never` when a pod came back bare
#   refused, held    the guard's ADDs of the new boot refused with code 11, and held until the
#                    delegate was there and then run (its log in the guest's journal)
#
# and the time of each phase on stderr. Exits 1 when the run could not be made (a pod without
# net1 before the reboot, the guest not back within VM_REBOOT_TIMEOUT s (default 300), a pod not
# Ready again in time); what the line must show is asserted by scripts/test.d/38-vm.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=scripts/versions.sh
. scripts/versions.sh
# shellcheck source=conformance/k8s/lib.sh
. conformance/k8s/lib.sh

LAYOUT=${1:-} GUARD=${2:-} PODS=${3:-3}
case "$LAYOUT/$GUARD" in
  original/off | original/on) ;;
  *) echo "usage: $0 original off|on [PODS]" >&2; exit 2 ;;
esac
CLUSTER_DIR=${CNI_GUARD_CLUSTER_DIR:-/var/lib/cni-guard-cluster}
export KUBECONFIG=$CLUSTER_DIR/admin.kubeconfig
K=$KUBERNETES_BIN/kubectl
NODE_NAME=cni-guard-vm
TIMEOUT=${VM_REBOOT_TIMEOUT:-300}
# The guard's operator commands, as its image names them (one place for a rename).
GUARD_AGENT=${GUARD_AGENT:-/cni-guard-agent}
LABEL=cni-guard.test/vm-reboot
export VM_LAYOUT=$LAYOUT VM_MULTUS_MASTER=05-cilium.conflist

say() { echo "vm-reboot $LAYOUT/$GUARD: $*" >&2; }
fail() { say "FAIL: $*"; exit 1; }
vm() { scripts/vm-node.sh exec "$@"; }
in_vm() { vm -- /bin/sh -c "$1"; } # a shell line in the guest
now() { date +%s.%N; }
since() { python3 -c 'import sys; print(f"{float(sys.argv[2]) - float(sys.argv[1]):.1f}")' "$1" "$(now)"; }

W=$(mktemp -d /tmp/cni-guard-vm-reboot.XXXXXX)
cleanup() {
  local rc=$?
  [ -n "${poller:-}" ] && kill "$poller" 2>/dev/null
  "$K" delete pod -l "$LABEL" --wait=false >/dev/null 2>&1 || true
  rm -rf "$W"
  exit "$rc"
}
trap cleanup EXIT
phases=()
phase() { # NAME START: one timing, printed now and kept for the end
  phases+=("$1=$(since "$2")s")
  say "${phases[-1]}"
}

multus_ready() {
  in_vm 'test -s /etc/cni/net.d/00-multus.conf' >/dev/null 2>&1 &&
    [ "$("$K" -n kube-system get pod -l app=multus -o jsonpath='{range .items[*]}{.metadata.deletionTimestamp}{"|"}{.status.containerStatuses[0].ready}{"\n"}{end}' 2>/dev/null)" = "|true" ]
}
wait_until() { # WHAT SECONDS COMMAND...
  local what=$1 secs=$2 t=$SECONDS
  shift 2
  while ! "$@" >/dev/null; do
    ((SECONDS - t < secs)) || fail "timed out after ${secs}s waiting for $what"
    sleep 2
  done
}

# --- the layout -----------------------------------------------------------------------------------
t=$(now)
# An earlier run's pods (same names) must be gone, or `apply` would patch pods still terminating.
"$K" delete pod -l "$LABEL" --wait=true --timeout="${TIMEOUT}s" >/dev/null
primary=$(python3 - <<'EOF'
import json
print(json.dumps({"cniVersion": "1.0.0", "name": "cilium", "plugins": [{"type": "bridge", "bridge": "cni-guard0",
  "isGateway": True, "ipam": {"type": "host-local", "subnet": "10.88.0.0/16", "routes": [{"dst": "0.0.0.0/0"}]}}]}, indent=2))
EOF
)
printf '%s\n' "$primary" >"$W/primary"
vm --stdin "$W/primary" -- /bin/sh -c 'mkdir -p /etc/cni/net.d /etc/cni/multus/net.d &&
  rm -f /etc/cni/multus/net.d/05-cilium.conflist && cat >/etc/cni/net.d/.05-cilium.tmp &&
  mv /etc/cni/net.d/.05-cilium.tmp /etc/cni/net.d/05-cilium.conflist'
if [ "$GUARD" = off ] && "$K" -n cni-guard get daemonset cni-guard >/dev/null 2>&1; then
  "$K" -n cni-guard delete daemonset cni-guard --wait=true --timeout=120s >/dev/null
  guard_pods_gone() { [ -z "$("$K" -n cni-guard get pods -o name 2>/dev/null)" ]; }
  wait_until "the guard's pod to go" 120 guard_pods_gone
fi
if [ "$GUARD" = off ]; then
  in_vm 'rm -f /etc/cni/net.d/00-cni-guard.conflist /opt/cni/bin/cni-guard'
fi
multus_config() { "$K" -n kube-system get configmap multus-daemon-config -o jsonpath='{.data}' 2>/dev/null || true; }
config_before=$(multus_config)
scripts/vm-node.sh manifest multus.yaml | "$K" apply -f - >/dev/null
wait_until "the NetworkAttachmentDefinition CRD" 60 "$K" get crd network-attachment-definitions.k8s.cni.cncf.io -o name
"$K" wait --for=condition=Established --timeout=60s crd/network-attachment-definitions.k8s.cni.cncf.io >/dev/null
scripts/vm-node.sh manifest net1-nad.yaml | "$K" apply -f - >/dev/null
# A changed daemon-config takes a new Multus pod (the DaemonSet's own template did not change).
if [ -n "$config_before" ] && [ "$(multus_config)" != "$config_before" ]; then
  "$K" -n kube-system delete pod -l app=multus --wait=false >/dev/null 2>&1 || true
fi
wait_until "Multus (00-multus.conf written, its pod Ready)" "$TIMEOUT" multus_ready
if [ "$GUARD" = on ]; then
  scripts/vm-node.sh manifest guard | "$K" apply -f - >/dev/null
  "$K" -n cni-guard rollout status daemonset/cni-guard --timeout="${TIMEOUT}s" >/dev/null
  wait_until "00-cni-guard.conflist" 60 in_vm 'test -s /etc/cni/net.d/00-cni-guard.conflist'
  "$K" -n cni-guard exec ds/cni-guard -c keep -- "$GUARD_AGENT" check \
    --config=/host/etc/cni/net.d/00-cni-guard.conflist --host-root=/host --cni-path=/opt/cni/bin >&2 ||
    fail "the guard's check says ADD would not proceed before the reboot"
fi
say "conf dir: $(in_vm 'ls /etc/cni/net.d | tr "\n" " "')"
phase layout "$t"

# --- the pods -------------------------------------------------------------------------------------
t=$(now)
for i in $(seq "$PODS"); do
  sed -e "s/name: with-net1/name: vm-reboot-$i/" -e "s#^  annotations:#  labels: {$LABEL: \"1\"}\n&#" \
    <(scripts/vm-node.sh manifest pod-net1.yaml)
  echo ---
done | "$K" apply -f - >/dev/null
"$K" wait --for=condition=Ready --timeout="${TIMEOUT}s" pod -l "$LABEL" >/dev/null ||
  fail "the pods are not Ready before the reboot: $("$K" get pods -l "$LABEL" -o wide)"
interfaces() { # POD -> "eth0 net1", "eth0", ...: its interfaces with an IPv4 address
  "$K" exec "$1" -- ip -o -4 addr | awk '$2 != "lo" { print $2 }' | sort | tr '\n' ' '
}
for i in $(seq "$PODS"); do
  ifs=$(interfaces "vm-reboot-$i") || fail "cannot read vm-reboot-$i's interfaces"
  [ "$ifs" = "eth0 net1 " ] || fail "vm-reboot-$i has '$ifs' before the reboot, not eth0 and net1"
done
pod_field() { # JSONPATH (per pod) -> "name value" lines of the test pods
  "$K" get pods -l "$LABEL" -o jsonpath="{range .items[*]}{.metadata.name} $1{\"\\n\"}{end}"
}
pod_field '{.status.containerStatuses[0].restartCount}' >"$W/restarts-before"
in_vm "crictl pods --label $LABEL=1 --state ready -q" >"$W/sandboxes-before"
[ "$(wc -l <"$W/sandboxes-before")" = "$PODS" ] || fail "not $PODS sandboxes before the reboot: $(cat "$W/sandboxes-before")"
phase pods "$t"

# --- the reboot -----------------------------------------------------------------------------------
boot_before=$(vm -- cat /proc/sys/kernel/random/boot_id)
poll_status "$W/node-ready" "$K" get node "$NODE_NAME" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}'
poller=$!
t_reboot=$(now)
say "systemctl reboot (boot $boot_before)"
vm --timeout 30 -- systemctl reboot || true
t=$SECONDS
while true; do
  ((SECONDS - t < TIMEOUT)) || fail "the guest not back within ${TIMEOUT}s of systemctl reboot (serial console: /var/lib/cni-guard-vm/serial.log)"
  b=$(vm --timeout 10 -- cat /proc/sys/kernel/random/boot_id 2>/dev/null) || b=
  [ -n "$b" ] && [ "$b" != "$boot_before" ] && break
  sleep 1
done
# The boot on the guest's clock: now minus the time since its kernel started.
# shellcheck disable=SC2016 # the guest's shell expands them
read -r guest_now uptime < <(in_vm 'echo "$(date +%s.%N) $(cut -d" " -f1 /proc/uptime)"')
boot=$(python3 -c 'import sys; print(f"{float(sys.argv[1]) - float(sys.argv[2]):.3f}")' "$guest_now" "$uptime")
offset=$(python3 -c 'import sys; print(f"{float(sys.argv[1]) - float(sys.argv[2]):+.1f}")' "$guest_now" "$(now)")
say "new boot $b: kernel started $(python3 -c 'import sys; print(f"{float(sys.argv[1]) - float(sys.argv[2]):.1f}")' "$boot" "$t_reboot")s after the reboot call (guest clock $offset s from the host's)"
phase guest_back "$t_reboot"
in_vm 'systemd-analyze 2>/dev/null | head -n 1' >&2 || true

# --- back: node, Multus, every pod on a new sandbox ------------------------------------------------
node_ready() { [ "$(tail -n 1 "$W/node-ready" | cut -d' ' -f2)" = True ]; }
pods_back() { # every test pod Ready, restarted (a new sandbox) since the boot
  local name st ltt rc before n=0
  while read -r name st ltt rc; do
    before=$(awk -v n="$name" '$1 == n { print $2 }' "$W/restarts-before")
    [ "$st" = True ] && [ "${rc:-0}" -gt "${before:-0}" ] || return 1
    python3 -c 'import sys, datetime as d; t = d.datetime.strptime(sys.argv[1], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=d.timezone.utc).timestamp(); sys.exit(not t >= float(sys.argv[2]) - 1)' "$ltt" "$boot" || return 1
    n=$((n + 1))
  done < <(pod_field '{.status.conditions[?(@.type=="Ready")].status} {.status.conditions[?(@.type=="Ready")].lastTransitionTime} {.status.containerStatuses[0].restartCount}')
  [ "$n" = "$PODS" ]
}
wait_until "node $NODE_NAME Ready" "$TIMEOUT" node_ready
phase node_ready "$t_reboot"
wait_until "Multus back (00-multus.conf, its pod Ready)" "$TIMEOUT" multus_ready
phase multus_ready "$t_reboot"
wait_until "the $PODS pods Ready on new sandboxes" "$TIMEOUT" pods_back
phase pods_ready "$t_reboot"

# --- what they came back with ---------------------------------------------------------------------
full=0 bare=0 bare_pods=()
for i in $(seq "$PODS"); do
  ifs=$(interfaces "vm-reboot-$i") || fail "cannot read vm-reboot-$i's interfaces"
  case "$ifs" in
    "eth0 net1 ") full=$((full + 1)) ;;
    "eth0 ") bare=$((bare + 1)) bare_pods+=("vm-reboot-$i") ;;
    *) fail "vm-reboot-$i came back with '$ifs'" ;;
  esac
done
notready=$(seconds_not_true "$W/node-ready")
kill "$poller" 2>/dev/null
poller=
if [ "$bare" -gt 0 ]; then
  say "bare: ${bare_pods[*]}; looking again in 30 s"
  sleep 30
  for p in "${bare_pods[@]}"; do
    [ "$(interfaces "$p")" = "eth0 " ] || fail "$p, bare after the boot, changed to '$(interfaces "$p")'"
  done
  all_full=never
else
  last=$(pod_field '{.status.conditions[?(@.type=="Ready")].lastTransitionTime}' | awk '{ print $2 }' | sort | tail -n 1)
  all_full=$(python3 -c 'import sys, datetime as d; t = d.datetime.strptime(sys.argv[1], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=d.timezone.utc).timestamp(); print(round(t - float(sys.argv[2])))' "$last" "$boot")
fi
phase classified "$t_reboot"

# The old sandboxes' teardown, from containerd's journal of this boot.
in_vm "journalctl -b -u containerd -o cat --no-pager" >"$W/containerd.log"
stuck=0
while read -r sb; do
  [ -n "$sb" ] || continue
  failed=$(grep -c "ailed to destroy network for sandbox \\\\\"$sb" "$W/containerd.log" || true)
  torn=$(grep -c "TearDown network for sandbox \\\\\"$sb\\\\\" successfully" "$W/containerd.log" || true)
  say "old sandbox ${sb:0:13}: teardown failed $failed times, succeeded $torn times"
  if [ "$failed" -gt 0 ] && [ "$torn" = 0 ]; then stuck=$((stuck + 1)); fi
done <"$W/sandboxes-before"

# The guard's decisions in this boot (its syslog lines in the journal).
in_vm "journalctl -b -t cni-guard -o short --no-pager" >"$W/guard.log" || true
refused=$(awk '/cni-guard\[[0-9]+\]: verb=ADD .* decision=refused code=11 / { n++ } END { print n + 0 }' "$W/guard.log")
held=$(awk '/cni-guard\[[0-9]+\]: verb=ADD .* waited=[0-9.]+ms/ && !/decision=refused/ { n++ } END { print n + 0 }' "$W/guard.log")
[ "$GUARD" = off ] || say "the guard's ADDs in this boot: $(grep -c 'verb=ADD' "$W/guard.log" || true) ($refused refused, $held held)"

node_info() { "$K" get node "$NODE_NAME" -o jsonpath="{.status.nodeInfo.$1}"; }
kubelet_version=$(node_info kubeletVersion)
runtime_version=$(node_info containerRuntimeVersion)
say "phases: ${phases[*]}"

# The line's format is conformance/k8s/lib.sh's (reboot_summary), shared with the netns node.
reboot_summary "kubernetes=$kubelet_version" "containerd=${runtime_version#containerd://}" \
  "multus=$MULTUS_VERSION" primary=bridge node=vm etc_cni=disk "layout=$LAYOUT" "guard=$GUARD" \
  "pods=$PODS" "full=$full" "bare=$bare" "notready_s=$notready" "stuck_teardowns=$stuck" \
  "all_full_s=$all_full" "refused=$refused" "held=$held"
