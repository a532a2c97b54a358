//! Running the delegate network configuration, plugin by plugin, as libcni's `api.go` runs a
//! conflist: each plugin gets the list's `name` and `cniVersion`, the `runtimeConfig` entries
//! for the capabilities it declares, and `prevResult`; ADD threads results forward, DEL runs in
//! reverse with the final ADD result, CHECK and STATUS run forward, GC runs every plugin and
//! collects errors.
//!
//! Where we differ from libcni, on purpose: a failed ADD is rolled back here (DEL on the plugins
//! already run, in reverse, the failing one included), as Multus rolls back its delegates,
//! because the runtime sees only the guard and a half-made attachment must not wait for a DEL
//! that a runtime like cnitool never sends.
//!
//! **One deadline per verb.** `delegateTimeoutSeconds` bounds all of a verb's plugin runs
//! together, a failed ADD's rollback and a DEL's second list included (a DEL run again after its
//! delegate went away runs until the end of the DEL's budget: [`Deadline::until`]): the caller starts one
//! [`Deadline`] when the verb's waits are over and hands it to every run (the runtime gives the
//! verb a deadline of its own, kubelet's StopPodSandbox two minutes, and bounds that add up per
//! plugin or per list would pass it, so the runtime would kill the guard mid-teardown and the
//! error naming the plugin would never arrive). ADD's plugins get the first three quarters
//! ([`Deadline::forward`]); the rollback always has the last quarter. Where every plugin must get
//! its chance, DEL, the rollback and GC, each plugin gets an equal share of the time that is left
//! ([`Deadline::share`]), so one that hangs cannot take the others' time.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Map, Value};

use crate::config::GuardConfig;
use crate::error::{Error, Kind, Result};
use crate::invoke;
use crate::netconf::NetworkConfig;
use crate::verb::Command;
use crate::version::{convert_result, Version};

/// The request configuration for one plugin of `list` (libcni's `buildOneConfig` and
/// `injectRuntimeConfig`), plus the runtime's `args` from the guard's own configuration.
pub fn build_config(
    plugin: &Map<String, Value>,
    list: &NetworkConfig,
    guard: &GuardConfig,
    prev_result: Option<&Value>,
    extra: &[(&str, &Value)],
) -> Vec<u8> {
    // The plugin's own entries are borrowed, not copied: the configuration is only serialized,
    // and a deep copy of a large one costs more than parsing it did. A BTreeMap keeps the keys
    // in the order serde_json's Map has them.
    let mut conf: BTreeMap<&str, &Value> = plugin.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let name = Value::String(list.name.clone());
    let version = Value::String(list.cni_version.clone());
    conf.insert("name", &name);
    conf.insert("cniVersion", &version);
    let caps = plugin.get("capabilities");
    let declared =
        |cap: &String| caps.and_then(|c| c.get(cap)).and_then(Value::as_bool) == Some(true);
    let runtime_config: Map<String, Value> = guard
        .runtime_config
        .iter()
        .filter(|(cap, _)| declared(cap))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let runtime_config = (!runtime_config.is_empty()).then_some(Value::Object(runtime_config));
    let args = guard.args.as_ref().map(|args| {
        let own = plugin.get("args").and_then(Value::as_object);
        let mut merged = own.cloned().unwrap_or_default();
        merged.extend(args.clone());
        Value::Object(merged)
    });
    let optional = [
        ("prevResult", prev_result),
        ("runtimeConfig", runtime_config.as_ref()),
        ("args", args.as_ref()),
    ];
    conf.extend(optional.into_iter().filter_map(|(k, v)| v.map(|v| (k, v))));
    conf.extend(extra.iter().copied());
    serde_json::to_vec(&conf).expect("JSON values always serialize")
}

/// The deadline of one verb's delegate work: `whole` (the value of `key`) from its start.
#[derive(Debug, Clone, Copy)]
pub struct Deadline {
    start: Instant,
    whole: Duration,
    key: &'static str,
}

impl Deadline {
    /// `whole`, the value of `key`, from now.
    fn new(whole: Duration, key: &'static str) -> Deadline {
        Deadline {
            start: Instant::now(),
            whole,
            key,
        }
    }

    /// `delegateTimeoutSeconds` from now.
    pub fn start(guard: &GuardConfig) -> Deadline {
        Deadline::new(guard.delegate_timeout, "delegateTimeoutSeconds")
    }

    /// From now until `end`: a DEL's run again, in what is left of its budget.
    pub fn until(end: Instant) -> Deadline {
        let whole = end.saturating_duration_since(Instant::now());
        Deadline::new(whole, "the rest of the DEL's budget")
    }

    /// The end of everything: the verb's plugins, and for ADD its rollback.
    pub fn end(&self) -> Instant {
        self.start + self.whole
    }

