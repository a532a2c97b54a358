# shellcheck shell=bash
# Shared by the node's scripts (churn.sh, crash.sh, reboot.sh, recovery.sh): polling a status and
# reading the polls back; the node in a layout; what its logs say; the reboot-summary line.
# Sourced from the repository's root.

# poll_status FILE CMD...: in the background, about once a second while the sourcing script
# lives (kill -0 $$: it stops even if that script is SIGKILLed), run CMD and append "ms output"
# to FILE. A failed call or an empty answer is written as "ms ?": it is no status, but it is not
# dropped either (the readers below count it as not True, and apart). The poller holds neither
# the caller's stdout nor 35-kubernetes.sh's lock (fd 9). Its pid is in $! afterwards.
poll_status() {
  local file=$1
  shift
  (
    while kill -0 $$ 2>/dev/null; do
      if r=$("$@" 2>/dev/null) && [ -n "$r" ]; then echo "$(date +%s%3N) $r" >>"$file"
      else echo "$(date +%s%3N) ?" >>"$file"; fi
      sleep 1
    done
  ) >/dev/null 9>&- &
}

# seconds_not_true FILE: the seconds poll_status's FILE saw a status other than True (a failed
# poll included: unknown is not True), each such poll counting until the next one (to the
# nearest second); 0 for no polls.
seconds_not_true() {
  touch "$1"
  awk 'prev != "" && st != "True" { ms += $1 - prev } { prev = $1; st = $2 }
    END { print int((ms + 500) / 1000) }' "$1"
}

# seconds_unknown FILE: the part of seconds_not_true that follows failed polls ("?").
seconds_unknown() {
  touch "$1"
  awk 'prev != "" && st == "?" { ms += $1 - prev } { prev = $1; st = $2 }
    END { print int((ms + 500) / 1000) }' "$1"
}

# --- how long each stage of a suite took (35-kubernetes.sh, 37-cilium.sh) ------------------------
# stage_done NAME: NAME took the time since the previous stage_done (or since the sourcing);
# stage_table prints every stage, one a line ("  123 s  NAME"), for the suite's end.
STAGE_T0=$SECONDS
STAGE_TIMES=()
stage_done() {
  STAGE_TIMES+=("$(printf '%5d s  %s' $((SECONDS - STAGE_T0)) "$1")")
  STAGE_T0=$SECONDS
}
stage_table() { printf '%s\n' "${STAGE_TIMES[@]}"; }

# --- the node and its DaemonSets (churn.sh, reboot.sh, recovery.sh) ------------------------------
# These use the caller's K (kubectl), NODE and CLUSTER_DIR, and CLUSTER_PRIMARY (bridge|cilium).

