//! The raw Linux calls the keeper needs (inotify, signalfd, poll), each wrapped once with a
//! `// SAFETY:` note, so the rest of the operator code is safe Rust.

use std::ffi::{CString, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;

/// One inotify event on a watched directory.
#[derive(Debug)]
pub struct DirEvent {
    pub mask: u32,
    /// The entry's name inside the directory; `None` for events on the directory itself.
    pub name: Option<OsString>,
}

/// An inotify instance watching one directory.
pub struct DirWatch {
    fd: OwnedFd,
}

impl DirWatch {
    pub fn new(dir: &Path, mask: u32) -> io::Result<DirWatch> {
        // SAFETY: inotify_init1 takes only flags and returns a new descriptor or -1.
        let raw = unsafe { libc::inotify_init1(libc::IN_CLOEXEC | libc::IN_NONBLOCK) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a freshly created descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let path = CString::new(dir.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))?;
        // SAFETY: `fd` is a valid inotify descriptor and `path` a NUL-terminated string that
        // outlives the call.
        let wd = unsafe { libc::inotify_add_watch(fd.as_raw_fd(), path.as_ptr(), mask) };
        if wd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(DirWatch { fd })
    }

    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Reads every event queued now (non-blocking); an empty list when there is none.
    pub fn read_events(&self) -> io::Result<Vec<DirEvent>> {
        // Aligned for inotify_event; large enough for many events with NAME_MAX names.
        let mut buf = vec![0u64; 4096 / 8];
        let mut events = Vec::new();
        loop {
            // SAFETY: the buffer is valid for writes of its full byte length.
            let n = unsafe {
                libc::read(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len() * std::mem::size_of::<u64>(),
                )
            };
            if n < 0 {
                let err = io::Error::last_os_error();
                return match err.kind() {
                    io::ErrorKind::WouldBlock => Ok(events),
                    io::ErrorKind::Interrupted => continue,
                    _ => Err(err),
                };
            }
            let n = n as usize;
            let bytes: &[u8] =
                // SAFETY: the kernel initialised the first `n` bytes of `buf`.
                unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), n) };
            let header = std::mem::size_of::<libc::inotify_event>();
            let mut off = 0;
            while off + header <= n {
                // SAFETY: a whole header lies within the initialised bytes; read_unaligned
                // does not rely on the offset's alignment.
                let ev: libc::inotify_event = unsafe {
                    std::ptr::read_unaligned(bytes[off..].as_ptr().cast::<libc::inotify_event>())
                };
                let name_start = off + header;
                let name_end = (name_start + ev.len as usize).min(n);
                let raw_name = &bytes[name_start..name_end];
                let trimmed = match raw_name.iter().position(|&b| b == 0) {
                    Some(end) => &raw_name[..end],
                    None => raw_name,
                };
                events.push(DirEvent {
                    mask: ev.mask,
                    name: (!trimmed.is_empty()).then(|| OsString::from_vec(trimmed.to_vec())),
                });
                off = name_end;
            }
        }
    }
}

/// SIGTERM, SIGINT and SIGHUP, blocked for the whole (single-threaded) process and delivered
/// through a signalfd instead of a handler, so the keeper sees them in its poll loop.
pub struct TermSignals {
    fd: OwnedFd,
}

impl TermSignals {
    pub fn block() -> io::Result<TermSignals> {
        // SAFETY: sigset_t is plain data; sigemptyset initialises it before any other use.
        let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is a valid, exclusively borrowed sigset_t for each call.
        unsafe {
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGTERM);
            libc::sigaddset(&mut set, libc::SIGINT);
            libc::sigaddset(&mut set, libc::SIGHUP);
        }
        // SAFETY: `set` is initialised; a null old-set pointer is allowed. Blocking (rather
        // than handling) also makes SIGTERM reach us as PID 1 of a container.
        let rc = unsafe { libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: -1 asks for a new descriptor; `set` is initialised.
        let raw = unsafe { libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a freshly created descriptor that nothing else owns.
        Ok(TermSignals {
            fd: unsafe { OwnedFd::from_raw_fd(raw) },
        })
    }

    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// The number of a pending signal, if one is queued.
    pub fn take(&self) -> io::Result<Option<i32>> {
        // SAFETY: signalfd_siginfo is plain data.
        let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
        let size = std::mem::size_of::<libc::signalfd_siginfo>();
        // SAFETY: `info` is valid for writes of `size` bytes.
        let n = unsafe {
            libc::read(
                self.fd.as_raw_fd(),
                (&mut info as *mut libc::signalfd_siginfo).cast(),
                size,
            )
        };
        if n < 0 {
            let err = io::Error::last_os_error();
            return match err.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
                _ => Err(err),
            };
        }
        Ok((n as usize == size).then_some(info.ssi_signo as i32))
    }
}

/// Waits until one of `fds` is readable; returns which ones are.
pub fn wait_readable(fds: &[RawFd], timeout_ms: i32) -> io::Result<Vec<bool>> {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    loop {
        // SAFETY: `pfds` is a valid array of `pfds.len()` pollfd structs.
        let rc = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, timeout_ms) };
        if rc < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        return Ok(pfds
            .iter()
            .map(|p| p.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0)
            .collect());
    }
}

pub fn signal_name(signo: i32) -> &'static str {
    match signo {
        libc::SIGTERM => "SIGTERM",
        libc::SIGINT => "SIGINT",
        libc::SIGHUP => "SIGHUP",
        _ => "signal",
    }
}
