//! `cni-noop`: a CNI plugin that does nothing and answers a fixed result, the cheapest delegate
//! there can be. The benchmark runs it directly and through the guard; the difference is the
//! guard's cost.
//!
//! ADD answers a fixed result in the request's cniVersion (0.3.x/0.4.0 `ips` carry a
//! `version`, 1.x do not); VERSION lists what it speaks; CHECK, DEL, STATUS and GC answer nothing.
//! With `CNI_NOOP_STAMP` set, it first writes the CLOCK_MONOTONIC time it started at (ns) into
//! that file, so the wake-up benchmark can see when the guard let it run.
//! It uses std only, so it stays small and starts fast; the bench links it statically.

use std::io::{Read, Write};

fn main() {
    if let Some(stamp) = std::env::var_os("CNI_NOOP_STAMP") {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: ts is a valid timespec to write into.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        let ns = ts.tv_sec as u128 * 1_000_000_000 + ts.tv_nsec as u128;
        let _ = std::fs::write(stamp, ns.to_string());
    }
    let mut stdin = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut stdin);
    let version = cni_version(&stdin).unwrap_or("1.0.0");
    let command = std::env::var("CNI_COMMAND").unwrap_or_default();
    let reply = match command.as_str() {
        "ADD" => result(version),
        "VERSION" => format!(
            "{{\"cniVersion\":\"{version}\",\"supportedVersions\":[\"0.3.0\",\"0.3.1\",\"0.4.0\",\"1.0.0\",\"1.1.0\"]}}"
        ),
        "CHECK" | "DEL" | "STATUS" | "GC" => String::new(),
        _ => {
            print!("{{\"cniVersion\":\"{version}\",\"code\":4,\"msg\":\"unknown CNI_COMMAND\"}}");
            std::process::exit(1);
        }
    };
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(reply.as_bytes()).and_then(|()| out.flush());
}

/// The fixed ADD result, shaped for `version`.
fn result(version: &str) -> String {
    let ip_version = if version.starts_with("0.") {
        ",\"version\":\"4\""
    } else {
        ""
    };
    format!(
        "{{\"cniVersion\":\"{version}\",\"interfaces\":[{{\"name\":\"eth0\",\"mac\":\"02:00:00:00:00:01\",\"sandbox\":\"/run/netns/noop\"}}],\"ips\":[{{\"address\":\"10.99.0.2/24\",\"gateway\":\"10.99.0.1\",\"interface\":0{ip_version}}}],\"dns\":{{}}}}\n"
    )
}

/// The top-level `"cniVersion"` string of the configuration, found without a JSON parser: the
/// first occurrence of the key is the top-level one in every configuration the bench writes.
fn cni_version(conf: &[u8]) -> Option<&str> {
    let key = b"\"cniVersion\"";
    let at = conf.windows(key.len()).position(|w| w == key)? + key.len();
    let rest = &conf[at..];
    let open = rest.iter().position(|&b| b == b'"')? + 1;
    let len = rest[open..].iter().position(|&b| b == b'"')?;
    std::str::from_utf8(&rest[open..open + len]).ok()
}
