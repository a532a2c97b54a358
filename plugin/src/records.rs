//! The guard's records: for each attachment made through the guard, the delegate configuration
//! it was made with, so DEL can tear it down after the delegate file is gone or has changed.
//!
//! Layout:
//!
//! ```text
//! <cacheDir>/                             0700, a real directory owned by the guard's user
//!   <network>/                            0700, one per guard network name
//!     <containerID>:<ifname>.json         0600, one record per attachment (empty while locked
//!                                         for an attachment that has no record yet)
//!     .<containerID>:<ifname>.json.tmp    a record being written
//! ```
//!
//! `:` can appear in neither a container ID nor an interface name (both validated before they
//! reach a path), so the file name is unambiguous. A new attachment's record is created unnamed
//! (`O_TMPFILE`), locked and written, then linked to its name: one inode, and nobody can see it
//! before it is complete. Otherwise (a record already there, or no `O_TMPFILE`) it is written to
//! a temp file in the same directory and renamed into place. Either way a reader sees the old
//! record or the new one, never a part. There is no fsync: records are written on every pod start, the page cache outlives a
//! killed process, and libcni and Multus do not fsync their caches either.
//!
//! Every file is opened relative to the network directory's descriptor, itself opened with
//! `O_DIRECTORY|O_NOFOLLOW` after the cache dir was checked (a real directory, ours, not
//! writable by others), and every open is `O_NOFOLLOW`: a symlink planted in the cache dir is
//! never followed.
//!
//! **Serialisation.** ADD and DEL of the same attachment exclude each other with an `flock` on
//! the record file's inode, held from before the record is read or written until the delegate
//! has finished. Since a write replaces the inode (rename), a writer locks the new inode before
//! the rename; whoever waited on the old one sees, after it gets its lock, that the name now
//! points elsewhere, and locks again. An attachment without a record is locked through an empty
//! placeholder file at the record's name, removed when the lock is released. ADD may end by
//! exec'ing the delegate: the lock taken by [`Store::write`] is therefore kept open, without
//! close-on-exec, for the rest of the process, so the exec'd delegate holds it until it exits.
//! Whoever holds the lock also removes the attachment's temp file and an empty placeholder that
//! a killed process left: neither survives the next ADD or DEL of that attachment.
//!
//! A record file holds `{"containerID", "ifname", "network", "cniVersion", "delegatePath",
//! "delegate"}`, `delegate` being the delegate file's JSON as it was at ADD.

use std::cell::RefCell;
use std::ffi::OsStr;
use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::error::{code, Error, Result};
use crate::sys;
use crate::sys::at;

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
    fd: OwnedFd,
    /// The attachment this process has locked, if any (one at a time).
    held: RefCell<Option<Lock>>,
}

/// An `flock` on an attachment's record inode.
#[derive(Debug)]
struct Lock {
    name: String,
    fd: OwnedFd,
    /// Kept for the life of the process (and across exec) instead of released on drop.
    keep: bool,
}

