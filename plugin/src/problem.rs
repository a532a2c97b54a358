//! Why a precondition of ADD does not hold. One type carries every reason from the readiness
//! checks to the refusal's words, the metrics reason label and `check`'s lines: nothing parses
//! the guard's own messages back.

use std::fmt;
use std::path::PathBuf;

use crate::error::{Error, Kind};

/// What a precondition is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subject {
    Delegate,
    Attachment,
    /// The executable for a plugin type named by the delegate or an attachment.
    Plugin(String),
    /// Strict mode: the file must not be writable by group or others.
    Permissions,
    /// A unix socket that must accept connections (a daemon the delegate needs).
    Socket,
}

/// Why it does not hold, said after its path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// The file is not there.
    Missing,
    /// There, but not usable yet (not JSON, perhaps still being written; unreadable; not a
    /// regular file): waiting may fix it.
    NotYet(String),
    /// Whole, but nothing waiting can fix makes it usable (a cniVersion the guard cannot run, a
    /// type that is no file name): whoever writes it must.
    Unusable(String),
    /// It names the guard itself: the guard would call itself.
    Recursion(String),
    /// Writable by group or others while `strictPermissions` is set.
    Writable,
    /// The plugin's binary cannot be run from CNI_PATH.
    NoBinary(String),
    /// The socket does not accept connections.
    Dead(String),
}

impl Problem {
    /// [`Kind::Misconfigured`] (code 7, never waited for) or [`Kind::NotReady`] (11).
    pub fn kind(&self) -> Kind {
        match self {
            Problem::Unusable(_) | Problem::Recursion(_) | Problem::Writable => Kind::Misconfigured,
            _ => Kind::NotReady,
        }
    }

    /// As an error of its own (a recorded configuration that does not load, say).
    pub fn error(&self, what: &str) -> Error {
        Error::new(self.kind(), format!("{what} {self}"))
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::Missing => f.write_str("does not exist"),
            Problem::Writable => {
                f.write_str("is writable by group or others (strictPermissions is set)")
            }
            Problem::NotYet(why)
            | Problem::Unusable(why)
            | Problem::Recursion(why)
            | Problem::NoBinary(why)
            | Problem::Dead(why) => f.write_str(why),
        }
    }
}

/// One precondition and whether it holds.
#[derive(Debug, Clone)]
pub struct Item {
    pub subject: Subject,
    /// The configuration file, the socket, or the plugin binary (where it was found, or its type).
    pub path: PathBuf,
    pub problem: Option<Problem>,
    /// Who writes the delegate's file (`delegateWriter`), said with its problems.
    pub writer: Option<String>,
}

impl Item {
    pub fn new(subject: Subject, path: PathBuf, problem: Option<Problem>) -> Item {
        Item {
            subject,
            path,
            problem,
            writer: None,
        }
    }

    pub fn ok(&self) -> bool {
        self.problem.is_none()
    }

    /// A configuration error: waiting will not fix it.
    pub fn fatal(&self) -> bool {
        self.problem.as_ref().map(Problem::kind) == Some(Kind::Misconfigured)
    }

    /// Why it does not hold, with who writes the file when that is known; empty when it holds.
    pub fn reason(&self) -> String {
        let Some(p) = &self.problem else {
            return String::new();
        };
        match (&self.writer, p) {
            (Some(w), Problem::Missing) => format!("{p} (written by {w})"),
            (Some(w), Problem::Unusable(_)) => {
                format!("{p} (written by {w}; waiting will not fix it)")
            }
            _ => p.to_string(),
        }
    }

    /// The refusal reason it is counted under (`cni_guard_refusals_total{reason}`); `None`
    /// when it holds.
    pub fn label(&self) -> Option<&'static str> {
        let p = self.problem.as_ref()?;
        Some(match (&self.subject, p) {
            (_, Problem::Recursion(_)) => "recursion",
            (_, Problem::Writable) => "permissions",
            (_, Problem::Dead(_)) => "socket-dead",
            (_, Problem::NoBinary(_)) => "plugin-missing",
            (Subject::Delegate, Problem::Missing) => "delegate-missing",
            (Subject::Delegate, _) => "delegate-invalid",
            (_, Problem::Missing) => "attachment-missing",
            _ => "attachment-invalid",
        })
    }

    /// `delegate /etc/cni/net.d/00-multus.conf does not exist (written by Multus)`.
    pub fn describe(&self) -> String {
        let what = match &self.subject {
            Subject::Delegate => "delegate".to_owned(),
            Subject::Attachment => "attachment".to_owned(),
            Subject::Plugin(t) => format!("plugin {t:?}"),
            Subject::Permissions => "permissions of".to_owned(),
            Subject::Socket => "socket".to_owned(),
        };
        match (&self.subject, &self.problem) {
            (_, None) => format!("{what} {}", self.path.display()),
            // A plugin that was not found has no path to name: `path` is its type, said above.
            (Subject::Plugin(_), Some(_)) => format!("{what} {}", self.reason()),
            (_, Some(_)) => format!("{what} {} {}", self.path.display(), self.reason()),
        }
    }
}
