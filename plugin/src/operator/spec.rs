//! The guard's conflist as `install` and `keep` write it, built from their shared flags.
//!
//! Two kinds of path meet here, and the flags keep them apart:
//! - `--conf-dir` is where *this process* writes, through its own mounts (in a DaemonSet pod,
//!   `/host/etc/cni/net.d`);
//! - `--delegate`, `--attachment` and `--cache-dir` are written *into* the conflist and read
//!   later by the plugin, which containerd runs on the host: they are host paths
//!   (`/etc/cni/net.d/00-multus.conf`), whatever this process's mounts are.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::{Failure, Flags, SPEC_VERSIONS};
use crate::config::MAX_WAIT_SECONDS;

pub const DEFAULT_CONF_NAME: &str = "00-cni-guard.conflist";
pub const DEFAULT_NETWORK_NAME: &str = "guarded-pod-network";
pub const DEFAULT_CNI_VERSION: &str = "1.0.0";
pub use crate::config::DEFAULT_CACHE_DIR;
/// The plugin's type, and so its file name in the CNI bin dir.
pub use crate::config::GUARD_TYPE as PLUGIN_TYPE;

pub const SPEC_FLAGS_HELP: &str = "\
Where this process writes (a path as mounted in this container):
  --conf-dir DIR         the CNI conf dir containerd reads, e.g. /host/etc/cni/net.d (required)
  --conf-name NAME       the guard's file name; must sort first [00-cni-guard.conflist]

Written into the conflist (host paths, as the plugin sees them when containerd runs it):
  --delegate FILE        the real network's config, e.g. /etc/cni/net.d/00-multus.conf (required)
  --attachment FILE      a config the delegate needs, e.g. /etc/cni/multus/net.d/05-cilium.conflist
                         (repeatable)
  --cache-dir DIR        where the plugin keeps its ADD records [/var/lib/cni/cni-guard]

Conflist settings:
  --network-name NAME    the guard network's name [guarded-pod-network]
  --cni-version V        the conflist's cniVersion [1.0.0]
  --wait-seconds N       how long ADD waits for the delegate before refusing [0]
  --delegate-timeout-seconds N
                         bound on a delegate plugin run as the guard's child [plugin default: 220]
  --capability NAME      a runtime capability to accept and pass on, e.g. portMappings
                         (repeatable)
  --strict-permissions   refuse delegate and attachment files writable by group or others
";

/// Everything that determines the guard's conflist and where it goes.
#[derive(Debug, Clone)]
pub struct GuardFile {
    pub conf_dir: Option<PathBuf>,
    pub conf_name: String,
    pub network_name: String,
    pub cni_version: String,
    pub delegate: Option<PathBuf>,
    pub attachments: Vec<PathBuf>,
    pub wait_seconds: u64,
    pub delegate_timeout_seconds: Option<u64>,
    pub cache_dir: PathBuf,
    pub capabilities: Vec<String>,
    pub strict_permissions: bool,
}

