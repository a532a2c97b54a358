//! The system calls the crate makes, each wrapped once. Nearly all go through `nix`; the few
//! `unsafe` blocks left (a `pre_exec` hook, `pidfd_open`, `close_range` and `_exit` in a forked
//! child, `fork` itself) live here, each with a `// SAFETY:` note, so the rest of the crate is
//! `#![deny(unsafe_code)]`. `at.rs` holds the record store's directory-relative calls,
//! `daemon.rs` the long-running operator commands' signals.

#![allow(unsafe_code)]

pub(crate) mod at;

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::{fcntl, FcntlArg, FdFlag, OFlag};
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::inotify::{AddWatchFlags, InitFlags};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

/// An anonymous in-memory file holding `data`, positioned at its start: a delegate's stdin that
/// never blocks the writer, whatever its size.
pub fn memfd_with(data: &[u8]) -> io::Result<OwnedFd> {
    use nix::sys::memfd::{memfd_create, MFdFlags};
    let owned = memfd_create(c"cni-guard-stdin", MFdFlags::MFD_CLOEXEC)?;
    let mut file = std::fs::File::from(owned);
    io::Write::write_all(&mut file, data)?;
    io::Seek::seek(&mut file, io::SeekFrom::Start(0))?;
    Ok(file.into())
}

/// Asks the kernel to SIGKILL the calling process when its parent dies. Called in a forked child
/// before exec, so a delegate does not outlive a guard that the runtime killed on timeout.
///
/// Only async-signal-safe calls are made, as required between fork and exec.
fn die_with_parent(parent: Pid) -> io::Result<()> {
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
    // The parent may have died before prctl took effect: then we were reparented already.
    if nix::unistd::getppid() != parent {
        exit_now(1);
    }
    Ok(())
}

/// `_exit`: ends a forked child at once, running no handlers and flushing nothing.
fn exit_now(status: i32) -> ! {
    // SAFETY: _exit is async-signal-safe and has no preconditions.
    unsafe { libc::_exit(status) }
}

/// Makes the child `cmd` spawns the leader of a process group of its own (so the guard can kill
/// whatever it started along with it) and SIGKILLed when the guard dies.
pub fn child_of_guard(cmd: &mut Command) {
    let parent = nix::unistd::getpid();
    cmd.process_group(0);
    // SAFETY: the hook runs between fork and exec and makes only async-signal-safe calls
    // (prctl, getppid, _exit), touching no memory shared with the parent.
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
    let mut flags = FdFlag::from_bits_retain(fcntl(fd, FcntlArg::F_GETFD)?);
    flags.set(FdFlag::FD_CLOEXEC, on);
    fcntl(fd, FcntlArg::F_SETFD(flags))?;
    Ok(())
}

/// Waits up to `timeout` (`None`: without end) until one of `fds` is readable (or at end of
/// file, or in error). Returns which are; all false on timeout or when a signal interrupted
/// the wait. The crate's one poll loop.
pub fn poll_readable(fds: &[BorrowedFd<'_>], timeout: Option<Duration>) -> io::Result<Vec<bool>> {
    let mut pfds: Vec<PollFd> = fds
        .iter()
        .map(|fd| PollFd::new(*fd, PollFlags::POLLIN))
        .collect();
    let timeout = match timeout {
        // Round up so a sub-millisecond remainder still waits instead of spinning.
        Some(t) => {
            let ms = t.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as i32;
            PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX)
        }
        None => PollTimeout::NONE,
    };
    match nix::poll::poll(&mut pfds, timeout) {
        Ok(_) => {}
        Err(Errno::EINTR) => return Ok(vec![false; fds.len()]),
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
            Err(Errno::EAGAIN) => return Ok(false),
            Err(Errno::EINTR) => continue,
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
            Err(Errno::EINTR) => continue,
            Err(_) => return,
        }
    }
}

/// Writes `data` to `fd` without ever waiting, ignoring failures: a log line on stderr, which
/// may be a full pipe, a closed one or a full disk. `O_NONBLOCK` is set on the descriptor for
/// the write and put back after it; the flag belongs to the open file description, which a
/// runtime's stderr pipe shares with no other writer while the guard runs.
pub fn write_nowait(fd: BorrowedFd<'_>, data: &[u8]) {
    let Ok(bits) = fcntl(fd, FcntlArg::F_GETFL) else {
        return;
    };
    let flags = OFlag::from_bits_retain(bits);
    let toggled = !flags.contains(OFlag::O_NONBLOCK)
        && fcntl(fd, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK)).is_ok();
    write_best_effort(fd, data);
    if toggled {
        let _ = fcntl(fd, FcntlArg::F_SETFL(flags));
    }
}

