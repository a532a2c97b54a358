//! One line per invocation to syslog (`/dev/log`), or to stderr when there is no syslog socket.
//! stdout is reserved for the CNI reply.
//!
//! Best effort on every path: a line neither syslog nor stderr takes at once is dropped, and
//! nothing here can fail, wait or panic, so a verb's reply never depends on its log.

use std::os::fd::AsFd;
use std::os::unix::net::UnixDatagram;
use std::path::Path;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Info,
    Warning,
}

/// Sends one line. Never fails: a log that cannot be written must not fail a pod.
pub fn emit(level: Level, line: &str) {
    let socket = std::env::var_os("CNI_GUARD_SYSLOG").unwrap_or_else(|| "/dev/log".into());
    if !send(Path::new(&socket), level, line) {
        to_stderr(&format!("cni-guard: {line}"));
    }
}

/// One line on stderr, written without waiting; dropped if stderr does not take it (full,
/// closed, or a full disk). `eprintln!` would panic there instead.
pub fn to_stderr(line: &str) {
    crate::sys::write_nowait(std::io::stderr().as_fd(), format!("{line}\n").as_bytes());
}

/// Sends one datagram to the syslog socket without ever waiting: a syslog daemon that is slow
/// or stuck fills its queue (net.unix.max_dgram_qlen datagrams, 10 by default), and a blocking
/// send would then hold up every pod start until the runtime's timeout. Returns whether it went.
fn send(socket: &Path, level: Level, line: &str) -> bool {
    // Facility user (1); severity info (6) or warning (4).
    let pri = 8 + if level == Level::Info { 6 } else { 4 };
    let msg = format!("<{pri}>cni-guard[{}]: {line}", std::process::id());
    let Ok(s) = UnixDatagram::unbound() else {
        return false;
    };
    s.set_nonblocking(true).is_ok() && s.send_to(msg.as_bytes(), socket).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_syslog_that_does_not_read_never_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.sock");
        let sink = UnixDatagram::bind(&path).unwrap();
        // A blocking send would hang here once the socket's queue is full.
        let sent = (0..2000).filter(|_| send(&path, Level::Info, "x")).count();
        // The queue holds net.unix.max_dgram_qlen datagrams; the rest were refused at once.
        assert!((1..2000).contains(&sent), "sent {sent} of 2000");
        let mut buf = [0u8; 256];
        let n = sink.recv(&mut buf).unwrap();
        assert!(std::str::from_utf8(&buf[..n]).unwrap().ends_with("]: x"));
    }
}
