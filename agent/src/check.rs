//! `cni-guard-agent check`: would ADD proceed on this node now? One line per precondition, for a
//! person (✓/✗, the path, the reason) or as JSON; exit 0 only when ready. The DaemonSet's
//! readiness probe.
//!
//! The preconditions are the plugin's own (`readiness::check`, the same function ADD runs),
//! plus two that only make sense from outside: that no configuration names the guard itself,
//! and that the guard's file is the first in its conf dir (or containerd never runs it). Then
//! the layout, as a preflight before the first reboot: no fallback configuration beside the
//! guard's and the delegate's, and Multus's primary there.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::budget;
use crate::files::{conf_files, under_root};
use crate::Flags;
use cni_guard::config::{Entry, GuardConfig, GUARD_TYPE};
use cni_guard::error::{code, Error, Kind, Result};
use cni_guard::readiness::{self, Subject};
use cni_guard::request::Command;
use serde_json::Value;

const HELP: &str = "\
Usage: cni-guard-agent check --config FILE [--host-root DIR] [--cni-path DIRS] [--json]

Says whether ADD would proceed now, one line per precondition: the delegate, each attachment,
each plugin binary they name, recursion (a configuration that names cni-guard, or whose Multus
clusterNetwork is a cni-guard configuration in its folder), and whether the guard's file is the
first config in its conf dir. Exit 0 when ready, 1 when not. Two more lines check the layout
before a reboot, without changing that: fallback (any other configuration in the conf dir, which
containerd would use if the delegate vanished) and primary (Multus's clusterNetwork file is
there).

  --config FILE      the guard's conflist, e.g. /etc/cni/net.d/00-cni-guard.conflist
  --host-root DIR    look up the host paths the conflist names under DIR (in a pod that
                     mounts the host's folders under /host: --host-root=/host)
  --cni-path DIRS    where plugin binaries are, ':'-separated host paths, as CNI_PATH
                     [CNI_PATH from the environment, else /opt/cni/bin]
  --json             print one JSON object instead of lines
";

#[derive(Serialize)]
struct Line {
    check: &'static str,
    /// The plugin type, for `plugin` lines.
    #[serde(skip_serializing_if = "Option::is_none", rename = "type")]
    plugin_type: Option<String>,
    path: String,
    ok: bool,
    reason: String,
}

/// Where plugin binaries are looked up, and what said so.
#[derive(Serialize)]
struct CniPath {
    #[serde(skip)]
    dirs: Vec<PathBuf>,
    /// The directories as given (host paths), for people and JSON.
    #[serde(rename = "dirs")]
    shown: Vec<String>,
    from: Source,
}

#[derive(Serialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum Source {
    #[serde(rename = "--cni-path")]
    Flag,
    Environment,
    Default,
}

impl CniPath {
    const DEFAULT: &'static str = "/opt/cni/bin";

    /// `--cni-path` when given, else a non-empty CNI_PATH from the environment, else the default.
    fn choose(flag: Option<OsString>, env: Option<OsString>) -> CniPath {
        let (value, from) = match (flag, env) {
            (Some(value), _) => (value, Source::Flag),
            (None, Some(value)) if !value.is_empty() => (value, Source::Environment),
            _ => (OsString::from(Self::DEFAULT), Source::Default),
        };
        let dirs: Vec<PathBuf> = std::env::split_paths(&value)
            .filter(|d| !d.as_os_str().is_empty())
            .collect();
        let shown = dirs.iter().map(|d| d.display().to_string()).collect();
        CniPath { dirs, shown, from }
    }

    /// The line saying which directories and why, e.g. `CNI_PATH from --cni-path: /opt/cni/bin`.
    fn describe(&self) -> String {
        let dirs = match self.shown.join(":") {
            dirs if dirs.is_empty() => "(no directory)".to_string(),
            dirs => dirs,
        };
        match self.from {
            Source::Flag => format!("CNI_PATH from --cni-path: {dirs}"),
            Source::Environment => format!("CNI_PATH from the environment: {dirs}"),
            Source::Default => format!("CNI_PATH by default (no --cni-path, no CNI_PATH): {dirs}"),
        }
    }
}

