//! The directory-relative calls of the record store and the events file: opening, creating,
//! renaming, listing and locking files through directory descriptors, never following a symlink
//! in the last component.

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use nix::errno::Errno;
use nix::fcntl::{fcntl, openat, renameat, FcntlArg, OFlag, AT_FDCWD};
use nix::sys::stat::{mkdirat, Mode};
use nix::unistd::{unlinkat, UnlinkatFlags};

fn mode(bits: u32) -> Mode {
    Mode::from_bits_truncate(bits as nix::libc::mode_t)
}

/// Never through a symlink, never blocking (a FIFO in its place), never a controlling terminal.
const SAFE: OFlag = OFlag::O_NOFOLLOW
    .union(OFlag::O_NONBLOCK)
    .union(OFlag::O_NOCTTY)
    .union(OFlag::O_CLOEXEC);

/// `dir`, or the working directory without one.
fn base(dir: Option<&OwnedFd>) -> BorrowedFd<'_> {
    dir.map_or(AT_FDCWD, |d| d.as_fd())
}

/// Opens `name` relative to `dir` with [`SAFE`]; a file it creates (the lock file) is 0600.
fn open(dir: BorrowedFd, name: impl AsRef<OsStr>, flags: OFlag) -> io::Result<OwnedFd> {
    Ok(openat(dir, name.as_ref(), flags | SAFE, mode(0o600))?)
}

/// Opens a directory, refusing a symlink in the last component; relative to `dir`, or to the
/// working directory without one.
pub fn open_dir(dir: Option<&OwnedFd>, name: impl AsRef<OsStr>) -> io::Result<OwnedFd> {
    open(base(dir), name, OFlag::O_RDONLY | OFlag::O_DIRECTORY)
}

pub fn mkdir(dir: Option<&OwnedFd>, name: impl AsRef<OsStr>, bits: u32) -> io::Result<()> {
    Ok(mkdirat(base(dir), name.as_ref(), mode(bits))?)
}

/// Opens an existing file to read.
pub fn open_read(dir: &OwnedFd, name: impl AsRef<OsStr>) -> io::Result<OwnedFd> {
    open(dir.as_fd(), name, OFlag::O_RDONLY)
}

/// Opens an existing file to append to.
pub fn open_append(dir: &OwnedFd, name: impl AsRef<OsStr>) -> io::Result<OwnedFd> {
    open(dir.as_fd(), name, OFlag::O_WRONLY | OFlag::O_APPEND)
}

/// Opens (creating if missing, 0600) a file to lock: read-write, as a POSIX write lock needs; on
/// a read-only file system an existing file read-only (then [`lock_byte`] takes a read lock).
pub fn open_lock(dir: &OwnedFd, name: impl AsRef<OsStr>) -> io::Result<OwnedFd> {
    let name = name.as_ref();
    match open(dir.as_fd(), name, OFlag::O_RDWR | OFlag::O_CREAT) {
        Err(e) if e.raw_os_error() == Some(libc::EROFS) => match open_read(dir, name) {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Err(Errno::EROFS.into()),
            other => other,
        },
        other => other,
    }
}

