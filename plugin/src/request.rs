//! The CNI request: parameters from the environment and the configuration from stdin.
//!
//! Parsing has no side effects: the environment comes in as a getter and stdin as a reader, so
//! tests never touch the process environment (as libcni's `pkg/skel` dispatcher is built).

use std::ffi::{OsStr, OsString};
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use crate::error::{Error, Kind, Result};
use crate::names::{self, truncate};
pub use crate::verb::Command;

/// Upper bound on stdin. A guard config with a GC attachment list for thousands of pods is well
/// under a megabyte; anything this large is an error, not something to buffer.
pub const MAX_STDIN: u64 = 16 << 20;
/// Bound on every CNI_* value (container IDs and interface names have tighter ones, in `names`).
pub const MAX_VALUE: usize = 4096;

/// Required parameters per verb (spec 1.1 section 2, as `pkg/skel` enforces them).
fn required(command: Command) -> &'static [&'static str] {
    match command {
        Command::Add | Command::Check => {
            &["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"]
        }
        Command::Del => &["CNI_CONTAINERID", "CNI_IFNAME", "CNI_PATH"],
        Command::Status | Command::Gc => &["CNI_PATH"],
        Command::Version => &[],
    }
}

/// A validated request: what the guard reads of it. Optional parameters are empty strings when
/// absent. `CNI_NETNS` is checked but not kept: the delegate gets it from the environment it
/// inherits; `CNI_ARGS` is kept for what the guard reads of it (`K8S_POD_NAMESPACE`).
#[derive(Debug, Clone)]
pub struct Request {
    pub container_id: String,
    pub ifname: String,
    pub cni_path: Vec<PathBuf>,
    /// `CNI_ARGS` as given (`KEY=VALUE;...`), empty when absent.
    pub cni_args: String,
}

impl Request {
    /// One key of `CNI_ARGS` (`K8S_POD_NAMESPACE=...;K8S_POD_NAME=...`), when given.
    pub fn cni_arg(&self, key: &str) -> Option<&str> {
        self.cni_args
            .split(';')
            .filter_map(|kv| kv.split_once('='))
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v)
    }
}

/// Reads the command alone, so errors about the rest can still be reported.
pub fn command(getenv: &dyn Fn(&str) -> Option<OsString>) -> Result<Command> {
    let raw = getenv("CNI_COMMAND").unwrap_or_default();
    let s = raw.to_string_lossy();
    Command::parse(&s).ok_or_else(|| {
        let msg = format!("unknown CNI_COMMAND {:?}", truncate(&s, 64));
        Error::new(Kind::BadEnv, msg)
            .with_details("expected one of ADD, DEL, CHECK, STATUS, GC, VERSION")
    })
}

/// Reads and validates every parameter the verb needs, reporting all problems together.
pub fn parse_env(command: Command, getenv: &dyn Fn(&str) -> Option<OsString>) -> Result<Request> {
    let mut problems = Vec::new();
    let mut get = |name: &str, rule: fn(&str) -> std::result::Result<(), names::BadName>| {
        let given = getenv(name);
        let checked = match text(given.as_deref().unwrap_or_default()) {
            Ok("") if !required(command).contains(&name) => Ok(""),
            Ok("") if given.is_none() => Err("is missing".to_owned()),
            Ok("") => Err("is empty".to_owned()),
            Ok(value) => rule(value).map(|()| value),
            Err(why) => Err(why.to_owned()),
        };
        checked.map(str::to_owned).unwrap_or_else(|why| {
            problems.push(format!("{name} {why}"));
            String::new()
        })
    };
    let any = |_: &str| Ok(());
    let container_id = get("CNI_CONTAINERID", names::container_id);
    get("CNI_NETNS", any);
    let ifname = get("CNI_IFNAME", names::ifname);
    let cni_args = get("CNI_ARGS", any);
    let path = get("CNI_PATH", any);
    if !problems.is_empty() {
        let (verb, problems) = (command.as_str(), problems.join("; "));
        let msg = format!("invalid CNI parameters for {verb}: {problems}");
        return Err(Error::new(Kind::BadEnv, msg));
    }
    Ok(Request {
        container_id,
        ifname,
        cni_path: path
            .split(':')
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
            .collect(),
        cni_args,
    })
}

