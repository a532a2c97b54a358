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

# Each step's wall time, printed after it and as a table at the end (docs/development/testing.md quotes
# them for a cold and a warm machine).
timings=()
step() {
  local name=$1 start=$SECONDS
  shift
  echo "== $name"
  "$@"
  timings+=("$(printf '%5d s  %s' $((SECONDS - start)) "$name")")
  echo "== $name: $((SECONDS - start)) s"
}

# The node's Go builds (etcd, Multus, Kubernetes, Cilium, Helm, promtool: most of a cold run)
# go on in the background, niced, while the tests that need none of them run; each suite that
# needs them waits for its part first.
step setup bash scripts/setup.sh --background

step "cargo fmt --check" cargo fmt --all -- --check
step "cargo clippy" cargo clippy --workspace --all-targets --locked -- -D warnings
step "cargo test" cargo test --workspace --locked
step "release build" cargo build --release --locked -p cni-guard -p cni-guard-agent

for part in scripts/test.d/*.sh; do
  [ -e "$part" ] || continue
  case ${part##*/} in
    35-*) step "setup: wait (cluster)" bash scripts/setup.sh --wait cluster ;;
    37-*) step "setup: wait (all)" bash scripts/setup.sh --wait all ;;
  esac
  step "$part" bash "$part"
done
echo "== time per step"
printf '%s\n' "${timings[@]}"
echo "== all tests passed in $SECONDS s"
