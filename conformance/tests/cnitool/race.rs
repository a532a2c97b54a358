//! Suite 5: the reboot race, reproduced without the guard and closed with it.
//!
//! The conf dir holds `00-multus.conf` (mini-multus: eth0 from the cluster network, net1 from
//! the VLAN attachment) and `05-cilium.conflist` (bridge, the cluster network). A flapper deletes
//! and rewrites `00-multus.conf` the way the Multus daemon does on each restart while sandboxes
//! are created concurrently. Each creation picks its network the way containerd does (the first
//! file in name order at that moment, kept in memory: a private snapshot) and runs it with
//! cnitool. Teardown, like containerd's, uses the network that is first *at teardown time*.
//! With the guard, `00-cni-guard.conflist` (delegate `00-multus.conf`) sorts first.
use crate::{binaries, host_namespace, macvlan_parent, put};
use conformance::cnitool::{container_id, Cnitool};
use conformance::confdir::{snapshot, write_atomic};
use conformance::fixture::Fixture;
use conformance::leaks::leases;
use conformance::netns::Netns;
use conformance::prereq::can_run;
use conformance::sandbox::interfaces;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const SANDBOXES: usize = 300;
const WORKERS: usize = 8;

struct Layout<'a> {
    fx: &'a Fixture,
    host: &'a Netns,
    cilium_net: String,
    vlan_net: String,
    multus_path: PathBuf,
    multus_bytes: Vec<u8>,
    guard: bool,
}

#[derive(Debug, Clone, PartialEq)]
enum Built {
    Full,
    Bare,
    Refused,
}

/// A sandbox's teardown: whether DEL succeeded, and what it left behind.
type Teardown = (Result<(), String>, Vec<String>);

struct Sandbox {
    ns: Netns,
    cid: String,
    built: Result<Built, String>,
}

/// A tiny xorshift for the flapper's timing (no dependency needed for test jitter).
struct Jitter(u64);
impl Jitter {
    fn new() -> Jitter {
        Jitter(u64::from_str_radix(&conformance::random_hex(8), 16).unwrap() | 1)
    }
    fn ms(&mut self, lo: u64, hi: u64) -> Duration {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        Duration::from_millis(lo + self.0 % (hi - lo))
    }
}

/// Deletes and rewrites 00-multus.conf until stopped; leaves it present. Returns the restarts.
fn flap(path: &Path, bytes: &[u8], stop: &AtomicBool) -> usize {
    let mut jitter = Jitter::new();
    let mut restarts = 0;
    while !stop.load(Ordering::Relaxed) {
        let _ = std::fs::remove_file(path);
        std::thread::sleep(jitter.ms(5, 25));
        write_atomic(path, bytes);
        restarts += 1;
        std::thread::sleep(jitter.ms(15, 60));
    }
    restarts
}

/// Runs `work` over `items` on WORKERS threads, optionally with the flapper running.
fn parallel<T: Sync>(
    layout: &Layout,
    items: &[T],
    flapping: bool,
    work: impl Fn(usize, &T) + Sync,
) -> usize {
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let flapper = flapping.then(|| {
            let (stop, path, bytes) = (&stop, &layout.multus_path, &layout.multus_bytes);
            s.spawn(move || flap(path, bytes, stop))
        });
        let workers: Vec<_> = (0..WORKERS)
            .map(|_| {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(item) = items.get(i) else { break };
                    work(i, item);
                })
            })
            .collect();
        for w in workers {
            w.join().expect("race worker panicked");
        }
        stop.store(true, Ordering::Relaxed);
        flapper
            .map(|f| f.join().expect("flapper panicked"))
            .unwrap_or(0)
    })
}

/// containerd's choice: the first network in the conf dir now, kept as a private snapshot.
fn chosen<'a>(layout: &'a Layout, i: usize, phase: &str) -> (Cnitool<'a>, String) {
    let snap = layout.fx.root.join(format!("snap/{phase}-{i}"));
    let (net, _file) = snapshot(&layout.fx.netd, &snap).expect("conf dir is empty");
    (Cnitool::new(layout.fx, layout.host, &snap), net)
}

fn build(
    layout: &Layout,
    i: usize,
    sandbox: &Netns,
    cid: &str,
    phase: &str,
) -> Result<Built, String> {
    let (cni, net) = chosen(layout, i, phase);
    let out = cni.add(&net, sandbox);
    if out.ok {
        let ifs = interfaces(sandbox);
        return match ifs
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .as_slice()
        {
            ["eth0", "net1"] => Ok(Built::Full),
            ["eth0"] => Ok(Built::Bare),
            other => Err(format!(
                "sandbox {i}: add via {net} gave interfaces {other:?}"
            )),
        };
    }
    if layout.guard {
        let replies = layout.fx.tap_records(cid, "ADD");
        let code = replies
            .last()
            .and_then(|r| r["stdout"].as_str())
            .and_then(|s| serde_json::from_str::<Value>(s).ok())
            .and_then(|v| v["code"].as_u64());
        if code == Some(11) {
            if interfaces(sandbox).is_empty() {
                return Ok(Built::Refused);
            }
            return Err(format!(
                "sandbox {i}: refused but has {:?}",
                interfaces(sandbox)
            ));
        }
    }
    Err(format!(
        "sandbox {i}: add via {net} failed: {}",
        out.stderr.trim()
    ))
}

