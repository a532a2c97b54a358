//! `cni-guard-agent keep`: the DaemonSet's long-running container. It watches the conf dir with
//! inotify and puts the guard's conflist back whenever something deletes, renames or rewrites
//! it (Cilium's `cni.exclusive: true` renames foreign configs to `*.cilium_bak`; an installer
//! may overwrite). On SIGTERM it exits and leaves the file exactly as it is: a pod stopping
//! must never open the window the guard exists to close.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::check::State;
use crate::daemon::{signal_name, wait_readable, DirWatch, TermSignals};
use crate::files::{conf_files_before, is_conf_name, under_root, write_atomically, Written};
use crate::spec::{GuardFile, SPEC_FLAGS_HELP};
use crate::Flags;
use cni_guard::error::{Error, Kind, Result};

fn help() -> String {
    format!(
        "\
Usage: cni-guard-agent keep --conf-dir DIR --delegate FILE [options]

Writes the guard's conflist (as `install` does, without the binary) and then keeps it: when
anything deletes, renames or rewrites it, the file is put back at once and the restoration is
logged. Exits 0 on SIGTERM, SIGINT or SIGHUP without touching the file. Takes the same
conflist flags as `install`; give it the same values.

Metrics (off unless --metrics-address is given):
  --metrics-address HOST:PORT
                         serve Prometheus text on http://HOST:PORT/metrics: the node's
                         readiness (as `check`), the plugin's decisions and refusals (counted
                         from <cacheDir>/{events}, which keep creates and rotates), the seconds
                         not ready

Readiness (with metrics or without): keep checks once a second what `check` checks and logs
each change, \"ready: ADD would proceed (...)\" or \"not ready: <why>\".
  --host-root DIR        where the host paths the conflist names are (in a pod: /host)
  --cni-path DIRS        where plugin binaries are, host paths [CNI_PATH, else /opt/cni/bin]

{SPEC_FLAGS_HELP}",
        events = cni_guard::events::FILE
    )
}

/// How often the metrics thread checks readiness and counts new events.
const METRICS_TICK: std::time::Duration = std::time::Duration::from_secs(1);
/// How often readiness is checked for the log when metrics are off (with metrics, each
/// metrics tick and scrape checks it).
const READINESS_TICK: std::time::Duration = std::time::Duration::from_secs(1);

/// Events that can change what the guard's file holds, or tell that the folder went away.
const WATCH_MASK: u32 = libc::IN_CREATE
    | libc::IN_CLOSE_WRITE
    | libc::IN_DELETE
    | libc::IN_MOVED_FROM
    | libc::IN_MOVED_TO
    | libc::IN_ATTRIB
    | libc::IN_DELETE_SELF
    | libc::IN_MOVE_SELF
    | libc::IN_ONLYDIR;

/// After a failed write, try again this often (milliseconds) until it succeeds.
const RETRY_MS: i32 = 500;

pub fn run(args: Vec<OsString>) -> Result<i32> {
    let mut flags = Flags::new(args);
    let mut spec = GuardFile::default();
    let mut metrics_address: Option<String> = None;
    let mut host_root: Option<PathBuf> = None;
    let mut cni_path: Option<OsString> = None;
    while let Some(flag) = flags.next_flag()? {
        match flag.as_str() {
            "--help" | "-h" => {
                print!("{}", help());
                return Ok(0);
            }
            "--metrics-address" => metrics_address = Some(flags.value(&flag)?),
            "--host-root" => host_root = Some(flags.path(&flag)?),
            "--cni-path" => cni_path = Some(flags.value(&flag)?.into()),
            other => {
                if !spec.take_flag(other, &mut flags)? {
                    return Err(Flags::unknown(other));
                }
            }
        }
    }
    let conf_dir = spec.validate()?.to_path_buf();
    for warning in spec.budget_warnings() {
        log(&format!("warning: {warning}"));
    }
    let keeper = Keeper {
        path: conf_dir.join(&spec.conf_name),
        dir: conf_dir,
        name: spec.conf_name.clone(),
        content: spec.render(),
    };
    // Signals first: a SIGTERM from here on is queued for the loop, never half-handled.
    let signals =
        TermSignals::block().map_err(|e| Error::new(Kind::Io, format!("signalfd: {e}")))?;
    // The watch before the first write, so nothing that happens in between goes unseen.
    let watch = DirWatch::new(&keeper.dir, WATCH_MASK)
        .map_err(|e| Error::new(Kind::Io, format!("watching {}: {e}", keeper.dir.display())))?;

    let mut pending = !keeper.ensure("wrote");
    let mut fight = RenameFight::default();
    let readiness = Readiness {
        config: keeper.path.clone(),
        host_root: host_root.clone(),
        cni_path: cni_path.clone(),
        last: None,
    };
    // Served on a thread of its own: the loop below never waits on a network peer. Readiness
    // is checked there too, or on a thread of its own without metrics: the loop below never
    // waits on a readiness check (a socket's connect, a slow file system).
    match &metrics_address {
        Some(address) => Metrics::start(
            address,
            under_root(host_root.as_deref(), &spec.cache_dir()),
            readiness,
        )?,
        None => readiness.start()?,
    }

    let mut warned = BTreeSet::new();
    keeper.warn_about_earlier_configs(&mut warned);
    log(&format!(
        "keeping {} (pid {})",
        keeper.path.display(),
        std::process::id()
    ));

    loop {
        let timeout = if pending { RETRY_MS } else { -1 };
        let ready = wait_readable(&[signals.as_fd(), watch.as_fd()], timeout)
            .map_err(|e| Error::new(Kind::Io, format!("poll: {e}")))?;
        if ready[0] {
            if let Some(signo) = signals
                .take()
                .map_err(|e| Error::new(Kind::Io, format!("signalfd: {e}")))?
            {
                log(&format!(
                    "{}: exiting; {} left as it is",
                    signal_name(signo),
                    keeper.path.display()
                ));
                return Ok(0);
            }
        }
        let mut recheck = pending;
        let mut other_configs = false;
        if ready[1] {
            let events = watch
                .read_events()
                .map_err(|e| Error::new(Kind::Io, format!("reading inotify events: {e}")))?;
            for event in &events {
                if event.mask & (libc::IN_DELETE_SELF | libc::IN_MOVE_SELF | libc::IN_IGNORED) != 0
                {
                    return Err(Error::new(
                        Kind::Failed,
                        format!(
                        "{} itself was removed or moved; exiting so that a restart watches it anew",
                        keeper.dir.display()
                    ),
                    ));
                }
                if event.mask & libc::IN_Q_OVERFLOW != 0 {
                    recheck = true;
                }
                match event.name.as_deref().and_then(|n| n.to_str()) {
                    Some(name) if name == keeper.name => recheck = true,
                    Some(name) if is_conf_name(name) => other_configs = true,
                    _ => {}
                }
            }
        }
        if recheck {
            pending = !keeper.ensure("restored");
            fight.after_restore(&keeper);
        }
        if other_configs {
            keeper.warn_about_earlier_configs(&mut warned);
        }
    }
}

