# shellcheck shell=bash
# Pinned versions of the components the suites run, and where their binaries are.
# Sourced (never run) by scripts/setup.sh, which builds the Go components, and by the suites:
#
#   . scripts/versions.sh
#   "$CONTAINERD2_BIN/containerd" --version
#
# Two generations stay side by side:
#   - Debian bookworm's packages (apt, scripts/setup.sh step 1): containerd 1.6.20, runc 1.1.5,
#     the reference plugins 1.1.1 in /usr/lib/cni, and cnitool built from Debian's source package;
#   - current releases, built by scripts/setup.sh step 3 with `go install MODULE/cmd/X@VERSION`
#     (CGO_ENABLED=0) from the Go module proxy, each into its own folder keyed by component and
#     version under $CNI_GUARD_GO_CACHE, outside the clone. containerd 2.x runs Debian's runc
#     (runc needs cgo; it is not rebuilt here).
# Every version below was checked to exist with `go list -m -versions MODULE`.
#
# Cold build cost on this project's 2-core machine (go1.26.8, CGO_ENABLED=0, shared with other
# builds, so +-50%): each component alone from empty module and build caches, downloads included:
#   containerd + shim + ctr 173 s (bin 107M) | crictl 83 s (39M) | cnitool 41 s (6.9M) |
#   8 reference plugins 57 s (50M).
# In setup.sh's order with the caches shared, from empty: 67 s + 30 s + 1.6 s + 5.6 s, 1m44s in
# all. A second run builds nothing ("present", 0.4 s). $CNI_GUARD_GO_CACHE then holds about
# 1.8G: module cache 0.8G, build cache 0.8G, binaries 0.2G.
# Issue 12's cluster adds (setup.sh prints wall time and /usr/bin/time's peak RSS; CPU time from
# /usr/bin/time -v), downloads included:
#   from empty module and build caches, the machine otherwise idle, in one cache in this order:
#   Multus 93 s (peak RSS 0.9G) | etcd 27 s (0.5G, most modules shared with Multus) | the 5
#   Kubernetes binaries 262 s wall = 408 s user + 93 s sys CPU (1.9G). About 6.5 min in all;
#   that cache then holds 1.3G of modules and 4.0G of build cache; binaries 0.55G.
#   through setup.sh on top of the caches above, the machine loaded by other builds (load
#   average 10-30): Kubernetes 1048 s (17.5 min; the same 397 s user + 91 s sys CPU), Multus
#   75 s, etcd 47 s.
# A second run builds nothing (setup.sh then takes ~5 s, most of it the final `du`).

# --- current generation (Go module proxy) -------------------------------------------------------
CONTAINERD2_MODULE=github.com/containerd/containerd/v2
CONTAINERD2_VERSION=v2.4.2
CRICTL_MODULE=sigs.k8s.io/cri-tools
CRICTL_VERSION=v1.37.0
CNI_MODULE=github.com/containernetworking/cni # cnitool and libcni (the oracle's go.mod pins the same)
CNI_VERSION=v1.3.1                            # the newest v1.3.x
CNI_PLUGINS_MODULE=github.com/containernetworking/plugins
CNI_PLUGINS_VERSION=v1.10.0
# The reference plugins built from CNI_PLUGINS_MODULE (package paths under plugins/).
CNI_PLUGINS_BUILT=(main/bridge main/ptp main/macvlan main/loopback main/ipvlan ipam/host-local
  meta/portmap meta/tuning)
# The single-node cluster of scripts/cluster.sh (issue 12). Kubernetes is built through a wrapper
# module that scripts/setup.sh generates from the published go.mod (k8s_wrapper_mod there): its
# go.mod replaces every k8s.io staging module with ./staging, so `go install` refuses it.
KUBERNETES_MODULE=k8s.io/kubernetes
KUBERNETES_VERSION=v1.36.3 # the proxy lists v1.36.1 v1.36.3 v1.37.2 (December 2026)
KUBERNETES_BUILT=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl)
# The store: etcd, the 3.6 line Kubernetes 1.36 is built against (its go.mod requires the
# v3.6.8 client), newest patch. Tried first and dropped: kine v0.17.5 (github.com/k3s-io/kine,
# sqlite through modernc.org/sqlite) builds and runs with CGO_ENABLED=0 (go install, 130 s), but
# under kube-apiserver v1.36.3 lease updates fail ("Precondition failed: UID in precondition:
# ..., UID in object meta: "), reads miss objects just created, and /readyz stays failing on
# autoregister-completion (with --watch-cache=false too).
ETCD_MODULE=go.etcd.io/etcd/server/v3
ETCD_VERSION=v3.6.16
MULTUS_MODULE=gopkg.in/k8snetworkplumbingwg/multus-cni.v4 # thick plugin: multus-daemon + multus-shim
MULTUS_VERSION=v4.3.0 # the proxy serves this exact version but no version list for the module
# The real Cilium of scripts/cluster.sh's CLUSTER_PRIMARY=cilium (issue 19): cilium-agent (package
# daemon) and cilium-cni, built through a wrapper module (its go.mod pins a gobgp pseudo-version the
# proxy refuses; the wrapper replaces it with the release below), CGO_ENABLED=0, -tags osusergo.
# v1.20.2: go 1.26.0, k8s.io libraries v0.36.x. cilium-operator is not built (one of its modules is
# refused by the proxy); the node runs without it (ipam kubernetes). The module's bpf/ (the C the
# agent compiles at run time with clang >= 18.1: Debian's clang-19) is copied next to the binaries,
# with its CRDs. Cold build through setup.sh (nice -n 10, module cache warm from the other
# components, machine loaded by other builds, load average 10-23): 1019 s wall (17 min), 590 s
# user + 117 s sys CPU, peak RSS 2.5G; cilium-agent 128M, cilium-cni 17M. A second run: "present".
CILIUM_MODULE=github.com/cilium/cilium
CILIUM_VERSION=v1.20.2
CILIUM_GOBGP_REPLACE="github.com/osrg/gobgp/v4 => github.com/osrg/gobgp/v4 v4.7.0"
# stakater/Reloader, which rolls Multus's DaemonSet when its daemon config changes (the
# annotation configmap.reloader.stakater.com/reload), for the cutover of several nodes. Its go.mod
# has replace directives (argo-rollouts'), so `go install X@V` refuses it: scripts/setup.sh builds
# it as the main module in a copy of the downloaded module. The proxy lists v1.4.22 only.
RELOADER_MODULE=github.com/stakater/Reloader
RELOADER_VERSION=v1.4.22
# Its go.mod asks for openshift/api at a commit the proxy does not serve (403): the nearest commit
# it serves, a week older, which openshift/client-go's apps/v1 builds against.
RELOADER_REPLACES="github.com/openshift/api=github.com/openshift/api@v0.0.0-20260326111139-30c2ef7a272e"
# The Go release these modules need at least (the newest `go` line among their go.mod files).
GO_MIN_VERSION=1.26.8

