//! The guard's own configuration: its entry in `00-cni-guard.conflist`.
//!
//! One schema, [`Entry`], names the entry's keys, decoded by serde: a value of the wrong type is
//! a configuration error (code 7) naming its path (`attachments[1]: invalid type: ...`, through
//! `serde_path_to_error`). The plugin decodes the entry from stdin, where the runtime passes it
//! with `name`, `cniVersion`, `runtimeConfig`, `prevResult`, `args` and GC's attachment list
//! added ([`GuardConfig::parse`]); the agent's `install` and `keep` write it and its `check`
//! reads it back. [`Entry::validate`] is the one place that checks the values and turns them into
//! the [`GuardConfig`] the plugin runs on. Keys the schema does not name are skipped unread: a
//! runtime may add others.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Deserializer};
use serde_json::{Map, Number, Value};

use crate::error::{Error, Kind, Result};
use crate::names;
use crate::version::{Version, LATEST, SUPPORTED};

/// Where records live unless `cacheDir` says otherwise.
pub const DEFAULT_CACHE_DIR: &str = "/var/lib/cni/cni-guard";
/// The plugin type the guard is installed under.
pub const GUARD_TYPE: &str = "cni-guard";
/// Multus's own default for `systemNamespaces`.
pub const DEFAULT_MULTUS_SYSTEM_NAMESPACE: &str = "kube-system";
/// Upper bound on `delegateWriter`'s length, in characters: a component's name, not a text.
pub const MAX_WRITER_CHARS: usize = 64;

/// A key holding seconds: its bounds and its default (taken when it is absent or null).
/// The upper bounds are against mistakes only; kubelet's deadlines are what a configuration
/// must stay under (docs/reference/cni-behaviour.md#deadlines), which `install` and `check` say.
#[derive(Debug)]
pub struct Seconds {
    pub key: &'static str,
    pub default: f64,
    /// Whether 0 is allowed; without it the range is open at 0.
    pub zero: bool,
    pub max: f64,
}

/// `waitSeconds`: how long ADD waits for missing preconditions.
pub const WAIT: Seconds = Seconds::new("waitSeconds", 0.0, true, 600.0);
/// `delWaitSeconds`: how long a DEL replaying the recorded delegate it fronts waits for that
/// delegate to be ready again. Absent or null: `waitSeconds`'s value (`default` is not used).
pub const DEL_WAIT: Seconds = Seconds::new("delWaitSeconds", 0.0, true, 600.0);
/// `delegateTimeoutSeconds`: what a verb's delegate plugins get, all together, after the
/// verb's waits. 40 s: with the lock wait (10 s) and install's DEL wait (40 s) a DEL ends within
/// 90 s, well inside kubelet's 2-minute StopPodSandbox deadline.
pub const DELEGATE_TIMEOUT: Seconds = Seconds::new("delegateTimeoutSeconds", 40.0, false, 600.0);
/// `lockWaitSeconds`: the bound on waiting for another guard process on the same attachment
/// (an ADD or DEL of it still running). Past it ADD answers 11 and DEL says what it could not
/// tear down; the runtime retries both.
pub const LOCK_WAIT: Seconds = Seconds::new("lockWaitSeconds", 10.0, true, 600.0);
/// `statusTimeoutSeconds`: the bound on the delegate's STATUS, all its plugins together. Small:
/// containerd runs STATUS inside the CRI `Status` call that kubelet polls (about every 5 s) and
/// bounds by nothing else, while multus-shim's STATUS waits up to 60 s for a Multus daemon that
/// is down.
pub const STATUS_TIMEOUT: Seconds = Seconds::new("statusTimeoutSeconds", 3.0, false, 60.0);

impl Seconds {
    const fn new(key: &'static str, default: f64, zero: bool, max: f64) -> Seconds {
        Seconds {
            key,
            default,
            zero,
            max,
        }
    }

