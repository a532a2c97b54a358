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
///
/// The last close of an inotify instance that has watches waits in the kernel for the watches
/// to be retired (an SRCU grace period: about 20 ms, up to 70 ms under load, measured here).
/// The guard must not pay that between the delegate appearing and running it, so a detached
/// helper process holds a second reference and makes the last close in the background: the
/// guard's own close is then immediate.
pub struct Inotify {
    // Dropped in declaration order: the guard's reference first, then the pipe whose closing
    // tells the helper to drop the last one.
    fd: OwnedFd,
    _helper: Option<OwnedFd>,
}

impl Inotify {
    pub fn new() -> io::Result<Inotify> {
        // SAFETY: flags are valid for inotify_init1.
        let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC | libc::IN_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd was just returned by inotify_init1 and is owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // Without a helper the close is merely slow, not wrong.
        let helper = hold_last_reference(fd.as_raw_fd()).ok();
        Ok(Inotify {
            fd,
            _helper: helper,
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

/// Starts a detached process holding a reference to `fd` until the returned pipe end is closed
/// (or the guard dies), so that the guard's own close of `fd` is never the last one.
///
/// Double fork: the helper is orphaned at once (re-parented to init or the runtime's subreaper),
/// so it never becomes a child of the delegate the guard execs. The intermediate process closes
/// every descriptor but `fd` and the pipe before forking the helper, so the helper never holds
/// the runtime's stdin/stdout/stderr pipes open.
fn hold_last_reference(fd: libc::c_int) -> io::Result<OwnedFd> {
    let mut p = [0 as libc::c_int; 2];
    // SAFETY: p has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just returned by pipe2 and are owned by nobody else.
    let (read_end, write_end) = unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) };
    let r = read_end.as_raw_fd();
    // SAFETY: between fork and _exit the children call only async-signal-safe functions
    // (close_range, close, fork, read, _exit) and touch no memory the parent owns.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        // SAFETY: as above; only system calls on descriptors, then _exit.
        unsafe {
            let (low, high) = (fd.min(r), fd.max(r));
            for (first, last) in [
                (0, low - 1),
                (low + 1, high - 1),
                (high + 1, libc::c_int::MAX),
            ] {
                if first > last {
                    continue;
                }
                // close_range (Linux 5.9+) is one call however high RLIMIT_NOFILE is.
                if libc::syscall(
                    libc::SYS_close_range,
                    first as libc::c_uint,
                    last as libc::c_uint,
                    0,
                ) != 0
                {
                    let top = libc::sysconf(libc::_SC_OPEN_MAX).clamp(64, 65536) as libc::c_int;
                    for other in first..=last.min(top) {
                        libc::close(other);
                    }
                }
            }
            if libc::fork() == 0 {
                let mut b = 0u8;
                // EOF once every write end is closed: the guard's, at its close or its death.
                while libc::read(r, (&mut b as *mut u8).cast(), 1) != 0 {
                    if *libc::__errno_location() != libc::EINTR {
                        break;
                    }
                }
                libc::_exit(0);
            }
            libc::_exit(0);
        }
    }
    drop(read_end);
    let mut status = 0;
    // SAFETY: pid is our child; status is valid for writing.
    while unsafe { libc::waitpid(pid, &mut status, 0) } < 0 {
        if io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            break;
        }
    }
    Ok(write_end)
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
