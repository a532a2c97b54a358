//! Suite 3: the reboot race on containerd itself. A flapper deletes and rewrites `00-multus.conf`
//! in containerd's conf dir the way the Multus daemon does on each restart, while pod sandboxes
//! are created (and later torn down) concurrently through the CRI. containerd picks, reloads and
//! runs the config itself; we only count what each sandbox got.
//!
//! Layout (as on the incident's nodes): `05-cilium.conflist` (a bridge standing in for Cilium),
//! `00-multus.conf` (the `mini-multus` stand-in: `eth0` from 05-cilium, `net1` from a VLAN
//! attachment outside the conf dir), and with the guard `00-cni-guard.conflist` first.
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use containerd_conformance::cni::{
    self, as_conf, as_conflist, bridge_network, mini_multus_conf, write_atomically,
};
use containerd_conformance::containerd::cni_results_for;
use containerd_conformance::crictl::Crictl;
use containerd_conformance::netns::interfaces_in;
use containerd_conformance::{
    on_both_generations, prereq, start_containerd, Containerd, Generation,
};
use serde_json::Value;

const SANDBOXES: usize = 200;
const CONCURRENCY: usize = 6;
/// The delegate is absent a third of the time.
const ABSENT: Duration = Duration::from_millis(40);
const PRESENT: Duration = Duration::from_millis(80);

/// Deletes and rewrites a config file until stopped; leaves it present.
struct Flapper {
    stop: Arc<AtomicBool>,
    flaps: Arc<AtomicUsize>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Flapper {
    fn start(dir: &Path, name: &'static str, doc: Value) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flaps = Arc::new(AtomicUsize::new(0));
        let dir = dir.to_owned();
        let thread = {
            let (stop, flaps) = (stop.clone(), flaps.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    // The Multus daemon removes its file on shutdown ...
                    std::fs::remove_file(dir.join(name)).expect("remove delegate");
                    std::thread::sleep(ABSENT);
                    // ... and writes it again when it starts.
                    write_atomically(&dir, name, &doc).expect("write delegate");
                    flaps.fetch_add(1, Ordering::SeqCst);
                    std::thread::sleep(PRESENT);
                }
            })
        };
        Self {
            stop,
            flaps,
            thread: Some(thread),
        }
    }

    fn stop(&mut self) -> usize {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.join().expect("flapper");
        }
        self.flaps.load(Ordering::SeqCst)
    }
}

