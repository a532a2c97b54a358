//! `keep --metrics-address` and the plugin's decision counting, through the built binary: keep
//! serves `/metrics` on a loopback port with a temporary cache dir; the plugin refuses, execs
//! and fails; the counters are read back from a scrape. A corrupt or unwritable events file
//! never changes an ADD's outcome.
//!
//! With `METRICS_SCRAPE_OUT=FILE` the scrape taken during a refusal is saved there, for
//! `promtool check metrics` (scripts/test.d/47-metrics.sh).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

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

const RESULT: &str = r#"{"cniVersion":"1.0.0","interfaces":[{"name":"eth0"}],"ips":[{"address":"10.9.0.2/24","interface":0}]}"#;

struct Node {
    dir: tempfile::TempDir,
    /// The guard's cacheDir: `cache` in the node's folder unless a test moves it.
    cache: PathBuf,
}

impl Node {
    fn new() -> Node {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache");
        let node = Node { dir, cache };
        for d in ["net.d", "multus", "bin", "cache"] {
            std::fs::create_dir(node.path(d)).unwrap();
        }
        // The delegate's plugin: succeeds on ADD unless its configuration says "fail".
        node.script(
            "bin/fake",
            &format!(
                "#!/bin/sh\nif grep -q '\"fail\"' ; then echo '{{\"code\":7,\"msg\":\"told to fail\"}}'; exit 1; fi\n\
                 [ \"$CNI_COMMAND\" = ADD ] && printf '%s' '{RESULT}'\nexit 0\n"
            ),
        );
        node
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    fn script(&self, rel: &str, body: &str) {
        std::fs::write(self.path(rel), body).unwrap();
        std::fs::set_permissions(
            self.path(rel),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
    }

    fn delegate(&self) -> PathBuf {
        self.path("multus/00-multus.conflist")
    }

    /// One plugin: at the guard's version (1.0.0) the guard execs it; at another it runs it as
    /// a child.
    fn set_delegate(&self, fail: bool, version: &str) {
        let mut plugin = json!({"type": "fake"});
        if fail {
            plugin["fail"] = json!(true);
        }
        let list = json!({"cniVersion":version,"name":"multus","plugins":[plugin]});
        std::fs::write(self.delegate(), serde_json::to_vec(&list).unwrap()).unwrap();
    }

    fn flags(&self) -> Vec<String> {
        vec![
            format!("--conf-dir={}", self.path("net.d").display()),
            format!("--delegate={}", self.delegate().display()),
            format!("--cache-dir={}", self.cache.display()),
            // Refuse at once: these tests count refusals, not waits.
            "--wait-seconds=0".to_owned(),
        ]
    }

    /// The guard's entry as a runtime passes it, from the conflist keep wrote.
    fn guard_conf(&self) -> Vec<u8> {
        let list: Value = serde_json::from_slice(
            &std::fs::read(self.path("net.d/00-cni-guard.conflist")).unwrap(),
        )
        .unwrap();
        let mut entry = list["plugins"][0].clone();
        entry["name"] = list["name"].clone();
        entry["cniVersion"] = list["cniVersion"].clone();
        serde_json::to_vec(&entry).unwrap()
    }

    fn cni(&self, verb: &str, id: &str) -> i32 {
        self.cni_with(verb, id, &self.guard_conf())
    }

    /// The plugin for `verb` on container `id`, with `conf` on stdin.
    fn cni_with(&self, verb: &str, id: &str, conf: &[u8]) -> i32 {
        let bin = self.path("bin");
        let env: [(&str, Option<&std::ffi::OsStr>); 7] = [
            ("PATH", Some("/usr/bin:/bin".as_ref())),
            ("CNI_GUARD_SYSLOG", Some("/nonexistent".as_ref())),
            ("CNI_COMMAND", Some(verb.as_ref())),
            ("CNI_CONTAINERID", Some(id.as_ref())),
            ("CNI_NETNS", Some("/run/netns/x".as_ref())),
            ("CNI_IFNAME", Some("eth0".as_ref())),
            ("CNI_PATH", Some(bin.as_os_str())),
        ];
        let mut c = test_support::command(plugin_binary(), env);
        test_support::run(&mut c, conf).status.unwrap_or(-1)
    }
}

/// A running `keep --metrics-address 127.0.0.1:0` and the address it serves on.
struct Keep {
    child: Child,
    addr: String,
}

impl Keep {
    fn start(node: &Node) -> Keep {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_cni-guard-agent"))
            .env_remove("CNI_COMMAND")
            .arg("keep")
            .args(node.flags())
            .arg("--metrics-address=127.0.0.1:0")
            .arg(format!("--cni-path={}", node.path("bin").display()))
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let addr = loop {
            let line = lines.next().expect("keep exited").unwrap();
            if let Some(rest) = line.split("serving metrics on http://").nth(1) {
                break rest.split('/').next().unwrap().to_owned();
            }
        };
        // Keep draining keep's log so it never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Keep { child, addr }
    }

    fn scrape(&self) -> String {
        let mut s = TcpStream::connect(&self.addr).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
        out.split_once("\r\n\r\n").unwrap().1.to_owned()
    }
}

impl Drop for Keep {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every sample of a scrape, by series with labels.
fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').unwrap();
            (k.to_owned(), v.parse().unwrap())
        })
        .collect()
}

