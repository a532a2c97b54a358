//! The record file: what DEL needs to know about an attachment, as one JSON object.

use std::path::PathBuf;

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::error::{Error, Kind, Result};

/// What DEL needs to know about an attachment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub container_id: String,
    pub ifname: String,
    pub network: String,
    pub cni_version: String,
    pub delegate_path: PathBuf,
    /// The delegate configuration's bytes, as loaded at ADD.
    pub delegate: Vec<u8>,
}

#[derive(Deserialize)]
struct RecordFile {
    #[serde(rename = "containerID")]
    container_id: String,
    ifname: String,
    network: String,
    #[serde(rename = "cniVersion")]
    cni_version: String,
    #[serde(rename = "delegatePath")]
    delegate_path: PathBuf,
    delegate: Box<RawValue>,
}

impl Record {
    /// The record file's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let header = serde_json::json!({
            "containerID": self.container_id,
            "ifname": self.ifname,
            "network": self.network,
            "cniVersion": self.cni_version,
            "delegatePath": self.delegate_path,
        });
        let mut out = serde_json::to_vec(&header).expect("strings always serialize");
        // The delegate bytes were validated as JSON when loaded: splice them in unparsed.
        out.pop();
        out.extend_from_slice(b",\"delegate\":");
        out.extend_from_slice(&self.delegate);
        out.extend_from_slice(b"}\n");
        out
    }

    /// Parses a record file's bytes; the error ([`Kind::BadInput`]) says why.
    pub fn decode(bytes: &[u8]) -> Result<Record> {
        let f: RecordFile =
            serde_json::from_slice(bytes).map_err(|e| Error::new(Kind::BadInput, e.to_string()))?;
        Ok(Record {
            container_id: f.container_id,
            ifname: f.ifname,
            network: f.network,
            cni_version: f.cni_version,
            delegate_path: f.delegate_path,
            delegate: f.delegate.get().as_bytes().to_vec(),
        })
    }
}
