#!/usr/bin/env bash
# Runs the benchmark once in quick mode so it cannot rot. Asserts nothing about timing; fails if
# the bench itself breaks (a case answers wrongly, a tool is missing under CI, the report is
# incomplete). The committed bench/results.md is not touched.
set -euo pipefail
cd "$(dirname "$0")/../.."
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
bash scripts/bench.sh --quick --out "$out/results.md"
report="$out/results.md"
fail() { echo "bench smoke: FAILED: $1" >&2; exit 1; }
for row in "1. floor: one extra exec" "1. fast path overhead, static guard" \
  "2. child path, 0.4.0 delegate" "2. child path, two-plugin conflist" \
  "4. refusal: ADD with the delegate missing" "4. STATUS, not ready" "5. wake-up" \
  "6. 64 concurrent ADDs" "6. overhead by number of attachments" "6. overhead by delegate size" \
  "7. peak RSS of the guard by path" "7. stripped static binary" \
  "Cross-check: hyperfine" "Cross-check: /usr/bin/time -v"; do
  grep -qF "$row" "$report" || fail "the report has no \"$row\""
done
if [ "$(id -u)" = 0 ]; then
  grep -qF "3. bridge + host-local ADD+DEL, through the guard" "$report" \
    || fail "the real ADD+DEL did not run as root"
elif [ "${CI:-}" = true ]; then
  fail "not root under CI=true"
else
  echo "bench smoke: not root: the real ADD+DEL was SKIPPED" >&2
fi
echo "bench smoke: ok"
