#!/usr/bin/env bash
# Installs what the test suites and the demo need on a fresh machine (idempotent).
# Without root it only checks and says what is missing.
#
# As root on Debian bookworm it:
#   1. installs the apt packages below (one `apt-get update`, only when something is missing);
#   2. builds cnitool from Debian's *source* package golang-github-appc-cni (cnitool/ ships only
#      there), offline: GOPATH mode against /usr/share/gocode, GOPROXY=off. The deb-src entry is
#      derived from this machine's own apt sources into a private sources dir with private lists,
#      so /etc/apt and /var/lib/apt/lists are left untouched. The binary goes to $CNITOOL.
#   3. builds the current releases pinned in scripts/versions.sh (containerd 2.x, crictl, cnitool,
#      the reference plugins) with `CGO_ENABLED=0 go install MODULE/cmd/X@VERSION` from the Go
#      module proxy, each into its own folder under $CNI_GUARD_GO_CACHE (/var/cache/cni-guard/go,
#      outside the clone; the module and build caches are there too). A component whose binaries
#      are all there is not rebuilt ("present"). Debian's generation (steps 1-2) stays as it is.
#      For the one-node cluster of scripts/cluster.sh also etcd, Multus (thick: multus-daemon,
#      multus-shim) and Kubernetes (kube-apiserver, kube-controller-manager, kube-scheduler,
#      kubelet, kubectl), each through a small wrapper module generated in a temp dir
#      (wrapper_mod below); Kubernetes is by far the longest build (500 s of CPU: 4.5 min on 2
#      idle cores, 17 min on loaded ones). Then Cilium's agent and CNI plugin (CLUSTER_PRIMARY=
#      cilium), the same way (700 s of CPU, 17 min on loaded cores); Helm and promtool
#      (scripts/setup-helm.sh); last the VM node's disk image (scripts/vm-image.sh: Debian from
#      mmdebstrap with containerd, kubelet and the plugins above, cached by recipe).
#
#   scripts/setup.sh                  # everything, in the foreground
#   scripts/setup.sh --background     # steps 1-2 and the containerd-side builds of 3 (what the
#                                     # cargo tests and the 20/25/30 suites need) in the
#                                     # foreground; the node's builds (etcd, Multus, Kubernetes,
#                                     # Reloader, then Cilium, Helm, promtool, the VM image) go on in the
#                                     # background at nice 19, logged to
#                                     # $CNI_GUARD_GO_CACHE/setup-background.log. The first
#                                     # three need Go alone: they start before apt (whose
#                                     # downloads leave the cores idle); the others wait for
#                                     # the packages (clang, mmdebstrap, ...)
#   scripts/setup.sh --wait cluster   # waits for etcd, Multus and Kubernetes (builds them here
#                                     # when no background build is there), checks them
#   scripts/setup.sh --wait reloader  # the same, then Reloader (the three-node suites)
#   scripts/setup.sh --wait           # the same for everything
# scripts/test.sh runs the tests that need none of the node's builds while they are made (a cold
# run's longest part: 20-30 min of Go builds on 2 cores). Each group of builds holds a lock
# ($CNI_GUARD_GO_CACHE/.setup-cluster.lock, .setup-reloader.lock, .setup-rest.lock) while it runs, so a second
# setup.sh waits for it instead of building into the same folders.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/versions.sh
. scripts/versions.sh

PACKAGES=(
  containernetworking-plugins # reference plugins in /usr/lib/cni
  iproute2 iptables           # namespaces, links, the portmap plugin's rules
  gcc-aarch64-linux-gnu libc6-dev-arm64-cross # the arm64 image (scripts/build-image.sh release)
  golang-go golang-github-appc-cni-dev dpkg-dev # building cnitool from source
  containerd runc busybox-static                # the containerd suites
  hyperfine                                     # the latency measurements
  shellcheck                                    # actionlint checks the workflows' run: scripts with it (45-helm.sh)
  clang-19 llvm-19 ipset                        # the Cilium agent's datapath (CLUSTER_PRIMARY=cilium)
  qemu-system-x86 qemu-utils mmdebstrap         # the VM node (scripts/vm-image.sh, 38-vm.sh)
)
CNITOOL=${CNITOOL:-/usr/local/bin/cnitool}
mode=all wait_for=
case "${1:-}" in
  '') ;;
  --background) mode=background ;;
  --wait)
    mode=wait wait_for=${2:-all}
    case "$wait_for" in cluster | reloader | all) ;; *) echo "setup: --wait cluster|reloader|all, not $wait_for" >&2; exit 2 ;; esac
    ;;
  *) echo "usage: scripts/setup.sh [--background | --wait [cluster|reloader|all]]" >&2; exit 2 ;;
