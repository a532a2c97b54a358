//! A small CRI v1 `RuntimeService` client over a Unix socket: only the sandbox calls kubelet makes
//! when it builds and tears down a pod's network.
//!
//! The messages are written by hand as prost structs; field numbers follow the CRI API's
//! `pkg/apis/runtime/v1/api.proto` (kubernetes/cri-api). Only the fields these tests read or set
//! are declared: protobuf decoding skips the others, so this stays compatible with any CRI v1
//! server. Calls go through tonic's generic `Grpc` client, as generated code would.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::codec::ProstCodec;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::{Channel, Endpoint, Uri};

// ---- messages (api.proto field numbers) ----

#[derive(Clone, PartialEq, prost::Message)]
pub struct VersionRequest {
    #[prost(string, tag = "1")]
    pub version: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct VersionResponse {
    #[prost(string, tag = "1")]
    pub version: String,
    #[prost(string, tag = "2")]
    pub runtime_name: String,
    #[prost(string, tag = "3")]
    pub runtime_version: String,
    #[prost(string, tag = "4")]
    pub runtime_api_version: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct StatusRequest {
    #[prost(bool, tag = "1")]
    pub verbose: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RuntimeCondition {
    #[prost(string, tag = "1")]
    pub r#type: String,
    #[prost(bool, tag = "2")]
    pub status: bool,
    #[prost(string, tag = "3")]
    pub reason: String,
    #[prost(string, tag = "4")]
    pub message: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RuntimeStatus {
    #[prost(message, repeated, tag = "1")]
    pub conditions: Vec<RuntimeCondition>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct StatusResponse {
    #[prost(message, optional, tag = "1")]
    pub status: Option<RuntimeStatus>,
    /// With `verbose`, containerd puts its loaded CNI config here (key `cniconfig`).
    #[prost(map = "string, string", tag = "2")]
    pub info: HashMap<String, String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxMetadata {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub uid: String,
    #[prost(string, tag = "3")]
    pub namespace: String,
    #[prost(uint32, tag = "4")]
    pub attempt: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LinuxPodSandboxConfig {
    #[prost(string, tag = "1")]
    pub cgroup_parent: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxConfig {
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<PodSandboxMetadata>,
    #[prost(string, tag = "2")]
    pub hostname: String,
    #[prost(string, tag = "3")]
    pub log_directory: String,
    #[prost(map = "string, string", tag = "6")]
    pub labels: HashMap<String, String>,
    #[prost(map = "string, string", tag = "7")]
    pub annotations: HashMap<String, String>,
    /// Left at its default, the sandbox gets its own network namespace (NamespaceMode POD).
    #[prost(message, optional, tag = "8")]
    pub linux: Option<LinuxPodSandboxConfig>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RunPodSandboxRequest {
    #[prost(message, optional, tag = "1")]
    pub config: Option<PodSandboxConfig>,
    #[prost(string, tag = "2")]
    pub runtime_handler: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RunPodSandboxResponse {
    #[prost(string, tag = "1")]
    pub pod_sandbox_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxIdRequest {
    #[prost(string, tag = "1")]
    pub pod_sandbox_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Empty {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxStatusRequest {
    #[prost(string, tag = "1")]
    pub pod_sandbox_id: String,
    #[prost(bool, tag = "2")]
    pub verbose: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum PodSandboxState {
    SandboxReady = 0,
    SandboxNotready = 1,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodIp {
    #[prost(string, tag = "1")]
    pub ip: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxNetworkStatus {
    #[prost(string, tag = "1")]
    pub ip: String,
    #[prost(message, repeated, tag = "2")]
    pub additional_ips: Vec<PodIp>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxStatus {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(message, optional, tag = "2")]
    pub metadata: Option<PodSandboxMetadata>,
    #[prost(enumeration = "PodSandboxState", tag = "3")]
    pub state: i32,
    #[prost(int64, tag = "4")]
    pub created_at: i64,
    #[prost(message, optional, tag = "5")]
    pub network: Option<PodSandboxNetworkStatus>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxStatusResponse {
    #[prost(message, optional, tag = "1")]
    pub status: Option<PodSandboxStatus>,
    /// With `verbose`, containerd's JSON under key `info` (it holds `netNamespacePath`).
    #[prost(map = "string, string", tag = "2")]
    pub info: HashMap<String, String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxFilter {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(map = "string, string", tag = "3")]
    pub label_selector: HashMap<String, String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListPodSandboxRequest {
    #[prost(message, optional, tag = "1")]
    pub filter: Option<PodSandboxFilter>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandbox {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(message, optional, tag = "2")]
    pub metadata: Option<PodSandboxMetadata>,
    #[prost(enumeration = "PodSandboxState", tag = "3")]
    pub state: i32,
    #[prost(map = "string, string", tag = "5")]
    pub labels: HashMap<String, String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListPodSandboxResponse {
    #[prost(message, repeated, tag = "1")]
    pub items: Vec<PodSandbox>,
}

// ---- client ----

const SERVICE: &str = "/runtime.v1.RuntimeService/";

/// A CRI `RuntimeService` client. Cheap to clone; clones share one HTTP/2 connection.
#[derive(Clone)]
pub struct RuntimeClient {
    grpc: tonic::client::Grpc<Channel>,
}

impl RuntimeClient {
    /// Connects to the CRI gRPC server listening on `socket`. Each call times out after `timeout`.
    pub async fn connect(
        socket: &Path,
        timeout: Duration,
    ) -> Result<Self, tonic::transport::Error> {
        let socket: PathBuf = socket.to_owned();
        // The URI is required by the API but unused: the connector always dials the socket.
        let channel =
            Endpoint::from_static("http://cri.invalid")
                .timeout(timeout)
                .connect_with_connector(tower::service_fn(move |_: Uri| {
                    let socket = socket.clone();
                    async move {
                        Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(socket).await?))
                    }
                }))
                .await?;
        Ok(Self {
            grpc: tonic::client::Grpc::new(channel),
        })
    }

    async fn call<Req, Resp>(&self, method: &'static str, req: Req) -> Result<Resp, tonic::Status>
    where
        Req: prost::Message + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        let mut grpc = self.grpc.clone();
        grpc.ready()
            .await
            .map_err(|e| tonic::Status::unavailable(format!("CRI connection not ready: {e}")))?;
        let path = PathAndQuery::try_from(format!("{SERVICE}{method}"))
            .map_err(|e| tonic::Status::internal(e.to_string()))?;
        let codec: ProstCodec<Req, Resp> = ProstCodec::default();
        Ok(grpc
            .unary(tonic::Request::new(req), path, codec)
            .await?
            .into_inner())
    }

    pub async fn version(&self) -> Result<VersionResponse, tonic::Status> {
        let req = VersionRequest {
            version: "v1".into(),
        };
        self.call("Version", req).await
    }

    pub async fn status(&self, verbose: bool) -> Result<StatusResponse, tonic::Status> {
        self.call("Status", StatusRequest { verbose }).await
    }

    /// Whether the runtime reports `NetworkReady=true` (a CNI config is loaded).
    pub async fn network_ready(&self) -> Result<bool, tonic::Status> {
        let status = self.status(false).await?;
        Ok(status
            .status
            .map(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.r#type == "NetworkReady" && c.status)
            })
            .unwrap_or(false))
    }

    pub async fn run_pod_sandbox(&self, config: PodSandboxConfig) -> Result<String, tonic::Status> {
        let req = RunPodSandboxRequest {
            config: Some(config),
            runtime_handler: String::new(),
        };
        let resp: RunPodSandboxResponse = self.call("RunPodSandbox", req).await?;
        Ok(resp.pod_sandbox_id)
    }

    pub async fn pod_sandbox_status(
        &self,
        id: &str,
        verbose: bool,
    ) -> Result<PodSandboxStatusResponse, tonic::Status> {
        let req = PodSandboxStatusRequest {
            pod_sandbox_id: id.into(),
            verbose,
        };
        self.call("PodSandboxStatus", req).await
    }

    pub async fn stop_pod_sandbox(&self, id: &str) -> Result<(), tonic::Status> {
        let req = PodSandboxIdRequest {
            pod_sandbox_id: id.into(),
        };
        let _: Empty = self.call("StopPodSandbox", req).await?;
        Ok(())
    }

    pub async fn remove_pod_sandbox(&self, id: &str) -> Result<(), tonic::Status> {
        let req = PodSandboxIdRequest {
            pod_sandbox_id: id.into(),
        };
        let _: Empty = self.call("RemovePodSandbox", req).await?;
        Ok(())
    }

    pub async fn list_pod_sandbox(&self) -> Result<Vec<PodSandbox>, tonic::Status> {
        let resp: ListPodSandboxResponse = self
            .call("ListPodSandbox", ListPodSandboxRequest { filter: None })
            .await?;
        Ok(resp.items)
    }

    /// The network namespace path of a sandbox, from containerd's verbose status info.
    pub async fn sandbox_netns(&self, id: &str) -> Result<Option<PathBuf>, tonic::Status> {
        let resp = self.pod_sandbox_status(id, true).await?;
        let Some(info) = resp.info.get("info") else {
            return Ok(None);
        };
        let info: serde_json::Value = serde_json::from_str(info)
            .map_err(|e| tonic::Status::internal(format!("sandbox info is not JSON: {e}")))?;
        // containerd 1.6 has it only in the sandbox's runtime spec; later versions also at top.
        let from_spec = info
            .pointer("/runtimeSpec/linux/namespaces")
            .and_then(|n| n.as_array())
            .and_then(|n| {
                n.iter()
                    .find(|ns| ns.get("type").and_then(|t| t.as_str()) == Some("network"))
            })
            .and_then(|ns| ns.get("path"));
        Ok(info
            .get("netNamespacePath")
            .or(from_spec)
            .and_then(|p| p.as_str())
            .filter(|p| !p.is_empty())
            .map(PathBuf::from))
    }
}

/// A sandbox config like kubelet's for a pod `name` in namespace `namespace` (uid derived).
pub fn pod_config(name: &str, namespace: &str, attempt: u32) -> PodSandboxConfig {
    PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: name.into(),
            uid: format!("uid-{namespace}-{name}"),
            namespace: namespace.into(),
            attempt,
        }),
        hostname: name.into(),
        log_directory: String::new(),
        labels: HashMap::from([("cni-guard-test".to_string(), namespace.to_string())]),
        annotations: HashMap::new(),
        linux: Some(LinuxPodSandboxConfig::default()),
    }
}
