//! Delegate plugins that misbehave, against the built binary: one that leaves a process behind
//! on its pipes, one that daemonizes, one that hangs, one that closes stdout and then hangs, one
//! whose child outlives it holding everything it inherited, one killed by a signal. Each runs on
//! both of the guard's paths: as a child (a two-plugin conflist, bounded by
//! `delegateTimeoutSeconds`) and exec'd (one plugin at the guard's version).
//!
//! What must hold in every case: the guard's own time is bounded (it never waits for what a
//! plugin left behind, and never past its bound), successful work is never reported as a
//! timeout, and DEL of a successful ADD succeeds without waiting for leftovers: the attachment
//! lock dies with the process that held it.
//!
//! Leftovers sleep [`LINGER`] seconds: a guard that waited for them would take at least that.

use serde_json::{json, Value};
use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// How long what a plugin leaves behind lives.
const LINGER: u64 = 6;
/// What "did not wait for the leftovers" means: well under [`LINGER`].
const PROMPT: Duration = Duration::from_secs(3);

const RESULT: &str = r#"{"cniVersion":"1.0.0","interfaces":[{"name":"eth0"}],"ips":[{"address":"10.9.0.2/24","interface":0}]}"#;

struct Fx {
    dir: tempfile::TempDir,
}

struct Done {
    status: i32,
    stdout: String,
    took: Duration,
}

impl Done {
    fn reply(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not one JSON value ({e}): {:?}", self.stdout))
    }
    fn ok(&self) -> &Self {
        assert_eq!(self.status, 0, "stdout {}", self.stdout);
        self
    }
    fn error(&self, code: u64) -> Value {
        assert_ne!(self.status, 0, "expected failure, stdout {}", self.stdout);
        let v = self.reply();
        assert_eq!(v["code"], code, "reply {v}");
        v
    }
    fn prompt(&self, what: &str) -> &Self {
        assert!(self.took < PROMPT, "{what} took {:?}", self.took);
        self
    }
}

