#!/usr/bin/env bash
# Packages the chart deploy/helm/cni-guard for a release, with the published image as its
# default (the chart in the repository has none, and refuses to render without one):
#
#   scripts/package-chart.sh OUT_DIR IMAGE_REPOSITORY IMAGE_DIGEST [RUNBOOK_BASE_URL]
#
# writes OUT_DIR/cni-guard-VERSION.tgz (VERSION: Chart.yaml's, which is the crate's) whose
# values.yaml has image.repository IMAGE_REPOSITORY, image.digest IMAGE_DIGEST (sha256:<64 hex>,
# the image index `scripts/build-image.sh release` printed and the registry holds) and, when
# given, prometheusRule.runbookBaseUrl RUNBOOK_BASE_URL (an address of docs/operations/runbooks.md
# that an alert's link can open). The chart's README values table is regenerated to match, and the
# packaged chart is linted and rendered once before it is written. Prints the package's path.
#
# The release workflow (.github/workflows/release.yml) runs it; scripts/test.d/45-helm.sh runs
# it with made-up values and renders the package. Needs helm (HELM, else scripts/setup-helm.sh's)
# and python3 with PyYAML.
set -euo pipefail
if [ $# -lt 3 ] || [ $# -gt 4 ]; then
  sed -n '2,16p' "$0" >&2
  exit 2
fi
out=$1 repository=$2 digest=$3 runbooks=${4:-}
repo=$(cd "$(dirname "$0")/.." && pwd)
if [ -z "${HELM:-}" ]; then
  # shellcheck source=setup-helm.sh
  . "$repo/scripts/setup-helm.sh" --env
  HELM=$HELM_BIN/helm
fi
[ -x "$HELM" ] || { echo "package-chart: no helm at $HELM (scripts/setup-helm.sh builds it)" >&2; exit 1; }
[[ $digest =~ ^sha256:[0-9a-f]{64}$ ]] || { echo "package-chart: $digest is no sha256:<64 hex> digest" >&2; exit 1; }
if ! [[ $repository =~ ^[a-z0-9][a-z0-9._/:-]*$ ]] || [[ $repository == *:*/*:* ]]; then
  echo "package-chart: $repository is no image repository (REGISTRY/PATH, no tag)" >&2
  exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r "$repo/deploy/helm/cni-guard" "$work/cni-guard"
# Only the three lines change (values.yaml keeps its comments); then the values are read back.
python3 - "$work/cni-guard/values.yaml" "$repository" "$digest" "$runbooks" <<'PY'
import re, sys, yaml
path, repository, digest, runbooks = sys.argv[1:]
text = open(path).read()
def put(key_re, value, what):
    global text
    pattern = re.compile(key_re, re.M)
    if len(pattern.findall(text)) != 1:
        sys.exit(f"package-chart: values.yaml has not exactly one {what} line")
    text = pattern.sub(lambda m: m.group(1) + value, text)
put(r'^(  repository: )"".*$', yaml.safe_dump(repository, default_style='"').strip(), "image.repository")
put(r'^(  digest: )"".*$', yaml.safe_dump(digest, default_style='"').strip(), "image.digest")
if runbooks:
    put(r'^(  runbookBaseUrl: ).*$', yaml.safe_dump(runbooks, default_style='"').strip(), "runbookBaseUrl")
open(path, "w").write(text)
v = yaml.safe_load(text)
assert v["image"]["repository"] == repository and v["image"]["digest"] == digest, v["image"]
assert not runbooks or v["prometheusRule"]["runbookBaseUrl"] == runbooks
PY
CHART="$work/cni-guard" bash "$repo/scripts/helm-docs.sh" >/dev/null
export HELM_CONFIG_HOME=$work/helm/config HELM_CACHE_HOME=$work/helm/cache HELM_DATA_HOME=$work/helm/data
"$HELM" lint --strict --quiet "$work/cni-guard" >"$work/lint.out" 2>&1 || { cat "$work/lint.out" >&2; exit 1; }
"$HELM" template cni-guard "$work/cni-guard" >/dev/null
mkdir -p "$out"
"$HELM" package "$work/cni-guard" -d "$out" >"$work/package.out"
sed -n 's/^Successfully packaged chart and saved it to: //p' "$work/package.out"
