//! The CNI side of the suites: network configs (bridge + host-local, the guard's conflist, the
//! Multus stand-in's config), atomic writes into containerd's conf dir, and what is left behind
//! (host-local reservations, guard records).

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

/// A bridge + host-local network. Its host-local reservations go under `data_dir/<name>/`.
pub fn bridge_network(name: &str, bridge: &str, subnet: &str, data_dir: &Path) -> Value {
    json!({
        "type": "bridge",
        "bridge": bridge,
        "isGateway": true,
        "ipMasq": false,
        "ipam": {
            "type": "host-local",
            "ranges": [[{ "subnet": subnet }]],
            "dataDir": data_dir,
        },
        "name": name,
    })
}

/// `plugin` (one plugin config with a `name`) as a single-plugin `.conf` document.
pub fn as_conf(plugin: &Value) -> Value {
    let mut conf = plugin.clone();
    conf["cniVersion"] = json!("1.0.0");
    conf
}

/// `plugin` as a one-plugin conflist document.
pub fn as_conflist(plugin: &Value) -> Value {
    let mut inner = plugin.clone();
    let name = inner
        .as_object_mut()
        .and_then(|o| o.remove("name"))
        .unwrap_or(json!("net"));
    json!({ "cniVersion": "1.0.0", "name": name, "plugins": [inner] })
}

/// The guard's conflist (the contract in the project brief).
pub fn guard_conflist(
    delegate: &Path,
    attachments: &[PathBuf],
    wait_seconds: u64,
    cache_dir: &Path,
) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": GUARD_NETWORK,
        "plugins": [{
            "type": "cni-guard",
            "delegate": delegate,
            "attachments": attachments,
            "waitSeconds": wait_seconds,
            "cacheDir": cache_dir,
            "capabilities": { "portMappings": true },
        }],
    })
}

/// The guard conflist's network name; its records live under `<cacheDir>/<this>/`.
pub const GUARD_NETWORK: &str = "guarded-pod-network";

/// The Multus stand-in's `.conf`: `eth0` from the cluster conflist, `net1`.. from attachments.
pub fn mini_multus_conf(cluster_network: &Path, attachments: &[PathBuf]) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": "multus-cni-network",
        "type": "mini-multus",
        "clusterNetwork": cluster_network,
        "attachments": attachments,
    })
}

/// Writes `doc` to `dir/name` the way config writers should: a temp file whose name containerd
/// never loads (no .conf/.conflist/.json ending), then a rename.
pub fn write_atomically(dir: &Path, name: &str, doc: &Value) -> std::io::Result<()> {
    let tmp = dir.join(format!(".{name}.tmp"));
    fs::write(&tmp, serde_json::to_vec_pretty(doc).expect("JSON"))?;
    fs::rename(&tmp, dir.join(name))
}

/// host-local reservations (one file per IP, named after it) left for network `network`.
pub fn reservations(data_dir: &Path, network: &str) -> Vec<String> {
    let Ok(entries) = fs::read_dir(data_dir.join(network)) else {
        return Vec::new();
    };
    let mut ips: Vec<String> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "lock" && !n.starts_with("last_reserved_ip"))
        .collect();
    ips.sort();
    ips
}

/// The guard's records (regular files) left under `<cache_dir>/<GUARD_NETWORK>/`.
pub fn guard_records(cache_dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![cache_dir.join(GUARD_NETWORK)];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.filter_map(|e| e.ok()) {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                found.push(p);
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conflist_moves_the_name_up() {
        let net = bridge_network("pods", "cni0", "10.1.0.0/24", Path::new("/d"));
        let list = as_conflist(&net);
        assert_eq!(list["name"], "pods");
        assert!(list["plugins"][0].get("name").is_none());
        assert_eq!(list["plugins"][0]["ipam"]["dataDir"], "/d");
        assert_eq!(as_conf(&net)["cniVersion"], "1.0.0");
    }

    #[test]
    fn atomic_write_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        write_atomically(dir.path(), "00-x.conf", &json!({"a": 1})).unwrap();
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("00-x.conf")]);
    }

    #[test]
    fn reservations_skip_bookkeeping_files() {
        let dir = tempfile::tempdir().unwrap();
        let net = dir.path().join("pods");
        fs::create_dir_all(&net).unwrap();
        for f in ["lock", "last_reserved_ip.0", "10.1.0.2"] {
            fs::write(net.join(f), "x").unwrap();
        }
        assert_eq!(reservations(dir.path(), "pods"), vec!["10.1.0.2"]);
    }
}
