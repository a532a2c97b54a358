//! Suite 6: 64 sandboxes added and deleted in parallel through the guard.
use crate::{binaries, guarded_bridge, host_namespace};
use conformance::cnitool::Cnitool;
use conformance::fixture::Fixture;
use conformance::leaks::leases;
use conformance::netns::Netns;
use conformance::prereq::can_run;
use conformance::sandbox::{allocated_ips, interfaces};
use std::collections::BTreeSet;
use std::sync::Barrier;

const SANDBOXES: usize = 64;

#[test]
#[ignore = "root: run by scripts/test.d/20-conformance.sh"]
fn concurrency() {
    if !can_run("concurrency", true) {
        return;
    }
    println!(); // start on a fresh line after libtest\'s "test ... "
    let fx = Fixture::new(&binaries(), false);
    let host = host_namespace();
    let (pod_net, guard_net, _) = guarded_bridge(&fx, "conc", "concbr0", "10.49.0.0/24");
    let cni = Cnitool::new(&fx, &host, &fx.netd);
    let sandboxes: Vec<Netns> = (0..SANDBOXES).map(|_| Netns::create("cg-conc")).collect();
    let barrier = Barrier::new(SANDBOXES);

    // Phase 1: all adds at once. A thread reports instead of panicking, so no one is left
    // waiting; failures are asserted after every sandbox has been deleted.
    let added: Vec<Result<String, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = sandboxes
            .iter()
            .map(|sandbox| {
                let (cni, barrier, guard_net) = (&cni, &barrier, &guard_net);
                s.spawn(move || {
                    barrier.wait();
                    let out = cni.add(guard_net, sandbox);
                    if !out.ok {
                        return Err(format!("add failed: {out:?}"));
                    }
                    let ips = serde_json::from_str(&out.stdout).map(|r| allocated_ips(&r));
                    match (ips, interfaces(sandbox)) {
                        (Ok(ips), ifs) if ifs == ["eth0"] && ips.len() == 1 => Ok(ips[0].clone()),
                        (ips, ifs) => Err(format!("after add: {ips:?} interfaces {ifs:?}")),
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("add thread"))
            .collect()
    });
    // Phase 2: all dels at once.
    let deleted: Vec<Result<(), String>> = std::thread::scope(|s| {
        let handles: Vec<_> = sandboxes
            .iter()
            .map(|sandbox| {
                let (cni, guard_net) = (&cni, &guard_net);
                s.spawn(move || {
                    let out = cni.del(guard_net, sandbox);
                    match (out.ok, interfaces(sandbox)) {
                        (true, ifs) if ifs.is_empty() => Ok(()),
                        (ok, ifs) => Err(format!("del ok={ok} left {ifs:?}: {out:?}")),
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("del thread"))
            .collect()
    });
    let failed: Vec<&String> = added.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(failed.is_empty(), "adds failed: {failed:?}");
    let del_failed: Vec<&String> = deleted.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(del_failed.is_empty(), "dels failed: {del_failed:?}");
    let addresses: Vec<&String> = added.iter().filter_map(|r| r.as_ref().ok()).collect();
    let distinct: BTreeSet<&&String> = addresses.iter().collect();
    assert_eq!(
        distinct.len(),
        SANDBOXES,
        "addresses were not distinct: {addresses:?}"
    );
    assert_eq!(leases(&fx.leases, &pod_net), vec![], "leases left");
    assert_eq!(
        host.links_of_kind("veth"),
        Vec::<String>::new(),
        "host veths left"
    );
    assert!(
        fx.guard_records().is_empty(),
        "records left: {:?}",
        fx.guard_records()
    );
    assert_eq!(
        fx.cached_results(),
        Vec::<std::path::PathBuf>::new(),
        "result cache left"
    );
    println!(
        "concurrency {}: {SANDBOXES} parallel adds and dels through the guard, distinct addresses, nothing left",
        conformance::generation::generation().label()
    );
}
