//! Suite 2: delegates at 0.3.1, 0.4.0, 1.0.0 behind guard conflists at each of them (9 pairs).
//! Delegates at 1.1.0 too where the plugins have it (reference plugins 1.10), guards at 1.1.0
//! too where cnitool's libcni parses 1.1.0 results (1.3.1; 1.1.2 refuses "unsupported CNI
//! result version"): 16 pairs with both current, 12 with one of them.
use crate::{binaries, bridge_conflist, host_namespace, put};
use conformance::cnitool::Cnitool;
use conformance::fixture::Fixture;
use conformance::generation::generation;
use conformance::leaks::leases;
use conformance::netns::Netns;
use conformance::prereq::can_run;
use conformance::sandbox::{allocated_ips, interfaces};

const VERSIONS: [&str; 4] = ["0.3.1", "0.4.0", "1.0.0", "1.1.0"];

/// The versions up to `newest`.
fn up_to(newest: &str) -> Vec<&'static str> {
    let end = VERSIONS
        .iter()
        .position(|v| *v == newest)
        .expect("a known version")
        + 1;
    VERSIONS[..end].to_vec()
}

fn pair(fx: &Fixture, host: &Netns, index: usize, delegate_version: &str, guard_version: &str) {
    let label = format!("d{delegate_version}-g{guard_version}");
    let delegate_net = fx.network(&format!("ver{index}"));
    let subnet = format!("10.50.{index}.0/24");
    let delegate = bridge_conflist(
        fx,
        &delegate_net,
        delegate_version,
        &format!("vbr{index}"),
        &subnet,
    );
    let delegate_path = put(
        fx,
        &fx.delegates,
        &format!("ver{index}.conflist"),
        &delegate,
    );
    let guard_net = fx.network(&format!("guard-ver{index}"));
    put(
        fx,
        &fx.netd,
        &format!("00-cni-guard-{index}.conflist"),
        &fx.guard_conflist(&guard_net, guard_version, &delegate_path, &[]),
    );
    let cni = Cnitool::new(fx, host, &fx.netd);
    let sandbox = Netns::create("cg-ver");

    let added = cni.add(&guard_net, &sandbox);
    let result = added.result();
    assert_eq!(
        result["cniVersion"].as_str(),
        Some(guard_version),
        "{label}: result not in the guard's version: {result}"
    );
    let ips = allocated_ips(&result);
    assert_eq!(ips.len(), 1, "{label}: one address expected in {result}");
    assert!(
        ips[0].starts_with(&format!("10.50.{index}.")),
        "{label}: {ips:?} not in {subnet}"
    );
    assert_eq!(
        interfaces(&sandbox),
        vec!["eth0".to_string()],
        "{label}: sandbox interfaces"
    );
    let addr = conformance::must(sandbox.ip().args(["-4", "-o", "addr", "show", "eth0"]));
    assert!(
        addr.contains(&format!("{}/", ips[0])),
        "{label}: eth0 lacks {}: {addr}",
        ips[0]
    );
    assert_eq!(leases(&fx.leases, &delegate_net).len(), 1, "{label}: lease");

    let deleted = cni.del(&guard_net, &sandbox);
    assert!(deleted.ok, "{label}: del failed: {deleted:?}");
    assert_eq!(
        interfaces(&sandbox),
        Vec::<String>::new(),
        "{label}: interfaces left"
    );
    assert_eq!(
        leases(&fx.leases, &delegate_net),
        vec![],
        "{label}: lease left"
    );
    println!(
        "versions {} {label}: add parsed by cnitool (result {guard_version}), del clean",
        generation().label()
    );
}

#[test]
#[ignore = "root: run by scripts/test.d/20-conformance.sh"]
fn versions() {
    if !can_run("versions", true) {
        return;
    }
    println!(); // start on a fresh line after libtest\'s "test ... "
    let fx = Fixture::new(&binaries(), false);
    let host = host_namespace();
    let gen = generation();
    let (delegates, guards) = (
        up_to(gen.plugins.newest_cni_version),
        up_to(gen.cnitool.newest_cni_version),
    );
    std::thread::scope(|s| {
        let mut index = 0;
        for &delegate_version in &delegates {
            for &guard_version in &guards {
                let (fx, host) = (&fx, &host);
                s.spawn(move || pair(fx, host, index, delegate_version, guard_version));
                index += 1;
            }
        }
    });
    assert_eq!(
        host.links_of_kind("veth"),
        Vec::<String>::new(),
        "host veths left"
    );
    assert_eq!(
        fx.cached_results(),
        Vec::<std::path::PathBuf>::new(),
        "result cache left"
    );
    assert!(
        fx.guard_records().is_empty(),
        "guard records left: {:?}",
        fx.guard_records()
    );
    println!(
        "versions {}: {} pairs (delegates {} x guards {}) parsed by cnitool, del clean",
        gen.label(),
        delegates.len() * guards.len(),
        delegates.join("/"),
        guards.join("/")
    );
}
