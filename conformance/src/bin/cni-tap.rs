//! cni-tap: records the reply of the plugin it stands in for.
//!
//! cnitool prints a plugin error as `msg; details` and drops the code, so a suite that must see
//! the code puts this binary in the bin dir under the plugin's name. It runs the real plugin
//! (`CNI_TAP_TARGET_<name>`, `<name>` being the name it was run under with `-` as `_`, else
//! `CNI_TAP_TARGET`) with the same stdin, environment and arguments, passes stdout and the exit
//! status through unchanged, and writes one JSON record per call into `CNI_TAP_DIR`:
//! `{"plugin", "command", "containerId", "ifname", "status", "stdin", "stdout"}` (`stdin` parsed
//! when it is JSON), in a file `<containerId>-<command>-<nanos>.json`.
use serde_json::json;
use std::io::{Read, Write};
use std::process::{Command, ExitCode, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

fn main() -> ExitCode {
    let plugin = std::env::args_os()
        .next()
        .map(|a| {
            std::path::Path::new(&a)
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned()
        })
        .unwrap_or_default();
    let own = format!("CNI_TAP_TARGET_{}", plugin.replace('-', "_"));
    let target = std::env::var_os(&own).or_else(|| std::env::var_os("CNI_TAP_TARGET"));
    let (Some(target), Some(dir)) = (target, std::env::var_os("CNI_TAP_DIR")) else {
        eprintln!("cni-tap: CNI_TAP_TARGET and CNI_TAP_DIR must be set");
        return ExitCode::from(2);
    };
    let mut input = Vec::new();
    if let Err(e) = std::io::stdin().read_to_end(&mut input) {
        eprintln!("cni-tap: stdin: {e}");
        return ExitCode::from(2);
    }
    let child = Command::new(&target)
        .args(std::env::args_os().skip(1))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cni-tap: exec {}: {e}", target.to_string_lossy());
            return ExitCode::from(2);
        }
    };
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(&input);
    }
    let out = match child.wait_with_output() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("cni-tap: wait: {e}");
            return ExitCode::from(2);
        }
    };
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    let stdin = serde_json::from_slice::<serde_json::Value>(&input)
        .unwrap_or_else(|_| String::from_utf8_lossy(&input).into_owned().into());
    let record = json!({
        "plugin": plugin,
        "command": var("CNI_COMMAND"),
        "containerId": var("CNI_CONTAINERID"),
        "ifname": var("CNI_IFNAME"),
        "status": out.status.code(),
        "stdin": stdin,
        "stdout": String::from_utf8_lossy(&out.stdout),
    });
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let name = format!(
        "{}-{}-{}.json",
        var("CNI_CONTAINERID"),
        var("CNI_COMMAND"),
        nanos
    );
    let path = std::path::Path::new(&dir).join(name);
    if let Err(e) = std::fs::write(&path, record.to_string()) {
        eprintln!("cni-tap: write {}: {e}", path.display());
    }
    let _ = std::io::stdout().write_all(&out.stdout);
    let _ = std::io::stdout().flush();
    match out.status.code() {
        Some(code) => ExitCode::from(code as u8),
        None => ExitCode::from(1),
    }
}
