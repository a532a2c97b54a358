//! cni-guard under faults. Run by `scripts/test.d/50-hardening.sh`:
//!
//! ```text
//! CNI_GUARD_BIN=target/release/cni-guard cargo test --release -p faults -- --ignored --test-threads=1
//! ```
//!
//! The suites that make real attachments (bridge + host-local from /usr/lib/cni) do so from a
//! "host" network namespace they create, into a "container" namespace they create; both are
//! deleted afterwards, also when an assertion fails (drop guards). Without root they skip
//! loudly; under `CI=true` they fail. `FAULTS_SEED` replays a run's random choices;
//! `FAULTS_KILLS` and `FAULTS_RACES` shorten the loops for a quick local look.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use faults::*;
use serde_json::{json, Value};

const LIMIT: Duration = Duration::from_secs(60);

/// A guard network whose delegate is a bridge with host-local IPAM, run from a host namespace
/// into a container namespace, with the guard's cache and host-local's leases in a temp dir.
struct BridgeNet {
    tmp: tempfile::TempDir,
    bin: PathBuf,
    ctr_path: String,
    host: Netns,
    ctr: Netns,
}

impl BridgeNet {
    /// `bridge` is what the delegate type `bridge` resolves to in CNI_PATH.
    fn new(bridge: impl FnOnce(&Path)) -> BridgeNet {
        let tmp = tempfile::tempdir().unwrap();
        let ctr = Netns::new("cg-faults-ctr");
        let net = BridgeNet {
            bin: tmp.path().join("bin"),
            ctr_path: ctr.path().display().to_string(),
            host: Netns::new("cg-faults-host"),
            ctr,
            tmp,
        };
        std::fs::create_dir(net.bin()).unwrap();
        std::fs::create_dir(net.path("net.d")).unwrap();
        bridge(&net.bin());
        std::os::unix::fs::symlink(
            Path::new(REFERENCE_PLUGINS).join("host-local"),
            net.bin().join("host-local"),
        )
        .unwrap();
        let conf = json!({"cniVersion":"1.0.0","name":"faultnet","type":"bridge",
            "bridge":"cgfaults0","isGateway":true,
            "ipam":{"type":"host-local","subnet":"10.251.0.0/24","dataDir": net.path("ipam")}});
        std::fs::write(net.delegate(), conf.to_string()).unwrap();
        net
    }

    fn path(&self, p: &str) -> PathBuf {
        self.tmp.path().join(p)
    }
    fn bin(&self) -> PathBuf {
        self.bin.clone()
    }
    fn delegate(&self) -> PathBuf {
        self.path("net.d/00-multus.conf")
    }
    fn records_dir(&self) -> PathBuf {
        self.path("cache/guarded")
    }

    fn config(&self, version: &str) -> Value {
        json!({"cniVersion": version, "name":"guarded","type":"cni-guard",
               "delegate": self.delegate(), "cacheDir": self.path("cache")})
    }

    fn invocation<'a>(
        &'a self,
        command: &'a str,
        container: &'a str,
        config: &'a Value,
    ) -> Invocation<'a> {
        Invocation {
            command,
            container,
            ifname: "eth0",
            netns: &self.ctr_path,
            cni_path: &self.bin,
            config,
            host: Some(&self.host),
            extra_env: Vec::new(),
        }
    }

    /// Leases host-local holds (file name = address, content = container ID, ifname).
    fn leases(&self) -> Vec<(String, String)> {
        let dir = self.path("ipam/faultnet");
        names(&dir)
            .into_iter()
            .filter(|n| n != "lock" && !n.starts_with("last_reserved_ip"))
            .map(|n| {
                let content = std::fs::read_to_string(dir.join(&n)).unwrap_or_default();
                (n, content)
            })
            .collect()
    }

    fn veths(&self) -> Vec<String> {
        self.host.links(&["type", "veth"])
    }

    fn ctr_has_eth0(&self) -> bool {
        !self.ctr.links(&["dev", "eth0"]).is_empty()
    }

    /// Asserts the attachment is completely gone: no lease, no veth, no record, no temp file.
    fn assert_clean(&self, what: &str) {
        assert!(
            names(&self.records_dir()).is_empty(),
            "{what}: files left in the cache dir: {:?}",
            names(&self.records_dir())
        );
        assert!(
            self.veths().is_empty(),
            "{what}: veths left: {:?}",
            self.veths()
        );
        assert!(!self.ctr_has_eth0(), "{what}: eth0 left in the container");
        assert!(
            self.leases().is_empty(),
            "{what}: leases left: {:?}",
            self.leases()
        );
    }

    /// Every record file that exists is whole: a reader never sees a torn one.
    fn assert_records_whole(&self, what: &str) {
        for n in names(&self.records_dir()) {
            if n.starts_with('.') {
                continue; // a temp file: never read by anyone but its writer
            }
            let bytes = std::fs::read(self.records_dir().join(&n)).unwrap_or_default();
            if bytes.is_empty() {
                continue; // a lock placeholder, never taken for a record
            }
            let v: Value = serde_json::from_slice(&bytes)
                .unwrap_or_else(|e| panic!("{what}: torn record {n}: {e}"));
            assert!(
                v["delegate"].is_object(),
                "{what}: record {n} without delegate"
            );
        }
    }
}

