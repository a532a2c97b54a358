//! A private containerd (CRI plugin enabled) started inside a network namespace of its own, with
//! its own root, state, sockets and CNI folders in a temporary directory; stopped and cleaned up
//! on drop, also when a test fails.
//!
//! Why `nsenter --net=` and not `ip netns exec`: the latter remounts /sys, which hides the cgroup
//! mounts runc needs. Why a namespace at all: the CNI plugins containerd runs put host-side links
//! (bridges, veth ends) in containerd's own namespace, which must never be the machine's.

use std::collections::HashSet;
use std::fs;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::crictl::Crictl;
use crate::netns::{run, Netns};
use crate::runtime::{self, Generation};

/// The image name the sandbox image is imported under and containerd is told to use.
pub const SANDBOX_IMAGE: &str = "localhost/cni-guard-test/sandbox:1";

pub struct Containerd {
    generation: Generation,
    crictl: Crictl,
    /// The version containerd's CRI reports, without packaging suffix ("2.4.2", "1.6.20").
    version: String,
    child: Option<Child>,
    socket: PathBuf,
    cgroups_created: Vec<PathBuf>,
    guard_log: GuardLog,
    netns: Netns,
    dir: tempfile::TempDir,
}

impl Containerd {
    /// Starts containerd of `generation` with a private config; `sandbox_image_tar` (an OCI
    /// layout tarball, see scripts/build-image.sh) is imported as [`SANDBOX_IMAGE`].
    pub fn start(generation: Generation, sandbox_image_tar: &Path) -> Result<Self, String> {
        let dir = tempfile::Builder::new()
            .prefix("cni-guard-containerd-")
            .tempdir()
            .map_err(|e| e.to_string())?;
        let netns = Netns::create("cg-ctrd")?;
        let cgroups_created = k8s_cgroups().into_iter().filter(|p| !p.exists()).collect();
        let socket = dir.path().join("containerd.sock");
        let crictl =
            Crictl::new(&runtime::crictl(), &socket, dir.path()).map_err(|e| e.to_string())?;
        // The guard logs one line per invocation to this socket (CNI_GUARD_SYSLOG in
        // containerd's environment reaches every plugin containerd runs).
        let guard_log = GuardLog::bind(&dir.path().join("guard-log.sock"))?;
        let mut ctrd = Self {
            generation,
            crictl,
            version: String::new(),
            child: None,
            socket,
            cgroups_created,
            guard_log,
            netns,
            dir,
        };
        for sub in ["root", "state", "opt", "runc", "net.d", "bin", "tmp"] {
            fs::create_dir_all(ctrd.dir.path().join(sub)).map_err(|e| e.to_string())?;
        }
        let config = ctrd.dir.path().join("config.toml");
        fs::write(&config, config_toml(generation, ctrd.dir.path())).map_err(|e| e.to_string())?;
        let log = fs::File::create(ctrd.log_path()).map_err(|e| e.to_string())?;
        // containerd looks its shim up in PATH: this generation's shim first, then Debian's runc.
        let path = format!(
            "{}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            generation.shim_dir().display()
        );
        let child = Command::new("nsenter")
            .arg(format!("--net={}", ctrd.netns.path().display()))
            .arg(generation.containerd())
            .arg("--config")
            .arg(&config)
            .env("PATH", path)
            .env("CNI_GUARD_SYSLOG", ctrd.guard_log.path())
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
        let quick = self.crictl.with_timeout(Duration::from_secs(2));
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
                if let Ok((name, version, api)) = quick.version() {
                    if name != "containerd" || api != "v1" {
                        return Err(format!("unexpected CRI runtime {name} {version} {api}"));
                    }
                    self.version = runtime::upstream_version(&version);
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

    /// Imports an OCI layout tarball into the CRI's image namespace (`k8s.io`) with the `ctr`
    /// of the same release.
    pub fn import_image(&self, tar: &Path) -> Result<(), String> {
        run(Command::new(self.generation.ctr())
            .arg("-a")
            .arg(&self.socket)
            .args(["-n", "k8s.io", "images", "import"])
            .arg(tar))
        .map(|_| ())
    }

    /// crictl pointed at this containerd.
    pub fn crictl(&self) -> &Crictl {
        &self.crictl
    }

    pub fn generation(&self) -> Generation {
        self.generation
    }

    /// The running daemon's version as its CRI reports it, packaging suffix dropped: "2.4.2".
    pub fn version(&self) -> &str {
        &self.version
    }

    /// `containerd-<version>`, as the suites' summary lines name the runtime.
    pub fn runtime_name(&self) -> String {
        format!("containerd-{}", self.version)
    }

    /// containerd's CNI `conf_dir`.
    pub fn conf_dir(&self) -> PathBuf {
        self.dir.path().join("net.d")
    }

    /// containerd's CNI bin dir (CNI_PATH).
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

    /// The guard's log lines (`verb=... container=... decision=...`), one per invocation: those
    /// sent to the suite's syslog socket, then any the guard wrote to stderr instead (when the
    /// socket's queue was full), which containerd's log holds for successful calls.
    pub fn guard_log(&self) -> Vec<String> {
        let mut lines = self.guard_log.lines();
        lines.extend(
            self.log()
                .lines()
                .filter_map(|l| l.find("cni-guard: verb=").map(|i| l[i + 11..].to_string())),
        );
        lines
    }

    pub fn log_tail(&self, lines: usize) -> String {
        let log = self.log();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Waits until containerd reports `NetworkReady` (its CNI config is loaded).
    pub fn wait_network_ready(&self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        let mut last = String::new();
        while Instant::now() < deadline {
            match self.crictl.network_ready() {
                Ok((true, _)) => return Ok(()),
                Ok((false, msg)) => last = msg,
                Err(e) => last = e.message,
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(format!(
            "containerd's network not ready after {timeout:?}: {last}"
        ))
    }

    /// Stops and removes every sandbox containerd knows; returns the errors met.
    pub fn remove_all_sandboxes(&self) -> Vec<String> {
        let ids = match self.crictl.pods() {
            Ok(ids) => ids,
            Err(e) => return vec![format!("crictl pods: {e}")],
        };
        let mut errors = Vec::new();
        for id in ids {
            if let Err(e) = self.crictl.stopp(&id) {
                errors.push(format!("crictl stopp {id}: {e}"));
            }
            if let Err(e) = self.crictl.rmp(&id) {
                errors.push(format!("crictl rmp {id}: {e}"));
            }
        }
        errors
    }

    fn shutdown(&mut self) {
        let running = self
            .child
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_none());
        let sandboxes: Vec<String> = if running {
            self.crictl
                .with_timeout(Duration::from_secs(10))
                .pods()
                .unwrap_or_default()
        } else {
            Vec::new()
        };
        if !sandboxes.is_empty() {
            for e in self.remove_all_sandboxes() {
                eprintln!("cleanup: {e}");
            }
        }
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
        kill_own_plugins(&self.bin_dir());
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
                "---- containerd {} log (last 60 lines) ----\n{}\n----",
                self.version,
                self.log_tail(60)
            );
        }
        self.shutdown();
    }
}

/// The suite's syslog: a datagram socket the guard sends its lines to, drained by a thread.
struct GuardLog {
    path: PathBuf,
    lines: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl GuardLog {
    fn bind(path: &Path) -> Result<Self, String> {
        let socket =
            UnixDatagram::bind(path).map_err(|e| format!("bind {}: {e}", path.display()))?;
        socket
            .set_read_timeout(Some(Duration::from_millis(100)))
            .map_err(|e| e.to_string())?;
        let lines = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (lines, stop) = (lines.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 65536];
                while !stop.load(Ordering::SeqCst) {
                    if let Ok(n) = socket.recv(&mut buf) {
                        let text = String::from_utf8_lossy(&buf[..n]);
                        // "<14>cni-guard[PID]: verb=..." (plugin/src/log.rs)
                        let line = text.find("]: ").map_or(&text[..], |i| &text[i + 3..]);
                        lines.lock().unwrap().push(line.trim_end().to_string());
                    }
                }
            })
        };
        Ok(Self {
            path: path.to_owned(),
            lines,
            stop,
            thread: Some(thread),
        })
    }

