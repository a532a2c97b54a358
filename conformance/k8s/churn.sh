#!/usr/bin/env bash
# The seed's incident under churn, on the real node of scripts/cluster.sh (issue 12):
#
#   conformance/k8s/churn.sh LAYOUT GUARD     LAYOUT original|seed-fix, GUARD on|off|perpod
#
#   original   00-multus.conf and 05-cilium.conflist both in the conf dir containerd reads
#              (CLUSTER_LAYOUT=before-fix: the layout before the seed's fix)
#   seed-fix   05-cilium.conflist in etc/cni/multus/net.d, Multus's autoconfig dir (the default)
#   GUARD on   deploy/multus-cilium in front (in `original` its attachment is the conf dir's
#              05-cilium.conflist); off: no guard; perpod: the guard with per-pod awareness
#              (--per-pod-primary, seed-fix only), and beside the churn's Deployment a second
#              one of pods asking for no Multus network (`plain`), scaled up in every window
#
# Brings the node up in that layout (down first if it runs in another one), then: a Deployment
# whose pods ask for net1 (k8s.v1.cni.cncf.io/networks: macvlan-net1) is scaled up and down and
# has pods deleted while the Multus DaemonSet pod is deleted $CHURN_RESTARTS times (SIGTERM: the
# daemon removes 00-multus.conf). Every pod seen Running is classified once: full (network-status
# and `ip addr` inside both show eth0 and net1) or bare (Running without net1). Prints
#
#   incident-summary kubernetes=.. containerd=.. multus=.. primary=.. layout=.. guard=.. pods=N full=F
#     bare=B teardown_failures=T notready_s=X recovery_s=Y refused=R failed_sandboxes=S
#     unknown_s=U held=H went_away=W
#
#   teardown_failures  churn pod deletions whose sandbox teardown failed at least once: the
#                      deleted pods' sandbox ids (crictl, just before the deletion) in kubelet's
#                      "failed to destroy network for sandbox" lines during the run
#   notready_s         seconds the node's Ready condition was not seen True (polled each second;
#                      a poll whose kubectl call failed counts too: unknown is not Ready)
#   unknown_s          the part of notready_s that follows failed polls (so notready_s -
#                      unknown_s is what the node itself reported)
#   recovery_s         from Multus back (the last restart) to every pod Running with net1;
#                      "never" when that did not happen within $CHURN_RECOVERY_TIMEOUT s, or
#                      when every pod runs and some are bare (a bare pod stays bare: only
#                      replacing it helps; the run does not wait that bound out then)
#   refused            the guard's own refusals in the run: its log lines (logs/guard-syslog.log,
#                      see scripts/cluster.sh) "verb=ADD ... decision=refused code=11"
#   held               the ADDs the guard held until Multus was back and then ran (its log
#                      lines "verb=ADD ... waited=...ms" that are not refusals): with the
#                      manifest's wait (60 s) the window reaches pods as held ADDs, not refusals
#   failed_sandboxes   every sandbox whose network teardown failed at least once in the run
#                      (kubelet's "failed to destroy network for sandbox" lines), pods that never
#                      started included
#   went_away          the guard's DELs answered 11 because their delegate went away while they
#                      ran (Multus SIGTERMed with the DEL inside it) and it did not wait for it
#                      (per-pod awareness does not wait there), for kubelet's retry
#
# Every Multus restart must open a window: a 00-multus.conf still there 12 s after the pod's
# deletion fails the run (no window, nothing measured).
#
# With GUARD perpod the line adds
#
#     plain=P plain_in_windows=N plain_delay_s=D window_s=G
#
#   plain_in_windows   plain pods created while 00-multus.conf was gone
#   plain_delay_s      their median time from creation to Ready (whole seconds, the API's), against
#   window_s           the median time 00-multus.conf was gone per restart
#
# Leaves the cluster up (scripts/cluster.sh down removes it); removes its Deployments.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=scripts/versions.sh
. scripts/versions.sh
# shellcheck source=conformance/k8s/lib.sh
. conformance/k8s/lib.sh

LAYOUT=${1:-}
GUARD=${2:-}
case "$LAYOUT $GUARD" in
  original\ on | original\ off | original\ perpod | seed-fix\ on | seed-fix\ off | seed-fix\ perpod) ;;
  *) echo "usage: $0 original|seed-fix on|off|perpod" >&2; exit 2 ;;
