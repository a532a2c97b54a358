//! What a sandbox can leave behind: host-local leases, libcni result cache entries, guard
//! records, host-side veths, iptables rules.
use crate::fixture::RESULTS_CACHE;
use crate::netns::Netns;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq)]
pub struct Lease {
    pub ip: IpAddr,
    pub container_id: String,
    pub ifname: String,
}

/// host-local leases of network `net` under `data_dir` (a file per IP holding `id\r\nifname`).
pub fn leases(data_dir: &Path, net: &str) -> Vec<Lease> {
    let Ok(rd) = std::fs::read_dir(data_dir.join(net)) else {
        return Vec::new();
    };
    rd.filter_map(|e| e.ok())
        .filter_map(|e| {
            let ip: IpAddr = e.file_name().to_str()?.parse().ok()?;
            let text = std::fs::read_to_string(e.path()).ok()?;
            let mut lines = text.lines();
            Some(Lease {
                ip,
                container_id: lines.next().unwrap_or_default().trim().to_string(),
                ifname: lines.next().unwrap_or_default().trim().to_string(),
            })
        })
        .collect()
}

/// libcni result cache entries (`<net>-<containerID>-<ifname>`) of the given networks.
pub fn cached_results(networks: &[String]) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(RESULTS_CACHE) else {
        return Vec::new();
    };
    rd.filter_map(|e| e.ok())
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            networks.iter().any(|net| n.starts_with(&format!("{net}-")))
        })
        .map(|e| e.path())
        .collect()
}

/// Every regular file under `dir` (the guard's records live under its cacheDir).
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.filter_map(|e| e.ok()) {
        let p = e.path();
        if p.is_dir() {
            out.extend(files_under(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// The host namespace's nat and filter rules (iptables-save), for before/after comparisons.
pub fn iptables_rules(host: &Netns) -> Vec<String> {
    let out = crate::must(&mut host.exec("iptables-save"));
    out.lines()
        .filter(|l| l.starts_with('-') || l.starts_with(':'))
        .map(|l| {
            // counters on chain lines change; keep the chain name only
            if l.starts_with(':') {
                l.split_whitespace().next().unwrap_or(l).to_string()
            } else {
                l.to_string()
            }
        })
        .collect()
}
