//! The summary table (printed) and `bench/results.md` (every figure beside its target).

use std::fmt::Write;
use std::time::Duration;

use crate::cases::Results;
use crate::measure::{median, Samples};
use crate::Options;

/// One line of the summary: a figure, its target, and whether it is met.
struct Row {
    what: String,
    value: String,
    target: String,
    verdict: String,
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

/// `a - b` in milliseconds, signed.
fn diff_ms(a: Duration, b: Duration) -> f64 {
    (a.as_secs_f64() - b.as_secs_f64()) * 1e3
}

/// The overhead of `s` over `base` in ms: the median of the per-round differences (each round
/// runs both, close in time, so a load change between rounds cancels out).
fn over(s: &Samples, base: &Samples) -> f64 {
    let mut d: Vec<f64> = s
        .times
        .iter()
        .zip(&base.times)
        .map(|(a, b)| diff_ms(*a, *b))
        .collect();
    d.sort_by(f64::total_cmp);
    match d.len() {
        0 => 0.0,
        n if n % 2 == 1 => d[n / 2],
        n => (d[n / 2 - 1] + d[n / 2]) / 2.0,
    }
}

fn verdict(ok: bool) -> String {
    if ok { "met" } else { "MISSED" }.to_owned()
}

fn find<'a>(samples: &'a [Samples], starts: &str) -> Option<&'a Samples> {
    samples.iter().find(|s| s.name.starts_with(starts))
}

fn quantile(s: &Samples, q: f64) -> Duration {
    let mut v = s.times.clone();
    v.sort_unstable();
    if v.is_empty() {
        return Duration::ZERO;
    }
    v[((v.len() - 1) as f64 * q).round() as usize]
}

fn mib(kib: u64) -> String {
    format!("{:.2} MiB", kib as f64 / 1024.0)
}

