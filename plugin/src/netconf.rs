//! Loading the network configurations the guard depends on: the delegate and the attachments.
//!
//! A configuration is a single-plugin `.conf`/`.json` or a `.conflist`, decided by the file name
//! as libcni's `LoadConfList` decides it (a conflist inside a `.conf` is refused, as containerd
//! refuses it). Loading never blocks: FIFOs, sockets and devices are refused before anything
//! is read, and the size is bounded.
//!
//! What a file that is there can be: not JSON (perhaps still being written: [`Problem::NotYet`],
//! waited for), or whole JSON that no wait makes usable ([`Problem::Unusable`], code 7: its
//! writer must fix it), or one that names the guard ([`Problem::Recursion`]).

use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::config::GUARD_TYPE;
use crate::problem::Problem;
use crate::version::Version;

/// A CNI configuration never comes near this; a larger file is treated as broken.
pub const MAX_CONFIG_BYTES: u64 = 8 << 20;

/// A loaded network configuration, normalised to a list of plugins.
#[derive(Debug, Clone)]
pub struct NetworkConfig {
    pub path: PathBuf,
    pub name: String,
    pub cni_version: String,
    pub plugins: Vec<Map<String, Value>>,
    pub disable_check: bool,
    pub disable_gc: bool,
    /// The file's bytes, kept for the record written at ADD.
    pub raw: Vec<u8>,
    /// Group- or world-writable file (logged, or refused in strict mode).
    pub loosely_writable: bool,
}

fn unusable(reason: impl Into<String>) -> Problem {
    Problem::Unusable(reason.into())
}

impl NetworkConfig {
    pub fn version(&self) -> Version {
        Version::parse(&self.cni_version).expect("validated at load time")
    }

    pub fn types(&self) -> impl Iterator<Item = &str> {
        self.plugins
            .iter()
            .map(|p| p.get("type").and_then(Value::as_str).unwrap_or(""))
    }

    /// Reads and validates the file at `path`: refused as recursion when it names the guard, or
    /// when its Multus `clusterNetwork` is a guard configuration in its own folder
    /// ([`cluster_network_recursion`]).
    pub fn load(path: &Path, own_type: &str) -> Result<NetworkConfig, Problem> {
        let (raw, mode) = read_regular(path)?;
        let mut conf = Self::from_bytes(path, raw, own_type)?;
        conf.loosely_writable = mode & 0o022 != 0;
        cluster_network_recursion(&conf, own_type).map_or(Ok(conf), Err)
    }

    /// Validates configuration bytes (from a file, or from a record written at ADD).
    pub fn from_bytes(path: &Path, raw: Vec<u8>, own_type: &str) -> Result<NetworkConfig, Problem> {
        let value: Value = serde_json::from_slice(&raw).map_err(|e| {
            Problem::NotYet(format!(
                "is not valid JSON (perhaps still being written): {e}"
            ))
        })?;
        // Checked on the parsed value itself: a copy of a large configuration costs more than
        // parsing it did.
        if mentions_type(&value, own_type) {
            return Err(Problem::Recursion(format!(
                "names the {own_type:?} plugin itself: the guard would call itself (point the delegate at the real network, not at the guard's own configuration)"
            )));
        }
        let Value::Object(obj) = value else {
            return Err(unusable("is not a JSON object"));
        };
        let is_list = match path.extension().and_then(|e| e.to_str()).unwrap_or("") {
            "conflist" => true,
            "conf" | "json" => false,
            _ => obj.contains_key("plugins"),
        };
        // A single plugin's switches are not read.
        let switch = |key| bool_field(key, obj.get(key).filter(|_| is_list));
        let (disable_check, disable_gc) = (switch("disableCheck")?, switch("disableGC")?);
        let (name, cni_version, plugins) = match is_list {
            true => {
                let Some(Value::String(name)) = obj.get("name").filter(|n| n != &"") else {
                    return Err(unusable("has no network name"));
                };
                let Some(Value::Array(plugins)) = obj.get("plugins") else {
                    return Err(unusable("is a .conflist without a \"plugins\" list"));
                };
                if plugins.is_empty() {
                    return Err(unusable("has an empty plugin list"));
                }
                let plugins = plugins.iter().enumerate().map(|(i, p)| match p {
                    Value::Object(m) => check_type(m).map(|_| m.clone()),
                    _ => Err(unusable(format!("plugins[{i}] is not an object"))),
                });
                let plugins = plugins.collect::<Result<_, _>>()?;
                (name.clone(), list_version(&obj)?, plugins)
            }
            false if obj.contains_key("plugins") && !obj.contains_key("type") => {
                return Err(unusable(
                    "holds a plugin list but is not named .conflist (a .conf holds one plugin)",
                ))
            }
            false => {
                check_type(&obj)?;
                let name = obj
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned();
                (name, supported(obj.get("cniVersion"))?, vec![obj])
            }
        };
        Ok(NetworkConfig {
            path: path.to_owned(),
            name,
            cni_version,
            disable_check,
            disable_gc,
            plugins,
            raw,
            loosely_writable: false,
        })
    }
}