#[derive(Serialize)]
struct Verdict {
    ready: bool,
    config: String,
    #[serde(rename = "cniPath")]
    cni_path: CniPath,
    /// The CNI error code ADD would return (11 try again later, 7 misconfigured), if any.
    code: Option<u32>,
    message: Option<String>,
    items: Vec<Line>,
    warnings: Vec<String>,
    /// A verb's deadline past kubelet's ([`budget::warnings`]): said, not refused.
    budget: Vec<String>,
    /// How many configurations the `fallback` line names (none until the conflist loaded).
    #[serde(skip)]
    fallback_configs: Option<usize>,
}

pub fn run(args: Vec<OsString>) -> Result<i32> {
    let mut flags = Flags::new(args);
    let mut config: Option<PathBuf> = None;
    let mut host_root: Option<PathBuf> = None;
    let mut cni_path_flag: Option<OsString> = None;
    let mut json = false;
    while let Some(flag) = flags.next_flag()? {
        match flag.as_str() {
            "--help" | "-h" => {
                print!("{HELP}");
                return Ok(0);
            }
            "--config" => config = Some(flags.path(&flag)?),
            "--host-root" => host_root = Some(flags.path(&flag)?),
            "--cni-path" => cni_path_flag = Some(flags.value(&flag)?.into()),
            "--json" => json = true,
            other => return Err(Flags::unknown(other)),
        }
    }
    let config = config.ok_or_else(|| crate::usage_error("--config is required"))?;
    let cni_path = CniPath::choose(cni_path_flag, std::env::var_os("CNI_PATH"));
    let verdict = assess(&config, host_root.as_deref(), cni_path);
    if json {
        let text = serde_json::to_string_pretty(&verdict).expect("a verdict serialises");
        println!("{text}");
    } else {
        print!("{}", render(&verdict));
    }
    Ok(if verdict.ready { 0 } else { 1 })
}

/// Whether ADD would proceed now, by the same checks as `check` (the keeper's
/// `cni_guard_ready` and its log): `cni_path` as `--cni-path` would give it, else `CNI_PATH`,
/// else the default. With it, in a few words, what holds (ready) or why not.
pub(crate) fn state(config: &Path, host_root: Option<&Path>, cni_path: Option<OsString>) -> State {
    let cni_path = CniPath::choose(cni_path, std::env::var_os("CNI_PATH"));
    let verdict = assess(config, host_root, cni_path);
    let words = if verdict.ready {
        ready_words(&verdict)
    } else {
        not_ready_words(&verdict)
    };
    State {
        ready: verdict.ready,
        words,
        fallback_configs: verdict.fallback_configs,
    }
}

/// What `keep` takes from a check, once a second: readiness in words, and the `fallback`
/// line's count of the configurations that would take over if the delegate vanished.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct State {
    pub ready: bool,
    pub words: String,
    pub fallback_configs: Option<usize>,
}

/// What holds: `ADD would proceed (delegate X, attachment Y, socket Z, plugins "a", "b")`.
fn ready_words(verdict: &Verdict) -> String {
    let mut parts: Vec<String> = verdict
        .items
        .iter()
        .filter(|l| matches!(l.check, "delegate" | "attachment" | "socket"))
        .map(|l| format!("{} {}", l.check, l.path))
        .collect();
    let plugins: Vec<String> = verdict
        .items
        .iter()
        .filter_map(|l| l.plugin_type.as_ref().map(|t| format!("{t:?}")))
        .collect();
    if !plugins.is_empty() {
        parts.push(format!("plugins {}", plugins.join(", ")));
    }
    format!("ADD would proceed ({})", parts.join(", "))
}

/// Why not: ADD's own refusal without its `cni-guard: ...` prefix, and the code it answers.
fn not_ready_words(verdict: &Verdict) -> String {
    let message = verdict.message.as_deref().unwrap_or("unknown");
    match verdict.code {
        Some(c) if c == code::TRY_AGAIN_LATER => format!(
            "{}; ADD answers {c} (try again later)",
            message
                .strip_prefix("cni-guard: network not ready: ")
                .unwrap_or(message)
        ),
        Some(c) => format!(
            "misconfigured: {}; ADD answers {c}",
            message
                .strip_prefix("cni-guard is misconfigured: ")
                .unwrap_or(message)
        ),
        None => message.to_owned(),
    }
}

