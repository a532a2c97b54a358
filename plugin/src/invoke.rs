//! Finding and running delegate plugins, as libcni's `pkg/invoke` does: look the type up in
//! CNI_PATH, pass the runtime's environment with the verb set, the configuration on stdin,
//! read the result from stdout, let stderr through to the runtime.
//!
//! Two ways to run: [`run_until`] as a child (the guard reads the result), and [`exec`], which
//! replaces the guard with the delegate so the pod pays one exec and nothing more.

use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::error::{code, Error, Kind};
use crate::problem::Problem;
use crate::sys;
use crate::verb::Command as Verb;

/// Finds the executable for a plugin type, as libcni's `FindInPath`: the first directory of
/// CNI_PATH holding a regular file of that name; we also require it to be executable. The
/// problem says why after the plugin's name: "is not in CNI_PATH ...".
pub fn find_plugin(plugin_type: &str, cni_path: &[PathBuf]) -> Result<PathBuf, Problem> {
    let missing = |why: String| Err(Problem::NoBinary(why));
    if ["", ".", ".."].contains(&plugin_type) || plugin_type.contains('/') {
        return missing(format!("is not a valid plugin type {plugin_type:?}"));
    }
    if cni_path.is_empty() {
        return missing("cannot be looked up: CNI_PATH is empty".to_owned());
    }
    let files: Vec<PathBuf> = cni_path
        .iter()
        .map(|dir| dir.join(plugin_type))
        .filter(|p| p.is_file())
        .collect();
    if let Some(found) = files.iter().find(|p| executable(p)) {
        return Ok(found.clone());
    }
    let path: Vec<String> = cni_path.iter().map(|p| p.display().to_string()).collect();
    missing(match files.first() {
        Some(p) => format!("is not executable at {}", p.display()),
        None => format!("is not in CNI_PATH {}", path.join(":")),
    })
}

