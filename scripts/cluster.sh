#!/usr/bin/env bash
# A one-node Kubernetes cluster on this machine, without systemd, Docker or a registry (issue 12):
#
#   scripts/cluster.sh up       start it (prints the KUBECONFIG path); nothing to do when it is up
#                               for a run still alive (CLUSTER_OWNER_PID, by default the caller:
#                               a cluster whose run was killed is removed and made anew)
#   scripts/cluster.sh down     stop every process it started, remove its network namespace, its
#                               mounts, cgroups and files; safe to run at any time, any number
#   scripts/cluster.sh status   the processes, the node and every pod
#   scripts/cluster.sh containerd-restart   containerd stopped (SIGTERM, as its service is) and
#                               started again, the pods left running
#   scripts/cluster.sh reboot   the node (not its control plane) restarts as Talos reboots: kubelet
#                               stopped, every pod stopped through the CRI, containerd stopped,
#                               /run wiped (and /etc/cni with CLUSTER_REBOOT_ETC_CNI=tmpfs, as on
#                               Talos 1.14), then booted again (see reboot_node for the rest)
#   scripts/cluster.sh cilium stop [--uninstall] | start   (CLUSTER_PRIMARY=cilium) stop the agent
#                               (SIGTERM; --uninstall then removes its conflist, as the chart's
#                               preStop does with cni.uninstall) or start it again, with
#                               CLUSTER_CILIUM_EXCLUSIVE as set now
#   scripts/cluster.sh manifest FILE   conformance/k8s/manifests/FILE with this node's paths
#                                      (FILE `guard`: deploy/multus-cilium for this node;
#                                      `guard-uninstall`: deploy/uninstall for this node)
#   scripts/cluster.sh sysctls  the kernel settings `up` saves and `down` puts back (one a line)
#   scripts/cluster.sh leftovers   what of the cluster is still on the host (nothing after down)
#   scripts/cluster.sh nodes    one line a node: INDEX NAME ADDRESS FOLDER (its folders on the host)
#   scripts/cluster.sh in-node I COMMAND...   COMMAND in node I's namespaces
#
# CLUSTER_NODES=N (1 to 9, default 1) brings up N nodes (with CLUSTER_PRIMARY=bridge): node 1 as
# below, with the control plane in its network namespace; node I > 1 in a network namespace of
# its own (cni-guard-k8s-I, address 10.77.0.(I+1)), a mount and UTS namespace of its own where
# the node's folder is $CLUSTER_DIR/nodeI bind-mounted at $CLUSTER_DIR/node (so every node runs
# the same manifests and configs; its own /etc/machine-id and hostname), its own cgroups
# (cni-guard-k8s-I), containerd, kubelet and guard-syslog (logs/nodeI/). The nodes reach each
# other and the host over the host's bridge cgk8s-br (10.77.0.1); each node's pods get
# 10.88.I.0/24 from the bridge primary, and every node routes the others' through them, so a pod
# reaches a pod on another node over eth0. CLUSTER_NODE_INDEX=I makes containerd-restart and
# reboot act on node I (default 1). What is still shared with the host: /var/lib/cni/results
# (libcni's cache, keyed by sandbox id) and the kernel.
#
# Everything runs in one network namespace, the node ($NETNS, address $NODE_IP; the host reaches
# it over a veth at $HOST_IP), from binaries built by scripts/setup.sh (scripts/versions.sh):
#   etcd -> kube-apiserver -> kube-controller-manager, kube-scheduler
#   containerd 2.x (private config, root, state and sockets) <- kubelet (cgroupfs, cgroup v1)
#   guard-syslog (the guard's log on this node: logs/guard-syslog.log, through CNI_GUARD_SYSLOG)
# The node's CNI folders are private, under $CLUSTER_DIR/node:
#   etc/cni/net.d          containerd's conf_dir (the node's /etc/cni/net.d); Multus writes
#                          00-multus.conf here
#   etc/cni/multus/net.d   05-cilium.conflist, the primary network (a bridge + host-local
#                          standing in for Cilium), read by Multus only (the seed's layout)
#   opt/cni/bin            the reference plugins, cni-guard, and multus-shim (installed by the
#                          Multus DaemonSet's init container)
# Images are OCI tarballs built here and imported with `ctr -n k8s.io images import`: the sandbox
# (pause) image, a busybox test image, the guard's image (scripts/build-image.sh) and a Multus
# image. Multus (thick plugin) runs as a DaemonSet (conformance/k8s/manifests/multus.yaml) and a
# NetworkAttachmentDefinition `macvlan-net1` (macvlan on the node's veth net1-parent) gives
# pods that ask for it a second interface net1. cni-guard's DaemonSet (deploy/multus-cilium, its
# paths moved under the node's folder) then puts 00-cni-guard.conflist in front of Multus.
#
# Environment: CNI_GUARD_CLUSTER_DIR (default /var/lib/cni-guard-cluster), CLUSTER_MULTUS=0 to
# leave Multus out (05-cilium.conflist then goes straight into the conf dir), CLUSTER_GUARD=0 to
# leave cni-guard out (by default deploy/multus-cilium runs in front of Multus), CLUSTER_TIMEOUT
# (seconds each wait may take, default 180), CLUSTER_LAYOUT=before-fix for the layout the seed
# fixed (05-cilium.conflist in the conf dir, Multus's autoconfig dir the conf dir, no guard: the
# incident itself), CLUSTER_MULTUS_MASTER (Multus's multusMasterCNI; see MASTER_CNI below),
# CLUSTER_RELOADER=1 to run stakater/Reloader beside the control plane (the cutover),
# CLUSTER_KEEP_ON_FAILURE=1 to leave a failed `up`
# running for a look (`down` still removes it),
# CLUSTER_PRIMARY=bridge|cilium|daemonset (default bridge): the primary network. `bridge` is the
# stand-in conflist above, written by this script; `daemonset` is that same conflist written by a
# DaemonSet that behaves as Cilium's chart (conformance/k8s/manifests/primary-daemonset.yaml:
# written into its confPath when ready, removed by its preStop, rolled one node at a time); `cilium` is the real Cilium $CILIUM_VERSION (issue 19): cilium-agent runs as a
# node process in the node's network namespace (nsenter, like the other daemons; see README "The
# real Cilium" for why not a DaemonSet), bpffs mounted at $NODE/sys/fs/bpf, Cilium's CRDs
# applied, IPAM `kubernetes` from the node's podCIDR (kube-controller-manager allocates it), and
# the agent writes its own 05-cilium.conflist where the stand-in would be (--write-cni-conf-when-
# ready) once it is ready; cilium-cni goes into the node's bin dir, and the guard gets the
# agent's socket as a `sockets` precondition. CLUSTER_CILIUM_EXCLUSIVE=true runs the agent with
# --cni-exclusive=true (the Helm chart's default; false by default here, as the seed sets it).
# CLUSTER_NODE=none brings up the control plane alone (etcd, API server, controller manager,
# scheduler) and writes the images to $CLUSTER_DIR/images, for a node of its own to join it
# (conformance/vm: a virtual machine on a bridge in this namespace); default netns, the node
# above. CLUSTER_GUARD_WAIT=N for the guard's --wait-seconds (the manifest's, 60, by default; the
# scenarios about the refusal itself pin 0), CLUSTER_GUARD_ARGS="--flag=... ..." for more flags
# of the guard's install and keep (host paths, moved under the node's folder like the
# manifest's). Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
# shellcheck source=scripts/versions.sh
. scripts/versions.sh

# CLUSTER_INSTANCE=K (0 to 9, default 0): a cluster of its own beside the others on this host,
# sharing nothing with them but the kernel (a suite runs on three nodes while another runs on
# one). Instance 0 has the names and addresses below; instance K > 0 its own folder
# (/var/lib/cni-guard-cluster-K unless CNI_GUARD_CLUSTER_DIR says), network namespaces and
# cgroups (cgiK-k8s, cgiK-k8s-I), host links (cgiK-host, cgiK-hostI, cgiK-br), logs kept in
# /tmp/cni-guard-cluster-logs-K and host subnet 10.77.(100+K).0/24, with the bridge primary only.
# The kernel settings kubelet changes are saved once for every instance and put back by each
# (save_sysctls).
INSTANCE=${CLUSTER_INSTANCE:-0}
[[ $INSTANCE =~ ^[0-9]$ ]] || { echo "cluster: CLUSTER_INSTANCE is 0 to 9, not $INSTANCE" >&2; exit 2; }
if [ "$INSTANCE" = 0 ]; then
  CLUSTER_DIR=${CNI_GUARD_CLUSTER_DIR:-/var/lib/cni-guard-cluster}
  NS_NAME=cni-guard-k8s LINK_NAME=cgk8s NET3=0 LOGS_KEPT=/tmp/cni-guard-cluster-logs
else
  CLUSTER_DIR=${CNI_GUARD_CLUSTER_DIR:-/var/lib/cni-guard-cluster-$INSTANCE}
  NS_NAME=cgi$INSTANCE-k8s LINK_NAME=cgi$INSTANCE NET3=$((100 + INSTANCE))
  LOGS_KEPT=/tmp/cni-guard-cluster-logs-$INSTANCE
fi
# The node's private file system folders, as every node's daemons see them. Node 1 (with the
# control plane in its network namespace) has them there on the host too; node I > 1 has them
# in $CLUSTER_DIR/nodeI on the host, bind-mounted at $NODE in a mount namespace of its own
# (select_node), so that one manifest's hostPaths, one containerd config and one kubelet config
# serve every node. $NODE_HOST is where the host finds the selected node's.
NODE=$CLUSTER_DIR/node
HOST_IP=10.77.$NET3.1
CP_IP=10.77.$NET3.2 # the control plane's address: node 1's
SERVICE_CIDR=10.96.0.0/16
API_SERVICE_IP=10.96.0.1 # the `kubernetes` Service; DNAT to the API server (no kube-proxy)
CLUSTER_POD_SUBNET=10.88.0.0/16 # every node's pods (05-cilium.conflist: bridge cni-guard0 + host-local)
NET1_SUBNET=10.99.0.0/24 # the NetworkAttachmentDefinition (macvlan on net1-parent)
BRIDGE=$LINK_NAME-br # with several nodes: the host's bridge between them (at $HOST_IP)
# CLUSTER_NODES=N: `up` brings up N nodes (default 1), each a network namespace, a mount
# namespace (I > 1), a containerd and a kubelet of its own; the control plane runs once, in node
# 1's namespace. The other commands take the count of the cluster there ($CLUSTER_DIR/nodes).
# (A record that is missing or garbled, from an `up` killed early, counts as 1: `down` walks
# every node there may be anyway.)
if [ "${1:-}" = up ]; then
  NODES=${CLUSTER_NODES:-1}
  [[ $NODES =~ ^[1-9]$ ]] || { echo "cluster: CLUSTER_NODES is 1 to 9, not $NODES" >&2; exit 2; }
else
  NODES=$(cat "$CLUSTER_DIR/nodes" 2>/dev/null || true)
  [[ $NODES =~ ^[1-9]$ ]] || NODES=1
