//! mini-multus: the Multus stand-in of the conformance suites.
//!
//! A test meta-plugin, small and honest. Its own config (a single-plugin `.conf`) names a
//! `clusterNetwork` (a conflist, attached as `eth0`) and `attachments` (`.conf` or `.conflist`
//! files, attached as `net1`, `net2`, ... in order). ADD runs the real plugins of each network
//! the way libcni runs a conflist (`name`/`cniVersion` injected, `prevResult` threaded); on a
//! failure it deletes what it already attached and passes the plugin's error through. DEL goes
//! in reverse and carries on past missing files, as Multus does. Its result is the cluster
//! network's. CHECK is not implemented and says so.
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

const SUPPORTED: [&str; 3] = ["0.3.1", "0.4.0", "1.0.0"];

/// One failure: the stdout (error JSON) to pass through.
struct Failure(String);

fn error_json(version: &str, code: u32, msg: &str) -> String {
    json!({"cniVersion": version, "code": code, "msg": msg}).to_string()
}

/// A network: the plugin configs to run, in order, already carrying name and cniVersion.
struct Network {
    plugins: Vec<Value>,
}

fn load_network(path: &Path, version: &str) -> Result<Network, Failure> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        Failure(error_json(
            version,
            11,
            &format!("mini-multus: cannot read {}: {e}", path.display()),
        ))
    })?;
    let conf: Value = serde_json::from_str(&text).map_err(|e| {
        Failure(error_json(
            version,
            6,
            &format!("mini-multus: {} is not JSON: {e}", path.display()),
        ))
    })?;
    if let Some(list) = conf.get("plugins").and_then(Value::as_array) {
        let name = conf.get("name").cloned().unwrap_or(Value::Null);
        let cni_version = conf.get("cniVersion").cloned().unwrap_or(Value::Null);
        let plugins = list
            .iter()
            .map(|p| {
                let mut p = p.clone();
                if let Some(obj) = p.as_object_mut() {
                    obj.insert("name".into(), name.clone());
                    obj.insert("cniVersion".into(), cni_version.clone());
                }
                p
            })
            .collect();
        Ok(Network { plugins })
    } else {
        Ok(Network {
            plugins: vec![conf],
        })
    }
}

/// Runs one plugin binary found in CNI_PATH, like libcni's invoke: config on stdin, stdout
/// buffered, stderr inherited.
fn exec_plugin(command: &str, ifname: &str, conf: &Value) -> Result<String, Failure> {
    let version = conf
        .get("cniVersion")
        .and_then(Value::as_str)
        .unwrap_or("1.0.0");
    let kind = conf.get("type").and_then(Value::as_str).unwrap_or_default();
    let cni_path = std::env::var("CNI_PATH").unwrap_or_default();
    let binary = std::env::split_paths(&cni_path)
        .map(|dir| dir.join(kind))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            Failure(error_json(
                version,
                11,
                &format!("mini-multus: plugin {kind:?} not found in CNI_PATH {cni_path}"),
            ))
        })?;
    let mut child = Command::new(&binary)
        .env("CNI_COMMAND", command)
        .env("CNI_IFNAME", ifname)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| {
            Failure(error_json(
                version,
                999,
                &format!("mini-multus: exec {}: {e}", binary.display()),
            ))
        })?;
    let input = conf.to_string();
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(input.as_bytes());
    }
    let out = child.wait_with_output().map_err(|e| {
        Failure(error_json(
            version,
            999,
            &format!("mini-multus: wait {}: {e}", binary.display()),
        ))
    })?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() {
        Ok(stdout)
    } else if stdout.trim().is_empty() {
        Err(Failure(error_json(
            version,
            999,
            &format!(
                "mini-multus: {kind} {command} failed ({}) without an error reply",
                out.status
            ),
        )))
    } else {
        Err(Failure(stdout))
    }
}

fn add_network(net: &Network, ifname: &str) -> Result<Value, Failure> {
    let mut prev: Option<Value> = None;
    for plugin in &net.plugins {
        let mut conf = plugin.clone();
        if let (Some(obj), Some(prev)) = (conf.as_object_mut(), prev.as_ref()) {
            obj.insert("prevResult".into(), prev.clone());
        }
        let out = exec_plugin("ADD", ifname, &conf)?;
        let result: Value = serde_json::from_str(&out).map_err(|e| {
            Failure(error_json(
                "1.0.0",
                999,
                &format!("mini-multus: result of {ifname} is not JSON: {e}"),
            ))
        })?;
        prev = Some(result);
    }
    Ok(prev.unwrap_or_else(|| json!({})))
}

