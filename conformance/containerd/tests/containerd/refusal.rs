//! Suite 2: the guard's refusal as kubelet sees it. The delegate is missing: RunPodSandbox fails
//! with the guard's message (what `kubectl describe pod` shows), containerd's deferred DEL
//! succeeds, and a kubelet-like retry loop gets a running sandbox once the delegate appears.
use std::path::Path;
use std::time::{Duration, Instant};

use containerd_conformance::cni::{self, as_conf, bridge_network, write_atomically};
use containerd_conformance::containerd::cni_results_for;
use containerd_conformance::{on_both_generations, prereq, start_containerd, Generation};

use crate::common::{run_sandbox, NETWORK_READY};

/// kubelet's pod worker requeues a pod whose sync failed after `backOffPeriod` (10 s) jittered
/// by `workerBackOffPeriodJitterFactor` (0.5): each retry comes 10 to 15 s after the last.
const KUBELET_BACKOFF: Duration = Duration::from_secs(10);
const KUBELET_JITTER: f64 = 0.5;

/// When the delegate appears, counted from the first RunPodSandbox.
const DELEGATE_ARRIVES_AFTER: Duration = Duration::from_secs(3);

fn jittered(base: Duration) -> Duration {
    let r = u32::from_str_radix(&containerd_conformance::netns::random_suffix(), 16).unwrap_or(0);
    base.mul_f64(1.0 + KUBELET_JITTER * (r as f64 / u32::MAX as f64))
}

on_both_generations!(refusal_as_kubelet_sees_it);

fn refusal_as_kubelet_sees_it(generation: Generation) {
    const SUITE: &str = "refusal_as_kubelet_sees_it";
    if !prereq::can_run(SUITE, generation) {
        return;
    }
    let Some(guard) = prereq::binary(SUITE, "CNI_GUARD_BIN", "cni-guard") else {
        return;
    };
    for wait_seconds in [0, 10] {
        refuse_then_retry(generation, &guard, wait_seconds);
    }
}

