#!/usr/bin/env bash
# libcni as the oracle (issue 11 item 6): a table of network configurations, each run through
# libcni itself and through cni-guard (the same configuration as the guard's delegate, the
# guard invoked through libcni), with recording fake plugins; every plugin's stdin and CNI_*
# environment and every result or error must match, but for the purposeful differences the
# table names. No root, no network namespaces: it never skips (CI=true or not).
#
#   bash scripts/test.d/25-libcni.sh            every case
#   bash scripts/test.d/25-libcni.sh -run fail  only the cases whose name contains "fail"
#   bash scripts/test.d/25-libcni.sh -v         also print every case's calls
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=scripts/versions.sh
. scripts/versions.sh

echo "== libcni oracle: building the guard (release)"
cargo build --release --locked -p cni-guard
export CNI_GUARD_BIN="${CARGO_TARGET_DIR:-$PWD/target}/release/cni-guard"

GO=$(cni_guard_go) || { echo "25-libcni: FAIL: Go $GO_MIN_VERSION or newer is needed" >&2; exit 1; }
mkdir -p "$GO_MODCACHE_DIR" "$GO_BUILDCACHE_DIR"
out=$(mktemp -d /tmp/cni-guard-libcni.XXXXXX)
trap 'rm -rf "$out"' EXIT
echo "== libcni oracle: building it and its fake plugin ($("$GO" env GOVERSION), libcni $CNI_VERSION)"
(
  cd conformance/libcni-oracle
  # go.sum is committed: -mod=readonly refuses to change go.mod or go.sum.
  export CGO_ENABLED=0 GOTOOLCHAIN=local GOMODCACHE="$GO_MODCACHE_DIR" GOCACHE="$GO_BUILDCACHE_DIR" \
    GOFLAGS="-mod=readonly -modcacherw"
  grep -qx "require github.com/containernetworking/cni $CNI_VERSION" go.mod \
    || { echo "25-libcni: FAIL: go.mod does not pin libcni $CNI_VERSION (scripts/versions.sh)" >&2; exit 1; }
  unformatted=$("$(dirname "$GO")/gofmt" -l .)
  [ -z "$unformatted" ] || { echo "25-libcni: FAIL: not gofmt'ed: $unformatted" >&2; exit 1; }
  "$GO" vet ./...
  "$GO" build -o "$out/libcni-oracle" .
  "$GO" build -o "$out/fake" ./cmd/fake
)

echo "== libcni oracle: cases"
"$out/libcni-oracle" -fake "$out/fake" "$@"
