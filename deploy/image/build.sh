#!/bin/sh
# The image's build stage (deploy/image/Containerfile), run from the repository's root: both
# binaries, statically linked (.cargo/config.toml), every crate as Cargo.lock pins it, into OUT.
#
#   sh deploy/image/build.sh OUT
set -eu
out=$1
cargo build --release --locked -p cni-guard -p cni-guard-agent
mkdir -p "$out"
cp "${CARGO_TARGET_DIR:-target}/release/cni-guard" "${CARGO_TARGET_DIR:-target}/release/cni-guard-agent" "$out/"