/// DEL of one network, plugins in reverse order; the first error is returned after all ran.
fn del_network(net: &Network, ifname: &str) -> Result<(), Failure> {
    let mut first = None;
    for plugin in net.plugins.iter().rev() {
        if let Err(e) = exec_plugin("DEL", ifname, plugin) {
            first.get_or_insert(e);
        }
    }
    first.map_or(Ok(()), Err)
}

struct Own {
    version: String,
    cluster: PathBuf,
    attachments: Vec<PathBuf>,
}

fn own_config(conf: &Value) -> Result<Own, Failure> {
    let version = conf
        .get("cniVersion")
        .and_then(Value::as_str)
        .unwrap_or("1.0.0")
        .to_string();
    let cluster = conf
        .get("clusterNetwork")
        .and_then(Value::as_str)
        .map(PathBuf::from)
        .ok_or_else(|| {
            Failure(error_json(
                &version,
                7,
                "mini-multus: clusterNetwork is required",
            ))
        })?;
    let attachments = conf
        .get("attachments")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(PathBuf::from)
                .collect()
        })
        .unwrap_or_default();
    Ok(Own {
        version,
        cluster,
        attachments,
    })
}

fn ifname_of(index: usize) -> String {
    if index == 0 {
        "eth0".into()
    } else {
        format!("net{index}")
    }
}

fn cmd_add(own: &Own) -> Result<String, Failure> {
    let paths: Vec<&PathBuf> = std::iter::once(&own.cluster)
        .chain(own.attachments.iter())
        .collect();
    let mut attached: Vec<(Network, String)> = Vec::new();
    let mut cluster_result = None;
    for (i, path) in paths.iter().enumerate() {
        let ifname = ifname_of(i);
        let step = load_network(path, &own.version).and_then(|net| {
            let result = add_network(&net, &ifname)?;
            Ok((net, result))
        });
        match step {
            Ok((net, result)) => {
                if i == 0 {
                    cluster_result = Some(result);
                }
                attached.push((net, ifname));
            }
            Err(failure) => {
                for (net, ifname) in attached.iter().rev() {
                    let _ = del_network(net, ifname);
                }
                return Err(failure);
            }
        }
    }
    Ok(cluster_result.unwrap_or_else(|| json!({})).to_string())
}

fn cmd_del(own: &Own) -> Result<String, Failure> {
    let paths: Vec<&PathBuf> = std::iter::once(&own.cluster)
        .chain(own.attachments.iter())
        .collect();
    let mut first = None;
    for (i, path) in paths.iter().enumerate().rev() {
        // A network whose file is gone is skipped, as Multus logs and carries on.
        let Ok(net) = load_network(path, &own.version) else {
            continue;
        };
        if let Err(e) = del_network(&net, &ifname_of(i)) {
            first.get_or_insert(e);
        }
    }
    first.map_or(Ok(String::new()), Err)
}

fn run() -> Result<String, Failure> {
    let command = std::env::var("CNI_COMMAND").unwrap_or_default();
    let mut input = String::new();
    std::io::stdin()
        .read_to_string(&mut input)
        .map_err(|e| Failure(error_json("1.0.0", 5, &format!("mini-multus: stdin: {e}"))))?;
    if command == "VERSION" {
        return Ok(json!({"cniVersion": "1.0.0", "supportedVersions": SUPPORTED}).to_string());
    }
    let conf: Value = serde_json::from_str(&input).map_err(|e| {
        Failure(error_json(
            "1.0.0",
            6,
            &format!("mini-multus: config is not JSON: {e}"),
        ))
    })?;
    let own = own_config(&conf)?;
    match command.as_str() {
        "ADD" => cmd_add(&own),
        "DEL" => cmd_del(&own),
        other => Err(Failure(error_json(
            &own.version,
            4,
            &format!("mini-multus: {other:?} is not implemented (only ADD, DEL, VERSION)"),
        ))),
    }
}

fn main() -> ExitCode {
    match run() {
        Ok(out) => {
            print!("{out}");
            ExitCode::SUCCESS
        }
        Err(Failure(out)) => {
            print!("{out}");
            ExitCode::FAILURE
        }
    }
}
