#!/usr/bin/env bash
# The one-node Kubernetes of scripts/cluster.sh (issue 12): up, the checks of
# conformance/k8s/check.sh (a plain pod; a pod with Multus's net1; the guard in front) and
# conformance/k8s/incident.sh (Multus stopped, a pod in the window is refused by the guard, then
# gets eth0 + net1 once Multus is back; what an operator sees is captured), daemonset.sh (the
# guard's DaemonSet: shutdown, install, keep, uninstall overlay) and crash.sh (a SIGKILLed Multus,
# three ways); recovery.sh and perpod.sh (issue 18); node-events.sh (containerd restart, a reboot
# that does not stop the pods first, a long Multus outage); then, without the guard in the layout before the seed's fix, the incident itself
# (the pod comes up without net1) and autoconfig.sh (the guard there with Multus's auto-config:
# refused naming it); then, layout by layout, the incident under churn (churn.sh: five
# incident-summary lines) and node reboots (reboot.sh, issue 28: six reboot-summary lines, /etc/cni
# on disk and as Talos 1.14's tmpfs), and a DEL cut off by Multus's shutdown (del-during-shutdown.sh:
# two del-during-shutdown-summary lines, without and with the guard); then down, and nothing left behind (processes, network
# namespace, mounts, cgroups, files, entries in /var/lib/cni/results, the kernel settings kubelet
# changes). Each stage's time is printed at the end.
#
# Needs root and the binaries scripts/setup.sh builds. Locally without them it skips loudly;
# under CI=true that is a failure.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=scripts/versions.sh
. scripts/versions.sh
# shellcheck source=conformance/k8s/lib.sh
. conformance/k8s/lib.sh

skip() {
  if [ "${CI:-}" = true ]; then
    echo "35-kubernetes: FAIL: $1" >&2
    exit 1
  fi
  echo "35-kubernetes: SKIP: $1" >&2
  exit 0
}
[ "$(id -u)" = 0 ] || skip "needs root (network namespaces, containerd, kubelet)"
for b in "$KUBERNETES_BIN/kubelet" "$ETCD_BIN/etcd" "$MULTUS_BIN/multus-daemon"; do
  [ -x "$b" ] || skip "$b is not built (scripts/setup.sh)"
done

CLUSTER_DIR=${CNI_GUARD_CLUSTER_DIR:-/var/lib/cni-guard-cluster}
cargo build --release --locked -p cni-guard

# One node per machine (fixed namespace, addresses, folder): every user of it (this test from
# any clone, anything else that runs scripts/cluster.sh) holds this lock; the others wait here.
exec 9>/run/lock/cni-guard-node.lock
flock -w 1800 9 || skip "another run of this test held the lock for 30 min"
stage_done "release build, waiting for the node lock"
# The cluster belongs to this run: a cluster left up by a killed run is not taken for ours
# (scripts/cluster.sh up removes it and makes a new one).
export CLUSTER_OWNER_PID=$$
# Under the lock, a cluster already there is a leftover of a killed run (its daemons run in
# sessions of their own and outlive it): its kubelet changed the kernel settings and its
# sandboxes wrote libcni's cache, so it goes before the snapshots below are taken (down puts
# back the settings it saved when it came up). Taken with it there, "before" would be its.
if [ -e "$CLUSTER_DIR" ] || [ -e /run/netns/cni-guard-k8s ]; then
  echo "35-kubernetes: a cluster left by a killed run is there: removing it first" >&2
  scripts/cluster.sh down
fi
# What the node writes outside its folder, as it was before: libcni's cache and the kernel
# settings kubelet changes (scripts/cluster.sh sysctls).
mapfile -t results_before < <(ls -A /var/lib/cni/results 2>/dev/null | sort)
mapfile -t sysctls < <(scripts/cluster.sh sysctls)
sysctls_before=$(sysctl -n "${sysctls[@]}")