    /// Where ADD's own plugins must be done: three quarters in, so the rollback has the rest.
    pub fn forward(&self) -> Instant {
        self.start + self.whole.mul_f64(0.75)
    }

    /// The deadline of the next of `left` plugins that must each get their chance: an equal share
    /// of the time left.
    pub fn share(&self, left: usize) -> Instant {
        let now = Instant::now();
        let rest = self.end().saturating_duration_since(now);
        now + rest / u32::try_from(left.max(1)).unwrap_or(u32::MAX)
    }

    /// Runs one plugin for `verb` until `until`; past it the plugin's group is killed and the
    /// error says how much of the verb's deadline it had.
    fn run(&self, binary: &Path, verb: Command, conf: &[u8], until: Instant) -> Result<Vec<u8>> {
        let had = seconds(until.saturating_duration_since(Instant::now()));
        let whole = seconds(self.whole);
        invoke::run_until(binary, verb, conf, until, || {
            let plugin = binary.display();
            let msg = format!(
                "plugin {plugin} did not finish its {} within {had}s and was killed ({} {whole}s bounds all of the verb's plugin runs, rollback included)",
                verb.as_str(),
                self.key,
            );
            Error::new(Kind::TimedOut, msg)
        })
    }
}

/// Seconds with at most three decimals and no trailing zeros: `0.75`, `1`.
fn seconds(d: Duration) -> String {
    let s = format!("{:.3}", d.as_secs_f64());
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// When the delegate is one plugin speaking the guard's cniVersion, its output needs no
/// conversion: the guard can exec it and cost the pod one exec. Returns the binary and stdin,
/// when the binary can be exec'd as it is ([`invoke::can_exec`]).
pub fn exec_plan(
    list: &NetworkConfig,
    guard: &GuardConfig,
    cni_path: &[PathBuf],
    prev_result: Option<&Value>,
) -> Result<Option<(PathBuf, Vec<u8>)>> {
    if list.plugins.len() != 1 || list.cni_version != guard.cni_version {
        return Ok(None);
    }
    let plugin = &list.plugins[0];
    let binary = find(plugin, cni_path)?;
    let conf = build_config(plugin, list, guard, prev_result, &[]);
    Ok(invoke::can_exec(&binary).then_some((binary, conf)))
}

/// ADD through every plugin; returns the final result in the guard's cniVersion.
/// On failure the plugins already run are rolled back; `Err.1` says whether that succeeded.
pub fn add(
    list: &NetworkConfig,
    guard: &GuardConfig,
    cni_path: &[PathBuf],
    deadline: &Deadline,
) -> std::result::Result<Value, (Error, bool)> {
    let mut prev = prev_result(list, guard).map_err(|e| (e, true))?;
    for (i, plugin) in list.plugins.iter().enumerate() {
        let step = find(plugin, cni_path).and_then(|binary| {
            let conf = build_config(plugin, list, guard, prev.as_ref(), &[]);
            let out = deadline.run(&binary, Command::Add, &conf, deadline.forward())?;
            parse_result(&out, &binary, &list.cni_version)
        });
        match step {
            Ok(result) => prev = Some(result),
            Err(e) => {
                // As the list's own DEL: no prevResult for versions whose DEL has none; each
                // plugin run so far, the failing one included, with its share of what is left.
                // A plugin whose binary was not found (the one failure here that is NotReady)
                // never ran, and is left out.
                let ran = i + usize::from(*e.kind() != Kind::NotReady);
                let prev = prev.filter(|_| list.version().has_cached_result());
                let mut each = Each::new(Command::Del, prev.as_ref());
                each.keep_going = true;
                let errors = each.run(list, &list.plugins[..ran], guard, cni_path, deadline);
                return Err((e, errors.is_empty()));
            }
        }
    }
    let failed = |msg: String| Error::new(Kind::Failed, msg);
    let last = prev.ok_or_else(|| (failed("delegate produced no result".into()), true))?;
    convert_result(&last, &list.cni_version, &guard.cni_version).map_err(|e| {
        let msg = format!("cannot convert the delegate's result: {}", e.msg());
        (failed(msg), false)
    })
}

/// How a verb other than ADD runs a list's plugins: no result is threaded. DEL (and ADD's
/// rollback) runs the list in reverse. Where every plugin must get its chance, DEL and GC, each
/// gets a share of the time left; otherwise each plugin may take all that is left.
struct Each<'a> {
    verb: Command,
    prev: Option<&'a Value>,
    /// Keys the runtime sent that go to every plugin as sent (GC's attachment lists).
    extra: Vec<(&'a str, &'a Value)>,
    /// Plugins of the verb still to run after these (a DEL's second list): each plugin's share
    /// counts them.
    after: usize,
    /// Every plugin gets its turn after a failure (GC, ADD's rollback); otherwise the first
    /// failure ends the run.
    keep_going: bool,
}