esac
SRC_PACKAGE=golang-github-appc-cni

say() { echo "setup: $*"; }

if ! command -v cargo >/dev/null; then
  say "cargo is required" >&2
  exit 1
fi

missing_packages() {
  local p
  for p in "${PACKAGES[@]}"; do
    if [ "$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null)" != installed ]; then
      echo "$p"
    fi
  done
}

if [ "$(id -u)" != 0 ]; then
  missing=$(missing_packages | tr '\n' ' ')
  [ -n "$missing" ] && say "not root: NOT installing missing packages: $missing"
  [ -x "$CNITOOL" ] || command -v cnitool >/dev/null || say "not root: cnitool is not installed"
  for b in "$CONTAINERD2_BIN/containerd" "$CRICTL_BIN/crictl" "$CNITOOL_GO_BIN/cnitool" \
           "$CNI_PLUGINS_BIN/bridge" "$ETCD_BIN/etcd" "$MULTUS_BIN/multus-daemon" \
           "$KUBERNETES_BIN/kubelet" "$CILIUM_BIN/cilium-agent" "$CILIUM_BIN/cilium-cni" "$RELOADER_BIN/reloader"; do
    [ -x "$b" ] || say "not root: $b is not built"
  done
  say "not root: root-only suites will skip"
  exit 0
fi

apt_opts=(-o DPkg::Lock::Timeout=600 -o Dpkg::Use-Pty=0)

base_phase() {
# --- 1. packages -------------------------------------------------------------------------------
mapfile -t missing < <(missing_packages)
if [ "${#missing[@]}" -gt 0 ]; then
  say "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # No init system here: keep package scripts from trying to start daemons (containerd).
  policy=/usr/sbin/policy-rc.d
  policy_added=
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod 755 "$policy"
    policy_added=1
  fi
  apt-get "${apt_opts[@]}" update -q
  apt-get "${apt_opts[@]}" install -y -q --no-install-recommends "${missing[@]}"
  if [ -n "$policy_added" ]; then rm -f "$policy"; fi
else
  say "apt packages present"
fi

# The Rust target of the arm64 image (scripts/build-image.sh cross-builds it with the linker
# above); rustup keeps it with the toolchain, so a second run finds it.
if command -v rustup >/dev/null && ! rustup target list --installed | grep -qx aarch64-unknown-linux-gnu; then
  say "adding the Rust target aarch64-unknown-linux-gnu"
  rustup target add aarch64-unknown-linux-gnu
fi

# --- 2. cnitool from the source package, offline -----------------------------------------------

debian_cnitool() {
  scratch=$(mktemp -d /tmp/cni-guard-setup.XXXXXX)
  mkdir -p "$scratch/sources.list.d" "$scratch/lists/partial" "$scratch/cache/archives/partial" \
    "$scratch/src"
  : >"$scratch/sources.list"
  # apt downloads as the unprivileged _apt user when it can write the target dirs.
  chmod 0755 "$scratch"
  if id _apt >/dev/null 2>&1; then
    chown -R _apt "$scratch/lists" "$scratch/cache" "$scratch/src"
  fi

  codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
  [ -n "$codename" ] || { say "cannot tell the release codename from /etc/os-release" >&2; exit 1; }

  # Derive one deb-src entry per archive that serves the release's main suite, from the machine's
  # own configured sources (only *.list and *.sources are active, as apt itself reads them).
  derive_deb_src() {
    local f
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
      [ -f "$f" ] || continue
      # one-line format: deb [opts] URI SUITE COMPONENTS...
      awk -v suite="$codename" '
        $1 == "deb" {
          i = 2
          opts = ""
          if ($2 ~ /^\[/) { while ($i !~ /\]$/) { opts = opts " " $i; i++ } opts = opts " " $i; i++ }
          if ($(i + 1) != suite) next
          line = "deb-src" opts " " $i " " suite
          for (j = i + 2; j <= NF; j++) line = line " " $j
          print line
        }' "$f" >>"$scratch/sources.list"
    done
    for f in /etc/apt/sources.list.d/*.sources; do
      [ -f "$f" ] || continue
      # deb822 format: keep stanzas that list the release suite, as deb-src for that suite only.
      awk -v suite="$codename" '
        function flush() {
          if (types ~ /(^| )deb( |$)/ && (" " suites " ") ~ (" " suite " ") && uris != "" && enabled != "no") {
            print "Types: deb-src"
            print "URIs: " uris
            print "Suites: " suite
            print "Components: " comps
            if (signed != "") print "Signed-By: " signed
            print ""
          }
          types = uris = suites = comps = signed = enabled = ""
        }
        /^[ \t]*#/ { next }
        /^[ \t]*$/ { flush(); next }
        {
          key = tolower($1); sub(/:$/, "", key)
          val = $0; sub(/^[^:]*:[ \t]*/, "", val)
          if (key == "types") types = val
          else if (key == "uris") uris = val
          else if (key == "suites") suites = val
          else if (key == "components") comps = val
          else if (key == "signed-by") signed = val
          else if (key == "enabled") enabled = tolower(val)
        }
        END { flush() }' "$f" >>"$scratch/sources.list.d/deb-src.sources"
    done
  }
  derive_deb_src
  if [ ! -s "$scratch/sources.list" ] && [ ! -s "$scratch/sources.list.d/deb-src.sources" ]; then
    say "no apt source for suite $codename found to derive a deb-src entry from" >&2
    exit 1
  fi

  private_apt=("${apt_opts[@]}"
    -o Dir::Etc::SourceList="$scratch/sources.list"
    -o Dir::Etc::SourceParts="$scratch/sources.list.d"
    -o Dir::State::Lists="$scratch/lists"
    -o Dir::Cache="$scratch/cache"
    -o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache=)
  say "fetching the $SRC_PACKAGE source package (private apt lists in $scratch)"
  apt-get "${private_apt[@]}" update -q
  (cd "$scratch/src" && apt-get "${private_apt[@]}" source -q "$SRC_PACKAGE")

  srcdir=$(find "$scratch/src" -mindepth 1 -maxdepth 1 -type d -name "$SRC_PACKAGE-*" | head -n1)
  [ -d "$srcdir/cnitool" ] || { say "no cnitool/ in the source package" >&2; exit 1; }

  # GOPATH mode: put the source tree at its import path; dependencies come from /usr/share/gocode.
  gopath="$scratch/gopath"
  mkdir -p "$gopath/src/github.com/containernetworking"
  mv "$srcdir" "$gopath/src/github.com/containernetworking/cni"
  say "building cnitool offline"
  (
    cd "$gopath/src/github.com/containernetworking/cni/cnitool"
    GO111MODULE=off GOPATH="$gopath:/usr/share/gocode" GOPROXY=off GOFLAGS= CGO_ENABLED=0 \
      GOCACHE="$scratch/gocache" go build -o "$scratch/cnitool" .
  )
  install -D -m 0755 "$scratch/cnitool" "$CNITOOL"
  say "installed $CNITOOL"
}

