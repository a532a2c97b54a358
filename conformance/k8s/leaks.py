#!/usr/bin/env python3
"""The guard's records and the host-local leases against the sandboxes that exist (issue 21).

    conformance/k8s/leaks.py [--settle SECONDS] [--no-guard]

On the node of scripts/cluster.sh, after a run with the guard in front: every record in the
guard's cacheDir and every host-local lease must name a sandbox that is still there and Ready
(its network not torn down), and every Ready sandbox with a network of its own must have its
guard record and its leases (the primary's when the primary is host-local, net1's when the pod
asks for macvlan-net1). A file naming a sandbox that is gone is a leak: a teardown that did not
go through the guard, or did not finish.

One exception is counted apart, not as a leak: Multus v4.3.0's DEL of the primary fails on this
node ("no IP ranges specified", see scripts/cluster.sh), so a pod that Multus set up leaves its
primary lease behind (`multus_primary_left`). A pod the guard ran on the primary itself
(per-pod awareness: its ADD logged `perpod=primary`) has no such excuse: its left lease is a leak.

While pods are still being torn down the two sides differ for a moment: the check is repeated
every second for up to --settle seconds (default 60) until they match. Prints

    node-leaks sandboxes=N records=N leases=N stale_records=N missing_records=N stale_leases=N
      missing_leases=N multus_primary_left=N

and, for each mismatch, a line on stderr naming the file and the sandbox. Exits 1 on a mismatch.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

CLUSTER_DIR = os.environ.get("CNI_GUARD_CLUSTER_DIR", "/var/lib/cni-guard-cluster")
NODE = os.path.join(CLUSTER_DIR, "node")
CACHE = os.path.join(NODE, "var/lib/cni/cni-guard")
LEASES = os.path.join(NODE, "var/lib/cni/networks")
GUARD_LOG = os.path.join(CLUSTER_DIR, "logs/guard-syslog.log")
PRIMARY_NET = "cilium"  # 05-cilium.conflist's network name (the bridge + host-local stand-in)
NET1 = "macvlan-net1"  # the NetworkAttachmentDefinition (conformance/k8s/manifests/net1-nad.yaml)
IP_NAME = re.compile(r"^[0-9a-fA-F.:]+$")


def crictl(*args):
    """crictl's JSON output; a failed call is a failure, never an empty node."""
    binary = os.path.join(os.environ["CRICTL_BIN"], "crictl")
    endpoint = "unix://" + os.path.join(NODE, "run/containerd/containerd.sock")
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as config:  # crictl warns without one
        config.write(f"runtime-endpoint: {endpoint}\ntimeout: 20\n")
        config.flush()
        out = subprocess.run(
            # (flags before the arguments: crictl's flag parsing stops at the first argument)
            [binary, "--config", config.name, args[0], "-o", "json", *args[1:]],
            capture_output=True, text=True, check=False)
    if out.returncode != 0:
        sys.exit(f"node-leaks: FAIL: crictl {' '.join(args)}: {out.stderr.strip()}")
    return json.loads(out.stdout)


def sandboxes():
    """Ready sandboxes with a network of their own: id -> (namespace/name, wants net1)."""
    ready = {}
    for item in crictl("pods").get("items", []):
        if item.get("state") != "SANDBOX_READY":
            continue
        sid = item["id"]
        status = crictl("inspectp", sid).get("status", {})
        net = status.get("linux", {}).get("namespaces", {}).get("options", {}).get("network")
        if net == "NODE":
            continue  # hostNetwork (Multus, the guard): no CNI at all
        meta = item.get("metadata", {})
        networks = item.get("annotations", {}).get("k8s.v1.cni.cncf.io/networks", "")
        ready[sid] = (f"{meta.get('namespace')}/{meta.get('name')}", NET1 in networks)
    return ready


def records():
    """(path, container id) of every record file (and every placeholder) in the cacheDir."""
    found = []
    if not os.path.isdir(CACHE):
        return found
    for network in sorted(os.listdir(CACHE)):
        d = os.path.join(CACHE, network)
        if not os.path.isdir(d):
            continue
        for name in sorted(os.listdir(d)):
            if name.startswith(".") or ":" not in name:
                continue  # a temp file being written, or not the guard's
            found.append((os.path.join(d, name), name.split(":", 1)[0]))
    return found


def leases():
    """(path, network, container id) of every host-local lease below the node's dataDir."""
    found = []
    if not os.path.isdir(LEASES):
        return found
    for network in sorted(os.listdir(LEASES)):
        d = os.path.join(LEASES, network)
        if not os.path.isdir(d):
            continue
        for name in sorted(os.listdir(d)):
            if not IP_NAME.match(name):
                continue  # lock, last_reserved_ip.0
            try:
                with open(os.path.join(d, name), encoding="utf-8") as f:
                    words = f.read().split()
            except OSError:
                words = []
            owner = words[0] if words else ""
            found.append((os.path.join(d, name), network, owner))
    return found


def bypassed():
    """Sandboxes the guard itself ran on the primary (its ADD logged perpod=primary)."""
    ids = set()
    try:
        with open(GUARD_LOG, encoding="utf-8", errors="replace") as f:
            for line in f:
                if "verb=ADD" in line and "perpod=primary" in line:
                    m = re.search(r"container=([0-9a-f]{64})", line)
                    if m:
                        ids.add(m.group(1))
    except FileNotFoundError:
        pass
    return ids


def check(guard):
    live = sandboxes()
    recs = records()
    lss = leases()
    problems = []
    recorded = {cid for _, cid in recs}
    for path, cid in recs:
        if cid not in live:
            problems.append(("stale_records", f"{path}: sandbox {cid[:13]} is not there (or torn down)"))
    if guard:
        for sid, (pod, _) in live.items():
            if sid not in recorded:
                problems.append(("missing_records", f"{pod} (sandbox {sid[:13]}) has no guard record in {CACHE}"))
    via_guard = bypassed()
    multus_left = 0
    leased = {}
    for path, network, owner in lss:
        leased.setdefault(network, set()).add(owner)
        if owner in live:
            continue
        if network == PRIMARY_NET and owner not in via_guard:
            multus_left += 1
            continue
        problems.append(("stale_leases", f"{path}: names sandbox {owner[:13] or '(none)'}, which is not there"))
    primary_host_local = os.path.isdir(os.path.join(LEASES, PRIMARY_NET))
    for sid, (pod, wants_net1) in live.items():
        if primary_host_local and sid not in leased.get(PRIMARY_NET, set()):
            problems.append(("missing_leases", f"{pod} (sandbox {sid[:13]}) has no {PRIMARY_NET} lease"))
        if wants_net1 and sid not in leased.get(NET1, set()):
            problems.append(("missing_leases", f"{pod} (sandbox {sid[:13]}) has no {NET1} lease"))
    counts = {k: 0 for k in ("stale_records", "missing_records", "stale_leases", "missing_leases")}
    for kind, _ in problems:
        counts[kind] += 1
    line = (f"node-leaks sandboxes={len(live)} records={len(recs)} leases={len(lss)} "
            + " ".join(f"{k}={v}" for k, v in counts.items())
            + f" multus_primary_left={multus_left}")
    return line, problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--settle", type=float, default=60)
    ap.add_argument("--no-guard", action="store_true",
                    help="the guard was not in front: do not ask each sandbox for a record")
    args = ap.parse_args()
    deadline = time.monotonic() + args.settle
    while True:
        line, problems = check(not args.no_guard)
        if not problems or time.monotonic() >= deadline:
            break
        time.sleep(1)
    for _, what in problems:
        print(f"node-leaks: {what}", file=sys.stderr)
    print(line)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
