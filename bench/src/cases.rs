//! The comparisons of issue 6, each set up in the work directory and run interleaved.

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::measure::{self, compare, Case, Env, Rng, Samples, Step};
use crate::Options;

/// Everything the report needs.
#[derive(Debug, Default)]
pub struct Results {
    pub quick: bool,
    pub fast: Vec<Samples>,
    pub child: Vec<Samples>,
    /// `None` when the real ADD+DEL could not run (no root / no reference plugins).
    pub real: Option<Vec<Samples>>,
    pub refusal: Vec<Samples>,
    /// Rename-to-delegate-start latencies.
    /// Per guard binary (the real one first, then candidates): the latencies.
    pub wake: Vec<(String, Vec<Duration>)>,
    /// Total wall time of 64 concurrent ADDs: direct, then through the guard.
    pub concurrent: Vec<Samples>,
    /// (attachments, samples); the first entry is the direct noop reference.
    pub attachments: Vec<(usize, Samples)>,
    /// (delegate bytes, direct samples, guard samples).
    pub sizes: Vec<(usize, Samples, Samples)>,
    /// (delegate bytes, samples) of each candidate binary, in the same rounds as `sizes`.
    pub size_candidates: Vec<(usize, Samples)>,
    /// (file, bytes).
    pub binaries: Vec<(String, u64)>,
    /// /proc/loadavg before and after each section.
    pub load: Vec<(String, String, String)>,
}

/// The fixed layout of one run's work directory.
struct Layout {
    bin: PathBuf,
    netd: PathBuf,
    cache: PathBuf,
    tmpfs_cache: Option<PathBuf>,
    work: PathBuf,
}

impl Layout {
    fn noop(&self) -> PathBuf {
        self.bin.join("cni-noop")
    }
    fn floor(&self) -> PathBuf {
        self.bin.join("exec-floor")
    }
    fn guard(&self) -> PathBuf {
        self.bin.join("cni-guard")
    }
    fn guard_dynamic(&self) -> PathBuf {
        self.bin.join("cni-guard-dynamic")
    }

    /// Writes a guard request configuration (as the runtime passes it on stdin).
    fn guard_conf(
        &self,
        file: &str,
        version: &str,
        delegate: &Path,
        attachments: &[PathBuf],
        wait: u32,
        cache: &Path,
    ) -> Result<PathBuf, String> {
        let v = json!({
            "cniVersion": version,
            "name": "guarded",
            "type": "cni-guard",
            "delegate": delegate,
            "attachments": attachments,
            "waitSeconds": wait,
            "cacheDir": cache,
            "capabilities": {"portMappings": true},
        });
        write_json(&self.work.join(file), &v)
    }

    fn noop_conf(&self, file: &str, version: &str) -> Result<PathBuf, String> {
        write_json(
            &self.netd.join(file),
            &json!({"cniVersion": version, "name": "noopnet", "type": "cni-noop"}),
        )
    }
}

fn write_json(path: &Path, v: &Value) -> Result<PathBuf, String> {
    let bytes = serde_json::to_vec(v).expect("JSON values serialize");
    std::fs::write(path, bytes).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(path.to_owned())
}

fn mkdir(p: &Path) -> Result<(), String> {
    std::fs::create_dir_all(p).map_err(|e| format!("cannot create {}: {e}", p.display()))
}

