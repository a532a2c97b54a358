//! The `cni-guard` binary: the CNI plugin, run by the container runtime. Nothing else: the node
//! agent (install, keep, check, uninstall, metrics) is `cni-guard-agent`.

#![forbid(unsafe_code)]

use std::io::Write;
use std::process::ExitCode;

use cni_guard::cni::{self, Action};
use cni_guard::error::{Error, Kind};
use cni_guard::request::Command;
use cni_guard::{invoke, log};

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
    // A panic must still answer the runtime in the spec's terms, never with a bare backtrace.
    std::panic::set_hook(Box::new(|info| {
        let e = Error::new(Kind::Failed, format!("cni-guard failed internally: {info}"));
        // A guard failure is code 999 on every verb.
        let _ =
            std::io::stdout().write_all(&e.to_json(Command::Version, cni_guard::version::LATEST));
        log::emit(log::Level::Warning, &format!("internal failure: {info}"));
    }));
    let outcome = cni::handle(&|k| std::env::var_os(k), &mut std::io::stdin().lock());
    for w in &outcome.warnings {
        log::emit(log::Level::Warning, w);
    }
    log::emit(outcome.decision.level(), &log::invocation_line(&outcome));
    // Counted on the node when a `keep --metrics-address` is collecting; never fails the verb.
    cni_guard::events::append(&outcome.cache_dir, &outcome.event.event());
    let (stdout, exit) = match outcome.action {
        Action::Reply { stdout, exit } => (stdout, exit),
        Action::Exec {
            plugin,
            config,
            verb,
            cni_version,
            lock,
        } => {
            let e = invoke::exec(&plugin, &config);
            // The exec failed: the guard is the holder again, and lets go when it exits.
            drop(lock);
            log::emit(log::Level::Warning, &format!("exec failed: {e}"));
            (e.to_json(verb, &cni_version), 1)
        }
    };
    let mut out = std::io::stdout().lock();
    if out.write_all(&stdout).and_then(|()| out.flush()).is_err() {
        return ExitCode::from(1);
    }
    ExitCode::from(exit as u8)
}