fi
# select_node I: the variables of node I. Node 1 keeps the names of the one-node cluster.
#   NODE_HOST   its folders on the host          NETNS, NETNS_PATH  its network namespace
#   NODE_IP     its address (eth0)               NODE_NAME          its Kubernetes name
#   VETH_HOST   the host end of its eth0         CGROUP             kubelet's cgroupRoot; its
#   NODE_TAG    "" or "nodeI/": its logs/ and pids/ sub-folder         daemons in $CGROUP/daemons
#   POD_SUBNET  its pods' addresses (the bridge stand-in's host-local range)
select_node() {
  NODE_INDEX=$1
  if [ "$1" = 1 ]; then
    NODE_HOST=$NODE NETNS=$NS_NAME VETH_HOST=$LINK_NAME-host NODE_NAME=cni-guard-node
    CGROUP=$NS_NAME NODE_TAG=
  else
    NODE_HOST=$CLUSTER_DIR/node$1 NETNS=$NS_NAME-$1 VETH_HOST=$LINK_NAME-host$1
    NODE_NAME=cni-guard-node$1 CGROUP=$NS_NAME-$1 NODE_TAG=node$1/
  fi
  NETNS_PATH=/run/netns/$NETNS
  NODE_IP=10.77.$NET3.$(($1 + 1))
  if [ "$NODES" = 1 ]; then POD_SUBNET=$CLUSTER_POD_SUBNET; else POD_SUBNET=10.88.$1.0/24; fi
  GUARD_SYSLOG=$NODE/run/cni-guard-syslog.sock
  CILIUM_BPFFS=$NODE/sys/fs/bpf
}
# The node that containerd-restart and reboot act on; every other command starts from node 1.
case "${1:-}" in
  containerd-restart | reboot)
    if ! [[ ${CLUSTER_NODE_INDEX:-1} =~ ^[1-9]$ ]] || [ "${CLUSTER_NODE_INDEX:-1}" -gt "$NODES" ]; then
      echo "cluster: CLUSTER_NODE_INDEX is 1 to $NODES, not $CLUSTER_NODE_INDEX" >&2
      exit 2
    fi
    select_node "${CLUSTER_NODE_INDEX:-1}" ;;
  *) select_node 1 ;;
esac
TIMEOUT=${CLUSTER_TIMEOUT:-180}
# The seed's layout (default), or the one before its fix: Cilium's 05-cilium.conflist in the
# conf dir containerd reads, and Multus's multusAutoconfigDir that same folder (no guard then).
LAYOUT=${CLUSTER_LAYOUT:-seed}
case "$LAYOUT" in
  seed) AUTOCONFIG_DIR=/etc/cni/multus/net.d ;;
  before-fix) AUTOCONFIG_DIR=/host/etc/cni/net.d ;;
  *) echo "cluster: CLUSTER_LAYOUT is seed or before-fix, not $LAYOUT" >&2; exit 2 ;;
esac
# The guard: on by default in the seed's layout, off by default before the fix (the incident
# itself); CLUSTER_GUARD=1 with before-fix puts it in front there too, its attachment then being
# 05-cilium.conflist in the conf dir (conformance/k8s/churn.sh).
if [ "$LAYOUT" = before-fix ]; then GUARD=${CLUSTER_GUARD:-0}; else GUARD=${CLUSTER_GUARD:-1}; fi
# Multus's multusMasterCNI: empty is auto (the first .conf/.conflist of the autoconfig dir not
# named 00-multus*). With the guard in the autoconfig dir (before-fix) that first file is
# 00-cni-guard.conflist, so there it is pinned to 05-cilium.conflist, as the guide says.
# CLUSTER_MULTUS_MASTER=auto keeps auto anyway (to see what the guard says of that).
if [ "$LAYOUT" = before-fix ] && [ "$GUARD" = 1 ]; then MASTER_CNI=05-cilium.conflist; else MASTER_CNI=; fi
case "${CLUSTER_MULTUS_MASTER:-}" in
  "") ;;
  auto) MASTER_CNI= ;;
  *) MASTER_CNI=$CLUSTER_MULTUS_MASTER ;;
esac
PRIMARY=${CLUSTER_PRIMARY:-bridge}
case "$PRIMARY" in
  bridge | cilium | daemonset) ;;
  *) echo "cluster: CLUSTER_PRIMARY is bridge, cilium or daemonset, not $PRIMARY" >&2; exit 2 ;;
esac
NODE_KIND=${CLUSTER_NODE:-netns}
case "$NODE_KIND" in
  netns | none) ;;
  *) echo "cluster: CLUSTER_NODE is netns or none, not $NODE_KIND" >&2; exit 2 ;;
esac
CILIUM_EXCLUSIVE=${CLUSTER_CILIUM_EXCLUSIVE:-false}
case "$CILIUM_EXCLUSIVE" in
  true | false) ;;
  *) echo "cluster: CLUSTER_CILIUM_EXCLUSIVE is true or false, not $CILIUM_EXCLUSIVE" >&2; exit 2 ;;
esac
# The agent's state dir and API socket: /var/run/cilium, the host's /run/cilium, as on a real
# node. That is where the agent also puts its pid file and its monitor and shell sockets,
# whatever --state-dir says, and where cilium-cni looks for the agent's socket and writes its
# log and its queue of deletions; cilium-cni runs there twice: in Multus's container (the folder
# mounted at that path) and, in the layout before the seed's fix, run by containerd itself on
# the host (a private folder of the node's was no agent to it: every such ADD failed after 30 s,
# so the incident could not happen here). `up` makes it, marked as this node's ($CILIUM_RUN_MARK:
# one of the host's own is never touched), a reboot empties it, `down` removes it. bpffs stays
# below the node's folder.
CILIUM_RUN=/run/cilium
CILIUM_RUN_MARK=$CILIUM_RUN/.cni-guard-cluster-node
CILIUM_SOCK=$CILIUM_RUN/cilium.sock
KUBECONFIG_ADMIN=$CLUSTER_DIR/admin.kubeconfig
# LOGS_KEPT (above): the logs of the last failed `up` / last `down`
DAEMONS=(etcd kube-apiserver kube-controller-manager kube-scheduler guard-syslog containerd kubelet)
# The guard's syslog on this node (there is no /dev/log here): containerd hands CNI_GUARD_SYSLOG
# to every plugin it runs, and guard-syslog writes each datagram the guard sends as one line of
# logs/guard-syslog.log ("<14>cni-guard[PID]: verb=ADD ... decision=refused code=11 ...").
# libcni drops a failing plugin's stderr, so without it a refusal leaves no line of the guard's.
# Its socket is $GUARD_SYSLOG (select_node).
GUARD_SYSLOG_SINK='
import os, socket, sys
path = sys.argv[1]
if os.path.exists(path):
    os.unlink(path)
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
s.bind(path)
while True:
    line = s.recv(65536).decode(errors="replace").rstrip("\n").replace("\n", " ")
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
'
SANDBOX_IMAGE=localhost/cni-guard-test/sandbox:1
TEST_IMAGE=localhost/cni-guard-test/busybox:1
GUARD_IMAGE=localhost/cni-guard:dev
MULTUS_IMAGE=localhost/cni-guard-test/multus:$MULTUS_VERSION
# The kernel settings kubelet changes at start (not per namespace): saved by `up`, put back as
# soon as kubelet has started and again by `down`. kernel.panic_on_oops=1 and kernel.panic=10
# would reboot a shared test machine on an oops.
SYSCTLS=(vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops
  kernel.keys.root_maxkeys kernel.keys.root_maxbytes)

say() { echo "cluster: $*" >&2; }
die() { say "$*"; exit 1; }
kubectl() { "$KUBERNETES_BIN/kubectl" --kubeconfig "$KUBECONFIG_ADMIN" "$@"; }
# NS_ARGS: nsenter's arguments for the selected node's namespaces (network; for node I > 1 also
# its mount and UTS namespaces, held by its node-ns process: start_node_ns).
set_ns_args() {
  NS_ARGS=(--net="$NETNS_PATH")
  [ "$NODE_INDEX" != 1 ] || return 0
  local h
  h=$(pid_of node-ns)
  [ -n "$h" ] || die "$NODE_NAME: the process holding its mount namespace (node-ns) does not run"
  NS_ARGS+=(--mount="/proc/$h/ns/mnt" --uts="/proc/$h/ns/uts")
}
in_node() { set_ns_args; nsenter "${NS_ARGS[@]}" -- "$@"; }
# A path as the selected node sees it ($NODE/...) -> where the host finds it.
host_path() { echo "$NODE_HOST${1#"$NODE"}"; }
crictl() {
  local c=$CLUSTER_DIR/${NODE_TAG%/}${NODE_TAG:+-}crictl.yaml
  [ -f "$c" ] || printf 'runtime-endpoint: unix://%s\ntimeout: 20\n' \
    "$NODE_HOST/run/containerd/containerd.sock" >"$c"
  "$CRICTL_BIN/crictl" --config "$c" "$@"
}
# ctr warns on every call that cgroup v1 is deprecated; that line is dropped.
ctr() {
  "$CONTAINERD2_BIN/ctr" --address "$NODE_HOST/run/containerd/containerd.sock" "$@" 2> >(grep -v 'DEPRECATION: The support for cgroup v1' >&2)
}

# wait_for WHAT COMMAND...: runs COMMAND every second until it succeeds, at most $TIMEOUT s.
wait_for() {
  local what=$1 i
  shift
  for ((i = 0; i < TIMEOUT; i++)); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 1
  done
  say "timed out after ${TIMEOUT}s waiting for $what"
  return 1
}

# The run a cluster belongs to: CLUSTER_OWNER_PID (scripts/test.d/35-kubernetes.sh exports its
# own), by default the process that called `up`. Recorded as "PID STARTTIME" (its start time in
# clock ticks since boot: a reused pid does not match).
OWNER_FILE=$CLUSTER_DIR/owner
process_id() { # PID -> "PID STARTTIME", or nothing for no such process
  local s
  s=$(sed -E 's/^.*\) //' "/proc/$1/stat" 2>/dev/null) || return 0
  echo "$1 $(cut -d' ' -f20 <<<"$s")"
}
owner_alive() {
  local rec
  rec=$(cat "$OWNER_FILE" 2>/dev/null) || return 1
  [ -n "$rec" ] && [ "$(process_id "${rec%% *}")" = "$rec" ]
}

pid_of() { # NAME -> the pid of a running daemon this script started (on the selected node), or nothing
  local f=$CLUSTER_DIR/pids/$NODE_TAG$1.pid p
  [ -f "$f" ] || return 0
  p=$(cat "$f")
  # The pid file is ours; the process must still be the one we started (same binary).
  if [ -d "/proc/$p" ] && grep -qF "$CLUSTER_DIR" "/proc/$p/cmdline" 2>/dev/null; then echo "$p"; fi
}

