//! The one error type: every failure knows its CNI error code and renders as the spec's error JSON.

use std::fmt;

/// Well-known CNI error codes (spec section 6, "Error").
pub mod code {
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    pub const UNSUPPORTED_FIELD: u32 = 2;
    pub const INVALID_ENV: u32 = 4;
    pub const IO_FAILURE: u32 = 5;
    pub const DECODE_FAILURE: u32 = 6;
    pub const INVALID_CONFIG: u32 = 7;
    pub const TRY_AGAIN_LATER: u32 = 11;
    pub const NOT_AVAILABLE: u32 = 50;
    /// libcni's `ErrInternal`: a delegate that crashed or answered something that is not CNI.
    pub const INTERNAL: u32 = 999;
}

/// Why an invocation failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// An error of the guard's own, rendered in the request's cniVersion.
    Cni {
        code: u32,
        msg: String,
        details: String,
    },
    /// A delegate's own error JSON, passed to the runtime byte for byte.
    Delegate { stdout: Vec<u8>, code: u32 },
}

impl Error {
    pub fn new(code: u32, msg: impl Into<String>, details: impl Into<String>) -> Self {
        Error::Cni {
            code,
            msg: msg.into(),
            details: details.into(),
        }
    }

    pub fn code(&self) -> u32 {
        match self {
            Error::Cni { code, .. } | Error::Delegate { code, .. } => *code,
        }
    }

    /// The message part, for logs.
    pub fn msg(&self) -> String {
        match self {
            Error::Cni { msg, .. } => msg.clone(),
            Error::Delegate { stdout, .. } => serde_json::from_slice::<serde_json::Value>(stdout)
                .ok()
                .and_then(|v| v.get("msg").and_then(|m| m.as_str()).map(str::to_owned))
                .unwrap_or_else(|| "delegate error".to_owned()),
        }
    }

    /// The bytes for stdout: the spec's error structure in `cni_version`.
    pub fn to_json(&self, cni_version: &str) -> Vec<u8> {
        match self {
            Error::Delegate { stdout, .. } => stdout.clone(),
            Error::Cni { code, msg, details } => {
                let mut obj = serde_json::Map::new();
                obj.insert("cniVersion".into(), cni_version.into());
                obj.insert("code".into(), (*code).into());
                obj.insert("msg".into(), msg.as_str().into());
                if !details.is_empty() {
                    obj.insert("details".into(), details.as_str().into());
                }
                let mut out = serde_json::to_vec(&serde_json::Value::Object(obj))
                    .expect("a map of strings and numbers always serializes");
                out.push(b'\n');
                out
            }
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Cni { code, msg, details } if details.is_empty() => {
                write!(f, "code {code}: {msg}")
            }
            Error::Cni { code, msg, details } => write!(f, "code {code}: {msg} ({details})"),
            Error::Delegate { code, .. } => write!(f, "code {code}: delegate: {}", self.msg()),
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_spec_error_json() {
        let e = Error::new(code::TRY_AGAIN_LATER, "delegate missing", "/x: not found");
        let v: serde_json::Value = serde_json::from_slice(&e.to_json("1.0.0")).unwrap();
        assert_eq!(v["cniVersion"], "1.0.0");
        assert_eq!(v["code"], 11);
        assert_eq!(v["msg"], "delegate missing");
        assert_eq!(v["details"], "/x: not found");
    }

    #[test]
    fn omits_empty_details() {
        let v: serde_json::Value =
            serde_json::from_slice(&Error::new(4, "m", "").to_json("0.3.1")).unwrap();
        assert!(v.get("details").is_none());
    }

    #[test]
    fn delegate_error_passes_through_unchanged() {
        let raw = br#"{"cniVersion":"0.4.0","code":117,"msg":"boom","details":"x"}"#.to_vec();
        let e = Error::Delegate {
            stdout: raw.clone(),
            code: 117,
        };
        assert_eq!(e.to_json("1.0.0"), raw);
        assert_eq!(e.msg(), "boom");
    }
}