finish() {
  local rc=$?
  trap - EXIT
  # Interrupted: a step still running (churn.sh, say) must not race the teardown.
  if pkill -TERM -P $$ 2>/dev/null; then sleep 2; pkill -KILL -P $$ 2>/dev/null || true; fi
  scripts/cluster.sh down || rc=1
  # Nothing may be left behind.
  left=()
  [ ! -e /run/netns/cni-guard-k8s ] || left+=("netns cni-guard-k8s")
  [ ! -e "$CLUSTER_DIR" ] || left+=("$CLUSTER_DIR")
  ! ip link show cgk8s-host >/dev/null 2>&1 || left+=("host veth cgk8s-host")
  if pgrep -f "$CLUSTER_DIR/" >/dev/null; then left+=("processes naming $CLUSTER_DIR"); fi
  if awk -v d="$CLUSTER_DIR" '$5 == d || index($5, d "/") == 1 { found = 1 } END { exit !found }' /proc/self/mountinfo; then
    left+=("mounts below $CLUSTER_DIR")
  fi
  if compgen -G "/sys/fs/cgroup/*/cni-guard-k8s" >/dev/null; then left+=("cgroups cni-guard-k8s"); fi
  local_results=$(comm -13 <(printf '%s\n' "${results_before[@]}") <(ls -A /var/lib/cni/results 2>/dev/null | sort) | sed '/^$/d')
  [ -z "$local_results" ] || left+=("libcni cache entries in /var/lib/cni/results: $(tr '\n' ' ' <<<"$local_results")")
  [ "$(sysctl -n "${sysctls[@]}")" = "$sysctls_before" ] ||
    left+=("kernel settings changed (before -> after): $(paste -d' ' <(printf '%s\n' "${sysctls[@]}") <(printf '%s\n' "$sysctls_before") <(sysctl -n "${sysctls[@]}") | awk '$2 != $3 { printf "%s=%s->%s ", $1, $2, $3 }')")
  if [ ${#left[@]} -gt 0 ]; then
    echo "35-kubernetes: FAIL: left behind: ${left[*]}" >&2
    rc=1
  fi
  stage_done down
  echo "35-kubernetes: time per stage"
  stage_table
  exit "$rc"
}
trap finish EXIT

field() { # LINE KEY -> the value of KEY=... in LINE
  tr ' ' '\n' <<<"$1" | sed -n "s/^$2=//p"
}
num() { # LINE KEY -> the value of KEY, which must be a number (a missing or garbled field fails)
  local v
  v=$(field "$1" "$2" | head -n 1)
  [[ $v =~ ^[0-9]+(\.[0-9]+)?$ ]] || { echo "35-kubernetes: FAIL: $2=\"$v\" is not a number in: $1" >&2; exit 1; }
  echo "$v"
}

start=$SECONDS
# The scenarios about the refusal itself (incident, daemonset, crash) see it at once: the guard
# refuses without waiting (--wait-seconds=0). The manifest's own wait (60) is measured against 0
# by recovery.sh below, and is what the churn runs use.
export CLUSTER_GUARD_WAIT=0
scripts/cluster.sh up
echo "35-kubernetes: up in $((SECONDS - start))s"
scripts/cluster.sh status
stage_done "up (the seed's layout, the guard in front)"
conformance/k8s/check.sh
conformance/k8s/incident.sh
stage_done "check.sh, incident.sh"
# The hold test an operator runs (scripts/hold-test.sh): Multus kept off the node by a node
# affinity, a pod with a namespaced network of its own in a namespace of its own, held, then
# Ready with net1 once Multus is back.
hold_kubectl() { KUBECONFIG=$CLUSTER_DIR/admin.kubeconfig "$KUBERNETES_BIN/kubectl" "$@"; }
hold_kubectl create namespace hold-test >/dev/null
line=$(KUBECONFIG=$CLUSTER_DIR/admin.kubeconfig KUBECTL=$KUBERNETES_BIN/kubectl scripts/hold-test.sh \
  --node cni-guard-node --namespace hold-test --image localhost/cni-guard-test/busybox:1 --hold 15)
echo "$line"
[ "$(field "$line" result)" = pass ] && [ "$(num "$line" held_s)" -ge 15 ] && [ "$(field "$line" net1)" = yes ] ||
  { echo "35-kubernetes: FAIL: the hold test: $line" >&2; exit 1; }
hold_kubectl delete namespace hold-test --wait=true --timeout=120s >/dev/null
stage_done "hold-test.sh"
# The guard's DaemonSet as an operator runs it: shutdown, install, keep, the uninstall overlay.
conformance/k8s/daemonset.sh
stage_done "daemonset.sh"
# A SIGKILLed, crash-looping Multus (00-multus.conf stays, its socket dead) without the guard,
# with it, and with its `sockets` precondition: every pod comes up with net1 (crash.sh fails
# otherwise); only the sockets precondition refuses at once, naming the socket, and turns the
# guard's probe NotReady.
for mode in no-guard guard guard-socket; do
  line=$(conformance/k8s/crash.sh "$mode")
  echo "$line"
  num "$line" pod_ready_s >/dev/null
  case "$mode" in
    guard)
      # No refusal by the guard (the file is there; the shim holds the ADD; if Multus took over
      # 60 s to come back the shim's own error may show) and the probe Ready throughout: at
      # most one poll (3 s on the loaded machine) not seen Ready, where a failed probe keeps the
      # pod NotReady a whole probe period (10 s). One exception, which is Multus's and not the
      # guard's: Multus writes 00-multus.conf in place (os.WriteFile: truncate, then write), so
      # a SIGKILL between the two leaves it empty until the next daemon writes it again (20 s
      # seen in a run). The guard then refuses, and its probe fails, for that reason and no other
      # (guard_refused_why, guard_notready_why: the reasons seen in its log and kubelet's).
      notready=$(num "$line" guard_notready_s)
      refused_why=$(field "$line" guard_refused_why) notready_why=$(field "$line" guard_notready_why)
      allowed() { [ "$1" = - ] || [ "$1" = delegate_is_not_valid_JSON ]; }
      if ! allowed "$refused_why" || ! allowed "$notready_why" ||
         { [ "$notready" -gt 3 ] && [ "$notready_why" = - ]; } ||
         { [ "$refused_why" = - ] && grep -q 'cni-guard: network not ready' <<<"$line"; }; then
        echo "35-kubernetes: FAIL: without sockets the guard refused or turned NotReady: $line" >&2
        exit 1
      fi
      [ "$notready_why" = - ] && [ "$refused_why" = - ] ||
        echo "35-kubernetes: the guard refused or was NotReady while Multus's SIGKILL left 00-multus.conf empty (${notready}s; Multus's in-place write)" ;;
    guard-socket)
      # Refused at once, naming the socket (dead, or gone while Multus restarts its socket
      # folder): the first event within 15 s of the pod (1 s
      # measured; the margin is the loaded machine's), inside the 20 s Multus is dead and far
      # from the 60 s multus-shim would hold the ADD; the probe NotReady (seen so, not a failed
      # poll).
      # (The socket named in the first event, or, where a SIGKILL left 00-multus.conf empty
      # before the pod's first ADD (see above) and that refusal came first, in a later one.)
      first=$(num "$line" first_event_s)
      notready=$(num "$line" guard_notready_s)
      unknown=$(num "$line" guard_unknown_s)
      if ! python3 -c 'import sys; sys.exit(not float(sys.argv[1]) < 15)' "$first" ||
         ! grep -Eq 'socket .* (does not accept connections|does not exist)|guard_refused_why=([^ ]*,)?socket_does_not_(accept_connections|exist)' <<<"$line" ||
         [ $((notready - unknown)) -le 0 ]; then
        echo "35-kubernetes: FAIL: with sockets the guard did not refuse at once naming the socket, or stayed Ready: $line" >&2
        exit 1
      fi ;;
  esac
  stage_done "crash.sh $mode"