fn link_reference_bridge(bin: &Path) {
    std::os::unix::fs::symlink(
        Path::new(REFERENCE_PLUGINS).join("bridge"),
        bin.join("bridge"),
    )
    .unwrap();
}

const BRIDGE_TOOLS: &[&str] = &[
    "ip",
    "mount",
    "/usr/lib/cni/bridge",
    "/usr/lib/cni/host-local",
];

/// SIGKILL the guard at random points of ADD and DEL; the next invocation (a DEL) must leave
/// no lease, veth, record, temp file or placeholder. Half the runs use a guard version equal to
/// the delegate's (the guard execs the bridge: the kill lands in the plugin), half a different
/// one (the bridge is the guard's child and dies with it).
#[test]
#[ignore = "root-only fault suite: run by scripts/test.d/50-hardening.sh"]
fn killed_mid_flight() {
    if !can_run("killed_mid_flight", true, BRIDGE_TOOLS) {
        return;
    }
    let net = BridgeNet::new(link_reference_bridge);
    let mut rng = Rng::new("killed_mid_flight");
    let rounds = iterations("FAULTS_KILLS", 200);

    // Calibrate: how long a whole ADD and DEL take here, so kills land inside them.
    let conf = net.config("1.0.0");
    let t = Instant::now();
    net.invocation("ADD", "calibrate", &conf).run(LIMIT).ok();
    let add_time = t.elapsed();
    let t = Instant::now();
    net.invocation("DEL", "calibrate", &conf).run(LIMIT).ok();
    let del_time = t.elapsed();
    net.assert_clean("calibration");
    eprintln!("killed_mid_flight: ADD takes {add_time:?}, DEL {del_time:?}");

    let (mut killed, mut finished, mut partial_leases) = (0, 0, 0);
    for i in 0..rounds {
        let container = format!("kill{i}");
        let version = if i % 2 == 0 { "1.0.0" } else { "0.4.0" };
        let conf = net.config(version);
        let verb = if rng.below(2) == 0 { "ADD" } else { "DEL" };
        if verb == "DEL" {
            net.invocation("ADD", &container, &conf).run(LIMIT).ok();
        }
        let span = if verb == "ADD" { add_time } else { del_time };
        let delay = Duration::from_micros(rng.below(span.as_micros() as u64));
        let child = net.invocation(verb, &container, &conf).spawn();
        std::thread::sleep(delay);
        // SAFETY: kill with a pid we spawned and have not reaped.
        unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
        let out = wait(child, LIMIT);
        if out.signal == Some(libc::SIGKILL) {
            killed += 1;
        } else {
            finished += 1;
        }
        let what = format!("round {i} ({verb} at {delay:?}, guard {version})");
        net.assert_records_whole(&what);

        // The next invocation: the runtime's DEL.
        let del = net.invocation("DEL", &container, &conf).run(LIMIT);
        assert_eq!(
            del.status,
            Some(0),
            "{what}: DEL failed: {} {}",
            del.stdout,
            del.stderr
        );
        // host-local writes a lease by create-then-write: a kill between the two leaves an
        // empty lease file that no DEL can match to its container. That is the reference
        // plugin's, counted and removed here, not the guard's.
        for (addr, content) in net.leases() {
            if content.is_empty() {
                partial_leases += 1;
                let _ = std::fs::remove_file(net.path("ipam/faultnet").join(addr));
            }
        }
        net.assert_clean(&what);
    }
    eprintln!(
        "killed_mid_flight: {rounds} rounds, {killed} killed mid-flight, {finished} finished before the kill, {partial_leases} empty host-local lease files; every DEL after left nothing"
    );
    assert!(
        killed >= rounds / 4,
        "too few kills landed mid-flight: {killed}"
    );
}