fn rows(r: &Results) -> Vec<Row> {
    let mut rows = Vec::new();
    let mut push = |what: &str, value: String, target: &str, verdict: String| {
        rows.push(Row {
            what: what.to_owned(),
            value,
            target: target.to_owned(),
            verdict,
        })
    };
    // 1. Fast path.
    let empty = Samples::default();
    let noop_s = find(&r.fast, "cni-noop").unwrap_or(&empty);
    let noop = noop_s.median();
    let floor = find(&r.fast, "exec-floor")
        .map(|s| over(s, noop_s))
        .unwrap_or(0.0);
    if !r.fast.is_empty() {
        push(
            "1. cni-noop called directly (baseline)",
            ms(noop),
            "—",
            "—".into(),
        );
        push(
            "1. floor: one extra exec (exec-floor → cni-noop, minus baseline)",
            format!("{floor:.3} ms"),
            "≈ 0.5 ms (reference)",
            "—".into(),
        );
    }
    for (name, label) in [
        (
            "cni-guard (static) → cni-noop",
            "1. fast path overhead, static guard (guard → cni-noop, minus baseline)",
        ),
        (
            "cni-guard (dynamic)",
            "1. fast path overhead, dynamically linked guard",
        ),
    ] {
        if let Some(s) = find(&r.fast, name) {
            let o = over(s, noop_s);
            let ratio = o / floor;
            push(
                label,
                format!("{o:.3} ms = {ratio:.2}× floor"),
                "≤ 1.5× floor",
                verdict(ratio <= 1.5),
            );
        }
    }
    if let Some(s) = find(&r.fast, "cni-guard (static) → cni-noop, records on tmpfs") {
        let o = over(s, noop_s);
        push(
            "1. (diagnostic) same, records on tmpfs instead of the disk",
            format!("{o:.3} ms = {:.2}× floor", o / floor),
            "—",
            "—".into(),
        );
    }
    if let (Some(m), Some(g)) = (
        find(&r.fast, "cni-guard (static) → cni-noop, metrics on"),
        find(&r.fast, "cni-guard (static) → cni-noop"),
    ) {
        let cost_us = over(m, g) * 1e3;
        push(
            "1. metrics on: the plugin's event append (guard with the events file minus without, paired)",
            format!("{cost_us:.1} µs"),
            "< 20 µs",
            verdict(cost_us < 20.0),
        );
    }
    if let Some(s) = find(&r.fast, "cni-guard (static) → cni-noop, no syslog") {
        let o = over(s, noop_s);
        push(
            "1. (diagnostic) same, no syslog socket (the line goes to stderr)",
            format!("{o:.3} ms = {:.2}× floor", o / floor),
            "—",
            "—".into(),
        );
    }
    for s in r.fast.iter().filter(|s| s.name.starts_with("candidate ")) {
        let o = over(s, noop_s);
        let name = s.name.trim_end_matches(" → cni-noop");
        push(
            &format!("1. ({name}) fast path overhead"),
            format!("{o:.3} ms = {:.2}× floor", o / floor),
            "≤ 1.5× floor",
            verdict(o / floor <= 1.5),
        );
    }
    if let (Some(g), Some(f)) = (
        find(&r.fast, "cni-guard (static) → cni-noop"),
        find(&r.fast, "exec-floor"),
    ) {
        // The same ratio in five consecutive blocks of rounds: how much it moves with the load.
        let n = g.times.len() / 5;
        if n >= 10 {
            let block = |s: &Samples, i: usize| Samples {
                times: s.times[i * n..(i + 1) * n].to_vec(),
                ..Samples::default()
            };
            let ratios: Vec<String> = (0..5)
                .map(|i| {
                    let b = block(noop_s, i);
                    format!("{:.2}", over(&block(g, i), &b) / over(&block(f, i), &b))
                })
                .collect();
            push(
                "1. (noise) fast path ratio in five consecutive blocks of rounds",
                format!("{}×", ratios.join("×, ")),
                "≤ 1.5× floor",
                "—".into(),
            );
        }
    }
    if let Some(s) = find(&r.fast, "cni-guard (static) VERSION") {
        push(
            "1. (diagnostic) guard VERSION: start, read stdin, reply, log (minus baseline)",
            format!("{:.3} ms", over(s, noop_s)),
            "—",
            "—".into(),
        );
    }
    // 2. Child path.
    let cnoop = find(&r.child, "cni-noop").unwrap_or(&empty);
    if let Some(s) = find(&r.child, "cni-guard → cni-noop at 0.4.0") {
        push(
            "2. child path, 0.4.0 delegate converted to 1.0.0 (minus baseline)",
            format!("{:.3} ms", over(s, cnoop)),
            "— (one fork+exec more than the exec path)",
            "—".into(),
        );
    }
    if let Some(s) = find(&r.child, "cni-guard → conflist") {
        push(
            "2. child path, two-plugin conflist (minus one baseline)",
            format!("{:.3} ms", over(s, cnoop)),
            "—",
            "—".into(),
        );
    }
    // 3. Real ADD+DEL.
    match &r.real {
        Some(real) => {
            let d = real[0].median();
            let o = over(&real[1], &real[0]);
            let ratio = 1.0 + o / (d.as_secs_f64() * 1e3);
            push(
                "3. bridge + host-local ADD+DEL, direct",
                ms(d),
                "—",
                "—".into(),
            );
            push(
                "3. bridge + host-local ADD+DEL, through the guard (median of paired differences)",
                format!("+{o:.3} ms = {ratio:.3}× direct"),
                "≤ 1.05× direct",
                verdict(ratio <= 1.05),
            );
        }
        None => push(
            "3. real ADD+DEL",
            "not run (needs root and the reference plugins)".into(),
            "≤ 1.05× direct",
            "NOT RUN".into(),
        ),
    }
    // 4. Refusal and STATUS.
    if let Some(s) = find(&r.refusal, "cni-guard ADD, delegate missing") {
        push(
            "4. refusal: ADD with the delegate missing (whole process)",
            ms(s.median()),
            "≤ 1 ms",
            verdict(s.median() <= Duration::from_millis(1)),
        );
    }
    if let Some(s) = find(&r.refusal, "cni-guard STATUS, delegate missing") {
        push(
            "4. STATUS, not ready (whole process)",
            ms(s.median()),
            "≤ 1 ms",
            verdict(s.median() <= Duration::from_millis(1)),
        );
    }
    if let Some(s) = find(&r.refusal, "cni-guard STATUS, ready") {
        push(
            "4. STATUS, ready (includes running the delegate's STATUS)",
            ms(s.median()),
            "≤ 1 ms",
            verdict(s.median() <= Duration::from_millis(1)),
        );
    }
    // 5. Wake-up.
    for (name, wake) in &r.wake {
        let m = median(wake);
        let max = wake.iter().max().copied().unwrap_or_default();
        let label = if name == "cni-guard" {
            "5. wake-up: rename of the delegate → delegate started (median / max)".to_owned()
        } else {
            format!("5. ({name}) wake-up (median / max)")
        };
        push(
            &label,
            format!("{} / {}", ms(m), ms(max)),
            "≤ 10 ms",
            verdict(m <= Duration::from_millis(10)),
        );
    }
    // 6. Scale.
    if r.concurrent.len() >= 3 {
        let d = r.concurrent[0].median();
        let f = r.concurrent[1].median();
        let g = r.concurrent[2].median();
        push(
            "6. 64 concurrent exec-floor → cni-noop, total (two execs each, for reference)",
            format!(
                "{} = {:.2}× direct",
                ms(f),
                f.as_secs_f64() / d.as_secs_f64()
            ),
            "—",
            "—".into(),
        );
        push(
            "6. 64 concurrent ADDs, total: direct / through the guard",
            format!(
                "{} / {} = {:.2}×",
                ms(d),
                ms(g),
                g.as_secs_f64() / d.as_secs_f64()
            ),
            "—",
            "—".into(),
        );
        for c in r.concurrent[3..]
            .iter()
            .filter(|c| c.name.contains("candidate"))
        {
            let t = c.median();
            push(
                &format!(
                    "6. ({}) 64 concurrent ADDs",
                    c.name
                        .trim_start_matches("64 × ")
                        .trim_end_matches(" → cni-noop")
                ),
                format!(
                    "{} = {:.2}× direct",
                    ms(t),
                    t.as_secs_f64() / d.as_secs_f64()
                ),
                "—",
                "—".into(),
            );
        }
        if let Some(t) = r
            .concurrent
            .iter()
            .find(|c| c.name.ends_with("records on tmpfs"))
        {
            let t = t.median();
            push(
                "6. (diagnostic) 64 concurrent ADDs through the guard, records on tmpfs",
                format!(
                    "{} = {:.2}× direct",
                    ms(t),
                    t.as_secs_f64() / d.as_secs_f64()
                ),
                "—",
                "—".into(),
            );
        }
    }
    if let Some((_, base)) = r.attachments.first() {
        let o: Vec<(usize, f64)> = r.attachments[1..]
            .iter()
            .map(|(n, s)| (*n, over(s, base)))
            .collect();
        let text = o
            .iter()
            .map(|(n, x)| format!("{n}: {x:.3}"))
            .collect::<Vec<_>>()
            .join(", ");
        let per = |a: usize, z: usize| -> Option<f64> {
            let x = o.iter().find(|(n, _)| *n == a)?.1;
            let y = o.iter().find(|(n, _)| *n == z)?.1;
            Some((y - x) / (z - a) as f64 * 1e3)
        };
        let (small, large) = (per(1, 10).unwrap_or(0.0), per(10, 100).unwrap_or(0.0));
        push(
            "6. overhead by number of attachments (ms)",
            format!("{text}; per attachment {small:.1} µs (1→10), {large:.1} µs (10→100)"),
            "linear, not worse",
            verdict(large <= small.max(5.0) * 1.5),
        );
    }
    if !r.sizes.is_empty() {
        let o: Vec<(usize, f64)> = r.sizes.iter().map(|(n, d, g)| (*n, over(g, d))).collect();
        let text = o
            .iter()
            .map(|(n, x)| format!("{} KiB: {x:.3}", n >> 10))
            .collect::<Vec<_>>()
            .join(", ");
        let per_kib =
            |i: usize, j: usize| (o[j].1 - o[i].1) / ((o[j].0 - o[i].0) as f64 / 1024.0) * 1e3;
        let (small, large) = if o.len() >= 4 {
            (per_kib(1, 2), per_kib(2, 3))
        } else {
            (0.0, 0.0)
        };
        push(
            "6. overhead by delegate size (ms, guard minus cni-noop fed the same bytes)",
            format!("{text}; per KiB {small:.2} µs (16→256), {large:.2} µs (256→1024)"),
            "linear, not worse",
            verdict(large <= small.max(0.5) * 1.5),
        );
    }
    let mut names: Vec<&str> = Vec::new();
    for (_, c) in &r.size_candidates {
        let name = c.name.split(',').next().unwrap_or("");
        if !names.contains(&name) {
            names.push(name);
        }
    }
    for name in names {
        let o: Vec<String> = r
            .size_candidates
            .iter()
            .filter(|(_, c)| c.name.starts_with(&format!("{name},")))
            .filter_map(|(n, c)| {
                let (_, d, _) = r.sizes.iter().find(|(m, _, _)| m == n)?;
                Some(format!(
                    "{} KiB: {:.3} ({})",
                    n >> 10,
                    over(c, d),
                    mib(c.median_rss_kib())
                ))
            })
            .collect();
        push(
            &format!("6. ({name}) overhead by delegate size (ms, peak RSS)"),
            o.join(", "),
            "linear, not worse",
            "—".into(),
        );
    }
    // 7. Footprint.
    let mut paths: Vec<(&str, u64)> = Vec::new();
    for (set, name, label) in [
        (
            &r.fast,
            "cni-guard (static) → cni-noop",
            "exec path (max of guard and cni-noop after exec)",
        ),
        (
            &r.child,
            "cni-guard → cni-noop at 0.4.0",
            "child path, conversion",
        ),
        (&r.child, "cni-guard → conflist", "child path, two plugins"),
        (&r.refusal, "cni-guard ADD, delegate missing", "refusal"),
        (
            &r.refusal,
            "cni-guard STATUS, delegate missing",
            "STATUS not ready",
        ),
        (&r.refusal, "cni-guard STATUS, ready", "STATUS ready"),
    ] {
        if let Some(s) = find(set, name) {
            paths.push((label, s.median_rss_kib()));
        }
    }
    if let Some((_, _, g)) = r.sizes.last() {
        paths.push(("1 MiB delegate", g.median_rss_kib()));
    }
    let worst = paths
        .iter()
        .filter(|(l, _)| !l.starts_with("1 MiB"))
        .map(|(_, k)| *k)
        .max()
        .unwrap_or(0);
    push(
        "7. peak RSS of the guard by path",
        paths
            .iter()
            .map(|(l, k)| format!("{l}: {}", mib(*k)))
            .collect::<Vec<_>>()
            .join("; "),
        "≤ 4 MiB",
        verdict(worst <= 4096),
    );
    if let Some((_, b)) = r.binaries.iter().find(|(n, _)| n == "cni-guard") {
        push(
            "7. stripped static binary",
            format!("{:.2} MiB ({b} bytes)", *b as f64 / 1048576.0),
            "≤ 3 MiB",
            verdict(*b <= 3 << 20),
        );
    }
    rows
}

