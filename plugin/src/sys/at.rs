//! The `*at` system calls std does not wrap, on directory descriptors: how the record store
//! opens, creates, renames and locks files without following symlinks.

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use nix::errno::Errno;
use nix::fcntl::{fcntl, openat, renameat, FcntlArg, OFlag, AT_FDCWD};
use nix::sys::stat::{fstat as nix_fstat, fstatat, mkdirat, FileStat, Mode};
use nix::unistd::{linkat, unlinkat, UnlinkatFlags};

fn mode(bits: u32) -> Mode {
    Mode::from_bits_truncate(bits as nix::libc::mode_t)
}

/// Opens a directory, refusing a symlink in the last component; relative to `dir`, or to the
/// working directory without one.
pub fn open_dir(dir: Option<&OwnedFd>, name: &OsStr) -> io::Result<OwnedFd> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    Ok(match dir {
        Some(d) => openat(d, name, flags, Mode::empty())?,
        None => openat(AT_FDCWD, name, flags, Mode::empty())?,
    })
}

pub fn mkdir(dir: &OwnedFd, name: &OsStr, bits: u32) -> io::Result<()> {
    Ok(mkdirat(dir, name, mode(bits))?)
}

/// Creates a new file; fails if anything (a symlink included) has the name.
pub fn create_new(dir: &OwnedFd, name: &OsStr, bits: u32) -> io::Result<OwnedFd> {
    // Readable too: the writer keeps it as its lock and may read the record back through it.
    let flags =
        OFlag::O_RDWR | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    Ok(openat(dir, name, flags, mode(bits))?)
}

/// Creates an unnamed file in `dir` (`O_TMPFILE`), to be written and locked before
/// [`link_into`] gives it a name. Fails with `EOPNOTSUPP` (or `EISDIR`, `EINVAL` on old
/// kernels) where the file system cannot.
pub fn create_unnamed(dir: &OwnedFd, bits: u32) -> io::Result<OwnedFd> {
    let flags = OFlag::O_TMPFILE | OFlag::O_RDWR | OFlag::O_CLOEXEC;
    Ok(openat(dir, ".", flags, mode(bits))?)
}

/// Gives an unnamed file its name in `dir`; fails with `EEXIST` if the name is taken (by
/// anything, a symlink included). Through `/proc/self/fd`, which needs no capability, unlike
/// `AT_EMPTY_PATH`.
pub fn link_into(fd: &OwnedFd, dir: &OwnedFd, name: &OsStr) -> io::Result<()> {
    let proc_path = format!("/proc/self/fd/{}", fd.as_raw_fd());
    Ok(linkat(
        AT_FDCWD,
        proc_path.as_str(),
        dir,
        name,
        nix::fcntl::AtFlags::AT_SYMLINK_FOLLOW,
    )?)
}

/// Opens (creating if missing) a file to lock: read-write, as a POSIX write lock needs; on a
/// read-only file system an existing file read-only (then [`try_lock_record`] takes a read
/// lock). Non-blocking, so a planted FIFO cannot hang us.
pub fn open_lock(dir: &OwnedFd, name: &OsStr) -> io::Result<OwnedFd> {
    let flags = OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_CLOEXEC;
    match openat(
        dir,
        name,
        flags | OFlag::O_RDWR | OFlag::O_CREAT,
        mode(0o600),
    ) {
        Err(Errno::EROFS) => match openat(dir, name, flags | OFlag::O_RDONLY, Mode::empty()) {
            Err(Errno::ENOENT) => Err(Errno::EROFS.into()),
            other => Ok(other?),
        },
        other => Ok(other?),
    }
}

/// Opens an existing file to append to: never through a symlink, never creating it, never
/// blocking (a FIFO in its place).
pub fn open_append(dir: &OwnedFd, name: &OsStr) -> io::Result<OwnedFd> {
    let flags = OFlag::O_WRONLY
        | OFlag::O_APPEND
        | OFlag::O_NOFOLLOW
        | OFlag::O_NONBLOCK
        | OFlag::O_NOCTTY
        | OFlag::O_CLOEXEC;
    Ok(openat(dir, name, flags, Mode::empty())?)
}

/// Opens an existing file to append to by its full path in one call, refusing a symlink in any
/// component (`openat2` with `RESOLVE_NO_SYMLINKS`, Linux 5.6+); `ENOSYS` before that.
pub fn open_append_no_symlinks(path: &std::path::Path) -> io::Result<OwnedFd> {
    use nix::fcntl::{openat2, OpenHow, ResolveFlag};
    let how = OpenHow::new()
        .flags(
            OFlag::O_WRONLY
                | OFlag::O_APPEND
                | OFlag::O_NONBLOCK
                | OFlag::O_NOCTTY
                | OFlag::O_CLOEXEC,
        )
        .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    Ok(openat2(AT_FDCWD, path, how)?)
}

pub fn unlink(dir: &OwnedFd, name: &OsStr) -> io::Result<()> {
    Ok(unlinkat(dir, name, UnlinkatFlags::NoRemoveDir)?)
}

pub fn rename(dir: &OwnedFd, from: &OsStr, to: &OsStr) -> io::Result<()> {
    Ok(renameat(dir, from, dir, to)?)
}

pub fn fstat(fd: impl AsFd) -> io::Result<FileStat> {
    Ok(nix_fstat(fd)?)
}

/// `stat` of a name in a directory, not following a symlink.
pub fn lstat(dir: &OwnedFd, name: &OsStr) -> io::Result<FileStat> {
    Ok(fstatat(
        dir,
        name,
        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
    )?)
}

/// Tries once to take a POSIX record lock on the whole file: a write lock, or a read lock on a
/// descriptor open read-only. `Ok(None)` when taken, `Ok(Some(pid))` when another process holds
/// a conflicting lock (pid 0 if it let go meanwhile).
pub fn try_lock_record(fd: &OwnedFd) -> io::Result<Option<i32>> {
    let access = OFlag::from_bits_retain(fcntl(fd, FcntlArg::F_GETFL)?) & OFlag::O_ACCMODE;
    let kind = if access == OFlag::O_RDONLY {
        libc::F_RDLCK
    } else {
        libc::F_WRLCK
    };
    let whole = || libc::flock {
        l_type: kind as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: 0,
        l_len: 0,
        l_pid: 0,
    };
    loop {
        match fcntl(fd, FcntlArg::F_SETLK(&whole())) {
            Ok(_) => return Ok(None),
            Err(Errno::EINTR) => continue,
            Err(Errno::EAGAIN | Errno::EACCES) => {
                let mut probe = whole();
                fcntl(fd, FcntlArg::F_GETLK(&mut probe))?;
                let unlocked = probe.l_type == libc::F_UNLCK as libc::c_short;
                return Ok(Some(if unlocked { 0 } else { probe.l_pid }));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Reads a whole file from offset 0 (up to `max` bytes), whatever the descriptor's position.
pub fn pread_all(fd: &OwnedFd, max: u64, out: &mut Vec<u8>) -> io::Result<()> {
    let mut buf = [0u8; 8192];
    let mut off: u64 = 0;
    while off < max {
        match nix::sys::uio::pread(fd, &mut buf, off as libc::off_t) {
            Ok(0) => break,
            Ok(n) => {
                out.extend_from_slice(&buf[..n]);
                off += n as u64;
            }
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}
