//! The rules for the names that become file names or reach the kernel: container IDs, interface
//! names and network names. Said once here; `request` applies them to `CNI_CONTAINERID` and
//! `CNI_IFNAME`, `config` to the network's `name`.
//!
//! Each rule returns `Err` with a reason that reads after its subject ("CNI_IFNAME " + reason,
//! "network name " + reason) and quotes the offending value, cut to 64 characters.

/// Container IDs become file names in the record store.
pub const MAX_CONTAINER_ID: usize = 200;
/// Linux's IFNAMSIZ less the terminating NUL.
pub const MAX_IFNAME: usize = 15;
/// Network names become folder names in the record store (and in libcni's cache).
pub const MAX_NETWORK_NAME: usize = 200;

/// Why a name breaks its rule, said after its subject.
pub type BadName = String;

/// The spec's rule for `CNI_CONTAINERID`: starts with a letter or digit, then letters, digits,
/// `_`, `.` or `-`; at most [`MAX_CONTAINER_ID`] characters.
pub fn container_id(id: &str) -> Result<(), BadName> {
    if !plain(id) {
        let shown = truncate(id, 64);
        return Err(format!("{shown:?} must start with a letter or digit and contain only letters, digits, '_', '.', '-'"));
    }
    if id.len() > MAX_CONTAINER_ID {
        return Err(format!("is longer than {MAX_CONTAINER_ID} characters"));
    }
    Ok(())
}

/// The spec's interface-name rule (Linux's): 1 to [`MAX_IFNAME`] bytes, not `.` or `..`, no `/`,
/// `:` or whitespace.
pub fn ifname(name: &str) -> Result<(), BadName> {
    let why = match name {
        "" => return Err("is empty".to_owned()),
        _ if name.len() > MAX_IFNAME => format!("is longer than {MAX_IFNAME} bytes"),
        "." | ".." => "is not a valid interface name".to_owned(),
        _ if name.contains(|c: char| c == '/' || c == ':' || c.is_whitespace()) => {
            "contains '/', ':' or whitespace".to_owned()
        }
        _ => return Ok(()),
    };
    Err(format!("{:?} {why}", truncate(name, 64)))
}

/// libcni's rule for network names (the container ID's characters), at most
/// [`MAX_NETWORK_NAME`] characters.
pub fn network_name(name: &str) -> Result<(), BadName> {
    if plain(name) && name.len() <= MAX_NETWORK_NAME {
        Ok(())
    } else {
        Err(format!(
            "{name:?} must start with a letter or digit, contain only letters, digits, '_', '.', '-', and be at most {MAX_NETWORK_NAME} characters"
        ))
    }
}

/// Starts with an ASCII letter or digit; then only those, `_`, `.` and `-`. Such a name is never
/// empty, `.` or `..`, and holds no `/`, `:`, whitespace or control character.
fn plain(s: &str) -> bool {
    let mut bytes = s.bytes();
    bytes.next().is_some_and(|b| b.is_ascii_alphanumeric())
        && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// `s` cut to at most `max` characters, for quoting a value in a message.
pub(crate) fn truncate(s: &str, max: usize) -> &str {
    match s.char_indices().nth(max) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_ids() {
        for ok in ["a", "0", "abc-1.2_3", &"a".repeat(MAX_CONTAINER_ID)] {
            assert_eq!(container_id(ok), Ok(()), "{ok:?}");
        }
        for bad in [
            "", "../x", "a/b", "-a", ".a", "_a", "a\nb", "a b", "a:b", "é", "a\0",
        ] {
            let why = container_id(bad).unwrap_err().to_string();
            assert!(
                why.contains("must start with a letter or digit"),
                "{bad:?}: {why}"
            );
        }
        assert_eq!(
            container_id(&"a".repeat(MAX_CONTAINER_ID + 1))
                .unwrap_err()
                .to_string(),
            "is longer than 200 characters"
        );
        // A long bad value is quoted cut, never whole.
        let why = container_id(&format!("/{}", "x".repeat(5000))).unwrap_err();
        assert!(why.to_string().len() < 200, "{why}");
    }

    #[test]
    fn ifnames() {
        for ok in [
            "eth0",
            "net1",
            "a",
            "veth-1.2_3",
            "é",
            &"a".repeat(MAX_IFNAME),
        ] {
            assert_eq!(ifname(ok), Ok(()), "{ok:?}");
        }
        let cases = [
            ("", "is empty"),
            (".", "not a valid interface name"),
            ("..", "not a valid interface name"),
            ("a/b", "contains '/', ':' or whitespace"),
            ("a:b", "contains '/', ':' or whitespace"),
            ("a b", "contains '/', ':' or whitespace"),
            ("eth\t0", "contains '/', ':' or whitespace"),
            ("0123456789abcdef", "is longer than 15 bytes"),
            ("ééééééééé", "is longer than 15 bytes"),
        ];
        for (bad, want) in cases {
            let why = ifname(bad).unwrap_err().to_string();
            assert!(why.contains(want), "{bad:?}: {why}");
        }
    }

    #[test]
    fn network_names() {
        for ok in [
            "guarded-pod-network",
            "a",
            "0.x_y-z",
            &"n".repeat(MAX_NETWORK_NAME),
        ] {
            assert_eq!(network_name(ok), Ok(()), "{ok:?}");
        }
        for bad in [
            "",
            "../etc",
            "a/b",
            "a b",
            ".hidden",
            "-x",
            "a:b",
            &"n".repeat(MAX_NETWORK_NAME + 1),
        ] {
            let why = network_name(bad).unwrap_err().to_string();
            assert!(why.starts_with(&format!("{bad:?} must start")), "{why}");
        }
    }
}
