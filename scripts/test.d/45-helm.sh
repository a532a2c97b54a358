#!/usr/bin/env bash
# The Helm chart in deploy/helm/cni-guard, checked offline (no cluster):
#  1. `helm lint --strict` with the default values and every values file in ci/;
#  2. `helm template` with ci/multus-cilium-values.yaml renders the same objects as
#     `kubectl kustomize deploy/multus-cilium` (and the default values, Namespace on, the same as
#     deploy/base), after the normalisation described at `normalise` below;
#  3. the rendered objects pass the same strict schema validation as the kustomize output
#     (kubernetes-validate, two Kubernetes versions); the PodMonitor and PrometheusRule, which
#     are CRDs, get a structural check and `promtool check rules` on their rule group;
#  4. values.schema.json rejects a wrong type and unknown keys (helm template fails);
#  5. install and keep get the same conflist flags for every values file, the probe checks the
#     file keep writes, every /host mount is its host path, the probe can read each config's
#     folder and reach each socket through the folder above it, and the install flags run by the
#     release binary write the conflist the values ask for;
#  6. `promtool test rules` (deploy/helm/cni-guard/tests/alert-test.yaml): CniGuardRefusingPods
#     fires with the node and reason labels for a node not ready for more than 5 minutes, and not
#     for a blip; CniGuardMissing for a node without a guard; each runbook_url's anchor is a
#     heading of docs/operations/runbooks.md;
#  7. the chart's conventions: kubeVersion (1.24 refused, 1.25 accepted), NOTES.txt, pod
#     metadata, placement, pull secrets, digest, update strategy, extra flags and environment
#     reach the DaemonSet; the ServiceMonitor's Service selects the pods; the README's values
#     table is what values.yaml says (scripts/helm-docs.sh --check).
#  8. scripts/package-chart.sh (the release workflow's): the package's defaults are the published
#     image and runbooks; actionlint (and shellcheck) on .github/workflows;
#  9. deploy/flux: the Kustomizations' order, the HelmRelease's strategy and values, the Multus
#     folder's patches over a stand-in of upstream's manifest (a config change restarts Multus);
# 10. every `helm install` / `helm upgrade` of the chart in README.md and docs/ renders;
#
# Needs kubectl (kustomize), python3 with pip, and Go (scripts/setup-helm.sh builds helm and
# promtool, pinned, once). Under CI=true anything missing is a failure; locally it skips loudly.
set -euo pipefail
cd "$(dirname "$0")/../.."

K8S_VERSIONS=(1.37.0 1.33.0 1.25.0)
VALIDATE_VERSION=1.37.0
CHART=deploy/helm/cni-guard
NAMESPACE=cni-guard

missing() {
  if [ "${CI:-}" = true ]; then
    echo "45-helm: FAIL: $1" >&2
    exit 1
  fi
  echo "45-helm: SKIPPED: $1" >&2
  exit 0
}
fail() {
  echo "45-helm: FAIL: $1" >&2
  exit 1
}

command -v kubectl >/dev/null || missing "kubectl is not installed (needed for kubectl kustomize)"
command -v python3 >/dev/null || missing "python3 is not installed"
# shellcheck source=../versions.sh
. scripts/versions.sh
if ! python3 -c 'import kubernetes_validate, yaml' 2>/dev/null ||
  [ "$(python3 -c 'import importlib.metadata as m; print(m.version("kubernetes-validate"))')" != "$VALIDATE_VERSION" ]; then
  if [ "$(id -u)" = 0 ] || [ -n "${VIRTUAL_ENV:-}" ]; then
    python3 -m pip install --quiet --disable-pip-version-check "kubernetes-validate==$VALIDATE_VERSION"
  else
    missing "kubernetes-validate==$VALIDATE_VERSION is not installed (pip install it, or run as root)"
  fi
fi

# shellcheck source=../setup-helm.sh
. scripts/setup-helm.sh --env
if [ ! -x "$HELM_BIN/helm" ] || [ ! -x "$PROMTOOL_BIN/promtool" ] || [ ! -x "$ACTIONLINT_BIN/actionlint" ]; then
  cni_guard_go >/dev/null || missing "no go >= $GO_MIN_VERSION to build helm, promtool and actionlint (scripts/setup.sh installs it)"
fi
bash scripts/setup-helm.sh
HELM=$HELM_BIN/helm
PROMTOOL=$PROMTOOL_BIN/promtool

BIN=target/release/cni-guard-agent
if [ ! -x "$BIN" ] || [ ! -x target/release/cni-guard ]; then
  cargo build --release --locked -p cni-guard -p cni-guard-agent
fi

WORK=$(mktemp -d /tmp/cni-guard-helm.XXXXXX)
cleanup() { rm -rf "$WORK"; }
trap cleanup EXIT
# helm keeps no state between runs and never reads the user's repositories or plugins.
export HELM_CONFIG_HOME=$WORK/helm/config HELM_CACHE_HOME=$WORK/helm/cache HELM_DATA_HOME=$WORK/helm/data