/// `keep --metrics-address`: the collector of the node's events and the server of `/metrics`,
/// on a thread of their own. What is counted and checked is shared with the connection threads.
struct Metrics {
    collector: crate::metrics::Collector,
    readiness: Readiness,
}

/// The node's readiness as `check` sees it, logged at each change: `ready: <what holds>` or
/// `not ready: <why>`, the first time at start.
struct Readiness {
    /// The conflist keep writes, checked as `check` checks it.
    config: PathBuf,
    host_root: Option<PathBuf>,
    cni_path: Option<OsString>,
    /// What was logged last.
    last: Option<(bool, String)>,
}

impl Readiness {
    /// Checks readiness now; logs it when it differs from the last check. Returns it, with the
    /// count of fallback configurations.
    fn check(&mut self) -> State {
        let now = crate::check::state(
            &self.config,
            self.host_root.as_deref(),
            self.cni_path.clone(),
        );
        let said = (now.ready, now.words.clone());
        if self.last.as_ref() != Some(&said) {
            log(&format!(
                "{}: {}",
                if now.ready { "ready" } else { "not ready" },
                now.words
            ));
            self.last = Some(said);
        }
        now
    }

    /// Without metrics: a thread of its own checks once every [`READINESS_TICK`].
    fn start(mut self) -> Result<()> {
        std::thread::Builder::new()
            .name("readiness".into())
            .spawn(move || loop {
                self.check();
                std::thread::sleep(READINESS_TICK);
            })
            .map(drop)
            .map_err(|e| Error::new(Kind::Io, format!("readiness: cannot start a thread: {e}")))
    }
}

impl Metrics {
    /// Binds `address` and starts the metrics thread. Fails (and keep with it) only when the
    /// events file or the address cannot be had.
    fn start(address: &str, cache_dir: PathBuf, readiness: Readiness) -> Result<()> {
        use crate::metrics::server::{Answer, Reply, Server};
        let collector = crate::metrics::Collector::start(&cache_dir).map_err(|e| {
            Error::new(
                Kind::Io,
                format!(
                    "metrics: cannot start the events file in {}: {e}",
                    cache_dir.display()
                ),
            )
        })?;
        let server = Server::bind(address).map_err(|e| {
            Error::new(
                Kind::Io,
                format!("metrics: cannot listen on {address}: {e}"),
            )
        })?;
        let bound = server
            .local_addr()
            .map_or_else(|_| address.to_owned(), |a| a.to_string());
        let mut m = Metrics {
            collector,
            readiness,
        };
        m.tick();
        let shared = Arc::new(Mutex::new(m));
        let answer: Answer = {
            let shared = Arc::clone(&shared);
            Arc::new(move |_, path| {
                if path != "/metrics" {
                    return Reply {
                        status: "404 Not Found",
                        content_type: "text/plain; charset=utf-8",
                        body: "see /metrics\n".to_owned(),
                    };
                }
                let mut m = lock(&shared);
                m.tick();
                Reply {
                    status: "200 OK",
                    content_type: "text/plain; version=0.0.4; charset=utf-8",
                    body: m.collector.render(std::time::Instant::now()),
                }
            })
        };
        std::thread::Builder::new()
            .name("metrics".into())
            .spawn(move || loop {
                let readable = crate::daemon::poll_readable(&[server.as_fd()], Some(METRICS_TICK));
                lock(&shared).tick();
                if readable.is_ok_and(|r| r[0]) {
                    server.accept_pending(&answer);
                }
            })
            .map_err(|e| Error::new(Kind::Io, format!("metrics: cannot start a thread: {e}")))?;
        log(&format!(
            "serving metrics on http://{bound}/metrics (events from {})",
            cache_dir.join(cni_guard::events::FILE).display()
        ));
        Ok(())
    }

