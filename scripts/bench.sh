#!/usr/bin/env bash
# What cni-guard adds to a pod start, measured side by side with what it wraps (issue 6).
#
#   scripts/bench.sh                 full run (a few minutes); writes bench/results.md
#   scripts/bench.sh --quick         a few runs of everything (the smoke test); writes
#                                    target/bench-quick/results.md unless --out is given
#   scripts/bench.sh --out FILE      write the report elsewhere
#   scripts/bench.sh --only fast,refusal   only the sections whose names start so (fast, child,
#                                    real, refusal, wake, 64, attachments, delegate); writes
#                                    target/bench-partial/results.md unless --out is given
#   scripts/bench.sh --candidate NAME=BIN   also measure another cni-guard binary (a proposed
#                                    change) beside the real one in the fast path; repeatable
#
# Builds cni-guard (static, and dynamically linked for comparison), the no-op delegate
# `cni-noop` and the `exec-floor` binary (bench/), creates its own temp dirs and, as root, two
# network namespaces (a "host" one the benchmark runs in, where the bridge lives, and a
# container one), and removes all of it on exit, also on failure. The timing is done by
# bench/src (interleaved rounds, medians); hyperfine and /usr/bin/time cross-check the fast path
# and the peak RSS. Nothing here asserts a timing: targets are reported, not enforced.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never

quick=""
out=""
only=""
candidates=()
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    --out) out="$2"; shift ;;
    --only) only="$2"; shift ;;
    --candidate) candidates+=("$2"); shift ;;
    *) echo "bench: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
if [ -z "$out" ]; then
  if [ -n "$quick" ]; then
    out=target/bench-quick/results.md
  elif [ -n "$only" ]; then
    out=target/bench-partial/results.md
  else
    out=bench/results.md
  fi
fi
mkdir -p "$(dirname "$out")"
out="$(cd "$(dirname "$out")" && pwd)/$(basename "$out")"

is_root=""
[ "$(id -u)" = 0 ] && is_root=1
missing_prereq() {
  if [ "${CI:-}" = true ]; then
    echo "bench: FAILED: $1 (required under CI=true)" >&2
    exit 1
  fi
  echo "bench: SKIPPING $2: $1" >&2
}