/// A `cniVersion` the guard can run a delegate at (absent: 0.1.0, as libcni reads it).
fn supported(v: Option<&Value>) -> Result<String, Problem> {
    match v {
        None => Ok("0.1.0".to_owned()),
        Some(Value::String(v)) if Version::delegate_supported(v) => Ok(v.clone()),
        Some(v) => Err(unusable(format!("has unsupported cniVersion {v}"))),
    }
}

/// `cniVersion`, or with 1.1's `cniVersions` the newest listed version the guard can run.
fn list_version(obj: &Map<String, Value>) -> Result<String, Problem> {
    let listed = obj.get("cniVersions").and_then(Value::as_array);
    let best = listed
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .filter(|v| Version::delegate_supported(v))
        .max_by_key(|v| Version::parse(v));
    best.map_or_else(|| supported(obj.get("cniVersion")), |v| Ok(v.to_owned()))
}

fn check_type(plugin: &Map<String, Value>) -> Result<(), Problem> {
    match plugin.get("type") {
        Some(Value::String(t)) if t.is_empty() => Err(unusable("names an empty plugin type")),
        Some(Value::String(t)) if t.contains('/') || t == "." || t == ".." => Err(unusable(
            format!("names plugin type {t:?}, which is not a plain file name"),
        )),
        Some(Value::String(_)) => Ok(()),
        _ => Err(unusable("has a plugin without a \"type\"")),
    }
}

/// A conflist's boolean switch as libcni reads it: absent is false; a boolean, or the string
/// "true" or "false" in any case; anything else makes the list invalid.
fn bool_field(key: &str, value: Option<&Value>) -> Result<bool, Problem> {
    match value {
        None => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(Value::String(s)) if s.eq_ignore_ascii_case("true") => Ok(true),
        Some(Value::String(s)) if s.eq_ignore_ascii_case("false") => Ok(false),
        Some(v) => Err(unusable(format!(
            "has {key} {v}, which is neither true nor false"
        ))),
    }
}

/// Whether any object anywhere in the configuration (Multus's inline `delegates` included) has
/// the guard's type.
fn mentions_type(v: &Value, own_type: &str) -> bool {
    match v {
        Value::Object(m) => {
            m.get("type")
                .and_then(Value::as_str)
                .is_some_and(|t| t == own_type || t == GUARD_TYPE)
                || m.values().any(|c| mentions_type(c, own_type))
        }
        Value::Array(items) => items.iter().any(|c| mentions_type(c, own_type)),
        _ => false,
    }
}

