//! The CRI as kubelet uses it, through crictl: `runp`, `inspectp`, `stopp`, `rmp`, `pods`,
//! `info`, `version`, each one process (`crictl --config PRIVATE --runtime-endpoint unix://SOCK
//! --timeout T ...`). The private config file keeps a machine's /etc/crictl.yaml out of it.
//!
//! A failed call gives [`CriError`]: crictl's stderr and the CRI status message in it (what
//! kubelet shows in a pod's events), taken from crictl's last `level=error msg="..."` line.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{json, Value};

/// A failed crictl call.
#[derive(Debug, Clone)]
pub struct CriError {
    /// The CRI error message (after `desc = `), or crictl's whole stderr if it has none.
    pub message: String,
    pub stderr: String,
}

impl std::fmt::Display for CriError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// crictl pointed at one runtime's socket.
pub struct Crictl {
    bin: PathBuf,
    config: PathBuf,
    endpoint: String,
    /// Where pod configs are written for `runp`.
    pods_dir: PathBuf,
    /// kubelet's runtime-request-timeout is 2 minutes (RunPodSandbox gets twice that).
    timeout: Duration,
    serial: AtomicUsize,
}

impl Crictl {
    /// crictl for the CRI on `socket`; its config file and pod configs go in `dir`.
    pub fn new(bin: &Path, socket: &Path, dir: &Path) -> std::io::Result<Self> {
        let endpoint = format!("unix://{}", socket.display());
        let config = dir.join("crictl.yaml");
        std::fs::write(
            &config,
            format!("runtime-endpoint: {endpoint}\nimage-endpoint: {endpoint}\n"),
        )?;
        let pods_dir = dir.join("pod-configs");
        std::fs::create_dir_all(&pods_dir)?;
        Ok(Self {
            bin: bin.to_owned(),
            config,
            endpoint,
            pods_dir,
            timeout: Duration::from_secs(120),
            serial: AtomicUsize::new(0),
        })
    }

    /// The same crictl with another per-call timeout.
    pub fn with_timeout(&self, timeout: Duration) -> Self {
        Self {
            bin: self.bin.clone(),
            config: self.config.clone(),
            endpoint: self.endpoint.clone(),
            pods_dir: self.pods_dir.clone(),
            timeout,
            serial: AtomicUsize::new(self.serial.load(Ordering::SeqCst)),
        }
    }

    /// The command line up to the subcommand.
    pub fn command(&self) -> Command {
        let mut c = Command::new(&self.bin);
        c.arg("--config")
            .arg(&self.config)
            .arg("--runtime-endpoint")
            .arg(&self.endpoint)
            .arg("--timeout")
            .arg(format!("{}s", self.timeout.as_secs().max(1)));
        c
    }