impl Store {
    /// Opens (creating when `create`) `<cache_dir>/<network>`. Without `create`, a store that
    /// does not exist yet is `None`. Refuses a cache dir that is a symlink, not a directory,
    /// owned by another user, or writable by others.
    pub fn open(cache_dir: &Path, network: &str, create: bool) -> Result<Option<Store>> {
        if network.is_empty()
            || network.starts_with('.')
            || network.contains('/')
            || network.contains('\0')
        {
            return Err(Error::new(
                code::INVALID_CONFIG,
                format!("network name {network:?} cannot name a record directory"),
                "",
            ));
        }
        match std::fs::symlink_metadata(cache_dir) {
            Ok(meta) => check_dir(cache_dir, &DirMeta::of(&meta))?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if !create {
                    return Ok(None);
                }
                if let Some(parent) = cache_dir.parent() {
                    std::fs::create_dir_all(parent).map_err(|e| io_error(parent, "create", &e))?;
                }
                match std::fs::DirBuilder::new().mode(0o700).create(cache_dir) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(io_error(cache_dir, "create", &e)),
                }
            }
            Err(e) => return Err(io_error(cache_dir, "examine", &e)),
        }
        // The checks again on what was actually opened: the name may have been swapped since.
        let top =
            at::open_dir(None, cache_dir.as_os_str()).map_err(|e| dir_open_error(cache_dir, &e))?;
        check_dir(cache_dir, &DirMeta::stat(&top, cache_dir)?)?;

        let dir = cache_dir.join(network);
        let name = OsStr::new(network);
        if at::lstat(&top, name).is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFLNK) {
            return Err(dir_open_error(
                &dir,
                &io::Error::from_raw_os_error(libc::ELOOP),
            ));
        }
        match at::open_dir(Some(&top), name) {
            Ok(fd) => {
                check_dir(&dir, &DirMeta::stat(&fd, &dir)?)?;
                return Ok(Some(Store::new(dir, fd)));
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) && !create => return Ok(None),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => return Err(dir_open_error(&dir, &e)),
        }
        match at::mkdir(&top, name, 0o700) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
            Err(e) => return Err(io_error(&dir, "create", &e)),
        }
        let fd = at::open_dir(Some(&top), name).map_err(|e| dir_open_error(&dir, &e))?;
        check_dir(&dir, &DirMeta::stat(&fd, &dir)?)?;
        Ok(Some(Store::new(dir, fd)))
    }

    fn new(dir: PathBuf, fd: OwnedFd) -> Store {
        Store {
            dir,
            fd,
            held: RefCell::new(None),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Writes the record atomically (temp file in the same directory, then rename), with the
    /// attachment locked. The lock stays held for the rest of the process and by a delegate it
    /// execs, so a DEL of the same attachment waits for the ADD to finish.
    pub fn write(&self, record: &Record) -> Result<()> {
        let name = file_name(&record.container_id, &record.ifname)?;
        let tmp = temp_name(&name);
        let path = self.dir.join(&name);
        let held = self.held.borrow_mut().take();
        let old = match held {
            Some(lock) if lock.name == name => lock,
            other => {
                if let Some(lock) = other {
                    self.release(lock, false);
                }
                // A new attachment (the common case: a new sandbox): the record is created
                // unnamed, locked and written, then linked into place. One inode and one link,
                // against the placeholder, the temp file and the rename over the placeholder
                // below (twice the journal work on ext4, measured by scripts/bench.sh); and it is
                // locked and complete before anyone can open it. Taken name (EEXIST) or no
                // O_TMPFILE here: the general path.
                if let Some(fd) = self
                    .link_new(&name, &record.encode())
                    .map_err(|e| io_error(&path, "create", &e))?
                {
                    // Inherited across exec: the delegate keeps the attachment locked until it
                    // exits.
                    let _ = at::set_cloexec(&fd, false);
                    *self.held.borrow_mut() = Some(Lock {
                        name,
                        fd,
                        keep: true,
                    });
                    return Ok(());
                }
                self.lock(&name, true)
                    .map_err(|e| io_error(&path, "lock", &e))?
                    .expect("a blocking lock is granted")
            }
        };
        let tmp_path = self.dir.join(&tmp);
        let result = (|| {
            remove_entry(&self.fd, &tmp).map_err(|e| io_error(&tmp_path, "remove", &e))?;
            let fd = at::create_new(&self.fd, OsStr::new(&tmp), 0o600)
                .map_err(|e| io_error(&tmp_path, "create", &e))?;
            at::flock(&fd, true).map_err(|e| io_error(&tmp_path, "lock", &e))?;
            let mut file = std::fs::File::from(fd);
            file.write_all(&record.encode())
                .map_err(|e| io_error(&tmp_path, "write", &e))?;
            at::rename(&self.fd, OsStr::new(&tmp), OsStr::new(&name))
                .map_err(|e| io_error(&path, "rename into", &e))?;
            Ok(OwnedFd::from(file))
        })();
        match result {
            Ok(fd) => {
                // Inherited across exec: the delegate keeps the attachment locked until it exits.
                let _ = at::set_cloexec(&fd, false);
                *self.held.borrow_mut() = Some(Lock {
                    name,
                    fd,
                    keep: true,
                });
                // The old inode is no longer the record: nothing to clean, just let it go.
                drop(old.fd);
                Ok(())
            }
            Err(e) => {
                let _ = remove_entry(&self.fd, &tmp);
                *self.held.borrow_mut() = Some(old);
                Err(e)
            }
        }
    }

    /// Reads the record of an attachment; `None` when there is none. The attachment stays
    /// locked until the store is dropped (or another attachment is locked), so the caller can
    /// tear it down and [`remove`](Store::remove) the record without an ADD in between. A record
    /// that cannot be read or parsed is reported as an error string so the caller can log it and
    /// carry on.
    pub fn read(
        &self,
        container_id: &str,
        ifname: &str,
    ) -> std::result::Result<Option<Record>, String> {
        let name = file_name(container_id, ifname).map_err(|e| e.msg())?;
        let path = self.dir.join(&name);
        self.take_lock(&name)
            .map_err(|e| format!("cannot lock record {}: {e}", path.display()))?;
        let held = self.held.borrow();
        let Some(lock) = held.as_ref() else {
            // A read-only cache dir without this record: nothing to read, nothing to lock.
            return Ok(None);
        };
        // The lock is on the record's own inode: read through it.
        let mut bytes = Vec::new();
        at::pread_all(&lock.fd, MAX_RECORD_BYTES, &mut bytes)
            .map_err(|e| format!("cannot read record {}: {e}", path.display()))?;
        if bytes.is_empty() {
            return Ok(None);
        }
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

    /// Removes an attachment's record (and a temp file a killed writer left); a missing record
    /// is fine.
    pub fn remove(&self, container_id: &str, ifname: &str) -> Result<()> {
        let name = file_name(container_id, ifname)?;
        let path = self.dir.join(&name);
        self.take_lock(&name)
            .map_err(|e| io_error(&path, "lock", &e))?;
        let tmp = temp_name(&name);
        remove_entry(&self.fd, &tmp).map_err(|e| io_error(&self.dir.join(&tmp), "remove", &e))?;
        remove_entry(&self.fd, &name).map_err(|e| io_error(&path, "remove", &e))
    }

    /// Every record's attachment, as `(containerID, ifname)`, read from the file names.
    /// Placeholders (empty files of attachments being locked) are not records.
    pub fn list(&self) -> Result<Vec<(String, String)>> {
        let mut out = Vec::new();
        for name in self.names()? {
            if let Some((id, ifname)) = parse_name(&name) {
                if at::lstat(&self.fd, OsStr::new(&name)).is_ok_and(|st| st.st_size == 0) {
                    continue;
                }
                out.push((id.to_owned(), ifname.to_owned()));
            }
        }
        out.sort();
        Ok(out)
    }

    /// Removes temp files whose writer is gone (its attachment is not locked). Returns how many
    /// were removed.
    pub fn sweep_temp_files(&self) -> usize {
        let Ok(names) = self.names() else {
            return 0;
        };
        let mut removed = 0;
        for tmp in names {
            let Some(record) = record_of_temp(&tmp) else {
                continue;
            };
            if parse_name(record).is_none() {
                continue;
            }
            // A writer holds its attachment's lock: if we get it, nobody is writing.
            let Ok(Some(lock)) = self.lock(record, false) else {
                continue;
            };
            if remove_entry(&self.fd, &tmp).is_ok() {
                removed += 1;
            }
            self.release(lock, false);
        }
        removed
    }

    /// Lets a lock go. Whoever holds it is the only one who could be writing the attachment's
    /// temp file or placeholder: those are left-overs of a killed process, or our own, and go.
    /// A lock [`write`](Store::write) took is kept instead when the process is done with the
    /// store (`at_end`): the delegate it is about to run, or exec, must still hold it.
    fn release(&self, lock: Lock, at_end: bool) {
        if lock.keep && at_end {
            std::mem::forget(lock.fd);
            return;
        }
        let _ = remove_entry(&self.fd, &temp_name(&lock.name));
        let name = OsStr::new(&lock.name);
        if let (Ok(st), Ok(now)) = (at::fstat(&lock.fd), at::lstat(&self.fd, name)) {
            if st.st_size == 0 && now.st_ino == st.st_ino && now.st_dev == st.st_dev {
                let _ = remove_entry(&self.fd, &lock.name);
            }
        }
    }

    fn names(&self) -> Result<Vec<String>> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&self.dir).map_err(|e| io_error(&self.dir, "list", &e))? {
            let entry = entry.map_err(|e| io_error(&self.dir, "list", &e))?;
            if let Some(name) = entry.file_name().to_str() {
                out.push(name.to_owned());
            }
        }
        Ok(out)
    }

    /// Makes `name` the attachment this process holds locked (blocking), releasing any other.
    /// On a read-only file system where the record does not exist, nothing is locked.
    fn take_lock(&self, name: &str) -> io::Result<()> {
        if self.held.borrow().as_ref().is_some_and(|l| l.name == name) {
            return Ok(());
        }
        let previous = self.held.borrow_mut().take();
        if let Some(lock) = previous {
            self.release(lock, false);
        }
        match self.lock(name, true) {
            Ok(lock) => {
                *self.held.borrow_mut() = lock;
                Ok(())
            }
            Err(e) if e.raw_os_error() == Some(libc::EROFS) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Creates the record of an attachment that has none: an unnamed file, locked and written,
    /// then linked to `name`. `Ok(None)` when the name is taken or the file system has no
    /// `O_TMPFILE`: the caller takes the general path.
    fn link_new(&self, name: &str, bytes: &[u8]) -> io::Result<Option<OwnedFd>> {
        let fd = match at::create_unnamed(&self.fd, 0o600) {
            Ok(fd) => fd,
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EOPNOTSUPP | libc::EISDIR | libc::EINVAL)
                ) =>
            {
                return Ok(None)
            }
            Err(e) => return Err(e),
        };
        at::flock(&fd, true)?;
        let mut file = std::fs::File::from(fd);
        file.write_all(bytes)?;
        let fd = OwnedFd::from(file);
        match at::link_into(&fd, &self.fd, OsStr::new(name)) {
            Ok(()) => {
                // Holding the lock: a temp file a killed writer left goes, as on the general
                // path (one unlinkat; nothing to journal when there is none).
                remove_entry(&self.fd, &temp_name(name))?;
                Ok(Some(fd))
            }
            // Taken (EEXIST), or no /proc to link through: the general path.
            Err(_) => Ok(None),
        }
    }

    /// Locks the inode at `name`, creating an empty placeholder when there is none, and makes
    /// sure the lock is on what the name points to once it is granted. `Ok(None)`: not blocking
    /// and someone else holds it.
    fn lock(&self, name: &str, blocking: bool) -> io::Result<Option<Lock>> {
        let cname = OsStr::new(name);
        loop {
            let fd = at::open_lock(&self.fd, cname)?;
            let st = at::fstat(&fd)?;
            if st.st_mode & libc::S_IFMT != libc::S_IFREG {
                return Err(io::Error::other("not a regular file"));
            }
            match at::flock(&fd, blocking) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => return Ok(None),
                Err(e) => return Err(e),
            }
            match at::lstat(&self.fd, cname) {
                Ok(now) if now.st_ino == st.st_ino && now.st_dev == st.st_dev => {
                    return Ok(Some(Lock {
                        name: name.to_owned(),
                        fd,
                        keep: false,
                    }))
                }
                // Replaced or removed while we waited: lock what is there now.
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                Err(e) => return Err(e),
            }
        }
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        if let Some(lock) = self.held.get_mut().take() {
            self.release(lock, true);
        }
    }
}

