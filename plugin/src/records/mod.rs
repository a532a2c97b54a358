//! The guard's records: for each attachment made through the guard, the delegate configuration
//! it was made with, so DEL can tear it down after the delegate file is gone or has changed.
//!
//! Layout:
//!
//! ```text
//! <cacheDir>/                             0700, a real directory owned by the guard's user,
//!                                         writable by nobody else (group included)
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
//! record or the new one, never a part. There is no fsync: records are written on every pod
//! start, the page cache outlives a killed process, and libcni and Multus do not fsync their
//! caches either.
//!
//! Every file is opened relative to the network directory's descriptor, itself opened with
//! `O_DIRECTORY|O_NOFOLLOW` after the cache dir was checked ([`dir`]), and every open is
//! `O_NOFOLLOW`: a symlink planted in the cache dir is never followed.
//!
//! **Serialisation.** ADD and DEL of the same attachment exclude each other with a lock on the
//! record file's inode ([`lock`]), held from before the record is read or written until the
//! delegate has finished, and waited for at most `lockWaitSeconds`. Since a write replaces the
//! inode (rename), a writer locks the new inode before the rename; whoever waited on the old one
//! sees, once it has its lock, that the name now points elsewhere, and locks again. An
//! attachment without a record is locked through an empty placeholder file at the record's
//! name, removed when the lock is released. ADD may end by exec'ing the delegate: then
//! [`Store::exec_lock`] hands the lock over, so the exec'd delegate holds it until it exits.
//! Whoever holds the lock also removes the attachment's temp file and an empty placeholder that
//! a killed process left: neither survives the next ADD or DEL of that attachment.
//!
//! A record file holds `{"containerID", "ifname", "network", "cniVersion", "delegatePath",
//! "delegate"}` ([`format`]), `delegate` being the delegate file's JSON as it was at ADD.

mod dir;
mod format;
mod lock;

