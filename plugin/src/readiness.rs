//! Whether the delegate network is completely there: the checks behind ADD and STATUS, and the
//! report behind `cni-guard-agent check`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::config::GuardConfig;
use crate::error::Error;
use crate::invoke::find_plugin;
use crate::netconf::NetworkConfig;
pub use crate::problem::{Item, Problem, Subject};
use crate::sys;

#[derive(Debug, Clone, Default)]
pub struct Report {
    pub items: Vec<Item>,
    /// The delegate, when it loaded.
    pub delegate: Option<NetworkConfig>,
    /// Files that are writable by group or others (warned about unless strict).
    pub warnings: Vec<PathBuf>,
}

impl Report {
    pub fn ready(&self) -> bool {
        self.items.iter().all(Item::ok)
    }

    pub fn failures(&self) -> impl Iterator<Item = &Item> {
        self.items.iter().filter(|i| !i.ok())
    }

    /// The failure a refusal names: the first configuration error, else the first failure.
    fn first_failure(&self) -> Option<&Item> {
        self.failures()
            .find(|i| i.fatal())
            .or_else(|| self.failures().next())
    }

    /// The reason the refusal is counted under: that of the failure [`Report::error`] names.
    pub fn label(&self) -> Option<&'static str> {
        self.first_failure().and_then(Item::label)
    }

    /// The refusal: [`Kind::Misconfigured`] when any failure is a configuration error,
    /// [`Kind::NotReady`] otherwise. The message names the first failing path; the details name
    /// every other failure (runtimes print `msg; details`: nothing twice).
    pub fn error(&self) -> Option<Error> {
        let first = self.first_failure()?;
        let problem = first.problem.as_ref()?;
        let prefix = match problem {
            Problem::Unusable(_) => "cni-guard: unusable configuration",
            _ if first.fatal() => "cni-guard is misconfigured",
            _ => "cni-guard: network not ready",
        };
        let msg = format!("{prefix}: {}", first.describe());
        let others: Vec<String> = self
            .failures()
            .filter(|i| !std::ptr::eq(*i, first))
            .map(Item::describe)
            .collect();
        let details = (!others.is_empty()).then(|| format!("also: {}", others.join("; ")));
        Some(Error::new(problem.kind(), msg).with_details(details.unwrap_or_default()))
    }

    /// Directories whose changes could make a failing precondition pass.
    pub fn watch_dirs(&self, cni_path: &[PathBuf]) -> Vec<PathBuf> {
        let dirs = self.failures().flat_map(|item| match item.subject {
            Subject::Plugin(_) => cni_path.to_vec(),
            _ => item.path.parent().into_iter().map(Path::to_owned).collect(),
        });
        dirs.collect::<BTreeSet<_>>().into_iter().collect()
    }

    fn push(&mut self, subject: Subject, path: PathBuf, problem: Option<Problem>) {
        self.items.push(Item::new(subject, path, problem));
    }
}

/// Checks every precondition of ADD. Never blocks and never writes.
pub fn check(cfg: &GuardConfig, cni_path: &[PathBuf]) -> Report {
    let mut report = Report::default();
    let delegate = check_config(&mut report, Subject::Delegate, &cfg.delegate, cfg);
    let attachments: Vec<NetworkConfig> = cfg
        .attachments
        .iter()
        .filter_map(|p| check_config(&mut report, Subject::Attachment, p, cfg))
        .collect();
    let loaded = delegate.iter().chain(&attachments);
    let types: BTreeSet<&str> = loaded.flat_map(NetworkConfig::types).collect();
    for t in types {
        let found = find_plugin(t, cni_path);
        let path = found.clone().unwrap_or_else(|_| PathBuf::from(t));
        report.push(Subject::Plugin(t.to_owned()), path, found.err());
    }
    for path in &cfg.sockets {
        let problem = sys::unix_socket_accepts(path).err();
        report.push(Subject::Socket, path.clone(), problem.map(dead_socket));
    }
    report.delegate = delegate;
    report
}