fn assess(config: &Path, root: Option<&Path>, cni_path: CniPath) -> Verdict {
    // What a person reading the report knows: host paths, not this pod's mount points.
    let shown = |p: &Path| -> String {
        match root.and_then(|r| p.strip_prefix(r).ok()) {
            Some(rest) => Path::new("/").join(rest).display().to_string(),
            None => p.display().to_string(),
        }
    };
    // The same for paths inside messages and reasons written by the readiness checks.
    let unroot = |text: String| -> String { unroot_text(&text, root) };
    let mut verdict = Verdict {
        ready: false,
        config: shown(config),
        cni_path,
        code: None,
        message: None,
        items: Vec::new(),
        warnings: Vec::new(),
        budget: Vec::new(),
        fallback_configs: None,
    };

    let host_config = match load_conflist(config) {
        Ok(cfg) => cfg,
        Err(e) => {
            verdict.items.push(Line {
                check: "config",
                plugin_type: None,
                path: shown(config),
                ok: false,
                reason: unroot(e.msg().to_owned()),
            });
            verdict.message = Some(format!(
                "the guard's configuration is not usable here: {}",
                unroot(e.msg().to_owned())
            ));
            return verdict;
        }
    };
    let mut cfg = host_config.clone();
    cfg.delegate = under_root(root, &host_config.delegate);
    cfg.sockets = host_config
        .sockets
        .iter()
        .map(|p| under_root(root, p))
        .collect();
    cfg.attachments = host_config
        .attachments
        .iter()
        .map(|a| under_root(root, a))
        .collect();
    let cni_path: Vec<PathBuf> = verdict
        .cni_path
        .dirs
        .iter()
        .map(|d| under_root(root, d))
        .collect();

    let report = readiness::check(&cfg, &cni_path);
    for item in &report.items {
        let (check, plugin_type) = match &item.subject {
            Subject::Delegate => ("delegate", None),
            Subject::Attachment => ("attachment", None),
            Subject::Plugin(t) => ("plugin", Some(t.clone())),
            Subject::Permissions => ("permissions", None),
            Subject::Socket => ("socket", None),
        };
        verdict.items.push(Line {
            check,
            plugin_type,
            path: shown(&item.path),
            ok: item.ok(),
            reason: unroot(item.reason()),
        });
    }

    // Recursion: NetworkConfig::load refuses a file naming the guard, or whose Multus
    // clusterNetwork is a guard configuration, as a fatal problem; its reason says which.
    let recursive = report
        .items
        .iter()
        .find(|i| i.fatal() && matches!(i.subject, Subject::Delegate | Subject::Attachment));
    verdict.items.push(match recursive {
        Some(item) => Line {
            check: "recursion",
            plugin_type: None,
            path: shown(&item.path),
            ok: false,
            reason: unroot(item.reason()),
        },
        None => Line {
            check: "recursion",
            plugin_type: None,
            path: String::new(),
            ok: true,
            reason: format!("no configuration that loaded names {:?}", cfg.plugin_type),
        },
    });

    let first = first_in_conf_dir(config);
    verdict.items.push(Line {
        check: "first",
        plugin_type: None,
        path: shown(config),
        ok: first.is_ok(),
        reason: match &first {
            Ok(()) => format!(
                "sorts first in {}",
                config.parent().map(&shown).unwrap_or_default()
            ),
            Err(e) => e.msg().to_owned(),
        },
    });
    // The layout, for a preflight before the first reboot; neither line changes the verdict.
    let (line, others) = fallback(config, &cfg.delegate, &shown);
    verdict.items.push(line);
    verdict.fallback_configs = Some(others);
    let multus = report.delegate.as_ref().and_then(|d| {
        d.plugins
            .iter()
            .find_map(|p| p.get("clusterNetwork").and_then(|c| c.as_str()))
    });
    if let Some(named) = multus {
        verdict.items.push(primary(named, root, &shown));
    }
    verdict.warnings = report
        .warnings
        .iter()
        .map(|p| format!("{} is writable by group or others", shown(p)))
        .collect();
    verdict.budget = budget::warnings(&cfg, budget::KUBELET_RUNTIME_REQUEST_TIMEOUT);

    match report.error() {
        Some(e) => {
            verdict.code = Some(e.code(Command::Add));
            verdict.message = Some(unroot(e.msg().to_owned()));
        }
        None if first.is_err() => {
            verdict.message = Some(format!(
                "the guard is not in force: containerd uses another config ({})",
                first.unwrap_err().msg()
            ));
        }
        None => verdict.ready = true,
    }
    verdict
}

