//! CNI mode: one invocation, from the runtime's request to the reply (or to exec'ing the
//! delegate). The decision table is in docs/reference/cni-behaviour.md.

use std::ffi::OsString;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::config::{self, GuardConfig};
use crate::delegate;
use crate::error::{code, Error, Kind, Result};
use crate::log::Level;
use crate::netconf::NetworkConfig;
use crate::perpod;
use crate::readiness;
use crate::records::{Record, Store};
use crate::request::{self, Command, Request};
use crate::version::{Version, SUPPORTED};
use crate::wait;

/// What the process does once the guard has decided.
#[derive(Debug)]
pub enum Action {
    /// Print `stdout` and exit with `exit`.
    Reply { stdout: Vec<u8>, exit: i32 },
    /// Replace the process with the delegate plugin, `config` on its stdin. If the exec fails,
    /// reply with the error for `verb` in `cni_version`. `lock`, kept open until the exec, is the
    /// attachment's lock, which the exec'd delegate then holds until it exits.
    Exec {
        plugin: PathBuf,
        config: Vec<u8>,
        verb: Command,
        cni_version: String,
        lock: Option<OwnedFd>,
    },
}

/// What the guard decided for one invocation: the log line's `decision=` and what the
/// per-node counters count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The delegate ran as the guard's child(ren) and its result is the reply.
    Delegated,
    /// The guard execs the delegate plugin.
    Exec { plugin: PathBuf },
    /// Done without a result to print (DEL, CHECK, STATUS, GC): what happened.
    Done(&'static str),
    /// Not now (codes 11 and 50): the runtime retries.
    Refused { code: u32, msg: String },
    /// Any other failure.
    Failed { code: u32, msg: String },
}

impl Decision {
    fn of(result: &Result<Done>, verb: Command) -> Decision {
        match result {
            Ok(Done::Result(_)) => Decision::Delegated,
            Ok(Done::Empty(what)) => Decision::Done(what),
            Ok(Done::Exec(plugin, ..)) => Decision::Exec {
                plugin: plugin.clone(),
            },
            Err(e) => {
                let (code, msg) = (e.code(verb), e.msg().to_owned());
                if code == code::TRY_AGAIN_LATER || code == code::NOT_AVAILABLE {
                    Decision::Refused { code, msg }
                } else {
                    Decision::Failed { code, msg }
                }
            }
        }
    }

    /// The decision as the node's counters name it.
    pub fn token(&self) -> &'static str {
        match self {
            Decision::Delegated => "child",
            Decision::Exec { .. } => "exec",
            Decision::Done(_) => "done",
            Decision::Refused { .. } => "refused",
            Decision::Failed { .. } => "error",
        }
    }

    /// How loud the log line is.
    pub fn level(&self) -> Level {
        match self {
            Decision::Refused { .. } | Decision::Failed { .. } => Level::Warning,
            _ => Level::Info,
        }
    }
}

/// Who asked: the runtime's `CNI_COMMAND`, `CNI_CONTAINERID` and `CNI_IFNAME` as given (they may
/// be invalid; the log shows them anyway).
#[derive(Debug, Clone, Default)]
pub struct Invocation {
    pub verb: String,
    pub container: String,
    pub ifname: String,
}