/// A regular file (through symlinks) with an execute bit.
fn executable(path: &Path) -> bool {
    path.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// How long the guard keeps reading a finished plugin's pipes for what it wrote, when something
/// it left behind still holds them open. What the plugin itself wrote is in the pipe already.
const DRAIN_GRACE: Duration = Duration::from_millis(100);
/// How long the guard waits for a plugin it killed to be gone: one in uninterruptible sleep (a
/// hung file system) dies only when the kernel lets it, and whoever inherits it reaps it.
const KILL_GRACE: Duration = Duration::from_millis(500);
/// The most of a plugin's stdout kept (a result is a few KiB); what is beyond is read and dropped.
const MAX_STDOUT: usize = 16 << 20;
/// The most read from one pipe per wake-up, so a plugin that never stops writing cannot keep
/// the guard from its deadline.
const READ_PER_WAKE: usize = 64 << 10;

/// Runs a plugin as a child and returns its stdout on success. A plugin still running at
/// `deadline` is killed and the error is `timed_out()` (of [`Kind::TimedOut`]).
///
/// The plugin leads a process group of its own and dies with the guard. The guard waits for
/// the plugin's *exit*, not for the end of its pipes, so a process it leaves behind holding
/// them costs at most [`DRAIN_GRACE`]; its stderr goes through the guard, never waited for, so
/// nothing left behind holds the runtime's pipes either. At the deadline the whole group is
/// killed and the guard answers within [`KILL_GRACE`].
///
/// A plugin that fails with the spec's error JSON on stdout fails with that error unchanged;
/// one that crashes, is killed, prints something else or outlives the deadline fails with
/// code 999 naming it.
pub fn run_until(
    plugin: &Path,
    verb: Verb,
    config: &[u8],
    deadline: Instant,
    timed_out: impl FnOnce() -> Error,
) -> Result<Vec<u8>, Error> {
    let failed =
        |why: String| Error::new(Kind::Failed, format!("plugin {} {why}", plugin.display()));
    let cannot_run = |e: std::io::Error| failed(format!("cannot be run: {e}"));
    let mut cmd = Command::new(plugin);
    cmd.env("CNI_COMMAND", verb.as_str())
        .stdin(Stdio::from(sys::memfd_with(config).map_err(cannot_run)?))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    sys::child_of_guard(&mut cmd);
    let mut child = while_text_busy(|| cmd.spawn()).map_err(cannot_run)?;
    let (status, stdout) = match wait_bounded(&mut child, deadline) {
        Ok(Some(ended)) => ended,
        Ok(None) => return Err(timed_out()),
        Err(e) => {
            sys::kill_group(child.id());
            return Err(cannot_run(e));
        }
    };
    if status.success() {
        return Ok(stdout);
    }
    if let Some(err) = as_cni_error(&stdout) {
        return Err(err);
    }
    let how = match (status.code(), status.signal()) {
        (Some(c), _) => format!("exited with status {c}"),
        (None, Some(s)) => format!("was killed by signal {s}"),
        _ => "failed".to_owned(),
    };
    let printed = String::from_utf8_lossy(&stdout[..stdout.len().min(1024)]).into_owned();
    Err(failed(format!("{how} without a CNI error")).with_details(printed))
}

/// Reads the child's stdout (kept) and stderr (relayed to ours) until it exits, then for at
/// most [`DRAIN_GRACE`] more. At `deadline` its process group is killed: `None`.
fn wait_bounded(
    child: &mut Child,
    deadline: Instant,
) -> std::io::Result<Option<(ExitStatus, Vec<u8>)>> {
    let out = OwnedFd::from(child.stdout.take().expect("stdout is piped"));
    let err = OwnedFd::from(child.stderr.take().expect("stderr is piped"));
    sys::set_nonblocking(out.as_fd())?;
    sys::set_nonblocking(err.as_fd())?;
    let exited = sys::pidfd_open(child.id())?;
    let (mut stdout, mut relay) = (Vec::new(), Vec::new());
    let (mut out_open, mut err_open) = (true, true);
    let mut ended: Option<(ExitStatus, Instant)> = None;
    loop {
        if ended.is_none() {
            ended = child
                .try_wait()?
                .map(|st| (st, Instant::now() + DRAIN_GRACE));
        }
        let now = Instant::now();
        match ended {
            Some((st, until)) if !(out_open || err_open) || now >= until => {
                return Ok(Some((st, stdout)))
            }
            None if now >= deadline => {
                sys::kill_group(child.id());
                reap_within(child, &exited, KILL_GRACE);
                return Ok(None);
            }
            _ => {}
        }
        let limit = ended.map_or(deadline, |(_, until)| until);
        let running = ended.is_none();
        let watched = [(out_open, &out), (err_open, &err), (running, &exited)];
        let fds: Vec<_> = watched
            .iter()
            .filter(|(on, _)| *on)
            .map(|(_, fd)| fd.as_fd())
            .collect();
        sys::poll_readable(&fds, Some(limit.saturating_duration_since(now)))?;
        if out_open {
            out_open = !sys::read_available(out.as_fd(), &mut stdout, MAX_STDOUT, READ_PER_WAKE)?;
        }
        if err_open {
            relay.clear();
            err_open = !sys::read_available(err.as_fd(), &mut relay, READ_PER_WAKE, READ_PER_WAKE)?;
            sys::write_nowait(std::io::stderr().as_fd(), &relay);
        }
    }
}

/// Reaps a killed child if it is gone within `grace`; otherwise leaves it (a process in
/// uninterruptible sleep dies when the kernel lets it, and is reaped by whoever inherits it).
fn reap_within(child: &mut Child, pidfd: &OwnedFd, grace: Duration) {
    let until = Instant::now() + grace;
    while let Ok(None) = child.try_wait() {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() || sys::poll_readable(&[pidfd.as_fd()], Some(left)).is_err() {
            return;
        }
    }
}

/// Whether `plugin` can be exec'd as it is: an ELF executable, or a script whose interpreter is
/// there and executable. What fails this runs as a child instead, where its failure is what it
/// is (an exec that failed could not be told from one that ran, once counted).
pub fn can_exec(plugin: &Path) -> bool {
    let mut head = [0u8; 256];
    let n = std::fs::File::open(plugin).and_then(|mut f| f.read(&mut head));
    let head = &head[..n.unwrap_or(0)];
    let Some(line) = head.strip_prefix(b"#!") else {
        return head.starts_with(b"\x7fELF");
    };
    let interpreter = line
        .split(|b| b" \t\n".contains(b))
        .find(|w| !w.is_empty())
        .and_then(|w| std::str::from_utf8(w).ok());
    interpreter.is_some_and(|i| executable(Path::new(i)))
}

/// Replaces this process with the plugin, its configuration on stdin. Returns only on failure.
pub fn exec(plugin: &Path, config: &[u8]) -> Error {
    let failed = sys::memfd_with(config).and_then(|stdin| {
        let mut cmd = Command::new(plugin);
        cmd.stdin(stdin);
        while_text_busy(|| Err::<(), _>(cmd.exec()))
    });
    let e = failed.unwrap_err();
    let msg = format!("cannot exec plugin {}: {e}", plugin.display());
    Error::new(Kind::Failed, msg)
}

/// How long a plugin binary that is open for writing somewhere (ETXTBSY: an installer still
/// writing it, or a process forked while it had it open and not yet at its own exec) is retried.
const TEXT_BUSY_RETRY: Duration = Duration::from_millis(200);

/// Runs `start` (a spawn or an exec) again, with a short backoff, while it fails with ETXTBSY,
/// for at most [`TEXT_BUSY_RETRY`]; the last outcome otherwise.
fn while_text_busy<T>(mut start: impl FnMut() -> std::io::Result<T>) -> std::io::Result<T> {
    let until = Instant::now() + TEXT_BUSY_RETRY;
    let mut pause = Duration::from_millis(1);
    loop {
        match start() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && Instant::now() < until => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            outcome => return outcome,
        }
    }
}

