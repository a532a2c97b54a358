#!/usr/bin/env bash
# A crashed Multus on the real node of scripts/cluster.sh (issue 12): the daemon is SIGKILLed, so
# 00-multus.conf stays and its socket is dead. multus-shim then polls the socket for up to 60 s
# before it fails (pkg/server/api: WaitUntilAPIReady), holding the sandbox's ADD that long.
#
#   conformance/k8s/crash.sh MODE      MODE: no-guard | guard | guard-socket
#
#   no-guard      the guard's DaemonSet removed: containerd runs 00-multus.conf itself
#   guard         deploy/multus-cilium as it is
#   guard-socket  the same with `--socket <node>/run/multus/multus.sock` (config key `sockets`)
#                 on install and keep, and the folder above the socket's mounted read-only for the
#                 readiness probe, with HostToContainer propagation, as the chart mounts it. That
#                 folder holds the pods' network namespaces (containerd's state dir): two pods
#                 made before keep starts are deleted after, and none of their namespaces may stay
#                 mounted in keep's mount namespace (it would keep them alive, with their
#                 interfaces and addresses), or the run fails
#
# The daemon is killed with SIGKILL every 0.2 s for $CRASH_DEAD_S s (a crash-looping Multus:
# kubelet restarts the container, it is killed again); 1 s in, a pod asking for net1 is created.
# Prints one line:
#   crash-summary mode=M dead_s=D multus_back_s=B first_event_s=E pod_ready_s=R net1=yes guard_notready_s=N guard_ready_s=G guard_unknown_s=U event="..."
#     multus_back_s  from the pod's creation to the daemon's socket accepting again, once the
#                    killing stopped (kubelet's back-off decides when it restarts)
#     first_event_s  from the pod's creation to its first FailedCreatePodSandBox event ("-": none)
#     pod_ready_s    from the pod's creation to Ready
#     guard_notready_s  seconds the guard's pod was not seen Ready ("-" without the guard; a
#                    failed poll counts: unknown is not Ready)
#     guard_unknown_s   the part of guard_notready_s that follows failed polls
#     guard_ready_s  from the pod's creation to the guard's pod Ready again (after the pod)
# Leaves the cluster as scripts/cluster.sh up made it (guard deployed, no socket).
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=scripts/versions.sh
. scripts/versions.sh
# shellcheck source=conformance/k8s/lib.sh
. conformance/k8s/lib.sh

MODE=${1:-}
case "$MODE" in no-guard | guard | guard-socket) ;; *) echo "usage: $0 no-guard|guard|guard-socket" >&2; exit 2 ;; esac
DEAD_S=${CRASH_DEAD_S:-20}
CLUSTER_DIR=${CNI_GUARD_CLUSTER_DIR:-/var/lib/cni-guard-cluster}
NODE=$CLUSTER_DIR/node
export KUBECONFIG=$CLUSTER_DIR/admin.kubeconfig
K=$KUBERNETES_BIN/kubectl
SOCK=$NODE/run/multus/multus.sock
RUN=$(dirname "$(dirname "$SOCK")") # the folder above the socket's
POD=crash
SEL='app.kubernetes.io/name=cni-guard'

fail() { echo "k8s crash: FAIL: $*" >&2; exit 1; }
say() { echo "k8s crash: $*" >&2; }
now() { date +%s.%N; }
since() { python3 -c 'import sys; print(f"{float(sys.argv[2]) - float(sys.argv[1]):.1f}")' "$1" "$2"; }
accepts() { python3 -c 'import socket,sys; s=socket.socket(socket.AF_UNIX); s.settimeout(0.5); s.connect(sys.argv[1])' "$1" 2>/dev/null; }

# The multus-daemon processes of this node (not of any other cluster on the machine).
daemon_pids() {
  local p
  for p in $(pgrep -x multus-daemon || true); do
    grep -q cni-guard-k8s "/proc/$p/cgroup" 2>/dev/null && echo "$p"
  done
}

# why_slugs: each line of stdin (a reason the guard gave: "delegate /x/00-multus.conf is not valid
# JSON (perhaps ...": ...") as a word without its paths and details ("delegate_is_not_valid_JSON"),
# each once, joined by commas; "-" for none.
why_slugs() {
  python3 -c '
import re, sys
seen = []
for line in sys.stdin:
    words = [w for w in line.split() if not w.startswith("/")]
    text = re.split(r"[(:]", " ".join(words))[0].strip()
    slug = re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_")
    if slug and slug not in seen:
        seen.append(slug)
print(",".join(seen) or "-")'
}

guard_ready() {
  "$K" -n cni-guard wait --for=condition=Ready pod -l "$SEL" --timeout=120s >/dev/null
}

