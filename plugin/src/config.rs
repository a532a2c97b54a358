//! The guard's own configuration: its entry in `00-cni-guard.conflist`, as the runtime passes it
//! on stdin (with `name`, `cniVersion`, `runtimeConfig`, `prevResult` injected by libcni).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Map, Value};

use crate::error::{code, Error, Result};
use crate::version::{Version, LATEST};

/// Where records live unless `cacheDir` says otherwise.
pub const DEFAULT_CACHE_DIR: &str = "/var/lib/cni/cni-guard";
/// The plugin type the guard is installed under.
pub const GUARD_TYPE: &str = "cni-guard";
/// Upper bound on `waitSeconds`: kubelet gives a whole RunPodSandbox about four minutes.
pub const MAX_WAIT_SECONDS: f64 = 600.0;
/// Default bound on one delegate plugin run as a child: under kubelet's four-minute
/// RunPodSandbox deadline, so the guard answers before the runtime gives up on it.
pub const DEFAULT_DELEGATE_TIMEOUT_SECONDS: f64 = 220.0;
/// Default bound on waiting for another guard process that holds the same attachment (an ADD or
/// DEL of the same container and interface still running). Past it ADD answers 11 and DEL says
/// what it could not tear down; the runtime retries both.
pub const DEFAULT_LOCK_WAIT_SECONDS: f64 = 10.0;

#[derive(Debug, Clone)]
pub struct GuardConfig {
    pub cni_version: String,
    pub name: String,
    /// The `type` the runtime ran us as (normally `cni-guard`); used to detect recursion.
    pub plugin_type: String,
    pub delegate: PathBuf,
    pub attachments: Vec<PathBuf>,
    pub wait: Duration,
    /// How long one delegate plugin run as a child may take before it is killed.
    pub delegate_timeout: Duration,
    /// How long to wait for another guard process holding the same attachment.
    pub lock_wait: Duration,
    pub cache_dir: PathBuf,
    /// Refuse delegate and attachment files that others than their owner may write.
    pub strict_permissions: bool,
    pub runtime_config: Map<String, Value>,
    pub prev_result: Option<Value>,
    pub args: Option<Map<String, Value>>,
    /// GC's list of attachments that are still valid, as `(containerID, ifname)`.
    pub valid_attachments: Option<Vec<(String, String)>>,
}

impl GuardConfig {
    pub fn version(&self) -> Version {
        Version::parse(&self.cni_version).expect("validated at parse time")
    }

    /// Parses the request configuration from stdin.
    pub fn parse(stdin: &[u8]) -> Result<GuardConfig> {
        let value: Value = serde_json::from_slice(stdin).map_err(|e| {
            Error::new(
                code::DECODE_FAILURE,
                format!("cannot decode the network configuration on stdin: {e}"),
                "",
            )
        })?;
        let Value::Object(obj) = value else {
            return Err(Error::new(
                code::DECODE_FAILURE,
                "the network configuration on stdin is not a JSON object",
                "",
            ));
        };
        Self::from_object(&obj)
    }

    /// Loads the guard's entry from a conflist file, as the runtime would pass it (for
    /// `cni-guard check`). The first plugin of type `cni-guard` is taken.
    pub fn from_conflist_file(path: &Path) -> Result<GuardConfig> {
        let bytes = std::fs::read(path).map_err(|e| {
            Error::new(
                code::IO_FAILURE,
                format!("cannot read {}: {e}", path.display()),
                "",
            )
        })?;
        let value: Value = serde_json::from_slice(&bytes).map_err(|e| {
            Error::new(
                code::DECODE_FAILURE,
                format!("cannot decode {}: {e}", path.display()),
                "",
            )
        })?;
        let list = value.as_object().ok_or_else(|| {
            Error::new(
                code::DECODE_FAILURE,
                format!("{} is not a JSON object", path.display()),
                "",
            )
        })?;
        let entry = match list.get("plugins") {
            Some(Value::Array(plugins)) => plugins
                .iter()
                .filter_map(Value::as_object)
                .find(|p| p.get("type").and_then(Value::as_str) == Some(GUARD_TYPE)),
            _ => Some(list).filter(|l| l.get("type").and_then(Value::as_str) == Some(GUARD_TYPE)),
        };
        let mut obj = entry.cloned().ok_or_else(|| {
            Error::new(
                code::INVALID_CONFIG,
                format!("{} has no plugin of type {GUARD_TYPE:?}", path.display()),
                "",
            )
        })?;
        for key in ["name", "cniVersion"] {
            if let Some(v) = list.get(key) {
                obj.insert(key.into(), v.clone());
            }
        }
        Self::from_object(&obj)
    }

