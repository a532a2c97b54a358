//! Prometheus metrics of one node's guard: the plugin processes append one line per decision
//! to the cache dir's events file ([`events`]); `keep --metrics-address` counts them
//! ([`Collector`]), checks readiness the way `check` does, and serves the text exposition on
//! `/metrics` ([`server`]).
//!
//! Series:
//!
//! - `cni_guard_ready`: 1 when ADD would proceed now (the same checks as `check`), else 0;
//! - `cni_guard_decisions_total{verb,decision}`: every invocation, by verb (`add`, `del`,
//!   `check`, `status`, `gc`, `version`) and decision (`exec`, `child`, `done`, `refused`,
//!   `error`);
//! - `cni_guard_refusals_total{reason}`: refusals (codes 11 and 50) by reason;
//! - `cni_guard_not_ready_seconds_total`: seconds this `keep` saw the node not ready;
//! - `cni_guard_fallback_configs`: configurations in the guard's conf dir that containerd would
//!   use if the delegate vanished (`check`'s `fallback` line), once the conflist has loaded;
//! - `cni_guard_build_info{version,commit}`: 1, with the binary's version and the commit it was
//!   built from (12 hex digits, or `unknown`).
//!
//! Counters start at 0 when `keep` starts (it begins a new events file), as a process's own
//! counters do.

use cni_guard::events::is_token;

/// The events file's names and bounds as `keep` reads and rotates it.
mod events {
    pub use cni_guard::events::FILE;
    /// The name a rotated file has until `keep` has read it to its end.
    pub const ROTATED: &str = ".metrics-events.old";
    /// The longest line the plugin writes.
    pub const MAX_LINE: usize = 96;
    /// `keep` rotates past this size.
    pub const ROTATE_BYTES: u64 = 1 << 20;
}
pub mod server;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long a rotated events file is kept open for writers that opened it just before the
/// rotation (an append is one system call: microseconds).
const ROTATION_GRACE: Duration = Duration::from_secs(1);

/// The verbs and decisions always exposed (at 0 until they happen), so a rate over them exists
/// from the first scrape.
const VERBS: [&str; 6] = ["add", "del", "check", "status", "gc", "version"];
const DECISIONS: [&str; 5] = ["exec", "child", "done", "refused", "error"];

/// The counts `keep` serves, built from the node's events file.
#[derive(Debug)]
pub struct Collector {
    dir: PathBuf,
    current: Option<Reader>,
    /// A rotated file still read until its grace is over.
    rotated: Option<(Reader, Instant)>,
    decisions: BTreeMap<(String, String), u64>,
    refusals: BTreeMap<String, u64>,
    /// Invocations that waited for the delegate, and the milliseconds they waited, by verb.
    held: BTreeMap<String, (u64, u64)>,
    malformed: u64,
    ready: Option<bool>,
    not_ready: Duration,
    last_observed: Option<Instant>,
    fallback_configs: Option<usize>,
}

#[derive(Debug)]
struct Reader {
    file: File,
    ino: u64,
    partial: Vec<u8>,
}

impl Collector {
    /// Starts counting for `cache_dir` (created 0700 if missing, as the plugin creates it): a
    /// new, empty events file replaces whatever an earlier `keep` left.
    pub fn start(cache_dir: &Path) -> io::Result<Collector> {
        match std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(cache_dir)
        {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        let mut c = Collector {
            dir: cache_dir.to_owned(),
            current: None,
            rotated: None,
            decisions: BTreeMap::new(),
            refusals: BTreeMap::new(),
            held: BTreeMap::new(),
            malformed: 0,
            ready: None,
            not_ready: Duration::ZERO,
            last_observed: None,
            fallback_configs: None,
        };
        let _ = std::fs::remove_file(c.path(events::ROTATED));
        let _ = std::fs::remove_file(c.path(events::FILE));
        c.current = Some(c.create()?);
        Ok(c)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn create(&self) -> io::Result<Reader> {
        let path = self.path(events::FILE);
        // Created for the plugin to append to, read here.
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)?;
        Reader::open(&path)
    }

    /// Counts every complete line appended since the last call; rotates a large file and puts
    /// back a missing or replaced one.
    pub fn drain(&mut self) -> io::Result<()> {
        if let Some((mut old, since)) = self.rotated.take() {
            self.count(&mut old)?;
            if since.elapsed() < ROTATION_GRACE {
                self.rotated = Some((old, since));
            } else {
                let _ = std::fs::remove_file(self.path(events::ROTATED));
            }
        }
        let mut cur = match self.current.take() {
            Some(r) => r,
            None => self.create()?,
        };
        self.count(&mut cur)?;
        let path = self.path(events::FILE);
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.ino() == cur.ino && m.len() < events::ROTATE_BYTES => {
                self.current = Some(cur);
            }
            Ok(m) if m.ino() == cur.ino => {
                std::fs::rename(&path, self.path(events::ROTATED))?;
                self.rotated = Some((cur, Instant::now()));
                self.current = Some(self.create()?);
            }
            // Removed or replaced by something else: start a new one (what was appended to the
            // old inode until now is counted).
            _ => {
                let _ = std::fs::remove_file(&path);
                self.current = Some(self.create()?);
            }
        }
        Ok(())
    }

