//! Running plugin invocations and timing them: one spawn, one `wait4`, wall time and peak RSS.

use std::fs::File;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// One process to run: a plugin with a CNI verb and a configuration on stdin.
#[derive(Debug, Clone)]
pub struct Step {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub verb: &'static str,
    pub stdin: PathBuf,
    /// Extra environment on top of the common CNI variables.
    pub env: Vec<(String, String)>,
    pub expect_exit: i32,
    /// A substring the first (checking) run's stdout must hold.
    pub expect_out: Option<String>,
}

impl Step {
    pub fn new(program: &Path, verb: &'static str, stdin: &Path) -> Step {
        Step {
            program: program.to_owned(),
            args: Vec::new(),
            verb,
            stdin: stdin.to_owned(),
            env: Vec::new(),
            expect_exit: 0,
            expect_out: None,
        }
    }

    pub fn arg(mut self, a: impl Into<String>) -> Step {
        self.args.push(a.into());
        self
    }

    pub fn env(mut self, k: &str, v: impl Into<String>) -> Step {
        self.env.push((k.to_owned(), v.into()));
        self
    }

    pub fn expect(mut self, exit: i32, out: Option<&str>) -> Step {
        self.expect_exit = exit;
        self.expect_out = out.map(str::to_owned);
        self
    }
}

/// A measured unit: its steps run in order with one container ID (ADD then DEL, say).
#[derive(Debug, Clone)]
pub struct Case {
    pub name: String,
    pub steps: Vec<Step>,
}

impl Case {
    pub fn one(name: impl Into<String>, step: Step) -> Case {
        Case {
            name: name.into(),
            steps: vec![step],
        }
    }
}

/// Environment every step gets (the runtime's view).
#[derive(Debug, Clone)]
pub struct Env {
    pub netns: String,
    pub ifname: String,
    pub cni_path: String,
    pub syslog: PathBuf,
}

/// Timings of one case over all rounds.
#[derive(Debug, Clone, Default)]
pub struct Samples {
    pub name: String,
    pub times: Vec<Duration>,
    pub max_rss_kib: Vec<u64>,
    /// User plus system CPU time of the processes of each run (children included).
    pub cpu: Vec<Duration>,
    /// For cases of several steps: each step's own wall time, per step.
    pub steps: Vec<Vec<Duration>>,
}

impl Samples {
    pub fn median(&self) -> Duration {
        median(&self.times)
    }

    pub fn median_cpu(&self) -> Duration {
        median(&self.cpu)
    }

    pub fn median_rss_kib(&self) -> u64 {
        let mut v = self.max_rss_kib.clone();
        v.sort_unstable();
        v.get(v.len() / 2).copied().unwrap_or(0)
    }
}

pub fn median(times: &[Duration]) -> Duration {
    let mut v = times.to_vec();
    v.sort_unstable();
    match v.len() {
        0 => Duration::ZERO,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2,
    }
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A container ID never used before in this run, so every ADD writes a new record.
pub fn fresh_container_id() -> String {
    format!(
        "bench{}x{}",
        std::process::id(),
        NEXT_ID.fetch_add(1, Ordering::Relaxed)
    )
}

fn command(step: &Step, env: &Env, container_id: &str) -> Result<Command, String> {
    let stdin = File::open(&step.stdin)
        .map_err(|e| format!("cannot open {}: {e}", step.stdin.display()))?;
    let mut cmd = Command::new(&step.program);
    cmd.args(&step.args)
        .env_clear()
        .env("CNI_COMMAND", step.verb)
        .env("CNI_CONTAINERID", container_id)
        .env("CNI_NETNS", &env.netns)
        .env("CNI_IFNAME", &env.ifname)
        .env("CNI_PATH", &env.cni_path)
        .env("CNI_GUARD_SYSLOG", &env.syslog)
        .envs(step.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::from(stdin));
    Ok(cmd)
}

/// Runs the case once with output captured and checks every step's exit status and output.
pub fn check(case: &Case, env: &Env) -> Result<(), String> {
    let id = fresh_container_id();
    for (i, step) in case.steps.iter().enumerate() {
        let out = command(step, env, &id)?
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .map_err(|e| format!("{}: cannot run {}: {e}", case.name, step.program.display()))?;
        let code = out
            .status
            .code()
            .unwrap_or_else(|| 128 + out.status.signal().unwrap_or(0));
        let stdout = String::from_utf8_lossy(&out.stdout);
        let fail = |why: String| {
            Err(format!(
                "{} (step {} {}): {why}; stdout: {stdout}; stderr: {}",
                case.name,
                i + 1,
                step.verb,
                String::from_utf8_lossy(&out.stderr)
            ))
        };
        if code != step.expect_exit {
            return fail(format!("exit status {code}, expected {}", step.expect_exit));
        }
        if let Some(want) = &step.expect_out {
            if !stdout.contains(want.as_str()) {
                return fail(format!("stdout does not contain {want:?}"));
            }
        }
    }
    Ok(())
}

/// A started process, to be reaped by [`reap`].
pub struct Running {
    pid: libc::pid_t,
    name: String,
    expect_exit: i32,
}

/// Starts one step with stdout and stderr discarded.
pub fn start(step: &Step, env: &Env, container_id: &str, name: &str) -> Result<Running, String> {
    let mut cmd = command(step, env, container_id)?;
    cmd.stdout(Stdio::null()).stderr(Stdio::null());
    let child = cmd
        .spawn()
        .map_err(|e| format!("{name}: cannot run {}: {e}", step.program.display()))?;
    Ok(Running {
        pid: child.id() as libc::pid_t,
        name: name.to_owned(),
        expect_exit: step.expect_exit,
    })
}

/// What `wait4` reports about a finished process.
#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    pub max_rss_kib: u64,
    pub cpu: Duration,
}

