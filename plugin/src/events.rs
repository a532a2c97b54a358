//! The node's decision log, the plugin's side: one short line per invocation, appended to
//! `<cacheDir>/.metrics-events`, which the agent's `keep` reads and counts.
//!
//! It must never slow or fail a pod start: one `write(2)` to a file opened `O_APPEND`
//! (concurrent appends of a few bytes land whole, one after the other), no lock, nothing
//! created (the file exists only while a `keep` with metrics on owns it, so a node without
//! metrics writes nothing and nothing grows), and silence on any error: a missing, unwritable,
//! full, replaced or corrupt file costs one failed system call.
//!
//! A line is `<verb> <decision> <reason>\n`, each a token of `[a-z0-9-]`, and ` <ms>` before the
//! newline when the invocation waited for the delegate (the milliseconds it waited). `keep`
//! rotates the file; the plugin stops appending past [`MAX_BYTES`] in case no `keep` ever does.

use std::ffi::OsStr;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::Duration;

use crate::sys::{self, at, Expect};
use crate::verb::Command;

/// The events file's name in the cache dir (a network's record folder never starts with `.`).
pub const FILE: &str = ".metrics-events";
/// The plugin appends nothing past this size (no `keep` is rotating the file).
pub const MAX_BYTES: u64 = 16 << 20;

/// One invocation as counted: the verb (`None`: not one the guard knows), the decision, for a
/// refusal why (`-` when none), and how long it waited for the delegate, if it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    pub verb: Option<Command>,
    pub decision: &'static str,
    pub reason: &'static str,
    pub waited: Option<Duration>,
}

impl Event {
    /// The line the plugin appends: `add refused delegate-missing`; tokens that are not
    /// `[a-z0-9-]` become `other`.
    pub fn line(&self) -> String {
        let verb = self
            .verb
            .map_or("other".to_owned(), |v| v.as_str().to_ascii_lowercase());
        let token = |t: &'static str| if is_token(t) { t } else { "other" };
        let (decision, reason) = (token(self.decision), token(self.reason));
        match self.waited {
            Some(w) => format!("{verb} {decision} {reason} {}\n", w.as_millis()),
            None => format!("{verb} {decision} {reason}\n"),
        }
    }
}

/// A token of the events file: 1 to 30 characters of `[a-z0-9-]`.
pub fn is_token(t: &str) -> bool {
    (1..=30).contains(&t.len())
        && t.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// Appends `event` to the cache dir's events file if there is one. Never blocks on a lock and
/// never fails the caller: returns whether the line went in.
pub fn append(cache_dir: &Path, event: &Event) -> bool {
    let line = event.line();
    // One `write(2)`: a partial append is not retried (it would interleave with others').
    let written = open(cache_dir).map(|file| nix::unistd::write(&file, line.as_bytes()));
    written == Some(Ok(line.len()))
}

/// The events file, if there is one that is ours (keep creates it as the guard's user), a
/// regular file, and under the bound, in a cache dir the records would trust.
fn open(cache_dir: &Path) -> Option<OwnedFd> {
    // The cache dir by its path, as the records are kept (its ancestors may be symlinks: a
    // node's /var/lib on a data disk), itself and the file never through one, each checked as
    // the records check theirs.
    let dir = at::open_dir(None, cache_dir.as_os_str()).ok()?;
    sys::trust(&dir, Expect::Dir).ok()?;
    let file = at::open_append(&dir, OsStr::new(FILE)).ok()?;
    sys::trust(&file, Expect::File).ok()?;
    let size = nix::sys::stat::fstat(&file).ok()?.st_size as u64;
    (size < MAX_BYTES).then_some(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn odd_tokens_become_other() {
        let e = Event {
            verb: Some(Command::Add),
            decision: "refused",
            reason: "delegate-missing",
            waited: None,
        };
        assert_eq!(e.line(), "add refused delegate-missing\n");
        let held = Event {
            waited: Some(Duration::from_micros(1_234_567)),
            ..e
        };
        assert_eq!(held.line(), "add refused delegate-missing 1234\n");
        let odd = Event {
            verb: None,
            decision: "exec",
            reason: "a b",
            waited: None,
        };
        assert_eq!(odd.line(), "other exec other\n");
    }

    #[test]
    fn appends_only_to_an_existing_file_of_ours() {
        let d = tempfile::tempdir().unwrap();
        let e = Event {
            verb: Some(Command::Add),
            decision: "exec",
            reason: "-",
            waited: None,
        };
        // No file: nothing is created.
        assert!(!append(d.path(), &e));
        assert!(!d.path().join(FILE).exists());
        std::fs::write(d.path().join(FILE), "").unwrap();
        assert!(append(d.path(), &e));
        assert!(append(d.path(), &e));
        assert_eq!(
            std::fs::read_to_string(d.path().join(FILE)).unwrap(),
            "add exec -\nadd exec -\n"
        );
        // A symlink in its place is not followed.
        std::fs::remove_file(d.path().join(FILE)).unwrap();
        let elsewhere = d.path().join("elsewhere");
        std::fs::write(&elsewhere, "").unwrap();
        std::os::unix::fs::symlink(&elsewhere, d.path().join(FILE)).unwrap();
        assert!(!append(d.path(), &e));
        assert_eq!(std::fs::read_to_string(&elsewhere).unwrap(), "");
        // A symlinked cache dir is not followed either; a symlinked ancestor is.
        let linked = d.path().join("linked-cache");
        std::os::unix::fs::symlink(d.path(), &linked).unwrap();
        assert!(!append(&linked, &e));
        std::fs::create_dir(d.path().join("real")).unwrap();
        std::fs::write(d.path().join("real").join(FILE), "").unwrap();
        assert!(append(&linked.join("real"), &e));
        // A directory in its place, or a missing cache dir: nothing.
        std::fs::remove_file(d.path().join(FILE)).unwrap();
        std::fs::create_dir(d.path().join(FILE)).unwrap();
        assert!(!append(d.path(), &e));
        assert!(!append(&d.path().join("missing"), &e));
    }

    /// The cache dir is checked as the records check it: in one that others can write, where
    /// the records refuse to be kept, nothing is appended either.
    #[test]
    fn appends_nothing_in_a_cache_dir_others_can_write() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let cache = d.path().join("cache");
        std::fs::create_dir(&cache).unwrap();
        std::fs::write(cache.join(FILE), "").unwrap();
        let e = Event {
            verb: Some(Command::Add),
            decision: "exec",
            reason: "-",
            waited: None,
        };
        std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert!(append(&cache, &e));
        std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(!append(&cache, &e));
        assert_eq!(
            std::fs::read_to_string(cache.join(FILE)).unwrap(),
            "add exec -\n"
        );
    }

    #[test]
    fn stops_at_the_size_bound() {
        let d = tempfile::tempdir().unwrap();
        let f = std::fs::File::create(d.path().join(FILE)).unwrap();
        f.set_len(MAX_BYTES).unwrap();
        let e = Event {
            verb: Some(Command::Add),
            decision: "exec",
            reason: "-",
            waited: None,
        };
        assert!(!append(d.path(), &e));
        assert_eq!(f.metadata().unwrap().len(), MAX_BYTES);
    }
}
