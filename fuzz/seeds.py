#!/usr/bin/env python3
"""Writes the seed corpora under fuzz/corpus/<target>/ from the inputs the guard's tests use
(plugin/tests/cni.rs, the unit tests) and the shapes in testdata/. Deterministic; re-run after
changing it, then commit what it writes. Files are named by the SHA-1 of their content, as
libFuzzer names corpus entries."""
import hashlib, json, os, sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
VERSIONS = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]


def put(target, data):
    if isinstance(data, (dict, list)):
        data = json.dumps(data).encode()
    elif isinstance(data, str):
        data = data.encode()
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, hashlib.sha1(data).hexdigest()), "wb") as f:
        f.write(data)


def result(version, addr="10.1.0.2/24"):
    ip = {"address": addr, "gateway": "10.1.0.1", "interface": 0}
    if version.startswith("0."):
        ip["version"] = "4"
    return {"cniVersion": version, "interfaces": [{"name": "eth0", "sandbox": "/run/netns/test"}],
            "ips": [ip], "routes": [{"dst": "0.0.0.0/0"}], "dns": {"nameservers": ["10.1.0.1"]}}


def guard(version="1.0.0", **extra):
    g = {"cniVersion": version, "name": "guarded", "type": "cni-guard",
         "delegate": "/etc/cni/net.d/00-multus.conf", "cacheDir": "/var/lib/cni/cni-guard"}
    g.update(extra)
    return g


guards = [guard(v) for v in VERSIONS]
guards += [
    guard(attachments=["/etc/cni/net.d/05-cilium.conflist"], waitSeconds=10,
          capabilities={"portMappings": True}),
    guard("1.1.0", **{"cni.dev/valid-attachments": [{"containerID": "keep1", "ifname": "eth0"}]}),
    guard("1.1.0", **{"cni.dev/attachments": []}),
    guard("1.1.0", **{"cni.dev/valid-attachments": None}),
    guard(prevResult=result("1.0.0")),
    guard("0.4.0", prevResult=result("0.4.0")),
    guard(runtimeConfig={"portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}],
                         "bandwidth": {"ingressRate": 1}}),
    guard(args={"cni": {"ips": ["10.1.0.2"]}}, strictPermissions=True),
    guard(waitSeconds=0.4),
    guard(delegate="relative.conf"),
    guard("4.2.0"),
    guard(name="../etc"),
    guard(prevResult="x"),
    guard(waitSeconds=1e9),
    {"cniVersion": "1.0.0", "name": "g", "type": "cni-guard"},
]
for g in guards:
    put("guard_config", g)
for raw in [b"{", b"[]", b"\xff\xfe", b"", b"{not json", b'{"cniVersion":"1.0.0"}', b"[" * 200]:
    put("guard_config", raw)

# request: [selector, len, value] records (see decode_request in src/lib.rs), 7 ends the env.
NAMES = {"CNI_COMMAND": 0, "CNI_CONTAINERID": 1, "CNI_NETNS": 2, "CNI_IFNAME": 3,
         "CNI_ARGS": 4, "CNI_PATH": 5}


def request(env, stdin):
    out = bytearray()
    for k, v in env.items():
        v = v.encode() if isinstance(v, str) else v
        out += bytes([NAMES[k], len(v)]) + v
    out += bytes([7, 0])
    if isinstance(stdin, (dict, list)):
        stdin = json.dumps(stdin).encode()
    return bytes(out) + stdin


base = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "ctr1", "CNI_NETNS": "/run/netns/test",
        "CNI_IFNAME": "eth0", "CNI_PATH": "/opt/cni/bin:/usr/lib/cni"}
for cmd in ["ADD", "DEL", "CHECK", "STATUS", "GC", "VERSION", "add", "FROB", ""]:
    for g in [guard(), guard("1.1.0"), guard(prevResult=result("1.0.0"))]:
        put("request", request(dict(base, CNI_COMMAND=cmd), g))