if [ -x "$CNITOOL" ]; then
  say "cnitool present at $CNITOOL"
else
  debian_cnitool
fi
}

# --- 3. current releases from the Go module proxy (pinned in scripts/versions.sh) --------------
GO= # go_init, once the packages are there (golang-go comes from apt)
go_init() {
  GO=$(cni_guard_go)
  mkdir -p "$GO_MODCACHE_DIR" "$GO_BUILDCACHE_DIR"
  say "Go components: $GO ($("$GO" env GOVERSION)), cache $CNI_GUARD_GO_CACHE"
}

# The environment of every Go command here. -modcacherw: the module cache stays removable with
# rm -rf. GOTOOLCHAIN=local: never fetch another toolchain. GOPROXY and GOSUMDB are the
# environment's (Go's defaults).
go_env() {
  env CGO_ENABLED=0 GOTOOLCHAIN=local GOMODCACHE="$GO_MODCACHE_DIR" GOCACHE="$GO_BUILDCACHE_DIR" \
    GOFLAGS="-modcacherw -trimpath" "$@"
}

# go_component NAME DIR LDFLAGS BINARY... -- PACKAGE@VERSION...
# (a BINARY written NAME:BUILT is the file go writes as BUILT, renamed NAME)
# Builds into DIR.partial and renames it to DIR once every BINARY is there, so an interrupted
# build never passes for a finished one. Nothing is rebuilt when DIR/bin has every BINARY.
# With GO_MODULE_DIR set, the PACKAGEs (no @VERSION) are built with `go build` inside that
# module instead of `go install PACKAGE@VERSION` (the Kubernetes wrapper module).
# The wall time and peak memory (/usr/bin/time -v, when present) are printed.
go_component() {
  local name=$1 dir=$2 ldflags=$3
  shift 3
  local bins=() b missing=() start elapsed timing=() peak=
  while [ "$1" != -- ]; do bins+=("$1"); shift; done
  shift
  for b in "${bins[@]}"; do [ -x "$dir/bin/${b%%:*}" ] || missing+=("${b%%:*}"); done
  if [ "${#missing[@]}" = 0 ]; then
    say "$name present in $dir/bin"
    return
  fi
  say "building $name (${missing[*]} missing in $dir/bin)"
  rm -rf "$dir.partial"
  mkdir -p "$dir.partial/bin"
  if [ -x /usr/bin/time ]; then timing=(/usr/bin/time -v -o "$dir.partial/time.txt"); fi
  start=$(date +%s%N)
  if [ -n "${GO_MODULE_DIR:-}" ]; then
    (cd "$GO_MODULE_DIR" && go_env ${GO_NICE:-} "${timing[@]}" "$GO" build -ldflags="$ldflags" \
      ${GO_TAGS:+-tags=$GO_TAGS} -o "$dir.partial/bin/" "$@")
  else
    go_env GOBIN="$dir.partial/bin" "${timing[@]}" "$GO" install -ldflags="$ldflags" "$@"
  fi
  elapsed=$(( ($(date +%s%N) - start) / 1000000 ))
  if [ -f "$dir.partial/time.txt" ]; then
    peak=$(awk -F': ' '/Maximum resident set size/ {printf ", peak RSS %d MiB", $2 / 1024}' \
      "$dir.partial/time.txt")
    mv "$dir.partial/time.txt" "$dir.partial/build-time.txt"
  fi
  for b in "${bins[@]}"; do # NAME, or NAME:BUILT when go names the binary BUILT
    [ -x "$dir.partial/bin/${b#*:}" ] || { say "$name: go did not produce ${b#*:}" >&2; exit 1; }
    if [ "${b%%:*}" != "${b#*:}" ]; then mv "$dir.partial/bin/${b#*:}" "$dir.partial/bin/${b%%:*}"; fi
  done
  rm -rf "$dir"
  mv "$dir.partial" "$dir"
  say "built $name in $((elapsed / 1000)).$(printf '%03d' $((elapsed % 1000)))s$peak ($("$GO" env GOVERSION), CGO_ENABLED=0) into $dir/bin"
}

