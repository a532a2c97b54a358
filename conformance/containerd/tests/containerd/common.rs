//! What several suites share: sandbox creation and inspection through crictl.
use std::path::PathBuf;
use std::time::Duration;

use containerd_conformance::crictl::{netns_of, CriError, Crictl};
use containerd_conformance::netns::{interfaces_in, Interface};

/// A running sandbox as the suites see it.
#[derive(Debug)]
pub struct Sandbox {
    pub id: String,
    pub ip: String,
    #[allow(dead_code)] // shown in failure output
    pub netns: PathBuf,
    pub interfaces: Vec<Interface>,
}

/// `crictl runp`, then `crictl inspectp` and a look inside its network namespace.
pub fn run_sandbox(
    crictl: &Crictl,
    name: &str,
    namespace: &str,
    attempt: u32,
) -> Result<Sandbox, CriError> {
    let id = crictl.runp(name, namespace, attempt)?;
    let inspect = crictl.inspectp(&id)?;
    assert_eq!(
        inspect["status"]["state"], "SANDBOX_READY",
        "sandbox {id} is not ready: {}",
        inspect["status"]
    );
    let ip = inspect
        .pointer("/status/network/ip")
        .and_then(|v| v.as_str())
        .unwrap_or_default()
        .to_string();
    let netns =
        netns_of(&inspect).unwrap_or_else(|| panic!("sandbox {id} has no network namespace"));
    let interfaces = interfaces_in(&netns).unwrap_or_else(|e| panic!("{e}"));
    Ok(Sandbox {
        id,
        ip,
        netns,
        interfaces,
    })
}

pub const NETWORK_READY: Duration = Duration::from_secs(10);
