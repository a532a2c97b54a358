//! Suite 1: a pod sandbox through the CRI, first on a plain bridge (the harness's baseline), then
//! through the guard with a delegate present; on containerd 1.6 and 2.x.
use std::path::Path;

use containerd_conformance::cni::{self, as_conflist, bridge_network, write_atomically};
use containerd_conformance::containerd::cni_results_for;
use containerd_conformance::{on_both_generations, prereq, start_containerd, Generation};

use crate::common::{run_sandbox, NETWORK_READY};

fn assert_in_subnet(ip: &str, prefix: &str) {
    assert!(ip.starts_with(prefix), "IP {ip:?} is not in {prefix}0/24");
}

on_both_generations!(sandbox_on_a_plain_bridge);

fn sandbox_on_a_plain_bridge(generation: Generation) {
    if !prereq::can_run("sandbox_on_a_plain_bridge", generation) {
        return;
    }
    let ctrd = start_containerd(generation, &[]);
    let ipam = ctrd.scratch("ipam");
    let net = bridge_network("pods", "cni-pods", "10.77.0.0/24", &ipam);
    write_atomically(&ctrd.conf_dir(), "10-pods.conflist", &as_conflist(&net)).unwrap();
    ctrd.wait_network_ready(NETWORK_READY).unwrap();
    let crictl = ctrd.crictl();
    let (name, version, api) = crictl.version().unwrap();
    println!(
        "CRI runtime: {name} {version} (CRI API {api}) = {}",
        ctrd.runtime_name()
    );
    assert_eq!(name, "containerd");
    assert_eq!(api, "v1");
    // The private config is in the daemon's own format (2.4 migrates a version 3 file at every
    // start, saying so).
    assert!(
        !ctrd.log().contains("Configuration migrated"),
        "containerd migrated the suite's config:\n{}",
        ctrd.log_tail(40)
    );

    let sb = run_sandbox(crictl, "plain", "suite1", 0).unwrap();
    println!(
        "plain bridge sandbox {} ip={} {:?}",
        sb.id, sb.ip, sb.interfaces
    );
    assert_in_subnet(&sb.ip, "10.77.0.");
    let names: Vec<&str> = sb.interfaces.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names, vec!["eth0"]);
    assert_eq!(sb.interfaces[0].ipv4, vec![sb.ip.clone()]);
    assert_eq!(cni::reservations(&ipam, "pods"), vec![sb.ip.clone()]);

    crictl.stopp(&sb.id).unwrap();
    crictl.rmp(&sb.id).unwrap();
    assert_clean(&ctrd, &ipam, "pods", &sb.id);
}

pub fn assert_clean(
    ctrd: &containerd_conformance::Containerd,
    ipam: &Path,
    network: &str,
    id: &str,
) {
    assert!(
        cni::reservations(ipam, network).is_empty(),
        "host-local reservations left: {:?}",
        cni::reservations(ipam, network)
    );
    let veths = ctrd.netns().links_of_kind("veth").unwrap();
    assert!(
        veths.is_empty(),
        "veths left in containerd's namespace: {veths:?}"
    );
    assert!(
        cni_results_for(id).is_empty(),
        "libcni cache entries left for {id}"
    );
    let left = ctrd.crictl().pods().unwrap();
    assert!(left.is_empty(), "sandboxes left: {left:?}");
}

on_both_generations!(sandbox_through_the_guard);

fn sandbox_through_the_guard(generation: Generation) {
    const SUITE: &str = "sandbox_through_the_guard";
    if !prereq::can_run(SUITE, generation) {
        return;
    }
    let Some(guard) = prereq::binary(SUITE, "CNI_GUARD_BIN", "cni-guard") else {
        return;
    };
    let ctrd = start_containerd(generation, &[("cni-guard", &guard)]);
    let ipam = ctrd.scratch("ipam");
    let cache = ctrd.scratch("guard-cache");
    let delegates = ctrd.scratch("delegates");
    let net = bridge_network("pods", "cni-pods", "10.78.0.0/24", &ipam);
    write_atomically(&delegates, "10-pods.conflist", &as_conflist(&net)).unwrap();
    let delegate = delegates.join("10-pods.conflist");
    let guard_conf = cni::guard_conflist(&delegate, &[], 0, &cache);
    write_atomically(&ctrd.conf_dir(), "00-cni-guard.conflist", &guard_conf).unwrap();
    ctrd.wait_network_ready(NETWORK_READY).unwrap();
    let crictl = ctrd.crictl();

    let sb = run_sandbox(crictl, "guarded", "suite1", 0).unwrap();
    println!(
        "{}: guarded sandbox {} ip={} {:?}",
        ctrd.runtime_name(),
        sb.id,
        sb.ip,
        sb.interfaces
    );
    // The delegate's interface, with the address the delegate's IPAM gave, reported by the CRI.
    assert_in_subnet(&sb.ip, "10.78.0.");
    let names: Vec<&str> = sb.interfaces.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names, vec!["eth0"]);
    assert_eq!(sb.interfaces[0].ipv4, vec![sb.ip.clone()]);
    assert_eq!(cni::reservations(&ipam, "pods"), vec![sb.ip.clone()]);
    let records = cni::guard_records(&cache);
    assert_eq!(
        records.len(),
        1,
        "one guard record per attachment: {records:?}"
    );
    let veths = ctrd.netns().links_of_kind("veth").unwrap();
    assert_eq!(veths.len(), 1, "one host-side veth: {veths:?}");

    crictl.stopp(&sb.id).unwrap();
    crictl.rmp(&sb.id).unwrap();
    assert_clean(&ctrd, &ipam, "pods", &sb.id);
    let records = cni::guard_records(&cache);
    assert!(records.is_empty(), "guard records left: {records:?}");
    assert!(
        !ctrd.log().contains("Failed to destroy network"),
        "containerd logged a failed teardown"
    );
    // containerd really went through the guard, both ways.
    let lines: Vec<String> = ctrd
        .guard_log()
        .into_iter()
        .filter(|l| l.contains(&format!("container={} ", sb.id)))
        .collect();
    println!("the guard's log:\n  {}", lines.join("\n  "));
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("verb=ADD") && !l.contains("decision=refused")),
        "no ADD through the guard logged: {lines:?}"
    );
    assert!(
        lines.iter().any(|l| l.starts_with("verb=DEL")),
        "no DEL through the guard logged: {lines:?}"
    );
}
