#!/usr/bin/env bash
# The project's whole test run (the README's test command; .ci/run calls only this).
#
#   scripts/test.sh          everything: set-up, lint, unit + integration tests, then every
#                            part in scripts/test.d/ in name order (conformance, containerd, ...)
#
# On a fresh machine, as root, it installs what it needs (scripts/setup.sh). Parts that need root
# skip loudly when run without it locally; under CI=true a missing prerequisite is a failure.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never

bash scripts/setup.sh

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== cargo test"
cargo test --workspace --locked
echo "== release build"
cargo build --release --locked -p cni-guard

for part in scripts/test.d/*.sh; do
  [ -e "$part" ] || continue
  echo "== $part"
  bash "$part"
done
echo "== all tests passed"
