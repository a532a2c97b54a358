//! A private containerd (CRI plugin enabled) started inside a network namespace of its own, with
//! its own root, state, sockets and CNI folders in a temporary directory; stopped and cleaned up
//! on drop, also when a test fails.
//!
//! Why `nsenter --net=` and not `ip netns exec`: the latter remounts /sys, which hides the cgroup
//! mounts runc needs. Why a namespace at all: the CNI plugins containerd runs put host-side links
//! (bridges, veth ends) in containerd's own namespace, which must never be the machine's.

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::cri::RuntimeClient;
use crate::netns::{run, Netns};

/// The image name the sandbox image is imported under and containerd is told to use.
pub const SANDBOX_IMAGE: &str = "localhost/cni-guard-test/sandbox:1";

const CRI_TIMEOUT: Duration = Duration::from_secs(120);

pub struct Containerd {
    rt: tokio::runtime::Runtime,
    client: Option<RuntimeClient>,
    child: Option<Child>,
    socket: PathBuf,
    cgroups_created: Vec<PathBuf>,
    netns: Netns,
    dir: tempfile::TempDir,
}

impl Containerd {
    /// Starts containerd with a private config; `sandbox_image_tar` (an OCI layout tarball, see
    /// scripts/build-image.sh) is imported as [`SANDBOX_IMAGE`].
    pub fn start(sandbox_image_tar: &Path) -> Result<Self, String> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        let dir = tempfile::Builder::new()
            .prefix("cni-guard-containerd-")
            .tempdir()
            .map_err(|e| e.to_string())?;
        let netns = Netns::create("cg-ctrd")?;
        let cgroups_created = k8s_cgroups().into_iter().filter(|p| !p.exists()).collect();
        let mut ctrd = Self {
            rt,
            client: None,
            child: None,
            socket: dir.path().join("containerd.sock"),
            cgroups_created,
            netns,
            dir,
        };
        for sub in ["root", "state", "opt", "runc", "net.d", "bin"] {
            fs::create_dir_all(ctrd.dir.path().join(sub)).map_err(|e| e.to_string())?;
        }
        let config = ctrd.dir.path().join("config.toml");
        fs::write(&config, config_toml(ctrd.dir.path())).map_err(|e| e.to_string())?;
        let log = fs::File::create(ctrd.log_path()).map_err(|e| e.to_string())?;
        let child = Command::new("nsenter")
            .arg(format!("--net={}", ctrd.netns.path().display()))
            .arg("containerd")
            .arg("--config")
            .arg(&config)
            // cni-guard logs to syslog, or to stderr when it cannot; pointed at a socket that
            // does not exist, its lines land in this log (libcni hands plugins containerd's
            // stderr), where the suites can read each decision.
            .env("CNI_GUARD_SYSLOG", ctrd.dir.path().join("no-syslog"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot start containerd: {e}"))?;
        ctrd.child = Some(child);
        ctrd.wait_ready()?;
        ctrd.import_image(sandbox_image_tar)?;
        Ok(ctrd)
    }

    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                return Err(format!(
                    "containerd exited at start ({status}):\n{}",
                    self.log_tail(40)
                ));
            }
            if self.socket.exists() {
                let socket = self.socket.clone();
                let attempt = self.rt.block_on(async move {
                    let client = RuntimeClient::connect(&socket, CRI_TIMEOUT).await.ok()?;
                    client.version().await.ok()?;
                    Some(client)
                });
                if let Some(client) = attempt {
                    self.client = Some(client);
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "containerd's CRI did not answer within 30s:\n{}",
                    self.log_tail(40)
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Imports an OCI layout tarball into the CRI's image namespace (`k8s.io`).
    pub fn import_image(&self, tar: &Path) -> Result<(), String> {
        run(Command::new("ctr")
            .arg("-a")
            .arg(&self.socket)
            .args(["-n", "k8s.io", "images", "import"])
            .arg(tar))
        .map(|_| ())
    }

    /// The CRI client (clone it to use from concurrent tasks).
    pub fn cri(&self) -> RuntimeClient {
        self.client.clone().expect("connected at start")
    }

    /// Runs a future on this harness's runtime.
    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    /// containerd's `cni.conf_dir`.
    pub fn conf_dir(&self) -> PathBuf {
        self.dir.path().join("net.d")
    }

    /// containerd's `cni.bin_dir` (CNI_PATH).
    pub fn bin_dir(&self) -> PathBuf {
        self.dir.path().join("bin")
    }

    /// A scratch folder for the suite (delegates, IPAM data, guard records...).
    pub fn scratch(&self, name: &str) -> PathBuf {
        let p = self.dir.path().join("scratch").join(name);
        fs::create_dir_all(&p).expect("create scratch dir");
        p
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The namespace containerd (and so every host-side CNI link) lives in.
    pub fn netns(&self) -> &Netns {
        &self.netns
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("containerd.log")
    }

    pub fn log(&self) -> String {
        fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// The guard's log lines (one per invocation) that containerd's log holds.
    pub fn guard_log(&self) -> Vec<String> {
        self.log()
            .lines()
            .filter_map(|l| l.find("cni-guard: verb=").map(|i| l[i..].to_string()))
            .collect()
    }

    pub fn log_tail(&self, lines: usize) -> String {
        let log = self.log();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Waits until containerd reports `NetworkReady` (its CNI config is loaded).
    pub fn wait_network_ready(&self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        let cri = self.cri();
        while Instant::now() < deadline {
            if self.rt.block_on(cri.network_ready()).unwrap_or(false) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(format!("containerd's network not ready after {timeout:?}"))
    }

    /// Stops and removes every sandbox containerd knows; returns the errors met.
    pub fn remove_all_sandboxes(&self) -> Vec<String> {
        let cri = self.cri();
        self.rt.block_on(async move {
            let mut errors = Vec::new();
            let items = match cri.list_pod_sandbox().await {
                Ok(items) => items,
                Err(e) => return vec![format!("ListPodSandbox: {}", e.message())],
            };
            for sb in items {
                if let Err(e) = cri.stop_pod_sandbox(&sb.id).await {
                    errors.push(format!("StopPodSandbox {}: {}", sb.id, e.message()));
                }
                if let Err(e) = cri.remove_pod_sandbox(&sb.id).await {
                    errors.push(format!("RemovePodSandbox {}: {}", sb.id, e.message()));
                }
            }
            errors
        })
    }

    fn shutdown(&mut self) {
        let sandboxes: Vec<String> = if self.client.is_some() {
            let cri = self.cri();
            self.rt
                .block_on(cri.list_pod_sandbox())
                .map(|items| items.into_iter().map(|s| s.id).collect())
                .unwrap_or_default()
        } else {
            Vec::new()
        };
        if !sandboxes.is_empty() {
            for e in self.remove_all_sandboxes() {
                eprintln!("cleanup: {e}");
            }
        }
        self.client = None;
        if let Some(mut child) = self.child.take() {
            let pid = child.id().to_string();
            let _ = Command::new("kill").args(["-TERM", &pid]).status();
            let deadline = Instant::now() + Duration::from_secs(10);
            while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            if child.try_wait().ok().flatten().is_none() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        kill_own_shims(&self.socket);
        unmount_under(self.dir.path());
        // libcni's result cache and the sandboxes' cgroups live outside our folder. A cache
        // entry is ours when the network config it holds points into our folder (every config
        // the suites write does); a sandbox torn down under another network name leaves one.
        for f in cni_results_mentioning(self.dir.path()) {
            let _ = fs::remove_file(f);
        }
        for id in &sandboxes {
            for cg in k8s_cgroups() {
                let _ = fs::remove_dir(cg.join(id));
            }
        }
        for cg in &self.cgroups_created {
            let _ = fs::remove_dir(cg);
        }
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "---- containerd log (last 60 lines) ----\n{}\n----",
                self.log_tail(60)
            );
        }
        self.shutdown();
    }
}

/// containerd 1.6 config (version 2). Keys checked against `containerd config default` of the
/// packaged 1.6.20.
fn config_toml(dir: &Path) -> String {
    let d = dir.display();
    format!(
        r#"version = 2
root = "{d}/root"
state = "{d}/state"
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
]

[grpc]
  address = "{d}/containerd.sock"

[ttrpc]
  address = "{d}/containerd.sock.ttrpc"

[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = "{d}/opt"
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "{SANDBOX_IMAGE}"
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
    enable_selinux = false
    disable_apparmor = true
    restrict_oom_score_adj = true
    netns_mounts_under_state_dir = true
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "{d}/bin"
      conf_dir = "{d}/net.d"
      max_conf_num = 1
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "overlayfs"
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          Root = "{d}/runc"
"#
    )
}

/// The `k8s.io` cgroup folders containerd uses for sandboxes (cgroup v1: one per controller).
fn k8s_cgroups() -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir("/sys/fs/cgroup") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .map(|p| p.join("k8s.io"))
        .collect()
}

/// Shims started for this containerd carry its socket path on their command line.
fn kill_own_shims(socket: &Path) {
    let needle = socket.as_os_str().as_encoded_bytes();
    let Ok(procs) = fs::read_dir("/proc") else {
        return;
    };
    for p in procs.filter_map(|e| e.ok()) {
        let Ok(pid) = p.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmdline) = fs::read(p.path().join("cmdline")) else {
            continue;
        };
        let is_shim = cmdline.starts_with(b"/usr/bin/containerd-shim")
            || cmdline.starts_with(b"containerd-shim");
        if is_shim && cmdline.windows(needle.len()).any(|w| w == needle) {
            eprintln!("cleanup: killing leftover shim {pid}");
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
    }
}

/// Unmounts everything mounted below `dir` (overlay rootfs, shm, netns bind mounts), deepest first.
pub fn unmount_under(dir: &Path) {
    let Ok(info) = fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let prefix = format!("{}/", dir.display());
    let mut points: Vec<String> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(unescape_mount_path)
        .filter(|p| p.starts_with(&prefix))
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for p in points {
        if run(Command::new("umount").arg(&p)).is_err() {
            let _ = run(Command::new("umount").arg("-l").arg(&p));
        }
    }
}

fn unescape_mount_path(p: &str) -> String {
    p.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

const CNI_RESULTS: &str = "/var/lib/cni/results";

/// libcni's cached results whose stored network config mentions `dir`.
pub fn cni_results_mentioning(dir: &Path) -> Vec<PathBuf> {
    use base64::Engine as _;
    let needle = dir.as_os_str().as_encoded_bytes();
    let Ok(entries) = fs::read_dir(CNI_RESULTS) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            let Ok(text) = fs::read(p) else { return false };
            let Ok(entry) = serde_json::from_slice::<serde_json::Value>(&text) else {
                return false;
            };
            let config = entry.get("config").and_then(|c| c.as_str()).unwrap_or("");
            base64::engine::general_purpose::STANDARD
                .decode(config)
                .map(|c| c.windows(needle.len()).any(|w| w == needle))
                .unwrap_or(false)
        })
        .collect()
}

/// libcni's cached results that mention a sandbox id.
pub fn cni_results_for(sandbox_id: &str) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(CNI_RESULTS) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(sandbox_id))
        .map(|e| e.path())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_points_everything_into_the_private_dir() {
        let cfg = config_toml(Path::new("/x/y"));
        for line in [
            "root = \"/x/y/root\"",
            "state = \"/x/y/state\"",
            "address = \"/x/y/containerd.sock\"",
            "conf_dir = \"/x/y/net.d\"",
            "bin_dir = \"/x/y/bin\"",
            "path = \"/x/y/opt\"",
            "Root = \"/x/y/runc\"",
            "netns_mounts_under_state_dir = true",
            "max_conf_num = 1",
        ] {
            assert!(cfg.contains(line), "missing {line}");
        }
    }

    #[test]
    fn mount_paths_are_unescaped() {
        assert_eq!(unescape_mount_path("/a\\040b"), "/a b");
    }
}
