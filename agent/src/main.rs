//! `cni-guard-agent`: cni-guard's node agent, run by a person or by the DaemonSet, never by a
//! container runtime: `install`, `uninstall`, `keep` (with metrics), `check`. The plugin itself,
//! `cni-guard`, is the other binary: it does the CNI verbs and nothing else.
//!
//! Exit codes: 0 done (or ready), 1 the operation failed or was refused (or not ready),
//! 2 the command line was wrong.

#![forbid(unsafe_code)]

mod budget;
mod build;
mod check;
mod daemon;
mod files;
mod install;
mod keep;
mod metrics;
mod spec;
mod uninstall;

use std::ffi::OsString;
use std::path::PathBuf;

use cni_guard::error::{Error, Kind, Result};

/// The CNI specification versions the guard speaks, as `--help` lists them.
pub use cni_guard::version::SUPPORTED as SPEC_VERSIONS;

fn main() -> std::process::ExitCode {
    std::process::ExitCode::from(run(std::env::args_os().skip(1).collect()) as u8)
}

fn usage() -> String {
    format!(
        "\
cni-guard-agent: the node agent of cni-guard, a CNI meta-plugin that refuses ADD until its
delegate network is complete. The plugin is the other binary, cni-guard, which the container
runtime runs; this one is run by hand or by the DaemonSet:

  cni-guard-agent install     copy the plugin into the CNI bin dir and write the guard's conflist
  cni-guard-agent uninstall   remove the conflist, then the plugin
  cni-guard-agent keep        put the conflist back whenever something deletes, renames or
                              rewrites it; log readiness; serve metrics
  cni-guard-agent check       say whether ADD would proceed now, one line per precondition
  cni-guard-agent --version   print the version and the commit it was built from

Each command takes --help. Exit codes: 0 done or ready, 1 failed, refused or not ready,
2 wrong command line. CNI spec versions spoken: {}.
",
        SPEC_VERSIONS.join(", ")
    )
}

/// Entry point of operator mode; `args` excludes argv[0]. Returns the process exit code.
pub fn run(args: Vec<OsString>) -> i32 {
    let mut args = args.into_iter();
    let Some(command) = args.next() else {
        cni_guard::log::to_stderr(usage().trim_end());
        return 2;
    };
    let rest: Vec<OsString> = args.collect();
    match command.to_str().unwrap_or("") {
        "install" => finish("install", install::run(rest)),
        "uninstall" => finish("uninstall", uninstall::run(rest)),
        "keep" => finish("keep", keep::run(rest)),
        "check" => finish("check", check::run(rest)),
        "--version" | "-V" | "version" => {
            println!("{}", crate::build::version_line());
            0
        }
        "--help" | "-h" | "help" => {
            print!("{}", usage());
            0
        }
        other => {
            cni_guard::log::to_stderr(&format!(
                "cni-guard-agent: unknown command {other:?}; see cni-guard-agent --help"
            ));
            2
        }
    }
}

/// The command line was wrong: the message points at `--help`, and the exit code is 2.
pub(crate) fn usage_error(message: impl Into<String>) -> Error {
    Error::new(Kind::Usage, format!("{}; see --help", message.into()))
}

/// A command's exit code for its error: 2 for a wrong command line, 1 for everything else.
pub(crate) fn exit_code(e: &Error) -> i32 {
    match e.kind() {
        Kind::Usage => 2,
        _ => 1,
    }
}

/// The operator edge: a command's error is its message on stderr and its exit code (2 for a
/// wrong command line, 1 for everything else).
fn finish(command: &str, outcome: Result<i32>) -> i32 {
    match outcome {
        Ok(code) => code,
        Err(e) => {
            cni_guard::log::to_stderr(&format!("cni-guard {command}: {}", e.msg()));
            crate::exit_code(&e)
        }
    }
}

/// The command line of a command: `--flag value`, `--flag=value` and bare `--switch`, read by
/// lexopt; flags are named as written (`--bin-dir`).
pub(crate) struct Flags {
    parser: lexopt::Parser,
}

fn lexopt_error(e: lexopt::Error) -> Error {
    usage_error(e.to_string())
}

impl Flags {
    pub fn new(args: Vec<OsString>) -> Flags {
        Flags {
            parser: lexopt::Parser::from_args(args),
        }
    }

    /// The next flag's name (`--bin-dir`), or `None` at the end.
    pub fn next_flag(&mut self) -> Result<Option<String>> {
        use lexopt::Arg::{Long, Short, Value};
        match self.parser.next().map_err(lexopt_error)? {
            None => Ok(None),
            Some(Long(name)) => Ok(Some(format!("--{name}"))),
            Some(Short(c)) => Ok(Some(format!("-{c}"))),
            Some(Value(v)) => Err(crate::usage_error(format!("unexpected argument {v:?}"))),
        }
    }

    /// The value of `flag`, given inline or as the next argument.
    pub fn value(&mut self, flag: &str) -> Result<String> {
        let value = self
            .parser
            .value()
            .map_err(|_| crate::usage_error(format!("{flag} needs a value")))?;
        value
            .into_string()
            .map_err(|v| crate::usage_error(format!("{flag}: value {v:?} is not UTF-8")))
    }

    pub fn path(&mut self, flag: &str) -> Result<PathBuf> {
        let value = self.value(flag)?;
        if value.is_empty() {
            return Err(crate::usage_error(format!("{flag} needs a non-empty path")));
        }
        Ok(PathBuf::from(value))
    }

    /// Fails when `name` was unknown to the caller.
    pub fn unknown(name: &str) -> Error {
        crate::usage_error(format!("unknown flag {name}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wrong_command_line_exits_2_everything_else_1() {
        let e = usage_error("--x needs a value");
        assert_eq!(e.msg(), "--x needs a value; see --help");
        assert_eq!(exit_code(&e), 2);
        assert_eq!(exit_code(&Error::new(Kind::Io, "m")), 1);
    }

    fn flags(args: &[&str]) -> Flags {
        Flags::new(args.iter().map(OsString::from).collect())
    }

    #[test]
    fn flags_take_separate_and_inline_values() {
        let mut f = flags(&["--a", "1", "--b=2", "--c"]);
        assert_eq!(f.next_flag().unwrap().as_deref(), Some("--a"));
        assert_eq!(f.value("--a").unwrap(), "1");
        assert_eq!(f.next_flag().unwrap().as_deref(), Some("--b"));
        assert_eq!(f.value("--b").unwrap(), "2");
        assert_eq!(f.next_flag().unwrap().as_deref(), Some("--c"));
        assert!(f.value("--c").is_err());
    }

    #[test]
    fn flags_reject_positional_and_unused_inline_values() {
        assert_eq!(
            crate::exit_code(&flags(&["stray"]).next_flag().unwrap_err()),
            2
        );
        let mut f = flags(&["--json=yes"]);
        assert_eq!(f.next_flag().unwrap().as_deref(), Some("--json"));
        assert_eq!(crate::exit_code(&f.next_flag().unwrap_err()), 2);
    }
}