done
unset CLUSTER_GUARD_WAIT

# Recovery by default (issue 18): a pod created while Multus restarts, from 00-multus.conf back to
# the pod Ready, with the guard refusing at once (0) and with the manifest's wait (60, inotify).
recovery=()
for w in 0 60; do
  line=$(conformance/k8s/recovery.sh "$w" 3)
  echo "$line"
  recovery+=("$line")
  stage_done "recovery.sh $w 3"
done
median60=$(num "${recovery[1]}" median_ms)
median0=$(num "${recovery[0]}" median_ms)
if [ "$median60" -gt 1500 ] || [ "$median60" -ge "$median0" ]; then
  echo "35-kubernetes: FAIL: with the default wait the pod should run within 1.5 s of Multus (median ${median60} ms, ${median0} ms without): ${recovery[*]}" >&2
  exit 1
fi

# Per-pod awareness (issue 18): plain pods start on the primary during the outage, pods that
# need Multus are refused and get their networks when it is back, nothing leaks.
line=$(conformance/k8s/perpod.sh 3)
echo "$line"
[ "$(field "$line" plain_started_during_outage)" = 3/3 ] && [ "$(num "$line" networked_bare)" = 0 ] &&
  [ "$(num "$line" leaked)" = 0 ] || { echo "35-kubernetes: FAIL: per-pod: $line" >&2; exit 1; }