# The values files: the defaults (with an image: the chart has none by default), and each file
# in ci/.
IMAGE_SET=(--set image.repository=cni-guard)
VALUES=(default)
for f in "$CHART"/ci/*-values.yaml; do
  name=$(basename "$f" -values.yaml)
  VALUES+=("$name")
done
values_args() {
  if [ "$1" != default ]; then
    echo "-f $CHART/ci/$1-values.yaml"
  else
    echo "${IMAGE_SET[*]}"
  fi
}

echo "-- lint"
for v in "${VALUES[@]}"; do
  # shellcheck disable=SC2046
  "$HELM" lint --strict --quiet "$CHART" $(values_args "$v") >"$WORK/lint.out" 2>&1 ||
    { cat "$WORK/lint.out" >&2; fail "helm lint --strict with $v values"; }
  echo "helm lint --strict: $v values"
done

echo "-- render"
for v in "${VALUES[@]}"; do
  # shellcheck disable=SC2046
  "$HELM" template cni-guard "$CHART" -n "$NAMESPACE" $(values_args "$v") >"$WORK/helm-$v.yaml"
  echo "helm template with $v values: $(grep -c '^kind:' "$WORK/helm-$v.yaml") objects"
done
# deploy/base's counterpart: the default values with the Namespace.
"$HELM" template cni-guard "$CHART" -n "$NAMESPACE" --set namespace.create=true \
  --set delegateWriter=null "${IMAGE_SET[@]}" >"$WORK/helm-base.yaml"
for overlay in base multus-cilium uninstall; do
  kubectl kustomize "deploy/$overlay" >"$WORK/kustomize-$overlay.yaml"
done

echo "-- schema"
# Core objects to kubernetes-validate, the Prometheus Operator's CRDs to a structural check.
mkdir -p "$WORK/core" "$WORK/crd"
python3 - "$WORK" "${VALUES[@]}" <<'PY'
import os, sys, yaml
work, names = sys.argv[1], sys.argv[2:]
for name in names:
    with open(os.path.join(work, f"helm-{name}.yaml")) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    core = [d for d in docs if not d["apiVersion"].startswith("monitoring.coreos.com/")]
    crds = [d for d in docs if d["apiVersion"].startswith("monitoring.coreos.com/")]
    with open(os.path.join(work, "core", f"{name}.yaml"), "w") as f:
        yaml.safe_dump_all(core, f)
    for d in crds:
        with open(os.path.join(work, "crd", f"{name}-{d['kind']}.yaml"), "w") as f:
            yaml.safe_dump(d, f)
PY
for version in "${K8S_VERSIONS[@]}"; do
  kubernetes-validate --strict --quiet -k "$version" "$WORK"/core/*.yaml
  echo "all core objects of every values file valid against Kubernetes $version (strict)"
done
python3 - "$WORK" <<'PY'
import glob, os, re, sys, yaml
work = sys.argv[1]
def fail(msg):
    print("45-helm: FAIL: " + msg, file=sys.stderr)
    sys.exit(1)

DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")
NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# The fields of monitoring.coreos.com/v1 that the chart uses, with their types; anything else
# is an error (as the CRD's structural schema prunes or rejects it).
def check(obj, shape, where):
    if isinstance(shape, dict):
        if not isinstance(obj, dict):
            fail(f"{where}: not an object")
        for k, v in obj.items():
            if k not in shape:
                fail(f"{where}: unknown field {k}")
            check(v, shape[k], f"{where}.{k}")
    elif isinstance(shape, list):
        if not isinstance(obj, list) or not obj:
            fail(f"{where}: not a non-empty list")
        for i, item in enumerate(obj):
            check(item, shape[0], f"{where}[{i}]")
    elif shape == "duration":
        if not (isinstance(obj, str) and DURATION.match(obj)):
            fail(f"{where}: {obj!r} is not a duration")
    elif shape == "labels":
        if not (isinstance(obj, dict) and all(isinstance(v, str) for v in obj.values())):
            fail(f"{where}: not a map of strings")
    elif not isinstance(obj, shape):
        fail(f"{where}: {obj!r} is not {shape.__name__}")

META = {"name": str, "namespace": str, "labels": "labels"}
SHAPES = {
    "PodMonitor": {
        "apiVersion": str, "kind": str, "metadata": META,
        "spec": {
            "selector": {"matchLabels": "labels"},
            "podMetricsEndpoints": [{
                "port": str, "path": str, "interval": "duration", "scrapeTimeout": "duration",
                "relabelings": [{"sourceLabels": [str], "targetLabel": str}],
            }],
        },
    },
    "ServiceMonitor": {
        "apiVersion": str, "kind": str, "metadata": META,
        "spec": {
            "selector": {"matchLabels": "labels"},
            "endpoints": [{
                "port": str, "path": str, "interval": "duration", "scrapeTimeout": "duration",
                "relabelings": [{"sourceLabels": [str], "targetLabel": str}],
            }],
        },
    },
    "PrometheusRule": {
        "apiVersion": str, "kind": str, "metadata": META,
        "spec": {"groups": [{"name": str, "rules": [{
            "alert": str, "expr": str, "for": "duration",
            "labels": "labels", "annotations": "labels"}]}]},
    },
}
files = sorted(glob.glob(os.path.join(work, "crd", "*.yaml")))
if not files:
    fail("no PodMonitor or PrometheusRule rendered (ci/everything-values.yaml enables both)")
for path in files:
    doc = yaml.safe_load(open(path))
    kind = doc["kind"]
    if doc["apiVersion"] != "monitoring.coreos.com/v1" or kind not in SHAPES:
        fail(f"{path}: unexpected {doc['apiVersion']} {kind}")
    check(doc, SHAPES[kind], kind)
    if not NAME.match(doc["metadata"]["name"]):
        fail(f"{kind}: bad name {doc['metadata']['name']}")
    if kind in ("PodMonitor", "ServiceMonitor"):
        (endpoint,) = doc["spec"]["podMetricsEndpoints" if kind == "PodMonitor" else "endpoints"]
        if endpoint["port"] != "metrics":
            fail(f"{kind} scrapes a port other than the `metrics` one")
        if {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"} not in endpoint["relabelings"]:
            fail(f"{kind} does not label series with their node (the alerts need it)")
    else:
        # The rule group alone, for promtool check rules.
        with open(path[:-5] + ".rules.yml", "w") as f:
            yaml.safe_dump({"groups": doc["spec"]["groups"]}, f)
    print(f"{os.path.basename(path)}: structure of monitoring.coreos.com/v1 {kind} as used")
PY
for rules in "$WORK"/crd/*.rules.yml; do
  "$PROMTOOL" check rules "$rules" >"$WORK/promtool.out" 2>&1 ||
    { cat "$WORK/promtool.out" >&2; fail "promtool check rules $(basename "$rules")"; }
  echo "promtool check rules $(basename "$rules"): $(grep -o 'SUCCESS.*' "$WORK/promtool.out")"
done

echo "-- values.schema.json"
# Each of these must make helm template fail, naming the offending key: through
# values.schema.json, or (the last two: a socket in a folder directly in /, podMonitor without metrics)
# through the chart's own `fail`.
SCHEMA_ERROR="values don't meet the specifications of the schema"
rejects=(
  "--set waitSeconds=soon|'/waitSeconds': got string, want integer"
  "--set waitSeconds=601|/waitSeconds"
  "--set-json 'attachments=\"/etc/cni/multus/net.d/05-cilium.conflist\"'|'/attachments': got string, want array"
  "--set image.tag=1|'/image/tag': got number, want string"
  "--set metrics.enabled=yes|'/metrics/enabled': got string, want boolean"
  "--set delegateTimeoutSeconds=1.5|/delegateTimeoutSeconds"
  "--set waitSecond=5|additional properties 'waitSecond' not allowed"
  "--set metrics.prot=9000|'/metrics': additional properties 'prot' not allowed"
  "--set-json 'tolerations=[{\"operator\":\"Exists\",\"efect\":\"NoSchedule\"}]'|'/tolerations/0': additional properties 'efect' not allowed"
  "--set resources.requests.cpus=5m|'/resources/requests': additional properties 'cpus' not allowed"
  "--set delegate=etc/cni/net.d/00-multus.conf|/delegate"
  "--set cniVersion=2.0.0|/cniVersion"
  "--set confName=guard.conf|/confName"
  "--set delegateWriter=|/delegateWriter"
  "--set-json 'delegateWriter=\"Mul\\ntus\"'|/delegateWriter"
  "--set-json 'delegateWriter=1'|'/delegateWriter': got number, want"
  "--set 'sockets={run/multus/multus.sock}'|'/sockets/0': 'run/multus/multus.sock' does not match pattern"
  "--set-json 'sockets=\"/run/multus/multus.sock\"'|'/sockets': got string, want array"
  "--set 'sockets={/multus/multus.sock}'|sockets: /multus/multus.sock is in a folder directly in /"
  "--set metrics.enabled=false --set podMonitor.enabled=true|podMonitor.enabled needs metrics.enabled"
  "--set metrics.enabled=false --set serviceMonitor.enabled=true|serviceMonitor.enabled needs metrics.enabled"
  "--set podMonitor.enabled=true --set serviceMonitor.enabled=true|podMonitor.enabled and serviceMonitor.enabled: choose one"
  "--set 'extraArgs={--delegate=/etc/other.conf}'|extraArgs: --delegate=/etc/other.conf: the chart mounts and probes"
  "--set 'extraArgs={--host-root=/}'|extraArgs: --host-root=/: the chart mounts and probes"
  "--set 'extraArgs={lock-wait-seconds=3}'|'/extraArgs/0': 'lock-wait-seconds=3' does not match pattern"
  "--set image.digest=sha256:abc|'/image/digest': 'sha256:abc' does not match pattern"
  "--set updateStrategy.type=Recreate|/updateStrategy/type"
  "--set-json 'imagePullSecrets=[\"reg\"]'|'/imagePullSecrets/0': got string, want object"
  "--set-json 'extraEnv=[{\"value\":\"1\"}]'|'/extraEnv/0': missing property 'name'"
  "--set-json 'affinity={\"nodeAfinity\":{}}'|'/affinity': additional properties 'nodeAfinity' not allowed"
  "--set podLabels.team=1|'/podLabels/team': got number, want string"
  "--set prometheusRule.missing.for=soon|/prometheusRule/missing/for"
  "--set delWaitSeconds=100|DEL may take 150 s (lockWaitSeconds 10 + delWaitSeconds 100 + delegateTimeoutSeconds 40), past kubelet's 120 s StopPodSandbox deadline"
  "--set delegateTimeoutSeconds=90 --set kubeletRuntimeRequestTimeoutSeconds=60|DEL may take 140 s"
  "--set waitSeconds=600|ADD may take 650 s (lockWaitSeconds 10 + waitSeconds 600 + delegateTimeoutSeconds 40), past kubelet's 240 s RunPodSandbox deadline"
  "--set kubeletRuntimeRequestTimeoutSeconds=0|/kubeletRuntimeRequestTimeoutSeconds"
  "--set mode=remove|/mode"
  "--set metrics.address=host-ip|/metrics/address"
  "--set grafanaDashboard.enabled=yes|'/grafanaDashboard/enabled': got string, want boolean"
  "--set grafanaDashboard.labels.grafana_dashboard=1|'/grafanaDashboard/labels/grafana_dashboard': got number, want string"
  # No image by default: the chart refuses to render, saying what to do, in both modes.
  "--set mode=guard|image.repository is not set: this chart has no default image"
  "--set mode=uninstall|image.repository is not set: this chart has no default image"
  "--set image.tag=0.2.0|image.repository is not set: this chart has no default image"
)
for case in "${rejects[@]}"; do
  args=${case%%|*}
  want=${case#*|}
  # Every case but the image's own has an image, so that it fails for its own reason.
  case $want in *"image.repository is not set"*) ;; *) args="${IMAGE_SET[*]} $args" ;; esac
  if eval "\"\$HELM\" template cni-guard \"\$CHART\" -n \"\$NAMESPACE\" $args" >"$WORK/reject.out" 2>&1; then
    fail "helm template accepted $args"
  fi
  grep -qF -- "$want" "$WORK/reject.out" || { cat "$WORK/reject.out" >&2; fail "$args: the error does not say $want"; }
  case $want in
    *"Monitor.enabled needs"* | *"choose one"* | *"is in a folder directly in /"* | *"the chart mounts and probes"* | *" may take "* | *"image.repository is not set"*) ;;
    *) grep -qF -- "$SCHEMA_ERROR" "$WORK/reject.out" || { cat "$WORK/reject.out" >&2; fail "$args: not refused by the schema"; } ;;
  esac
  echo "rejected: $args ($want)"
done

echo "-- manifests"
python3 - "$WORK" "$BIN" "$CHART" "${VALUES[@]}" <<'PY'
import copy, difflib, json, os, subprocess, sys, yaml

work, binary, chart, names = sys.argv[1], os.path.abspath(sys.argv[2]), sys.argv[3], sys.argv[4:]
CHART_APP_VERSION = yaml.safe_load(open(os.path.join(chart, "Chart.yaml")))["appVersion"]
def load(name):
    with open(os.path.join(work, name + ".yaml")) as f:
        return [d for d in yaml.safe_load_all(f) if d]
def fail(msg):
    print("45-helm: FAIL: " + msg, file=sys.stderr)
    sys.exit(1)
def check(cond, msg):
    if not cond:
        fail(msg)
def flags(args):
    return [tuple(a.partition("=")[::2]) for a in args]
def values(name):
    with open(os.path.join(chart, "values.yaml")) as f:
        v = yaml.safe_load(f)
    if name != "default":
        with open(os.path.join(chart, "ci", name + "-values.yaml")) as f:
            over = yaml.safe_load(f) or {}
        def merge(a, b):
            for k, x in b.items():
                a[k] = merge(a.get(k, {}), x) if isinstance(x, dict) and isinstance(a.get(k), dict) else x
            return a
        merge(v, over)
    else:
        v["image"]["repository"] = "cni-guard"  # IMAGE_SET: the chart has no default image
    return v

# --- 2. the chart renders what kustomize renders ---------------------------------------------
# keep's own flags: the metrics address, and the host root and plugin path of its readiness
# checks (its log, and cni_guard_ready). Only --metrics-address differs from kustomize's.
KEEP_METRICS_FLAGS = ("--metrics-address=", "--host-root=", "--cni-path=")
HELM_LABELS = {"helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance",
               "app.kubernetes.io/version"}
def normalise(doc):
    """What the comparison ignores, and why:
    - the labels only Helm adds (HELM_LABELS): bookkeeping of the release, no behaviour;
    - the keep container's --metrics-address flag and its `metrics` port: the chart turns
      metrics on by default, the kustomize manifests do not (the flag is off by default);
    - imagePullPolicy IfNotPresent: what the API server sets for a tagged image that is not
      :latest when none is given, as kustomize's manifests do;
    - volume names: local to the pod spec; each volume is identified by its host path (the
      chart names the folders of attachments cni-config-N, the overlay multus-cni-conf).
    Everything else, including the order of every list and of every argument, must be equal."""
    doc = copy.deepcopy(doc)
    def strip_labels(meta):
        labels = meta.get("labels", {})
        for k in HELM_LABELS:
            labels.pop(k, None)
    strip_labels(doc["metadata"])
    if doc["kind"] == "DaemonSet":
        tmpl = doc["spec"]["template"]
        strip_labels(tmpl["metadata"])
        spec = tmpl["spec"]
        byname = {v["name"]: v["hostPath"]["path"] for v in spec.get("volumes", [])}
        for v in spec.get("volumes", []):
            v["name"] = "host:" + v["hostPath"]["path"]
        for c in spec.get("initContainers", []) + spec["containers"]:
            c["args"] = [a for a in c.get("args", []) if not a.startswith("--metrics-address=")]
            c["ports"] = [p for p in c.get("ports", []) if p.get("name") != "metrics"]
            if not c["ports"]:
                del c["ports"]
            image = c["image"]
            if c.get("imagePullPolicy") == "IfNotPresent" and ":" in image.rsplit("/", 1)[-1] \
                    and not image.endswith(":latest"):
                del c["imagePullPolicy"]
            for m in c.get("volumeMounts", []):
                m["name"] = "host:" + byname[m["name"]]
                # With metrics on, keep writes the events file into the cache dir.
                if m["name"].endswith("/cni-guard") and m.get("readOnly") is False:
                    m["readOnly"] = True
    return doc

def key(doc):
    return (doc["kind"], doc["metadata"].get("namespace", ""), doc["metadata"]["name"])

for helm_name, overlay in [("multus-cilium", "multus-cilium"), ("base", "base")]:
    h = {key(d): normalise(d) for d in load("helm-" + helm_name)}
    k = {key(d): normalise(d) for d in load("kustomize-" + overlay)}
    check(sorted(h) == sorted(k), f"{helm_name}: helm renders {sorted(h)}, kustomize {sorted(k)}")
    for obj in sorted(k):
        if h[obj] != k[obj]:
            a = yaml.safe_dump(k[obj], sort_keys=True).splitlines()
            b = yaml.safe_dump(h[obj], sort_keys=True).splitlines()
            fail(f"{helm_name}: {obj} differs from deploy/{overlay}:\n" +
                 "\n".join(difflib.unified_diff(a, b, "kustomize", "helm", lineterm="")))
    print(f"helm template ({helm_name} values) = kubectl kustomize deploy/{overlay}: "
          f"{len(k)} objects equal after normalisation")

# The comparison sees a difference: the two layouts differ by one attachment and its mount.
ds = lambda name: normalise([d for d in load(name) if d["kind"] == "DaemonSet"][0])
check(ds("helm-multus-cilium") != ds("kustomize-base"), "the comparison cannot tell base from multus-cilium")
print("the comparison tells deploy/base from deploy/multus-cilium")

# --- 5b. mode uninstall: each node's pod removes what install put there ----------------------
def uninstall_mode(name, v, docs, ds):
    spec = ds["spec"]["template"]["spec"]
    kinds = sorted(d["kind"] for d in docs)
    want_kinds = sorted(["DaemonSet", "ServiceAccount"] + (["Namespace"] if v["namespace"]["create"] else []))
    check(kinds == want_kinds, f"{name}: mode uninstall renders {kinds}, want {want_kinds} (no monitoring)")
    check("initContainers" not in spec, f"{name}: mode uninstall has an install container")
    (c,) = spec["containers"]
    check(c["name"] == "uninstall" and "readinessProbe" not in c, f"{name}: the uninstall container")
    check(ds["spec"]["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "100%"}},
          f"{name}: mode uninstall must replace every node's pod at once: {ds['spec']['updateStrategy']}")
    check(ds["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": "cni-guard"},
          f"{name}: the selector changed (a DaemonSet's selector is immutable: the upgrade would fail)")
    check(c.get("env", []) == v.get("extraEnv", []), f"{name}: uninstall env")
    img = v["image"]
    want_image = (f"{img['repository']}@{img['digest']}" if img.get("digest")
                  else f"{img['repository']}:{img['tag'] or CHART_APP_VERSION}")
    check(c["image"] == want_image, f"{name}: image {c['image']}")
    # The same binary and host paths as install's: the DaemonSet's own kustomize overlay runs
    # the same command (deploy/uninstall).
    kust = [d for d in load("kustomize-uninstall") if d["kind"] == "DaemonSet"][0]["spec"]["template"]["spec"]["containers"][0]
    check(c["command"] == kust["command"], f"{name}: command {c['command']}, deploy/uninstall runs {kust['command']}")
    check(c["args"] == ["uninstall", "--bin-dir=/host" + v["binDir"], "--conf-dir=/host" + v["confDir"],
                        "--conf-name=" + v["confName"], "--stay"], f"{name}: args {c['args']}")
    vols = {x["name"]: x["hostPath"]["path"] for x in spec["volumes"]}
    for m in c["volumeMounts"]:
        check(m["mountPath"] == "/host" + vols[m["name"]] and not m.get("readOnly"), f"{name}: mount {m}")

    # Run it: install (with the guard's own flags) puts the binary and the conflist on a host;
    # the rendered uninstall command, run by the release binary, removes both and leaves the
    # delegate alone. --stay is left out (it would wait for SIGTERM).
    root = os.path.join(work, "host-" + name)
    for d in [v["binDir"], v["confDir"]]:
        os.makedirs(root + d, exist_ok=True)
    conf = os.path.join(root + v["confDir"], v["confName"])
    delegate = os.path.join(root + v["confDir"], "00-multus.conf")
    open(delegate, "w").write('{"cniVersion":"1.0.0","name":"multus-cni-network","type":"multus-shim"}')
    env = {k: x for k, x in os.environ.items() if k != "CNI_COMMAND"}
    proc = subprocess.run([binary, "install", "--bin-dir=" + root + v["binDir"], "--conf-dir=" + root + v["confDir"],
                           "--conf-name=" + v["confName"], "--delegate=/etc/cni/net.d/00-multus.conf"],
                          capture_output=True, text=True, env=env)
    check(proc.returncode == 0 and os.path.exists(conf), f"{name}: install: {proc.stdout}{proc.stderr}")
    args = [a.replace("=/host/", "=" + root + "/") for a in c["args"] if a != "--stay"]
    proc = subprocess.run([binary] + args, capture_output=True, text=True, env=env)
    check(proc.returncode == 0, f"{name}: {' '.join(args)}: exit {proc.returncode}\n{proc.stdout}{proc.stderr}")
    check(not os.path.exists(conf), f"{name}: the conflist is still there after uninstall")
    check(not os.path.exists(os.path.join(root + v["binDir"], "cni-guard")), f"{name}: the binary is still there")
    check(os.path.exists(delegate), f"{name}: uninstall removed the delegate")
    print(f"{name}: mode uninstall: one container running `{' '.join(c['args'])}` on every node at once, "
          f"no monitoring objects; run by the release binary it removed the conflist and the binary, not the delegate")

# --- 5. install and keep agree, for every values file -----------------------------------------
for name in names + ["base"]:
    v = values(name) if name != "base" else values("default")
    if name == "base":
        v["delegateWriter"] = None  # rendered with --set delegateWriter=null, as deploy/base
    docs = load("helm-" + name)
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    spec = ds["spec"]["template"]["spec"]
    if v["mode"] == "uninstall":
        uninstall_mode(name, v, docs, ds)
        continue
    (install,) = spec["initContainers"]
    (keep,) = spec["containers"]
    check(install["args"][0] == "install" and keep["args"][0] == "keep", f"{name}: verbs")
    inst = [f for f in flags(install["args"][1:]) if f[0] != "--bin-dir"]
    metrics = [f for f in flags(keep["args"][1:]) if f[0] == "--metrics-address"]
    kept = [f for f in flags(keep["args"][1:]) if not (f[0] + "=").startswith(KEEP_METRICS_FLAGS)]
    check(inst == kept, f"{name}: install and keep must write the same conflist:\n{inst}\n{kept}")
    check(flags(install["args"][1:2]) == [("--bin-dir", "/host" + v["binDir"])], f"{name}: --bin-dir")
    kf = dict(kept)
    probe = keep["readinessProbe"]["exec"]["command"]
    check(probe[:2] == ["/cni-guard-agent", "check"], f"{name}: the probe runs check")
    check(install["command"] == keep["command"] == ["/cni-guard-agent"], f"{name}: the agent runs")
    pf = dict(flags(probe[2:]))
    check(pf["--config"] == kf["--conf-dir"] + "/" + kf["--conf-name"],
          f"{name}: the probe checks the file keep writes")
    check(pf["--cni-path"] == v["binDir"] and pf["--host-root"] == "/host", f"{name}: probe paths")
    own = [f for f in flags(keep["args"][1:]) if f[0] in ("--host-root", "--cni-path")]
    check(own == [("--host-root", "/host"), ("--cni-path", v["binDir"])],
          f"{name}: keep checks readiness where the probe does: {own}")
    # The values reach the flags.
    want = {"--delegate": [v["delegate"]], "--attachment": v["attachments"],
            "--socket": v["sockets"],
            "--capability": v["capabilities"], "--cache-dir": [v["cacheDir"]],
            "--wait-seconds": [str(v["waitSeconds"])], "--cni-version": [v["cniVersion"]],
            "--conf-name": [v["confName"]], "--conf-dir": ["/host" + v["confDir"]],
            "--network-name": [v["networkName"]],
            "--delegate-writer": [v["delegateWriter"]] if v.get("delegateWriter") else [],
            "--strict-permissions": [""] if v["strictPermissions"] else []}
    for flag, key_ in [("--delegate-timeout-seconds", "delegateTimeoutSeconds"),
                       ("--del-wait-seconds", "delWaitSeconds"),
                       ("--lock-wait-seconds", "lockWaitSeconds"),
                       ("--status-timeout-seconds", "statusTimeoutSeconds")]:
        want[flag] = [] if v[key_] is None else [str(v[key_])]
    # extraArgs: after the values' own flags, in both containers.
    for a in v.get("extraArgs", []):
        n, _, val = a.partition("=")
        want.setdefault(n, []).append(val)
    check(kept[len(kept) - len(v.get("extraArgs", [])):] == flags(v.get("extraArgs", [])),
          f"{name}: extraArgs are not the last conflist flags: {kept}")
    for flag, w in want.items():
        got = [val for n, val in kept if n == flag]
        check(got == w, f"{name}: {flag} is {got}, the values say {w}")
    check(set(kf) <= set(want), f"{name}: flags the test does not know: {set(kf) - set(want)}")
    # Metrics: the flag and the port together, only when enabled.
    ports = [p for p in keep.get("ports", []) if p["name"] == "metrics"]
    if v["metrics"]["enabled"]:
        addr = v["metrics"]["address"]
        host = "$(CNI_GUARD_HOST_IP)" if addr == "hostIP" else f"[{addr}]" if ":" in addr else addr
        check(metrics == [("--metrics-address", f"{host}:{v['metrics']['port']}")],
              f"{name}: keep's --metrics-address is {metrics}")
        check(ports == [{"name": "metrics", "containerPort": v["metrics"]["port"], "protocol": "TCP"}],
              f"{name}: the metrics port is {ports}")
    else:
        check(not metrics and not ports, f"{name}: metrics are off but rendered")
    # Every /host/... mount is its host path; the probe sees the delegate and every attachment.
    vols = {x["name"]: x["hostPath"]["path"] for x in spec["volumes"]}
    for c in (install, keep):
        for m in c["volumeMounts"]:
            check(m["mountPath"] == "/host" + vols[m["name"]], f"{name}: {m['mountPath']} mounts {vols[m['name']]}")
    keep_dirs = {m["mountPath"][len("/host"):]: m.get("readOnly", False) for m in keep["volumeMounts"]}
    for path in [v["delegate"]] + v["attachments"]:
        check(os.path.dirname(path) in keep_dirs, f"{name}: the probe cannot see {path}")
    # A socket is reached through the folder above its own (Multus removes and remakes its
    # socket's folder at every start: a mount of that folder would stay on the deleted one).
    for path in v["sockets"]:
        check(os.path.dirname(os.path.dirname(path)) in keep_dirs,
              f"{name}: the probe cannot reach {path} (the folder above its own is not mounted)")
        check(os.path.dirname(path) not in keep_dirs,
              f"{name}: {os.path.dirname(path)} is mounted itself: after a daemon restart it is the old folder")
        # The folder above (/run) holds the pods' network namespaces: its mount follows the
        # host's unmounts (HostToContainer), so keep never holds one alive.
        (m,) = [m for m in keep["volumeMounts"] if m["mountPath"] == "/host" + os.path.dirname(os.path.dirname(path))]
        check(m.get("mountPropagation") == "HostToContainer" and m.get("readOnly") is True,
              f"{name}: {m['mountPath']} is mounted {m}: want read-only, HostToContainer")
    check(len(keep_dirs) == len(keep["volumeMounts"]), f"{name}: a folder is mounted twice in keep")
    check(spec.get("hostNetwork") is True, f"{name}: hostNetwork")
    print(f"{name}: install and keep get the same {len(kept)} conflist flags; probe, mounts and metrics as the values say")

    # The install flags as the agent takes them (the plugin beside it, as in the image): the
    # conflist holds what the values say.
    root = os.path.join(work, "host-" + name)
    for d in [v["binDir"], v["confDir"]]:  # DirectoryOrCreate
        os.makedirs(root + d, exist_ok=True)
    mapped = [a.replace("=/host/", "=" + root + "/") for a in install["args"]]
    proc = subprocess.run([binary] + mapped, capture_output=True, text=True,
                          env={k: x for k, x in os.environ.items() if k != "CNI_COMMAND"})
    check(proc.returncode == 0, f"{name}: {' '.join(mapped)}: exit {proc.returncode}\n{proc.stdout}{proc.stderr}")
    conflist = json.load(open(os.path.join(root + v["confDir"], v["confName"])))
    (entry,) = conflist["plugins"]
    check(conflist["cniVersion"] == v["cniVersion"] and conflist["name"] == v["networkName"], f"{name}: conflist head")
    check(entry["delegate"] == v["delegate"] and entry["attachments"] == v["attachments"]
          and entry["cacheDir"] == v["cacheDir"] and entry["waitSeconds"] == v["waitSeconds"],
          f"{name}: conflist entry {entry}")
    check(entry.get("capabilities", {}) == {c: True for c in v["capabilities"]}, f"{name}: capabilities {entry}")
    check(entry.get("strictPermissions", False) == v["strictPermissions"], f"{name}: strictPermissions")
    check(entry.get("sockets", []) == v["sockets"], f"{name}: sockets {entry}")
    check(entry.get("delegateWriter") == (v.get("delegateWriter") or None),
          f"{name}: delegateWriter is {entry.get('delegateWriter')}, the values say {v.get('delegateWriter')}")
    for flag, key_ in [("--delegate-timeout-seconds", "delegateTimeoutSeconds"),
                       ("--del-wait-seconds", "delWaitSeconds"),
                       ("--lock-wait-seconds", "lockWaitSeconds"),
                       ("--status-timeout-seconds", "statusTimeoutSeconds")]:
        # Left out, install writes the plugin's default, except delWaitSeconds: install's 40.
        expected = int(want[flag][-1]) if want[flag] else (40 if key_ == "delWaitSeconds" else None)
        check(entry.get(key_) == expected, f"{name}: {key_} is {entry.get(key_)}, the values and extraArgs say {expected}")

    # --- 7. the conventions reach the DaemonSet -------------------------------------------
    tmeta = ds["spec"]["template"]["metadata"]
    sel = ds["spec"]["selector"]["matchLabels"]
    check(all(tmeta["labels"].get(k) == x for k, x in sel.items()), f"{name}: podLabels broke the selector")
    for k, x in v.get("podLabels", {}).items():
        if k not in sel and k != "app.kubernetes.io/instance":
            check(tmeta["labels"].get(k) == x, f"{name}: podLabels {k} not on the pods")
    check(tmeta.get("annotations", {}) == v.get("podAnnotations", {}), f"{name}: podAnnotations {tmeta.get('annotations')}")
    check(spec.get("affinity", {}) == v.get("affinity", {}), f"{name}: affinity {spec.get('affinity')}")
    check(spec.get("imagePullSecrets", []) == v.get("imagePullSecrets", []), f"{name}: imagePullSecrets")
    check(ds["spec"].get("updateStrategy") == v["updateStrategy"], f"{name}: updateStrategy {ds['spec'].get('updateStrategy')}")
    img = v["image"]
    want_image = (f"{img['repository']}@{img['digest']}" if img.get("digest")
                  else f"{img['repository']}:{img['tag'] or CHART_APP_VERSION}")
    host_ip = [{"name": "CNI_GUARD_HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}}]
    for c in (install, keep):
        check(c["image"] == want_image, f"{name}: {c['name']} image {c['image']}, want {want_image}")
        want_env = v.get("extraEnv", []) + (host_ip if c is keep and v["metrics"]["enabled"]
                                            and v["metrics"]["address"] == "hostIP" else [])
        check(c.get("env", []) == want_env, f"{name}: {c['name']} env {c.get('env')}, want {want_env}")
    # The dashboard: the chart's JSON as it is, with the sidecar's labels.
    dashboards = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard")]
    if v["grafanaDashboard"]["enabled"]:
        (cm,) = dashboards
        check(cm["data"] == {"cni-guard.json": open(os.path.join(chart, "dashboards/cni-guard.json")).read().rstrip("\n")},
              f"{name}: the dashboard ConfigMap does not hold dashboards/cni-guard.json")
        json.loads(cm["data"]["cni-guard.json"])
        for k, x in v["grafanaDashboard"]["labels"].items():
            check(cm["metadata"]["labels"].get(k) == x, f"{name}: dashboard label {k}")
        check(cm["metadata"].get("annotations", {}) == v["grafanaDashboard"].get("annotations", {}),
              f"{name}: dashboard annotations")
    else:
        check(not dashboards, f"{name}: a dashboard without grafanaDashboard.enabled")
    services = [d for d in docs if d["kind"] == "Service"]
    monitors = [d for d in docs if d["kind"] == "ServiceMonitor"]
    if v["serviceMonitor"]["enabled"]:
        (svc,) = services
        (mon,) = monitors
        check(all(tmeta["labels"].get(k) == x for k, x in svc["spec"]["selector"].items()),
              f"{name}: the Service does not select the pods")
        check(svc["spec"].get("clusterIP") == "None", f"{name}: the Service is not headless")
        check(all(svc["metadata"]["labels"].get(k) == x for k, x in mon["spec"]["selector"]["matchLabels"].items()),
              f"{name}: the ServiceMonitor does not select the Service")
        check([p["targetPort"] for p in svc["spec"]["ports"]] == ["metrics"], f"{name}: Service ports")
    else:
        check(not services and not monitors, f"{name}: a Service or ServiceMonitor without serviceMonitor.enabled")
print("the release agent's install, run with each rendering's flags, writes the conflist the values ask for")
PY

echo "-- alert"
"$HELM" template cni-guard "$CHART" -n "$NAMESPACE" "${IMAGE_SET[@]}" --set prometheusRule.enabled=true \
  --set prometheusRule.for=5m --set prometheusRule.missing.for=10m --set prometheusRule.fallback.for=15m \
  --show-only templates/prometheusrule.yaml >"$WORK/rule.yaml"
mkdir -p "$WORK/alert"
python3 -c 'import sys, yaml
doc = yaml.safe_load(open(sys.argv[1]))
yaml.safe_dump({"groups": doc["spec"]["groups"]}, open(sys.argv[2], "w"))' "$WORK/rule.yaml" "$WORK/alert/rules.yaml"
cp "$CHART/tests/alert-test.yaml" "$WORK/alert/"
"$PROMTOOL" check rules "$WORK/alert/rules.yaml" >/dev/null
"$PROMTOOL" test rules "$WORK/alert/alert-test.yaml" >"$WORK/promtool.out" 2>&1 ||
  { cat "$WORK/promtool.out" >&2; fail "promtool test rules"; }
grep -E 'SUCCESS|PASS' "$WORK/promtool.out" | sed 's/^ */promtool test rules: /'
# Every alert has a runbook, and its anchor is a heading of docs/operations/runbooks.md (as
# GitHub and most renderers make anchors: lower case, spaces to dashes, punctuation dropped).
python3 - "$WORK/rule.yaml" docs/operations/runbooks.md <<'PY'
import re, sys, yaml
rules = yaml.safe_load(open(sys.argv[1]))["spec"]["groups"][0]["rules"]
text = open(sys.argv[2]).read()
anchors = {re.sub(r"[^a-z0-9 _-]", "", h.strip().lower()).replace(" ", "-")
           for h in re.findall(r"^#+ (.+)$", text, re.M)}
