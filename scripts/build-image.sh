#!/usr/bin/env bash
# Builds a single-layer OCI image as an OCI layout tarball, without any container engine:
#
#   scripts/build-image.sh sandbox OUT.tar [NAME]
#       the pod sandbox ("pause") image: Debian's static busybox, entrypoint a long sleep.
#       NAME defaults to localhost/cni-guard-test/sandbox:1
#   scripts/build-image.sh guard OUT.tar BINARY [NAME]
#       the init-container image: BINARY (cni-guard) as /cni-guard, entrypoint /cni-guard, plus
#       only the shared libraries it needs if it is dynamically linked.
#       NAME defaults to localhost/cni-guard:dev
#
# The tarball holds oci-layout, index.json (annotated io.containerd.image.name) and blobs by
# sha256; import it with `ctr -a SOCKET -n k8s.io images import OUT.tar`.
set -euo pipefail

usage() { sed -n '2,12p' "$0" >&2; exit 2; }
[ $# -ge 2 ] || usage
kind=$1 out=$2
case "$kind" in
  sandbox) name=${3:-localhost/cni-guard-test/sandbox:1} ;;
  guard) [ $# -ge 3 ] || usage; binary=$3; name=${4:-localhost/cni-guard:dev} ;;
  *) usage ;;
esac

# The shared objects a binary loads (none for a static one; ldd's exit code differs between
# static and static-pie binaries, so look at what it prints).
libs_of() { ldd "$1" 2>/dev/null | grep -oE '/[^ ]+' | sort -u || true; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rootfs=$work/rootfs layout=$work/layout
mkdir -p "$rootfs" "$layout/blobs/sha256"

case "$kind" in
  sandbox)
    busybox=/bin/busybox
    [ -x "$busybox" ] || { echo "build-image: $busybox missing (apt-get install busybox-static)" >&2; exit 1; }
    [ -z "$(libs_of "$busybox")" ] \
      || { echo "build-image: $busybox is not static (install busybox-static)" >&2; exit 1; }
    mkdir -p "$rootfs/bin"
    cp "$busybox" "$rootfs/bin/busybox"
    ln -s busybox "$rootfs/bin/sh"
    ln -s busybox "$rootfs/bin/sleep"
    entrypoint='["/bin/busybox","sleep","2147483647"]'
    ;;
  guard)
    [ -x "$binary" ] || { echo "build-image: $binary is not an executable" >&2; exit 1; }
    cp "$binary" "$rootfs/cni-guard"
    # A dynamically linked binary needs its loader and libraries: copy exactly those.
    for lib in $(libs_of "$binary"); do
      mkdir -p "$rootfs$(dirname "$lib")"
      cp -L "$lib" "$rootfs$lib"
    done
    entrypoint='["/cni-guard"]'
    ;;
esac

# Reproducible layer: sorted, owned by root, fixed mtime.
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$rootfs" -cf "$work/layer.tar" .

blob() { # FILE -> prints "sha256hex size" and stores the blob
  local sum size
  sum=$(sha256sum "$1" | cut -d' ' -f1)
  size=$(stat -c %s "$1")
  cp "$1" "$layout/blobs/sha256/$sum"
  echo "$sum $size"
}

read -r layer_sum layer_size < <(blob "$work/layer.tar")
arch=$(dpkg --print-architecture 2>/dev/null || echo amd64)

cat >"$work/config.json" <<EOF
{"architecture":"$arch","os":"linux","config":{"Entrypoint":$entrypoint,"Env":["PATH=/bin"]},"rootfs":{"type":"layers","diff_ids":["sha256:$layer_sum"]}}
EOF
read -r config_sum config_size < <(blob "$work/config.json")

cat >"$work/manifest.json" <<EOF
{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:$config_sum","size":$config_size},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:$layer_sum","size":$layer_size}]}
EOF
read -r manifest_sum manifest_size < <(blob "$work/manifest.json")

cat >"$layout/index.json" <<EOF
{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:$manifest_sum","size":$manifest_size,"annotations":{"io.containerd.image.name":"$name","org.opencontainers.image.ref.name":"${name##*:}"}}]}
EOF
echo '{"imageLayoutVersion":"1.0.0"}' >"$layout/oci-layout"

mkdir -p "$(dirname "$out")"
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$layout" -cf "$out" oci-layout index.json blobs
echo "build-image: $kind image $name -> $out (manifest sha256:$manifest_sum)"
echo "build-image: layer files: $(tar -tf "$work/layer.tar" | grep -v '/$' | sort | tr '\n' ' ')"