# Where they are built. Root's cache is system-wide; anyone else who cannot write there gets a
# private one (only scripts/test.d/25-libcni.sh, which needs no root, builds as non-root).
if [ -z "${CNI_GUARD_GO_CACHE:-}" ]; then
  if [ "$(id -u)" = 0 ] || [ -w /var/cache/cni-guard/go ]; then
    CNI_GUARD_GO_CACHE=/var/cache/cni-guard/go
  else
    CNI_GUARD_GO_CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/cni-guard/go
  fi
fi
GO_MODCACHE_DIR=$CNI_GUARD_GO_CACHE/mod   # GOMODCACHE for every build here
GO_BUILDCACHE_DIR=$CNI_GUARD_GO_CACHE/build # GOCACHE for every build here

CONTAINERD2_BIN=$CNI_GUARD_GO_CACHE/containerd-$CONTAINERD2_VERSION/bin # containerd, containerd-shim-runc-v2, ctr
CRICTL_BIN=$CNI_GUARD_GO_CACHE/crictl-$CRICTL_VERSION/bin                # crictl
CNITOOL_GO_BIN=$CNI_GUARD_GO_CACHE/cnitool-$CNI_VERSION/bin              # cnitool
CNI_PLUGINS_BIN=$CNI_GUARD_GO_CACHE/plugins-$CNI_PLUGINS_VERSION/bin     # bridge, ptp, ... (a CNI_PATH)
KUBERNETES_BIN=$CNI_GUARD_GO_CACHE/kubernetes-$KUBERNETES_VERSION/bin    # kube-apiserver, ..., kubectl
ETCD_BIN=$CNI_GUARD_GO_CACHE/etcd-$ETCD_VERSION/bin                      # etcd
MULTUS_BIN=$CNI_GUARD_GO_CACHE/multus-$MULTUS_VERSION/bin                # multus-daemon, multus-shim
CILIUM_BIN=$CNI_GUARD_GO_CACHE/cilium-$CILIUM_VERSION/bin  # cilium-agent, cilium-cni; clang, llc (-> *-19)
CILIUM_LIB=$CNI_GUARD_GO_CACHE/cilium-$CILIUM_VERSION/lib  # the agent's --lib-dir: bpf/ from the module
RELOADER_BIN=$CNI_GUARD_GO_CACHE/reloader-$RELOADER_VERSION/bin          # reloader

# --- Debian generation (apt) --------------------------------------------------------------------
DEBIAN_CONTAINERD=/usr/bin/containerd # 1.6.20 on bookworm
DEBIAN_RUNC=/usr/sbin/runc            # 1.1.5 on bookworm; also the runtime of containerd 2.x here
DEBIAN_CNI_PLUGINS_BIN=/usr/lib/cni   # 1.1.1 on bookworm
DEBIAN_CNITOOL=${CNITOOL:-/usr/local/bin/cnitool} # built by setup.sh from Debian's source package

# A `go` of at least GO_MIN_VERSION: /usr/local/go's first (Debian's golang-go, 1.19 on
# bookworm, may come first in PATH), else the one in PATH. Prints its path, or fails.
cni_guard_go() {
  local g v
  for g in /usr/local/go/bin/go "$(command -v go 2>/dev/null || true)"; do
    [ -n "$g" ] && [ -x "$g" ] || continue
    v=$("$g" env GOVERSION 2>/dev/null) || continue
    v=${v#go}
    if [ "$(printf '%s\n%s\n' "$GO_MIN_VERSION" "$v" | sort -V | head -n1)" = "$GO_MIN_VERSION" ]; then
      echo "$g"
      return 0
    fi
  done
  echo "no go >= $GO_MIN_VERSION found (looked at /usr/local/go/bin/go and PATH)" >&2
  return 1
}
