//! The attachment lock: a POSIX record lock (`fcntl F_SETLK`) on the record file's inode.
//!
//! A POSIX lock belongs to the process that took it: it is kept across `execve` (so a delegate
//! the guard execs holds it until it exits) and is *not* inherited by `fork` (so nothing the
//! delegate starts can hold it after the delegate is gone). `flock` locks, by contrast, follow
//! the open file description into every child and keep the attachment locked for as long as
//! any of them lives. The descriptor is close-on-exec except on the way into that one exec.
//!
//! Two rules follow from POSIX semantics and are kept by the store: one process holds at most
//! one attachment at a time, and never opens and closes a second descriptor of a locked inode
//! (closing any descriptor of a file drops the process's locks on it).
//!
//! Waiting is bounded: a lock held by another process past the bound is reported with that
//! process's pid, never waited for without end.

use std::io;
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use crate::sys::at;

/// A held lock on the inode behind `fd`, at the record name `name`.
#[derive(Debug)]
pub(super) struct Lock {
    pub name: String,
    pub fd: OwnedFd,
}

/// Another process holds the attachment.
#[derive(Debug)]
pub(super) struct Busy {
    /// The holder's pid as the kernel reports it (0 when it let go just as we asked).
    pub holder: i32,
    pub waited: Duration,
}

/// How long to keep trying.
#[derive(Debug, Clone, Copy)]
pub(super) enum Wait {
    /// One attempt.
    Once,
    /// Until the deadline.
    Until(Instant),
}

/// Takes the lock on `fd`, retrying with short sleeps (1 ms doubling to 25 ms) while another
/// process holds it, up to `wait`. `Ok(Err(busy))` when it is still held then.
pub(super) fn take(fd: &OwnedFd, wait: Wait) -> io::Result<Result<(), Busy>> {
    let start = Instant::now();
    let mut pause = Duration::from_millis(1);
    loop {
        let holder = match at::try_lock_record(fd)? {
            None => return Ok(Ok(())),
            Some(pid) => pid,
        };
        let now = Instant::now();
        let deadline = match wait {
            Wait::Once => now,
            Wait::Until(d) => d,
        };
        if now >= deadline {
            return Ok(Err(Busy {
                holder,
                waited: now - start,
            }));
        }
        std::thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(Duration::from_millis(25));
    }
}