/// Multus's election of the guard as its cluster network: a plugin of `conf` (for a `.conf`, its
/// top level) whose string `clusterNetwork` has a base name that, in the folder holding `conf`,
/// is a configuration naming the guard (the same test as [`mentions_type`]). Multus thick with
/// `multusConfigFile: auto` and `multusAutoconfigDir` equal to containerd's conf dir writes
/// `"clusterNetwork": "/host/etc/cni/net.d/00-cni-guard.conflist"` once the guard's file sorts
/// first: it would run the guard for the primary network, from inside its own container, forever.
///
/// Only the base name counts: Multus sees the conf dir through its own mount (`/host/...`),
/// while the guard sees it where the delegate is. Anything else (not a string, no base name,
/// nothing readable there, not JSON, no guard in it) is not recursion; it is never waited for.
/// The file is read as the delegate is, bounded and without blocking.
fn cluster_network_recursion(conf: &NetworkConfig, own_type: &str) -> Option<Problem> {
    let dir = conf.path.parent()?;
    conf.plugins.iter().find_map(|plugin| {
        let named = plugin.get("clusterNetwork")?.as_str()?;
        // The delegate itself was tested when it loaded.
        let base = Path::new(named)
            .file_name()
            .filter(|b| Some(*b) != conf.path.file_name())?;
        let target = dir.join(base);
        let (raw, _) = read_regular(&target).ok()?;
        let value: Value = serde_json::from_slice(&raw).ok()?;
        mentions_type(&value, own_type).then(|| {
            Problem::Recursion(format!(
                "has Multus's clusterNetwork {named:?}, which is a {own_type} configuration ({}): Multus would run the guard for the primary network; pin \"multusMasterCNI\" in Multus's daemon config to the primary network's file, or point multusAutoconfigDir at a folder without the guard's file",
                target.display()
            ))
        })
    })
}

/// Opens without blocking or following into devices, checks it is a regular file, reads it.
/// Returns the bytes and the file's mode.
pub(crate) fn read_regular(path: &Path) -> Result<(Vec<u8>, u32), Problem> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| open_problem(path, &e))?;
    let meta = file
        .metadata()
        .map_err(|e| Problem::NotYet(format!("cannot be examined: {e}")))?;
    if let Some(why) = not_regular(meta.mode()) {
        return Err(Problem::NotYet(why.to_owned()));
    }
    // Never more than one byte past the bound, whatever size the file says it has.
    let mut raw = Vec::new();
    file.take(MAX_CONFIG_BYTES + 1)
        .read_to_end(&mut raw)
        .map_err(|e| Problem::NotYet(format!("cannot be read: {e}")))?;
    if raw.len() as u64 > MAX_CONFIG_BYTES {
        let mib = MAX_CONFIG_BYTES >> 20;
        return Err(Problem::NotYet(format!("is larger than {mib} MiB")));
    }
    Ok((raw, meta.mode()))
}

/// Why a file of this `st_mode` is not a configuration (each reason said once); `None` for a
/// regular file.
fn not_regular(mode: u32) -> Option<&'static str> {
    Some(match mode & libc::S_IFMT {
        libc::S_IFREG => return None,
        libc::S_IFDIR => "is a directory, not a regular file",
        libc::S_IFIFO => "is a FIFO, not a regular file",
        libc::S_IFSOCK => "is a socket, not a regular file",
        libc::S_IFCHR | libc::S_IFBLK => "is a device, not a regular file",
        _ => "is not a regular file",
    })
}

