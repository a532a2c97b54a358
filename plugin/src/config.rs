//! The guard's own configuration: its entry in `00-cni-guard.conflist`.
//!
//! One schema, [`Entry`], names the entry's keys. The plugin decodes it from stdin, where the
//! runtime passes the entry with `name`, `cniVersion`, `runtimeConfig`, `prevResult`, `args` and
//! GC's attachment list added ([`GuardConfig::parse`]); `check` decodes it from the conflist
//! ([`GuardConfig::from_conflist_file`]); `install` and `keep` build it from their flags and
//! write it (`operator::spec`). [`Entry::validate`] is the one place that checks the values and
//! turns them into the [`GuardConfig`] the plugin runs on.
//!
//! Every key is a [`Field`]: absent, `null`, of its type, or of another type. A value of the
//! wrong type is not a decoding error but a configuration error (code 7) naming its key, so
//! decoding takes any JSON object and `validate` says what is wrong, in the same order every
//! time. Keys the schema does not name are skipped unread: a runtime may add others.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Number, Value};

use crate::error::{Error, Kind, Result};
use crate::names;
use crate::version::{Version, LATEST, SUPPORTED};

/// Where records live unless `cacheDir` says otherwise.
pub const DEFAULT_CACHE_DIR: &str = "/var/lib/cni/cni-guard";
/// The plugin type the guard is installed under.
pub const GUARD_TYPE: &str = "cni-guard";
/// Upper bound on `waitSeconds`: 600 s, ten minutes. A bound against mistakes only: kubelet
/// gives a whole RunPodSandbox about four minutes, so a wait longer than that is cut short by the
/// runtime giving up on the ADD.
pub const MAX_WAIT_SECONDS: f64 = 600.0;
/// Upper bound on `delegateTimeoutSeconds`: 600 s, ten minutes. A bound against mistakes only:
/// past kubelet's four-minute RunPodSandbox deadline the runtime gives up before the guard does,
/// which is why the default stays under it.
pub const MAX_DELEGATE_TIMEOUT_SECONDS: f64 = 600.0;
/// Default deadline of one verb's delegate plugins run as children, rollback included: with
/// `install`'s wait (60 s) and the lock wait (10 s), 190 s at most, under kubelet's four-minute
/// RunPodSandbox deadline, so the guard answers before the runtime gives up on it.
pub const DEFAULT_DELEGATE_TIMEOUT_SECONDS: f64 = 120.0;
/// Upper bound on `lockWaitSeconds`: 600 s, ten minutes, a bound against mistakes only, as for
/// `waitSeconds`.
pub const MAX_LOCK_WAIT_SECONDS: f64 = 600.0;
/// Default bound on waiting for another guard process that holds the same attachment (an ADD or
/// DEL of the same container and interface still running). Past it ADD answers 11 and DEL says
/// what it could not tear down; the runtime retries both.
pub const DEFAULT_LOCK_WAIT_SECONDS: f64 = 10.0;

/// Upper bound on `statusTimeoutSeconds`: kubelet polls the runtime's status every few
/// seconds, and containerd puts no timeout of its own on CNI STATUS.
pub const MAX_STATUS_TIMEOUT_SECONDS: f64 = 60.0;
/// Default bound on the delegate's STATUS: small, because containerd runs STATUS inside the CRI
/// `Status` call that kubelet polls (about every 5 s) and bounds by nothing else, while
/// multus-shim's STATUS waits up to 60 s for a Multus daemon that is down.
pub const DEFAULT_STATUS_TIMEOUT_SECONDS: f64 = 3.0;

/// A key holding seconds: its bounds and its default, for the plugin and for `install`'s flags.
#[derive(Debug)]
pub struct Seconds {
    pub key: &'static str,
    /// Taken when the key is absent or null.
    pub default: f64,
    /// Whether 0 is allowed; without it the range is open at 0.
    pub zero: bool,
    pub max: f64,
}