# node_in_layout LAYOUT GUARD: the node of scripts/cluster.sh up in LAYOUT (original: both files
# in the conf dir, CLUSTER_LAYOUT=before-fix; seed-fix: 05-cilium.conflist in Multus's folder)
# with GUARD (on, off, or perpod: the caller sets CLUSTER_GUARD_ARGS). A node that runs so already
# (the layout, the guard, Multus's master as cluster.sh renders it, the guard's wait as cluster.sh
# renders it now, per-pod awareness, the primary) is left as it is. One in the same layout with
# the same primary but another guard is changed as an operator would change it (node_regard:
# about 20 s, where down and up take 40-60 s here); any other is brought down and up anew.
node_in_layout() {
  local cl cg pp=0
  case "$1" in original) cl="before-fix" ;; seed-fix) cl=seed ;; *) echo "node_in_layout: layout $1?" >&2; return 2 ;; esac
  case "$2" in on) cg=1 ;; perpod) cg=1 pp=1 ;; off) cg=0 ;; *) echo "node_in_layout: guard $2?" >&2; return 2 ;; esac
  node_matches "$cl" "$cg" "$pp" && return 0
  if node_same_layout "$cl" && node_regard "$cl" "$cg" && node_matches "$cl" "$cg" "$pp"; then
    echo "node_in_layout: the running node changed to guard=$2 (layout $1)" >&2
    return 0
  fi
  scripts/cluster.sh down >/dev/null 2>&1 || true
  CLUSTER_LAYOUT=$cl CLUSTER_GUARD=$cg scripts/cluster.sh up >/dev/null
}
node_same_layout() { # CLUSTER_LAYOUT: the node runs, in that layout, with the asked primary
  local orig=0
  scripts/cluster.sh status >/dev/null 2>&1 || return 1
  [ -e "$NODE/etc/cni/net.d/05-cilium.conflist" ] && orig=1
  [ "$orig" = "$([ "$1" = before-fix ] && echo 1 || echo 0)" ] &&
    [ "$(cat "$CLUSTER_DIR/primary" 2>/dev/null || echo bridge)" = "${CLUSTER_PRIMARY:-bridge}" ]
}
# node_regard CLUSTER_LAYOUT CLUSTER_GUARD: the running node's Multus and guard changed as
# cluster.sh renders them for that layout and guard, as an operator does it. Multus first (a
# guard whose probe fails on Multus's election of it turns Ready only then): its ConfigMap
# applied, and its pod restarted when multusMasterCNI changed (the daemon reads its config once,
# at start). The guard off: its DaemonSet deleted, then its conflist (keep leaves it on SIGTERM,
# by design). On: its manifest applied (with CLUSTER_GUARD_ARGS and CLUSTER_GUARD_WAIT as set
# now) and rolled.
node_regard() {
  local cl=$1 cg=$2 before after
  before=$("$K" -n kube-system get configmap multus-daemon-config -o jsonpath='{.data.daemon-config\.json}')
  CLUSTER_LAYOUT=$cl CLUSTER_GUARD=$cg scripts/cluster.sh manifest multus.yaml | "$K" apply -f - >/dev/null || return 1
  after=$("$K" -n kube-system get configmap multus-daemon-config -o jsonpath='{.data.daemon-config\.json}')
  if [ "$before" != "$after" ]; then
    "$K" -n kube-system delete pod -l app=multus --wait=true --timeout=90s >/dev/null || return 1
    "$K" -n kube-system rollout status daemonset/kube-multus-ds --timeout=180s >/dev/null || return 1
  fi
  if [ "$cg" = 0 ]; then
    if "$K" -n cni-guard get daemonset cni-guard >/dev/null 2>&1; then
      "$K" -n cni-guard delete daemonset cni-guard --wait=true --timeout=90s >/dev/null || return 1
      "$K" -n cni-guard wait --for=delete pod -l app.kubernetes.io/name=cni-guard --timeout=90s >/dev/null 2>&1 || true
    fi
    rm -f "$NODE/etc/cni/net.d/00-cni-guard.conflist"
  else
    CLUSTER_LAYOUT=$cl CLUSTER_GUARD=$cg scripts/cluster.sh manifest guard | "$K" apply -f - >/dev/null || return 1
    "$K" -n cni-guard rollout status daemonset/cni-guard --timeout=120s >/dev/null || return 1
  fi
  local i
  for ((i = 0; i < 120; i++)); do
    [ -s "$NODE/etc/cni/net.d/00-multus.conf" ] &&
      { [ "$cg" = 0 ] || [ -s "$NODE/etc/cni/net.d/00-cni-guard.conflist" ]; } && return 0
    sleep 1
  done
  return 1
}
node_matches() { # CLUSTER_LAYOUT CLUSTER_GUARD PERPOD(0|1)
  local cl=$1 cg=$2 pp=$3 orig=0 g=0 master want_master have_pp=0 want_wait
  scripts/cluster.sh status >/dev/null 2>&1 || return 1
  [ -e "$NODE/etc/cni/net.d/05-cilium.conflist" ] && orig=1
  "$K" -n cni-guard get daemonset cni-guard >/dev/null 2>&1 && g=1
  # Multus's master as cluster.sh renders it for this layout (autoconfig.sh leaves it on auto).
  want_master=$(CLUSTER_LAYOUT=$cl CLUSTER_GUARD=$cg scripts/cluster.sh manifest multus.yaml |
    grep -o '"multusMasterCNI": *"[^"]*"') || return 1
  master=$("$K" -n kube-system get configmap multus-daemon-config -o jsonpath='{.data.daemon-config\.json}' 2>/dev/null |
    grep -o '"multusMasterCNI": *"[^"]*"') || return 1
  grep -q '"perPodPrimary"' "$NODE/etc/cni/net.d/00-cni-guard.conflist" 2>/dev/null && have_pp=1
  if [ "$cg" = 1 ]; then
    want_wait=$(scripts/cluster.sh manifest guard | grep -o -- '--wait-seconds=[0-9]*' | head -n1) || return 1
    grep -q "\"waitSeconds\": ${want_wait#--wait-seconds=}," "$NODE/etc/cni/net.d/00-cni-guard.conflist" 2>/dev/null ||
      return 1
  fi
  [ "$orig" = "$([ "$cl" = before-fix ] && echo 1 || echo 0)" ] && [ "$g" = "$cg" ] &&
    [ "$master" = "$want_master" ] && [ "$have_pp" = "$pp" ] &&
    [ "$(cat "$CLUSTER_DIR/primary" 2>/dev/null || echo bridge)" = "${CLUSTER_PRIMARY:-bridge}" ]
}

