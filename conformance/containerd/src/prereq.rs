//! What a containerd suite needs before it can run, and where the binaries under test are.
//!
//! Without root (or a missing tool) a suite skips loudly when run locally; under `CI=true` the
//! same condition is a failure, never a skip.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::netns::run;
use crate::runtime::{self, Generation};

const TOOLS: &[&str] = &["runc", "nsenter", "ip", "umount", "tar", "sha256sum"];

/// Skips (locally) or fails (under CI=true) because of `why`. Returns false for `if !..{return}`.
pub fn unmet(suite: &str, why: &str) -> bool {
    test_support::prerequisites(
        suite,
        &[format!(
            "{why} (this suite needs root, containerd 1.6 and 2.x and crictl; see \
             scripts/test.d/30-containerd.sh and scripts/setup.sh)"
        )],
    )
}

fn on_path(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

fn executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Root, the tools, `generation`'s containerd, shim, ctr and reference plugins, crictl, and the
/// static busybox for the sandbox image.
pub fn can_run(suite: &str, generation: Generation) -> bool {
    if !test_support::is_root() {
        return unmet(suite, "root");
    }
    for tool in TOOLS {
        if !on_path(tool) {
            return unmet(suite, &format!("`{tool}` not found"));
        }
    }
    let shim_dir = generation.shim_dir();
    let binaries = [
        generation.containerd(),
        shim_dir.join("containerd-shim-runc-v2"),
        generation.ctr(),
        runtime::crictl(),
        generation.plugins().join("bridge"),
        generation.plugins().join("host-local"),
        generation.plugins().join("loopback"),
    ];
    for b in binaries {
        if !executable(&b) {
            return unmet(
                suite,
                &format!(
                    "{} missing (containerd {})",
                    b.display(),
                    generation.label()
                ),
            );
        }
    }
    if !Path::new("/bin/busybox").exists() {
        return unmet(suite, "/bin/busybox missing (busybox-static)");
    }
    true
}

/// The workspace root (this crate lives in conformance/containerd).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("workspace root")
}

fn release_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
        .join("release")
}

/// A binary under test: `$env_var` if set, else `target/release/<name>`; `None` if absent.
pub fn binary(suite: &str, env_var: &str, name: &str) -> Option<PathBuf> {
    let path = std::env::var_os(env_var)
        .map(PathBuf::from)
        .unwrap_or_else(|| release_dir().join(name));
    if path.is_file() {
        Some(path)
    } else {
        unmet(
            suite,
            &format!(
                "{} not found (build it with `cargo build --release`, or set {env_var})",
                path.display()
            ),
        );
        None
    }
}

/// Builds an image with scripts/build-image.sh (`args` after the kind and output path); returns
/// the files its layer holds.
pub fn build_image(kind: &str, out: &Path, args: &[&str]) -> Result<Vec<String>, String> {
    let report = run(Command::new("bash")
        .arg(workspace_root().join("scripts/build-image.sh"))
        .arg(kind)
        .arg(out)
        .args(args))?;
    Ok(report
        .lines()
        .find_map(|l| l.strip_prefix("build-image: layer files:"))
        .unwrap_or_default()
        .split_whitespace()
        .map(String::from)
        .collect())
}

/// Fills containerd's CNI bin dir: the reference plugins in `plugins` (symlinked) plus `extra`
/// (copied).
pub fn populate_bin_dir(
    plugins: &Path,
    bin_dir: &Path,
    extra: &[(&str, &Path)],
) -> Result<(), String> {
    let entries = std::fs::read_dir(plugins).map_err(|e| e.to_string())?;
    for e in entries.filter_map(|e| e.ok()) {
        let target = bin_dir.join(e.file_name());
        if !target.exists() {
            std::os::unix::fs::symlink(e.path(), &target).map_err(|e| e.to_string())?;
        }
    }
    for (name, src) in extra {
        std::fs::copy(src, bin_dir.join(name))
            .map_err(|e| format!("copy {} into the bin dir: {e}", src.display()))?;
    }
    Ok(())
}
