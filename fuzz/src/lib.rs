//! The bodies of the cni-guard fuzz targets. Each takes the fuzzer's bytes, feeds them to the
//! guard's parsers, and asserts what must hold whatever the input (besides not panicking).
//!
//! Nothing here execs, spawns or writes: parsing functions are called directly, and the one
//! target that runs a whole invocation ([`request`]) first points every path the guard could act
//! on (delegate, attachments, cache dir) at a directory that does not exist and drops any wait.

use std::collections::HashMap;
use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::Path;

use cni_guard::cni::{self, Action};
use cni_guard::config::{self, GuardConfig};
use cni_guard::names;
use cni_guard::netconf::NetworkConfig;
use cni_guard::records::Record;
use cni_guard::request::{self, Command};
use cni_guard::version::{self, Version, SUPPORTED};
use serde_json::{json, Value};

/// Where the request target points every path: it must not exist.
pub const NOWHERE: &str = "/nonexistent-cni-guard-fuzz";

/// Asserts that `bytes` is the spec's error structure: one JSON object with a numeric `code`, a
/// string `msg` and a supported `cniVersion`.
fn assert_error_json(bytes: &[u8], want_code: Option<u32>) {
    let v: Value = serde_json::from_slice(bytes)
        .unwrap_or_else(|e| panic!("error reply is not JSON ({e}): {bytes:?}"));
    let code = v["code"].as_u64().expect("error reply has a numeric code");
    if let Some(want) = want_code {
        assert_eq!(code, u64::from(want));
    }
    assert!(v["msg"].is_string(), "error reply has a msg: {v}");
    let ver = v["cniVersion"]
        .as_str()
        .expect("error reply has a cniVersion");
    assert!(SUPPORTED.contains(&ver), "error reply in {ver}");
}

/// The guard's own configuration, as the runtime passes it on stdin.
pub fn guard_config(data: &[u8]) {
    let reply = config::reply_version(data);
    assert!(SUPPORTED.contains(&reply.as_str()));
    match GuardConfig::parse(data) {
        Ok(cfg) => {
            let v = cfg.version();
            assert!(Version::parse(&cfg.cni_version) == Some(v));
            assert!(SUPPORTED.contains(&cfg.cni_version.as_str()));
            assert!(names::network_name(&cfg.name).is_ok());
            assert!(cfg.delegate.is_absolute(), "{:?}", cfg.delegate);
            assert!(cfg.attachments.iter().all(|a| a.is_absolute()));
            assert!(cfg.cache_dir.is_absolute());
            assert!(cfg.wait.as_secs_f64() <= config::WAIT.max);
            for p in std::iter::once(&cfg.delegate).chain(&cfg.attachments) {
                let s = p.as_os_str().as_encoded_bytes();
                assert!(!s.iter().any(u8::is_ascii_control), "{p:?}");
            }
            assert!(cfg.prev_result.as_ref().is_none_or(Value::is_object));
        }
        Err(e) => {
            // Every verb that reads the configuration answers a bad one alike.
            let code = e.code(Command::Add);
            assert!([1, 6, 7].contains(&code), "{e}");
            for verb in [Command::Add, Command::Status] {
                assert_eq!(e.code(verb), code, "{e}");
                assert_error_json(&e.to_json(verb, &reply), Some(code));
            }
        }
    }
}

const ENV_NAMES: [&str; 7] = [
    "CNI_COMMAND",
    "CNI_CONTAINERID",
    "CNI_NETNS",
    "CNI_IFNAME",
    "CNI_ARGS",
    "CNI_PATH",
    "CNI_COMMAND",
];
const COMMANDS: [&str; 8] = ["ADD", "DEL", "CHECK", "STATUS", "GC", "VERSION", "add", ""];

