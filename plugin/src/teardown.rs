//! DEL: tearing an attachment down, in plain steps, with what was recorded at its ADD.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::cni::{primary_config, wait_ready, Ctx, Done};
use crate::config::GuardConfig;
use crate::delegate::{self, Deadline};
use crate::error::{Error, Kind, Result};
use crate::netconf::NetworkConfig;
use crate::readiness;
use crate::records::Store;
use crate::request::Request;
use crate::sys;
use crate::version::convert_result;

/// DEL, in plain steps: lock the attachment and read its record; choose what tears it down;
/// wait for the delegate the record fronts; run it under the verb's one deadline; remove the
/// record. Never refused for a missing delegate. Fails (11), tearing nothing down, when
/// another process holds the attachment past `lockWaitSeconds`: the runtime retries. A run
/// through a delegate that went away while it ran is not trusted ([`Seen`]): the lists run again
/// once it is back, and while it is not back within the verb's budget DEL fails (11), keeping
/// the record, for the runtime to retry.
pub(crate) fn del(req: &Request, cfg: &GuardConfig, ctx: &mut Ctx) -> Result<Done> {
    // The verb's budget, which kubelet's StopPodSandbox deadline must hold (budget.rs).
    let end = Instant::now() + cfg.lock_wait + cfg.del_wait + cfg.delegate_timeout;
    // 1. Lock and read the record.
    let store = Store::open_existing(&cfg.cache_dir, &cfg.name, cfg.lock_wait);
    let mut store = store.unwrap_or_else(|e| {
        let why = format!("records unusable, tearing down with the current delegate: {e}");
        ctx.warnings.push(why);
        None
    });
    let recorded = match store.as_mut().map(|s| recorded(s, req, cfg)) {
        Some(Err(e)) if *e.kind() == Kind::Busy => {
            let msg = format!("{}: not torn down", e.msg());
            let why = "lockWaitSeconds bounds the wait; the runtime retries DEL";
            return Err(e.with_msg(msg).with_details(why));
        }
        Some(Err(e)) => {
            ctx.warnings.push(e.to_string());
            None
        }
        Some(Ok(list)) => list,
        None => None,
    };
    // 2. Choose: the record (3. waiting for the delegate it fronts); else the current delegate
    // when ADD would run it now (the guard never ran this attachment's ADD: it records first),
    // and with per-pod awareness the primary's DEL too: Multus skips it for a pod it has no
    // cache entry for.
    let mut runs = Vec::new();
    let decision = match recorded {
        Some(list) => {
            await_recorded_delegate(req, cfg, &list, ctx);
            runs.push((list, cfg.clone()));
            "deleted-recorded"
        }
        None => {
            runs.extend(ready_now(req, cfg, "ADD would refuse now", ctx).map(|l| (l, cfg.clone())));
            if let Some(per_pod) = &cfg.per_pod {
                let primary = primary_config(cfg, per_pod);
                let list = ready_now(req, &primary, "the primary cannot run", ctx);
                runs.extend(list.map(|l| (l, primary)));
            }
            match runs.first() {
                None => return Ok(Done::Empty("nothing-to-do")),
                Some((l, _)) if l.path == cfg.delegate => "deleted-current",
                Some(_) => "deleted-primary",
            }
        }
    };
    // 4. Run every list under the verb's budget; 5. remove the record.
    run_trusted(req, cfg, &runs, end, ctx)?;
    if runs.iter().any(|(_, c)| c.delegate != cfg.delegate) {
        ctx.notes.push(("perpod", "primary".to_owned()));
    }
    if let Some(Err(e)) = store.map(|mut s| s.remove(&req.container_id, &req.ifname)) {
        ctx.warnings
            .push(format!("torn down, but the record stays: {e}"));
    }
    Ok(Done::Empty(decision))
}

