//! One invocation, from the runtime's request to the reply (or to exec'ing the delegate). The
//! decision table and each verb's deadline against kubelet's are in
//! docs/reference/cni-behaviour.md.

use std::ffi::OsString;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::config::{self, GuardConfig};
use crate::delegate::{self, Deadline};
use crate::error::{code, Error, Kind, Result};
use crate::events::Event;
use crate::netconf::NetworkConfig;
use crate::perpod;
use crate::readiness::{self, Report};
use crate::records::{Record, Store};
use crate::request::{self, Command, Request};
use crate::version::{Version, LATEST, SUPPORTED};
use crate::{teardown, wait};

/// What the process does once the guard has decided.
#[derive(Debug)]
pub enum Action {
    /// Print `stdout` and exit with `exit`.
    Reply { stdout: Vec<u8>, exit: i32 },
    /// Replace the process with the delegate plugin, `config` on its stdin (if the exec fails,
    /// reply with the error in [`reply_version`]). `lock`, kept open until the exec, is the
    /// attachment's lock, which the exec'd delegate then holds until it exits.
    Exec {
        plugin: PathBuf,
        config: Vec<u8>,
        lock: Option<OwnedFd>,
    },
}

/// The decision, what follows from it, and what goes with it into the log and the counters.
#[derive(Debug)]
pub struct Outcome {
    pub action: Action,
    /// The log line: `verb=ADD container=… ifname=eth0 decision=… duration=0.214ms`.
    pub line: String,
    /// Whether the line is a warning (refusals and failures).
    pub warn: bool,
    /// Extra warnings to log (loosely writable configuration files, unusable records).
    pub warnings: Vec<String>,
    /// Where the node's events file is (the guard's `cacheDir`, or the default when the
    /// configuration did not parse).
    pub cache_dir: PathBuf,
    /// How this invocation is counted on the node.
    pub event: Event,
}