names = [r["alert"] for r in rules]
if names != ["CniGuardRefusingPods", "CniGuardMissing", "CniGuardFallbackConfig"]:
    sys.exit(f"45-helm: FAIL: the alerts are {names}")
for r in rules:
    url = r["annotations"].get("runbook_url", "")
    page, _, anchor = url.partition("#")
    if page != "docs/operations/runbooks.md" or anchor not in anchors:
        sys.exit(f"45-helm: FAIL: {r['alert']}: runbook_url {url!r} is no heading of {sys.argv[2]}")
    print(f"{r['alert']}: runbook {url}")
PY

echo "-- conventions"
# kubeVersion: what docs/guides/talos-cilium-multus.md's Talos releases run is covered, older is refused.
"$HELM" template cni-guard "$CHART" -n "$NAMESPACE" "${IMAGE_SET[@]}" --kube-version 1.25.0 >/dev/null ||
  fail "helm template refuses Kubernetes 1.25.0 (kubeVersion)"
if "$HELM" template cni-guard "$CHART" -n "$NAMESPACE" "${IMAGE_SET[@]}" --kube-version 1.24.17 >"$WORK/kube.out" 2>&1; then
  fail "helm template accepts Kubernetes 1.24.17 (kubeVersion)"
fi
grep -qF "kubeVersion" "$WORK/kube.out" || { cat "$WORK/kube.out" >&2; fail "1.24.17 refused for another reason"; }
echo "kubeVersion: 1.25.0 accepted, 1.24.17 refused"
# Chart and app are the crate's version.
crate=$(sed -n 's/^version = "\(.*\)"$/\1/p' plugin/Cargo.toml)
python3 - "$CHART/Chart.yaml" "$crate" <<'PY'
import sys, yaml
c = yaml.safe_load(open(sys.argv[1]))
if (c["version"], c["appVersion"]) != (sys.argv[2], sys.argv[2]):
    sys.exit(f"45-helm: FAIL: chart {c['version']} / app {c['appVersion']}, the crate is {sys.argv[2]}")
