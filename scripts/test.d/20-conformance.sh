#!/usr/bin/env bash
# The cnitool conformance suites (issue 3): cni-guard under the real cnitool and the reference
# plugins, in network namespaces the suites create and remove. Root only: locally without root
# they skip loudly; under CI=true a missing prerequisite fails.
#
#   bash scripts/test.d/20-conformance.sh              all six suites
#   bash scripts/test.d/20-conformance.sh race         only the tests whose name contains "race"
set -euo pipefail
cd "$(dirname "$0")/../.."

echo "== conformance: building the guard, mini-multus and cni-tap (release)"
cargo build --release --locked -p cni-guard -p conformance --bins
export CNI_GUARD_BIN="${CARGO_TARGET_DIR:-$PWD/target}/release/cni-guard"

echo "== conformance: cnitool suites"
cargo test --release --locked -p conformance --test cnitool -- --ignored --test-threads=1 --nocapture "$@"
