#!/usr/bin/env bash
# Installs what the test suites and the demo need on a fresh machine (idempotent).
# Without root it only checks and says what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v cargo >/dev/null; then
  echo "setup: cargo is required" >&2
  exit 1
fi
