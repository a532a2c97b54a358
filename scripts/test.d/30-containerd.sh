#!/usr/bin/env bash
# The containerd suites (issues 4 and 11): cni-guard under real containerd, driven through the CRI
# by crictl, each suite on Debian's containerd 1.6.20 and on containerd 2.x (scripts/versions.sh):
# a sandbox through the guard, the refusal as kubelet sees it, the reboot race, the install
# container, and CNI STATUS. Each suite starts its own containerd in its own network namespace
# and removes everything after, also on failure.
#
#   bash scripts/test.d/30-containerd.sh                 # everything, both generations
#   bash scripts/test.d/30-containerd.sh containerd_2    # only tests whose name contains this
#
# Needs root. Locally without root it skips loudly; under CI=true that is a failure, and so is any
# missing prerequisite (the suites' own gate).
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=scripts/versions.sh
. scripts/versions.sh
started=$(date +%s)

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
# containerd 2.x, its shim and ctr, crictl and the current reference plugins are built by
# scripts/setup.sh into a cache outside the clone (a no-op when they are there).
for b in "$CONTAINERD2_BIN/containerd" "$CONTAINERD2_BIN/containerd-shim-runc-v2" \
         "$CONTAINERD2_BIN/ctr" "$CRICTL_BIN/crictl" "$CNI_PLUGINS_BIN/bridge"; do
  if [ ! -x "$b" ]; then
    echo "30-containerd: $b missing: running scripts/setup.sh"
    bash scripts/setup.sh
    break
  fi
done
echo "30-containerd: $("$DEBIAN_CONTAINERD" --version)"
echo "30-containerd: $("$CONTAINERD2_BIN/containerd" --version)"
echo "30-containerd: $("$CRICTL_BIN/crictl" --version), runc $($DEBIAN_RUNC --version | head -n1)"

# The binaries under test, as release builds (test.sh has built cni-guard already: no-op then).
cargo build --release --locked -p cni-guard
cargo build --release --locked -p conformance --bin mini-multus

# The suites drive containerd through crictl; the test binary is the debug one `cargo test
# --workspace` has already built.
log=$(mktemp /tmp/cg-30-containerd.XXXXXX)
trap 'rm -f "$log"' EXIT
status=0
cargo test --locked -p containerd-conformance --test containerd -- \
  --include-ignored --test-threads=1 --nocapture "$@" 2>&1 | tee "$log" || status=$?

echo
echo "30-containerd: summary ($(( $(date +%s) - started )) s in all, exit $status)"
grep -E '^(race-summary|race-leaks|race-duration|delegate-to-running|cri-status|cri-status-calls|cri-status-transition|cri-info-latency) ' \
  "$log" || true
grep -E '^test result:' "$log" || true
exit "$status"
