//! The guard's records: for each attachment made through the guard, the delegate configuration
//! it was made with, so DEL can tear it down after the delegate file is gone or has changed.
//!
//! Layout:
//!
//! ```text
//! <cacheDir>/                                  0700, a real directory owned by the guard's user
//!   <network>/                                 0700, one per guard network name
//!     <containerID>:<ifname>.json              0600, one record per attachment
//!     .<containerID>:<ifname>.json.<pid>.tmp   a record being written by process <pid>
//! ```
//!
//! `:` can appear in neither a container ID nor an interface name (both validated before they
//! reach a path), so the file name is unambiguous. A record is written to a temp file in the
//! same directory and renamed into place, so a reader sees the old record or the new one, never
//! a part. There is no fsync: records are written on every pod start, the page cache outlives a
//! killed process, and libcni and Multus do not fsync their caches either. A temp file left by a
//! killed writer is removed by the next writer of the same record, and by GC.
//!
//! A record file holds `{"containerID", "ifname", "network", "cniVersion", "delegatePath",
//! "delegate"}`, `delegate` being the delegate file's JSON as it was at ADD.

use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::error::{code, Error, Result};
use crate::sys;

const MAX_RECORD_BYTES: u64 = 16 << 20;

/// What DEL needs to know about an attachment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub container_id: String,
    pub ifname: String,
    pub network: String,
    pub cni_version: String,
    pub delegate_path: PathBuf,
    /// The delegate configuration's bytes, as loaded at ADD.
    pub delegate: Vec<u8>,
}

#[derive(Deserialize)]
struct RecordFile {
    #[serde(rename = "containerID")]
    container_id: String,
    ifname: String,
    network: String,
    #[serde(rename = "cniVersion")]
    cni_version: String,
    #[serde(rename = "delegatePath")]
    delegate_path: PathBuf,
    delegate: Box<RawValue>,
}

impl Record {
    /// The record file's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let header = serde_json::json!({
            "containerID": self.container_id,
            "ifname": self.ifname,
            "network": self.network,
            "cniVersion": self.cni_version,
            "delegatePath": self.delegate_path,
        });
        let mut out = serde_json::to_vec(&header).expect("strings always serialize");
        // The delegate bytes were validated as JSON when loaded: splice them in unparsed.
        out.pop();
        out.extend_from_slice(b",\"delegate\":");
        out.extend_from_slice(&self.delegate);
        out.extend_from_slice(b"}\n");
        out
    }

    /// Parses a record file's bytes.
    pub fn decode(bytes: &[u8]) -> std::result::Result<Record, String> {
        let f: RecordFile = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        Ok(Record {
            container_id: f.container_id,
            ifname: f.ifname,
            network: f.network,
            cni_version: f.cni_version,
            delegate_path: f.delegate_path,
            delegate: f.delegate.get().as_bytes().to_vec(),
        })
    }
}

/// The records of one guard network.
#[derive(Debug)]
pub struct Store {
    dir: PathBuf,
}