printf '%s\n' "${recovery[@]}" "$line" >"${CNI_GUARD_K8S_AVAILABILITY:-/tmp/cni-guard-availability-summary.txt}"
stage_done "perpod.sh 3"

# What else a node goes through, with the guard at the manifest's wait (issue 21): containerd
# restarted while the guard holds an ADD, a reboot that does not stop the pods first (/run wiped;
# the old sandboxes torn down through their records after the boot, while Multus is not up yet;
# reboot.sh below reboots as Talos does, its pods stopped through the CRI first), a Multus outage
# past the guard's and multus-shim's 60 s. Each script fails when its evidence is missing (no ADD
# held, no DEL that waited for Multus, no refusal after the full wait) or anything is left
# (leaks.py).
for scenario in containerd-restart reboot long-outage; do
  line=$(conformance/k8s/node-events.sh "$scenario")
  echo "$line"
  [ "$(num "$line" bare)" = 0 ] && [ "$(num "$line" stale)" = 0 ] ||
    { echo "35-kubernetes: FAIL: $scenario: $line" >&2; exit 1; }
  stage_done "node-events.sh $scenario"
done

# The incident under churn (conformance/k8s/churn.sh): one incident-summary line per layout and
# guard, each run bringing the node up in its layout when it is in another (about 80 s a run).
# churn.sh itself fails a run in which a Multus restart opened no window (00-multus.conf still
# there after 12 s). What each line must show:
#   original off   the incident: bare > 0
#   seed-fix off   the seed's fix alone: bare = 0, and what it costs, seen by the detectors that
#                  must stay at 0 with the guard: teardown_failures > 0 and the node NotReady
#                  (notready_s - unknown_s > 0: reported by the node, not a failed poll)
#   seed-fix perpod  as "on", and the plain pods (no Multus network) created in a window start
#                  at once: plain_delay_s <= 5 and under half the window
#   both on        the window reached pods: refused + held > 0 (the guard's own log; with the
#                  manifest's wait a pod is held, not refused); bare = 0,
#                  teardown_failures = 0, failed_sandboxes = 0, the node never NotReady (at most
#                  $NOTREADY_MARGIN s not seen True: one poll on a loaded machine, where a real
#                  NotReady lasts a kubelet status period, 38 s in the seed-fix off run), and every
#                  pod Running with net1 after the last restart (recovery_s a number, not "never")
# CNI_GUARD_K8S_CHURN=0 leaves them out (a quick local run); CI always runs them.
NOTREADY_MARGIN=3
churn_summaries=()
churn_run() { # LAYOUT GUARD
  local run="$1 $2" line pods full bare td nr rec refused fs unk held in_w delay window went allowed
  line=$(conformance/k8s/churn.sh "$1" "$2")
  echo "$line"
  churn_summaries+=("$line")
  pods=$(num "$line" pods)
  full=$(num "$line" full)
  bare=$(num "$line" bare)
  td=$(num "$line" teardown_failures)
  nr=$(num "$line" notready_s)
  rec=$(field "$line" recovery_s)
  refused=$(num "$line" refused)
  fs=$(num "$line" failed_sandboxes)
  unk=$(num "$line" unknown_s)
  if [ "$pods" -eq 0 ] || [ "$full" -eq 0 ]; then echo "35-kubernetes: FAIL: $run: no pod came up full" >&2; exit 1; fi
  case "$run" in
    "original off")
      [ "$bare" -gt 0 ] || { echo "35-kubernetes: FAIL: original off: the incident did not happen (bare=0)" >&2; exit 1; } ;;
    "seed-fix off")
      [ "$bare" -eq 0 ] || { echo "35-kubernetes: FAIL: seed-fix off: bare=$bare" >&2; exit 1; }
      # The detectors detect: this is the run where they must see something.
      if [ "$td" -eq 0 ] || [ $((nr - unk)) -le 0 ]; then
        echo "35-kubernetes: FAIL: seed-fix off: the detectors saw nothing (want teardown_failures > 0 and notready_s - unknown_s > 0): $line" >&2
        exit 1
      fi ;;
    *)
      # With the manifest's wait (60 s) a pod in a window is held until Multus is back, not
      # refused; either way the guard's log shows that the window reached it.
      held=$(num "$line" held)
      if [ $((refused + held)) -eq 0 ]; then
        echo "35-kubernetes: FAIL: $run: the guard neither refused nor held an ADD: the window reached no pod, nothing was shown: $line" >&2
        exit 1
      fi
      # With per-pod awareness a DEL whose delegate went away while it ran (Multus SIGTERMed
      # with the DEL inside it) is answered 11 at once and retried by kubelet, not waited for:
      # those teardowns fail once, each one a refusal of the guard's own.
      went=$(num "$line" went_away)
      allowed=0
      [ "$run" != "seed-fix perpod" ] || allowed=$went
      if [ "$bare" -ne 0 ] || [ "$td" -gt "$allowed" ] || [ "$fs" -gt "$allowed" ] || [ "$nr" -gt "$NOTREADY_MARGIN" ] || [ "$rec" = never ]; then
        echo "35-kubernetes: FAIL: $run: want bare=0 teardown_failures=0 failed_sandboxes=0 (with per-pod awareness at most went_away) notready_s<=$NOTREADY_MARGIN and a recovery: $line" >&2
        exit 1
      fi ;;
  esac
  if [ "$run" = "seed-fix perpod" ]; then
    # Per-pod awareness in the churn: the plain pods created in a window start at once on
    # the primary (well inside the window), the networked ones as with the guard on.
    in_w=$(num "$line" plain_in_windows)
    delay=$(num "$line" plain_delay_s)
    window=$(num "$line" window_s)
    if [ "$in_w" -eq 0 ] || ! python3 -c 'import sys; d, w = map(float, sys.argv[1:]); sys.exit(not (d <= 5 and d < w / 2))' "$delay" "$window"; then
      echo "35-kubernetes: FAIL: $run: plain pods created in a window should start at once (want plain_in_windows > 0, plain_delay_s <= 5 and < window_s / 2): $line" >&2
      exit 1
    fi
  fi
  stage_done "churn.sh $run"
}

