//! The cnitool conformance suites: cni-guard driven by the real cnitool over the reference
//! plugins, in network namespaces the suites create and remove. Which cnitool and which
//! plugins (Debian's 1.1.2 and 1.1.1, or the current releases) is the run's `generation`
//! (`CONFORMANCE_PLUGINS`, `CONFORMANCE_CNITOOL`); the suites are the same for each.
//!
//! Root only. They are `#[ignore]`d in the plain `cargo test --workspace` run (they need the
//! release guard binary); `scripts/test.d/20-conformance.sh` runs them with `--ignored`.
//! Locally without root they skip loudly; under CI=true a missing prerequisite fails.
mod concurrency;
mod del_without_delegate;
mod equivalence;
mod gc;
mod race;
mod refusal;
mod status;
mod versions;

use conformance::fixture::{Binaries, Fixture};
use conformance::netns::Netns;
use serde_json::{json, Value};
use std::path::Path;

pub fn binaries() -> Binaries {
    Binaries::new(
        env!("CARGO_BIN_EXE_mini-multus"),
        env!("CARGO_BIN_EXE_cni-tap"),
    )
}

/// The suite's host namespace: where cnitool and the plugins run, where bridges live.
pub fn host_namespace() -> Netns {
    Netns::create("cg-host")
}

/// bridge + host-local, the plain pod network.
pub fn bridge_conflist(
    fx: &Fixture,
    name: &str,
    version: &str,
    bridge: &str,
    subnet: &str,
) -> Value {
    json!({
        "cniVersion": version,
        "name": name,
        "plugins": [{
            "type": "bridge",
            "bridge": bridge,
            "isGateway": true,
            "ipam": fx.host_local(subnet),
        }],
    })
}

/// A parent link for macvlan in the host namespace: a dummy where the kernel has it, else one
/// end of a veth pair (this machine's kernel has no dummy driver).
pub fn macvlan_parent(host: &Netns, name: &str) {
    let dummy = conformance::run(host.ip().args(["link", "add", name, "type", "dummy"]));
    if dummy.is_err() {
        let peer = format!("{name}p");
        conformance::must(
            host.ip()
                .args(["link", "add", name, "type", "veth", "peer", "name", &peer]),
        );
        conformance::must(host.ip().args(["link", "set", &peer, "up"]));
    }
    conformance::must(host.ip().args(["link", "set", name, "up"]));
}

/// The guarded layout most suites start from: a bridge + host-local delegate network
/// (`<tag>-pod`) and the guard's conflist first in the conf dir, pointing at it.
/// Returns the delegate's network name, the guard's network name and the delegate's path.
pub fn guarded_bridge(
    fx: &Fixture,
    tag: &str,
    bridge: &str,
    subnet: &str,
) -> (String, String, std::path::PathBuf) {
    let pod_net = fx.network(&format!("{tag}-pod"));
    let delegate = put(
        fx,
        &fx.delegates,
        "00-multus.conflist",
        &bridge_conflist(fx, &pod_net, "1.0.0", bridge, subnet),
    );
    let guard_net = fx.network(&format!("guard-{tag}"));
    put(
        fx,
        &fx.netd,
        "00-cni-guard.conflist",
        &fx.guard_conflist(&guard_net, "1.0.0", &delegate, &[]),
    );
    (pod_net, guard_net, delegate)
}

/// Writes `value` to `dir/file` and returns the path.
pub fn put(fx: &Fixture, dir: &Path, file: &str, value: &Value) -> std::path::PathBuf {
    let p = dir.join(file);
    fx.write(&p, value);
    p
}
