#!/usr/bin/env python3
"""Checks the chart's Grafana dashboard against a real scrape of `keep --metrics-address`.

    scripts/dashboard-check.py DASHBOARD.json SCRAPE.txt OUT_DIR

Writes OUT_DIR/rules.yml and OUT_DIR/test.yml for `promtool test rules` (run by
scripts/test.d/47-metrics.sh) and prints what it checks:

- the dashboard's shape: every panel has an id (unique), a gridPos and targets whose datasource
  is the dashboard's `${datasource}` variable; the `node` variable is there;
- every target's PromQL, with Grafana's variables put in ($node: the All value `.*`,
  $__rate_interval: 2m, $__range: 10m), becomes an alerting rule; the input series are the
  scrape's own series (names, labels and values as keep served them) as seen from two nodes,
  `node-a` (the scrape itself, taken while the node refused a sandbox) and `node-b` (the same
  series, ready, counters at 0), with the `node` label the chart's monitors add. Each counter
  grows linearly to the scraped value over 10 minutes; gauges keep their value;
- the expected result of each query is derived from the input series, not written by hand: a
  query whose outer aggregation is `by (L...)` must return one series per distinct value of L
  among the series of its metric that match its equality matchers; a query without one, a
  single series without labels. So a query naming a metric or a label keep does not serve, or
  matching a label value it never has, returns nothing (or the wrong series) and the test fails.
"""
import json, re, sys, yaml

dashboard_path, scrape_path, out = sys.argv[1:]
dash = json.load(open(dashboard_path))
problems = []


def fail(msg):
    problems.append(msg)


# --- the scrape ----------------------------------------------------------------------------
types, samples = {}, []
SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
for line in open(scrape_path):
    line = line.rstrip("\n")
    if line.startswith("# TYPE "):
        _, _, name, kind = line.split(" ", 3)
        types[name] = kind
    elif line and not line.startswith("#"):
        m = SAMPLE.match(line)
        if not m:
            sys.exit(f"dashboard-check: cannot read the scrape line {line!r}")
        labels = dict(LABEL.findall(m.group(3) or ""))
        samples.append((m.group(1), labels, float(m.group(4))))
if not samples:
    sys.exit("dashboard-check: the scrape holds no samples")

STEPS = 10  # one sample a minute for 10 minutes


def series_text(name, labels):
    return name + "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


inputs = []  # (name, labels) of every input series
input_series = []
for node in ("node-a", "node-b"):
    for name, labels, value in samples:
        labels = dict(labels, node=node, job="cni-guard", instance=f"{node}:9718")
        kind = types.get(name, "untyped")
        if node == "node-b":
            value = 1.0 if name == "cni_guard_ready" else (value if kind == "gauge" else 0.0)
        if kind == "counter":
            values = f"0+{value / STEPS!r}x{STEPS}"
        else:
            values = f"{value!r}x{STEPS}"
        inputs.append((name, labels))
        input_series.append({"series": series_text(name, labels), "values": values})

# --- the dashboard's shape ------------------------------------------------------------------
variables = {v["name"]: v for v in dash.get("templating", {}).get("list", [])}
if variables.get("datasource", {}).get("type") != "datasource" or "node" not in variables:
    fail("the dashboard needs the variables `datasource` (type datasource) and `node`")
ids = [p.get("id") for p in dash["panels"]]
if len(set(ids)) != len(ids) or None in ids:
    fail(f"panel ids are missing or repeated: {ids}")
targets = []
for p in dash["panels"]:
    if set(p.get("gridPos", {})) != {"x", "y", "w", "h"}:
        fail(f"panel {p.get('id')} ({p.get('title')}): no gridPos")
    if not p.get("targets"):
        fail(f"panel {p.get('id')} ({p.get('title')}): no targets")
    for t in p.get("targets", []):
        if t.get("datasource", p.get("datasource", {})).get("uid") != "${datasource}":
            fail(f"panel {p['id']} target {t.get('refId')}: its datasource is not ${{datasource}}")
        targets.append((p, t))

# --- every query, as an alerting rule, and what it must return ------------------------------
SUBST = {"$__rate_interval": "2m", "$__range": "10m", "$node": ".*"}
BY = re.compile(r'^\s*(?:sum|max|min|avg|count)\s+by\s*\(([^)]*)\)')
SELECTOR = re.compile(r'\b(cni_guard_[a-z_]+)\{([^}]*)\}')
rules, tests = [], []
for p, t in targets:
    expr = t["expr"]
    for k, v in SUBST.items():
        expr = expr.replace(k, v)
    if "$" in expr:
        fail(f"panel {p['id']}: a variable the check does not know in {t['expr']}")
        continue
    name = f"Panel{p['id']}{t['refId']}"
    rules.append({"alert": name, "expr": expr})
    m = BY.match(expr)
    sel = SELECTOR.findall(expr)
    metrics = {s[0] for s in sel}
    if len(metrics) != 1:
        fail(f"panel {p['id']}: the check needs exactly one metric per query, found {sorted(metrics)}")
        continue
    (metric,) = metrics
    eq = dict(re.findall(r'([a-z_]+)="([^"]*)"', sel[0][1]))
    if not m:
        expected = [{}]
    else:
        keys = [k.strip() for k in m.group(1).split(",")]
        matching = [l for n, l in inputs if n == metric and all(l.get(k) == v for k, v in eq.items())]
        seen = []
        for l in matching:
            want = {k: l[k] for k in keys if k in l}
            if want not in seen:
                seen.append(want)
        expected = seen
    if not expected:
        fail(f"panel {p['id']}: no input series of {metric} match {eq}: the scrape has no such series")
    legend = set(re.findall(r"\{\{\s*([a-z_]+)\s*\}\}", t.get("legendFormat", "")))
    for e in expected:
        if not legend <= set(e):
            fail(f"panel {p['id']}: its legend names {sorted(legend - set(e))}, which its series lack")
    tests.append({"alertname": name, "eval_time": "10m",
                  "exp_alerts": [{"exp_labels": e} for e in expected]})
    print(f"dashboard-check: panel {p['id']} {p['title']!r}: {expr}\n"
          f"    expects {len(expected)} series: {', '.join(json.dumps(e, sort_keys=True) for e in expected)}")

with open(f"{out}/rules.yml", "w") as f:
    yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}, f, sort_keys=False)
with open(f"{out}/test.yml", "w") as f:
    yaml.safe_dump({"rule_files": ["rules.yml"], "evaluation_interval": "1m",
                    "tests": [{"interval": "1m", "input_series": input_series, "alert_rule_test": tests}]},
                   f, sort_keys=False, width=1000)
for msg in problems:
    print(f"dashboard-check: FAIL: {msg}", file=sys.stderr)
if problems:
    sys.exit(1)
print(f"dashboard-check: {len(dash['panels'])} panels, {len(rules)} queries; {len(samples)} scraped series x 2 nodes as input")
