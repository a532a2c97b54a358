//! The `*at` system calls std does not wrap, on directory descriptors: how the record store
//! opens, creates, renames and locks files without following symlinks.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;

fn cstr(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

fn dirfd(dir: Option<&OwnedFd>) -> RawFd {
    dir.map_or(libc::AT_FDCWD, AsRawFd::as_raw_fd)
}

fn owned(fd: libc::c_int) -> io::Result<OwnedFd> {
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just returned by the kernel and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn check(r: libc::c_int) -> io::Result<()> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Opens a directory, refusing a symlink in the last component.
pub fn open_dir(dir: Option<&OwnedFd>, name: &OsStr) -> io::Result<OwnedFd> {
    let c = cstr(name)?;
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: c is a valid C string; the flags need no further arguments.
    owned(unsafe { libc::openat(dirfd(dir), c.as_ptr(), flags) })
}

pub fn mkdir(dir: &OwnedFd, name: &OsStr, mode: libc::mode_t) -> io::Result<()> {
    let c = cstr(name)?;
    // SAFETY: c is a valid C string; dir is an open directory.
    check(unsafe { libc::mkdirat(dir.as_raw_fd(), c.as_ptr(), mode) })
}

/// Creates a new file; fails if anything (a symlink included) has the name.
pub fn create_new(dir: &OwnedFd, name: &OsStr, mode: libc::mode_t) -> io::Result<OwnedFd> {
    let c = cstr(name)?;
    // Readable too: the writer keeps it as its lock and may read the record back through it.
    let flags = libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: c is a valid C string; O_CREAT takes the mode as third argument.
    owned(unsafe { libc::openat(dir.as_raw_fd(), c.as_ptr(), flags, libc::c_uint::from(mode)) })
}

/// Creates an unnamed file in `dir` (`O_TMPFILE`), to be written and locked before
/// [`link_into`] gives it a name. Fails with `EOPNOTSUPP` (or `EISDIR`, `EINVAL` on old
/// kernels) where the file system cannot.
pub fn create_unnamed(dir: &OwnedFd, mode: libc::mode_t) -> io::Result<OwnedFd> {
    let flags = libc::O_TMPFILE | libc::O_RDWR | libc::O_CLOEXEC;
    // SAFETY: "." is a valid C string; O_TMPFILE takes the mode as third argument.
    owned(unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c".".as_ptr(),
            flags,
            libc::c_uint::from(mode),
        )
    })
}

/// Gives an unnamed file its name in `dir`; fails with `EEXIST` if the name is taken (by
/// anything, a symlink included). Through `/proc/self/fd`, which needs no capability, unlike
/// `AT_EMPTY_PATH`.
pub fn link_into(fd: &OwnedFd, dir: &OwnedFd, name: &OsStr) -> io::Result<()> {
    let c = cstr(name)?;
    let proc_path =
        CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd())).expect("no NUL in a number");
    // SAFETY: both are valid C strings; the directory descriptor is open.
    check(unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            proc_path.as_ptr(),
            dir.as_raw_fd(),
            c.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    })
}

/// Opens (creating if missing) a file to lock: read-write, as a POSIX write lock needs; on a
/// read-only file system an existing file read-only (then [`try_lock_record`] takes a read
/// lock). Non-blocking, so a planted FIFO cannot hang us.
pub fn open_lock(dir: &OwnedFd, name: &OsStr) -> io::Result<OwnedFd> {
    let c = cstr(name)?;
    let flags = libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC;
    // SAFETY: c is a valid C string; O_CREAT takes the mode as third argument.
    let rw = owned(unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c.as_ptr(),
            flags | libc::O_RDWR | libc::O_CREAT,
            0o600 as libc::c_uint,
        )
    });
    match rw {
        Err(e) if e.raw_os_error() == Some(libc::EROFS) => {
            // SAFETY: c is a valid C string; no O_CREAT, so no mode.
            owned(unsafe { libc::openat(dir.as_raw_fd(), c.as_ptr(), flags | libc::O_RDONLY) })
                .map_err(|e2| {
                    if e2.raw_os_error() == Some(libc::ENOENT) {
                        e
                    } else {
                        e2
                    }
                })
        }
        other => other,
    }
}

pub fn unlink(dir: &OwnedFd, name: &OsStr) -> io::Result<()> {
    let c = cstr(name)?;
    // SAFETY: c is a valid C string; dir is an open directory.
    check(unsafe { libc::unlinkat(dir.as_raw_fd(), c.as_ptr(), 0) })
}

pub fn rename(dir: &OwnedFd, from: &OsStr, to: &OsStr) -> io::Result<()> {
    let (f, t) = (cstr(from)?, cstr(to)?);
    let d = dir.as_raw_fd();
    // SAFETY: f and t are valid C strings; d is an open directory.
    check(unsafe { libc::renameat(d, f.as_ptr(), d, t.as_ptr()) })
}

pub fn fstat(fd: &OwnedFd) -> io::Result<libc::stat> {
    // SAFETY: an all-zero stat is a valid value to be overwritten.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fd is open; st is writable.
    check(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) })?;
    Ok(st)
}

/// `stat` of a name in a directory, not following a symlink.
pub fn lstat(dir: &OwnedFd, name: &OsStr) -> io::Result<libc::stat> {
    let c = cstr(name)?;
    // SAFETY: an all-zero stat is a valid value to be overwritten.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: c is a valid C string; st is writable; dir is an open directory.
    check(unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            c.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    Ok(st)
}

/// Tries once to take a POSIX record lock on the whole file: a write lock, or a read lock on a
/// descriptor open read-only. `Ok(None)` when taken, `Ok(Some(pid))` when another process holds
/// a conflicting lock (pid 0 if it let go meanwhile).
pub fn try_lock_record(fd: &OwnedFd) -> io::Result<Option<libc::pid_t>> {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let mode = OFlag::from_bits_retain(fcntl(fd, FcntlArg::F_GETFL)?) & OFlag::O_ACCMODE;
    let kind = if mode == OFlag::O_RDONLY {
        libc::F_RDLCK
    } else {
        libc::F_WRLCK
    };
    let whole = |kind: libc::c_int| libc::flock {
        l_type: kind as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: 0,
        l_len: 0,
        l_pid: 0,
    };
    loop {
        match fcntl(fd, FcntlArg::F_SETLK(&whole(kind))) {
            Ok(_) => return Ok(None),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EACCES) => {
                let mut probe = whole(kind);
                fcntl(fd, FcntlArg::F_GETLK(&mut probe))?;
                let holder = if probe.l_type == libc::F_UNLCK as libc::c_short {
                    0
                } else {
                    probe.l_pid
                };
                return Ok(Some(holder));
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
        // SAFETY: buf is writable for its length; fd is open.
        let n = unsafe {
            libc::pread(
                fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                off as libc::off_t,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n as usize]);
        off += n as u64;
    }
    Ok(())
}