/// `waitSeconds`: how long ADD waits for missing preconditions.
pub const WAIT: Seconds = Seconds {
    key: "waitSeconds",
    default: 0.0,
    zero: true,
    max: MAX_WAIT_SECONDS,
};
/// `delWaitSeconds`: how long a DEL replaying the recorded delegate it fronts waits for that
/// delegate to be ready again. Absent or null: `waitSeconds`'s value (`default` is not used).
pub const DEL_WAIT: Seconds = Seconds {
    key: "delWaitSeconds",
    default: 0.0,
    zero: true,
    max: MAX_WAIT_SECONDS,
};
/// `delegateTimeoutSeconds`: the bound on one delegate plugin run as the guard's child.
pub const DELEGATE_TIMEOUT: Seconds = Seconds {
    key: "delegateTimeoutSeconds",
    default: DEFAULT_DELEGATE_TIMEOUT_SECONDS,
    zero: false,
    max: MAX_DELEGATE_TIMEOUT_SECONDS,
};
/// `lockWaitSeconds`: the bound on waiting for another guard process on the same attachment.
pub const LOCK_WAIT: Seconds = Seconds {
    key: "lockWaitSeconds",
    default: DEFAULT_LOCK_WAIT_SECONDS,
    zero: true,
    max: MAX_LOCK_WAIT_SECONDS,
};

/// `statusTimeoutSeconds`: the bound on the delegate's STATUS, all its plugins together.
pub const STATUS_TIMEOUT: Seconds = Seconds {
    key: "statusTimeoutSeconds",
    default: DEFAULT_STATUS_TIMEOUT_SECONDS,
    zero: false,
    max: MAX_STATUS_TIMEOUT_SECONDS,
};

impl Seconds {
    pub fn allows(&self, seconds: f64) -> bool {
        if self.zero {
            (0.0..=self.max).contains(&seconds)
        } else {
            seconds > 0.0 && seconds <= self.max
        }
    }

    /// The range as messages write it: `0..600`, or `(0, 600]` when 0 is not allowed.
    pub fn range(&self) -> String {
        if self.zero {
            format!("0..{}", self.max)
        } else {
            format!("(0, {}]", self.max)
        }
    }

    fn read(&self, field: Field<Number>) -> std::result::Result<Duration, Invalid> {
        match field.given() {
            Ok(None) => Ok(Duration::from_secs_f64(self.default)),
            Ok(Some(n)) => match n.as_f64() {
                Some(s) if self.allows(s) => Ok(Duration::from_secs_f64(s)),
                _ => Err(invalid(
                    self.key,
                    format!("{} {n} is outside {}", self.key, self.range()),
                )),
            },
            Err(_) => Err(invalid(self.key, format!("{} is not a number", self.key))),
        }
    }
}

/// Keys the runtime adds to the entry it passes on stdin; nothing writes them into the conflist.
pub const INJECTED_KEYS: [&str; 5] = [
    "runtimeConfig",
    "prevResult",
    "args",
    "cni.dev/valid-attachments",
    "cni.dev/attachments",
];