/// A parameter's value as text, or why it cannot be one.
fn text(value: &OsStr) -> std::result::Result<&str, &'static str> {
    if value.len() > MAX_VALUE {
        Err("is too long")
    } else if value.as_bytes().iter().any(u8::is_ascii_control) {
        Err("contains control characters")
    } else {
        value.to_str().ok_or("is not valid UTF-8")
    }
}

/// Reads stdin up to [`MAX_STDIN`] bytes.
pub fn read_stdin(input: impl Read) -> Result<Vec<u8>> {
    let mut buf = Vec::new();
    let read = input.take(MAX_STDIN + 1).read_to_end(&mut buf);
    read.map_err(|e| Error::new(Kind::Io, format!("cannot read stdin: {e}")))?;
    if buf.len() as u64 > MAX_STDIN {
        let mib = MAX_STDIN >> 20;
        let msg = format!("network configuration on stdin is larger than {mib} MiB");
        return Err(Error::new(Kind::BadInput, msg));
    }
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
        let map: HashMap<String, OsString> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn parses_add() {
        let e = env(&[
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "abc-1.2_3"),
            ("CNI_NETNS", "/run/netns/x"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/opt/cni/bin::/usr/lib/cni"),
        ]);
        assert_eq!(command(&e).unwrap(), Command::Add);
        let r = parse_env(Command::Add, &e).unwrap();
        assert_eq!(r.container_id, "abc-1.2_3");
        assert_eq!(
            r.cni_path,
            vec![PathBuf::from("/opt/cni/bin"), PathBuf::from("/usr/lib/cni")]
        );
    }

    #[test]
    fn reports_every_missing_variable() {
        let e = env(&[("CNI_COMMAND", "ADD")]);
        let err = parse_env(Command::Add, &e).unwrap_err();
        assert_eq!(err.code(Command::Add), 4);
        for name in ["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"] {
            assert!(err.msg().contains(name), "{name} in {}", err.msg());
        }
    }

    #[test]
    fn del_does_not_need_netns() {
        let e = env(&[
            ("CNI_CONTAINERID", "c"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/b"),
        ]);
        assert!(parse_env(Command::Del, &e).is_ok());
        assert!(parse_env(Command::Check, &e).is_err());
    }

    #[test]
    fn unknown_and_lowercase_commands_are_code_4() {
        for c in ["add", "", "FOO", "ADD "] {
            let e = env(&[("CNI_COMMAND", c)]);
            assert_eq!(command(&e).unwrap_err().code(Command::Add), 4, "{c:?}");
        }
        assert_eq!(command(&env(&[])).unwrap_err().code(Command::Add), 4);
    }

    #[test]
    fn rejects_bad_ids_and_ifnames() {
        let e = env(&[
            ("CNI_CONTAINERID", "../x"),
            ("CNI_IFNAME", "a:b"),
            ("CNI_PATH", "/b"),
        ]);
        let err = parse_env(Command::Del, &e).unwrap_err();
        assert_eq!(err.code(Command::Add), 4);
        assert!(
            err.msg().contains(
                "CNI_CONTAINERID \"../x\" must start with a letter or digit and contain only \
                 letters, digits, '_', '.', '-'; CNI_IFNAME \"a:b\" contains '/', ':' or whitespace"
            ),
            "{}",
            err.msg()
        );
        let e = env(&[
            ("CNI_CONTAINERID", "x"),
            ("CNI_IFNAME", "eth0\n"),
            ("CNI_PATH", "/b"),
        ]);
        let err = parse_env(Command::Del, &e).unwrap_err();
        assert!(
            err.msg().contains("CNI_IFNAME contains control characters"),
            "{}",
            err.msg()
        );
    }

    #[test]
    fn bounds_stdin() {
        let big = std::io::repeat(b' ').take(MAX_STDIN + 10);
        assert_eq!(read_stdin(big).unwrap_err().code(Command::Add), 6);
        assert_eq!(read_stdin(&b"{}"[..]).unwrap(), b"{}");
    }
}