/// Why a socket does not accept connections, said after its path.
fn dead_socket(e: std::io::Error) -> Problem {
    let why = match e.raw_os_error() {
        Some(libc::ENOENT) => "does not exist",
        Some(libc::ECONNREFUSED) => "does not accept connections (refused: nothing listens on it)",
        Some(libc::ENOTSOCK) | Some(libc::ECONNRESET) => "is not a listening socket",
        _ => return Problem::Dead(format!("does not accept connections ({e})")),
    };
    Problem::Dead(why.to_owned())
}

fn check_config(
    report: &mut Report,
    subject: Subject,
    path: &Path,
    cfg: &GuardConfig,
) -> Option<NetworkConfig> {
    let loaded = NetworkConfig::load(path, &cfg.plugin_type);
    let writer = cfg
        .delegate_writer
        .clone()
        .filter(|_| subject == Subject::Delegate);
    let problem = loaded.as_ref().err().cloned();
    report.items.push(Item {
        writer,
        ..Item::new(subject, path.to_owned(), problem)
    });
    let conf = loaded.ok()?;
    if conf.loosely_writable {
        report.warnings.push(path.to_owned());
        if cfg.strict_permissions {
            report.push(
                Subject::Permissions,
                path.to_owned(),
                Some(Problem::Writable),
            );
        }
    }
    Some(conf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Kind;
    use std::os::unix::fs::PermissionsExt;

    struct Fixture {
        dir: tempfile::TempDir,
    }

    impl Fixture {
        fn new() -> Fixture {
            let f = Fixture {
                dir: tempfile::tempdir().unwrap(),
            };
            std::fs::create_dir(f.bin()).unwrap();
            f
        }
        fn bin(&self) -> PathBuf {
            self.dir.path().join("bin")
        }
        fn plugin(&self, name: &str) {
            let p = self.bin().join(name);
            std::fs::write(&p, "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        fn file(&self, name: &str, body: &str) -> PathBuf {
            let p = self.dir.path().join(name);
            std::fs::write(&p, body).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
            p
        }
        fn config(&self, delegate: &Path, attachments: &[&Path]) -> GuardConfig {
            let v = serde_json::json!({"cniVersion":"1.0.0","name":"g","type":"cni-guard",
                "delegate": delegate, "attachments": attachments});
            GuardConfig::parse(&serde_json::to_vec(&v).unwrap()).unwrap()
        }
    }

    #[test]
    fn a_socket_must_accept_connections() {
        let f = Fixture::new();
        f.plugin("multus-shim");
        let d = f.file(
            "00-multus.conf",
            r#"{"cniVersion":"1.0.0","name":"m","type":"multus-shim"}"#,
        );
        let sock = f.dir.path().join("multus.sock");
        let mut cfg = f.config(&d, &[]);
        cfg.sockets = vec![sock.clone()];
        let socket_item = |r: &Report| {
            r.items
                .iter()
                .find(|i| i.subject == Subject::Socket)
                .unwrap()
                .clone()
        };
        // Missing.
        let r = check(&cfg, &[f.bin()]);
        assert!(!r.ready());
        assert_eq!(socket_item(&r).reason(), "does not exist");
        assert_eq!(r.label(), Some("socket-dead"));
        // Listening.
        let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        assert!(check(&cfg, &[f.bin()]).ready());
        // The daemon died: the socket file stays, nothing listens (a SIGKILLed Multus).
        drop(listener);
        let r = check(&cfg, &[f.bin()]);
        assert!(
            socket_item(&r).reason().contains("refused"),
            "{}",
            socket_item(&r).reason()
        );
        let e = r.error().unwrap();
        assert!(
            e.msg().contains("socket") && e.msg().contains("multus.sock"),
            "{}",
            e.msg()
        );
        // A regular file in its place is no listener either.
        std::fs::remove_file(&sock).unwrap();
        std::fs::write(&sock, "").unwrap();
        assert!(!check(&cfg, &[f.bin()]).ready());
    }

    #[test]
    fn ready_when_everything_is_there() {
        let f = Fixture::new();
        f.plugin("multus-shim");
        f.plugin("cilium-cni");
        let d = f.file(
            "00-multus.conf",
            r#"{"cniVersion":"0.3.1","name":"m","type":"multus-shim"}"#,
        );
        let a = f.file(
            "05-cilium.conflist",
            r#"{"cniVersion":"0.3.1","name":"c","plugins":[{"type":"cilium-cni"}]}"#,
        );
        let r = check(&f.config(&d, &[&a]), &[f.bin()]);
        assert!(r.ready(), "{:?}", r.items);
        assert_eq!(r.items.len(), 4);
        assert!(r.error().is_none());
        assert_eq!(r.delegate.unwrap().name, "m");
    }

    #[test]
    fn names_every_missing_piece() {
        let f = Fixture::new();
        let d = f.dir.path().join("00-multus.conf");
        let a = f.file(
            "05-cilium.conflist",
            r#"{"cniVersion":"0.3.1","name":"c","plugins":[{"type":"cilium-cni"}]}"#,
        );
        let r = check(&f.config(&d, &[&a]), &[f.bin()]);
        let e = r.error().unwrap();
        assert_eq!(*e.kind(), Kind::NotReady);
        assert!(e.msg().contains(d.to_str().unwrap()), "{}", e.msg());
        assert!(e.msg().contains("does not exist"));
        let details = e.details().unwrap();
        assert!(details.contains("cilium-cni"), "{details}");
        assert_eq!(
            r.watch_dirs(&[f.bin()]),
            vec![f.dir.path().to_owned(), f.bin()]
        );
    }

    #[test]
    fn a_missing_delegate_names_its_writer_when_told() {
        let f = Fixture::new();
        f.plugin("cilium-cni");
        let d = f.dir.path().join("00-multus.conf");
        let a = f.file(
            "05-cilium.conflist",
            r#"{"cniVersion":"0.3.1","name":"c","plugins":[{"type":"cilium-cni"}]}"#,
        );
        let mut cfg = f.config(&d, &[&a]);
        cfg.delegate_writer = Some("Multus".into());
        let r = check(&cfg, &[f.bin()]);
        let e = r.error().unwrap();
        assert_eq!(*e.kind(), Kind::NotReady);
        assert_eq!(
            e.msg(),
            format!(
                "cni-guard: network not ready: delegate {} does not exist (written by Multus)",
                d.display()
            )
        );
        assert_eq!(r.label(), Some("delegate-missing"));
        // An attachment that is missing says no writer: the key is the delegate's.
        let gone = f.dir.path().join("07-gone.conflist");
        let plain = f.file(
            "00-plain.conf",
            r#"{"cniVersion":"1.0.0","name":"p","type":"cilium-cni"}"#,
        );
        let mut cfg = f.config(&plain, &[&gone]);
        cfg.delegate_writer = Some("Multus".into());
        let r = check(&cfg, &[f.bin()]);
        assert_eq!(
            r.error().unwrap().msg(),
            format!(
                "cni-guard: network not ready: attachment {} does not exist",
                gone.display()
            )
        );
        assert_eq!(r.label(), Some("attachment-missing"));
        // A delegate that is there but invalid keeps its own reason.
        let bad = f.file("00-bad.conf", "{");
        let mut cfg = f.config(&bad, &[]);
        cfg.delegate_writer = Some("Multus".into());
        let r = check(&cfg, &[f.bin()]);
        assert!(!r.error().unwrap().msg().contains("written by"));
        assert_eq!(r.label(), Some("delegate-invalid"));
    }

    #[test]
    fn recursion_is_code_7() {
        let f = Fixture::new();
        let d = f.file(
            "00-multus.conf",
            r#"{"cniVersion":"1.0.0","name":"m","type":"cni-guard"}"#,
        );
        let e = check(&f.config(&d, &[]), &[f.bin()]).error().unwrap();
        assert_eq!(*e.kind(), Kind::Misconfigured);
        assert!(e.msg().contains("misconfigured"), "{}", e.msg());
    }

    /// Multus's auto-config elected the guard's own file as its cluster network.
    #[test]
    fn cluster_network_naming_the_guard_is_recursion_code_7() {
        let f = Fixture::new();
        f.plugin("multus-shim");
        f.plugin("cilium-cni");
        let guard = f.file(
            "00-cni-guard.conflist",
            r#"{"cniVersion":"1.0.0","name":"cni-guard","plugins":[{"type":"cni-guard"}]}"#,
        );
        let multus = |cluster_network: serde_json::Value| {
            let body = serde_json::json!({"cniVersion":"1.0.0","name":"multus-cni-network",
                "clusterNetwork": cluster_network, "type":"multus-shim"});
            f.file("00-multus.conf", &body.to_string())
        };
        let a = f.file(
            "05-cilium.conflist",
            r#"{"cniVersion":"0.3.1","name":"c","plugins":[{"type":"cilium-cni"}]}"#,
        );
        let d = multus("/host/etc/cni/net.d/00-cni-guard.conflist".into());
        let r = check(&f.config(&d, &[&a]), &[f.bin()]);
        assert_eq!(r.label(), Some("recursion"));
        let e = r.error().unwrap();
        assert_eq!(*e.kind(), Kind::Misconfigured);
        assert_eq!(e.code(crate::request::Command::Add), 7);
        assert_eq!(e.code(crate::request::Command::Status), 7);
        let want = format!(
            "cni-guard is misconfigured: delegate {} has Multus's clusterNetwork \"/host/etc/cni/net.d/00-cni-guard.conflist\", which is a cni-guard configuration ({}): ",
            d.display(),
            guard.display()
        );
        assert!(e.msg().starts_with(&want), "{}", e.msg());
        assert!(e.msg().contains("multusMasterCNI"), "{}", e.msg());
        // Nothing to wait for: the refusal is at once, whatever waitSeconds says.
        assert!(r.failures().any(Item::fatal));

        // The same Multus file as an attachment.
        let plain = f.file(
            "01-plain.conf",
            r#"{"cniVersion":"1.0.0","name":"p","type":"cilium-cni"}"#,
        );
        let r = check(&f.config(&plain, &[&d]), &[f.bin()]);
        assert_eq!(r.label(), Some("recursion"));

        // Pinned to the primary network, missing, not a string, or in another folder: ready.
        let other = tempfile::tempdir().unwrap();
        let elsewhere = other.path().join("00-guard-elsewhere.conflist");
        std::fs::copy(&guard, &elsewhere).unwrap();
        for named in [
            serde_json::json!("/host/etc/cni/net.d/05-cilium.conflist"),
            serde_json::json!("/host/etc/cni/net.d/07-gone.conflist"),
            serde_json::json!(false),
            serde_json::json!(elsewhere),
        ] {
            let d = multus(named.clone());
            let r = check(&f.config(&d, &[&a]), &[f.bin()]);
            assert!(r.ready(), "{named}: {:?}", r.error());
        }
    }

    #[test]
    fn strict_mode_refuses_writable_files() {
        let f = Fixture::new();
        f.plugin("x");
        let d = f.file("d.conf", r#"{"cniVersion":"1.0.0","name":"m","type":"x"}"#);
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o666)).unwrap();
        let mut cfg = f.config(&d, &[]);
        let r = check(&cfg, &[f.bin()]);
        assert!(r.ready());
        assert_eq!(r.warnings, vec![d.clone()]);
        cfg.strict_permissions = true;
        assert_eq!(
            *check(&cfg, &[f.bin()]).error().unwrap().kind(),
            Kind::Misconfigured
        );
    }
}
