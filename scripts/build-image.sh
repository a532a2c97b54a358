#!/usr/bin/env bash
# Builds OCI images as OCI layout tarballs, without any container engine:
#
#   scripts/build-image.sh sandbox OUT.tar [NAME]
#       the pod sandbox ("pause") image: Debian's static busybox, entrypoint a long sleep.
#       NAME defaults to localhost/cni-guard-test/sandbox:1
#   scripts/build-image.sh guard OUT.tar BINARY [NAME]
#       the DaemonSet's image: BINARY (the plugin, cni-guard) as /cni-guard and the node agent
#       beside it (cni-guard-agent in BINARY's folder) as /cni-guard-agent, the entrypoint, plus
#       only the shared libraries they need if they are dynamically linked.
#       NAME defaults to localhost/cni-guard:dev
#   scripts/build-image.sh release OUT.tar [NAME]
#       the release image: `cargo build --release --locked` of the static cni-guard for each
#       architecture in ARCHES (default "amd64 arm64" where this machine can build arm64: the
#       aarch64-unknown-linux-gnu target and aarch64-linux-gnu-gcc; an architecture asked for
#       in ARCHES that cannot be built is an error), each architecture's two binaries alone
#       (/cni-guard, the plugin; /cni-guard-agent, the entrypoint) in a single-layer image, all
#       under one image index. NAME defaults to
#       localhost/cni-guard:VERSION (the crate's). Builds go to target/image unless
#       CARGO_TARGET_DIR says otherwise.
#
# Reproducible: the same input gives the same bytes, so the same digests (the layer is sorted,
# owned by root, at mtime 0, with fixed modes; the JSON is written in one fixed form; nothing
# records when or where it was built; the release binaries are built with the checkout's and
# cargo's paths remapped). The release image's index digest is what the chart's image.digest
# takes.
#
# The tarball holds oci-layout, index.json (annotated io.containerd.image.name) and blobs by
# sha256; import it with `ctr -a SOCKET -n k8s.io images import OUT.tar`.
set -euo pipefail

usage() { sed -n '2,30p' "$0" >&2; exit 2; }
[ $# -ge 2 ] || usage
kind=$1 out=$2
repo=$(cd "$(dirname "$0")/.." && pwd)
case "$kind" in
  sandbox) name=${3:-localhost/cni-guard-test/sandbox:1} ;;
  guard) [ $# -ge 3 ] || usage; binary=$3; name=${4:-localhost/cni-guard:dev} ;;
  release)
    version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$repo/plugin/Cargo.toml")
    name=${3:-localhost/cni-guard:$version}
    ;;
  *) usage ;;
esac