/// Same container, same interface, ADD and DEL racing. The delegate records the verbs it
/// completed, in the order they completed (it runs under the guard's attachment lock, so that is
/// the order the guard serialised them in); the end state must be that of the last one, and no
/// reader ever sees a torn record.
#[test]
#[ignore = "root-only fault suite: run by scripts/test.d/50-hardening.sh"]
fn same_container_race() {
    if !can_run("same_container_race", true, BRIDGE_TOOLS) {
        return;
    }
    let net = BridgeNet::new(|bin| {
        script(
            bin,
            "bridge",
            &format!(
                "out=$({}/bridge); rc=$?\n[ $rc -eq 0 ] && echo \"$CNI_COMMAND\" >> \"$RACE_LOG\"\nprintf '%s' \"$out\"\nexit $rc",
                REFERENCE_PLUGINS
            ),
        );
    });
    let log = net.path("race.log");
    let mut rng = Rng::new("same_container_race");
    let rounds = iterations("FAULTS_RACES", 1000);
    let env = vec![("RACE_LOG", log.display().to_string())];

    // The record dir exists from here on (a DEL without one takes no lock).
    let conf = net.config("1.0.0");
    let mut first = net.invocation("ADD", "race", &conf);
    first.extra_env = env.clone();
    first.run(LIMIT).ok();
    let mut del = net.invocation("DEL", "race", &conf);
    del.extra_env = env.clone();
    del.run(LIMIT).ok();
    net.assert_clean("setup");

    // A reader that keeps reading the record while the verbs race.
    let stop = Arc::new(AtomicBool::new(false));
    let record = net.records_dir().join("race:eth0.json");
    let reader = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let (mut reads, mut torn) = (0u64, Vec::new());
            while !stop.load(Ordering::Relaxed) {
                if let Ok(bytes) = std::fs::read(&record) {
                    reads += 1;
                    if !bytes.is_empty() && serde_json::from_slice::<Value>(&bytes).is_err() {
                        torn.push(String::from_utf8_lossy(&bytes).into_owned());
                    }
                }
                std::thread::yield_now();
            }
            (reads, torn)
        })
    };

    let (mut add_last, mut del_last) = (0, 0);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        for i in 0..rounds {
            std::fs::write(&log, "").unwrap();
            let version = if i % 2 == 0 { "1.0.0" } else { "0.4.0" };
            let conf = net.config(version);
            let mut add = net.invocation("ADD", "race", &conf);
            add.extra_env = env.clone();
            let mut del = net.invocation("DEL", "race", &conf);
            del.extra_env = env.clone();
            let gap = Duration::from_micros(rng.below(3000));
            let (a, d) = if rng.below(2) == 0 {
                let a = add.spawn();
                std::thread::sleep(gap);
                (a, del.spawn())
            } else {
                let d = del.spawn();
                std::thread::sleep(gap);
                (add.spawn(), d)
            };
            let what = format!("round {i} (guard {version})");
            let a = wait(a, LIMIT);
            let d = wait(d, LIMIT);
            assert_eq!(a.status, Some(0), "{what}: ADD: {} {}", a.stdout, a.stderr);
            assert_eq!(d.status, Some(0), "{what}: DEL: {} {}", d.stdout, d.stderr);
            let verbs: Vec<String> = std::fs::read_to_string(&log)
                .unwrap()
                .lines()
                .map(str::to_owned)
                .collect();
            assert_eq!(verbs.len(), 2, "{what}: delegate runs {verbs:?}");
            let files = names(&net.records_dir());
            if verbs[1] == "ADD" {
                add_last += 1;
                assert_eq!(files, ["race:eth0.json"], "{what}: ADD last");
                let rec: Value = serde_json::from_slice(
                    &std::fs::read(net.records_dir().join("race:eth0.json")).unwrap(),
                )
                .unwrap();
                assert_eq!(rec["containerID"], "race", "{what}");
                assert!(net.ctr_has_eth0(), "{what}: ADD last, but no eth0");
                assert_eq!(net.veths().len(), 1, "{what}: ADD last: {:?}", net.veths());
                let leases = net.leases();
                assert_eq!(leases.len(), 1, "{what}: ADD last: {leases:?}");
                assert!(leases[0].1.starts_with("race"), "{what}: {leases:?}");
                let mut clean = net.invocation("DEL", "race", &conf);
                clean.extra_env = env.clone();
                clean.run(LIMIT).ok();
            } else {
                del_last += 1;
            }
            net.assert_clean(&what);
        }
    }));
    stop.store(true, Ordering::Relaxed);
    let (reads, torn) = reader.join().unwrap();
    if let Err(p) = result {
        std::panic::resume_unwind(p);
    }
    eprintln!(
        "same_container_race: {rounds} rounds, ADD last {add_last}, DEL last {del_last}, {reads} concurrent record reads, {} torn",
        torn.len()
    );
    assert!(torn.is_empty(), "torn records read: {torn:?}");
}

