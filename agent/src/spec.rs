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
use serde_json::{Map, Number, Value};

use crate::{Flags, SPEC_VERSIONS};
use cni_guard::config::{
    Entry, GuardConfig, Seconds, DELEGATE_TIMEOUT, DEL_WAIT, LOCK_WAIT, STATUS_TIMEOUT, WAIT,
};
use cni_guard::error::{Kind, Result};

pub const DEFAULT_CONF_NAME: &str = "00-cni-guard.conflist";
pub const DEFAULT_NETWORK_NAME: &str = "guarded-pod-network";
pub const DEFAULT_CNI_VERSION: &str = "1.0.0";
pub use cni_guard::config::DEFAULT_CACHE_DIR;
/// The plugin's type, and so its file name in the CNI bin dir.
pub use cni_guard::config::GUARD_TYPE as PLUGIN_TYPE;

pub const SPEC_FLAGS_HELP: &str = "\
Where this process writes (a path as mounted in this container):
  --conf-dir DIR         the CNI conf dir containerd reads, e.g. /host/etc/cni/net.d (required)
  --conf-name NAME       the guard's file name; must sort first [00-cni-guard.conflist]

Written into the conflist (host paths, as the plugin sees them when containerd runs it):
  --delegate FILE        the real network's config, e.g. /etc/cni/net.d/00-multus.conf (required)
  --delegate-writer NAME who writes that file, e.g. Multus: a refusal while it is missing then
                         says \"does not exist (written by NAME)\"
  --attachment FILE      a config the delegate needs, e.g. /etc/cni/multus/net.d/05-cilium.conflist
                         (repeatable)
  --socket FILE          a unix socket that must accept connections, e.g. Multus's
                         /run/multus/multus.sock (repeatable)
  --cache-dir DIR        where the plugin keeps its ADD records [/var/lib/cni/cni-guard]