/// The spec's error structure, if `stdout` holds one: an object with a numeric `code`.
pub fn as_cni_error(stdout: &[u8]) -> Option<Error> {
    let v: serde_json::Value = serde_json::from_slice(stdout).ok()?;
    let c = u32::try_from(v.get("code")?.as_u64()?).unwrap_or(code::INTERNAL);
    let msg = v.get("msg")?.as_str().unwrap_or("delegate error");
    Some(Error::delegate(c, msg, stdout.to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run bounded by `timeout` from now.
    fn run(plugin: &Path, verb: Verb, config: &[u8], timeout: Duration) -> Result<Vec<u8>, Error> {
        run_until(plugin, verb, config, Instant::now() + timeout, || {
            Error::new(
                Kind::TimedOut,
                format!(
                    "plugin {} did not finish within {}s and was killed",
                    plugin.display(),
                    timeout.as_secs_f64()
                ),
            )
        })
    }

    const T: Duration = Duration::from_secs(30);

    fn script(dir: &Path, name: &str, body: &str, mode: u32) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    /// A binary open for writing elsewhere (ETXTBSY) is retried, not failed at once: an
    /// installer finishing it, or a process forked while it was open and not yet at its exec.
    #[test]
    fn a_plugin_busy_being_written_is_retried() {
        let d = tempfile::tempdir().unwrap();
        let p = script(d.path(), "busy", "echo '{\"ok\":3}'", 0o755);
        let writer = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
        let release = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            drop(writer);
        });
        let out = run(&p, Verb::Add, b"{}", Duration::from_secs(5));
        release.join().unwrap();
        assert_eq!(out.unwrap(), b"{\"ok\":3}\n");
        // Past the retry window it is the error it was.
        let writer = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
        let e = run(&p, Verb::Add, b"{}", Duration::from_secs(5)).unwrap_err();
        assert!(e.msg().contains("Text file busy"), "{}", e.msg());
        drop(writer);
    }

    #[test]
    fn finds_first_executable_in_path() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        script(a.path(), "noexec", "", 0o644);
        let want = script(b.path(), "bridge", "", 0o755);
        let path = [a.path().to_owned(), b.path().to_owned()];
        assert_eq!(find_plugin("bridge", &path).unwrap(), want);
        assert!(find_plugin("noexec", &path)
            .unwrap_err()
            .to_string()
            .contains("not executable"));
        assert!(find_plugin("missing", &path)
            .unwrap_err()
            .to_string()
            .contains("not in CNI_PATH"));
        assert!(find_plugin("../bridge", &path).is_err());
        std::fs::create_dir(a.path().join("dir")).unwrap();
        assert!(find_plugin("dir", &path).is_err());
    }

    #[test]
    fn run_passes_stdin_and_reads_stdout() {
        let d = tempfile::tempdir().unwrap();
        let p = script(d.path(), "echo", "echo \"$CNI_COMMAND\"; cat", 0o755);
        let out = run(&p, Verb::Del, b"{\"x\":1}", T).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "DEL\n{\"x\":1}");
    }

    #[test]
    fn run_reports_failures() {
        let d = tempfile::tempdir().unwrap();
        let p = script(
            d.path(),
            "err",
            r#"echo '{"code":42,"msg":"nope"}'; exit 1"#,
            0o755,
        );
        assert_eq!(
            run(&p, Verb::Add, b"{}", T).unwrap_err().code(Verb::Add),
            42
        );
        let p = script(d.path(), "crash", "echo garbage; exit 3", 0o755);
        let e = run(&p, Verb::Add, b"{}", T).unwrap_err();
        assert_eq!(e.code(Verb::Add), 999);
        assert!(e.msg().contains("status 3"), "{}", e.msg());
        let p = script(d.path(), "killed", "kill -9 $$", 0o755);
        let e = run(&p, Verb::Add, b"{}", T).unwrap_err();
        assert!(e.msg().contains("signal 9"), "{}", e.msg());
    }

    /// Runs `body` as a plugin under `timeout`; returns the outcome and how long it took.
    fn timed(body: &str, timeout: Duration) -> (Result<Vec<u8>, Error>, Duration) {
        let d = tempfile::tempdir().unwrap();
        let p = script(d.path(), "plugin", body, 0o755);
        let start = Instant::now();
        let r = run(&p, Verb::Add, b"{}", timeout);
        (r, start.elapsed())
    }

    #[test]
    fn a_process_left_behind_on_the_pipes_costs_only_the_grace() {
        // Prints its result and exits at once, leaving a sleeper on stdout and stderr.
        let (r, took) = timed("sleep 5 & echo '{\"ok\":1}'", Duration::from_secs(2));
        assert_eq!(r.unwrap(), b"{\"ok\":1}\n");
        assert!(took < Duration::from_secs(2), "took {took:?}");
    }

    #[test]
    fn a_daemon_it_starts_does_not_hold_the_guard() {
        // Forks a child into a session of its own (out of the plugin's process group).
        let (r, took) = timed(
            "setsid sh -c 'sleep 5' & echo '{\"ok\":2}'",
            Duration::from_secs(2),
        );
        assert_eq!(r.unwrap(), b"{\"ok\":2}\n");
        assert!(took < Duration::from_secs(2), "took {took:?}");
    }

    /// The living (not zombie) processes of process group `pgrp`, from /proc.
    fn living_in_group(pgrp: i32) -> Vec<i32> {
        let mut found = Vec::new();
        for e in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            // "pid (comm) state ppid pgrp ...": comm may hold anything but not the last ')'.
            let Some((_, rest)) = stat.rsplit_once(')') else {
                continue;
            };
            let fields: Vec<&str> = rest.split_whitespace().collect();
            if fields.len() > 2 && fields[0] != "Z" && fields[2] == pgrp.to_string() {
                found.push(pid);
            }
        }
        found
    }

    #[test]
    fn closing_stdout_then_hanging_is_bounded_and_the_group_killed() {
        let d = tempfile::tempdir().unwrap();
        let leader = d.path().join("leader");
        let sleeper = d.path().join("sleeper");
        // The plugin (its group's leader: pgid = its pid) notes its pid and its background
        // sleeper's, closes stdout and hangs.
        let body = format!(
            "echo $$ >{l}; (sleep 30; true) & echo $! >{s}; exec >/dev/null; sleep 30",
            l = leader.display(),
            s = sleeper.display()
        );
        let (r, took) = timed(&body, Duration::from_millis(300));
        let e = r.unwrap_err();
        assert_eq!(e.code(Verb::Add), 999);
        assert!(
            e.msg().contains("did not finish within 0.3s"),
            "{}",
            e.msg()
        );
        assert!(took < Duration::from_secs(2), "took {took:?}");
        let pid = |p: &Path| -> i32 { std::fs::read_to_string(p).unwrap().trim().parse().unwrap() };
        let (group, sleeper) = (pid(&leader), pid(&sleeper));
        assert_ne!(group, sleeper);
        // Every process of the plugin's group, the background sleeper included, died with it
        // (a SIGKILLed process may take a moment to leave /proc).
        let start = Instant::now();
        loop {
            let living = living_in_group(group);
            if living.is_empty() {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "left behind in group {group} (sleeper {sleeper}): {living:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn living_in_group_finds_a_living_group() {
        // The check above must be able to fail: this test's own group has a living member.
        let own = nix::unistd::getpgrp().as_raw();
        assert!(living_in_group(own).contains(&(std::process::id() as i32)));
    }

    #[test]
    fn a_plugin_killed_by_a_signal_is_reported_at_once() {
        let (r, took) = timed("sleep 5 & kill -9 $$", Duration::from_secs(3));
        let e = r.unwrap_err();
        assert!(e.msg().contains("signal 9"), "{}", e.msg());
        assert!(took < Duration::from_secs(2), "took {took:?}");
    }

    #[test]
    fn run_kills_a_delegate_that_outlives_its_timeout() {
        let d = tempfile::tempdir().unwrap();
        let p = script(d.path(), "hang", "exec sleep 60", 0o755);
        let e = run(&p, Verb::Add, b"{}", Duration::from_millis(200)).unwrap_err();
        assert_eq!(e.code(Verb::Add), 999);
        assert!(
            e.msg().contains("did not finish within 0.2s"),
            "{}",
            e.msg()
        );
    }
}