for k, v in [("CNI_CONTAINERID", "../../etc"), ("CNI_CONTAINERID", "a/b"), ("CNI_IFNAME", "../x"),
             ("CNI_IFNAME", "0123456789abcdefg"), ("CNI_IFNAME", "eth0\n"), ("CNI_CONTAINERID", b"a\0b"),
             ("CNI_ARGS", "K8S_POD_NAME=p;IgnoreUnknown=1"), ("CNI_PATH", ""), ("CNI_NETNS", b"\xff")]:
    put("request", request(dict(base, **{k: v}), guard()))
put("request", request({"CNI_COMMAND": "ADD"}, guard()))
put("request", request({"CNI_COMMAND": "VERSION"}, {"cniVersion": "0.4.0"}))
put("request", request(base, b"{not json"))
put("request", request(base, b""))
put("request", bytes([0, 255, ord("A")]) + request(base, guard()))

delegates = [
    {"cniVersion": "0.3.1", "name": "multus", "type": "multus-shim"},
    {"cniVersion": "1.0.0", "name": "multus-net", "type": "multus-shim", "args": {"own": 1}},
    {"cniVersion": "1.0.0", "name": "cilium", "disableCheck": True,
     "plugins": [{"type": "cilium-cni"}, {"type": "portmap", "capabilities": {"portMappings": True}}]},
    {"cniVersions": ["0.4.0", "1.1.0", "9.0.0"], "name": "n", "plugins": [{"type": "a"}]},
    {"cniVersion": "1.1.0", "name": "c", "disableGC": True, "plugins": [{"type": "bridge"}, {"type": "tuning"}]},
    {"cniVersion": "0.2.0", "name": "old", "type": "old"},
    {"name": "noversion", "type": "x"},
    {"cniVersion": "0.3.1", "name": "m", "type": "multus",
     "delegates": [{"name": "g", "plugins": [{"type": "cni-guard"}]}]},
    {"cniVersion": "1.0.0", "type": "../bin/sh"},
    {"cniVersion": "1.0.0", "name": "n", "plugins": []},
    {"cniVersion": "1.0.0", "name": "n", "plugins": [7]},
    {"cniVersion": "1.0.0", "name": "bridge-net", "type": "bridge", "bridge": "cni0", "isGateway": True,
     "ipMasq": True, "ipam": {"type": "host-local", "subnet": "10.88.0.0/16",
                              "routes": [{"dst": "0.0.0.0/0"}]}},
]
for sel in range(4):
    for d in delegates:
        put("delegate_config", bytes([sel]) + json.dumps(d).encode())
    put("delegate_config", bytes([sel]) + b'{"cniVersion":"0.3.1","name":"mul')

for v in VERSIONS:
    put("result_conversion", result(v))
    put("result_conversion", {"cniVersion": v, "code": 11, "msg": "later"})
put("result_conversion", {"cniVersion": "0.2.0", "ip4": {"ip": "10.0.0.5/24", "gateway": "10.0.0.1",
                          "routes": [{"dst": "0.0.0.0/0"}]}, "ip6": {"ip": "fd00::5/64"},
                          "dns": {"nameservers": ["1.1.1.1"]}})
put("result_conversion", {"cniVersion": "1.1.0", "routes": [{"dst": "0.0.0.0/0", "mtu": 1400}],
                          "interfaces": [{"name": "net1", "socketPath": "/x"}]})
put("result_conversion", {"ips": [{"address": "10.0.0.1/8"}, {"address": "fd00::2/64"}]})
put("result_conversion", {"cniVersion": "0.4.0", "code": 117, "msg": "multus: cannot reach daemon",
                          "details": "dial unix"})
for raw in [b"not json", b"[1]", b'{"ips":"x"}', b'{"ips":[{}]}', b'{"dns":[]}', b'{"cniVersion":7}']:
    put("result_conversion", raw)
print("seeds written under", ROOT, file=sys.stderr)