/// `<containerID>:<ifname>.json`, refusing what could make it another path.
fn file_name(container_id: &str, ifname: &str) -> Result<String> {
    let bad = |s: &str| s.is_empty() || s.starts_with('.') || s.contains(['/', ':', '\0']);
    if bad(container_id) || bad(ifname) {
        return Err(Error::new(
            code::INVALID_ENV,
            format!("attachment {container_id:?}/{ifname:?} cannot name a record"),
            "",
        ));
    }
    Ok(format!("{container_id}:{ifname}.json"))
}

fn temp_name(record: &str) -> String {
    format!(".{record}.tmp")
}

/// `(containerID, ifname)` of a record file name.
fn parse_name(name: &str) -> Option<(&str, &str)> {
    if name.starts_with('.') {
        return None;
    }
    name.strip_suffix(".json")?.split_once(':')
}

/// The record a temp file belongs to: `.<record>.tmp`, or `.<record>.<pid>.tmp` as written by
/// earlier versions, which took no lock: such a file is only stale once its writer is gone.
fn record_of_temp(name: &str) -> Option<&str> {
    let inner = name.strip_prefix('.')?.strip_suffix(".tmp")?;
    if inner.ends_with(".json") {
        return Some(inner);
    }
    let (record, pid) = inner.rsplit_once('.')?;
    let pid: libc::pid_t = pid.parse().ok()?;
    (pid > 0 && record.ends_with(".json") && !sys::pid_alive(pid)).then_some(record)
}