    fn count(&mut self, r: &mut Reader) -> io::Result<()> {
        let start = r.partial.len();
        r.file.read_to_end(&mut r.partial)?;
        if r.partial.len() == start {
            return Ok(());
        }
        let complete = match r.partial.iter().rposition(|&b| b == b'\n') {
            Some(i) => i + 1,
            None => return Ok(()),
        };
        let lines: Vec<u8> = r.partial.drain(..complete).collect();
        for line in lines.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
            let known = |e: &Line<'_>| {
                (VERBS.contains(&e.verb) || e.verb == "other")
                    && (DECISIONS.contains(&e.decision) || e.decision == "other")
            };
            match std::str::from_utf8(line).ok().and_then(parse).filter(known) {
                Some(e) => {
                    *self
                        .decisions
                        .entry((e.verb.to_owned(), e.decision.to_owned()))
                        .or_default() += 1;
                    if e.decision == "refused" {
                        *self.refusals.entry(e.reason.to_owned()).or_default() += 1;
                    }
                    if let Some(ms) = e.waited_ms {
                        let held = self.held.entry(e.verb.to_owned()).or_default();
                        *held = (held.0 + 1, held.1 + ms);
                    }
                }
                None => self.malformed += 1,
            }
        }
        // A line longer than any the plugin writes is garbage: drop it.
        if r.partial.len() > 4 * events::MAX_LINE {
            r.partial.clear();
            self.malformed += 1;
        }
        Ok(())
    }

    /// Records whether ADD would proceed now; time between two observations counts as not
    /// ready when the earlier one said so.
    pub fn observe_ready(&mut self, ready: bool, now: Instant) {
        if let (Some(false), Some(last)) = (self.ready, self.last_observed) {
            self.not_ready += now.saturating_duration_since(last);
        }
        self.ready = Some(ready);
        self.last_observed = Some(now);
    }

    /// The text exposition (format 0.0.4).
    /// The count of configurations in the conf dir that containerd would use if the delegate
    /// vanished, from the last check (`None`: the guard's conflist did not load).
    pub fn observe_fallback(&mut self, configs: Option<usize>) {
        self.fallback_configs = configs;
    }

    pub fn render(&self, now: Instant) -> String {
        let mut out = String::with_capacity(2048);
        let mut not_ready = self.not_ready;
        if let (Some(false), Some(last)) = (self.ready, self.last_observed) {
            not_ready += now.saturating_duration_since(last);
        }
        let _ = writeln!(
            out,
            "# HELP cni_guard_ready Whether ADD would proceed on this node now (1) or be refused (0), from the same checks as cni-guard-agent check.\n\
             # TYPE cni_guard_ready gauge\n\
             cni_guard_ready {}",
            u8::from(self.ready == Some(true))
        );
        if let Some(n) = self.fallback_configs {
            let _ = writeln!(
                out,
                "# HELP cni_guard_fallback_configs Configurations in the guard's conf dir that containerd would use if the delegate's file vanished: 0 when the layout is safe for a reboot.\n\
                 # TYPE cni_guard_fallback_configs gauge\n\
                 cni_guard_fallback_configs {n}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP cni_guard_decisions_total Invocations of the cni-guard plugin on this node, by verb and decision.\n\
             # TYPE cni_guard_decisions_total counter"
        );
        let mut decisions = self.decisions.clone();
        for v in VERBS {
            for d in DECISIONS {
                decisions.entry((v.to_owned(), d.to_owned())).or_default();
            }
        }
        for ((verb, decision), n) in &decisions {
            let _ = writeln!(
                out,
                "cni_guard_decisions_total{{verb=\"{}\",decision=\"{}\"}} {n}",
                label(verb),
                label(decision)
            );
        }
        let _ = writeln!(
            out,
            "# HELP cni_guard_refusals_total Refused ADD, CHECK and STATUS invocations (codes 11 and 50) on this node, by reason.\n\
             # TYPE cni_guard_refusals_total counter"
        );
        for (reason, n) in &self.refusals {
            let _ = writeln!(
                out,
                "cni_guard_refusals_total{{reason=\"{}\"}} {n}",
                label(reason)
            );
        }
        let _ = writeln!(
            out,
            "# HELP cni_guard_held_total Invocations of the cni-guard plugin on this node that waited for the delegate (ADD up to waitSeconds, DEL up to delWaitSeconds), however they ended, by verb.\n\
             # TYPE cni_guard_held_total counter"
        );
        let mut held = self.held.clone();
        for v in ["add", "del"] {
            held.entry(v.to_owned()).or_default();
        }
        for (verb, (n, _)) in &held {
            let _ = writeln!(out, "cni_guard_held_total{{verb=\"{}\"}} {n}", label(verb));
        }
        let _ = writeln!(
            out,
            "# HELP cni_guard_held_seconds_total Seconds those invocations waited for the delegate, by verb.\n\
             # TYPE cni_guard_held_seconds_total counter"
        );
        for (verb, (_, ms)) in &held {
            let seconds = *ms as f64 / 1000.0;
            let _ = writeln!(
                out,
                "cni_guard_held_seconds_total{{verb=\"{}\"}} {seconds:.3}",
                label(verb)
            );
        }
        let _ = writeln!(
            out,
            "# HELP cni_guard_not_ready_seconds_total Seconds this node was seen not ready (ADD would be refused).\n\
             # TYPE cni_guard_not_ready_seconds_total counter\n\
             cni_guard_not_ready_seconds_total {:.3}",
            not_ready.as_secs_f64()
        );
        let _ = writeln!(
            out,
            "# HELP cni_guard_events_malformed_total Lines of the node's events file that could not be read.\n\
             # TYPE cni_guard_events_malformed_total counter\n\
             cni_guard_events_malformed_total {}",
            self.malformed
        );
        let _ = writeln!(
            out,
            "# HELP cni_guard_build_info The cni-guard binary serving these metrics.\n\
             # TYPE cni_guard_build_info gauge\n\
             cni_guard_build_info{{version=\"{}\",commit=\"{}\"}} 1",
            label(crate::build::VERSION),
            label(crate::build::COMMIT)
        );
        out
    }
}

