//! Suite 8: GC through the guard (its conflist at 1.1.0), in real namespaces.
//!
//! What reaches the guard, read from libcni 1.3.1's `GCNetworkList`:
//! - first, every attachment libcni has cached for the network (`/var/lib/cni/results`) and
//!   that is not in the valid list gets a DEL, with its cached netns, ifname and args;
//! - then every plugin of a list at 1.1.0 or later gets GC, with no container ID, netns or
//!   ifname, and `cni.dev/valid-attachments` (and `cni.dev/attachments`) only when GC arguments
//!   were given.
//!
//! `cnitool gc` (1.3.1) gives none: every cached attachment is DELeted, and the GC carries no
//! list. A runtime gives the attachments it still runs (containerd 2.x); this suite does what
//! libcni does then: `cnitool del` of the cached attachment outside the list, then the guard's
//! GC with the list, on the configuration libcni would build.
//!
//! Four sandboxes go through the guard: `keep` (valid), `stale` (cached, not valid), `lost`
//! (its pod is gone and the runtime forgot it: netns deleted, cache entry removed, so only the
//! guard's record knows it) and `lost2` (valid at the runtime's GC, forgotten before
//! `cnitool gc`). After the runtime's GC only the valid records are left, GC was forwarded with
//! the list to a delegate whose version has GC, and `keep` still works; after `cnitool gc` and
//! a last GC with an empty list nothing is left but what the delegate's plugins themselves do
//! not collect.
use crate::{binaries, bridge_conflist, host_namespace, put};
use conformance::cnitool::{container_id, Cnitool};
use conformance::fixture::Fixture;
use conformance::generation::generation;
use conformance::leaks::leases;
use conformance::netns::Netns;
use conformance::prereq::can_run_status_gc;
use conformance::sandbox::interfaces;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// The guard's GC as libcni's GCNetworkList sends it with GC arguments: the guard's plugin
/// configuration with `name`, `cniVersion` and both list keys injected; CNI_CONTAINERID,
/// CNI_NETNS, CNI_IFNAME and CNI_ARGS empty. Returns the guard's exit status and stdout.
fn runtime_gc(fx: &Fixture, host: &Netns, conflist: &Value, valid: &[&str]) -> (bool, String) {
    let list: Vec<Value> = valid
        .iter()
        .map(|id| json!({"containerID": id, "ifname": "eth0"}))
        .collect();
    let mut conf = conflist["plugins"][0].clone();
    conf["name"] = conflist["name"].clone();
    conf["cniVersion"] = conflist["cniVersion"].clone();
    conf["cni.dev/valid-attachments"] = json!(list);
    conf["cni.dev/attachments"] = json!(list);
    let mut cmd = host.exec(fx.bin.join("cni-guard").to_str().unwrap());
    cmd.env("CNI_COMMAND", "GC")
        .env("CNI_CONTAINERID", "")
        .env("CNI_NETNS", "")
        .env("CNI_IFNAME", "")
        .env("CNI_ARGS", "")
        .env("CNI_PATH", &fx.bin);
    for (k, v) in fx.tap_env() {
        cmd.env(k, v);
    }
    let out = test_support::run(&mut cmd, conf.to_string().as_bytes());
    (out.status == Some(0), out.stdout_text())
}

