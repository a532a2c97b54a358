//! Network namespaces with random suffixes that delete themselves on Drop.
use crate::{must, run};
use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;

pub struct Netns {
    name: String,
}

impl Netns {
    /// `ip netns add <prefix>-p<pid>-<random>` with `lo` up (see `test_support::netns`).
    pub fn create(prefix: &str) -> Netns {
        let name = test_support::netns::name(prefix);
        must(Command::new("ip").args(["netns", "add", &name]));
        let ns = Netns { name };
        must(ns.ip().args(["link", "set", "lo", "up"]));
        ns
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn path(&self) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.name)
    }

    /// `ip -n <name> ...`
    pub fn ip(&self) -> Command {
        let mut c = Command::new("ip");
        c.args(["-n", &self.name]);
        c
    }

    /// `ip netns exec <name> <program>`: the program and its children run inside.
    pub fn exec(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, program]);
        c
    }

    /// `ip -j -d link show` inside, parsed.
    pub fn links(&self) -> Vec<Value> {
        let out = must(self.ip().args(["-j", "-d", "link", "show"]));
        serde_json::from_str(&out).unwrap_or_default()
    }

    /// Names of all links inside, sorted.
    pub fn link_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .links()
            .iter()
            .filter_map(|l| l.get("ifname").and_then(Value::as_str).map(String::from))
            .collect();
        names.sort();
        names
    }

    /// Links of one kind (`veth`, `bridge`, `macvlan`, ...), by name.
    pub fn links_of_kind(&self, kind: &str) -> Vec<String> {
        self.links()
            .iter()
            .filter(|l| l.pointer("/linkinfo/info_kind").and_then(Value::as_str) == Some(kind))
            .filter_map(|l| l.get("ifname").and_then(Value::as_str).map(String::from))
            .collect()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Err(e) = run(Command::new("ip").args(["netns", "del", &self.name])) {
            eprintln!("warning: {e}");
        }
    }
}