/// The runtime kills the guard (its timeout) while the delegate runs: the delegate must not
/// live on. As a child (versions differ) it gets the parent-death signal; exec'd (same
/// version) it *is* the killed process.
#[test]
#[ignore = "fault suite: run by scripts/test.d/50-hardening.sh"]
fn runtime_gives_up() {
    if !can_run("runtime_gives_up", false, &["sh", "sleep"]) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let bin = tmp.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    script(&bin, "slow", "echo $$ > \"$PIDFILE\"\nexec sleep 120");
    for (guard_version, path) in [("1.0.0", "child"), ("0.4.0", "exec")] {
        let delegate = tmp.path().join("slow.conf");
        std::fs::write(
            &delegate,
            json!({"cniVersion":"0.4.0","name":"slow","type":"slow"}).to_string(),
        )
        .unwrap();
        let pidfile = tmp.path().join(format!("{path}.pid"));
        let conf = json!({"cniVersion": guard_version, "name":"guarded","type":"cni-guard",
            "delegate": delegate, "cacheDir": tmp.path().join("cache")});
        let inv = Invocation {
            command: "ADD",
            container: "slow1",
            ifname: "eth0",
            netns: "/run/netns/none",
            cni_path: &bin,
            config: &conf,
            host: None,
            extra_env: vec![("PIDFILE", pidfile.display().to_string())],
        };
        let child = inv.spawn();
        let guard_pid = child.id() as i32;
        assert!(
            eventually(Duration::from_secs(20), || std::fs::read_to_string(
                &pidfile
            )
            .is_ok_and(|s| s.ends_with('\n'))),
            "{path}: the delegate never started"
        );
        let delegate_pid: i32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(alive(delegate_pid));
        if path == "exec" {
            assert_eq!(
                delegate_pid, guard_pid,
                "exec'd: the delegate is the guard's process"
            );
        } else {
            assert_ne!(delegate_pid, guard_pid);
        }
        // SAFETY: kill with a pid we spawned and have not reaped.
        unsafe { libc::kill(guard_pid, libc::SIGKILL) };
        let out = wait(child, LIMIT);
        assert_eq!(out.signal, Some(libc::SIGKILL));
        assert!(
            eventually(Duration::from_secs(5), || !alive(delegate_pid)),
            "{path}: delegate {delegate_pid} outlived the killed guard"
        );
        eprintln!("runtime_gives_up: {path} path: delegate {delegate_pid} died with the guard");
    }
}

