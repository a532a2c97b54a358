//! The system calls that std has no call for (or not the one needed), each wrapped once, nearly
//! all through `nix`; the few `unsafe` blocks left (a `pre_exec` hook, `pidfd_open`, `_exit` in
//! a forked child) live here, each with a `// SAFETY:` note, so the rest of the crate is
//! `#![deny(unsafe_code)]`. `at.rs` holds the directory-relative calls. The rest of the crate
//! makes std's own calls where it needs them (`netconf` opens and reads configuration files,
//! `invoke` spawns and execs plugins, `records` reads a record, `log` sends to syslog) and two of
//! `nix`'s safe ones (`events`: one `write` and an `fstat`; `invoke`: `getpgrp` in a test).

#![allow(unsafe_code)]

pub mod at;

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

/// Makes the child `cmd` spawns the leader of a process group of its own (so the guard can kill
/// whatever it started along with it) and SIGKILLed when the guard dies: a delegate does not
/// outlive a guard that the runtime killed on timeout.
pub fn child_of_guard(cmd: &mut Command) {
    let parent = nix::unistd::getpid();
    cmd.process_group(0);
    // SAFETY: the hook runs between fork and exec and makes only async-signal-safe calls
    // (prctl, getppid, _exit), touching no memory shared with the parent.
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
            // The parent may have died before prctl took effect: then we were reparented already.
            if nix::unistd::getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        });
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
    // Milliseconds rounded up, so a sub-millisecond remainder still waits instead of spinning.
    let timeout = timeout.map_or(PollTimeout::NONE, |t| {
        PollTimeout::try_from(t.as_nanos().div_ceil(1_000_000)).unwrap_or(PollTimeout::MAX)
    });
    match nix::poll::poll(&mut pfds, timeout) {
        Ok(_) => {}
        Err(Errno::EINTR) => return Ok(vec![false; fds.len()]),
        Err(e) => return Err(e.into()),
    }
    let woke = PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR;
    Ok(pfds
        .iter()
        .map(|p| p.revents().is_some_and(|r| r.intersects(woke)))
        .collect())
}

/// Reads at most `now` bytes of what is there from a non-blocking descriptor into `out`, which
/// keeps at most `keep` bytes in all (the rest is read and dropped): a writer that never stops
/// cannot hold the caller here. Returns whether the end of file was reached.
pub fn read_available(
    fd: BorrowedFd<'_>,
    out: &mut Vec<u8>,
    keep: usize,
    now: usize,
) -> io::Result<bool> {
    let mut buf = [0u8; 16384];
    let mut read = 0;
    while read < now {
        match nix::unistd::read(fd, &mut buf[..(now - read).min(16384)]) {
            Ok(0) => return Ok(true),
            Ok(n) => {
                read += n;
                out.extend_from_slice(&buf[..n.min(keep.saturating_sub(out.len()))]);
            }
            Err(Errno::EAGAIN) => return Ok(false),
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(false)
}

/// Writes `data` to `fd` without ever waiting, ignoring failures: a log line or a delegate's
/// relayed diagnostics on stderr, which may be a full pipe, a closed one or a full disk; what
/// does not fit now is dropped. `O_NONBLOCK` is set on the descriptor for the write and put back
/// after it; the flag belongs to the open file description, which a runtime's stderr pipe
/// shares with no other writer while the guard runs.
pub fn write_nowait(fd: BorrowedFd<'_>, mut data: &[u8]) {
    let Ok(bits) = fcntl(fd, FcntlArg::F_GETFL) else {
        return;
    };
    let flags = OFlag::from_bits_retain(bits);
    let toggled = !flags.contains(OFlag::O_NONBLOCK)
        && fcntl(fd, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK)).is_ok();
    while !data.is_empty() {
        match nix::unistd::write(fd, data) {
            Ok(0) => break,
            Ok(n) => data = &data[n..],
            Err(Errno::EINTR) => continue,
            Err(_) => break,
        }
    }
    if toggled {
        let _ = fcntl(fd, FcntlArg::F_SETFL(flags));
    }
}

/// Whether something listens on the unix stream socket at `path`: a non-blocking connect, closed
/// at once. A full backlog (`EAGAIN`) means a listener is there, busy: that counts as accepting.
pub fn unix_socket_accepts(path: &Path) -> io::Result<()> {
    use nix::sys::socket::{connect, socket, AddressFamily, SockFlag, SockType, UnixAddr};
    let addr = UnixAddr::new(path)?;
    let flags = SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC;
    let fd = socket(AddressFamily::Unix, SockType::Stream, flags, None)?;
    match connect(fd.as_raw_fd(), &addr) {
        Ok(()) | Err(Errno::EAGAIN) | Err(Errno::EINPROGRESS) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

pub fn geteuid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// What a file the guard trusts must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    Dir,
    File,
}

/// The one owner and mode check, on what was opened: a directory or regular file owned by the
/// guard's user and writable by nobody else (group included). Whoever can write a record, or
/// the folder it is in, can make DEL run a delegate of their choosing as the guard's user
/// (root). The error is the reason, said after the file's path.
pub fn trust(fd: impl AsFd, expect: Expect) -> Result<(), String> {
    let st = nix::sys::stat::fstat(fd).map_err(|e| format!("cannot be examined: {e}"))?;
    let (want, word) = match expect {
        Expect::Dir => (libc::S_IFDIR, "a directory"),
        Expect::File => (libc::S_IFREG, "a regular file"),
    };
    if st.st_mode & libc::S_IFMT != want {
        return Err(format!("is not {word}"));
    }
    let euid = geteuid();
    if st.st_uid != euid {
        return Err(format!(
            "is owned by uid {}, not by the guard's uid {euid}",
            st.st_uid
        ));
    }
    match st.st_mode & 0o022 {
        0 => Ok(()),
        0o020 => Err("is writable by its group".to_owned()),
        0o002 => Err("is writable by others".to_owned()),
        _ => Err("is writable by others and by its group".to_owned()),
    }
}

/// An inotify instance watching directories: the guard's wait for a missing file.
pub struct Inotify(nix::sys::inotify::Inotify);

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
        let flags = InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK;
        Ok(Inotify(nix::sys::inotify::Inotify::init(flags)?))
    }

    /// Watches a directory (only a directory) for the events in `mask`.
    pub fn watch_dir(&self, dir: &Path, mask: u32) -> io::Result<()> {
        let flags = AddWatchFlags::from_bits_retain(mask) | AddWatchFlags::IN_ONLYDIR;
        self.0.add_watch(dir, flags)?;
        Ok(())
    }

    /// Waits up to `timeout` for events and drains what is there, at most 16 reads (each takes
    /// what fits in nix's buffer): a folder whose changes never stop cannot hold the caller here
    /// (what is left wakes its next wait at once). Returns whether any arrived.
    pub fn wait(&self, timeout: Duration) -> io::Result<bool> {
        if !poll_readable(&[self.0.as_fd()], Some(timeout))?[0] {
            return Ok(false);
        }
        for _ in 0..16 {
            match self.0.read_events() {
                Ok(_) => {}
                Err(Errno::EAGAIN) => break,
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(e.into()),
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
        n.watch_dir(dir.path(), DIR_CHANGES).unwrap();
        assert!(!n.wait(Duration::from_millis(10)).unwrap());
        let other = tempfile::tempdir().unwrap();
        std::fs::write(other.path().join("x"), "1").unwrap();
        std::fs::rename(other.path().join("x"), dir.path().join("x")).unwrap();
        assert!(n.wait(Duration::from_secs(5)).unwrap());
    }
}
