//! Runs the real cnitool inside the suite's host namespace.
//!
//! Which cnitool is the run's generation's (`generation`), unless a suite picks another (STATUS
//! and GC need one that has them). cnitool takes the network by name from NETCONFPATH, plugins from CNI_PATH, capability
//! arguments from CAP_ARGS; it derives the container ID from the sandbox's netns path and caches
//! results in /var/lib/cni/results (the fixture removes its networks' entries).
use crate::fixture::Fixture;
use crate::netns::Netns;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

pub struct Cnitool<'a> {
    pub fixture: &'a Fixture,
    pub host: &'a Netns,
    pub netconfpath: PathBuf,
    pub cap_args: Option<String>,
    /// The cnitool binary.
    pub tool: PathBuf,
}

#[derive(Debug)]
pub struct Outcome {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

impl Outcome {
    /// The printed result (ADD): panics with the outcome when it did not succeed.
    pub fn result(&self) -> Value {
        assert!(self.ok, "cnitool failed: {self:?}");
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("cnitool printed no JSON result ({e}): {self:?}"))
    }
}

impl<'a> Cnitool<'a> {
    pub fn new(fixture: &'a Fixture, host: &'a Netns, netconfpath: &Path) -> Cnitool<'a> {
        Cnitool {
            fixture,
            host,
            netconfpath: netconfpath.to_path_buf(),
            cap_args: None,
            tool: crate::prereq::cnitool(),
        }
    }

    /// `cnitool <verb> <net> <sandbox netns path>` in the host namespace.
    pub fn run(&self, verb: &str, net: &str, sandbox: &Netns) -> Outcome {
        let mut cmd: Command = self.host.exec(self.tool.to_str().unwrap());
        cmd.args([verb, net])
            .arg(sandbox.path())
            .env("NETCONFPATH", &self.netconfpath)
            .env("CNI_PATH", &self.fixture.bin)
            .env_remove("CNI_IFNAME")
            .env_remove("CNI_ARGS");
        for (k, v) in self.fixture.tap_env() {
            cmd.env(k, v);
        }
        match &self.cap_args {
            Some(c) => cmd.env("CAP_ARGS", c),
            None => cmd.env_remove("CAP_ARGS"),
        };
        let out = cmd.output().expect("spawn cnitool");
        Outcome {
            ok: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    pub fn add(&self, net: &str, sandbox: &Netns) -> Outcome {
        self.run("add", net, sandbox)
    }
    pub fn check(&self, net: &str, sandbox: &Netns) -> Outcome {
        self.run("check", net, sandbox)
    }
    pub fn del(&self, net: &str, sandbox: &Netns) -> Outcome {
        self.run("del", net, sandbox)
    }
    /// `cnitool status`: libcni's GetStatusNetworkList (the netns argument is not used).
    pub fn status(&self, net: &str, sandbox: &Netns) -> Outcome {
        self.run("status", net, sandbox)
    }
    /// `cnitool gc`: libcni's GCNetworkList with no GC arguments, so every cached attachment of
    /// the network is DELeted first, then every plugin gets GC (1.1.0 and later) without
    /// `cni.dev/valid-attachments` (the netns argument is not used).
    pub fn gc(&self, net: &str, sandbox: &Netns) -> Outcome {
        self.run("gc", net, sandbox)
    }
}

/// The container ID cnitool (1.1.2 and 1.3.1 alike) uses for a sandbox: `cnitool-` and the hex of the first 10
/// bytes of the SHA-512 of the absolute netns path.
pub fn container_id(sandbox: &Netns) -> String {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = Command::new("sha512sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn sha512sum");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(sandbox.path().to_string_lossy().as_bytes())
        .unwrap();
    let out = child.wait_with_output().expect("sha512sum");
    format!("cnitool-{}", &String::from_utf8_lossy(&out.stdout)[..20])
}