/// Splits the fuzzer's bytes into an environment and stdin.
///
/// Layout: records of `[selector, len, value...]`. `selector & 7` picks the variable (7 ends
/// the environment); bit 3 makes the value one of the real commands (len is then its index);
/// `len == 255` makes the value 5000 copies of its next byte (a too-long value). The rest is
/// stdin. Values are raw bytes: NUL, newlines and invalid UTF-8 reach the getter.
pub fn decode_request(data: &[u8]) -> (HashMap<String, OsString>, &[u8]) {
    let mut env = HashMap::new();
    let mut rest = data;
    while let [sel, len, tail @ ..] = rest {
        let which = usize::from(sel & 7);
        if which == 7 {
            rest = tail;
            break;
        }
        let name = ENV_NAMES[which].to_owned();
        if sel & 8 != 0 {
            env.insert(
                name,
                OsString::from(COMMANDS[usize::from(*len) % COMMANDS.len()]),
            );
            rest = tail;
            continue;
        }
        if *len == 255 {
            let byte = tail.first().copied().unwrap_or(b'a');
            env.insert(name, OsString::from_vec(vec![byte; 5000]));
            rest = tail.get(1..).unwrap_or(&[]);
            continue;
        }
        let n = usize::from(*len).min(tail.len());
        env.insert(name, OsString::from_vec(tail[..n].to_vec()));
        rest = &tail[n..];
    }
    (env, rest)
}

/// Rewrites a guard configuration so that handling it can touch nothing: the delegate,
/// attachments and cache dir point under [`NOWHERE`], and there is no wait.
fn defuse(stdin: &[u8]) -> Vec<u8> {
    let Ok(Value::Object(mut obj)) = serde_json::from_slice::<Value>(stdin) else {
        return stdin.to_vec();
    };
    if obj.contains_key("delegate") {
        obj.insert("delegate".into(), json!(format!("{NOWHERE}/d.conf")));
    }
    if let Some(Value::Array(items)) = obj.get_mut("attachments") {
        for (i, item) in items.iter_mut().enumerate() {
            if item.is_string() {
                *item = json!(format!("{NOWHERE}/a{i}.conflist"));
            }
        }
    }
    obj.insert("cacheDir".into(), json!(format!("{NOWHERE}/cache")));
    obj.remove("waitSeconds");
    serde_json::to_vec(&Value::Object(obj)).expect("JSON values serialize")
}

/// Request parsing: the environment and stdin, piece by piece and as a whole invocation.
pub fn request(data: &[u8]) {
    assert!(!Path::new(NOWHERE).exists(), "{NOWHERE} must not exist");
    let (env, stdin) = decode_request(data);
    let getenv = |k: &str| env.get(k).cloned();

    if let Ok(cmd) = request::command(&getenv) {
        match request::parse_env(cmd, &getenv) {
            Ok(req) => {
                if !req.container_id.is_empty() {
                    names::container_id(&req.container_id).unwrap();
                    assert!(!req.container_id.contains(['/', ':', '\0', '\n']));
                    assert!(!req.container_id.starts_with('.'));
                }
                if !req.ifname.is_empty() {
                    names::ifname(&req.ifname).unwrap();
                    assert!(req.ifname.len() <= names::MAX_IFNAME);
                    assert!(req.ifname != "." && req.ifname != "..");
                    assert!(!req.ifname.contains(['/', ':', '\0', '\n']));
                }
                assert!(req.cni_path.iter().all(|p| !p.as_os_str().is_empty()));
            }
            Err(e) => {
                assert_eq!(e.code(cmd), 4, "{e}");
                assert_error_json(&e.to_json(cmd, version::LATEST), Some(4));
            }
        }
    }
    assert_eq!(request::read_stdin(stdin).unwrap(), stdin);

    let stdin = defuse(stdin);
    let outcome = cni::handle(&getenv, &mut &stdin[..]);
    assert!(
        !outcome.line.contains(['\n', '\r', '\0']),
        "log line: {:?}",
        outcome.line
    );
    match outcome.action {
        Action::Reply { stdout, exit: 0 } => {
            if !stdout.is_empty() {
                let v: Value = serde_json::from_slice(&stdout).expect("a success reply is JSON");
                assert!(v.is_object());
            }
        }
        Action::Reply { stdout, exit } => {
            assert_eq!(exit, 1);
            assert_error_json(&stdout, None);
        }
        Action::Exec { plugin, .. } => panic!("nothing is runnable, yet: exec {plugin:?}"),
    }
}

