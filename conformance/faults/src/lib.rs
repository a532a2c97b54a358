//! The harness of the fault suites (`tests/faults.rs`): the guard binary, delegates that
//! misbehave on purpose, network namespaces and mounts that are always removed, and the
//! prerequisites check that skips loudly locally and fails under `CI=true`.
//!
//! The suites are `#[ignore]`d in `cargo test --workspace`: `scripts/test.d/50-hardening.sh`
//! runs them against the release binary (`CNI_GUARD_BIN`), once, one at a time.

use std::ffi::OsStr;
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// Where the reference plugins are (Debian's containernetworking-plugins).
pub const REFERENCE_PLUGINS: &str = "/usr/lib/cni";

/// The guard binary under test: `CNI_GUARD_BIN`, else the workspace's debug build.
pub fn guard_bin() -> PathBuf {
    let p = std::env::var_os("CNI_GUARD_BIN").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/debug/cni-guard"),
        PathBuf::from,
    );
    assert!(
        p.is_file(),
        "the guard binary {} does not exist: build it (cargo build --release -p cni-guard) and set CNI_GUARD_BIN",
        p.display()
    );
    p
}

/// The project's recording fake delegate.
pub fn fake_plugin() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/plugins/fake-plugin")
}

/// Whether a suite can run. When it cannot: under `CI=true` that is a failure (panic);
/// locally the suite says so loudly on stderr and the caller returns.
pub fn can_run(suite: &str, needs_root: bool, tools: &[&str]) -> bool {
    let mut missing = Vec::new();
    if needs_root && !test_support::is_root() {
        missing.push("root".to_owned());
    }
    for t in tools {
        let found = if t.starts_with('/') {
            Path::new(t).exists()
        } else {
            std::env::var_os("PATH")
                .map(|p| std::env::split_paths(&p).any(|d| d.join(t).is_file()))
                .unwrap_or(false)
        };
        if !found {
            missing.push((*t).to_owned());
        }
    }
    test_support::prerequisites(suite, &missing)
}

/// A small deterministic generator (xorshift64*), seeded from the clock or `FAULTS_SEED`, so a
/// failing run can be replayed.
pub struct Rng(u64);

impl Rng {
    pub fn new(suite: &str) -> Rng {
        let seed = std::env::var("FAULTS_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64
                    | 1
            });
        eprintln!("{suite}: FAULTS_SEED={seed}");
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// How many iterations: `var` overrides `default` (for quick local runs).
pub fn iterations(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A named network namespace (`/run/netns/<name>`), deleted on drop.
pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn new(prefix: &str) -> Netns {
        let name = test_support::netns::name(prefix);
        run_ok(Command::new("ip").args(["netns", "add", &name]));
        let ns = Netns { name };
        run_ok(Command::new("ip").args(["-n", &ns.name, "link", "set", "lo", "up"]));
        ns
    }

    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/run/netns/{}", self.name))
    }

    /// `ip -n <ns> -o link show <args>`: one line per link.
    pub fn links(&self, args: &[&str]) -> Vec<String> {
        let out = Command::new("ip")
            .args(["-n", &self.name, "-o", "link", "show"])
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// A tmpfs mounted on a directory, unmounted on drop.
pub struct Tmpfs {
    pub dir: PathBuf,
}

impl Tmpfs {
    pub fn new(dir: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(dir).unwrap();
        run_ok(
            Command::new("mount")
                .args([
                    "-t",
                    "tmpfs",
                    "-o",
                    &format!("size={size},mode=0700"),
                    "cni-guard-faults",
                ])
                .arg(dir),
        );
        Tmpfs {
            dir: dir.to_owned(),
        }
    }

    pub fn remount_ro(&self) {
        run_ok(
            Command::new("mount")
                .args(["-o", "remount,ro"])
                .arg(&self.dir),
        );
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
    }
}

/// A shell-script delegate in `dir`, named after its plugin type.
pub fn script(dir: &Path, ty: &str, body: &str) -> PathBuf {
    let p = dir.join(ty);
    std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

/// One invocation of the guard as a runtime makes it.
pub struct Invocation<'a> {
    pub command: &'a str,
    pub container: &'a str,
    pub ifname: &'a str,
    pub netns: &'a str,
    pub cni_path: &'a Path,
    pub config: &'a serde_json::Value,
    /// Run in this network namespace (the "host" side, where bridges are made).
    pub host: Option<&'a Netns>,
    pub extra_env: Vec<(&'a str, String)>,
}

impl Invocation<'_> {
    /// Starts the guard; stdin is written in full and closed.
    pub fn spawn(&self) -> Child {
        let env: [(&str, &OsStr); 7] = [
            ("PATH", "/usr/sbin:/usr/bin:/sbin:/bin".as_ref()),
            ("CNI_COMMAND", self.command.as_ref()),
            ("CNI_CONTAINERID", self.container.as_ref()),
            ("CNI_IFNAME", self.ifname.as_ref()),
            ("CNI_NETNS", self.netns.as_ref()),
            ("CNI_PATH", self.cni_path.as_ref()),
            // Logs to stderr, not to the machine's syslog.
            (
                "CNI_GUARD_SYSLOG",
                "/nonexistent-cni-guard-faults-syslog".as_ref(),
            ),
        ];
        let extra = self.extra_env.iter().map(|(k, v)| (*k, v.as_ref()));
        let mut c = test_support::command(
            guard_bin(),
            env.into_iter().chain(extra).map(|(k, v)| (k, Some(v))),
        );
        if let Some(ns) = self.host {
            let f = std::fs::File::open(ns.path()).unwrap();
            // SAFETY: setns is async-signal-safe; the fd stays open in the parent until spawn
            // returns (f lives past it).
            unsafe {
                let fd = f.as_raw_fd();
                c.pre_exec(move || {
                    if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
            let child = self.spawn_with(c);
            drop(f);
            return child;
        }
        self.spawn_with(c)
    }

    fn spawn_with(&self, mut c: Command) -> Child {
        test_support::spawn(&mut c, &serde_json::to_vec(self.config).unwrap())
    }

    /// Runs the guard to completion (at most `limit`).
    pub fn run(&self, limit: Duration) -> Outcome {
        wait(self.spawn(), limit)
    }
}

pub struct Outcome {
    pub status: Option<i32>,
    pub signal: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Outcome {
    pub fn ok(self) -> Outcome {
        assert_eq!(
            self.status,
            Some(0),
            "stdout {} stderr {}",
            self.stdout,
            self.stderr
        );
        self
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not one JSON value ({e}): {:?}", self.stdout))
    }
}

/// Waits for a child, killing it and failing if it takes longer than `limit`.
pub fn wait(mut child: Child, limit: Duration) -> Outcome {
    let start = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the guard did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let out = child.wait_with_output().unwrap();
    use std::os::unix::process::ExitStatusExt;
    Outcome {
        status: out.status.code(),
        signal: out.status.signal(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Whether a process exists (and is not a zombie).
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// Waits up to `limit` for `cond`.
pub fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    cond()
}

/// Every file name in a directory (empty when it does not exist).
pub fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}