    /// Counts new events and checks readiness.
    fn tick(&mut self) {
        if let Err(e) = self.collector.drain() {
            log(&format!("metrics: reading the events file: {e}"));
        }
        let state = self.readiness.check();
        self.collector
            .observe_ready(state.ready, std::time::Instant::now());
        self.collector.observe_fallback(state.fallback_configs);
    }
}

/// The shared metrics state; a thread that panicked holding it has ended the process already
/// (panic = abort), so a poisoned lock is taken as it is.
fn lock(shared: &Mutex<Metrics>) -> std::sync::MutexGuard<'_, Metrics> {
    shared
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

struct Keeper {
    dir: PathBuf,
    name: String,
    path: PathBuf,
    content: Vec<u8>,
}

/// A fight of renames: another writer keeps renaming our file away (Cilium's `cni.exclusive`
/// renames every other config in its confPath to `*.cilium_bak`, at start and on every change
/// it sees), keep keeps restoring it, and in between containerd may see no guard. Not silent: a
/// warning naming the renamed copies and the count, at most every [`FIGHT_WARN_EVERY`].
#[derive(Default)]
struct RenameFight {
    restores: u64,
    warned: Option<std::time::Instant>,
}

/// How often a rename fight is reported while it lasts.
const FIGHT_WARN_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

impl RenameFight {
    /// After a restore: counts it when a renamed copy of our file sits beside it, and warns.
    fn after_restore(&mut self, keeper: &Keeper) {
        let copies = keeper.renamed_copies();
        if copies.is_empty() {
            return;
        }
        self.restores += 1;
        let now = std::time::Instant::now();
        if self
            .warned
            .is_some_and(|t| now.duration_since(t) < FIGHT_WARN_EVERY)
        {
            return;
        }
        log(&format!(
            "warning: {} keeps being renamed away (beside it: {}); {} restores since the last warning: \
             another writer is fighting keep over it, and while it is gone containerd may build \
             sandboxes without the guard. Cilium's cni.exclusive renames every config in its \
             confPath to *.cilium_bak: set cni.exclusive=false or move Cilium's confPath out of {}",
            keeper.path.display(),
            copies.join(", "),
            self.restores,
            keeper.dir.display()
        ));
        self.restores = 0;
        self.warned = Some(now);
    }
}

impl Keeper {
    /// Renamed copies of our file beside it (`00-cni-guard.conflist.cilium_bak`): what a
    /// renaming writer leaves. keep's own temp files start with a dot and are not among them.
    fn renamed_copies(&self) -> Vec<String> {
        let prefix = format!("{}.", self.name);
        let mut copies: Vec<String> = fs::read_dir(&self.dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| n.starts_with(&prefix))
            .collect();
        copies.sort();
        copies
    }

    /// Makes the file hold exactly our content; logs what it did (`verb`: "wrote" at start,
    /// "restored" after an event). `false` when writing failed (logged; the caller retries).
    fn ensure(&self, verb: &str) -> bool {
        let was = match fs::read(&self.path) {
            Ok(current) if current == self.content => None,
            Ok(_) => Some("its content had changed"),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Some("it was missing"),
            Err(_) => Some("it was unreadable"),
        };
        match write_atomically(&self.dir, &self.name, &self.content, 0o644) {
            Ok(Written::Unchanged) => true,
            Ok(Written::Created) => {
                let reason = was.unwrap_or("it was missing");
                log(&format!("{verb} {}: {reason}", self.path.display()));
                true
            }
            Ok(Written::Replaced) => {
                let reason = was.unwrap_or("its content had changed");
                log(&format!("{verb} {}: {reason}", self.path.display()));
                true
            }
            Err(e) => {
                log(&format!(
                    "could not write {}: {e}; retrying",
                    self.path.display()
                ));
                false
            }
        }
    }

    /// Logs, once per name, a config that sorts before ours: containerd uses that one instead.
    fn warn_about_earlier_configs(&self, warned: &mut BTreeSet<String>) {
        let Ok(before) = conf_files_before(&self.dir, &self.name) else {
            return;
        };
        for name in before {
            if warned.insert(name.clone()) {
                log(&format!(
                    "warning: {} sorts before {}; containerd uses it and the guard is not in force",
                    Path::new(&self.dir).join(&name).display(),
                    self.name
                ));
            }
        }
    }
}

fn log(line: &str) {
    cni_guard::log::to_stderr(&format!("cni-guard keep: {line}"));
}
