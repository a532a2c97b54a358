#!/usr/bin/env bash
# What a node goes through besides a Multus rollout, with the guard in front (issue 21), on the
# real node of scripts/cluster.sh with the real Multus and the guard as deploy/multus-cilium has
# it (its --wait-seconds, 60):
#
#   conformance/k8s/node-events.sh containerd-restart|reboot|long-outage
#
#   containerd-restart  a pod runs (its guard record written); Multus goes away and a second pod
#                       is created, its ADD held by the guard; containerd restarts (as its
#                       service does: SIGTERM to containerd alone). Multus comes back: the held
#                       pod gets eth0 + net1, the first pod kept its sandbox, net1 and record
#                       unchanged, and its DEL afterwards runs the recorded delegate.
#   reboot              a pod runs; the node reboots without stopping its pods first
#                       (scripts/cluster.sh reboot with CLUSTER_REBOOT_PODS=kill: kubelet and
#                       containerd stopped, then every process killed, as a shutdown without
#                       kubelet's graceful node shutdown, or a crash; /run wiped, the pods' network
#                       namespaces gone; containerd and kubelet up before the guard's and Multus's
#                       pods), so the old sandbox is torn down after the boot. Multus is kept off the
#                       node until the guard's DEL of the old sandbox is seen waiting for it (a
#                       local image starts Multus in about a second, so otherwise it is a race
#                       whether the window reaches that DEL). The pod comes back on a new
#                       sandbox with net1; the old sandbox is torn down through the delegate the
#                       guard recorded (multus-shim), its record and its net1 lease gone.
#   long-outage         Multus stays away 75 s, longer than the guard's wait and multus-shim's
#                       60 s: a pod created then is held, refused once the wait is over (code
#                       11, kubelet retries), and comes up with net1 when Multus is back; a pod
#                       deleted 30 s before Multus is back is not torn down before (its recorded
#                       delegate is multus-shim: the guard's DEL waits for Multus) and is, once
#                       it is, its net1 lease freed.
#
# Each ends with conformance/k8s/leaks.py (the guard's records and the host-local leases match
# the sandboxes left) and prints one line
#
#   node-event-summary scenario=NAME ... bare=0 stale=0
#
# failing (exit 1) when what the scenario is about did not happen (no ADD held when containerd
# went down, no teardown through the record after the reboot, no refusal after the full wait)
# as well as when a pod ends up without net1 or something is left. Leaves the cluster up with
# Multus back and no test pod.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=scripts/versions.sh
. scripts/versions.sh
export CRICTL_BIN

SCENARIO=${1:-}
case "$SCENARIO" in
  containerd-restart | reboot | long-outage) ;;
  *) echo "usage: $0 containerd-restart|reboot|long-outage" >&2; exit 2 ;;
esac
OUTAGE=${NODE_EVENTS_OUTAGE:-75}

CLUSTER_DIR=${CNI_GUARD_CLUSTER_DIR:-/var/lib/cni-guard-cluster}
NODE=$CLUSTER_DIR/node
export KUBECONFIG=$CLUSTER_DIR/admin.kubeconfig
K=$KUBERNETES_BIN/kubectl
CONF=$NODE/etc/cni/net.d/00-multus.conf
GUARD_CONF=$NODE/etc/cni/net.d/00-cni-guard.conflist
CACHE=$NODE/var/lib/cni/cni-guard
LEASES=$NODE/var/lib/cni/networks
GUARD_LOG=$CLUSTER_DIR/logs/guard-syslog.log
GUARD_PLUGIN=$NODE/opt/cni/bin/cni-guard
CRICTL_CONFIG=$(mktemp /tmp/cni-guard-node-events.XXXXXX) # (without one crictl warns at every call)
printf 'runtime-endpoint: unix://%s\ntimeout: 20\n' "$NODE/run/containerd/containerd.sock" >"$CRICTL_CONFIG"
crictl() { "$CRICTL_BIN/crictl" --config "$CRICTL_CONFIG" "$@"; }

