#!/usr/bin/env bash
# The seed's trigger itself, a node reboot, on the real node of scripts/cluster.sh (issue 28):
#
#   conformance/k8s/reboot.sh LAYOUT GUARD [ETC_CNI]
#
#   LAYOUT   original|seed-fix, as churn.sh: both files in the conf dir (the layout before the
#            seed's fix), or 05-cilium.conflist in Multus's own folder
#   GUARD    on|off: deploy/multus-cilium in front, or no guard
#   ETC_CNI  disk (default): /etc/cni kept over the reboot (Talos up to 1.13); tmpfs: /etc/cni
#            empty at boot (Talos 1.14 and later), every writer writes its file again
#
# Brings the node up in that layout (kept when it runs so already, with the primary of
# CLUSTER_PRIMARY), runs $REBOOT_PODS (default 6) pods of a Deployment asking for net1, each
# checked to have eth0 and net1, and reboots the node as Talos does (scripts/cluster.sh reboot:
# kubelet stopped, every pod stopped through the CRI, the pods with a network of their own first,
# then Multus, whose daemon removes 00-multus.conf; then every process gone, /run wiped, the pods'
# network namespaces gone). Every pod then comes back on a new sandbox, full (eth0 and net1) or
# bare (eth0 alone, for good: only replacing the pod helps).
#
# Multus's pod waits $REBOOT_MULTUS_DELAY s (default 8) in an init container before its daemon
# starts (lib.sh start_delay, as churn.sh's restarts): on this node its image is local and its API
# server next door, so it would otherwise start within a second of the boot, where a production
# node pulls images, waits for its API server and starts everything at once. With
# REBOOT_GUARD_DELAY=S the guard's pod waits S s before its install container (default 0): with
# ETC_CNI tmpfs that is the race of the guard's file against the primary's (the Cilium agent, or
# the bridge stand-in's agent writing CLUSTER_PRIMARY_DELAY s after the boot).
#
# Prints one line (lib.sh: reboot_summary, whose comment says what each field counts)
#
#   reboot-summary kubernetes=.. containerd=.. multus=.. primary=.. node=netns etc_cni=.. layout=..
#     guard=.. pods=N full=F bare=B notready_s=.. stuck_teardowns=.. all_full_s=.. refused=..
#     held=.. first_conf=FILE recorded_teardowns=K/N guard_delay_s=S
#
#   recorded_teardowns  of the pods' sandboxes from before the reboot, those the guard tore down
#                       from its ADD record (its log: "verb=DEL container=ID ... deleted-recorded")
#
# and fails when lib.sh's reboot_check says the line misses what it must show. With the guard,
# and its file first at boot, it also fails unless every old sandbox was torn down through its
# record (the delegate recorded at ADD, multus-shim; at the shutdown, while Multus still ran) and
# leaks.py finds the records and leases matching the sandboxes left.
# Leaves the node up, without its Deployment and without the guard's delay.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=scripts/versions.sh
. scripts/versions.sh
# shellcheck source=conformance/k8s/lib.sh
. conformance/k8s/lib.sh

LAYOUT=${1:-}
GUARD=${2:-}
ETC_CNI=${3:-disk}
if ! [[ $LAYOUT =~ ^(original|seed-fix)$ && $GUARD =~ ^(on|off)$ && $ETC_CNI =~ ^(disk|tmpfs)$ ]]; then
  echo "usage: $0 original|seed-fix on|off [disk|tmpfs]" >&2
  exit 2
fi
PODS=${REBOOT_PODS:-6}
MULTUS_DELAY=${REBOOT_MULTUS_DELAY:-8}
GUARD_DELAY=${REBOOT_GUARD_DELAY:-0}
TIMEOUT=${REBOOT_TIMEOUT:-180}

CLUSTER_DIR=${CNI_GUARD_CLUSTER_DIR:-/var/lib/cni-guard-cluster}
NODE=$CLUSTER_DIR/node
export KUBECONFIG=$CLUSTER_DIR/admin.kubeconfig
export CRICTL_BIN # (leaks.py)
K=$KUBERNETES_BIN/kubectl
NODE_NAME=cni-guard-node
CONF_DIR=$NODE/etc/cni/net.d

say() { echo "k8s reboot: $*" >&2; }
fail() { echo "k8s reboot: FAIL: $*" >&2; exit 1; }
now_ms() { date +%s%3N; }

t_up=$SECONDS
node_in_layout "$LAYOUT" "$GUARD"
say "node up in layout=$LAYOUT guard=$GUARD primary=$(cat "$CLUSTER_DIR/primary") ($((SECONDS - t_up))s)"

W=$(mktemp -d /tmp/cni-guard-reboot.XXXXXX)
printf 'runtime-endpoint: unix://%s\ntimeout: 20\n' "$NODE/run/containerd/containerd.sock" >"$W/crictl.yaml"
crictl() { "$CRICTL_BIN/crictl" --config "$W/crictl.yaml" "$@"; }
BG=()
cleanup() {
  local p
  for p in "${BG[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  "$K" delete deployment reboot --ignore-not-found --wait=false >/dev/null 2>&1 || true
  "$K" delete pod -l app=reboot --ignore-not-found --wait=true --timeout=120s >/dev/null 2>&1 || true
  if [ "$GUARD" = on ] && [ "$GUARD_DELAY" != 0 ]; then start_delay cni-guard cni-guard 0 >/dev/null 2>&1 || true; fi
  rm -rf "$W"
}
trap cleanup EXIT

