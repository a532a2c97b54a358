//! Waiting for a not-ready network to become ready, up to `waitSeconds`: woken by inotify when a
//! file arrives (by creation or by rename, as atomic writers do) or changes, and never past the
//! deadline. One thing raises no inotify event: a daemon that has bound its socket (the file
//! appears) but does not listen yet. While a socket file is there and refuses connections, the
//! wait also re-polls, with a short backoff ([`SOCKET_POLL_FIRST`] doubling to
//! [`SOCKET_POLL_MAX`]).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::config::GuardConfig;
use crate::readiness::{self, Item, Report, Subject};
use crate::sys::{Inotify, DIR_CHANGES};

/// Fallback step when inotify itself is unavailable (out of instances or watches).
const FALLBACK_STEP: Duration = Duration::from_millis(50);
/// The first re-poll of a socket that is there but refuses, and the longest one.
const SOCKET_POLL_FIRST: Duration = Duration::from_millis(10);
const SOCKET_POLL_MAX: Duration = Duration::from_millis(200);

/// Checks readiness, waiting up to `wait` for it (ADD's `cfg.wait`, DEL's `cfg.del_wait`, or
/// what is left of DEL's budget when it waits to run a DEL again): the caller bounds the wait,
/// nothing here cuts it. Returns the last report.
pub fn until_ready(cfg: &GuardConfig, cni_path: &[PathBuf], wait: Duration) -> Report {
    let mut report = readiness::check(cfg, cni_path);
    if done(&report) || wait.is_zero() {
        return report;
    }
    let deadline = Instant::now() + wait;
    // One instance for the whole wait: adding a watch again is harmless. (Its last close waits
    // for the kernel to retire the watches, 20-70 ms, paid only by an ADD that waited anyway.)
    let inotify = Inotify::new().ok();
    let mut socket_poll = SOCKET_POLL_FIRST;
    loop {
        let watching = inotify.as_ref().filter(|i| watch(i, &report, cni_path));
        // Checked after the watches are in place (and so once per wake-up): a file that arrived
        // before a watch existed would otherwise be missed until the deadline.
        report = readiness::check(cfg, cni_path);
        let mut step = deadline.saturating_duration_since(Instant::now());
        if done(&report) || step.is_zero() {
            return report;
        }
        if socket_bound_not_listening(&report) {
            step = step.min(socket_poll);
            socket_poll = (socket_poll * 2).min(SOCKET_POLL_MAX);
        }
        if !watching.is_some_and(|i| i.wait(step).is_ok()) {
            std::thread::sleep(step.min(FALLBACK_STEP));
        }
    }
}

fn done(report: &Report) -> bool {
    report.ready() || report.failures().any(Item::fatal)
}

/// A socket precondition fails although its file is there: bound, not (yet) listening.
fn socket_bound_not_listening(report: &Report) -> bool {
    report
        .failures()
        .any(|i| i.subject == Subject::Socket && i.path.exists())
}

/// Watches the directories that matter, or the nearest ancestor that exists. False when some
/// directory has no watchable ancestor (then the caller falls back to sleeping).
fn watch(inotify: &Inotify, report: &Report, cni_path: &[PathBuf]) -> bool {
    report.watch_dirs(cni_path).iter().all(|dir| {
        dir.ancestors()
            .any(|d| inotify.watch_dir(d, DIR_CHANGES).is_ok())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn setup(wait: f64) -> (tempfile::TempDir, GuardConfig, Vec<PathBuf>) {
        let d = tempfile::tempdir().unwrap();
        let bin = d.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        let p = bin.join("x");
        std::fs::write(&p, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        let v = serde_json::json!({"cniVersion":"1.0.0","name":"g","type":"cni-guard",
            "delegate": d.path().join("net.d/00-d.conf"), "waitSeconds": wait});
        let cfg = GuardConfig::parse(&serde_json::to_vec(&v).unwrap()).unwrap();
        (d, cfg, vec![bin])
    }

    #[test]
    fn gives_up_at_the_deadline() {
        let (_d, cfg, path) = setup(0.2);
        let start = Instant::now();
        let r = until_ready(&cfg, &path, cfg.wait);
        assert!(!r.ready());
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(200), "{took:?}");
        assert!(took < Duration::from_secs(2), "waited {took:?} of 0.2 s");
    }

    /// The wait never lasts longer than asked, even while unrelated files in the watched
    /// directory keep waking it (each wake-up must count against the same deadline).
    #[test]
    fn never_waits_longer_than_asked_while_other_files_churn() {
        let (d, cfg, path) = setup(0.5);
        let dir = d.path().join("net.d");
        std::fs::create_dir(&dir).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let churn = {
            let (dir, stop) = (dir.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let p = dir.join(format!("other-{}", n % 4));
                    std::fs::write(&p, b"{}").unwrap();
                    std::fs::remove_file(&p).unwrap();
                    n += 1;
                    std::thread::sleep(Duration::from_millis(2));
                }
                n
            })
        };
        let start = Instant::now();
        let r = until_ready(&cfg, &path, cfg.wait);
        let took = start.elapsed();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let events = churn.join().unwrap();
        assert!(!r.ready());
        assert!(events > 10, "the churn made only {events} changes");
        assert!(took >= Duration::from_millis(500), "{took:?}");
        assert!(
            took < Duration::from_secs(3),
            "waited {took:?} of 0.5 s through {events} unrelated changes"
        );
    }

    /// A folder flooded with changes (several writers that never pause) does not hold the wait
    /// past its deadline: each drain of the events is bounded.
    #[test]
    fn a_flood_of_changes_does_not_hold_the_wait() {
        let (d, cfg, path) = setup(0.3);
        let dir = d.path().join("net.d");
        std::fs::create_dir(&dir).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flood: Vec<_> = (0..4)
            .map(|t| {
                let (dir, stop) = (dir.clone(), stop.clone());
                std::thread::spawn(move || {
                    let p = dir.join(format!("other-{t}"));
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        std::fs::write(&p, b"{}").unwrap();
                        std::fs::remove_file(&p).unwrap();
                    }
                })
            })
            .collect();
        let (done, took) = std::sync::mpsc::channel();
        let waiter = std::thread::spawn(move || {
            let start = Instant::now();
            let r = until_ready(&cfg, &path, cfg.wait);
            let _ = done.send(start.elapsed());
            r
        });
        let took = took.recv_timeout(Duration::from_secs(10));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for f in flood {
            f.join().unwrap();
        }
        let took = took.expect("the wait did not end within 10 s of a 0.3 s deadline");
        assert!(!waiter.join().unwrap().ready());
        assert!(took < Duration::from_secs(3), "waited {took:?} of 0.3 s");
    }

    #[test]
    fn wakes_when_the_file_is_renamed_into_a_directory_created_later() {
        let (d, cfg, path) = setup(30.0);
        let root = d.path().to_owned();
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            std::fs::create_dir(root.join("net.d")).unwrap();
            std::thread::sleep(Duration::from_millis(50));
            std::fs::write(
                root.join("net.d/.tmp"),
                r#"{"cniVersion":"1.0.0","name":"d","type":"x"}"#,
            )
            .unwrap();
            std::fs::rename(root.join("net.d/.tmp"), root.join("net.d/00-d.conf")).unwrap();
        });
        let r = until_ready(&cfg, &path, cfg.wait);
        writer.join().unwrap();
        assert!(r.ready(), "{:?}", r.items);
    }
}