impl Default for GuardFile {
    fn default() -> Self {
        GuardFile {
            conf_dir: None,
            conf_name: DEFAULT_CONF_NAME.to_string(),
            network_name: DEFAULT_NETWORK_NAME.to_string(),
            cni_version: DEFAULT_CNI_VERSION.to_string(),
            delegate: None,
            attachments: Vec::new(),
            wait_seconds: 0,
            delegate_timeout_seconds: None,
            cache_dir: PathBuf::from(DEFAULT_CACHE_DIR),
            capabilities: Vec::new(),
            strict_permissions: false,
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Conflist<'a> {
    cni_version: &'a str,
    name: &'a str,
    plugins: [Plugin<'a>; 1],
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Plugin<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    delegate: &'a Path,
    attachments: &'a [PathBuf],
    wait_seconds: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    delegate_timeout_seconds: Option<u64>,
    cache_dir: &'a Path,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    strict_permissions: bool,
    #[serde(skip_serializing_if = "serde_json::Map::is_empty")]
    capabilities: serde_json::Map<String, serde_json::Value>,
}

impl GuardFile {
    /// Takes `flag` if it is one of the conflist flags; `Ok(false)` when it is not.
    pub fn take_flag(&mut self, flag: &str, flags: &mut Flags) -> Result<bool, Failure> {
        match flag {
            "--conf-dir" => self.conf_dir = Some(flags.path(flag)?),
            "--conf-name" => self.conf_name = flags.value(flag)?,
            "--network-name" => self.network_name = flags.value(flag)?,
            "--cni-version" => self.cni_version = flags.value(flag)?,
            "--delegate" => self.delegate = Some(flags.path(flag)?),
            "--attachment" => self.attachments.push(flags.path(flag)?),
            "--cache-dir" => self.cache_dir = flags.path(flag)?,
            "--capability" => self.capabilities.push(flags.value(flag)?),
            "--strict-permissions" => self.strict_permissions = true,
            "--wait-seconds" => {
                let value = flags.value(flag)?;
                self.wait_seconds = value
                    .parse()
                    .ok()
                    .filter(|s| *s as f64 <= MAX_WAIT_SECONDS)
                    .ok_or_else(|| {
                        Failure::usage(format!(
                            "--wait-seconds: {value:?} is not a whole number from 0 to {MAX_WAIT_SECONDS}"
                        ))
                    })?;
            }
            "--delegate-timeout-seconds" => {
                let value = flags.value(flag)?;
                let secs = value
                    .parse::<u64>()
                    .ok()
                    .filter(|s| *s >= 1 && *s as f64 <= MAX_WAIT_SECONDS)
                    .ok_or_else(|| {
                        Failure::usage(format!(
                            "--delegate-timeout-seconds: {value:?} is not a whole number from 1 to {MAX_WAIT_SECONDS}"
                        ))
                    })?;
                self.delegate_timeout_seconds = Some(secs);
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Checks the flags together; returns the conf dir to write into.
    pub fn validate(&self) -> Result<&Path, Failure> {
        let conf_dir = self
            .conf_dir
            .as_deref()
            .ok_or_else(|| Failure::usage("--conf-dir is required"))?;
        let delegate = self
            .delegate
            .as_deref()
            .ok_or_else(|| Failure::usage("--delegate is required"))?;
        let host_paths = std::iter::once(("--delegate", delegate))
            .chain(
                self.attachments
                    .iter()
                    .map(|a| ("--attachment", a.as_path())),
            )
            .chain(std::iter::once(("--cache-dir", self.cache_dir.as_path())));
        for (flag, path) in host_paths {
            if !path.is_absolute() {
                return Err(Failure::usage(format!(
                    "{flag} {}: must be an absolute host path",
                    path.display()
                )));
            }
        }
        if !self.conf_name.ends_with(".conflist") || self.conf_name.contains('/') {
            return Err(Failure::usage(format!(
                "--conf-name {:?}: must be a file name ending in .conflist",
                self.conf_name
            )));
        }
        if self.conf_name.starts_with('.') {
            return Err(Failure::usage("--conf-name must not start with a dot"));
        }
        if !SPEC_VERSIONS.contains(&self.cni_version.as_str()) {
            return Err(Failure::usage(format!(
                "--cni-version {:?}: supported are {}",
                self.cni_version,
                SPEC_VERSIONS.join(", ")
            )));
        }
        if let Err(e) = crate::config::validate_network_name(&self.network_name) {
            return Err(Failure::usage(format!("--network-name: {}", e.msg())));
        }
        if let Some(cap) = self.capabilities.iter().find(|c| c.is_empty()) {
            return Err(Failure::usage(format!("--capability {cap:?}: empty name")));
        }
        Ok(conf_dir)
    }

    /// The conflist's bytes: deterministic for the same flags, so an unchanged setup is
    /// recognised byte for byte and never rewritten.
    pub fn render(&self) -> Vec<u8> {
        let capabilities = self
            .capabilities
            .iter()
            .map(|c| (c.clone(), serde_json::Value::Bool(true)))
            .collect();
        let conflist = Conflist {
            cni_version: &self.cni_version,
            name: &self.network_name,
            plugins: [Plugin {
                kind: PLUGIN_TYPE,
                delegate: self.delegate.as_deref().unwrap_or(Path::new("")),
                attachments: &self.attachments,
                wait_seconds: self.wait_seconds,
                delegate_timeout_seconds: self.delegate_timeout_seconds,
                cache_dir: &self.cache_dir,
                strict_permissions: self.strict_permissions,
                capabilities,
            }],
        };
        let mut bytes =
            serde_json::to_vec_pretty(&conflist).expect("a conflist of strings serialises");
        bytes.push(b'\n');
        bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_the_contract_conflist() {
        let spec = GuardFile {
            conf_dir: Some(PathBuf::from("/host/etc/cni/net.d")),
            delegate: Some(PathBuf::from("/etc/cni/net.d/00-multus.conf")),
            attachments: vec![PathBuf::from("/etc/cni/multus/net.d/05-cilium.conflist")],
            capabilities: vec!["portMappings".into()],
            ..GuardFile::default()
        };
        spec.validate().unwrap();
        let value: serde_json::Value = serde_json::from_slice(&spec.render()).unwrap();
        assert_eq!(
            value,
            serde_json::json!({
                "cniVersion": "1.0.0",
                "name": "guarded-pod-network",
                "plugins": [{
                    "type": "cni-guard",
                    "delegate": "/etc/cni/net.d/00-multus.conf",
                    "attachments": ["/etc/cni/multus/net.d/05-cilium.conflist"],
                    "waitSeconds": 0,
                    "cacheDir": "/var/lib/cni/cni-guard",
                    "capabilities": {"portMappings": true}
                }]
            })
        );
    }

    #[test]
    fn strict_permissions_is_written_only_when_asked_for() {
        let mut spec = GuardFile {
            conf_dir: Some(PathBuf::from("/c")),
            delegate: Some(PathBuf::from("/d.conf")),
            ..GuardFile::default()
        };
        let plugin = |spec: &GuardFile| {
            let v: serde_json::Value = serde_json::from_slice(&spec.render()).unwrap();
            v["plugins"][0].clone()
        };
        assert!(plugin(&spec).get("strictPermissions").is_none());
        spec.strict_permissions = true;
        assert_eq!(plugin(&spec)["strictPermissions"], true);
    }

    #[test]
    fn the_plugin_reads_back_what_is_rendered() {
        let spec = GuardFile {
            conf_dir: Some(PathBuf::from("/c")),
            delegate: Some(PathBuf::from("/etc/cni/net.d/00-multus.conf")),
            attachments: vec![PathBuf::from("/etc/cni/multus/net.d/05-cilium.conflist")],
            wait_seconds: 7,
            delegate_timeout_seconds: Some(30),
            cache_dir: PathBuf::from("/var/lib/cni/elsewhere"),
            strict_permissions: true,
            network_name: "guarded".into(),
            cni_version: "1.1.0".into(),
            ..GuardFile::default()
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(&spec.conf_name);
        std::fs::write(&path, spec.render()).unwrap();
        let cfg = crate::config::GuardConfig::from_conflist_file(&path).unwrap();
        assert_eq!(cfg.delegate, spec.delegate.unwrap());
        assert_eq!(cfg.attachments, spec.attachments);
        assert_eq!(cfg.delegate_timeout, std::time::Duration::from_secs(30));
        assert_eq!(cfg.wait, std::time::Duration::from_secs(7));
        assert_eq!(cfg.cache_dir, spec.cache_dir);
        assert!(cfg.strict_permissions);
        assert_eq!(cfg.name, "guarded");
        assert_eq!(cfg.cni_version, "1.1.0");
        assert_eq!(cfg.plugin_type, PLUGIN_TYPE);
    }

    #[test]
    fn rejects_relative_host_paths_and_bad_names() {
        let base = GuardFile {
            conf_dir: Some(PathBuf::from("/c")),
            delegate: Some(PathBuf::from("/d.conf")),
            ..GuardFile::default()
        };
        base.validate().unwrap();
        let bad = [
            GuardFile {
                delegate: Some(PathBuf::from("d.conf")),
                ..base.clone()
            },
            GuardFile {
                attachments: vec![PathBuf::from("x")],
                ..base.clone()
            },
            GuardFile {
                conf_name: "00-guard.conf".into(),
                ..base.clone()
            },
            GuardFile {
                cni_version: "2.0.0".into(),
                ..base.clone()
            },
            GuardFile {
                network_name: "a b".into(),
                ..base.clone()
            },
            GuardFile {
                conf_dir: None,
                ..base.clone()
            },
        ];
        for spec in bad {
            assert_eq!(spec.validate().unwrap_err().code, 2, "{spec:?}");
        }
    }
}
