//! The few system calls std does not wrap. Every `unsafe` block of the crate lives under here:
//! this file for CNI mode, `at.rs` for the record store's directory-relative calls, `daemon.rs`
//! for the long-running operator commands.

pub(crate) mod at;
pub(crate) mod daemon;

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use nix::fcntl::{fcntl, FcntlArg, OFlag};
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

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

/// Makes the child `cmd` spawns the leader of a process group of its own (so the guard can kill
/// whatever it started along with it) and SIGKILLed when the guard dies.
pub fn child_of_guard(cmd: &mut Command) {
    let parent = getpid();
    cmd.process_group(0);
    // SAFETY: die_with_parent makes only async-signal-safe calls.
    unsafe {
        cmd.pre_exec(move || die_with_parent(parent));
    }
}

/// A descriptor that becomes readable when the process exits (Linux 5.3+).
pub fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just returned by pidfd_open and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

/// SIGKILLs every process of a group; a group that is gone already is not an error.
pub fn kill_group(pgid: u32) {
    let _ = killpg(Pid::from_raw(pgid as libc::pid_t), Signal::SIGKILL);
}

pub fn set_nonblocking(fd: BorrowedFd<'_>) -> io::Result<()> {
    let flags = OFlag::from_bits_retain(fcntl(fd, FcntlArg::F_GETFL)?);
    fcntl(fd, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
    Ok(())
}

/// Sets or clears close-on-exec.
pub fn set_cloexec(fd: BorrowedFd<'_>, on: bool) -> io::Result<()> {
    let mut flags = nix::fcntl::FdFlag::from_bits_retain(fcntl(fd, FcntlArg::F_GETFD)?);
    flags.set(nix::fcntl::FdFlag::FD_CLOEXEC, on);
    fcntl(fd, FcntlArg::F_SETFD(flags))?;
    Ok(())
}

/// Waits up to `timeout` until one of `fds` is readable (or at end of file, or in error).
/// Returns which are; all false on timeout or when a signal interrupted the wait.
pub fn poll_readable(fds: &[BorrowedFd<'_>], timeout: Duration) -> io::Result<Vec<bool>> {
    let mut pfds: Vec<PollFd> = fds
        .iter()
        .map(|fd| PollFd::new(*fd, PollFlags::POLLIN))
        .collect();
    // Round up so a sub-millisecond remainder still waits instead of spinning.
    let ms = timeout.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as i32;
    match nix::poll::poll(
        &mut pfds,
        PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX),
    ) {
        Ok(_) => {}
        Err(nix::errno::Errno::EINTR) => return Ok(vec![false; fds.len()]),
        Err(e) => return Err(e.into()),
    }
    Ok(pfds
        .iter()
        .map(|p| {
            p.revents().is_some_and(|r| {
                r.intersects(PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR)
            })
        })
        .collect())
}

/// Reads what is there now from a non-blocking descriptor into `out`, at most `max` bytes in
/// all (the rest is read and dropped). Returns whether the end of file was reached.
pub fn read_available(fd: BorrowedFd<'_>, out: &mut Vec<u8>, max: usize) -> io::Result<bool> {
    let mut buf = [0u8; 16384];
    loop {
        match nix::unistd::read(fd, &mut buf) {
            Ok(0) => return Ok(true),
            Ok(n) => {
                let room = max.saturating_sub(out.len());
                out.extend_from_slice(&buf[..n.min(room)]);
            }
            Err(nix::errno::Errno::EAGAIN) => return Ok(false),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Writes all of `data` to `fd`, ignoring failures (a relay of a child's diagnostics).
pub fn write_best_effort(fd: impl AsFd, mut data: &[u8]) {
    while !data.is_empty() {
        match nix::unistd::write(&fd, data) {
            Ok(0) => return,
            Ok(n) => data = &data[n..],
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return,
        }
    }
}

pub fn getpid() -> libc::pid_t {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() }
}

pub fn geteuid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
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
}
