//! Named network namespaces the tests create (random suffix, `lo` up), deleted on drop, and the
//! few `ip` queries the suites make inside namespaces.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs a command, returning its stdout, or an error naming the command and its stderr.
pub fn run(cmd: &mut Command) -> Result<String, String> {
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A random lowercase hex suffix (from the kernel's random pool).
pub fn random_suffix() -> String {
    let bytes = std::fs::read("/proc/sys/kernel/random/uuid").unwrap_or_default();
    String::from_utf8_lossy(&bytes)
        .chars()
        .filter(|c| c.is_ascii_hexdigit())
        .take(8)
        .collect()
}

/// A named network namespace under /run/netns, removed when dropped.
pub struct Netns {
    name: String,
}

impl Netns {
    pub fn create(prefix: &str) -> Result<Self, String> {
        let name = test_support::netns::name(prefix);
        run(Command::new("ip").args(["netns", "add", &name]))?;
        let ns = Self { name };
        run(Command::new("ip").args(["-n", &ns.name, "link", "set", "lo", "up"]))?;
        Ok(ns)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn path(&self) -> PathBuf {
        Path::new("/run/netns").join(&self.name)
    }

    /// Names of the links of `kind` (`veth`, `bridge`, ...) in this namespace.
    pub fn links_of_kind(&self, kind: &str) -> Result<Vec<String>, String> {
        let out =
            run(Command::new("ip").args(["-n", &self.name, "-j", "link", "show", "type", kind]))?;
        Ok(link_names(&out))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Err(e) = run(Command::new("ip").args(["netns", "del", &self.name])) {
            eprintln!("cleanup: {e}");
        }
    }
}

fn link_names(ip_json: &str) -> Vec<String> {
    let links: serde_json::Value = serde_json::from_str(ip_json.trim()).unwrap_or_default();
    links
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|l| l.get("ifname").and_then(|n| n.as_str()).map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// One interface seen inside a sandbox: its name and IPv4 addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interface {
    pub name: String,
    pub ipv4: Vec<String>,
}

/// The interfaces (other than `lo`) in the network namespace mounted at `netns`.
pub fn interfaces_in(netns: &Path) -> Result<Vec<Interface>, String> {
    let out = run(Command::new("nsenter")
        .arg(format!("--net={}", netns.display()))
        .args(["ip", "-j", "addr", "show"]))?;
    let links: serde_json::Value =
        serde_json::from_str(out.trim()).map_err(|e| format!("ip -j addr: {e}: {out}"))?;
    let mut found = Vec::new();
    for link in links.as_array().into_iter().flatten() {
        let name = link.get("ifname").and_then(|n| n.as_str()).unwrap_or("");
        if name.is_empty() || name == "lo" {
            continue;
        }
        let ipv4 = link
            .get("addr_info")
            .and_then(|a| a.as_array())
            .into_iter()
            .flatten()
            .filter(|a| a.get("family").and_then(|f| f.as_str()) == Some("inet"))
            .filter_map(|a| a.get("local").and_then(|l| l.as_str()).map(String::from))
            .collect();
        found.push(Interface {
            name: name.to_string(),
            ipv4,
        });
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_names_reads_ip_json() {
        let json =
            r#"[{"ifindex":3,"ifname":"veth1234","flags":[]},{"ifindex":4,"ifname":"vethab"}]"#;
        assert_eq!(link_names(json), vec!["veth1234", "vethab"]);
        assert!(link_names("").is_empty());
    }

    #[test]
    fn random_suffix_is_hex_and_varies() {
        let a = random_suffix();
        assert_eq!(a.len(), 8);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, random_suffix());
    }
}