/// The summary table, as printed and as quoted in the README.
pub fn table(r: &Results) -> String {
    let mut out = String::from("| Measurement | Median | Target | Verdict |\n|---|---|---|---|\n");
    for row in rows(r) {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} |",
            row.what, row.value, row.target, row.verdict
        );
    }
    out
}

fn detail(out: &mut String, title: &str, samples: &[Samples]) {
    let _ = writeln!(
        out,
        "\n### {title}\n\n| Case | Median | p25–p75 | Runs | CPU (user+sys) | Peak RSS |\n|---|---|---|---|---|---|"
    );
    for s in samples {
        let _ = writeln!(
            out,
            "| {} | {} | {}–{} | {} | {} | {} |",
            s.name,
            ms(s.median()),
            ms(quantile(s, 0.25)),
            ms(quantile(s, 0.75)),
            s.times.len(),
            ms(s.median_cpu()),
            mib(s.median_rss_kib())
        );
    }
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".into());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    format!(
        "- CPU: {cpu}, {cores} cores (nproc)\n- Kernel: {}\n- Date: {} UTC\n",
        kernel.trim(),
        utc_now()
    )
}

/// `YYYY-MM-DD HH:MM` from the system clock (days-to-civil conversion, proleptic Gregorian).
fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0) as i64;
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60
    )
}

