//! One line per invocation to syslog (`/dev/log`), or to stderr when there is no syslog socket.
//! stdout is reserved for the CNI reply.

use std::os::unix::net::UnixDatagram;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Info,
    Warning,
}

/// Sends one line. Never fails: a log that cannot be written must not fail a pod.
pub fn emit(level: Level, line: &str) {
    let socket = std::env::var_os("CNI_GUARD_SYSLOG").unwrap_or_else(|| "/dev/log".into());
    // Facility user (1); severity info (6) or warning (4).
    let pri = 8 + if level == Level::Info { 6 } else { 4 };
    let msg = format!("<{pri}>cni-guard[{}]: {line}", std::process::id());
    let sent = UnixDatagram::unbound()
        .and_then(|s| s.send_to(msg.as_bytes(), &socket))
        .is_ok();
    if !sent {
        eprintln!("cni-guard: {line}");
    }
}
