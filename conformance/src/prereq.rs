//! Whether the root-only suites can run here: locally a loud SKIP, under CI=true a failure.
use std::path::{Path, PathBuf};

use crate::generation::{generation, Cnitool};
use test_support::is_root;

/// Where the guard binary is: `CNI_GUARD_BIN`, else `<target dir>/release/cni-guard`.
pub fn guard_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("CNI_GUARD_BIN") {
        return PathBuf::from(p);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    target.join("release/cni-guard")
}

/// This run's cnitool (see `generation`).
pub fn cnitool() -> PathBuf {
    generation().cnitool.path.clone()
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()))
        .unwrap_or(false)
}

fn missing_cnitool(tool: &Cnitool, missing: &mut Vec<String>) {
    if !tool.path.is_file() {
        missing.push(format!(
            "cnitool {} at {} ({})",
            tool.version,
            tool.path.display(),
            tool.source
        ));
    }
}

/// What is missing for the cnitool suites, empty when they can run. `status_gc`: the suite
/// drives `cnitool status`/`gc` too, which needs a cnitool that has them.
pub fn missing(needs_guard: bool, status_gc: bool) -> Vec<String> {
    let gen = generation();
    let mut missing = Vec::new();
    if !is_root() {
        missing.push("root (network namespaces)".to_string());
    }
    for program in ["ip", "iptables-save", "sha512sum"] {
        if !on_path(program) {
            missing.push(format!("{program} on PATH"));
        }
    }
    missing_cnitool(&gen.cnitool, &mut missing);
    if status_gc && !gen.cnitool.status_gc {
        missing_cnitool(&gen.status_gc_cnitool(), &mut missing);
    }
    for plugin in [
        "bridge",
        "host-local",
        "ptp",
        "macvlan",
        "tuning",
        "portmap",
    ] {
        let p = gen.plugins.dir.join(plugin);
        if !p.is_file() {
            missing.push(format!(
                "{} (reference plugins {}: {})",
                p.display(),
                gen.plugins.version,
                gen.plugins.source
            ));
        }
    }
    if needs_guard && !guard_binary().is_file() {
        missing.push(format!(
            "{} (cargo build --release -p cni-guard)",
            guard_binary().display()
        ));
    }
    missing
}

/// True when the suite can run. Locally it prints a loud SKIP and returns false when something
/// is missing; under CI=true a missing prerequisite is a failure.
pub fn can_run(suite: &str, needs_guard: bool) -> bool {
    test_support::prerequisites(suite, &missing(needs_guard, false))
}

/// [`can_run`] for a suite that drives `cnitool status` and `cnitool gc`.
pub fn can_run_status_gc(suite: &str) -> bool {
    test_support::prerequisites(suite, &missing(true, true))
}
