//! Which cnitool and which reference plugins a run of the cnitool suites uses.
//!
//! Two generations stand side by side (scripts/versions.sh):
//!
//! | name      | cnitool                                   | reference plugins                      |
//! |-----------|-------------------------------------------|----------------------------------------|
//! | `debian`  | 1.1.2, built from Debian's source package | 1.1.1 in /usr/lib/cni (spec to 1.0.0)  |
//! | `current` | `$CNI_VERSION` in `$CNITOOL_GO_BIN`       | `$CNI_PLUGINS_VERSION` in `$CNI_PLUGINS_BIN` (spec to 1.1.0) |
//!
//! `CONFORMANCE_PLUGINS=debian|current` picks the plugins (default `debian`),
//! `CONFORMANCE_CNITOOL=debian|current` the cnitool (default: the plugins' own generation).
//! The current generation's versions and folders come from the environment
//! `scripts/test.d/20-conformance.sh` exports after sourcing scripts/versions.sh, so the pins are
//! written down once. STATUS and GC need a cnitool that has them: the suites that drive those
//! verbs take [`Generation::status_gc_cnitool`] whatever the run's cnitool is.
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// A cnitool binary and the version it was built from.
#[derive(Debug, Clone)]
pub struct Cnitool {
    pub version: String,
    pub path: PathBuf,
    /// Whether it has the `status` and `gc` commands (libcni 1.2 and later).
    pub status_gc: bool,
    /// The newest cniVersion its libcni parses results of (the guard's conflist can be no newer).
    pub newest_cni_version: &'static str,
    /// Where it comes from, for a missing-prerequisite message.
    pub source: &'static str,
}

/// A folder of reference plugins and what their release implements.
#[derive(Debug, Clone)]
pub struct Plugins {
    pub version: String,
    pub dir: PathBuf,
    /// The newest cniVersion they accept (delegates are written at it where a suite wants the
    /// newest: STATUS and GC come with 1.1.0).
    pub newest_cni_version: &'static str,
    /// Whether portmap's CHECK succeeds on an IPv4-only sandbox. portmap 1.1.1 looks for its
    /// chain in ip6tables too and fails; there the guard must fail CHECK exactly as the
    /// delegate does.
    pub portmap_check: bool,
    pub source: &'static str,
}

#[derive(Debug, Clone)]
pub struct Generation {
    pub cnitool: Cnitool,
    pub plugins: Plugins,
}

fn env_or(key: &str, default: &str) -> String {
    std::env::var(key).unwrap_or_else(|_| default.to_string())
}

/// The current releases' version without the Go module's `v`: `v1.10.0` -> `1.10.0`.
fn current_version(key: &str) -> String {
    match std::env::var(key) {
        Ok(v) => v.trim_start_matches('v').to_string(),
        Err(_) => format!("${key}-unset"),
    }
}

fn cnitool_of(name: &str) -> Cnitool {
    match name {
        "debian" => Cnitool {
            version: "1.1.2".into(),
            path: PathBuf::from(
                std::env::var("DEBIAN_CNITOOL")
                    .unwrap_or_else(|_| env_or("CNITOOL", "/usr/local/bin/cnitool")),
            ),
            status_gc: false,
            newest_cni_version: "1.0.0",
            source: "scripts/setup.sh builds it from Debian's source package",
        },
        "current" => Cnitool {
            version: current_version("CNI_VERSION"),
            path: Path::new(&env_or("CNITOOL_GO_BIN", "$CNITOOL_GO_BIN-unset")).join("cnitool"),
            status_gc: true,
            newest_cni_version: "1.1.0",
            source: "scripts/setup.sh builds it; source scripts/versions.sh for CNITOOL_GO_BIN",
        },
        other => panic!("CONFORMANCE_CNITOOL={other}: expected debian or current"),
    }
}

fn plugins_of(name: &str) -> Plugins {
    match name {
        "debian" => Plugins {
            version: "1.1.1".into(),
            dir: PathBuf::from(env_or("DEBIAN_CNI_PLUGINS_BIN", "/usr/lib/cni")),
            newest_cni_version: "1.0.0",
            portmap_check: false,
            source: "apt containernetworking-plugins",
        },
        "current" => Plugins {
            version: current_version("CNI_PLUGINS_VERSION"),
            dir: PathBuf::from(env_or("CNI_PLUGINS_BIN", "$CNI_PLUGINS_BIN-unset")),
            newest_cni_version: "1.1.0",
            portmap_check: true,
            source: "scripts/setup.sh builds them; source scripts/versions.sh for CNI_PLUGINS_BIN",
        },
        other => panic!("CONFORMANCE_PLUGINS={other}: expected debian or current"),
    }
}

/// The generation this run uses (read once from the environment).
pub fn generation() -> &'static Generation {
    static GEN: OnceLock<Generation> = OnceLock::new();
    GEN.get_or_init(|| {
        let plugins = env_or("CONFORMANCE_PLUGINS", "debian");
        let cnitool = env_or("CONFORMANCE_CNITOOL", &plugins);
        Generation {
            cnitool: cnitool_of(&cnitool),
            plugins: plugins_of(&plugins),
        }
    })
}

impl Generation {
    /// `runtime=cnitool-1.3.1 plugins=1.10.0`: how summary lines name the generation.
    pub fn label(&self) -> String {
        format!(
            "runtime=cnitool-{} plugins={}",
            self.cnitool.version, self.plugins.version
        )
    }

    /// The cnitool that drives STATUS and GC: this run's if it has them, else the current one.
    pub fn status_gc_cnitool(&self) -> Cnitool {
        if self.cnitool.status_gc {
            self.cnitool.clone()
        } else {
            cnitool_of("current")
        }
    }
}