/// Delegates that crash, are killed, print garbage, print an error with status 0, or never
/// exit. Each runs as the guard's child (its version differs from the guard's), where the guard
/// reads what it printed.
#[test]
#[ignore = "fault suite: run by scripts/test.d/50-hardening.sh"]
fn misbehaving_delegates() {
    if !can_run("misbehaving_delegates", false, &["sh", "sleep"]) {
        return;
    }
    // ADD misbehaves; DEL (the guard's rollback) succeeds and is recorded.
    let cases: [(&str, &str, u64, &str); 5] = [
        (
            "crash",
            "cat >/dev/null; exit 2",
            999,
            "exited with status 2",
        ),
        ("segv", "kill -SEGV $$", 999, "killed by signal 11"),
        ("garbage", "echo 'this is not JSON'", 999, "not JSON"),
        (
            "error-with-status-0",
            "echo '{\"cniVersion\":\"0.4.0\",\"code\":11,\"msg\":\"not yet\"}'",
            11,
            "not yet",
        ),
        ("hang", "echo $$ > \"$PIDFILE\"; exec sleep 3600", 0, ""),
    ];
    for (name, add, want_code, want_msg) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let bin = tmp.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        let calls = tmp.path().join("calls");
        script(
            &bin,
            "bad",
            &format!(
                "echo \"$CNI_COMMAND\" >> {calls}\ncase \"$CNI_COMMAND\" in\nADD) {add} ;;\n*) cat >/dev/null ;;\nesac",
                calls = calls.display()
            ),
        );
        let delegate = tmp.path().join("bad.conf");
        std::fs::write(
            &delegate,
            json!({"cniVersion":"0.4.0","name":"bad","type":"bad"}).to_string(),
        )
        .unwrap();
        let pidfile = tmp.path().join("pid");
        let conf = json!({"cniVersion":"1.0.0","name":"guarded","type":"cni-guard",
            "delegate": delegate, "cacheDir": tmp.path().join("cache")});
        let inv = Invocation {
            command: "ADD",
            container: "bad1",
            ifname: "eth0",
            netns: "/run/netns/none",
            cni_path: &bin,
            config: &conf,
            host: None,
            extra_env: vec![("PIDFILE", pidfile.display().to_string())],
        };
        let records = tmp.path().join("cache/guarded");
        if name == "hang" {
            // The guard has no deadline of its own for a delegate: it waits as long as the
            // delegate runs, and the runtime's timeout (the CNI call's context; kubelet's
            // RunPodSandbox deadline) ends it by killing the guard. The delegate then dies with
            // it (parent-death signal), and the runtime's DEL cleans up with the record.
            let child = inv.spawn();
            let guard_pid = child.id() as i32;
            assert!(eventually(Duration::from_secs(20), || pidfile.exists()));
            std::thread::sleep(Duration::from_secs(2));
            let delegate_pid: i32 = std::fs::read_to_string(&pidfile)
                .unwrap()
                .trim()
                .parse()
                .unwrap();
            assert!(alive(guard_pid), "hang: the guard gave up by itself");
            assert!(alive(delegate_pid));
            // SAFETY: kill with a pid we spawned and have not reaped.
            unsafe { libc::kill(guard_pid, libc::SIGKILL) };
            wait(child, LIMIT);
            assert!(
                eventually(Duration::from_secs(5), || !alive(delegate_pid)),
                "hang: the delegate outlived the guard"
            );
            assert_eq!(
                names(&records),
                ["bad1:eth0.json"],
                "hang: the record stays for DEL"
            );
            let mut del = Invocation {
                command: "DEL",
                ..inv
            };
            del.extra_env = Vec::new();
            del.run(LIMIT).ok();
            assert!(names(&records).is_empty(), "hang: DEL removed the record");
            eprintln!(
                "misbehaving_delegates: hang: guard waits until killed; delegate died with it"
            );
            // With a bound of its own (delegateTimeoutSeconds), the guard kills the delegate
            // itself, answers 999 naming it, and rolls the attachment back.
            std::fs::remove_file(&pidfile).unwrap();
            let mut bounded_conf = conf.clone();
            bounded_conf["delegateTimeoutSeconds"] = json!(1);
            let bounded = Invocation {
                config: &bounded_conf,
                extra_env: vec![("PIDFILE", pidfile.display().to_string())],
                ..inv
            };
            let out = bounded.run(LIMIT);
            assert_eq!(
                out.status,
                Some(1),
                "hang-bounded: {} {}",
                out.stdout,
                out.stderr
            );
            let reply: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
            assert_eq!(reply["code"], 999, "hang-bounded: {reply}");
            assert!(
                reply["msg"]
                    .as_str()
                    .unwrap()
                    .contains("did not finish its ADD within"),
                "hang-bounded: {reply}"
            );
            let delegate_pid: i32 = std::fs::read_to_string(&pidfile)
                .unwrap()
                .trim()
                .parse()
                .unwrap();
            assert!(
                eventually(Duration::from_secs(5), || !alive(delegate_pid)),
                "hang-bounded: the delegate outlived its timeout"
            );
            assert!(
                names(&records).is_empty(),
                "hang-bounded: rolled back, no record"
            );
            eprintln!(
                "misbehaving_delegates: hang with delegateTimeoutSeconds=1: code 999, delegate killed, rolled back"
            );
            continue;
        }
        let out = inv.run(LIMIT);
        assert_eq!(out.status, Some(1), "{name}: {} {}", out.stdout, out.stderr);
        assert!(!out.stderr.contains("panicked"), "{name}: {}", out.stderr);
        let reply = out.json();
        assert_eq!(reply["code"], want_code, "{name}: {reply}");
        assert!(
            reply["msg"].as_str().unwrap().contains(want_msg),
            "{name}: {reply}"
        );
        let ran: Vec<String> = std::fs::read_to_string(&calls)
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect();
        assert_eq!(ran, ["ADD", "DEL"], "{name}: rolled back");
        assert!(
            names(&records).is_empty(),
            "{name}: after a clean rollback no record, temp or placeholder: {:?}",
            names(&records)
        );
        eprintln!("misbehaving_delegates: {name}: code {want_code}, rolled back, nothing left");
    }
}

