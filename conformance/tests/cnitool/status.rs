//! Suite 7: `cnitool status` through the guard (its conflist at 1.1.0).
//!
//! cnitool (1.3.1) runs libcni's GetStatusNetworkList: STATUS to every plugin of a list at
//! 1.1.0 or later, nothing at all before. While the delegate or an attachment is missing the
//! guard answers 50 naming it, at once (STATUS never waits, even with `waitSeconds`); once both
//! are there it answers success after the delegate's own STATUS, where the delegate's version has
//! STATUS (reference plugins 1.10: bridge implements it and asks its IPAM; 1.1.1 stop at 1.0.0).
//! cnitool drops the CNI code: cni-tap records the guard's reply and the plugins' calls.
use crate::{binaries, bridge_conflist, host_namespace, put};
use conformance::cnitool::Cnitool;
use conformance::fixture::Fixture;
use conformance::generation::generation;
use conformance::leaks::leases;
use conformance::netns::Netns;
use conformance::prereq::can_run_status_gc;
use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, Instant};

/// The guard's last STATUS reply (STATUS has no container ID).
fn last_reply(fx: &Fixture) -> Value {
    fx.tap_records("", "STATUS")
        .pop()
        .expect("the guard's STATUS reply was recorded")
}

/// STATUS while `missing` is missing: code 50 naming it, at once, nothing run or created.
fn not_ready(fx: &Fixture, cni: &Cnitool, host: &Netns, guard_net: &str, missing: &Path) {
    let bridge_calls = fx.plugin_records("bridge", "", "STATUS").len();
    let started = Instant::now();
    let out = cni.status(guard_net, host);
    let took = started.elapsed();
    assert!(
        !out.ok,
        "status succeeded with {} missing",
        missing.display()
    );
    let named = missing.display().to_string();
    assert!(
        out.stderr.contains(&named),
        "cnitool's error does not name {named}: {}",
        out.stderr
    );
    let record = last_reply(fx);
    let reply: Value = serde_json::from_str(record["stdout"].as_str().unwrap()).expect("JSON");
    assert_eq!(reply["code"], 50, "not code 50: {reply}");
    assert_eq!(record["status"], 1, "exit status: {record}");
    assert!(
        reply["msg"].as_str().unwrap_or_default().contains(&named),
        "msg does not name {named}: {reply}"
    );
    assert!(
        took < Duration::from_secs(5),
        "STATUS waited ({took:?}) although it never waits"
    );
    assert_eq!(
        fx.plugin_records("bridge", "", "STATUS").len(),
        bridge_calls,
        "the delegate's STATUS ran while not ready"
    );
    println!(
        "status {}: code 50 in {:.0} ms: {}",
        generation().label(),
        took.as_secs_f64() * 1000.0,
        reply["msg"].as_str().unwrap_or_default()
    );
}

