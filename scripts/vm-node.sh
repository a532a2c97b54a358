#!/usr/bin/env bash
# A virtual-machine node for the control plane of `CLUSTER_NODE=none scripts/cluster.sh up`: a
# real reboot (systemctl reboot inside) with its own kernel, systemd, containerd and kubelet.
#
#   scripts/vm-node.sh up        seed disk, containerd's store, qcow2 overlay on the cached image
#                                (scripts/vm-image.sh), bridge and tap, qemu; waits for the node
#                                to register (Ready once a test puts a network in /etc/cni/net.d)
#   scripts/vm-node.sh down      qemu stopped, bridge, tap, overlay, seed and the Node object
#                                gone; safe to run at any time
#   scripts/vm-node.sh exec [--timeout S] [--stdin FILE] -- CMD...
#                                CMD in the guest (the QEMU guest agent: conformance/vm/qga.py)
#   scripts/vm-node.sh ping [SECONDS]   the guest agent answers (within SECONDS)
#   scripts/vm-node.sh manifest multus.yaml|pod-net1.yaml|...|guard   a manifest with the VM's
#                                own paths (the node's /etc/cni/net.d, /opt/cni/bin, /run ...)
#   scripts/vm-node.sh status    qemu, the guest's units, the node
#
# Network: in the control plane's namespace (cni-guard-k8s, where the API server listens at
# 10.77.0.2) a bridge $BRIDGE at $GATEWAY/24 with the VM's tap; the VM is $VM_IP, with a route to
# 10.77.0.0/24 and no default route. Nothing is forwarded from or to the bridge (FORWARD drops
# it), so the VM reaches the namespace's own addresses and nothing else.
#
# The run's folder $VM_DIR holds the overlay, the seed (an ext4 image, label vm-seed: kubelet's
# certificates signed by the cluster's CA, its kubeconfig and configuration, containerd's
# configuration, node.env), containerd's store (an ext4 image, label vm-containerd: the guest's
# /var/lib/containerd with the images of $CLUSTER_DIR/images, imported on the host), qemu's pid,
# its serial console (serial.log) and the guest agent's socket.
#
# Environment: VM_MEMORY (MiB, default 1536), VM_CPUS (default 2: multi-threaded TCG, a host
# thread each), VM_TIMEOUT (seconds the node may take to register after qemu starts, default
# 300). Under software emulation (TCG: this machine's KVM cannot run a stock kernel, see
# docs/development/testing.md). Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
# shellcheck source=scripts/versions.sh
. scripts/versions.sh

CLUSTER_DIR=${CNI_GUARD_CLUSTER_DIR:-/var/lib/cni-guard-cluster}
VM_DIR=${CNI_GUARD_VM_DIR:-/var/lib/cni-guard-vm}
NETNS=cni-guard-k8s # scripts/cluster.sh's
NETNS_PATH=/run/netns/$NETNS
API_IP=10.77.0.2 # scripts/cluster.sh's NODE_IP: the API server
API_NET=10.77.0.0/24
BRIDGE=cgvm0
TAP=cgvm-tap0
GATEWAY=10.77.1.1
VM_IP=10.77.1.2
VM_NAME=cni-guard-vm
VM_MAC=52:54:00:4d:01:02
SERVICE_IP=10.96.0.1
SANDBOX_IMAGE=localhost/cni-guard-test/sandbox:1 # scripts/cluster.sh's images
TEST_IMAGE=localhost/cni-guard-test/busybox:1
GUARD_IMAGE=localhost/cni-guard:dev
MULTUS_IMAGE=localhost/cni-guard-test/multus:$MULTUS_VERSION
NET1_SUBNET=10.99.0.0/24
KUBECONFIG_ADMIN=$CLUSTER_DIR/admin.kubeconfig
QGA=$VM_DIR/qga.sock
TIMEOUT=${VM_TIMEOUT:-300}