impl Store {
    /// Opens (creating when `create`) `<cache_dir>/<network>`. Without `create`, a store that
    /// does not exist yet is `None`. Refuses a cache dir that is a symlink, not a directory,
    /// owned by another user, or writable by others.
    pub fn open(cache_dir: &Path, network: &str, create: bool) -> Result<Option<Store>> {
        let dir = cache_dir.join(network);
        for (path, is_top) in [(cache_dir, true), (dir.as_path(), false)] {
            match std::fs::symlink_metadata(path) {
                Ok(meta) => check_dir(path, &meta)?,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    if !create {
                        return Ok(None);
                    }
                    make_dir(path, is_top)?;
                    let meta = std::fs::symlink_metadata(path)
                        .map_err(|e| io_error(path, "examine", &e))?;
                    check_dir(path, &meta)?;
                }
                Err(e) => return Err(io_error(path, "examine", &e)),
            }
        }
        Ok(Some(Store { dir }))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, container_id: &str, ifname: &str) -> PathBuf {
        self.dir.join(format!("{container_id}:{ifname}.json"))
    }

    /// Writes the record atomically (temp file in the same directory, then rename).
    pub fn write(&self, record: &Record) -> Result<()> {
        let final_path = self.path(&record.container_id, &record.ifname);
        let name = final_path
            .file_name()
            .expect("has a file name")
            .to_string_lossy()
            .into_owned();
        let tmp = self.dir.join(format!(".{name}.{}.tmp", sys::getpid()));
        let result = (|| {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&tmp)
                .map_err(|e| io_error(&tmp, "create", &e))?;
            f.write_all(&record.encode())
                .map_err(|e| io_error(&tmp, "write", &e))?;
            drop(f);
            std::fs::rename(&tmp, &final_path).map_err(|e| io_error(&final_path, "rename into", &e))
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result
    }

    /// Reads the record of an attachment; `None` when there is none. A record that cannot be
    /// parsed is reported as an error string so the caller can log it and carry on.
    pub fn read(
        &self,
        container_id: &str,
        ifname: &str,
    ) -> std::result::Result<Option<Record>, String> {
        let path = self.path(container_id, ifname);
        let file = match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(&path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("cannot open record {}: {e}", path.display())),
        };
        let meta = file
            .metadata()
            .map_err(|e| format!("cannot examine record {}: {e}", path.display()))?;
        if !meta.is_file() {
            return Err(format!("record {} is not a regular file", path.display()));
        }
        let mut bytes = Vec::new();
        file.take(MAX_RECORD_BYTES)
            .read_to_end(&mut bytes)
            .map_err(|e| format!("cannot read record {}: {e}", path.display()))?;
        let record = Record::decode(&bytes)
            .map_err(|e| format!("record {} is corrupt: {e}", path.display()))?;
        if record.container_id != container_id || record.ifname != ifname {
            return Err(format!(
                "record {} belongs to another attachment",
                path.display()
            ));
        }
        Ok(Some(record))
    }

    /// Removes an attachment's record; a missing record is fine.
    pub fn remove(&self, container_id: &str, ifname: &str) -> Result<()> {
        let path = self.path(container_id, ifname);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_error(&path, "remove", &e)),
        }
    }

    /// Every record's attachment, as `(containerID, ifname)`, read from the file names.
    pub fn list(&self) -> Result<Vec<(String, String)>> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&self.dir).map_err(|e| io_error(&self.dir, "list", &e))? {
            let entry = entry.map_err(|e| io_error(&self.dir, "list", &e))?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if let Some((id, ifname)) = name.strip_suffix(".json").and_then(|n| n.split_once(':')) {
                if !name.starts_with('.') {
                    out.push((id.to_owned(), ifname.to_owned()));
                }
            }
        }
        out.sort();
        Ok(out)
    }

    /// Removes temp files whose writer is gone. Returns how many were removed.
    pub fn sweep_temp_files(&self) -> usize {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return 0;
        };
        let mut removed = 0;
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            let Some(rest) = name.strip_prefix('.').and_then(|n| n.strip_suffix(".tmp")) else {
                continue;
            };
            let pid = rest
                .rsplit('.')
                .next()
                .and_then(|p| p.parse::<libc::pid_t>().ok());
            if pid.is_some_and(|p| p > 0 && !sys::pid_alive(p))
                && std::fs::remove_file(entry.path()).is_ok()
            {
                removed += 1;
            }
        }
        removed
    }
}

fn check_dir(path: &Path, meta: &std::fs::Metadata) -> Result<()> {
    let refuse = |why: &str| {
        Err(Error::new(
            code::INVALID_CONFIG,
            format!("cacheDir {} {why}", path.display()),
            "the guard keeps its records only in a private directory it owns",
        ))
    };
    if meta.file_type().is_symlink() {
        return refuse("is a symlink");
    }
    if !meta.is_dir() {
        return refuse("is not a directory");
    }
    if meta.uid() != sys::geteuid() {
        return refuse(&format!(
            "is owned by uid {}, not by the guard's uid {}",
            meta.uid(),
            sys::geteuid()
        ));
    }
    if meta.mode() & 0o002 != 0 {
        return refuse("is writable by others");
    }
    Ok(())
}