# Node reboots, side by side (conformance/k8s/reboot.sh, issue 28), each run on the node the
# churn of its layout left up: one reboot-summary line each, judged by lib.sh's reboot_check
# (original off: bare > 0, the incident made by the reboot; seed-fix off: bare 0 and the node
# NotReady; guard on: bare 0, no stuck teardown, the guard reached). With /etc/cni a tmpfs (Talos
# 1.14 and later) in the original layout, the guard's install container is held back
# (REBOOT_GUARD_DELAY) until after the primary's file is written: the first file wins, and that
# line must show the incident with the guard installed (first_conf 05-cilium.conflist, bare > 0).
# In the seed's layout the guard's file comes first as it does on its own, and every pod is full.
# CNI_GUARD_K8S_REBOOT=0 leaves them out; CI always runs them.
reboot_summaries=()
reboot_run() { # LAYOUT GUARD ETC_CNI [GUARD_DELAY]
  local line
  [ "${CNI_GUARD_K8S_REBOOT:-1}" = 1 ] || [ "${CI:-}" = true ] || return 0
  line=$(REBOOT_GUARD_DELAY=${4:-0} conformance/k8s/reboot.sh "$1" "$2" "$3")
  echo "$line"
  reboot_summaries+=("$line")
  if [ "${4:-0}" != 0 ] && [ "$(field "$line" first_conf)" != 05-cilium.conflist ]; then
    echo "35-kubernetes: FAIL: the guard held back ${4} s, yet the primary's file was not the first at boot: the race was not set up: $line" >&2
    exit 1
  fi
  stage_done "reboot.sh $*"
}