/// Removes a directory entry; a missing one is fine.
fn remove_entry(dir: &OwnedFd, name: &str) -> io::Result<()> {
    match at::unlink(dir, OsStr::new(name)) {
        Err(e) if e.raw_os_error() != Some(libc::ENOENT) => Err(e),
        _ => Ok(()),
    }
}

/// What [`check_dir`] looks at, from `lstat` or from `fstat` on an open directory.
struct DirMeta {
    is_symlink: bool,
    is_dir: bool,
    uid: u32,
    mode: u32,
}

impl DirMeta {
    fn of(meta: &std::fs::Metadata) -> DirMeta {
        DirMeta {
            is_symlink: meta.file_type().is_symlink(),
            is_dir: meta.is_dir(),
            uid: meta.uid(),
            mode: meta.mode(),
        }
    }

    fn stat(fd: &OwnedFd, path: &Path) -> Result<DirMeta> {
        let st = at::fstat(fd).map_err(|e| io_error(path, "examine", &e))?;
        Ok(DirMeta {
            is_symlink: false,
            is_dir: st.st_mode & libc::S_IFMT == libc::S_IFDIR,
            uid: st.st_uid,
            mode: st.st_mode,
        })
    }
}

fn check_dir(path: &Path, meta: &DirMeta) -> Result<()> {
    let refuse = |why: &str| {
        Err(Error::new(
            code::INVALID_CONFIG,
            format!("cacheDir {} {why}", path.display()),
            "the guard keeps its records only in a private directory it owns",
        ))
    };
    if meta.is_symlink {
        return refuse("is a symlink");
    }
    if !meta.is_dir {
        return refuse("is not a directory");
    }
    let euid = sys::geteuid();
    if meta.uid != euid {
        return refuse(&format!(
            "is owned by uid {}, not by the guard's uid {euid}",
            meta.uid
        ));
    }
    if meta.mode & 0o002 != 0 {
        return refuse("is writable by others");
    }
    Ok(())
}

