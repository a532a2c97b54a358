//! The node's decision log: one short line per plugin invocation, appended by the plugin to
//! `<cacheDir>/.metrics-events` and read by `keep`, which counts them.
//!
//! The plugin side must never slow or fail a pod start: it appends with one `write(2)` to a file
//! opened `O_APPEND` (concurrent appends of a few bytes land whole, one after the other), takes
//! no lock, creates nothing (the file exists only while a `keep` with metrics on owns it, so a
//! node without metrics writes nothing and nothing grows), and gives up silently on any error:
//! a missing, unwritable, full, replaced or corrupt file costs one failed system call.
//!
//! A line is `<verb> <decision> <reason>\n`, each a token of `[a-z0-9-]`, at most
//! [`MAX_LINE`] bytes. `keep` rotates the file when it passes [`ROTATE_BYTES`] (rename, a new
//! empty file, the old one read to its end once more and removed), and the plugin stops
//! appending past [`MAX_BYTES`] in case no `keep` ever rotates it.

use std::ffi::OsStr;
use std::io;
use std::os::fd::OwnedFd;
use std::path::Path;

use crate::sys;
use crate::sys::at;

/// The events file's name in the cache dir (a network's record folder never starts with `.`).
pub const FILE: &str = ".metrics-events";
/// The name a rotated file has until `keep` has read it to its end.
pub const ROTATED: &str = ".metrics-events.old";
/// The longest line the plugin writes.
pub const MAX_LINE: usize = 96;
/// `keep` rotates past this size.
pub const ROTATE_BYTES: u64 = 1 << 20;
/// The plugin appends nothing past this size (no `keep` is rotating the file).
pub const MAX_BYTES: u64 = 16 << 20;

/// One invocation as counted: the verb, the decision and, for a refusal, why.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Event<'a> {
    pub verb: &'a str,
    pub decision: &'a str,
    /// `-` when there is none.
    pub reason: &'a str,
}

impl Event<'_> {
    /// The line the plugin appends; tokens that are not `[a-z0-9-]` become `other`.
    pub fn line(&self) -> String {
        let mut out = String::with_capacity(48);
        for (i, t) in [self.verb, self.decision, self.reason].iter().enumerate() {
            if i > 0 {
                out.push(' ');
            }
            out.push_str(if is_token(t) { t } else { "other" });
        }
        out.push('\n');
        out
    }

    /// Parses one line (without its newline); `None` for anything that is not three tokens.
    pub fn parse(line: &str) -> Option<Event<'_>> {
        let mut it = line.split(' ');
        let (verb, decision, reason) = (it.next()?, it.next()?, it.next()?);
        (it.next().is_none() && [verb, decision, reason].iter().all(|t| is_token(t))).then_some(
            Event {
                verb,
                decision,
                reason,
            },
        )
    }
}

fn is_token(t: &str) -> bool {
    !t.is_empty()
        && t.len() <= 30
        && t.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// Appends `event` to the cache dir's events file if there is one. Never blocks on a lock and
/// never fails the caller: returns whether the line went in.
pub fn append(cache_dir: &Path, event: &Event<'_>) -> bool {
    append_line(cache_dir, event.line().as_bytes()).is_ok()
}

fn append_line(cache_dir: &Path, line: &[u8]) -> io::Result<()> {
    // Never through a symlink, in any component: one openat2 call where the kernel has it,
    // else the cache dir opened O_NOFOLLOW and the file relative to it.
    let file = match at::open_append_no_symlinks(&cache_dir.join(FILE)) {
        Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => {
            let dir = at::open_dir(None, cache_dir.as_os_str())?;
            at::open_append(&dir, OsStr::new(FILE))?
        }
        other => other?,
    };
    // Ours (keep creates it as the guard's user), a regular file, under the bound.
    let st = at::fstat(&file)?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG
        || st.st_uid != sys::geteuid()
        || st.st_mode & 0o022 != 0
        || st.st_size as u64 >= MAX_BYTES
    {
        return Err(io::ErrorKind::InvalidData.into());
    }
    write_once(&file, line)
}

/// One `write(2)`: a partial append is not retried (it would interleave with others').
fn write_once(file: &OwnedFd, line: &[u8]) -> io::Result<()> {
    match nix::unistd::write(file, line) {
        Ok(n) if n == line.len() => Ok(()),
        Ok(_) => Err(io::ErrorKind::WriteZero.into()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_round_trip_and_odd_tokens_become_other() {
        let e = Event {
            verb: "add",
            decision: "refused",
            reason: "delegate-missing",
        };
        assert_eq!(e.line(), "add refused delegate-missing\n");
        assert_eq!(Event::parse("add refused delegate-missing"), Some(e));
        let odd = Event {
            verb: "ADD",
            decision: "exec",
            reason: "a b",
        };
        assert_eq!(odd.line(), "other exec other\n");
        for bad in [
            "",
            "add",
            "add exec",
            "add exec - x",
            "add  exec -",
            "add exec \u{e9}",
        ] {
            assert_eq!(Event::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn appends_only_to_an_existing_file_of_ours() {
        let d = tempfile::tempdir().unwrap();
        let e = Event {
            verb: "add",
            decision: "exec",
            reason: "-",
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
        // A symlinked cache dir is not followed either.
        let linked = d.path().join("linked-cache");
        std::os::unix::fs::symlink(d.path(), &linked).unwrap();
        assert!(!append(&linked, &e));
        // A directory in its place, or a missing cache dir: nothing.
        std::fs::remove_file(d.path().join(FILE)).unwrap();
        std::fs::create_dir(d.path().join(FILE)).unwrap();
        assert!(!append(d.path(), &e));
        assert!(!append(&d.path().join("missing"), &e));
    }

    #[test]
    fn stops_at_the_size_bound() {
        let d = tempfile::tempdir().unwrap();
        let f = std::fs::File::create(d.path().join(FILE)).unwrap();
        f.set_len(MAX_BYTES).unwrap();
        let e = Event {
            verb: "add",
            decision: "exec",
            reason: "-",
        };
        assert!(!append(d.path(), &e));
        assert_eq!(f.metadata().unwrap().len(), MAX_BYTES);
    }
}