/// What one sandbox left after its DEL: interfaces inside, leases, result cache entries.
fn leftovers(layout: &Layout, sandbox: &Sandbox) -> Vec<String> {
    let mut left: Vec<String> = interfaces(&sandbox.ns)
        .into_iter()
        .map(|i| format!("interface {i}"))
        .collect();
    for net in [&layout.cilium_net, &layout.vlan_net] {
        for l in leases(&layout.fx.leases, net) {
            if l.container_id == sandbox.cid {
                left.push(format!("lease {net} {}", l.ip));
            }
        }
    }
    for p in layout.fx.cached_results() {
        if p.to_string_lossy().contains(&sandbox.cid) {
            left.push(format!(
                "cache {}",
                p.file_name().unwrap().to_string_lossy()
            ));
        }
    }
    left
}

fn race(guard: bool) {
    let suite = if guard {
        "race_with_guard"
    } else {
        "race_without_guard"
    };
    if !can_run(suite, true) {
        return;
    }
    let n: usize = std::env::var("CONFORMANCE_RACE_SANDBOXES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(SANDBOXES);
    let fx = Fixture::new(&binaries(), guard);
    let host = host_namespace();
    macvlan_parent(&host, "racevlan0");
    let parent_links = host.links_of_kind("veth");

    let cilium_net = fx.network("cilium");
    let cilium = put(
        &fx,
        &fx.netd,
        "05-cilium.conflist",
        &json!({"cniVersion": "1.0.0", "name": cilium_net, "plugins": [{
            "type": "bridge", "bridge": "racebr0", "isGateway": true,
            "ipam": fx.host_local("10.70.0.0/16")}]}),
    );
    let vlan_net = fx.network("iot-vlan");
    let vlan = put(
        &fx,
        &fx.delegates,
        "iot-vlan.conf",
        &json!({"cniVersion": "1.0.0", "name": vlan_net, "type": "macvlan",
            "master": "racevlan0", "mode": "bridge", "ipam": fx.host_local("10.80.0.0/16")}),
    );
    let multus_net = fx.network("multus");
    let multus = json!({"cniVersion": "1.0.0", "name": multus_net, "type": "mini-multus",
        "clusterNetwork": cilium, "attachments": [vlan]});
    let multus_path = put(&fx, &fx.netd, "00-multus.conf", &multus);
    if guard {
        let guard_net = fx.network("cni-guard");
        put(
            &fx,
            &fx.netd,
            "00-cni-guard.conflist",
            &fx.guard_conflist(&guard_net, "1.0.0", &multus_path, &[&cilium, &vlan]),
        );
    }
    let layout = Layout {
        fx: &fx,
        host: &host,
        cilium_net,
        vlan_net,
        multus_path,
        multus_bytes: multus.to_string().into_bytes(),
        guard,
    };
    let started = Instant::now();

    // Phase 1: sandboxes created while the Multus daemon restarts over and over.
    let slots: Vec<Mutex<Option<Sandbox>>> = (0..n).map(|_| Mutex::new(None)).collect();
    let restarts = parallel(&layout, &slots, true, |i, slot| {
        let ns = Netns::create("cg-race");
        let cid = container_id(&ns);
        let built = build(&layout, i, &ns, &cid, "add");
        *slot.lock().unwrap() = Some(Sandbox { ns, cid, built });
    });
    let sandboxes: Vec<Sandbox> = slots
        .into_iter()
        .map(|s| s.into_inner().unwrap().unwrap())
        .collect();
    let count = |b: Built| {
        sandboxes
            .iter()
            .filter(|s| s.built.as_ref() == Ok(&b))
            .count()
    };
    let (full, bare, refused) = (
        count(Built::Full),
        count(Built::Bare),
        count(Built::Refused),
    );
    let failures: Vec<&String> = sandboxes
        .iter()
        .filter_map(|s| s.built.as_ref().err())
        .collect();

    // Phase 2 (guard): the daemon is back; containerd DELs each failed sandbox and kubelet
    // retries it: every refused one must come up full.
    let retried: Vec<Result<(), String>> = if guard {
        let refused_ones: Vec<(usize, &Sandbox)> = sandboxes
            .iter()
            .enumerate()
            .filter(|(_, s)| s.built == Ok(Built::Refused))
            .collect();
        let results: Vec<Mutex<Result<(), String>>> =
            refused_ones.iter().map(|_| Mutex::new(Ok(()))).collect();
        parallel(&layout, &refused_ones, false, |k, (i, s)| {
            let (cni, net) = chosen(&layout, *i, "del-failed");
            let del = cni.del(&net, &s.ns);
            let outcome = if !del.ok {
                Err(format!(
                    "sandbox {i}: DEL after refused ADD failed: {}",
                    del.stderr.trim()
                ))
            } else {
                match build(&layout, *i, &s.ns, &s.cid, "retry") {
                    Ok(Built::Full) => Ok(()),
                    other => Err(format!("sandbox {i}: retry gave {other:?}")),
                }
            };
            *results[k].lock().unwrap() = outcome;
        });
        results
            .into_iter()
            .map(|m| m.into_inner().unwrap())
            .collect()
    } else {
        Vec::new()
    };

    // Phase 3: teardown while the daemon restarts again, each with the network first *now*.
    let teardown: Vec<Mutex<Teardown>> = sandboxes
        .iter()
        .map(|_| Mutex::new((Ok(()), Vec::new())))
        .collect();
    parallel(&layout, &sandboxes, true, |i, s| {
        let (cni, net) = chosen(&layout, i, "del");
        let del = cni.del(&net, &s.ns);
        let ok = if del.ok {
            Ok(())
        } else {
            Err(format!(
                "sandbox {i}: DEL via {net} failed: {}",
                del.stderr.trim()
            ))
        };
        *teardown[i].lock().unwrap() = (ok, leftovers(&layout, s));
    });
    let teardown: Vec<Teardown> = teardown
        .into_iter()
        .map(|m| m.into_inner().unwrap())
        .collect();
    let records = fx.guard_records();
    let host_veths: Vec<String> = host
        .links_of_kind("veth")
        .into_iter()
        .filter(|l| !parent_links.contains(l))
        .collect();
    let leaking = teardown.iter().filter(|(_, left)| !left.is_empty()).count();
    let leaked = leaking + records.len() + host_veths.len();
    let kinds = |prefix: &str| {
        teardown
            .iter()
            .flat_map(|(_, left)| left.iter())
            .filter(|l| l.starts_with(prefix))
            .count()
    };

    let generation = conformance::generation::generation().label();
    println!(
        "\nrace-summary {generation} guard={} sandboxes={n} full={full} refused={refused} bare={bare} leaked={leaked}",
        if guard { "on" } else { "off" }
    );
    println!(
        "race-detail {generation} guard={} multus-restarts={restarts} leaked-interfaces={} leaked-leases-cluster={} \
         leaked-leases-vlan={} leaked-cache-entries={} leaked-records={} host-veths={} retried-full={} seconds={:.1}",
        if guard { "on" } else { "off" },
        kinds("interface"),
        kinds(&format!("lease {}", layout.cilium_net)),
        kinds(&format!("lease {}", layout.vlan_net)),
        kinds("cache"),
        records.len(),
        host_veths.len(),
        retried.iter().filter(|r| r.is_ok()).count(),
        started.elapsed().as_secs_f64(),
    );

    assert!(
        failures.is_empty(),
        "sandboxes failed otherwise: {failures:?}"
    );
    let del_failures: Vec<&String> = teardown
        .iter()
        .filter_map(|(r, _)| r.as_ref().err())
        .collect();
    assert!(restarts > 0, "the flapper never restarted the daemon");
    if guard {
        assert_eq!(bare, 0, "bare sandboxes with the guard");
        assert!(
            refused > 0,
            "no sandbox hit the window: the run proves nothing"
        );
        assert_eq!(full + refused, n);
        let retry_failures: Vec<&String> =
            retried.iter().filter_map(|r| r.as_ref().err()).collect();
        assert!(retry_failures.is_empty(), "retries: {retry_failures:?}");
        assert!(del_failures.is_empty(), "teardown: {del_failures:?}");
        let examples: Vec<&Vec<String>> = teardown
            .iter()
            .map(|(_, l)| l)
            .filter(|l| !l.is_empty())
            .take(5)
            .collect();
        assert_eq!(
            leaked, 0,
            "leaks with the guard: {examples:?} records {records:?} veths {host_veths:?}"
        );
    } else {
        assert!(
            bare > 0,
            "no bare sandbox without the guard: the bug was not reproduced"
        );
        assert_eq!(full + bare, n);
    }
}

#[test]
#[ignore = "root: run by scripts/test.d/20-conformance.sh"]
fn race_without_guard() {
    race(false);
}

#[test]
#[ignore = "root: run by scripts/test.d/20-conformance.sh"]
fn race_with_guard() {
    race(true);
}
