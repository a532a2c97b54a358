#!/usr/bin/env bash
# Installs what the test suites and the demo need on a fresh machine (idempotent).
# Without root it only checks and says what is missing.
#
# As root on Debian bookworm it:
#   1. installs the apt packages below (one `apt-get update`, only when something is missing);
#   2. builds cnitool from Debian's *source* package golang-github-appc-cni (cnitool/ ships only
#      there), offline: GOPATH mode against /usr/share/gocode, GOPROXY=off. The deb-src entry is
#      derived from this machine's own apt sources into a private sources dir with private lists,
#      so /etc/apt and /var/lib/apt/lists are left untouched. The binary goes to $CNITOOL.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  containernetworking-plugins # reference plugins in /usr/lib/cni
  iproute2 iptables           # namespaces, links, the portmap plugin's rules
  golang-go golang-github-appc-cni-dev dpkg-dev # building cnitool from source
  containerd runc busybox-static                # the containerd suites
  hyperfine                                     # the latency measurements
)
CNITOOL=${CNITOOL:-/usr/local/bin/cnitool}
SRC_PACKAGE=golang-github-appc-cni

say() { echo "setup: $*"; }

if ! command -v cargo >/dev/null; then
  say "cargo is required" >&2
  exit 1
fi

missing_packages() {
  local p
  for p in "${PACKAGES[@]}"; do
    if [ "$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null)" != installed ]; then
      echo "$p"
    fi
  done
}

if [ "$(id -u)" != 0 ]; then
  missing=$(missing_packages | tr '\n' ' ')
  [ -n "$missing" ] && say "not root: NOT installing missing packages: $missing"
  [ -x "$CNITOOL" ] || command -v cnitool >/dev/null || say "not root: cnitool is not installed"
  say "not root: root-only suites will skip"
  exit 0
fi

apt_opts=(-o DPkg::Lock::Timeout=600 -o Dpkg::Use-Pty=0)

# --- 1. packages -------------------------------------------------------------------------------
mapfile -t missing < <(missing_packages)
if [ "${#missing[@]}" -gt 0 ]; then
  say "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # No init system here: keep package scripts from trying to start daemons (containerd).
  policy=/usr/sbin/policy-rc.d
  policy_added=
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod 755 "$policy"
    policy_added=1
  fi
  apt-get "${apt_opts[@]}" update -q
  apt-get "${apt_opts[@]}" install -y -q --no-install-recommends "${missing[@]}"
  if [ -n "$policy_added" ]; then rm -f "$policy"; fi
else
  say "apt packages present"
fi

# --- 2. cnitool from the source package, offline -----------------------------------------------
if [ -x "$CNITOOL" ]; then
  say "cnitool present at $CNITOOL"
  exit 0
fi

scratch=$(mktemp -d /tmp/cni-guard-setup.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$scratch/sources.list.d" "$scratch/lists/partial" "$scratch/cache/archives/partial" \
  "$scratch/src"
: >"$scratch/sources.list"
# apt downloads as the unprivileged _apt user when it can write the target dirs.
chmod 0755 "$scratch"
if id _apt >/dev/null 2>&1; then
  chown -R _apt "$scratch/lists" "$scratch/cache" "$scratch/src"
fi

codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
[ -n "$codename" ] || { say "cannot tell the release codename from /etc/os-release" >&2; exit 1; }

# Derive one deb-src entry per archive that serves the release's main suite, from the machine's
# own configured sources (only *.list and *.sources are active, as apt itself reads them).
derive_deb_src() {
  local f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    # one-line format: deb [opts] URI SUITE COMPONENTS...
    awk -v suite="$codename" '
      $1 == "deb" {
        i = 2
        opts = ""
        if ($2 ~ /^\[/) { while ($i !~ /\]$/) { opts = opts " " $i; i++ } opts = opts " " $i; i++ }
        if ($(i + 1) != suite) next
        line = "deb-src" opts " " $i " " suite
        for (j = i + 2; j <= NF; j++) line = line " " $j
        print line
      }' "$f" >>"$scratch/sources.list"
  done
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    # deb822 format: keep stanzas that list the release suite, as deb-src for that suite only.
    awk -v suite="$codename" '
      function flush() {
        if (types ~ /(^| )deb( |$)/ && (" " suites " ") ~ (" " suite " ") && uris != "" && enabled != "no") {
          print "Types: deb-src"
          print "URIs: " uris
          print "Suites: " suite
          print "Components: " comps
          if (signed != "") print "Signed-By: " signed
          print ""
        }
        types = uris = suites = comps = signed = enabled = ""
      }
      /^[ \t]*#/ { next }
      /^[ \t]*$/ { flush(); next }
      {
        key = tolower($1); sub(/:$/, "", key)
        val = $0; sub(/^[^:]*:[ \t]*/, "", val)
        if (key == "types") types = val
        else if (key == "uris") uris = val
        else if (key == "suites") suites = val
        else if (key == "components") comps = val
        else if (key == "signed-by") signed = val
        else if (key == "enabled") enabled = tolower(val)
      }
      END { flush() }' "$f" >>"$scratch/sources.list.d/deb-src.sources"
  done
}
derive_deb_src
if [ ! -s "$scratch/sources.list" ] && [ ! -s "$scratch/sources.list.d/deb-src.sources" ]; then
  say "no apt source for suite $codename found to derive a deb-src entry from" >&2
  exit 1
fi

private_apt=("${apt_opts[@]}"
  -o Dir::Etc::SourceList="$scratch/sources.list"
  -o Dir::Etc::SourceParts="$scratch/sources.list.d"
  -o Dir::State::Lists="$scratch/lists"
  -o Dir::Cache="$scratch/cache"
  -o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache=)
say "fetching the $SRC_PACKAGE source package (private apt lists in $scratch)"
apt-get "${private_apt[@]}" update -q
(cd "$scratch/src" && apt-get "${private_apt[@]}" source -q "$SRC_PACKAGE")

srcdir=$(find "$scratch/src" -mindepth 1 -maxdepth 1 -type d -name "$SRC_PACKAGE-*" | head -n1)
[ -d "$srcdir/cnitool" ] || { say "no cnitool/ in the source package" >&2; exit 1; }

# GOPATH mode: put the source tree at its import path; dependencies come from /usr/share/gocode.
gopath="$scratch/gopath"
mkdir -p "$gopath/src/github.com/containernetworking"
mv "$srcdir" "$gopath/src/github.com/containernetworking/cni"
say "building cnitool offline"
(
  cd "$gopath/src/github.com/containernetworking/cni/cnitool"
  GO111MODULE=off GOPATH="$gopath:/usr/share/gocode" GOPROXY=off GOFLAGS= CGO_ENABLED=0 \
    GOCACHE="$scratch/gocache" go build -o "$scratch/cnitool" .
)
install -D -m 0755 "$scratch/cnitool" "$CNITOOL"
say "installed $CNITOOL"