# wrapper_mod DIR MODULE VERSION TOOL_PACKAGE...
# Writes into DIR a module that requires MODULE at VERSION and lists each TOOL_PACKAGE as a `tool`
# (so `go mod tidy` resolves exactly what they import), then tidies it; build the tools there
# with GO_MODULE_DIR=DIR go_component. Three modules need this instead of `go install X@V`:
#  - k8s.io/kubernetes: its published go.mod replaces every k8s.io staging module with
#    ./staging/src/k8s.io/NAME, so `go install` refuses it (and a dependency's replaces count for
#    nothing anyway). The wrapper replaces each staging module named there with its published
#    v0.MINOR.PATCH (they come and go between releases, so the list is read, not written down),
#    and copies its `godebug` lines (the main module's to set).
#  - Multus: the proxy serves v4.3.0 but refuses the module's version list (403), which
#    `go install X@V` reads to look for a deprecation notice;
#  - etcd's server module: its go.mod replaces its sibling modules with ../api and so on (the
#    wrapper needs no replace: the published requires name real versions).
wrapper_mod() {
  local dir=$1 module=$2 version=$3 gomod rest t
  shift 3
  gomod=$(go_env "$GO" mod download -json "$module@$version" |
    sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
  [ -f "$gomod" ] || { say "no go.mod for $module@$version" >&2; exit 1; }
  {
    echo "// Generated by scripts/setup.sh to build $module@$version."
    echo "module wrapper-build"
    echo
    sed -n 's/^go \([0-9.]*\)$/go \1/p' "$gomod"
    sed -n '/^godebug /p' "$gomod"
    echo
    echo "require $module $version"
    if [ "$module" = "$CILIUM_MODULE" ]; then
      echo
      echo "replace $CILIUM_GOBGP_REPLACE"
    fi
    if [ "$module" = "$KUBERNETES_MODULE" ]; then
      rest=${version#v1.}
      echo
      echo "replace ("
      # `replace ( ... )` blocks and single `replace X => ./staging/...` lines.
      awk '/^replace \($/ { r = 1; next } r && /^\)/ { r = 0; next }
           r && $2 == "=>" && $3 ~ /^\.\/staging\// { print $1 }
           /^replace [^(]/ && $3 == "=>" && $4 ~ /^\.\/staging\// { print $2 }' "$gomod" |
        sort -u | while read -r m; do printf '\t%s => %s v0.%s\n' "$m" "$m" "$rest"; done
      echo ")"
    fi
    echo
    for t in "$@"; do echo "tool $t"; done
  } >"$dir/go.mod"
  if [ "$module" = "$KUBERNETES_MODULE" ] && ! grep -q "=> k8s.io/" "$dir/go.mod"; then
    say "no staging module found in $gomod" >&2
    exit 1
  fi
  (cd "$dir" && go_env "$GO" mod tidy)
}

# wrapped_component NAME DIR LDFLAGS MODULE VERSION BINARY... -- PACKAGE...
# go_component through a wrapper module (wrapper_mod), made only when something is missing.
wrapped_component() {
  local name=$1 dir=$2 ldflags=$3 module=$4 version=$5 b bins=() absent='' work
  shift 5
  while [ "$1" != -- ]; do bins+=("$1"); shift; done
  shift
  for b in "${bins[@]}"; do [ -x "$dir/bin/${b%%:*}" ] || absent=1; done
  if [ -z "$absent" ]; then
    say "$name present in $dir/bin"
    return
  fi
  work=$(mktemp -d /tmp/cni-guard-wrapper.XXXXXX)
  wrappers+=("$work")
  say "$name: wrapper module in $work"
  wrapper_mod "$work" "$module" "$version" "$@"
  GO_MODULE_DIR=$work go_component "$name" "$dir" "$ldflags" "${bins[@]}" -- "$@"
}
# copied_component NAME DIR LDFLAGS MODULE VERSION BINARY... -- PACKAGE...
# go_component inside a writable copy of MODULE@VERSION as downloaded, built as the main module
# (its replace directives then apply), made only when something is missing.
copied_component() {
  local name=$1 dir=$2 ldflags=$3 module=$4 version=$5 b bins=() absent='' work src
  shift 5
  while [ "$1" != -- ]; do bins+=("$1"); shift; done
  shift
  for b in "${bins[@]}"; do [ -x "$dir/bin/${b%%:*}" ] || absent=1; done
  if [ -z "$absent" ]; then
    say "$name present in $dir/bin"
    return
  fi
  src=$(go_env "$GO" mod download -json "$module@$version" |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  [ -f "$src/go.mod" ] || { say "no module source for $module@$version" >&2; exit 1; }
  work=$(mktemp -d /tmp/cni-guard-module.XXXXXX)
  wrappers+=("$work")
  cp -r "$src/." "$work/"
  chmod -R u+w "$work"
  # COPY_REPLACES="OLD=NEW@V ...": dependencies pinned to versions the proxy serves; go.sum is
  # brought to match for the packages the build needs (not `tidy`: the module's tests need
  # modules the proxy does not serve).
  if [ -n "${COPY_REPLACES:-}" ]; then
    for r in $COPY_REPLACES; do (cd "$work" && go_env "$GO" mod edit -replace "$r"); done
    (cd "$work" && go_env "$GO" list -mod=mod -deps "$@" >/dev/null)
  fi
  GO_MODULE_DIR=$work go_component "$name" "$dir" "$ldflags" "${bins[@]}" -- "$@"
}
scratch= # debian_cnitool's work dir
wrappers=()
trap 'rm -rf "${wrappers[@]}"; if [ -n "$scratch" ]; then rm -rf "$scratch"; fi' EXIT

runtime_builds() {
  go_component "containerd $CONTAINERD2_VERSION" "$(dirname "$CONTAINERD2_BIN")" \
    "-X $CONTAINERD2_MODULE/version.Version=$CONTAINERD2_VERSION" \
    containerd containerd-shim-runc-v2 ctr -- \
    "$CONTAINERD2_MODULE/cmd/containerd@$CONTAINERD2_VERSION" \
    "$CONTAINERD2_MODULE/cmd/containerd-shim-runc-v2@$CONTAINERD2_VERSION" \
    "$CONTAINERD2_MODULE/cmd/ctr@$CONTAINERD2_VERSION"
  go_component "crictl $CRICTL_VERSION" "$(dirname "$CRICTL_BIN")" \
    "-X $CRICTL_MODULE/pkg/version.Version=$CRICTL_VERSION" \
    crictl -- "$CRICTL_MODULE/cmd/crictl@$CRICTL_VERSION"
  go_component "cnitool $CNI_VERSION" "$(dirname "$CNITOOL_GO_BIN")" "" \
    cnitool -- "$CNI_MODULE/cnitool@$CNI_VERSION"
  plugin_names=() plugin_pkgs=()
  for p in "${CNI_PLUGINS_BUILT[@]}"; do
    plugin_names+=("${p##*/}")
    plugin_pkgs+=("$CNI_PLUGINS_MODULE/plugins/$p@$CNI_PLUGINS_VERSION")
  done
  go_component "reference plugins $CNI_PLUGINS_VERSION" "$(dirname "$CNI_PLUGINS_BIN")" \
    "-X $CNI_PLUGINS_MODULE/pkg/utils/buildversion.BuildVersion=$CNI_PLUGINS_VERSION" \
    "${plugin_names[@]}" -- "${plugin_pkgs[@]}"
  # What was built answers for its version (a wrong pin or a broken build fails here).
  "$CONTAINERD2_BIN/containerd" --version | grep -qF " $CONTAINERD2_VERSION" \
    || { say "$CONTAINERD2_BIN/containerd does not report $CONTAINERD2_VERSION" >&2; exit 1; }
  "$CRICTL_BIN/crictl" --version | grep -qF "$CRICTL_VERSION" \
    || { say "$CRICTL_BIN/crictl does not report $CRICTL_VERSION" >&2; exit 1; }
  usage=$("$CNITOOL_GO_BIN/cnitool" 2>&1 </dev/null || true)
  grep -qE '^  add +Add network interface' <<<"$usage" \
    || { say "$CNITOOL_GO_BIN/cnitool does not print its usage: $usage" >&2; exit 1; }
  # Without CNI_COMMAND a reference plugin prints "CNI bridge plugin vX.Y.Z" (its build version).
  about=$("$CNI_PLUGINS_BIN/bridge" </dev/null 2>&1 || true)
  grep -qF "plugin $CNI_PLUGINS_VERSION" <<<"$about" \
    || { say "$CNI_PLUGINS_BIN/bridge does not report $CNI_PLUGINS_VERSION: $about" >&2; exit 1; }
  echo '{"cniVersion":"1.1.0"}' | CNI_COMMAND=VERSION "$CNI_PLUGINS_BIN/bridge" | grep -qF '"1.1.0"' \
    || { say "$CNI_PLUGINS_BIN/bridge VERSION does not list 1.1.0" >&2; exit 1; }
  say "$("$CONTAINERD2_BIN/containerd" --version); $("$CRICTL_BIN/crictl" --version); $(head -n1 <<<"$about")"
  say "runc for containerd $CONTAINERD2_VERSION: Debian's $($DEBIAN_RUNC --version | head -n1)"
}

# The node's builds, part 1 (scripts/cluster.sh's bridge stand-in needs only these).
cluster_builds() {
  # etcd: its go.mod replaces its sibling modules with ../api etc., so it goes through a wrapper
  # module too; its main package is the module's root, which go names "server" (major suffix).
  wrapped_component "etcd $ETCD_VERSION" "$(dirname "$ETCD_BIN")" \
    "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=$ETCD_VERSION" \
    "$ETCD_MODULE" "$ETCD_VERSION" etcd:server -- "$ETCD_MODULE"
  multus_ldflags=
  for kv in "version=$MULTUS_VERSION" gitTreeState=clean releaseStatus=released; do
    multus_ldflags+=" -X $MULTUS_MODULE/pkg/multus.$kv"
  done

  wrapped_component "Multus $MULTUS_VERSION" "$(dirname "$MULTUS_BIN")" "$multus_ldflags" \
    "$MULTUS_MODULE" "$MULTUS_VERSION" multus-daemon multus-shim -- \
    "$MULTUS_MODULE/cmd/multus-daemon" "$MULTUS_MODULE/cmd/multus-shim"
  # Kubernetes: the version variables as its own build sets them (hack/lib/version.sh).
  k8s_minor=${KUBERNETES_VERSION#v1.}
  k8s_minor=${k8s_minor%%.*}
  k8s_ldflags="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    for kv in "gitVersion=$KUBERNETES_VERSION" gitMajor=1 "gitMinor=$k8s_minor" \
              gitTreeState=clean buildDate=1970-01-01T00:00:00Z; do
      k8s_ldflags+=" -X $pkg.$kv"
    done
  done
  k8s_pkgs=()
  for b in "${KUBERNETES_BUILT[@]}"; do k8s_pkgs+=("$KUBERNETES_MODULE/cmd/$b"); done
  wrapped_component "Kubernetes $KUBERNETES_VERSION" "$(dirname "$KUBERNETES_BIN")" "$k8s_ldflags" \
    "$KUBERNETES_MODULE" "$KUBERNETES_VERSION" "${KUBERNETES_BUILT[@]}" -- "${k8s_pkgs[@]}"

  # What was built answers for its version.
  for b in "${KUBERNETES_BUILT[@]}"; do
    [ "$b" = kubectl ] && v=$("$KUBERNETES_BIN/$b" version --client 2>&1) || v=$("$KUBERNETES_BIN/$b" --version 2>&1)
    grep -qF "$KUBERNETES_VERSION" <<<"$v" \
      || { say "$KUBERNETES_BIN/$b does not report $KUBERNETES_VERSION: $v" >&2; exit 1; }
  done
  v=$("$ETCD_BIN/etcd" --version 2>&1)
  grep -qF "etcd Version: ${ETCD_VERSION#v}" <<<"$v" \
    || { say "$ETCD_BIN/etcd does not report $ETCD_VERSION: $v" >&2; exit 1; }
  for b in multus-daemon multus-shim; do
    v=$("$MULTUS_BIN/$b" -version 2>&1 || true)
    grep -qF "version:$MULTUS_VERSION" <<<"$v" \
      || { say "$MULTUS_BIN/$b does not report $MULTUS_VERSION: $v" >&2; exit 1; }
  done
  say "Kubernetes $KUBERNETES_VERSION; etcd $ETCD_VERSION; Multus $MULTUS_VERSION"
}

# Part 1b: stakater/Reloader (the three-node suites, conformance/k8s/several-nodes.sh; by hand,
# beside 35-kubernetes.sh's cluster if wanted: `scripts/setup.sh --wait reloader` waits for it).
reloader_builds() {
  GO_NICE="nice -n 10" COPY_REPLACES=$RELOADER_REPLACES copied_component "Reloader $RELOADER_VERSION" \
    "$(dirname "$RELOADER_BIN")" "-s -w" "$RELOADER_MODULE" "$RELOADER_VERSION" reloader:Reloader -- .
  [ -x "$RELOADER_BIN/reloader" ] || { say "$RELOADER_BIN/reloader was not built" >&2; exit 1; }
  say "Reloader $RELOADER_VERSION"
}

# Part 2: Cilium (37-cilium.sh), then Helm and promtool (45-helm.sh, 47-metrics.sh).
rest_builds() {
  # Cilium: the agent and its CNI plugin (issue 19), niced (the longest build after Kubernetes); the
  # version string as its Makefile.defs stamps it ("1.20.2 <revision>"). Then the module's bpf/ into
  # $CILIUM_LIB (the agent's --lib-dir), its CRDs into $CILIUM_LIB/crds, and clang/llc links to Debian's -19 tools next to the agent
  # (the agent runs `clang` from PATH; bookworm's default clang is 14, too old for v1.20's bpf/).
  cilium_dir=$(dirname "$CILIUM_BIN")
  GO_NICE="nice -n 10" GO_TAGS=osusergo wrapped_component "Cilium $CILIUM_VERSION" "$cilium_dir" \
    "-s -w -X '$CILIUM_MODULE/pkg/version.ciliumVersion=${CILIUM_VERSION#v} $CILIUM_VERSION'" \
    "$CILIUM_MODULE" "$CILIUM_VERSION" cilium-agent:daemon cilium-cni -- \
    "$CILIUM_MODULE/daemon" "$CILIUM_MODULE/plugins/cilium-cni"
  if [ ! -f "$CILIUM_LIB/bpf/bpf_lxc.c" ] || [ ! -d "$CILIUM_LIB/crds/v2" ]; then
    cilium_src=$(go_env "$GO" mod download -json "$CILIUM_MODULE@$CILIUM_VERSION" |
      sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
    [ -f "$cilium_src/bpf/bpf_lxc.c" ] || { say "no bpf/ in $cilium_src" >&2; exit 1; }
    rm -rf "$CILIUM_LIB.partial"
    mkdir -p "$CILIUM_LIB.partial"
    cp -r "$cilium_src/bpf" "$CILIUM_LIB.partial/"
    # The CRDs the agent needs (it exits when they are missing; without the operator nobody else
    # registers them): pkg/k8s/apis/cilium.io/client/crds/{v2,v2alpha1}/*.yaml.
    cp -r "$cilium_src/pkg/k8s/apis/cilium.io/client/crds" "$CILIUM_LIB.partial/crds"
    chmod -R u+w "$CILIUM_LIB.partial"
    rm -rf "$CILIUM_LIB"
    mv "$CILIUM_LIB.partial" "$CILIUM_LIB"
    say "copied $CILIUM_MODULE@$CILIUM_VERSION's bpf/ and CRDs into $CILIUM_LIB"
  fi
  ln -sfn /usr/bin/clang-19 "$CILIUM_BIN/clang"
  ln -sfn /usr/bin/llc-19 "$CILIUM_BIN/llc"

  v=$("$CILIUM_BIN/cilium-agent" --version 2>&1 || true)
  grep -qF "${CILIUM_VERSION#v}" <<<"$v" \
    || { say "$CILIUM_BIN/cilium-agent does not report $CILIUM_VERSION: $v" >&2; exit 1; }
  v=$(echo '{"cniVersion":"1.0.0"}' | CNI_COMMAND=VERSION "$CILIUM_BIN/cilium-cni" 2>&1 || true)
  grep -qF '"1.0.0"' <<<"$v" \
    || { say "$CILIUM_BIN/cilium-cni VERSION does not list 1.0.0: $v" >&2; exit 1; }
  "$CILIUM_BIN/clang" --version | grep -qE 'clang version (19|[2-9][0-9])\.' \
    || { say "$CILIUM_BIN/clang is not clang >= 19" >&2; exit 1; }
  say "Cilium $CILIUM_VERSION"

  # --- Helm and promtool (the chart's and the metrics' tests), pinned and cached the same way ---
  bash scripts/setup-helm.sh

  # --- the VM node's disk image (38-vm.sh): Debian from mmdebstrap with the binaries above,
  # cached by recipe under /var/cache/cni-guard/vm ---
  bash scripts/vm-image.sh build >/dev/null

}

# --- what runs where ---------------------------------------------------------------------------
LOCKS=$CNI_GUARD_GO_CACHE
BG_LOG=$CNI_GUARD_GO_CACHE/setup-background.log # the background build's output
BG_STATUS=$CNI_GUARD_GO_CACHE/setup-background.status # cluster=RC / rest=RC, as each ends
BASE_DONE=$CNI_GUARD_GO_CACHE/.setup-base.done # the foreground's packages are in (--background)

# group FUNCTION: FUNCTION in a subshell of its own that stops at its first failure and removes
# the wrapper modules it made.
group() {
  (
    set -e
    trap 'rm -rf "${wrappers[@]}"' EXIT
    "$1"
  )
}

# locked GROUP FUNCTION: FUNCTION under GROUP's lock (waits for a build of it elsewhere).
locked() {
  mkdir -p "$LOCKS"
  (flock 9; group "$2") 9>"$LOCKS/.setup-$1.lock"
}

# Prints what the background build wrote since the last call.
show_background() {
  local shown size
  [ -f "$BG_LOG" ] || return 0
  shown=$(cat "$BG_LOG.shown" 2>/dev/null || echo 0)
  size=$(stat -c %s "$BG_LOG")
  if [ "$size" -gt "$shown" ]; then
    tail -c +"$((shown + 1))" "$BG_LOG" | sed 's/^/  [background] /'
  fi
  echo "$size" >"$BG_LOG.shown"
}

# wait_group GROUP FUNCTION: waits for a background build of GROUP, prints its output, then runs
# FUNCTION here under the lock: a no-op check when the background built it all, the build itself
# when it failed or never started.
wait_group() {
  local name=$1 start=$SECONDS
  mkdir -p "$LOCKS"
  (
    flock -n 9 || { say "waiting for the background build ($name; log $BG_LOG)"; flock 9; }
    show_background
    rc=$({ sed -n "s/^$name=//p" "$BG_STATUS" 2>/dev/null || true; } | tail -n1) # none: no background build
    if [ -n "$rc" ] && [ "$rc" != 0 ]; then
      say "the background build of $name failed (exit $rc, above): building it here"
    fi
    group "$2"
  ) 9>"$LOCKS/.setup-$name.lock"
  say "$name ready after $((SECONDS - start)) s of waiting and checking"
}

start_background() {
  mkdir -p "$LOCKS"
  exec 7>"$LOCKS/.setup-reloader.lock" 8>"$LOCKS/.setup-cluster.lock" 9>"$LOCKS/.setup-rest.lock"
  if ! flock -n 7 || ! flock -n 8 || ! flock -n 9; then
    exec 7>&- 8>&- 9>&-
    say "another setup.sh is building (a lock is held): --wait waits for it"
    return
  fi
  : >"$BG_LOG"
  echo 0 >"$BG_LOG.shown"
  : >"$BG_STATUS"
  rm -f "$BASE_DONE"
  local setup_pid=$$
  (
    renice -n 19 -p "$BASHPID" >/dev/null
    exec </dev/null >>"$BG_LOG" 2>&1
    set +e
    group cluster_builds
    echo "cluster=$?" >>"$BG_STATUS"
    exec 8>&- # 35-kubernetes.sh may go on
    group reloader_builds
    echo "reloader=$?" >>"$BG_STATUS"
    exec 7>&- # its three-node suites too
    # The rest needs the apt packages: it waits for the foreground's base phase.
    while [ ! -e "$BASE_DONE" ]; do
      if ! kill -0 "$setup_pid" 2>/dev/null; then
        echo "setup: the foreground setup.sh ended before its packages were in: the rest is not built"
        echo "rest=1" >>"$BG_STATUS"
        exit 1
      fi
      sleep 1
    done
    group rest_builds
    echo "rest=$?" >>"$BG_STATUS"
  ) &
  exec 7>&- 8>&- 9>&-
  say "building etcd, Multus, Kubernetes, Reloader, then Cilium, Helm, promtool and the VM image in the background (pid $!, nice 19, log $BG_LOG)"
}

case $mode in
  all)
    base_phase
    go_init
    runtime_builds
    locked cluster cluster_builds
    locked reloader reloader_builds
    locked rest rest_builds
    ;;
  background)
    go_init
    start_background
    base_phase
    touch "$BASE_DONE"
    runtime_builds
    ;;
  wait)
    go_init
    wait_group cluster cluster_builds
    if [ "$wait_for" != cluster ]; then wait_group reloader reloader_builds; fi
    if [ "$wait_for" = all ]; then wait_group rest rest_builds; fi
    ;;
esac
