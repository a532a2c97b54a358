#!/usr/bin/env bash
# The main job, shown step by step: cni-guard holding a pod sandbox back while the Multus
# config is missing, then letting it through with both interfaces once it is there.
#
#   sudo bash scripts/demo.sh
#
# As root on Debian bookworm: builds the guard (and mini-multus, the Multus stand-in of the
# conformance suites), runs scripts/setup.sh (reference plugins, cnitool), then works in
# throwaway network namespaces and a temp dir. It leaves nothing behind.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
  echo "demo: needs root (network namespaces); run: sudo bash scripts/demo.sh" >&2
  exit 1
fi

if [ -t 1 ]; then
  step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
else
  step() { printf '\n== %s\n' "$*"; }
fi
say() { printf '   %s\n' "$*"; }

step "Building cni-guard and mini-multus (release), and setting up plugins and cnitool"
cargo build --release --locked -q -p cni-guard -p conformance --bins
bash scripts/setup.sh | sed 's/^/   /'
target=${CARGO_TARGET_DIR:-$PWD/target}/release
cnitool=/usr/local/bin/cnitool
started=$(date +%s)

suffix=$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
demo=$(mktemp -d /tmp/cni-guard-demo.XXXXXX)
host=demo-host-$suffix
pod=demo-pod-$suffix
guard_net=guarded-pod-network-$suffix

cleanup() {
  set +e
  if [ -e "/run/netns/$pod" ] && [ -e "/run/netns/$host" ]; then
    run_cnitool del "$guard_net" >/dev/null 2>&1
  fi
  ip netns del "$pod" 2>/dev/null
  ip netns del "$host" 2>/dev/null
  rm -f /var/lib/cni/results/"$guard_net"-*
  rm -rf "$demo"
}
trap cleanup EXIT

# cnitool in the demo's host namespace; the guard's own log lines (stderr without syslog) are
# kept out of the way so the plugin's answer stands out.
run_cnitool() {
  local rc=0
  ip netns exec "$host" env NETCONFPATH="$demo/net.d" CNI_PATH="$demo/bin" \
    "$cnitool" "$1" "$2" "/run/netns/$pod" 2>"$demo/cnitool.err" || rc=$?
  grep -v '^cni-guard: verb=' "$demo/cnitool.err" >&2 || true
  return "$rc"
}

