//! DEL: tearing an attachment down, in plain steps, with what was recorded at its ADD.

use crate::cni::{primary_config, wait_ready, Ctx, Done};
use crate::config::GuardConfig;
use crate::delegate::{self, Deadline};
use crate::error::{Error, Kind, Result};
use crate::netconf::NetworkConfig;
use crate::readiness;
use crate::records::Store;
use crate::request::Request;

/// DEL, in plain steps: lock the attachment and read its record; choose the configuration
/// that tears it down; wait for the delegate it fronts; run it under the verb's one deadline;
/// remove the record. Never refused for a missing delegate. Fails (11), tearing nothing down,
/// when another process holds the attachment past `lockWaitSeconds`: the runtime retries.
pub(crate) fn del(req: &Request, cfg: &GuardConfig, ctx: &mut Ctx) -> Result<Done> {
    // 1. Lock and read the record.
    let mut store =
        Store::open_existing(&cfg.cache_dir, &cfg.name, cfg.lock_wait).unwrap_or_else(|e| {
            ctx.warnings.push(format!(
                "records unusable, tearing down with the current delegate: {e}"
            ));
            None
        });
    let recorded = match store.as_mut().map(|s| recorded(s, req, cfg)) {
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
        Some(Ok(list)) => list,
        None => None,
    };
    // 2. Choose: the record; else the current delegate when ADD would run it now (the guard
    // never ran this attachment's ADD: it records first). With per-pod awareness and no
    // record, the primary's DEL too: Multus skips it for a pod it has no cache entry for.
    let (list, decision) = match recorded {
        Some(list) => (Some(list), "deleted-recorded"),
        None => (
            ready_now(req, cfg, "ADD would refuse now", ctx),
            "deleted-current",
        ),
    };
    let primary = match (&list, decision, &cfg.per_pod) {
        (_, "deleted-current", Some(per_pod)) => {
            let primary = primary_config(cfg, per_pod);
            ready_now(req, &primary, "the primary cannot run", ctx).map(|l| (l, primary))
        }
        _ => None,
    };
    if list.is_none() && primary.is_none() {
        return Ok(Done::Empty("nothing-to-do"));
    }
    // 3. Wait for the delegate the record fronts (see `await_recorded_delegate`).
    if let (Some(list), "deleted-recorded") = (&list, decision) {
        await_recorded_delegate(req, cfg, list, ctx);
    }
    // 4. Run, every list under one deadline; the primary's too when the delegate's failed.
    let deadline = Deadline::start(cfg);
    let after = primary.as_ref().map_or(0, |(l, _)| l.plugins.len());
    let mut result = Ok(());
    if let Some(list) = &list {
        result = delegate::del(
            list,
            &del_config(cfg, list, ctx),
            &req.cni_path,
            &deadline,
            after,
        );
    }
    if let Some((list, primary_cfg)) = &primary {
        let ran = delegate::del(list, primary_cfg, &req.cni_path, &deadline, 0);
        ctx.notes.push(("perpod", "primary".to_owned()));
        result = result.and(ran);
    }
    result?;
    // 5. Remove the record.
    if let Some(store) = &mut store {
        if let Err(e) = store.remove(&req.container_id, &req.ifname) {
            ctx.warnings
                .push(format!("torn down, but the record stays: {e}"));
        }
    }
    Ok(Done::Empty(match list {
        None => "deleted-primary",
        Some(_) => decision,
    }))
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
    NetworkConfig::from_bytes(&r.delegate_path, r.delegate, &cfg.plugin_type)
        .map(Some)
        .map_err(|p| {
            Error::new(
                Kind::Io,
                format!(
                    "recorded delegate {} unusable: {p}",
                    r.delegate_path.display()
                ),
            )
        })
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
            ctx.warnings.push(format!(
                "DEL of {}/{}: no record, and {why} ({detail}): its DEL is not run",
                req.container_id, req.ifname
            ));
            None
        }
    }
}

/// DEL's configuration: a prevResult the delegate could not be given must not stop the
/// teardown, which goes on without it, as for a runtime that cached nothing.
fn del_config(cfg: &GuardConfig, list: &NetworkConfig, ctx: &mut Ctx) -> GuardConfig {
    let unusable = cfg
        .prev_result
        .as_ref()
        .and_then(|p| crate::version::convert_result(p, &cfg.cni_version, &list.cni_version).err());
    match unusable {
        Some(why) => {
            ctx.warnings
                .push(format!("invalid prevResult ignored for DEL: {}", why.msg()));
            GuardConfig {
                prev_result: None,
                ..cfg.clone()
            }
        }
        None => cfg.clone(),
    }
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
        ctx.warnings.push(format!(
            "DEL of {}/{}: the delegate is still not ready after the wait ({}): its recorded DEL \
             runs anyway, and a delegate that needs its daemon may tear nothing down",
            req.container_id,
            req.ifname,
            why.msg()
        ));
    }
}
