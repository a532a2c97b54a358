#!/usr/bin/env bash
# The values table of the chart's README (deploy/helm/cni-guard/README.md), generated from
# values.yaml: one row per key, its default (as JSON) and its comment (the comment lines right
# above the key, and a comment after it on the same line). A key that holds an object with keys
# of its own gets a row of its own only when it has a comment; its keys get rows. The table sits
# between the markers `<!-- values-table:begin -->` and `<!-- values-table:end -->`.
#
#   scripts/helm-docs.sh          rewrite the table
#   scripts/helm-docs.sh --check  exit 1 (with a diff) when the table is not what values.yaml says
#
# Needs python3 with PyYAML (scripts/test.d/45-helm.sh runs the check).
set -euo pipefail
cd "$(dirname "$0")/.."
CHART=${CHART:-deploy/helm/cni-guard}
mode=${1:-write}
case "$mode" in write | --check) ;; *) sed -n '2,11p' "$0" >&2; exit 2 ;; esac
python3 - "$CHART/values.yaml" "$CHART/README.md" "$mode" <<'PY'
import difflib, json, re, sys, yaml

values_path, readme_path, mode = sys.argv[1:]
BEGIN, END = "<!-- values-table:begin -->", "<!-- values-table:end -->"
text = open(values_path).read()
values = yaml.safe_load(text)

NESTED = object()
KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][A-Za-z0-9_-]*):(?P<rest>.*)$")
rows, stack, comment = [], [], []
for line in text.splitlines():
    stripped = line.strip()
    if not stripped:
        comment = []
        continue
    if stripped.startswith("#"):
        body = stripped.lstrip("#").strip()
        # Section rulers ("# --- Metrics ---") head a part of the file, not a key.
        comment = [] if body.startswith("---") else comment + [body]
        continue
    m = KEY.match(line)
    if not m:
        comment = []  # a list item or a continuation: not a key of the values
        continue
    indent = len(m["indent"])
    while stack and stack[-1][0] >= indent:
        stack.pop()
    path = [k for _, k in stack] + [m["key"]]
    rest = m["rest"]
    inline = ""
    if " #" in rest:
        rest, inline = rest.split(" #", 1)
    node = values
    for k in path:
        node = node[k]
    words = " ".join(comment + ([inline.strip()] if inline.strip() else []))
    nested = isinstance(node, dict) and node and not rest.strip()
    if not nested or words:
        rows.append((".".join(path), NESTED if nested else node, words))
    stack.append((indent, m["key"]))
    comment = []

def cell(s):
    return s.replace("|", "\\|")
out = ["| key | default | description |", "| --- | --- | --- |"]
for key, default, words in rows:
    shown = "" if default is NESTED else "`" + cell(json.dumps(default, separators=(", ", ": "))) + "`"
    out.append(f"| `{key}` | {shown} | {cell(words)} |")
table = "\n".join(out)

readme = open(readme_path).read()
if BEGIN not in readme or END not in readme:
    sys.exit(f"helm-docs: {readme_path} has no {BEGIN} ... {END} markers")
head, rest = readme.split(BEGIN, 1)
_, tail = rest.split(END, 1)
want = f"{head}{BEGIN}\n{table}\n{END}{tail}"
if mode == "--check":
    if want != readme:
        sys.stdout.writelines(difflib.unified_diff(readme.splitlines(True), want.splitlines(True),
                                                   readme_path, "generated from values.yaml"))
        sys.exit(f"helm-docs: the values table of {readme_path} is not what values.yaml says: run scripts/helm-docs.sh")
    print(f"helm-docs: the values table of {readme_path} matches values.yaml ({len(rows)} rows)")
else:
    open(readme_path, "w").write(want)
    print(f"helm-docs: wrote {len(rows)} rows into {readme_path}")
PY
