//! Suite 5: CNI STATUS as the CRI reports it. containerd 2.x (from 2.0.1) runs STATUS on the
//! loaded network on every CRI `Status` call when that conflist's cniVersion is 1.1.0 or later,
//! and reports a failure as `NetworkReady=false` (kubelet then marks the node NotReady).
//!
//! On 2.x, with the guard's conflist at 1.1.0:
//! - delegate missing: `crictl info` shows NetworkReady false with the guard's message;
//! - delegate present: NetworkReady true; the time from the delegate's arrival (and removal) to
//!   the changed condition, polling `crictl info` every 50 ms;
//! - a delegate whose STATUS hangs: `crictl info` still answers within the guard's STATUS bound
//!   (`statusTimeoutSeconds`, 3 s by default), NetworkReady false saying why;
//! - at 1.0.0 STATUS is never called: the guard's log (one line per invocation, to the suite's
//!   syslog socket) has no `verb=STATUS` line over as many `crictl info` calls.
//!
//! On 1.6 the same 1.1.0 conflist is never asked for STATUS: NetworkReady stays true while the
//! delegate is missing.
use std::path::Path;
use std::time::{Duration, Instant};

use containerd_conformance::cni::{self, as_conf, bridge_network, write_atomically, GUARD_NETWORK};
use containerd_conformance::crictl::{network_condition, Crictl};
use containerd_conformance::{
    on_both_generations, prereq, start_containerd, Containerd, Generation,
};
use serde_json::{json, Value};

/// How often `crictl info` is polled while waiting for a changed condition.
const POLL: Duration = Duration::from_millis(50);
/// Arrival/removal rounds measured.
const ROUNDS: usize = 5;
/// `crictl info` calls over which STATUS invocations are counted.
const INFO_CALLS: usize = 10;
/// The guard's default bound on a delegate's STATUS (`statusTimeoutSeconds`).
const STATUS_TIMEOUT: Duration = Duration::from_secs(3);

/// A delegate plugin whose STATUS never ends (it sleeps in the shell itself, so the process the
/// guard started is the one that hangs); every other verb answers at once.
const HANG_STATUS: &str = r#"#!/bin/sh
case "$CNI_COMMAND" in
  VERSION) echo '{"cniVersion":"1.1.0","supportedVersions":["1.0.0","1.1.0"]}' ;;
  STATUS) while :; do sleep 1; done ;;
  ADD) echo '{"cniVersion":"1.1.0","interfaces":[],"ips":[]}' ;;
  *) ;;
esac
"#;

on_both_generations!(cni_status);

fn cni_status(generation: Generation) {
    const SUITE: &str = "cni_status";
    if !prereq::can_run(SUITE, generation) {
        return;
    }
    let Some(guard) = prereq::binary(SUITE, "CNI_GUARD_BIN", "cni-guard") else {
        return;
    };
    let ctrd = start_containerd(generation, &[("cni-guard", &guard)]);
    let bin = ctrd.bin_dir();
    std::fs::write(bin.join("hang-status"), HANG_STATUS).unwrap();
    set_executable(&bin.join("hang-status"));
    if generation.calls_status() {
        status_is_called(&ctrd);
    } else {
        status_is_never_called(&ctrd, "1.1.0");
    }
}