mkdir -p "$demo/bin" "$demo/net.d" "$demo/multus.d" "$demo/leases" "$demo/guard"
for p in /usr/lib/cni/*; do ln -s "$p" "$demo/bin/"; done
ln -s "$target/cni-guard" "$demo/bin/cni-guard"
ln -s "$target/mini-multus" "$demo/bin/mini-multus"
ip netns add "$host"
ip netns add "$pod"
ip -n "$host" link set lo up
ip -n "$pod" link set lo up
# The VLAN attachment's parent link (a dummy if the kernel has it, else a veth end).
if ! ip -n "$host" link add vlan-parent type dummy 2>/dev/null; then
  ip -n "$host" link add vlan-parent type veth peer name vlan-peer
  ip -n "$host" link set vlan-peer up
fi
ip -n "$host" link set vlan-parent up

cat >"$demo/net.d/05-cilium.conflist" <<EOF
{"cniVersion":"1.0.0","name":"cilium-$suffix","plugins":[{"type":"bridge","bridge":"cilium0",
 "isGateway":true,"ipam":{"type":"host-local","dataDir":"$demo/leases",
 "ranges":[[{"subnet":"10.244.0.0/24"}]],"routes":[{"dst":"0.0.0.0/0"}]}}]}
EOF
cat >"$demo/multus.d/iot-vlan.conf" <<EOF
{"cniVersion":"1.0.0","name":"iot-vlan-$suffix","type":"macvlan","master":"vlan-parent",
 "mode":"bridge","ipam":{"type":"host-local","dataDir":"$demo/leases",
 "ranges":[[{"subnet":"192.168.30.0/24"}]]}}
EOF
multus_conf="{\"cniVersion\":\"1.0.0\",\"name\":\"multus-$suffix\",\"type\":\"mini-multus\",
 \"clusterNetwork\":\"$demo/net.d/05-cilium.conflist\",\"attachments\":[\"$demo/multus.d/iot-vlan.conf\"]}"
cat >"$demo/net.d/00-cni-guard.conflist" <<EOF
{"cniVersion":"1.0.0","name":"$guard_net","plugins":[{"type":"cni-guard",
 "delegate":"$demo/net.d/00-multus.conf",
 "attachments":["$demo/net.d/05-cilium.conflist","$demo/multus.d/iot-vlan.conf"],
 "waitSeconds":0,"cacheDir":"$demo/guard","capabilities":{"portMappings":true}}]}
EOF

step "1. The layout: the runtime's conf dir, right after a Multus restart"
say "containerd builds every pod sandbox from the FIRST file in its conf dir ($demo/net.d)."
say "Multus deletes 00-multus.conf whenever its daemon stops; without the guard, containerd"
say "would fall back to 05-cilium.conflist and build pods with no VLAN interface."
say "The guard's file sorts first and points at the delegate (00-multus.conf) and at the"
say "attachments Multus needs (the cluster network and the IoT VLAN definition):"
echo
ls -1 "$demo/net.d" | sed 's/^/     /'
echo
sed 's/^/     /' "$demo/net.d/00-cni-guard.conflist"

step "2. A pod sandbox is created while 00-multus.conf is missing: the guard refuses"
if run_cnitool add "$guard_net" >"$demo/out" 2>"$demo/err"; then
  say "UNEXPECTED: the ADD succeeded"; exit 1
fi
say "cnitool add failed, as it should. The guard answered with CNI error code 11 (try again"
say "later), which a runtime retries; cnitool prints the message and details it carried:"
sed 's/^/     /' "$demo/err"
say "Inside the sandbox there is nothing but the loopback interface:"
ip -n "$pod" -br addr | sed 's/^/     /'
say "Leases handed out: $(find "$demo/leases" -type f -regex '.*/[0-9.]*' | wc -l)"

step "3. The Multus daemon is back and writes 00-multus.conf"
printf '%s\n' "$multus_conf" >"$demo/net.d/.00-multus.conf.tmp"
mv "$demo/net.d/.00-multus.conf.tmp" "$demo/net.d/00-multus.conf"
ls -1 "$demo/net.d" | sed 's/^/     /'

step "4. The runtime retries: the guard runs Multus, the sandbox gets both interfaces"
run_cnitool add "$guard_net" >"$demo/out"
say "cnitool add succeeded. Inside the sandbox (ip addr):"
ip -n "$pod" addr 2>/dev/null | sed 's/^/     /'
if ! ip -n "$pod" link show eth0 >/dev/null || ! ip -n "$pod" link show net1 >/dev/null; then
  say "UNEXPECTED: eth0 and net1 are not both there"; exit 1
fi
say "eth0 is the cluster network, net1 the IoT VLAN attachment."

step "5. The pod goes away: DEL cleans everything up (even if 00-multus.conf vanished again)"
rm "$demo/net.d/00-multus.conf"
say "00-multus.conf removed again (another Multus restart); DEL uses the guard's record:"
run_cnitool del "$guard_net"
say "cnitool del succeeded. Inside the sandbox:"
ip -n "$pod" -br addr | sed 's/^/     /'
say "Leases left: $(find "$demo/leases" -type f -regex '.*/[0-9.]*' | wc -l)," \
  "guard records left: $(find "$demo/guard" -mindepth 2 -type f | wc -l) (the network's lock file stays, as host-local's does)"

step "Done in $(( $(date +%s) - started ))s after set-up; removing the demo namespaces and files"
