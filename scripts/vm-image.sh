#!/usr/bin/env bash
# The disk image of the virtual-machine node (conformance/vm): Debian bookworm with its own
# kernel and systemd, containerd and kubelet as systemd units, built once and cached by recipe.
#
#   scripts/vm-image.sh build   builds it unless the cache has it ("present"); prints its folder
#   scripts/vm-image.sh path    prints its folder, or fails when it is not built
#
# The folder, $CNI_GUARD_VM_CACHE/bookworm-<recipe> (default /var/cache/cni-guard/vm), holds
#   disk.raw     ext4 root file system (sparse, 3 GiB): boot with root=/dev/vda, read only as
#                the backing file of a qcow2 overlay per run (scripts/vm-node.sh)
#   vmlinuz, initrd.img   the guest's own kernel (Debian's linux-image-amd64) and its initramfs
#                         (only the modules to mount the root: virtio_pci, virtio_blk, ext4)
#   recipe       what the recipe hash was made of
# <recipe> is a hash of this script and the versions it puts in (scripts/versions.sh): a change
# to either builds a new folder (and removes the older ones); the same recipe is never built
# twice. The build goes to <folder>.partial and is renamed when complete.
#
# What is in it: mmdebstrap (Debian's apt-based debootstrap) of bookworm, variant minbase, from
# this machine's own apt sources, plus the packages in PACKAGES; Debian's runc (1.1.5, as on the
# host); from the caches of scripts/setup.sh: containerd $CONTAINERD2_VERSION (+ shim, ctr),
# kubelet $KUBERNETES_VERSION, crictl, and the reference plugins in /opt/cni/bin. The units:
#   vm-node-init.service    every boot, before the network and containerd: copies the run's seed
#                           (the second disk, label vm-seed, mounted at /seed: certificates,
#                           kubeconfig, kubelet and containerd configurations, node.env) into
#                           /etc, writes eth0's address for systemd-networkd, makes net1-parent
#                           (a veth pair: the macvlan parent of net1) and the DNAT of the
#                           `kubernetes` Service address to the API server (no kube-proxy)
#   containerd.service      as upstream's (KillMode=process, Delegate=yes); its root
#                           /var/lib/containerd is the run's third disk (label vm-containerd),
#                           holding the images (scripts/vm-node.sh imports them on the host)
#   kubelet.service         after containerd; --node-ip from node.env
#   qemu-guest-agent        the test's way in (virtio-serial): exec, files, the guest's clock
# The journal is persistent (/var/log/journal), so a boot's logs are read after the next.
# Needs root, mmdebstrap, mke2fs (e2fsprogs) and the binaries scripts/setup.sh builds.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/versions.sh
. scripts/versions.sh

SUITE=bookworm
PACKAGES=(systemd-sysv udev dbus iproute2 kmod procps iptables linux-image-amd64
  initramfs-tools runc qemu-guest-agent)
VM_CACHE=${CNI_GUARD_VM_CACHE:-/var/cache/cni-guard/vm}

say() { echo "vm-image: $*" >&2; }
die() { say "$*"; exit 1; }

recipe() {
  echo "suite=$SUITE"
  echo "packages=${PACKAGES[*]}"
  echo "containerd=$CONTAINERD2_VERSION kubernetes=$KUBERNETES_VERSION crictl=$CRICTL_VERSION plugins=$CNI_PLUGINS_VERSION"
  echo "script=$(sha256sum <"$0" | cut -d' ' -f1)"
}
DIR=$VM_CACHE/$SUITE-$(recipe | sha256sum | cut -c1-16)

# The machine's own apt sources that serve the suite (one-line .list or deb822 .sources files,
# as apt reads them): mmdebstrap pastes each file into the image's sources.
apt_sources() {
  local f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] && grep -qE "^[^#]*\b$SUITE\b" "$f" && echo "$f"
  done
  return 0
}

unit() { # NAME: stdin to the image's /etc/systemd/system/NAME
  cat >"$ROOT/etc/systemd/system/$1"
}