fn make_dir(path: &Path, create_parents: bool) -> Result<()> {
    if create_parents {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| io_error(parent, "create", &e))?;
        }
    }
    match std::fs::DirBuilder::new().mode(0o700).create(path) {
        Ok(()) => {
            // The umask may have narrowed the mode further; widen to exactly 0700 is not needed.
            let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700));
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(io_error(path, "create", &e)),
    }
}

fn io_error(path: &Path, what: &str, e: &std::io::Error) -> Error {
    Error::new(
        code::IO_FAILURE,
        format!("cannot {what} {}: {e}", path.display()),
        "",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str) -> Record {
        Record {
            container_id: id.into(),
            ifname: "eth0".into(),
            network: "g".into(),
            cni_version: "1.0.0".into(),
            delegate_path: "/etc/cni/net.d/00-multus.conf".into(),
            delegate: br#"{"cniVersion":"0.3.1", "name":"m","type":"x"}"#.to_vec(),
        }
    }

    #[test]
    fn round_trip_with_tight_modes() {
        let d = tempfile::tempdir().unwrap();
        let cache = d.path().join("cache");
        assert!(Store::open(&cache, "g", false).unwrap().is_none());
        let s = Store::open(&cache, "g", true).unwrap().unwrap();
        s.write(&record("c1")).unwrap();
        assert_eq!(s.read("c1", "eth0").unwrap().unwrap(), record("c1"));
        assert_eq!(s.read("c2", "eth0").unwrap(), None);
        assert_eq!(
            s.list().unwrap(),
            vec![("c1".to_owned(), "eth0".to_owned())]
        );
        let mode = |p: &Path| std::fs::metadata(p).unwrap().mode() & 0o777;
        assert_eq!(mode(&cache), 0o700);
        assert_eq!(mode(s.dir()), 0o700);
        assert_eq!(mode(&s.dir().join("c1:eth0.json")), 0o600);
        s.remove("c1", "eth0").unwrap();
        s.remove("c1", "eth0").unwrap();
        assert!(s.list().unwrap().is_empty());
        assert_eq!(std::fs::read_dir(s.dir()).unwrap().count(), 0);
    }

    #[test]
    fn refuses_symlinked_or_open_cache_dirs() {
        let d = tempfile::tempdir().unwrap();
        let real = d.path().join("real");
        std::fs::create_dir(&real).unwrap();
        let link = d.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert_eq!(Store::open(&link, "g", true).unwrap_err().code(), 7);
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert_eq!(Store::open(&real, "g", true).unwrap_err().code(), 7);
        let file = d.path().join("file");
        std::fs::write(&file, "").unwrap();
        assert_eq!(Store::open(&file, "g", true).unwrap_err().code(), 7);
    }

    #[test]
    fn corrupt_record_is_reported_not_trusted() {
        let d = tempfile::tempdir().unwrap();
        let s = Store::open(d.path(), "g", true).unwrap().unwrap();
        std::fs::write(s.dir().join("c1:eth0.json"), "{\"containerID\":").unwrap();
        assert!(s.read("c1", "eth0").unwrap_err().contains("corrupt"));
        let mut other = record("c9");
        other.ifname = "eth0".into();
        std::fs::write(s.dir().join("c1:eth0.json"), other.encode()).unwrap();
        assert!(s
            .read("c1", "eth0")
            .unwrap_err()
            .contains("another attachment"));
    }

    #[test]
    fn sweeps_temp_files_of_dead_writers_only() {
        let d = tempfile::tempdir().unwrap();
        let s = Store::open(d.path(), "g", true).unwrap().unwrap();
        let mine = s.dir().join(format!(".c1:eth0.json.{}.tmp", sys::getpid()));
        let dead = s.dir().join(".c2:eth0.json.2147483646.tmp");
        std::fs::write(&mine, "").unwrap();
        std::fs::write(&dead, "").unwrap();
        assert_eq!(s.sweep_temp_files(), 1);
        assert!(mine.exists());
        assert!(!dead.exists());
        assert!(s.list().unwrap().is_empty());
    }
}