/// Removes the records written so far (the files, not the directories: a real node's cache
/// directory exists after the first pod).
fn clear_records(caches: &[PathBuf]) -> Result<(), String> {
    for cache in caches {
        let Ok(networks) = std::fs::read_dir(cache) else {
            continue;
        };
        for net in networks.flatten() {
            if !net.path().is_dir() {
                continue;
            }
            for rec in std::fs::read_dir(net.path())
                .map_err(|e| e.to_string())?
                .flatten()
            {
                std::fs::remove_file(rec.path())
                    .map_err(|e| format!("cannot remove {}: {e}", rec.path().display()))?;
            }
        }
    }
    Ok(())
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// A syslog socket that swallows the guard's log lines, as a node's syslog daemon would.
fn syslog_sink(path: &Path) -> Result<(), String> {
    let _ = std::fs::remove_file(path);
    let sock =
        UnixDatagram::bind(path).map_err(|e| format!("cannot bind {}: {e}", path.display()))?;
    std::thread::spawn(move || {
        let mut buf = [0u8; 8192];
        while sock.recv(&mut buf).is_ok() {}
    });
    Ok(())
}

struct Plan {
    warmup: usize,
    fast: usize,
    child: usize,
    real: usize,
    refusal: usize,
    wake: usize,
    concurrent: usize,
    attachments: usize,
    sizes: usize,
}

pub fn run_all(opts: &Options) -> Result<Results, String> {
    let plan = if opts.quick {
        Plan {
            warmup: 1,
            fast: 5,
            child: 3,
            real: 2,
            refusal: 3,
            wake: 2,
            concurrent: 1,
            attachments: 2,
            sizes: 2,
        }
    } else {
        Plan {
            warmup: 20,
            fast: 1000,
            child: 300,
            real: 150,
            refusal: 400,
            wake: 30,
            concurrent: 30,
            attachments: 200,
            sizes: 60,
        }
    };
    let l = Layout {
        bin: opts.bin.clone(),
        netd: opts.work.join("net.d"),
        cache: opts.work.join("cache"),
        tmpfs_cache: opts.tmpfs.as_ref().map(|t| t.join("cache")),
        work: opts.work.clone(),
    };
    mkdir(&l.netd)?;
    mkdir(&l.cache)?;
    if let Some(t) = &l.tmpfs_cache {
        mkdir(t)?;
    }
    let syslog = opts.work.join("syslog.sock");
    syslog_sink(&syslog)?;
    let mut cni_path = l.bin.display().to_string();
    if let Some(r) = &opts.ref_plugins {
        cni_path.push(':');
        cni_path.push_str(&r.display().to_string());
    }
    let env = Env {
        netns: opts
            .ctr_netns
            .clone()
            .unwrap_or_else(|| "/run/netns/cni-guard-bench-none".into()),
        ifname: "eth0".into(),
        cni_path,
        syslog,
    };
    // A cache dir with the node's events file present, as under `keep --metrics-address`: the
    // plugin appends one line per decision there.
    let metrics_cache = l.work.join("cache-metrics");
    mkdir(&metrics_cache)?;
    std::fs::write(metrics_cache.join(".metrics-events"), "")
        .map_err(|e| format!("cannot create the events file: {e}"))?;
    let mut caches = vec![l.cache.clone(), metrics_cache.clone()];
    caches.extend(l.tmpfs_cache.clone());
    let mut between = || clear_records(&caches);
    let mut rng = Rng::new();
    let mut r = Results {
        quick: opts.quick,
        ..Results::default()
    };
    let section =
        |r: &mut Results, name: &str, f: &mut dyn FnMut(&mut Results) -> Result<(), String>| {
            if !opts.only.is_empty() && !opts.only.iter().any(|o| name.starts_with(o.as_str())) {
                return Ok(());
            }
            eprintln!("cni-guard-bench: {name} ...");
            let before = loadavg();
            let t = Instant::now();
            f(r)?;
            eprintln!(
                "cni-guard-bench: {name} done in {:.1}s",
                t.elapsed().as_secs_f64()
            );
            r.load.push((name.to_owned(), before, loadavg()));
            Ok::<(), String>(())
        };

    // 1. Fast path.
    let noop_conf = l.noop_conf("00-noop.conf", "1.0.0")?;
    let g_fast = l.guard_conf("g-fast.json", "1.0.0", &noop_conf, &[], 0, &l.cache)?;
    section(&mut r, "fast path", &mut |r| {
        let ok = Some("10.99.0.2");
        let mut cases = vec![
            Case::one(
                "cni-noop, direct",
                Step::new(&l.noop(), "ADD", &g_fast).expect(0, ok),
            ),
            Case::one(
                "exec-floor → cni-noop",
                Step::new(&l.floor(), "ADD", &g_fast)
                    .arg(l.noop().display().to_string())
                    .expect(0, ok),
            ),
            Case::one(
                "cni-guard (static) → cni-noop",
                Step::new(&l.guard(), "ADD", &g_fast).expect(0, ok),
            ),
        ];
        if l.guard_dynamic().exists() {
            cases.push(Case::one(
                "cni-guard (dynamic) → cni-noop",
                Step::new(&l.guard_dynamic(), "ADD", &g_fast).expect(0, ok),
            ));
        }
        if let Some(t) = &l.tmpfs_cache {
            let g = l.guard_conf("g-fast-tmpfs.json", "1.0.0", &noop_conf, &[], 0, t)?;
            cases.push(Case::one(
                "cni-guard (static) → cni-noop, records on tmpfs",
                Step::new(&l.guard(), "ADD", &g).expect(0, ok),
            ));
        }
        let g_metrics = l.guard_conf(
            "g-fast-metrics.json",
            "1.0.0",
            &noop_conf,
            &[],
            0,
            &metrics_cache,
        )?;
        cases.push(Case::one(
            "cni-guard (static) → cni-noop, metrics on (one event appended)",
            Step::new(&l.guard(), "ADD", &g_metrics).expect(0, ok),
        ));
        cases.push(Case::one(
            "cni-guard (static) → cni-noop, no syslog socket (log line to stderr)",
            Step::new(&l.guard(), "ADD", &g_fast)
                .env(
                    "CNI_GUARD_SYSLOG",
                    l.work.join("no-syslog.sock").display().to_string(),
                )
                .expect(0, ok),
        ));
        for (name, path) in &opts.candidates {
            cases.push(Case::one(
                format!("candidate {name} → cni-noop"),
                Step::new(path, "ADD", &g_fast).expect(0, ok),
            ));
        }
        cases.push(Case::one(
            "cni-guard (static) VERSION: start, read, reply, log",
            Step::new(&l.guard(), "VERSION", &g_fast).expect(0, Some("supportedVersions")),
        ));
        r.fast = compare(&cases, &env, plan.warmup, plan.fast, &mut rng, &mut between)?;
        Ok(())
    })?;

    // 2. Child path: conversion, and a two-plugin conflist.
    let conf_040 = l.noop_conf("10-noop-040.conf", "0.4.0")?;
    let two = write_json(
        &l.netd.join("20-noop-two.conflist"),
        &json!({"cniVersion":"1.0.0","name":"noopnet","plugins":[{"type":"cni-noop"},{"type":"cni-noop"}]}),
    )?;
    let g_conv = l.guard_conf("g-conv.json", "1.0.0", &conf_040, &[], 0, &l.cache)?;
    let g_two = l.guard_conf("g-two.json", "1.0.0", &two, &[], 0, &l.cache)?;
    section(&mut r, "child path", &mut |r| {
        let cases = vec![
            Case::one(
                "cni-noop, direct",
                Step::new(&l.noop(), "ADD", &g_fast).expect(0, Some("10.99.0.2")),
            ),
            Case::one(
                "cni-guard → cni-noop at 0.4.0 (child, result converted)",
                Step::new(&l.guard(), "ADD", &g_conv).expect(0, Some("\"cniVersion\":\"1.0.0\"")),
            ),
            Case::one(
                "cni-guard → conflist of two cni-noop (two children)",
                Step::new(&l.guard(), "ADD", &g_two).expect(0, Some("10.99.0.2")),
            ),
        ];
        r.child = compare(
            &cases,
            &env,
            plan.warmup,
            plan.child,
            &mut rng,
            &mut between,
        )?;
        Ok(())
    })?;

    // 3. Real ADD+DEL: bridge + host-local in the container namespace.
    if let (Some(refdir), Some(_)) = (&opts.ref_plugins, &opts.ctr_netns) {
        let ipam_dir = l.work.join("ipam");
        mkdir(&ipam_dir)?;
        let plugin = json!({"type":"bridge","bridge":"cgb0","isGateway":true,"ipMasq":false,
            "ipam":{"type":"host-local","ranges":[[{"subnet":"10.250.0.0/24"}]],"dataDir": ipam_dir}});
        let list = write_json(
            &l.netd.join("60-bridge.conflist"),
            &json!({"cniVersion":"1.0.0","name":"benchnet","plugins":[plugin.clone()]}),
        )?;
        let mut direct = plugin;
        direct["name"] = json!("benchnet");
        direct["cniVersion"] = json!("1.0.0");
        let direct = write_json(&l.work.join("bridge-direct.json"), &direct)?;
        let g_bridge = l.guard_conf("g-bridge.json", "1.0.0", &list, &[], 0, &l.cache)?;
        let bridge = refdir.join("bridge");
        section(&mut r, "real ADD+DEL", &mut |r| {
            let ok = Some("10.250.0.");
            let cases = vec![
                Case {
                    name: "bridge + host-local ADD+DEL, direct".into(),
                    steps: vec![
                        Step::new(&bridge, "ADD", &direct).expect(0, ok),
                        Step::new(&bridge, "DEL", &direct),
                    ],
                },
                Case {
                    name: "bridge + host-local ADD+DEL, through cni-guard".into(),
                    steps: vec![
                        Step::new(&l.guard(), "ADD", &g_bridge).expect(0, ok),
                        Step::new(&l.guard(), "DEL", &g_bridge),
                    ],
                },
            ];
            r.real = Some(compare(
                &cases,
                &env,
                plan.warmup.min(3),
                plan.real,
                &mut rng,
                &mut between,
            )?);
            Ok(())
        })?;
    }

    // 4. Refusal and STATUS.
    let missing = l.netd.join("99-missing.conf");
    let g_missing = l.guard_conf("g-missing.json", "1.0.0", &missing, &[], 0, &l.cache)?;
    let g_status_missing =
        l.guard_conf("g-status-missing.json", "1.1.0", &missing, &[], 0, &l.cache)?;
    let conf_110 = l.noop_conf("30-noop-110.conf", "1.1.0")?;
    let g_status_ready =
        l.guard_conf("g-status-ready.json", "1.1.0", &conf_110, &[], 0, &l.cache)?;
    section(&mut r, "refusal and STATUS", &mut |r| {
        let cases = vec![
            Case::one(
                "cni-noop, direct",
                Step::new(&l.noop(), "ADD", &g_fast).expect(0, Some("10.99.0.2")),
            ),
            Case::one(
                "cni-guard ADD, delegate missing (refused, code 11)",
                Step::new(&l.guard(), "ADD", &g_missing).expect(1, Some("\"code\":11")),
            ),
            Case::one(
                "cni-guard STATUS, delegate missing (code 50)",
                Step::new(&l.guard(), "STATUS", &g_status_missing).expect(1, Some("\"code\":50")),
            ),
            Case::one(
                "cni-guard STATUS, ready (runs the delegate's STATUS)",
                Step::new(&l.guard(), "STATUS", &g_status_ready),
            ),
        ];
        r.refusal = compare(
            &cases,
            &env,
            plan.warmup,
            plan.refusal,
            &mut rng,
            &mut between,
        )?;
        Ok(())
    })?;

    // 5. Wake-up.
    let wake_conf = l.netd.join("40-wake.conf");
    let g_wake = l.guard_conf("g-wake.json", "1.0.0", &wake_conf, &[], 10, &l.cache)?;
    section(&mut r, "wake-up", &mut |r| {
        let mut guards = vec![("cni-guard".to_owned(), l.guard())];
        guards.extend(
            opts.candidates
                .iter()
                .map(|(n, p)| (format!("candidate {n}"), p.clone())),
        );
        r.wake = wake_up(&l, &env, &guards, &g_wake, &wake_conf, plan.wake, &mut rng)?;
        clear_records(std::slice::from_ref(&l.cache))
    })?;

    // 6a. 64 concurrent ADDs.
    let g_fast_tmpfs = match &l.tmpfs_cache {
        Some(t) => Some(l.guard_conf("g-fast-tmpfs.json", "1.0.0", &noop_conf, &[], 0, t)?),
        None => None,
    };
    section(&mut r, "64 concurrent ADDs", &mut |r| {
        let mut sides = vec![
            (
                "64 × cni-noop, direct",
                Step::new(&l.noop(), "ADD", &g_fast),
            ),
            (
                "64 × exec-floor → cni-noop",
                Step::new(&l.floor(), "ADD", &g_fast).arg(l.noop().display().to_string()),
            ),
            (
                "64 × cni-guard → cni-noop",
                Step::new(&l.guard(), "ADD", &g_fast),
            ),
        ];
        if let Some(g) = &g_fast_tmpfs {
            sides.push((
                "64 × cni-guard → cni-noop, records on tmpfs",
                Step::new(&l.guard(), "ADD", g),
            ));
        }
        let names: Vec<String> = opts
            .candidates
            .iter()
            .map(|(n, _)| format!("64 × candidate {n} → cni-noop"))
            .collect();
        for ((_, bin), name) in opts.candidates.iter().zip(&names) {
            sides.push((name.as_str(), Step::new(bin, "ADD", &g_fast)));
        }
        r.concurrent = concurrent(&sides, &env, 64, plan.concurrent, &mut rng, &mut between)?;
        Ok(())
    })?;

    // 6b. Attachments.
    let att_dir = l.netd.join("attachments");
    mkdir(&att_dir)?;
    let mut att_files = Vec::new();
    for i in 0..100 {
        att_files.push(write_json(
            &att_dir.join(format!("{i:03}.conflist")),
            &json!({"cniVersion":"1.0.0","name":format!("att{i}"),"plugins":[{"type":"cni-noop"}]}),
        )?);
    }
    section(&mut r, "attachments", &mut |r| {
        let mut cases = vec![Case::one(
            "cni-noop, direct",
            Step::new(&l.noop(), "ADD", &g_fast).expect(0, Some("10.99.0.2")),
        )];
        let counts = [0usize, 1, 10, 100];
        for n in counts {
            let g = l.guard_conf(
                &format!("g-att-{n}.json"),
                "1.0.0",
                &noop_conf,
                &att_files[..n],
                0,
                &l.cache,
            )?;
            cases.push(Case::one(
                format!("cni-guard, {n} attachments"),
                Step::new(&l.guard(), "ADD", &g).expect(0, Some("10.99.0.2")),
            ));
        }
        let s = compare(
            &cases,
            &env,
            plan.warmup.min(5),
            plan.attachments,
            &mut rng,
            &mut between,
        )?;
        r.attachments = std::iter::once(usize::MAX).chain(counts).zip(s).collect();
        Ok(())
    })?;

    // 6c. Delegate size.
    let sizes = [1usize << 10, 16 << 10, 256 << 10, 1 << 20];
    let mut size_files = Vec::new();
    for &size in &sizes {
        let conf = padded_conf(size);
        let path = l.netd.join(format!("50-size-{size}.conf"));
        std::fs::write(&path, &conf).map_err(|e| e.to_string())?;
        let g = l.guard_conf(
            &format!("g-size-{size}.json"),
            "1.0.0",
            &path,
            &[],
            0,
            &l.cache,
        )?;
        size_files.push((size, path, g));
    }
    section(&mut r, "delegate size", &mut |r| {
        let mut cases = Vec::new();
        for (size, path, g) in &size_files {
            cases.push(Case::one(
                format!("cni-noop direct, {} KiB config", size >> 10),
                Step::new(&l.noop(), "ADD", path).expect(0, Some("10.99.0.2")),
            ));
            cases.push(Case::one(
                format!("cni-guard, {} KiB delegate", size >> 10),
                Step::new(&l.guard(), "ADD", g).expect(0, Some("10.99.0.2")),
            ));
        }
        let mut extra = Vec::new();
        for (name, bin) in &opts.candidates {
            for (size, _, g) in &size_files {
                extra.push(*size);
                cases.push(Case::one(
                    format!("candidate {name}, {} KiB delegate", size >> 10),
                    Step::new(bin, "ADD", g).expect(0, Some("10.99.0.2")),
                ));
            }
        }
        let s = compare(
            &cases,
            &env,
            plan.warmup.min(3),
            plan.sizes,
            &mut rng,
            &mut between,
        )?;
        let mut it = s.into_iter();
        for &size in &sizes {
            let d = it.next().expect("two per size");
            let g = it.next().expect("two per size");
            r.sizes.push((size, d, g));
        }
        r.size_candidates = extra.into_iter().zip(it).collect();
        Ok(())
    })?;

    // 7. Binary sizes.
    for name in ["cni-guard", "cni-guard-dynamic", "cni-noop", "exec-floor"] {
        if let Ok(m) = std::fs::metadata(l.bin.join(name)) {
            r.binaries.push((name.to_owned(), m.len()));
        }
    }
    Ok(r)
}

/// A single-plugin delegate of about `size` bytes: the noop plugin with a list of small objects,
/// the shape a large Multus configuration has.
fn padded_conf(size: usize) -> Vec<u8> {
    let head = br#"{"cniVersion":"1.0.0","name":"noopnet","type":"cni-noop","pad":["#;
    let mut out = head.to_vec();
    let mut i = 0;
    while out.len() + 64 < size {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(
            format!(r#"{{"name":"net{i:06}","value":"abcdefghijklmnopqrstuvwx"}}"#).as_bytes(),
        );
        i += 1;
    }
    out.extend_from_slice(b"]}");
    while out.len() < size {
        out.insert(out.len() - 1, b' ');
    }
    out
}

/// Starts a waiting ADD, renames the delegate into place at a random moment, and returns how
/// long after the rename the delegate started (as `cni-noop` stamps it). The guards take turns.
fn wake_up(
    l: &Layout,
    env: &Env,
    guards: &[(String, PathBuf)],
    g: &Path,
    conf: &Path,
    n: usize,
    rng: &mut Rng,
) -> Result<Vec<(String, Vec<Duration>)>, String> {
    let stamp = l.work.join("wake.stamp");
    let body =
        serde_json::to_vec(&json!({"cniVersion":"1.0.0","name":"noopnet","type":"cni-noop"}))
            .expect("serializes");
    let tmp = conf.with_file_name(".40-wake.conf.tmp");
    let mut out: Vec<(String, Vec<Duration>)> = guards
        .iter()
        .map(|(name, _)| (name.clone(), Vec::new()))
        .collect();
    let mut order: Vec<usize> = (0..guards.len()).collect();
    for _ in 0..n {
        rng.shuffle(&mut order);
        for &i in &order {
            let step = Step::new(&guards[i].1, "ADD", g)
                .env("CNI_NOOP_STAMP", stamp.display().to_string());
            let _ = std::fs::remove_file(conf);
            let _ = std::fs::remove_file(&stamp);
            let id = measure::fresh_container_id();
            let running = measure::start(&step, env, &id, "wake-up")?;
            std::thread::sleep(Duration::from_millis(50 + rng.below(250)));
            std::fs::write(&tmp, &body).map_err(|e| e.to_string())?;
            let renamed = measure::monotonic_ns();
            std::fs::rename(&tmp, conf).map_err(|e| e.to_string())?;
            measure::reap(running)?;
            let started: u128 = std::fs::read_to_string(&stamp)
                .map_err(|e| format!("wake-up: the delegate did not run: {e}"))?
                .trim()
                .parse()
                .map_err(|e| format!("wake-up: bad stamp: {e}"))?;
            if started < renamed {
                return Err("wake-up: the delegate ran before the rename".into());
            }
            out[i]
                .1
                .push(Duration::from_nanos((started - renamed) as u64));
        }
    }
    let _ = std::fs::remove_file(conf);
    Ok(out)
}

/// `n` processes at once per side, sides interleaved per round; the total wall time per round.
fn concurrent(
    sides: &[(&str, Step)],
    env: &Env,
    n: usize,
    rounds: usize,
    rng: &mut Rng,
    between: &mut dyn FnMut() -> Result<(), String>,
) -> Result<Vec<Samples>, String> {
    let mut samples: Vec<Samples> = sides
        .iter()
        .map(|(name, _)| Samples {
            name: (*name).to_owned(),
            ..Samples::default()
        })
        .collect();
    let mut order: Vec<usize> = (0..sides.len()).collect();
    for _ in 0..rounds + 1 {
        rng.shuffle(&mut order);
        for &i in &order {
            let (name, step) = &sides[i];
            let ids: Vec<String> = (0..n).map(|_| measure::fresh_container_id()).collect();
            let start = Instant::now();
            let running = ids
                .iter()
                .map(|id| measure::start(step, env, id, name))
                .collect::<Result<Vec<_>, _>>()?;
            let mut usage = measure::Usage::default();
            for r in running {
                usage = usage.and(measure::reap(r)?);
            }
            samples[i].times.push(start.elapsed());
            samples[i].max_rss_kib.push(usage.max_rss_kib);
            samples[i].cpu.push(usage.cpu);
        }
        between()?;
    }
    // The first round warmed up.
    for s in &mut samples {
        s.times.remove(0);
        s.max_rss_kib.remove(0);
        s.cpu.remove(0);
    }
    Ok(samples)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padded_conf_is_json_of_the_size_asked() {
        for size in [1024, 16 << 10, 1 << 20] {
            let c = padded_conf(size);
            assert_eq!(c.len(), size);
            let v: Value = serde_json::from_slice(&c).unwrap();
            assert_eq!(v["type"], "cni-noop");
        }
    }
}