/// The guard's records by file name (`<containerID>:<ifname>.json`), sorted.
fn record_names(fx: &Fixture) -> Vec<String> {
    let mut names: Vec<String> = fx
        .guard_records()
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn record(cid: &str) -> String {
    format!("{cid}:eth0.json")
}

/// Host veths, waiting up to 5 s for those of deleted namespaces to go (the kernel removes a
/// netns's devices asynchronously).
fn host_veths_settled(host: &Netns, expected: usize) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let veths = host.links_of_kind("veth");
        if veths.len() <= expected || Instant::now() > deadline {
            return veths;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Sandbox `i`'s pod is gone and the runtime forgot it: its libcni cache entry is removed and
/// its netns deleted (its veth goes with it); the guard's record and the lease stay.
fn forget(fx: &Fixture, sandbox: Netns, cid: &str) {
    for p in fx.cached_results() {
        if p.to_string_lossy().contains(cid) {
            std::fs::remove_file(p).unwrap();
        }
    }
    drop(sandbox);
}

/// The last call of a plugin's GC, checked to have succeeded.
fn last_gc(fx: &Fixture, plugin: &str) -> Option<Value> {
    let r = fx.plugin_records(plugin, "", "GC").pop()?;
    assert_eq!(r["status"], 0, "{plugin} GC failed: {r}");
    Some(r)
}

#[test]
#[ignore = "root: run by scripts/test.d/20-conformance.sh"]
fn gc() {
    if !can_run_status_gc("gc") {
        return;
    }
    println!(); // start on a fresh line after libtest\'s "test ... "
    let gen = generation();
    let fx = Fixture::new(&binaries(), true);
    fx.tap_plugin("bridge");
    fx.tap_plugin("host-local");
    let host = host_namespace();
    let tool = gen.status_gc_cnitool();
    let delegate_version = gen.plugins.newest_cni_version;
    let forwards = delegate_version == "1.1.0";

    let pod_net = fx.network("gc-pod");
    let delegate = put(
        &fx,
        &fx.delegates,
        "00-multus.conflist",
        &bridge_conflist(&fx, &pod_net, delegate_version, "gcbr0", "10.54.0.0/24"),
    );
    let guard_net = fx.network("guard-gc");
    let conflist = fx.guard_conflist(&guard_net, "1.1.0", &delegate, &[]);
    put(&fx, &fx.netd, "00-cni-guard.conflist", &conflist);
    let mut cni = Cnitool::new(&fx, &host, &fx.netd);
    cni.tool = tool.path.clone();

    // keep, stale, lost, lost2: attached through the guard.
    let sandbox = || {
        let ns = Netns::create("cg-gc");
        cni.add(&guard_net, &ns).result();
        assert_eq!(interfaces(&ns), vec!["eth0".to_string()]);
        let cid = container_id(&ns);
        (ns, cid)
    };
    let ((keep_ns, keep), (stale_ns, stale), (lost_ns, lost), (lost2_ns, lost2)) =
        (sandbox(), sandbox(), sandbox(), sandbox());
    let (keep, stale, lost, lost2) = (&keep, &stale, &lost, &lost2);
    let keep_ns = &keep_ns;
    assert_eq!(leases(&fx.leases, &pod_net).len(), 4);
    assert_eq!(record_names(&fx).len(), 4, "one record per attachment");

    // lost: the pod is gone and the runtime forgot it.
    forget(&fx, lost_ns, lost);
    assert_eq!(
        host_veths_settled(&host, 3).len(),
        3,
        "lost's veth went with its netns"
    );

    // 1. The runtime's GC: keep and lost2 are valid. libcni DELs stale (cached), then GCs with
    //    the list.
    let del = cni.del(&guard_net, &stale_ns);
    assert!(del.ok, "DEL of the stale attachment: {del:?}");
    drop(stale_ns);
    let (ok, stdout) = runtime_gc(&fx, &host, &conflist, &[keep, lost2]);
    assert!(ok, "the guard's GC failed: {stdout}");
    let guard_gc = fx.tap_records("", "GC");
    assert_eq!(guard_gc.len(), 1);
    assert_eq!(guard_gc[0]["status"], 0, "{}", guard_gc[0]);
    let mut valid_records = vec![record(keep), record(lost2)];
    valid_records.sort();
    assert_eq!(
        record_names(&fx),
        valid_records,
        "after the runtime's GC only the valid attachments' records stay"
    );
    let bridge_gc = last_gc(&fx, "bridge");
    if forwards {
        let r = bridge_gc.expect("GC forwarded to the delegate");
        let valid = json!([{"containerID": keep, "ifname": "eth0"},
                           {"containerID": lost2, "ifname": "eth0"}]);
        assert_eq!(r["stdin"]["cni.dev/valid-attachments"], valid, "{r}");
        assert_eq!(r["stdin"]["cni.dev/attachments"], valid, "{r}");
        assert_eq!(r["stdin"]["name"], json!(pod_net));
    } else {
        assert!(
            bridge_gc.is_none(),
            "GC sent to a {delegate_version} delegate"
        );
    }
    assert_eq!(
        interfaces(keep_ns),
        vec!["eth0".to_string()],
        "keep lost eth0"
    );
    let holders: Vec<String> = leases(&fx.leases, &pod_net)
        .into_iter()
        .map(|l| l.container_id)
        .collect();
    assert!(holders.contains(keep), "keep's lease went: {holders:?}");
    assert!(holders.contains(lost2), "lost2's lease went: {holders:?}");
    assert!(
        !holders.contains(stale),
        "stale's lease stayed: {holders:?}"
    );
    assert_eq!(
        host.links_of_kind("veth").len(),
        2,
        "keep's and lost2's veths only"
    );
    let check = cni.check(&guard_net, keep_ns);
    assert!(check.ok, "keep fails CHECK after GC: {check:?}");

    // lost2: now its pod is gone too, and the runtime forgot it.
    forget(&fx, lost2_ns, lost2);
    assert_eq!(
        host_veths_settled(&host, 1).len(),
        1,
        "lost2's veth went with its netns"
    );

    // 2. cnitool gc: libcni DELs keep (cached), then GC without a list.
    let out = {
        let mut c = Cnitool::new(&fx, &host, &fx.netd);
        c.tool = tool.path.clone();
        c.gc(&guard_net, keep_ns)
    };
    assert!(out.ok, "cnitool gc: {out:?}");
    let dels = fx.tap_records(keep, "DEL");
    assert_eq!(
        dels.len(),
        1,
        "libcni DELed the cached attachment through the guard"
    );
    assert_eq!(dels[0]["status"], 0, "{}", dels[0]);
    let guard_gc = fx.tap_records("", "GC");
    assert_eq!(guard_gc.len(), 2);
    assert_eq!(guard_gc[1]["status"], 0, "{}", guard_gc[1]);
    assert!(
        guard_gc[1]["stdin"]
            .get("cni.dev/valid-attachments")
            .is_none(),
        "cnitool sent a list: {}",
        guard_gc[1]["stdin"]
    );
    let bridge_gcs = fx.plugin_records("bridge", "", "GC");
    if forwards {
        assert_eq!(bridge_gcs.len(), 2, "GC forwarded again");
        assert_eq!(bridge_gcs[1]["status"], 0, "{}", bridge_gcs[1]);
        // Nothing invented: an empty list would tell the delegate that nothing is valid.
        let sent = &bridge_gcs[1]["stdin"];
        assert!(
            sent.get("cni.dev/valid-attachments").is_none()
                && sent.get("cni.dev/attachments").is_none(),
            "with no list from cnitool the guard told the delegate one: {sent}"
        );
        println!(
            "NOTE gc {}: with no list from cnitool the guard forwarded none to the delegate",
            gen.label()
        );
    } else {
        assert!(bridge_gcs.is_empty());
    }
    assert_eq!(
        interfaces(keep_ns),
        Vec::<String>::new(),
        "keep's eth0 after DEL"
    );
    let after_cnitool = record_names(&fx);
    assert!(
        after_cnitool.iter().all(|r| r == &record(lost2)),
        "records other than the forgotten lost2's after cnitool gc: {after_cnitool:?}"
    );
    if !after_cnitool.is_empty() {
        println!(
            "NOTE gc {}: cnitool gc sends no cni.dev/valid-attachments; the guard kept the \
             record of an attachment libcni did not know ({after_cnitool:?}), and told its \
             delegate nothing either (no list is not an empty list)",
            gen.label()
        );
    }
    // A runtime with no pod left says so with an empty list: the last record goes.
    let (ok, stdout) = runtime_gc(&fx, &host, &conflist, &[]);
    assert!(ok, "the guard's GC with an empty list: {stdout}");
    assert_eq!(record_names(&fx), Vec::<String>::new(), "records left");

    // Nothing left: veths, cache entries, records; leases but those of the forgotten pods,
    // which only the delegate's own GC could free.
    assert_eq!(
        host_veths_settled(&host, 0),
        Vec::<String>::new(),
        "veths left"
    );
    assert_eq!(
        fx.cached_results(),
        Vec::<std::path::PathBuf>::new(),
        "cache left"
    );
    let left: Vec<String> = leases(&fx.leases, &pod_net)
        .into_iter()
        .map(|l| l.container_id)
        .collect();
    assert!(
        left.iter().all(|c| c == lost || c == lost2),
        "leases of attachments the guard and libcni knew: {left:?}"
    );
    if !left.is_empty() {
        // The delegate itself, given GC by cnitool directly, frees no more.
        let mut direct = Cnitool::new(&fx, &host, &fx.delegates);
        direct.tool = tool.path.clone();
        let out = direct.gc(&pod_net, keep_ns);
        assert!(out.ok, "cnitool gc of the delegate itself: {out:?}");
        let after_direct: Vec<String> = leases(&fx.leases, &pod_net)
            .into_iter()
            .map(|l| l.container_id)
            .collect();
        assert_eq!(
            after_direct.len(),
            left.len(),
            "the delegate's own GC freed what the guard's forwarded GC did not"
        );
        println!(
            "NOTE gc {}: {} lease(s) of forgotten pods stay after GC, through the guard and \
             directly alike: bridge {} does not implement GC (nor pass it to its IPAM)",
            gen.label(),
            left.len(),
            gen.plugins.version
        );
    }
    println!(
        "gc {} delegate={delegate_version}: runtime GC (valid=[keep, lost2]) left their records only \
         and {}; cnitool-{} gc DELed keep through the guard and sent GC without a list; no \
         veth, cache entry or record left",
        gen.label(),
        if forwards {
            "was forwarded to bridge with the list"
        } else {
            "was not forwarded (delegate before 1.1.0)"
        },
        tool.version
    );
}