/// How a verb ended, before it becomes an [`Action`].
pub(crate) enum Done {
    /// The delegate ran as the guard's child(ren) and this is its result.
    Result(Value),
    /// Done, nothing to print (DEL, CHECK, STATUS, GC): what happened.
    Empty(&'static str),
    /// Exec the delegate plugin with this configuration, holding this lock.
    Exec(PathBuf, Vec<u8>, Option<OwnedFd>),
}

#[derive(Default)]
pub(crate) struct Ctx {
    pub(crate) warnings: Vec<String>,
    /// `key=value` pairs for the log line: `waited=` (how long the verb waited for the
    /// delegate), `perpod=` (`primary`: run on the primary alone; `needs-multus`), `delegate=`.
    pub(crate) notes: Vec<(&'static str, String)>,
    /// How long the verb waited for the delegate, when it did (counted on the node).
    waited: Option<Duration>,
    /// The guard's cache dir, once its configuration parsed.
    cache_dir: Option<PathBuf>,
    /// Why a refusal happened, for the node's counters.
    pub(crate) reason: Option<&'static str>,
}

/// The cniVersion the reply is in, once the request is read: the panic hook's too.
static REPLY_VERSION: OnceLock<String> = OnceLock::new();

/// The version to answer in so far: the request's, or the newest before it is read.
pub fn reply_version() -> &'static str {
    REPLY_VERSION.get().map_or(LATEST, String::as_str)
}

/// Handles one invocation. `getenv` and `stdin` are the runtime's; nothing is printed here.
pub fn handle(getenv: &dyn Fn(&str) -> Option<OsString>, stdin: &mut dyn Read) -> Outcome {
    let start = Instant::now();
    let mut ctx = Ctx::default();
    let env = |k: &str| getenv(k).map_or_else(String::new, |v| v.to_string_lossy().into_owned());
    let result = request::read_stdin(stdin).and_then(|bytes| {
        let _ = REPLY_VERSION.set(config::reply_version(&bytes));
        // Test builds only: a way to reach the panic hook from outside.
        #[cfg(debug_assertions)]
        if getenv("CNI_GUARD_DEBUG_PANIC").is_some() {
            panic!("CNI_GUARD_DEBUG_PANIC is set");
        }
        dispatch(getenv, &bytes, &mut ctx)
    });
    // The edge: here the verb turns each error's kind into its CNI code. A request without a
    // known verb fails with code 4, which is the same on every verb.
    let verb = Command::parse(&env("CNI_COMMAND"));
    let reply_verb = verb.unwrap_or(Command::Version);
    let reply = |stdout, exit| Action::Reply { stdout, exit };
    let (action, decision, note) = match result {
        Ok(Done::Result(v)) => {
            let out = format!("{v}\n").into_bytes();
            (reply(out, 0), "child", "decision=delegated".to_owned())
        }
        Ok(Done::Empty(what)) => (reply(Vec::new(), 0), "done", format!("decision={what}")),
        Ok(Done::Exec(plugin, config, lock)) => {
            let note = format!("decision=exec plugin={}", plugin.display());
            let exec = Action::Exec {
                plugin,
                config,
                lock,
            };
            (exec, "exec", note)
        }
        Err(e) => {
            let code = e.code(reply_verb);
            let word = match code {
                code::TRY_AGAIN_LATER | code::NOT_AVAILABLE => "refused",
                _ => "error",
            };
            ctx.reason = ctx.reason.or(match e.kind() {
                Kind::Busy => Some("busy"),
                Kind::NotReady => Some("not-ready"),
                _ => None,
            });
            let note = format!("decision={word} code={code} msg={:?}", e.msg());
            (reply(e.to_json(reply_verb, reply_version()), 1), word, note)
        }
    };
    let notes: String = ctx
        .notes
        .iter()
        .map(|(k, v)| format!(" {k}={}", printable(v)))
        .collect();
    let line = format!(
        "verb={} container={} ifname={} {note}{notes} duration={:.3}ms",
        printable(&env("CNI_COMMAND")),
        printable(&env("CNI_CONTAINERID")),
        printable(&env("CNI_IFNAME")),
        start.elapsed().as_secs_f64() * 1e3
    );
    Outcome {
        action,
        line,
        warn: decision == "refused" || decision == "error",
        warnings: ctx.warnings,
        cache_dir: ctx
            .cache_dir
            .unwrap_or_else(|| PathBuf::from(config::DEFAULT_CACHE_DIR)),
        event: Event {
            verb,
            decision,
            reason: match decision {
                "refused" => ctx.reason.unwrap_or("other"),
                _ => "-",
            },
            waited: ctx.waited,
        },
    }
}

/// Log values come from the runtime: keep them on one line, cut to 128 characters.
fn printable(s: &str) -> String {
    if s.is_empty() {
        return "-".to_owned();
    }
    s.chars()
        .take(128)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

fn dispatch(env: &dyn Fn(&str) -> Option<OsString>, stdin: &[u8], ctx: &mut Ctx) -> Result<Done> {
    let command = request::command(env)?;
    let req = request::parse_env(command, env)?;
    if command == Command::Version {
        return Ok(Done::Result(serde_json::json!({
            "cniVersion": config::reply_version(stdin),
            "supportedVersions": SUPPORTED,
        })));
    }
    let cfg = GuardConfig::parse(stdin)?;
    ctx.cache_dir = Some(cfg.cache_dir.clone());
    match command {
        Command::Add => add(&req, &cfg, ctx),
        Command::Del => teardown::del(&req, &cfg, ctx),
        Command::Check => check(&req, &cfg),
        Command::Status => status(&req, &cfg, ctx),
        Command::Gc => gc(&req, &cfg, ctx),
        Command::Version => unreachable!("answered above"),
    }
}

/// A wait shorter than this is not worth a word in the log (it is the checks' own time).
const WAITED_NOTED: Duration = Duration::from_millis(5);

/// Waits up to `wait` for the network `cfg` names to be ready; notes how long it took.
pub(crate) fn wait_ready(
    req: &Request,
    cfg: &GuardConfig,
    wait: Duration,
    ctx: &mut Ctx,
) -> Report {
    let started = Instant::now();
    let report = wait::until_ready(cfg, &req.cni_path, wait);
    let waited = started.elapsed();
    if waited >= WAITED_NOTED {
        ctx.notes
            .push(("waited", format!("{:.1}ms", waited.as_secs_f64() * 1e3)));
        ctx.waited = Some(ctx.waited.unwrap_or_default() + waited);
    }
    warn_loose(&report, ctx);
    report
}

/// The delegate of a ready report, or the refusal the report makes, counted under its reason.
fn ready(report: Report, ctx: &mut Ctx) -> Result<NetworkConfig> {
    if let Some(e) = report.error() {
        ctx.reason = report.label();
        return Err(e);
    }
    Ok(report.delegate.expect("a ready report has the delegate"))
}

/// ADD: refuse (11, or 7) until the delegate network is complete; then record the delegate
/// and run it, by exec when no conversion is needed. With per-pod awareness, a pod that needs
/// no Multus network gets the primary network at once while the delegate is not ready.
fn add(req: &Request, cfg: &GuardConfig, ctx: &mut Ctx) -> Result<Done> {
    let mut needs_multus = None;
    if let Some(per_pod) = &cfg.per_pod {
        let first = readiness::check(cfg, &req.cni_path).error();
        // Only a delegate that is not there yet is bypassed; a misconfiguration (7) is not.
        if let Some(delegate) = first.filter(|e| *e.kind() == Kind::NotReady) {
            match perpod::need(per_pod, cfg, req) {
                perpod::Need::PrimaryOnly => return add_primary(req, cfg, per_pod, delegate, ctx),
                perpod::Need::Multus(why) => {
                    ctx.notes.push(("perpod", "needs-multus".to_owned()));
                    needs_multus = Some(format!("per-pod: {why}"));
                }
            }
        }
    }
    let report = wait_ready(req, cfg, cfg.wait, ctx);
    let list = ready(report, ctx).map_err(|e| {
        let details = [e.details().map(str::to_owned), needs_multus];
        let details: Vec<String> = details.into_iter().flatten().collect();
        e.with_details(details.join("; "))
    })?;
    run_add(req, cfg, list, ctx)
}

/// Per-pod awareness: the pod needs no Multus network and the delegate is not ready, so the
/// primary network runs for it directly, as Multus would have run it (same configuration, same
/// ifname). Refused (11) when the primary is not ready either. The record names the primary,
/// so the pod's DEL replays the primary's DEL whatever Multus does meanwhile.
fn add_primary(
    req: &Request,
    cfg: &GuardConfig,
    per_pod: &config::PerPod,
    delegate: Error,
    ctx: &mut Ctx,
) -> Result<Done> {
    let primary = primary_config(cfg, per_pod);
    let report = wait_ready(req, &primary, Duration::ZERO, ctx);
    let list = ready(report, ctx).map_err(|e| {
        e.with_details(format!(
            "per-pod: the pod needs no Multus network, but the primary is not ready either; the delegate: {}",
            delegate.msg()
        ))
    })?;
    ctx.notes.push(("perpod", "primary".to_owned()));
    run_add(req, &primary, list, ctx)
}

/// The guard's configuration with the primary as the delegate: no attachments or sockets of
/// Multus's, and without the pod annotations (a capability the guard asked for itself, not the
/// primary's).
pub(crate) fn primary_config(cfg: &GuardConfig, per_pod: &config::PerPod) -> GuardConfig {
    let mut primary = GuardConfig {
        delegate: per_pod.primary.clone(),
        attachments: Vec::new(),
        sockets: Vec::new(),
        per_pod: None,
        ..cfg.clone()
    };
    primary.runtime_config.remove(perpod::POD_ANNOTATIONS);
    primary
}

/// Records `list` for the attachment, then runs its ADD: by exec when it is one plugin at the
/// guard's version that can be exec'd ([`delegate::exec_plan`]), else as children.
fn run_add(req: &Request, cfg: &GuardConfig, list: NetworkConfig, ctx: &mut Ctx) -> Result<Done> {
    // Planned before anything is recorded: a plugin binary gone since the check refuses the ADD
    // with nothing recorded, as nothing ran.
    let prev = cfg.prev_result.as_ref();
    let plan = delegate::exec_plan(&list, cfg, &req.cni_path, prev)?;
    let mut store = Store::create(&cfg.cache_dir, &cfg.name, cfg.lock_wait)?;
    store.write(&Record {
        container_id: req.container_id.clone(),
        ifname: req.ifname.clone(),
        network: cfg.name.clone(),
        cni_version: cfg.cni_version.clone(),
        delegate_path: list.path.clone(),
        delegate: list.raw.clone(),
    })?;
    if let Some((plugin, config)) = plan {
        // The exec'd delegate must hold the attachment's lock; if the lock cannot be handed
        // over, the delegate runs as a child instead, with the guard holding it.
        match store.exec_lock() {
            Ok(lock) => return Ok(Done::Exec(plugin, config, lock)),
            Err(e) => ctx.warnings.push(format!(
                "cannot keep the attachment locked across exec ({e}): running the delegate as a child"
            )),
        }
    }
    let (e, rolled_back) = match delegate::add(&list, cfg, &req.cni_path, &Deadline::start(cfg)) {
        Ok(result) => return Ok(Done::Result(result)),
        Err(failed) => failed,
    };
    let removed = rolled_back.then(|| store.remove(&req.container_id, &req.ifname));
    if let Some(Err(re)) = removed {
        ctx.warnings.push(format!(
            "cannot remove the record after a rolled-back ADD: {re}"
        ));
    }
    Err(e)
}

/// CHECK: the delegate's CHECK with prevResult, where its version and configuration allow it,
/// with the delegate recorded at the attachment's ADD (the current one without a record).
fn check(req: &Request, cfg: &GuardConfig) -> Result<Done> {
    require(cfg, Version::V0_4_0, "CHECK")?;
    let mut store = Store::open_existing(&cfg.cache_dir, &cfg.name, cfg.lock_wait)?;
    let recorded = store.as_mut().map(|s| teardown::recorded(s, req, cfg));
    let list = match recorded.transpose()?.flatten() {
        Some(list) => list,
        // Not ready (11) or misconfigured (7), as the problem is.
        None => NetworkConfig::load(&cfg.delegate, &cfg.plugin_type)
            .map_err(|p| p.error(&format!("cni-guard: delegate {}", cfg.delegate.display())))?,
    };
    if !list.version().has_check() || list.disable_check {
        return Ok(Done::Empty("check-skipped"));
    }
    let prev = delegate::prev_result(&list, cfg)?;
    if let Some((plugin, config)) = delegate::exec_plan(&list, cfg, &req.cni_path, prev.as_ref())? {
        return Ok(Done::Exec(plugin, config, None));
    }
    delegate::check(&list, cfg, &req.cni_path, &Deadline::start(cfg))?;
    Ok(Done::Empty("checked"))
}

/// STATUS: 50 while not ready (never waits); then the delegate's own STATUS.
fn status(req: &Request, cfg: &GuardConfig, ctx: &mut Ctx) -> Result<Done> {
    require(cfg, Version::V1_1_0, "STATUS")?;
    let report = readiness::check(cfg, &req.cni_path);
    warn_loose(&report, ctx);
    let list = ready(report, ctx)?;
    if let Err(e) = delegate::status(&list, cfg, &req.cni_path) {
        ctx.reason = Some(match e.kind() {
            Kind::TimedOut => "status-timeout",
            _ => "delegate-status",
        });
        return Err(e);
    }
    Ok(Done::Empty("ready"))
}

/// GC: forwarded to the delegate; then the guard's own records outside the valid set go.
fn gc(req: &Request, cfg: &GuardConfig, ctx: &mut Ctx) -> Result<Done> {
    require(cfg, Version::V1_1_0, "GC")?;
    let mut errors = Vec::new();
    if let Ok(list) = NetworkConfig::load(&cfg.delegate, &cfg.plugin_type) {
        errors = delegate::gc(&list, cfg, &req.cni_path, &Deadline::start(cfg));
    }
    match Store::open_existing(&cfg.cache_dir, &cfg.name, cfg.lock_wait) {
        Ok(Some(mut store)) => {
            let swept = store.sweep_temp_files();
            if swept > 0 {
                ctx.warnings.push(format!(
                    "removed {swept} temp file(s) left by killed writers"
                ));
            }
            if let Some(valid) = &cfg.valid_attachments {
                errors.extend(store.keep_only(valid));
            }
        }
        Ok(None) => {}
        Err(e) => errors.push(e),
    }
    let mut errors = errors.into_iter();
    let Some(first) = errors.next() else {
        return Ok(Done::Empty("collected"));
    };
    let rest: Vec<String> = errors.map(|e| e.to_string()).collect();
    match rest.is_empty() {
        true => Err(first),
        false => Err(first.with_details(format!("also: {}", rest.join("; ")))),
    }
}

/// A verb the guard's cniVersion does not have yet: code 1.
fn require(cfg: &GuardConfig, since: Version, verb: &str) -> Result<()> {
    if cfg.version() >= since {
        return Ok(());
    }
    let Version(a, b, c) = since;
    let msg = format!(
        "cniVersion {} does not have {verb} (it came with {a}.{b}.{c})",
        cfg.cni_version
    );
    Err(Error::new(Kind::Unsupported, msg))
}

fn warn_loose(report: &Report, ctx: &mut Ctx) {
    let loose = report.warnings.iter().map(|p| p.display());
    ctx.warnings
        .extend(loose.map(|p| format!("{p} is writable by group or others")));
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// ADD records before it runs the delegate. A plugin binary that vanished between the
    /// readiness check and the run refuses the ADD (11) with nothing run: the record goes too,
    /// or the runtime's DEL would wait for that delegate and fail for it.
    #[test]
    fn an_add_refused_after_recording_leaves_no_record() {
        let d = tempfile::tempdir().unwrap();
        let cache = d.path().join("cache");
        let conf = json!({"cniVersion":"1.0.0","name":"g","type":"cni-guard",
            "delegate": d.path().join("00-d.conf"), "cacheDir": cache});
        let cfg = GuardConfig::parse(conf.to_string().as_bytes()).unwrap();
        let req = Request {
            container_id: "c1".into(),
            ifname: "eth0".into(),
            cni_path: vec![d.path().join("bin")],
            cni_args: String::new(),
        };
        // Exec'd (one plugin at the guard's version), run as a child (another version), and a
        // conflist whose first plugin is gone.
        for delegate in [
            json!({"cniVersion":"1.0.0","name":"d","type":"gone"}),
            json!({"cniVersion":"0.4.0","name":"d","type":"gone"}),
            json!({"cniVersion":"1.0.0","name":"d","plugins":[{"type":"gone"},{"type":"gone2"}]}),
        ] {
            let name = match delegate.get("plugins") {
                Some(_) => "00-d.conflist",
                None => "00-d.conf",
            };
            let list = NetworkConfig::from_bytes(
                &d.path().join(name),
                delegate.to_string().into_bytes(),
                config::GUARD_TYPE,
            )
            .unwrap();
            let Err(e) = run_add(&req, &cfg, list, &mut Ctx::default()) else {
                panic!("{delegate}: the ADD ran");
            };
            assert_eq!(
                e.code(Command::Add),
                code::TRY_AGAIN_LATER,
                "{delegate}: {e}"
            );
            let store = Store::open_existing(&cache, "g", cfg.lock_wait).unwrap();
            let records = store.map(|s| s.list().unwrap()).unwrap_or_default();
            assert!(records.is_empty(), "{delegate}: a record stays");
        }
    }
}
