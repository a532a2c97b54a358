//! Suite 4: the init container. An OCI image holding only the (static) cni-guard binary, built by
//! scripts/build-image.sh, imported into containerd and run as the DaemonSet's install container
//! would run (host folders for /opt/cni/bin and /etc/cni/net.d mounted in). containerd, not
//! restarted, builds the next sandbox through the guard.
use std::process::Command;
use std::time::{Duration, Instant};

use containerd_conformance::cni::{self, as_conflist, bridge_network, write_atomically};
use containerd_conformance::netns::{random_suffix, run};
use containerd_conformance::{prereq, start_containerd};

use crate::common::{run_sandbox, NETWORK_READY};

const GUARD_IMAGE: &str = "localhost/cni-guard:test";

#[test]
#[ignore = "needs root and containerd: run by scripts/test.d/30-containerd.sh"]
fn init_container_installs_the_guard() {
    const SUITE: &str = "init_container_installs_the_guard";
    if !prereq::can_run(SUITE) {
        return;
    }
    let Some(guard) = prereq::binary(SUITE, "CNI_GUARD_BIN", "cni-guard") else {
        return;
    };
    // The bin dir holds only the reference plugins: the install container brings the guard.
    let ctrd = start_containerd(&[]);
    let conf_dir = ctrd.conf_dir();
    let bin_dir = ctrd.bin_dir();
    let ipam = ctrd.scratch("ipam");
    let cache = ctrd.scratch("guard-cache");
    let net = bridge_network("pods", "cni-pods", "10.80.0.0/24", &ipam);
    write_atomically(&conf_dir, "10-pods.conflist", &as_conflist(&net)).unwrap();
    ctrd.wait_network_ready(NETWORK_READY).unwrap();
    let cri = ctrd.cri();

    // Before: containerd uses the pod network directly.
    let before = ctrd
        .block_on(run_sandbox(&cri, "before", "suite4", 0))
        .unwrap();
    assert!(cni::guard_records(&cache).is_empty());
    assert!(!bin_dir.join("cni-guard").exists());

    // The image: the binary and nothing it does not need.
    let images = tempfile::tempdir().unwrap();
    let tar = images.path().join("cni-guard.tar");
    let files =
        prereq::build_image("guard", &tar, &[guard.to_str().unwrap(), GUARD_IMAGE]).unwrap();
    println!("guard image layer: {files:?}");
    let statically_linked = run(Command::new("ldd").arg(&guard))
        .map(|out| out.contains("statically linked"))
        .unwrap_or(true); // ldd fails on a non-PIE static binary
    if statically_linked {
        assert_eq!(
            files,
            vec!["./cni-guard"],
            "the image holds more than the binary"
        );
    } else {
        assert!(files.contains(&"./cni-guard".to_string()), "{files:?}");
    }
    ctrd.import_image(&tar).unwrap();

    // Run it as the init container: host folders mounted at /host/..., host paths in the flags.
    let mount = |src: &std::path::Path, dst: &str| {
        format!("type=bind,src={},dst={dst},options=rbind:rw", src.display())
    };
    let started = Instant::now();
    let out = run(Command::new("ctr")
        .arg("-a")
        .arg(ctrd.socket())
        .args(["-n", "k8s.io", "run", "--rm"])
        .arg("--mount")
        .arg(mount(&bin_dir, "/host/opt/cni/bin"))
        .arg("--mount")
        .arg(mount(&conf_dir, "/host/etc/cni/net.d"))
        .arg(GUARD_IMAGE)
        .arg(format!("cni-guard-install-{}", random_suffix()))
        // ctr, unlike a pod spec's `args`, replaces the entrypoint: name the binary.
        .args([
            "/cni-guard",
            "install",
            "--bin-dir",
            "/host/opt/cni/bin",
            "--conf-dir",
            "/host/etc/cni/net.d",
        ])
        .arg("--delegate")
        .arg(conf_dir.join("10-pods.conflist"))
        .arg("--cache-dir")
        .arg(&cache)
        .args(["--capability", "portMappings"]))
    .unwrap_or_else(|e| panic!("install container: {e}"));
    println!("install container output:\n{out}");
    assert_eq!(
        std::fs::read(bin_dir.join("cni-guard")).unwrap(),
        std::fs::read(&guard).unwrap(),
        "the installed binary differs from the image's"
    );
    let conflist: serde_json::Value = serde_json::from_slice(
        &std::fs::read(conf_dir.join("00-cni-guard.conflist")).expect("guard conflist written"),
    )
    .unwrap();
    assert_eq!(conflist["plugins"][0]["type"], "cni-guard");

    // containerd picks it up by itself (no restart).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let status = ctrd.block_on(cri.status(true)).unwrap();
        let loaded = status.info.get("cniconfig").cloned().unwrap_or_default();
        if loaded.contains(cni::GUARD_NETWORK) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "containerd did not load the guard: {loaded}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    println!(
        "containerd loaded the guard {:?} after the install container started",
        started.elapsed()
    );

    // After: the next sandbox goes through the guard (its record is the proof).
    let after = ctrd
        .block_on(run_sandbox(&cri, "after", "suite4", 0))
        .unwrap();
    assert!(after.ip.starts_with("10.80.0."), "{after:?}");
    let records = cni::guard_records(&cache);
    assert_eq!(
        records.len(),
        1,
        "the sandbox did not go through the guard: {records:?}"
    );

    for id in [&before.id, &after.id] {
        ctrd.block_on(cri.stop_pod_sandbox(id)).unwrap();
        ctrd.block_on(cri.remove_pod_sandbox(id)).unwrap();
    }
    assert!(cni::reservations(&ipam, "pods").is_empty());
    assert!(cni::guard_records(&cache).is_empty());
    assert!(ctrd.netns().links_of_kind("veth").unwrap().is_empty());
}
