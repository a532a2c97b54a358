//! Suite 4: DEL works from the guard's record after the delegate file is gone.
use crate::{binaries, guarded_bridge, host_namespace};
use conformance::cnitool::Cnitool;
use conformance::fixture::Fixture;
use conformance::leaks::leases;
use conformance::netns::Netns;
use conformance::prereq::can_run;
use conformance::sandbox::interfaces;

#[test]
#[ignore = "root: run by scripts/test.d/20-conformance.sh"]
fn del_without_delegate() {
    if !can_run("del_without_delegate", true) {
        return;
    }
    println!(); // start on a fresh line after libtest\'s "test ... "
    let fx = Fixture::new(&binaries(), false);
    let host = host_namespace();
    let (pod_net, guard_net, delegate) = guarded_bridge(&fx, "dwd", "dwdbr0", "10.48.0.0/24");
    let cni = Cnitool::new(&fx, &host, &fx.netd);
    let sandbox = Netns::create("cg-dwd");

    let added = cni.add(&guard_net, &sandbox);
    added.result();
    assert_eq!(interfaces(&sandbox), vec!["eth0".to_string()]);
    assert_eq!(
        leases(&fx.leases, &pod_net).len(),
        1,
        "lease while attached"
    );
    assert_eq!(
        host.links_of_kind("veth").len(),
        1,
        "host veth while attached"
    );
    assert!(
        !fx.guard_records().is_empty(),
        "the guard wrote no record at ADD"
    );

    std::fs::remove_file(&delegate).unwrap();
    let deleted = cni.del(&guard_net, &sandbox);
    assert!(deleted.ok, "del without the delegate failed: {deleted:?}");
    assert_eq!(leases(&fx.leases, &pod_net), vec![], "lease left");
    assert_eq!(
        host.links_of_kind("veth"),
        Vec::<String>::new(),
        "host veth left"
    );
    assert_eq!(
        interfaces(&sandbox),
        Vec::<String>::new(),
        "sandbox interface left"
    );
    assert!(
        fx.guard_records().is_empty(),
        "record left: {:?}",
        fx.guard_records()
    );
    assert_eq!(
        fx.cached_results(),
        Vec::<std::path::PathBuf>::new(),
        "result cache left"
    );
    println!(
        "del_without_delegate {}: del succeeded from the record; lease, veth and record gone",
        conformance::generation::generation().label()
    );
}