    /// Runs `crictl ARGS...`; stdout on success.
    pub fn call(&self, args: &[&str]) -> Result<String, CriError> {
        let out = self.command().args(args).output().map_err(|e| CriError {
            message: format!("cannot run {}: {e}", self.bin.display()),
            stderr: String::new(),
        })?;
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(CriError {
                message: cri_message(&stderr)
                    .unwrap_or_else(|| format!("crictl {args:?} failed: {}", stderr.trim())),
                stderr,
            })
        }
    }

    fn json(&self, args: &[&str]) -> Result<Value, CriError> {
        let out = self.call(args)?;
        serde_json::from_str(&out).map_err(|e| CriError {
            message: format!("crictl {args:?}: not JSON ({e}): {out}"),
            stderr: String::new(),
        })
    }

    /// `crictl version`: (RuntimeName, RuntimeVersion, RuntimeApiVersion).
    pub fn version(&self) -> Result<(String, String, String), CriError> {
        let out = self.call(&["version"])?;
        let field = |k: &str| {
            out.lines()
                .find_map(|l| l.strip_prefix(k))
                .and_then(|rest| rest.strip_prefix(':'))
                .map(|v| v.trim().to_string())
                .unwrap_or_default()
        };
        Ok((
            field("RuntimeName"),
            field("RuntimeVersion"),
            field("RuntimeApiVersion"),
        ))
    }

    /// `crictl info -o json`: the CRI `Status` with containerd's verbose info.
    pub fn info(&self) -> Result<Value, CriError> {
        self.json(&["info", "-o", "json"])
    }

    /// The `NetworkReady` condition from `crictl info`: (status, message).
    pub fn network_ready(&self) -> Result<(bool, String), CriError> {
        let info = self.info()?;
        Ok(network_condition(&info))
    }

    /// `crictl runp`: RunPodSandbox with a config like kubelet's; the sandbox id.
    pub fn runp(&self, name: &str, namespace: &str, attempt: u32) -> Result<String, CriError> {
        let file = self.pods_dir.join(format!(
            "{namespace}-{name}-{attempt}-{}.json",
            self.serial.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::write(&file, pod_config(name, namespace, attempt).to_string()).map_err(|e| {
            CriError {
                message: format!("write {}: {e}", file.display()),
                stderr: String::new(),
            }
        })?;
        let out = self.call(&["runp", file.to_str().expect("UTF-8 path")]);
        let _ = std::fs::remove_file(&file);
        Ok(out?.trim().to_string())
    }

    /// `crictl inspectp -o json`: the sandbox status and containerd's verbose info.
    pub fn inspectp(&self, id: &str) -> Result<Value, CriError> {
        self.json(&["inspectp", "-o", "json", id])
    }

    pub fn stopp(&self, id: &str) -> Result<(), CriError> {
        self.call(&["stopp", id]).map(|_| ())
    }

    pub fn rmp(&self, id: &str) -> Result<(), CriError> {
        self.call(&["rmp", id]).map(|_| ())
    }

    /// `crictl pods -q`: every sandbox id.
    pub fn pods(&self) -> Result<Vec<String>, CriError> {
        Ok(self
            .call(&["pods", "-q"])?
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(String::from)
            .collect())
    }

    /// The network namespace path of a sandbox (containerd 1.6 has it only in the sandbox's
    /// runtime spec; some versions also at the top of the info).
    pub fn sandbox_netns(&self, id: &str) -> Result<Option<PathBuf>, CriError> {
        let v = self.inspectp(id)?;
        Ok(netns_of(&v))
    }
}

/// The sandbox's network namespace path in `crictl inspectp -o json` output.
pub fn netns_of(inspect: &Value) -> Option<PathBuf> {
    let info = &inspect["info"];
    let from_spec = info
        .pointer("/runtimeSpec/linux/namespaces")
        .and_then(|n| n.as_array())
        .and_then(|n| {
            n.iter()
                .find(|ns| ns.get("type").and_then(|t| t.as_str()) == Some("network"))
        })
        .and_then(|ns| ns.get("path"));
    info.get("netNamespacePath")
        .or(from_spec)
        .and_then(|p| p.as_str())
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
}

/// The `NetworkReady` condition in `crictl info -o json` output: (status, message).
pub fn network_condition(info: &Value) -> (bool, String) {
    info.pointer("/status/conditions")
        .and_then(|c| c.as_array())
        .and_then(|c| c.iter().find(|c| c["type"] == "NetworkReady"))
        .map(|c| {
            (
                c["status"].as_bool().unwrap_or(false),
                c["message"].as_str().unwrap_or_default().to_string(),
            )
        })
        .unwrap_or((false, "no NetworkReady condition".into()))
}

/// A sandbox config like kubelet's for pod `name` in `namespace` (the uid derived from both).
pub fn pod_config(name: &str, namespace: &str, attempt: u32) -> Value {
    json!({
        "metadata": {
            "name": name,
            "uid": format!("uid-{namespace}-{name}"),
            "namespace": namespace,
            "attempt": attempt,
        },
        "hostname": name,
        "labels": { "cni-guard-test": namespace },
        "linux": {},
    })
}

/// The CRI status message in crictl's stderr: crictl ends a failed command with logrus's
/// `level=fatal|error msg="<what>: rpc error: code = X desc = <message>"`.
pub fn cri_message(stderr: &str) -> Option<String> {
    let line = stderr
        .lines()
        .rev()
        .find(|l| l.contains("level=fatal msg=") || l.contains("level=error msg="))?;
    let quoted = &line[line.find("msg=\"")? + 4..];
    let msg = go_unquote(quoted)?;
    Some(match msg.find("desc = ") {
        Some(i) => msg[i + "desc = ".len()..].to_string(),
        None => msg,
    })
}

/// Reads one Go-quoted string (`strconv.Quote`, as logrus writes values) from the start of `s`.
fn go_unquote(s: &str) -> Option<String> {
    let mut chars = s.strip_prefix('"')?.chars();
    let mut out = String::new();
    loop {
        match chars.next()? {
            '"' => return Some(out),
            '\\' => {
                let c = chars.next()?;
                let hex = |chars: &mut std::str::Chars, n: usize| {
                    let h: String = chars.by_ref().take(n).collect();
                    u32::from_str_radix(&h, 16).ok().and_then(char::from_u32)
                };
                out.push(match c {
                    'n' => '\n',
                    't' => '\t',
                    'r' => '\r',
                    'a' => '\u{7}',
                    'b' => '\u{8}',
                    'f' => '\u{c}',
                    'v' => '\u{b}',
                    'x' => hex(&mut chars, 2)?,
                    'u' => hex(&mut chars, 4)?,
                    'U' => hex(&mut chars, 8)?,
                    other => other,
                });
            }
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cri_message_is_taken_from_crictls_last_error_line() {
        let stderr = concat!(
            "time=\"2026-12-02T17:16:13Z\" level=warning msg=\"cgroup_parent is not set\"\n",
            "E1202 17:16:13.735520   25667 remote_runtime.go:325] \"RunPodSandbox from runtime ",
            "service failed\" err=\"rpc error: code = Unknown desc = x\"\n",
            "time=\"2026-12-02T17:16:13Z\" level=fatal msg=\"run pod sandbox: rpc error: code = ",
            "Unknown desc = failed to setup network for sandbox \\\"2ad5\\\": plugin ",
            "type=\\\"cni-guard\\\" failed (add): cni-guard: network not ready: delegate ",
            "/a b/00-multus.conf does not exist\"\n"
        );
        assert_eq!(
            cri_message(stderr).unwrap(),
            "failed to setup network for sandbox \"2ad5\": plugin type=\"cni-guard\" failed \
             (add): cni-guard: network not ready: delegate /a b/00-multus.conf does not exist"
        );
        assert_eq!(cri_message("nothing here"), None);
    }

    #[test]
    fn go_quoting_is_undone() {
        assert_eq!(
            go_unquote(r#""a\"b\\c\n\x41\u00e9" rest"#).unwrap(),
            "a\"b\\c\nAé"
        );
        assert_eq!(go_unquote(r#""unterminated"#), None);
    }

    #[test]
    fn the_netns_is_found_in_the_runtime_spec() {
        let v = json!({"info": {"runtimeSpec": {"linux": {"namespaces": [
            {"type": "pid"}, {"type": "network", "path": "/s/netns/cni-1"}]}}}});
        assert_eq!(netns_of(&v), Some(PathBuf::from("/s/netns/cni-1")));
        assert_eq!(netns_of(&json!({})), None);
    }

    #[test]
    fn network_ready_is_read_from_the_conditions() {
        let v = json!({"status": {"conditions": [
            {"type": "RuntimeReady", "status": true, "message": ""},
            {"type": "NetworkReady", "status": false, "message": "Network plugin returns error: x"}]}});
        assert_eq!(
            network_condition(&v),
            (false, "Network plugin returns error: x".to_string())
        );
    }
}