const DELEGATE_NAMES: [&str; 4] = [
    "/etc/cni/net.d/00-multus.conf",
    "/etc/cni/net.d/05-cilium.conflist",
    "/etc/cni/net.d/10-x.json",
    "/etc/cni/net.d/noext",
];

/// Delegate and attachment configuration files (`.conf`, `.conflist`, ...), the request each of
/// their plugins would get, and the record ADD would write with them.
pub fn delegate_config(data: &[u8]) {
    let Some((sel, raw)) = data.split_first() else {
        return;
    };
    let path = Path::new(DELEGATE_NAMES[usize::from(*sel) % DELEGATE_NAMES.len()]);
    let Ok(list) = NetworkConfig::from_bytes(path, raw.to_vec(), "cni-guard") else {
        return;
    };
    let v = list.version();
    assert!(Version::delegate_supported(&list.cni_version), "{v:?}");
    assert!(!list.plugins.is_empty());
    for t in list.types() {
        assert!(!t.is_empty() && !t.contains('/') && t != "." && t != "..");
        assert_ne!(t, "cni-guard");
    }
    let guard = GuardConfig::parse(
        br#"{"cniVersion":"1.0.0","name":"g","type":"cni-guard","delegate":"/d.conf",
            "runtimeConfig":{"portMappings":[{"hostPort":80}],"bandwidth":{"rate":1}},
            "args":{"cni":{"ips":["10.0.0.2"]}}}"#,
    )
    .expect("a valid guard configuration");
    let prev = json!({"cniVersion":"1.0.0","ips":[{"address":"10.0.0.2/24"}]});
    for plugin in &list.plugins {
        let conf = cni_guard::delegate::build_config(plugin, &list, &guard, Some(&prev), &[]);
        let conf: Value = serde_json::from_slice(&conf).expect("built configuration is JSON");
        assert_eq!(conf["name"], list.name.as_str());
        assert_eq!(conf["cniVersion"], list.cni_version.as_str());
        assert_eq!(conf["type"], plugin["type"]);
        assert_eq!(conf["prevResult"], prev);
    }

    // The record written at ADD must give DEL back the same network.
    let record = Record {
        container_id: "c1".into(),
        ifname: "eth0".into(),
        network: "g".into(),
        cni_version: "1.0.0".into(),
        delegate_path: path.to_owned(),
        delegate: list.raw.clone(),
    };
    let back = Record::decode(&record.encode()).expect("a record reads back");
    let again = NetworkConfig::from_bytes(&back.delegate_path, back.delegate, "cni-guard")
        .expect("the recorded delegate loads");
    assert_eq!(again.name, list.name);
    assert_eq!(again.cni_version, list.cni_version);
    assert_eq!(again.plugins, list.plugins);
}

const FALLBACKS: [&str; 8] = [
    "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0", "x",
];

/// Results and prevResults: conversion between every pair of versions, and delegate error
/// structures passed through unchanged.
pub fn result_conversion(data: &[u8]) {
    if let Some(e) = cni_guard::invoke::as_cni_error(data) {
        assert_eq!(
            e.to_json(Command::Add, "1.0.0"),
            data,
            "a delegate error passes unchanged"
        );
    }
    let Ok(value) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    for fallback in FALLBACKS {
        for target in SUPPORTED {
            let Ok(out) = version::convert_result(&value, fallback, target) else {
                continue;
            };
            assert_eq!(out["cniVersion"], target);
            let modern = Version::parse(target).unwrap() >= Version::V1_0_0;
            if let Some(Value::Array(ips)) = out.get("ips") {
                for ip in ips.iter().filter_map(Value::as_object) {
                    assert_eq!(ip.contains_key("version"), !modern, "{out}");
                }
            }
            let source = value
                .get("cniVersion")
                .and_then(Value::as_str)
                .unwrap_or(fallback);
            // Converting the output again changes nothing (known exception: 0.1.0/0.2.0
            // results are not shape-checked, see the hardening report).
            if Version::parse(source).is_some_and(|v| v >= Version::V0_3_0) {
                assert_eq!(
                    version::convert_result(&out, target, target).as_ref(),
                    Ok(&out)
                );
            }
        }
    }
}