# start_delay NAMESPACE DAEMONSET SECONDS [first]: the DaemonSet's pods wait SECONDS in an init
# container `start-delay` (the test image's sleep) after its other init containers, or before them
# with `first`; 0 takes it out. It stands in for what makes a pod start later in production than
# on this node (an image pulled again, an API server slow after a reboot). Rolls the DaemonSet
# when that changes anything, and waits for the roll.
start_delay() {
  local ns=$1 ds=$2 seconds=$3 where=${4:-last} patch
  patch=$("$K" -n "$ns" get daemonset "$ds" -o json | python3 -c '
import json, sys
seconds, where = int(sys.argv[1]), sys.argv[2]
spec = json.load(sys.stdin)["spec"]["template"]["spec"]
inits = spec.get("initContainers", [])
others = [c for c in inits if c["name"] != "start-delay"]
new = others
if seconds:
    delay = {"name": "start-delay", "image": "localhost/cni-guard-test/busybox:1",
             "imagePullPolicy": "Never", "command": ["/bin/sleep", str(seconds)]}
    new = [delay] + others if where == "first" else others + [delay]
def key(cs): return [(c["name"], c.get("command")) for c in cs]
if key(new) != key(inits):
    print(json.dumps([{"op": "replace" if "initContainers" in spec else "add",
                       "path": "/spec/template/spec/initContainers", "value": new}]))
' "$seconds" "$where") || return 1
  [ -z "$patch" ] || "$K" -n "$ns" patch daemonset "$ds" --type=json -p "$patch" >/dev/null
  "$K" -n "$ns" rollout status "daemonset/$ds" --timeout=180s >/dev/null
}

# deployment NAME REPLICAS [NETWORKS] [COMMAND]: a Deployment of sleepers labelled app=NAME in
# `default`, asking Multus for NETWORKS when given (k8s.v1.cni.cncf.io/networks), their
# container running COMMAND (a JSON list; default a sleep, which as PID 1 ignores SIGTERM and
# goes at the end of the 1 s grace period).
deployment() {
  local ann='' cmd=${4:-}
  [ -n "$cmd" ] || cmd='["/bin/sleep", "3600"]'
  [ -z "${3:-}" ] || ann="
      annotations:
        k8s.v1.cni.cncf.io/networks: $3"
  "$K" apply -f - >/dev/null <<EOF
apiVersion: apps/v1
kind: Deployment
metadata:
  name: $1
  namespace: default
spec:
  replicas: $2
  selector:
    matchLabels: {app: $1}
  template:
    metadata:
      labels: {app: $1}$ann
    spec:
      terminationGracePeriodSeconds: 1
      containers:
        - name: main
          image: localhost/cni-guard-test/busybox:1
          imagePullPolicy: Never
          command: $cmd
EOF
}

# --- what the node's logs say (churn.sh, reboot.sh) ------------------------------------------------
# failed_teardowns FILE: the sandbox ids of kubelet's "failed to destroy network for sandbox"
# lines in FILE (a part of logs/kubelet.log), one a line, each once. (grep, not awk: Debian's mawk
# has no {64}.) No match is no sandbox; grep's other errors fail.
failed_teardowns() {
  { grep -oE 'failed to destroy network for sandbox [^a-f0-9]*[a-f0-9]{64}' "$1" || [ $? -eq 1 ]; } |
    { grep -oE '[a-f0-9]{64}$' || [ $? -eq 1 ]; } | sort -u
}
# guard_refusals BYTE, guard_holds BYTE: from byte BYTE (0-based) of the guard's log on the node
# (logs/guard-syslog.log, see scripts/cluster.sh) on, its code-11 ADD refusals ("verb=ADD ...
# decision=refused code=11"), and its ADDs that waited and then went on ("verb=ADD ...
# waited=...ms" that are not refusals: held until the network was complete).
guard_refusals() {
  tail -c +"$(($1 + 1))" "$CLUSTER_DIR/logs/guard-syslog.log" |
    awk '/cni-guard\[[0-9]+\]: verb=ADD .* decision=refused code=11 / { n++ } END { print n + 0 }'
}
guard_holds() {
  tail -c +"$(($1 + 1))" "$CLUSTER_DIR/logs/guard-syslog.log" |
    awk '/cni-guard\[[0-9]+\]: verb=ADD .* waited=[0-9.]+ms/ && !/decision=refused/ { n++ } END { print n + 0 }'
}

# --- the reboot-summary line ------------------------------------------------------------------------
# One line per node reboot, whatever the node (conformance/k8s/reboot.sh on the node of
# scripts/cluster.sh, node=netns; a virtual machine that really reboots, node=vm), made by
# reboot_summary and judged by reboot_check, both here and nowhere else:
#
#   reboot-summary kubernetes=.. containerd=.. multus=.. primary=bridge|cilium node=netns|vm
#     etc_cni=disk|tmpfs layout=original|seed-fix guard=on|off pods=N full=F bare=B notready_s=S
#     stuck_teardowns=T all_full_s=A|never refused=R held=H [first_conf=FILE ...]
#
#   etc_cni          disk: /etc/cni kept over the reboot (Talos up to 1.13); tmpfs: empty at boot
#                    (Talos 1.14 and later), every writer writes its file again
#   pods, full, bare the pods asking for net1 that were Running with it before the reboot; after
#                    it, on their new sandboxes, with eth0 and net1 (full) or without net1 (bare)
#   notready_s       seconds the node's Ready condition was not seen True (polled each second)
#   stuck_teardowns  of those pods' sandboxes from before the reboot, the ones whose network
#                    teardown failed at least once after it (kubelet: "failed to destroy network
#                    for sandbox"): the pod cannot get a new sandbox meanwhile
#   all_full_s       from the boot (the node's containerd started) to every pod Ready with all
#                    its interfaces; never: not so within the run's bound (a bare pod stays bare)
#   refused, held    the guard's own log after the boot: ADDs refused (code 11), ADDs held until
#                    the network was complete and then run
#   first_conf       (optional) the first configuration containerd had in the conf dir after the
#                    boot: the file that sorted first the first time the folder was not empty
#                    (with etc_cni=disk, what the reboot left there)

REBOOT_FIELDS=(kubernetes containerd multus primary node etc_cni layout guard pods full bare
  notready_s stuck_teardowns all_full_s refused held)

# reboot_summary KEY=VALUE...: prints the line, the fields above in that order, then any other
# given fields in the order given. A missing or empty field fails (status 1, nothing printed).
reboot_summary() {
  local kv k line=reboot-summary extra=()
  local -A v=()
  for kv; do
    k=${kv%%=*}
    if [[ $kv != *=* || -z ${kv#*=} || $kv == *" "* ]]; then
      echo "reboot_summary: bad field \"$kv\"" >&2
      return 1
    fi
    if [[ " ${REBOOT_FIELDS[*]} " == *" $k "* ]]; then v[$k]=${kv#*=}; else extra+=("$kv"); fi
  done
  for k in "${REBOOT_FIELDS[@]}"; do
    [ -n "${v[$k]:-}" ] || { echo "reboot_summary: no $k=" >&2; return 1; }
    line+=" $k=${v[$k]}"
  done
  [ ${#extra[@]} -eq 0 ] || line+=" ${extra[*]}"
  echo "$line"
}

# reboot_field LINE KEY: the value of KEY=... in LINE (empty when absent).
reboot_field() { tr ' ' '\n' <<<"$1" | sed -n "s/^$2=//p" | head -n 1; }

# reboot_check LINE: what the line must show; on a miss prints "reboot_check: ..." naming it
# and returns 1.
#   every line    pods > 0 and full + bare = pods (every pod came back and was looked at)
#   original off  bare > 0 and all_full_s=never: the incident, made by the reboot (Multus's
#                 00-multus.conf gone with its daemon, 05-cilium.conflist first at boot)
#   seed-fix off  bare = 0, all_full_s a number, and what the layout alone costs seen: the node
#                 NotReady (notready_s > 0: no configuration at all until Multus writes its file)
#   guard on      bare = 0, stuck_teardowns = 0, all_full_s a number, and the guard reached:
#                 refused + held > 0; except with etc_cni=tmpfs in the original layout when the
#                 primary's file came first (first_conf=05-cilium.conflist): then bare > 0, the
#                 incident with the guard installed (a guard that is not first guards nothing);
#                 and with etc_cni=tmpfs stuck_teardowns is not asserted (nothing at all is in
#                 the conf dir until the first writer, the guard included, has run)
reboot_miss() { echo "reboot_check: $2: $1" >&2; return 1; } # LINE WHAT
reboot_check() {
  local line=$1 k v pods full bare layout guard etc first all stuck
  [[ $line == "reboot-summary "* ]] || { reboot_miss "$line" "not a reboot-summary line"; return 1; }
  for k in "${REBOOT_FIELDS[@]}"; do
    v=$(reboot_field "$line" "$k")
    case "$k" in
      pods | full | bare | notready_s | stuck_teardowns | refused | held) [[ $v =~ ^[0-9]+$ ]] ;;
      all_full_s) [[ $v =~ ^[0-9]+$ || $v == never ]] ;;
      node) [[ $v == netns || $v == vm ]] ;;
      etc_cni) [[ $v == disk || $v == tmpfs ]] ;;
      layout) [[ $v == original || $v == seed-fix ]] ;;
      guard) [[ $v == on || $v == off ]] ;;
      *) [ -n "$v" ] ;;
    esac || { reboot_miss "$line" "$k=\"$v\""; return 1; }
  done
  pods=$(reboot_field "$line" pods) full=$(reboot_field "$line" full)
  bare=$(reboot_field "$line" bare) layout=$(reboot_field "$line" layout)
  guard=$(reboot_field "$line" guard) etc=$(reboot_field "$line" etc_cni)
  first=$(reboot_field "$line" first_conf) all=$(reboot_field "$line" all_full_s)
  stuck=$(reboot_field "$line" stuck_teardowns)
  [ "$pods" -gt 0 ] || { reboot_miss "$line" "no pods"; return 1; }
  [ $((full + bare)) -eq "$pods" ] ||
    { reboot_miss "$line" "full + bare is not pods: a pod did not come back, or was not looked at"; return 1; }
  case "$guard $layout" in
    "off original")
      [ "$bare" -gt 0 ] && [ "$all" = never ] ||
        { reboot_miss "$line" "original off: the reboot made no bare pod (want bare > 0, all_full_s=never)"; return 1; } ;;
    "off seed-fix")
      [ "$bare" -eq 0 ] && [ "$all" != never ] ||
        { reboot_miss "$line" "seed-fix off: want bare=0 and every pod full"; return 1; }
      [ "$(reboot_field "$line" notready_s)" -gt 0 ] ||
        { reboot_miss "$line" "seed-fix off: the node was never seen NotReady (the layout's cost not seen)"; return 1; } ;;
    "on "*)
      if [ "$etc" = tmpfs ] && [ "$layout" = original ] && [ "$first" = 05-cilium.conflist ]; then
        [ "$bare" -gt 0 ] ||
          { reboot_miss "$line" "tmpfs, original layout, the primary's file first at boot: want bare > 0"; return 1; }
        return 0
      fi
      [ "$bare" -eq 0 ] && [ "$all" != never ] ||
        { reboot_miss "$line" "guard on: want bare=0 and every pod full"; return 1; }
      [ "$etc" = tmpfs ] || [ "$stuck" -eq 0 ] ||
        { reboot_miss "$line" "guard on: want stuck_teardowns=0"; return 1; }
      [ $(($(reboot_field "$line" refused) + $(reboot_field "$line" held))) -gt 0 ] ||
        { reboot_miss "$line" "guard on: the guard neither refused nor held an ADD after the boot: the window reached no pod"; return 1; } ;;
  esac
}