fn open_problem(path: &Path, e: &std::io::Error) -> Problem {
    let why = match e.raw_os_error() {
        Some(libc::ENOENT) if std::fs::symlink_metadata(path).is_err() => return Problem::Missing,
        Some(libc::ENOENT) => "is a dangling symlink",
        Some(libc::ELOOP) => "is a symlink loop",
        Some(libc::EACCES) => "is not readable (permission denied)",
        Some(libc::ENXIO) => "is a socket or device, not a regular file",
        Some(libc::ENOTDIR) => "has a parent that is not a directory",
        _ => return Problem::NotYet(format!("cannot be opened: {e}")),
    };
    Problem::NotYet(why.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Kind;

    fn load(name: &str, body: &str) -> Result<NetworkConfig, Problem> {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(name);
        std::fs::write(&p, body).unwrap();
        NetworkConfig::load(&p, "cni-guard")
    }

    #[test]
    fn loads_conf_and_conflist() {
        let c = load(
            "00-multus.conf",
            r#"{"cniVersion":"0.3.1","name":"multus","type":"multus-shim"}"#,
        )
        .unwrap();
        assert_eq!(c.name, "multus");
        assert_eq!(c.types().collect::<Vec<_>>(), ["multus-shim"]);
        let l = load(
            "05-cilium.conflist",
            r#"{"cniVersion":"1.0.0","name":"cilium","disableCheck":true,
                "plugins":[{"type":"cilium-cni"},{"type":"portmap"}]}"#,
        )
        .unwrap();
        assert_eq!(l.types().collect::<Vec<_>>(), ["cilium-cni", "portmap"]);
        assert!(l.disable_check);
        assert_eq!(l.version(), Version::V1_0_0);
    }

    #[test]
    fn picks_newest_of_cni_versions() {
        let l = load(
            "x.conflist",
            r#"{"cniVersions":["0.4.0","1.1.0","9.0.0"],"name":"n","plugins":[{"type":"a"}]}"#,
        )
        .unwrap();
        assert_eq!(l.cni_version, "1.1.0");
    }

    #[test]
    fn half_written_is_retryable() {
        let p = load("00-multus.conf", r#"{"cniVersion":"0.3.1","name":"mul"#).unwrap_err();
        assert_eq!(p.kind(), Kind::NotReady);
        assert!(p.to_string().contains("not valid JSON"), "{p}");
    }

    #[test]
    fn whole_but_unusable_files_are_misconfigurations() {
        for (name, body) in [
            ("a.conf", r#"{"cniVersion":"1.0.0","name":"n"}"#),
            (
                "a.conf",
                r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"x"}]}"#,
            ),
            (
                "a.conflist",
                r#"{"cniVersion":"1.0.0","name":"n","type":"x"}"#,
            ),
            (
                "a.conflist",
                r#"{"cniVersion":"1.0.0","name":"n","plugins":[]}"#,
            ),
            (
                "a.conflist",
                r#"{"cniVersion":"1.0.0","plugins":[{"type":"x"}]}"#,
            ),
            (
                "a.conflist",
                r#"{"cniVersion":"1.0.0","name":"n","plugins":[7]}"#,
            ),
            ("a.conf", r#"{"cniVersion":"1.0.0","type":"../bin/sh"}"#),
            ("a.conf", r#"{"cniVersion":"5.0.0","type":"x"}"#),
            ("a.conf", r#"[1,2]"#),
        ] {
            let p = load(name, body).unwrap_err();
            // Whole JSON: no wait makes it usable, so it is a misconfiguration (code 7).
            assert_eq!(p.kind(), Kind::Misconfigured, "{name} {body}");
        }
    }

    #[test]
    fn switches_are_read_as_libcni_reads_them() {
        let list = |v: &str| {
            NetworkConfig::from_bytes(
                Path::new("/x.conflist"),
                format!(r#"{{"cniVersion":"1.1.0","name":"n","disableCheck":{v},"disableGC":{v},"plugins":[{{"type":"p"}}]}}"#)
                    .into_bytes(),
                "cni-guard",
            )
        };
        for (v, want) in [
            ("true", true),
            ("false", false),
            ("\"TRUE\"", true),
            ("\"False\"", false),
        ] {
            let l = list(v).unwrap();
            assert_eq!((l.disable_check, l.disable_gc), (want, want), "{v}");
        }
        for v in ["\"yes\"", "1", "null"] {
            let p = list(v).unwrap_err();
            assert!(
                p.to_string().contains("neither true nor false"),
                "{v}: {}",
                p
            );
        }
    }

    #[test]
    fn recursion_is_fatal() {
        let p = load("a.conf", r#"{"cniVersion":"1.0.0","type":"cni-guard"}"#).unwrap_err();
        assert_eq!(p.kind(), Kind::Misconfigured);
        let p = load(
            "00-multus.conf",
            r#"{"cniVersion":"0.3.1","name":"m","type":"multus","delegates":[{"name":"g","plugins":[{"type":"cni-guard"}]}]}"#,
        )
        .unwrap_err();
        assert_eq!(p.kind(), Kind::Misconfigured, "{p}");
        // Multus thin's inline delegate object, of the guard's type itself.
        let p = load(
            "00-multus.conf",
            r#"{"cniVersion":"0.3.1","name":"m","type":"multus","delegates":[{"cniVersion":"0.3.1","name":"g","type":"cni-guard"}]}"#,
        )
        .unwrap_err();
        assert_eq!(p.kind(), Kind::Misconfigured, "{p}");
    }

    /// The guard's conflist as `cni-guard install` writes it, and Multus's auto-generated
    /// `00-multus.conf` with `clusterNetwork` as given (a JSON value), in one folder.
    struct MultusDir {
        dir: tempfile::TempDir,
    }

    const GUARD_LIST: &str = r#"{"cniVersion":"1.0.0","name":"cni-guard","plugins":[{"type":"cni-guard","delegate":"/etc/cni/net.d/00-multus.conf"}]}"#;

    impl MultusDir {
        fn new() -> MultusDir {
            let d = MultusDir {
                dir: tempfile::tempdir().unwrap(),
            };
            d.write("00-cni-guard.conflist", GUARD_LIST);
            d.write(
                "05-cilium.conflist",
                r#"{"cniVersion":"0.3.1","name":"cilium","plugins":[{"type":"cilium-cni"}]}"#,
            );
            d
        }
        fn write(&self, name: &str, body: &str) -> PathBuf {
            let p = self.dir.path().join(name);
            std::fs::write(&p, body).unwrap();
            p
        }
        fn multus(&self, cluster_network: Value) -> Result<NetworkConfig, Problem> {
            let body = serde_json::json!({"cniVersion":"1.0.0","name":"multus-cni-network",
                "clusterNetwork": cluster_network, "type":"multus-shim","logToStderr":true,
                "daemonSocketDir":"/run/multus"});
            let p = self.write("00-multus.conf", &body.to_string());
            NetworkConfig::load(&p, "cni-guard")
        }
    }

    #[test]
    fn cluster_network_naming_a_guard_file_is_recursion() {
        let d = MultusDir::new();
        let guard_file = d.dir.path().join("00-cni-guard.conflist");
        // As Multus writes it from inside its pod, and as a bare file name.
        for named in [
            "/host/etc/cni/net.d/00-cni-guard.conflist",
            "00-cni-guard.conflist",
        ] {
            let p = d.multus(Value::from(named)).unwrap_err();
            assert_eq!(p.kind(), Kind::Misconfigured, "{p}");
            let want = format!(
                "has Multus's clusterNetwork {named:?}, which is a cni-guard configuration ({}): Multus would run the guard for the primary network; pin \"multusMasterCNI\"",
                guard_file.display()
            );
            assert!(p.to_string().starts_with(&want), "{p}");
        }
        // A .conflist delegate with Multus as one of its plugins; and as an attachment (the
        // same load).
        let list = d.write(
            "00-multus.conflist",
            r#"{"cniVersion":"1.0.0","name":"m","plugins":[{"type":"multus-shim","clusterNetwork":"/host/etc/cni/net.d/00-cni-guard.conflist"}]}"#,
        );
        let p = NetworkConfig::load(&list, "cni-guard").unwrap_err();
        assert_eq!(p.kind(), Kind::Misconfigured, "{p}");
        // The guard under another type name: the type it was run as counts.
        d.write(
            "00-cni-guard.conflist",
            r#"{"cniVersion":"1.0.0","name":"g","plugins":[{"type":"guard-2"}]}"#,
        );
        let p = NetworkConfig::load(&list, "guard-2").unwrap_err();
        assert_eq!(p.kind(), Kind::Misconfigured, "{p}");
        assert!(NetworkConfig::load(&list, "cni-guard").is_ok());
    }

    #[test]
    fn cluster_network_naming_anything_else_is_not_recursion() {
        let d = MultusDir::new();
        let other = tempfile::tempdir().unwrap();
        let elsewhere = other.path().join("01-guard-elsewhere.conflist");
        std::fs::write(&elsewhere, GUARD_LIST).unwrap();
        nix::unistd::mkfifo(
            &d.dir.path().join("fifo.conflist"),
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .unwrap();
        std::fs::create_dir(d.dir.path().join("sub.conflist")).unwrap();
        d.write(
            "half.conflist",
            r#"{"cniVersion":"1.0.0","plugins":[{"type":"cni-gu"#,
        );
        for named in [
            // The primary network, as pinned with multusMasterCNI.
            Value::from("/host/etc/cni/net.d/05-cilium.conflist"),
            Value::from("05-cilium.conflist"),
            // A network name, no file.
            Value::from("cilium"),
            // Missing.
            Value::from("/host/etc/cni/net.d/07-gone.conflist"),
            // A guard file, but in another folder, and no file of that name here.
            Value::from(elsewhere.to_str().unwrap()),
            // Not a string.
            serde_json::json!(7),
            serde_json::json!(null),
            serde_json::json!(["00-cni-guard.conflist"]),
            serde_json::json!({"path": "00-cni-guard.conflist"}),
            // Nothing with a base name, the delegate itself, nothing readable as a config.
            Value::from(""),
            Value::from("/"),
            Value::from(".."),
            Value::from("00-multus.conf"),
            Value::from("fifo.conflist"),
            Value::from("sub.conflist"),
            Value::from("half.conflist"),
        ] {
            let conf = d.multus(named.clone());
            assert!(conf.is_ok(), "{named}: {:?}", conf.unwrap_err());
        }
    }

    #[test]
    fn refuses_non_regular_files() {
        let dir = tempfile::tempdir().unwrap();
        let p = NetworkConfig::load(dir.path(), "cni-guard").unwrap_err();
        assert_eq!(p.to_string(), "is a directory, not a regular file");
        let p = NetworkConfig::load(Path::new("/dev/zero"), "cni-guard").unwrap_err();
        assert_eq!(p.to_string(), "is a device, not a regular file");
        let fifo = dir.path().join("fifo.conf");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let p = NetworkConfig::load(&fifo, "cni-guard").unwrap_err();
        assert_eq!(p.to_string(), "is a FIFO, not a regular file");
        let missing = NetworkConfig::load(&dir.path().join("nope.conf"), "cni-guard").unwrap_err();
        assert_eq!(missing.to_string(), "does not exist");
        let link = dir.path().join("dangling.conf");
        std::os::unix::fs::symlink(dir.path().join("nowhere"), &link).unwrap();
        let p = NetworkConfig::load(&link, "cni-guard").unwrap_err();
        assert_eq!(p.to_string(), "is a dangling symlink");
        let a = dir.path().join("a.conf");
        let b = dir.path().join("b.conf");
        std::os::unix::fs::symlink(&b, &a).unwrap();
        std::os::unix::fs::symlink(&a, &b).unwrap();
        let p = NetworkConfig::load(&a, "cni-guard").unwrap_err();
        assert_eq!(p.to_string(), "is a symlink loop");
    }

    #[test]
    fn each_non_regular_kind_is_said_once() {
        for (kind, want) in [
            (libc::S_IFDIR, "is a directory, not a regular file"),
            (libc::S_IFIFO, "is a FIFO, not a regular file"),
            (libc::S_IFSOCK, "is a socket, not a regular file"),
            (libc::S_IFCHR, "is a device, not a regular file"),
            (libc::S_IFBLK, "is a device, not a regular file"),
            // A kind the guard has no word for (a symlink: an open that follows links never
            // returns one) used to read "is not a regular file, not a regular file".
            (libc::S_IFLNK, "is not a regular file"),
        ] {
            let why = not_regular(kind | 0o644).unwrap();
            assert_eq!(why, want);
            assert_eq!(why.matches("regular file").count(), 1, "{why}");
        }
        assert_eq!(not_regular(libc::S_IFREG | 0o644), None);
    }
}
