//! The few system calls std does not wrap. Every `unsafe` block of the crate lives under here:
//! this file for CNI mode, `at.rs` for the record store's directory-relative calls, `daemon.rs`
//! for the long-running operator commands.

pub(crate) mod at;
pub(crate) mod daemon;

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

/// An anonymous in-memory file holding `data`, positioned at its start: a delegate's stdin that
/// never blocks the writer, whatever its size.
pub fn memfd_with(data: &[u8]) -> io::Result<OwnedFd> {
    let name = c"cni-guard-stdin";
    // SAFETY: name is a valid C string; flags are valid for memfd_create.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just returned by memfd_create and is owned by nobody else.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut file = std::fs::File::from(owned);
    io::Write::write_all(&mut file, data)?;
    io::Seek::seek(&mut file, io::SeekFrom::Start(0))?;
    Ok(file.into())
}

/// Asks the kernel to SIGKILL the calling process when its parent dies. Called in a forked child
/// before exec, so a delegate does not outlive a guard that the runtime killed on timeout.
///
/// # Safety
/// Only async-signal-safe calls are made, as required between fork and exec.
pub unsafe fn die_with_parent(parent: libc::pid_t) -> io::Result<()> {
    // SAFETY: prctl with PR_SET_PDEATHSIG takes a signal number; no memory is passed.
    if unsafe {
        libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        )
    } != 0
    {
        return Err(io::Error::last_os_error());
    }
    // The parent may have died before prctl took effect: then we were reparented already.
    // SAFETY: getppid has no preconditions.
    if unsafe { libc::getppid() } != parent {
        // SAFETY: _exit is async-signal-safe and has no preconditions.
        unsafe { libc::_exit(1) };
    }
    Ok(())
}

pub fn getpid() -> libc::pid_t {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() }
}

pub fn geteuid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

/// Sends a signal; errors (the process is already gone) are of no interest to the caller.
pub fn kill(pid: libc::pid_t, signal: libc::c_int) {
    // SAFETY: kill takes plain integers; a pid that is gone only yields ESRCH.
    unsafe { libc::kill(pid, signal) };
}

/// Whether a process with this pid exists (for telling a live writer's temp file from a stale one).
pub fn pid_alive(pid: libc::pid_t) -> bool {
    // SAFETY: signal 0 only checks for existence and permission.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// An inotify instance watching directories for entries appearing, changing or going.
pub struct Inotify {
    fd: OwnedFd,
}

impl Inotify {
    pub fn new() -> io::Result<Inotify> {
        // SAFETY: flags are valid for inotify_init1.
        let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC | libc::IN_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd was just returned by inotify_init1 and is owned by nobody else.
        Ok(Inotify {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// Watches a directory for the events that can make a missing or broken file usable:
    /// creation, rename into it, a write finishing, a mode change; and for the directory itself
    /// going away (then the caller re-plans its watches).
    pub fn watch_dir(&self, dir: &Path) -> io::Result<()> {
        let c = CString::new(std::os::unix::ffi::OsStrExt::as_bytes(dir.as_os_str()))
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let mask = libc::IN_CREATE
            | libc::IN_MOVED_TO
            | libc::IN_CLOSE_WRITE
            | libc::IN_MODIFY
            | libc::IN_ATTRIB
            | libc::IN_DELETE
            | libc::IN_MOVED_FROM
            | libc::IN_DELETE_SELF
            | libc::IN_MOVE_SELF
            | libc::IN_ONLYDIR;
        // SAFETY: fd is a live inotify descriptor; c is a valid C string.
        let wd = unsafe { libc::inotify_add_watch(self.fd.as_raw_fd(), c.as_ptr(), mask) };
        if wd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Waits up to `timeout` for events and drains them. Returns whether any arrived.
    pub fn wait(&self, timeout: Duration) -> io::Result<bool> {
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // Round up so a sub-millisecond remainder still waits instead of spinning.
        let ms = timeout.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as i32;
        // SAFETY: pfd is one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::Interrupted {
                Ok(false)
            } else {
                Err(e)
            };
        }
        if n == 0 {
            return Ok(false);
        }
        let mut buf = [0u8; 4096];
        loop {
            // SAFETY: buf is writable for its length; fd is non-blocking.
            let r = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if r <= 0 {
                break;
            }
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn memfd_reads_back() {
        let fd = memfd_with(b"hello").unwrap();
        let mut s = String::new();
        std::fs::File::from(fd).read_to_string(&mut s).unwrap();
        assert_eq!(s, "hello");
    }

    #[test]
    fn inotify_wakes_on_rename_into_dir() {
        let dir = tempfile::tempdir().unwrap();
        let n = Inotify::new().unwrap();
        n.watch_dir(dir.path()).unwrap();
        assert!(!n.wait(Duration::from_millis(10)).unwrap());
        let other = tempfile::tempdir().unwrap();
        std::fs::write(other.path().join("x"), "1").unwrap();
        std::fs::rename(other.path().join("x"), dir.path().join("x")).unwrap();
        assert!(n.wait(Duration::from_secs(5)).unwrap());
    }

    #[test]
    fn pid_alive_sees_self() {
        assert!(pid_alive(getpid()));
    }
}