fn dir_open_error(path: &Path, e: &io::Error) -> Error {
    match e.raw_os_error() {
        Some(libc::ELOOP) => Error::new(
            code::INVALID_CONFIG,
            format!("cacheDir {} is a symlink", path.display()),
            "the guard keeps its records only in a private directory it owns",
        ),
        Some(libc::ENOTDIR) => Error::new(
            code::INVALID_CONFIG,
            format!("cacheDir {} is not a directory", path.display()),
            "the guard keeps its records only in a private directory it owns",
        ),
        _ => io_error(path, "open", e),
    }
}

fn io_error(path: &Path, what: &str, e: &io::Error) -> Error {
    Error::new(
        code::IO_FAILURE,
        format!("cannot {what} {}: {e}", path.display()),
        "",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

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
    fn sweeps_temp_files_of_unlocked_attachments_only() {
        let d = tempfile::tempdir().unwrap();
        let writer = Store::open(d.path(), "g", true).unwrap().unwrap();
        writer.write(&record("c1")).unwrap();
        // c1 is locked by its writer: its temp file is in progress, not stale.
        let live = writer.dir().join(".c1:eth0.json.tmp");
        let dead = writer.dir().join(".c2:eth0.json.tmp");
        let legacy_dead = writer.dir().join(".c3:eth0.json.2147483646.tmp");
        let legacy_live = writer
            .dir()
            .join(format!(".c4:eth0.json.{}.tmp", sys::getpid()));
        for p in [&live, &dead, &legacy_dead, &legacy_live] {
            std::fs::write(p, "{").unwrap();
        }
        let gc = Store::open(d.path(), "g", false).unwrap().unwrap();
        assert_eq!(gc.sweep_temp_files(), 2);
        assert!(live.exists() && legacy_live.exists());
        assert!(!dead.exists() && !legacy_dead.exists());
        // Locking c2 and c3 to sweep left no placeholder behind.
        assert_eq!(gc.list().unwrap(), [("c1".to_owned(), "eth0".to_owned())]);
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn the_next_holder_removes_what_a_killed_process_left() {
        let d = tempfile::tempdir().unwrap();
        let s = Store::open(d.path(), "g", true).unwrap().unwrap();
        // Killed after locking a new attachment (placeholder) and mid-way through its temp file.
        std::fs::write(s.dir().join("c1:eth0.json"), "").unwrap();
        std::fs::write(s.dir().join(".c1:eth0.json.tmp"), "{\"contain").unwrap();
        assert_eq!(s.read("c1", "eth0").unwrap(), None);
        drop(s);
        assert!(names(&d.path().join("g")).is_empty());
        // Killed mid-write over an existing record: the record survives, the temp does not.
        // (Records are made by hand in these tests: a write's lock is held until the process
        // exits, by design.)
        std::fs::write(d.path().join("g/c1:eth0.json"), record("c1").encode()).unwrap();
        std::fs::write(d.path().join("g/.c1:eth0.json.tmp"), "{\"contain").unwrap();
        let s = Store::open(d.path(), "g", false).unwrap().unwrap();
        assert_eq!(s.read("c1", "eth0").unwrap().unwrap(), record("c1"));
        drop(s);
        assert_eq!(names(&d.path().join("g")), ["c1:eth0.json"]);
    }

    #[test]
    fn a_writer_replaces_a_stale_temp_file_even_a_symlink() {
        let d = tempfile::tempdir().unwrap();
        let target = d.path().join("target");
        std::fs::write(&target, "precious").unwrap();
        let s = Store::open(&d.path().join("cache"), "g", true)
            .unwrap()
            .unwrap();
        std::os::unix::fs::symlink(&target, s.dir().join(".c1:eth0.json.tmp")).unwrap();
        s.write(&record("c1")).unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "precious");
        assert_eq!(names(s.dir()), ["c1:eth0.json"]);
    }

    #[test]
    fn never_follows_a_symlink_planted_as_a_record() {
        let d = tempfile::tempdir().unwrap();
        let target = d.path().join("target");
        std::fs::write(&target, "precious").unwrap();
        let s = Store::open(&d.path().join("cache"), "g", true)
            .unwrap()
            .unwrap();
        std::os::unix::fs::symlink(&target, s.dir().join("c1:eth0.json")).unwrap();
        assert_eq!(s.write(&record("c1")).unwrap_err().code(), 5);
        assert!(s.read("c1", "eth0").is_err());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "precious");
        // A FIFO in its place: refused at once, never opened for a blocking read.
        std::fs::remove_file(s.dir().join("c1:eth0.json")).unwrap();
        let fifo = std::ffi::CString::new(s.dir().join("c1:eth0.json").to_str().unwrap()).unwrap();
        // SAFETY: fifo is a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        assert!(s.read("c1", "eth0").unwrap_err().contains("regular"));
    }

    #[test]
    fn refuses_a_symlinked_network_dir_and_foreign_owners() {
        let d = tempfile::tempdir().unwrap();
        let cache = d.path().join("cache");
        std::fs::create_dir(&cache).unwrap();
        std::fs::create_dir(d.path().join("elsewhere")).unwrap();
        std::os::unix::fs::symlink(d.path().join("elsewhere"), cache.join("g")).unwrap();
        let e = Store::open(&cache, "g", true).unwrap_err();
        assert_eq!(e.code(), 7);
        assert!(e.msg().contains("symlink"), "{}", e.msg());
        assert_eq!(Store::open(&cache, "../x", true).unwrap_err().code(), 7);
        if sys::geteuid() == 0 {
            let other = d.path().join("other");
            std::fs::create_dir(&other).unwrap();
            std::os::unix::fs::chown(&other, Some(4242), None).unwrap();
            let e = Store::open(&other, "g", true).unwrap_err();
            assert!(e.msg().contains("owned by uid 4242"), "{}", e.msg());
        }
    }

    #[test]
    fn readers_of_the_same_attachment_take_turns() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        let d = tempfile::tempdir().unwrap();
        let dir = Store::open(d.path(), "g", true)
            .unwrap()
            .unwrap()
            .dir()
            .to_owned();
        std::fs::write(dir.join("c1:eth0.json"), record("c1").encode()).unwrap();
        let a = Store::open(d.path(), "g", false).unwrap().unwrap();
        assert!(a.read("c1", "eth0").unwrap().is_some());
        let released = Arc::new(AtomicBool::new(false));
        let (path, flag) = (d.path().to_owned(), released.clone());
        let b = std::thread::spawn(move || {
            let b = Store::open(&path, "g", false).unwrap().unwrap();
            let r = b.read("c1", "eth0").unwrap();
            (flag.load(Ordering::SeqCst), r.is_some())
        });
        std::thread::sleep(std::time::Duration::from_millis(200));
        // a tears down: removes the record and lets go.
        a.remove("c1", "eth0").unwrap();
        released.store(true, Ordering::SeqCst);
        drop(a);
        let (after_release, found) = b.join().unwrap();
        assert!(after_release, "b read while a held the attachment");
        assert!(!found, "b saw a's removal");
        assert!(names(&d.path().join("g")).is_empty());
    }
}
