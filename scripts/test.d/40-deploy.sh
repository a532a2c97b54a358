#!/usr/bin/env bash
# The Kubernetes manifests in deploy/ and the release binary they run, checked offline:
#  1. every kustomization renders (`kubectl kustomize`);
#  2. every rendered object passes strict schema validation (kubernetes-validate, from PyPI)
#     for a current Kubernetes version and an older supported one, and the validator rejects a
#     broken object (so a pass means something);
#  3. the rendered DaemonSet does what the docs say (tolerations, priority, probe, resources,
#     install and keep writing the same conflist, the guide's paths);
#  4. the exact commands the pods run (install, the readiness probe, uninstall) are run with the
#     release agent against a temporary host root, /host/... mapped into it;
#  5. the release binaries (the plugin and the agent) are statically linked, under 3 MiB, and
#     run in an empty root;
#  6. scripts/build-image.sh is reproducible: the guard image of one build built twice (another
#     copy, umask and mtime) has one digest, and the release image (amd64, and arm64 where this
#     machine can build it) built twice has one index digest, platforms as built;
#  7. deploy/image/Containerfile, as far as this machine can go without a container engine:
#     its build stage (deploy/image/build.sh) run in the build context it gets (the files git
#     tracks, less .dockerignore's) gives the two static binaries its final stage copies. Not
#     run here: the engine's own build (no Docker or Podman engine, no registry for its
#     rust image).
#
# Needs kubectl (with kustomize v5; it is part of this machine's image) and python3 with pip.
# Under CI=true anything missing is a failure; locally it skips loudly.
set -euo pipefail
cd "$(dirname "$0")/../.."

K8S_VERSIONS=(1.37.0 1.33.0)
VALIDATE_VERSION=1.37.0

missing() {
  if [ "${CI:-}" = true ]; then
    echo "40-deploy: FAIL: $1" >&2
    exit 1
  fi
  echo "40-deploy: SKIPPED: $1" >&2
  exit 0
}

command -v kubectl >/dev/null || missing "kubectl is not installed (needed for kubectl kustomize)"
command -v python3 >/dev/null || missing "python3 is not installed"
if ! command -v file >/dev/null; then
  if [ "$(id -u)" = 0 ]; then
    apt-get install -y -qq file >/dev/null || { apt-get update -qq && apt-get install -y -qq file; }
  else
    missing "file is not installed (apt-get install file)"
  fi
fi
if ! python3 -c 'import kubernetes_validate, yaml' 2>/dev/null ||
  [ "$(python3 -c 'import importlib.metadata as m; print(m.version("kubernetes-validate"))')" != "$VALIDATE_VERSION" ]; then
  if [ "$(id -u)" = 0 ] || [ -n "${VIRTUAL_ENV:-}" ]; then
    python3 -m pip install --quiet --disable-pip-version-check "kubernetes-validate==$VALIDATE_VERSION"
  else
    missing "kubernetes-validate==$VALIDATE_VERSION is not installed (pip install it, or run as root)"
  fi
fi

BIN=target/release/cni-guard
AGENT=target/release/cni-guard-agent
if [ ! -x "$BIN" ] || [ ! -x "$AGENT" ]; then
  cargo build --release --locked -p cni-guard -p cni-guard-agent
fi

WORK=$(mktemp -d /tmp/cni-guard-deploy.XXXXXX)
cleanup() { rm -rf "$WORK"; }
trap cleanup EXIT

echo "-- render"
for overlay in base multus-cilium uninstall uninstall-job; do
  kubectl kustomize "deploy/$overlay" >"$WORK/$overlay.yaml"
  echo "rendered deploy/$overlay: $(grep -c '^kind:' "$WORK/$overlay.yaml") objects"
done