impl<'a> Each<'a> {
    fn new(verb: Command, prev: Option<&'a Value>) -> Each<'a> {
        Each {
            verb,
            prev,
            extra: Vec::new(),
            after: 0,
            keep_going: verb == Command::Gc,
        }
    }

    /// Runs `plugins` of `list`; returns every error (at most one unless `keep_going`).
    fn run(
        &self,
        list: &NetworkConfig,
        plugins: &[Map<String, Value>],
        guard: &GuardConfig,
        cni_path: &[PathBuf],
        deadline: &Deadline,
    ) -> Vec<Error> {
        let mut order: Vec<&Map<String, Value>> = plugins.iter().collect();
        if self.verb == Command::Del {
            order.reverse();
        }
        let mut errors = Vec::new();
        for (done, plugin) in order.iter().enumerate() {
            let until = match self.verb {
                Command::Del | Command::Gc => deadline.share(order.len() + self.after - done),
                _ => deadline.end(),
            };
            let ran = find(plugin, cni_path).and_then(|binary| {
                let conf = build_config(plugin, list, guard, self.prev, &self.extra);
                deadline.run(&binary, self.verb, &conf, until)
            });
            if let Err(e) = ran {
                errors.push(e);
                if !self.keep_going {
                    break;
                }
            }
        }
        errors
    }
}

/// DEL through every plugin in reverse (stopping at the first failure, as libcni does), each
/// given the runtime's prevResult (libcni's cached final result) in the delegate's version,
/// where that version has DEL prevResults. Each plugin gets an equal share of what is left of
/// the verb's deadline, counting `after` more plugins that run after this list.
pub fn del(
    list: &NetworkConfig,
    guard: &GuardConfig,
    cni_path: &[PathBuf],
    deadline: &Deadline,
    after: usize,
) -> Result<()> {
    let prev = match list.version().has_cached_result() {
        true => prev_result(list, guard)?,
        false => None,
    };
    let mut each = Each::new(Command::Del, prev.as_ref());
    each.after = after;
    first(each.run(list, &list.plugins, guard, cni_path, deadline))
}

/// CHECK through every plugin, each given the runtime's prevResult in the delegate's version.
/// The caller has excluded versions before 0.4.0 (which have no CHECK, nor a cached result to
/// give it) and `disableCheck`.
pub fn check(
    list: &NetworkConfig,
    guard: &GuardConfig,
    cni_path: &[PathBuf],
    deadline: &Deadline,
) -> Result<()> {
    let prev = prev_result(list, guard)?;
    let each = Each::new(Command::Check, prev.as_ref());
    first(each.run(list, &list.plugins, guard, cni_path, deadline))
}

/// STATUS through every plugin (libcni's `GetStatusNetworkList`), for delegates at 1.1.0+,
/// all of them within `statusTimeoutSeconds`: past it the slow plugin is killed and STATUS
/// answers 50 naming it, so the runtime's status call (which kubelet polls, and containerd
/// bounds by nothing) stays fast.
pub fn status(list: &NetworkConfig, guard: &GuardConfig, cni_path: &[PathBuf]) -> Result<()> {
    if !list.version().has_status_and_gc() {
        return Ok(());
    }
    let deadline = Deadline::new(guard.status_timeout, "statusTimeoutSeconds");
    let each = Each::new(Command::Status, None);
    first(each.run(list, &list.plugins, guard, cni_path, &deadline)).map_err(|e| {
        if *e.kind() != Kind::TimedOut {
            return e;
        }
        let path = list.path.display();
        let why = e.msg();
        let msg = format!("cni-guard: delegate {path} did not answer STATUS: {why}");
        e.with_msg(msg)
    })
}

/// GC through every plugin, continuing past failures (each with an equal share of what is left
/// of the verb's deadline); returns every error. The attachment lists go to each plugin as the
/// runtime sent them, under the names it used: a runtime that sent none tells the delegate
/// nothing (an empty list would tell it that nothing is valid).
pub fn gc(
    list: &NetworkConfig,
    guard: &GuardConfig,
    cni_path: &[PathBuf],
    deadline: &Deadline,
) -> Vec<Error> {
    if !list.version().has_status_and_gc() || list.disable_gc {
        return Vec::new();
    }
    let mut each = Each::new(Command::Gc, None);
    each.extra = guard.gc_attachments.iter().map(|(k, v)| (*k, v)).collect();
    each.run(list, &list.plugins, guard, cni_path, deadline)
}

/// The first error of a run that stops at its first failure.
fn first(errors: Vec<Error>) -> Result<()> {
    errors.into_iter().next().map_or(Ok(()), Err)
}

/// The runtime's prevResult for the plugins of `list`, converted to the list's version; plugins
/// before 0.3.0 get none.
pub fn prev_result(list: &NetworkConfig, guard: &GuardConfig) -> Result<Option<Value>> {
    let prev = guard.prev_result.as_ref();
    let Some(prev) = prev.filter(|_| list.version() >= Version::V0_3_0) else {
        return Ok(None);
    };
    convert_result(prev, &guard.cni_version, &list.cni_version)
        .map(Some)
        .map_err(|e| Error::new(Kind::BadInput, format!("invalid prevResult: {}", e.msg())))
}

fn find(plugin: &Map<String, Value>, cni_path: &[PathBuf]) -> Result<PathBuf> {
    let t = plugin.get("type").and_then(Value::as_str).unwrap_or("");
    invoke::find_plugin(t, cni_path)
        .map_err(|p| p.error(&format!("cni-guard: delegate plugin {t:?}")))
}

/// Parses a plugin's ADD output into a result in the list's version. An error structure printed
/// with exit status 0 is treated as the error it is.
fn parse_result(stdout: &[u8], binary: &Path, list_version: &str) -> Result<Value> {
    if let Some(err) = invoke::as_cni_error(stdout) {
        return Err(err);
    }
    let plugin = binary.display();
    let value: Value = serde_json::from_slice(stdout).map_err(|e| {
        let msg = format!("plugin {plugin} printed a result that is not JSON: {e}");
        let head = String::from_utf8_lossy(&stdout[..stdout.len().min(1024)]);
        Error::new(Kind::Failed, msg).with_details(head)
    })?;
    // Results are threaded and converted in the 0.3.0+ shape, also for 0.1.0/0.2.0 delegates.
    let shape = match Version::parse(list_version) {
        Some(v) if v < Version::V0_3_0 => "0.3.0",
        _ => list_version,
    };
    convert_result(&value, list_version, shape).map_err(|e| {
        let msg = format!("plugin {plugin} printed an invalid result: {}", e.msg());
        Error::new(Kind::Failed, msg)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn guard(extra: Value) -> GuardConfig {
        let mut v =
            json!({"cniVersion":"1.0.0","name":"g","type":"cni-guard","delegate":"/d.conflist"});
        v.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        GuardConfig::parse(&serde_json::to_vec(&v).unwrap()).unwrap()
    }

    fn list(body: Value) -> NetworkConfig {
        NetworkConfig::from_bytes(
            Path::new("/d.conflist"),
            serde_json::to_vec(&body).unwrap(),
            "cni-guard",
        )
        .unwrap()
    }

    #[test]
    fn injects_name_version_and_declared_capabilities_only() {
        let l = list(json!({"cniVersion":"0.4.0","name":"real","plugins":[
            {"type":"bridge","capabilities":{"portMappings":true,"bandwidth":false}}]}));
        let g = guard(
            json!({"runtimeConfig":{"portMappings":[{"hostPort":80}],"bandwidth":{"x":1},"ips":["1.2.3.4"]},
                             "args":{"cni":{"a":1}}}),
        );
        let conf: Value =
            serde_json::from_slice(&build_config(&l.plugins[0], &l, &g, None, &[])).unwrap();
        assert_eq!(conf["name"], "real");
        assert_eq!(conf["cniVersion"], "0.4.0");
        assert_eq!(
            conf["runtimeConfig"],
            json!({"portMappings":[{"hostPort":80}]})
        );
        assert_eq!(conf["args"], json!({"cni":{"a":1}}));
        assert!(conf.get("prevResult").is_none());
    }

    #[test]
    fn no_runtime_config_without_capabilities() {
        let l = list(json!({"cniVersion":"1.0.0","name":"real","plugins":[{"type":"ptp"}]}));
        let g = guard(json!({"runtimeConfig":{"portMappings":[]}}));
        let conf: Value =
            serde_json::from_slice(&build_config(&l.plugins[0], &l, &g, None, &[])).unwrap();
        assert!(conf.get("runtimeConfig").is_none());
    }

    #[test]
    fn exec_only_for_one_plugin_of_the_same_version() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("x");
        std::fs::write(&bin, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&bin, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let path = [dir.path().to_owned()];
        let g = guard(json!({}));
        let same = list(json!({"cniVersion":"1.0.0","name":"n","plugins":[{"type":"x"}]}));
        assert_eq!(exec_plan(&same, &g, &path, None).unwrap().unwrap().0, bin);
        let other = list(json!({"cniVersion":"0.4.0","name":"n","plugins":[{"type":"x"}]}));
        assert!(exec_plan(&other, &g, &path, None).unwrap().is_none());
        let two =
            list(json!({"cniVersion":"1.0.0","name":"n","plugins":[{"type":"x"},{"type":"x"}]}));
        assert!(exec_plan(&two, &g, &path, None).unwrap().is_none());
    }
}
