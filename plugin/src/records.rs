//! The guard's records: for each attachment made through the guard, the delegate configuration
//! it was made with, so DEL (and CHECK) use it after the delegate file is gone or has changed.
//!
//! Layout:
//!
//! ```text
//! <cacheDir>/                             0700, a real directory owned by the guard's user,
//!                                         writable by nobody else (group included)
//!   .<network>.lock                       0600, the attachments' locks: one byte each
//!   <network>/                            0700, one per guard network name
//!     <containerID>:<ifname>.json         0600, one record per attachment
//!     .<containerID>:<ifname>.json.tmp    a record being written
//! ```
//!
//! `:` can appear in neither a container ID nor an interface name (both validated before they
//! reach a path), so the file name is unambiguous; a network name never starts with `.`, so the
//! lock file is never a network's folder. A record is written to its temp file and renamed into
//! place: a reader sees the old record or the new one, never a part. There is no fsync: records
//! are written on every pod start, the page cache outlives a killed process, and libcni and
//! Multus do not fsync their caches either.
//!
//! Every file is opened relative to the directory descriptor this store opened, with
//! `O_NOFOLLOW`, and listed through it: a symlink planted in the cache dir is never followed,
//! and a directory swapped in at the same path is never touched.
//!
//! **Serialisation.** ADD and DEL of the same attachment exclude each other with a POSIX record
//! lock on one byte of the network's lock file, at an offset hashed from the attachment's name
//! ([`lock_offset`]; two attachments that share one merely wait for each other). It is taken
//! before the record is read or written and held until the delegate has finished, waited for
//! at most `lockWaitSeconds`. A POSIX lock belongs to the process that took it: it is kept
//! across `execve` (ADD may end by exec'ing the delegate, which then holds the attachment until
//! it exits: [`Store::exec_lock`]) and is not inherited by `fork`, so nothing the delegate starts
//! holds it after the delegate is gone. Two rules follow: a process holds one attachment at a
//! time, and it never opens and closes a second descriptor of the lock file (closing any
//! descriptor of a file drops the process's locks on it). The holder also removes the temp file
//! a killed writer of its attachment left.
//!
//! A record file holds `{"containerID", "ifname", "network", "cniVersion", "delegatePath",
//! "delegate"}`, `delegate` being the delegate file's JSON as it was at ADD.

use std::io::{self, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::error::{Error, Kind, Result};
use crate::names;
use crate::sys::{self, at, Expect};

const MAX_RECORD_BYTES: u64 = 16 << 20;

/// What DEL needs to know about an attachment: the record file's JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    #[serde(rename = "containerID")]
    pub container_id: String,
    pub ifname: String,
    pub network: String,
    pub cni_version: String,
    pub delegate_path: PathBuf,
    /// The delegate configuration's bytes, as loaded at ADD (JSON already validated): written
    /// into the record as they are, never parsed again on the way.
    #[serde(serialize_with = "raw_out", deserialize_with = "raw_in")]
    pub delegate: Vec<u8>,
}

fn raw_out<S: serde::Serializer>(bytes: &[u8], s: S) -> std::result::Result<S::Ok, S::Error> {
    let raw: &RawValue = serde_json::from_slice(bytes).map_err(serde::ser::Error::custom)?;
    raw.serialize(s)
}

fn raw_in<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Vec<u8>, D::Error> {
    Box::<RawValue>::deserialize(d).map(|raw| raw.get().as_bytes().to_vec())
}

impl Record {
    /// The record file's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = serde_json::to_vec(self).expect("a loaded delegate always serializes");
        out.push(b'\n');
        out
    }

    /// Parses a record file's bytes; the error says why.
    pub fn decode(bytes: &[u8]) -> std::result::Result<Record, serde_json::Error> {
        serde_json::from_slice(bytes)
    }
}

/// The records of one guard network, and the one attachment this process holds locked.
#[derive(Debug)]
pub struct Store {
    dir: PathBuf,
    fd: OwnedFd,
    /// The network's lock file; `None` on a read-only cache dir that has none (nothing to lock:
    /// nothing can be written there either).
    locks: Option<OwnedFd>,
    /// The byte this process holds locked, with its attachment's record name.
    held: Option<(String, u64)>,
    lock_wait: Duration,
}

fn io_error(path: &Path, what: &str, e: &io::Error) -> Error {
    Error::new(Kind::Io, format!("cannot {what} {}: {e}", path.display()))
}