use std::ffi::OsStr;
use std::io::{self, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::{Error, Kind, Result};
use crate::names;
use crate::sys;
use crate::sys::at;
use dir::{check_dir, dir_open_error, io_error, DirMeta};
pub use format::Record;
use lock::{Busy, Lock, Wait};

const MAX_RECORD_BYTES: u64 = 16 << 20;

/// The records of one guard network, and the one attachment this process holds locked.
#[derive(Debug)]
pub struct Store {
    dir: PathBuf,
    fd: OwnedFd,
    held: Option<Lock>,
    /// How long to wait for another process holding an attachment.
    lock_wait: Duration,
}

impl Store {
    /// Opens `<cache_dir>/<network>`, creating both as needed. Refuses a cache dir that is a
    /// symlink, not a directory, owned by another user, or writable by its group or others.
    pub fn create(cache_dir: &Path, network: &str, lock_wait: Duration) -> Result<Store> {
        let dir = cache_dir.join(network);
        Self::open(cache_dir, network, lock_wait, true)?
            .ok_or_else(|| io_error(&dir, "create", &io::ErrorKind::NotFound.into()))
    }

    /// Opens `<cache_dir>/<network>` if it exists (`None` if not), with the same checks.
    pub fn open_existing(
        cache_dir: &Path,
        network: &str,
        lock_wait: Duration,
    ) -> Result<Option<Store>> {
        Self::open(cache_dir, network, lock_wait, false)
    }

    fn open(
        cache_dir: &Path,
        network: &str,
        lock_wait: Duration,
        create: bool,
    ) -> Result<Option<Store>> {
        if let Err(why) = names::network_name(network) {
            return Err(Error::new(
                Kind::Misconfigured,
                format!("network name {why}: it cannot name a record directory"),
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
        let store = |dir: PathBuf, fd| Store {
            dir,
            fd,
            held: None,
            lock_wait,
        };
        match at::open_dir(Some(&top), name) {
            Ok(fd) => {
                check_dir(&dir, &DirMeta::stat(&fd, &dir)?)?;
                return Ok(Some(store(dir, fd)));
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
        Ok(Some(store(dir, fd)))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Writes the record atomically, with the attachment locked; the lock stays held until the
    /// store is dropped (or handed to an exec'd delegate by [`exec_lock`](Store::exec_lock)),
    /// so a DEL of the same attachment waits for the ADD to finish. Another process holding the
    /// attachment past `lockWaitSeconds`: code 11.
    pub fn write(&mut self, record: &Record) -> Result<()> {
        let name = file_name(&record.container_id, &record.ifname)?;
        let tmp = temp_name(&name);
        let path = self.dir.join(&name);
        let old = match self.held.take() {
            Some(lock) if lock.name == name => lock,
            other => {
                if let Some(lock) = other {
                    self.release(lock);
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
                    self.held = Some(Lock { name, fd });
                    return Ok(());
                }
                self.lock(&name, self.deadline())
                    .map_err(|e| io_error(&path, "lock", &e))?
                    .map_err(|busy| busy_error(&record.container_id, &record.ifname, &busy))?
            }
        };
        let tmp_path = self.dir.join(&tmp);
        let result = (|| {
            remove_entry(&self.fd, &tmp).map_err(|e| io_error(&tmp_path, "remove", &e))?;
            let fd = at::create_new(&self.fd, OsStr::new(&tmp), 0o600)
                .map_err(|e| io_error(&tmp_path, "create", &e))?;
            // Nobody else can know this new inode yet: the lock is granted at once.
            lock::take(&fd, Wait::Once)
                .map_err(|e| io_error(&tmp_path, "lock", &e))?
                .map_err(|_| io_error(&tmp_path, "lock", &io::ErrorKind::WouldBlock.into()))?;
            let mut file = std::fs::File::from(fd);
            file.write_all(&record.encode())
                .map_err(|e| io_error(&tmp_path, "write", &e))?;
            at::rename(&self.fd, OsStr::new(&tmp), OsStr::new(&name))
                .map_err(|e| io_error(&path, "rename into", &e))?;
            Ok(OwnedFd::from(file))
        })();
        match result {
            Ok(fd) => {
                self.held = Some(Lock { name, fd });
                // The old inode is no longer the record: nothing to clean, just let it go.
                drop(old.fd);
                Ok(())
            }
            Err(e) => {
                let _ = remove_entry(&self.fd, &tmp);
                self.held = Some(old);
                Err(e)
            }
        }
    }

    /// Hands the held lock over for an exec: its descriptor, no longer close-on-exec, for the
    /// caller to keep open until it execs the delegate, which then holds the attachment until
    /// it exits. `Ok(None)` when nothing is held. On failure the lock stays with the store.
    pub fn exec_lock(&mut self) -> io::Result<Option<OwnedFd>> {
        let Some(lock) = self.held.take() else {
            return Ok(None);
        };
        match sys::set_cloexec(lock.fd.as_fd(), false) {
            Ok(()) => Ok(Some(lock.fd)),
            Err(e) => {
                self.held = Some(lock);
                Err(e)
            }
        }
    }

    /// Locks an attachment (waiting at most `lockWaitSeconds`) and reads its record; `None` when
    /// there is none. The attachment stays locked until the store is dropped (or another is
    /// locked), so the caller can tear it down and [`remove`](Store::remove) the record without
    /// an ADD in between. Another process holding it past the bound: code 11; a record that
    /// cannot be read or parsed: code 5, for the caller to log and carry on.
    pub fn read(&mut self, container_id: &str, ifname: &str) -> Result<Option<Record>> {
        let name = file_name(container_id, ifname)?;
        let path = self.dir.join(&name);
        self.take_lock(&name)
            .map_err(|e| io_error(&path, "lock record", &e))?
            .map_err(|busy| busy_error(container_id, ifname, &busy))?;
        let Some(lock) = &self.held else {
            // A read-only cache dir without this record: nothing to read, nothing to lock.
            return Ok(None);
        };
        // Trusted only if only the guard's user could have written it: a record names the
        // delegate that DEL runs as that user.
        let st = at::fstat(&lock.fd).map_err(|e| io_error(&path, "examine record", &e))?;
        let euid = sys::geteuid();
        if st.st_uid != euid {
            return Err(Error::new(
                Kind::Io,
                format!(
                    "record {} is owned by uid {}, not by the guard's uid {euid}: not trusted",
                    path.display(),
                    st.st_uid
                ),
            ));
        }
        if st.st_mode & 0o022 != 0 {
            return Err(Error::new(
                Kind::Io,
                format!(
                    "record {} is writable by group or others (mode {:o}): not trusted",
                    path.display(),
                    st.st_mode & 0o7777
                ),
            ));
        }
        // The lock is on the record's own inode: read through it.
        let mut bytes = Vec::new();
        at::pread_all(&lock.fd, MAX_RECORD_BYTES, &mut bytes)
            .map_err(|e| io_error(&path, "read record", &e))?;
        if bytes.is_empty() {
            return Ok(None);
        }
        let corrupt =
            |why: String| Error::new(Kind::Io, format!("record {} {why}", path.display()));
        let record =
            Record::decode(&bytes).map_err(|e| corrupt(format!("is corrupt: {}", e.msg())))?;
        if record.container_id != container_id || record.ifname != ifname {
            return Err(corrupt("belongs to another attachment".to_owned()));
        }
        Ok(Some(record))
    }

    /// Removes an attachment's record (and a temp file a killed writer left); a missing record
    /// is fine.
    pub fn remove(&mut self, container_id: &str, ifname: &str) -> Result<()> {
        let name = file_name(container_id, ifname)?;
        let path = self.dir.join(&name);
        self.take_lock(&name)
            .map_err(|e| io_error(&path, "lock", &e))?
            .map_err(|busy| busy_error(container_id, ifname, &busy))?;
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
    /// were removed. Lets go of the attachment this store held.
    pub fn sweep_temp_files(&mut self) -> usize {
        if let Some(lock) = self.held.take() {
            self.release(lock);
        }
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
            let Ok(Ok(lock)) = self.lock(record, Wait::Once) else {
                continue;
            };
            if remove_entry(&self.fd, &tmp).is_ok() {
                removed += 1;
            }
            self.release(lock);
        }
        removed
    }

    fn deadline(&self) -> Wait {
        Wait::Until(Instant::now() + self.lock_wait)
    }

    /// Lets a lock go. Whoever holds it is the only one who could be writing the attachment's
    /// temp file or placeholder: those are left-overs of a killed process, or our own, and go.
    fn release(&self, lock: Lock) {
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

    /// Makes `name` the attachment this process holds locked (waiting at most the bound),
    /// releasing any other. On a read-only file system where the record does not exist,
    /// nothing is locked.
    fn take_lock(&mut self, name: &str) -> io::Result<std::result::Result<(), Busy>> {
        if self.held.as_ref().is_some_and(|l| l.name == name) {
            return Ok(Ok(()));
        }
        if let Some(lock) = self.held.take() {
            self.release(lock);
        }
        match self.lock(name, self.deadline()) {
            Ok(Ok(lock)) => {
                self.held = Some(lock);
                Ok(Ok(()))
            }
            Ok(Err(busy)) => Ok(Err(busy)),
            Err(e) if e.raw_os_error() == Some(libc::EROFS) => Ok(Ok(())),
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
        // Nobody else can know this unnamed inode: the lock is granted at once.
        if lock::take(&fd, Wait::Once)?.is_err() {
            return Ok(None);
        }
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
    /// sure the lock is on what the name points to once it is granted.
    fn lock(&self, name: &str, wait: Wait) -> io::Result<std::result::Result<Lock, Busy>> {
        let cname = OsStr::new(name);
        loop {
            let fd = at::open_lock(&self.fd, cname)?;
            let st = at::fstat(&fd)?;
            if st.st_mode & libc::S_IFMT != libc::S_IFREG {
                return Err(io::Error::other("it is not a regular file"));
            }
            if let Err(busy) = lock::take(&fd, wait)? {
                return Ok(Err(busy));
            }
            match at::lstat(&self.fd, cname) {
                Ok(now) if now.st_ino == st.st_ino && now.st_dev == st.st_dev => {
                    return Ok(Ok(Lock {
                        name: name.to_owned(),
                        fd,
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
        if let Some(lock) = self.held.take() {
            self.release(lock);
        }
    }
}

/// The error for an attachment another process holds past the bound.
fn busy_error(container_id: &str, ifname: &str, busy: &Busy) -> Error {
    let who = match busy.holder {
        0 => "another process".to_owned(),
        pid => format!("process {pid}"),
    };
    Error::new(Kind::Busy, format!(
            "cni-guard: attachment {container_id}/{ifname} is held by {who} (an ADD or DEL of it still running) after waiting {:.1}s",
            busy.waited.as_secs_f64()
        )).with_details("lockWaitSeconds bounds the wait; the runtime retries")
}

/// `<containerID>:<ifname>.json`. The name rules ([`names`]) keep `/` and `:` out of both
/// parts and `.` from the start of the container ID, so it is one unambiguous entry of the
/// network directory, never a hidden one.
fn file_name(container_id: &str, ifname: &str) -> Result<String> {
    let bad = |what: &str, why: names::BadName| {
        Error::new(
            Kind::BadEnv,
            format!("{what} {why}: it cannot name a record"),
        )
    };
    names::container_id(container_id).map_err(|why| bad("container ID", why))?;
    names::ifname(ifname).map_err(|why| bad("interface name", why))?;
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

/// The record a temp file belongs to: `.<record>.tmp`.
fn record_of_temp(name: &str) -> Option<&str> {
    let inner = name.strip_prefix('.')?.strip_suffix(".tmp")?;
    inner.ends_with(".json").then_some(inner)
}

/// Removes a directory entry; a missing one is fine.
fn remove_entry(dir: &OwnedFd, name: &str) -> io::Result<()> {
    match at::unlink(dir, OsStr::new(name)) {
        Err(e) if e.raw_os_error() != Some(libc::ENOENT) => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::Command as Verb;
    use std::io::{BufRead, BufReader};
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use std::process::{Child, Command, Stdio};

    const W: Duration = Duration::from_secs(5);

    /// Another process holding a POSIX write lock on `path` (POSIX locks never conflict
    /// within one process, so the holder must be another one), until it is killed.
    struct Holder(Child);

    impl Holder {
        fn lock(path: &Path) -> Holder {
            let mut child = Command::new("python3")
                .args([
                    "-c",
                    "import fcntl,sys,time\n\
                     f=open(sys.argv[1],'r+')\n\
                     fcntl.lockf(f,fcntl.LOCK_EX)\n\
                     print('locked',flush=True)\n\
                     time.sleep(60)",
                ])
                .arg(path)
                .stdout(Stdio::piped())
                .spawn()
                .expect("python3 runs the lock holder");
            let mut line = String::new();
            BufReader::new(child.stdout.as_mut().unwrap())
                .read_line(&mut line)
                .unwrap();
            assert_eq!(line, "locked\n");
            Holder(child)
        }
        fn pid(&self) -> u32 {
            self.0.id()
        }
    }

    impl Drop for Holder {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

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
        assert!(Store::open_existing(&cache, "g", W).unwrap().is_none());
        let mut s = Store::create(&cache, "g", W).unwrap();
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

    /// Everything after the open goes through the directory it opened: swapped for another
    /// directory at the same path, the store still lists (and so GC removes) its own records,
    /// and never those of what now has its name.
    #[test]
    fn lists_the_directory_it_opened_not_what_has_its_path_now() {
        let d = tempfile::tempdir().unwrap();
        let cache = d.path().join("cache");
        let mut s = Store::create(&cache, "g", W).unwrap();
        s.write(&record("c1")).unwrap();
        drop(s);
        let mut s = Store::open_existing(&cache, "g", W).unwrap().unwrap();
        std::fs::rename(cache.join("g"), cache.join("moved")).unwrap();
        let mut other = Store::create(&cache, "g", W).unwrap();
        other.write(&record("planted")).unwrap();
        drop(other);
        let listed = s.list().unwrap();
        assert_eq!(listed, vec![("c1".to_owned(), "eth0".to_owned())]);
        for (id, ifname) in listed {
            s.remove(&id, &ifname).unwrap();
        }
        assert!(cache.join("g/planted:eth0.json").exists());
        assert!(!cache.join("moved/c1:eth0.json").exists());
    }

    #[test]
    fn refuses_symlinked_or_open_cache_dirs() {
        let d = tempfile::tempdir().unwrap();
        let real = d.path().join("real");
        std::fs::create_dir(&real).unwrap();
        let link = d.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert_eq!(Store::create(&link, "g", W).unwrap_err().code(Verb::Add), 7);
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert_eq!(Store::create(&real, "g", W).unwrap_err().code(Verb::Add), 7);
        let file = d.path().join("file");
        std::fs::write(&file, "").unwrap();
        assert_eq!(Store::create(&file, "g", W).unwrap_err().code(Verb::Add), 7);
    }

    #[test]
    fn corrupt_record_is_reported_not_trusted() {
        let d = tempfile::tempdir().unwrap();
        let mut s = Store::create(d.path(), "g", W).unwrap();
        std::fs::write(s.dir().join("c1:eth0.json"), "{\"containerID\":").unwrap();
        assert!(s.read("c1", "eth0").unwrap_err().msg().contains("corrupt"));
        let mut other = record("c9");
        other.ifname = "eth0".into();
        std::fs::write(s.dir().join("c1:eth0.json"), other.encode()).unwrap();
        assert!(s
            .read("c1", "eth0")
            .unwrap_err()
            .msg()
            .contains("another attachment"));
    }

    #[test]
    fn sweeps_temp_files_of_unlocked_attachments_only() {
        let d = tempfile::tempdir().unwrap();
        let mut writer = Store::create(d.path(), "g", W).unwrap();
        writer.write(&record("c1")).unwrap();
        drop(writer);
        // c1 is locked by a live writer: its temp file is in progress, not stale.
        let _writer = Holder::lock(&d.path().join("g/c1:eth0.json"));
        let live = d.path().join("g/.c1:eth0.json.tmp");
        let dead = d.path().join("g/.c2:eth0.json.tmp");
        for p in [&live, &dead] {
            std::fs::write(p, "{").unwrap();
        }
        let mut gc = Store::open_existing(d.path(), "g", W).unwrap().unwrap();
        assert_eq!(gc.sweep_temp_files(), 1);
        assert!(live.exists());
        assert!(!dead.exists());
        // Locking c2 to sweep left no placeholder behind.
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
        let mut s = Store::create(d.path(), "g", W).unwrap();
        // Killed after locking a new attachment (placeholder) and mid-way through its temp file.
        std::fs::write(s.dir().join("c1:eth0.json"), "").unwrap();
        std::fs::write(s.dir().join(".c1:eth0.json.tmp"), "{\"contain").unwrap();
        assert_eq!(s.read("c1", "eth0").unwrap(), None);
        drop(s);
        assert!(names(&d.path().join("g")).is_empty());
        // Killed mid-write over an existing record: the record survives, the temp does not.
        std::fs::write(d.path().join("g/c1:eth0.json"), record("c1").encode()).unwrap();
        std::fs::write(d.path().join("g/.c1:eth0.json.tmp"), "{\"contain").unwrap();
        let mut s = Store::open_existing(d.path(), "g", W).unwrap().unwrap();
        assert_eq!(s.read("c1", "eth0").unwrap().unwrap(), record("c1"));
        drop(s);
        assert_eq!(names(&d.path().join("g")), ["c1:eth0.json"]);
    }

    #[test]
    fn a_writer_replaces_a_stale_temp_file_even_a_symlink() {
        let d = tempfile::tempdir().unwrap();
        let target = d.path().join("target");
        std::fs::write(&target, "precious").unwrap();
        let mut s = Store::create(&d.path().join("cache"), "g", W).unwrap();
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
        let mut s = Store::create(&d.path().join("cache"), "g", W).unwrap();
        std::os::unix::fs::symlink(&target, s.dir().join("c1:eth0.json")).unwrap();
        assert_eq!(s.write(&record("c1")).unwrap_err().code(Verb::Add), 5);
        assert!(s.read("c1", "eth0").is_err());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "precious");
        // A FIFO in its place: refused at once, never opened for a blocking read.
        std::fs::remove_file(s.dir().join("c1:eth0.json")).unwrap();
        nix::unistd::mkfifo(
            &s.dir().join("c1:eth0.json"),
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .unwrap();
        assert!(s.read("c1", "eth0").unwrap_err().msg().contains("regular"));
    }

    #[test]
    fn refuses_a_symlinked_network_dir_and_foreign_owners() {
        let d = tempfile::tempdir().unwrap();
        let cache = d.path().join("cache");
        std::fs::create_dir(&cache).unwrap();
        std::fs::create_dir(d.path().join("elsewhere")).unwrap();
        std::os::unix::fs::symlink(d.path().join("elsewhere"), cache.join("g")).unwrap();
        let e = Store::create(&cache, "g", W).unwrap_err();
        assert_eq!(e.code(Verb::Add), 7);
        assert!(e.msg().contains("symlink"), "{}", e.msg());
        assert_eq!(
            Store::create(&cache, "../x", W)
                .unwrap_err()
                .code(Verb::Add),
            7
        );
        if sys::geteuid() == 0 {
            let other = d.path().join("other");
            std::fs::create_dir(&other).unwrap();
            std::os::unix::fs::chown(&other, Some(4242), None).unwrap();
            let e = Store::create(&other, "g", W).unwrap_err();
            assert!(e.msg().contains("owned by uid 4242"), "{}", e.msg());
        }
    }

    #[test]
    fn a_holder_past_the_bound_is_named_and_nothing_is_touched() {
        let d = tempfile::tempdir().unwrap();
        let mut s = Store::create(d.path(), "g", W).unwrap();
        s.write(&record("c1")).unwrap();
        drop(s);
        let holder = Holder::lock(&d.path().join("g/c1:eth0.json"));
        let short = Duration::from_millis(200);
        let mut s = Store::open_existing(d.path(), "g", short).unwrap().unwrap();
        for e in [
            s.read("c1", "eth0").unwrap_err(),
            s.remove("c1", "eth0").unwrap_err(),
            s.write(&record("c1")).unwrap_err(),
        ] {
            assert_eq!(e.code(Verb::Add), 11);
            assert!(
                e.msg()
                    .contains(&format!("held by process {}", holder.pid())),
                "{}",
                e.msg()
            );
        }
        assert_eq!(names(&d.path().join("g")), ["c1:eth0.json"]);
        // Once the holder is gone, the same store gets the attachment.
        drop(holder);
        assert_eq!(s.read("c1", "eth0").unwrap().unwrap(), record("c1"));
    }

    #[test]
    fn a_waiter_gets_the_attachment_when_the_holder_lets_go() {
        let d = tempfile::tempdir().unwrap();
        let mut s = Store::create(d.path(), "g", W).unwrap();
        s.write(&record("c1")).unwrap();
        drop(s);
        let holder = Holder::lock(&d.path().join("g/c1:eth0.json"));
        let release = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            drop(holder);
        });
        let mut s = Store::open_existing(d.path(), "g", W).unwrap().unwrap();
        assert_eq!(s.read("c1", "eth0").unwrap().unwrap(), record("c1"));
        release.join().unwrap();
    }

    #[test]
    fn the_exec_lock_is_handed_over_without_close_on_exec() {
        let d = tempfile::tempdir().unwrap();
        let mut s = Store::create(d.path(), "g", W).unwrap();
        assert!(s.exec_lock().unwrap().is_none());
        s.write(&record("c1")).unwrap();
        let fd = s
            .exec_lock()
            .unwrap()
            .expect("the written attachment is held");
        let flags = nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_GETFD).unwrap();
        assert_eq!(flags & libc::FD_CLOEXEC, 0);
        // The store no longer holds it: dropping the store leaves the record alone.
        drop(s);
        assert_eq!(names(&d.path().join("g")), ["c1:eth0.json"]);
    }
}