start_delay kube-system kube-multus-ds "$MULTUS_DELAY"
if [ "$GUARD" = on ]; then
  start_delay cni-guard cni-guard "$GUARD_DELAY" first
  "$K" -n cni-guard wait --for=condition=Ready pod -l app.kubernetes.io/name=cni-guard --timeout=120s >/dev/null ||
    fail "the guard is not Ready"
fi

# --- the pods, full before the reboot ------------------------------------------------------------
# Sleepers that end on SIGTERM (a busybox sleep as PID 1 would ignore it and hold the shutdown
# for the whole grace period).
deployment reboot "$PODS" macvlan-net1 '["/bin/sh", "-c", "trap \"exit 0\" TERM; while :; do sleep 1; done"]'
"$K" rollout status deployment/reboot --timeout=180s >/dev/null || fail "the Deployment did not come up before the reboot"
mapfile -t names < <("$K" get pod -l app=reboot -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}')
[ "${#names[@]}" -eq "$PODS" ] || fail "want $PODS pods before the reboot, have ${#names[@]}"
# addresses NAME: "eth0 net1" as far as the pod has them with an IPv4 address ("" when exec fails)
addresses() {
  "$K" exec "$1" -- ip -o -4 addr 2>/dev/null | awk '$2 == "eth0" || $2 == "net1" { print $2 }' | sort | tr '\n' ' ' | sed 's/ $//'
}
declare -A old_sandbox=()
for n in "${names[@]}"; do
  [ "$(addresses "$n")" = "eth0 net1" ] || fail "$n has not eth0 and net1 before the reboot: $(addresses "$n")"
  old_sandbox[$n]=$(crictl pods --namespace default --name "^$n\$" --state ready -q) || fail "crictl pods failed"
  [[ ${old_sandbox[$n]} =~ ^[0-9a-f]{64}$ ]] || fail "$n has not one ready sandbox: ${old_sandbox[$n]}"
done
printf '%s\n' "${old_sandbox[@]}" >"$W/old-sandboxes"
say "$PODS pods Running with eth0 and net1; rebooting the node (/etc/cni on $ETC_CNI)"

k8s_version=$("$K" version -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["serverVersion"]["gitVersion"])')
ctrd_version=$("$K" get node "$NODE_NAME" -o jsonpath='{.status.nodeInfo.containerRuntimeVersion}')
multus_image=$("$K" -n kube-system get daemonset kube-multus-ds -o jsonpath='{.spec.template.spec.containers[0].image}')

# --- observers -----------------------------------------------------------------------------------
poll_status "$W/ready-polls" "$K" get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}'
BG+=($!)
# The conf dir as libcni lists it (*.conf, *.conflist, *.json, sorted), "ms files..." at each
# change, every 0.1 s. A listing that fails (the folder itself removed, as a tmpfs reboot does
# for a moment) is looked at again, not recorded: under errexit and pipefail it would otherwise
# end the observer, and first_conf would be a guess.
(
  last=-
  while kill -0 $$ 2>/dev/null; do
    if now=$(find "$CONF_DIR" -maxdepth 1 -type f \( -name '*.conf' -o -name '*.conflist' -o -name '*.json' \) \
      -printf '%f\n' 2>/dev/null | LC_ALL=C sort | tr '\n' ' ') && [ "$now" != "$last" ]; then
      echo "$(now_ms) $now" >>"$W/conf-dir"
      last=$now
    fi
    sleep 0.1
  done
) >/dev/null 9>&- &
observer=$!
BG+=($!)
kubelet_log=$CLUSTER_DIR/logs/kubelet.log
kubelet_from=$(($(stat -c %s "$kubelet_log") + 1))
guard_from=$(stat -c %s "$CLUSTER_DIR/logs/guard-syslog.log")

# --- the reboot ----------------------------------------------------------------------------------
t_reboot=$(now_ms)
CLUSTER_REBOOT_ETC_CNI=$ETC_CNI scripts/cluster.sh reboot
boot=$(cat "$CLUSTER_DIR/boot-ms")
say "node down and booted again in $(((boot - t_reboot) / 1000)) s"