say() { echo "vm-node: $*" >&2; }
die() { say "$*"; exit 1; }
kubectl() { "$KUBERNETES_BIN/kubectl" --kubeconfig "$KUBECONFIG_ADMIN" "$@"; }
in_ns() { nsenter --net="$NETNS_PATH" -- "$@"; }
qga() { python3 "$REPO/conformance/vm/qga.py" "$QGA" "$@"; }

qemu_pid() { # the pid of the qemu this script started, or nothing
  local p
  p=$(cat "$VM_DIR/qemu.pid" 2>/dev/null) || return 0
  if [ -d "/proc/$p" ] && grep -qF "$VM_DIR/" "/proc/$p/cmdline" 2>/dev/null; then echo "$p"; fi
}

# --- the seed: what the run gives the guest -------------------------------------------------------
cert() { # NAME CN O SANS: NAME.{key,crt} in $1's folder, signed by the cluster CA
  local out=$1 cn=$2 o=$3 sans=$4 ext
  ext=$(mktemp)
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    if [ -n "$sans" ]; then
      echo "extendedKeyUsage=serverAuth"
      echo "subjectAltName=$sans"
    else
      echo "extendedKeyUsage=clientAuth"
    fi
  } >"$ext"
  openssl req -new -newkey rsa:2048 -nodes -keyout "$out.key" -subj "${o:+/O=$o}/CN=$cn" \
    -out "$out.csr" 2>/dev/null
  openssl x509 -req -in "$out.csr" -CA "$CLUSTER_DIR/pki/ca.crt" -CAkey "$CLUSTER_DIR/pki/ca.key" \
    -set_serial "0x$(openssl rand -hex 8)" -days 30 -sha256 -extfile "$ext" -out "$out.crt" 2>/dev/null
  rm -f "$out.csr" "$ext"
}

