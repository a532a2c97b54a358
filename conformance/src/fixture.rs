//! A conf-dir/bin-dir fixture: one temp tree per suite, removed on Drop with the libcni result
//! cache entries of the networks it named.
//!
//! Layout under `/tmp/cg-conformance-<random>/`:
//! - `bin/`        CNI_PATH: symlinks to the run's reference plugins (`generation`), `cni-guard`
//!   (or cni-tap standing in for it), `mini-multus`; a tapped plugin is cni-tap too
//! - `net.d/`      the conf dir (what containerd would read)
//! - `delegates/`  delegate and attachment files that are not in the conf dir
//! - `leases/`     host-local `dataDir` (one dir per network name)
//! - `guard/`      the guard's `cacheDir` (its records)
//! - `taps/`       cni-tap records
use crate::generation::generation;
use crate::prereq::guard_binary;
use crate::random_hex;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The binaries a fixture links into its bin dir (the suites get the last two from cargo).
pub struct Binaries {
    pub guard: PathBuf,
    pub mini_multus: PathBuf,
    pub tap: PathBuf,
}

impl Binaries {
    pub fn new(mini_multus: &str, tap: &str) -> Binaries {
        Binaries {
            guard: guard_binary(),
            mini_multus: PathBuf::from(mini_multus),
            tap: PathBuf::from(tap),
        }
    }
}

pub struct Fixture {
    pub root: PathBuf,
    pub bin: PathBuf,
    pub netd: PathBuf,
    pub delegates: PathBuf,
    pub leases: PathBuf,
    pub guard_cache: PathBuf,
    pub taps: PathBuf,
    pub suffix: String,
    pub guard: PathBuf,
    tap: PathBuf,
    networks: Mutex<Vec<String>>,
    /// Plugins replaced by cni-tap: (name, the real binary).
    tapped: Mutex<Vec<(String, PathBuf)>>,
}

pub const RESULTS_CACHE: &str = "/var/lib/cni/results";

impl Fixture {
    /// With `tap_guard`, `bin/cni-guard` is cni-tap recording the real guard's replies.
    pub fn new(bins: &Binaries, tap_guard: bool) -> Fixture {
        let suffix = random_hex(3);
        let root = PathBuf::from(format!("/tmp/cg-conformance-{suffix}"));
        let f = Fixture {
            bin: root.join("bin"),
            netd: root.join("net.d"),
            delegates: root.join("delegates"),
            leases: root.join("leases"),
            guard_cache: root.join("guard"),
            taps: root.join("taps"),
            root,
            suffix,
            guard: bins.guard.clone(),
            tap: bins.tap.clone(),
            networks: Mutex::new(Vec::new()),
            tapped: Mutex::new(Vec::new()),
        };
        for d in [
            &f.bin,
            &f.netd,
            &f.delegates,
            &f.leases,
            &f.guard_cache,
            &f.taps,
        ] {
            std::fs::create_dir_all(d).expect("create fixture dir");
        }
        let plugins = &generation().plugins.dir;
        let listing = std::fs::read_dir(plugins)
            .unwrap_or_else(|e| panic!("read {}: {e}", plugins.display()));
        for entry in listing {
            let entry = entry.expect("dir entry");
            std::os::unix::fs::symlink(entry.path(), f.bin.join(entry.file_name()))
                .expect("symlink plugin");
        }
        let guard_link = if tap_guard { &bins.tap } else { &bins.guard };
        std::os::unix::fs::symlink(guard_link, f.bin.join("cni-guard")).expect("symlink guard");
        std::os::unix::fs::symlink(&bins.mini_multus, f.bin.join("mini-multus"))
            .expect("symlink mini-multus");
        f
    }

    /// A network name unique to this fixture; its result cache entries are removed on Drop.
    pub fn network(&self, base: &str) -> String {
        let name = format!("{base}-{}", self.suffix);
        self.networks.lock().unwrap().push(name.clone());
        name
    }