impl Fx {
    fn new() -> Fx {
        let fx = Fx {
            dir: tempfile::tempdir().unwrap(),
        };
        for d in ["bin", "net.d", "out"] {
            std::fs::create_dir(fx.path(d)).unwrap();
        }
        fx
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    /// A plugin whose ADD runs `add` (then prints [`RESULT`] unless `add` ended the script) and
    /// whose other verbs succeed at once; every call is logged.
    fn plugin(&self, ty: &str, add: &str) {
        let log = self.path("calls.log");
        let body = format!(
            "#!/bin/sh\n\
             echo \"{ty} $CNI_COMMAND $CNI_CONTAINERID\" >>'{log}'\n\
             if [ \"$CNI_COMMAND\" = ADD ]; then\n{add}\nprintf '%s' '{RESULT}'\nfi\n",
            log = log.display()
        );
        let p = self.path("bin").join(ty);
        std::fs::write(&p, body).unwrap();
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    }

    /// The delegate: `types` as one conflist (one type: the guard execs it; two: it runs them
    /// as children).
    fn delegate(&self, types: &[&str]) {
        let plugins: Vec<Value> = types.iter().map(|t| json!({"type": t})).collect();
        let list = json!({"cniVersion":"1.0.0","name":"multus-net","plugins":plugins});
        std::fs::write(
            self.path("net.d/00-multus.conflist"),
            serde_json::to_vec(&list).unwrap(),
        )
        .unwrap();
    }

    fn guard(&self, extra: Value) -> Vec<u8> {
        let mut v = json!({"cniVersion":"1.0.0","name":"guarded","type":"cni-guard",
            "delegate": self.path("net.d/00-multus.conflist"), "cacheDir": self.path("cache"),
            "delegateTimeoutSeconds": 1});
        for (k, val) in extra.as_object().unwrap() {
            v[k] = val.clone();
        }
        serde_json::to_vec(&v).unwrap()
    }

    /// Starts the guard for `verb` on container `id`. Its stdout goes to a file, so the time
    /// measured is the process's own, not that of whoever else holds a pipe.
    fn start(&self, verb: &str, id: &str, conf: &[u8]) -> (Child, PathBuf) {
        let out = self.path(&format!("out/{verb}-{id}-{}", unique()));
        let no_syslog = self.path("no-syslog");
        let bin = self.path("bin");
        let env: [(&str, Option<&std::ffi::OsStr>); 7] = [
            ("PATH", Some("/usr/bin:/bin".as_ref())),
            ("CNI_GUARD_SYSLOG", Some(no_syslog.as_os_str())),
            ("CNI_COMMAND", Some(verb.as_ref())),
            ("CNI_CONTAINERID", Some(id.as_ref())),
            ("CNI_NETNS", Some("/run/netns/test".as_ref())),
            ("CNI_IFNAME", Some("eth0".as_ref())),
            ("CNI_PATH", Some(bin.as_os_str())),
        ];
        let mut child = test_support::command(env!("CARGO_BIN_EXE_cni-guard"), env)
            .stdin(Stdio::piped())
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(conf).unwrap();
        (child, out)
    }

    fn finish(&self, (mut child, out): (Child, PathBuf), start: Instant) -> Done {
        let status = child.wait().unwrap();
        let took = start.elapsed();
        Done {
            status: status.code().unwrap_or(-1),
            stdout: std::fs::read_to_string(out).unwrap(),
            took,
        }
    }

    fn run(&self, verb: &str, id: &str, conf: &[u8]) -> Done {
        let start = Instant::now();
        let child = self.start(verb, id, conf);
        self.finish(child, start)
    }

    fn calls(&self) -> String {
        std::fs::read_to_string(self.path("calls.log")).unwrap_or_default()
    }

    fn records(&self) -> Vec<String> {
        match std::fs::read_dir(self.path("cache/guarded")) {
            Ok(rd) => rd
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect(),
            Err(_) => Vec::new(),
        }
    }
}

fn unique() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// ADD, then DEL: both succeed, neither waits for what the plugin left behind.
fn add_then_del_are_prompt(fx: &Fx, what: &str) {
    let conf = fx.guard(json!({}));
    let add = fx.run("ADD", "c1", &conf);
    add.ok().prompt(&format!("{what}: ADD"));
    assert_eq!(add.reply()["ips"][0]["address"], "10.9.0.2/24");
    assert_eq!(fx.records(), ["c1:eth0.json"]);
    fx.run("DEL", "c1", &conf)
        .ok()
        .prompt(&format!("{what}: DEL after ADD"));
    assert!(fx.records().is_empty(), "{:?}", fx.records());
    eprintln!("{what}: ADD {:?}", add.took);
}

const LEAVES_BEHIND: &str = "sleep $LINGER &";
const DAEMONIZES: &str = "setsid sleep $LINGER &";

fn with_linger(body: &str) -> String {
    body.replace("$LINGER", &LINGER.to_string())
}

#[test]
fn leaves_a_process_behind_on_its_pipes_as_a_child() {
    let fx = Fx::new();
    fx.plugin("first", &with_linger(LEAVES_BEHIND));
    fx.plugin("second", &with_linger(LEAVES_BEHIND));
    fx.delegate(&["first", "second"]);
    add_then_del_are_prompt(&fx, "leaves a process behind (child)");
}

#[test]
fn leaves_a_process_behind_when_execd() {
    let fx = Fx::new();
    // The leftover inherits the exec'd delegate's lock descriptor, but not its lock.
    fx.plugin("only", &with_linger(LEAVES_BEHIND));
    fx.delegate(&["only"]);
    add_then_del_are_prompt(&fx, "leaves a process behind (exec)");
}

#[test]
fn daemonizes_as_a_child() {
    let fx = Fx::new();
    fx.plugin("first", &with_linger(DAEMONIZES));
    fx.plugin("second", "");
    fx.delegate(&["first", "second"]);
    add_then_del_are_prompt(&fx, "daemonizes (child)");
}

#[test]
fn daemonizes_when_execd() {
    let fx = Fx::new();
    fx.plugin("only", &with_linger(DAEMONIZES));
    fx.delegate(&["only"]);
    add_then_del_are_prompt(&fx, "daemonizes (exec)");
}

#[test]
fn no_lock_descriptor_reaches_a_childs_leftovers() {
    let fx = Fx::new();
    // The leftover writes where its descriptors point, then lingers.
    let fds = fx.path("leftover-fds");
    fx.plugin(
        "first",
        &format!(
            "(ls -l /proc/self/fd/ >'{fds}.part' && mv '{fds}.part' '{fds}'; sleep {LINGER}) &",
            fds = fds.display()
        ),
    );
    fx.plugin("second", "");
    fx.delegate(&["first", "second"]);
    add_then_del_are_prompt(&fx, "child's leftover");
    // The leftover runs on its own time: wait for its whole listing (renamed into place).
    let start = Instant::now();
    while !fds.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the leftover never listed its descriptors"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let listing = std::fs::read_to_string(&fds).unwrap();
    assert!(listing.contains("/proc/"), "not a listing: {listing}");
    assert!(
        !listing.contains(fx.path("cache").to_str().unwrap()),
        "a record descriptor reached the leftover:\n{listing}"
    );
}

#[test]
fn hangs_as_a_child_is_killed_at_the_bound_and_rolled_back() {
    let fx = Fx::new();
    fx.plugin("first", "");
    fx.plugin("second", "exec sleep 30");
    fx.delegate(&["first", "second"]);
    let conf = fx.guard(json!({}));
    let add = fx.run("ADD", "c1", &conf);
    let e = add.error(999);
    let msg = e["msg"].as_str().unwrap();
    assert!(
        msg.contains("second did not finish its ADD within")
            && msg.contains("delegateTimeoutSeconds 1s"),
        "{e}"
    );
    add.prompt("hang (child): ADD");
    // Rolled back: DEL on both, in reverse; no record left.
    assert!(
        fx.calls().ends_with("second DEL c1\nfirst DEL c1\n"),
        "{}",
        fx.calls()
    );
    assert!(fx.records().is_empty(), "{:?}", fx.records());
    fx.run("DEL", "c1", &conf).ok().prompt("hang (child): DEL");
}

#[test]
fn closes_stdout_then_hangs_as_a_child_is_killed_at_the_bound() {
    let fx = Fx::new();
    fx.plugin("first", "");
    fx.plugin(
        "second",
        &format!("printf '%s' '{RESULT}'; exec >&-; exec sleep 30"),
    );
    fx.delegate(&["first", "second"]);
    let conf = fx.guard(json!({}));
    let add = fx.run("ADD", "c1", &conf);
    add.error(999);
    add.prompt("closes stdout then hangs (child): ADD");
    assert!(fx.records().is_empty(), "{:?}", fx.records());
}

#[test]
fn killed_by_a_signal_as_a_child_is_reported_and_rolled_back() {
    let fx = Fx::new();
    fx.plugin("first", "");
    fx.plugin("second", &format!("sleep {LINGER} & kill -9 $$"));
    fx.delegate(&["first", "second"]);
    let conf = fx.guard(json!({}));
    let add = fx.run("ADD", "c1", &conf);
    let e = add.error(999);
    assert!(e["msg"].as_str().unwrap().contains("signal 9"), "{e}");
    add.prompt("killed by a signal (child): ADD");
    assert!(fx.records().is_empty(), "{:?}", fx.records());
}

#[test]
fn killed_by_a_signal_when_execd_leaves_the_attachment_free() {
    let fx = Fx::new();
    fx.plugin("only", &format!("sleep {LINGER} & kill -9 $$"));
    fx.delegate(&["only"]);
    let conf = fx.guard(json!({}));
    let add = fx.run("ADD", "c1", &conf);
    assert_ne!(add.status, 0);
    fx.run("DEL", "c1", &conf)
        .ok()
        .prompt("killed by a signal (exec): DEL");
    assert!(fx.records().is_empty(), "{:?}", fx.records());
}

#[test]
fn hangs_when_execd_holds_the_attachment_and_del_waits_only_its_bound() {
    let fx = Fx::new();
    fx.plugin("only", "exec sleep 30");
    fx.delegate(&["only"]);
    let conf = fx.guard(json!({"lockWaitSeconds": 0.5}));
    let start = Instant::now();
    let (mut add, add_out) = fx.start("ADD", "c1", &conf);
    // The exec'd delegate has the attachment once its record is there.
    while fx.records().is_empty() {
        assert!(start.elapsed() < PROMPT, "no record");
        std::thread::sleep(Duration::from_millis(10));
    }
    let del = fx.run("DEL", "c1", &conf);
    let e = del.error(11);
    let msg = e["msg"].as_str().unwrap();
    // exec keeps the pid: the holder named is the ADD the runtime started.
    assert!(
        msg.contains(&format!("held by process {}", add.id())) && msg.contains("not torn down"),
        "{msg}"
    );
    del.prompt("hang (exec): DEL while held");
    assert!(!fx.calls().contains("DEL"), "{}", fx.calls());
    // A second ADD of the same attachment is refused the same way.
    fx.run("ADD", "c1", &conf).error(11);
    // The runtime gives up on the hung ADD and kills it, as containerd does at its deadline:
    // the lock goes with it, and DEL goes through.
    add.kill().unwrap();
    add.wait().unwrap();
    drop(add_out);
    fx.run("DEL", "c1", &conf)
        .ok()
        .prompt("hang (exec): DEL after the kill");
    assert!(fx.calls().contains("only DEL c1"), "{}", fx.calls());
    assert!(fx.records().is_empty(), "{:?}", fx.records());
}

#[test]
fn a_status_that_hangs_is_cut_at_its_bound_and_answers_50_naming_it() {
    let fx = Fx::new();
    let p = fx.path("bin/slow-status");
    std::fs::write(
        &p,
        "#!/bin/sh\n[ \"$CNI_COMMAND\" = STATUS ] && exec sleep 30\nexit 0\n",
    )
    .unwrap();
    std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let list = json!({"cniVersion":"1.1.0","name":"multus-net","plugins":[{"type":"slow-status"}]});
    std::fs::write(
        fx.path("net.d/00-multus.conflist"),
        serde_json::to_vec(&list).unwrap(),
    )
    .unwrap();
    let mut conf: Value = serde_json::from_slice(&fx.guard(json!({}))).unwrap();
    conf["cniVersion"] = json!("1.1.0");
    conf["statusTimeoutSeconds"] = json!(0.5);
    let status = fx.run("STATUS", "c1", &serde_json::to_vec(&conf).unwrap());
    let e = status.error(50);
    let msg = e["msg"].as_str().unwrap();
    assert!(
        msg.contains("slow-status did not finish its STATUS within 0.5s")
            && msg.contains("statusTimeoutSeconds 0.5s"),
        "{msg}"
    );
    status.prompt("a STATUS that hangs");
    eprintln!(
        "STATUS with a hanging delegate answered in {:?}",
        status.took
    );
}

/// `delegateTimeoutSeconds` bounds a verb's plugin runs together, rollback included: a
/// two-plugin list run as children (cniVersion 0.3.1) whose second ADD hangs and whose DELs
/// hang too ends in about one bound with the error naming the plugin, not one bound per run
/// (three here). Past kubelet's deadline the runtime would kill the guard before that error.
#[test]
fn one_deadline_bounds_a_hanging_add_and_its_hanging_rollback() {
    let fx = Fx::new();
    let log = fx.path("calls.log");
    for (ty, add) in [
        (
            "first",
            "printf '%s' '{\"cniVersion\":\"0.3.1\",\"ips\":[]}'",
        ),
        ("second", "exec sleep 30"),
    ] {
        let p = fx.path("bin").join(ty);
        std::fs::write(
            &p,
            format!(
                "#!/bin/sh\necho \"{ty} $CNI_COMMAND $CNI_CONTAINERID\" >>'{}'\n\
                 [ \"$CNI_COMMAND\" = DEL ] && exec sleep 30\n{add}\n",
                log.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    }
    let list = json!({"cniVersion":"0.3.1","name":"multus-net",
        "plugins":[{"type":"first"},{"type":"second"}]});
    std::fs::write(
        fx.path("net.d/00-multus.conflist"),
        serde_json::to_vec(&list).unwrap(),
    )
    .unwrap();
    let mut conf: Value = serde_json::from_slice(&fx.guard(json!({}))).unwrap();
    conf["delegateTimeoutSeconds"] = json!(2);
    let add = fx.run("ADD", "c1", &serde_json::to_vec(&conf).unwrap());
    let e = add.error(999);
    let msg = e["msg"].as_str().unwrap();
    assert!(
        msg.contains("second did not finish its ADD within")
            && msg.contains("delegateTimeoutSeconds 2s"),
        "{msg}"
    );
    // Both rollback DELs ran (and were cut), in reverse.
    assert!(
        fx.calls().ends_with("second DEL c1\nfirst DEL c1\n"),
        "{}",
        fx.calls()
    );
    // The rollback did not finish: the record stays for the runtime's DEL to finish it.
    assert_eq!(fx.records(), ["c1:eth0.json"], "{msg}");
    assert!(
        add.took < Duration::from_millis(3500),
        "ADD and its rollback took {:?} at a 2 s bound",
        add.took
    );
    eprintln!(
        "hanging ADD + hanging rollback at a 2 s bound: {:?}",
        add.took
    );
}

/// Starts the guard for ADD on `c1` with `conf` on its stdin, its stdout to the file returned
/// (`out/NAME`) and its stderr on a pipe left to the caller.
fn spawn_add_with_piped_stderr(fx: &Fx, name: &str, conf: &[u8]) -> (Child, Instant, PathBuf) {
    let no_syslog = fx.path("no-syslog");
    let bin = fx.path("bin");
    let out = fx.path(&format!("out/{name}"));
    let env: [(&str, Option<&std::ffi::OsStr>); 7] = [
        ("PATH", Some("/usr/bin:/bin".as_ref())),
        ("CNI_GUARD_SYSLOG", Some(no_syslog.as_os_str())),
        ("CNI_COMMAND", Some("ADD".as_ref())),
        ("CNI_CONTAINERID", Some("c1".as_ref())),
        ("CNI_NETNS", Some("/run/netns/test".as_ref())),
        ("CNI_IFNAME", Some("eth0".as_ref())),
        ("CNI_PATH", Some(bin.as_os_str())),
    ];
    let start = Instant::now();
    let mut child = test_support::command(env!("CARGO_BIN_EXE_cni-guard"), env)
        .stdin(Stdio::piped())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(conf).unwrap();
    (child, start, out)
}

/// Runs the guard for ADD on `c1` with its stderr on a pipe that nobody reads (a runtime that
/// stopped reading, or a log pipe that is full), and gives it `limit` to finish: past it the
/// guard is killed and the test fails.
fn run_with_unread_stderr(fx: &Fx, conf: &[u8], limit: Duration) -> (Done, bool) {
    let (mut child, start, out) = spawn_add_with_piped_stderr(fx, "unread-stderr", conf);
    // Held open and never read.
    let _unread = child.stderr.take();
    let mut killed = false;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > limit {
            child.kill().unwrap();
            killed = true;
            break child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let done = Done {
        status: status.code().unwrap_or(-1),
        stdout: std::fs::read_to_string(out).unwrap(),
        took: start.elapsed(),
    };
    (done, killed)
}

/// A delegate that writes more to stderr than the runtime's pipe holds, to a runtime that does
/// not read it: the relay must never hold the guard (it drops what does not fit), so the result
/// still arrives, and in time.
#[test]
fn a_stderr_nobody_reads_never_holds_the_guard() {
    let fx = Fx::new();
    let spew = "head -c 1048576 /dev/zero | tr '\\0' x >&2";
    fx.plugin("first", spew);
    fx.plugin("second", spew);
    fx.delegate(&["first", "second"]);
    let (done, killed) = run_with_unread_stderr(&fx, &fx.guard(json!({})), Duration::from_secs(20));
    assert!(
        !killed,
        "the guard was still writing stderr after {:?}",
        done.took
    );
    done.ok().prompt("ADD with an unread stderr");
    assert_eq!(done.reply()["ips"][0]["address"], "10.9.0.2/24");
}

/// A delegate that floods stderr without end and never finishes, relayed to a runtime that reads
/// the guard's stderr slower than that: the relay reads a bounded amount per wake-up and never
/// waits to write it, so the deadline is still checked and the plugin killed at it.
#[test]
fn a_delegate_flooding_stderr_is_killed_at_the_deadline() {
    let fx = Fx::new();
    // Writers enough that the pipe is never found empty.
    fx.plugin(
        "first",
        "for i in 1 2 3 4 5 6; do cat /dev/zero >&2 & done; exec cat /dev/zero >&2",
    );
    fx.plugin("second", "");
    fx.delegate(&["first", "second"]);
    let conf = fx.guard(json!({"delegateTimeoutSeconds": 1}));
    let (mut child, start, out) = spawn_add_with_piped_stderr(&fx, "flood", &conf);
    // The runtime reads the guard's stderr, slower than the flood comes.
    let mut err = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while matches!(std::io::Read::read(&mut err, &mut buf), Ok(n) if n > 0) {
            std::thread::sleep(Duration::from_millis(5));
        }
    });
    let mut finished = false;
    while start.elapsed() < Duration::from_secs(20) {
        if child.try_wait().unwrap().is_some() {
            finished = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let took = start.elapsed();
    if !finished {
        let _ = child.kill();
    }
    let _ = child.wait();
    let _ = reader.join();
    assert!(finished, "the guard still relayed the flood after {took:?}");
    let reply: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    assert_eq!(reply["code"], 999, "{reply}");
    assert!(
        reply["msg"].as_str().unwrap().contains("was killed"),
        "{reply}"
    );
    assert!(took < PROMPT, "took {took:?}");
}