fn set_executable(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

struct Setup {
    conf_dir: std::path::PathBuf,
    delegate: std::path::PathBuf,
    cache: std::path::PathBuf,
    bridge: Value,
}

fn setup(ctrd: &Containerd) -> Setup {
    let conf_dir = ctrd.conf_dir();
    let ipam = ctrd.scratch("ipam");
    let mut bridge = as_conf(&bridge_network("pods", "cni-pods", "10.81.0.0/24", &ipam));
    bridge["cniVersion"] = json!("1.1.0");
    Setup {
        delegate: conf_dir.join("00-multus.conf"),
        conf_dir,
        cache: ctrd.scratch("guard-cache"),
        bridge,
    }
}

/// Writes the guard's conflist at `version` (with `extra` keys in its entry) and waits until
/// containerd has loaded exactly that.
fn load_guard(ctrd: &Containerd, s: &Setup, version: &str, extra: &[(&str, Value)]) {
    let mut conf = cni::guard_conflist(&s.delegate, &[], 0, &s.cache);
    conf["cniVersion"] = json!(version);
    for (k, v) in extra {
        conf["plugins"][0][*k] = v.clone();
    }
    write_atomically(&s.conf_dir, "00-cni-guard.conflist", &conf).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let info = ctrd.crictl().info().unwrap();
        let loaded = info
            .pointer("/cniconfig/Networks")
            .and_then(|n| n.as_array())
            .into_iter()
            .flatten()
            .any(|n| {
                n.pointer("/Config/Name") == Some(&json!(GUARD_NETWORK))
                    && n.pointer("/Config/Source")
                        .and_then(|s| s.as_str())
                        .is_some_and(|s| s == serde_json::to_string_pretty(&conf).unwrap())
            });
        if loaded {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "containerd did not load the guard's conflist at {version}: {}",
            info["cniconfig"]
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Polls `crictl info` every [`POLL`] until NetworkReady is `want`; the time from `since` to
/// the `crictl info` that showed it, and that call's message.
fn until_ready_is(crictl: &Crictl, want: bool, since: Instant) -> (Duration, String) {
    loop {
        let (ready, msg) = crictl.network_ready().unwrap();
        if ready == want {
            return (since.elapsed(), msg);
        }
        assert!(
            since.elapsed() < Duration::from_secs(30),
            "NetworkReady still {ready} after 30 s: {msg}"
        );
        std::thread::sleep(POLL);
    }
}

fn status_lines(lines: &[String]) -> usize {
    lines
        .iter()
        .filter(|l| l.starts_with("verb=STATUS "))
        .count()
}

fn ms(d: Duration) -> u128 {
    d.as_millis()
}

fn summary(name: &str, samples: &mut [Duration]) -> String {
    samples.sort();
    let list: Vec<String> = samples.iter().map(|d| ms(*d).to_string()).collect();
    format!(
        "{name}-ms={} min={} median={} max={}",
        list.join(","),
        ms(samples[0]),
        ms(samples[samples.len() / 2]),
        ms(samples[samples.len() - 1])
    )
}

/// containerd 2.x: STATUS through the guard, at 1.1.0 and (never) at 1.0.0.
fn status_is_called(ctrd: &Containerd) {
    let runtime = ctrd.runtime_name();
    let crictl = ctrd.crictl();
    let s = setup(ctrd);
    let delegate_text = s.delegate.display().to_string();

    // 1. 1.1.0, delegate missing: NetworkReady false, carrying the guard's message.
    load_guard(ctrd, &s, "1.1.0", &[]);
    let before = status_lines(&ctrd.guard_log());
    let mut info_latency = Vec::new();
    let mut absent_msg = String::new();
    for _ in 0..INFO_CALLS {
        let t = Instant::now();
        let (ready, msg) = crictl.network_ready().unwrap();
        info_latency.push(t.elapsed());
        assert!(!ready, "NetworkReady true while the delegate is missing");
        absent_msg = msg;
    }
    println!("{runtime}: NetworkReady message: {absent_msg}");
    assert!(
        absent_msg.starts_with("Network plugin returns error: ")
            && absent_msg.contains("cni-guard")
            && absent_msg.contains(&format!("delegate {delegate_text} does not exist")),
        "not the guard's message: {absent_msg}"
    );
    let calls = status_lines(&ctrd.guard_log()) - before;
    println!(
        "cri-status runtime={runtime} guard-cni-version=1.1.0 delegate=absent network-ready=false"
    );
    println!(
        "cri-status-calls runtime={runtime} guard-cni-version=1.1.0 info-calls={INFO_CALLS} status-calls={calls}"
    );
    println!(
        "cri-info-latency runtime={runtime} delegate=absent {}",
        summary("info", &mut info_latency)
    );
    assert!(
        calls >= INFO_CALLS,
        "{calls} STATUS calls for {INFO_CALLS} `crictl info` at 1.1.0"
    );

    // 2. The delegate comes and goes: time to the changed condition.
    let (mut arrivals, mut removals) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        let t = Instant::now();
        write_atomically(&s.conf_dir, "00-multus.conf", &s.bridge).unwrap();
        let (took, msg) = until_ready_is(crictl, true, t);
        arrivals.push(took);
        if round == 0 {
            println!("{runtime}: delegate present, NetworkReady true (message {msg:?})");
            println!(
                "cri-status runtime={runtime} guard-cni-version=1.1.0 delegate=present network-ready=true"
            );
        }
        let t = Instant::now();
        std::fs::remove_file(&s.delegate).unwrap();
        let (took, msg) = until_ready_is(crictl, false, t);
        removals.push(took);
        assert!(msg.contains(&delegate_text), "{msg}");
    }
    println!(
        "cri-status-transition runtime={runtime} poll-ms={} delegate=arrived {}",
        POLL.as_millis(),
        summary("to-ready", &mut arrivals)
    );
    println!(
        "cri-status-transition runtime={runtime} poll-ms={} delegate=removed {}",
        POLL.as_millis(),
        summary("to-not-ready", &mut removals)
    );

    // 3. A delegate whose STATUS hangs: crictl info answers within the guard's bound.
    let slow = json!({"cniVersion": "1.1.0", "name": "slow-net", "type": "hang-status"});
    write_atomically(&s.conf_dir, "00-multus.conf", &slow).unwrap();
    let patient = crictl.with_timeout(Duration::from_secs(60));
    for (label, extra) in [
        ("default", vec![]),
        ("1", vec![("statusTimeoutSeconds", json!(1))]),
    ] {
        if label != "default" && !status_timeout_key_known() {
            println!("{runtime}: statusTimeoutSeconds is not a guard key yet: only the default");
            continue;
        }
        load_guard(ctrd, &s, "1.1.0", &extra);
        let bound = if label == "default" {
            STATUS_TIMEOUT
        } else {
            Duration::from_secs(1)
        };
        let t = Instant::now();
        let outcome = patient.network_ready();
        let took = t.elapsed();
        let (ready, msg) = outcome.unwrap_or_else(|e| {
            panic!("crictl info failed after {took:?} with a hanging delegate STATUS: {e}")
        });
        println!("{runtime}: hanging STATUS, statusTimeoutSeconds={label}: crictl info took {took:?}; NetworkReady {ready}: {msg}");
        println!(
            "cri-status runtime={runtime} guard-cni-version=1.1.0 delegate=hangs-on-status status-timeout={label} network-ready={ready} info-ms={}",
            ms(took)
        );
        assert!(
            !ready,
            "NetworkReady true while the delegate's STATUS hangs"
        );
        assert!(
            took < bound + Duration::from_secs(2),
            "crictl info took {took:?} with statusTimeoutSeconds={label}"
        );
        assert!(
            msg.starts_with("Network plugin returns error: ")
                && msg.contains(&format!("delegate {delegate_text} did not answer STATUS"))
                && msg.contains("hang-status"),
            "the message does not say which delegate was too slow: {msg}"
        );
        assert_no_process_left(&ctrd.bin_dir().join("hang-status"));
    }
    std::fs::remove_file(&s.delegate).unwrap();

    // 4. 1.0.0: STATUS is never called; NetworkReady only says a config is loaded.
    status_is_never_called(ctrd, "1.0.0");
}

/// At `version` the runtime never asks for STATUS: NetworkReady true with the delegate missing,
/// and no `verb=STATUS` line in the guard's log over [`INFO_CALLS`] `crictl info` calls.
fn status_is_never_called(ctrd: &Containerd, version: &str) {
    let runtime = ctrd.runtime_name();
    let s = setup(ctrd);
    assert!(!s.delegate.exists());
    load_guard(ctrd, &s, version, &[]);
    let before = status_lines(&ctrd.guard_log());
    let mut ready_all = true;
    for _ in 0..INFO_CALLS {
        let info = ctrd.crictl().info().unwrap();
        let (ready, msg) = network_condition(&info);
        assert!(ready, "NetworkReady false at {version}: {msg}");
        ready_all &= ready;
    }
    // The guard sends its line before it answers: any STATUS would be here by now.
    let calls = status_lines(&ctrd.guard_log()) - before;
    println!(
        "cri-status runtime={runtime} guard-cni-version={version} delegate=absent network-ready={ready_all} status-calls={calls} info-calls={INFO_CALLS}"
    );
    assert_eq!(calls, 0, "STATUS was called at cniVersion {version}");
}

/// Whether this tree's guard knows `statusTimeoutSeconds` (the lead's change, issue 11).
fn status_timeout_key_known() -> bool {
    let config = prereq::workspace_root().join("plugin/src/config.rs");
    std::fs::read_to_string(config).is_ok_and(|s| s.contains("statusTimeoutSeconds"))
}

/// No process runs `plugin` any more (the guard kills a timed-out delegate's process group).
fn assert_no_process_left(plugin: &Path) {
    let needle = plugin.as_os_str().as_encoded_bytes();
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let left: Vec<String> = std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
            .filter(|e| {
                std::fs::read(e.path().join("cmdline"))
                    .is_ok_and(|c| c.split(|b| *b == 0).any(|a| a == needle))
            })
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        if left.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{} still running: pids {left:?}",
            plugin.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