/// The cache dir or the network's folder is not one the guard may keep records in.
fn untrusted(path: &Path, why: &str) -> Error {
    let msg = format!("cacheDir {} {why}", path.display());
    Error::new(Kind::Misconfigured, msg)
        .with_details("the guard keeps its records only in a private directory it owns")
}

impl Store {
    /// Opens `<cache_dir>/<network>`, creating both as needed. Refuses a cache dir that is a
    /// symlink, not a directory, owned by another user, or writable by its group or others.
    pub fn create(cache_dir: &Path, network: &str, lock_wait: Duration) -> Result<Store> {
        Self::open(cache_dir, network, lock_wait, true)?
            .ok_or_else(|| io_error(cache_dir, "create", &io::ErrorKind::NotFound.into()))
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
        wait: Duration,
        create: bool,
    ) -> Result<Option<Store>> {
        names::network_name(network).map_err(|why| {
            let msg = format!("network name {why}: it cannot name a record directory");
            Error::new(Kind::Misconfigured, msg)
        })?;
        if let Some(parent) = cache_dir.parent().filter(|_| create) {
            std::fs::create_dir_all(parent).map_err(|e| io_error(parent, "create", &e))?;
        }
        let Some(top) = open_dir(None, cache_dir, create)? else {
            return Ok(None);
        };
        let dir = cache_dir.join(network);
        let Some(fd) = open_dir(Some(&top), &dir, create)? else {
            return Ok(None);
        };
        let lock_name = format!(".{network}.lock");
        let lock_path = cache_dir.join(&lock_name);
        let locks = match at::open_lock(&top, &lock_name) {
            Ok(fd) => Some(fd),
            Err(e) if e.raw_os_error() == Some(libc::EROFS) => None,
            Err(e) => return Err(io_error(&lock_path, "open", &e)),
        };
        if let Some(l) = &locks {
            sys::trust(l, Expect::File).map_err(|why| untrusted(&lock_path, &why))?;
        }
        Ok(Some(Store {
            dir,
            fd,
            locks,
            held: None,
            lock_wait: wait,
        }))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Writes the record atomically, with the attachment locked; the lock stays held until the
    /// store is dropped (or handed to an exec'd delegate by [`exec_lock`](Store::exec_lock)),
    /// so a DEL of the same attachment waits for the ADD to finish. Another process holding the
    /// attachment past `lockWaitSeconds`: code 11.
    pub fn write(&mut self, record: &Record) -> Result<()> {
        let name = self.lock(&record.container_id, &record.ifname)?;
        // Only the attachment's holder writes its temp file: one there is a killed writer's.
        let tmp = temp_name(&name);
        at::unlink(&self.fd, &tmp)
            .and_then(|()| at::write_replace(&self.fd, &name, &tmp, &record.encode(), 0o600, false))
            .map_err(|e| io_error(&self.dir.join(&name), "write", &e))
    }

    /// Hands the lock over for an exec: the lock file's descriptor, no longer close-on-exec, for
    /// the caller to keep open until it execs the delegate, which then holds the attachment until
    /// it exits. `Ok(None)` when nothing is held. On failure the lock stays with the store.
    pub fn exec_lock(&mut self) -> io::Result<Option<OwnedFd>> {
        match (&self.held, &self.locks) {
            (Some(_), Some(fd)) => sys::set_cloexec(fd.as_fd(), false)?,
            _ => return Ok(None),
        }
        Ok(self.locks.take())
    }

    /// Locks an attachment (waiting at most `lockWaitSeconds`) and reads its record; `None` when
    /// there is none. The attachment stays locked until the store is dropped (or another is
    /// locked), so the caller can tear it down and [`remove`](Store::remove) the record without
    /// an ADD in between. Another process holding it past the bound: code 11; a record that
    /// cannot be trusted, read or parsed: code 5, for the caller to log and carry on.
    pub fn read(&mut self, container_id: &str, ifname: &str) -> Result<Option<Record>> {
        let name = self.lock(container_id, ifname)?;
        let path = self.dir.join(&name);
        let fd = match at::open_read(&self.fd, &name) {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
            other => other.map_err(|e| io_error(&path, "open record", &e))?,
        };
        let bad = |why: String| Error::new(Kind::Io, format!("record {} {why}", path.display()));
        // Trusted only if only the guard's user could have written it: a record names the
        // delegate that DEL runs as that user.
        sys::trust(&fd, Expect::File).map_err(|why| bad(format!("{why}: not trusted")))?;
        let mut bytes = Vec::new();
        let mut file = std::fs::File::from(fd).take(MAX_RECORD_BYTES);
        file.read_to_end(&mut bytes)
            .map_err(|e| io_error(&path, "read record", &e))?;
        if bytes.is_empty() {
            // A placeholder an earlier version left: no record.
            return Ok(None);
        }
        let record = Record::decode(&bytes).map_err(|e| bad(format!("is corrupt: {e}")))?;
        if record.container_id != container_id || record.ifname != ifname {
            return Err(bad("belongs to another attachment".to_owned()));
        }
        Ok(Some(record))
    }

    /// Removes an attachment's record (and a temp file a killed writer left); a missing record
    /// is fine.
    pub fn remove(&mut self, container_id: &str, ifname: &str) -> Result<()> {
        let name = self.lock(container_id, ifname)?;
        for n in [temp_name(&name), name] {
            at::unlink(&self.fd, &n).map_err(|e| io_error(&self.dir.join(&n), "remove", &e))?;
        }
        Ok(())
    }

    /// Every record's attachment, as `(containerID, ifname)`, read from the names in the
    /// directory this store opened. A name that is no attachment's (`notes.json`, a container
    /// ID the spec's rules refuse) is none of the guard's records, and left out.
    pub fn list(&self) -> Result<Vec<(String, String)>> {
        let mut out: Vec<(String, String)> = self
            .names()?
            .iter()
            .filter_map(|n| parse_name(n))
            .filter(|(id, ifname)| file_name(id, ifname).is_ok())
            .map(|(id, ifname)| (id.to_owned(), ifname.to_owned()))
            .collect();
        out.sort();
        Ok(out)
    }

    /// Removes every record but those of `valid` attachments; returns what failed. Only the
    /// attachments free at once are taken: one held by another process (an ADD or DEL of it under
    /// way) is in use now, whatever the runtime's list said when it was made, and is left alone.
    pub fn keep_only(&mut self, valid: &[(String, String)]) -> Vec<Error> {
        let records = match self.list() {
            Ok(records) => records,
            Err(e) => return vec![e],
        };
        let mut errors = Vec::new();
        for (id, ifname) in records.iter().filter(|r| !valid.contains(r)) {
            let name = file_name(id, ifname).expect("list() names attachments only");
            match self.try_lock(&name, Instant::now()) {
                Err(e) if *e.kind() == Kind::Busy => {}
                locked => errors.extend(locked.and_then(|()| self.remove(id, ifname)).err()),
            }
        }
        errors
    }

    /// Removes temp files whose writer is gone (its attachment is not locked). Returns how many
    /// were removed. Lets go of the attachment this store held.
    pub fn sweep_temp_files(&mut self) -> usize {
        self.release();
        let mut removed = 0;
        for tmp in self.names().unwrap_or_default() {
            let Some(record) = record_of_temp(&tmp) else {
                continue;
            };
            // A writer holds its attachment's lock: if we get it at once, nobody is writing.
            if self.try_lock(record, Instant::now()).is_ok() && at::unlink(&self.fd, &tmp).is_ok() {
                removed += 1;
            }
            self.release();
        }
        removed
    }

    fn names(&self) -> Result<Vec<String>> {
        at::list(&self.fd).map_err(|e| io_error(&self.dir, "list", &e))
    }

    /// Makes the attachment the one this process holds locked (waiting at most the bound),
    /// releasing any other; returns its record's name.
    fn lock(&mut self, container_id: &str, ifname: &str) -> Result<String> {
        let name = file_name(container_id, ifname)?;
        self.try_lock(&name, Instant::now() + self.lock_wait)?;
        Ok(name)
    }

    /// Makes the attachment whose record is `name` the one held, waiting until `deadline`.
    fn try_lock(&mut self, name: &str, deadline: Instant) -> Result<()> {
        if self.held.as_ref().is_some_and(|(n, _)| n == name) {
            return Ok(());
        }
        self.release();
        let Some(locks) = &self.locks else {
            return Ok(());
        };
        let (start, offset) = (Instant::now(), lock_offset(name));
        let mut pause = Duration::from_millis(1);
        let failed = |e: io::Error| io_error(&self.dir, "lock an attachment in", &e);
        while let Some(holder) = at::lock_byte(locks, offset).map_err(failed)? {
            if Instant::now() >= deadline {
                return Err(busy_error(name, holder, start.elapsed()));
            }
            std::thread::sleep(pause.min(deadline - Instant::now()));
            pause = (pause * 2).min(Duration::from_millis(25));
        }
        self.held = Some((name.to_owned(), offset));
        // Whoever holds the attachment is the only one who could be writing its temp file: one
        // that is there now is a killed writer's.
        let _ = at::unlink(&self.fd, temp_name(name));
        Ok(())
    }

    fn release(&mut self) {
        if let (Some((_, offset)), Some(locks)) = (self.held.take(), &self.locks) {
            let _ = at::unlock_byte(locks, offset);
        }
    }
}

/// Opens a directory the guard keeps records in (creating it when asked and missing), relative
/// to `parent` or by path, checked as it was opened; `None` when it is missing and not created.
fn open_dir(parent: Option<&OwnedFd>, path: &Path, create: bool) -> Result<Option<OwnedFd>> {
    let name = parent.and(path.file_name()).unwrap_or(path.as_os_str());
    let fd = match at::open_dir(parent, name) {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) && !create => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => match at::mkdir(parent, name, 0o700) {
            Err(e) if e.raw_os_error() != Some(libc::EEXIST) => {
                return Err(io_error(path, "create", &e))
            }
            _ => at::open_dir(parent, name),
        },
        other => other,
    };
    let fd = fd.map_err(|e| match e.raw_os_error() {
        Some(libc::ELOOP) => untrusted(path, "is a symlink"),
        Some(libc::ENOTDIR) if path.is_symlink() => untrusted(path, "is a symlink"),
        Some(libc::ENOTDIR) => untrusted(path, "is not a directory"),
        _ => io_error(path, "open", &e),
    })?;
    sys::trust(&fd, Expect::Dir).map_err(|why| untrusted(path, &why))?;
    Ok(Some(fd))
}