# Each pod, once it runs on a new sandbox: full or bare, one verdict a pod. Done when every pod
# has one and they are all full, or some are bare (a bare pod stays bare: nothing re-runs its
# ADD), or after $TIMEOUT s.
declare -A verdict=()
all_full=never
while (($(now_ms) - boot < TIMEOUT * 1000)); do
  for n in "${names[@]}"; do
    [ -z "${verdict[$n]:-}" ] || continue
    sb=$(crictl pods --namespace default --name "^$n\$" --state ready -q 2>/dev/null | head -n 1) || true
    [ -n "$sb" ] && [ "$sb" != "${old_sandbox[$n]}" ] || continue
    [ -n "$(crictl ps --pod "$sb" --state running -q 2>/dev/null)" ] || continue
    a=$(addresses "$n")
    case "$a" in
      "eth0 net1") verdict[$n]=full ;;
      eth0) verdict[$n]=bare ;;
      *) continue ;; # (exec failed, or eth0 not up yet: looked at again)
    esac
    say "$n on sandbox ${sb:0:13}: ${verdict[$n]} ($a) $((($(now_ms) - boot) / 1000)) s after the boot"
  done
  if [ "${#verdict[@]}" -eq "$PODS" ]; then
    if [[ " ${verdict[*]} " != *" bare "* ]]; then all_full=$((($(now_ms) - boot + 500) / 1000)); fi
    break
  fi
  sleep 0.5
done
full=0 bare=0
for n in "${names[@]}"; do
  case "${verdict[$n]:-}" in full) full=$((full + 1)) ;; bare) bare=$((bare + 1)) ;; *) say "$n: no verdict within $TIMEOUT s" ;; esac
done

# --- the numbers ---------------------------------------------------------------------------------
if [ "$GUARD" = on ]; then
  # The guard's file is in the conf dir again (with tmpfs: written by its init container).
  for _ in $(seq 120); do [ -s "$CONF_DIR/00-cni-guard.conflist" ] && break; sleep 1; done
  [ -s "$CONF_DIR/00-cni-guard.conflist" ] || fail "00-cni-guard.conflist not back 120 s after the boot"
fi
kill -0 "$observer" 2>/dev/null || fail "the conf dir's observer ended before the run did: $W/conf-dir is not the whole story"
for p in "${BG[@]}"; do kill "$p" 2>/dev/null || true; done
wait 2>/dev/null || true
BG=()
# The first configuration containerd had after the boot: the conf dir's first file the first time
# it held any, from the boot on (on disk, what the reboot left there; with tmpfs nothing writes
# between the wipe and the boot, so only what came after counts).
first_conf=$(awk -v boot="$boot" -v tmpfs="$([ "$ETC_CNI" = tmpfs ] && echo 1)" '
  $1 <= boot && !tmpfs { at_boot = $2 }
  $1 > boot && first == "" && NF > 1 { first = $2 }
  END { print (at_boot != "" ? at_boot : (first != "" ? first : "none")) }' "$W/conf-dir")
say "the conf dir from the boot on (s after it: files): $(awk -v boot="$boot" '
  $1 <= boot { line = "0.0: " substr($0, index($0, " ") + 1) }
  $1 > boot { if (line != "") { printf "%s; ", line; line = "" } printf "%.1f: %s; ", ($1 - boot) / 1000, substr($0, index($0, " ") + 1) }
  END { if (line != "") printf "%s", line }' "$W/conf-dir")"
tail -c +"$kubelet_from" "$kubelet_log" >"$W/kubelet-run.log"
failed_teardowns "$W/kubelet-run.log" >"$W/failed-sandboxes"
stuck=$(awk 'NR == FNR { failed[$1] = 1; next } ($1 in failed) { n++ } END { print n + 0 }' "$W/failed-sandboxes" "$W/old-sandboxes")
recorded=0 waited=0
for sb in "${old_sandbox[@]}"; do
  l=$(tail -c +"$((guard_from + 1))" "$CLUSTER_DIR/logs/guard-syslog.log" | grep "verb=DEL container=$sb .*decision=deleted-recorded" | head -n 1 || true)
  [ -z "$l" ] || recorded=$((recorded + 1))
  if grep -q 'waited=[0-9]' <<<"$l"; then waited=$((waited + 1)); fi
done
line=$(reboot_summary kubernetes="$k8s_version" containerd="${ctrd_version#containerd://}" \
  multus="${multus_image##*:}" primary="$(cat "$CLUSTER_DIR/primary")" node=netns etc_cni="$ETC_CNI" \
  layout="$LAYOUT" guard="$GUARD" pods="$PODS" full="$full" bare="$bare" \
  notready_s="$(seconds_not_true "$W/ready-polls")" stuck_teardowns="$stuck" all_full_s="$all_full" \
  refused="$(guard_refusals "$guard_from")" held="$(guard_holds "$guard_from")" \
  first_conf="$first_conf" recorded_teardowns="$recorded/$PODS" guard_delay_s="$GUARD_DELAY")
say "failed teardowns after the boot: $(wc -l <"$W/failed-sandboxes") sandboxes, $stuck of the pods' old ones; DELs from the record that waited for the delegate: $waited"
if [ "$GUARD" = on ] && [ "$first_conf" = 00-cni-guard.conflist ]; then
  [ "$recorded" -eq "$PODS" ] ||
    fail "with the guard first, every old sandbox must be torn down from its record ($recorded/$PODS): $line"
  leaks=$(conformance/k8s/leaks.py --settle 60) || fail "records or leases do not match the sandboxes left: $leaks"
  say "$leaks"
fi
reboot_check "$line" || fail "the line does not show what it must (above)"
echo "$line"