/// The guard's entry in its conflist: every key it can have, once. Field order is the order
/// `install` writes them in.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Entry {
    /// The conflist's own, added to the entry by the runtime.
    #[serde(skip_serializing)]
    pub cni_version: Field<String>,
    /// The conflist's own, added to the entry by the runtime.
    #[serde(skip_serializing)]
    pub name: Field<String>,
    #[serde(rename = "type", skip_serializing_if = "Field::is_absent")]
    pub plugin_type: Field<String>,
    #[serde(skip_serializing_if = "Field::is_absent")]
    pub delegate: Field<String>,
    /// Who writes the delegate's file (`Multus`), named in refusals while it does not exist.
    #[serde(skip_serializing_if = "Field::is_absent")]
    pub delegate_writer: Field<String>,
    #[serde(skip_serializing_if = "Field::is_absent")]
    pub attachments: Field<Vec<Value>>,
    #[serde(skip_serializing_if = "Field::is_absent")]
    pub sockets: Field<Vec<Value>>,
    #[serde(skip_serializing_if = "Field::is_absent")]
    pub wait_seconds: Field<Number>,
    /// DEL's own wait for the delegate it fronts (absent: `waitSeconds`).
    #[serde(skip_serializing_if = "Field::is_absent")]
    pub del_wait_seconds: Field<Number>,
    #[serde(skip_serializing_if = "Field::is_absent")]
    pub delegate_timeout_seconds: Field<Number>,
    #[serde(skip_serializing_if = "Field::is_absent")]
    pub lock_wait_seconds: Field<Number>,
    #[serde(skip_serializing_if = "Field::is_absent")]
    pub status_timeout_seconds: Field<Number>,
    #[serde(skip_serializing_if = "Field::is_absent")]
    pub cache_dir: Field<String>,
    #[serde(skip_serializing_if = "Field::is_absent")]
    pub strict_permissions: Field<bool>,
    /// Per-pod awareness (opt-in): the primary network's configuration (Multus's
    /// `clusterNetwork` file), run directly for a pod that needs no Multus network while the
    /// delegate is not ready.
    #[serde(skip_serializing_if = "Field::is_absent")]
    pub per_pod_primary: Field<String>,
    /// Multus's `defaultNetworks` (daemon-side): every pod outside the system namespaces gets
    /// them, so every such pod needs Multus.
    #[serde(skip_serializing_if = "Field::is_absent")]
    pub multus_default_networks: Field<Vec<Value>>,
    /// Multus's `systemNamespaces` (daemon-side; Multus's default is `kube-system`): their pods
    /// get no `defaultNetworks`.
    #[serde(skip_serializing_if = "Field::is_absent")]
    pub multus_system_namespaces: Field<Vec<Value>>,
    /// Multus's `auxiliaryCNIChainName` (daemon-side): a chain Multus runs for every pod, so
    /// every pod needs Multus.
    #[serde(skip_serializing_if = "Field::is_absent")]
    pub multus_auxiliary_chain: Field<String>,
    /// libcni's: the capability arguments the runtime may pass. The guard does not read it.
    #[serde(skip_serializing_if = "Field::is_absent")]
    pub capabilities: Field<Map<String, Value>>,
    #[serde(skip_serializing)]
    pub runtime_config: Field<Map<String, Value>>,
    #[serde(skip_serializing)]
    pub prev_result: Field<Map<String, Value>>,
    #[serde(skip_serializing)]
    pub args: Field<Map<String, Value>>,
    /// GC's list of attachments still in use, as libcni names it.
    #[serde(rename = "cni.dev/valid-attachments", skip_serializing)]
    pub valid_attachments: Field<Vec<Value>>,
    /// The same list as the spec names it, read when libcni's name is absent.
    #[serde(rename = "cni.dev/attachments", skip_serializing)]
    pub gc_attachments: Field<Vec<Value>>,
}

/// One key's value as the schema decodes it.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum Field<T> {
    #[default]
    Absent,
    Null,
    Is(T),
    /// A value of another JSON type than the key's.
    Wrong(Value),
}

impl<T> Field<T> {
    pub fn is_absent(&self) -> bool {
        matches!(self, Field::Absent)
    }

    /// `None` when absent or null (the key's default applies); `Err` when of the wrong type.
    fn given(self) -> std::result::Result<Option<T>, Value> {
        match self {
            Field::Absent | Field::Null => Ok(None),
            Field::Is(value) => Ok(Some(value)),
            Field::Wrong(value) => Err(value),
        }
    }
}

/// The JSON types a key can have.
pub trait JsonType: Sized {
    /// The value as this type, or back unchanged when it is another.
    fn from_json(value: Value) -> std::result::Result<Self, Value>;
}

macro_rules! json_type {
    ($type:ty, $variant:ident) => {
        impl JsonType for $type {
            fn from_json(value: Value) -> std::result::Result<Self, Value> {
                match value {
                    Value::$variant(v) => Ok(v),
                    other => Err(other),
                }
            }
        }
    };
}
json_type!(String, String);
json_type!(Number, Number);
json_type!(bool, Bool);
json_type!(Vec<Value>, Array);
json_type!(Map<String, Value>, Object);

impl<'de, T: JsonType> Deserialize<'de> for Field<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        Ok(match Value::deserialize(d)? {
            Value::Null => Field::Null,
            value => T::from_json(value).map_or_else(Field::Wrong, Field::Is),
        })
    }
}

impl<T: Serialize> Serialize for Field<T> {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match self {
            Field::Is(value) => value.serialize(s),
            Field::Wrong(value) => value.serialize(s),
            Field::Absent | Field::Null => s.serialize_unit(),
        }
    }
}

