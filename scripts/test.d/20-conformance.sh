#!/usr/bin/env bash
# The cnitool conformance suites (issues 3 and 11): cni-guard under the real cnitool and the
# reference plugins, in network namespaces the suites create and remove. Root only: locally
# without root they skip loudly; under CI=true a missing prerequisite fails.
#
# The eight suites run once per generation, PLUGINS:CNITOOL, each `debian` (bookworm's
# reference plugins 1.1.1 and the cnitool 1.1.2 built from its source package) or `current`
# (the releases pinned in scripts/versions.sh, built by scripts/setup.sh). STATUS and GC need
# cnitool 1.3.1: under a Debian cnitool the status and gc suites use the current one.
#
#   bash scripts/test.d/20-conformance.sh              every suite, every generation
#   bash scripts/test.d/20-conformance.sh race         only the tests whose name contains "race"
#   CONFORMANCE_GENERATIONS=current:current bash scripts/test.d/20-conformance.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/versions.sh
# The current generation's versions and folders, as the suites read them (conformance/src/generation.rs).
export CNI_VERSION CNI_PLUGINS_VERSION CNITOOL_GO_BIN CNI_PLUGINS_BIN DEBIAN_CNI_PLUGINS_BIN DEBIAN_CNITOOL

# debian:debian  the original pairing;         current:current  plugins 1.10 under cnitool 1.3.1;
# debian:current old plugins, newer runtime;   current:debian   new plugins, older runtime.
GENERATIONS=${CONFORMANCE_GENERATIONS:-debian:debian current:current debian:current current:debian}

echo "== conformance: building the guard, mini-multus and cni-tap (release)"
cargo build --release --locked -p cni-guard -p conformance --bins
export CNI_GUARD_BIN="${CARGO_TARGET_DIR:-$PWD/target}/release/cni-guard"
cargo test --release --locked -p conformance --test cnitool --no-run

log=$(mktemp /tmp/cg-conformance-log.XXXXXX)
trap 'rm -f "$log"' EXIT
failed=()
took=()
for g in $GENERATIONS; do
  plugins=${g%%:*} cnitool=${g#*:}
  echo "== conformance: cnitool suites, plugins=$plugins cnitool=$cnitool"
  start=$SECONDS
  if ! CONFORMANCE_PLUGINS=$plugins CONFORMANCE_CNITOOL=$cnitool \
    cargo test --release --locked -p conformance --test cnitool -- \
    --ignored --test-threads=1 --nocapture "$@" 2>&1 | tee -a "$log"; then
    failed+=("$g")
  fi
  took+=("plugins=$plugins cnitool=$cnitool took $((SECONDS - start)) s")
  echo "== conformance: ${took[-1]}"
done

# One line per suite and generation (versions' per-pair lines stay in the output above).
echo "== conformance: summary lines"
grep -E '^(test result|race-summary|race-detail|NOTE|status runtime|gc runtime|equivalence runtime|refusal runtime|concurrency runtime|del_without_delegate runtime)|^versions runtime=[^ ]+ plugins=[^ ]+:' "$log" || true
printf '%s\n' "${took[@]}"
if [ ${#failed[@]} -gt 0 ]; then
  echo "== conformance: FAILED for ${failed[*]}" >&2
  exit 1
fi