# The shared objects a binary loads (none for a static one; ldd's exit code differs between
# static and static-pie binaries, so look at what it prints).
libs_of() { ldd "$1" 2>/dev/null | grep -oE '/[^ ]+' | sort -u || true; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
layout=$work/layout
mkdir -p "$layout/blobs/sha256"

# A reproducible tar of a folder: sorted, owned by root, mtime 0, modes fixed (directories and
# executables 0755, other files 0644) whatever the umask or the copies' modes were.
repro_tar() { # DIR OUT
  tar --format=gnu --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 \
    --mode='u=rwX,go=rX' -C "$1" -cf "$2" .
}

blob() { # FILE -> prints "sha256hex size" and stores the blob
  local sum size
  sum=$(sha256sum "$1" | cut -d' ' -f1)
  size=$(stat -c %s "$1")
  cp "$1" "$layout/blobs/sha256/$sum"
  echo "$sum $size"
}

# One single-layer image of ROOTFS for ARCH; prints "manifest-sha256 manifest-size".
image() { # ROOTFS ARCH ENTRYPOINT-JSON LABELS-JSON
  local rootfs=$1 arch=$2 entrypoint=$3 labels=$4 tmp layer_sum layer_size config_sum config_size
  tmp=$(mktemp -d -p "$work")
  repro_tar "$rootfs" "$tmp/layer.tar"
  read -r layer_sum layer_size < <(blob "$tmp/layer.tar")
  printf '{"architecture":"%s","os":"linux","config":{"Entrypoint":%s,"Env":["PATH=/bin"],"Labels":%s},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}\n' \
    "$arch" "$entrypoint" "$labels" "$layer_sum" >"$tmp/config.json"
  read -r config_sum config_size < <(blob "$tmp/config.json")
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:%s","size":%s}]}\n' \
    "$config_sum" "$config_size" "$layer_sum" "$layer_size" >"$tmp/manifest.json"
  echo "build-image: $arch layer files: $(tar -tf "$tmp/layer.tar" | grep -v '/$' | sort | tr '\n' ' ')" >&2
  blob "$tmp/manifest.json"
}

# index.json: one entry (MEDIA-TYPE DIGEST SIZE) named NAME; then the tarball.
finish() { # MEDIA-TYPE SUM SIZE
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"%s","digest":"sha256:%s","size":%s,"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}\n' \
    "$1" "$2" "$3" "$name" "${name##*:}" >"$layout/index.json"
  echo '{"imageLayoutVersion":"1.0.0"}' >"$layout/oci-layout"
  mkdir -p "$(dirname "$out")"
  tar --format=gnu --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 \
    --mode='u=rwX,go=rX' -C "$layout" -cf "$out" oci-layout index.json blobs
}

MANIFEST=application/vnd.oci.image.manifest.v1+json
INDEX=application/vnd.oci.image.index.v1+json
host_arch=$(dpkg --print-architecture 2>/dev/null || echo amd64)

case "$kind" in
  sandbox)
    busybox=/bin/busybox
    [ -x "$busybox" ] || { echo "build-image: $busybox missing (apt-get install busybox-static)" >&2; exit 1; }
    [ -z "$(libs_of "$busybox")" ] \
      || { echo "build-image: $busybox is not static (install busybox-static)" >&2; exit 1; }
    rootfs=$work/rootfs
    mkdir -p "$rootfs/bin"
    cp "$busybox" "$rootfs/bin/busybox"
    ln -s busybox "$rootfs/bin/sh"
    ln -s busybox "$rootfs/bin/sleep"
    read -r sum size < <(image "$rootfs" "$host_arch" '["/bin/busybox","sleep","2147483647"]' '{}' 2>"$work/files")
    finish "$MANIFEST" "$sum" "$size"
    echo "build-image: $kind image $name -> $out (manifest sha256:$sum)"
    echo "build-image: layer files: $(sed 's/^build-image: [^ ]* layer files: //' "$work/files")"
    ;;
  guard)
    agent=$(dirname "$binary")/cni-guard-agent
    for b in "$binary" "$agent"; do
      [ -x "$b" ] || { echo "build-image: $b is not an executable" >&2; exit 1; }
    done
    rootfs=$work/rootfs
    mkdir -p "$rootfs"
    cp "$binary" "$rootfs/cni-guard"
    cp "$agent" "$rootfs/cni-guard-agent"
    # A dynamically linked binary needs its loader and libraries: copy exactly those.
    for lib in $(libs_of "$binary") $(libs_of "$agent"); do
      mkdir -p "$rootfs$(dirname "$lib")"
      cp -L "$lib" "$rootfs$lib"
    done
    read -r sum size < <(image "$rootfs" "$host_arch" '["/cni-guard-agent"]' '{}' 2>"$work/files")
    finish "$MANIFEST" "$sum" "$size"
    echo "build-image: $kind image $name -> $out (manifest sha256:$sum)"
    echo "build-image: layer files: $(sed 's/^build-image: [^ ]* layer files: //' "$work/files")"
    ;;
  release)
    # What can be built here: amd64 natively; arm64 with the Rust target and a cross linker.
    can_arm64() {
      rustup target list --installed 2>/dev/null | grep -qx aarch64-unknown-linux-gnu &&
        command -v aarch64-linux-gnu-gcc >/dev/null
    }
    if [ -z "${ARCHES:-}" ]; then
      ARCHES=amd64
      if can_arm64; then
        ARCHES="amd64 arm64"
      else
        echo "build-image: arm64 left out: needs \`rustup target add aarch64-unknown-linux-gnu\` and aarch64-linux-gnu-gcc with libc6-dev-arm64-cross (apt-get install gcc-aarch64-linux-gnu libc6-dev-arm64-cross)" >&2
      fi
    fi
    cd "$repo"
    cargo_home=${CARGO_HOME:-$HOME/.cargo}
    export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$repo/target/image}
    # Where the build happened leaves no trace in the binaries (panic locations name paths).
    export RUSTFLAGS="--remap-path-prefix=$repo=/cni-guard --remap-path-prefix=$cargo_home=/cargo"
    commit=$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo "${CNI_GUARD_COMMIT:-unknown}")
    labels=$(printf '{"org.opencontainers.image.licenses":"Apache-2.0","org.opencontainers.image.revision":"%s","org.opencontainers.image.title":"cni-guard","org.opencontainers.image.version":"%s"}' "$commit" "$version")
    entries=()
    for arch in $ARCHES; do
      case "$arch" in
        amd64) target=x86_64-unknown-linux-gnu ;;
        arm64)
          can_arm64 || { echo "build-image: ARCHES asks for arm64, which this machine cannot build (see above)" >&2; exit 1; }
          target=aarch64-unknown-linux-gnu
          export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
          ;;
        *) echo "build-image: unknown architecture $arch (amd64, arm64)" >&2; exit 2 ;;
      esac
      cargo build --release --locked -p cni-guard -p cni-guard-agent --target "$target" >&2
      rootfs=$work/rootfs-$arch
      mkdir -p "$rootfs"
      sums=()
      for binary in cni-guard cni-guard-agent; do
        bin=$CARGO_TARGET_DIR/$target/release/$binary
        # Static, or it is no image for a node without glibc (Talos).
        if file "$bin" | grep -q 'dynamically linked'; then
          echo "build-image: $bin is dynamically linked" >&2
          exit 1
        fi
        cp "$bin" "$rootfs/$binary"
        sums+=("$binary sha256:$(sha256sum "$bin" | cut -d' ' -f1)")
      done
      read -r sum size < <(image "$rootfs" "$arch" '["/cni-guard-agent"]' "$labels")
      echo "build-image: linux/$arch manifest sha256:$sum (${sums[*]})"
      entries+=("$(printf '{"mediaType":"%s","digest":"sha256:%s","size":%s,"platform":{"architecture":"%s","os":"linux"}}' "$MANIFEST" "$sum" "$size" "$arch")")
    done
    (IFS=,; printf '{"schemaVersion":2,"mediaType":"%s","manifests":[%s]}\n' "$INDEX" "${entries[*]}") >"$work/image-index.json"
    read -r sum size < <(blob "$work/image-index.json")
    finish "$INDEX" "$sum" "$size"
    echo "build-image: release image $name ($ARCHES) -> $out"
    echo "build-image: digest sha256:$sum"
    ;;
esac