apply_mode() {
  case "$1" in
    no-guard)
      scripts/cluster.sh manifest guard | "$K" delete -f - --wait=true --timeout=120s >/dev/null || return 1
      # Its pod gone too (keep would put the file back), the namespace's deletion waits for it.
      "$K" -n cni-guard wait --for=delete pod -l "$SEL" --timeout=60s >/dev/null 2>&1 || true
      # Nothing deletes the guard's conflist on shutdown: take it out as the uninstall would.
      rm -f "$NODE/etc/cni/net.d/00-cni-guard.conflist"
      ;;
    guard)
      # Each step `|| return 1`: cleanup calls this in an || list, where set -e does not apply.
      # The guard-socket mode's patched mount is no part of the manifest: apply would keep it.
      if "$K" -n cni-guard get daemonset cni-guard -o jsonpath='{.spec.template.spec.volumes[*].name}' 2>/dev/null |
        grep -qw multus-run; then
        "$K" -n cni-guard delete daemonset cni-guard --wait=true --timeout=120s >/dev/null || return 1
      fi
      scripts/cluster.sh manifest guard | "$K" apply -f - >/dev/null || return 1
      "$K" -n cni-guard rollout status daemonset/cni-guard --timeout=120s >/dev/null || return 1
      guard_ready
      ;;
    guard-socket)
      scripts/cluster.sh manifest guard | python3 -c '
import sys
sock, dir = sys.argv[1], sys.argv[2]
out = []
for line in sys.stdin.read().split("\n"):
    out.append(line)
    s = line.strip()
    # after each --delegate=... argument (install and keep): the socket
    if s.startswith("- --delegate="):
        out.append(line.split("-")[0] + "- --socket=" + sock)