/// Runs every list's DEL in turn, whatever the one before did, under one deadline; while a
/// delegate went away during its run ([`Seen`]), waits for it and runs them all again, at most
/// [`RERUNS`] times and until `end` (the verb's budget), the run again with at least a quarter of
/// `delegateTimeoutSeconds`. Past either: 11, for the runtime to retry with the record kept.
fn run_trusted(
    req: &Request,
    cfg: &GuardConfig,
    runs: &[(NetworkConfig, GuardConfig)],
    end: Instant,
    ctx: &mut Ctx,
) -> Result<()> {
    let (mut deadline, mut reruns) = (Deadline::start(cfg), 0);
    loop {
        let seen: Vec<Option<Seen>> = runs.iter().map(|(l, c)| Seen::now(l, c)).collect();
        let (mut after, mut result) = (runs.iter().map(|(l, _)| l.plugins.len()).sum(), Ok(()));
        for (list, run_cfg) in runs {
            after -= list.plugins.len();
            let run_cfg = del_config(run_cfg, list, ctx);
            let ran = delegate::del(list, &run_cfg, &req.cni_path, &deadline, after);
            result = result.and(ran);
        }
        let went = runs
            .iter()
            .zip(&seen)
            .find_map(|((l, c), seen)| Some((l.path.display(), c, seen.as_ref()?.went_away()?)));
        let Some((path, run_cfg, what)) = went else {
            if reruns > 0 {
                ctx.notes.push(("reran", reruns.to_string()));
            }
            return result;
        };
        let gone = format!("delegate {path} went away while its DEL ran ({what})");
        let (id, ifname) = (&req.container_id, &req.ifname);
        ctx.warnings.push(format!("DEL of {id}/{ifname}: {gone}: that run's result is not trusted; waiting for it to come back to run the DEL again"));
        // With per-pod awareness no wait: containerd runs no CNI call while one from before a
        // reload of its configuration (the delegate's file gone) is under way, so a DEL waiting
        // here would hold every pod start on the node, plain pods' too, until the delegate is back.
        let wait = end.saturating_duration_since(Instant::now() + cfg.delegate_timeout / 4);
        let wait = if cfg.per_pod.is_some() {
            Duration::ZERO
        } else {
            wait
        };
        if reruns == RERUNS || wait.is_zero() || !wait_ready(req, run_cfg, wait, ctx).ready() {
            ctx.reason = Some("delegate-went-away");
            let msg = format!("cni-guard: {gone}: not torn down for sure");
            let why = format!("a DEL waits for its delegate within lockWaitSeconds + delWaitSeconds + delegateTimeoutSeconds (not with perPodPrimary) and runs again at most {RERUNS} times; the record, if any, stays, and the runtime retries");
            return Err(Error::new(Kind::NotReady, msg).with_details(why));
        }
        (deadline, reruns) = (Deadline::until(end), reruns + 1);
    }
}

/// What a DEL through the delegate a configuration fronts depends on, as it was when the run
/// started: the delegate's file, then each socket with whether it accepted connections. A
/// delegate that is the client of a daemon can report success for a DEL the daemon never
/// finished: multus-shim does so when its daemon stops while the DEL is inside it (the daemon
/// removes its file and exits without finishing the requests under way). So a run is trusted
/// only when what it depended on is still there, the same, at its end. Watched for the
/// delegate a configuration names (the guard's, or the per-pod primary), not for a record of a
/// file since replaced, which no configuration names.
struct Seen(Vec<(PathBuf, Option<Vec<u8>>, bool)>);

/// The most runs again of one DEL: a delegate that goes away during every run is not waited
/// for without end (ten: the reboot race's flapper, which rewrites the file twenty times a
/// second, leaves a DEL about one chance in three to end while the file is away).
const RERUNS: usize = 10;

/// What a path holds now: the delegate file's bytes (written again with the same bytes, it is
/// the same configuration); for a socket, that it is there (a daemon that stopped removed it, or
/// stopped listening: [`Seen::went_away`] asks); `None` when nothing is there.
fn id(p: &Path, socket: bool) -> Option<Vec<u8>> {
    match socket {
        true => p.exists().then(Vec::new),
        false => crate::netconf::read_regular(p).ok().map(|(raw, _)| raw),
    }
}

impl Seen {
    fn now(list: &NetworkConfig, run_cfg: &GuardConfig) -> Option<Seen> {
        let sockets = run_cfg.sockets.iter().map(|p| (p, true));
        let seen = std::iter::once((&list.path, false))
            .chain(sockets)
            .map(|(p, socket)| {
                let accepts = socket && sys::unix_socket_accepts(p).is_ok();
                (p.clone(), id(p, socket), accepts)
            });
        (list.path == run_cfg.delegate).then(|| Seen(seen.collect()))
    }