pub fn markdown(opts: &Options, r: &Results) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# cni-guard benchmark results\n");
    let (cmd, note) = if r.quick {
        (
            "scripts/bench.sh --quick",
            " QUICK MODE: a few runs only, the figures are not meaningful.",
        )
    } else {
        ("scripts/bench.sh", "")
    };
    let _ = writeln!(out, "Written by `{cmd}`.{note} Medians of interleaved runs (every round runs each case once, in random order); an overhead (\"minus baseline\") is the median over rounds of the case minus `cni-noop` called directly in the same round.\n");
    let _ = writeln!(out, "{}", machine());
    let _ = writeln!(out, "## Summary\n\n{}", table(r));
    let _ = writeln!(out, "## Noise\n\nLoad average (1, 5, 15 min) before and after each section; the machine is shared, so compare within a section only.\n\n| Section | Before | After |\n|---|---|---|");
    for (name, a, b) in &r.load {
        let _ = writeln!(out, "| {name} | {a} | {b} |");
    }
    let _ = writeln!(out, "\n## All cases");
    detail(&mut out, "1. Fast path", &r.fast);
    detail(&mut out, "2. Child path", &r.child);
    if let Some(real) = &r.real {
        detail(&mut out, "3. Real ADD+DEL (bridge + host-local)", real);
    }
    if let Some(real) = &r.real {
        let _ = writeln!(out, "\nPer step (median wall time):\n");
        for c in real {
            let steps: Vec<String> = c
                .steps
                .iter()
                .zip(["ADD", "DEL"])
                .map(|(t, verb)| format!("{verb} {}", ms(median(t))))
                .collect();
            let _ = writeln!(out, "- {}: {}", c.name, steps.join(", "));
        }
    }
    detail(&mut out, "4. Refusal and STATUS", &r.refusal);
    if !r.wake.is_empty() {
        let _ = writeln!(out, "\n### 5. Wake-up\n\nRename of the delegate into place → `cni-noop` started, sorted, in ms:\n");
        for (name, wake) in &r.wake {
            let mut w = wake.clone();
            w.sort_unstable();
            let list: Vec<String> = w
                .iter()
                .map(|d| format!("{:.2}", d.as_secs_f64() * 1e3))
                .collect();
            let _ = writeln!(out, "- {name} ({} runs): {}", w.len(), list.join(", "));
        }
    }
    detail(
        &mut out,
        "6. 64 concurrent ADDs (total wall time per batch)",
        &r.concurrent,
    );
    let att: Vec<Samples> = r.attachments.iter().map(|(_, s)| s.clone()).collect();
    detail(&mut out, "6. Attachments", &att);
    let mut sizes: Vec<Samples> = r
        .sizes
        .iter()
        .flat_map(|(_, d, g)| [d.clone(), g.clone()])
        .collect();
    sizes.extend(r.size_candidates.iter().map(|(_, c)| c.clone()));
    detail(&mut out, "6. Delegate size", &sizes);
    let _ = writeln!(out, "\n### 7. Binaries\n\n| File | Bytes |\n|---|---|");
    for (n, b) in &r.binaries {
        let _ = writeln!(out, "| {n} | {b} |");
    }
    for a in &opts.appendix {
        if let Ok(text) = std::fs::read_to_string(a) {
            let _ = writeln!(out, "\n{}", text.trim_end());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_now_is_plausible() {
        let s = utc_now();
        assert_eq!(s.len(), 16, "{s}");
        assert!(s.starts_with("20"), "{s}");
    }
}