print("\n".join(out))
' "$SOCK" "$(dirname "$SOCK")" | "$K" apply -f - >/dev/null
      # The probe connects to the socket under /host: mount the folder above the socket's
      # (Multus removes and remakes its socket folder at every start, which would leave a mount
      # of that folder itself on the old, deleted one), read-only (connect(2) is allowed there).
      "$K" -n cni-guard patch daemonset cni-guard --type=json -p "[
        {\"op\":\"add\",\"path\":\"/spec/template/spec/volumes/-\",\"value\":{\"name\":\"multus-run\",\"hostPath\":{\"path\":\"$RUN\"}}},
        {\"op\":\"add\",\"path\":\"/spec/template/spec/containers/0/volumeMounts/-\",\"value\":{\"name\":\"multus-run\",\"mountPath\":\"/host$RUN\",\"readOnly\":true,\"mountPropagation\":\"HostToContainer\"}}]" >/dev/null
      "$K" -n cni-guard rollout status daemonset/cni-guard --timeout=120s >/dev/null
      guard_ready
      grep -q '"sockets"' "$NODE/etc/cni/net.d/00-cni-guard.conflist" || fail "the guard's conflist names no socket"
      ;;
  esac
}

cleanup() {
  local rc=$?
  [ -z "${KILLER:-}" ] || kill "$KILLER" 2>/dev/null || true
  [ -z "${WATCH:-}" ] || kill "$WATCH" 2>/dev/null || true
  "$K" delete pod "$POD" --ignore-not-found --wait=true --timeout=60s >/dev/null 2>&1 || true
  apply_mode guard || rc=1
  rm -rf "${W:-}"
  exit "$rc"
}
W=$(mktemp -d /tmp/cni-guard-crash.XXXXXX)
trap cleanup EXIT

if [ "$MODE" = guard-socket ]; then
  # Pods whose network namespaces are mounted under the node's run folder when keep starts.
  for p in netns-1 netns-2; do
    sed "s/name: with-net1/name: $p/" <(scripts/cluster.sh manifest pod-net1.yaml) | "$K" apply -f - >/dev/null
  done
  "$K" wait --for=condition=Ready --timeout=120s pod/netns-1 pod/netns-2 >/dev/null || fail "the netns pods did not come up"
fi
apply_mode "$MODE"
if [ "$MODE" = guard-socket ]; then
  keep=$(pgrep -f "cni-guard-agent keep" | head -n 1)
  grep -q cni-guard-k8s "/proc/$keep/cgroup" || fail "keep ($keep) is not the node's"
  before=$(awk '$9 == "nsfs"' "/proc/$keep/mountinfo" | wc -l)
  [ "$before" -ge 2 ] || fail "keep's mount namespace holds $before network namespaces: the pods' were not mounted under $RUN when it started"
  "$K" delete pod netns-1 netns-2 --wait=true --timeout=90s >/dev/null
  for _ in $(seq 20); do
    left=$(awk '$9 == "nsfs" { print $5 }' "/proc/$keep/mountinfo")
    [ -z "$left" ] && break
    sleep 0.5
  done
  [ -z "$left" ] || fail "network namespaces of deleted pods stay mounted in keep: $left"
  say "mode=$MODE: keep's mount held $before pod network namespaces; none left once the pods were deleted"
fi
# A fresh Multus pod: kubelet's restart back-off (10 s, doubled at each crash, up to 5 min) is
# kept per pod, and each run starts from none.
"$K" -n kube-system delete pod -l app=multus --wait=true --timeout=60s >/dev/null
"$K" -n kube-system rollout status daemonset/kube-multus-ds --timeout=120s >/dev/null
for _ in $(seq 60); do [ -s "$NODE/etc/cni/net.d/00-multus.conf" ] && accepts "$SOCK" && break; sleep 0.5; done
[ "$MODE" = no-guard ] || guard_ready
accepts "$SOCK" || fail "Multus's socket $SOCK does not accept connections before the crash"
[ -n "$(daemon_pids)" ] || fail "no multus-daemon process of the node"

# The guard's readiness (lib.sh's poller).
if [ "$MODE" != no-guard ]; then
  poll_status "$W/guard-polls" "$K" -n cni-guard get pod -l "$SEL" -o jsonpath='{.items[0].status.conditions[?(@.type=="Ready")].status}'
  WATCH=$!
fi

# The crash: SIGKILL, again and again, for DEAD_S seconds.
t_kill=$(now)
syslog_mark=$(stat -c %s "$CLUSTER_DIR/logs/guard-syslog.log")
kubelet_mark=$(stat -c %s "$CLUSTER_DIR/logs/kubelet.log")
(
  end=$((SECONDS + DEAD_S))
  while ((SECONDS < end)) && kill -0 $$ 2>/dev/null; do
    for p in $(daemon_pids); do kill -KILL "$p" 2>/dev/null || true; done
    sleep 0.2
  done
) >/dev/null 9>&- &
KILLER=$!
sleep 1
[ -e "$NODE/etc/cni/net.d/00-multus.conf" ] || fail "00-multus.conf went with a SIGKILL"
# kubelet restarts the container at once the first time: the socket is dead most of the time.
dead=
for _ in $(seq 20); do accepts "$SOCK" || { dead=1; break; }; sleep 0.1; done
[ -n "$dead" ] || fail "Multus's socket kept accepting connections under SIGKILL"
say "mode=$MODE: multus-daemon SIGKILLed; 00-multus.conf stays, its socket is dead"

sed "s/name: with-net1/name: $POD/" <(scripts/cluster.sh manifest pod-net1.yaml) | "$K" apply -f - >/dev/null
t_pod=$(now)
uid=$("$K" get pod "$POD" -o jsonpath='{.metadata.uid}')
first_event=- event='' back=-
ready=
while [ -z "$ready" ]; do
  if [ "$first_event" = - ]; then
    m=$("$K" get events --field-selector "involvedObject.uid=$uid,reason=FailedCreatePodSandBox" \
      -o jsonpath='{.items[0].message}' 2>/dev/null || true)
    if [ -n "$m" ]; then first_event=$(since "$t_pod" "$(now)"); event=$m; fi
  fi
  if [ "$back" = - ] && ! kill -0 "$KILLER" 2>/dev/null && accepts "$SOCK"; then
    back=$(since "$t_pod" "$(now)")
  fi
  if [ "$("$K" get pod "$POD" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]; then
    ready=$(since "$t_pod" "$(now)")
  fi
  python3 -c 'import sys; sys.exit(float(sys.argv[2]) - float(sys.argv[1]) < 240)' "$t_pod" "$(now)" &&
    fail "pod $POD not Ready 240 s after it was made"
  sleep 0.5
done
wait "$KILLER" 2>/dev/null || true
KILLER=
net1=no
"$K" exec "$POD" -- ip -o addr | grep -q ' net1 .*inet ' && net1=yes
[ "$net1" = yes ] || fail "pod $POD came up without net1 after the crash"
notready=- again=- unknown=-
if [ -n "${WATCH:-}" ]; then
  kill "$WATCH" 2>/dev/null || true
  WATCH=
  [ -s "$W/guard-polls" ] || fail "the guard's pod was never polled"
  notready=$(seconds_not_true "$W/guard-polls")
  unknown=$(seconds_unknown "$W/guard-polls")
  # The probe must see the new daemon's socket too.
  "$K" -n cni-guard wait --for=condition=Ready pod -l "$SEL" --timeout=60s >/dev/null ||
    fail "the guard's pod is not Ready 60 s after $POD was"
  again=$(since "$t_pod" "$(now)")
fi
# Why: the guard's refusals in its log, and the checks its readiness probe failed in kubelet's.
refused_why=$(tail -c +"$((syslog_mark + 1))" "$CLUSTER_DIR/logs/guard-syslog.log" |
  sed -n 's/.*verb=ADD .*decision=refused code=11 msg="cni-guard: network not ready: \([^"]*\)".*/\1/p' | why_slugs)
notready_why=$(tail -c +"$((kubelet_mark + 1))" "$CLUSTER_DIR/logs/kubelet.log" | sed -n 's/^[[:space:]]*✗ //p' | why_slugs)
say "dead for ${DEAD_S}s from $(date -d "@${t_kill%.*}" +%T)"
event=${event#*plugin type=}
echo "crash-summary mode=$MODE dead_s=$DEAD_S multus_back_s=$back first_event_s=$first_event pod_ready_s=$ready net1=$net1 guard_notready_s=$notready guard_ready_s=$again guard_unknown_s=$unknown guard_refused_why=$refused_why guard_notready_why=$notready_why event=\"${event:0:300}\""