print(f"Chart.yaml: version and appVersion {sys.argv[2]}, as plugin/Cargo.toml")
PY
# NOTES.txt: rendered by an install (client-side dry run: no cluster), it names the commands.
"$HELM" install cni-guard "$CHART" -n "$NAMESPACE" --dry-run=client \
  -f "$CHART/ci/servicemonitor-values.yaml" >"$WORK/notes.out"
for want in "kubectl -n $NAMESPACE rollout status daemonset/cni-guard" \
  "/cni-guard-agent check" "--config=/host/etc/cni/net.d/00-cni-guard.conflist" \
  "kubectl -n $NAMESPACE logs POD -c keep" "ServiceMonitor cni-guard" "CniGuardRefusingPods"; do
  grep -qF -- "$want" "$WORK/notes.out" || { sed -n '/^NOTES:/,$p' "$WORK/notes.out" >&2; fail "NOTES.txt does not say $want"; }
done
echo "NOTES.txt: rollout status, check, keep's log, the monitor and the alerts"
bash scripts/helm-docs.sh --check

echo "-- release package"
# scripts/package-chart.sh as the release workflow runs it: the package's defaults are the
# published image (by digest) and a runbook address that resolves; it renders with no values.
RELEASE_DIGEST=sha256:89abcdef0123456789abcdef0123456789abcdef0123456789abcdef01234567
package=$(HELM=$HELM bash scripts/package-chart.sh "$WORK/package" registry.invalid/platform/cni-guard \
  "$RELEASE_DIGEST" https://docs.example.invalid/cni-guard/runbooks.md)
chart_version=$(sed -n 's/^version: //p' "$CHART/Chart.yaml")
[ "$package" = "$WORK/package/cni-guard-$chart_version.tgz" ] || fail "package-chart.sh wrote $package"
"$HELM" template cni-guard "$package" -n "$NAMESPACE" --set prometheusRule.enabled=true >"$WORK/package.yaml"
grep -qF "image: registry.invalid/platform/cni-guard@$RELEASE_DIGEST" "$WORK/package.yaml" ||
  fail "the packaged chart's default image is not the published one"
grep -qF 'runbook_url: "https://docs.example.invalid/cni-guard/runbooks.md#cniguardrefusingpods"' "$WORK/package.yaml" ||
  fail "the packaged chart's runbook_url is not the release's"
mkdir -p "$WORK/unpacked"
tar -xzf "$package" -C "$WORK/unpacked"
bash -c 'CHART=$1 exec bash scripts/helm-docs.sh --check' _ "$WORK/unpacked/cni-guard" >/dev/null ||
  fail "the packaged chart's README values table is not its values.yaml"
[ -s "$WORK/unpacked/cni-guard/dashboards/cni-guard.json" ] || fail "the package has no dashboard"
if HELM=$HELM bash scripts/package-chart.sh "$WORK/package-bad" registry.invalid/cni-guard sha256:abc >/dev/null 2>&1; then
  fail "package-chart.sh took a digest that is no sha256:<64 hex>"
fi
echo "package-chart.sh: cni-guard-$chart_version.tgz renders registry.invalid/platform/cni-guard@${RELEASE_DIGEST:0:19}... and the release's runbooks with no values; a bad digest is refused"

echo "-- release workflow"
# actionlint (built like helm, pinned) on every workflow, with shellcheck on their run: scripts.
SHELLCHECK=$(command -v shellcheck || true)
if [ -z "$SHELLCHECK" ]; then
  if [ "${CI:-}" = true ]; then fail "shellcheck is not installed (scripts/setup.sh installs it)"; fi
  echo "45-helm: NOTE: shellcheck is not installed: actionlint checks the workflows without it" >&2
fi
"$ACTIONLINT_BIN/actionlint" -shellcheck="$SHELLCHECK" -pyflakes= .github/workflows/*.yml ||
  fail "actionlint found problems in .github/workflows (above)"
workflows=(.github/workflows/*.yml)
echo "actionlint $ACTIONLINT_VERSION${SHELLCHECK:+ (with shellcheck)}: ${workflows[*]} clean"
# The release builds with the tools the tests use.
python3 - .github/workflows/release.yml "$GO_MIN_VERSION" "$HELM_VERSION" "$CRANE_VERSION" <<'PY'
import sys, yaml
env = yaml.safe_load(open(sys.argv[1]))["env"]
want = dict(zip(["GO_VERSION", "HELM_VERSION", "CRANE_VERSION"], sys.argv[2:]))
got = {k: str(env.get(k)) for k in want}
if got != want:
    sys.exit(f"45-helm: FAIL: release.yml pins {got}, scripts/versions.sh and setup-helm.sh {want}")
print(f"release.yml builds with go {want['GO_VERSION']}, helm {want['HELM_VERSION']}, crane {want['CRANE_VERSION']}, as the tests")
PY

echo "-- release push"
# The release's push, against a registry of the test's own (crane registry serve, in a network
# namespace made and removed here): crane push of an image layout keeps the digest
# build-image.sh printed, and the chart pushed with helm push renders from oci:// with that
# image as its default. Needs root (the namespace).
if [ "$(id -u)" != 0 ]; then
  [ "${CI:-}" != true ] || fail "the release push needs root (a network namespace)"
  echo "45-helm: SKIPPED: the release push (needs root for its network namespace)" >&2
else
  NETNS=cg-helm-p$$-$(od -An -N4 -tx1 /dev/urandom | tr -d ' \n')
  ip netns add "$NETNS"
  cleanup() {
    [ -z "${REGISTRY_PID:-}" ] || kill "$REGISTRY_PID" 2>/dev/null || true
    ip netns del "$NETNS" 2>/dev/null || true
    rm -rf "$WORK"
  }
  ip netns exec "$NETNS" ip link set lo up
  ip netns exec "$NETNS" "$CRANE_BIN/crane" registry serve --address 127.0.0.1:5000 >"$WORK/registry.log" 2>&1 &
  REGISTRY_PID=$!
  in_ns() { ip netns exec "$NETNS" "$@"; }
  for _ in $(seq 50); do
    in_ns "$CRANE_BIN/crane" catalog --insecure 127.0.0.1:5000 >/dev/null 2>&1 && break
    sleep 0.2
  done
  in_ns "$CRANE_BIN/crane" catalog --insecure 127.0.0.1:5000 >/dev/null || { cat "$WORK/registry.log" >&2; fail "the test registry did not start"; }
  bash scripts/build-image.sh guard "$WORK/guard.tar" "$BIN" 127.0.0.1:5000/cni-guard:test >"$WORK/build-image.out"
  built=$(sed -n 's/.*(manifest \(sha256:[0-9a-f]*\))$/\1/p' "$WORK/build-image.out")
  mkdir -p "$WORK/layout"
  tar -xf "$WORK/guard.tar" -C "$WORK/layout"
  pushed=$(in_ns "$CRANE_BIN/crane" push --insecure "$WORK/layout" 127.0.0.1:5000/cni-guard:test 2>"$WORK/push.err")
  if [ -z "$built" ] || [ "${pushed##*@}" != "$built" ]; then
    fail "crane push printed $pushed; build-image.sh built $built"
  fi
  [ "$(in_ns "$CRANE_BIN/crane" digest --insecure 127.0.0.1:5000/cni-guard:test)" = "$built" ] || fail "the registry holds another digest"
  package=$(HELM=$HELM bash scripts/package-chart.sh "$WORK/push" 127.0.0.1:5000/cni-guard "$built")
  in_ns "$HELM" push "$package" oci://127.0.0.1:5000/charts --plain-http >"$WORK/helm-push.out" 2>&1 ||
    { cat "$WORK/helm-push.out" >&2; fail "helm push"; }
  chart_digest=$(sed -n 's/^Digest: //p' "$WORK/helm-push.out")
  [[ $chart_digest =~ ^sha256:[0-9a-f]{64}$ ]] || { cat "$WORK/helm-push.out" >&2; fail "helm push printed no digest (the workflow signs it)"; }
  in_ns "$HELM" template cni-guard oci://127.0.0.1:5000/charts/cni-guard --version "$chart_version" --plain-http \
    -n "$NAMESPACE" >"$WORK/oci.yaml" 2>"$WORK/oci.err"
  [ "$(grep -c "image: 127.0.0.1:5000/cni-guard@$built" "$WORK/oci.yaml")" = 2 ] ||
    fail "the chart from oci:// does not default to the pushed image"
  echo "release push: crane push kept ${built:0:19}...; helm push gave ${chart_digest:0:19}...; the chart from oci:// runs the pushed image by digest"
fi

echo "-- flux"
# deploy/flux: the order of the Kustomizations, the HelmRelease's values against the chart (its
# schema, by rendering them), and the Multus folder's patches over a stand-in of upstream's
# thick manifest that has the objects and fields they touch.
kubectl kustomize deploy/flux/cni-guard >"$WORK/flux-cni-guard.yaml"
python3 - "$WORK" <<'PY'
import sys, yaml
work = sys.argv[1]
def fail(msg):
    sys.exit("45-helm: FAIL: flux: " + msg)
docs = {d["kind"]: d for d in yaml.safe_load_all(open(f"{work}/flux-cni-guard.yaml")) if d}
ks = {d["metadata"]["name"]: d["spec"] for d in yaml.safe_load_all(open("deploy/flux/kustomizations.yaml")) if d}
deps = lambda n: sorted(x["name"] for x in ks[n].get("dependsOn", []))
if deps("cni-guard") != ["cilium", "multus"] or deps("multus") != ["cilium"]:
    fail(f"order: cni-guard depends on {deps('cni-guard')}, multus on {deps('multus')}")
if not (ks["multus"].get("wait") and ks["cilium"].get("wait")):
    fail("the multus and cilium Kustomizations must wait for their objects to be Ready")
if "OCIRepository" in docs:
    fail("an OCIRepository: no chart is published, the example takes the chart from Git")
hr, src = docs["HelmRelease"], docs["GitRepository"]
chart = hr["spec"]["chart"]["spec"]
if chart["sourceRef"] != {"kind": "GitRepository", "name": src["metadata"]["name"]} or \
        src["metadata"]["namespace"] != hr["metadata"]["namespace"] or \
        chart["chart"] != "./deploy/helm/cni-guard" or chart.get("reconcileStrategy") != "Revision":
    fail(f"the HelmRelease does not take ./deploy/helm/cni-guard from the GitRepository beside it: {chart}")
if set(src["spec"]["ref"]) != {"commit"}:
    fail(f"the GitRepository is not pinned to a commit: {src['spec']['ref']}")
for action in ("install", "upgrade"):
    if hr["spec"][action]["strategy"]["name"] != "RetryOnFailure" or "remediation" in hr["spec"][action]:
        fail(f"{action}: strategy {hr['spec'][action]}, want RetryOnFailure (no uninstall between attempts)")
if docs["Namespace"]["metadata"]["labels"].get("pod-security.kubernetes.io/enforce") != "privileged":
    fail("the namespace is not privileged")
yaml.safe_dump(hr["spec"]["values"], open(f"{work}/flux-values.yaml", "w"))
print("deploy/flux: cilium, then multus (both waited for), then cni-guard; RetryOnFailure for install and upgrade")
PY
# As shipped, with nothing added: the values render (REGISTRY is the one thing to replace), and
# no object that needs the Prometheus Operator's CRDs; turned on as its comment says, they do.
"$HELM" template cni-guard "$CHART" -n "$NAMESPACE" -f "$WORK/flux-values.yaml" >"$WORK/flux-render.yaml" ||
  fail "the HelmRelease's values, as shipped, do not render with the chart (above)"
grep -q '^kind: DaemonSet$' "$WORK/flux-render.yaml" || fail "the HelmRelease's values render no DaemonSet"
[ "$(grep -c 'image: "\?REGISTRY/cni-guard:dev"\?$' "$WORK/flux-render.yaml")" = 2 ] ||
  fail "the HelmRelease's values, as shipped, do not run REGISTRY/cni-guard:dev"
for kind in PodMonitor PrometheusRule ConfigMap; do
  ! grep -q "^kind: $kind$" "$WORK/flux-render.yaml" ||
    fail "the HelmRelease's values render a $kind as shipped: monitoring must be off until the user has the CRDs"
done
! grep -q 'example.invalid\|runbookBaseUrl' "$WORK/flux-values.yaml" || fail "the HelmRelease sets a placeholder runbook address"
"$HELM" template cni-guard "$CHART" -n "$NAMESPACE" -f "$WORK/flux-values.yaml" \
  --set podMonitor.enabled=true --set prometheusRule.enabled=true --set grafanaDashboard.enabled=true \
  --set podMonitor.labels.release=kube-prometheus-stack --set prometheusRule.labels.release=kube-prometheus-stack \
  >"$WORK/flux-render-monitoring.yaml" || fail "the HelmRelease's values with monitoring on do not render (above)"
for kind in PodMonitor PrometheusRule ConfigMap; do
  grep -q "^kind: $kind$" "$WORK/flux-render-monitoring.yaml" || fail "with monitoring on, the HelmRelease's values render no $kind"
done
echo "deploy/flux/cni-guard/helmrelease.yaml: as shipped its values pass the schema and render the DaemonSet of REGISTRY/cni-guard:dev and no monitoring object; with monitoring on, the PodMonitor, PrometheusRule and dashboard"
mkdir -p "$WORK/multus"
cp deploy/flux/multus/* "$WORK/multus/"
cat >"$WORK/multus/multus-daemonset-thick.yml" <<'YAML'
# A stand-in of upstream's deployments/multus-daemonset-thick.yml (v4.3.0): the names the
# patches of deploy/flux/multus touch.
kind: ConfigMap
apiVersion: v1
metadata:
  name: multus-daemon-config
  namespace: kube-system
data:
  daemon-config.json: |
    {"cniConfigDir": "/host/etc/cni/net.d", "multusAutoconfigDir": "/host/etc/cni/net.d"}
---
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: kube-multus-ds
  namespace: kube-system
spec:
  selector:
    matchLabels:
      name: multus
  template:
    metadata:
      labels:
        name: multus
    spec:
      containers:
        - name: kube-multus
          image: multus-thick
          volumeMounts:
            - name: host-run-netns
              mountPath: /run/netns
              mountPropagation: HostToContainer
            - name: multus-daemon-config
              mountPath: /etc/cni/net.d/multus.d
              readOnly: true
      initContainers:
        - name: install-multus-binary
          image: multus-thick
          command: ["cp", "/usr/src/multus-cni/bin/multus-shim", "/host/opt/cni/bin/multus-shim"]
      volumes:
        - name: multus-daemon-config
          configMap:
            name: multus-daemon-config
            items:
              - key: daemon-config.json
                path: daemon-config.json
        - name: host-run-netns
          hostPath:
            path: /run/netns/
YAML
kubectl kustomize "$WORK/multus" >"$WORK/multus-1.yaml"
sed -i 's/"logLevel": "verbose"/"logLevel": "debug"/' "$WORK/multus/daemon-config.json"
kubectl kustomize "$WORK/multus" >"$WORK/multus-2.yaml"
python3 - "$WORK" <<'PY'
import json, sys, yaml
work = sys.argv[1]
def fail(msg):
    sys.exit("45-helm: FAIL: flux multus: " + msg)
def load(n):
    docs = [d for d in yaml.safe_load_all(open(f"{work}/multus-{n}.yaml")) if d]
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap"]
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    return cm, ds
cm, ds = load(1)
name = cm["metadata"]["name"]
if not name.startswith("multus-daemon-config-layout-") or name == "multus-daemon-config-layout-":
    fail(f"the daemon config's ConfigMap is {name}: no hash of its content")
conf = json.loads(cm["data"]["daemon-config.json"])
if conf["multusAutoconfigDir"] != "/etc/cni/multus/net.d" or conf["cniConfigDir"] != "/host/etc/cni/net.d":
    fail(f"daemon-config.json: {conf}")
spec = ds["spec"]["template"]["spec"]
vols = {v["name"]: v for v in spec["volumes"]}
if vols["multus-daemon-config"]["configMap"]["name"] != name or "items" not in vols["multus-daemon-config"]["configMap"]:
    fail(f"the DaemonSet mounts {vols['multus-daemon-config']}, not {name}")
if vols["host-run-netns"]["hostPath"]["path"] != "/var/run/netns/":
    fail("host-run-netns is not /var/run/netns/ (Talos)")
(init,) = spec["initContainers"]
if init["command"][0] != "/usr/src/multus-cni/bin/install_multus" or init.get("image") != "multus-thick":
    fail(f"install-multus-binary: {init}")
cm2, ds2 = load(2)
if cm2["metadata"]["name"] == name or ds2["spec"]["template"] == ds["spec"]["template"]:
    fail("a change of daemon-config.json does not change the DaemonSet's pod template (no restart)")
print(f"deploy/flux/multus: daemon config in {name} (multusAutoconfigDir /etc/cni/multus/net.d), "
      "upstream's ConfigMap dropped, host-run-netns /var/run/netns/, install_multus; "
      "a change of daemon-config.json changes the pod template (every Multus restarts)")
PY

echo "-- helm commands of the docs"
# Every `helm install` / `helm upgrade` of this chart shown in README.md and docs/ (code blocks,
# `\` continuations joined), placeholders filled in, must render with `helm template`: its
# values exist (the schema refuses unknown keys) and its image is set.
# shellcheck disable=SC2046 # the docs' paths have no spaces
python3 - "$WORK" README.md $(find docs -name '*.md' | sort) <<'PY' >"$WORK/doc-commands.txt"
import re, shlex, sys
work, files = sys.argv[1], sys.argv[2:]
PLACEHOLDERS = {"REGISTRY": "registry.invalid", "sha256:DIGEST": "sha256:" + "ab" * 32,
                "DIGEST": "sha256:" + "ab" * 32, "VERSION": "0.0.1", '"$NS"': "cni-guard"}
for path in files:
    lines = open(path).read().splitlines()
    in_code, i = False, 0
    while i < len(lines):
        line = lines[i]
        if re.match(r"^\s*(```|~~~)", line):
            in_code = not in_code
        elif in_code and re.match(r"^\s*helm (install|upgrade) ", line):
            start, text = i, line
            while text.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                text = text.rstrip()[:-1] + " " + lines[i]
            text = text.split(" #")[0]
            for k, v in PLACEHOLDERS.items():
                text = text.replace(k, v)
            print(f"{path}:{start + 1}\t{text.strip()}")
        i += 1
PY
checked=0
while IFS=$'\t' read -r where cmd; do
  read -ra words <<<"$cmd"
  # helm install|upgrade NAME CHART ARGS... -> helm template NAME deploy/helm/cni-guard ARGS...
  # The reader's own values (-f FILE, --reuse-values) cannot be checked: they are taken to hold
  # the image, and the --set flags shown are checked on top of it.
  args=() own=
  set -- "${words[@]:4}"
  while [ $# -gt 0 ]; do
    case $1 in
      --install | --wait | --atomic | --take-ownership | --dry-run*) ;;
      --reuse-values) own=1 ;;
      -f | --values) own=1; shift ;;
      *) args+=("$1") ;;
    esac
    shift
  done
  [ -z "$own" ] || args=("${IMAGE_SET[@]}" "${args[@]}")
  [ "${words[3]}" = deploy/helm/cni-guard ] || fail "$where: helm ${words[1]} of ${words[3]}, not the chart (deploy/helm/cni-guard)"
  eval "\"\$HELM\" template cni-guard \"\$CHART\" ${args[*]}" >"$WORK/doc-command.yaml" 2>"$WORK/doc-command.err" ||
    { cat "$WORK/doc-command.err" >&2; fail "$where: \`$cmd\` does not render"; }
  checked=$((checked + 1))
done <"$WORK/doc-commands.txt"
[ "$checked" -gt 0 ] || fail "no helm install or upgrade found in the docs"
echo "$checked helm install/upgrade commands of README.md and docs/ render with helm template"
echo "45-helm: all checks passed"