/// Loads the guard's entry from its conflist, as the runtime would pass it to the plugin: the
/// first plugin of type `cni-guard`, with the list's `name` and `cniVersion`.
pub fn load_conflist(path: &Path) -> Result<GuardConfig> {
    let bytes = std::fs::read(path)
        .map_err(|e| Error::new(Kind::Io, format!("cannot read {}: {e}", path.display())))?;
    let bad = |why: String| Error::new(Kind::BadInput, format!("{} {why}", path.display()));
    let list: Value =
        serde_json::from_slice(&bytes).map_err(|e| bad(format!("cannot be decoded: {e}")))?;
    let list = list
        .as_object()
        .ok_or_else(|| bad("is not a JSON object".to_owned()))?;
    let is_guard = |p: &&serde_json::Map<String, Value>| {
        p.get("type").and_then(Value::as_str) == Some(GUARD_TYPE)
    };
    let entry = match list.get("plugins") {
        Some(Value::Array(plugins)) => plugins.iter().filter_map(Value::as_object).find(is_guard),
        _ => Some(list).filter(is_guard),
    };
    let mut entry = entry.cloned().ok_or_else(|| {
        Error::new(
            Kind::Misconfigured,
            format!("{} has no plugin of type {GUARD_TYPE:?}", path.display()),
        )
    })?;
    for key in ["name", "cniVersion"] {
        if let Some(v) = list.get(key) {
            entry.insert(key.into(), v.clone());
        }
    }
    Ok(Entry::from_value(Value::Object(entry))?.validate()?)
}

/// `text` with every path under `root` said as the host path (`/host/etc/...` as `/etc/...`
/// for `--host-root=/host`): only where a path starts, never inside another path (`/var/host/`)
/// or a quoted value, which is what a file says (Multus's clusterNetwork, written from inside its
/// own pod, is `"/host/etc/cni/net.d/..."` on the host too).
fn unroot_text(text: &str, root: Option<&Path>) -> String {
    let Some(r) = root
        .and_then(|r| r.to_str())
        .map(|r| r.trim_end_matches('/'))
        .filter(|r| !r.is_empty())
    else {
        return text.to_owned();
    };
    let needle = format!("{r}/");
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(&needle) {
        let starts_path = rest[..at]
            .chars()
            .next_back()
            .or_else(|| out.chars().next_back())
            .map_or(true, |c| {
                !(c == '"' || c.is_alphanumeric() || "/._-".contains(c))
            });
        out.push_str(&rest[..at]);
        if starts_path {
            out.push('/');
        } else {
            out.push_str(&needle);
        }
        rest = &rest[at + needle.len()..];
    }
    out.push_str(rest);
    out
}

/// `fallback`: every configuration in the guard's conf dir but the guard's file and the
/// delegate's: what containerd would build sandboxes on if the delegate vanished (the hazard
/// itself; on a reboot, the delegate's file is gone until its daemon is back).
fn fallback(config: &Path, delegate: &Path, shown: &dyn Fn(&Path) -> String) -> (Line, usize) {
    let dir = config.parent().unwrap_or(Path::new("."));
    let delegate_here = delegate.parent() == Some(dir);
    let others: Vec<String> = conf_files(dir)
        .unwrap_or_default()
        .into_iter()
        .filter(|f| {
            let f = Some(std::ffi::OsStr::new(f));
            f != config.file_name() && !(delegate_here && f == delegate.file_name())
        })
        .map(|f| shown(&dir.join(f)))
        .collect();
    let line = Line {
        check: "fallback",
        plugin_type: None,
        path: String::new(),
        ok: others.is_empty(),
        reason: match others.is_empty() {
            true => format!("no other configuration in {}", shown(dir)),
            false => format!(
                "{}: containerd would use it if the delegate vanished",
                others.join(", ")
            ),
        },
    };
    (line, others.len())
}

