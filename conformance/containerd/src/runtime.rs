//! The two containerd generations the suites run on, and where their binaries are.
//!
//! - **Debian's**: bookworm's containerd 1.6.20 (`/usr/bin`), its shim and `ctr`, config
//!   version 2, the reference plugins 1.1.1 in `/usr/lib/cni`;
//! - **current**: containerd 2.x built by `scripts/setup.sh` (`$CONTAINERD2_BIN`: containerd,
//!   containerd-shim-runc-v2, ctr), config version 4 (v2.4's own; 3 would be migrated at every
//!   start), the reference plugins of `$CNI_PLUGINS_BIN`.
//!
//! Both run Debian's runc 1.1.5 and are driven by the same crictl (`$CRICTL_BIN`). Every path
//! comes from `scripts/versions.sh` (sourced by bash, so the pins live in one place); the
//! variables of the same names in the environment win.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::prereq::workspace_root;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Generation {
    /// containerd 1.6 from Debian bookworm.
    Debian,
    /// containerd 2.x from the Go module proxy (scripts/versions.sh pins it).
    Current,
}

/// What scripts/versions.sh says, read once.
struct Pins {
    containerd2_bin: PathBuf,
    crictl_bin: PathBuf,
    plugins_bin: PathBuf,
    debian_containerd: PathBuf,
    debian_plugins: PathBuf,
}

fn pins() -> &'static Pins {
    static PINS: OnceLock<Pins> = OnceLock::new();
    PINS.get_or_init(|| {
        let script = r#". scripts/versions.sh && printf '%s\n' "$CONTAINERD2_BIN" "$CRICTL_BIN" \
            "$CNI_PLUGINS_BIN" "$DEBIAN_CONTAINERD" "$DEBIAN_CNI_PLUGINS_BIN""#;
        let out = Command::new("bash")
            .args(["-c", script])
            .current_dir(workspace_root())
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        let mut lines = out.lines().map(PathBuf::from);
        let mut next = |fallback: &str| {
            lines
                .next()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or_else(|| PathBuf::from(fallback))
        };
        Pins {
            containerd2_bin: next("/var/cache/cni-guard/go/containerd-v2.4.2/bin"),
            crictl_bin: next("/var/cache/cni-guard/go/crictl-v1.37.0/bin"),
            plugins_bin: next("/var/cache/cni-guard/go/plugins-v1.10.0/bin"),
            debian_containerd: next("/usr/bin/containerd"),
            debian_plugins: next("/usr/lib/cni"),
        }
    })
}

impl Generation {
    pub const ALL: [Generation; 2] = [Generation::Debian, Generation::Current];

    /// A short name for messages and test names ("1.6" or "2.x").
    pub fn label(self) -> &'static str {
        match self {
            Generation::Debian => "1.6",
            Generation::Current => "2.x",
        }
    }

    /// The containerd binary.
    pub fn containerd(self) -> PathBuf {
        match self {
            Generation::Debian => pins().debian_containerd.clone(),
            Generation::Current => pins().containerd2_bin.join("containerd"),
        }
    }

    /// The folder holding its `containerd-shim-runc-v2` (first in containerd's PATH, which is
    /// where containerd looks its shim up).
    pub fn shim_dir(self) -> PathBuf {
        self.containerd()
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default()
    }

    /// The `ctr` of the same release.
    pub fn ctr(self) -> PathBuf {
        self.shim_dir().join("ctr")
    }

    /// The reference CNI plugins of the same generation.
    pub fn plugins(self) -> PathBuf {
        match self {
            Generation::Debian => pins().debian_plugins.clone(),
            Generation::Current => pins().plugins_bin.clone(),
        }
    }

    /// Whether this generation calls CNI STATUS from the CRI `Status` call (containerd 2.0.1+).
    pub fn calls_status(self) -> bool {
        self == Generation::Current
    }
}

/// crictl (one for both generations).
pub fn crictl() -> PathBuf {
    pins().crictl_bin.join("crictl")
}

/// containerd's version as its CRI reports it ("v2.4.2", "1.6.20~ds1"), as the suites print it:
/// no leading `v`, no packaging suffix (`~ds1`, `+deb12u3`): "2.4.2", "1.6.20".
pub fn upstream_version(reported: &str) -> String {
    let v = reported.trim().trim_start_matches('v');
    v.split(['~', '+']).next().unwrap_or(v).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_printed_without_packaging() {
        assert_eq!(upstream_version("v2.4.2"), "2.4.2");
        assert_eq!(upstream_version("1.6.20~ds1"), "1.6.20");
        assert_eq!(upstream_version("1.6.20+deb12u3"), "1.6.20");
    }
}