# A DEL inside Multus's daemon when the daemon is SIGTERMed (conformance/k8s/del-during-shutdown.sh):
# multus-shim answers success for a DEL its daemon never finished. Without the guard the net1
# leases leak (leaked > 0); with it every such DEL is run again once Multus is back (retried >=
# dels) and nothing leaks.
del_summaries=()
del_shutdown_run() { # GUARD
  local line dels leaked retried
  line=$(conformance/k8s/del-during-shutdown.sh "$1")
  echo "$line"
  del_summaries+=("$line")
  dels=$(num "$line" dels)
  leaked=$(num "$line" leaked)
  retried=$(num "$line" retried)
  [ "$dels" -gt 0 ] || { echo "35-kubernetes: FAIL: del-during-shutdown $1: no DEL was inside the daemon: $line" >&2; exit 1; }
  case "$1" in
    on) if [ "$leaked" -ne 0 ] || [ "$retried" -lt "$dels" ]; then
          echo "35-kubernetes: FAIL: del-during-shutdown on: want leaked=0 and every DEL run again (retried >= dels): $line" >&2
          exit 1
        fi ;;
    off) [ "$leaked" -gt 0 ] ||
          { echo "35-kubernetes: FAIL: del-during-shutdown off: the cut-off DELs leaked nothing (want leaked > 0): the reproduction reproduced nothing: $line" >&2; exit 1; } ;;
  esac
  stage_done "del-during-shutdown.sh $1"
}

# The seed's layout first, on the node the scenarios above leave (the guard at the manifest's
# wait), then per-pod awareness and no guard on that same node (node_in_layout changes the guard
# as an operator would); then the layout before the fix.
del_shutdown_run on
if [ "${CNI_GUARD_K8S_CHURN:-1}" = 1 ] || [ "${CI:-}" = true ]; then churn_run seed-fix on; fi
reboot_run seed-fix on disk
reboot_run seed-fix on tmpfs
if [ "${CNI_GUARD_K8S_CHURN:-1}" = 1 ] || [ "${CI:-}" = true ]; then churn_run seed-fix perpod; fi
if [ "${CNI_GUARD_K8S_CHURN:-1}" = 1 ] || [ "${CI:-}" = true ]; then churn_run seed-fix off; fi
del_shutdown_run off
printf '%s\n' "${del_summaries[@]}" >"${CNI_GUARD_K8S_DEL_SUMMARY:-/tmp/cni-guard-del-during-shutdown-summary.txt}"
reboot_run seed-fix off disk
scripts/cluster.sh down
echo "35-kubernetes: the seed's layout passed in $((SECONDS - start))s"

# The same incident without the guard, in the layout the seed fixed: the pod comes up without net1.
CLUSTER_LAYOUT=before-fix scripts/cluster.sh up
conformance/k8s/incident.sh
stage_done "up (the layout before the fix), incident.sh without the guard"

if [ "${CNI_GUARD_K8S_CHURN:-1}" = 1 ] || [ "${CI:-}" = true ]; then churn_run original off; fi
reboot_run original off disk
# The guard in that layout with Multus's auto-config left alone: refused naming the election.
conformance/k8s/autoconfig.sh
stage_done "autoconfig.sh"
if [ "${CNI_GUARD_K8S_CHURN:-1}" = 1 ] || [ "${CI:-}" = true ]; then churn_run original on; fi
reboot_run original on disk
reboot_run original on tmpfs 20
[ ${#churn_summaries[@]} -eq 0 ] ||
  printf '%s\n' "${churn_summaries[@]}" >"${CNI_GUARD_K8S_SUMMARY:-/tmp/cni-guard-incident-summary.txt}"
[ ${#reboot_summaries[@]} -eq 0 ] ||
  printf '%s\n' "${reboot_summaries[@]}" >"${CNI_GUARD_K8S_REBOOT_SUMMARY:-/tmp/cni-guard-reboot-summary.txt}"
echo "35-kubernetes: passed in $((SECONDS - start))s"
