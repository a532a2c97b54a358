//! Suite 4: the init container. An OCI image holding only the (static) cni-guard plugin and its
//! agent, built by scripts/build-image.sh, imported into containerd and run as the DaemonSet's
//! install container would run (host folders for /opt/cni/bin and /etc/cni/net.d mounted in). containerd, not
//! restarted, builds the next sandbox through the guard.
use std::process::Command;
use std::time::{Duration, Instant};

use containerd_conformance::cni::{self, as_conflist, bridge_network, write_atomically};
use containerd_conformance::netns::{random_suffix, run};
use containerd_conformance::{on_both_generations, prereq, start_containerd, Generation};

use crate::common::{run_sandbox, NETWORK_READY};

const GUARD_IMAGE: &str = "localhost/cni-guard:test";

on_both_generations!(init_container_installs_the_guard);

fn init_container_installs_the_guard(generation: Generation) {
    const SUITE: &str = "init_container_installs_the_guard";
    if !prereq::can_run(SUITE, generation) {
        return;
    }
    let Some(guard) = prereq::binary(SUITE, "CNI_GUARD_BIN", "cni-guard") else {
        return;
    };
    // The bin dir holds only the reference plugins: the install container brings the guard.
    let ctrd = start_containerd(generation, &[]);
    let conf_dir = ctrd.conf_dir();
    let bin_dir = ctrd.bin_dir();
    let ipam = ctrd.scratch("ipam");
    let cache = ctrd.scratch("guard-cache");
    let net = bridge_network("pods", "cni-pods", "10.80.0.0/24", &ipam);
    write_atomically(&conf_dir, "10-pods.conflist", &as_conflist(&net)).unwrap();
    ctrd.wait_network_ready(NETWORK_READY).unwrap();
    let crictl = ctrd.crictl();

    // Before: containerd uses the pod network directly.
    let before = run_sandbox(crictl, "before", "suite4", 0).unwrap();
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
            vec!["./cni-guard", "./cni-guard-agent"],
            "the image holds more than the plugin and the agent"
        );
    } else {
        for f in ["./cni-guard", "./cni-guard-agent"] {
            assert!(files.contains(&f.to_string()), "{files:?}");
        }
    }
    ctrd.import_image(&tar).unwrap();

    // Run it as the init container: host folders mounted at /host/..., host paths in the flags.
    let mount = |src: &std::path::Path, dst: &str| {
        format!("type=bind,src={},dst={dst},options=rbind:rw", src.display())
    };
    let started = Instant::now();
    let out = run(Command::new(generation.ctr())
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
            "/cni-guard-agent",
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
        let info = crictl.info().unwrap();
        let loaded = info["cniconfig"].to_string();
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
        "{} loaded the guard {:?} after the install container started",
        ctrd.runtime_name(),
        started.elapsed()
    );

    // After: the next sandbox goes through the guard (its record is the proof).
    let after = run_sandbox(crictl, "after", "suite4", 0).unwrap();
    assert!(after.ip.starts_with("10.80.0."), "{after:?}");
    let records = cni::guard_records(&cache);
    assert_eq!(
        records.len(),
        1,
        "the sandbox did not go through the guard: {records:?}"
    );

    for id in [&before.id, &after.id] {
        crictl.stopp(id).unwrap();
        crictl.rmp(id).unwrap();
    }
    assert!(cni::reservations(&ipam, "pods").is_empty());
    assert!(cni::guard_records(&cache).is_empty());
    assert!(ctrd.netns().links_of_kind("veth").unwrap().is_empty());
}
