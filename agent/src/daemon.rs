//! What the long-running commands (`keep`, `uninstall --wait`) need from the system: termination
//! signals as a descriptor, a directory watch, and one poll over them.

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;
use std::time::Duration;

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use nix::sys::signal::{SigSet, SigmaskHow, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};

/// One inotify event on the watched directory.
#[derive(Debug)]
pub struct DirEvent {
    pub mask: u32,
    /// The entry's name inside the directory; `None` for events on the directory itself.
    pub name: Option<OsString>,
}

/// An inotify instance watching one directory.
pub struct DirWatch {
    inotify: Inotify,
}

impl DirWatch {
    pub fn new(dir: &Path, mask: u32) -> io::Result<DirWatch> {
        let inotify = Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK)?;
        inotify.add_watch(
            dir,
            AddWatchFlags::from_bits_retain(mask) | AddWatchFlags::IN_ONLYDIR,
        )?;
        Ok(DirWatch { inotify })
    }

    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.inotify.as_fd()
    }

    /// Reads every event queued now (non-blocking); an empty list when there is none.
    pub fn read_events(&self) -> io::Result<Vec<DirEvent>> {
        let mut events = Vec::new();
        loop {
            match self.inotify.read_events() {
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
}

/// Waits up to `timeout` (`None`: without end) until one of `fds` is readable (or at end of
/// file, or in error). Returns which are; all false on timeout or when a signal interrupted it.
pub fn poll_readable(fds: &[BorrowedFd<'_>], timeout: Option<Duration>) -> io::Result<Vec<bool>> {
    let mut pfds: Vec<PollFd> = fds
        .iter()
        .map(|fd| PollFd::new(*fd, PollFlags::POLLIN))
        .collect();
    let timeout = match timeout {
        Some(t) => PollTimeout::try_from(t.as_millis().min(i32::MAX as u128) as i32)
            .unwrap_or(PollTimeout::MAX),
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

/// SIGTERM, SIGINT and SIGHUP, blocked for the whole (single-threaded) process and delivered
/// through a signalfd instead of a handler, so the keeper sees them in its poll loop.
pub struct TermSignals {
    fd: SignalFd,
}

impl TermSignals {
    pub fn block() -> io::Result<TermSignals> {
        let mut set = SigSet::empty();
        for s in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
            set.add(s);
        }
        // Blocking (rather than handling) also makes SIGTERM reach us as PID 1 of a container.
        nix::sys::signal::sigprocmask(SigmaskHow::SIG_BLOCK, Some(&set), None)?;
        let fd = SignalFd::with_flags(&set, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)?;
        Ok(TermSignals { fd })
    }

    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The number of a pending signal, if one is queued.
    pub fn take(&self) -> io::Result<Option<i32>> {
        match self.fd.read_signal() {
            Ok(info) => Ok(info.map(|i| i.ssi_signo as i32)),
            Err(nix::errno::Errno::EINTR) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }
}

/// Waits until one of `fds` is readable, up to `timeout_ms` (negative: without end); returns
/// which ones are.
pub fn wait_readable(fds: &[BorrowedFd<'_>], timeout_ms: i32) -> io::Result<Vec<bool>> {
    let timeout = u64::try_from(timeout_ms).ok().map(Duration::from_millis);
    poll_readable(fds, timeout)
}

pub fn signal_name(signo: i32) -> &'static str {
    match Signal::try_from(signo) {
        Ok(Signal::SIGTERM) => "SIGTERM",
        Ok(Signal::SIGINT) => "SIGINT",
        Ok(Signal::SIGHUP) => "SIGHUP",
        _ => "signal",
    }
}