/// The attachment whose record is `name` is held by `holder` past the bound.
fn busy_error(name: &str, holder: i32, waited: Duration) -> Error {
    let (container_id, ifname) = parse_name(name).unwrap_or_default();
    let who = match holder {
        0 => "another process".to_owned(),
        pid => format!("process {pid}"),
    };
    Error::new(Kind::Busy, format!(
        "cni-guard: attachment {container_id}/{ifname} is held by {who} (an ADD or DEL of it still running) after waiting {:.1}s",
        waited.as_secs_f64()
    ))
    .with_details("lockWaitSeconds bounds the wait; the runtime retries")
}

/// The byte of the lock file that stands for the attachment whose record is `name` (FNV-1a,
/// within the first TiB).
pub fn lock_offset(name: &str) -> u64 {
    let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    hash & ((1 << 40) - 1)
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

/// The record a temp file belongs to: `.<record>.tmp`, `<record>` a record's name.
fn record_of_temp(name: &str) -> Option<&str> {
    let record = name.strip_prefix('.')?.strip_suffix(".tmp")?;
    parse_name(record).map(|_| record)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::Command as Verb;
    use std::io::{BufRead, BufReader};
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use std::process::{Child, Command, Stdio};

    const W: Duration = Duration::from_secs(5);

    /// Another process holding the POSIX write lock of attachment `c1:eth0` of network `g`
    /// under `cache` (POSIX locks never conflict within one process, so the holder must be
    /// another one), until it is killed.
    struct Holder(Child);

    impl Holder {
        fn lock(cache: &Path) -> Holder {
            Holder::lock_record(cache, "c1:eth0.json")
        }
        /// The same for the attachment whose record is `name`.
        fn lock_record(cache: &Path, name: &str) -> Holder {
            let mut child = Command::new("python3")
                .args([
                    "-c",
                    "import fcntl,sys,time\n\
                     f=open(sys.argv[1],'r+')\n\
                     fcntl.lockf(f,fcntl.LOCK_EX,1,int(sys.argv[2]))\n\
                     print('locked',flush=True)\n\
                     time.sleep(60)",
                ])
                .arg(cache.join(".g.lock"))
                .arg(lock_offset(name).to_string())
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

    /// GC takes only the records that are free at once: it neither waits lockWaitSeconds for
    /// each busy one, nor removes the record of an attachment that was in use while it waited
    /// (an ADD that ends while GC waits has just made that record).
    #[test]
    fn keep_only_takes_only_records_free_at_once() {
        let d = tempfile::tempdir().unwrap();
        let mut s = Store::create(d.path(), "g", W).unwrap();
        for id in ["c1", "c2", "c3", "c4"] {
            s.write(&record(id)).unwrap();
        }
        drop(s);
        // Three ADDs under way, ending within 300 ms; c4 free.
        let held: Vec<Holder> = ["c1", "c2", "c3"]
            .iter()
            .map(|id| Holder::lock_record(d.path(), &format!("{id}:eth0.json")))
            .collect();
        let release = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            drop(held);
        });
        let mut gc = Store::open_existing(d.path(), "g", Duration::from_secs(2))
            .unwrap()
            .unwrap();
        let start = Instant::now();
        let errors = gc.keep_only(&[]);
        let took = start.elapsed();
        release.join().unwrap();
        assert!(errors.is_empty(), "{errors:?}");
        assert!(took < Duration::from_millis(300), "GC waited {took:?}");
        assert_eq!(
            gc.list().unwrap(),
            ["c1", "c2", "c3"].map(|id| (id.to_owned(), "eth0".to_owned()))
        );
    }

    /// A file in the records folder whose name is no attachment's is none of the guard's: it is
    /// not listed, so GC neither fails on it nor removes it.
    #[test]
    fn names_that_are_no_attachments_are_not_records() {
        let d = tempfile::tempdir().unwrap();
        let mut s = Store::create(d.path(), "g", W).unwrap();
        s.write(&record("c1")).unwrap();
        for odd in [
            "notes.json",
            "bad id!:eth0.json",
            "c2:eth0:x.json",
            "c3:.json",
        ] {
            std::fs::write(s.dir().join(odd), "{}").unwrap();
        }
        assert_eq!(s.list().unwrap(), [("c1".to_owned(), "eth0".to_owned())]);
        assert!(s.keep_only(&[]).is_empty());
        assert_eq!(
            names(&d.path().join("g")),
            [
                "bad id!:eth0.json",
                "c2:eth0:x.json",
                "c3:.json",
                "notes.json"
            ]
        );
    }

    #[test]
    fn sweeps_temp_files_of_unlocked_attachments_only() {
        let d = tempfile::tempdir().unwrap();
        let mut writer = Store::create(d.path(), "g", W).unwrap();
        writer.write(&record("c1")).unwrap();
        drop(writer);
        // c1 is locked by a live writer: its temp file is in progress, not stale.
        let _writer = Holder::lock(d.path());
        let live = d.path().join("g/.c1:eth0.json.tmp");
        let dead = d.path().join("g/.c2:eth0.json.tmp");
        for p in [&live, &dead] {
            std::fs::write(p, "{").unwrap();
        }
        let mut gc = Store::open_existing(d.path(), "g", W).unwrap().unwrap();
        assert_eq!(gc.sweep_temp_files(), 1);
        assert!(live.exists());
        assert!(!dead.exists());
        // Locking c2 to sweep left nothing behind.
        assert_eq!(gc.list().unwrap(), [("c1".to_owned(), "eth0".to_owned())]);
        assert_eq!(
            names(&d.path().join("g")),
            [".c1:eth0.json.tmp", "c1:eth0.json"]
        );
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
        // Killed mid-way through a new attachment's temp file: no record, and the next holder
        // removes the temp file.
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
        // An empty placeholder an earlier version left is no record, and DEL removes it.
        std::fs::write(d.path().join("g/c2:eth0.json"), "").unwrap();
        let mut s = Store::open_existing(d.path(), "g", W).unwrap().unwrap();
        assert_eq!(s.read("c2", "eth0").unwrap(), None);
        s.remove("c2", "eth0").unwrap();
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
        assert_eq!(s.read("c1", "eth0").unwrap_err().code(Verb::Add), 5);
        // A write replaces the link itself (a rename), never what it points at.
        s.write(&record("c1")).unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "precious");
        assert!(!s.dir().join("c1:eth0.json").is_symlink());
        assert_eq!(s.read("c1", "eth0").unwrap().unwrap(), record("c1"));
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
        let holder = Holder::lock(d.path());
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
        let holder = Holder::lock(d.path());
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