fn refuse_then_retry(generation: Generation, guard: &Path, wait_seconds: u64) {
    let ctrd = start_containerd(generation, &[("cni-guard", guard)]);
    let runtime = ctrd.runtime_name();
    let conf_dir = ctrd.conf_dir();
    let ipam = ctrd.scratch("ipam");
    let cache = ctrd.scratch("guard-cache");
    // The delegate lives where Multus writes it: in containerd's conf dir, after the guard.
    let delegate = conf_dir.join("00-multus.conf");
    let guard_conf = cni::guard_conflist(&delegate, &[], wait_seconds, &cache);
    write_atomically(&conf_dir, "00-cni-guard.conflist", &guard_conf).unwrap();
    ctrd.wait_network_ready(NETWORK_READY).unwrap();
    let crictl = ctrd.crictl();

    // 1. Refused, and the caller is told why (crictl prints the CRI error kubelet gets).
    if wait_seconds == 0 {
        let err = crictl
            .runp("refused", "suite2", 0)
            .expect_err("RunPodSandbox must fail while the delegate is missing");
        let msg = &err.message;
        println!("{runtime}: RunPodSandbox error as kubelet sees it: {msg}");
        assert!(
            msg.starts_with("failed to setup network for sandbox \"")
                && msg.contains("plugin type=\"cni-guard\"")
                && msg.contains("failed (add): cni-guard: network not ready: delegate "),
            "not the guard's refusal: {msg}"
        );
        assert!(
            msg.contains(&format!("{} does not exist", delegate.display())),
            "the message does not say the delegate is missing: {msg}"
        );
        assert!(
            msg.contains(&delegate.display().to_string()),
            "the message does not name the missing delegate {}: {msg}",
            delegate.display()
        );
        // The refused ADD and the deferred teardown (DEL) both went through the guard (its log
        // lines reach the suite's syslog socket), the DEL succeeded, nothing lingers, and
        // containerd logged no failed teardown.
        let id = msg
            .split('"')
            .nth(1)
            .expect("the error names the sandbox id")
            .to_string();
        // The lines of this sandbox, once its DEL is there (a datagram may still be in flight).
        let refused_at = Instant::now();
        let deadline = refused_at + Duration::from_secs(2);
        let guard_lines: Vec<String> = loop {
            let lines: Vec<String> = ctrd
                .guard_log()
                .into_iter()
                .filter(|l| l.contains(&format!("container={id} ")))
                .collect();
            if lines.iter().any(|l| l.starts_with("verb=DEL")) || Instant::now() > deadline {
                break lines;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        println!(
            "the guard's log for {id} ({:?} after crictl returned):\n  {}",
            refused_at.elapsed(),
            guard_lines.join("\n  ")
        );
        assert!(
            guard_lines
                .iter()
                .any(|l| l.starts_with("verb=ADD") && l.contains("decision=refused code=11")),
            "the guard logged no refused ADD: {guard_lines:?}"
        );
        let dels: Vec<&String> = guard_lines
            .iter()
            .filter(|l| l.contains("verb=DEL"))
            .collect();
        assert!(
            !dels.is_empty(),
            "containerd ran no DEL after the refused ADD; the guard's whole log: {:#?}\n\
             containerd on {id}: {:#?}",
            ctrd.guard_log(),
            ctrd.log()
                .lines()
                .filter(|l| l.contains(&id))
                .collect::<Vec<_>>()
        );
        assert!(
            dels.iter()
                .all(|l| !l.contains("decision=error") && !l.contains("decision=refused")),
            "a DEL failed: {dels:?}"
        );
        let left = crictl.pods().unwrap();
        assert!(left.is_empty(), "a refused sandbox lingers: {left:?}");
        let log = ctrd.log();
        assert!(
            !log.contains("Failed to destroy network"),
            "containerd's deferred DEL failed:\n{}",
            ctrd.log_tail(30)
        );
        assert!(cni::guard_records(&cache).is_empty());
        assert!(ctrd.netns().links_of_kind("veth").unwrap().is_empty());
    }

    // 2. kubelet's retry loop while the delegate appears.
    let net = bridge_network("pods", "cni-pods", "10.79.0.0/24", &ipam);
    let writer = {
        let conf_dir = conf_dir.clone();
        let conf = as_conf(&net);
        std::thread::spawn(move || {
            std::thread::sleep(DELEGATE_ARRIVES_AFTER);
            write_atomically(&conf_dir, "00-multus.conf", &conf).unwrap();
            Instant::now()
        })
    };
    let mut attempt = 0u32;
    let (sandbox, running_at) = loop {
        let started = Instant::now();
        match run_sandbox(crictl, "retried", "suite2", attempt) {
            Ok(sb) => break (sb, Instant::now()),
            Err(e) => {
                let msg = e.message;
                assert!(msg.contains("cni-guard"), "unexpected failure: {msg}");
                println!(
                    "{runtime}: waitSeconds={wait_seconds} attempt {attempt} refused after {:?}",
                    started.elapsed()
                );
            }
        }
        attempt += 1;
        assert!(attempt < 10, "no running sandbox after {attempt} attempts");
        std::thread::sleep(jittered(KUBELET_BACKOFF));
    };
    let arrived_at = writer.join().unwrap();
    let delay = running_at.saturating_duration_since(arrived_at);
    println!(
        "delegate-to-running runtime={runtime} waitSeconds={wait_seconds} attempts={} ms={}",
        attempt + 1,
        delay.as_millis()
    );
    assert!(sandbox.ip.starts_with("10.79.0."), "{sandbox:?}");
    if wait_seconds >= DELEGATE_ARRIVES_AFTER.as_secs() {
        // The first ADD was still waiting when the delegate appeared: no kubelet retry needed.
        assert_eq!(attempt, 0, "the waiting ADD should have succeeded");
    } else {
        assert!(attempt >= 1, "the first ADD should have been refused");
    }

    cri_cleanup(&ctrd, &sandbox.id);
    assert!(cni::reservations(&ipam, "pods").is_empty());
    assert!(cni::guard_records(&cache).is_empty());
    assert!(cni_results_for(&sandbox.id).is_empty());
}

fn cri_cleanup(ctrd: &containerd_conformance::Containerd, id: &str) {
    let crictl = ctrd.crictl();
    crictl.stopp(id).unwrap();
    crictl.rmp(id).unwrap();
    assert!(crictl.pods().unwrap().is_empty());
}