# --- processes ---------------------------------------------------------------------------------
# start NAME COMMAND...: runs COMMAND in the selected node's namespaces (set_ns_args), in its own
# session, in the cgroup $CGROUP/daemons (so that `down` finds it and everything it forks: shims,
# containers), stdout and stderr to logs/${NODE_TAG}NAME.log.
start() {
  local name=$1 pid log=$CLUSTER_DIR/logs/$NODE_TAG$1.log
  shift
  say "starting $name${NODE_TAG:+ on $NODE_NAME}"
  set_ns_args
  mkdir -p "$CLUSTER_DIR/logs/$NODE_TAG" "$CLUSTER_DIR/pids/$NODE_TAG"
  # setsid and nsenter exec in place: $! is the daemon's pid. Descriptor 9 (a caller's
  # lock, as in scripts/test.d/35-kubernetes.sh) is not handed down.
  # shellcheck disable=SC2016 # $$ and $@ are the inner shell's
  setsid nsenter "${NS_ARGS[@]}" -- /bin/sh -c '
    for c in /sys/fs/cgroup/*/'"$CGROUP"'/daemons; do echo $$ >"$c/cgroup.procs" || exit 1; done
    exec "$@"' "$name" "$@" </dev/null >>"$log" 2>&1 9>&- &
  pid=$!
  echo "$pid" >"$CLUSTER_DIR/pids/$NODE_TAG$name.pid"
  sleep 0.2
  [ -d "/proc/$pid" ] || { tail -n 20 "$log" >&2; die "$name exited at once"; }
}

# Node I > 1: the process that holds its mount and UTS namespaces. There $NODE is the host's
# $NODE_HOST, bind-mounted in the same peer group (made shared here): what the node's containerd
# and kubelet mount below it (network namespaces, pod volumes) shows on the host, and what the
# host unmounts there (a reboot) goes in the node too; $CLUSTER_DIR itself is a slave there, so
# that bind does not reach the host. /etc/machine-id (a bind of the node's own) and the hostname
# are the node's. In the node's network namespace and its daemons' cgroup: down's kill takes it,
# and its namespaces go with it.
start_node_ns() {
  [ "$NODE_INDEX" != 1 ] || return 0
  # A peer group of its own (a bind inside the shared $CLUSTER_DIR would join $CLUSTER_DIR's).
  mountpoint -q "$NODE_HOST" || mount --bind "$NODE_HOST" "$NODE_HOST"
  mount --make-private "$NODE_HOST"
  mount --make-shared "$NODE_HOST"
  mkdir -p "$NODE_HOST/etc" "$CLUSTER_DIR/logs/$NODE_TAG" "$CLUSTER_DIR/pids/$NODE_TAG"
  [ -s "$NODE_HOST/etc/machine-id" ] || { od -An -N16 -tx1 /dev/urandom | tr -d ' \n'; echo; } >"$NODE_HOST/etc/machine-id"
  rm -f "$NODE_HOST/.node-ns-ready"
  say "starting node-ns ($NODE_NAME's mount namespace)"
  # shellcheck disable=SC2016 # the inner shell's arguments
  setsid nsenter --net="$NETNS_PATH" -- unshare --mount --uts --propagation unchanged -- /bin/sh -c '
    set -e
    for c in /sys/fs/cgroup/*/"$5"/daemons; do echo $$ >"$c/cgroup.procs"; done
    mount --make-slave "$1"
    mount --bind "$2" "$3"
    if [ -e /etc/machine-id ]; then
      mount --make-slave "$(findmnt -no TARGET -T /etc/machine-id)"
      mount --bind "$3/etc/machine-id" /etc/machine-id
    fi
    hostname "$4"
    touch "$3/.node-ns-ready"
    while :; do sleep 3600; done' node-ns "$CLUSTER_DIR" "$NODE_HOST" "$NODE" "$NODE_NAME" "$CGROUP" \
    </dev/null >>"$CLUSTER_DIR/logs/${NODE_TAG}node-ns.log" 2>&1 9>&- &
  local holder=$!
  echo "$holder" >"$CLUSTER_DIR/pids/${NODE_TAG}node-ns.pid"
  # shellcheck disable=SC2016 # the inner shell's arguments
  wait_for "$NODE_NAME's mount namespace (logs/${NODE_TAG}node-ns.log)" \
    sh -c 'test -e "$1" || ! kill -0 "$2"' - "$NODE_HOST/.node-ns-ready" "$holder"
  [ -e "$NODE_HOST/.node-ns-ready" ] ||
    { tail -n 20 "$CLUSTER_DIR/logs/${NODE_TAG}node-ns.log" >&2; die "$NODE_NAME's node-ns exited"; }
}

# stop NAME [SECONDS]: SIGTERM, then SIGKILL after SECONDS (default 10).
stop() {
  local name=$1 grace=${2:-10} pid i
  pid=$(pid_of "$name")
  [ -n "$pid" ] || return 0
  say "stopping $name (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < grace * 10; i++)); do
    [ -d "/proc/$pid" ] || break
    sleep 0.1
  done
  if [ -d "/proc/$pid" ]; then
    say "$name did not stop in ${grace}s: SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$CLUSTER_DIR/pids/$NODE_TAG$name.pid"
}