Conflist settings:
  --network-name NAME    the guard network's name [guarded-pod-network]
  --cni-version V        the conflist's cniVersion [1.0.0]
  --wait-seconds N       how long ADD waits for the delegate before refusing [60]
  --del-wait-seconds N   how long a DEL waits for the delegate it recorded before running it
                         anyway (a daemon's client may answer success for a DEL it never ran)
                         [40, whatever --wait-seconds says]
  --delegate-timeout-seconds N
                         one deadline for all of a verb's delegate plugins run as the guard's
                         children, rollback included [plugin default: 40]
  --lock-wait-seconds N  bound on waiting for another guard process on the same attachment
                         [plugin default: 10]
  --status-timeout-seconds N
                         bound on the delegate's STATUS (cniVersion 1.1.0) [plugin default: 3]
  --capability NAME      a runtime capability to accept and pass on, e.g. portMappings
                         (repeatable)
  --strict-permissions   refuse delegate and attachment files writable by group or others

Per-pod awareness (opt-in): while the delegate is not ready, a pod that asks for no Multus
network gets the primary network at once; only pods that need Multus are refused. Declares the
capability io.kubernetes.cri.pod-annotations. The daemon-side Multus keys are not in
00-multus.conf: give them here as Multus's daemon-config has them.
  --per-pod-primary FILE the primary network (Multus's clusterNetwork file), e.g.
                         /etc/cni/multus/net.d/05-cilium.conflist
  --multus-default-network NAME
                         one of Multus's defaultNetworks (repeatable)
  --multus-system-namespace NS
                         one of Multus's systemNamespaces (repeatable) [kube-system]
  --multus-auxiliary-chain NAME
                         Multus's auxiliaryCNIChainName: every pod then needs Multus
";

/// What a conflist flag takes.
#[derive(Debug)]
enum Takes {
    Text,
    /// A host path, written as given.
    Path,
    /// A host path, one more item of a list (repeatable).
    ListedPath,
    /// A name, one more item of a list (repeatable).
    ListedText,
    /// Whole seconds within the key's bounds.
    Seconds(&'static Seconds),
    /// A bare switch: `true`.
    Switch,
    /// A capability name, one more `name: true` of an object (repeatable).
    Capability,
}

/// The conflist flags, and the key of the guard's entry each one sets. `take_flag` knows no
/// others, and a test proves that they are the schema's keys ([`Entry`]) less those the runtime
/// adds and `type`, each once.
const KEY_FLAGS: [(&str, &str, Takes); 18] = [
    ("--network-name", "name", Takes::Text),
    ("--cni-version", "cniVersion", Takes::Text),
    ("--delegate", "delegate", Takes::Path),
    ("--delegate-writer", "delegateWriter", Takes::Text),
    ("--attachment", "attachments", Takes::ListedPath),
    ("--socket", "sockets", Takes::ListedPath),
    ("--cache-dir", "cacheDir", Takes::Path),
    ("--wait-seconds", WAIT.key, Takes::Seconds(&WAIT)),
    (
        "--del-wait-seconds",
        DEL_WAIT.key,
        Takes::Seconds(&DEL_WAIT),
    ),
    (
        "--delegate-timeout-seconds",
        DELEGATE_TIMEOUT.key,
        Takes::Seconds(&DELEGATE_TIMEOUT),
    ),
    (
        "--lock-wait-seconds",
        LOCK_WAIT.key,
        Takes::Seconds(&LOCK_WAIT),
    ),
    (
        "--status-timeout-seconds",
        STATUS_TIMEOUT.key,
        Takes::Seconds(&STATUS_TIMEOUT),
    ),
    ("--strict-permissions", "strictPermissions", Takes::Switch),
    ("--capability", "capabilities", Takes::Capability),
    ("--per-pod-primary", "perPodPrimary", Takes::Path),
    (
        "--multus-default-network",
        "multusDefaultNetworks",
        Takes::ListedText,
    ),
    (
        "--multus-system-namespace",
        "multusSystemNamespaces",
        Takes::ListedText,
    ),
    (
        "--multus-auxiliary-chain",
        "multusAuxiliaryChain",
        Takes::Text,
    ),
];

/// How long ADD waits for the delegate in the conflist `install` and `keep` write, unless
/// `--wait-seconds` says otherwise (the plugin's own default, for a hand-written conflist, is 0).
/// Measured on the real node: with 0, a pod created while Multus restarts runs 12-13 s after
/// Multus is back (kubelet's back-off); with a wait it runs within about a second (the inotify
/// wake-up). 60 s covers a Multus restart and, with the delegate's deadline (40 s) and the lock
/// wait (10 s), ends within 110 s, well under kubelet's four-minute RunPodSandbox deadline.
pub const INSTALL_WAIT_SECONDS: u64 = 60;

/// How long a DEL waits for the delegate it recorded in the conflist `install` and `keep` write,
/// unless `--del-wait-seconds` says otherwise; not tied to `--wait-seconds` (the plugin's own
/// default, for a hand-written conflist, is `waitSeconds`). A guard that refuses ADD at once
/// (`--wait-seconds=0`) must still not tear a pod down past an absent Multus: multus-shim
/// answers success for a DEL its daemon never ran, and the pod's secondary IPs would leak.
/// Seen on the real node (Cilium under Multus, pods deleted while Multus restarted): with no
/// DEL wait one churn run left three net1 leases. The wait holds a pod's deletion, never a new
/// pod; it ends the moment Multus is back (inotify), and a DEL the runtime gives up on keeps
/// its record, so the retried DEL still tears down.
/// 40 s: with the lock wait (10 s) and the delegate's own deadline (40 s) a DEL ends within
/// 90 s, well inside kubelet's 2-minute StopPodSandbox deadline (a Multus restart takes 10-14 s
/// here).
pub const INSTALL_DEL_WAIT_SECONDS: u64 = 40;

/// The flag that sets `key`, for messages; the key itself when no flag does.
fn flag_for(key: &str) -> &str {
    KEY_FLAGS
        .iter()
        .find(|(_, k, _)| *k == key)
        .map_or(key, |(flag, _, _)| flag)
}

/// Everything that determines the guard's conflist and where it goes.
#[derive(Debug, Clone)]
pub struct GuardFile {
    pub conf_dir: Option<PathBuf>,
    pub conf_name: String,
    /// The entry's keys as the flags gave them; [`GuardFile::entry`] adds the defaults.
    keys: Map<String, Value>,
}

impl Default for GuardFile {
    fn default() -> Self {
        GuardFile {
            conf_dir: None,
            conf_name: DEFAULT_CONF_NAME.to_string(),
            keys: Map::new(),
        }
    }
}

/// The file: the entry's `cniVersion` and `name` at the top, the entry the one plugin.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Conflist<'a> {
    cni_version: &'a Value,
    name: &'a Value,
    plugins: [Ordered<'a>; 1],
}

/// The entry's keys in the order the file has them (the schema's).
const ENTRY_ORDER: [&str; 17] = [
    "type",
    "delegate",
    "delegateWriter",
    "attachments",
    "sockets",
    "waitSeconds",
    "delWaitSeconds",
    "delegateTimeoutSeconds",
    "lockWaitSeconds",
    "statusTimeoutSeconds",
    "cacheDir",
    "strictPermissions",
    "perPodPrimary",
    "multusDefaultNetworks",
    "multusSystemNamespaces",
    "multusAuxiliaryChain",
    "capabilities",
];

/// An object whose keys are written in the order given.
struct Ordered<'a>(Vec<(&'a str, &'a Value)>);

impl Serialize for Ordered<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

impl GuardFile {
    /// Takes `flag` if it is one of the conflist flags; `Ok(false)` when it is not.
    pub fn take_flag(&mut self, flag: &str, flags: &mut Flags) -> Result<bool> {
        match flag {
            "--conf-dir" => self.conf_dir = Some(flags.path(flag)?),
            "--conf-name" => self.conf_name = flags.value(flag)?,
            _ => {
                let Some((_, key, takes)) = KEY_FLAGS.iter().find(|(f, _, _)| *f == flag) else {
                    return Ok(false);
                };
                let key = key.to_string();
                match takes {
                    Takes::Text => {
                        self.keys.insert(key, flags.value(flag)?.into());
                    }
                    Takes::Path => {
                        self.keys.insert(key, path(flags, flag)?.into());
                    }
                    Takes::ListedPath | Takes::ListedText => {
                        let item = if matches!(takes, Takes::ListedPath) {
                            path(flags, flag)?.into()
                        } else {
                            let name = flags.value(flag)?;
                            if name.is_empty() {
                                return Err(crate::usage_error(format!(
                                    "{flag} {name:?}: empty name"
                                )));
                            }
                            name.into()
                        };
                        match self
                            .keys
                            .entry(key)
                            .or_insert_with(|| Value::Array(Vec::new()))
                        {
                            Value::Array(items) => items.push(item),
                            other => *other = Value::Array(vec![item]),
                        }
                    }
                    Takes::Seconds(bounds) => {
                        let value = flags.value(flag)?;
                        let seconds: u64 = value
                            .parse()
                            .ok()
                            .filter(|s| bounds.allows(*s as f64))
                            .ok_or_else(|| {
                                crate::usage_error(format!(
                                    "{flag}: {value:?} is not a whole number from {} to {}",
                                    if bounds.zero { 0 } else { 1 },
                                    bounds.max
                                ))
                            })?;
                        self.keys.insert(key, Number::from(seconds).into());
                    }
                    Takes::Switch => {
                        self.keys.insert(key, true.into());
                    }
                    Takes::Capability => {
                        let name = flags.value(flag)?;
                        if name.is_empty() {
                            return Err(crate::usage_error(format!("{flag} {name:?}: empty name")));
                        }
                        match self
                            .keys
                            .entry(key)
                            .or_insert_with(|| Value::Object(Map::new()))
                        {
                            Value::Object(names) => {
                                names.insert(name, true.into());
                            }
                            other => *other = serde_json::json!({ name: true }),
                        }
                    }
                }
            }
        }
        Ok(true)
    }

    /// The cache dir the conflist names (a host path).
    pub fn cache_dir(&self) -> PathBuf {
        PathBuf::from(
            self.keys
                .get("cacheDir")
                .and_then(Value::as_str)
                .unwrap_or(DEFAULT_CACHE_DIR),
        )
    }

    /// The entry's keys: the flags' over the defaults.
    fn keys(&self) -> Map<String, Value> {
        let mut keys = Map::new();
        keys.insert("cniVersion".into(), DEFAULT_CNI_VERSION.into());
        keys.insert("name".into(), DEFAULT_NETWORK_NAME.into());
        keys.insert("type".into(), PLUGIN_TYPE.into());
        keys.insert("attachments".into(), Value::Array(Vec::new()));
        keys.insert(WAIT.key.into(), INSTALL_WAIT_SECONDS.into());
        keys.insert(DEL_WAIT.key.into(), INSTALL_DEL_WAIT_SECONDS.into());
        keys.insert("cacheDir".into(), DEFAULT_CACHE_DIR.into());
        keys.extend(self.keys.clone());
        // Per-pod awareness reads the pod's annotations, which the runtime passes only to a
        // plugin that declares the capability.
        if keys.contains_key("perPodPrimary") {
            match keys
                .entry("capabilities")
                .or_insert_with(|| Value::Object(Map::new()))
            {
                Value::Object(names) => {
                    names.insert(cni_guard::perpod::POD_ANNOTATIONS.to_owned(), true.into());
                }
                other => *other = serde_json::json!({ cni_guard::perpod::POD_ANNOTATIONS: true }),
            }
        }
        keys
    }

    /// The entry to write, as the plugin decodes it.
    fn entry(&self) -> Entry {
        // Cannot fail: every flag gives its key a value of the schema's type.
        Entry::from_value(Value::Object(self.keys())).expect("the flags' keys decode as an entry")
    }

    /// Checks the flags together, by the plugin's own rules; returns the conf dir to write into.
    pub fn validate(&self) -> Result<&Path> {
        let conf_dir = self
            .conf_dir
            .as_deref()
            .ok_or_else(|| crate::usage_error("--conf-dir is required"))?;
        if !self.keys.contains_key("delegate") {
            return Err(crate::usage_error("--delegate is required"));
        }
        if !self.conf_name.ends_with(".conflist") || self.conf_name.contains('/') {
            return Err(crate::usage_error(format!(
                "--conf-name {:?}: must be a file name ending in .conflist",
                self.conf_name
            )));
        }
        if self.conf_name.starts_with('.') {
            return Err(crate::usage_error("--conf-name must not start with a dot"));
        }
        if let Err(invalid) = self.entry().validate() {
            let mut message = format!("{}: {}", flag_for(invalid.key), invalid.error.msg());
            if *invalid.error.kind() == Kind::Unsupported {
                message.push_str(&format!(" (supported are {})", SPEC_VERSIONS.join(", ")));
            }
            return Err(crate::usage_error(message));
        }
        Ok(conf_dir)
    }

    /// What the conflist's deadlines say against kubelet's ([`crate::budget::warnings`]), for
    /// `install` and `keep` to say loudly; empty when each verb ends in time.
    pub fn budget_warnings(&self) -> Vec<String> {
        let timeout = crate::budget::KUBELET_RUNTIME_REQUEST_TIMEOUT;
        self.entry()
            .validate()
            .map(|cfg: GuardConfig| crate::budget::warnings(&cfg, timeout))
            .unwrap_or_default()
    }

    /// The conflist's bytes: deterministic for the same flags, so an unchanged setup is
    /// recognised byte for byte and never rewritten.
    pub fn render(&self) -> Vec<u8> {
        let keys = self.keys();
        let entry = ENTRY_ORDER
            .iter()
            .filter_map(|k| keys.get(*k).map(|v| (*k, v)))
            .collect();
        let conflist = Conflist {
            cni_version: &keys["cniVersion"],
            name: &keys["name"],
            plugins: [Ordered(entry)],
        };
        let mut bytes =
            serde_json::to_vec_pretty(&conflist).expect("a JSON entry always serialises");
        bytes.push(b'\n');
        bytes
    }
}

/// A path flag's value, which must not be empty.
fn path(flags: &mut Flags, flag: &str) -> Result<String> {
    let value = flags.value(flag)?;
    if value.is_empty() {
        return Err(crate::usage_error(format!("{flag} needs a non-empty path")));
    }
    Ok(value)
}

/// Keys the runtime adds to the entry it passes on stdin; nothing writes them into the conflist.
#[cfg(test)]
const INJECTED_KEYS: [&str; 5] = [
    "runtimeConfig",
    "prevResult",
    "args",
    "cni.dev/valid-attachments",
    "cni.dev/attachments",
];

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::ffi::OsString;
    use std::time::Duration;

    use super::*;

    /// The schema's keys, as serde itself lists them for decoding.
    fn schema_keys() -> &'static [&'static str] {
        use serde::de::{self, Visitor};

        /// Records the field list serde passes to `deserialize_struct`, then stops.
        struct Probe<'a>(&'a mut &'static [&'static str]);
        impl<'de> serde::Deserializer<'de> for Probe<'_> {
            type Error = de::value::Error;
            fn deserialize_any<V: Visitor<'de>>(
                self,
                _: V,
            ) -> std::result::Result<V::Value, Self::Error> {
                Err(de::Error::custom("not a struct"))
            }
            fn deserialize_struct<V: Visitor<'de>>(
                self,
                _: &'static str,
                fields: &'static [&'static str],
                _: V,
            ) -> std::result::Result<V::Value, Self::Error> {
                *self.0 = fields;
                Err(de::Error::custom("probed"))
            }
            serde::forward_to_deserialize_any! {
                bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
                option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
                ignored_any
            }
        }
        let mut fields: &'static [&'static str] = &[];
        let _ = <cni_guard::config::Entry as serde::Deserialize>::deserialize(Probe(&mut fields));
        fields
    }

    /// A `GuardFile` from conflist flags, as `install` and `keep` build it.
    fn file(args: &[&str]) -> Result<GuardFile> {
        let mut flags = Flags::new(args.iter().map(OsString::from).collect());
        let mut spec = GuardFile::default();
        while let Some(flag) = flags.next_flag()? {
            if !spec.take_flag(&flag, &mut flags)? {
                return Err(Flags::unknown(&flag));
            }
        }
        Ok(spec)
    }

    const BASE: [&str; 2] = [
        "--conf-dir=/host/etc/cni/net.d",
        "--delegate=/etc/cni/net.d/00-multus.conf",
    ];

    fn with(extra: &[&str]) -> Result<GuardFile> {
        file(&[&BASE[..], extra].concat())
    }

    #[test]
    fn renders_the_contract_conflist_byte_for_byte() {
        let spec = with(&[
            "--attachment=/etc/cni/multus/net.d/05-cilium.conflist",
            "--capability=portMappings",
        ])
        .unwrap();
        spec.validate().unwrap();
        // The README's file: an existing install must find its conflist unchanged.
        let want = r#"{
  "cniVersion": "1.0.0",
  "name": "guarded-pod-network",
  "plugins": [
    {
      "type": "cni-guard",
      "delegate": "/etc/cni/net.d/00-multus.conf",
      "attachments": [
        "/etc/cni/multus/net.d/05-cilium.conflist"
      ],
      "waitSeconds": 60,
      "delWaitSeconds": 40,
      "cacheDir": "/var/lib/cni/cni-guard",
      "capabilities": {
        "portMappings": true
      }
    }
  ]
}
"#;
        assert_eq!(String::from_utf8(spec.render()).unwrap(), want);
    }

    #[test]
    fn optional_keys_are_written_only_when_asked_for() {
        let plugin = |spec: &GuardFile| {
            let v: Value = serde_json::from_slice(&spec.render()).unwrap();
            v["plugins"][0].clone()
        };
        let spec = with(&[]).unwrap();
        for key in [
            "strictPermissions",
            "delegateTimeoutSeconds",
            "lockWaitSeconds",
            "capabilities",
            "delegateWriter",
        ] {
            assert!(plugin(&spec).get(key).is_none(), "{key}");
        }
        let spec = with(&["--delegate-writer", "Multus"]).unwrap();
        assert_eq!(plugin(&spec)["delegateWriter"], "Multus");
        let spec = with(&["--strict-permissions", "--lock-wait-seconds=0"]).unwrap();
        assert_eq!(plugin(&spec)["strictPermissions"], true);
        assert_eq!(plugin(&spec)["lockWaitSeconds"], 0);
    }

    #[test]
    fn the_plugin_reads_back_what_is_rendered() {
        let spec = with(&[
            "--attachment=/etc/cni/multus/net.d/05-cilium.conflist",
            "--attachment=/etc/cni/multus/net.d/10-macvlan.conflist",
            "--wait-seconds=7",
            "--del-wait-seconds=0",
            "--delegate-timeout-seconds=30",
            "--lock-wait-seconds",
            "3",
            "--status-timeout-seconds=2",
            "--cache-dir=/var/lib/cni/elsewhere",
            "--strict-permissions",
            "--network-name=guarded",
            "--cni-version=1.1.0",
            "--capability=portMappings",
            "--capability=bandwidth",
            "--delegate-writer=Multus",
        ])
        .unwrap();
        spec.validate().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(&spec.conf_name);
        std::fs::write(&path, spec.render()).unwrap();
        let cfg = crate::check::load_conflist(&path).unwrap();
        assert_eq!(cfg.delegate, PathBuf::from("/etc/cni/net.d/00-multus.conf"));
        assert_eq!(
            cfg.attachments,
            [
                PathBuf::from("/etc/cni/multus/net.d/05-cilium.conflist"),
                PathBuf::from("/etc/cni/multus/net.d/10-macvlan.conflist")
            ]
        );
        assert_eq!(cfg.wait, Duration::from_secs(7));
        assert_eq!(cfg.del_wait, Duration::ZERO);
        assert_eq!(cfg.delegate_timeout, Duration::from_secs(30));
        assert_eq!(cfg.lock_wait, Duration::from_secs(3));
        assert_eq!(cfg.status_timeout, Duration::from_secs(2));
        assert_eq!(cfg.cache_dir, PathBuf::from("/var/lib/cni/elsewhere"));
        assert!(cfg.strict_permissions);
        assert_eq!(cfg.delegate_writer.as_deref(), Some("Multus"));
        assert_eq!(cfg.name, "guarded");
        assert_eq!(cfg.cni_version, "1.1.0");
        assert_eq!(cfg.plugin_type, PLUGIN_TYPE);
        let v: Value = serde_json::from_slice(&spec.render()).unwrap();
        assert_eq!(
            v["plugins"][0]["capabilities"],
            serde_json::json!({"bandwidth": true, "portMappings": true})
        );
    }

    #[test]
    fn every_schema_key_has_one_flag_and_every_flag_a_key() {
        let flag_keys: Vec<&str> = KEY_FLAGS.iter().map(|(_, key, _)| *key).collect();
        let unique: BTreeSet<&str> = flag_keys.iter().copied().collect();
        assert_eq!(unique.len(), flag_keys.len(), "a key with two flags");
        let written: BTreeSet<&str> = schema_keys()
            .iter()
            .copied()
            .filter(|k| !INJECTED_KEYS.contains(k) && *k != "type")
            .collect();
        assert_eq!(unique, written);
        // The file writes the entry's keys in the schema's order, every one of them.
        let ordered: Vec<&str> = schema_keys()
            .iter()
            .copied()
            .filter(|k| !INJECTED_KEYS.contains(k) && !["cniVersion", "name"].contains(k))
            .collect();
        assert_eq!(ordered, ENTRY_ORDER);
        for (flag, key, takes) in &KEY_FLAGS {
            if let Takes::Seconds(bounds) = takes {
                assert_eq!(bounds.key, *key, "{flag}");
            }
            assert!(
                SPEC_FLAGS_HELP.contains(&format!("  {flag} ")),
                "{flag} in help"
            );
        }
    }

    #[test]
    fn every_flag_reaches_the_rendered_conflist() {
        let args: Vec<String> = KEY_FLAGS
            .iter()
            .map(|(flag, _, takes)| match takes {
                Takes::Text if *flag == "--cni-version" => format!("{flag}=1.1.0"),
                Takes::Text => format!("{flag}=n"),
                Takes::Path | Takes::ListedPath => format!("{flag}=/p"),
                Takes::ListedText => format!("{flag}=n"),
                Takes::Seconds(_) => format!("{flag}=9"),
                Takes::Switch => flag.to_string(),
                Takes::Capability => format!("{flag}=c"),
            })
            .chain(std::iter::once("--conf-dir=/c".to_string()))
            .collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let spec = file(&args).unwrap();
        spec.validate().unwrap();
        let v: Value = serde_json::from_slice(&spec.render()).unwrap();
        for (flag, key, _) in &KEY_FLAGS {
            let value = v.get(key).or_else(|| v["plugins"][0].get(key));
            let given = match value {
                Some(Value::String(s)) => ["n", "/p", "1.1.0"].contains(&s.as_str()),
                Some(Value::Array(items)) => {
                    items == &[Value::from("/p")] || items == &[Value::from("n")]
                }
                Some(Value::Number(n)) => n.as_u64() == Some(9),
                Some(Value::Bool(b)) => *b,
                Some(Value::Object(names)) => names.contains_key("c"),
                _ => false,
            };
            assert!(given, "{flag} -> {key}: {v}");
        }
    }

    #[test]
    fn rejects_what_the_plugin_would_refuse_with_code_2() {
        with(&[]).unwrap().validate().unwrap();
        let bad: [(&[&str], &str); 14] = [
            (
                &["--delegate=d.conf"],
                "--delegate: delegate \"d.conf\" is not an absolute path",
            ),
            (
                &["--attachment=x"],
                "--attachment: attachments[0] \"x\" is not an absolute path",
            ),
            (
                &["--cache-dir=var/lib"],
                "--cache-dir: cacheDir \"var/lib\"",
            ),
            (&["--conf-name=00-guard.conf"], "--conf-name"),
            (
                &["--cni-version=2.0.0"],
                "--cni-version: unsupported cniVersion \"2.0.0\" (supported are 0.3.0,",
            ),
            (
                &["--network-name=a b"],
                "--network-name: network name \"a b\" must start",
            ),
            (
                &["--wait-seconds=601"],
                "--wait-seconds: \"601\" is not a whole number from 0 to 600",
            ),
            (&["--wait-seconds=1.5"], "--wait-seconds"),
            (
                &["--delegate-timeout-seconds=0"],
                "--delegate-timeout-seconds: \"0\" is not a whole number from 1 to 600",
            ),
            (
                &["--lock-wait-seconds=-1"],
                "--lock-wait-seconds: \"-1\" is not a whole number from 0 to 600",
            ),
            (&["--capability="], "--capability \"\": empty name"),
            (&["--delegate=/a\n"], "contains control characters"),
            (
                &["--delegate-writer="],
                "--delegate-writer: delegateWriter is empty",
            ),
            (
                &["--delegate-writer=Mul\ttus"],
                "--delegate-writer: delegateWriter \"Mul\\ttus\" has a control character",
            ),
        ];
        for (extra, want) in bad {
            let err = match with(extra) {
                Ok(spec) => spec.validate().map(|_| ()).unwrap_err(),
                Err(e) => e,
            };
            assert_eq!(crate::exit_code(&err), 2, "{extra:?}");
            assert!(err.msg().contains(want), "{extra:?}: {}", err.msg());
        }
        let no_conf_dir = file(&["--delegate=/d.conf"]).unwrap();
        assert!(no_conf_dir
            .validate()
            .unwrap_err()
            .msg()
            .contains("--conf-dir is required"));
        let no_delegate = file(&["--conf-dir=/c"]).unwrap();
        assert!(no_delegate
            .validate()
            .unwrap_err()
            .msg()
            .contains("--delegate is required"));
    }
}
