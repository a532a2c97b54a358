//! What the long-running operator commands (`keep`, `uninstall --wait`) need beyond CNI mode:
//! termination signals as a descriptor, and a directory watch; both polled with
//! [`super::poll_readable`].

use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;
use std::time::Duration;

use nix::sys::signal::{SigSet, SigmaskHow, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};

pub use super::DirEvent;

/// An inotify instance watching one directory.
pub struct DirWatch {
    inotify: super::Inotify,
}

impl DirWatch {
    pub fn new(dir: &Path, mask: u32) -> io::Result<DirWatch> {
        let inotify = super::Inotify::new()?;
        inotify.watch_dir(dir, mask)?;
        Ok(DirWatch { inotify })
    }

    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.inotify.as_fd()
    }

    /// Reads every event queued now (non-blocking); an empty list when there is none.
    pub fn read_events(&self) -> io::Result<Vec<DirEvent>> {
        self.inotify.read_events()
    }
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
    super::poll_readable(fds, timeout)
}

pub fn signal_name(signo: i32) -> &'static str {
    match Signal::try_from(signo) {
        Ok(Signal::SIGTERM) => "SIGTERM",
        Ok(Signal::SIGINT) => "SIGINT",
        Ok(Signal::SIGHUP) => "SIGHUP",
        _ => "signal",
    }
}