# Every process in the node's cgroups (daemons, shims, pods' processes).
cgroup_pids() {
  # (None at all is no error: `down` on a machine without the node.)
  { find /sys/fs/cgroup/*/"$CGROUP" -name cgroup.procs -exec cat {} + 2>/dev/null || true; } | sort -un
}

kill_cgroup() {
  local i pids
  for ((i = 0; i < 50; i++)); do
    pids=$(cgroup_pids)
    [ -n "$pids" ] || return 0
    # shellcheck disable=SC2086 # one pid a word
    kill -KILL $pids 2>/dev/null || true
    sleep 0.2
  done
  say "processes left in the $CGROUP cgroups: $(cgroup_pids | tr '\n' ' ')"
}

make_cgroups() {
  local h
  for h in /sys/fs/cgroup/*/; do
    h=${h%/}
    [ "$(basename "$h")" = unified ] && continue
    mkdir -p "$h/$CGROUP/daemons"
    if [ -f "$h/cpuset.cpus" ]; then # a new cpuset holds no cpu until given one
      cat "$h/cpuset.cpus" >"$h/$CGROUP/cpuset.cpus"
      cat "$h/cpuset.mems" >"$h/$CGROUP/cpuset.mems"
      cat "$h/cpuset.cpus" >"$h/$CGROUP/daemons/cpuset.cpus"
      cat "$h/cpuset.mems" >"$h/$CGROUP/daemons/cpuset.mems"
    fi
  done
}

remove_cgroups() {
  local d
  # Deepest first; a cgroup that still holds a process stays (and is reported).
  while read -r d; do
    rmdir "$d" 2>/dev/null || say "cannot remove cgroup $d"
  done < <(find /sys/fs/cgroup/*/"$CGROUP" -depth -type d 2>/dev/null)
}

# --- mounts ------------------------------------------------------------------------------------
# Every mount point at or below $CLUSTER_DIR, deepest first (mountinfo escapes spaces as \040).
mounts_below() {
  awk -v d="$CLUSTER_DIR" '$5 == d || index($5, d "/") == 1 { print $5 }' /proc/self/mountinfo |
    awk '{ print length($0) " " $0 }' | sort -rn | cut -d' ' -f2-
}

unmount_all() {
  local m i
  for ((i = 0; i < 5; i++)); do
    [ -n "$(mounts_below)" ] || return 0
    while read -r m; do
      [ -n "$m" ] || continue
      umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
    done < <(mounts_below)
  done
  [ -z "$(mounts_below)" ] || say "mounts left below $CLUSTER_DIR: $(mounts_below | tr '\n' ' ')"
}

# --- network -----------------------------------------------------------------------------------
# The selected node's network namespace, its eth0 at $NODE_IP (to the host; with several nodes
# through the host's bridge $BRIDGE, which make_bridge made) and, for node I > 1, its mount
# namespace (start_node_ns).
make_bridge() {
  ip link add "$BRIDGE" type bridge
  ip addr add "$HOST_IP/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  # With br_netfilter the bridged frames cross the host's FORWARD chain, which may drop them.
  iptables -I FORWARD -i "$BRIDGE" -o "$BRIDGE" -j ACCEPT
}
make_network() {
  ip netns add "$NETNS"
  ip link add "$VETH_HOST" type veth peer name eth0 netns "$NETNS"
  if [ "$NODES" = 1 ]; then
    ip addr add "$HOST_IP/24" dev "$VETH_HOST"
  else
    ip link set "$VETH_HOST" master "$BRIDGE"
  fi
  ip link set "$VETH_HOST" up
  start_node_ns
  in_node ip link set lo up
  in_node ip addr add "$NODE_IP/24" dev eth0
  in_node ip link set eth0 up
  in_node ip route add default via "$HOST_IP"
  # The parent of the secondary network's macvlan links: one end of a veth pair inside the node
  # (this kernel has no dummy links: CONFIG_DUMMY is not set), so no traffic leaves the node.
  in_node ip link add net1-parent type veth peer name net1-peer
  in_node ip link set net1-parent up
  in_node ip link set net1-peer up
  # No kube-proxy: the `kubernetes` Service address leads to the API server, from pods (through
  # the bridge: PREROUTING) and from host-network pods and the node itself (OUTPUT).
  in_node iptables -t nat -A PREROUTING -d "$API_SERVICE_IP/32" -p tcp --dport 443 \
    -j DNAT --to-destination "$CP_IP:6443"
  in_node iptables -t nat -A OUTPUT -d "$API_SERVICE_IP/32" -p tcp --dport 443 \
    -j DNAT --to-destination "$CP_IP:6443"
  in_node sysctl -qw net.ipv4.ip_forward=1
  # Several nodes: the other nodes' pods through their node (native routing, as Cilium's).
  local j
  for ((j = 1; j <= NODES; j++)); do
    [ "$NODES" = 1 ] || [ "$j" = "$NODE_INDEX" ] || in_node ip route add "10.88.$j.0/24" via "10.77.$NET3.$((j + 1))"
  done
}

remove_network() {
  if [ -e "$NETNS_PATH" ]; then
    ip netns del "$NETNS" 2>/dev/null || { umount "$NETNS_PATH" 2>/dev/null; rm -f "$NETNS_PATH"; }
  fi
  # The host end goes with its peer; remove it if the namespace went some other way.
  if ip link show "$VETH_HOST" >/dev/null 2>&1; then ip link del "$VETH_HOST" || true; fi
}
remove_bridge() { # (the host's iptables touched only where a bridge was made)
  ip link show "$BRIDGE" >/dev/null 2>&1 || return 0
  ip link del "$BRIDGE" || true
  while iptables -D FORWARD -i "$BRIDGE" -o "$BRIDGE" -j ACCEPT 2>/dev/null; do :; done
}

# --- certificates and kubeconfigs --------------------------------------------------------------
# cert NAME CN [O] [SANS]: a key and a certificate signed by the cluster CA, in pki/.
cert() {
  local name=$1 cn=$2 o=${3:-} sans=${4:-} subj ext
  subj="/CN=$cn"
  [ -n "$o" ] && subj="/O=$o$subj"
  ext=$CLUSTER_DIR/pki/$name.ext
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    if [ -n "$sans" ]; then
      echo "extendedKeyUsage=serverAuth,clientAuth"
      echo "subjectAltName=$sans"
    else
      echo "extendedKeyUsage=clientAuth"
    fi
  } >"$ext"
  openssl req -new -newkey rsa:2048 -nodes -keyout "$CLUSTER_DIR/pki/$name.key" \
    -subj "$subj" -out "$CLUSTER_DIR/pki/$name.csr" 2>/dev/null
  openssl x509 -req -in "$CLUSTER_DIR/pki/$name.csr" -CA "$CLUSTER_DIR/pki/ca.crt" \
    -CAkey "$CLUSTER_DIR/pki/ca.key" -CAcreateserial -days 30 -sha256 -extfile "$ext" \
    -out "$CLUSTER_DIR/pki/$name.crt" 2>/dev/null
  rm -f "$CLUSTER_DIR/pki/$name.csr" "$ext"
}

kubeconfig() { # NAME USER: kubeconfigs/NAME for the client certificate pki/USER.*
  local out=$CLUSTER_DIR/$1.kubeconfig p=$CLUSTER_DIR/pki
  cat >"$out" <<EOF
apiVersion: v1
kind: Config
clusters:
  - name: cni-guard-k8s
    cluster:
      server: https://$CP_IP:6443
      certificate-authority: $p/ca.crt
users:
  - name: $2
    user:
      client-certificate: $p/$2.crt
      client-key: $p/$2.key
contexts:
  - name: cni-guard-k8s
    context: {cluster: cni-guard-k8s, user: $2}
current-context: cni-guard-k8s
EOF
}

make_pki() {
  local p=$CLUSTER_DIR/pki
  mkdir -p "$p"
  openssl req -x509 -newkey rsa:2048 -nodes -keyout "$p/ca.key" -out "$p/ca.crt" -days 30 \
    -subj "/CN=cni-guard-cluster-ca" -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" 2>/dev/null
  cert apiserver kube-apiserver "" "IP:127.0.0.1,IP:$CP_IP,IP:$API_SERVICE_IP,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
  cert admin admin system:masters
  cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters
  cert controller-manager system:kube-controller-manager
  cert scheduler system:kube-scheduler
  local i
  for ((i = 1; i <= NODES; i++)); do
    select_node "$i"
    cert "kubelet$(kubelet_id)" "system:node:$NODE_NAME" system:nodes
    cert "kubelet-serving$(kubelet_id)" "$NODE_NAME" "" "IP:$NODE_IP,DNS:$NODE_NAME"
    kubeconfig "kubelet$(kubelet_id)" "kubelet$(kubelet_id)"
  done
  select_node 1
  openssl genrsa -out "$p/sa.key" 2048 2>/dev/null
  openssl rsa -in "$p/sa.key" -pubout -out "$p/sa.pub" 2>/dev/null
  chmod 600 "$p"/*.key
  kubeconfig admin admin
  kubeconfig controller-manager controller-manager
  kubeconfig scheduler scheduler
}
kubelet_id() { [ "$NODE_INDEX" = 1 ] || echo "$NODE_INDEX"; } # the suffix of its pki and kubeconfig

# --- images ------------------------------------------------------------------------------------
# oci_image NAME ROOTFS ENTRYPOINT_JSON OUT: a one-layer OCI layout tarball, in the format of
# scripts/build-image.sh (index.json annotated io.containerd.image.name).
oci_image() {
  local name=$1 rootfs=$2 entrypoint=$3 out=$4 work layer_sum layer_size cfg_sum cfg_size m_sum m_size
  work=$(mktemp -d "$CLUSTER_DIR/tmp/image.XXXXXX")
  mkdir -p "$work/layout/blobs/sha256"
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$rootfs" -cf "$work/layer.tar" .
  blob() {
    local sum
    sum=$(sha256sum "$1" | cut -d' ' -f1)
    cp "$1" "$work/layout/blobs/sha256/$sum"
    echo "$sum $(stat -c %s "$1")"
  }
  read -r layer_sum layer_size < <(blob "$work/layer.tar")
  printf '{"architecture":"%s","os":"linux","config":{"Entrypoint":%s,"Env":["PATH=/bin:/usr/src/multus-cni/bin"]},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
    "$(dpkg --print-architecture)" "$entrypoint" "$layer_sum" >"$work/config.json"
  read -r cfg_sum cfg_size < <(blob "$work/config.json")
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:%s","size":%s}]}' \
    "$cfg_sum" "$cfg_size" "$layer_sum" "$layer_size" >"$work/manifest.json"
  read -r m_sum m_size < <(blob "$work/manifest.json")
  printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
    "$m_sum" "$m_size" "$name" "${name##*:}" >"$work/layout/index.json"
  echo '{"imageLayoutVersion":"1.0.0"}' >"$work/layout/oci-layout"
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$work/layout" -cf "$out" \
    oci-layout index.json blobs
  rm -rf "$work"
}

busybox_root() { # DIR: static busybox at /bin/busybox with every applet linked in /bin
  mkdir -p "$1/bin" "$1/tmp" "$1/etc"
  cp /bin/busybox "$1/bin/busybox"
  # multus-daemon refuses to start unless user.Current() says uid 0, which without cgo reads
  # /etc/passwd (it dereferences a nil user when the file is missing).
  echo 'root:x:0:0:root:/root:/bin/sh' >"$1/etc/passwd"
  echo 'root:x:0:' >"$1/etc/group"
  local a
  for a in $(/bin/busybox --list); do [ -e "$1/bin/$a" ] || ln -s busybox "$1/bin/$a"; done
}

make_images() {
  local img=$CLUSTER_DIR/images root
  mkdir -p "$img" "$CLUSTER_DIR/tmp"
  bash scripts/build-image.sh sandbox "$img/sandbox.tar" "$SANDBOX_IMAGE" >/dev/null
  bash scripts/build-image.sh guard "$img/guard.tar" "$GUARD_BIN" "$GUARD_IMAGE" >/dev/null
  root=$CLUSTER_DIR/tmp/busybox-root
  busybox_root "$root"
  oci_image "$TEST_IMAGE" "$root" '["/bin/sh"]' "$img/busybox.tar"
  # The Multus image: its two binaries where upstream's image has them, and busybox (cp for the
  # init container that installs multus-shim).
  mkdir -p "$root/usr/src/multus-cni/bin"
  cp "$MULTUS_BIN/multus-daemon" "$MULTUS_BIN/multus-shim" "$root/usr/src/multus-cni/bin/"
  oci_image "$MULTUS_IMAGE" "$root" '["/usr/src/multus-cni/bin/multus-daemon"]' "$img/multus.tar"
  rm -rf "$root"
}

import_images() {
  local t
  for t in "$CLUSTER_DIR"/images/*.tar; do
    ctr -n k8s.io images import "$t" >/dev/null
  done
  say "images: $(ctr -n k8s.io images ls -q | grep -v '^sha256:' | tr '\n' ' ')"
}

# --- configuration files -----------------------------------------------------------------------
# The selected node's (written where the host finds them, naming the paths the node sees).
write_configs() {
  mkdir -p "$NODE_HOST/etc/containerd" "$NODE_HOST/etc/kubernetes"
  cat >"$NODE_HOST/etc/containerd/config.toml" <<EOF
# containerd $CONTAINERD2_VERSION for the node of scripts/cluster.sh: nothing shared with the host's.
version = 3
root = "$NODE/var/lib/containerd"
state = "$NODE/run/containerd"
imports = []
disabled_plugins = [
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.erofs",
  "io.containerd.nri.v1.nri",
]
[grpc]
  address = "$NODE/run/containerd/containerd.sock"
[ttrpc]
  address = "$NODE/run/containerd/containerd.sock.ttrpc"
[plugins]
  [plugins.'io.containerd.internal.v1.opt']
    path = "$NODE/opt/containerd"
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = "overlayfs"
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = "$SANDBOX_IMAGE"
  [plugins.'io.containerd.cri.v1.runtime']
    enable_selinux = false
    disable_apparmor = true
    netns_mounts_under_state_dir = true
    # This machine gives root no CAP_SYS_RESOURCE (CapEff 000001fffeffffff: bit 24 is off), so
    # nothing may lower an oom_score_adj; kubelet asks -998 for sandboxes, and runc then fails
    # ("nsexec: failed to update /proc/self/oom_score_adj: Permission denied"). Clamp instead.
    restrict_oom_score_adj = true
    cdi_spec_dirs = []
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "$DEBIAN_RUNC"
        Root = "$NODE/run/runc"
        SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ["$NODE/opt/cni/bin"]
      conf_dir = "$NODE/etc/cni/net.d"
      max_conf_num = 1
  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
EOF
  cat >"$NODE_HOST/etc/kubernetes/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://$NODE/run/containerd/containerd.sock
cgroupDriver: cgroupfs
cgroupRoot: /$CGROUP
failSwapOn: false
failCgroupV1: false
address: $NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: $CLUSTER_DIR/pki/kubelet-serving$(kubelet_id).crt
tlsPrivateKeyFile: $CLUSTER_DIR/pki/kubelet-serving$(kubelet_id).key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $CLUSTER_DIR/pki/ca.crt}
authorization: {mode: Webhook}
podLogsDir: $NODE/var/log/pods
resolvConf: /etc/resolv.conf
staticPodPath: ""
# A test machine shared with other builds: evict only when it is really full.
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
# No image can be pulled here: every image is imported.
serializeImagePulls: true
EOF
  # The primary network, standing in for Cilium's 05-cilium.conflist. Nothing in it needs
  # iptables (no ipMasq, no portmap): Multus runs it inside its own image, which has none.
  # Known and left as it is: Multus v4.3.0 caches this delegate for DEL re-marshalled from its
  # own struct, which keeps only cniVersion, name and each plugin's type and ipam.type, so every
  # DEL fails in host-local ("plugin type="bridge" failed (delete): no IP ranges specified",
  # with "ranges" or "subnet", cniVersion 1.0.0 or 0.4.0) and the pod's lease stays on disk.
  cat >"$(primary_src)" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "cilium",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni-guard0",
      "isGateway": true,
      "ipam": {
        "type": "host-local",
        "subnet": "$POD_SUBNET",
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": "$NODE/var/lib/cni/networks"
      }
    }
  ]
}
EOF
}

# The bridge stand-in's 05-cilium.conflist of the selected node (its pods' range), as written
# (write_configs), to be copied into the primary's folder (up, a reboot's stand-in agent); the
# host's path, which the node's processes see too.
primary_src() { if [ "$NODE_INDEX" = 1 ]; then echo "$CLUSTER_DIR/05-cilium.conflist"; else echo "$NODE_HOST/05-cilium.conflist"; fi; }

# The agent's folder as Multus's container mounts it: the host's /run/cilium with the real
# Cilium; with the bridge stand-in a folder of the node's (nothing on the host is made for it).
cilium_run_of_node() {
  if [ "$(cat "$CLUSTER_DIR/primary" 2>/dev/null || echo "$PRIMARY")" = cilium ]; then echo "$CILIUM_RUN"
  else echo "$NODE/run/cilium"; fi
}

# Fills the @...@ placeholders of a manifest in conformance/k8s/manifests.
# One left unfilled (a placeholder added to a manifest but not here) fails, naming it.
manifest() {
  local out
  out=$(sed -e "s|@NODE@|$NODE|g" -e "s|@MULTUS_IMAGE@|$MULTUS_IMAGE|g" \
    -e "s|@TEST_IMAGE@|$TEST_IMAGE|g" -e "s|@NET1_SUBNET@|$NET1_SUBNET|g" \
    -e "s|@AUTOCONFIG_DIR@|$AUTOCONFIG_DIR|g" -e "s|@MASTER_CNI@|$MASTER_CNI|g" \
    -e "s|@GUARD_IMAGE@|$GUARD_IMAGE|g" -e "s|@CILIUM_RUN@|$(cilium_run_of_node)|g" \
    -e "s|@PRIMARY_CONF_DIR@|${CLUSTER_PRIMARY_CONF_DIR:-/host$(primary_conf_dir | sed "s#^$NODE##")}|g" \
    -e "s|@PRIMARY_UNINSTALL@|${CLUSTER_PRIMARY_UNINSTALL:-true}|g" \
    "$REPO/conformance/k8s/manifests/$1")
  ! grep -qE '@[A-Z_]+@' <<<"$out" ||
    die "manifest $1: placeholders left unfilled: $(grep -oE '@[A-Z_]+@' <<<"$out" | sort -u | tr '\n' ' ')"
  printf '%s\n' "$out"
}

# deploy/multus-cilium as it is, rendered with the node's folders for the host's: every
# /etc/cni/..., /opt/cni/bin and /var/lib/cni/cni-guard (hostPaths, the conflist's paths, and the
# /host/... mount paths the probe reads with --host-root=/host) moves under $NODE; the image is
# the imported one.
guard_args() { # stdin -> stdout: $CLUSTER_GUARD_ARGS added after each --delegate= argument
  # (before guard_manifest moves the host paths under the node's folder)
  local a script=
  for a in ${CLUSTER_GUARD_ARGS:-}; do
    script+="s#^\\( *\\)- \\(--delegate=.*\\)#&\\n\\1- $a#;"
  done
  if [ -n "$script" ]; then sed -e "$script"; else cat; fi
}
# With CLUSTER_PRIMARY=cilium the guard also gets the agent's API socket as a `sockets`
# precondition (--socket on install and keep; its folder mounted read-only for keep's check):
# cilium-cni's ADD needs the agent, and the conflist the agent leaves behind when it stops says
# nothing about whether it runs.
guard_manifest() { # [KUSTOMIZATION: deploy/multus-cilium by default, or deploy/uninstall]
  local k=${1:-multus-cilium} kdir
  if [ "$PRIMARY" = cilium ] && [ "$k" = multus-cilium ]; then
    kdir=$CLUSTER_DIR/tmp/guard-cilium
    mkdir -p "$kdir"
    cat >"$kdir/kustomization.yaml" <<EOF
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - $(realpath --relative-to="$kdir" "$REPO/deploy/$k")
patches:
  - target: {kind: DaemonSet, name: cni-guard}
    patch: |-
      - {op: add, path: /spec/template/spec/initContainers/0/args/-, value: "--socket=$CILIUM_SOCK"}
      - {op: add, path: /spec/template/spec/containers/0/args/-, value: "--socket=$CILIUM_SOCK"}
      - op: add
        path: /spec/template/spec/containers/0/volumeMounts/-
        value: {name: cilium-run, mountPath: "/host$CILIUM_RUN", readOnly: true}
      - op: add
        path: /spec/template/spec/volumes/-
        value: {name: cilium-run, hostPath: {path: "$CILIUM_RUN", type: DirectoryOrCreate}}
EOF
  else
    kdir=$REPO/deploy/$k
  fi
  kubectl kustomize "$kdir" | guard_args | sed -e "s#/etc/cni/#$NODE/etc/cni/#g" \
    -e "s#/opt/cni/bin#$NODE/opt/cni/bin#g" -e "s#/var/lib/cni/cni-guard#$NODE/var/lib/cni/cni-guard#g" \
    -e "s#^\( *image:\) cni-guard:.*#\1 $GUARD_IMAGE#" |
    if [ -n "${CLUSTER_GUARD_WAIT:-}" ]; then
      sed -e "s#--wait-seconds=[0-9]*#--wait-seconds=$CLUSTER_GUARD_WAIT#"
    else cat; fi |
    if [ "$LAYOUT" = before-fix ]; then
      sed -e "s#--attachment=$NODE/etc/cni/multus/net.d/#--attachment=$NODE/etc/cni/net.d/#"
    else cat; fi
}

# --- the primary network ------------------------------------------------------------------------
# Where 05-cilium.conflist goes: the conf dir containerd reads without Multus or before the seed's
# fix, else Multus's autoconfig dir (the seed's cni.confPath). Recorded by `up` for later calls.
primary_conf_dir() {
  if [ -s "$CLUSTER_DIR/primary-conf-dir" ]; then
    cat "$CLUSTER_DIR/primary-conf-dir"
  elif [ "${CLUSTER_MULTUS:-1}" = 0 ] || [ "$LAYOUT" = before-fix ]; then
    echo "$NODE/etc/cni/net.d"
  else
    echo "$NODE/etc/cni/multus/net.d"
  fi
}

node_has_pod_cidr() { [ -n "$(kubectl get node "$NODE_NAME" -o jsonpath='{.spec.podCIDR}')" ]; }
cilium_sock_up() { curl -sf --unix-socket "$CILIUM_SOCK" http://localhost/v1/healthz >/dev/null; }

# The Cilium agent as a node process (see the header). Its flags are those of the seed's values
# that apply without the Helm chart (cni.exclusive false, cni.confPath Multus's autoconfig dir)
# and what this node needs: no kube-proxy replacement (socket LB would attach at the VM's
# cgroup-v2 root, shared with the host), no Envoy (--enable-l7-proxy=false), no operator (IPAM
# kubernetes), native routing on the one node, no health endpoint, no Hubble.
start_cilium() {
  local conf_dir
  conf_dir=$(primary_conf_dir)
  say "applying Cilium $CILIUM_VERSION's CRDs"
  kubectl apply --server-side -f "$CILIUM_LIB/crds/v2" -f "$CILIUM_LIB/crds/v2alpha1" >/dev/null
  wait_for "node $NODE_NAME's podCIDR (kube-controller-manager)" node_has_pod_cidr
  launch_cilium
  local t=$TIMEOUT
  TIMEOUT=${CLUSTER_CILIUM_TIMEOUT:-420}
  wait_for "the Cilium agent's API (logs/cilium-agent.log)" cilium_sock_up
  wait_for "Cilium's 05-cilium.conflist in $conf_dir" test -s "$conf_dir/05-cilium.conflist"
  TIMEOUT=$t
  say "Cilium agent up; $conf_dir/05-cilium.conflist written"
}
# The agent process alone, not waited for (a reboot starts it as kubelet would start its pod).
launch_cilium() {
  local conf_dir
  conf_dir=$(primary_conf_dir)
  if [ -e "$CILIUM_RUN" ] && [ ! -e "$CILIUM_RUN_MARK" ]; then
    die "$CILIUM_RUN is there and not this node's (another Cilium on the host?): not touched"
  fi
  mkdir -p "$CILIUM_BPFFS" "$CILIUM_RUN"
  echo "$CLUSTER_DIR" >"$CILIUM_RUN_MARK"
  mountpoint -q "$CILIUM_BPFFS" || mount -t bpf bpf "$CILIUM_BPFFS"
  # clang (-> clang-19) comes first in PATH: the agent compiles its datapath with `clang`.
  start cilium-agent env PATH="$CILIUM_BIN:$PATH" K8S_NODE_NAME="$NODE_NAME" \
    CILIUM_K8S_NAMESPACE=kube-system "$CILIUM_BIN/cilium-agent" \
    --k8s-kubeconfig-path="$KUBECONFIG_ADMIN" --k8s-namespace=kube-system \
    --state-dir="$CILIUM_RUN" --socket-path="$CILIUM_SOCK" --lib-dir="$CILIUM_LIB" \
    --bpf-root="$CILIUM_BPFFS" --cgroup-root=/sys/fs/cgroup/unified \
    --ipam=kubernetes --k8s-require-ipv4-pod-cidr=true --enable-ipv4=true --enable-ipv6=false \
    --routing-mode=native --ipv4-native-routing-cidr="$CLUSTER_POD_SUBNET" \
    --enable-ipv4-masquerade=false \
    --kube-proxy-replacement=false --enable-l7-proxy=false \
    --enable-health-checking=false --enable-endpoint-health-checking=false \
    --enable-hubble=false --agent-health-port=9879 \
    --write-cni-conf-when-ready="$conf_dir/05-cilium.conflist" \
    --cni-exclusive="$CILIUM_EXCLUSIVE"
}

# --- the node's own daemons (also started again by containerd-restart and reboot) ---------------
start_guard_syslog() {
  start guard-syslog python3 -c "$GUARD_SYSLOG_SINK" "$GUARD_SYSLOG"
  wait_for "the guard's syslog socket (logs/${NODE_TAG}guard-syslog.log)" test -S "$(host_path "$GUARD_SYSLOG")"
}
start_containerd() {
  start containerd env PATH="$CONTAINERD2_BIN:$PATH" CNI_GUARD_SYSLOG="$GUARD_SYSLOG" \
    "$CONTAINERD2_BIN/containerd" --config "$NODE/etc/containerd/config.toml"
  wait_for "containerd (logs/${NODE_TAG}containerd.log)" ctr version
}
start_kubelet() {
  start kubelet "$KUBERNETES_BIN/kubelet" --config="$NODE/etc/kubernetes/kubelet.yaml" \
    --kubeconfig="$CLUSTER_DIR/kubelet$(kubelet_id).kubeconfig" --root-dir="$NODE/var/lib/kubelet" \
    --cert-dir="$NODE/var/lib/kubelet/pki" --hostname-override="$NODE_NAME" \
    --node-ip="$NODE_IP" --v=2
}

# containerd-restart: containerd stopped as its service is (SIGTERM to containerd alone:
# systemd's KillMode=process leaves the shims and the containers running) and started again.
# A CNI plugin containerd is running at that moment (an ADD the guard holds) is its child: what
# becomes of it is containerd's to decide, and the scenarios look.
containerd_restart() {
  [ -n "$(pid_of containerd)" ] || die "containerd does not run"
  stop containerd 15
  start_containerd
  say "containerd restarted"
}

# reboot: the node restarts, its control plane (another machine in production) does not. As
# Talos reboots (its sequence's phase "cleanup", task stopAllPods, then its services): kubelet
# stopped; then every pod stopped through the CRI while containerd still runs, those with a
# network namespace of their own first (each container with a 30 s grace, then its sandbox,
# whose CNI DEL runs while Multus still does), then the host-network ones (Multus, whose daemon
# removes 00-multus.conf on that SIGTERM; the guard's keep, which leaves its file; Cilium's agent,
# a node process here, with them); then containerd, and whatever is left of the pods and shims
# SIGTERMed, SIGKILLed $CLUSTER_REBOOT_GRACE s later (default 15). CLUSTER_REBOOT_PODS=kill skips
# the CRI round, as a shutdown does that stops kubelet and containerd and then signals every
# process left (systemd without kubelet's graceful node shutdown): there the SIGTERM reaches
# Multus's shim with its daemon, the shim exits at once, and the daemon dies without removing
# its file (measured: 00-multus.conf left behind, as after a power cut; CLUSTER_REBOOT_GRACE=0
# is one).
# What lives in memory goes (the mounts below run/ and the pods' tmpfs volumes, bpffs, every pod
# network namespace, the pods' bridge and Cilium's devices): /run is wiped. What is on disk
# stays: var/lib (containerd's sandboxes, kubelet's pods, libcni's, Multus's and the guard's
# caches, host-local's leases) and, with CLUSTER_REBOOT_ETC_CNI=disk (the default, Talos up to
# 1.13), etc/cni (the guard's 00-cni-guard.conflist, the primary's 05-cilium.conflist). With
# CLUSTER_REBOOT_ETC_CNI=tmpfs (Talos 1.14 and later: /etc/cni is a tmpfs) etc/cni is empty at
# boot but for its two folders, and every writer writes its file again: the guard's init
# container, Multus, and the primary. Then the node boots: guard-syslog, containerd, kubelet, in
# that order (the boot's time, in ms, goes to $CLUSTER_DIR/boot-ms), and the primary: the Cilium
# agent again, or, for the bridge stand-in on a tmpfs boot, a stand-in agent that writes
# 05-cilium.conflist CLUSTER_PRIMARY_DELAY s after the boot (default 5: the real agent writes its
# file about 5 s after it starts here). The guard's and Multus's pods come back when kubelet
# starts them.
reboot_node() {
  local primary etc_cni=${CLUSTER_REBOOT_ETC_CNI:-disk}
  primary=$(cat "$CLUSTER_DIR/primary" 2>/dev/null) || die "the node was not brought up by this script"
  case "$etc_cni" in disk | tmpfs) ;; *) die "CLUSTER_REBOOT_ETC_CNI is disk or tmpfs, not $etc_cni" ;; esac
  [ -n "$(pid_of kubelet)" ] && [ -n "$(pid_of containerd)" ] || die "the node does not run"
  stop kubelet 15
  case "${CLUSTER_REBOOT_PODS:-cri}" in
    cri) stop_all_pods POD && stop_all_pods NODE ;;
    kill) ;;
    *) die "CLUSTER_REBOOT_PODS is cri or kill, not $CLUSTER_REBOOT_PODS" ;;
  esac
  stop containerd 15
  local pids i m grace=${CLUSTER_REBOOT_GRACE:-15} memory="^$NODE_HOST/(run|var/lib/kubelet/pods|sys/fs/bpf)(/|\$)"
  for i in TERM KILL; do
    # (the primary's agent, a node process here, with the pods)
    pids=$(node_pids; pid_of cilium-agent; pid_of primary-standin)
    # shellcheck disable=SC2086 # one pid a word
    [ -z "$pids" ] || kill -"$i" $pids 2>/dev/null || true
    for ((m = 0; m < grace * 10; m++)); do [ -n "$(node_pids)" ] || break; sleep 0.1; done
    grace=5
  done
  [ -z "$(node_pids)" ] || die "reboot: processes of the node left: $(node_pids | tr '\n' ' ')"
  stop cilium-agent 10
  stop primary-standin 1
  stop guard-syslog
  for ((i = 0; i < 5; i++)); do
    while read -r m; do
      [ -n "$m" ] || continue
      umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
    done < <(mounts_below | grep -E "$memory" || true)
  done
  if mounts_below | grep -qE "$memory"; then
    die "reboot: mounts left: $(mounts_below | grep -E "$memory" | tr '\n' ' ')"
  fi
  rm -rf "${NODE_HOST:?}"/run/*
  mkdir -p "$NODE_HOST"/run/{containerd,multus}
  if [ -e "$CILIUM_RUN_MARK" ]; then rm -rf "$CILIUM_RUN"; fi
  in_node ip link del cni-guard0 2>/dev/null || true
  in_node ip link del cilium_host 2>/dev/null || true # (and its peer cilium_net)
  if [ "$etc_cni" = tmpfs ]; then
    rm -rf "${NODE_HOST:?}"/etc/cni
    mkdir -p "$NODE_HOST"/etc/cni/{net.d,multus/net.d}
  fi
  say "node down: /run wiped, pods' network namespaces gone, /etc/cni on $etc_cni; booting"
  start_guard_syslog
  date +%s%3N >"$CLUSTER_DIR/${NODE_TAG%/}${NODE_TAG:+-}boot-ms"
  start_containerd
  start_kubelet
  restore_sysctls
  if [ "$primary" = cilium ]; then
    launch_cilium
  elif [ "$primary" = bridge ] && [ "$etc_cni" = tmpfs ] && [ "${CLUSTER_MULTUS:-1}" != 0 ]; then
    # (with CLUSTER_PRIMARY=daemonset the primary's pod writes it again, as Cilium's does)
    launch_primary_standin "${CLUSTER_PRIMARY_DELAY:-5}"
  fi
  say "node booted (kubelet started; /etc/cni $etc_cni)"
}

# stop_all_pods POD|NODE: every ready sandbox whose network namespace mode is that (POD: its
# own; NODE: the host's) stopped through the CRI, all at once: its running containers first
# (SIGTERM, 30 s, then SIGKILL), then the sandbox (its CNI DEL). As Talos's StopAllPods.
stop_all_pods() {
  local id ids=() pids=()
  mapfile -t ids < <(crictl pods --state ready -q 2>/dev/null)
  for id in "${ids[@]}"; do
    [ "$(crictl inspectp -o json "$id" 2>/dev/null | python3 -c 'import json,sys
print(json.load(sys.stdin)["status"]["linux"]["namespaces"]["options"]["network"])' 2>/dev/null)" = "$1" ] ||
      continue
    (
      mapfile -t cs < <(crictl ps -q --pod "$id" --state running 2>/dev/null)
      [ ${#cs[@]} -eq 0 ] || crictl stop --timeout 30 "${cs[@]}" >/dev/null 2>&1 || say "stopping the containers of sandbox ${id:0:13} failed"
      crictl stopp "$id" >/dev/null 2>&1 || say "stopping sandbox ${id:0:13} failed (its network teardown, most likely)"
    ) 9>&- &
    pids+=($!)
  done
  [ ${#pids[@]} -eq 0 ] || wait "${pids[@]}"
  say "stopped ${#pids[@]} pods with network mode $1 through the CRI"
}

# The bridge stand-in's agent, after a boot that emptied /etc/cni: it writes 05-cilium.conflist
# (same-folder temp file and rename, as Cilium does) SECONDS after it starts, then stays, as an
# agent does. A node daemon like the real agent (`down` and the next reboot stop it).
launch_primary_standin() { # SECONDS
  local dir
  dir=$(primary_conf_dir)
  # shellcheck disable=SC2016 # the inner shell's arguments
  start primary-standin /bin/sh -c 'sleep "$1" && mkdir -p "$3" &&
    cp "$2" "$3/.05-cilium.conflist.tmp" && mv -f "$3/.05-cilium.conflist.tmp" "$3/05-cilium.conflist" &&
    echo "wrote $3/05-cilium.conflist" && exec sleep 2147483647' primary-standin "$1" "$(primary_src)" "$dir"
}

# The processes of the node's pods and their shims: the pods' cgroups (kubelet's cgroupRoot,
# not the daemons') and every containerd-shim serving this node's containerd.
# (Every node's shims name the same address, as each node sees it: those of the selected node are
# the ones in its mount namespace.)
node_pids() {
  local mnt p h
  if [ "$NODE_INDEX" = 1 ]; then mnt=$(readlink "/proc/$$/ns/mnt")
  else h=$(pid_of node-ns); mnt=${h:+$(readlink "/proc/$h/ns/mnt")}; fi
  {
    find /sys/fs/cgroup/*/"$CGROUP" -path "*/$CGROUP/daemons" -prune -o -name cgroup.procs -print0 2>/dev/null |
      xargs -0r cat 2>/dev/null || true
    for p in $(pgrep -f "containerd-shim-runc-v2 .*-address $NODE/run/containerd/containerd.sock" || true); do
      if [ "$NODES" = 1 ] || [ "$(readlink "/proc/$p/ns/mnt" 2>/dev/null)" = "$mnt" ]; then echo "$p"; fi
    done
  } | sort -un
}

# --- up / down / status ------------------------------------------------------------------------
need_binaries() {
  local b
  for b in "$ETCD_BIN/etcd" "$CONTAINERD2_BIN/containerd" "$CONTAINERD2_BIN/ctr" \
           "$CRICTL_BIN/crictl" "$CNI_PLUGINS_BIN/bridge" "$MULTUS_BIN/multus-daemon" \
           "$MULTUS_BIN/multus-shim" "$DEBIAN_RUNC" /bin/busybox; do
    [ -x "$b" ] || die "$b is missing: run scripts/setup.sh (as root)"
  done
  for b in "${KUBERNETES_BUILT[@]}"; do
    [ -x "$KUBERNETES_BIN/$b" ] || die "$KUBERNETES_BIN/$b is missing: run scripts/setup.sh"
  done
  if [ "${CLUSTER_RELOADER:-0}" = 1 ]; then
    [ -x "$RELOADER_BIN/reloader" ] || die "$RELOADER_BIN/reloader is missing: run scripts/setup.sh"
  fi
  if [ "$PRIMARY" = cilium ]; then
    for b in "$CILIUM_BIN/cilium-agent" "$CILIUM_BIN/cilium-cni" "$CILIUM_BIN/clang" \
             "$CILIUM_LIB/bpf/bpf_lxc.c" "$CILIUM_LIB/crds/v2/ciliumnodes.yaml" /usr/sbin/ipset; do
      [ -e "$b" ] || die "$b is missing: run scripts/setup.sh (as root)"
    done
  fi
  # The plugin; the image takes the agent from beside it (scripts/build-image.sh guard).
  GUARD_BIN=${CNI_GUARD_BIN:-$REPO/target/release/cni-guard}
  if [ ! -x "$GUARD_BIN" ] || [ ! -x "$(dirname "$GUARD_BIN")/cni-guard-agent" ]; then
    say "building $GUARD_BIN and the agent"
    nice -n 10 cargo build --release --locked -p cni-guard -p cni-guard-agent >&2
  fi
}

apiserver_ready() {
  curl -sf --cacert "$CLUSTER_DIR/pki/ca.crt" --cert "$CLUSTER_DIR/pki/admin.crt" \
    --key "$CLUSTER_DIR/pki/admin.key" "https://$CP_IP:6443/readyz" >/dev/null
}

is_up() {
  local d daemons=("${DAEMONS[@]}") i up=0
  if [ "$(cat "$CLUSTER_DIR/node-kind" 2>/dev/null)" = none ]; then daemons=("${DAEMONS[@]:0:4}"); fi
  for d in "${daemons[@]}"; do [ -n "$(pid_of "$d")" ] || return 1; done
  if [ "$(cat "$CLUSTER_DIR/primary" 2>/dev/null)" = cilium ]; then
    [ -n "$(pid_of cilium-agent)" ] || return 1
  fi
  for ((i = 2; i <= NODES; i++)); do
    select_node "$i"
    for d in node-ns "${DAEMONS[@]:4}"; do [ -n "$(pid_of "$d")" ] || up=1; done
  done
  select_node 1
  [ "$up" = 0 ] && apiserver_ready
}

up() {
  local owner=${CLUSTER_OWNER_PID:-$PPID}
  # (A cluster of another count is not the one asked for: it goes like a leftover.)
  if [ "$(cat "$CLUSTER_DIR/nodes" 2>/dev/null || echo 1)" != "$NODES" ] && [ -e "$CLUSTER_DIR" ]; then
    say "a cluster of $(cat "$CLUSTER_DIR/nodes" 2>/dev/null || echo 1) nodes is there, $NODES asked for: removing it first"
    down
  fi
  if is_up; then
    if owner_alive; then
      say "already up (for pid $(cut -d' ' -f1 "$OWNER_FILE"), still running)"
      echo "KUBECONFIG=$KUBECONFIG_ADMIN"
      return 0
    fi
    # Its daemons run in sessions of their own (setsid): they outlive a run that was killed.
    say "a cluster is up, but its run (pid $(cut -d' ' -f1 "$OWNER_FILE" 2>/dev/null || echo unknown)) is gone: a leftover of a killed run, removing it first"
    down
  fi
  if [ -e "$CLUSTER_DIR" ] || [ -e "$NETNS_PATH" ]; then
    say "a partial cluster is there: removing it first"
    down
  fi
  if [ "$INSTANCE" != 0 ] && { [ "$PRIMARY" = cilium ] || [ "$NODE_KIND" != netns ]; }; then
    die "CLUSTER_INSTANCE=$INSTANCE: a cluster beside another runs with CLUSTER_PRIMARY=bridge or daemonset and CLUSTER_NODE=netns only"
  fi
  if [ "$NODES" != 1 ] && { [ "$PRIMARY" = cilium ] || [ "$NODE_KIND" != netns ]; }; then
    die "CLUSTER_NODES=$NODES: several nodes run with CLUSTER_PRIMARY=bridge or daemonset and CLUSTER_NODE=netns only"
  fi
  need_binaries
  trap 'failed' EXIT
  trap 'exit 130' INT TERM
  local t0=$SECONDS i

  mkdir -p "$CLUSTER_DIR"/{logs,pids,tmp}
  echo "$NODES" >"$CLUSTER_DIR/nodes"
  for ((i = 1; i <= NODES; i++)); do
    select_node "$i"
    mkdir -p "$NODE_HOST"/etc/cni/{net.d,multus/net.d} "$NODE_HOST"/opt/cni/bin \
      "$NODE_HOST"/var/lib/{kubelet,containerd,cni} "$NODE_HOST"/run/{containerd,multus} \
      "$NODE_HOST"/var/log/pods
  done
  select_node 1
  process_id "$owner" >"$OWNER_FILE"
  [ -s "$OWNER_FILE" ] || die "the owner pid $owner does not run (CLUSTER_OWNER_PID)"
  # Its own mount, shared: mounts made below it later (netns files, pod volumes) reach the
  # containers that mount a folder of it with mountPropagation HostToContainer.
  mount --bind "$CLUSTER_DIR" "$CLUSTER_DIR"
  mount --make-rshared "$CLUSTER_DIR"
  save_sysctls
  [ "$NODES" = 1 ] || make_bridge
  for ((i = 1; i <= NODES; i++)); do
    select_node "$i"
    make_cgroups
    make_network
  done
  select_node 1
  make_pki
  echo "$PRIMARY" >"$CLUSTER_DIR/primary"
  primary_conf_dir >"$CLUSTER_DIR/primary-conf-dir"
  for ((i = 1; i <= NODES; i++)); do
    select_node "$i"
    write_configs
    cp "$CNI_PLUGINS_BIN"/* "$NODE_HOST/opt/cni/bin/"
    cp "$GUARD_BIN" "$NODE_HOST/opt/cni/bin/cni-guard"
    if [ "$PRIMARY" = cilium ]; then
      cp "$CILIUM_BIN/cilium-cni" "$NODE_HOST/opt/cni/bin/"
    elif [ "$PRIMARY" = daemonset ]; then
      mkdir -p "$(host_path "$(primary_conf_dir)")" # the DaemonSet's pods write it
    else
      cp "$(primary_src)" "$(host_path "$(primary_conf_dir)")/"
    fi
  done
  select_node 1

  local p=$CLUSTER_DIR/pki kcm_cidrs=()
  # Cilium's IPAM `kubernetes` takes the node's podCIDR, which kube-controller-manager allocates.
  if [ "$PRIMARY" = cilium ]; then
    kcm_cidrs=(--allocate-node-cidrs=true --cluster-cidr="$CLUSTER_POD_SUBNET" --node-cidr-mask-size=24)
  fi
  # No fsync: a throw-away test store on a disk shared with other builds.
  start etcd "$ETCD_BIN/etcd" --name "$NODE_NAME" --data-dir "$CLUSTER_DIR/etcd" \
    --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster "$NODE_NAME=http://127.0.0.1:2380" --unsafe-no-fsync --log-level warn
  start kube-apiserver "$KUBERNETES_BIN/kube-apiserver" \
    --etcd-servers=http://127.0.0.1:2379 \
    --advertise-address="$CP_IP" --bind-address=0.0.0.0 --secure-port=6443 \
    --cert-dir="$CLUSTER_DIR/apiserver" \
    --tls-cert-file="$p/apiserver.crt" --tls-private-key-file="$p/apiserver.key" \
    --client-ca-file="$p/ca.crt" \
    --kubelet-client-certificate="$p/apiserver-kubelet-client.crt" \
    --kubelet-client-key="$p/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority="$p/ca.crt" \
    --kubelet-preferred-address-types=InternalIP \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$p/sa.pub" --service-account-signing-key-file="$p/sa.key" \
    --service-cluster-ip-range="$SERVICE_CIDR" \
    --authorization-mode=Node,RBAC --allow-privileged=true \
    --profiling=false
  wait_for "the API server (logs/kube-apiserver.log)" apiserver_ready
  start kube-controller-manager "$KUBERNETES_BIN/kube-controller-manager" \
    --kubeconfig="$CLUSTER_DIR/controller-manager.kubeconfig" \
    --authentication-kubeconfig="$CLUSTER_DIR/controller-manager.kubeconfig" \
    --authorization-kubeconfig="$CLUSTER_DIR/controller-manager.kubeconfig" \
    --service-account-private-key-file="$p/sa.key" --root-ca-file="$p/ca.crt" \
    --use-service-account-credentials=true --leader-elect=false \
    --bind-address=127.0.0.1 --cert-dir="$CLUSTER_DIR/controller-manager" \
    --service-cluster-ip-range="$SERVICE_CIDR" --profiling=false "${kcm_cidrs[@]}"
  start kube-scheduler "$KUBERNETES_BIN/kube-scheduler" \
    --kubeconfig="$CLUSTER_DIR/scheduler.kubeconfig" \
    --authentication-kubeconfig="$CLUSTER_DIR/scheduler.kubeconfig" \
    --authorization-kubeconfig="$CLUSTER_DIR/scheduler.kubeconfig" \
    --leader-elect=false --bind-address=127.0.0.1 --profiling=false
  # CLUSTER_RELOADER=1: stakater/Reloader, which rolls a workload when a ConfigMap its
  # annotation configmap.reloader.stakater.com/reload names changes (the seed's cutover). It takes
  # its API server from KUBECONFIG only; its :9090 (metrics, fixed) is node 1's network's.
  if [ "${CLUSTER_RELOADER:-0}" = 1 ]; then
    start reloader env KUBECONFIG="$KUBECONFIG_ADMIN" "$RELOADER_BIN/reloader" --resources-to-ignore=secrets
  fi

  make_images
  echo "$NODE_KIND" >"$CLUSTER_DIR/node-kind"
  if [ "$NODE_KIND" = none ]; then
    trap - EXIT INT TERM
    say "control plane up in $((SECONDS - t0))s at $CP_IP (API https://$CP_IP:6443), no node; images in $CLUSTER_DIR/images"
    echo "KUBECONFIG=$KUBECONFIG_ADMIN"
    return 0
  fi
  # containerd finds its shim in PATH: its own, not Debian's 1.6 shim in /usr/bin (that one
  # fails with "start failed: io.containerd.runc.v2: type with url <id>: not found").
  for ((i = 1; i <= NODES; i++)); do
    select_node "$i"
    start_guard_syslog
    start_containerd
    import_images
    start_kubelet
  done
  for ((i = 1; i <= NODES; i++)); do
    select_node "$i"
    wait_for "node $NODE_NAME to register (logs/${NODE_TAG}kubelet.log)" kubectl get node "$NODE_NAME"
  done
  select_node 1
  restore_sysctls
  if [ "$PRIMARY" = cilium ]; then start_cilium; fi
  if [ "$PRIMARY" = daemonset ]; then
    say "deploying the primary as a DaemonSet (conformance/k8s/manifests/primary-daemonset.yaml)"
    manifest primary-daemonset.yaml | kubectl apply -f - >/dev/null
  fi

  if [ "${CLUSTER_MULTUS:-1}" != 0 ]; then
    say "deploying Multus $MULTUS_VERSION and the NetworkAttachmentDefinition"
    manifest multus.yaml | kubectl apply -f - >/dev/null
    wait_for "the NetworkAttachmentDefinition CRD" kubectl get crd \
      network-attachment-definitions.k8s.cni.cncf.io
    kubectl wait --for=condition=Established --timeout=60s \
      crd/network-attachment-definitions.k8s.cni.cncf.io >/dev/null
    manifest net1-nad.yaml | kubectl apply -f - >/dev/null
    for ((i = 1; i <= NODES; i++)); do
      select_node "$i"
      wait_for "Multus's 00-multus.conf on $NODE_NAME" test -s "$NODE_HOST/etc/cni/net.d/00-multus.conf"
    done
    select_node 1
    if [ "$GUARD" != 0 ]; then
      say "deploying cni-guard (deploy/multus-cilium) in front of Multus"
      guard_manifest | kubectl apply -f - >/dev/null
      kubectl -n cni-guard rollout status daemonset/cni-guard --timeout="${TIMEOUT}s" >/dev/null
      for ((i = 1; i <= NODES; i++)); do
        select_node "$i"
        wait_for "the guard's 00-cni-guard.conflist on $NODE_NAME" test -s "$NODE_HOST/etc/cni/net.d/00-cni-guard.conflist"
      done
      select_node 1
    fi
  fi
  for ((i = 1; i <= NODES; i++)); do
    select_node "$i"
    kubectl wait --for=condition=Ready --timeout="${TIMEOUT}s" "node/$NODE_NAME" >/dev/null ||
      die "node $NODE_NAME is not Ready: $(kubectl get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].message}')"
  done
  select_node 1
  # Again: kubelet may set its kernel tunables after it registers (container manager start).
  restore_sysctls
  trap - EXIT INT TERM
  if [ "$NODES" = 1 ]; then
    say "up in $((SECONDS - t0))s: node $NODE_NAME Ready at $NODE_IP (API https://$CP_IP:6443)"
  else
    say "up in $((SECONDS - t0))s: $NODES nodes Ready, $NODE_NAME..cni-guard-node$NODES at 10.77.$NET3.2..$((NODES + 1)) (API https://$CP_IP:6443)"
  fi
  echo "KUBECONFIG=$KUBECONFIG_ADMIN"
}

# The kernel settings as they were before any cluster here came up, saved once in
# $SYSCTL_SHARED/saved for every instance: an instance that came up while another's kubelet had
# just set them would otherwise save kubelet's values and put those back. Each instance that is
# up has a file in $SYSCTL_SHARED/users (its folder); the last one down removes the saved values.
SYSCTL_SHARED=/run/cni-guard-cluster-sysctls
save_sysctls() {
  local s u fd
  mkdir -p "$SYSCTL_SHARED/users"
  exec {fd}>"$SYSCTL_SHARED/lock"
  flock "$fd"
  for u in "$SYSCTL_SHARED"/users/*; do # instances removed without their `down`
    if [ -f "$u" ] && [ ! -d "$(cat "$u")" ]; then rm -f "$u"; fi
  done
  if ! compgen -G "$SYSCTL_SHARED/users/*" >/dev/null || [ ! -s "$SYSCTL_SHARED/saved" ]; then
    for s in "${SYSCTLS[@]}"; do echo "$s=$(sysctl -n "$s")"; done >"$SYSCTL_SHARED/saved"
  fi
  echo "$CLUSTER_DIR" >"$SYSCTL_SHARED/users/$INSTANCE"
  cp "$SYSCTL_SHARED/saved" "$CLUSTER_DIR/sysctl.saved"
  exec {fd}>&-
}
release_sysctls() {
  local fd
  [ -d "$SYSCTL_SHARED/users" ] || return 0
  exec {fd}>"$SYSCTL_SHARED/lock"
  flock "$fd"
  rm -f "$SYSCTL_SHARED/users/$INSTANCE"
  compgen -G "$SYSCTL_SHARED/users/*" >/dev/null || rm -rf "$SYSCTL_SHARED"
  exec {fd}>&-
}
restore_sysctls() {
  [ -f "$CLUSTER_DIR/sysctl.saved" ] || return 0
  local line
  while read -r line; do
    [ "$(sysctl -n "${line%%=*}")" = "${line#*=}" ] || sysctl -qw "$line" || true
  done <"$CLUSTER_DIR/sysctl.saved"
}

keep_logs() { # the daemons' logs and the pods' (kubelet's podLogsDir)
  [ -d "$CLUSTER_DIR/logs" ] || return 0
  rm -rf "$LOGS_KEPT"
  cp -r "$CLUSTER_DIR/logs" "$LOGS_KEPT"
  if [ -d "$NODE/var/log/pods" ]; then cp -rL "$NODE/var/log/pods" "$LOGS_KEPT/pods" 2>/dev/null || true; fi
}

failed() {
  local rc=$? f
  trap - EXIT
  say "up failed (exit $rc); the last lines of each log:"
  for f in "$CLUSTER_DIR"/logs/*.log "$CLUSTER_DIR"/logs/*/*.log "$NODE"/var/log/pods/*/*/*.log; do
    [ -f "$f" ] || continue
    echo "--- ${f#"$CLUSTER_DIR"/}" >&2
    tail -n 15 "$f" >&2
  done
  if apiserver_ready 2>/dev/null; then kubectl get pods -A -o wide >&2 || true; fi
  if [ "${CLUSTER_KEEP_ON_FAILURE:-0}" = 1 ]; then
    say "left as it is (CLUSTER_KEEP_ON_FAILURE=1): scripts/cluster.sh down removes it"
    exit "$rc"
  fi
  down
  exit "$rc"
}

down() {
  local ids=() node_ids=() id d i
  # Every node there may be (a partial cluster's count is not known), node 1's last.
  for ((i = 9; i >= 1; i--)); do
    select_node "$i"
    if [ -n "$(pid_of kubelet)" ]; then stop kubelet 15; fi
    if [ -n "$(pid_of containerd)" ]; then
      # Pods go through CNI DEL while containerd still runs, kube-system's (Multus) last so that
      # the others' DEL reaches it; the sandbox ids name libcni's cache.
      mapfile -t node_ids < <({ crictl pods -q 2>/dev/null | grep -vxF -f <(crictl pods -q --namespace kube-system 2>/dev/null; echo -) || true
        crictl pods -q --namespace kube-system 2>/dev/null || true; })
      for id in "${node_ids[@]}"; do
        crictl stopp "$id" >/dev/null 2>&1 || say "stopping sandbox $id on $NODE_NAME failed"
        crictl rmp -f "$id" >/dev/null 2>&1 || say "removing sandbox $id on $NODE_NAME failed"
      done
      ids+=("${node_ids[@]}")
      stop containerd 15
    fi
    stop guard-syslog
    stop primary-standin 1
  done
  select_node 1
  stop cilium-agent 20
  if [ -e "$CILIUM_RUN_MARK" ]; then rm -rf "$CILIUM_RUN"; fi
  for d in reloader kube-scheduler kube-controller-manager kube-apiserver etcd; do stop "$d"; done
  for ((i = 9; i >= 1; i--)); do
    select_node "$i"
    kill_cgroup
    remove_cgroups
    remove_network
  done
  select_node 1
  remove_bridge
  unmount_all
  restore_sysctls
  release_sysctls
  # What kubelet and libcni write outside the folder they are given. libcni's cache keeps an
  # entry whose DEL never ran through the config that made it (a sandbox torn down through
  # another file, as in the incident): every entry of this node's network namespaces goes.
  for id in "${ids[@]}"; do rm -f /var/lib/cni/results/*-"$id"-*; done
  local stale
  mapfile -t stale < <(grep -lF "\"netns\":\"$NODE/" /var/lib/cni/results/* 2>/dev/null || true)
  if [ ${#stale[@]} -gt 0 ]; then
    say "libcni cache entries of sandboxes no longer there: ${#stale[@]} (${stale[*]##*/}): removed"
    rm -f "${stale[@]}"
  fi
  for d in /var/log/containers/*.log; do
    [ -L "$d" ] && case "$(readlink "$d")" in "$NODE"/*) rm -f "$d" ;; esac
  done
  keep_logs
  if [ -z "$(mounts_below)" ]; then rm -rf "$CLUSTER_DIR"; fi
  say "down (logs kept in $LOGS_KEPT)"
}

# leftovers: what of this cluster (instance) is still on the host, one line each; nothing once
# `down` removed it all (its network namespaces, host links, cgroups, folder, mounts, processes).
leftovers() {
  local i
  for ((i = 1; i <= 9; i++)); do
    select_node "$i"
    [ ! -e "$NETNS_PATH" ] || echo "network namespace $NETNS"
    ! ip link show "$VETH_HOST" >/dev/null 2>&1 || echo "host link $VETH_HOST"
    ! compgen -G "/sys/fs/cgroup/*/$CGROUP" >/dev/null || echo "cgroups $CGROUP"
  done
  select_node 1
  ! ip link show "$BRIDGE" >/dev/null 2>&1 || echo "bridge $BRIDGE"
  [ ! -e "$CLUSTER_DIR" ] || echo "folder $CLUSTER_DIR"
  [ -z "$(mounts_below)" ] || echo "mounts below $CLUSTER_DIR"
  ! pgrep -f "$CLUSTER_DIR/" >/dev/null || echo "processes naming $CLUSTER_DIR/"
}

