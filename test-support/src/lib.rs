//! What the test suites share, said once: running the built `cni-guard` binary as a runtime
//! runs it (a cleared environment, the given variables, the given stdin), whether this process
//! is root, and the gate of suites that need root or tools: under `CI=true` a missing
//! prerequisite fails the test; locally the test says loudly that it skipped and returns. And
//! the names of the suites' network namespaces, with the removal of those a killed run left
//! ([`netns`]).
//!
//! Used by the plugin's integration tests (as a dev-dependency) and by the conformance crates.

pub mod netns;

use std::ffi::OsStr;
use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, Stdio};

/// How a run of the binary ended and what it wrote.
#[derive(Debug)]
pub struct Run {
    /// The exit status; `None` when a signal ended it (see `signal`).
    pub status: Option<i32>,
    pub signal: Option<i32>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

impl Run {
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
}

/// `program` with nothing of this process's environment but `env`, in order: `Some` sets a
/// variable, `None` removes one set earlier in the list (so a call can override a default).
pub fn command<K, V>(
    program: impl AsRef<OsStr>,
    env: impl IntoIterator<Item = (K, Option<V>)>,
) -> Command
where
    K: AsRef<OsStr>,
    V: AsRef<OsStr>,
{
    let mut c = Command::new(program);
    c.env_clear();
    for (k, v) in env {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    c
}

fn piped(cmd: &mut Command) -> Child {
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {:?}: {e}", cmd.get_program()))
}

/// Starts `cmd` with stdout and stderr piped and `stdin` written in full and closed before it
/// returns (so the child has all of its input by then). For inputs a pipe holds: a larger one
/// blocks until the child reads it; [`run`] writes from a thread instead.
pub fn spawn(cmd: &mut Command, stdin: &[u8]) -> Child {
    let mut child = piped(cmd);
    let mut input = child.stdin.take().expect("stdin is piped");
    // The child may exit without reading: a broken pipe is its business, not the caller's.
    let _ = input.write_all(stdin);
    drop(input);
    child
}

/// Runs `cmd` to the end with `stdin` written in full from a thread, so that a large stdin
/// cannot deadlock against a full stdout pipe.
pub fn run(cmd: &mut Command, stdin: &[u8]) -> Run {
    let mut child = piped(cmd);
    let mut input = child.stdin.take().expect("stdin is piped");
    let data = stdin.to_vec();
    // The binary may stop reading (its stdin is bounded) and exit: a broken pipe is expected.
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(&data);
    });
    let out = child.wait_with_output().expect("wait for the child");
    writer.join().expect("the stdin writer");
    Run {
        status: out.status.code(),
        signal: out.status.signal(),
        stdout: out.stdout,
        stderr: out.stderr,
    }
}

/// [`run`] of [`command`]: `program` with a cleared environment plus `env`, fed `stdin`.
pub fn run_cleared<K, V>(
    program: impl AsRef<OsStr>,
    env: impl IntoIterator<Item = (K, Option<V>)>,
    stdin: &[u8],
) -> Run
where
    K: AsRef<OsStr>,
    V: AsRef<OsStr>,
{
    run(&mut command(program, env), stdin)
}

/// Whether this process runs with effective uid 0.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Whether this is a CI run (`CI=true`), where a missing prerequisite is a failure.
fn in_ci() -> bool {
    std::env::var_os("CI").is_some_and(|v| v == "true")
}

/// The gate of a suite that needs root (or tools, or files): true when nothing is `missing`
/// (the caller lists "root" when [`is_root`] is false). Otherwise, under
/// `CI=true` it panics (a suite that cannot run is a failure there, never a skip); locally it
/// says loudly on stderr that the suite was skipped and returns false, for
/// `if !prerequisites(..) { return; }`.
#[track_caller]
pub fn prerequisites(suite: &str, missing: &[String]) -> bool {
    match unmet(suite, missing, in_ci()) {
        None => true,
        Some(Unmet::Fail(msg)) => panic!("{msg}"),
        Some(Unmet::Skip(msg)) => {
            eprintln!("{msg}");
            false
        }
    }
}

enum Unmet {
    Fail(String),
    Skip(String),
}

fn unmet(suite: &str, missing: &[String], ci: bool) -> Option<Unmet> {
    if missing.is_empty() {
        return None;
    }
    let what = format!("{suite}: missing {}", missing.join(", "));
    Some(if ci {
        Unmet::Fail(format!(
            "{what} (CI=true: a missing prerequisite is a failure)"
        ))
    } else {
        Unmet::Skip(format!("\n!!!!!!!! SKIPPED (not run, not passed) {what}\n"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_is_cleared_and_then_set_in_order() {
        // The test process has PATH and more; the child must see exactly what it was given.
        let r = run_cleared(
            "/usr/bin/env",
            [
                ("A", Some("1")),
                ("B", Some("2")),
                ("B", None),
                ("C", Some("3")),
            ],
            b"",
        );
        assert_eq!(r.status, Some(0), "{}", r.stderr_text());
        assert_eq!(r.stdout_text(), "A=1\nC=3\n");
    }

    #[test]
    fn stdin_is_fed_in_full_and_outputs_are_kept_apart() {
        // 4 MiB: more than any pipe buffer, so the writer must not block the wait.
        let r = run(
            Command::new("/bin/sh").args(["-c", "echo err >&2; wc -c; exit 3"]),
            &vec![b'x'; 4 << 20],
        );
        assert_eq!(r.status, Some(3));
        assert_eq!(r.stdout_text().trim(), (4 << 20).to_string());
        assert_eq!(r.stderr_text(), "err\n");
    }

    #[test]
    fn a_reader_that_stops_early_is_not_an_error() {
        let r = run(
            Command::new("/bin/sh").args(["-c", "head -c 1 >/dev/null; exit 0"]),
            &vec![b'y'; 1 << 20],
        );
        assert_eq!(r.status, Some(0));
    }

    #[test]
    fn spawn_feeds_stdin_in_full_and_closes_it() {
        // cat ends only at the end of its input.
        let mut c = Command::new("/bin/sh");
        c.args(["-c", "sleep 0.2; cat"]);
        let child = spawn(&mut c, b"all of it");
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.stdout, b"all of it");
    }

    #[test]
    fn a_signal_is_reported_as_such() {
        let r = run(Command::new("/bin/sh").args(["-c", "kill -9 $$"]), b"");
        assert_eq!((r.status, r.signal), (None, Some(9)));
    }

    #[test]
    fn is_root_is_the_effective_uid() {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let euid = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .unwrap();
        assert_eq!(is_root(), euid == "0");
    }

    #[test]
    fn the_gate_fails_under_ci_and_skips_loudly_locally() {
        assert!(unmet("s", &[], true).is_none());
        assert!(unmet("s", &[], false).is_none());
        let missing = ["root".to_owned(), "ip on PATH".to_owned()];
        match unmet("suite", &missing, true) {
            Some(Unmet::Fail(m)) => assert_eq!(
                m,
                "suite: missing root, ip on PATH (CI=true: a missing prerequisite is a failure)"
            ),
            _ => panic!("under CI a missing prerequisite must fail"),
        }
        match unmet("suite", &missing, false) {
            Some(Unmet::Skip(m)) => assert_eq!(
                m,
                "\n!!!!!!!! SKIPPED (not run, not passed) suite: missing root, ip on PATH\n"
            ),
            _ => panic!("locally a missing prerequisite must skip"),
        }
    }

    #[test]
    fn the_gate_passes_with_nothing_missing() {
        assert!(prerequisites("suite", &[]));
    }
}
