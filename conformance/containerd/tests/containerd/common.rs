//! What several suites share: sandbox creation and inspection through the CRI.
use std::path::PathBuf;
use std::time::Duration;

use containerd_conformance::cri::{pod_config, PodSandboxState, RuntimeClient};
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

/// RunPodSandbox, then PodSandboxStatus and a look inside its network namespace.
pub async fn run_sandbox(
    cri: &RuntimeClient,
    name: &str,
    namespace: &str,
    attempt: u32,
) -> Result<Sandbox, tonic::Status> {
    let id = cri
        .run_pod_sandbox(pod_config(name, namespace, attempt))
        .await?;
    let status = cri.pod_sandbox_status(&id, false).await?;
    let status = status.status.expect("PodSandboxStatus has a status");
    assert_eq!(
        status.state,
        PodSandboxState::SandboxReady as i32,
        "sandbox {id} is not ready"
    );
    let ip = status.network.map(|n| n.ip).unwrap_or_default();
    let netns = cri
        .sandbox_netns(&id)
        .await?
        .unwrap_or_else(|| panic!("sandbox {id} has no network namespace path"));
    let interfaces = interfaces_in(&netns).unwrap_or_else(|e| panic!("{e}"));
    Ok(Sandbox {
        id,
        ip,
        netns,
        interfaces,
    })
}

pub const NETWORK_READY: Duration = Duration::from_secs(10);