say() { echo "k8s $SCENARIO: $*" >&2; }
ok() { echo "k8s $SCENARIO: ok: $*" >&2; }
fail() { echo "k8s $SCENARIO: FAIL: $*" >&2; exit 1; }
now_ms() { date +%s%3N; }

"$K" -n cni-guard get daemonset cni-guard >/dev/null || fail "the guard is not deployed (scripts/cluster.sh up)"
wait_s=$(grep -o '"waitSeconds": *[0-9]*' "$GUARD_CONF" | grep -o '[0-9]*$') ||
  fail "00-cni-guard.conflist has no waitSeconds: $(cat "$GUARD_CONF")"
[ "$wait_s" -gt 0 ] || fail "the guard refuses without waiting (waitSeconds 0): these scenarios are about its wait"

multus_away() { # Multus off the node (a nodeSelector no node has): its daemon removes 00-multus.conf
  "$K" -n kube-system patch daemonset kube-multus-ds --type=merge \
    -p '{"spec":{"template":{"spec":{"nodeSelector":{"cni-guard.test/no-such-node":"1"}}}}}' >/dev/null
  for _ in $(seq 300); do [ -e "$CONF" ] || return 0; sleep 0.1; done
  fail "00-multus.conf still there 30 s after Multus was taken off the node"
}
multus_ready() {
  [ -s "$CONF" ] &&
    [ "$("$K" -n kube-system get pod -l app=multus -o jsonpath='{range .items[*]}{.metadata.deletionTimestamp}{"|"}{.status.containerStatuses[0].ready}{"\n"}{end}' 2>/dev/null)" = "|true" ]
}
multus_back() {
  "$K" -n kube-system patch daemonset kube-multus-ds --type=json \
    -p '[{"op":"remove","path":"/spec/template/spec/nodeSelector"}]' >/dev/null 2>&1 || true
}
wait_multus() { # SECONDS
  local i
  for ((i = 0; i < $1; i++)); do multus_ready && return 0; sleep 1; done
  fail "Multus not back within $1 s"
}
# cni_running VERB CONTAINER: a CNI plugin of that verb for that sandbox runs now (its
# environment: CNI_COMMAND, CNI_CONTAINERID).
cni_running() {
  local env
  for env in /proc/[0-9]*/environ; do
    env=$({ tr '\0' '\n' <"$env"; } 2>/dev/null) || continue # (gone meanwhile)
    grep -qx "CNI_CONTAINERID=$2" <<<"$env" && grep -qx "CNI_COMMAND=$1" <<<"$env" && return 0
  done
  return 1
}
cleanup() {
  rm -f "$CRICTL_CONFIG"
  multus_back
  "$K" delete pod -l cni-guard.test/node-events --ignore-not-found --wait=true --timeout=150s >/dev/null 2>&1 || true
}
trap cleanup EXIT

