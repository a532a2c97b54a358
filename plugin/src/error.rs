//! The one error type. A failure says what went wrong in the guard's terms (its [`Kind`]), a
//! message and, when there is more to say, details. The CNI error code and the spec's error JSON
//! are derived only at the edge, where the verb is known ([`Error::code`], [`Error::to_json`]).

use std::fmt;

use crate::verb::Command;

/// Well-known CNI error codes (spec section 6, "Error").
pub mod code {
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    pub const INVALID_ENV: u32 = 4;
    pub const IO_FAILURE: u32 = 5;
    pub const DECODE_FAILURE: u32 = 6;
    pub const INVALID_CONFIG: u32 = 7;
    pub const TRY_AGAIN_LATER: u32 = 11;
    pub const NOT_AVAILABLE: u32 = 50;
    /// libcni's `ErrInternal`: a delegate that crashed or answered something that is not CNI.
    pub const INTERNAL: u32 = 999;
}

/// What went wrong, in the guard's terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// Something the delegate network needs is missing, half-written or not yet usable; waiting
    /// may fix it. CNI 11 (try again later), or 50 (not available) on STATUS.
    NotReady,
    /// A configuration error that waiting will not fix. CNI 7.
    Misconfigured,
    /// The runtime's environment (`CNI_*`) is invalid. CNI 4.
    BadEnv,
    /// What the runtime gave on stdin (or as prevResult) cannot be decoded. CNI 6.
    BadInput,
    /// A cniVersion the guard does not speak, or a verb that version does not have. CNI 1.
    Unsupported,
    /// Reading or writing a file failed. CNI 5.
    Io,
    /// Another process holds the attachment (an ADD or DEL of it still running). CNI 11.
    Busy,
    /// A delegate plugin outlived its deadline and was killed: CNI 50 on STATUS (the delegate
    /// is not available), 999 otherwise.
    TimedOut,
    /// A plugin crashed, printed something that is not CNI, or could not be run; or the guard
    /// itself failed. CNI 999.
    Failed,
    /// The delegate's own error, `stdout` being its error JSON with `code`: passed to the
    /// runtime byte for byte, unless the guard added details.
    Delegate { code: u32, stdout: Vec<u8> },
    /// The agent's command line was wrong (exit 2). Never reaches a runtime.
    Usage,
}

impl Kind {
    /// The CNI error code for this kind on `verb`.
    pub fn code(&self, verb: Command) -> u32 {
        let status = verb == Command::Status;
        match self {
            Kind::NotReady | Kind::TimedOut if status => code::NOT_AVAILABLE,
            Kind::NotReady | Kind::Busy => code::TRY_AGAIN_LATER,
            Kind::Misconfigured => code::INVALID_CONFIG,
            Kind::BadEnv => code::INVALID_ENV,
            Kind::BadInput => code::DECODE_FAILURE,
            Kind::Unsupported => code::INCOMPATIBLE_VERSION,
            Kind::Io => code::IO_FAILURE,
            Kind::TimedOut | Kind::Failed | Kind::Usage => code::INTERNAL,
            Kind::Delegate { code, .. } => *code,
        }
    }
}

/// Why an invocation or an agent command failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    kind: Kind,
    msg: String,
    /// Never empty: no details is `None`.
    details: Option<String>,
}

impl Error {
    pub fn new(kind: Kind, msg: impl Into<String>) -> Self {
        Error {
            kind,
            msg: msg.into(),
            details: None,
        }
    }

    /// The same error with `details` (none when `details` is empty).
    pub fn with_details(mut self, details: impl Into<String>) -> Self {
        let details = details.into();
        self.details = (!details.is_empty()).then_some(details);
        self
    }

    /// The same error with another message.
    pub fn with_msg(mut self, msg: impl Into<String>) -> Self {
        self.msg = msg.into();
        self
    }

    /// A delegate's error structure (`stdout`, holding `code` and `msg`), passed through.
    pub fn delegate(code: u32, msg: impl Into<String>, stdout: Vec<u8>) -> Self {
        Error::new(Kind::Delegate { code, stdout }, msg)
    }

    pub fn kind(&self) -> &Kind {
        &self.kind
    }