impl Reader {
    fn open(path: &Path) -> io::Result<Reader> {
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(path)?;
        let ino = file.metadata()?.ino();
        Ok(Reader {
            file,
            ino,
            partial: Vec::new(),
        })
    }
}

/// A label value escaped as the exposition format wants.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// One line of the events file, as the plugin writes it (`cni_guard::events`).
#[derive(Debug, PartialEq, Eq)]
struct Line<'a> {
    verb: &'a str,
    decision: &'a str,
    reason: &'a str,
    /// The milliseconds the invocation waited for the delegate, when it did.
    waited_ms: Option<u64>,
}

/// One line of the events file (without its newline); `None` for anything that is not three
/// tokens and, optionally, the milliseconds waited.
fn parse(line: &str) -> Option<Line<'_>> {
    let mut it = line.split(' ');
    let (verb, decision, reason) = (it.next()?, it.next()?, it.next()?);
    let waited_ms = match it.next() {
        None => None,
        Some(ms) if ms.bytes().all(|b| b.is_ascii_digit()) => Some(ms.parse().ok()?),
        Some(_) => return None,
    };
    let tokens = [verb, decision, reason].into_iter().all(is_token);
    (it.next().is_none() && tokens).then_some(Line {
        verb,
        decision,
        reason,
        waited_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_with_and_without_the_wait_parse() {
        let line = |verb, decision, reason, waited_ms| Line {
            verb,
            decision,
            reason,
            waited_ms,
        };
        assert_eq!(parse("add exec -"), Some(line("add", "exec", "-", None)));
        assert_eq!(
            parse("del done - 1234"),
            Some(line("del", "done", "-", Some(1234)))
        );
        for bad in [
            "",
            "add",
            "add exec",
            "add exec - x",
            "add exec - 1 2",
            "add  exec -",
            "add exec \u{e9}",
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }
    use cni_guard::events::Event;

    fn ev(verb: &'static str, decision: &'static str, reason: &'static str) -> Event {
        Event {
            verb: cni_guard::verb::Command::parse(&verb.to_ascii_uppercase()),
            decision,
            reason,
            waited: None,
        }
    }

    fn value(text: &str, series: &str) -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("no {series} in\n{text}"))
            .parse()
            .unwrap()
    }

    #[test]
    fn counts_what_the_plugin_appends() {
        let d = tempfile::tempdir().unwrap();
        let cache = d.path().join("cache");
        // A file an earlier keep left is replaced: counters start at 0.
        std::fs::create_dir(&cache).unwrap();
        std::fs::write(cache.join(events::FILE), "add exec -\n").unwrap();
        let mut c = Collector::start(&cache).unwrap();
        for e in [
            ev("add", "exec", "-"),
            ev("add", "refused", "delegate-missing"),
            ev("add", "refused", "delegate-missing"),
            ev("status", "refused", "attachment-missing"),
            ev("del", "done", "-"),
        ] {
            assert!(cni_guard::events::append(&cache, &e));
        }
        c.drain().unwrap();
        let t = c.render(Instant::now());
        assert_eq!(
            value(
                &t,
                r#"cni_guard_decisions_total{verb="add",decision="exec"}"#
            ),
            1.0
        );
        assert_eq!(
            value(
                &t,
                r#"cni_guard_decisions_total{verb="add",decision="refused"}"#
            ),
            2.0
        );
        assert_eq!(
            value(
                &t,
                r#"cni_guard_decisions_total{verb="gc",decision="error"}"#
            ),
            0.0
        );
        assert_eq!(
            value(&t, r#"cni_guard_refusals_total{reason="delegate-missing"}"#),
            2.0
        );
        assert_eq!(
            value(
                &t,
                r#"cni_guard_refusals_total{reason="attachment-missing"}"#
            ),
            1.0
        );
        let build_info = format!(
            "cni_guard_build_info{{version=\"{}\",commit=\"{}\"}} 1\n",
            env!("CARGO_PKG_VERSION"),
            crate::build::COMMIT
        );
        assert!(t.contains(&build_info), "{t}");
    }

    #[test]
    fn half_lines_wait_and_garbage_is_counted_not_trusted() {
        let d = tempfile::tempdir().unwrap();
        let mut c = Collector::start(d.path()).unwrap();
        let path = d.path().join(events::FILE);
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        io::Write::write_all(&mut f, b"add ex").unwrap();
        c.drain().unwrap();
        io::Write::write_all(&mut f, b"ec -\nnot an event\n\xff\xfe\n").unwrap();
        c.drain().unwrap();
        let t = c.render(Instant::now());
        assert_eq!(
            value(
                &t,
                r#"cni_guard_decisions_total{verb="add",decision="exec"}"#
            ),
            1.0
        );
        assert_eq!(value(&t, "cni_guard_events_malformed_total"), 2.0);
    }

    fn add_execs(c: &Collector) -> f64 {
        value(
            &c.render(Instant::now()),
            r#"cni_guard_decisions_total{verb="add",decision="exec"}"#,
        )
    }

    #[test]
    fn rotates_a_large_file_without_losing_lines_and_puts_back_a_removed_one() {
        let d = tempfile::tempdir().unwrap();
        let mut c = Collector::start(d.path()).unwrap();
        let line = ev("add", "exec", "-");
        let n = events::ROTATE_BYTES / line.line().len() as u64 + 10;
        let body = line.line().repeat(n as usize);
        std::fs::OpenOptions::new()
            .append(true)
            .open(d.path().join(events::FILE))
            .and_then(|mut f| io::Write::write_all(&mut f, body.as_bytes()))
            .unwrap();
        c.drain().unwrap();
        assert!(d.path().join(events::ROTATED).exists());
        // A writer that opened the old file just before the rotation still counts.
        std::fs::OpenOptions::new()
            .append(true)
            .open(d.path().join(events::ROTATED))
            .and_then(|mut f| io::Write::write_all(&mut f, line.line().as_bytes()))
            .unwrap();
        assert!(cni_guard::events::append(d.path(), &line));
        c.drain().unwrap();
        assert_eq!(add_execs(&c), (n + 2) as f64);
        // Removed: put back, and appends go on counting.
        std::fs::remove_file(d.path().join(events::FILE)).unwrap();
        c.drain().unwrap();
        assert!(cni_guard::events::append(d.path(), &line));
        c.drain().unwrap();
        assert_eq!(add_execs(&c), (n + 3) as f64);
    }

    /// The fallback configurations from the last check, shown once the conflist loaded.
    #[test]
    fn fallback_configs_are_the_last_checks() {
        let d = tempfile::tempdir().unwrap();
        let mut c = Collector::start(d.path()).unwrap();
        let now = Instant::now();
        assert!(!c.render(now).contains("cni_guard_fallback_configs"));
        c.observe_fallback(Some(1));
        assert_eq!(value(&c.render(now), "cni_guard_fallback_configs"), 1.0);
        c.observe_fallback(Some(0));
        assert_eq!(value(&c.render(now), "cni_guard_fallback_configs"), 0.0);
        c.observe_fallback(None);
        assert!(!c.render(now).contains("cni_guard_fallback_configs"));
    }

    #[test]
    fn not_ready_time_accumulates_only_while_not_ready() {
        let d = tempfile::tempdir().unwrap();
        let mut c = Collector::start(d.path()).unwrap();
        let t0 = Instant::now();
        c.observe_ready(true, t0);
        c.observe_ready(false, t0 + Duration::from_secs(10));
        c.observe_ready(true, t0 + Duration::from_secs(25));
        c.observe_ready(false, t0 + Duration::from_secs(40));
        let t = c.render(t0 + Duration::from_secs(42));
        assert_eq!(value(&t, "cni_guard_not_ready_seconds_total"), 17.0);
        assert_eq!(value(&t, "cni_guard_ready"), 0.0);
    }
}