make_seed() {
  local s=$VM_DIR/seed k
  rm -rf "$s"
  mkdir -p "$s"/etc/{kubernetes/pki,containerd}
  k=$s/etc/kubernetes
  cat >"$s/node.env" <<EOF
NODE_NAME=$VM_NAME
NODE_IP=$VM_IP
NODE_CIDR=$VM_IP/24
GATEWAY=$GATEWAY
API_IP=$API_IP
API_NET=$API_NET
SERVICE_IP=$SERVICE_IP
EOF
  cp "$CLUSTER_DIR/pki/ca.crt" "$k/pki/ca.crt"
  cert "$k/pki/kubelet" "system:node:$VM_NAME" system:nodes ""
  cert "$k/pki/kubelet-serving" "$VM_NAME" "" "IP:$VM_IP,DNS:$VM_NAME"
  cat >"$k/kubelet.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
  - name: cni-guard
    cluster: {server: "https://$API_IP:6443", certificate-authority: /etc/kubernetes/pki/ca.crt}
users:
  - name: kubelet
    user: {client-certificate: /etc/kubernetes/pki/kubelet.crt, client-key: /etc/kubernetes/pki/kubelet.key}
contexts:
  - name: cni-guard
    context: {cluster: cni-guard, user: kubelet}
current-context: cni-guard
EOF
  cat >"$k/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
cgroupDriver: systemd
failSwapOn: false
address: $VM_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: /etc/kubernetes/pki/kubelet-serving.crt
tlsPrivateKeyFile: /etc/kubernetes/pki/kubelet-serving.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: /etc/kubernetes/pki/ca.crt}
authorization: {mode: Webhook}
resolvConf: /etc/resolv.conf
staticPodPath: ""
# A small test node: evict only when it is really full; no image can be pulled, none collected.
evictionHard: {memory.available: 50Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
EOF
  cat >"$s/etc/containerd/config.toml" <<EOF
# containerd $CONTAINERD2_VERSION on the VM node: its defaults (root /var/lib/containerd on disk,
# state /run/containerd), the imported sandbox image, Debian's runc with systemd cgroups, CNI
# from /etc/cni/net.d (the first file only, as containerd always does).
version = 3
disabled_plugins = [
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.erofs",
]
[plugins]
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = "overlayfs"
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = "$SANDBOX_IMAGE"
  [plugins.'io.containerd.cri.v1.runtime']
    netns_mounts_under_state_dir = true
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "/usr/sbin/runc"
        SystemdCgroup = true
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ["/opt/cni/bin"]
      conf_dir = "/etc/cni/net.d"
      max_conf_num = 1
EOF
  chmod 0600 "$k"/pki/*.key
  mke2fs -q -t ext4 -L vm-seed -d "$s" "$VM_DIR/seed.raw" 16M >/dev/null
  rm -rf "$s"
}

# containerd's store for the guest. Under emulation the guest's own `ctr images import` of the
# 127 MB Multus image took 96 s; containerd $CONTAINERD2_VERSION run here (the same version, the
# same overlayfs snapshotter, no CRI) fills a store with the run's images (content, unpacked
# snapshots, metadata) in seconds, and that store becomes the guest's /var/lib/containerd: a
# node whose images are already pulled. The pods' layers go there too, and stay over reboots.
make_containerd_disk() {
  local d=$VM_DIR/containerd-host pid t i
  local sock=$d/state/containerd.sock
  mkdir -p "$d/root" "$d/state"
  cat >"$d/config.toml" <<EOF
version = 3
root = "$d/root"
state = "$d/state"
disabled_plugins = [
  "io.containerd.grpc.v1.cri", "io.containerd.cri.v1.images", "io.containerd.cri.v1.runtime",
  "io.containerd.nri.v1.nri", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.erofs",
]
[grpc]
  address = "$sock"
[ttrpc]
  address = "$sock.ttrpc"
[plugins.'io.containerd.internal.v1.opt']
  path = "$d/state/opt"
EOF
  setsid "$CONTAINERD2_BIN/containerd" --config "$d/config.toml" </dev/null >"$VM_DIR/containerd-host.log" 2>&1 9>&- &
  pid=$!
  for ((i = 0; i < 100; i++)); do
    "$CONTAINERD2_BIN/ctr" --address "$sock" version >/dev/null 2>&1 && break
    sleep 0.1
  done
  for t in "$CLUSTER_DIR"/images/*.tar; do
    "$CONTAINERD2_BIN/ctr" --address "$sock" -n k8s.io images import "$t" >/dev/null 2>>"$VM_DIR/containerd-host.log"
  done
  kill -TERM "$pid"
  for ((i = 0; i < 100; i++)); do [ -d "/proc/$pid" ] || break; sleep 0.1; done
  [ ! -d "/proc/$pid" ] || { kill -KILL "$pid"; die "containerd (for the store) did not stop"; }
  mke2fs -q -t ext4 -L vm-containerd -d "$d/root" "$VM_DIR/containerd.raw" \
    "$(($(du -sm "$d/root" | cut -f1) + 1024))M" >/dev/null
  rm -rf "$d"
}

# --- network --------------------------------------------------------------------------------------
make_network() {
  in_ns ip link add "$BRIDGE" type bridge
  in_ns ip addr add "$GATEWAY/24" dev "$BRIDGE"
  in_ns ip link set "$BRIDGE" up
  in_ns ip tuntap add dev "$TAP" mode tap
  in_ns ip link set "$TAP" master "$BRIDGE" up
  # The namespace forwards (the netns node's pods need it): never for the VM.
  in_ns iptables -I FORWARD -i "$BRIDGE" -j DROP
  in_ns iptables -I FORWARD -o "$BRIDGE" -j DROP
}

remove_network() {
  [ -e "$NETNS_PATH" ] || return 0
  in_ns ip link del "$TAP" 2>/dev/null || true
  in_ns ip link del "$BRIDGE" 2>/dev/null || true
  while in_ns iptables -D FORWARD -i "$BRIDGE" -j DROP 2>/dev/null; do :; done
  while in_ns iptables -D FORWARD -o "$BRIDGE" -j DROP 2>/dev/null; do :; done
}

# --- up / down ------------------------------------------------------------------------------------
# Registered and reporting: the Ready condition has a status (it is False until a test lays out
# /etc/cni/net.d: no network configuration yet).
node_registered() {
  [ -n "$(kubectl get node "$VM_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" ]
}

up() {
  local image t0=$SECONDS i
  [ -e "$NETNS_PATH" ] && [ -s "$KUBECONFIG_ADMIN" ] ||
    die "no control plane: CLUSTER_NODE=none scripts/cluster.sh up"
  [ "$(cat "$CLUSTER_DIR/node-kind" 2>/dev/null)" = none ] ||
    die "the cluster runs its own node (scripts/cluster.sh up without CLUSTER_NODE=none)"
  [ -z "$(qemu_pid)" ] || die "the VM runs already (scripts/vm-node.sh down)"
  image=$(scripts/vm-image.sh path)
  down 2>/dev/null
  mkdir -p "$VM_DIR"
  trap 'say "up failed"; tail -n 40 "$VM_DIR/serial.log" >&2 2>/dev/null || true; down; exit 1' ERR
  qemu-img create -q -f qcow2 -b "$image/disk.raw" -F raw "$VM_DIR/overlay.qcow2"
  make_seed
  make_containerd_disk
  make_network
  say "starting qemu (TCG, $((${VM_MEMORY:-1536})) MiB, ${VM_CPUS:-2} vCPU) on $image"
  # setsid: qemu outlives no one by accident (down kills it by pid); descriptor 9 (a caller's
  # lock) is not handed down.
  setsid nsenter --net="$NETNS_PATH" -- qemu-system-x86_64 -name "$VM_NAME" \
    -accel tcg,tb-size=128 -cpu qemu64 -M q35 -smp "${VM_CPUS:-2}" -m "${VM_MEMORY:-1536}" \
    -display none -vga none -monitor none -serial "file:$VM_DIR/serial.log" \
    -kernel "$image/vmlinuz" -initrd "$image/initrd.img" \
    -append "root=/dev/vda rw console=ttyS0 net.ifnames=0 mitigations=off" \
    -drive "file=$VM_DIR/overlay.qcow2,if=virtio,format=qcow2,cache=unsafe" \
    -drive "file=$VM_DIR/seed.raw,if=virtio,format=raw,readonly=on" \
    -drive "file=$VM_DIR/containerd.raw,if=virtio,format=raw,cache=unsafe" \
    -device virtio-balloon-pci,free-page-reporting=on \
    -netdev "tap,id=n0,ifname=$TAP,script=no,downscript=no" \
    -device "virtio-net-pci,netdev=n0,mac=$VM_MAC" \
    -device virtio-serial-pci \
    -chardev "socket,id=qga0,path=$QGA,server=on,wait=off" \
    -device virtserialport,chardev=qga0,name=org.qemu.guest_agent.0 \
    </dev/null >"$VM_DIR/qemu.log" 2>&1 9>&- &
  echo $! >"$VM_DIR/qemu.pid"
  sleep 0.5
  [ -n "$(qemu_pid)" ] || { cat "$VM_DIR/qemu.log" >&2; false; }
  qga ping --wait "$TIMEOUT" >/dev/null || { say "the guest agent did not answer"; false; }
  say "guest agent up $((SECONDS - t0))s after qemu started"
  for ((i = SECONDS; SECONDS - i < TIMEOUT;)); do node_registered && break; sleep 2; done
  node_registered || { say "node $VM_NAME did not register; kubelet's last lines:"; qga exec -- journalctl -u kubelet -n 30 --no-pager >&2 || true; false; }
  trap - ERR
  say "node $VM_NAME registered from $VM_IP, $((SECONDS - t0))s after qemu started"
}

down() {
  local p i
  p=$(qemu_pid)
  if [ -n "$p" ]; then
    say "stopping qemu (pid $p)"
    kill -TERM "$p" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do [ -d "/proc/$p" ] || break; sleep 0.1; done
    [ ! -d "/proc/$p" ] || kill -KILL "$p" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do [ -d "/proc/$p" ] || break; sleep 0.1; done
  fi
  remove_network
  if [ -s "$KUBECONFIG_ADMIN" ] && kubectl get node "$VM_NAME" >/dev/null 2>&1; then
    kubectl delete node "$VM_NAME" --wait=false >/dev/null 2>&1 || true
  fi
  if [ -d "$VM_DIR" ]; then
    rm -rf /tmp/cni-guard-vm-logs
    mkdir -p /tmp/cni-guard-vm-logs
    cp "$VM_DIR"/*.log /tmp/cni-guard-vm-logs/ 2>/dev/null || true
    rm -rf "$VM_DIR"
  fi
}

# --- manifests ------------------------------------------------------------------------------------
# conformance/k8s/manifests/FILE for this node: its real paths (no node folder), the images it
# imported; VM_LAYOUT original|seed-fix and VM_MULTUS_MASTER as scripts/cluster.sh's layouts.
# (The node is a machine of its own: its paths are the real ones, Cilium's run folder included.)
manifest() {
  local autoconfig=/etc/cni/multus/net.d out
  [ "${VM_LAYOUT:-seed-fix}" = original ] && autoconfig=/host/etc/cni/net.d
  out=$(sed -e "s|@NODE@||g" -e "s|@MULTUS_IMAGE@|$MULTUS_IMAGE|g" \
    -e "s|@TEST_IMAGE@|$TEST_IMAGE|g" -e "s|@NET1_SUBNET@|$NET1_SUBNET|g" \
    -e "s|@AUTOCONFIG_DIR@|$autoconfig|g" -e "s|@MASTER_CNI@|${VM_MULTUS_MASTER:-}|g" \
    -e "s|@GUARD_IMAGE@|$GUARD_IMAGE|g" -e "s|@CILIUM_RUN@|/var/run/cilium|g" \
    "$REPO/conformance/k8s/manifests/$1" |
    # Multus's CPU limit (100m, upstream's) is a tenth of a CPU that runs emulated here, several
    # times slower than the host's: its daemon took 2 min to start and every ADD crawled. Left
    # without limits on this node.
    if [ "$1" = multus.yaml ]; then sed -e '/^ *limits:$/,/^ *memory: /d'; else cat; fi)
  ! grep -qE '@[A-Z_]+@' <<<"$out" ||
    die "manifest $1: placeholders left unfilled: $(grep -oE '@[A-Z_]+@' <<<"$out" | sort -u | tr '\n' ' ')"
  printf '%s\n' "$out"
}
# deploy/multus-cilium as it is but for the image (the imported one) and, in the original layout,
# its attachment: 05-cilium.conflist in the conf dir.
guard_manifest() {
  kubectl kustomize "$REPO/deploy/multus-cilium" |
    sed -e "s#^\( *image:\) cni-guard:.*#\1 $GUARD_IMAGE#" |
    if [ "${VM_LAYOUT:-seed-fix}" = original ]; then
      sed -e "s#--attachment=/etc/cni/multus/net.d/#--attachment=/etc/cni/net.d/#"
    else cat; fi
}

status() {
  local p
  p=$(qemu_pid)
  if [ -z "$p" ]; then echo "qemu not running"; return 1; fi
  echo "qemu running (pid $p, $(($(ps -o rss= -p "$p") / 1024)) MiB)"
  qga exec -- systemctl --no-pager --plain list-units containerd.service kubelet.service \
    vm-node-init.service vm-node-images.service || true
  kubectl get node "$VM_NAME" -o wide || true
}

[ "$(id -u)" = 0 ] || [ "${1:-}" = manifest ] || die "needs root"
case "${1:-}" in
  up) up ;;
  down) down ;;
  exec) shift; qga exec "$@" ;;
  ping) qga ping --wait "${2:-0}" ;;
  manifest)
    case "${2:-}" in
      guard) guard_manifest ;;
      *) manifest "$2" ;;
    esac ;;
  status) status ;;
  *) sed -n '2,15p' "$0" >&2; exit 2 ;;
esac