#[test]
#[ignore = "root: run by scripts/test.d/20-conformance.sh"]
fn status() {
    if !can_run_status_gc("status") {
        return;
    }
    println!(); // start on a fresh line after libtest\'s "test ... "
    let gen = generation();
    let fx = Fixture::new(&binaries(), true);
    for plugin in ["bridge", "host-local", "ptp", "macvlan"] {
        fx.tap_plugin(plugin);
    }
    let host = host_namespace();
    let tool = gen.status_gc_cnitool();
    let mut cni = Cnitool::new(&fx, &host, &fx.netd);
    cni.tool = tool.path.clone();
    let mut direct = Cnitool::new(&fx, &host, &fx.delegates);
    direct.tool = tool.path.clone();
    let delegate_version = gen.plugins.newest_cni_version;

    let pod_net = fx.network("st-pod");
    let delegate = fx.delegates.join("00-multus.conflist");
    let vlan_net = fx.network("st-vlan");
    let vlan = fx.delegates.join("vlan.conf");
    let guard_net = fx.network("guard-st");
    let mut conflist = fx.guard_conflist(&guard_net, "1.1.0", &delegate, &[&vlan]);
    conflist["plugins"][0]["waitSeconds"] = json!(30);
    put(&fx, &fx.netd, "00-cni-guard.conflist", &conflist);

    not_ready(&fx, &cni, &host, &guard_net, &delegate);
    let pod = bridge_conflist(&fx, &pod_net, delegate_version, "stbr0", "10.52.0.0/24");
    put(&fx, &fx.delegates, "00-multus.conflist", &pod);
    not_ready(&fx, &cni, &host, &guard_net, &vlan);
    put(
        &fx,
        &fx.delegates,
        "vlan.conf",
        &json!({"cniVersion": delegate_version, "name": vlan_net, "type": "bridge",
            "bridge": "stbr1", "ipam": fx.host_local("10.53.0.0/24")}),
    );

    let out = cni.status(&guard_net, &host);
    assert!(out.ok, "status failed with everything present: {out:?}");
    let record = last_reply(&fx);
    assert_eq!(record["status"], 0, "guard's STATUS: {record}");
    assert_eq!(record["stdout"], "", "STATUS prints nothing on success");
    let bridge = fx.plugin_records("bridge", "", "STATUS");
    let ipam = fx.plugin_records("host-local", "", "STATUS");
    let has_status = delegate_version == "1.1.0";
    if has_status {
        assert_eq!(bridge.len(), 1, "the delegate's STATUS was not called once");
        assert_eq!(bridge[0]["status"], 0, "bridge STATUS: {}", bridge[0]);
        assert_eq!(bridge[0]["stdin"]["name"], json!(pod_net));
        assert_eq!(bridge[0]["stdin"]["cniVersion"], json!(delegate_version));
        assert_eq!(ipam.len(), 1, "bridge asked its IPAM for STATUS once");
        assert_eq!(ipam[0]["status"], 0, "host-local STATUS: {}", ipam[0]);
    } else {
        assert!(
            bridge.is_empty() && ipam.is_empty(),
            "STATUS sent to a {delegate_version} delegate: {bridge:?}"
        );
    }
    // The same calls as cnitool status on the delegate directly.
    let direct_out = direct.status(&pod_net, &host);
    assert!(
        direct_out.ok,
        "status of the delegate itself: {direct_out:?}"
    );
    assert_eq!(
        fx.plugin_records("bridge", "", "STATUS").len(),
        2 * bridge.len(),
        "the guard sent STATUS where libcni does not, or the reverse"
    );
    assert_eq!(
        fx.plugin_records("host-local", "", "STATUS").len(),
        2 * ipam.len()
    );

    // ptp and macvlan delegates: STATUS reaches them too where their version has it.
    let mut others = Vec::new();
    for (plugin, extra) in [
        ("ptp", json!({"ipMasq": false})),
        ("macvlan", json!({"master": "lo", "mode": "bridge"})),
    ] {
        let mut conf = json!({"type": plugin, "ipam": fx.host_local("10.55.0.0/24")});
        conf.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let net = json!({"cniVersion": delegate_version, "name": pod_net, "plugins": [conf]});
        put(&fx, &fx.delegates, "00-multus.conflist", &net);
        let out = cni.status(&guard_net, &host);
        assert!(out.ok, "status with a {plugin} delegate: {out:?}");
        let calls = fx.plugin_records(plugin, "", "STATUS");
        assert_eq!(
            calls.len(),
            usize::from(has_status),
            "{plugin} STATUS calls"
        );
        assert!(calls.iter().all(|c| c["status"] == 0), "{calls:?}");
        others.push(format!("{plugin}={}", calls.len()));
    }

    // STATUS creates nothing.
    assert_eq!(host.links_of_kind("veth"), Vec::<String>::new());
    assert_eq!(host.links_of_kind("bridge"), Vec::<String>::new());
    assert_eq!(leases(&fx.leases, &pod_net), vec![]);
    assert!(fx.guard_records().is_empty(), "{:?}", fx.guard_records());
    println!(
        "status {} delegate={delegate_version}: cnitool-{} status through the guard: 50 naming \
         the missing delegate, then the missing attachment, never waiting; success when present, \
         after STATUS of bridge={} host-local={} {} (as libcni calls the delegate directly)",
        gen.label(),
        tool.version,
        bridge.len(),
        ipam.len(),
        others.join(" ")
    );
}
