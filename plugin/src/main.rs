//! The `cni-guard` binary: the CNI plugin, run by the container runtime. Nothing else: the node
//! agent (install, keep, check, uninstall, metrics) is `cni-guard-agent`.

#![forbid(unsafe_code)]

use std::io::Write;
use std::process::ExitCode;

use cni_guard::cni::{self, Action};
use cni_guard::error::{Error, Kind};
use cni_guard::log::{self, Level};
use cni_guard::verb::Command;
use cni_guard::{events, invoke};

fn main() -> ExitCode {
    if std::env::var_os("CNI_COMMAND").is_none() {
        // Run by hand, as libcni's skel answers: what this is, on stderr.
        log::to_stderr(&format!(
            "cni-guard {}: a CNI plugin, run by the container runtime (CNI_COMMAND unset); \
             its node agent is cni-guard-agent",
            env!("CARGO_PKG_VERSION")
        ));
        return ExitCode::from(2);
    }
    // A panic must still answer the runtime in the spec's terms, in the request's version,
    // never with a bare backtrace. A guard failure is code 999 on every verb.
    std::panic::set_hook(Box::new(|info| {
        let e = Error::new(Kind::Failed, format!("cni-guard failed internally: {info}"));
        let _ = std::io::stdout().write_all(&e.to_json(Command::Version, cni::reply_version()));
        log::emit(Level::Warning, &format!("internal failure: {info}"));
    }));
    let outcome = cni::handle(&|k| std::env::var_os(k), &mut std::io::stdin().lock());
    for w in &outcome.warnings {
        log::emit(Level::Warning, w);
    }
    let level = if outcome.warn {
        Level::Warning
    } else {
        Level::Info
    };
    log::emit(level, &outcome.line);
    // Counted on the node when a `keep --metrics-address` is collecting; never fails the verb.
    events::append(&outcome.cache_dir, &outcome.event);
    let (stdout, exit) = match outcome.action {
        Action::Reply { stdout, exit } => (stdout, exit),
        Action::Exec {
            plugin,
            config,
            lock,
        } => {
            let e = invoke::exec(&plugin, &config);
            // The exec failed: the guard holds the lock again, and lets go of it now, before it
            // answers (the record stays for the runtime's DEL). (The invocation was counted as
            // an exec: `invoke::can_exec` sent to the child path what it could tell would fail.)
            // 999, the code of a failure on every verb.
            drop(lock);
            log::emit(Level::Warning, &format!("exec failed: {e}"));
            (e.to_json(Command::Add, cni::reply_version()), 1)
        }
    };
    let mut out = std::io::stdout().lock();
    if out.write_all(&stdout).and_then(|()| out.flush()).is_err() {
        return ExitCode::from(1);
    }
    ExitCode::from(exit as u8)
}