impl Usage {
    /// Two runs one after the other: the larger peak, the summed CPU.
    pub fn and(self, other: Usage) -> Usage {
        Usage {
            max_rss_kib: self.max_rss_kib.max(other.max_rss_kib),
            cpu: self.cpu + other.cpu,
        }
    }
}

fn tv(t: libc::timeval) -> Duration {
    Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
}

/// Waits for a started process; returns its peak RSS and CPU time. A wrong exit status is an
/// error.
pub fn reap(r: Running) -> Result<Usage, String> {
    let mut status = 0;
    // SAFETY: rusage is plain data that wait4 fills in.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: pid is our own child, not yet reaped (std's Child was dropped without waiting);
    // status and usage are valid for writing.
    let got = unsafe { libc::wait4(r.pid, &mut status, 0, &mut usage) };
    if got != r.pid {
        return Err(format!(
            "{}: wait4 failed: {}",
            r.name,
            std::io::Error::last_os_error()
        ));
    }
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        128 + libc::WTERMSIG(status)
    };
    if code != r.expect_exit {
        return Err(format!(
            "{}: exit status {code}, expected {} (a timed run failed)",
            r.name, r.expect_exit
        ));
    }
    Ok(Usage {
        max_rss_kib: usage.ru_maxrss as u64,
        cpu: tv(usage.ru_utime) + tv(usage.ru_stime),
    })
}

/// Runs the case once, timed: every step in order, one fresh container ID.
pub fn time_once(case: &Case, env: &Env) -> Result<(Duration, Usage, Vec<Duration>), String> {
    let id = fresh_container_id();
    let mut usage = Usage::default();
    let mut steps = Vec::new();
    let t0 = Instant::now();
    for step in &case.steps {
        let ts = Instant::now();
        // The stdin file is opened inside the timed span, on every side alike.
        let r = start(step, env, &id, &case.name)?;
        usage = usage.and(reap(r)?);
        steps.push(ts.elapsed());
    }
    Ok((t0.elapsed(), usage, steps))
}

/// A small xorshift generator: shuffling rounds needs no more.
pub struct Rng(u64);

impl Rng {
    pub fn new() -> Rng {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0x9e37_79b9_7f4a_7c15);
        Rng(seed | 1)
    }

    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            v.swap(i, j);
        }
    }
}

/// Checks every case, then runs `warmup + rounds` rounds, each case once per round in a fresh
/// random order; `between` runs after every round, untimed (to clear records, say).
pub fn compare(
    cases: &[Case],
    env: &Env,
    warmup: usize,
    rounds: usize,
    rng: &mut Rng,
    between: &mut dyn FnMut() -> Result<(), String>,
) -> Result<Vec<Samples>, String> {
    for c in cases {
        check(c, env)?;
    }
    between()?;
    let mut samples: Vec<Samples> = cases
        .iter()
        .map(|c| Samples {
            name: c.name.clone(),
            ..Samples::default()
        })
        .collect();
    let mut order: Vec<usize> = (0..cases.len()).collect();
    for round in 0..warmup + rounds {
        rng.shuffle(&mut order);
        for &i in &order {
            let (t, usage, steps) = time_once(&cases[i], env)?;
            if round >= warmup {
                if samples[i].steps.len() < steps.len() {
                    samples[i].steps.resize(steps.len(), Vec::new());
                }
                for (k, st) in steps.into_iter().enumerate() {
                    samples[i].steps[k].push(st);
                }
                samples[i].times.push(t);
                samples[i].max_rss_kib.push(usage.max_rss_kib);
                samples[i].cpu.push(usage.cpu);
            }
        }
        between()?;
    }
    Ok(samples)
}

/// CLOCK_MONOTONIC in nanoseconds: the clock `cni-noop` stamps with.
pub fn monotonic_ns() -> u128 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec to write into.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u128 * 1_000_000_000 + ts.tv_nsec as u128
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even() {
        let ms = Duration::from_millis;
        assert_eq!(median(&[ms(3), ms(1), ms(2)]), ms(2));
        assert_eq!(
            median(&[ms(4), ms(1), ms(2), ms(3)]),
            Duration::from_micros(2500)
        );
        assert_eq!(median(&[]), Duration::ZERO);
    }

    #[test]
    fn shuffle_keeps_every_element() {
        let mut rng = Rng::new();
        let mut v: Vec<u32> = (0..20).collect();
        rng.shuffle(&mut v);
        v.sort_unstable();
        assert_eq!(v, (0..20).collect::<Vec<_>>());
    }
}