/// `primary`: Multus's `clusterNetwork` (as Multus names it, from inside its pod: a leading
/// `/host` is the host's root) must be a file that is there. (One that is the guard's own is
/// the `recursion` line's: the delegate does not load.)
fn primary(named: &str, root: Option<&Path>, shown: &dyn Fn(&Path) -> String) -> Line {
    let host_path = named.strip_prefix("/host").filter(|p| p.starts_with('/'));
    let found = [Some(named), host_path]
        .into_iter()
        .flatten()
        .map(|p| under_root(root, Path::new(p)))
        .find(|p| p.is_file());
    Line {
        check: "primary",
        plugin_type: None,
        path: String::new(),
        ok: found.is_some(),
        reason: match found {
            Some(p) => format!("Multus's clusterNetwork {} exists", shown(&p)),
            None => format!("Multus's clusterNetwork {named:?} does not exist here"),
        },
    }
}

/// `Ok` when `config` is the first file containerd would consider in its folder; the error says
/// why not, after the file's path.
fn first_in_conf_dir(config: &Path) -> Result<()> {
    let dir = config.parent().unwrap_or(Path::new("."));
    let misplaced = |why: String| Err(Error::new(Kind::Misconfigured, why));
    let Some(name) = config.file_name().and_then(|n| n.to_str()) else {
        return misplaced("has no file name".to_string());
    };
    let files = conf_files(dir)
        .map_err(|e| Error::new(Kind::Io, format!("cannot list {}: {e}", dir.display())))?;
    match files.first() {
        Some(first) if first == name => Ok(()),
        Some(first) => misplaced(format!("{first} sorts before it")),
        None => misplaced("is not in its folder".to_string()),
    }
}

fn render(verdict: &Verdict) -> String {
    let mut out = format!("  {}\n", verdict.cni_path.describe());
    for line in &verdict.items {
        let mark = if line.ok { '✓' } else { '✗' };
        let subject = match &line.plugin_type {
            Some(t) if line.ok => format!("{t:?} at {}", line.path),
            Some(t) => format!("{t:?}"),
            None => line.path.clone(),
        };
        let text = match (subject.is_empty(), line.reason.is_empty()) {
            (_, true) => subject,
            (true, false) => line.reason.clone(),
            (false, false) if line.ok => format!("{subject} {}", line.reason),
            (false, false) => format!("{subject}: {}", line.reason),
        };
        out.push_str(&format!("{mark} {:<11}{text}\n", line.check));
    }
    for warning in &verdict.warnings {
        out.push_str(&format!("! {:<11}{warning}\n", "warning"));
    }
    for warning in &verdict.budget {
        out.push_str(&format!("! {:<11}{warning}\n", "budget"));
    }
    let summary = match (verdict.code, &verdict.message) {
        _ if verdict.ready => "ready: ADD would proceed now".to_string(),
        (Some(c), Some(m)) => {
            let meaning = if c == code::TRY_AGAIN_LATER {
                "try again later"
            } else {
                "misconfigured"
            };
            format!("not ready: ADD would be refused with CNI error {c} ({meaning}): {m}")
        }
        (_, m) => format!("not ready: {}", m.as_deref().unwrap_or("unknown")),
    };
    out.push_str(&summary);
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unroot_says_host_paths_but_leaves_quoted_values_and_other_paths_alone() {
        let root = Some(Path::new("/host/"));
        let cases = [
            (
                "delegate /host/etc/cni/net.d/00-multus.conf has Multus's clusterNetwork \"/host/etc/cni/net.d/00-cni-guard.conflist\", which is a cni-guard configuration (/host/etc/cni/net.d/00-cni-guard.conflist): ...",
                "delegate /etc/cni/net.d/00-multus.conf has Multus's clusterNetwork \"/host/etc/cni/net.d/00-cni-guard.conflist\", which is a cni-guard configuration (/etc/cni/net.d/00-cni-guard.conflist): ...",
            ),
            (
                "is not in CNI_PATH /host/opt/cni/bin:/host/usr/lib/cni",
                "is not in CNI_PATH /opt/cni/bin:/usr/lib/cni",
            ),
            ("/host/etc/x", "/etc/x"),
            ("/var/host/etc/x and /hostile/x", "/var/host/etc/x and /hostile/x"),
        ];
        for (text, want) in cases {
            assert_eq!(unroot_text(text, root), want);
        }
        assert_eq!(unroot_text("/host/etc/x", None), "/host/etc/x");
        assert_eq!(
            unroot_text("/host/etc/x", Some(Path::new("/"))),
            "/host/etc/x"
        );
    }
}