pod() { # NAME: a test pod asking Multus for net1
  sed -e "s/name: with-net1/name: $1/" -e 's/^  annotations:/  labels: {cni-guard.test\/node-events: "1"}\n&/' \
    <(scripts/cluster.sh manifest pod-net1.yaml) | "$K" apply -f - >/dev/null
}
ready() { [ "$("$K" get pod "$1" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]; }
wait_ready() { # NAME SECONDS
  local i
  for ((i = 0; i < $2 * 2; i++)); do ready "$1" && return 0; sleep 0.5; done
  fail "$1 not Ready within $2 s: $("$K" get pod "$1" -o wide 2>&1 | tail -n 1)"
}
has_net1() { # NAME: eth0 and net1 inside the pod, both with an address
  local a
  a=$("$K" exec "$1" -- ip -o -4 addr) || fail "cannot read $1's addresses"
  grep -q ' eth0 ' <<<"$a" && grep -q ' net1 ' <<<"$a"
}
sandbox() { # NAME: the pod's ready sandbox id
  crictl pods --namespace default --name "^$1\$" --state ready -q | head -n 1
}
record() { # SANDBOX: its guard record (in the folder of the guard's network name)
  local f
  for f in "$CACHE"/*/"$1":eth0.json; do echo "$f"; return; done
}
net1_lease() { grep -rlF "$1" "$LEASES/macvlan-net1" 2>/dev/null || true; } # SANDBOX
guard_lines() { # FROM_BYTE PATTERN: the guard's log lines from that byte on that match
  tail -c +"$1" "$GUARD_LOG" | grep 'cni-guard\[' | grep -E "$2" || true
}
wait_log() { # FROM_BYTE PATTERN SECONDS: waits for such a line of the guard's
  local i
  for ((i = 0; i < $3; i++)); do
    [ -z "$(guard_lines "$1" "$2")" ] || return 0
    sleep 1
  done
  return 1
}
held_adds() { pgrep -f "^$GUARD_PLUGIN( |\$)" || true; } # the guard's invocations running now
leaks() { # the records and leases against the sandboxes; prints stale=N
  local line
  line=$(conformance/k8s/leaks.py --settle 60) || { echo "$line" >&2; fail "records or leases do not match the sandboxes left: $line"; }
  say "$line"
}
log_from=$(($(stat -c %s "$GUARD_LOG") + 1))

case "$SCENARIO" in
  containerd-restart)
    pod ce-before
    wait_ready ce-before 90
    sb_before=$(sandbox ce-before)
    [ -s "$(record "$sb_before")" ] || fail "ce-before (sandbox $sb_before) has no guard record"
    rec_sum=$(sha256sum <"$(record "$sb_before")")
    multus_away
    pod ce-held
    held=
    for _ in $(seq 60); do
      held=$(held_adds)
      [ -n "$held" ] && break
      sleep 0.5
    done
    [ -n "$held" ] || fail "no ADD of the guard was running 30 s after ce-held was created: nothing was held when containerd went down"
    sleep 2
    [ -n "$(held_adds)" ] || fail "the guard's ADD ended within 2 s although Multus is away: $(guard_lines "$log_from" 'verb=ADD' | tail -n 2)"
    say "the guard holds ce-held's ADD (pid $(tr '\n' ' ' <<<"$held")); restarting containerd"
    t0=$(now_ms)
    scripts/cluster.sh containerd-restart
    restart_ms=$(($(now_ms) - t0))
    after=alive
    for p in $held; do [ -d "/proc/$p" ] || after=ended; done
    say "containerd back in $restart_ms ms; the held ADD after the restart: $after"
    sleep 3
    multus_back
    wait_multus 120
    t_back=$(now_ms)
    wait_ready ce-held 120
    ready_ms=$(($(now_ms) - t_back))
    has_net1 ce-held || fail "ce-held is Ready without net1 after containerd's restart"
    ready ce-before || fail "ce-before is not Ready after containerd's restart"
    [ "$(sandbox ce-before)" = "$sb_before" ] || fail "ce-before's sandbox changed over containerd's restart ($sb_before -> $(sandbox ce-before))"
    has_net1 ce-before || fail "ce-before lost net1 over containerd's restart"
    [ "$(sha256sum <"$(record "$sb_before")")" = "$rec_sum" ] || fail "ce-before's guard record changed over containerd's restart"
    ok "ce-held Ready with net1 ${ready_ms} ms after Multus was back; ce-before kept its sandbox, net1 and record"
    lease=$(net1_lease "$sb_before")
    [ -n "$lease" ] || fail "ce-before has no net1 lease"
    "$K" delete pod ce-before --wait=true --timeout=90s >/dev/null
    wait_log "$log_from" "verb=DEL container=$sb_before .*decision=deleted-recorded" 30 ||
      fail "ce-before's DEL did not run its recorded delegate: $(guard_lines "$log_from" "container=$sb_before" | tail -n 3)"
    [ -z "$(net1_lease "$sb_before")" ] || fail "ce-before's net1 lease $lease was not freed"
    [ ! -e "$(record "$sb_before")" ] || fail "ce-before's record is left after its DEL"
    ok "ce-before's DEL ran the recorded delegate, freed net1's lease and removed the record"
    leaks
    summary="held_add=$after containerd_restart_ms=$restart_ms ready_after_multus_ms=$ready_ms record_kept=yes teardown=recorded" ;;

  reboot)
    pod rb-1
    wait_ready rb-1 90
    sb_old=$(sandbox rb-1)
    [ -s "$(record "$sb_old")" ] || fail "rb-1 (sandbox $sb_old) has no guard record"
    lease=$(net1_lease "$sb_old")
    [ -n "$lease" ] || fail "rb-1 has no net1 lease"
    multus_away
    t0=$(now_ms)
    CLUSTER_REBOOT_PODS="kill" scripts/cluster.sh reboot
    # kubelet tears the old sandbox down (its network namespace is gone) while Multus is away:
    # the guard's DEL of it waits for 00-multus.conf. Then Multus comes back.
    for _ in $(seq 120); do cni_running DEL "$sb_old" && break; sleep 0.5; done
    cni_running DEL "$sb_old" ||
      fail "no DEL of the old sandbox ${sb_old:0:13} waiting 60 s after the reboot: $(guard_lines "$log_from" "container=$sb_old" | tail -n 3)"
    multus_back
    # Multus's pod comes back with kubelet, the pods that need it wait for it (the guard).
    for _ in $(seq 180); do
      ready rb-1 && [ -n "$(sandbox rb-1)" ] && [ "$(sandbox rb-1)" != "$sb_old" ] && break
      sleep 1
    done
    ready rb-1 || fail "rb-1 not Ready 180 s after the reboot: $("$K" get pod rb-1 -o wide | tail -n 1)"
    ready_ms=$(($(now_ms) - t0))
    sb_new=$(sandbox rb-1)
    [ "$sb_new" != "$sb_old" ] || fail "rb-1 is Ready on its old sandbox after the reboot"
    has_net1 rb-1 || fail "rb-1 came back without net1"
    ok "rb-1 back on sandbox ${sb_new:0:13} with net1, ${ready_ms} ms after the reboot began"
    wait_log "$log_from" "verb=DEL container=$sb_old .*decision=deleted-recorded" 120 ||
      fail "the old sandbox ${sb_old:0:13} was not torn down through its record: $(guard_lines "$log_from" "container=$sb_old" | tail -n 3)"
    del_errors=$(guard_lines "$log_from" "verb=DEL container=$sb_old .*decision=error" | wc -l)
    # The evidence: Multus was not up when containerd tore the old sandbox down, and the guard's
    # DEL waited for it (a DEL replayed at once into multus-shim is a success that frees nothing).
    del_line=$(guard_lines "$log_from" "verb=DEL container=$sb_old .*decision=deleted-recorded" | head -n 1)
    del_waited=$(grep -o 'waited=[0-9]*' <<<"$del_line" | grep -o '[0-9]*$') ||
      fail "the old sandbox's DEL did not wait for Multus (was it up already?): $del_line"
    [ ! -e "$(record "$sb_old")" ] || fail "the old sandbox's record is left"
    for _ in $(seq 30); do [ -z "$(net1_lease "$sb_old")" ] && break; sleep 1; done
    [ -z "$(net1_lease "$sb_old")" ] || fail "the old sandbox's net1 lease $lease was not freed"
    ok "the old sandbox torn down through the recorded delegate after waiting ${del_waited} ms for Multus ($del_errors failed attempts before), its record and net1 lease gone"
    leaks
    summary="ready_after_reboot_ms=$ready_ms old_teardown=recorded del_waited_ms=$del_waited del_retries=$del_errors" ;;

  long-outage)
    pod lo-gone
    wait_ready lo-gone 90
    sb_gone=$(sandbox lo-gone)
    lease=$(net1_lease "$sb_gone")
    [ -n "$lease" ] || fail "lo-gone has no net1 lease"
    multus_away
    t_away=$(now_ms)
    pod lo-new
    # The guard's wait runs out ($wait_s s) before Multus is back: a refusal, code 11.
    wait_log "$log_from" "verb=ADD .*decision=refused code=11" $((OUTAGE - 5)) ||
      fail "no refusal of the guard's after its ${wait_s} s wait, $OUTAGE s into the outage"
    refusal=$(guard_lines "$log_from" "verb=ADD .*decision=refused code=11" | head -n 1)
    waited=$(grep -o 'waited=[0-9]*' <<<"$refusal" | grep -o '[0-9]*$') || fail "the refusal names no wait: $refusal"
    [ "$waited" -ge $((wait_s * 1000 - 1000)) ] || fail "the guard refused after ${waited} ms, not its ${wait_s} s wait: $refusal"
    ok "refused after waiting ${waited} ms: ${refusal#*decision=}"
    # lo-gone deleted 30 s before Multus is back: its DEL waits for Multus (within the guard's
    # wait) instead of replaying multus-shim, which would answer success for a DEL its absent
    # daemon never ran.
    while (($(now_ms) - t_away < (OUTAGE - 30) * 1000)); do sleep 1; done
    "$K" delete pod lo-gone --wait=false >/dev/null
    while (($(now_ms) - t_away < OUTAGE * 1000)); do sleep 1; done
    "$K" get pod lo-gone >/dev/null 2>&1 || fail "lo-gone was torn down while Multus was away: its recorded delegate (multus-shim) needs the daemon"
    multus_back
    wait_multus 120
    t_back=$(now_ms)
    away_s=$(((t_back - t_away) / 1000))
    wait_ready lo-new 150
    ready_ms=$(($(now_ms) - t_back))
    has_net1 lo-new || fail "lo-new is Ready without net1 after the long outage"
    for _ in $(seq 120); do "$K" get pod lo-gone >/dev/null 2>&1 || break; sleep 1; done
    ! "$K" get pod lo-gone >/dev/null 2>&1 || fail "lo-gone still there 120 s after Multus was back"
    gone_ms=$(($(now_ms) - t_back))
    wait_log "$log_from" "verb=DEL container=$sb_gone .*decision=deleted-recorded" 10 ||
      fail "lo-gone's DEL did not go through its record: $(guard_lines "$log_from" "container=$sb_gone" | tail -n 3)"
    del_errors=$(guard_lines "$log_from" "verb=DEL container=$sb_gone .*decision=error" | wc -l)
    [ -z "$(net1_lease "$sb_gone")" ] || fail "lo-gone's net1 lease $lease was not freed"
    refusals=$(guard_lines "$log_from" "verb=ADD .*decision=refused code=11" | wc -l)
    ok "lo-new Ready with net1 ${ready_ms} ms after Multus was back (${away_s} s away, $refusals refusals); lo-gone torn down ${gone_ms} ms after it ($del_errors failed DELs before)"
    leaks
    summary="away_s=$away_s wait_seconds=$wait_s refused=$refusals ready_after_multus_ms=$ready_ms del_retries=$del_errors teardown_after_multus_ms=$gone_ms" ;;
esac

"$K" delete pod -l cni-guard.test/node-events --wait=true --timeout=90s >/dev/null
line=$(conformance/k8s/leaks.py --settle 60) || fail "after the test pods' deletion: $line"
stale=$(grep -o 'stale_records=[0-9]* .*stale_leases=[0-9]*' <<<"$line" | grep -o '=[0-9]*' | tr -d = | paste -sd+ | bc)
echo "node-event-summary scenario=$SCENARIO $summary bare=0 stale=$stale"