fn get(s: &BTreeMap<String, f64>, series: &str) -> f64 {
    *s.get(series)
        .unwrap_or_else(|| panic!("no {series} in {s:#?}"))
}

#[test]
fn counts_refusals_execs_and_errors_and_reports_readiness() {
    let node = Node::new();
    let keep = Keep::start(&node);
    let first = samples(&keep.scrape());
    assert_eq!(get(&first, "cni_guard_ready"), 0.0);

    // Not ready: ADD refused, counted with its reason.
    assert_eq!(node.cni("ADD", "c1"), 1);
    // keep folds events in and adds not-ready time once a second: scrape until both show.
    let start = Instant::now();
    let refusing = loop {
        let text = keep.scrape();
        let s = samples(&text);
        if s.get(r#"cni_guard_decisions_total{verb="add",decision="refused"}"#) == Some(&1.0)
            && s.get("cni_guard_not_ready_seconds_total")
                .is_some_and(|v| *v >= 1.0)
        {
            break text;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "{text}");
        std::thread::sleep(Duration::from_millis(50));
    };
    if let Some(out) = std::env::var_os("METRICS_SCRAPE_OUT") {
        std::fs::write(out, &refusing).unwrap();
    }
    let s = samples(&refusing);
    assert_eq!(
        get(
            &s,
            r#"cni_guard_decisions_total{verb="add",decision="refused"}"#
        ),
        1.0
    );
    assert_eq!(
        get(&s, r#"cni_guard_refusals_total{reason="delegate-missing"}"#),
        1.0
    );
    assert!(
        get(&s, "cni_guard_not_ready_seconds_total") >= 1.0,
        "{s:#?}"
    );
    let build_info = s
        .keys()
        .find(|k| k.starts_with("cni_guard_build_info{"))
        .expect("cni_guard_build_info");
    let version_line = std::process::Command::new(env!("CARGO_BIN_EXE_cni-guard-agent"))
        .arg("--version")
        .env_remove("CNI_COMMAND")
        .output()
        .unwrap();
    let version_line = String::from_utf8(version_line.stdout).unwrap();
    let commit = version_line
        .trim_end()
        .strip_suffix(')')
        .and_then(|l| l.rsplit_once("(commit "))
        .map(|(_, c)| c)
        .expect("--version names the commit");
    assert_eq!(
        *build_info,
        format!(
            r#"cni_guard_build_info{{version="{}",commit="{commit}"}}"#,
            env!("CARGO_PKG_VERSION")
        )
    );

    // Ready: one plugin at the guard's version is exec'd; one at another version that fails
    // ran as a child and is an error; DEL of the first is done with its recorded delegate.
    node.set_delegate(false, "1.0.0");
    assert_eq!(node.cni("ADD", "c2"), 0);
    node.set_delegate(true, "0.4.0");
    assert_eq!(node.cni("ADD", "c3"), 1);
    assert_eq!(node.cni("DEL", "c2"), 0);
    let s = samples(&keep.scrape());
    assert_eq!(get(&s, "cni_guard_ready"), 1.0);
    for (verb, decision, n) in [
        ("add", "refused", 1.0),
        ("add", "exec", 1.0),
        ("add", "error", 1.0),
        ("add", "child", 0.0),
        ("del", "done", 1.0),
    ] {
        assert_eq!(
            get(
                &s,
                &format!(r#"cni_guard_decisions_total{{verb="{verb}",decision="{decision}"}}"#)
            ),
            n,
            "{verb} {decision}"
        );
    }
}

/// A node whose `/var/lib` is a symlink (a separate data disk): the cache dir's path goes
/// through it, and every decision is still counted. Only the events file itself must not be a
/// symlink.
#[test]
fn counts_through_a_symlinked_ancestor_of_the_cache_dir() {
    let mut node = Node::new();
    std::fs::create_dir_all(node.path("data/var-lib")).unwrap();
    std::os::unix::fs::symlink(node.path("data/var-lib"), node.path("var-lib")).unwrap();
    node.cache = node.path("var-lib/cni/cni-guard");
    let keep = Keep::start(&node);
    assert!(node.cache.join(".metrics-events").exists());
    assert_eq!(node.cni("ADD", "c1"), 1);
    let start = Instant::now();
    loop {
        let s = samples(&keep.scrape());
        let refused = r#"cni_guard_decisions_total{verb="add",decision="refused"}"#;
        if get(&s, refused) == 1.0 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the refusal was never counted: {s:#?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// An ADD that waits for the delegate and then runs it is counted as held, with the time it
/// waited (the dashboard's "held" and "waited" panels).
#[test]
fn counts_an_add_held_for_the_delegate_and_how_long() {
    let node = Node::new();
    let keep = Keep::start(&node);
    let mut conf: Value = serde_json::from_slice(&node.guard_conf()).unwrap();
    conf["waitSeconds"] = json!(10);
    let writer = {
        let path = node.delegate();
        let list = json!({"cniVersion":"1.0.0","name":"multus","plugins":[{"type":"fake"}]});
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(400));
            std::fs::write(path, serde_json::to_vec(&list).unwrap()).unwrap();
        })
    };
    assert_eq!(
        node.cni_with("ADD", "held", &serde_json::to_vec(&conf).unwrap()),
        0
    );
    writer.join().unwrap();
    let start = Instant::now();
    let s = loop {
        let s = samples(&keep.scrape());
        if get(&s, r#"cni_guard_held_total{verb="add"}"#) >= 1.0 {
            break s;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "{s:#?}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(get(&s, r#"cni_guard_held_total{verb="add"}"#), 1.0);
    assert_eq!(get(&s, r#"cni_guard_held_total{verb="del"}"#), 0.0);
    let waited = get(&s, r#"cni_guard_held_seconds_total{verb="add"}"#);
    assert!((0.3..10.0).contains(&waited), "waited {waited} s");
    assert_eq!(
        get(
            &s,
            r#"cni_guard_decisions_total{verb="add",decision="exec"}"#
        ),
        1.0
    );
}

/// A delegate the guard would exec but cannot (its interpreter is missing): the ADD fails with
/// 999 naming it, and is counted as the error it is, not as an exec.
#[test]
fn a_failed_exec_is_counted_as_an_error() {
    let node = Node::new();
    node.script("bin/broken", "#!/nonexistent/interpreter\n");
    let list = json!({"cniVersion":"1.0.0","name":"multus","plugins":[{"type":"broken"}]});
    std::fs::write(node.delegate(), serde_json::to_vec(&list).unwrap()).unwrap();
    let keep = Keep::start(&node);
    assert_eq!(node.cni("ADD", "c1"), 1);
    let start = Instant::now();
    let s = loop {
        let s = samples(&keep.scrape());
        let counted: f64 = ["exec", "error", "child", "refused"]
            .iter()
            .map(|d| {
                get(
                    &s,
                    &format!(r#"cni_guard_decisions_total{{verb="add",decision="{d}"}}"#),
                )
            })
            .sum();
        if counted >= 1.0 {
            break s;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "{s:#?}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(
        get(
            &s,
            r#"cni_guard_decisions_total{verb="add",decision="exec"}"#
        ),
        0.0
    );
    assert_eq!(
        get(
            &s,
            r#"cni_guard_decisions_total{verb="add",decision="error"}"#
        ),
        1.0
    );
}

#[test]
fn a_corrupt_or_unwritable_events_file_never_breaks_an_add() {
    let node = Node::new();
    node.set_delegate(false, "1.0.0");
    let keep = Keep::start(&node);
    let events = node.path("cache/.metrics-events");
    // Garbage in the file: ADD goes through; keep counts the garbage, not as decisions.
    std::fs::OpenOptions::new()
        .append(true)
        .open(&events)
        .unwrap()
        .write_all(b"\xff\xfe garbage\nadd exec\n")
        .unwrap();
    assert_eq!(node.cni("ADD", "c1"), 0);
    let s = samples(&keep.scrape());
    assert_eq!(
        get(
            &s,
            r#"cni_guard_decisions_total{verb="add",decision="exec"}"#
        ),
        1.0
    );
    assert_eq!(get(&s, "cni_guard_events_malformed_total"), 2.0);
    // A directory, a FIFO, a symlink to elsewhere, a full file: ADD goes through each time.
    for (i, make) in [
        &(|p: &Path| std::fs::create_dir(p).unwrap()) as &dyn Fn(&Path),
        &|p: &Path| {
            nix::unistd::mkfifo(p, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap()
        },
        &|p: &Path| std::os::unix::fs::symlink("/dev/full", p).unwrap(),
        &|p: &Path| std::fs::File::create(p).unwrap().set_len(64 << 20).unwrap(),
    ]
    .iter()
    .enumerate()
    {
        let _ = std::fs::remove_dir(&events);
        let _ = std::fs::remove_file(&events);
        make(&events);
        let start = Instant::now();
        assert_eq!(node.cni("ADD", &format!("x{i}")), 0, "case {i}");
        assert!(start.elapsed() < Duration::from_secs(5), "case {i}");
    }
}

/// The restore path never waits on a network peer: with one client trickling a request a byte
/// at a time and several connected and silent, a deleted conflist comes back as fast as with
/// none, while the trickler is still at it, and a scrape still answers.
#[test]
fn slow_and_idle_metrics_clients_never_delay_a_restore() {
    let node = Node::new();
    let keep = Keep::start(&node);
    let conflist = node.path("net.d/00-cni-guard.conflist");
    let expected = std::fs::read(&conflist).unwrap();
    let idle: Vec<TcpStream> = (0..4)
        .map(|_| TcpStream::connect(&keep.addr).unwrap())
        .collect();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let trickler = {
        let (addr, stop) = (keep.addr.clone(), stop.clone());
        std::thread::spawn(move || {
            // One byte every 0.4 s, reconnecting when cut off, until told to stop.
            let request = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
            let mut sent = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let Ok(mut s) = TcpStream::connect(&addr) else {
                    return sent;
                };
                for b in request.iter().cycle() {
                    if stop.load(std::sync::atomic::Ordering::Relaxed)
                        || s.write_all(&[*b]).is_err()
                    {
                        break;
                    }
                    sent += 1;
                    std::thread::sleep(Duration::from_millis(400));
                }
            }
            sent
        })
    };
    // Let the trickler get its first bytes in, then take the file away.
    std::thread::sleep(Duration::from_millis(900));
    std::fs::remove_file(&conflist).unwrap();
    let start = Instant::now();
    while std::fs::read(&conflist).ok().as_deref() != Some(&expected[..]) {
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "the conflist was not restored within 3 s while a metrics client trickled"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let took = start.elapsed();
    assert!(
        !trickler.is_finished(),
        "the trickler stopped before the restore"
    );
    eprintln!("restored after {took:?} with a trickling and 4 idle metrics clients");
    // The service itself is still there for a well-behaved client.
    assert!(samples(&keep.scrape()).contains_key("cni_guard_ready"));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(trickler.join().unwrap() > 0);
    drop(idle);
}

/// `cni_guard_fallback_configs`: the configurations in the guard's conf dir that containerd
/// would use if the delegate vanished (`check`'s `fallback` line), followed as they come and go.
#[test]
fn the_fallback_configs_gauge_follows_the_conf_dir() {
    let node = Node::new();
    let keep = Keep::start(&node);
    let until = |want: f64| {
        let start = Instant::now();
        loop {
            let text = keep.scrape();
            if samples(&text).get("cni_guard_fallback_configs") == Some(&want) {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "want {want}: {text}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    until(0.0);
    let cilium = node.path("net.d/05-cilium.conflist");
    std::fs::write(
        &cilium,
        r#"{"cniVersion":"1.0.0","name":"c","plugins":[{"type":"fake"}]}"#,
    )
    .unwrap();
    until(1.0);
    std::fs::write(node.path("net.d/10-other.conf"), "{}").unwrap();
    until(2.0);
    std::fs::remove_file(&cilium).unwrap();
    std::fs::remove_file(node.path("net.d/10-other.conf")).unwrap();
    until(0.0);
}