/// A value [`Entry::validate`] refused, with the key it is under (`install` names its flag).
#[derive(Debug)]
pub struct Invalid {
    pub key: &'static str,
    pub error: Error,
}

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
    /// Checks every value, in a fixed order (the first problem is the one reported), and
    /// applies the defaults.
    pub fn validate(self) -> std::result::Result<GuardConfig, Invalid> {
        let cni_version = match self.cni_version {
            Field::Absent => return Err(invalid("cniVersion", "cniVersion is required")),
            Field::Is(v) if Version::guard_supported(&v) => v,
            other => {
                let shown = match other {
                    Field::Is(v) => Value::String(v),
                    Field::Wrong(v) => v,
                    Field::Absent | Field::Null => Value::Null,
                };
                return Err(Invalid {
                    key: "cniVersion",
                    error: Error::new(Kind::Unsupported, format!("unsupported cniVersion {shown}"))
                        .with_details(format!("cni-guard supports {}", SUPPORTED.join(", "))),
                });
            }
        };
        let name = string("name", self.name)?.ok_or_else(|| invalid("name", "name is required"))?;
        names::network_name(&name).map_err(|why| invalid("name", format!("network name {why}")))?;
        let plugin_type =
            string("type", self.plugin_type)?.unwrap_or_else(|| GUARD_TYPE.to_owned());
        let delegate = match string("delegate", self.delegate)? {
            Some(p) => absolute_path("delegate", "delegate", p)?,
            None => {
                return Err(invalid(
                    "delegate",
                    "delegate is required: the path of the real network's configuration",
                ))
            }
        };
        let delegate_writer = match string("delegateWriter", self.delegate_writer)? {
            Some(w) => Some(writer_name(w)?),
            None => None,
        };
        let attachments = match self.attachments.given() {
            Ok(None) => Vec::new(),
            Ok(Some(items)) => items
                .into_iter()
                .enumerate()
                .map(|(i, item)| match item {
                    Value::String(p) => {
                        absolute_path("attachments", &format!("attachments[{i}]"), p)
                    }
                    _ => Err(invalid(
                        "attachments",
                        format!("attachments[{i}] is not a string"),
                    )),
                })
                .collect::<std::result::Result<_, _>>()?,
            Err(_) => return Err(invalid("attachments", "attachments is not a list of paths")),
        };
        let sockets = match self.sockets.given() {
            Ok(None) => Vec::new(),
            Ok(Some(items)) => items
                .into_iter()
                .enumerate()
                .map(|(i, item)| match item {
                    Value::String(p) => absolute_path("sockets", &format!("sockets[{i}]"), p),
                    _ => Err(invalid("sockets", format!("sockets[{i}] is not a string"))),
                })
                .collect::<std::result::Result<_, _>>()?,
            Err(_) => return Err(invalid("sockets", "sockets is not a list of paths")),
        };
        let wait = WAIT.read(self.wait_seconds)?;
        let del_wait = match self.del_wait_seconds {
            Field::Absent | Field::Null => wait,
            given => DEL_WAIT.read(given)?,
        };
        let delegate_timeout = DELEGATE_TIMEOUT.read(self.delegate_timeout_seconds)?;
        let lock_wait = LOCK_WAIT.read(self.lock_wait_seconds)?;
        let status_timeout = STATUS_TIMEOUT.read(self.status_timeout_seconds)?;
        let cache_dir = match string("cacheDir", self.cache_dir)? {
            Some(p) => absolute_path("cacheDir", "cacheDir", p)?,
            None => PathBuf::from(DEFAULT_CACHE_DIR),
        };
        let strict_permissions = self
            .strict_permissions
            .given()
            .map_err(|_| invalid("strictPermissions", "strictPermissions is not a boolean"))?
            .unwrap_or(false);
        let per_pod = match string("perPodPrimary", self.per_pod_primary)? {
            None => None,
            Some(p) => Some(PerPod {
                primary: absolute_path("perPodPrimary", "perPodPrimary", p)?,
                default_networks: strings("multusDefaultNetworks", self.multus_default_networks)?
                    .unwrap_or_default(),
                system_namespaces: strings(
                    "multusSystemNamespaces",
                    self.multus_system_namespaces,
                )?
                .unwrap_or_else(|| vec![DEFAULT_MULTUS_SYSTEM_NAMESPACE.to_owned()]),
                auxiliary_chain: string("multusAuxiliaryChain", self.multus_auxiliary_chain)?
                    .filter(|c| !c.is_empty()),
            }),
        };
        let runtime_config = object("runtimeConfig", self.runtime_config)?.unwrap_or_default();
        let prev_result = object("prevResult", self.prev_result)?.map(Value::Object);
        let args = object("args", self.args)?;
        // GC forwards the runtime's lists exactly as sent (libcni sends both names; a runtime
        // that sends none asks for nothing to be kept, and the delegate is told nothing).
        let gc_attachments = [
            ("cni.dev/valid-attachments", &self.valid_attachments),
            ("cni.dev/attachments", &self.gc_attachments),
        ]
        .into_iter()
        .filter_map(|(key, field)| match field {
            Field::Absent => None,
            Field::Null => Some((key, Value::Null)),
            Field::Is(items) => Some((key, Value::Array(items.clone()))),
            Field::Wrong(v) => Some((key, v.clone())),
        })
        .collect();
        let valid_attachments = valid_attachments(if self.valid_attachments.is_absent() {
            self.gc_attachments
        } else {
            self.valid_attachments
        })?;
        Ok(GuardConfig {
            cni_version,
            name,
            plugin_type,
            delegate,
            delegate_writer,
            attachments,
            sockets,
            wait,
            del_wait,
            delegate_timeout,
            lock_wait,
            status_timeout,
            cache_dir,
            strict_permissions,
            per_pod,
            runtime_config,
            prev_result,
            args,
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
    /// How long one delegate plugin run as a child may take before it is killed.
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

/// Multus's own default for `systemNamespaces`.
pub const DEFAULT_MULTUS_SYSTEM_NAMESPACE: &str = "kube-system";

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

/// JSON's insignificant whitespace, which may come before the opening brace.
const JSON_WHITESPACE: [char; 4] = [' ', '\t', '\n', '\r'];

impl GuardConfig {
    pub fn version(&self) -> Version {
        Version::parse(&self.cni_version).expect("validated at parse time")
    }

    /// Parses the request configuration from stdin.
    pub fn parse(stdin: &[u8]) -> Result<GuardConfig> {
        Ok(decode(stdin)?.validate()?)
    }

    /// Loads the guard's entry from a conflist file, as the runtime would pass it (for
    /// `cni-guard check`). The first plugin of type `cni-guard` is taken.
    pub fn from_conflist_file(path: &Path) -> Result<GuardConfig> {
        let bytes = std::fs::read(path)
            .map_err(|e| Error::new(Kind::Io, format!("cannot read {}: {e}", path.display())))?;
        let cannot_decode = |e: serde_json::Error| {
            Error::new(
                Kind::BadInput,
                format!("cannot decode {}: {e}", path.display()),
            )
        };
        let value: Value = serde_json::from_slice(&bytes).map_err(cannot_decode)?;
        let list = value.as_object().ok_or_else(|| {
            Error::new(
                Kind::BadInput,
                format!("{} is not a JSON object", path.display()),
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
                Kind::Misconfigured,
                format!("{} has no plugin of type {GUARD_TYPE:?}", path.display()),
            )
        })?;
        for key in ["name", "cniVersion"] {
            if let Some(v) = list.get(key) {
                obj.insert(key.into(), v.clone());
            }
        }
        let entry = Entry::deserialize(Value::Object(obj)).map_err(cannot_decode)?;
        Ok(entry.validate()?)
    }
}

/// Decodes the entry on stdin.
///
/// The fast path takes UTF-8 text that opens an object and decodes it straight into the schema,
/// skipping the keys the schema does not name. Whatever it refuses is decoded again as one whole
/// JSON value, as a plain parse does: a refusal keeps that parse's words, and an entry with a
/// key twice (which the schema refuses) is read with the last value, as a JSON object keeps it.
/// (Skipped keys are checked for JSON syntax only: a number out of range or nesting past
/// serde_json's limit there does not refuse the entry.)
fn decode(stdin: &[u8]) -> Result<Entry> {
    if let Ok(text) = std::str::from_utf8(stdin) {
        if text.trim_start_matches(JSON_WHITESPACE).starts_with('{') {
            if let Ok(entry) = serde_json::from_str(text) {
                return Ok(entry);
            }
        }
    }
    let cannot_decode = |e: serde_json::Error| {
        Error::new(
            Kind::BadInput,
            format!("cannot decode the network configuration on stdin: {e}"),
        )
    };
    match serde_json::from_slice::<Value>(stdin).map_err(cannot_decode)? {
        object @ Value::Object(_) => Entry::deserialize(object).map_err(cannot_decode),
        _ => Err(Error::new(
            Kind::BadInput,
            "the network configuration on stdin is not a JSON object",
        )),
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

/// `cni.dev/valid-attachments` (libcni) or `cni.dev/attachments` (the spec's name).
fn valid_attachments(
    field: Field<Vec<Value>>,
) -> std::result::Result<Option<Vec<(String, String)>>, Invalid> {
    const KEY: &str = "cni.dev/valid-attachments";
    let items = match field {
        Field::Absent => return Ok(None),
        // libcni marshals an empty Go slice of valid attachments as null.
        Field::Null => return Ok(Some(Vec::new())),
        Field::Is(items) => items,
        Field::Wrong(_) => return Err(invalid(KEY, format!("{KEY} is not a list"))),
    };
    items
        .iter()
        .map(|item| {
            let id = item.get("containerID").and_then(Value::as_str);
            let ifname = item.get("ifname").and_then(Value::as_str);
            match (id, ifname) {
                (Some(id), Some(ifname)) => Ok((id.to_owned(), ifname.to_owned())),
                _ => Err(invalid(
                    KEY,
                    format!("{KEY} entries need containerID and ifname"),
                )),
            }
        })
        .collect::<std::result::Result<Vec<_>, _>>()
        .map(Some)
}

/// Upper bound on `delegateWriter`'s length, in characters: a component's name, not a text.
pub const MAX_WRITER_CHARS: usize = 64;

/// `delegateWriter`: a name said inside a one-line refusal, so no control characters (the
/// runtime logs it and kubelet shows it in an event), not empty, and short.
fn writer_name(name: String) -> std::result::Result<String, Invalid> {
    const KEY: &str = "delegateWriter";
    if name.trim().is_empty() {
        return Err(invalid(KEY, format!("{KEY} is empty")));
    }
    if name.chars().count() > MAX_WRITER_CHARS {
        return Err(invalid(
            KEY,
            format!("{KEY} is longer than {MAX_WRITER_CHARS} characters"),
        ));
    }
    if name.chars().any(char::is_control) {
        return Err(invalid(
            KEY,
            format!("{KEY} {name:?} has a control character"),
        ));
    }
    Ok(name)
}

fn string(key: &'static str, field: Field<String>) -> std::result::Result<Option<String>, Invalid> {
    field
        .given()
        .map_err(|_| invalid(key, format!("{key} is not a string")))
}

/// A list of non-empty strings.
fn strings(
    key: &'static str,
    field: Field<Vec<Value>>,
) -> std::result::Result<Option<Vec<String>>, Invalid> {
    let not_strings = || invalid(key, format!("{key} is not a list of names"));
    match field.given() {
        Ok(None) => Ok(None),
        Ok(Some(items)) => items
            .into_iter()
            .map(|v| match v {
                Value::String(s) if !s.is_empty() => Ok(s),
                _ => Err(not_strings()),
            })
            .collect::<std::result::Result<Vec<_>, _>>()
            .map(Some),
        Err(_) => Err(not_strings()),
    }
}

fn object(
    key: &'static str,
    field: Field<Map<String, Value>>,
) -> std::result::Result<Option<Map<String, Value>>, Invalid> {
    field
        .given()
        .map_err(|_| invalid(key, format!("{key} is not an object")))
}

/// `label` names the value in the message (`attachments[2]`), `key` its key.
fn absolute_path(
    key: &'static str,
    label: &str,
    p: String,
) -> std::result::Result<PathBuf, Invalid> {
    if !p.starts_with('/') {
        return Err(invalid(
            key,
            format!("{label} {p:?} is not an absolute path"),
        ));
    }
    if p.bytes().any(|b| b.is_ascii_control()) {
        return Err(invalid(
            key,
            format!("{label} {p:?} contains control characters"),
        ));
    }
    Ok(PathBuf::from(p))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::Command;
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

    /// The words of every refusal, as the plugin has always given them.
    #[test]
    fn errors_say_which_key_and_why() {
        let cases: Vec<(&str, Value, u32, &str)> = vec![
            ("cniVersion", json!("9.9.9"), 1, "unsupported cniVersion \"9.9.9\""),
            ("cniVersion", json!(null), 1, "unsupported cniVersion null"),
            ("cniVersion", json!({"a": [1]}), 1, "unsupported cniVersion {\"a\":[1]}"),
            ("name", json!(5), 7, "name is not a string"),
            ("name", json!(null), 7, "name is required"),
            ("name", json!("a/b"), 7, "network name \"a/b\" must start with a letter or digit, contain only letters, digits, '_', '.', '-', and be at most 200 characters"),
            ("type", json!(1), 7, "type is not a string"),
            ("delegate", json!(7), 7, "delegate is not a string"),
            ("delegate", json!(null), 7, "delegate is required: the path of the real network's configuration"),
            ("delegate", json!("x.conf"), 7, "delegate \"x.conf\" is not an absolute path"),
            ("delegate", json!("/x\u{1}"), 7, "delegate \"/x\\u{1}\" contains control characters"),
            ("delegateWriter", json!(1), 7, "delegateWriter is not a string"),
            ("delegateWriter", json!(" "), 7, "delegateWriter is empty"),
            ("delegateWriter", json!("a\nb"), 7, "delegateWriter \"a\\nb\" has a control character"),
            ("delegateWriter", json!("x".repeat(65)), 7, "delegateWriter is longer than 64 characters"),
            ("attachments", json!({"a": 1}), 7, "attachments is not a list of paths"),
            ("attachments", json!(["/a", 1]), 7, "attachments[1] is not a string"),
            ("attachments", json!(["/a", "b"]), 7, "attachments[1] \"b\" is not an absolute path"),
            ("waitSeconds", json!("5"), 7, "waitSeconds is not a number"),
            ("waitSeconds", json!(1e9), 7, "waitSeconds 1000000000.0 is outside 0..600"),
            ("waitSeconds", json!(-1), 7, "waitSeconds -1 is outside 0..600"),
            ("delWaitSeconds", json!(601), 7, "delWaitSeconds 601 is outside 0..600"),
            ("delWaitSeconds", json!("60"), 7, "delWaitSeconds is not a number"),
            ("delegateTimeoutSeconds", json!(0), 7, "delegateTimeoutSeconds 0 is outside (0, 600]"),
            ("delegateTimeoutSeconds", json!(true), 7, "delegateTimeoutSeconds is not a number"),
            ("lockWaitSeconds", json!(600.5), 7, "lockWaitSeconds 600.5 is outside 0..600"),
            ("lockWaitSeconds", json!([]), 7, "lockWaitSeconds is not a number"),
            ("cacheDir", json!("var/lib"), 7, "cacheDir \"var/lib\" is not an absolute path"),
            ("cacheDir", json!(false), 7, "cacheDir is not a string"),
            ("strictPermissions", json!("yes"), 7, "strictPermissions is not a boolean"),
            ("runtimeConfig", json!([]), 7, "runtimeConfig is not an object"),
            ("prevResult", json!("x"), 7, "prevResult is not an object"),
            ("args", json!(1), 7, "args is not an object"),
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
    fn the_first_problem_in_key_order_is_reported() {
        let v = json!({"cniVersion":"1.0.0","waitSeconds":"x","delegate":5,"name":"n"});
        assert_eq!(parse(v).unwrap_err().msg(), "delegate is not a string");
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
        assert_eq!(c.delegate_timeout, Duration::from_secs(120));
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
            (&WAIT, MAX_WAIT_SECONDS),
            (&DEL_WAIT, MAX_WAIT_SECONDS),
            (&DELEGATE_TIMEOUT, MAX_DELEGATE_TIMEOUT_SECONDS),
            (&LOCK_WAIT, MAX_LOCK_WAIT_SECONDS),
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
    fn an_entry_serialises_only_what_it_holds() {
        let entry = Entry {
            cni_version: Field::Is("1.0.0".into()),
            plugin_type: Field::Is(GUARD_TYPE.into()),
            wait_seconds: Field::Is(5.into()),
            strict_permissions: Field::Null,
            runtime_config: Field::Is(Map::new()),
            ..Entry::default()
        };
        assert_eq!(
            serde_json::to_value(&entry).unwrap(),
            json!({"type": "cni-guard", "waitSeconds": 5, "strictPermissions": null})
        );
        let back: Entry = serde_json::from_value(json!({"type":"cni-guard","waitSeconds":5,
            "strictPermissions":null,"delegate":[1]}))
        .unwrap();
        assert_eq!(back.wait_seconds, Field::Is(5.into()));
        assert_eq!(back.strict_permissions, Field::Null);
        assert_eq!(back.delegate, Field::Wrong(json!([1])));
        assert_eq!(back.cache_dir, Field::Absent);
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