/// A full, then read-only, cache dir (a tiny tmpfs): ADD fails with a clear error and leaves
/// no partial file; DEL still tears down with the record.
#[test]
#[ignore = "root-only fault suite: run by scripts/test.d/50-hardening.sh"]
fn full_and_read_only_cache_dir() {
    if !can_run(
        "full_and_read_only_cache_dir",
        true,
        &["mount", "umount", "sh"],
    ) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let bin = tmp.path().join("bin");
    let fake = tmp.path().join("fake");
    std::fs::create_dir(&bin).unwrap();
    std::fs::create_dir(&fake).unwrap();
    for ty in ["recorded", "current"] {
        std::os::unix::fs::symlink(fake_plugin(), bin.join(ty)).unwrap();
        std::fs::write(
            fake.join(format!("{ty}.ADD.out")),
            json!({"cniVersion":"0.4.0","ips":[{"version":"4","address":"10.9.0.2/24"}]})
                .to_string(),
        )
        .unwrap();
    }
    let delegate = tmp.path().join("00-multus.conf");
    let set_delegate = |ty: &str| {
        std::fs::write(
            &delegate,
            json!({"cniVersion":"0.4.0","name":"d","type":ty}).to_string(),
        )
        .unwrap()
    };
    set_delegate("recorded");
    let cache = Tmpfs::new(&tmp.path().join("cache"), "64k");
    let records = cache.dir.join("guarded");
    let conf = json!({"cniVersion":"1.0.0","name":"guarded","type":"cni-guard",
        "delegate": delegate, "cacheDir": cache.dir});
    let inv = |command: &'static str, container: &'static str| Invocation {
        command,
        container,
        ifname: "eth0",
        netns: "/run/netns/none",
        cni_path: &bin,
        config: &conf,
        host: None,
        extra_env: vec![("FAKE_DIR", fake.display().to_string())],
    };
    let calls = || -> Vec<String> {
        std::fs::read_to_string(fake.join("calls"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    };

    inv("ADD", "first").run(LIMIT).ok();
    assert_eq!(names(&records), ["first:eth0.json"]);

    // Full.
    let filler = cache.dir.join("filler");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&filler).unwrap();
        let chunk = vec![0u8; 4096];
        while f.write_all(&chunk).is_ok() {}
    }
    let out = inv("ADD", "second").run(LIMIT);
    assert_eq!(out.status, Some(1), "full: {} {}", out.stdout, out.stderr);
    let reply = out.json();
    assert_eq!(reply["code"], 5, "full: {reply}");
    assert!(
        reply["msg"]
            .as_str()
            .unwrap()
            .contains("No space left on device"),
        "{reply}"
    );
    assert_eq!(
        names(&records),
        ["first:eth0.json"],
        "full: no partial file"
    );
    assert_eq!(calls(), ["recorded ADD"], "full: the delegate did not run");
    set_delegate("current");
    inv("DEL", "first").run(LIMIT).ok();
    assert_eq!(
        calls(),
        ["recorded ADD", "recorded DEL"],
        "full: DEL with the record"
    );
    assert!(names(&records).is_empty(), "full: DEL removed the record");
    eprintln!(
        "full_and_read_only_cache_dir: full: ADD code 5 {:?}; DEL tore down",
        reply["msg"]
    );

    // Read-only.
    std::fs::remove_file(&filler).unwrap();
    set_delegate("recorded");
    inv("ADD", "third").run(LIMIT).ok();
    cache.remount_ro();
    let out = inv("ADD", "fourth").run(LIMIT);
    assert_eq!(out.status, Some(1), "ro: {} {}", out.stdout, out.stderr);
    let reply = out.json();
    assert_eq!(reply["code"], 5, "ro: {reply}");
    assert!(
        reply["msg"]
            .as_str()
            .unwrap()
            .contains("Read-only file system"),
        "{reply}"
    );
    assert_eq!(names(&records), ["third:eth0.json"], "ro: no partial file");
    set_delegate("current");
    let out = inv("DEL", "third").run(LIMIT).ok();
    assert_eq!(
        calls(),
        [
            "recorded ADD",
            "recorded DEL",
            "recorded ADD",
            "recorded DEL"
        ],
        "ro: DEL tore down with the record"
    );
    assert!(
        out.stderr.contains("the record stays"),
        "ro: {}",
        out.stderr
    );
    eprintln!(
        "full_and_read_only_cache_dir: read-only: ADD code 5 {:?}; DEL tore down (record kept)",
        reply["msg"]
    );
}