/// The decision, what follows from it, and what goes with it into the log.
#[derive(Debug)]
pub struct Outcome {
    pub action: Action,
    pub invocation: Invocation,
    pub decision: Decision,
    pub duration: Duration,
    /// Extra warnings to log (loosely writable configuration files, unusable records).
    pub warnings: Vec<String>,
    /// `key=value` pairs for the log line: `waited=` (how long ADD waited for the delegate),
    /// `perpod=` (`primary`: run on the primary alone; `needs-multus`).
    pub notes: Vec<(&'static str, String)>,
    /// Where the node's events file is (the guard's `cacheDir`, or the default when the
    /// configuration did not parse).
    pub cache_dir: PathBuf,
    /// How this invocation is counted.
    pub event: Counted,
}

/// How a verb ended, before it becomes an [`Action`].
enum Done {
    Result(Value),
    Empty(&'static str),
    Exec(PathBuf, Vec<u8>, Option<OwnedFd>),
}

struct Ctx {
    warnings: Vec<String>,
    /// `key=value` pairs for the log line (`waited=`, `perpod=`).
    notes: Vec<(&'static str, String)>,
    /// Per-pod awareness: why this pod needs Multus, for a refusal's details.
    needs_multus: Option<String>,
    /// The guard's cache dir, once its configuration parsed.
    cache_dir: Option<PathBuf>,
    /// Why a refusal happened, for the node's counters.
    reason: Option<&'static str>,
}

/// Handles one invocation. `getenv` and `stdin` are the runtime's; nothing is printed here.
pub fn handle(getenv: &dyn Fn(&str) -> Option<OsString>, stdin: &mut dyn Read) -> Outcome {
    let start = Instant::now();
    let mut ctx = Ctx {
        warnings: Vec::new(),
        notes: Vec::new(),
        needs_multus: None,
        cache_dir: None,
        reason: None,
    };
    let given = |k: &str| {
        getenv(k)
            .map(|v| v.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    let invocation = Invocation {
        verb: given("CNI_COMMAND"),
        container: given("CNI_CONTAINERID"),
        ifname: given("CNI_IFNAME"),
    };
    let (reply_version, result) = match request::read_stdin(stdin) {
        Ok(bytes) => {
            let v = config::reply_version(&bytes);
            // Test builds only: a way to reach the panic hook from outside.
            #[cfg(debug_assertions)]
            if getenv("CNI_GUARD_DEBUG_PANIC").is_some() {
                panic!("CNI_GUARD_DEBUG_PANIC is set");
            }
            (v, dispatch(getenv, bytes, &mut ctx))
        }
        Err(e) => (crate::version::LATEST.to_owned(), Err(e)),
    };
    // The edge: here the verb turns each error's kind into its CNI code. A request without a
    // known verb fails with code 4, which is the same on every verb.
    let verb = Command::parse(&invocation.verb).unwrap_or(Command::Version);
    let decision = Decision::of(&result, verb);
    let result_kind = result.as_ref().err().map(|e| e.kind().clone());
    let action = match result {
        Ok(Done::Result(v)) => {
            let mut out = serde_json::to_vec(&v).expect("JSON values always serialize");
            out.push(b'\n');
            Action::Reply {
                stdout: out,
                exit: 0,
            }
        }
        Ok(Done::Empty(_)) => Action::Reply {
            stdout: Vec::new(),
            exit: 0,
        },
        Ok(Done::Exec(plugin, config, lock)) => Action::Exec {
            plugin,
            config,
            verb,
            cni_version: reply_version,
            lock,
        },
        Err(e) => Action::Reply {
            stdout: e.to_json(verb, &reply_version),
            exit: 1,
        },
    };
    let event = Counted {
        verb: verb_token(&invocation.verb),
        decision: decision.token(),
        reason: match (&decision, &result_kind) {
            (Decision::Refused { .. }, _) if ctx.reason.is_some() => ctx.reason.unwrap_or("-"),
            (Decision::Refused { .. }, Some(Kind::Busy)) => "busy",
            (Decision::Refused { .. }, Some(Kind::TimedOut)) => "status-timeout",
            (Decision::Refused { .. }, Some(Kind::NotReady)) => "not-ready",
            (Decision::Refused { .. }, _) => "other",
            _ => "-",
        },
    };
    Outcome {
        action,
        invocation,
        decision,
        duration: start.elapsed(),
        warnings: ctx.warnings,
        notes: ctx.notes,
        cache_dir: ctx
            .cache_dir
            .unwrap_or_else(|| PathBuf::from(config::DEFAULT_CACHE_DIR)),
        event,
    }
}

/// How an invocation is counted on the node (`cni_guard_decisions_total`,
/// `cni_guard_refusals_total`): tokens of the events file (see [`crate::events`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counted {
    pub verb: &'static str,
    pub decision: &'static str,
    pub reason: &'static str,
}

impl Counted {
    pub fn event(&self) -> crate::events::Event<'static> {
        crate::events::Event {
            verb: self.verb,
            decision: self.decision,
            reason: self.reason,
        }
    }
}

fn verb_token(verb: &str) -> &'static str {
    match Command::parse(verb) {
        Some(Command::Add) => "add",
        Some(Command::Del) => "del",
        Some(Command::Check) => "check",
        Some(Command::Status) => "status",
        Some(Command::Gc) => "gc",
        Some(Command::Version) => "version",
        None => "other",
    }
}

fn dispatch(
    getenv: &dyn Fn(&str) -> Option<OsString>,
    stdin: Vec<u8>,
    ctx: &mut Ctx,
) -> Result<Done> {
    let command = request::command(getenv)?;
    let mut req = request::parse_env(command, getenv)?;
    req.stdin = stdin;
    if command == Command::Version {
        return version(&req.stdin);
    }
    let cfg = GuardConfig::parse(&req.stdin)?;
    ctx.cache_dir = Some(cfg.cache_dir.clone());
    match command {
        Command::Add => add(&req, &cfg, ctx),
        Command::Del => del(&req, &cfg, ctx),
        Command::Check => check(&req, &cfg),
        Command::Status => status(&req, &cfg, ctx),
        Command::Gc => gc(&req, &cfg, ctx),
        Command::Version => unreachable!("handled above"),
    }
}

fn version(stdin: &[u8]) -> Result<Done> {
    Ok(Done::Result(serde_json::json!({
        "cniVersion": config::reply_version(stdin),
        "supportedVersions": SUPPORTED,
    })))
}

/// ADD: refuse (11, or 7) until the delegate network is complete; then record the delegate
/// and run it, by exec when no conversion is needed. With per-pod awareness, a pod that needs
/// no Multus network gets the primary network at once while the delegate is not ready.
fn add(req: &Request, cfg: &GuardConfig, ctx: &mut Ctx) -> Result<Done> {
    let started = Instant::now();
    let report = match &cfg.per_pod {
        None => wait::until_ready(cfg, &req.cni_path, cfg.wait),
        Some(per_pod) => {
            let first = readiness::check(cfg, &req.cni_path);
            // Only a delegate that is not there yet is bypassed; a misconfiguration (7) is not.
            let not_ready = first.error().is_some_and(|e| *e.kind() == Kind::NotReady);
            if !not_ready {
                first
            } else {
                match perpod::need(per_pod, cfg, req) {
                    perpod::Need::PrimaryOnly => {
                        return add_primary(req, cfg, per_pod, &first, ctx);
                    }
                    perpod::Need::Multus(why) => {
                        ctx.notes.push(("perpod", "needs-multus".to_owned()));
                        ctx.needs_multus = Some(why);
                        wait::until_ready(cfg, &req.cni_path, cfg.wait)
                    }
                }
            }
        }
    };
    let waited = started.elapsed();
    if waited >= WAITED_NOTED {
        ctx.notes
            .push(("waited", format!("{:.1}ms", waited.as_secs_f64() * 1e3)));
    }
    warn_loose(&report, ctx);
    if let Some(refusal) = report.error() {
        ctx.reason = report.reason_tag();
        return Err(match ctx.needs_multus.take() {
            Some(why) => {
                let details = match refusal.details() {
                    Some(d) if !d.is_empty() => format!("{d}; per-pod: {why}"),
                    _ => format!("per-pod: {why}"),
                };
                refusal.with_details(details)
            }
            None => refusal,
        });
    }
    let list = report.delegate.expect("a ready report has the delegate");
    run_add(req, cfg, &cfg.delegate, list, ctx)
}

/// A wait shorter than this is not worth a word in the log (it is the checks' own time).
const WAITED_NOTED: Duration = Duration::from_millis(5);

/// Per-pod awareness: the pod needs no Multus network and the delegate is not ready, so the
/// primary network runs for it directly, as Multus would have run it (same configuration, same
/// ifname). Refused (11) when the primary is not ready either. The record names the primary,
/// so the pod's DEL replays the primary's DEL whatever Multus does meanwhile.
fn add_primary(
    req: &Request,
    cfg: &GuardConfig,
    per_pod: &config::PerPod,
    delegate_report: &readiness::Report,
    ctx: &mut Ctx,
) -> Result<Done> {
    let primary = primary_config(cfg, per_pod);
    let report = readiness::check(&primary, &req.cni_path);
    warn_loose(&report, ctx);
    if let Some(refusal) = report.error() {
        ctx.reason = report.reason_tag();
        let why = delegate_report
            .error()
            .map_or_else(String::new, |e| e.msg().to_owned());
        return Err(refusal.with_details(format!(
            "per-pod: the pod needs no Multus network, but the primary is not ready either; the delegate: {why}"
        )));
    }
    ctx.notes.push(("perpod", "primary".to_owned()));
    let list = report.delegate.expect("a ready report has the delegate");
    run_add(req, &primary, &per_pod.primary, list, ctx)
}

/// The guard's configuration with the primary as the delegate: no attachments or sockets of
/// Multus's, and without the pod annotations (a capability the guard asked for itself, not the
/// primary's).
fn primary_config(cfg: &GuardConfig, per_pod: &config::PerPod) -> GuardConfig {
    let mut runtime_config = cfg.runtime_config.clone();
    runtime_config.remove(perpod::POD_ANNOTATIONS);
    GuardConfig {
        delegate: per_pod.primary.clone(),
        attachments: Vec::new(),
        sockets: Vec::new(),
        per_pod: None,
        runtime_config,
        ..cfg.clone()
    }
}

/// Records `list` (read from `delegate_path`) for the attachment, then runs its ADD.
fn run_add(
    req: &Request,
    cfg: &GuardConfig,
    delegate_path: &std::path::Path,
    list: NetworkConfig,
    ctx: &mut Ctx,
) -> Result<Done> {
    let mut store = Store::create(&cfg.cache_dir, &cfg.name, cfg.lock_wait)?;
    store.write(&Record {
        container_id: req.container_id.clone(),
        ifname: req.ifname.clone(),
        network: cfg.name.clone(),
        cni_version: cfg.cni_version.clone(),
        delegate_path: delegate_path.to_owned(),
        delegate: list.raw.clone(),
    })?;
    let prev = cfg.prev_result.as_ref();
    if let Some((plugin, config)) = delegate::exec_plan(&list, cfg, &req.cni_path, prev)? {
        // The exec'd delegate must hold the attachment's lock; if the lock cannot be handed
        // over, the delegate runs as a child instead, with the guard holding it.
        match store.exec_lock() {
            Ok(lock) => return Ok(Done::Exec(plugin, config, lock)),
            Err(e) => ctx.warnings.push(format!(
                "cannot keep the attachment locked across exec ({e}): running the delegate as a child"
            )),
        }
    }
    match delegate::add(&list, cfg, &req.cni_path) {
        Ok(result) => Ok(Done::Result(result)),
        Err((e, rolled_back)) => {
            if rolled_back {
                if let Err(re) = store.remove(&req.container_id, &req.ifname) {
                    ctx.warnings.push(format!(
                        "cannot remove the record after a rolled-back ADD: {re}"
                    ));
                }
            }
            Err(e)
        }
    }
}

/// DEL: never refused for a missing delegate. Tears down with the configuration recorded at
/// ADD (first waiting up to `delWaitSeconds` for the delegate it fronts to be ready again, see
/// [`await_recorded_delegate`]); without a record, with the current delegate when ADD would run
/// it now; else nothing.
/// Fails (11), tearing nothing down, when another process holds the attachment past
/// `lockWaitSeconds` or a plugin the record names has no binary in CNI_PATH: the runtime
/// retries.
fn del(req: &Request, cfg: &GuardConfig, ctx: &mut Ctx) -> Result<Done> {
    let mut store = match Store::open_existing(&cfg.cache_dir, &cfg.name, cfg.lock_wait) {
        Ok(s) => s,
        Err(e) => {
            ctx.warnings.push(format!(
                "records unusable, tearing down with the current delegate: {e}"
            ));
            None
        }
    };
    let teardown = teardown_config(req, cfg, store.as_mut(), ctx)?;
    // Per-pod awareness: without a record, the pod may have been set up by Multus, whose DEL
    // skips the primary when it has no cache entry for a pod that is gone, or not at all; the
    // primary's DEL (idempotent, as every DEL) then frees what the primary holds.
    let primary = match (&teardown, &cfg.per_pod) {
        (Teardown::Recorded(_), _) | (_, None) => None,
        (_, Some(per_pod)) => record_less_primary(req, cfg, per_pod, ctx),
    };
    let (list, decision) = match teardown {
        Teardown::Recorded(list) => {
            await_recorded_delegate(req, cfg, &list, ctx);
            (list, "deleted-recorded")
        }
        Teardown::Current(list) => (list, "deleted-current"),
        Teardown::Nothing => match primary {
            Some((list, primary_cfg)) => {
                delegate::del(&list, &primary_cfg, &req.cni_path)?;
                ctx.notes.push(("perpod", "primary".to_owned()));
                return Ok(Done::Empty("deleted-primary"));
            }
            None => return Ok(Done::Empty("nothing-to-do")),
        },
    };
    // A prevResult the delegate could not be given must not stop the teardown: DEL goes on
    // without it, as for a runtime that cached nothing.
    let unusable_prev = cfg
        .prev_result
        .as_ref()
        .and_then(|p| crate::version::convert_result(p, &cfg.cni_version, &list.cni_version).err());
    let cfg = match unusable_prev {
        Some(why) => {
            ctx.warnings
                .push(format!("invalid prevResult ignored for DEL: {}", why.msg()));
            &GuardConfig {
                prev_result: None,
                ..cfg.clone()
            }
        }
        None => cfg,
    };
    delegate::del(&list, cfg, &req.cni_path)?;
    if let Some((list, primary_cfg)) = primary {
        delegate::del(&list, &primary_cfg, &req.cni_path)?;
        ctx.notes.push(("perpod", "primary".to_owned()));
    }
    if let Some(store) = &mut store {
        if let Err(e) = store.remove(&req.container_id, &req.ifname) {
            ctx.warnings
                .push(format!("torn down, but the record stays: {e}"));
        }
    }
    Ok(Done::Empty(decision))
}

/// A recorded DEL of the delegate the guard fronts (its record names the current delegate file)
/// while that delegate is not ready waits for it, as ADD does, up to `delWaitSeconds` (by default
/// `waitSeconds`; `install` writes 60 whatever ADD's wait, so that a guard that refuses ADD at
/// once still tears down through Multus rather than past it): a delegate
/// that is a client of a daemon may report success for a DEL it could not deliver (multus-shim
/// returns success when its daemon's socket is not there), so replaying it at once while Multus
/// restarts or the node boots would drop the record of an attachment nobody tore down (its IPs
/// leaked). After the wait the DEL runs anyway (DEL is never refused), with a warning. A record
/// of another file (per-pod awareness's primary, a delegate since replaced) runs at once.
fn await_recorded_delegate(req: &Request, cfg: &GuardConfig, list: &NetworkConfig, ctx: &mut Ctx) {
    if list.path != cfg.delegate {
        return;
    }
    let started = Instant::now();
    let report = wait::until_ready(cfg, &req.cni_path, cfg.del_wait);
    let waited = started.elapsed();
    if waited >= WAITED_NOTED {
        ctx.notes
            .push(("waited", format!("{:.1}ms", waited.as_secs_f64() * 1e3)));
    }
    if let Some(why) = report.error() {
        ctx.notes.push(("delegate", "not-ready".to_owned()));
        ctx.warnings.push(format!(
            "DEL of {}/{}: the delegate is still not ready after the wait ({}): its recorded DEL \
             runs anyway, and a delegate that needs its daemon may tear nothing down",
            req.container_id,
            req.ifname,
            why.msg()
        ));
    }
}

/// The primary for a record-less DEL, with the configuration to run it on (no prevResult: the
/// runtime's is the delegate's result, not the primary's), when it is there to run.
fn record_less_primary(
    req: &Request,
    cfg: &GuardConfig,
    per_pod: &config::PerPod,
    ctx: &mut Ctx,
) -> Option<(NetworkConfig, GuardConfig)> {
    let primary = GuardConfig {
        prev_result: None,
        ..primary_config(cfg, per_pod)
    };
    let report = readiness::check(&primary, &req.cni_path);
    match (report.error(), report.delegate) {
        (None, Some(list)) => Some((list, primary)),
        (refusal, _) => {
            let why = refusal.map_or_else(|| "no primary".to_owned(), |e| e.msg().to_owned());
            ctx.warnings.push(format!(
                "DEL of {}/{}: no record, and the primary cannot run ({why}): its DEL is not run",
                req.container_id, req.ifname
            ));
            None
        }
    }
}

/// The configuration that tears an attachment down.
enum Teardown {
    /// The delegate as it was at ADD, from the attachment's record.
    Recorded(NetworkConfig),
    /// No usable record: the current delegate, on which ADD would proceed now.
    Current(NetworkConfig),
    /// No record, and ADD would refuse now: nothing the guard made can be undone.
    Nothing,
}

/// Which configuration tears the attachment down: its record when there is a usable one (the
/// attachment stays locked in `store` until the DEL is done); otherwise the current delegate if
/// ADD would run it now. Fails only when another process holds the attachment past
/// `lockWaitSeconds`: then nothing is torn down and the runtime retries.
fn teardown_config(
    req: &Request,
    cfg: &GuardConfig,
    store: Option<&mut Store>,
    ctx: &mut Ctx,
) -> Result<Teardown> {
    let recorded = match store.map(|s| s.read(&req.container_id, &req.ifname)) {
        None => None,
        Some(Ok(r)) => r,
        Some(Err(e)) if *e.kind() == Kind::Busy => {
            let msg = format!("{}: not torn down", e.msg());
            return Err(e
                .with_msg(msg)
                .with_details("lockWaitSeconds bounds the wait; the runtime retries DEL"));
        }
        Some(Err(e)) => {
            ctx.warnings.push(e.to_string());
            None
        }
    };
    if let Some(r) = recorded {
        match NetworkConfig::from_bytes(&r.delegate_path, r.delegate, &cfg.plugin_type) {
            Ok(list) => return Ok(Teardown::Recorded(list)),
            Err(p) => ctx.warnings.push(format!(
                "recorded delegate {} unusable: {}",
                r.delegate_path.display(),
                p.msg()
            )),
        }
    }
    // No record: the guard never ran this attachment's ADD (it records first), so the current
    // delegate runs only when ADD would run it now: every precondition holds (the delegate and
    // attachments valid, every plugin binary there, every socket accepting). Otherwise there is
    // nothing the guard made to undo, and the runtime's DEL right after a refused ADD must
    // succeed without calling a delegate the guard just declared unusable (a multus-shim whose
    // daemon is dead).
    let report = readiness::check(cfg, &req.cni_path);
    Ok(match (report.error(), report.delegate) {
        (None, Some(list)) => Teardown::Current(list),
        (refusal, _) => {
            let why = refusal.map_or_else(|| "no delegate".to_owned(), |e| e.msg().to_owned());
            ctx.warnings.push(format!(
                "DEL of {}/{}: no record, and ADD would refuse now ({why}): the delegate is not run",
                req.container_id, req.ifname
            ));
            Teardown::Nothing
        }
    })
}

/// CHECK: the delegate's CHECK with prevResult, where its version and configuration allow it.
fn check(req: &Request, cfg: &GuardConfig) -> Result<Done> {
    if cfg.version() < Version::V0_4_0 {
        return Err(Error::new(
            Kind::Unsupported,
            format!("cniVersion {} does not have CHECK", cfg.cni_version),
        ));
    }
    // Not ready (11) or misconfigured (7), as the problem is.
    let list = NetworkConfig::load(&cfg.delegate, &cfg.plugin_type).map_err(|p| {
        let msg = format!("cni-guard: delegate {} {}", cfg.delegate.display(), p.msg());
        p.with_msg(msg)
    })?;
    if !list.version().has_check() || list.disable_check {
        return Ok(Done::Empty("check-skipped"));
    }
    let prev = cfg
        .prev_result
        .as_ref()
        .map(|p| crate::version::convert_result(p, &cfg.cni_version, &list.cni_version))
        .transpose()
        .map_err(|e| Error::new(Kind::BadInput, format!("invalid prevResult: {}", e.msg())))?;
    if let Some((plugin, config)) = delegate::exec_plan(&list, cfg, &req.cni_path, prev.as_ref())? {
        return Ok(Done::Exec(plugin, config, None));
    }
    delegate::check(&list, cfg, &req.cni_path)?;
    Ok(Done::Empty("checked"))
}

/// STATUS: 50 while not ready (never waits); then the delegate's own STATUS.
fn status(req: &Request, cfg: &GuardConfig, ctx: &mut Ctx) -> Result<Done> {
    require_1_1(cfg, "STATUS")?;
    let report = readiness::check(cfg, &req.cni_path);
    warn_loose(&report, ctx);
    if let Some(e) = report.error() {
        ctx.reason = report.reason_tag();
        return Err(e);
    }
    let list = report.delegate.expect("a ready report has the delegate");
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
    require_1_1(cfg, "GC")?;
    let valid = cfg.valid_attachments.clone();
    let mut errors = Vec::new();
    if let Ok(list) = NetworkConfig::load(&cfg.delegate, &cfg.plugin_type) {
        errors.extend(delegate::gc(&list, cfg, &req.cni_path));
    }
    match Store::open_existing(&cfg.cache_dir, &cfg.name, cfg.lock_wait) {
        Ok(Some(mut store)) => {
            let swept = store.sweep_temp_files();
            if swept > 0 {
                ctx.warnings.push(format!(
                    "removed {swept} temp file(s) left by killed writers"
                ));
            }
            if let Some(valid) = &valid {
                match store.list() {
                    Ok(records) => {
                        for (id, ifname) in records.iter().filter(|r| !valid.contains(r)) {
                            if let Err(e) = store.remove(id, ifname) {
                                errors.push(e);
                            }
                        }
                    }
                    Err(e) => errors.push(e),
                }
            }
        }
        Ok(None) => {}
        Err(e) => errors.push(e),
    }
    match errors.len() {
        0 => Ok(Done::Empty("collected")),
        1 => Err(errors.remove(0)),
        _ => {
            let first = errors.remove(0);
            let rest: Vec<String> = errors.iter().map(ToString::to_string).collect();
            Err(first.with_details(format!("also: {}", rest.join("; "))))
        }
    }
}

fn require_1_1(cfg: &GuardConfig, verb: &str) -> Result<()> {
    if cfg.version() < Version::V1_1_0 {
        return Err(Error::new(
            Kind::Unsupported,
            format!(
                "cniVersion {} does not have {verb} (it came with 1.1.0)",
                cfg.cni_version
            ),
        ));
    }
    Ok(())
}

fn warn_loose(report: &readiness::Report, ctx: &mut Ctx) {
    for p in &report.warnings {
        ctx.warnings
            .push(format!("{} is writable by group or others", p.display()));
    }
}
