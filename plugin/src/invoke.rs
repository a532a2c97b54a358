//! Finding and running delegate plugins, as libcni's `pkg/invoke` does: look the type up in
//! CNI_PATH, pass the runtime's environment with the verb set, the configuration on stdin,
//! read the result from stdout, let stderr through to the runtime.
//!
//! Two ways to run: [`run`] as a child (the guard reads the result), and [`exec`], which
//! replaces the guard with the delegate so the pod pays one exec and nothing more.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

use crate::error::{code, Error};
use crate::request;
use crate::sys;

/// Finds the executable for a plugin type, as libcni's `FindInPath`: the first directory of
/// CNI_PATH holding a regular file of that name; we also require it to be executable.
pub fn find_plugin(plugin_type: &str, cni_path: &[PathBuf]) -> Result<PathBuf, String> {
    if plugin_type.is_empty()
        || plugin_type.contains('/')
        || plugin_type == "."
        || plugin_type == ".."
    {
        return Err(format!("is not a valid plugin type {plugin_type:?}"));
    }
    if cni_path.is_empty() {
        return Err("cannot be looked up: CNI_PATH is empty".to_owned());
    }
    let mut not_executable = None;
    for dir in cni_path {
        let candidate = dir.join(plugin_type);
        if let Ok(meta) = std::fs::metadata(&candidate) {
            if meta.is_file() {
                if meta.permissions().mode() & 0o111 != 0 {
                    return Ok(candidate);
                }
                not_executable.get_or_insert(candidate);
            }
        }
    }
    Err(match not_executable {
        Some(p) => format!("is not executable at {}", p.display()),
        None => format!(
            "is not in CNI_PATH {}",
            cni_path
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(":")
        ),
    })
}

/// Runs a plugin as a child and returns its stdout on success.
///
/// A plugin that fails with the spec's error JSON on stdout fails with that error unchanged;
/// one that crashes, is killed, prints something else or outlives `timeout` (it is then
/// killed) fails with code 999 naming it.
pub fn run(
    plugin: &Path,
    verb: request::Command,
    config: &[u8],
    timeout: Duration,
) -> Result<Vec<u8>, Error> {
    let stdin = sys::memfd_with(config).map_err(|e| {
        Error::new(
            code::IO_FAILURE,
            format!("cannot prepare stdin for {}: {e}", plugin.display()),
            "",
        )
    })?;
    let parent = sys::getpid();
    let mut cmd = Command::new(plugin);
    cmd.env("CNI_COMMAND", verb.as_str())
        .stdin(Stdio::from(stdin))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    // SAFETY: die_with_parent makes only async-signal-safe calls.
    unsafe {
        cmd.pre_exec(move || sys::die_with_parent(parent));
    }
    let cannot_run = |e: std::io::Error| {
        Error::new(
            code::INTERNAL,
            format!("cannot run plugin {}: {e}", plugin.display()),
            "",
        )
    };
    let child = cmd.spawn().map_err(cannot_run)?;
    // A watchdog bounds the wait: it kills the delegate unless told within `timeout` that the
    // delegate has finished.
    let pid = child.id() as libc::pid_t;
    let (finished, finished_rx) = mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        let expired = finished_rx.recv_timeout(timeout) == Err(RecvTimeoutError::Timeout);
        if expired {
            sys::kill(pid, libc::SIGKILL);
        }
        expired
    });
    let out = child.wait_with_output();
    drop(finished);
    let expired = watchdog.join().unwrap_or(false);
    let out = out.map_err(cannot_run)?;
    if expired {
        return Err(Error::new(
            code::INTERNAL,
            format!(
                "plugin {} did not finish within {}s and was killed",
                plugin.display(),
                timeout.as_secs_f64()
            ),
            "",
        ));
    }
    if out.status.success() {
        return Ok(out.stdout);
    }
    if let Some(err) = as_cni_error(&out.stdout) {
        return Err(err);
    }
    let how = match (out.status.code(), out.status.signal()) {
        (Some(c), _) => format!("exited with status {c}"),
        (None, Some(s)) => format!("was killed by signal {s}"),
        _ => "failed".to_owned(),
    };
    Err(Error::new(
        code::INTERNAL,
        format!("plugin {} {how} without a CNI error", plugin.display()),
        String::from_utf8_lossy(&out.stdout[..out.stdout.len().min(1024)]).into_owned(),
    ))
}

/// Replaces this process with the plugin, its configuration on stdin. Returns only on failure.
pub fn exec(plugin: &Path, config: &[u8]) -> Error {
    let stdin = match sys::memfd_with(config) {
        Ok(fd) => fd,
        Err(e) => {
            return Error::new(
                code::IO_FAILURE,
                format!("cannot prepare stdin for {}: {e}", plugin.display()),
                "",
            )
        }
    };
    let e = Command::new(plugin).stdin(Stdio::from(stdin)).exec();
    Error::new(
        code::INTERNAL,
        format!("cannot exec plugin {}: {e}", plugin.display()),
        "",
    )
}

/// The spec's error structure, if `stdout` holds one: an object with a numeric `code`.
pub fn as_cni_error(stdout: &[u8]) -> Option<Error> {
    let v: serde_json::Value = serde_json::from_slice(stdout).ok()?;
    let c = v.get("code")?.as_u64()?;
    v.get("msg")?;
    Some(Error::Delegate {
        stdout: stdout.to_vec(),
        code: u32::try_from(c).unwrap_or(code::INTERNAL),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(30);

    fn script(dir: &Path, name: &str, body: &str, mode: u32) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
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
            .contains("not executable"));
        assert!(find_plugin("missing", &path)
            .unwrap_err()
            .contains("not in CNI_PATH"));
        assert!(find_plugin("../bridge", &path).is_err());
        std::fs::create_dir(a.path().join("dir")).unwrap();
        assert!(find_plugin("dir", &path).is_err());
    }

    #[test]
    fn run_passes_stdin_and_reads_stdout() {
        let d = tempfile::tempdir().unwrap();
        let p = script(d.path(), "echo", "echo \"$CNI_COMMAND\"; cat", 0o755);
        let out = run(&p, request::Command::Del, b"{\"x\":1}", T).unwrap();
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
            run(&p, request::Command::Add, b"{}", T).unwrap_err().code(),
            42
        );
        let p = script(d.path(), "crash", "echo garbage; exit 3", 0o755);
        let e = run(&p, request::Command::Add, b"{}", T).unwrap_err();
        assert_eq!(e.code(), 999);
        assert!(e.msg().contains("status 3"), "{}", e.msg());
        let p = script(d.path(), "killed", "kill -9 $$", 0o755);
        let e = run(&p, request::Command::Add, b"{}", T).unwrap_err();
        assert!(e.msg().contains("signal 9"), "{}", e.msg());
    }

    #[test]
    fn run_kills_a_delegate_that_outlives_its_timeout() {
        let d = tempfile::tempdir().unwrap();
        let p = script(d.path(), "hang", "exec sleep 60", 0o755);
        let e = run(&p, request::Command::Add, b"{}", Duration::from_millis(200)).unwrap_err();
        assert_eq!(e.code(), 999);
        assert!(
            e.msg().contains("did not finish within 0.2s"),
            "{}",
            e.msg()
        );
    }
}