/// A delegate plugin stuck in uninterruptible sleep (it writes to a frozen file system, so
/// SIGKILL does not end it until the file system thaws): the guard kills its group at the
/// deadline and answers then, within a short grace, instead of waiting for the kernel to let the
/// plugin die. The plugin is reaped by whoever inherits it.
#[test]
#[ignore = "root-only fault suite: run by scripts/test.d/50-hardening.sh"]
fn a_delegate_in_uninterruptible_sleep() {
    if !can_run(
        "a_delegate_in_uninterruptible_sleep",
        true,
        &["mount", "umount", "mkfs.ext4", "fsfreeze", "truncate", "sh"],
    ) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let bin = tmp.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let image = tmp.path().join("fs.img");
    let mnt = tmp.path().join("frozen");
    std::fs::create_dir(&mnt).unwrap();
    for cmd in [
        vec!["truncate", "-s", "32M", image.to_str().unwrap()],
        vec!["mkfs.ext4", "-q", image.to_str().unwrap()],
        vec![
            "mount",
            "-o",
            "loop",
            image.to_str().unwrap(),
            mnt.to_str().unwrap(),
        ],
    ] {
        let st = std::process::Command::new(cmd[0])
            .args(&cmd[1..])
            .status()
            .unwrap();
        assert!(st.success(), "{cmd:?}");
    }
    struct Thaw(PathBuf);
    impl Drop for Thaw {
        fn drop(&mut self) {
            let _ = std::process::Command::new("fsfreeze")
                .arg("-u")
                .arg(&self.0)
                .status();
            std::thread::sleep(Duration::from_millis(200));
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(&self.0)
                .status();
        }
    }
    let thaw = Thaw(mnt.clone());
    let st = std::process::Command::new("fsfreeze")
        .arg("-f")
        .arg(&mnt)
        .status()
        .unwrap();
    assert!(st.success(), "fsfreeze -f");
    // Two plugins, so the guard runs them as its children; the first blocks in the kernel.
    script(
        &bin,
        "stuck",
        &format!("cat >/dev/null; echo x > '{}/file'", mnt.display()),
    );
    script(&bin, "second", "cat >/dev/null; echo '{}'");
    let delegate = tmp.path().join("00-multus.conflist");
    std::fs::write(
        &delegate,
        json!({"cniVersion":"1.0.0","name":"d","plugins":[{"type":"stuck"},{"type":"second"}]})
            .to_string(),
    )
    .unwrap();
    let conf = json!({"cniVersion":"1.0.0","name":"guarded","type":"cni-guard",
        "delegate": delegate, "cacheDir": tmp.path().join("cache"), "delegateTimeoutSeconds": 2});
    let start = Instant::now();
    let out = Invocation {
        command: "ADD",
        container: "stuck1",
        ifname: "eth0",
        netns: "/run/netns/none",
        cni_path: &bin,
        config: &conf,
        host: None,
        extra_env: vec![],
    }
    .run(LIMIT);
    let took = start.elapsed();
    let reply = out.json();
    assert_eq!(reply["code"], 999, "{reply}");
    assert!(
        reply["msg"].as_str().unwrap().contains("stuck"),
        "names the plugin: {reply}"
    );
    // The deadline (2 s, the rollback's share included) and a short grace: not the 10 s the
    // file system stays frozen.
    assert!(took < Duration::from_secs(5), "answered after {took:?}");
    std::thread::sleep(Duration::from_secs(10).saturating_sub(start.elapsed()));
    drop(thaw);
    eprintln!("a_delegate_in_uninterruptible_sleep: answered after {took:?}");
}