# --- several nodes (cutover.sh, rolling-reboot.sh) -----------------------------------------------
# These use the caller's K (kubectl), W (its work folder) and CLUSTER_DIR.
#
# node_log I NAME: node I's (1-based) log of daemon NAME (scripts/cluster.sh: logs/, logs/nodeI/).
node_log() {
  if [ "$1" = 1 ]; then echo "$CLUSTER_DIR/logs/$2.log"; else echo "$CLUSTER_DIR/logs/node$1/$2.log"; fi
}
# spread_workloads PODS: in `default`, a Deployment `spread` of PODS sleepers asking for net1,
# spread over the schedulable nodes (at most one more on a node than on another; a cordoned node
# is left out of the count), and a DaemonSet `spread-osd` asking for net1, standing in for Rook's
# OSDs (a pod on every node that is not drained away). Waits for both.
SPREAD_LABELS='app in (spread, spread-osd)'
spread_workloads() {
  "$K" apply -f - >/dev/null <<EOW
apiVersion: apps/v1
kind: Deployment
metadata: {name: spread, namespace: default}
spec:
  replicas: $1
  selector: {matchLabels: {app: spread}}
  template:
    metadata:
      labels: {app: spread}
      annotations: {k8s.v1.cni.cncf.io/networks: macvlan-net1}
    spec:
      terminationGracePeriodSeconds: 1
      topologySpreadConstraints:
        - {maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule,
           nodeTaintsPolicy: Honor, labelSelector: {matchLabels: {app: spread}}}
      containers:
        - {name: main, image: localhost/cni-guard-test/busybox:1, imagePullPolicy: Never, command: ["/bin/sleep", "3600"]}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: spread-osd, namespace: default}