    /// The message: for a delegate's error, its `msg`.
    pub fn msg(&self) -> &str {
        &self.msg
    }

    pub fn details(&self) -> Option<&str> {
        self.details.as_deref()
    }

    /// The CNI error code on `verb`.
    pub fn code(&self, verb: Command) -> u32 {
        self.kind.code(verb)
    }

    /// The bytes for stdout: the spec's error structure in `cni_version`, with the code for
    /// `verb`; a delegate's own error as it printed it.
    pub fn to_json(&self, verb: Command, cni_version: &str) -> Vec<u8> {
        if let (Kind::Delegate { stdout, .. }, None) = (&self.kind, &self.details) {
            return stdout.clone();
        }
        let mut reply = serde_json::json!({
            "cniVersion": cni_version,
            "code": self.code(verb),
            "msg": self.msg,
        });
        if let Some(details) = &self.details {
            reply["details"] = details.as_str().into();
        }
        format!("{reply}\n").into_bytes()
    }
}

/// For logs and warnings: `code N: msg (details)`, the code as on any verb but STATUS.
impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let code = self.code(Command::Add);
        let msg = &self.msg;
        match (&self.kind, &self.details) {
            (Kind::Delegate { .. }, _) => write!(f, "code {code}: delegate: {msg}"),
            (_, None) => write!(f, "code {code}: {msg}"),
            (_, Some(details)) => write!(f, "code {code}: {msg} ({details})"),
        }
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_spec_error_json() {
        let e = Error::new(Kind::NotReady, "delegate missing").with_details("/x: not found");
        let v: serde_json::Value =
            serde_json::from_slice(&e.to_json(Command::Add, "1.0.0")).unwrap();
        assert_eq!(v["cniVersion"], "1.0.0");
        assert_eq!(v["code"], 11);
        assert_eq!(v["msg"], "delegate missing");
        assert_eq!(v["details"], "/x: not found");
        let v: serde_json::Value =
            serde_json::from_slice(&e.to_json(Command::Status, "1.1.0")).unwrap();
        assert_eq!(v["code"], 50);
    }

    #[test]
    fn omits_empty_details() {
        let e = Error::new(Kind::BadEnv, "m").with_details("");
        assert_eq!(e.details(), None);
        let v: serde_json::Value =
            serde_json::from_slice(&e.to_json(Command::Add, "0.3.1")).unwrap();
        assert_eq!(v["code"], 4);
        assert!(v.get("details").is_none());
    }

    #[test]
    fn delegate_error_passes_through_unchanged() {
        let raw = br#"{"cniVersion":"0.4.0","code":117,"msg":"boom","details":"x"}"#.to_vec();
        let e = Error::delegate(117, "boom", raw.clone());
        assert_eq!(e.to_json(Command::Add, "1.0.0"), raw);
        assert_eq!(e.msg(), "boom");
        assert_eq!(e.code(Command::Status), 117);
        // With details of the guard's own, it is rendered: the delegate's code and message.
        let v: serde_json::Value =
            serde_json::from_slice(&e.with_details("also: more").to_json(Command::Gc, "1.1.0"))
                .unwrap();
        assert_eq!(v["code"], 117);
        assert_eq!(v["msg"], "boom");
        assert_eq!(v["details"], "also: more");
    }

    #[test]
    fn codes_depend_on_the_verb_only_for_not_ready_and_timed_out() {
        use Command::*;
        for (kind, other, status) in [
            (Kind::NotReady, 11, 50),
            (Kind::Misconfigured, 7, 7),
            (Kind::BadEnv, 4, 4),
            (Kind::BadInput, 6, 6),
            (Kind::Unsupported, 1, 1),
            (Kind::Io, 5, 5),
            (Kind::Busy, 11, 11),
            (Kind::TimedOut, 999, 50),
            (Kind::Failed, 999, 999),
        ] {
            for verb in [Add, Del, Check, Gc, Version] {
                assert_eq!(kind.code(verb), other, "{kind:?} on {verb:?}");
            }
            assert_eq!(kind.code(Status), status, "{kind:?} on STATUS");
        }
    }
}