/// Removes a directory entry (never a directory); a missing one is fine.
pub fn unlink(dir: &OwnedFd, name: impl AsRef<OsStr>) -> io::Result<()> {
    match unlinkat(dir, name.as_ref(), UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The names in the directory `dir` is open on (`.` and `..` and names that are not UTF-8
/// left out): read through the descriptor, not by path.
pub fn list(dir: &OwnedFd) -> io::Result<Vec<String>> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let mut d = nix::dir::Dir::openat(dir.as_fd(), ".", flags, Mode::empty())?;
    let mut names = Vec::new();
    for entry in d.iter() {
        match entry?.file_name().to_str() {
            Ok("." | "..") | Err(_) => {}
            Ok(name) => names.push(name.to_owned()),
        }
    }
    Ok(names)
}

fn byte(kind: libc::c_int, offset: u64) -> libc::flock {
    libc::flock {
        l_type: kind as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: offset as libc::off_t,
        l_len: 1,
        l_pid: 0,
    }
}

/// Tries once to take a POSIX record lock on one byte: a write lock, or a read lock on a
/// descriptor open read-only. `Ok(None)` when taken, `Ok(Some(pid))` when another process holds
/// a conflicting lock (pid 0 if it let go meanwhile).
pub fn lock_byte(fd: &OwnedFd, offset: u64) -> io::Result<Option<i32>> {
    let access = OFlag::from_bits_retain(fcntl(fd, FcntlArg::F_GETFL)?) & OFlag::O_ACCMODE;
    let kind = match access == OFlag::O_RDONLY {
        true => libc::F_RDLCK,
        false => libc::F_WRLCK,
    };
    loop {
        match fcntl(fd, FcntlArg::F_SETLK(&byte(kind, offset))) {
            Ok(_) => return Ok(None),
            Err(Errno::EINTR) => continue,
            Err(Errno::EAGAIN | Errno::EACCES) => {
                let mut probe = byte(kind, offset);
                fcntl(fd, FcntlArg::F_GETLK(&mut probe))?;
                let unlocked = probe.l_type == libc::F_UNLCK as libc::c_short;
                return Ok(Some(if unlocked { 0 } else { probe.l_pid }));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

pub fn unlock_byte(fd: &OwnedFd, offset: u64) -> io::Result<()> {
    fcntl(fd, FcntlArg::F_SETLK(&byte(libc::F_UNLCK, offset)))?;
    Ok(())
}

/// The one atomic writer: `bytes` into `<dir>/<tmp>`, a new file (with `mode`) that this call
/// creates, closed, then renamed over `name`, so a reader sees the old file or the new one, never
/// a part, and an exec of the new file never meets `ETXTBSY` (a file open for writing cannot be
/// run). With `sync`, the data is on disk before the rename and the rename after it (a node's
/// configuration); without, the page cache is enough (the records, written on every pod start).
/// A `tmp` that is there already is another writer's (or a killed one's, for the caller to
/// remove): the call fails with `EEXIST` and leaves it. On failure the temp file this call made
/// is removed.
pub fn write_replace(
    dir: &OwnedFd,
    name: &str,
    tmp: &str,
    bytes: &[u8],
    mode: u32,
    sync: bool,
) -> io::Result<()> {
    // A new file: fails if anything (a symlink included) has the name.
    let new = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL;
    let mut file = std::fs::File::from(openat(dir, tmp, new | SAFE, self::mode(mode))?);
    let result = (|| {
        io::Write::write_all(&mut file, bytes)?;
        // The umask may have narrowed the mode given at creation.
        file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(mode))?;
        if sync {
            file.sync_all()?;
        }
        drop(file);
        renameat(dir, tmp, dir, name)?;
        if sync {
            nix::unistd::fsync(dir)?;
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = unlink(dir, tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

    /// The new file is closed before it is renamed into place: an exec of a freshly installed
    /// plugin never finds it open for writing (`ETXTBSY`). Seen from inotify: the temp file's
    /// IN_CLOSE_WRITE comes before the IN_MOVED_TO of the name.
    #[test]
    fn the_new_file_is_closed_before_it_is_renamed() {
        let d = tempfile::tempdir().unwrap();
        let dir = open_dir(None, d.path()).unwrap();
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK).unwrap();
        let mask = AddWatchFlags::IN_CLOSE_WRITE | AddWatchFlags::IN_MOVED_TO;
        inotify.add_watch(d.path(), mask).unwrap();
        for sync in [false, true] {
            write_replace(&dir, "plugin", ".plugin.1.tmp", b"#!/bin/sh\n", 0o755, sync).unwrap();
            let events: Vec<(String, bool)> = inotify
                .read_events()
                .unwrap()
                .iter()
                .map(|e| {
                    let name = e.name.as_ref().unwrap().to_string_lossy().into_owned();
                    (name, e.mask.contains(AddWatchFlags::IN_MOVED_TO))
                })
                .collect();
            assert_eq!(
                events,
                [
                    (".plugin.1.tmp".to_owned(), false),
                    ("plugin".to_owned(), true)
                ],
                "sync={sync}: want the temp file closed, then renamed"
            );
        }
    }

    /// A temp file that is there is another writer's: the call fails and leaves it whole.
    #[test]
    fn never_touches_a_temp_file_it_did_not_make() {
        let d = tempfile::tempdir().unwrap();
        let dir = open_dir(None, d.path()).unwrap();
        std::fs::write(d.path().join(".c.tmp"), "another writer's").unwrap();
        let e = write_replace(&dir, "c", ".c.tmp", b"mine", 0o644, false).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EEXIST));
        assert_eq!(
            std::fs::read_to_string(d.path().join(".c.tmp")).unwrap(),
            "another writer's"
        );
        assert!(!d.path().join("c").exists());
    }
}