    pub fn allows(&self, seconds: f64) -> bool {
        seconds <= self.max && (seconds > 0.0 || (self.zero && seconds == 0.0))
    }

    /// The range as messages write it: `0..600`, or `(0, 600]` when 0 is not allowed.
    pub fn range(&self) -> String {
        match self.zero {
            true => format!("0..{}", self.max),
            false => format!("(0, {}]", self.max),
        }
    }

    fn read(&self, n: Option<Number>) -> Checked<Duration> {
        let Some(n) = n else {
            return Ok(Duration::from_secs_f64(self.default));
        };
        let (key, range) = (self.key, self.range());
        match n.as_f64() {
            Some(s) if self.allows(s) => Ok(Duration::from_secs_f64(s)),
            _ => Err(invalid(key, format!("{key} {n} is outside {range}"))),
        }
    }
}

/// The guard's entry in its conflist: every key it can have, once. Absent and null are both
/// `None` (the default), except where a null means something of its own (`present`).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Entry {
    /// The conflist's own, added to the entry by the runtime (any JSON: it is said back).
    #[serde(deserialize_with = "present")]
    pub cni_version: Option<Value>,
    /// The conflist's own, added to the entry by the runtime.
    pub name: Option<String>,
    #[serde(rename = "type")]
    pub plugin_type: Option<String>,
    pub delegate: Option<String>,
    /// Who writes the delegate's file (`Multus`), named in refusals while it does not exist.
    pub delegate_writer: Option<String>,
    pub attachments: Option<Vec<String>>,
    pub sockets: Option<Vec<String>>,
    pub wait_seconds: Option<Number>,
    /// DEL's own wait for the delegate it fronts (absent: `waitSeconds`).
    pub del_wait_seconds: Option<Number>,
    pub delegate_timeout_seconds: Option<Number>,
    pub lock_wait_seconds: Option<Number>,
    pub status_timeout_seconds: Option<Number>,
    pub cache_dir: Option<String>,
    pub strict_permissions: Option<bool>,
    /// Per-pod awareness (opt-in): the primary network's configuration (Multus's
    /// `clusterNetwork` file), run directly for a pod that needs no Multus network while the
    /// delegate is not ready.
    pub per_pod_primary: Option<String>,
    /// Multus's `defaultNetworks` (daemon-side): every pod outside the system namespaces gets
    /// them, so every such pod needs Multus.
    pub multus_default_networks: Option<Vec<String>>,
    /// Multus's `systemNamespaces` (daemon-side; Multus's default is `kube-system`).
    pub multus_system_namespaces: Option<Vec<String>>,
    /// Multus's `auxiliaryCNIChainName` (daemon-side): a chain Multus runs for every pod.
    pub multus_auxiliary_chain: Option<String>,
    /// libcni's: the capability arguments the runtime may pass. The guard does not read it.
    pub capabilities: Option<Value>,
    pub runtime_config: Option<Map<String, Value>>,
    pub prev_result: Option<Map<String, Value>>,
    pub args: Option<Map<String, Value>>,
    /// GC's list of attachments still in use, as libcni names it (its null is an empty list).
    #[serde(rename = "cni.dev/valid-attachments", deserialize_with = "present")]
    pub valid_attachments: Option<Value>,
    /// The same list as the spec names it, read when libcni's name is absent.
    #[serde(rename = "cni.dev/attachments", deserialize_with = "present")]
    pub gc_attachments: Option<Value>,
}

/// The entry's `cniVersion`, which the guard must speak: checked before anything else (code 1).
fn cni_version(v: Option<&Value>) -> Checked<String> {
    match v {
        None => Err(invalid("cniVersion", "cniVersion is required")),
        Some(Value::String(v)) if Version::guard_supported(v) => Ok(v.clone()),
        Some(other) => Err(Invalid {
            key: "cniVersion",
            error: Error::new(Kind::Unsupported, format!("unsupported cniVersion {other}"))
                .with_details(format!("cni-guard supports {}", SUPPORTED.join(", "))),
        }),
    }
}