esac
PERPOD_PRIMARY=/etc/cni/multus/net.d/05-cilium.conflist
PERPOD=
if [ "$GUARD" = perpod ]; then
  [ "$LAYOUT" = seed-fix ] || { echo "$0: perpod needs the seed-fix layout (Multus's clusterNetwork file in its own folder)" >&2; exit 2; }
  PERPOD=1
  export CLUSTER_GUARD_ARGS="--per-pod-primary=$PERPOD_PRIMARY"
fi
RESTARTS=${CHURN_RESTARTS:-3}
PODS_MAX=${CHURN_PODS:-20}
PODS_LOW=$((PODS_MAX * 3 / 5))
RECOVERY_TIMEOUT=${CHURN_RECOVERY_TIMEOUT:-90}

CLUSTER_DIR=${CNI_GUARD_CLUSTER_DIR:-/var/lib/cni-guard-cluster}
NODE=$CLUSTER_DIR/node
export KUBECONFIG=$CLUSTER_DIR/admin.kubeconfig
K=$KUBERNETES_BIN/kubectl
NODE_NAME=cni-guard-node
CONF=$NODE/etc/cni/net.d/00-multus.conf
crictl() { # its own config (without one crictl warns on every call)
  "$CRICTL_BIN/crictl" --config "$W/crictl.yaml" "$@"
}

say() { echo "k8s churn: $*" >&2; }
fail() { echo "k8s churn: FAIL: $*" >&2; exit 1; }

# --- the node in the asked layout ----------------------------------------------------------------
t_up=$SECONDS
node_in_layout "$LAYOUT" "$GUARD"
say "node up in layout=$LAYOUT guard=$GUARD ($((SECONDS - t_up))s)"

W=$(mktemp -d /tmp/cni-guard-churn.XXXXXX)
printf 'runtime-endpoint: unix://%s\ntimeout: 20\n' "$NODE/run/containerd/containerd.sock" >"$W/crictl.yaml"
BG=()
cleanup() {
  local p
  for p in "${BG[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  "$K" -n kube-system patch daemonset kube-multus-ds --type=json \
    -p '[{"op":"remove","path":"/spec/template/spec/nodeSelector"}]' >/dev/null 2>&1 || true
  "$K" delete deployment churn churn-plain --ignore-not-found --wait=false >/dev/null 2>&1 || true
  "$K" delete pod -l 'app in (churn, churn-plain)' --ignore-not-found --wait=true --timeout=90s >/dev/null 2>&1 || true
  rm -rf "$W"
}
trap cleanup EXIT

multus_ready() {
  [ -s "$CONF" ] &&
    [ "$("$K" -n kube-system get pod -l app=multus -o jsonpath='{range .items[*]}{.metadata.deletionTimestamp}{"|"}{.status.containerStatuses[0].ready}{"\n"}{end}' 2>/dev/null)" = "|true" ]
}
# A Multus restart on this node is quick (its image is local, its API server next door): about
# 1-2 s from the old daemon removing 00-multus.conf to the new one writing it. In production it
# takes longer (the image pulled again after a reboot, the init container, the informer's first
# list), and the window is what the incident lives in: an init container that sleeps
# $CHURN_MULTUS_DELAY s (default 8) stands in for that.
MULTUS_DELAY=${CHURN_MULTUS_DELAY:-8}
start_delay kube-system kube-multus-ds "$MULTUS_DELAY"
if [ "$GUARD" = on ]; then
  "$K" -n cni-guard wait --for=condition=Ready pod -l app.kubernetes.io/name=cni-guard --timeout=120s >/dev/null ||
    fail "the guard is not Ready"
fi