status() {
  local d pid i
  for ((i = 1; i <= NODES; i++)); do
    select_node "$i"
    local daemons=("${DAEMONS[@]:4}")
    if [ "$i" = 1 ]; then daemons=("${DAEMONS[@]}" cilium-agent); else daemons=(node-ns "${daemons[@]}"); fi
    for d in "${daemons[@]}"; do
      pid=$(pid_of "$d")
      if [ -n "$pid" ]; then printf '%-24s running (pid %s)\n' "$NODE_TAG$d" "$pid"
      else printf '%-24s not running\n' "$NODE_TAG$d"; fi
    done
    [ -e "$NETNS_PATH" ] && echo "network namespace $NETNS_PATH" || echo "no network namespace $NETNS_PATH"
  done
  select_node 1
  if apiserver_ready 2>/dev/null; then
    echo "KUBECONFIG=$KUBECONFIG_ADMIN"
    kubectl get nodes -o wide
    kubectl get pods -A -o wide
  else
    echo "the API server does not answer"
    return 1
  fi
}

case "${1:-}" in
  up | down | status | cilium | containerd-restart | reboot | in-node) [ "$(id -u)" = 0 ] || die "needs root" ;;
esac
case "${1:-}" in
  up) up ;;
  down) down ;;
  containerd-restart) containerd_restart ;;
  reboot) reboot_node ;;
  cilium)
    [ "$(id -u)" = 0 ] || die "needs root"
    [ "$(cat "$CLUSTER_DIR/primary" 2>/dev/null)" = cilium ] || die "the node does not run Cilium"
    case "${2:-}" in
      stop)
        stop cilium-agent 20
        if [ "${3:-}" = --uninstall ]; then rm -f "$(host_path "$(primary_conf_dir)")/05-cilium.conflist"; fi ;;
      start) [ -z "$(pid_of cilium-agent)" ] || die "the agent runs"; start_cilium ;;
      *) die "cilium stop [--uninstall] | start" ;;
    esac ;;
  status) status ;;
  sysctls) printf '%s\n' "${SYSCTLS[@]}" ;; # the kernel settings up saves and down puts back
  leftovers) leftovers ;;
  nodes) # one line a node: INDEX NAME ADDRESS FOLDER (where the host finds the node's folders)
    for ((i = 1; i <= NODES; i++)); do select_node "$i"; echo "$i $NODE_NAME $NODE_IP $NODE_HOST"; done ;;
  in-node) # I COMMAND...: COMMAND in node I's namespaces (network; mount and UTS for I > 1)
    [[ ${2:-} =~ ^[1-9]$ ]] && [ "$2" -le "$NODES" ] || die "in-node I COMMAND...: I is 1 to $NODES"
    select_node "$2"
    shift 2
    set_ns_args
    exec nsenter "${NS_ARGS[@]}" -- "$@" ;;
  manifest)
    case "${2:-}" in
      guard) guard_manifest ;;
      guard-uninstall) guard_manifest uninstall ;;
      *) manifest "$2" ;;
    esac ;;
  *) sed -n '2,26p' "$0" >&2; exit 2 ;;
esac
