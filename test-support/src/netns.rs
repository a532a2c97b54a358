//! Names of the network namespaces the suites create, and the removal of those a killed run
//! left behind.
//!
//! A suite's namespace is `<prefix>-p<pid>-<hex>`: the prefix says which suite (`cg-...`), the
//! pid which test process owns it, the hex keeps names apart within that process. A namespace
//! whose owner is gone was left by a run that was killed before its `Drop` ran: the first name
//! a process asks for removes every such namespace first, and says so on stderr.

use std::collections::BTreeSet;
use std::io::Read;
use std::path::Path;
use std::process::Command;
use std::sync::Once;

/// Where `ip netns` keeps its named namespaces.
const NETNS_DIR: &str = "/run/netns";
/// Every suite's prefix starts with this; nothing else under /run/netns is ever removed.
const PREFIX: &str = "cg-";

/// A fresh name for a suite's namespace, `<prefix>-p<pid>-<8 hex>`. `prefix` must start with
/// `cg-`. The first call in a process removes the namespaces left by killed runs.
pub fn name(prefix: &str) -> String {
    assert!(
        prefix.starts_with(PREFIX),
        "namespace prefix {prefix:?} does not start with {PREFIX:?}"
    );
    static REAP: Once = Once::new();
    REAP.call_once(|| {
        reap_stale(Path::new(NETNS_DIR));
    });
    let mut bytes = [0u8; 4];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .expect("read /dev/urandom");
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("{prefix}-p{}-{hex}", std::process::id())
}

/// The pid that owns a suite's namespace, from its name; `None` for a name no suite makes.
fn owner(name: &str) -> Option<u32> {
    let mut parts = name.rsplitn(3, '-');
    let hex = parts.next()?;
    let pid = parts.next()?.strip_prefix('p')?;
    let prefix = parts.next()?;
    if !prefix.starts_with(PREFIX) || prefix.len() == PREFIX.len() {
        return None;
    }
    let hex_ok = !hex.is_empty() && hex.bytes().all(|b| b.is_ascii_hexdigit());
    let pid_ok = !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit());
    if hex_ok && pid_ok {
        pid.parse().ok()
    } else {
        None
    }
}

/// The suites' namespaces among `names` whose owner `alive` says is gone.
fn stale(names: &BTreeSet<String>, alive: impl Fn(u32) -> bool) -> Vec<&str> {
    names
        .iter()
        .filter(|n| owner(n).is_some_and(|pid| !alive(pid)))
        .map(String::as_str)
        .collect()
}

/// Removes the suites' namespaces under `dir` whose owning process is gone; returns their
/// names. A removal that fails is said and skipped (the next run tries again).
pub fn reap_stale(dir: &Path) -> Vec<String> {
    let names: BTreeSet<String> = match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .collect(),
        Err(_) => return Vec::new(),
    };
    let mut removed = Vec::new();
    for name in stale(&names, |pid| Path::new(&format!("/proc/{pid}")).exists()) {
        let status = Command::new("ip").args(["netns", "del", name]).status();
        match status {
            Ok(s) if s.success() => {
                eprintln!(
                    "cleanup: removed network namespace {name}, left by a killed run (its test \
                     process is gone)"
                );
                removed.push(name.to_owned());
            }
            Ok(s) => eprintln!("cleanup: ip netns del {name} failed ({s}); left for the next run"),
            Err(e) => eprintln!("cleanup: cannot run ip netns del {name}: {e}"),
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_the_prefix_and_the_owner() {
        let a = name("cg-unit");
        let b = name("cg-unit");
        assert_ne!(a, b);
        assert_eq!(owner(&a), Some(std::process::id()));
        assert!(
            a.starts_with(&format!("cg-unit-p{}-", std::process::id())),
            "{a}"
        );
    }

    #[test]
    #[should_panic(expected = "does not start with")]
    fn a_prefix_outside_the_suites_is_refused() {
        let _ = name("pod");
    }

    #[test]
    fn only_the_suites_names_with_a_gone_owner_are_stale() {
        let names: BTreeSet<String> = [
            "cg-race-p100-0a1b2c3d",       // owner gone
            "cg-faults-ctr-p200-deadbeef", // owner alive
            "cg-host-p100-zz",             // not hex
            "cg-host-100-00aa",            // no p
            "cg-p100-00aa",                // no prefix left
            "demo-pod-p100-00aa",          // not a suite's
            "cni-guard-node",              // the node's, never touched
        ]
        .map(String::from)
        .into();
        assert_eq!(stale(&names, |pid| pid == 200), ["cg-race-p100-0a1b2c3d"]);
        assert!(stale(&names, |_| true).is_empty());
    }

    /// Root: a namespace named for a process that is gone is removed by the next reap, one of a
    /// live process is kept.
    #[test]
    fn a_killed_runs_namespace_is_removed_and_a_live_ones_kept() {
        let missing: Vec<String> = [(!crate::is_root()).then(|| "root".to_owned())]
            .into_iter()
            .flatten()
            .collect();
        if !crate::prerequisites("test-support netns reap", &missing) {
            return;
        }
        // A pid that was just used and is gone: a child that has been waited for.
        let mut child = Command::new("true").spawn().expect("spawn true");
        let gone = child.id();
        child.wait().expect("wait true");
        let left = format!("cg-reaptest-p{gone}-0000abcd");
        let live = name("cg-reaptest");
        for n in [&left, &live] {
            let ok = Command::new("ip").args(["netns", "add", n]).status();
            assert!(ok.is_ok_and(|s| s.success()), "ip netns add {n}");
        }
        let removed = reap_stale(Path::new(NETNS_DIR));
        let left_there = Path::new(NETNS_DIR).join(&left).exists();
        let live_there = Path::new(NETNS_DIR).join(&live).exists();
        for n in [&left, &live] {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
        assert!(removed.contains(&left), "{left} not removed: {removed:?}");
        assert!(!left_there, "{left} is still there");
        assert!(live_there, "{live} (this process's) was removed");
    }
}
