#!/usr/bin/env bash
# The metrics of `keep --metrics-address` (issue 13): the plugin's decisions counted through the
# built binaries (agent/tests/metrics.rs, also run by `cargo test`), and a scrape taken while the
# node refuses sandboxes passed through promtool's own exposition linter, and every query of the
# chart's Grafana dashboard evaluated by promtool over that scrape's series
# (scripts/dashboard-check.py says how). No root needed.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=scripts/setup-helm.sh
. scripts/setup-helm.sh --env
if [ ! -x "$PROMTOOL_BIN/promtool" ]; then
  bash scripts/setup-helm.sh
fi
out=$(mktemp -d /tmp/cni-guard-metrics.XXXXXX)
trap 'rm -rf "$out"' EXIT
echo "== metrics: keep --metrics-address against the release binary"
# The agent's test runs the plugin built beside it.
cargo build --release --locked -p cni-guard
METRICS_SCRAPE_OUT="$out/scrape.txt" cargo test --release --locked -p cni-guard-agent --test metrics
test -s "$out/scrape.txt" || { echo "47-metrics: FAIL: no scrape was saved" >&2; exit 1; }
echo "== metrics: promtool check metrics on a scrape taken during a refusal"
"$PROMTOOL_BIN/promtool" check metrics <"$out/scrape.txt"
grep -E '^cni_guard_(ready|refusals_total|not_ready_seconds_total)' "$out/scrape.txt"
echo "== metrics: the chart's Grafana dashboard's queries against that scrape (promtool test rules)"
python3 scripts/dashboard-check.py deploy/helm/cni-guard/dashboards/cni-guard.json "$out/scrape.txt" "$out"
"$PROMTOOL_BIN/promtool" check rules "$out/rules.yml"
"$PROMTOOL_BIN/promtool" test rules "$out/test.yml"
echo "47-metrics: ok"