k8s_version=$("$K" version -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["serverVersion"]["gitVersion"])')
ctrd_version=$("$K" get node "$NODE_NAME" -o jsonpath='{.status.nodeInfo.containerRuntimeVersion}')
ctrd_version=${ctrd_version#containerd://}
multus_image=$("$K" -n kube-system get daemonset kube-multus-ds -o jsonpath='{.spec.template.spec.containers[0].image}')
multus_version=${multus_image##*:}

# --- observers -----------------------------------------------------------------------------------
# The node's Ready condition (lib.sh's poller). The observers below stop with this script too
# (kill -0 $$) and hold neither the caller's lock (fd 9) nor its stdout.
poll_status "$W/ready-polls" "$K" get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}'
BG+=($!)

# classify: every churn pod Running (and not being deleted) gets one verdict, full or bare.
classify() {
  local name ts phase st addrs
  while IFS='|' read -r name ts phase; do
    [ -n "$name" ] && [ -z "$ts" ] && [ "$phase" = Running ] || continue
    grep -q "^$name " "$W/class" 2>/dev/null && continue
    addrs=$("$K" exec "$name" -- ip -o addr 2>/dev/null) || continue
    # No annotation is a verdict (a pod built without Multus has none); a failed call is not.
    st=$("$K" get pod "$name" -o jsonpath='{.metadata.annotations.k8s\.v1\.cni\.cncf\.io/network-status}' 2>/dev/null) || continue
    if grep -q ' net1 .*inet ' <<<"$addrs" && grep -q ' eth0 .*inet ' <<<"$addrs" &&
       python3 -c 'import json,sys; s={i.get("interface") for i in json.loads(sys.argv[1])}; sys.exit(not {"eth0","net1"} <= s)' "$st" 2>/dev/null; then
      echo "$name full" >>"$W/class"
    else
      echo "$name bare" >>"$W/class"
    fi
  done < <("$K" get pod -l app=churn -o jsonpath='{range .items[*]}{.metadata.name}{"|"}{.metadata.deletionTimestamp}{"|"}{.status.phase}{"\n"}{end}' 2>/dev/null)
}
(while kill -0 $$ 2>/dev/null; do classify; sleep 1; done) >/dev/null 9>&- &
BG+=($!)
# How long each Multus restart leaves the conf dir without 00-multus.conf (0.1 s resolution).
(
  gone=
  while kill -0 $$ 2>/dev/null; do
    if [ -e "$CONF" ]; then
      if [ -n "$gone" ]; then
        now=$(date +%s%3N)
        echo "$((now - gone))" >>"$W/conf-gaps"
        echo "$gone $now" >>"$W/windows"
      fi
      gone=
    elif [ -z "$gone" ]; then
      gone=$(date +%s%3N)
    fi
    sleep 0.1
  done
) >/dev/null 9>&- &
BG+=($!)

kubelet_log=$CLUSTER_DIR/logs/kubelet.log
kubelet_from=$(($(stat -c %s "$kubelet_log") + 1))
guard_log=$CLUSTER_DIR/logs/guard-syslog.log
[ -f "$guard_log" ] || fail "$guard_log is missing: the node runs no guard-syslog (scripts/cluster.sh)"
guard_size() { stat -c %s "$guard_log"; }
guard_from=$(guard_size)
t_run=$SECONDS

# --- the churn -----------------------------------------------------------------------------------
deployment churn "$PODS_LOW" macvlan-net1
"$K" rollout status deployment/churn --timeout=120s >/dev/null || fail "the Deployment did not come up before the churn"
PLAIN_START=3
if [ -n "$PERPOD" ]; then
  # Pods that ask for no Multus network: with per-pod awareness they start on the primary even
  # in a window. Only ever scaled up, so every one of them is still there to be measured.
  deployment churn-plain "$PLAIN_START"
  "$K" rollout status deployment/churn-plain --timeout=120s >/dev/null || fail "the plain Deployment did not come up before the churn"
fi

delete_some() { # N: deletes N random Running churn pods (not already being deleted), not waiting
  local names
  mapfile -t names < <("$K" get pod -l app=churn -o jsonpath='{range .items[*]}{.metadata.name}{"|"}{.metadata.deletionTimestamp}{"|"}{.status.phase}{"\n"}{end}' |
    awk -F'|' '$2 == "" && $3 == "Running" { print $1 }' | shuf -n "$1")
  # Their sandboxes, to find the ones whose teardown fails (kubelet names only the sandbox then).
  # A failed crictl call is a failure: a missing id would hide that pod's teardown failure.
  local n ids
  for n in "${names[@]}"; do
    ids=$(crictl pods --namespace default --name "^$n\$" --state ready -q) || fail "crictl pods for $n failed"
    [ -z "$ids" ] || sed "s/^/$n /" <<<"$ids" >>"$W/deleted"
  done
  # Gone already (the Deployment scaled down meanwhile) is fine; any other error is not.
  [ ${#names[@]} -eq 0 ] || "$K" delete pod --wait=false --ignore-not-found "${names[@]}" >/dev/null ||
    fail "deleting ${names[*]} failed"
}

t_back=
per_restart=()
for ((i = 1; i <= RESTARTS; i++)); do
  from=$(guard_size)
  "$K" -n kube-system delete pod -l app=multus --wait=false >/dev/null
  for _ in $(seq 60); do [ -e "$CONF" ] || break; sleep 0.2; done
  # ${CHURN_TEST_NO_WINDOW:-} only shows that this check fires (the file counts as still there).
  if [ -e "$CONF" ] || [ "${CHURN_TEST_NO_WINDOW:-}" = "$i" ]; then
    fail "restart $i: 00-multus.conf still there 12 s after the Multus pod's deletion: the restart opened no window"
  fi
  say "restart $i: Multus stopped, 00-multus.conf gone"
  # In the window: pods torn down (deletions of running pods), then new pods (scale up).
  delete_some 3
  "$K" scale deployment churn --replicas="$PODS_MAX" >/dev/null
  if [ -n "$PERPOD" ]; then
    "$K" scale deployment churn-plain --replicas=$((PLAIN_START + 3 * i)) >/dev/null
  fi
  for _ in $(seq 180); do multus_ready && break; sleep 1; done
  multus_ready || fail "Multus did not come back after restart $i"
  t_back=$SECONDS
  per_restart+=("$(guard_refusals "$from")")
  say "restart $i: Multus back after $((SECONDS - t_run))s of the run; the guard refused ${per_restart[-1]} ADDs and held $(guard_holds "$from") in this window"
  if [ "$i" -lt "$RESTARTS" ]; then
    sleep 8
    "$K" scale deployment churn --replicas="$PODS_LOW" >/dev/null
    delete_some 2
    sleep 4
  fi
done

# --- recovery ------------------------------------------------------------------------------------
# From here only this loop classifies (one writer: one verdict a pod).
kill "${BG[1]}" 2>/dev/null || true
wait "${BG[1]}" 2>/dev/null || true
"$K" scale deployment churn --replicas="$PODS_MAX" >/dev/null
recovery=never
while ((SECONDS - t_back < RECOVERY_TIMEOUT)); do
  classify
  mapfile -t live < <("$K" get pod -l app=churn -o jsonpath='{range .items[*]}{.metadata.name}{"|"}{.metadata.deletionTimestamp}{"|"}{.status.phase}{"\n"}{end}' | awk -F'|' '$2 == ""')
  n_run=0 n_full=0 n_bare=0
  for l in "${live[@]}"; do
    IFS='|' read -r name _ phase <<<"$l"
    [ "$phase" = Running ] || continue
    n_run=$((n_run + 1))
    if grep -q "^$name full$" "$W/class" 2>/dev/null; then n_full=$((n_full + 1)); fi
    if grep -q "^$name bare$" "$W/class" 2>/dev/null; then n_bare=$((n_bare + 1)); fi
  done
  if [ "${#live[@]}" -eq "$PODS_MAX" ] && [ "$n_run" -eq "$PODS_MAX" ] && [ "$n_full" -eq "$PODS_MAX" ]; then
    recovery=$((SECONDS - t_back))
    break
  fi
  # Every pod runs and has its verdict, and some are bare: that is final (nothing runs a running
  # sandbox's ADD again; incident.sh watches one such pod stay bare after Multus is back), so the
  # rest of the bound would only be waited out.
  if [ "${#live[@]}" -eq "$PODS_MAX" ] && [ "$n_run" -eq "$PODS_MAX" ] && [ $((n_full + n_bare)) -eq "$PODS_MAX" ] &&
     [ "$n_bare" -gt 0 ]; then
    break
  fi
  sleep 1
done
classify
# With the guard: its records and the host-local leases match the sandboxes left (leaks.py; a
# pod deleted in a window whose DEL went nowhere would leave its net1 lease).
if [ "$GUARD" != off ]; then
  leaks=$(CRICTL_BIN=$CRICTL_BIN conformance/k8s/leaks.py --settle 60) ||
    fail "layout=$LAYOUT guard=$GUARD: records or leases do not match the sandboxes left: $leaks"
  say "$leaks"
fi

# --- the numbers ---------------------------------------------------------------------------------
for p in "${BG[@]}"; do kill "$p" 2>/dev/null || true; done
BG=()
touch "$W/class"
awk '!seen[$1]++' "$W/class" >"$W/verdicts" # the first verdict of each pod
pods=$(wc -l <"$W/verdicts")
full=$(awk '$2 == "full"' "$W/verdicts" | wc -l)
bare=$(awk '$2 == "bare"' "$W/verdicts" | wc -l)
[ -s "$W/ready-polls" ] || fail "the node's Ready condition was never polled"
notready=$(seconds_not_true "$W/ready-polls")
unknown=$(seconds_unknown "$W/ready-polls")
refused=$(guard_refusals "$guard_from")
held=$(guard_holds "$guard_from")
# DELs the guard answered 11 because their delegate went away while they ran and it did not
# wait for it (per-pod awareness), for kubelet's retry.
went_away=$(tail -c +"$((guard_from + 1))" "$guard_log" |
  awk '/cni-guard\[[0-9]+\]: verb=DEL .* decision=refused .*went away while its DEL ran/ { n++ } END { print n + 0 }')
# Pod deletions whose sandbox teardown failed: the sandboxes of the pods delete_some deleted that
# appear in kubelet's "failed to destroy network for sandbox" lines (the pod worker names the pod,
# the garbage collector and the StopPodSandbox call only the sandbox). Every sandbox whose
# teardown failed, the failed sandboxes of pods that never started included, is counted apart.
tail -c +"$kubelet_from" "$kubelet_log" >"$W/kubelet-run.log"
failed_teardowns "$W/kubelet-run.log" >"$W/failed-sandboxes"
touch "$W/deleted"
awk 'NR == FNR { failed[$1] = 1; next } ($2 in failed) { print $1 }' "$W/failed-sandboxes" "$W/deleted" |
  sort -u >"$W/teardown"
teardown=$(wc -l <"$W/teardown")
say "pods deleted in the run: $(cut -d' ' -f1 "$W/deleted" | sort -u | wc -l); sandboxes whose network teardown failed at least once: $(wc -l <"$W/failed-sandboxes")"
if [ "$teardown" -gt 0 ]; then
  say "teardown failures: $(tr '\n' ' ' <"$W/teardown")"
  grep -m 2 -E 'KillPodSandbox|StopPodSandbox|failed to destroy network' "$W/kubelet-run.log" | cut -c1-600 >&2
fi
say "00-multus.conf absent for (ms): $(tr '\n' ' ' <"$W/conf-gaps" 2>/dev/null); the guard's refusals per window: ${per_restart[*]}"
say "run took $((SECONDS - t_run))s (with the node's up: $((SECONDS - t_up))s)"
perpod_fields=
if [ -n "$PERPOD" ]; then
  # The plain pods created in a window (creation time within a window's [gone, back], to the
  # API's whole seconds), and how long each took from creation to Ready.
  [ -s "$W/windows" ] || fail "no window was recorded"
  "$K" get pod -l app=churn-plain -o json >"$W/plain.json" || fail "cannot list the plain pods"
  read -r plain in_windows delay window < <(python3 - "$W/plain.json" "$W/windows" <<'PY'
import json, statistics, sys
from datetime import datetime
def t(s): return datetime.strptime(s, "%Y-%m-%dT%H:%M:%SZ").timestamp()
pods = json.load(open(sys.argv[1]))["items"]
windows = [tuple(int(x) / 1000 for x in l.split()) for l in open(sys.argv[2]) if l.strip()]
delays = []
for p in pods:
    created = t(p["metadata"]["creationTimestamp"])
    if not any(a - 1 <= created <= b for a, b in windows):
        continue
    ready = [c for c in p["status"].get("conditions", []) if c["type"] == "Ready" and c["status"] == "True"]
    delays.append(t(ready[0]["lastTransitionTime"]) - created if ready else float("inf"))
med = statistics.median(delays) if delays else float("nan")
print(len(pods), len(delays), "never" if med == float("inf") else f"{med:.0f}",
      f"{statistics.median(b - a for a, b in windows):.1f}")
PY
  )
  perpod_fields=" plain=$plain plain_in_windows=$in_windows plain_delay_s=$delay window_s=$window"
fi
echo "incident-summary kubernetes=$k8s_version containerd=$ctrd_version multus=$multus_version primary=$(cat "$CLUSTER_DIR/primary") layout=$LAYOUT guard=$GUARD pods=$pods full=$full bare=$bare teardown_failures=$teardown notready_s=$notready recovery_s=$recovery refused=$refused failed_sandboxes=$(wc -l <"$W/failed-sandboxes") unknown_s=$unknown held=$held went_away=$went_away$perpod_fields"
