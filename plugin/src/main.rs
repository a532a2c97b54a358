//! The `cni-guard` binary: CNI plugin when `CNI_COMMAND` is set, operator tool otherwise.

#![forbid(unsafe_code)]

use std::io::Write;
use std::process::ExitCode;

use cni_guard::cni::{self, Action};
use cni_guard::error::{code, Error};
use cni_guard::{invoke, log};

fn main() -> ExitCode {
    if std::env::var_os("CNI_COMMAND").is_none() {
        return operator(std::env::args_os().skip(1).collect());
    }
    // A panic must still answer the runtime in the spec's terms, never with a bare backtrace.
    std::panic::set_hook(Box::new(|info| {
        let e = Error::new(
            code::INTERNAL,
            format!("cni-guard failed internally: {info}"),
            "",
        );
        let _ = std::io::stdout().write_all(&e.to_json(cni_guard::version::LATEST));
        log::emit(log::Level::Warning, &format!("internal failure: {info}"));
    }));
    let outcome = cni::handle(&|k| std::env::var_os(k), &mut std::io::stdin().lock());
    for w in &outcome.warnings {
        log::emit(log::Level::Warning, w);
    }
    log::emit(outcome.decision.level(), &log::invocation_line(&outcome));
    let (stdout, exit) = match outcome.action {
        Action::Reply { stdout, exit } => (stdout, exit),
        Action::Exec {
            plugin,
            config,
            cni_version,
            lock,
        } => {
            let e = invoke::exec(&plugin, &config);
            // The exec failed: the guard is the holder again, and lets go when it exits.
            drop(lock);
            log::emit(log::Level::Warning, &format!("exec failed: {e}"));
            (e.to_json(&cni_version), 1)
        }
    };
    let mut out = std::io::stdout().lock();
    if out.write_all(&stdout).and_then(|()| out.flush()).is_err() {
        return ExitCode::from(1);
    }
    ExitCode::from(exit as u8)
}

fn operator(args: Vec<std::ffi::OsString>) -> ExitCode {
    ExitCode::from(cni_guard::operator::run(args) as u8)
}
