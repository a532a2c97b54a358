//! Fuzz target: see `cni_guard_fuzz::guard_config`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| cni_guard_fuzz::guard_config(data));