/// A key that is there, whatever its value (null included); absent keys take the default.
fn present<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

/// A value [`Entry::validate`] refused, with the key it is under (`install` names its flag).
#[derive(Debug)]
pub struct Invalid {
    pub key: &'static str,
    pub error: Error,
}

/// What a check of one value gives: the value, or the refusal.
type Checked<T> = std::result::Result<T, Invalid>;

impl From<Invalid> for Error {
    fn from(invalid: Invalid) -> Error {
        invalid.error
    }
}

fn invalid(key: &'static str, msg: impl Into<String>) -> Invalid {
    Invalid {
        key,
        error: Error::new(Kind::Misconfigured, msg),
    }
}

impl Entry {
    /// Decodes an entry from a JSON object; a value of the wrong type names its path (code 7).
    pub fn from_value(value: Value) -> Result<Entry> {
        serde_path_to_error::deserialize(value)
            .map_err(|e| Error::new(Kind::Misconfigured, format!("{}: {}", e.path(), e.inner())))
    }

    /// Checks every value, in a fixed order (the first problem is the one reported), and
    /// applies the defaults.
    pub fn validate(self) -> Checked<GuardConfig> {
        let cni_version = cni_version(self.cni_version.as_ref())?;
        let name = self
            .name
            .ok_or_else(|| invalid("name", "name is required"))?;
        names::network_name(&name).map_err(|why| invalid("name", format!("network name {why}")))?;
        let Some(delegate) = self.delegate else {
            let why = "delegate is required: the path of the real network's configuration";
            return Err(invalid("delegate", why));
        };
        let delegate = absolute_path("delegate", "delegate", delegate)?;
        let delegate_writer = self.delegate_writer.map(writer_name).transpose()?;
        let paths = |key: &'static str, items: Option<Vec<String>>| {
            items
                .unwrap_or_default()
                .into_iter()
                .enumerate()
                .map(|(i, p)| absolute_path(key, &format!("{key}[{i}]"), p))
                .collect::<Checked<Vec<_>>>()
        };
        let attachments = paths("attachments", self.attachments)?;
        let sockets = paths("sockets", self.sockets)?;
        let wait = WAIT.read(self.wait_seconds)?;
        let del_wait = match self.del_wait_seconds {
            None => wait,
            given => DEL_WAIT.read(given)?,
        };
        let cache_dir = match self.cache_dir {
            Some(p) => absolute_path("cacheDir", "cacheDir", p)?,
            None => PathBuf::from(DEFAULT_CACHE_DIR),
        };
        let networks = self.multus_default_networks.unwrap_or_default();
        let namespaces = self
            .multus_system_namespaces
            .unwrap_or_else(|| vec![DEFAULT_MULTUS_SYSTEM_NAMESPACE.to_owned()]);
        let per_pod = match self.per_pod_primary {
            None => None,
            Some(p) => Some(PerPod {
                primary: absolute_path("perPodPrimary", "perPodPrimary", p)?,
                default_networks: names_list("multusDefaultNetworks", networks)?,
                system_namespaces: names_list("multusSystemNamespaces", namespaces)?,
                auxiliary_chain: self.multus_auxiliary_chain.filter(|c| !c.is_empty()),
            }),
        };
        // GC forwards the runtime's lists exactly as sent (libcni sends both names; a runtime
        // that sends none asks for nothing to be kept, and the delegate is told nothing). The
        // guard reads the first: libcni's name wins.
        let gc_attachments: Vec<_> = [
            ("cni.dev/valid-attachments", self.valid_attachments),
            ("cni.dev/attachments", self.gc_attachments),
        ]
        .into_iter()
        .filter_map(|(key, v)| Some((key, v?)))
        .collect();
        let valid_attachments = valid_attachments(gc_attachments.first().map(|(_, v)| v))?;
        Ok(GuardConfig {
            cni_version,
            name,
            plugin_type: self.plugin_type.unwrap_or_else(|| GUARD_TYPE.to_owned()),
            delegate,
            delegate_writer,
            attachments,
            sockets,
            wait,
            del_wait,
            delegate_timeout: DELEGATE_TIMEOUT.read(self.delegate_timeout_seconds)?,
            lock_wait: LOCK_WAIT.read(self.lock_wait_seconds)?,
            status_timeout: STATUS_TIMEOUT.read(self.status_timeout_seconds)?,
            cache_dir,
            strict_permissions: self.strict_permissions.unwrap_or(false),
            per_pod,
            runtime_config: self.runtime_config.unwrap_or_default(),
            prev_result: self.prev_result.map(Value::Object),
            args: self.args,
            valid_attachments,
            gc_attachments,
        })
    }
}