    fn from_object(obj: &Map<String, Value>) -> Result<GuardConfig> {
        let cni_version = match obj.get("cniVersion") {
            None => return Err(invalid("cniVersion is required")),
            Some(Value::String(v)) if Version::guard_supported(v) => v.clone(),
            Some(other) => {
                return Err(Error::new(
                    code::INCOMPATIBLE_VERSION,
                    format!("unsupported cniVersion {other}"),
                    format!(
                        "cni-guard supports {}",
                        crate::version::SUPPORTED.join(", ")
                    ),
                ))
            }
        };
        let name = string_field(obj, "name")?.ok_or_else(|| invalid("name is required"))?;
        validate_network_name(&name)?;
        let plugin_type = string_field(obj, "type")?.unwrap_or_else(|| GUARD_TYPE.to_owned());
        let delegate = match string_field(obj, "delegate")? {
            Some(p) => absolute_path("delegate", &p)?,
            None => {
                return Err(invalid(
                    "delegate is required: the path of the real network's configuration",
                ))
            }
        };
        let attachments = match obj.get("attachments") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, item)| match item {
                    Value::String(p) => absolute_path(&format!("attachments[{i}]"), p),
                    _ => Err(invalid(format!("attachments[{i}] is not a string"))),
                })
                .collect::<Result<_>>()?,
            Some(_) => return Err(invalid("attachments is not a list of paths")),
        };
        let wait = match obj.get("waitSeconds") {
            None | Some(Value::Null) => Duration::ZERO,
            Some(Value::Number(n)) => match n.as_f64() {
                Some(s) if (0.0..=MAX_WAIT_SECONDS).contains(&s) => Duration::from_secs_f64(s),
                _ => {
                    return Err(invalid(format!(
                        "waitSeconds {n} is outside 0..{MAX_WAIT_SECONDS}"
                    )))
                }
            },
            Some(_) => return Err(invalid("waitSeconds is not a number")),
        };
        let delegate_timeout = match obj.get("delegateTimeoutSeconds") {
            None | Some(Value::Null) => Duration::from_secs_f64(DEFAULT_DELEGATE_TIMEOUT_SECONDS),
            Some(Value::Number(n)) => match n.as_f64() {
                Some(s) if s > 0.0 && s <= MAX_WAIT_SECONDS => Duration::from_secs_f64(s),
                _ => {
                    return Err(invalid(format!(
                        "delegateTimeoutSeconds {n} is outside (0, {MAX_WAIT_SECONDS}]"
                    )))
                }
            },
            Some(_) => return Err(invalid("delegateTimeoutSeconds is not a number")),
        };
        let lock_wait = match obj.get("lockWaitSeconds") {
            None | Some(Value::Null) => Duration::from_secs_f64(DEFAULT_LOCK_WAIT_SECONDS),
            Some(Value::Number(n)) => match n.as_f64() {
                Some(s) if (0.0..=MAX_WAIT_SECONDS).contains(&s) => Duration::from_secs_f64(s),
                _ => {
                    return Err(invalid(format!(
                        "lockWaitSeconds {n} is outside 0..{MAX_WAIT_SECONDS}"
                    )))
                }
            },
            Some(_) => return Err(invalid("lockWaitSeconds is not a number")),
        };
        let cache_dir = match string_field(obj, "cacheDir")? {
            Some(p) => absolute_path("cacheDir", &p)?,
            None => PathBuf::from(DEFAULT_CACHE_DIR),
        };
        let strict_permissions = match obj.get("strictPermissions") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(invalid("strictPermissions is not a boolean")),
        };
        let runtime_config = match obj.get("runtimeConfig") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(m)) => m.clone(),
            Some(_) => return Err(invalid("runtimeConfig is not an object")),
        };
        let prev_result = match obj.get("prevResult") {
            None | Some(Value::Null) => None,
            Some(v @ Value::Object(_)) => Some(v.clone()),
            Some(_) => return Err(invalid("prevResult is not an object")),
        };
        let args = match obj.get("args") {
            None | Some(Value::Null) => None,
            Some(Value::Object(m)) => Some(m.clone()),
            Some(_) => return Err(invalid("args is not an object")),
        };
        let valid_attachments = valid_attachments(obj)?;
        Ok(GuardConfig {
            cni_version,
            name,
            plugin_type,
            delegate,
            attachments,
            wait,
            delegate_timeout,
            lock_wait,
            cache_dir,
            strict_permissions,
            runtime_config,
            prev_result,
            args,
            valid_attachments,
        })
    }
}

