#!/usr/bin/env bash
# rustc wrapper: links the cni-guard and cni-guard-agent binaries with a static C runtime.
#
# Why a wrapper: `-C target-feature=+crt-static` in [target] rustflags also reaches proc-macro
# crates (serde_derive) when no --target is given, and the gnu target cannot build those with a
# static CRT. Passing --target would move the binary out of target/release/. So the flag is added
# only where it is needed: the `cni_guard` and `cni_guard_agent` crates compiled as bins. relocation-model=static makes
# it a plain static executable (`file`: "statically linked") rather than static-pie: a plugin
# that lives for milliseconds gains little from ASLR, and loads a little faster without
# self-relocation.
#
# bash, not sh: dash drops environment variables whose names contain a dash, such as the
# CARGO_BIN_EXE_cni-guard that cargo hands to rustc for the integration tests.
is_bin=0
is_guard=0
prev=
for arg in "$@"; do
  case "$prev/$arg" in
    --crate-type/bin) is_bin=1 ;;
    --crate-name/cni_guard | --crate-name/cni_guard_agent) is_guard=1 ;;
  esac
  prev=$arg
done
if [ "$is_bin" = 1 ] && [ "$is_guard" = 1 ]; then
  exec "$@" -C target-feature=+crt-static -C relocation-model=static
fi
exec "$@"