/// The configuration the plugin runs on: the [`Entry`] validated, defaults applied.
#[derive(Debug, Clone)]
pub struct GuardConfig {
    pub cni_version: String,
    pub name: String,
    /// The `type` the runtime ran us as (normally `cni-guard`); used to detect recursion.
    pub plugin_type: String,
    pub delegate: PathBuf,
    /// Who writes the delegate's file, said in a refusal while it does not exist.
    pub delegate_writer: Option<String>,
    pub attachments: Vec<PathBuf>,
    /// Unix sockets that must accept connections (a daemon the delegate needs, such as Multus's).
    pub sockets: Vec<PathBuf>,
    /// How long ADD waits for missing preconditions.
    pub wait: Duration,
    /// How long a DEL replaying the recorded delegate it fronts waits for that delegate.
    pub del_wait: Duration,
    /// What a verb's delegate plugins get, all together, after the verb's waits.
    pub delegate_timeout: Duration,
    /// How long to wait for another guard process holding the same attachment.
    pub lock_wait: Duration,
    /// How long the delegate's STATUS may take, all its plugins together.
    pub status_timeout: Duration,
    pub cache_dir: PathBuf,
    /// Refuse delegate and attachment files that others than their owner may write.
    pub strict_permissions: bool,
    /// Per-pod awareness, when `perPodPrimary` is set.
    pub per_pod: Option<PerPod>,
    pub runtime_config: Map<String, Value>,
    pub prev_result: Option<Value>,
    pub args: Option<Map<String, Value>>,
    /// GC's list of attachments that are still valid, as `(containerID, ifname)`.
    pub valid_attachments: Option<Vec<(String, String)>>,
    /// GC's attachment keys as the runtime sent them (either name, or both), for the delegate.
    pub gc_attachments: Vec<(&'static str, Value)>,
}

/// Per-pod awareness: what decides whether a pod needs Multus, and the network such a pod
/// gets while Multus is away (see [`crate::perpod`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PerPod {
    /// The primary network's configuration (Multus's `clusterNetwork` file).
    pub primary: PathBuf,
    /// Multus's `defaultNetworks`: when any, every pod outside `system_namespaces` needs Multus.
    pub default_networks: Vec<String>,
    pub system_namespaces: Vec<String>,
    /// Multus's `auxiliaryCNIChainName`: when set, every pod needs Multus.
    pub auxiliary_chain: Option<String>,
}

impl GuardConfig {
    pub fn version(&self) -> Version {
        Version::parse(&self.cni_version).expect("validated at parse time")
    }

