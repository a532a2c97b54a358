//! Whether the root-only suites can run here: locally a loud SKIP, under CI=true a failure.
use std::path::{Path, PathBuf};

use test_support::is_root;

pub const CNITOOL: &str = "/usr/local/bin/cnitool";
pub const PLUGINS: &str = "/usr/lib/cni";

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

pub fn cnitool() -> PathBuf {
    std::env::var_os("CNITOOL")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(CNITOOL))
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()))
        .unwrap_or(false)
}

/// What is missing for the cnitool suites, empty when they can run.
pub fn missing(needs_guard: bool) -> Vec<String> {
    let mut missing = Vec::new();
    if !is_root() {
        missing.push("root (network namespaces)".to_string());
    }
    for program in ["ip", "iptables-save", "sha512sum"] {
        if !on_path(program) {
            missing.push(format!("{program} on PATH"));
        }
    }
    if !cnitool().is_file() {
        missing.push(format!(
            "{} (scripts/setup.sh builds it)",
            cnitool().display()
        ));
    }
    for plugin in [
        "bridge",
        "host-local",
        "ptp",
        "macvlan",
        "tuning",
        "portmap",
    ] {
        let p = Path::new(PLUGINS).join(plugin);
        if !p.is_file() {
            missing.push(format!("{} (apt containernetworking-plugins)", p.display()));
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
    test_support::prerequisites(suite, &missing(needs_guard))
}