/// The cniVersion to answer a request in: the request's own when the guard speaks it.
pub fn reply_version(stdin: &[u8]) -> String {
    #[derive(serde::Deserialize)]
    struct Probe {
        #[serde(rename = "cniVersion")]
        cni_version: Option<String>,
    }
    serde_json::from_slice::<Probe>(stdin)
        .ok()
        .and_then(|p| p.cni_version)
        .filter(|v| Version::guard_supported(v))
        .unwrap_or_else(|| LATEST.to_owned())
}

/// libcni's rule for network names (they become file names in caches, ours included).
pub fn validate_network_name(name: &str) -> Result<()> {
    crate::names::network_name(name).map_err(|why| invalid(format!("network name {why}")))
}

/// `cni.dev/valid-attachments` (libcni) or `cni.dev/attachments` (the spec's name).
fn valid_attachments(obj: &Map<String, Value>) -> Result<Option<Vec<(String, String)>>> {
    let Some(list) = obj
        .get("cni.dev/valid-attachments")
        .or_else(|| obj.get("cni.dev/attachments"))
    else {
        return Ok(None);
    };
    if list.is_null() {
        // libcni marshals an empty Go slice of valid attachments as null.
        return Ok(Some(Vec::new()));
    }
    let items = list
        .as_array()
        .ok_or_else(|| invalid("cni.dev/valid-attachments is not a list"))?;
    items
        .iter()
        .map(|item| {
            let id = item.get("containerID").and_then(Value::as_str);
            let ifname = item.get("ifname").and_then(Value::as_str);
            match (id, ifname) {
                (Some(id), Some(ifname)) => Ok((id.to_owned(), ifname.to_owned())),
                _ => Err(invalid(
                    "cni.dev/valid-attachments entries need containerID and ifname",
                )),
            }
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

fn string_field(obj: &Map<String, Value>, key: &str) -> Result<Option<String>> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(invalid(format!("{key} is not a string"))),
    }
}

fn absolute_path(key: &str, p: &str) -> Result<PathBuf> {
    if !p.starts_with('/') {
        return Err(invalid(format!("{key} {p:?} is not an absolute path")));
    }
    if p.bytes().any(|b| b.is_ascii_control()) {
        return Err(invalid(format!("{key} {p:?} contains control characters")));
    }
    Ok(PathBuf::from(p))
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::new(code::INVALID_CONFIG, msg, "")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Result<GuardConfig> {
        GuardConfig::parse(&serde_json::to_vec(&v).unwrap())
    }

    fn base() -> Value {
        json!({"cniVersion":"1.0.0","name":"guarded","type":"cni-guard",
               "delegate":"/etc/cni/net.d/00-multus.conf"})
    }

    #[test]
    fn defaults() {
        let c = parse(base()).unwrap();
        assert_eq!(c.delegate, PathBuf::from("/etc/cni/net.d/00-multus.conf"));
        assert!(c.attachments.is_empty());
        assert_eq!(c.wait, Duration::ZERO);
        assert_eq!(c.cache_dir, PathBuf::from(DEFAULT_CACHE_DIR));
        assert!(c.prev_result.is_none());
    }

    #[test]
    fn full_entry() {
        let mut v = base();
        v["attachments"] = json!(["/a/b.conflist"]);
        v["waitSeconds"] = json!(10);
        v["cacheDir"] = json!("/tmp/x");
        v["runtimeConfig"] = json!({"portMappings":[]});
        v["cni.dev/valid-attachments"] = json!([{"containerID":"c1","ifname":"eth0"}]);
        let c = parse(v).unwrap();
        assert_eq!(c.attachments, vec![PathBuf::from("/a/b.conflist")]);
        assert_eq!(c.wait, Duration::from_secs(10));
        assert_eq!(c.cache_dir, PathBuf::from("/tmp/x"));
        assert!(c.runtime_config.contains_key("portMappings"));
        assert_eq!(
            c.valid_attachments,
            Some(vec![("c1".into(), "eth0".into())])
        );
    }

    #[test]
    fn errors_have_the_right_codes() {
        assert_eq!(GuardConfig::parse(b"{").unwrap_err().code(), 6);
        assert_eq!(GuardConfig::parse(b"[]").unwrap_err().code(), 6);
        assert_eq!(GuardConfig::parse(b"\xff").unwrap_err().code(), 6);
        let cases: Vec<(&str, Value, u32)> = vec![
            ("cniVersion", json!("9.9.9"), 1),
            ("cniVersion", json!("0.2.0"), 1),
            ("cniVersion", json!(1), 1),
            ("delegate", json!("relative/x.conf"), 7),
            ("delegate", json!(5), 7),
            ("attachments", json!("/x"), 7),
            ("attachments", json!(["x"]), 7),
            ("waitSeconds", json!(-1), 7),
            ("waitSeconds", json!("5"), 7),
            ("waitSeconds", json!(1e9), 7),
            ("delegateTimeoutSeconds", json!(0), 7),
            ("delegateTimeoutSeconds", json!("9"), 7),
            ("lockWaitSeconds", json!(-1), 7),
            ("lockWaitSeconds", json!("1"), 7),
            ("cacheDir", json!("var/lib"), 7),
            ("name", json!("../etc"), 7),
            ("prevResult", json!("x"), 7),
        ];
        for (key, val, want) in cases {
            let mut v = base();
            v[key] = val.clone();
            assert_eq!(parse(v).unwrap_err().code(), want, "{key}={val}");
        }
        let mut v = base();
        v.as_object_mut().unwrap().remove("delegate");
        assert_eq!(parse(v).unwrap_err().code(), 7);
        let mut v = base();
        v.as_object_mut().unwrap().remove("cniVersion");
        assert_eq!(parse(v).unwrap_err().code(), 7);
    }

    #[test]
    fn reply_version_falls_back() {
        assert_eq!(reply_version(br#"{"cniVersion":"0.3.1"}"#), "0.3.1");
        assert_eq!(reply_version(br#"{"cniVersion":"7.0.0"}"#), LATEST);
        assert_eq!(reply_version(b"nonsense"), LATEST);
    }

    #[test]
    fn loads_from_conflist_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("00-cni-guard.conflist");
        std::fs::write(
            &path,
            r#"{"cniVersion":"1.0.0","name":"g","plugins":[{"type":"cni-guard","delegate":"/d.conf"}]}"#,
        )
        .unwrap();
        let c = GuardConfig::from_conflist_file(&path).unwrap();
        assert_eq!(c.name, "g");
        assert_eq!(c.delegate, PathBuf::from("/d.conf"));
    }
}
