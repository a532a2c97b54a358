//! `cni-guard-bench`: measures what cni-guard adds to a pod start, side by side with what it
//! wraps, and writes the report. `scripts/bench.sh` builds the binaries, creates the temp dirs
//! and network namespaces, and runs this inside the "host" namespace.
//!
//! Every comparison runs all of its cases in one invocation, interleaved: each round runs every
//! case once in a fresh random order, so load from other processes falls on all sides alike.
//! Each case is checked once before timing (exit status and output), and every timed run's exit
//! status is checked again, so a broken bench fails instead of timing errors.
//! Times are wall-clock from spawn to reaped (`wait4`, which also gives the peak RSS).

mod cases;
mod measure;
mod report;

use std::path::PathBuf;
use std::process::ExitCode;

/// What `scripts/bench.sh` passes in.
#[derive(Debug, Clone)]
pub struct Options {
    /// Holds `cni-noop`, `exec-floor`, `cni-guard` (static) and optionally `cni-guard-dynamic`.
    pub bin: PathBuf,
    /// A scratch directory this run owns.
    pub work: PathBuf,
    /// Directories with the reference plugins (bridge, host-local), for the real ADD+DEL.
    pub ref_plugins: Option<PathBuf>,
    /// The container's network namespace path, for the real ADD+DEL (needs root).
    pub ctr_netns: Option<String>,
    /// A directory on tmpfs, for the "records on tmpfs" diagnostic case.
    pub tmpfs: Option<PathBuf>,
    pub quick: bool,
    pub out: PathBuf,
    /// Extra sections (machine facts, hyperfine, /usr/bin/time) to append verbatim.
    pub appendix: Vec<PathBuf>,
    /// Other guard binaries to measure beside the real one (proposed changes), by name.
    pub candidates: Vec<(String, PathBuf)>,
    /// Run only the sections whose names start with one of these.
    pub only: Vec<String>,
}

fn parse_args() -> Result<Options, String> {
    let mut o = Options {
        bin: PathBuf::new(),
        work: PathBuf::new(),
        ref_plugins: None,
        ctr_netns: None,
        tmpfs: None,
        quick: false,
        out: PathBuf::from("bench/results.md"),
        appendix: Vec::new(),
        candidates: Vec::new(),
        only: Vec::new(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--bin" => o.bin = value()?.into(),
            "--work" => o.work = value()?.into(),
            "--ref-plugins" => o.ref_plugins = Some(value()?.into()),
            "--ctr-netns" => o.ctr_netns = Some(value()?),
            "--tmpfs" => o.tmpfs = Some(value()?.into()),
            "--out" => o.out = value()?.into(),
            "--appendix" => o.appendix.push(value()?.into()),
            "--candidate" => {
                let v = value()?;
                let (name, path) = v
                    .split_once('=')
                    .ok_or_else(|| format!("--candidate wants NAME=PATH, not {v:?}"))?;
                o.candidates.push((name.to_owned(), path.into()));
            }
            "--only" => o.only.extend(value()?.split(',').map(str::to_owned)),
            "--quick" => o.quick = true,
            _ => return Err(format!("unknown argument {a:?}")),
        }
    }
    if o.bin.as_os_str().is_empty() || o.work.as_os_str().is_empty() {
        return Err("usage: cni-guard-bench --bin DIR --work DIR [--ref-plugins DIR --ctr-netns PATH] [--tmpfs DIR] [--quick] [--only SECTION,...] [--candidate NAME=GUARD]... [--out FILE] [--appendix FILE]...".into());
    }
    Ok(o)
}

fn main() -> ExitCode {
    let opts = match parse_args() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("cni-guard-bench: {e}");
            return ExitCode::from(2);
        }
    };
    match cases::run_all(&opts) {
        Ok(results) => {
            let md = report::markdown(&opts, &results);
            print!("{}", report::table(&results));
            if let Err(e) = std::fs::write(&opts.out, md) {
                eprintln!("cni-guard-bench: cannot write {}: {e}", opts.out.display());
                return ExitCode::from(1);
            }
            eprintln!("cni-guard-bench: wrote {}", opts.out.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("cni-guard-bench: FAILED: {e}");
            ExitCode::from(1)
        }
    }
}