    fn path(&self) -> &Path {
        &self.path
    }

    fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }
}

impl Drop for GuardLog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The private config: every path containerd writes into `dir`, the CRI's CNI settings at the
/// suite's folders, the sandbox image a local one, unused snapshotters off.
fn config_toml(generation: Generation, dir: &Path) -> String {
    match generation {
        Generation::Debian => config_v2(dir),
        Generation::Current => config_v4(dir),
    }
}

/// containerd 1.6 (config version 2). Keys checked against `containerd config default` of the
/// packaged 1.6.20.
fn config_v2(dir: &Path) -> String {
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

/// containerd 2.x (config version 4, v2.4's own: `containerd config default` of v2.4.2 and
/// internal/cri/config). Version 3 is still read but migrated at every start (with a warning);
/// 4 moved the gRPC/ttrpc addresses under the `io.containerd.server.v1.*` plugins. The CRI's
/// keys are the same in both: CNI under `io.containerd.cri.v1.runtime`, the sandbox image
/// pinned under `io.containerd.cri.v1.images`, streaming under `io.containerd.grpc.v1.cri`.
/// NRI is off (its socket would be the machine's /var/run/nri/nri.sock).
fn config_v4(dir: &Path) -> String {
    let d = dir.display();
    format!(
        r#"version = 4
root = "{d}/root"
state = "{d}/state"
temp = "{d}/tmp"
disabled_plugins = [
  "io.containerd.snapshotter.v1.blockfile",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.erofs",
  "io.containerd.differ.v1.erofs",
  "io.containerd.nri.v1.nri",
]

[plugins]
  [plugins.'io.containerd.server.v1.grpc']
    address = "{d}/containerd.sock"
  [plugins.'io.containerd.server.v1.ttrpc']
    address = "{d}/containerd.sock.ttrpc"
  [plugins.'io.containerd.internal.v1.opt']
    path = "{d}/opt"
  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = "overlayfs"
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = "{SANDBOX_IMAGE}"
  [plugins.'io.containerd.cri.v1.runtime']
    enable_selinux = false
    disable_apparmor = true
    restrict_oom_score_adj = true
    netns_mounts_under_state_dir = true
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ["{d}/bin"]
      conf_dir = "{d}/net.d"
      max_conf_num = 1
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = "runc"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
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
        let argv0 = cmdline.split(|b| *b == 0).next().unwrap_or_default();
        let is_shim = argv0
            .rsplit(|b| *b == b'/')
            .next()
            .is_some_and(|name| name.starts_with(b"containerd-shim"));
        if is_shim && cmdline.windows(needle.len()).any(|w| w == needle) {
            eprintln!("cleanup: killing leftover shim {pid}");
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
    }
}

/// Plugins still running from the suite's bin dir (a delegate that hangs, left by a daemon
/// that was stopped mid-call) are killed: their command line starts with a path in `bin_dir`.
fn kill_own_plugins(bin_dir: &Path) {
    let needle = bin_dir.as_os_str().as_encoded_bytes();
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
        if cmdline
            .split(|b| *b == 0)
            .any(|arg| arg.starts_with(needle))
        {
            eprintln!("cleanup: killing leftover plugin {pid}");
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
        for generation in Generation::ALL {
            let cfg = config_toml(generation, Path::new("/x/y"));
            let bin = if generation == Generation::Debian {
                "bin_dir = \"/x/y/bin\""
            } else {
                "bin_dirs = [\"/x/y/bin\"]"
            };
            assert!(cfg.contains(bin), "{generation:?}: missing {bin}");
            for line in [
                "root = \"/x/y/root\"",
                "state = \"/x/y/state\"",
                "address = \"/x/y/containerd.sock\"",
                "conf_dir = \"/x/y/net.d\"",
                "path = \"/x/y/opt\"",
                "Root = \"/x/y/runc\"",
                "netns_mounts_under_state_dir = true",
                "max_conf_num = 1",
                SANDBOX_IMAGE,
            ] {
                assert!(cfg.contains(line), "{generation:?}: missing {line}");
            }
        }
    }

    #[test]
    fn mount_paths_are_unescaped() {
        assert_eq!(unescape_mount_path("/a\\040b"), "/a b");
    }
}