    /// Parses the request configuration from stdin.
    pub fn parse(stdin: &[u8]) -> Result<GuardConfig> {
        let msg = match serde_json::from_slice(stdin) {
            Ok(value @ Value::Object(_)) => {
                cni_version(value.get("cniVersion"))?;
                return Ok(Entry::from_value(value)?.validate()?);
            }
            Ok(_) => "the network configuration on stdin is not a JSON object".to_owned(),
            Err(e) => format!("cannot decode the network configuration on stdin: {e}"),
        };
        Err(Error::new(Kind::BadInput, msg))
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

/// `cni.dev/valid-attachments` (libcni) or `cni.dev/attachments` (the spec's name): the
/// attachments GC must keep, as `(containerID, ifname)`.
fn valid_attachments(list: Option<&Value>) -> Checked<Option<Vec<(String, String)>>> {
    const KEY: &str = "cni.dev/valid-attachments";
    let items = match list {
        None => return Ok(None),
        // libcni marshals an empty Go slice of valid attachments as null.
        Some(Value::Null) => return Ok(Some(Vec::new())),
        Some(Value::Array(items)) => items,
        Some(_) => return Err(invalid(KEY, format!("{KEY} is not a list"))),
    };
    let text = |item: &Value, key: &str| item[key].as_str().map(str::to_owned);
    let pair = |item: &Value| Some((text(item, "containerID")?, text(item, "ifname")?));
    match items.iter().map(pair).collect() {
        Some(pairs) => Ok(Some(pairs)),
        None => Err(invalid(
            KEY,
            format!("{KEY} entries need containerID and ifname"),
        )),
    }
}

/// `delegateWriter`: a name said inside a one-line refusal, so no control characters (the
/// runtime logs it and kubelet shows it in an event), not empty, and short.
fn writer_name(name: String) -> Checked<String> {
    let why = if name.trim().is_empty() {
        "is empty".to_owned()
    } else if name.chars().count() > MAX_WRITER_CHARS {
        format!("is longer than {MAX_WRITER_CHARS} characters")
    } else if name.chars().any(char::is_control) {
        format!("{name:?} has a control character")
    } else {
        return Ok(name);
    };
    Err(invalid("delegateWriter", format!("delegateWriter {why}")))
}

/// A list of non-empty names.
fn names_list(key: &'static str, items: Vec<String>) -> Checked<Vec<String>> {
    match items.iter().any(String::is_empty) {
        true => Err(invalid(key, format!("{key} has an empty name"))),
        false => Ok(items),
    }
}

/// `label` names the value in the message (`attachments[2]`), `key` its key.
fn absolute_path(key: &'static str, label: &str, p: String) -> Checked<PathBuf> {
    let why = if !p.starts_with('/') {
        "is not an absolute path"
    } else if p.bytes().any(|b| b.is_ascii_control()) {
        "contains control characters"
    } else {
        return Ok(PathBuf::from(p));
    };
    Err(invalid(key, format!("{label} {p:?} {why}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verb::Command;
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
        assert_eq!(c.del_wait, Duration::ZERO);
        assert_eq!(c.cache_dir, PathBuf::from(DEFAULT_CACHE_DIR));
        assert!(c.prev_result.is_none());
        assert_eq!(c.delegate_writer, None);
    }

    /// DEL's wait is `waitSeconds`'s unless `delWaitSeconds` gives its own, in either direction.
    #[test]
    fn del_wait_follows_wait_unless_given() {
        let with = |keys: Value| {
            let mut v = base();
            v.as_object_mut()
                .unwrap()
                .extend(keys.as_object().unwrap().clone());
            let c = parse(v).unwrap();
            (c.wait, c.del_wait)
        };
        let s = Duration::from_secs;
        assert_eq!(with(json!({"waitSeconds": 7})), (s(7), s(7)));
        assert_eq!(
            with(json!({"waitSeconds": 7, "delWaitSeconds": null})),
            (s(7), s(7))
        );
        assert_eq!(
            with(json!({"waitSeconds": 0, "delWaitSeconds": 60})),
            (s(0), s(60))
        );
        assert_eq!(
            with(json!({"waitSeconds": 60, "delWaitSeconds": 0})),
            (s(60), s(0))
        );
        assert_eq!(with(json!({"delWaitSeconds": 600})), (s(0), s(600)));
    }

    #[test]
    fn delegate_writer_is_taken_as_given() {
        for name in [
            "Multus",
            "the Multus DaemonSet (kube-system/kube-multus-ds)",
            "é",
        ] {
            let mut v = base();
            v["delegateWriter"] = json!(name);
            assert_eq!(parse(v).unwrap().delegate_writer.as_deref(), Some(name));
        }
        let mut v = base();
        v["delegateWriter"] = json!(null);
        assert_eq!(parse(v).unwrap().delegate_writer, None);
        let mut v = base();
        v["delegateWriter"] = json!("x".repeat(MAX_WRITER_CHARS));
        assert!(parse(v).is_ok());
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
        assert_eq!(GuardConfig::parse(b"{").unwrap_err().code(Command::Add), 6);
        assert_eq!(GuardConfig::parse(b"[]").unwrap_err().code(Command::Add), 6);
        assert_eq!(
            GuardConfig::parse(b"\xff").unwrap_err().code(Command::Add),
            6
        );
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
            ("delWaitSeconds", json!(-1), 7),
            ("delWaitSeconds", json!("60"), 7),
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
            assert_eq!(
                parse(v).unwrap_err().code(Command::Add),
                want,
                "{key}={val}"
            );
        }
        let mut v = base();
        v.as_object_mut().unwrap().remove("delegate");
        assert_eq!(parse(v).unwrap_err().code(Command::Add), 7);
        let mut v = base();
        v.as_object_mut().unwrap().remove("cniVersion");
        assert_eq!(parse(v).unwrap_err().code(Command::Add), 7);
    }

    /// The words of every refusal: the key (its path) and why.
    #[test]
    fn errors_say_which_key_and_why() {
        let cases: Vec<(&str, Value, u32, &str)> = vec![
            ("cniVersion", json!("9.9.9"), 1, "unsupported cniVersion \"9.9.9\""),
            ("cniVersion", json!(null), 1, "unsupported cniVersion null"),
            ("cniVersion", json!({"a": [1]}), 1, "unsupported cniVersion {\"a\":[1]}"),
            ("name", json!(5), 7, "name: invalid type: integer `5`, expected a string"),
            ("name", json!(null), 7, "name is required"),
            ("name", json!("a/b"), 7, "network name \"a/b\" must start with a letter or digit, contain only letters, digits, '_', '.', '-', and be at most 200 characters"),
            ("type", json!(1), 7, "type: invalid type: integer `1`, expected a string"),
            ("delegate", json!(7), 7, "delegate: invalid type: integer `7`, expected a string"),
            ("delegate", json!(null), 7, "delegate is required: the path of the real network's configuration"),
            ("delegate", json!("x.conf"), 7, "delegate \"x.conf\" is not an absolute path"),
            ("delegate", json!("/x\u{1}"), 7, "delegate \"/x\\u{1}\" contains control characters"),
            ("delegateWriter", json!(1), 7, "delegateWriter: invalid type: integer `1`, expected a string"),
            ("delegateWriter", json!(" "), 7, "delegateWriter is empty"),
            ("delegateWriter", json!("a\nb"), 7, "delegateWriter \"a\\nb\" has a control character"),
            ("delegateWriter", json!("x".repeat(65)), 7, "delegateWriter is longer than 64 characters"),
            ("attachments", json!({"a": 1}), 7, "attachments: invalid type: map, expected a sequence"),
            ("attachments", json!(["/a", 1]), 7, "attachments[1]: invalid type: integer `1`, expected a string"),
            ("attachments", json!(["/a", "b"]), 7, "attachments[1] \"b\" is not an absolute path"),
            ("waitSeconds", json!("5"), 7, "waitSeconds: invalid type: string \"5\", expected a JSON number"),
            ("waitSeconds", json!(1e9), 7, "waitSeconds 1000000000.0 is outside 0..600"),
            ("waitSeconds", json!(-1), 7, "waitSeconds -1 is outside 0..600"),
            ("delWaitSeconds", json!(601), 7, "delWaitSeconds 601 is outside 0..600"),
            ("delWaitSeconds", json!("60"), 7, "delWaitSeconds: invalid type: string \"60\", expected a JSON number"),
            ("delegateTimeoutSeconds", json!(0), 7, "delegateTimeoutSeconds 0 is outside (0, 600]"),
            ("delegateTimeoutSeconds", json!(true), 7, "delegateTimeoutSeconds: invalid type: boolean `true`, expected a JSON number"),
            ("lockWaitSeconds", json!(600.5), 7, "lockWaitSeconds 600.5 is outside 0..600"),
            ("lockWaitSeconds", json!([]), 7, "lockWaitSeconds: invalid type: sequence, expected a JSON number"),
            ("cacheDir", json!("var/lib"), 7, "cacheDir \"var/lib\" is not an absolute path"),
            ("cacheDir", json!(false), 7, "cacheDir: invalid type: boolean `false`, expected a string"),
            ("strictPermissions", json!("yes"), 7, "strictPermissions: invalid type: string \"yes\", expected a boolean"),
            ("runtimeConfig", json!([]), 7, "runtimeConfig: invalid type: sequence, expected a map"),
            ("prevResult", json!("x"), 7, "prevResult: invalid type: string \"x\", expected a map"),
            ("args", json!(1), 7, "args: invalid type: integer `1`, expected a map"),
            ("cni.dev/valid-attachments", json!({}), 7, "cni.dev/valid-attachments is not a list"),
            ("cni.dev/attachments", json!([{"ifname": "e"}]), 7, "cni.dev/valid-attachments entries need containerID and ifname"),
        ];
        for (key, val, code, msg) in cases {
            let mut v = base();
            v[key] = val.clone();
            let err = parse(v).unwrap_err();
            assert_eq!(
                (err.code(Command::Add), err.msg()),
                (code, msg),
                "{key}={val}"
            );
        }
    }

    #[test]
    fn the_first_problem_is_reported() {
        // Keys are checked in name order (a JSON object's keys have no order of their own).
        let v = json!({"cniVersion":"1.0.0","waitSeconds":"x","delegate":5,"name":"n"});
        assert_eq!(
            parse(v).unwrap_err().msg(),
            "delegate: invalid type: integer `5`, expected a string"
        );
        let v = json!({"name":5,"cniVersion":"0.2.0"});
        assert_eq!(parse(v).unwrap_err().code(Command::Add), 1);
    }

    #[test]
    fn null_takes_the_default_and_unknown_keys_are_skipped() {
        let mut v = base();
        for key in [
            "type",
            "attachments",
            "waitSeconds",
            "delegateTimeoutSeconds",
            "lockWaitSeconds",
            "cacheDir",
            "strictPermissions",
            "runtimeConfig",
            "prevResult",
            "args",
        ] {
            v[key] = Value::Null;
        }
        v["somethingElse"] = json!({"deep": [[[["x"]]]], "n": 1e300});
        v["capabilities"] = json!("not read by the guard");
        let c = parse(v).unwrap();
        assert_eq!(c.plugin_type, GUARD_TYPE);
        assert_eq!(c.delegate_timeout, Duration::from_secs(40));
        assert_eq!(c.lock_wait, Duration::from_secs(10));
        assert!(c.args.is_none() && c.valid_attachments.is_none());
    }

    #[test]
    fn seconds_are_read_with_their_own_bounds() {
        let mut v = base();
        v["waitSeconds"] = json!(0.25);
        v["delegateTimeoutSeconds"] = json!(600);
        v["lockWaitSeconds"] = json!(0);
        let c = parse(v).unwrap();
        assert_eq!(c.wait, Duration::from_millis(250));
        assert_eq!(c.delegate_timeout, Duration::from_secs(600));
        assert_eq!(c.lock_wait, Duration::ZERO);
        for (bounds, max) in [
            (&WAIT, 600.0),
            (&DEL_WAIT, 600.0),
            (&DELEGATE_TIMEOUT, 600.0),
            (&LOCK_WAIT, 600.0),
        ] {
            assert_eq!(bounds.max, max);
            assert!(bounds.allows(bounds.default) && bounds.allows(max));
            assert!(!bounds.allows(max + 0.001) && !bounds.allows(-0.001));
        }
        assert!(WAIT.allows(0.0) && LOCK_WAIT.allows(0.0) && !DELEGATE_TIMEOUT.allows(0.0));
    }

    #[test]
    fn gc_attachments_under_either_name() {
        let mut v = base();
        v["cni.dev/attachments"] = json!([{"containerID":"c2","ifname":"net1"}]);
        let c = parse(v.clone()).unwrap();
        assert_eq!(
            c.valid_attachments,
            Some(vec![("c2".into(), "net1".into())])
        );
        // libcni's name wins, and its null is an empty list (a Go nil slice).
        v["cni.dev/valid-attachments"] = Value::Null;
        assert_eq!(parse(v).unwrap().valid_attachments, Some(vec![]));
    }

    #[test]
    fn what_is_not_an_object_is_refused_as_before() {
        let cases: [(&[u8], &str); 7] = [
            (b"", "cannot decode the network configuration on stdin: EOF while parsing a value at line 1 column 0"),
            (b"[1,2]", "the network configuration on stdin is not a JSON object"),
            (b" \"x\"", "the network configuration on stdin is not a JSON object"),
            (b"{}{}", "cannot decode the network configuration on stdin: trailing characters at line 1 column 3"),
            (b"\xef\xbb\xbf{}", "cannot decode the network configuration on stdin: expected value at line 1 column 1"),
            // Invalid UTF-8 is refused also where the schema skips the key.
            (b"{\"x\":\"\xc3\x28\"}", "cannot decode the network configuration on stdin: invalid unicode code point at line 1 column 7"),
            // The first error of the whole text, not the fast path's.
            (b"{\"x\":1e999,\"y\":[}", "cannot decode the network configuration on stdin: number out of range at line 1 column 10"),
        ];
        for (stdin, msg) in cases {
            let err = GuardConfig::parse(stdin).unwrap_err();
            assert_eq!((err.code(Command::Add), err.msg()), (6, msg), "{stdin:?}");
        }
    }

    #[test]
    fn a_key_given_twice_takes_the_last_value() {
        let stdin = br#"{"cniVersion":"1.0.0","name":"a","name":"b","delegate":"/d.conf"}"#;
        assert_eq!(GuardConfig::parse(stdin).unwrap().name, "b");
        let stdin = br#"{"cniVersion":"1.0.0","name":"a","delegate":"/d","delegate":"d"}"#;
        assert_eq!(GuardConfig::parse(stdin).unwrap_err().code(Command::Add), 7);
    }

    #[test]
    fn an_entry_holds_what_was_given() {
        let back = Entry::from_value(json!({"type":"cni-guard","waitSeconds":5,
            "strictPermissions":null}))
        .unwrap();
        assert_eq!(back.wait_seconds, Some(5.into()));
        assert_eq!(back.strict_permissions, None);
        assert_eq!(back.cache_dir, None);
        let wrong = Entry::from_value(json!({"type":"cni-guard","delegate":[1]})).unwrap_err();
        assert_eq!(
            (wrong.code(Command::Add), wrong.msg()),
            (7, "delegate: invalid type: sequence, expected a string")
        );
    }

    #[test]
    fn reply_version_falls_back() {
        assert_eq!(reply_version(br#"{"cniVersion":"0.3.1"}"#), "0.3.1");
        assert_eq!(reply_version(br#"{"cniVersion":"7.0.0"}"#), LATEST);
        assert_eq!(reply_version(b"nonsense"), LATEST);
    }
}
