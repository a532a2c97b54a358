//! The node agent (`install`, `uninstall`, `keep`, `check`) driven through the built
//! `cni-guard-agent` against temp folders. No root needed.

use std::fs;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

/// The plugin binary, built beside the agent by `cargo test --workspace`.
fn plugin_binary() -> PathBuf {
    let p = Path::new(env!("CARGO_BIN_EXE_cni-guard-agent")).with_file_name("cni-guard");
    assert!(
        p.exists(),
        "{} is not built: run cargo test --workspace",
        p.display()
    );
    p
}

fn guard() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cni-guard-agent"));
    // `check` takes CNI_PATH from the environment: a test that wants it sets it.
    cmd.env_remove("CNI_COMMAND").env_remove("CNI_PATH");
    cmd
}

fn run(args: &[&str]) -> Output {
    guard().args(args).output().expect("run cni-guard-agent")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A node's CNI folders in a temp dir: `bin/` and `net.d/`, as the installer sees them.
struct Node {
    _tmp: tempfile::TempDir,
    bin: PathBuf,
    conf: PathBuf,
}

impl Node {
    fn new() -> Node {
        let tmp = tempfile::tempdir().unwrap();
        let bin = tmp.path().join("bin");
        let conf = tmp.path().join("net.d");
        fs::create_dir(&bin).unwrap();
        fs::create_dir(&conf).unwrap();
        Node {
            _tmp: tmp,
            bin,
            conf,
        }
    }

    fn conflist(&self) -> PathBuf {
        self.conf.join("00-cni-guard.conflist")
    }

    fn binary(&self) -> PathBuf {
        self.bin.join("cni-guard")
    }

    /// `install` args for this node plus `extra`.
    fn install_args(&self, extra: &[&str]) -> Vec<String> {
        let mut args: Vec<String> = vec![
            "install".into(),
            format!("--bin-dir={}", self.bin.display()),
            format!("--conf-dir={}", self.conf.display()),
            "--delegate=/etc/cni/net.d/00-multus.conf".into(),
            "--attachment=/etc/cni/multus/net.d/05-cilium.conflist".into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    }

    fn install(&self, extra: &[&str]) -> Output {
        guard()
            .args(self.install_args(extra))
            .output()
            .expect("run install")
    }

    fn names(&self, dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }
}

fn mtime(path: &Path) -> SystemTime {
    fs::metadata(path).unwrap().modified().unwrap()
}

fn set_old_mtime(path: &Path) -> SystemTime {
    let old = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
    fs::File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(old)
        .unwrap();
    old
}

mod install {
    use super::*;

    /// The guard's entry of the conflist `install` wrote, as the runtime passes it to the
    /// plugin, parsed by the plugin's own configuration code (its defaults applied).
    fn installed_config(node: &Node) -> cni_guard::config::GuardConfig {
        let list: serde_json::Value =
            serde_json::from_slice(&fs::read(node.conflist()).unwrap()).unwrap();
        let mut entry = list["plugins"][0].clone();
        entry["name"] = list["name"].clone();
        entry["cniVersion"] = list["cniVersion"].clone();
        cni_guard::config::GuardConfig::parse(&serde_json::to_vec(&entry).unwrap()).unwrap()
    }

    /// kubelet runs StopPodSandbox (the CNI DEL) under its 2-minute --runtime-request-timeout
    /// and RunPodSandbox (ADD) under twice that; the runtime's context ends the plugin there.
    /// As installed, each verb's whole budget ends well before: DEL by its lock wait, its wait
    /// for the delegate and the delegate's own runs together.
    #[test]
    fn the_installed_budgets_end_well_under_kubelets_deadlines() {
        let node = Node::new();
        let out = node.install(&[]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert!(
            !text(&out.stderr).contains("kubelet"),
            "{}",
            text(&out.stderr)
        );
        let cfg = installed_config(&node);
        let del = cfg.lock_wait + cfg.del_wait + cfg.delegate_timeout;
        let add = cfg.lock_wait + cfg.wait + cfg.delegate_timeout;
        assert!(del <= Duration::from_secs(100), "DEL may take {del:?}");
        assert!(add <= Duration::from_secs(200), "ADD may take {add:?}");
    }

    /// A configured budget past kubelet's deadline is said loudly, naming the keys to change.
    #[test]
    fn warns_when_a_budget_passes_kubelets_deadline() {
        let node = Node::new();
        let out = node.install(&["--del-wait-seconds=100"]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let err = text(&out.stderr);
        assert!(
            err.contains("warning") && err.contains("DEL") && err.contains("120 s"),
            "{err}"
        );
        assert!(err.contains("delWaitSeconds"), "{err}");
    }

    #[test]
    fn writes_the_binary_and_the_conflist_with_host_paths() {
        let node = Node::new();
        let out = node.install(&["--capability=portMappings", "--wait-seconds=3"]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let stdout = text(&out.stdout);
        assert!(stdout.contains(&format!("created {}", node.binary().display())));
        assert!(stdout.contains(&format!("created {}", node.conflist().display())));

        let installed = fs::read(node.binary()).unwrap();
        let original = fs::read(plugin_binary()).unwrap();
        assert!(installed == original, "the installed binary is this binary");
        let mode = fs::metadata(node.binary()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o755);

        let conflist: serde_json::Value =
            serde_json::from_slice(&fs::read(node.conflist()).unwrap()).unwrap();
        assert_eq!(
            conflist,
            serde_json::json!({
                "cniVersion": "1.0.0",
                "name": "guarded-pod-network",
                "plugins": [{
                    "type": "cni-guard",
                    "delegate": "/etc/cni/net.d/00-multus.conf",
                    "attachments": ["/etc/cni/multus/net.d/05-cilium.conflist"],
                    "waitSeconds": 3,
                    // DEL's wait is install's own, whatever ADD's.
                    "delWaitSeconds": 40,
                    "cacheDir": "/var/lib/cni/cni-guard",
                    "capabilities": {"portMappings": true}
                }]
            })
        );
        // No temp file left behind in either folder.
        assert_eq!(node.names(&node.bin), ["cni-guard"]);
        assert_eq!(node.names(&node.conf), ["00-cni-guard.conflist"]);
    }

    #[test]
    fn writes_the_timing_settings_it_is_given_and_refuses_bad_ones() {
        let node = Node::new();
        let out = node.install(&[
            "--wait-seconds=4",
            "--delegate-timeout-seconds=30",
            "--lock-wait-seconds=2",
        ]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let conflist: serde_json::Value =
            serde_json::from_slice(&fs::read(node.conflist()).unwrap()).unwrap();
        let plugin = &conflist["plugins"][0];
        assert_eq!(plugin["waitSeconds"], 4);
        assert_eq!(plugin["delegateTimeoutSeconds"], 30);
        assert_eq!(plugin["lockWaitSeconds"], 2);

        for (flag, want) in [
            (
                "--lock-wait-seconds=601",
                "--lock-wait-seconds: \"601\" is not a whole number from 0 to 600",
            ),
            ("--lock-wait-seconds=soon", "--lock-wait-seconds: \"soon\""),
            ("--delegate-timeout-seconds=0", "from 1 to 600"),
        ] {
            let out = node.install(&[flag]);
            assert_eq!(out.status.code(), Some(2), "{flag}");
            assert!(
                text(&out.stderr).contains(want),
                "{flag}: {}",
                text(&out.stderr)
            );
        }
        let help = text(&run(&["install", "--help"]).stdout);
        assert!(help.contains("--lock-wait-seconds N"), "{help}");
        let help = text(&run(&["keep", "--help"]).stdout);
        assert!(help.contains("--lock-wait-seconds N"), "{help}");
    }

    #[test]
    fn is_idempotent_and_leaves_mtimes_alone() {
        let node = Node::new();
        assert!(node.install(&[]).status.success());
        let old_bin = set_old_mtime(&node.binary());
        let old_conf = set_old_mtime(&node.conflist());

        let out = node.install(&[]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert!(text(&out.stdout).contains(&format!("unchanged {}", node.conflist().display())));
        assert!(text(&out.stdout).contains(&format!("unchanged {}", node.binary().display())));
        assert_eq!(mtime(&node.binary()), old_bin);
        assert_eq!(mtime(&node.conflist()), old_conf);

        // Different flags: the conflist is replaced, the binary still untouched.
        let out = node.install(&["--wait-seconds=5"]);
        assert!(out.status.success());
        assert!(text(&out.stdout).contains(&format!("replaced {}", node.conflist().display())));
        assert_ne!(mtime(&node.conflist()), old_conf);
        assert_eq!(mtime(&node.binary()), old_bin);
    }

    #[test]
    fn a_reader_never_sees_a_partial_or_missing_conflist() {
        let node = Node::new();
        // Two conflists of different lengths, so every install below really rewrites.
        let short: Vec<String> = node.install_args(&[]);
        let long: Vec<String> = node.install_args(&[
            "--attachment=/etc/cni/multus/net.d/10-a-much-longer-attachment-name.conflist",
            "--attachment=/etc/cni/multus/net.d/20-another-long-attachment-name.conflist",
            "--capability=portMappings",
            "--capability=bandwidth",
        ]);
        assert!(guard().args(&short).status().unwrap().success());
        let short_bytes = fs::read(node.conflist()).unwrap();
        assert!(guard().args(&long).status().unwrap().success());
        let long_bytes = fs::read(node.conflist()).unwrap();
        assert_ne!(short_bytes, long_bytes);

        let stop = Arc::new(AtomicBool::new(false));
        let reader = {
            let stop = stop.clone();
            let path = node.conflist();
            let (short_bytes, long_bytes) = (short_bytes.clone(), long_bytes.clone());
            std::thread::spawn(move || {
                let mut reads = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let mut seen = Vec::new();
                    fs::File::open(&path)
                        .expect("the conflist is never missing")
                        .read_to_end(&mut seen)
                        .unwrap();
                    assert!(
                        seen == short_bytes || seen == long_bytes,
                        "partial read: {}",
                        text(&seen)
                    );
                    reads += 1;
                }
                reads
            })
        };
        for round in 0..60 {
            let args = if round % 2 == 0 { &short } else { &long };
            let out = guard().args(args).output().unwrap();
            assert!(out.status.success(), "{}", text(&out.stderr));
            assert!(text(&out.stdout).contains("replaced"));
        }
        stop.store(true, Ordering::Relaxed);
        let reads = reader.join().expect("reader saw only whole files");
        assert!(
            reads > 60,
            "the reader ran during the installs ({reads} reads)"
        );
    }

    #[test]
    fn replaces_a_binary_that_is_running() {
        let node = Node::new();
        // Another build of the plugin (trailing bytes change the file, not the program), running
        // from the bin dir: it waits for its stdin, as a plugin does.
        let other = node.bin.parent().unwrap().join("cni-guard-other");
        let mut bytes = fs::read(plugin_binary()).unwrap();
        bytes.extend_from_slice(b"another build");
        fs::write(&other, bytes).unwrap();
        fs::set_permissions(&other, fs::Permissions::from_mode(0o755)).unwrap();
        let out = node.install(&[&format!("--binary={}", other.display())]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let mut running = Command::new(node.binary())
            .env("CNI_COMMAND", "ADD")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        // Writing over a running executable in place fails with ETXTBSY; a rename does not.
        let out = node.install(&[]);
        running.kill().unwrap();
        running.wait().unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert!(
            text(&out.stdout).contains("replaced"),
            "{}",
            text(&out.stdout)
        );
        let installed = fs::read(node.binary()).unwrap();
        assert!(installed == fs::read(plugin_binary()).unwrap());
    }

    #[test]
    fn refuses_a_binary_that_is_not_the_plugin() {
        let node = Node::new();
        for binary in [
            which("sleep"),
            PathBuf::from(env!("CARGO_BIN_EXE_cni-guard-agent")),
        ] {
            let out = node.install(&[&format!("--binary={}", binary.display())]);
            assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
            assert!(
                text(&out.stderr).contains("is not the cni-guard plugin"),
                "{}",
                text(&out.stderr)
            );
            assert!(!node.binary().exists() && !node.conflist().exists());
        }
    }

    #[test]
    fn refuses_and_writes_nothing_when_another_config_sorts_first() {
        let node = Node::new();
        fs::write(node.conf.join("00-aaa.conf"), "{}").unwrap();
        let out = node.install(&[]);
        assert_eq!(out.status.code(), Some(1));
        let stderr = text(&out.stderr);
        assert!(stderr.contains("refusing to install"), "{stderr}");
        assert!(stderr.contains("00-aaa.conf"), "{stderr}");
        assert_eq!(node.names(&node.conf), ["00-aaa.conf"]);
        assert!(node.names(&node.bin).is_empty(), "no binary written");

        // A .json sorts too; files libcni does not list and folders do not count.
        fs::remove_file(node.conf.join("00-aaa.conf")).unwrap();
        fs::write(node.conf.join("00-0.json"), "{}").unwrap();
        assert_eq!(node.install(&[]).status.code(), Some(1));
        fs::remove_file(node.conf.join("00-0.json")).unwrap();
        fs::write(node.conf.join("00-aaa.conf.cilium_bak"), "{}").unwrap();
        fs::write(node.conf.join("00-readme.txt"), "x").unwrap();
        fs::create_dir(node.conf.join("00-a.conf")).unwrap();
        fs::write(node.conf.join("00-multus.conf"), "{}").unwrap();
        let out = node.install(&[]);
        assert!(out.status.success(), "{}", text(&out.stderr));

        // A --conf-name that sorts first makes the guard first again.
        let node = Node::new();
        fs::write(node.conf.join("00-aaa.conf"), "{}").unwrap();
        let out = node.install(&["--conf-name=00-0-cni-guard.conflist"]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert!(node.conf.join("00-0-cni-guard.conflist").is_file());
    }

    #[test]
    fn rejects_a_wrong_command_line_with_code_2() {
        let node = Node::new();
        for extra in [
            &["--delegate=relative.conf"][..],
            &["--attachment=relative.conflist"],
            &["--cache-dir=var/lib"],
            &["--conf-name=00-cni-guard.conf"],
            &["--cni-version=9.9.9"],
            &["--wait-seconds=soon"],
            &["--no-such-flag"],
            &["positional"],
        ] {
            let out = node.install(extra);
            assert_eq!(
                out.status.code(),
                Some(2),
                "{extra:?}: {}",
                text(&out.stderr)
            );
        }
        let out = run(&["install", "--conf-dir=/tmp", "--delegate=/x.conf"]);
        assert_eq!(out.status.code(), Some(2));
        assert!(text(&out.stderr).contains("--bin-dir is required"));
        assert!(node.names(&node.conf).is_empty() && node.names(&node.bin).is_empty());
    }
}

mod uninstall {
    use super::*;

    fn uninstall(node: &Node) -> Output {
        run(&[
            "uninstall",
            &format!("--bin-dir={}", node.bin.display()),
            &format!("--conf-dir={}", node.conf.display()),
        ])
    }

    #[test]
    fn removes_both_and_is_idempotent() {
        let node = Node::new();
        fs::write(node.conf.join("00-multus.conf"), "{}").unwrap();
        assert!(node.install(&[]).status.success());
        // The binary stays a while after the conflist is gone: a CNI call that read the
        // conflist just before the runtime's reload still finds it.
        let watch = {
            let (conf, bin) = (node.conflist(), node.binary());
            std::thread::spawn(move || {
                let start = Instant::now();
                while conf.exists() && start.elapsed() < Duration::from_secs(30) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                let gone = Instant::now();
                while bin.exists() && start.elapsed() < Duration::from_secs(30) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                gone.elapsed()
            })
        };
        let out = uninstall(&node);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let kept = watch.join().unwrap();
        assert!(
            kept >= Duration::from_millis(1500),
            "the binary went {kept:?} after the conflist"
        );
        let stdout = text(&out.stdout);
        let conf_line = format!("removed {}", node.conflist().display());
        let bin_line = format!("removed {}", node.binary().display());
        assert!(stdout.find(&conf_line).unwrap() < stdout.find(&bin_line).unwrap());
        assert_eq!(node.names(&node.conf), ["00-multus.conf"]);
        assert!(node.names(&node.bin).is_empty());

        let out = uninstall(&node);
        assert!(out.status.success());
        assert!(text(&out.stdout).contains(&format!("absent {}", node.conflist().display())));
    }

    /// A conf dir or bin dir that is not there (a typo, a missing mount) is an error, not a
    /// guard already gone: nothing is removed and the exit code says so.
    #[test]
    fn a_folder_that_is_not_there_fails_and_removes_nothing() {
        let node = Node::new();
        assert!(node.install(&[]).status.success());
        for (bin, conf) in [
            (node.bin.clone(), node.conf.join("typo")),
            (node.bin.join("typo"), node.conf.clone()),
        ] {
            let out = run(&[
                "uninstall",
                &format!("--bin-dir={}", bin.display()),
                &format!("--conf-dir={}", conf.display()),
            ]);
            assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
            assert!(
                text(&out.stderr).contains("is not a directory (is the host folder mounted?)"),
                "{}",
                text(&out.stderr)
            );
            assert!(
                !text(&out.stdout).contains("absent"),
                "{}",
                text(&out.stdout)
            );
            assert!(node.conflist().is_file() && node.binary().is_file());
        }
    }

    #[test]
    fn removes_the_conflist_before_the_binary() {
        // The binary cannot be removed (a folder stands in its place): the conflist must be
        // gone already when that fails.
        let node = Node::new();
        assert!(node.install(&[]).status.success());
        fs::remove_file(node.binary()).unwrap();
        fs::create_dir(node.binary()).unwrap();
        let out = uninstall(&node);
        assert_eq!(out.status.code(), Some(1));
        assert!(!node.conflist().exists(), "conflist removed first");

        // The conflist cannot be removed: the binary must still be there.
        let node = Node::new();
        assert!(node.install(&[]).status.success());
        fs::remove_file(node.conflist()).unwrap();
        fs::create_dir(node.conflist()).unwrap();
        fs::write(node.conflist().join("keep-me"), "x").unwrap();
        let out = uninstall(&node);
        assert_eq!(out.status.code(), Some(1));
        assert!(text(&out.stderr).contains("nothing after it was removed"));
        assert!(
            node.binary().is_file(),
            "binary left while the conflist stays"
        );
    }
}

mod keep {
    use super::*;

    /// A running `cni-guard-agent keep`, killed when dropped if a test failed before stopping it.
    /// Its log is read as it comes, so a test can wait for what keep says it did.
    pub(super) struct Keeper {
        child: Option<Child>,
        log: Arc<std::sync::Mutex<String>>,
        reader: Option<std::thread::JoinHandle<()>>,
    }

    impl Keeper {
        fn start(node: &Node) -> Keeper {
            Keeper::spawn(&[
                "keep".to_owned(),
                format!("--conf-dir={}", node.conf.display()),
                "--delegate=/etc/cni/net.d/00-multus.conf".to_owned(),
                "--attachment=/etc/cni/multus/net.d/05-cilium.conflist".to_owned(),
            ])
        }

        /// `cni-guard` with these arguments, its log read as it comes.
        pub(super) fn spawn(args: &[String]) -> Keeper {
            let mut child = guard()
                .args(args)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            let log = Arc::new(std::sync::Mutex::new(String::new()));
            let mut stderr = child.stderr.take().unwrap();
            let reader = {
                let log = Arc::clone(&log);
                std::thread::spawn(move || {
                    let mut buf = [0u8; 4096];
                    while let Ok(n @ 1..) = stderr.read(&mut buf) {
                        log.lock()
                            .unwrap()
                            .push_str(&String::from_utf8_lossy(&buf[..n]));
                    }
                })
            };
            Keeper {
                child: Some(child),
                log,
                reader: Some(reader),
            }
        }

        fn pid(&self) -> i32 {
            self.child.as_ref().unwrap().id() as i32
        }

        /// Waits until keep has logged `needle` (`count` times in all).
        pub(super) fn wait_log(&self, needle: &str, count: usize) {
            let start = Instant::now();
            loop {
                let log = self.log.lock().unwrap().clone();
                if log.matches(needle).count() >= count {
                    return;
                }
                assert!(
                    start.elapsed() < Duration::from_secs(10),
                    "keep never logged {needle:?} {count} times:\n{log}"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
        }

        /// Sends SIGTERM and returns the exit status and everything it logged.
        pub(super) fn terminate(mut self) -> (std::process::ExitStatus, String) {
            // SAFETY: sending a signal to our own child process.
            assert_eq!(unsafe { libc::kill(self.pid(), libc::SIGTERM) }, 0);
            let status = self.child.take().unwrap().wait().unwrap();
            self.reader.take().unwrap().join().unwrap();
            let log = self.log.lock().unwrap().clone();
            (status, log)
        }
    }

    impl Drop for Keeper {
        fn drop(&mut self) {
            if let Some(mut child) = self.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }

    /// Waits until `path` holds `content`; returns how long that took.
    fn wait_for(path: &Path, content: &[u8], limit: Duration) -> Duration {
        let start = Instant::now();
        loop {
            if fs::read(path).ok().as_deref() == Some(content) {
                return start.elapsed();
            }
            assert!(
                start.elapsed() < limit,
                "{} not restored within {limit:?}",
                path.display()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn restores_a_deleted_renamed_or_rewritten_conflist_and_exits_cleanly_on_sigterm() {
        let node = Node::new();
        let keeper = Keeper::start(&node);
        let path = node.conflist();
        // It writes the file at start: the same bytes install writes.
        let start = Instant::now();
        while !path.exists() {
            assert!(start.elapsed() < Duration::from_secs(5), "keep never wrote");
            std::thread::sleep(Duration::from_millis(5));
        }
        let reference = Node::new();
        assert!(reference.install(&[]).status.success());
        let expected = fs::read(reference.conflist()).unwrap();
        wait_for(&path, &expected, Duration::from_secs(1));
        // keep says so once its watch is in place: from then on every change is seen.
        keeper.wait_log("keeping ", 1);

        fs::remove_file(&path).unwrap();
        let took = wait_for(&path, &expected, Duration::from_secs(1));
        eprintln!("deleted file restored after {took:?}");

        // What Cilium's cni.exclusive does to configs that are not its own.
        fs::rename(&path, node.conf.join("00-cni-guard.conflist.cilium_bak")).unwrap();
        let took = wait_for(&path, &expected, Duration::from_secs(1));
        eprintln!("renamed file restored after {took:?}");

        // A careless installer writing over it in place.
        fs::write(
            &path,
            b"{\"cniVersion\":\"1.0.0\",\"name\":\"other\",\"plugins\":[]}",
        )
        .unwrap();
        let took = wait_for(&path, &expected, Duration::from_secs(1));
        eprintln!("rewritten file restored after {took:?}");

        keeper.wait_log("restored", 3);
        let before = set_old_mtime(&path);
        let (status, log) = keeper.terminate();
        assert!(
            status.success(),
            "keep exits 0 on SIGTERM: {status:?}\n{log}"
        );
        assert_eq!(fs::read(&path).unwrap(), expected, "file left in place");
        assert_eq!(mtime(&path), before, "file not touched on SIGTERM");
        assert_eq!(log.matches("restored").count(), 3, "{log}");
        assert!(log.contains("it was missing"), "{log}");
        assert!(log.contains("its content had changed"), "{log}");
        assert!(log.contains("SIGTERM: exiting"), "{log}");
        // The renamed copy stays where it was put; only our file is ours to manage.
        assert!(node.conf.join("00-cni-guard.conflist.cilium_bak").exists());
    }

    /// Cilium's cni.exclusive in the conf dir renames the guard's file to *.cilium_bak on every
    /// change it sees; keep restores it each time. Not silently: keep says it is a fight, names
    /// the renamed copy and the likely cause, once per 10 s however many rounds.
    #[test]
    fn says_so_when_another_writer_keeps_renaming_the_conflist_away() {
        let node = Node::new();
        let keeper = Keeper::start(&node);
        let path = node.conflist();
        keeper.wait_log("keeping ", 1);
        let bak = node.conf.join("00-cni-guard.conflist.cilium_bak");
        for round in 1..=5 {
            let start = Instant::now();
            while !path.exists() {
                assert!(
                    start.elapsed() < Duration::from_secs(5),
                    "round {round}: not restored"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
            fs::rename(&path, &bak).unwrap();
        }
        keeper.wait_log("restored", 5);
        keeper.wait_log("keeps being renamed away", 1);
        let (status, log) = keeper.terminate();
        assert!(status.success(), "{log}");
        assert_eq!(log.matches("keeps being renamed away").count(), 1, "{log}");
        assert!(
            log.contains("00-cni-guard.conflist.cilium_bak") && log.contains("cni.exclusive"),
            "{log}"
        );
    }

    #[test]
    fn warns_about_a_config_that_sorts_before_the_guard() {
        let node = Node::new();
        let keeper = Keeper::start(&node);
        let start = Instant::now();
        while !node.conflist().exists() {
            assert!(start.elapsed() < Duration::from_secs(5), "keep never wrote");
            std::thread::sleep(Duration::from_millis(5));
        }
        keeper.wait_log("keeping ", 1);
        fs::write(node.conf.join("00-aaa.conf"), "{}").unwrap();
        keeper.wait_log("00-aaa.conf sorts before 00-cni-guard.conflist", 1);
        let (status, log) = keeper.terminate();
        assert!(status.success());
        assert!(
            log.contains("00-aaa.conf sorts before 00-cni-guard.conflist"),
            "{log}"
        );
    }

    #[test]
    fn fails_when_the_conf_dir_is_missing() {
        let out = run(&[
            "keep",
            "--conf-dir=/nonexistent/cni-guard-test",
            "--delegate=/etc/cni/net.d/00-multus.conf",
        ]);
        assert_eq!(out.status.code(), Some(1));
        assert!(text(&out.stderr).contains("/nonexistent/cni-guard-test"));
    }
}

mod check {
    use super::*;

    /// A host root in a temp dir with the Multus + Cilium layout, the guard installed into it
    /// by host paths, and `check` run the way the readiness probe runs it (`--host-root`).
    struct Host {
        _tmp: tempfile::TempDir,
        root: PathBuf,
    }

    const DELEGATE: &str = "etc/cni/net.d/00-multus.conf";
    const ATTACHMENT: &str = "etc/cni/multus/net.d/05-cilium.conflist";

    impl Host {
        fn ready() -> Host {
            let tmp = tempfile::tempdir().unwrap();
            let root = tmp.path().to_path_buf();
            for dir in ["opt/cni/bin", "etc/cni/net.d", "etc/cni/multus/net.d"] {
                fs::create_dir_all(root.join(dir)).unwrap();
            }
            let host = Host { _tmp: tmp, root };
            let out = guard()
                .args([
                    "install",
                    &format!("--bin-dir={}", host.path("opt/cni/bin").display()),
                    &format!("--conf-dir={}", host.path("etc/cni/net.d").display()),
                    &format!("--delegate=/{DELEGATE}"),
                    &format!("--attachment=/{ATTACHMENT}"),
                ])
                .output()
                .unwrap();
            assert!(out.status.success(), "{}", text(&out.stderr));
            host.write(
                DELEGATE,
                r#"{"cniVersion":"0.3.1","name":"multus-cni-network","type":"multus-shim"}"#,
            );
            host.write(
                ATTACHMENT,
                r#"{"cniVersion":"0.3.1","name":"cilium","plugins":[{"type":"cilium-cni"}]}"#,
            );
            for plugin in ["multus-shim", "cilium-cni"] {
                let p = host.path("opt/cni/bin").join(plugin);
                fs::write(&p, "#!/bin/sh\nexit 0\n").unwrap();
                fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
            }
            host
        }

        fn path(&self, rel: &str) -> PathBuf {
            self.root.join(rel)
        }

        fn write(&self, rel: &str, body: &str) {
            let p = self.path(rel);
            fs::write(&p, body).unwrap();
            fs::set_permissions(&p, fs::Permissions::from_mode(0o644)).unwrap();
        }

        fn check(&self, extra: &[&str]) -> (Option<i32>, String) {
            let out = guard()
                .args([
                    "check",
                    &format!(
                        "--config={}",
                        self.path("etc/cni/net.d/00-cni-guard.conflist").display()
                    ),
                    &format!("--host-root={}", self.root.display()),
                ])
                .args(extra)
                .output()
                .unwrap();
            (out.status.code(), text(&out.stdout))
        }
    }

    /// A conflist whose DEL budget passes kubelet's StopPodSandbox deadline: check says so on
    /// a line of its own (a warning: readiness is not affected).
    #[test]
    fn warns_of_a_budget_past_kubelets_deadline() {
        let host = Host::ready();
        let conflist = host.path("etc/cni/net.d/00-cni-guard.conflist");
        let mut list: serde_json::Value =
            serde_json::from_slice(&fs::read(&conflist).unwrap()).unwrap();
        list["plugins"][0]["delegateTimeoutSeconds"] = 100.into();
        fs::write(&conflist, serde_json::to_vec(&list).unwrap()).unwrap();
        let (code, report) = host.check(&[]);
        assert_eq!(code, Some(0), "{report}");
        let warning = report
            .lines()
            .find(|l| l.starts_with("! budget"))
            .unwrap_or_else(|| panic!("no budget warning:\n{report}"));
        assert!(
            warning.contains("DEL") && warning.contains("120 s"),
            "{warning}"
        );
    }

    /// The layout before the first reboot: a configuration left beside the guard's and the
    /// delegate's is named as the fallback it is, without changing the verdict.
    #[test]
    fn names_a_fallback_configuration_left_in_the_conf_dir() {
        let host = Host::ready();
        host.write(
            "etc/cni/net.d/05-cilium.conflist",
            r#"{"cniVersion":"0.3.1","name":"cilium","plugins":[{"type":"cilium-cni"}]}"#,
        );
        let (code, report) = host.check(&[]);
        assert_eq!(code, Some(0), "{report}");
        assert_eq!(
            only_failure(&report, "fallback"),
            "✗ fallback   /etc/cni/net.d/05-cilium.conflist: containerd would use it if the delegate vanished"
        );
        assert!(
            report.ends_with("ready: ADD would proceed now\n"),
            "{report}"
        );
    }

    /// Multus's `clusterNetwork` (as Multus writes it, from inside its pod under /host) must be
    /// there and be the primary's, not the guard's.
    #[test]
    fn checks_that_multus_primary_is_there_and_not_the_guard() {
        let host = Host::ready();
        let multus = |cluster_network: &str| {
            host.write(
                DELEGATE,
                &format!(
                    r#"{{"cniVersion":"0.3.1","name":"multus-cni-network","type":"multus-shim","clusterNetwork":"{cluster_network}"}}"#
                ),
            )
        };
        multus("/host/etc/cni/multus/net.d/05-cilium.conflist");
        let (code, report) = host.check(&[]);
        assert_eq!(code, Some(0), "{report}");
        assert!(
            report.contains(
                "✓ primary    Multus's clusterNetwork /etc/cni/multus/net.d/05-cilium.conflist exists"
            ),
            "{report}"
        );
        multus("/host/etc/cni/multus/net.d/07-gone.conflist");
        let (_, report) = host.check(&[]);
        assert_eq!(
            only_failure(&report, "primary"),
            "✗ primary    Multus's clusterNetwork \"/host/etc/cni/multus/net.d/07-gone.conflist\" does not exist here"
        );
    }

    /// The one line for `check`, asserting there is exactly one failing line and it is it.
    fn only_failure<'a>(report: &'a str, check: &str) -> &'a str {
        let failing: Vec<&str> = report.lines().filter(|l| l.starts_with('✗')).collect();
        assert_eq!(failing.len(), 1, "{report}");
        assert!(
            failing[0].starts_with(&format!("✗ {check} ")),
            "expected {check} to fail:\n{report}"
        );
        failing[0]
    }

    #[test]
    fn ready_exits_0_with_a_tick_for_every_precondition() {
        let host = Host::ready();
        let (code, report) = host.check(&[]);
        assert_eq!(code, Some(0), "{report}");
        let lines: Vec<&str> = report.lines().collect();
        assert_eq!(
            lines,
            [
                "  CNI_PATH by default (no --cni-path, no CNI_PATH): /opt/cni/bin",
                "✓ delegate   /etc/cni/net.d/00-multus.conf",
                "✓ attachment /etc/cni/multus/net.d/05-cilium.conflist",
                "✓ plugin     \"cilium-cni\" at /opt/cni/bin/cilium-cni",
                "✓ plugin     \"multus-shim\" at /opt/cni/bin/multus-shim",
                "✓ recursion  no configuration that loaded names \"cni-guard\"",
                "✓ first      /etc/cni/net.d/00-cni-guard.conflist sorts first in /etc/cni/net.d",
                "✓ fallback   no other configuration in /etc/cni/net.d",
                "ready: ADD would proceed now",
            ]
        );
        assert!(
            !report.contains(host.root.to_str().unwrap()),
            "host paths shown, not the pod's mount points"
        );
    }

    #[test]
    fn a_missing_delegate_fails_with_code_11() {
        let host = Host::ready();
        fs::remove_file(host.path(DELEGATE)).unwrap();
        let (code, report) = host.check(&[]);
        assert_eq!(code, Some(1));
        // Without the delegate its plugin types are unknown: no plugin line for multus-shim.
        assert_eq!(
            only_failure(&report, "delegate"),
            "✗ delegate   /etc/cni/net.d/00-multus.conf: does not exist"
        );
        let last = report.lines().last().unwrap();
        assert!(
            last.starts_with("not ready: ADD would be refused with CNI error 11 (try again later)"),
            "{last}"
        );
        assert!(last.contains("/etc/cni/net.d/00-multus.conf"), "{last}");
    }

    /// `install --delegate-writer`: the conflist carries `delegateWriter`, and `check` (like
    /// ADD) says who writes the missing delegate; a name that cannot be said is a usage error.
    #[test]
    fn a_missing_delegate_names_its_writer_given_to_install() {
        let host = Host::ready();
        let install = |writer: &str| {
            guard()
                .args([
                    "install",
                    &format!("--bin-dir={}", host.path("opt/cni/bin").display()),
                    &format!("--conf-dir={}", host.path("etc/cni/net.d").display()),
                    &format!("--delegate=/{DELEGATE}"),
                    &format!("--attachment=/{ATTACHMENT}"),
                    "--delegate-writer",
                    writer,
                ])
                .output()
                .unwrap()
        };
        let out = install("Multus");
        assert!(out.status.success(), "{}", text(&out.stderr));
        let conflist: serde_json::Value = serde_json::from_slice(
            &fs::read(host.path("etc/cni/net.d/00-cni-guard.conflist")).unwrap(),
        )
        .unwrap();
        assert_eq!(conflist["plugins"][0]["delegateWriter"], "Multus");
        fs::remove_file(host.path(DELEGATE)).unwrap();
        let (code, report) = host.check(&[]);
        assert_eq!(code, Some(1));
        assert_eq!(
            only_failure(&report, "delegate"),
            "✗ delegate   /etc/cni/net.d/00-multus.conf: does not exist (written by Multus)"
        );
        assert_eq!(
            report.lines().last().unwrap(),
            "not ready: ADD would be refused with CNI error 11 (try again later): \
             cni-guard: network not ready: delegate /etc/cni/net.d/00-multus.conf does not exist \
             (written by Multus)"
        );
        for bad in ["", "Mul\ntus"] {
            let out = install(bad);
            assert_eq!(out.status.code(), Some(2), "{bad:?}");
            assert!(
                text(&out.stderr).contains("--delegate-writer: delegateWriter"),
                "{}",
                text(&out.stderr)
            );
        }
    }

    /// keep logs each change of readiness, the first at start, as `check` sees it: here without
    /// metrics (its own thread checks once a second). The log is the only synchronisation.
    #[test]
    fn keep_logs_each_readiness_change() {
        let host = Host::ready();
        let keeper = super::keep::Keeper::spawn(&[
            "keep".to_owned(),
            format!("--conf-dir={}", host.path("etc/cni/net.d").display()),
            format!("--delegate=/{DELEGATE}"),
            format!("--attachment=/{ATTACHMENT}"),
            "--delegate-writer=Multus".to_owned(),
            format!("--host-root={}", host.root.display()),
            "--cni-path=/opt/cni/bin".to_owned(),
        ]);
        let ready = "cni-guard keep: ready: ADD would proceed (delegate /etc/cni/net.d/00-multus.conf, \
            attachment /etc/cni/multus/net.d/05-cilium.conflist, plugins \"cilium-cni\", \"multus-shim\")\n";
        keeper.wait_log(ready, 1);
        // Multus goes away: its file is deleted.
        let multus = fs::read(host.path(DELEGATE)).unwrap();
        fs::remove_file(host.path(DELEGATE)).unwrap();
        let missing = "cni-guard keep: not ready: delegate /etc/cni/net.d/00-multus.conf does not \
            exist (written by Multus); ADD answers 11 (try again later)\n";
        keeper.wait_log(missing, 1);
        // Back, but Cilium's binary is gone meanwhile: a change of reason is logged too.
        fs::remove_file(host.path("opt/cni/bin/cilium-cni")).unwrap();
        // Written whole (a rename), as Multus writes it: no check sees half a file.
        let tmp = host.path("etc/cni/net.d/.00-multus.conf.tmp");
        fs::write(&tmp, &multus).unwrap();
        fs::rename(&tmp, host.path(DELEGATE)).unwrap();
        let no_plugin = "cni-guard keep: not ready: plugin \"cilium-cni\" is not in CNI_PATH \
            /opt/cni/bin; ADD answers 11 (try again later)\n";
        keeper.wait_log(no_plugin, 1);
        // The binary comes back whole and executable (a rename, as an installer does).
        let tmp = host.path("opt/cni/bin/.cilium-cni.tmp");
        fs::write(&tmp, "#!/bin/sh\nexit 0\n").unwrap();
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755)).unwrap();
        fs::rename(&tmp, host.path("opt/cni/bin/cilium-cni")).unwrap();
        keeper.wait_log(ready, 2);
        let (status, log) = keeper.terminate();
        assert!(status.success(), "{log}");
        // Each state once per change, in order; nothing logged while nothing changed.
        let states: Vec<&str> = log
            .lines()
            .filter(|l| {
                l.starts_with("cni-guard keep: ready: ")
                    || l.starts_with("cni-guard keep: not ready: ")
            })
            .collect();
        assert_eq!(
            states,
            [ready, missing, no_plugin, ready].map(str::trim_end),
            "{log}"
        );
        assert_eq!(fs::read(host.path(DELEGATE)).unwrap(), multus);
    }

    #[test]
    fn a_missing_or_broken_attachment_fails() {
        let host = Host::ready();
        fs::remove_file(host.path(ATTACHMENT)).unwrap();
        let (code, report) = host.check(&[]);
        assert_eq!(code, Some(1));
        assert!(only_failure(&report, "attachment")
            .starts_with("✗ attachment /etc/cni/multus/net.d/05-cilium.conflist: does not exist"));

        host.write(ATTACHMENT, r#"{"cniVersion":"0.3.1","name":"cil"#);
        let (code, report) = host.check(&[]);
        assert_eq!(code, Some(1));
        assert!(
            only_failure(&report, "attachment").contains("not valid JSON"),
            "{report}"
        );
    }

    #[test]
    fn a_missing_plugin_binary_fails() {
        let host = Host::ready();
        fs::remove_file(host.path("opt/cni/bin/cilium-cni")).unwrap();
        let (code, report) = host.check(&[]);
        assert_eq!(code, Some(1));
        let line = only_failure(&report, "plugin");
        assert!(line.starts_with("✗ plugin     \"cilium-cni\": "), "{line}");
        assert!(line.contains("/opt/cni/bin"), "{line}");
        assert!(!line.contains(host.root.to_str().unwrap()), "{line}");
        // The summary is ADD's own message, which names the type once.
        let last = report.lines().last().unwrap();
        assert!(
            last.ends_with(
                "cni-guard: network not ready: plugin \"cilium-cni\" is not in CNI_PATH /opt/cni/bin"
            ),
            "{last}"
        );
    }

    #[test]
    fn takes_cni_path_from_the_environment_unless_given_and_says_which() {
        let host = Host::ready();
        // The plugins move to where only CNI_PATH points.
        fs::create_dir_all(host.path("usr/lib/cni")).unwrap();
        for plugin in ["multus-shim", "cilium-cni"] {
            fs::rename(
                host.path("opt/cni/bin").join(plugin),
                host.path("usr/lib/cni").join(plugin),
            )
            .unwrap();
        }
        let check = |env: Option<&str>, extra: &[&str]| {
            let mut cmd = guard();
            cmd.args([
                "check",
                &format!(
                    "--config={}",
                    host.path("etc/cni/net.d/00-cni-guard.conflist").display()
                ),
                &format!("--host-root={}", host.root.display()),
            ])
            .args(extra);
            if let Some(value) = env {
                cmd.env("CNI_PATH", value);
            }
            let out = cmd.output().unwrap();
            (out.status.code(), text(&out.stdout))
        };

        let (code, report) = check(Some("/usr/lib/cni:/opt/cni/bin"), &[]);
        assert_eq!(code, Some(0), "{report}");
        assert_eq!(
            report.lines().next().unwrap(),
            "  CNI_PATH from the environment: /usr/lib/cni:/opt/cni/bin"
        );
        assert!(
            report.contains("\"cilium-cni\" at /usr/lib/cni/cilium-cni"),
            "{report}"
        );

        // --cni-path wins over the environment.
        let (code, report) = check(Some("/usr/lib/cni"), &["--cni-path=/opt/cni/bin"]);
        assert_eq!(code, Some(1), "{report}");
        assert_eq!(
            report.lines().next().unwrap(),
            "  CNI_PATH from --cni-path: /opt/cni/bin"
        );

        // Neither, or an empty CNI_PATH: the default.
        for env in [None, Some("")] {
            let (code, report) = check(env, &[]);
            assert_eq!(code, Some(1), "{report}");
            assert!(
                report.starts_with(
                    "  CNI_PATH by default (no --cni-path, no CNI_PATH): /opt/cni/bin\n"
                ),
                "{report}"
            );
        }

        let (code, out) = check(Some("/usr/lib/cni"), &["--json"]);
        assert_eq!(code, Some(0), "{out}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(
            v["cniPath"],
            serde_json::json!({"dirs": ["/usr/lib/cni"], "from": "environment"})
        );
    }

    #[test]
    fn a_delegate_that_names_the_guard_is_recursion_code_7() {
        let host = Host::ready();
        host.write(
            DELEGATE,
            r#"{"cniVersion":"1.0.0","name":"loop","type":"cni-guard"}"#,
        );
        let (code, report) = host.check(&[]);
        assert_eq!(code, Some(1));
        let failing: Vec<&str> = report.lines().filter(|l| l.starts_with('✗')).collect();
        assert_eq!(failing.len(), 2, "{report}");
        assert!(failing[0].starts_with("✗ delegate   /etc/cni/net.d/00-multus.conf: names"));
        assert!(failing[1].starts_with("✗ recursion  /etc/cni/net.d/00-multus.conf"));
        assert!(report
            .lines()
            .last()
            .unwrap()
            .starts_with("not ready: ADD would be refused with CNI error 7 (misconfigured)"));
    }

    /// Multus's auto-config in the conf dir elected the guard's file as its cluster network
    /// (`/host/...`: the path inside the Multus pod).
    #[test]
    fn a_multus_cluster_network_that_is_the_guard_is_recursion_code_7() {
        let host = Host::ready();
        host.write(
            DELEGATE,
            r#"{"cniVersion":"1.0.0","name":"multus-cni-network","clusterNetwork":"/host/etc/cni/net.d/00-cni-guard.conflist","type":"multus-shim","logToStderr":true}"#,
        );
        let (code, report) = host.check(&[]);
        assert_eq!(code, Some(1), "{report}");
        let reason = "has Multus's clusterNetwork \"/host/etc/cni/net.d/00-cni-guard.conflist\", which is a cni-guard configuration (/etc/cni/net.d/00-cni-guard.conflist): Multus would run the guard for the primary network; pin \"multusMasterCNI\" in Multus's daemon config to the primary network's file, or point multusAutoconfigDir at a folder without the guard's file";
        let failing: Vec<&str> = report.lines().filter(|l| l.starts_with('✗')).collect();
        assert_eq!(
            failing,
            [
                format!("✗ delegate   /etc/cni/net.d/00-multus.conf: {reason}"),
                format!("✗ recursion  /etc/cni/net.d/00-multus.conf: {reason}"),
            ],
            "{report}"
        );
        assert!(
            !report.contains(host.root.to_str().unwrap()),
            "host paths shown, not the pod's mount points:\n{report}"
        );
        assert_eq!(
            report.lines().last().unwrap(),
            format!("not ready: ADD would be refused with CNI error 7 (misconfigured): cni-guard is misconfigured: delegate /etc/cni/net.d/00-multus.conf {reason}")
        );
        let (_, out) = host.check(&["--json"]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["code"], 7);
        let item = v["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["check"] == "recursion")
            .unwrap();
        assert_eq!(item["ok"], false);
        assert_eq!(item["reason"], reason);

        // Pinned to the primary network's file: ready again.
        host.write(
            DELEGATE,
            r#"{"cniVersion":"1.0.0","name":"multus-cni-network","clusterNetwork":"/host/etc/cni/multus/net.d/05-cilium.conflist","type":"multus-shim"}"#,
        );
        let (code, report) = host.check(&[]);
        assert_eq!(code, Some(0), "{report}");
    }

    #[test]
    fn a_config_sorting_before_the_guard_fails() {
        let host = Host::ready();
        host.write("etc/cni/net.d/00-aaa.conf", "{}");
        let (code, report) = host.check(&[]);
        assert_eq!(code, Some(1));
        assert!(
            report.contains(
                "✗ first      /etc/cni/net.d/00-cni-guard.conflist: 00-aaa.conf sorts before it"
            ),
            "{report}"
        );
        // It is a fallback too: containerd's choice if the guard's file and the delegate went.
        assert!(
            report.contains("✗ fallback   /etc/cni/net.d/00-aaa.conf: containerd would use it"),
            "{report}"
        );
        assert!(
            report.contains("not ready: the guard is not in force"),
            "{report}"
        );
    }

    #[test]
    fn a_missing_guard_conflist_fails() {
        let host = Host::ready();
        fs::remove_file(host.path("etc/cni/net.d/00-cni-guard.conflist")).unwrap();
        let (code, report) = host.check(&[]);
        assert_eq!(code, Some(1));
        assert!(only_failure(&report, "config")
            .starts_with("✗ config     /etc/cni/net.d/00-cni-guard.conflist: cannot read"));
    }

    #[test]
    fn json_carries_the_same_verdict() {
        let host = Host::ready();
        let (code, out) = host.check(&["--json"]);
        assert_eq!(code, Some(0));
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["ready"], true);
        assert_eq!(v["items"].as_array().unwrap().len(), 7);

        fs::remove_file(host.path("opt/cni/bin/multus-shim")).unwrap();
        let (code, out) = host.check(&["--json"]);
        assert_eq!(code, Some(1));
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["ready"], false);
        assert_eq!(v["code"], 11);
        let failed: Vec<&serde_json::Value> = v["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|i| i["ok"] == false)
            .collect();
        assert_eq!(failed.len(), 1, "{out}");
        assert_eq!(failed[0]["check"], "plugin");
        assert_eq!(failed[0]["type"], "multus-shim");
    }

    #[test]
    fn without_host_root_paths_are_taken_as_they_are() {
        let host = Host::ready();
        // A conflist naming the temp paths directly, beside the installed one.
        let dir = tempfile::tempdir().unwrap();
        let conflist = dir.path().join("00-cni-guard.conflist");
        fs::write(
            &conflist,
            serde_json::json!({"cniVersion":"1.0.0","name":"g","plugins":[{"type":"cni-guard",
                "delegate": host.path(DELEGATE), "attachments": [host.path(ATTACHMENT)]}]})
            .to_string(),
        )
        .unwrap();
        let out = run(&[
            "check",
            &format!("--config={}", conflist.display()),
            &format!("--cni-path={}", host.path("opt/cni/bin").display()),
        ]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
        assert!(text(&out.stdout).contains(&host.path(DELEGATE).display().to_string()));
        assert_eq!(
            run(&["check"]).status.code(),
            Some(2),
            "--config is required"
        );
    }
}

mod cli {
    use super::*;

    /// The commit a build of this checkout names, found independently of build.rs: git's HEAD
    /// when the workspace is a checkout, else CNI_GUARD_COMMIT, else `unknown`.
    fn expected_commit() -> String {
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let git = Command::new("git")
            .arg("-C")
            .arg(workspace)
            .args(["rev-parse", "HEAD"])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| text(&o.stdout).trim().to_owned());
        let id = git.or_else(|| std::env::var("CNI_GUARD_COMMIT").ok());
        match id {
            Some(id) if id.len() >= 12 => id[..12].to_ascii_lowercase(),
            _ => "unknown".to_owned(),
        }
    }

    #[test]
    fn version_is_the_crate_version_and_the_commit() {
        let out = run(&["--version"]);
        assert!(out.status.success());
        assert_eq!(
            text(&out.stdout),
            format!(
                "cni-guard-agent {} (commit {})\n",
                env!("CARGO_PKG_VERSION"),
                expected_commit()
            )
        );
        assert!(out.stderr.is_empty(), "{}", text(&out.stderr));
        // The CNI spec versions moved to --help.
        let help = text(&run(&["--help"]).stdout);
        for v in ["0.4.0", "1.0.0", "1.1.0"] {
            assert!(help.contains(v), "{help}");
        }
    }

    #[test]
    fn every_command_has_help_and_unknown_ones_fail_with_2() {
        for cmd in ["install", "uninstall", "keep", "check"] {
            let out = run(&[cmd, "--help"]);
            assert!(out.status.success(), "{cmd} --help");
            assert!(
                text(&out.stdout).contains(&format!("cni-guard-agent {cmd}")),
                "{cmd}: {}",
                text(&out.stdout)
            );
        }
        assert!(text(&run(&["--help"]).stdout).contains("cni-guard-agent keep"));
        assert_eq!(run(&["frobnicate"]).status.code(), Some(2));
        assert_eq!(run(&[]).status.code(), Some(2));
    }
}

fn which(program: &str) -> PathBuf {
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join(program))
                .find(|p| p.is_file())
        })
        .unwrap_or_else(|| panic!("{program} not found in PATH"))
}