spec:
  selector: {matchLabels: {app: spread-osd}}
  template:
    metadata:
      labels: {app: spread-osd}
      annotations: {k8s.v1.cni.cncf.io/networks: macvlan-net1}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
        - {name: main, image: localhost/cni-guard-test/busybox:1, imagePullPolicy: Never, command: ["/bin/sleep", "3600"]}
EOW
  "$K" rollout status deployment/spread --timeout=180s >/dev/null &&
    "$K" rollout status daemonset/spread-osd --timeout=180s >/dev/null
}
spread_remove() {
  "$K" delete deployment spread --ignore-not-found --wait=false >/dev/null 2>&1 || true
  "$K" delete daemonset spread-osd --ignore-not-found --wait=false >/dev/null 2>&1 || true
}
# spread_pods: "NAME|DELETION|PHASE|NODE|STARTED" for every pod of the two, STARTED its
# container's start while it runs (empty otherwise).
spread_pods() {
  "$K" get pod -l "$SPREAD_LABELS" -o jsonpath='{range .items[*]}{.metadata.name}{"|"}{.metadata.deletionTimestamp}{"|"}{.status.phase}{"|"}{.spec.nodeName}{"|"}{.status.containerStatuses[0].state.running.startedAt}{"\n"}{end}'
}
# spread_classify: every sandbox of theirs that runs gets one verdict in $W/class, "NAME@STARTED
# NODE full|bare": full when network-status and `ip addr` inside both show eth0 and net1, bare
# when it runs without net1. Keyed by the container's start, so a pod whose sandbox was made
# anew (a reboot: same pod, new sandbox, its container started again) is looked at again. A
# failed call is no verdict (the next round tries again).
spread_classify() {
  local name ts phase node started st addrs
  while IFS='|' read -r name ts phase node started; do
    [ -n "$name" ] && [ -z "$ts" ] && [ "$phase" = Running ] && [ -n "$started" ] || continue
    grep -q "^$name@$started " "$W/class" 2>/dev/null && continue
    addrs=$("$K" exec "$name" -- ip -o addr 2>/dev/null) || continue
    st=$("$K" get pod "$name" -o jsonpath='{.metadata.annotations.k8s\.v1\.cni\.cncf\.io/network-status}' 2>/dev/null) || continue
    if grep -q ' net1 .*inet ' <<<"$addrs" && grep -q ' eth0 .*inet ' <<<"$addrs" &&
       python3 -c 'import json,sys; s={i.get("interface") for i in json.loads(sys.argv[1])}; sys.exit(not {"eth0","net1"} <= s)' "$st" 2>/dev/null; then
      echo "$name@$started $node full" >>"$W/class"
    else
      echo "$name@$started $node bare" >>"$W/class"
      echo "bare: $name on $node: $(awk '$3 == "inet" { printf "%s=%s ", $2, $4 }' <<<"$addrs")" >&2
    fi
  done < <(spread_pods 2>/dev/null)
}
# spread_settled WANT: WANT pods of theirs, none being deleted, every one Running with the verdict
# of its current sandbox.
spread_settled() {
  local live=0 done_=0 name ts phase node started
  while IFS='|' read -r name ts phase node started; do
    [ -n "$name" ] && [ -z "$ts" ] || continue
    live=$((live + 1))
    if [ "$phase" = Running ] && [ -n "$started" ] && grep -q "^$name@$started " "$W/class" 2>/dev/null; then
      done_=$((done_ + 1))
    fi
  done < <(spread_pods 2>/dev/null)
  [ "$live" -eq "$1" ] && [ "$done_" -eq "$1" ]
}
# spread_churn SECONDS: in the background, a random Running pod of the Deployment deleted every
# SECONDS, and every third time one of the DaemonSet's instead, except while $W/churn-paused
# exists (a caller waiting for every pod to settle: under deletions every few seconds some pod
# is always on its way up); $! is its pid.
spread_churn() {
  (
    n=0
    while kill -0 $$ 2>/dev/null; do
      if [ -e "$W/churn-paused" ]; then sleep 1; continue; fi
      n=$((n + 1))
      label=app=spread
      [ $((n % 3)) -ne 0 ] || label=app=spread-osd
      victim=$("$K" get pod -l "$label" -o jsonpath='{range .items[*]}{.metadata.name}{"|"}{.metadata.deletionTimestamp}{"|"}{.status.phase}{"\n"}{end}' 2>/dev/null |
        awk -F'|' '$2 == "" && $3 == "Running" { print $1 }' | shuf -n 1)
      [ -z "$victim" ] || "$K" delete pod --wait=false --ignore-not-found "$victim" >/dev/null 2>&1 || true
      sleep "$1"
    done
  ) >/dev/null 9>&- &
}
# nodes_ready_polls FILE: lib's poll_status of every node's Ready condition ("ms name=True ...").
nodes_ready_polls() {
  poll_status "$1" "$K" get nodes -o jsonpath='{range .items[*]}{.metadata.name}={.status.conditions[?(@.type=="Ready")].status} {end}'
}
# nodes_notready FILE NODE...: "S M": the most seconds any one NODE was not seen Ready (each poll
# not True counting until the next; a failed poll, or a node missing from it, is not True), and
# the most NODEs not seen Ready in one poll.
nodes_notready() {
  python3 - "$@" <<'PY'
import sys
polls = [l.split() for l in open(sys.argv[1]) if l.strip()]
nodes = sys.argv[2:]
def status(p, n): return next((f.split("=", 1)[1] for f in p[1:] if f.startswith(n + "=")), "?")
worst = 0
for n in nodes:
    ms, prev, st = 0, None, None
    for p in polls:
        if prev is not None and st != "True":
            ms += int(p[0]) - prev
        prev, st = int(p[0]), status(p, n)
    worst = max(worst, round(ms / 1000))
most = max((sum(status(p, n) != "True" for n in nodes) for p in polls), default=0)
print(worst, most)
PY
}
# guard_counts FILE: "REFUSED HELD" in FILE (a part of a node's guard-syslog.log): ADDs refused
# with code 11, ADDs held until the network was complete and then run (as guard_refusals/holds).
guard_counts() {
  awk '/cni-guard\[[0-9]+\]: verb=ADD .* decision=refused code=11 / { r++ }
    /cni-guard\[[0-9]+\]: verb=ADD .* waited=[0-9.]+ms/ && !/decision=refused/ { h++ }
    END { print r + 0, h + 0 }' "$1"
}
# nodes_log_marks N: from now on, for nodes_tally: the end of each of the N nodes' kubelet and
# guard-syslog logs, in $W/marks.
nodes_log_marks() {
  local i
  for ((i = 1; i <= $1; i++)); do
    echo "$i $(stat -c %s "$(node_log "$i" kubelet)") $(stat -c %s "$(node_log "$i" guard-syslog)")"
  done >"$W/marks"
}
# nodes_tally NAME...: "REFUSED HELD STUCK" since nodes_log_marks, summed over the nodes NAME...
# (node I is the I-th): the guard's refused and held ADDs, and the sandboxes whose network
# teardown failed at least once (kubelet); each node's own counts said on stderr.
nodes_tally() {
  local i k g r h s refused=0 held=0 stuck=0 names=("$@")
  while read -r i k g; do
    tail -c +"$((g + 1))" "$(node_log "$i" guard-syslog)" >"$W/guard-$i.log"
    read -r r h < <(guard_counts "$W/guard-$i.log")
    tail -c +"$((k + 1))" "$(node_log "$i" kubelet)" >"$W/kubelet-$i.log"
    s=$(failed_teardowns "$W/kubelet-$i.log" | wc -l)
    echo "${names[$((i - 1))]}: refused $r, held $h, sandboxes whose teardown failed $s" >&2
    refused=$((refused + r)) held=$((held + h)) stuck=$((stuck + s))
  done <"$W/marks"
  echo "$refused $held $stuck"
}
# nodes_teardowns [TIMEOUT]: after nodes_tally, "UNTRUSTED OTHER UNFINISHED" over the nodes, of the
# sandboxes whose teardown failed: UNTRUSTED, those the guard failed itself because the delegate
# went away while their DEL ran through it (Multus stopped with the DEL inside it: that run's
# result is not trusted, and past the DEL's budget the guard answers 11 for kubelet to retry);
# OTHER, those that failed for any other reason (a kubelet line without that message); UNFINISHED,
# those whose last DEL in the guard's log since the marks is no success (decision=deleted-... or
# nothing-to-do), or that have none there, waited for up to TIMEOUT s (default 0; kubelet retries a teardown with a back-off),
# the logs read again each time. Meaningful with the guard only.
nodes_teardowns() {
  local i k g id untrusted other unfinished end=$((SECONDS + ${1:-0}))
  while :; do
    untrusted=0 other=0 unfinished=0
    while read -r i k g; do
      tail -c +"$((g + 1))" "$(node_log "$i" guard-syslog)" >"$W/guard-$i.log"
      tail -c +"$((k + 1))" "$(node_log "$i" kubelet)" >"$W/kubelet-$i.log"
      while read -r id; do
        if grep -q "verb=DEL container=$id .*decision=refused code=11 msg=\"cni-guard: delegate .* went away while its DEL ran" "$W/guard-$i.log"; then
          untrusted=$((untrusted + 1))
        fi
        if grep "failed to destroy network for sandbox [^a-f0-9]*$id" "$W/kubelet-$i.log" | grep -vq 'went away while its DEL ran'; then
          other=$((other + 1))
        fi
        { grep "verb=DEL container=$id " "$W/guard-$i.log" || true; } | tail -n 1 |
          grep -Eq "decision=(deleted-[a-z]+|nothing-to-do)" || unfinished=$((unfinished + 1))
      done < <(failed_teardowns "$W/kubelet-$i.log")
    done <"$W/marks"
    [ "$unfinished" -gt 0 ] && [ "$SECONDS" -lt "$end" ] || break
    sleep 5
  done
  echo "$untrusted $other $unfinished"
}
