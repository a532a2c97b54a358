//! CNI mode: one invocation, from the runtime's request to the reply (or to exec'ing the
//! delegate). The decision table is in the README.

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
        cache_dir: ctx
            .cache_dir
            .unwrap_or_else(|| PathBuf::from(config::DEFAULT_CACHE_DIR)),
        event,
    }
}

/// How an invocation is counted on the node (`cni_guard_decisions_total`,
/// `cni_guard_refusals_total`): tokens of the events file (see [`crate::metrics::events`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counted {
    pub verb: &'static str,
    pub decision: &'static str,
    pub reason: &'static str,
}

impl Counted {
    pub fn event(&self) -> crate::metrics::events::Event<'static> {
        crate::metrics::events::Event {
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
/// and run it, by exec when no conversion is needed.
fn add(req: &Request, cfg: &GuardConfig, ctx: &mut Ctx) -> Result<Done> {
    let report = wait::until_ready(cfg, &req.cni_path);
    warn_loose(&report, ctx);
    if let Some(refusal) = report.error() {
        ctx.reason = report.reason_tag();
        return Err(refusal);
    }
    let list = report.delegate.expect("a ready report has the delegate");
    let mut store = Store::create(&cfg.cache_dir, &cfg.name, cfg.lock_wait)?;
    store.write(&Record {
        container_id: req.container_id.clone(),
        ifname: req.ifname.clone(),
        network: cfg.name.clone(),
        cni_version: cfg.cni_version.clone(),
        delegate_path: cfg.delegate.clone(),
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
/// ADD; without a record, with the current delegate when ADD would run it now; else nothing.
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
    let (list, decision) = match teardown_config(req, cfg, store.as_mut(), ctx)? {
        Teardown::Recorded(list) => (list, "deleted-recorded"),
        Teardown::Current(list) => (list, "deleted-current"),
        Teardown::Nothing => return Ok(Done::Empty("nothing-to-do")),
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
    if let Some(store) = &mut store {
        if let Err(e) = store.remove(&req.container_id, &req.ifname) {
            ctx.warnings
                .push(format!("torn down, but the record stays: {e}"));
        }
    }
    Ok(Done::Empty(decision))
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