configure() {
  local b
  install -m 0755 "$CONTAINERD2_BIN"/{containerd,containerd-shim-runc-v2,ctr} \
    "$KUBERNETES_BIN/kubelet" "$CRICTL_BIN/crictl" "$ROOT/usr/local/bin/"
  mkdir -p "$ROOT/opt/cni/bin" "$ROOT/etc/cni/net.d" "$ROOT/etc/containerd" \
    "$ROOT/etc/kubernetes" "$ROOT/seed" "$ROOT/var/log/journal" "$ROOT/var/lib/containerd"
  for b in "$CNI_PLUGINS_BIN"/*; do install -m 0755 "$b" "$ROOT/opt/cni/bin/"; done

  echo cni-guard-vm >"$ROOT/etc/hostname"
  printf '127.0.0.1 localhost\n127.0.1.1 cni-guard-vm\n' >"$ROOT/etc/hosts"
  : >"$ROOT/etc/resolv.conf" # no name service: nothing here resolves names
  cat >"$ROOT/etc/fstab" <<'EOF'
/dev/vda / ext4 rw,errors=remount-ro 0 0
LABEL=vm-seed /seed ext4 ro,x-systemd.device-timeout=60s 0 0
LABEL=vm-containerd /var/lib/containerd ext4 rw,x-systemd.device-timeout=60s 0 0
EOF
  printf 'runtime-endpoint: unix:///run/containerd/containerd.sock\ntimeout: 30\n' >"$ROOT/etc/crictl.yaml"
  # The test's sandbox and pods run busybox's sleep as PID 1, which ignores SIGTERM (a real pause
  # container exits on it): systemd would wait its default 90 s for each container's scope at
  # every shutdown. Multus's daemon, the one process the test looks at, exits on SIGTERM at once.
  mkdir -p "$ROOT/etc/systemd/system.conf.d"
  printf '[Manager]\nDefaultTimeoutStopSec=10s\n' >"$ROOT/etc/systemd/system.conf.d/10-vm-node.conf"

  cat >"$ROOT/usr/local/sbin/vm-node-init" <<'EOF'
#!/bin/sh
# Every boot (vm-node-init.service): the run's seed into /etc, eth0's address, net1-parent,
# the `kubernetes` Service address to the API server (a route for it, or a local connect fails
# before the DNAT: no default route here).
set -eu
[ -f /seed/node.env ] || { echo "vm-node-init: no seed (/seed/node.env)" >&2; exit 1; }
. /seed/node.env
cp -a /seed/etc/. /etc/
mkdir -p /run/systemd/network
cat >/run/systemd/network/10-eth0.network <<NET
[Match]
Name=eth0
[Network]
Address=$NODE_CIDR
LinkLocalAddressing=no
IPv6AcceptRA=no
[Route]
Destination=$API_NET
Gateway=$GATEWAY
[Route]
Destination=$SERVICE_IP/32
Gateway=$GATEWAY
NET
ip link show net1-parent >/dev/null 2>&1 || ip link add net1-parent type veth peer name net1-peer
ip link set net1-parent up
ip link set net1-peer up
for chain in OUTPUT PREROUTING; do
  iptables -t nat -C "$chain" -d "$SERVICE_IP/32" -p tcp --dport 443 -j DNAT --to-destination "$API_IP:6443" 2>/dev/null ||
    iptables -t nat -A "$chain" -d "$SERVICE_IP/32" -p tcp --dport 443 -j DNAT --to-destination "$API_IP:6443"
done
EOF
  chmod 0755 "$ROOT/usr/local/sbin/vm-node-init"

  unit vm-node-init.service <<'EOF'
[Unit]
Description=the test node's seed, address and links
RequiresMountsFor=/seed
After=local-fs.target
Before=systemd-networkd.service containerd.service kubelet.service
DefaultDependencies=no
[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/local/sbin/vm-node-init
[Install]
WantedBy=multi-user.target
EOF
  # containerd's own unit (containerd.service in its repository), the binary in /usr/local/bin.
  unit containerd.service <<'EOF'
[Unit]
Description=containerd container runtime
After=network.target local-fs.target vm-node-init.service
Requires=vm-node-init.service
RequiresMountsFor=/var/lib/containerd
[Service]
ExecStartPre=-/sbin/modprobe overlay
ExecStart=/usr/local/bin/containerd
Type=notify
Delegate=yes
KillMode=process
Restart=always
RestartSec=5
LimitNPROC=infinity
LimitCORE=infinity
TasksMax=infinity
OOMScoreAdjust=-999
[Install]
WantedBy=multi-user.target
EOF
  unit kubelet.service <<'EOF'
[Unit]
Description=kubelet
After=containerd.service
Wants=containerd.service
[Service]
EnvironmentFile=/seed/node.env
ExecStart=/usr/local/bin/kubelet --config=/etc/kubernetes/kubelet.yaml --kubeconfig=/etc/kubernetes/kubelet.kubeconfig --node-ip=${NODE_IP} --v=2
Restart=always
RestartSec=2
[Install]
WantedBy=multi-user.target
EOF
  chroot "$ROOT" systemctl enable --quiet systemd-networkd.service vm-node-init.service \
    containerd.service kubelet.service
  # What a test node does not need at boot (timers, a console on a display it has not).
  chroot "$ROOT" systemctl mask --quiet apt-daily.timer apt-daily-upgrade.timer dpkg-db-backup.timer \
    e2scrub_all.timer e2scrub_reap.service fstrim.timer systemd-tmpfiles-clean.timer \
    getty@tty1.service \
    systemd-networkd-wait-online.service
}

build() {
  local t0=$SECONDS b src=()
  for b in "$CONTAINERD2_BIN/containerd" "$CONTAINERD2_BIN/containerd-shim-runc-v2" \
           "$CONTAINERD2_BIN/ctr" "$KUBERNETES_BIN/kubelet" "$CRICTL_BIN/crictl" "$CNI_PLUGINS_BIN/bridge"; do
    [ -x "$b" ] || die "$b is missing: run scripts/setup.sh"
  done
  command -v mmdebstrap >/dev/null || die "mmdebstrap is missing: run scripts/setup.sh"
  mapfile -t src < <(apt_sources)
  [ ${#src[@]} -gt 0 ] || die "no apt source for $SUITE in /etc/apt"
  rm -rf "$DIR.partial"
  mkdir -p "$DIR.partial"
  ROOT=$DIR.partial/rootfs
  say "building $DIR (mmdebstrap $SUITE from ${src[*]})"
  # The initramfs holds only what mounts the root (smaller, so a faster boot under emulation):
  # set before linux-image-amd64 is installed, which makes it.
  # shellcheck disable=SC2016 # $1 is the hook's
  mmdebstrap --variant=minbase --include="$(IFS=,; echo "${PACKAGES[*]}")" \
    --essential-hook='mkdir -p "$1/etc/initramfs-tools/conf.d" "$1/etc/initramfs-tools/hooks"
      echo MODULES=list >"$1/etc/initramfs-tools/conf.d/vm-node.conf"
      printf "%s\n" "#!/bin/sh" "[ \"\$1\" = prereqs ] && exit 0" ". /usr/share/initramfs-tools/hook-functions" \
        "manual_add_modules virtio_pci virtio_blk ext4" >"$1/etc/initramfs-tools/hooks/vm-node"
      chmod 0755 "$1/etc/initramfs-tools/hooks/vm-node"' \
    "$SUITE" "$ROOT" "${src[@]}" >"$DIR.partial/mmdebstrap.log" 2>&1 ||
    { tail -n 30 "$DIR.partial/mmdebstrap.log" >&2; die "mmdebstrap failed (log above)"; }
  configure
  cp "$ROOT"/boot/vmlinuz-* "$DIR.partial/vmlinuz"
  cp "$ROOT"/boot/initrd.img-* "$DIR.partial/initrd.img"
  mke2fs -q -t ext4 -L vm-root -d "$ROOT" "$DIR.partial/disk.raw" 3G >/dev/null
  rm -rf "$ROOT"
  recipe >"$DIR.partial/recipe"
  rm -rf "$DIR"
  mv "$DIR.partial" "$DIR"
  # Older recipes are of no further use (each is about 1 GB).
  find "$VM_CACHE" -mindepth 1 -maxdepth 1 -type d -name "$SUITE-*" ! -path "$DIR" -exec rm -rf {} +
  say "built $DIR in $((SECONDS - t0)) s ($(du -sh --apparent-size "$DIR/disk.raw" | cut -f1) disk, $(du -sh "$DIR/disk.raw" | cut -f1) used)"
}

case "${1:-}" in
  build)
    [ "$(id -u)" = 0 ] || die "needs root"
    mkdir -p "$VM_CACHE"
    exec 9>"$VM_CACHE/.build.lock"
    flock 9
    if [ -f "$DIR/disk.raw" ]; then say "present in $DIR"; else build; fi
    echo "$DIR" ;;
  path)
    [ -f "$DIR/disk.raw" ] || die "not built ($DIR): scripts/vm-image.sh build"
    echo "$DIR" ;;
  *) sed -n '2,8p' "$0" >&2; exit 2 ;;
esac