    /// Puts cni-tap in front of the reference plugin `name` in the bin dir: every call of it
    /// (by the guard, by a plugin delegating to it) is recorded.
    pub fn tap_plugin(&self, name: &str) {
        let link = self.bin.join(name);
        let real = std::fs::read_link(&link)
            .unwrap_or_else(|e| panic!("{} is not a plugin link: {e}", link.display()));
        std::fs::remove_file(&link).expect("remove plugin link");
        std::os::unix::fs::symlink(&self.tap, &link).expect("symlink cni-tap");
        self.tapped.lock().unwrap().push((name.to_string(), real));
    }

    /// Environment for cni-tap (harmless when nothing is tapped).
    pub fn tap_env(&self) -> Vec<(String, PathBuf)> {
        let mut env = vec![
            ("CNI_TAP_TARGET".to_string(), self.guard.clone()),
            ("CNI_TAP_DIR".to_string(), self.taps.clone()),
        ];
        for (name, real) in self.tapped.lock().unwrap().iter() {
            env.push((
                format!("CNI_TAP_TARGET_{}", name.replace('-', "_")),
                real.clone(),
            ));
        }
        env
    }

    /// The guard's replies recorded by cni-tap for one container, oldest first.
    pub fn tap_records(&self, container_id: &str, command: &str) -> Vec<Value> {
        self.plugin_records("cni-guard", container_id, command)
    }

    /// The calls of one tapped plugin (`cni-guard` for the guard) for one container ID (empty
    /// for STATUS and GC) and command, oldest first.
    pub fn plugin_records(&self, plugin: &str, container_id: &str, command: &str) -> Vec<Value> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(&self.taps)
            .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        files.sort_by_key(|p| {
            // <cid>-<COMMAND>-<nanos>.json
            p.file_stem()
                .and_then(|s| s.to_str())
                .and_then(|s| s.rsplit('-').next())
                .and_then(|n| n.parse::<u128>().ok())
                .unwrap_or(0)
        });
        files
            .iter()
            .filter(|p| {
                let n = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
                n.starts_with(&format!("{container_id}-{command}-"))
            })
            .filter_map(|p| std::fs::read_to_string(p).ok())
            .filter_map(|t| serde_json::from_str::<Value>(&t).ok())
            .filter(|r| r["plugin"] == plugin)
            .collect()
    }

    /// host-local IPAM over `subnet`, leases under this fixture.
    pub fn host_local(&self, subnet: &str) -> Value {
        json!({
            "type": "host-local",
            "dataDir": self.leases,
            "ranges": [[{"subnet": subnet}]],
            "routes": [{"dst": "0.0.0.0/0"}],
        })
    }

    /// The guard's conflist, as the contract gives it.
    pub fn guard_conflist(
        &self,
        name: &str,
        version: &str,
        delegate: &Path,
        attachments: &[&Path],
    ) -> Value {
        json!({
            "cniVersion": version,
            "name": name,
            "plugins": [{
                "type": "cni-guard",
                "delegate": delegate,
                "attachments": attachments,
                "waitSeconds": 0,
                "cacheDir": self.guard_cache,
                "capabilities": {"portMappings": true},
            }],
        })
    }

    /// Writes JSON to a path atomically (temp name outside any conf extension, then rename).
    pub fn write(&self, path: &Path, value: &Value) {
        crate::confdir::write_atomic(path, value.to_string().as_bytes());
    }

    /// The guard's records (every file under its cacheDir but the networks' lock files).
    pub fn guard_records(&self) -> Vec<PathBuf> {
        // Each network's lock file (`<cacheDir>/.<network>.lock`) stays: it holds no attachment.
        let lock = |p: &PathBuf| {
            p.parent() == Some(self.guard_cache.as_path())
                && p.extension().is_some_and(|e| e == "lock")
        };
        let mut files = crate::leaks::files_under(&self.guard_cache);
        files.retain(|p| !lock(p));
        files
    }

    /// Entries this fixture's networks left in libcni's result cache.
    pub fn cached_results(&self) -> Vec<PathBuf> {
        let names = self.networks.lock().unwrap().clone();
        crate::leaks::cached_results(&names)
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        for p in self.cached_results() {
            let _ = std::fs::remove_file(p);
        }
        if let Err(e) = std::fs::remove_dir_all(&self.root) {
            eprintln!("warning: remove {}: {e}", self.root.display());
        }
    }
}
