#!/usr/bin/env bash
# Builds the tools scripts/test.d/45-helm.sh and 47-metrics.sh run, from the Go module proxy, pinned:
#   helm       helm.sh/helm/v4/cmd/helm                       v4.3.2
#   promtool   github.com/prometheus/prometheus/cmd/promtool  v0.316.0 (Prometheus 3.16)
#   actionlint github.com/rhysd/actionlint/cmd/actionlint     v1.7.12 (.github/workflows/)
#   crane      github.com/google/go-containerregistry/cmd/crane  v0.22.1 (the release's push, and a
#              registry in a test namespace: `crane registry serve`; the release workflow pins the same)
# Each goes into its own folder keyed by version under $CNI_GUARD_GO_CACHE (scripts/versions.sh),
# outside the clone, with CGO_ENABLED=0 and the same module and build caches as scripts/setup.sh.
# A second run builds nothing. Every version was checked to exist with `go list -m -versions`
# (actionlint: the newest listed in December 2026).
#
#   scripts/setup-helm.sh          # builds what is missing, prints where the binaries are
#   . scripts/setup-helm.sh --env  # (sourced) only sets HELM_MODULE ... CRANE_BIN, builds nothing
#
# Cold build cost measured on this project's 2-core machine (go1.26.8, nice -n 10, the cores
# shared with other builds, module cache already holding setup.sh's modules): helm 545 s,
# promtool 971 s (it pulls Prometheus's service-discovery dependencies); 25 min wall clock in all,
# 9.3 min of CPU. Binaries: helm 91M, promtool 118M. A second run: "present", under a second.
# On the 2026-12-04 cold setup (a slower machine) promtool took 561 s; rebuilt with
# remove_all_sd (below) it compiles a fraction of that (59 s with the module cache warm).
#
# (To be folded into scripts/setup.sh, with the versions in scripts/versions.sh.)
set -euo pipefail

HELM_MODULE=helm.sh/helm/v4
HELM_VERSION=v4.3.2
PROMTOOL_MODULE=github.com/prometheus/prometheus
PROMTOOL_VERSION=v0.316.0
PROMTOOL_RELEASE=3.16.0 # the release that module version is (v0.3XY.Z = 3.XY.Z)
ACTIONLINT_MODULE=github.com/rhysd/actionlint
ACTIONLINT_VERSION=v1.7.12
CRANE_MODULE=github.com/google/go-containerregistry
CRANE_VERSION=v0.22.1

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.sh
. "$here/versions.sh"
HELM_BIN=$CNI_GUARD_GO_CACHE/helm-$HELM_VERSION/bin             # helm
# promtool is built with Prometheus's own build tag remove_all_sd (plugins/plugin_*.go): none of
# its service discoveries (AWS, Azure, GCE, Kubernetes, ...), which `check rules`, `test rules`
# and `check metrics` never use and which are most of its build. The folder's name says so.
PROMTOOL_TAGS=remove_all_sd
PROMTOOL_BIN=$CNI_GUARD_GO_CACHE/promtool-$PROMTOOL_VERSION-$PROMTOOL_TAGS/bin # promtool
ACTIONLINT_BIN=$CNI_GUARD_GO_CACHE/actionlint-$ACTIONLINT_VERSION/bin # actionlint
CRANE_BIN=$CNI_GUARD_GO_CACHE/crane-$CRANE_VERSION/bin                # crane

if [ "${1:-}" = --env ]; then
  return 0 2>/dev/null || exit 0
fi

# go_build NAME DIR MODULE/cmd/X@VERSION [go install flags...]
go_build() {
  local name=$1 dir=$2 target=$3
  shift 3
  if [ -x "$dir/$name" ]; then
    echo "setup-helm: $name present ($dir)"
    return 0
  fi
  local go start
  go=$(cni_guard_go)
  mkdir -p "$GO_MODCACHE_DIR" "$GO_BUILDCACHE_DIR"
  start=$(date +%s)
  echo "setup-helm: building $target (CGO_ENABLED=0)"
  # Into a temporary folder first, so an interrupted build never looks present.
  rm -rf "$dir.tmp"
  mkdir -p "$dir.tmp"
  CGO_ENABLED=0 GOBIN="$dir.tmp" GOMODCACHE="$GO_MODCACHE_DIR" GOCACHE="$GO_BUILDCACHE_DIR" \
    GOFLAGS=-modcacherw nice -n "${GO_NICE_LEVEL:-10}" "$go" install "$@" "$target"
  rm -rf "$dir"
  mkdir -p "$(dirname "$dir")"
  mv "$dir.tmp" "$dir"
  echo "setup-helm: built $name in $(($(date +%s) - start)) s"
}

# helm stamps its version from these variables (else `helm version` says v4.x-dev).
go_build helm "$HELM_BIN" "$HELM_MODULE/cmd/helm@$HELM_VERSION" \
  -ldflags "-X helm.sh/helm/v4/internal/version.version=$HELM_VERSION"
go_build promtool "$PROMTOOL_BIN" "$PROMTOOL_MODULE/cmd/promtool@$PROMTOOL_VERSION" \
  -tags "$PROMTOOL_TAGS" -ldflags "-X github.com/prometheus/common/version.Version=$PROMTOOL_RELEASE"
# actionlint takes its version from the module's build info (go install MODULE@VERSION).
go_build actionlint "$ACTIONLINT_BIN" "$ACTIONLINT_MODULE/cmd/actionlint@$ACTIONLINT_VERSION"
go_build crane "$CRANE_BIN" "$CRANE_MODULE/cmd/crane@$CRANE_VERSION"
"$HELM_BIN/helm" version --short
"$PROMTOOL_BIN/promtool" --version 2>&1 | head -n1
echo "actionlint $("$ACTIONLINT_BIN/actionlint" -version | head -n1)"
echo "crane $("$CRANE_BIN/crane" version)"
