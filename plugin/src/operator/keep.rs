//! `cni-guard keep`: the DaemonSet's long-running container. It watches the conf dir with
//! inotify and puts the guard's conflist back whenever something deletes, renames or rewrites
//! it (Cilium's `cni.exclusive: true` renames foreign configs to `*.cilium_bak`; an installer
//! may overwrite). On SIGTERM it exits and leaves the file exactly as it is: a pod stopping
//! must never open the window the guard exists to close.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::files::{conf_files_before, is_conf_name, write_atomically, Written};
use super::spec::{GuardFile, SPEC_FLAGS_HELP};
use super::Flags;
use crate::error::{Error, Kind, Result};
use crate::sys::daemon::{signal_name, wait_readable, DirWatch, TermSignals};

fn help() -> String {
    format!(
        "\
Usage: cni-guard keep --conf-dir DIR --delegate FILE [options]

Writes the guard's conflist (as `install` does, without the binary) and then keeps it: when
anything deletes, renames or rewrites it, the file is put back at once and the restoration is
logged. Exits 0 on SIGTERM, SIGINT or SIGHUP without touching the file. Takes the same
conflist flags as `install`; give it the same values.

{SPEC_FLAGS_HELP}"
    )
}

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
    while let Some(flag) = flags.next_flag()? {
        match flag.as_str() {
            "--help" | "-h" => {
                print!("{}", help());
                return Ok(0);
            }
            other => {
                if !spec.take_flag(other, &mut flags)? {
                    return Err(Flags::unknown(other));
                }
            }
        }
    }
    let conf_dir = spec.validate()?.to_path_buf();
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
        }
        if other_configs {
            keeper.warn_about_earlier_configs(&mut warned);
        }
    }
}

struct Keeper {
    dir: PathBuf,
    name: String,
    path: PathBuf,
    content: Vec<u8>,
}

impl Keeper {
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
    eprintln!("cni-guard keep: {line}");
}