echo "-- schema"
for version in "${K8S_VERSIONS[@]}"; do
  kubernetes-validate --strict --quiet -k "$version" "$WORK"/*.yaml
  echo "all objects valid against Kubernetes $version (strict)"
done
# The validator must reject a DaemonSet with an unknown field and one with a wrong type.
sed 's/^\(\s*\)hostNetwork: true/\1hostNetwork: true\n\1hostNetwrk: true/' "$WORK/base.yaml" >"$WORK/broken-field.yml"
sed 's/^\(\s*\)hostNetwork: true/\1hostNetwork: "yes"/' "$WORK/base.yaml" >"$WORK/broken-type.yml"
for broken in "$WORK"/broken-*.yml; do
  if kubernetes-validate --strict --quiet -k "${K8S_VERSIONS[0]}" "$broken" >/dev/null 2>&1; then
    echo "40-deploy: FAIL: the validator accepted $(basename "$broken")" >&2
    exit 1
  fi
done
echo "the validator rejects an unknown field and a wrong type"

echo "-- manifests and binary"
python3 - "$WORK" "$BIN" "$AGENT" <<'PY'
import json, os, shutil, stat, subprocess, sys, yaml

work, binary, agent = sys.argv[1], os.path.abspath(sys.argv[2]), os.path.abspath(sys.argv[3])
def load(name):
    with open(os.path.join(work, name + ".yaml")) as f:
        return [d for d in yaml.safe_load_all(f) if d]
def one(docs, kind):
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, (kind, found)
    return found[0]
def fail(msg):
    print("40-deploy: FAIL: " + msg, file=sys.stderr)
    sys.exit(1)
def check(cond, msg):
    if not cond:
        fail(msg)

def flags(args):
    """--name=value args as (name, value) pairs, in order."""
    out = []
    for a in args:
        name, _, value = a.partition("=")
        out.append((name, value))
    return out

GUIDE = {
    "--delegate": ["/etc/cni/net.d/00-multus.conf"],
    "--attachment": ["/etc/cni/multus/net.d/05-cilium.conflist"],
}

for overlay in ["base", "multus-cilium"]:
    docs = load(overlay)
    ns = one(docs, "Namespace")
    check(ns["metadata"]["labels"].get("pod-security.kubernetes.io/enforce") == "privileged",
          f"{overlay}: namespace must allow hostPath pods")
    ds = one(docs, "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    check(spec.get("priorityClassName") == "system-node-critical", f"{overlay}: priority")
    check(spec.get("hostNetwork") is True, f"{overlay}: hostNetwork")
    check({"operator": "Exists"} in spec.get("tolerations", []),
          f"{overlay}: must tolerate every taint (control planes, not-ready nodes)")
    (install,) = spec["initContainers"]
    (keep,) = spec["containers"]
    for c in (install, keep):
        res = c.get("resources", {})
        check(res.get("requests") and res.get("limits"), f"{overlay}: {c['name']} resources")
    check(install["args"][0] == "install" and keep["args"][0] == "keep", f"{overlay}: commands")
    inst = [f for f in flags(install["args"][1:]) if f[0] != "--bin-dir"]
    # keep's own flags first: where its readiness checks look (the probe's root and plugin path).
    check(flags(keep["args"][1:3]) == [("--host-root", "/host"), ("--cni-path", "/opt/cni/bin")],
          f"{overlay}: keep's readiness flags are {keep['args'][1:3]}")
    kept = flags(keep["args"][3:])
    check(inst == kept, f"{overlay}: install and keep must write the same conflist:\n{inst}\n{kept}")
    probe = keep["readinessProbe"]["exec"]["command"]
    check(probe[:2] == ["/cni-guard-agent", "check"], f"{overlay}: probe runs check")
    check(install["command"] == keep["command"] == ["/cni-guard-agent"], f"{overlay}: the agent runs")
    pf = dict(flags(probe[2:]))
    kf = dict(kept)
    check(pf["--config"] == kf["--conf-dir"] + "/" + kf["--conf-name"],
          f"{overlay}: the probe checks the file keep writes")
    if overlay == "multus-cilium":
        for name, want in GUIDE.items():
            got = [v for n, v in kept if n == name]
            check(got == want, f"{overlay}: {name} is {got}, the guide says {want}")
        mounts = {m["mountPath"]: m["name"] for m in keep["volumeMounts"]}
        vols = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"]}
        check(vols.get(mounts.get("/host/etc/cni/multus/net.d")) == "/etc/cni/multus/net.d",
              f"{overlay}: the probe needs Cilium's conf dir under /host")
    # Every /host/... path a command uses is a mount of the same host path.
    mounts = {m["mountPath"]: m["name"] for c in (install, keep) for m in c["volumeMounts"]}
    vols = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"]}
    for mount, name in mounts.items():
        check(mount == "/host" + vols[name], f"{overlay}: {mount} mounts {vols[name]}")
    print(f"{overlay}: DaemonSet settings as documented")

# Run what the pods run, with /host mapped to a temporary host root.
def run_pod_command(args, root, expect):
    mapped = [a.replace("/host/", root + "/").replace("=/host", "=" + root) for a in args]
    if mapped[0] != "/cni-guard-agent":
        fail(f"{' '.join(args)}: the pod runs {mapped[0]}, not the agent")
    # As in the image, the plugin is beside the agent, which installs it from there.
    proc = subprocess.run([agent] + mapped[1:], capture_output=True, text=True,
                          env={k: v for k, v in os.environ.items() if k != "CNI_COMMAND"})
    if proc.returncode != expect:
        fail(f"{' '.join(mapped)}: exit {proc.returncode}, expected {expect}\n"
             f"{proc.stdout}{proc.stderr}")
    return proc.stdout

def write(path, text, mode=0o644):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, mode)

root = os.path.join(work, "host")
for d in ["opt/cni/bin", "etc/cni/net.d", "etc/cni/multus/net.d", "var/lib/cni/cni-guard"]:
    os.makedirs(os.path.join(root, d))
ds = one(load("multus-cilium"), "DaemonSet")["spec"]["template"]["spec"]
install, keep = ds["initContainers"][0], ds["containers"][0]
probe = keep["readinessProbe"]["exec"]["command"]

run_pod_command(install["command"] + install["args"], root, 0)
conflist = json.load(open(os.path.join(root, "etc/cni/net.d/00-cni-guard.conflist")))
plugin = conflist["plugins"][0]
check(plugin["type"] == "cni-guard", "conflist type")
check(plugin["delegate"] == "/etc/cni/net.d/00-multus.conf", "conflist delegate is a host path")
check(plugin["attachments"] == ["/etc/cni/multus/net.d/05-cilium.conflist"], "conflist attachments")
check(open(os.path.join(root, "opt/cni/bin/cni-guard"), "rb").read() == open(binary, "rb").read(),
      "installed binary")
print("install (as the init container runs it) wrote the guide's conflist and the binary")

out = run_pod_command(probe, root, 1)
check("00-multus.conf" in out, "the probe names the missing delegate:\n" + out)
write(os.path.join(root, "etc/cni/net.d/00-multus.conf"),
      '{"cniVersion":"0.3.1","name":"multus-cni-network","type":"multus-shim"}\n')
write(os.path.join(root, "etc/cni/multus/net.d/05-cilium.conflist"),
      '{"cniVersion":"0.3.1","name":"cilium","plugins":[{"type":"cilium-cni"}]}\n')
for plugin_type in ["multus-shim", "cilium-cni"]:
    write(os.path.join(root, "opt/cni/bin", plugin_type), "#!/bin/sh\nexit 0\n", 0o755)
run_pod_command(probe, root, 0)
os.remove(os.path.join(root, "etc/cni/multus/net.d/05-cilium.conflist"))
out = run_pod_command(probe, root, 1)
check("05-cilium.conflist" in out, "the probe names the missing attachment:\n" + out)
print("the readiness probe fails without the delegate or the attachment and passes with both")

(uninstall,) = one(load("uninstall"), "DaemonSet")["spec"]["template"]["spec"]["containers"]
args = [a for a in uninstall["args"] if a != "--stay"]
run_pod_command(uninstall["command"] + args, root, 0)
check(not os.path.exists(os.path.join(root, "etc/cni/net.d/00-cni-guard.conflist")), "conflist removed")
check(not os.path.exists(os.path.join(root, "opt/cni/bin/cni-guard")), "binary removed")
check(os.path.exists(os.path.join(root, "etc/cni/net.d/00-multus.conf")), "delegate left alone")
(job_container,) = one(load("uninstall-job"), "Job")["spec"]["template"]["spec"]["containers"]
run_pod_command(job_container["command"] + job_container["args"], root, 0)
print("uninstall (DaemonSet and Job commands) removed the guard and left the delegate")
PY

echo "-- static binaries"
for b in "$BIN" "$AGENT"; do
  description=$(file -L "$b")
  echo "$description"
  case "$description" in
    *"statically linked"*) ;;
    *) echo "40-deploy: FAIL: $b is not statically linked" >&2; exit 1 ;;
  esac
  libraries=$(ldd "$b" 2>&1 || true)
  case "$libraries" in
    *"statically linked"* | *"not a dynamic executable"*) ;;
    *) echo "40-deploy: FAIL: ldd lists shared libraries for $b: $libraries" >&2; exit 1 ;;
  esac
  size=$(stat -c %s "$b")
  stripped="$WORK/$(basename "$b").stripped"
  strip -o "$stripped" "$b"
  stripped_size=$(stat -c %s "$stripped")
  echo "$(basename "$b"): $size bytes; stripped: $stripped_size bytes"
  if [ "$stripped_size" -ge $((3 * 1024 * 1024)) ]; then
    echo "40-deploy: FAIL: stripped $b is 3 MiB or more" >&2
    exit 1
  fi
done

# An empty root, as in a FROM-scratch image: no libc, no /etc, no /proc.
if [ "$(id -u)" = 0 ]; then
  empty="$WORK/empty-root"
  mkdir -p "$empty/opt/cni/bin" "$empty/etc/cni/net.d"
  cp "$BIN" "$empty/cni-guard"
  cp "$AGENT" "$empty/cni-guard-agent"
  chroot "$empty" /cni-guard-agent --version
  chroot "$empty" /cni-guard-agent install --binary=/cni-guard --bin-dir=/opt/cni/bin \
    --conf-dir=/etc/cni/net.d --delegate=/etc/cni/net.d/00-multus.conf
  cmp "$empty/cni-guard" "$empty/opt/cni/bin/cni-guard"
  echo "runs and installs in an empty root"
elif [ "${CI:-}" = true ]; then
  echo "40-deploy: FAIL: the empty-root run needs root (chroot)" >&2
  exit 1
else
  echo "40-deploy: SKIPPED the empty-root run: needs root (chroot)" >&2
fi

echo "-- reproducible images"
digest_of() { sed -n 's/.*(manifest \(sha256:[0-9a-f]*\)).*/\1/p; s/^build-image: digest \(sha256:[0-9a-f]*\)$/\1/p'; }
mkdir "$WORK/other-copy"
cp "$BIN" "$AGENT" "$WORK/other-copy/"
touch -d @86400 "$WORK/other-copy"/*
first=$(bash scripts/build-image.sh guard "$WORK/guard-1.tar" "$BIN" | digest_of)
second=$( (umask 077; bash scripts/build-image.sh guard "$WORK/guard-2.tar" "$WORK/other-copy/cni-guard") | digest_of)
[ -n "$first" ] && [ "$first" = "$second" ] ||
  { echo "40-deploy: FAIL: the guard image of one binary has two digests: $first $second" >&2; exit 1; }
cmp "$WORK/guard-1.tar" "$WORK/guard-2.tar"
echo "guard image built twice: $first both times, byte-identical tarballs"
# Under the name asked for (REGISTRY/cni-guard:dev in the README), which index.json carries.
IMAGE_NAME=registry.invalid/team/cni-guard:dev
bash scripts/build-image.sh release "$WORK/release-1.tar" "$IMAGE_NAME" >"$WORK/release-1.log" 2>&1 ||
  { cat "$WORK/release-1.log" >&2; echo "40-deploy: FAIL: build-image.sh release" >&2; exit 1; }
(umask 077; bash scripts/build-image.sh release "$WORK/release-2.tar" "$IMAGE_NAME") >"$WORK/release-2.log" 2>&1 ||
  { cat "$WORK/release-2.log" >&2; echo "40-deploy: FAIL: build-image.sh release (again)" >&2; exit 1; }
first=$(digest_of <"$WORK/release-1.log")
second=$(digest_of <"$WORK/release-2.log")
[ -n "$first" ] && [ "$first" = "$second" ] && cmp -s "$WORK/release-1.tar" "$WORK/release-2.tar" ||
  { echo "40-deploy: FAIL: the release image built twice: $first, then $second" >&2; exit 1; }
grep -E '^build-image: (linux/|arm64 left out)' "$WORK/release-1.log"
python3 - "$WORK/release-1.tar" "$AGENT" "$IMAGE_NAME" <<'PY'
import hashlib, json, subprocess, sys, tarfile
t = tarfile.open(sys.argv[1])
blob = lambda d: t.extractfile("blobs/sha256/" + d.split(":")[1]).read()
(top,) = json.load(t.extractfile("index.json"))["manifests"]
named = top["annotations"]["io.containerd.image.name"]
if named != sys.argv[3] or top["annotations"]["org.opencontainers.image.ref.name"] != "dev":
    sys.exit(f"40-deploy: FAIL: the release image is named {named} in index.json, not {sys.argv[3]}")
index = json.loads(blob(top["digest"]))
platforms = [m["platform"]["architecture"] for m in index["manifests"]]
if platforms[0] != "amd64":
    sys.exit(f"40-deploy: FAIL: the release image's platforms are {platforms}")
for m in index["manifests"]:
    manifest = json.loads(blob(m["digest"]))
    config = json.loads(blob(manifest["config"]["digest"]))
    (layer,) = manifest["layers"]
    files = tarfile.open(fileobj=__import__("io").BytesIO(blob(layer["digest"])))
    names = [i.name for i in files.getmembers() if not i.isdir()]
    modes = {n: files.getmember(n).mode for n in names}
    if sorted(names) != ["./cni-guard", "./cni-guard-agent"] or set(modes.values()) != {0o755} \
            or config["architecture"] != m["platform"]["architecture"] \
            or config["config"]["Entrypoint"] != ["/cni-guard-agent"]:
        sys.exit(f"40-deploy: FAIL: {m['platform']}: files {modes}, config {config['architecture']} {config['config'].get('Entrypoint')}")
    if config["config"]["Labels"]["org.opencontainers.image.version"] != subprocess.run(
            [sys.argv[2], "--version"], capture_output=True, text=True).stdout.split()[1]:
        sys.exit(f"40-deploy: FAIL: {m['platform']}: the image's version label is not the binary's")
print(f"release image {named}: {top['digest']}, platforms {', '.join(platforms)}, each /cni-guard and /cni-guard-agent alone (0755)")
PY
# 7. The Containerfile's build stage, in its build context.
python3 - "$WORK/context" <<'PY'
import fnmatch, os, re, shutil, subprocess, sys
ctx = sys.argv[1]
cf = open("deploy/image/Containerfile").read()
def want(cond, msg):
    if not cond:
        sys.exit("40-deploy: FAIL: Containerfile: " + msg)
m = re.search(r"^FROM rust:(\d+)\.(\d+)\.(\d+)-slim-bookworm AS build$", cf, re.M)
want(m, "the build stage is not FROM rust:X.Y.Z-slim-bookworm (an exact toolchain)")
need = tuple(int(x) for x in re.search(r'^rust-version = "(\d+)\.(\d+)"', open("Cargo.toml").read(), re.M).groups())
want(tuple(map(int, m.groups()))[:2] >= need, f"rust {m.groups()} is older than the workspace's rust-version {need}")
for line in ("COPY . .", "RUN sh deploy/image/build.sh /out", "FROM scratch",
             "COPY --from=build /out/cni-guard /cni-guard",
             "COPY --from=build /out/cni-guard-agent /cni-guard-agent", 'ENTRYPOINT ["/cni-guard-agent"]'):
    want(re.search("^" + re.escape(line) + "$", cf, re.M), f"no line {line!r}")
# Without --build-arg the build gets the ARG's default: empty (the agent then says `commit
# unknown`) or a commit id; anything else fails the agent's build.rs.
arg = re.search(r"^ARG CNI_GUARD_COMMIT(?:=(\S*))?$", cf, re.M)
want(arg, "no line ARG CNI_GUARD_COMMIT")
want(not arg[1] or re.fullmatch(r"[0-9a-fA-F]{12,64}", arg[1]),
     f"ARG CNI_GUARD_COMMIT={arg[1]}: a build without --build-arg would fail (not empty, not a commit id)")
ignore = [l.strip().rstrip("/") for l in open(".dockerignore") if l.strip() and not l.startswith("#")]
files = subprocess.run(["git", "ls-files", "-z"], capture_output=True, check=True).stdout.decode().split("\0")
kept = 0
for f in filter(None, files):
    if any(f == p or f.startswith(p + "/") or fnmatch.fnmatch(f, p) for p in ignore):
        continue
    os.makedirs(os.path.join(ctx, os.path.dirname(f)), exist_ok=True)
    shutil.copy2(f, os.path.join(ctx, f), follow_symlinks=False)
    kept += 1
print(f"Containerfile: FROM rust:{'.'.join(m.groups())}-slim-bookworm, its context {kept} files (.dockerignore: {', '.join(ignore)})")
PY
# The deps come from the release build's target dir (a copy), offline: what is built anew is
# the workspace's own crates, from the context.
mkdir -p "$WORK/context-target"
cp -a target/release "$WORK/context-target/"
(cd "$WORK/context" && CARGO_TARGET_DIR="$WORK/context-target" CARGO_NET_OFFLINE=true \
  CNI_GUARD_COMMIT=0123456789abcdef0123456789abcdef01234567 sh deploy/image/build.sh "$WORK/context-out") \
  >"$WORK/context-build.log" 2>&1 ||
  { cat "$WORK/context-build.log" >&2; echo "40-deploy: FAIL: deploy/image/build.sh in the Containerfile's context" >&2; exit 1; }
for b in cni-guard cni-guard-agent; do
  file "$WORK/context-out/$b" | grep -q 'statically linked' ||
    { echo "40-deploy: FAIL: the Containerfile's $b is not statically linked: $(file "$WORK/context-out/$b")" >&2; exit 1; }
done
version=$("$WORK/context-out/cni-guard-agent" --version)
[ "$version" = "$("$AGENT" --version | sed 's/(commit [0-9a-z]*/(commit 0123456789ab/')" ] ||
  { echo "40-deploy: FAIL: the Containerfile's agent says \"$version\"" >&2; exit 1; }
echo "Containerfile: its build stage gives /cni-guard and /cni-guard-agent, static; $version"
echo "40-deploy: all checks passed"
