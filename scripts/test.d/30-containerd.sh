#!/usr/bin/env bash
# The containerd suites (issue 4): cni-guard under a real containerd 1.6, driven through the CRI.
# Each suite starts its own containerd in its own network namespace and removes everything after.
#
# Needs root. Locally without root it skips loudly; under CI=true that is a failure.
set -euo pipefail
cd "$(dirname "$0")/../.."

if [ "$(id -u)" != 0 ]; then
  if [ "${CI:-}" = true ]; then
    echo "30-containerd: FAIL: needs root under CI=true" >&2
    exit 1
  fi
  echo "30-containerd: SKIP: needs root (containerd, network namespaces)" >&2
  exit 0
fi

# What the suites need, installed if missing (idempotent; scripts/setup.sh installs the same).
need=()
for pair in containerd:containerd runc:runc ctr:containerd nsenter:util-linux ip:iproute2 \
            /bin/busybox:busybox-static /usr/lib/cni/bridge:containernetworking-plugins; do
  probe=${pair%%:*} pkg=${pair#*:}
  if [ "${probe#/}" != "$probe" ]; then [ -e "$probe" ] || need+=("$pkg")
  else command -v "$probe" >/dev/null || need+=("$pkg"); fi
done
if [ ${#need[@]} -gt 0 ]; then
  echo "30-containerd: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y --no-install-recommends "${need[@]}" >/dev/null \
    || { apt-get update >/dev/null && apt-get install -y --no-install-recommends "${need[@]}" >/dev/null; }
fi
containerd --version

# The binaries under test, as release builds (test.sh has built cni-guard already: no-op then).
cargo build --release --locked -p cni-guard
if grep -q 'name = "mini-multus"' conformance/Cargo.toml; then
  cargo build --release --locked -p conformance --bin mini-multus
fi

# The suites drive containerd, which is where the time goes: the test binary is the debug one
# `cargo test --workspace` has already built (a release build of tonic with LTO costs minutes).
cargo test --locked -p containerd-conformance -- --include-ignored --test-threads=1 --nocapture