impl Drop for Flapper {
    fn drop(&mut self) {
        self.stop();
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Full,
    Bare,
    Refused,
    /// containerd refused before any plugin ran: its reload read a directory listing naming a
    /// file the flapper had deleted by the time it was opened, so its CNI stays "not
    /// initialized" until the next event reloads it. No sandbox network, kubelet retries:
    /// fail-closed, the runtime's own, not the guard's (the guard's log has no ADD for it).
    NotInitialized,
}

struct Created {
    name: String,
    id: Option<String>,
    outcome: Outcome,
}

/// What the networks look like once every sandbox is stopped and removed.
struct Leaks {
    cluster: Vec<String>,
    vlan: Vec<String>,
    records: usize,
    cni_cache: usize,
    sandboxes: usize,
}

impl Leaks {
    fn total(&self) -> usize {
        self.cluster.len() + self.vlan.len() + self.records + self.cni_cache + self.sandboxes
    }
}

struct Layout {
    conf_dir: PathBuf,
    ipam: PathBuf,
    cache: PathBuf,
    multus: Value,
}

fn layout(ctrd: &Containerd, guard: bool) -> Layout {
    let conf_dir = ctrd.conf_dir();
    let ipam = ctrd.scratch("ipam");
    let cache = ctrd.scratch("guard-cache");
    let attach = ctrd.scratch("attachments");
    let cilium = bridge_network("cilium", "cg-cil0", "10.90.0.0/16", &ipam);
    let vlan = bridge_network("vlan", "cg-vlan0", "10.91.0.0/16", &ipam);
    let cluster = conf_dir.join("05-cilium.conflist");
    let vlan_conf = attach.join("10-vlan.conf");
    write_atomically(&conf_dir, "05-cilium.conflist", &as_conflist(&cilium)).unwrap();
    write_atomically(&attach, "10-vlan.conf", &as_conf(&vlan)).unwrap();
    let multus = mini_multus_conf(&cluster, std::slice::from_ref(&vlan_conf));
    write_atomically(&conf_dir, "00-multus.conf", &multus).unwrap();
    if guard {
        let guard_conf = cni::guard_conflist(
            &conf_dir.join("00-multus.conf"),
            &[cluster, vlan_conf],
            0,
            &cache,
        );
        write_atomically(&conf_dir, "00-cni-guard.conflist", &guard_conf).unwrap();
    }
    Layout {
        conf_dir,
        ipam,
        cache,
        multus,
    }
}

/// Who refused a sandbox, from the guard's own log (the suite's syslog socket; a datagram may
/// still be in flight, so it polls up to 2 s):
/// - the guard: its line `verb=ADD container=ID ... decision=refused code=11`. Error text is
///   not enough: a delegate's error passed through the guard also reads
///   `plugin type="cni-guard" failed (add)`;
/// - containerd itself: `cni plugin not initialized`, and no ADD of the guard for that sandbox.
fn refusal(ctrd: &Containerd, msg: &str) -> Result<Outcome, String> {
    const SANDBOX: &str = "failed to setup network for sandbox \"";
    let id = msg
        .find(SANDBOX)
        .map(|i| &msg[i + SANDBOX.len()..])
        .and_then(|rest| rest.split('"').next())
        .filter(|id| !id.is_empty())
        .ok_or_else(|| format!("the error names no sandbox: {msg}"))?;
    let container = format!("container={id} ");
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let lines: Vec<String> = ctrd
            .guard_log()
            .into_iter()
            .filter(|l| l.starts_with("verb=ADD") && l.contains(&container))
            .collect();
        if lines
            .iter()
            .any(|l| l.contains(" decision=refused code=11 "))
        {
            return Ok(Outcome::Refused);
        }
        if Instant::now() > deadline {
            if lines.is_empty() && msg.contains("cni plugin not initialized") {
                return Ok(Outcome::NotInitialized);
            }
            return Err(format!(
                "neither the guard's refusal (no refused ADD, code 11, for sandbox {id}; its ADD lines: {lines:?}) nor containerd's `cni plugin not initialized` with no ADD; the error: {msg}"
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn create(ctrd: &Containerd, name: String, attempt: u32) -> Created {
    let crictl = ctrd.crictl();
    match crictl.runp(&name, "race", attempt) {
        Ok(id) => {
            let netns = crictl
                .sandbox_netns(&id)
                .unwrap()
                .unwrap_or_else(|| panic!("{id}: no netns"));
            let ifaces = interfaces_in(&netns).unwrap();
            let mut names: Vec<String> = ifaces.into_iter().map(|i| i.name).collect();
            names.sort();
            let outcome = match names.iter().map(String::as_str).collect::<Vec<_>>()[..] {
                ["eth0", "net1"] => Outcome::Full,
                ["eth0"] => Outcome::Bare,
                _ => panic!("sandbox {id} has unexpected interfaces {names:?}"),
            };
            Created {
                name,
                id: Some(id),
                outcome,
            }
        }
        Err(e) => {
            let outcome = refusal(ctrd, &e.message).unwrap_or_else(|why| {
                panic!("{name}: RunPodSandbox failed, but not by a refusal: {why}")
            });
            Created {
                name,
                id: None,
                outcome,
            }
        }
    }
}

/// Runs `work` on every item, [`CONCURRENCY`] at a time (kubelet's pod workers); results in
/// the items' order.
fn in_parallel<T: Sync, R: Send>(items: &[T], work: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let next = AtomicUsize::new(0);
    let mut results: Vec<(usize, R)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..CONCURRENCY)
            .map(|_| {
                scope.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::SeqCst);
                        let Some(item) = items.get(i) else { break };
                        done.push((i, work(item)));
                    }
                    done
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("worker"))
            .collect()
    });
    results.sort_by_key(|(i, _)| *i);
    results.into_iter().map(|(_, r)| r).collect()
}

fn create_all(ctrd: &Containerd, names: Vec<String>, attempt: u32) -> Vec<Created> {
    in_parallel(&names, |name| create(ctrd, name.clone(), attempt))
}

/// How often a teardown the guard answered "try again" is retried, [`RETRY_PAUSE`] apart, as
/// kubelet's pod worker retries a failed StopPodSandbox (it never gives up).
const TEARDOWN_RETRIES: u32 = 5;
const RETRY_PAUSE: Duration = Duration::from_secs(1);

/// The guard's answer to a DEL whose delegate went away while it ran (code 11, the record kept):
/// not a result, a request to be asked again.
fn guard_says_retry(e: &impl std::fmt::Display) -> bool {
    e.to_string().contains("not torn down for sure")
}

/// Stops and removes every sandbox, [`CONCURRENCY`] at a time; a step the guard answered with
/// "try again" is retried as kubelet does. Returns the errors left after the retries, and how
/// many retries there were.
fn remove_all(crictl: &Crictl, ids: &[String]) -> (Vec<String>, u32) {
    let done = in_parallel(ids, |id| {
        let (mut errors, mut retries) = (Vec::new(), 0);
        let step = |what: &str| match what {
            "stop" => crictl.stopp(id),
            _ => crictl.rmp(id),
        };
        for what in ["stop", "remove"] {
            let mut result = step(what);
            while matches!(&result, Err(e) if guard_says_retry(e)) && retries < TEARDOWN_RETRIES {
                retries += 1;
                std::thread::sleep(RETRY_PAUSE);
                result = step(what);
            }
            if let Err(e) = result {
                errors.push(format!("{what} {id}: {e}"));
            }
        }
        (errors, retries)
    });
    let retries = done.iter().map(|(_, r)| r).sum();
    (done.into_iter().flat_map(|(e, _)| e).collect(), retries)
}

struct RaceRun {
    runtime: String,
    sandboxes: usize,
    full: usize,
    refused: usize,
    not_initialized: usize,
    bare: usize,
    leaks: Leaks,
}

fn race(generation: Generation, guard_bin: &Path, mini_multus: &Path, guard: bool) -> RaceRun {
    let ctrd = start_containerd(
        generation,
        &[("cni-guard", guard_bin), ("mini-multus", mini_multus)],
    );
    let runtime = ctrd.runtime_name();
    let l = layout(&ctrd, guard);
    ctrd.wait_network_ready(crate::common::NETWORK_READY)
        .unwrap();
    let crictl = ctrd.crictl();
    let sandboxes = race_sandboxes();
    let run_started = Instant::now();
    let on = if guard { "on" } else { "off" };

    // 1. Sandboxes created while the Multus file flaps.
    let started = Instant::now();
    let mut flapper = Flapper::start(&l.conf_dir, "00-multus.conf", l.multus.clone());
    let names: Vec<String> = (0..sandboxes).map(|i| format!("pod-{i:03}")).collect();
    let created = create_all(&ctrd, names, 0);
    let flaps = flapper.stop();
    let count = |o: Outcome| created.iter().filter(|c| c.outcome == o).count();
    let (full, bare, refused, not_initialized) = (
        count(Outcome::Full),
        count(Outcome::Bare),
        count(Outcome::Refused),
        count(Outcome::NotInitialized),
    );
    println!(
        "race {runtime} guard={on}: {sandboxes} sandboxes in {:?} over {flaps} flaps: full={full} bare={bare} refused={refused} not-initialized={not_initialized}",
        started.elapsed()
    );

    // 2. kubelet retries the refused ones (the guard's or containerd's) once the file is back:
    //    every one must come up full.
    let retry: Vec<String> = created
        .iter()
        .filter(|c| matches!(c.outcome, Outcome::Refused | Outcome::NotInitialized))
        .map(|c| c.name.clone())
        .collect();
    let retried = create_all(&ctrd, retry, 1);
    for r in &retried {
        assert_eq!(
            r.outcome,
            Outcome::Full,
            "{} on retry: {:?}",
            r.name,
            r.outcome
        );
    }

    // 3. Teardown while the file flaps again (kubelet stops pods during the same restarts):
    //    containerd runs DEL with whatever config it has loaded at that moment.
    let ids: Vec<String> = created
        .iter()
        .chain(&retried)
        .filter_map(|c| c.id.clone())
        .collect();
    let mut flapper = Flapper::start(&l.conf_dir, "00-multus.conf", l.multus.clone());
    let (errors, retries) = remove_all(crictl, &ids);
    flapper.stop();
    let leftover = crictl.pods().unwrap();
    let leaks = Leaks {
        cluster: cni::reservations(&l.ipam, "cilium"),
        vlan: cni::reservations(&l.ipam, "vlan"),
        records: cni::guard_records(&l.cache).len(),
        cni_cache: ids.iter().map(|id| cni_results_for(id).len()).sum(),
        sandboxes: leftover.len(),
    };
    println!(
        "race-leaks runtime={runtime} guard={on} cluster={} vlan={} records={} cni-cache={} sandboxes={} teardown-errors={} teardown-retries={retries}",
        leaks.cluster.len(),
        leaks.vlan.len(),
        leaks.records,
        leaks.cni_cache,
        leaks.sandboxes,
        errors.len()
    );
    for e in errors.iter().take(5) {
        println!("  teardown error: {e}");
    }
    println!(
        "race-duration runtime={runtime} guard={on} sandboxes={sandboxes} s={:.1}",
        run_started.elapsed().as_secs_f64()
    );
    if guard {
        assert!(
            errors.is_empty(),
            "teardown through the guard failed: {errors:?}"
        );
    }
    RaceRun {
        runtime,
        sandboxes,
        full,
        refused,
        not_initialized,
        bare,
        leaks,
    }
}

fn binaries(suite: &str, generation: Generation) -> Option<(PathBuf, PathBuf)> {
    if !prereq::can_run(suite, generation) {
        return None;
    }
    let guard = prereq::binary(suite, "CNI_GUARD_BIN", "cni-guard")?;
    let mini_multus = prereq::binary(suite, "MINI_MULTUS_BIN", "mini-multus")?;
    Some((guard, mini_multus))
}

on_both_generations!(reboot_race_on_containerd);

fn reboot_race_on_containerd(generation: Generation) {
    let Some((guard, mini_multus)) = binaries("reboot_race_on_containerd", generation) else {
        return;
    };
    for on in race_runs() {
        let r = race(generation, &guard, &mini_multus, on);
        let leaked = r.leaks.total();
        println!(
            "race-summary runtime={} guard={} sandboxes={} full={} refused={} bare={} leaked={leaked} not-initialized={}",
            r.runtime,
            if on { "on" } else { "off" },
            r.sandboxes,
            r.full,
            r.refused,
            r.bare,
            r.not_initialized
        );
        assert_eq!(r.full + r.refused + r.bare + r.not_initialized, r.sandboxes);
        if on {
            // The window reached the guard: without a refusal this run shows nothing.
            assert!(
                r.refused > 0,
                "the guard refused no sandbox: the flapping reached no ADD (full={} of {})",
                r.full,
                r.sandboxes
            );
            assert_eq!(r.bare, 0, "the guard let bare sandboxes through");
            assert_eq!(
                leaked,
                0,
                "left after teardown: cluster {:?} vlan {:?} records {} cache {} sandboxes {}",
                r.leaks.cluster,
                r.leaks.vlan,
                r.leaks.records,
                r.leaks.cni_cache,
                r.leaks.sandboxes
            );
        } else {
            assert!(
                r.bare > 0,
                "the race was not reproduced: no bare sandbox without the guard"
            );
        }
    }
}

/// `RACE_SANDBOXES=N` changes the count locally (the summary lines name it).
fn race_sandboxes() -> usize {
    std::env::var("RACE_SANDBOXES")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(SANDBOXES)
}

fn race_runs() -> Vec<bool> {
    match std::env::var("RACE_ONLY").as_deref() {
        Ok("off") => vec![false],
        Ok("on") => vec![true],
        _ => vec![false, true],
    }
}