# --- tools (installed on a fresh machine, as root) ---------------------------------------
need_pkgs=()
command -v hyperfine >/dev/null || need_pkgs+=(hyperfine)
[ -x /usr/bin/time ] || need_pkgs+=(time)
[ -x /usr/lib/cni/bridge ] && [ -x /usr/lib/cni/host-local ] || need_pkgs+=(containernetworking-plugins)
command -v jq >/dev/null || need_pkgs+=(jq)
command -v ip >/dev/null || need_pkgs+=(iproute2)
command -v nsenter >/dev/null || need_pkgs+=(util-linux)
if [ ${#need_pkgs[@]} -gt 0 ] && [ -n "$is_root" ] && command -v apt-get >/dev/null; then
  echo "bench: installing ${need_pkgs[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null
fi

# --- build ---------------------------------------------------------------------------------
host="$(rustc -vV | sed -n 's/^host: //p')"
echo "bench: building cni-guard as shipped (cargo build --release -p cni-guard)" >&2
cargo build --release --locked -q -p cni-guard
echo "bench: building cni-noop, exec-floor and the driver (static, like the guard)" >&2
# --target keeps the static flags off the proc macros, which cannot be static.
RUSTFLAGS="-C target-feature=+crt-static -C relocation-model=static" \
  cargo build --release --locked -q --target "$host" --target-dir target/bench-static \
  -p cni-guard-bench
static="target/bench-static/$host/release"
if [ -z "$quick" ]; then
  echo "bench: building a dynamically linked cni-guard, for comparison" >&2
  # No rustc wrapper: the workspace's adds the static flags to the guard.
  RUSTC_WRAPPER="" RUSTFLAGS="" cargo build --release --locked -q \
    --target-dir target/bench-dynamic -p cni-guard
fi

# --- scratch space, namespaces, and their removal ------------------------------------------
# The records go where a node keeps them: on a disk filesystem, not tmpfs (/var/tmp, not /tmp).
work="$(mktemp -d /var/tmp/cni-guard-bench.XXXXXX)"
shm=""
if [ "$(stat -f -c %T /dev/shm 2>/dev/null || true)" = tmpfs ]; then
  shm="$(mktemp -d /dev/shm/cni-guard-bench.XXXXXX)"
fi
suffix="$(od -An -N4 -tx4 /dev/urandom | tr -d ' ')"
host_ns="cgb-host-$suffix"
ctr_ns="cgb-ctr-$suffix"
made_ns=()
cleanup() {
  local rc=$?
  for ns in "${made_ns[@]}"; do ip netns delete "$ns" 2>/dev/null || true; done
  rm -rf "$work"
  [ -n "$shm" ] && rm -rf "$shm"
  exit $rc
}
trap cleanup EXIT INT TERM

bin="$work/bin"
mkdir -p "$bin"
cp target/release/cni-guard "$static/cni-noop" "$static/exec-floor" "$bin/"
[ -z "$quick" ] && cp target/bench-dynamic/release/cni-guard "$bin/cni-guard-dynamic"
driver="$static/cni-guard-bench"

args=(--bin "$bin" --work "$work" --out "$out")
[ -n "$quick" ] && args+=(--quick)
[ -n "$shm" ] && args+=(--tmpfs "$shm")
[ -n "$only" ] && args+=(--only "$only")
for c in "${candidates[@]}"; do
  name="${c%%=*}"
  cp "${c#*=}" "$bin/cni-guard-candidate-$name"
  args+=(--candidate "$name=$bin/cni-guard-candidate-$name")
done
run=()
if [ -z "$is_root" ]; then
  missing_prereq "not root (network namespaces)" "the real bridge ADD+DEL"
elif [ ! -x /usr/lib/cni/bridge ] || [ ! -x /usr/lib/cni/host-local ]; then
  missing_prereq "no reference plugins in /usr/lib/cni" "the real bridge ADD+DEL"
else
  ip netns add "$host_ns"; made_ns+=("$host_ns")
  ip netns add "$ctr_ns"; made_ns+=("$ctr_ns")
  ip -n "$host_ns" link set lo up
  ip -n "$ctr_ns" link set lo up
  args+=(--ref-plugins /usr/lib/cni --ctr-netns "/run/netns/$ctr_ns")
  # nsenter, not `ip netns exec`: only the network namespace changes.
  run=(nsenter "--net=/run/netns/$host_ns")
fi

{
  echo "## Setup"
  echo
  echo "- Records (cacheDir) on: \`$(stat -f -c %T "$work")\` ($(df --output=source "$work" | tail -n 1)); tmpfs diagnostic dir: ${shm:-none}"
  echo "- cni-guard as shipped: \`cargo build --release -p cni-guard\` ($( (file -b target/release/cni-guard 2>/dev/null || echo 'file(1) not installed') | cut -d, -f1-2)); cni-noop and exec-floor: \`RUSTFLAGS=\"-C target-feature=+crt-static -C relocation-model=static\"\`; (full run only) a dynamically linked cni-guard built without the workspace's rustc wrapper"
  echo "- hyperfine $(hyperfine --version 2>/dev/null | awk '{print $2}'), $(/usr/bin/time --version 2>&1 | head -n 1), containernetworking-plugins $(dpkg-query -W -f '${Version}' containernetworking-plugins 2>/dev/null || echo '?')"
} >"$work/setup.md"
args+=(--appendix "$work/setup.md")

echo "bench: running${quick:+ (quick)}" >&2
"${run[@]}" "$driver" "${args[@]}"

# --- cross-checks with public tools (appended to the report) --------------------------------
export CNI_COMMAND=ADD CNI_CONTAINERID=hyperfine1 CNI_NETNS=/run/netns/none CNI_IFNAME=eth0 \
  CNI_PATH="$bin" CNI_GUARD_SYSLOG="$work/no-syslog.sock"
g="$work/g-fast.json"
# hyperfine runs each command's runs in one block; to spread load changes over all sides alike,
# it runs in several rounds with the order of the commands rotated, and the times are pooled.
if [ -n "$quick" ]; then hf=(-w 2 -r 3); hf_rounds=2; else hf=(-w 10 -r 100); hf_rounds=10; fi
# No shell (-N): hyperfine cannot feed stdin, so `exec-floor --stdin` opens it and execs the
# side; that extra exec is the same on every side and cancels out of the differences.
# The feeder is a copy of exec-floor under another name: a different file, so that running
# exec-floor after it does not find the same pages hot in the CPU caches (that made the floor
# look half as large).
cp "$bin/exec-floor" "$bin/stdin-feeder"
feed="$bin/stdin-feeder --stdin $g"
sides=("cni-noop, direct|$feed $bin/cni-noop"
  "exec-floor -> cni-noop|$feed $bin/exec-floor $bin/cni-noop"
  "cni-guard -> cni-noop|$feed $bin/cni-guard")
for round in $(seq 1 "$hf_rounds"); do
  cmds=()
  for k in 0 1 2; do
    side="${sides[$(( (k + round) % 3 ))]}"
    cmds+=(-n "${side%%|*}" "${side#*|}")
  done
  # --prepare removes the records between runs, so every ADD creates one, as in the driver.
  hyperfine -N "${hf[@]}" --style basic --export-json "$work/hyperfine-$round.json" \
    --prepare "find $work/cache -type f -delete" "${cmds[@]}" >"$work/hyperfine.txt" 2>&1 \
    || { cat "$work/hyperfine.txt" >&2; echo "bench: FAILED: hyperfine" >&2; exit 1; }
done
jq -s '[.[].results[]] | group_by(.command)
  | map({command: .[0].command, times: (map(.times) | add | sort)})
  | map(. + {median: .times[(.times | length / 2 | floor)],
             mean: ((.times | add) / (.times | length))})' \
  "$work"/hyperfine-*.json >"$work/hyperfine.json"
rss() { { /usr/bin/time -v "$@" 2>&1 >/dev/null || true; } | sed -n 's/.*Maximum resident set size (kbytes): //p'; }
rss_exec="$(rss "$bin/cni-guard" <"$g")"
rss_refuse="$(rss "$bin/cni-guard" <"$work/g-missing.json")"
[ -n "$rss_exec" ] && [ -n "$rss_refuse" ] || { echo "bench: FAILED: /usr/bin/time -v gave no RSS" >&2; exit 1; }
{
  echo
  echo "## Cross-check: hyperfine -N (fast path; $hf_rounds rounds, command order rotated, times pooled; every side fed its stdin by \`stdin-feeder --stdin\` (a copy of exec-floor), one extra exec that cancels out; records removed between runs by \`--prepare\`; log line to stderr)"
  echo
  echo "| Command | Median | Mean | Runs |"
  echo "|---|---|---|---|"
  jq -r '.[] | "| \(.command) | \(.median*1e6|round/1e3) ms | \(.mean*1e6|round/1e3) ms | \(.times|length) |"' \
    "$work/hyperfine.json"
  jq -r 'map({(.command): .median}) | add
    | .["cni-noop, direct"] as $n | .["exec-floor -> cni-noop"] as $f | .["cni-guard -> cni-noop"] as $g
    | "\nFrom the pooled medians: floor \((($f-$n)*1e6|round)/1e3) ms, guard overhead \((($g-$n)*1e6|round)/1e3) ms = \((($g-$n)/($f-$n)*100|round)/100)× the floor (target ≤ 1.5×)."' \
    "$work/hyperfine.json"
  echo
  echo "## Cross-check: /usr/bin/time -v, maximum resident set size"
  echo
  echo "- cni-guard ADD, exec path (the guard, then cni-noop in the same process): ${rss_exec} KiB"
  echo "- cni-guard ADD, refused: ${rss_refuse} KiB"
} >>"$out"

# Availability on the real node (issue 18): measured by scripts/test.d/35-kubernetes.sh, which
# needs the whole node (minutes), so not re-run here: the lines of its last run are quoted.
availability=${CNI_GUARD_K8S_AVAILABILITY:-/tmp/cni-guard-availability-summary.txt}
{
  echo
  echo "## Availability on the real node (from the last scripts/test.d/35-kubernetes.sh)"
  echo
  if [ -s "$availability" ]; then
    echo "Recovery: from \`00-multus.conf\` back to a pod (asking for net1, created while Multus restarts) Ready, by the guard's \`waitSeconds\` (target: median ≤ 1500 ms with the default, 60). Per-pod awareness: plain pods started during an outage, networked pods bare, leaks. Run of $(date -u -r "$availability" '+%Y-%m-%d %H:%M UTC'):"
    echo
    echo '```'
    cat "$availability"
    echo '```'
  else
    echo "Not measured on this machine yet ($availability is missing): run scripts/test.d/35-kubernetes.sh."
  fi
} >>"$out"
echo "bench: report in $out" >&2