    /// What went away since (`its file was removed`); `None` when nothing did. What was not
    /// there at the start (a DEL run after the wait with the delegate still away) is not judged.
    fn went_away(&self) -> Option<String> {
        for (i, (path, was, accepted)) in self.0.iter().enumerate() {
            let refuses = || *accepted && sys::unix_socket_accepts(path).is_err();
            let how = match (was, id(path, i > 0)) {
                (None, _) => continue,
                (Some(_), None) => "removed",
                (Some(a), Some(b)) if *a != b => "replaced",
                _ if refuses() => "no longer accepting connections",
                _ => continue,
            };
            return Some(match i {
                0 => format!("its file was {how}"),
                _ => format!("socket {} {how}", path.display()),
            });
        }
        None
    }
}

/// The attachment's recorded delegate, with the attachment locked in `store`; `None` without a
/// usable record (said as a warning). Fails when another process holds it, or the record
/// cannot be read.
pub(crate) fn recorded(
    store: &mut Store,
    req: &Request,
    cfg: &GuardConfig,
) -> Result<Option<NetworkConfig>> {
    let Some(r) = store.read(&req.container_id, &req.ifname)? else {
        return Ok(None);
    };
    let path = r.delegate_path.display();
    let list = NetworkConfig::from_bytes(&r.delegate_path, r.delegate, &cfg.plugin_type)
        .map_err(|p| Error::new(Kind::Io, format!("recorded delegate {path} unusable: {p}")))?;
    Ok(Some(list))
}

/// The delegate `cfg` names when ADD would run it now (every precondition holds), else `None`
/// with a warning: a runtime's DEL right after a refused ADD must succeed without calling a
/// delegate the guard just declared unusable (a multus-shim whose daemon is dead).
fn ready_now(req: &Request, cfg: &GuardConfig, why: &str, ctx: &mut Ctx) -> Option<NetworkConfig> {
    let report = readiness::check(cfg, &req.cni_path);
    match (report.error(), report.delegate) {
        (None, Some(list)) => Some(list),
        (refusal, _) => {
            let detail = refusal.map_or_else(|| "no delegate".to_owned(), |e| e.msg().to_owned());
            let (id, ifname) = (&req.container_id, &req.ifname);
            ctx.warnings.push(format!(
                "DEL of {id}/{ifname}: no record, and {why} ({detail}): its DEL is not run"
            ));
            None
        }
    }
}

/// DEL's configuration: a prevResult the delegate could not be given must not stop the
/// teardown, which goes on without it, as for a runtime that cached nothing.
fn del_config(cfg: &GuardConfig, list: &NetworkConfig, ctx: &mut Ctx) -> GuardConfig {
    let mut cfg = cfg.clone();
    let prev = cfg.prev_result.as_ref();
    if let Some(Err(why)) = prev.map(|p| convert_result(p, &cfg.cni_version, &list.cni_version)) {
        ctx.warnings
            .push(format!("invalid prevResult ignored for DEL: {}", why.msg()));
        cfg.prev_result = None;
    }
    cfg
}

/// A recorded DEL of the delegate the guard fronts (its record names the current delegate file)
/// while that delegate is not ready waits for it, as ADD does, up to `delWaitSeconds`: a
/// delegate that is a client of a daemon may report success for a DEL it could not deliver
/// (multus-shim returns success when its daemon's socket is not there), so replaying it at once
/// while Multus restarts or the node boots would drop the record of an attachment nobody tore
/// down (its IPs leaked). After the wait the DEL runs anyway (DEL is never refused), with a
/// warning. A record of another file (per-pod awareness's primary, a delegate since replaced)
/// runs at once.
fn await_recorded_delegate(req: &Request, cfg: &GuardConfig, list: &NetworkConfig, ctx: &mut Ctx) {
    if list.path != cfg.delegate {
        return;
    }
    let report = wait_ready(req, cfg, cfg.del_wait, ctx);
    if let Some(why) = report.error() {
        ctx.notes.push(("delegate", "not-ready".to_owned()));
        let (id, ifname, why) = (&req.container_id, &req.ifname, why.msg());
        ctx.warnings.push(format!("DEL of {id}/{ifname}: the delegate is still not ready after the wait ({why}): its recorded DEL runs anyway, and a delegate that needs its daemon may tear nothing down"));
    }
}