/// Whether something listens on the unix stream socket at `path`: a non-blocking connect, closed
/// at once. A full backlog (`EAGAIN`) means a listener is there, busy: that counts as accepting.
pub fn unix_socket_accepts(path: &Path) -> io::Result<()> {
    use nix::sys::socket::{connect, socket, AddressFamily, SockFlag, SockType, UnixAddr};
    let addr = UnixAddr::new(path)?;
    let fd = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    match connect(fd.as_raw_fd(), &addr) {
        Ok(()) | Err(Errno::EAGAIN) | Err(Errno::EINPROGRESS) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

pub fn geteuid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// One inotify event on a watched directory.
#[derive(Debug)]
pub struct DirEvent {
    pub mask: u32,
    /// The entry's name inside the directory; `None` for events on the directory itself.
    pub name: Option<std::ffi::OsString>,
}

/// An inotify instance watching directories: the guard's wait for a missing file and the
/// keeper's watch on the conf dir.
///
/// The last close of an inotify instance that has watches waits in the kernel for the watches
/// to be retired (an SRCU grace period: about 20 ms, up to 70 ms under load, measured here).
/// The guard must not pay that between the delegate appearing and running it, so
/// [`Inotify::with_background_close`] has a detached helper process hold a second reference
/// and make the last close in the background: the guard's own close is then immediate.
pub struct Inotify {
    // Dropped in declaration order: our reference first, then the pipe whose closing tells the
    // helper to drop the last one.
    inner: nix::sys::inotify::Inotify,
    _helper: Option<OwnedFd>,
}

/// The events that can make a missing or broken file usable: creation, rename into the
/// directory, a write finishing, a mode change; and the directory itself going away (then the
/// caller re-plans its watches).
pub const DIR_CHANGES: u32 = libc::IN_CREATE
    | libc::IN_MOVED_TO
    | libc::IN_CLOSE_WRITE
    | libc::IN_MODIFY
    | libc::IN_ATTRIB
    | libc::IN_DELETE
    | libc::IN_MOVED_FROM
    | libc::IN_DELETE_SELF
    | libc::IN_MOVE_SELF;

impl Inotify {
    pub fn new() -> io::Result<Inotify> {
        let inner =
            nix::sys::inotify::Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK)?;
        Ok(Inotify {
            inner,
            _helper: None,
        })
    }

    /// An instance whose last close happens in a helper process, off the caller's path.
    pub fn with_background_close() -> io::Result<Inotify> {
        let mut n = Inotify::new()?;
        // Without a helper the close is merely slow, not wrong.
        n._helper = hold_last_reference(n.inner.as_fd().as_raw_fd()).ok();
        Ok(n)
    }

    /// Watches a directory (only a directory) for the events in `mask`.
    pub fn watch_dir(&self, dir: &Path, mask: u32) -> io::Result<()> {
        let flags = AddWatchFlags::from_bits_retain(mask) | AddWatchFlags::IN_ONLYDIR;
        self.inner.add_watch(dir, flags)?;
        Ok(())
    }

    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.inner.as_fd()
    }

    /// Reads every event queued now (non-blocking); an empty list when there is none.
    pub fn read_events(&self) -> io::Result<Vec<DirEvent>> {
        let mut events = Vec::new();
        loop {
            match self.inner.read_events() {
                Ok(batch) => events.extend(batch.into_iter().map(|e| DirEvent {
                    mask: e.mask.bits(),
                    name: e.name,
                })),
                Err(Errno::EAGAIN) => return Ok(events),
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Waits up to `timeout` for events and drains them. Returns whether any arrived.
    pub fn wait(&self, timeout: Duration) -> io::Result<bool> {
        if !poll_readable(&[self.as_fd()], Some(timeout))?[0] {
            return Ok(false);
        }
        self.read_events()?;
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
    let (read_end, write_end) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
    let r = read_end.as_raw_fd();
    // SAFETY: between fork and _exit the children call only async-signal-safe functions
    // (close_range, close, fork, read, _exit) and touch no memory the parent owns.
    match unsafe { nix::unistd::fork() }? {
        nix::unistd::ForkResult::Child => {
            close_all_but(fd, r);
            // SAFETY: as above; the grandchild only reads and exits.
            if let Ok(nix::unistd::ForkResult::Child) = unsafe { nix::unistd::fork() } {
                let mut b = [0u8; 1];
                // EOF once every write end is closed: the guard's, at its close or its death.
                // SAFETY: `r` stays open in this process until it exits.
                let pipe = unsafe { BorrowedFd::borrow_raw(r) };
                while nix::unistd::read(pipe, &mut b) == Err(Errno::EINTR) {}
            }
            exit_now(0);
        }
        nix::unistd::ForkResult::Parent { child } => {
            drop(read_end);
            while nix::sys::wait::waitpid(child, None) == Err(Errno::EINTR) {}
            Ok(write_end)
        }
    }
}

/// In a forked child: closes every descriptor except `a` and `b`.
fn close_all_but(a: libc::c_int, b: libc::c_int) {
    let (low, high) = (a.min(b), a.max(b));
    for (first, last) in [
        (0, low - 1),
        (low + 1, high - 1),
        (high + 1, libc::c_int::MAX),
    ] {
        if first > last {
            continue;
        }
        // close_range (Linux 5.9+) is one call however high RLIMIT_NOFILE is.
        // SAFETY: close_range takes plain integers and only closes descriptors.
        let r = unsafe {
            libc::syscall(
                libc::SYS_close_range,
                first as libc::c_uint,
                last as libc::c_uint,
                0,
            )
        };
        if r != 0 {
            let top = nix::unistd::sysconf(nix::unistd::SysconfVar::OPEN_MAX)
                .ok()
                .flatten()
                .unwrap_or(1024)
                .clamp(64, 65536) as libc::c_int;
            for other in first..=last.min(top) {
                let _ = nix::unistd::close(other);
            }
        }
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
        let n = Inotify::with_background_close().unwrap();
        n.watch_dir(dir.path(), DIR_CHANGES).unwrap();
        assert!(!n.wait(Duration::from_millis(10)).unwrap());
        let other = tempfile::tempdir().unwrap();
        std::fs::write(other.path().join("x"), "1").unwrap();
        std::fs::rename(other.path().join("x"), dir.path().join("x")).unwrap();
        assert!(n.wait(Duration::from_secs(5)).unwrap());
    }
}
