//! The built `cni-guard` binary driven from outside, as a runtime drives it, with fake delegate
//! plugins (`testdata/plugins/fake-plugin`) that record what they receive and answer what they
//! are told. One module per verb.

mod harness {
    use serde_json::{json, Value};
    use std::ffi::OsString;
    use std::path::{Path, PathBuf};

    pub struct Fx {
        pub dir: tempfile::TempDir,
    }

    pub struct Run {
        pub status: i32,
        pub stdout: String,
        pub stderr: String,
    }

    impl Run {
        pub fn json(&self) -> Value {
            serde_json::from_str(&self.stdout)
                .unwrap_or_else(|e| panic!("stdout is not one JSON value ({e}): {:?}", self.stdout))
        }
        /// Asserts the spec's error reply and returns it.
        pub fn error(&self, code: u64) -> Value {
            assert_ne!(self.status, 0, "expected failure, stdout {}", self.stdout);
            let v = self.json();
            assert_eq!(v["code"], code, "reply {v}");
            assert!(v["msg"].is_string(), "reply {v}");
            assert!(v["cniVersion"].is_string(), "reply {v}");
            assert!(!self.stderr.contains("panicked"), "{}", self.stderr);
            v
        }
        pub fn ok(&self) -> &Self {
            assert_eq!(
                self.status, 0,
                "stdout {} stderr {}",
                self.stdout, self.stderr
            );
            self
        }
    }

    impl Fx {
        pub fn new() -> Fx {
            let fx = Fx {
                dir: tempfile::tempdir().unwrap(),
            };
            for d in ["bin", "net.d", "fake"] {
                std::fs::create_dir(fx.dir.path().join(d)).unwrap();
            }
            fx
        }
        pub fn path(&self, p: &str) -> PathBuf {
            self.dir.path().join(p)
        }
        pub fn cache(&self) -> PathBuf {
            self.path("cache")
        }
        /// Installs the fake plugin under a type name.
        pub fn plugin(&self, ty: &str) {
            let fake =
                Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/plugins/fake-plugin");
            std::os::unix::fs::symlink(fake, self.path("bin").join(ty)).unwrap();
        }
        /// Makes a fake plugin sleep before it answers a verb.
        pub fn sleep(&self, ty: &str, cmd: &str, seconds: f64) {
            std::fs::write(
                self.path(&format!("fake/{ty}.{cmd}.sleep")),
                seconds.to_string(),
            )
            .unwrap();
        }
        /// Tells a fake plugin what to answer to a verb.
        pub fn answer(&self, ty: &str, cmd: &str, out: &str, rc: i32) {
            std::fs::write(self.path(&format!("fake/{ty}.{cmd}.out")), out).unwrap();
            std::fs::write(self.path(&format!("fake/{ty}.{cmd}.rc")), rc.to_string()).unwrap();
        }
        pub fn file(&self, name: &str, body: &Value) -> PathBuf {
            let p = self.path(name);
            std::fs::write(&p, serde_json::to_vec(body).unwrap()).unwrap();
            p
        }
        pub fn delegate_path(&self) -> PathBuf {
            self.path("net.d/00-multus.conf")
        }
        /// A single-plugin delegate `00-multus.conf` of the given type and version.
        pub fn delegate(&self, ty: &str, version: &str) -> PathBuf {
            self.file(
                "net.d/00-multus.conf",
                &json!({"cniVersion":version,"name":"multus-net","type":ty}),
            )
        }
        /// The guard's configuration as the runtime passes it on stdin.
        pub fn guard(&self, version: &str, extra: Value) -> Value {
            let mut v = json!({"cniVersion":version,"name":"guarded","type":"cni-guard",
                "delegate": self.delegate_path(), "cacheDir": self.cache()});
            for (k, val) in extra.as_object().unwrap() {
                v[k] = val.clone();
            }
            v
        }
        pub fn run(&self, cmd: &str, conf: &Value) -> Run {
            self.run_env(cmd, conf, &[])
        }
        pub fn run_env(&self, cmd: &str, conf: &Value, env: &[(&str, Option<&str>)]) -> Run {
            self.run_raw(cmd, &serde_json::to_vec(conf).unwrap(), env)
        }
        pub fn run_raw(&self, cmd: &str, stdin: &[u8], env: &[(&str, Option<&str>)]) -> Run {
            let defaults: [(&str, Option<OsString>); 8] = [
                ("PATH", Some("/usr/bin:/bin".into())),
                ("FAKE_DIR", Some(self.path("fake").into())),
                ("CNI_GUARD_SYSLOG", Some(self.path("no-syslog").into())),
                ("CNI_COMMAND", Some(cmd.into())),
                ("CNI_CONTAINERID", Some("ctr1".into())),
                ("CNI_NETNS", Some("/run/netns/test".into())),
                ("CNI_IFNAME", Some("eth0".into())),
                ("CNI_PATH", Some(self.path("bin").into())),
            ];
            let env = env.iter().map(|(k, v)| (*k, v.map(OsString::from)));
            let out = test_support::run_cleared(
                env!("CARGO_BIN_EXE_cni-guard"),
                defaults.into_iter().chain(env),
                stdin,
            );
            Run {
                status: out.status.unwrap_or(-1),
                stdout: out.stdout_text(),
                stderr: out.stderr_text(),
            }
        }
        /// The fake plugins' calls, in order: "type VERB".
        pub fn calls(&self) -> Vec<String> {
            std::fs::read_to_string(self.path("fake/calls"))
                .unwrap_or_default()
                .lines()
                .map(str::to_owned)
                .collect()
        }
        /// The configuration a fake plugin last received for a verb.
        pub fn received(&self, ty: &str, cmd: &str) -> Value {
            let s = std::fs::read_to_string(self.path(&format!("fake/{ty}.{cmd}.stdin"))).unwrap();
            serde_json::from_str(&s).unwrap()
        }
        pub fn received_env(&self, ty: &str, cmd: &str) -> String {
            std::fs::read_to_string(self.path(&format!("fake/{ty}.{cmd}.env"))).unwrap()
        }
        /// Every file under the cache dir (records and anything else) but the networks' lock
        /// files, which stay (`.<network>.lock`: the attachments' locks, no record).
        pub fn cache_files(&self) -> Vec<PathBuf> {
            fn walk(p: &Path, out: &mut Vec<PathBuf>) {
                if let Ok(rd) = std::fs::read_dir(p) {
                    for e in rd.flatten() {
                        if e.file_type().unwrap().is_dir() {
                            walk(&e.path(), out);
                        } else {
                            out.push(e.path());
                        }
                    }
                }
            }
            let mut out = Vec::new();
            walk(&self.cache(), &mut out);
            let lock = |p: &PathBuf| {
                p.parent() == Some(self.cache().as_path())
                    && p.extension().is_some_and(|e| e == "lock")
            };
            out.retain(|p| !lock(p));
            out
        }
    }

    /// A result in the shape of `version` (0.x results carry `ips[].version`).
    pub fn result(version: &str, addr: &str) -> String {
        let mut ip = json!({"address":addr,"gateway":"10.1.0.1","interface":0});
        if version.starts_with("0.") {
            ip["version"] = json!("4");
        }
        json!({"cniVersion":version,"interfaces":[{"name":"eth0","sandbox":"/run/netns/test"}],
               "ips":[ip],"routes":[{"dst":"0.0.0.0/0"}],"dns":{"nameservers":["10.1.0.1"]}})
        .to_string()
    }

    pub const VERSIONS: [&str; 5] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];
}

mod add {
    use super::harness::*;
    use serde_json::{json, Value};
    use std::time::{Duration, Instant};

    #[test]
    fn refuses_while_the_delegate_is_missing() {
        let fx = Fx::new();
        fx.plugin("multus-shim");
        let r = fx.run("ADD", &fx.guard("1.0.0", json!({})));
        let e = r.error(11);
        assert!(
            e["msg"]
                .as_str()
                .unwrap()
                .contains(fx.delegate_path().to_str().unwrap()),
            "{e}"
        );
        assert!(e["msg"].as_str().unwrap().contains("does not exist"), "{e}");
        assert_eq!(e["cniVersion"], "1.0.0");
        assert!(fx.calls().is_empty());
        assert!(fx.cache_files().is_empty());
    }

    /// `delegateWriter` names who writes the delegate's file in the refusal while it is missing
    /// (ADD 11, STATUS 50); once it is there the delegate runs as without the key.
    #[test]
    fn a_missing_delegate_refusal_names_its_writer() {
        let fx = Fx::new();
        fx.plugin("multus-shim");
        fx.answer("multus-shim", "ADD", &result("1.1.0", "10.1.0.2/24"), 0);
        let conf = fx.guard("1.1.0", json!({"delegateWriter": "Multus"}));
        let want = format!(
            "cni-guard: network not ready: delegate {} does not exist (written by Multus)",
            fx.delegate_path().display()
        );
        let e = fx.run("ADD", &conf).error(11);
        assert_eq!(e["msg"], want.as_str(), "{e}");
        let status = fx.run_env(
            "STATUS",
            &conf,
            &[
                ("CNI_CONTAINERID", None),
                ("CNI_IFNAME", None),
                ("CNI_NETNS", None),
            ],
        );
        assert_eq!(status.error(50)["msg"], want.as_str());
        assert!(fx.calls().is_empty());
        // Without the key the words are as before: nothing about a writer.
        let plain = fx.run("ADD", &fx.guard("1.1.0", json!({}))).error(11);
        assert!(
            plain["msg"].as_str().unwrap().ends_with("does not exist"),
            "{plain}"
        );
        // A writer's name that would break the one-line refusal is a configuration error.
        let bad = fx.guard("1.1.0", json!({"delegateWriter": "Multus\nother"}));
        let e = fx.run("ADD", &bad).error(7);
        assert!(e["msg"].as_str().unwrap().contains("delegateWriter"), "{e}");
        // The writer wrote it.
        fx.delegate("multus-shim", "1.1.0");
        fx.run("ADD", &conf).ok();
        assert_eq!(fx.calls(), ["multus-shim ADD"]);
    }

    #[test]
    fn refuses_at_once_while_a_required_socket_is_dead_and_names_it() {
        let fx = Fx::new();
        fx.plugin("multus-shim");
        fx.delegate("multus-shim", "1.0.0");
        fx.answer("multus-shim", "ADD", &result("1.0.0", "10.1.0.2/24"), 0);
        let sock = fx.path("multus.sock");
        let conf = fx.guard("1.1.0", json!({"sockets": [sock]}));
        // The daemon was SIGKILLed: its socket file stays, nothing listens.
        drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
        let start = Instant::now();
        let e = fx.run("ADD", &conf).error(11);
        let msg = e["msg"].as_str().unwrap();
        assert!(
            msg.contains("socket") && msg.contains("multus.sock") && msg.contains("refused"),
            "{e}"
        );
        assert!(start.elapsed() < Duration::from_secs(5));
        assert!(fx.calls().is_empty());
        let e = fx.run("STATUS", &conf).error(50);
        assert!(e["msg"].as_str().unwrap().contains("multus.sock"), "{e}");
        // The daemon is back.
        std::fs::remove_file(&sock).unwrap();
        let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        fx.run("ADD", &conf).ok();
        assert_eq!(fx.calls(), ["multus-shim ADD"]);
    }

    /// A daemon binds its socket and listens a moment later: bind raises an inotify event,
    /// listen none, so ADD must re-poll a socket that exists but refuses, not sleep its whole
    /// `waitSeconds`.
    #[test]
    fn a_socket_bound_before_it_listens_is_re_polled() {
        use std::os::fd::AsRawFd;
        let fx = Fx::new();
        fx.plugin("multus-shim");
        fx.delegate("multus-shim", "1.0.0");
        fx.answer("multus-shim", "ADD", &result("1.0.0", "10.1.0.2/24"), 0);
        let sock = fx.path("multus.sock");
        let conf = fx.guard("1.1.0", json!({"sockets": [sock], "waitSeconds": 30}));
        let daemon = {
            let sock = sock.clone();
            std::thread::spawn(move || {
                use nix::sys::socket::{
                    bind, listen, socket, AddressFamily, Backlog, SockFlag, SockType, UnixAddr,
                };
                // Let the guard start waiting on a missing socket first.
                std::thread::sleep(Duration::from_millis(300));
                let fd = socket(
                    AddressFamily::Unix,
                    SockType::Stream,
                    SockFlag::empty(),
                    None,
                )
                .unwrap();
                bind(fd.as_raw_fd(), &UnixAddr::new(&sock).unwrap()).unwrap();
                std::thread::sleep(Duration::from_millis(300));
                listen(&fd, Backlog::new(8).unwrap()).unwrap();
                // Keep it open until the guard is done.
                std::thread::sleep(Duration::from_secs(20));
                drop(fd);
            })
        };
        let start = Instant::now();
        fx.run("ADD", &conf).ok();
        let took = start.elapsed();
        assert!(
            took < Duration::from_secs(15),
            "ADD took {took:?} of its 30 s wait: a bound-then-listening socket was not re-polled"
        );
        assert_eq!(fx.calls(), ["multus-shim ADD"]);
        drop(daemon);
    }

    #[test]
    fn refuses_a_half_written_delegate() {
        let fx = Fx::new();
        fx.plugin("multus-shim");
        std::fs::write(
            fx.delegate_path(),
            r#"{"cniVersion":"1.0.0","name":"multus-net","ty"#,
        )
        .unwrap();
        let e = fx.run("ADD", &fx.guard("1.0.0", json!({}))).error(11);
        assert!(e["msg"].as_str().unwrap().contains("not valid JSON"), "{e}");
        assert!(fx.calls().is_empty());
    }

    /// A delegate file that is whole but that no wait can make usable (a cniVersion the guard
    /// cannot run, a type that is no file name): a misconfiguration of whoever writes it, code
    /// 7 at once, saying so; not 11 after the wait.
    #[test]
    fn refuses_a_delegate_waiting_cannot_fix_with_code_7_at_once() {
        let fx = Fx::new();
        fx.plugin("multus-shim");
        let conf = fx.guard(
            "1.0.0",
            json!({"waitSeconds": 3, "delegateWriter": "Multus"}),
        );
        for (body, says) in [
            (
                json!({"cniVersion":"9.9.9","name":"m","type":"multus-shim"}),
                "cniVersion",
            ),
            (
                json!({"cniVersion":"1.0.0","name":"m","type":"../multus-shim"}),
                "type",
            ),
        ] {
            fx.file("net.d/00-multus.conf", &body);
            let start = Instant::now();
            let e = fx.run("ADD", &conf).error(7);
            assert!(start.elapsed() < Duration::from_secs(2), "{e}");
            let msg = e["msg"].as_str().unwrap();
            assert!(
                msg.contains(says) && msg.contains("written by Multus"),
                "{e}"
            );
        }
        assert!(fx.calls().is_empty());
    }

    #[test]
    fn refuses_a_missing_attachment_and_a_missing_plugin_binary() {
        let fx = Fx::new();
        fx.plugin("multus-shim");
        fx.delegate("multus-shim", "1.0.0");
        let att = fx.path("net.d/05-cilium.conflist");
        let conf = fx.guard("1.0.0", json!({"attachments":[att]}));
        let e = fx.run("ADD", &conf).error(11);
        assert!(
            e["msg"].as_str().unwrap().contains(att.to_str().unwrap()),
            "{e}"
        );

        fx.file(
            "net.d/05-cilium.conflist",
            &json!({"cniVersion":"1.0.0","name":"cilium","plugins":[{"type":"cilium-cni"}]}),
        );
        let e = fx.run("ADD", &conf).error(11);
        assert!(e["msg"].as_str().unwrap().contains("\"cilium-cni\""), "{e}");
        assert!(
            e["msg"].as_str().unwrap().contains("not in CNI_PATH"),
            "{e}"
        );
        assert!(fx.calls().is_empty());
        assert!(fx.cache_files().is_empty());
    }

    #[test]
    fn refuses_recursion_with_code_7() {
        let fx = Fx::new();
        fx.plugin("cni-guard");
        fx.delegate("cni-guard", "1.0.0");
        let e = fx.run("ADD", &fx.guard("1.0.0", json!({}))).error(7);
        assert!(e["msg"].as_str().unwrap().contains("itself"), "{e}");
        // Through a conflist, and with a wait configured: no waiting on a configuration error.
        let list = fx.file(
            "net.d/00-list.conflist",
            &json!({"cniVersion":"1.0.0","name":"l","plugins":[{"type":"bridge"},{"type":"cni-guard"}]}),
        );
        let start = Instant::now();
        fx.run(
            "ADD",
            &fx.guard("1.0.0", json!({"delegate": list, "waitSeconds": 30})),
        )
        .error(7);
        assert!(start.elapsed() < Duration::from_secs(30));
        assert!(fx.calls().is_empty());
    }

    /// Multus thick with `multusConfigFile: auto` and its auto-config folder equal to the conf
    /// dir elected the guard's own file as its cluster network after a restart: refused at once
    /// as recursion (code 7) naming clusterNetwork, nothing run, nothing recorded.
    #[test]
    fn refuses_a_multus_cluster_network_that_is_the_guard_with_code_7() {
        let fx = Fx::new();
        fx.plugin("multus-shim");
        let guard_file = fx.file(
            "net.d/00-cni-guard.conflist",
            &json!({"cniVersion":"1.0.0","name":"cni-guard","plugins":[
                {"type":"cni-guard","delegate": fx.delegate_path()}]}),
        );
        fx.file(
            "net.d/00-multus.conf",
            &json!({"cniVersion":"1.0.0","name":"multus-cni-network",
                "clusterNetwork":"/host/etc/cni/net.d/00-cni-guard.conflist",
                "type":"multus-shim","logToStderr":true,"daemonSocketDir":"/run/multus"}),
        );
        // The events file `keep` would own: counted as every recursion is, a code-7 `error`
        // (`cni_guard_refusals_total` counts codes 11 and 50 only).
        std::fs::create_dir(fx.cache()).unwrap();
        let events = fx.cache().join(".metrics-events");
        std::fs::write(&events, "").unwrap();

        let start = Instant::now();
        let conf = fx.guard("1.1.0", json!({"waitSeconds": 30}));
        let e = fx.run("ADD", &conf).error(7);
        assert!(start.elapsed() < Duration::from_secs(30), "waited");
        let msg = e["msg"].as_str().unwrap();
        let want = format!(
            "cni-guard is misconfigured: delegate {} has Multus's clusterNetwork \"/host/etc/cni/net.d/00-cni-guard.conflist\", which is a cni-guard configuration ({}): Multus would run the guard for the primary network; pin \"multusMasterCNI\"",
            fx.delegate_path().display(),
            guard_file.display()
        );
        assert!(msg.starts_with(&want), "{e}");
        assert!(fx.calls().is_empty(), "{:?}", fx.calls());
        assert_eq!(
            fx.cache_files(),
            std::slice::from_ref(&events),
            "nothing recorded"
        );
        assert_eq!(std::fs::read_to_string(&events).unwrap(), "add error -\n");

        // STATUS says the same; DEL after the refusal has nothing to undo and succeeds.
        let e = fx
            .run_env(
                "STATUS",
                &conf,
                &[
                    ("CNI_CONTAINERID", None),
                    ("CNI_IFNAME", None),
                    ("CNI_NETNS", None),
                ],
            )
            .error(7);
        assert!(e["msg"].as_str().unwrap().contains("clusterNetwork"), "{e}");
        fx.run("DEL", &conf).ok();
        assert!(fx.calls().is_empty(), "{:?}", fx.calls());

        // Pinned to the primary network (multusMasterCNI): ADD runs Multus.
        fx.file(
            "net.d/00-multus.conf",
            &json!({"cniVersion":"1.0.0","name":"multus-cni-network",
                "clusterNetwork":"/host/etc/cni/net.d/05-cilium.conflist","type":"multus-shim"}),
        );
        fx.answer("multus-shim", "ADD", &result("1.0.0", "10.1.0.5/24"), 0);
        fx.run("ADD", &conf).ok();
        assert_eq!(fx.calls(), ["multus-shim ADD"]);
    }

    #[test]
    fn execs_a_same_version_delegate_and_returns_its_exact_result() {
        let fx = Fx::new();
        fx.plugin("multus-shim");
        fx.delegate("multus-shim", "1.0.0");
        // Deliberately unusual formatting: the reply must be the delegate's bytes, unparsed.
        let out = "{ \"cniVersion\": \"1.0.0\",  \"ips\": [{\"address\": \"10.1.0.5/24\"}], \"x-extra\": 1 }\n";
        fx.answer("multus-shim", "ADD", out, 0);
        let r = fx.run_env(
            "ADD",
            &fx.guard("1.0.0", json!({})),
            &[("CNI_ARGS", Some("K8S_POD_NAME=p;IgnoreUnknown=1"))],
        );
        r.ok();
        assert_eq!(r.stdout, out);
        assert_eq!(fx.calls(), ["multus-shim ADD"]);
        let got = fx.received("multus-shim", "ADD");
        assert_eq!(
            got["name"], "multus-net",
            "the delegate runs under its own name"
        );
        assert_eq!(got["cniVersion"], "1.0.0");
        let env = fx.received_env("multus-shim", "ADD");
        for want in [
            "CNI_ARGS=K8S_POD_NAME=p;IgnoreUnknown=1",
            "CNI_CONTAINERID=ctr1",
            "CNI_IFNAME=eth0",
            "CNI_NETNS=/run/netns/test",
            "CNI_COMMAND=ADD",
        ] {
            assert!(env.contains(want), "{want} in {env}");
        }
        assert!(r.stderr.contains("decision=exec"), "{}", r.stderr);
        let files = fx.cache_files();
        assert_eq!(files.len(), 1);
        assert!(files[0].ends_with("guarded/ctr1:eth0.json"));
    }

    #[test]
    fn passes_a_delegate_error_through_unchanged() {
        let fx = Fx::new();
        fx.plugin("multus-shim");
        fx.delegate("multus-shim", "0.4.0");
        let err = r#"{"cniVersion":"0.4.0","code":117,"msg":"multus: cannot reach daemon","details":"dial unix"}"#;
        fx.answer("multus-shim", "ADD", err, 1);
        // Different versions: the child path, which reads the error and passes it on as-is.
        let r = fx.run("ADD", &fx.guard("1.0.0", json!({})));
        r.error(117);
        assert_eq!(r.stdout, err);
        // Same version: the exec path.
        let fx2 = Fx::new();
        fx2.plugin("multus-shim");
        fx2.delegate("multus-shim", "0.4.0");
        fx2.answer("multus-shim", "ADD", err, 1);
        let r = fx2.run("ADD", &fx2.guard("0.4.0", json!({})));
        assert_eq!(r.stdout, err);
        assert_eq!(r.status, 1);
    }

    #[test]
    fn converts_between_every_pair_of_versions() {
        for guard_v in VERSIONS {
            for delegate_v in VERSIONS {
                let fx = Fx::new();
                fx.plugin("bridge");
                fx.delegate("bridge", delegate_v);
                fx.answer("bridge", "ADD", &result(delegate_v, "10.1.0.7/24"), 0);
                let r = fx.run("ADD", &fx.guard(guard_v, json!({})));
                r.ok();
                let v = r.json();
                assert_eq!(v["cniVersion"], guard_v, "{guard_v} <- {delegate_v}: {v}");
                assert_eq!(v["ips"][0]["address"], "10.1.0.7/24");
                assert_eq!(v["interfaces"][0]["name"], "eth0");
                let has_version = v["ips"][0].get("version").is_some();
                assert_eq!(
                    has_version,
                    guard_v.starts_with("0."),
                    "{guard_v} <- {delegate_v}: {v}"
                );
                assert_eq!(fx.received("bridge", "ADD")["cniVersion"], delegate_v);
            }
        }
    }

    #[test]
    fn converts_a_020_delegate_result() {
        let fx = Fx::new();
        fx.plugin("old");
        fx.delegate("old", "0.2.0");
        fx.answer(
            "old",
            "ADD",
            r#"{"cniVersion":"0.2.0","ip4":{"ip":"10.2.0.3/16","gateway":"10.2.0.1"}}"#,
            0,
        );
        let v = fx.run("ADD", &fx.guard("1.0.0", json!({}))).ok().json();
        assert_eq!(
            v["ips"],
            json!([{"address":"10.2.0.3/16","gateway":"10.2.0.1"}])
        );
    }

    #[test]
    fn runs_a_conflist_threading_prev_result() {
        let fx = Fx::new();
        for t in ["bridge", "tuning", "portmap"] {
            fx.plugin(t);
        }
        let list = fx.file(
            "net.d/10-chain.conflist",
            &json!({"cniVersion":"1.0.0","name":"chain","plugins":[
                {"type":"bridge"},{"type":"tuning"},
                {"type":"portmap","capabilities":{"portMappings":true}}]}),
        );
        fx.answer("bridge", "ADD", &result("1.0.0", "10.1.0.2/24"), 0);
        fx.answer("tuning", "ADD", &result("1.0.0", "10.1.0.3/24"), 0);
        fx.answer("portmap", "ADD", &result("1.0.0", "10.1.0.4/24"), 0);
        let conf = fx.guard(
            "1.0.0",
            json!({"delegate": list, "runtimeConfig": {"portMappings":[{"hostPort":8080,"containerPort":80,"protocol":"tcp"}],
                   "bandwidth":{"ingressRate":1}}}),
        );
        let v = fx.run("ADD", &conf).ok().json();
        assert_eq!(fx.calls(), ["bridge ADD", "tuning ADD", "portmap ADD"]);
        assert!(fx.received("bridge", "ADD").get("prevResult").is_none());
        assert_eq!(
            fx.received("tuning", "ADD")["prevResult"]["ips"][0]["address"],
            "10.1.0.2/24"
        );
        assert_eq!(
            fx.received("portmap", "ADD")["prevResult"]["ips"][0]["address"],
            "10.1.0.3/24"
        );
        assert_eq!(v["ips"][0]["address"], "10.1.0.4/24");
        // runtimeConfig only for declared capabilities, only the declared keys.
        assert!(fx.received("bridge", "ADD").get("runtimeConfig").is_none());
        assert_eq!(
            fx.received("portmap", "ADD")["runtimeConfig"],
            json!({"portMappings":[{"hostPort":8080,"containerPort":80,"protocol":"tcp"}]})
        );
        for t in ["bridge", "tuning", "portmap"] {
            assert_eq!(fx.received(t, "ADD")["name"], "chain");
        }
    }

    #[test]
    fn rolls_back_a_failed_conflist_in_reverse() {
        let fx = Fx::new();
        for t in ["bridge", "tuning", "portmap"] {
            fx.plugin(t);
        }
        let list = fx.file(
            "net.d/10-chain.conflist",
            &json!({"cniVersion":"1.0.0","name":"chain","plugins":[{"type":"bridge"},{"type":"tuning"},{"type":"portmap"}]}),
        );
        fx.answer("bridge", "ADD", &result("1.0.0", "10.1.0.2/24"), 0);
        let err = r#"{"cniVersion":"1.0.0","code":104,"msg":"tuning: sysctl refused"}"#;
        fx.answer("tuning", "ADD", err, 1);
        let r = fx.run("ADD", &fx.guard("1.0.0", json!({"delegate": list})));
        r.error(104);
        assert_eq!(r.stdout, err);
        assert_eq!(
            fx.calls(),
            ["bridge ADD", "tuning ADD", "tuning DEL", "bridge DEL"]
        );
        assert!(
            fx.cache_files().is_empty(),
            "record removed after a clean rollback"
        );
    }

    #[test]
    fn treats_an_error_printed_with_status_0_as_an_error() {
        let fx = Fx::new();
        fx.plugin("bridge");
        fx.delegate("bridge", "0.4.0");
        fx.answer(
            "bridge",
            "ADD",
            r#"{"cniVersion":"0.4.0","code":11,"msg":"later"}"#,
            0,
        );
        fx.run("ADD", &fx.guard("1.0.0", json!({}))).error(11);
        assert_eq!(fx.calls(), ["bridge ADD", "bridge DEL"]);
    }

    #[test]
    fn crashing_or_garbage_delegates_give_code_999() {
        for (out, rc, signal) in [("not json", 0, None), ("", 2, None), ("", 0, Some("KILL"))] {
            let fx = Fx::new();
            fx.plugin("bridge");
            fx.delegate("bridge", "0.4.0");
            fx.answer("bridge", "ADD", out, rc);
            if let Some(s) = signal {
                std::fs::write(fx.path("fake/bridge.ADD.signal"), s).unwrap();
            }
            fx.run("ADD", &fx.guard("1.0.0", json!({}))).error(999);
        }
    }

    #[test]
    fn waits_for_the_delegate_to_be_renamed_into_place() {
        let fx = Fx::new();
        fx.plugin("multus-shim");
        fx.answer("multus-shim", "ADD", &result("1.0.0", "10.1.0.9/24"), 0);
        let tmp = fx.path("net.d/.00-multus.conf.new");
        let dst = fx.delegate_path();
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            std::fs::write(
                &tmp,
                r#"{"cniVersion":"1.0.0","name":"multus-net","type":"multus-shim"}"#,
            )
            .unwrap();
            std::fs::rename(&tmp, &dst).unwrap();
        });
        let r = fx.run("ADD", &fx.guard("1.0.0", json!({"waitSeconds": 20})));
        writer.join().unwrap();
        r.ok();
        assert_eq!(r.json()["ips"][0]["address"], "10.1.0.9/24");
    }

    #[test]
    fn waits_no_less_than_asked_then_refuses() {
        let fx = Fx::new();
        let start = Instant::now();
        fx.run("ADD", &fx.guard("1.0.0", json!({"waitSeconds": 0.4})))
            .error(11);
        assert!(start.elapsed() >= Duration::from_millis(400));
    }

    #[test]
    fn guard_args_reach_the_delegate() {
        let fx = Fx::new();
        fx.plugin("bridge");
        fx.file(
            "net.d/00-multus.conf",
            &json!({"cniVersion":"1.0.0","name":"n","type":"bridge","args":{"own":1}}),
        );
        fx.answer("bridge", "ADD", &result("1.0.0", "10.1.0.2/24"), 0);
        fx.run(
            "ADD",
            &fx.guard("1.0.0", json!({"args":{"cni":{"ips":["10.1.0.2"]}}})),
        )
        .ok();
        let got: Value = fx.received("bridge", "ADD");
        assert_eq!(got["args"], json!({"own":1,"cni":{"ips":["10.1.0.2"]}}));
    }
}

mod del {
    use super::harness::*;
    use serde_json::json;
    use std::time::{Duration, Instant};

    /// A multus-shim ADD recorded under the guard `keys` make, then its delegate gone (Multus
    /// stopped): the conf to run DEL with.
    fn recorded_then_delegate_gone(fx: &Fx, keys: serde_json::Value) -> serde_json::Value {
        fx.plugin("multus-shim");
        fx.delegate("multus-shim", "1.0.0");
        fx.answer("multus-shim", "ADD", &result("1.0.0", "10.1.0.2/24"), 0);
        let conf = fx.guard("1.0.0", keys);
        fx.run("ADD", &conf).ok();
        std::fs::remove_file(fx.delegate_path()).unwrap();
        conf
    }

    /// Multus back 400 ms from now, writing `conf` as its delegate file; the thread answers when.
    fn delegate_back_soon(fx: &Fx, conf: &'static str) -> std::thread::JoinHandle<Instant> {
        let dst = fx.delegate_path();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(400));
            let now = Instant::now();
            std::fs::write(&dst, conf).unwrap();
            now
        })
    }

    /// multus-shim answers a DEL with success even when its daemon is not there to run it: a
    /// recorded DEL of the delegate the guard fronts waits for that delegate to be back (up to
    /// waitSeconds), then replays what was recorded.
    #[test]
    fn a_recorded_del_waits_for_the_delegate_to_come_back() {
        let fx = Fx::new();
        let conf = recorded_then_delegate_gone(&fx, json!({"waitSeconds": 20}));
        // Multus back, with a file of its own: the DEL still replays the record.
        let back = delegate_back_soon(
            &fx,
            r#"{"cniVersion":"1.0.0","name":"multus-net","type":"multus-shim","socketDir":"/new"}"#,
        );
        let start = Instant::now();
        let r = fx.run("DEL", &conf);
        let (took, done_at) = (start.elapsed(), Instant::now());
        let back_at = back.join().unwrap();
        r.ok();
        assert!(
            took >= Duration::from_millis(400),
            "the DEL did not wait: {took:?}"
        );
        assert!(
            done_at >= back_at,
            "the DEL ended before the delegate was back"
        );
        assert_eq!(fx.calls(), ["multus-shim ADD", "multus-shim DEL"]);
        let sent = fx.received("multus-shim", "DEL");
        assert!(
            sent.get("socketDir").is_none(),
            "not the recorded delegate: {sent}"
        );
        assert!(fx.cache_files().is_empty());
    }

    /// Never refused: a delegate still away after the wait gets its recorded DEL all the same.
    #[test]
    fn a_recorded_del_runs_after_the_wait_if_the_delegate_stays_away() {
        let fx = Fx::new();
        recorded_then_delegate_gone(&fx, json!({}));
        let start = Instant::now();
        let r = fx.run("DEL", &fx.guard("1.0.0", json!({"waitSeconds": 0.5})));
        r.ok();
        assert!(start.elapsed() >= Duration::from_millis(500));
        assert_eq!(fx.calls(), ["multus-shim ADD", "multus-shim DEL"]);
        assert!(
            r.stderr.contains("still not ready after the wait"),
            "{}",
            r.stderr
        );
        assert!(fx.cache_files().is_empty());
    }

    /// DEL's wait is its own: a guard that refuses ADD at once (waitSeconds 0) still waits, on
    /// DEL, for the delegate it fronts, up to delWaitSeconds.
    #[test]
    fn a_recorded_del_waits_del_wait_seconds_whatever_add_waits() {
        let fx = Fx::new();
        let conf =
            recorded_then_delegate_gone(&fx, json!({"waitSeconds": 0, "delWaitSeconds": 20}));
        // ADD's wait is 0: another sandbox is refused at once.
        fx.run_env("ADD", &conf, &[("CNI_CONTAINERID", Some("ctr2"))])
            .error(11);
        let back = delegate_back_soon(
            &fx,
            r#"{"cniVersion":"1.0.0","name":"m","type":"multus-shim"}"#,
        );
        let r = fx.run("DEL", &conf);
        let done_at = Instant::now();
        let back_at = back.join().unwrap();
        r.ok();
        assert!(done_at >= back_at, "the DEL did not wait for the delegate");
        assert!(!r.stderr.contains("still not ready"), "{}", r.stderr);
        assert_eq!(fx.calls(), ["multus-shim ADD", "multus-shim DEL"]);
        assert!(fx.cache_files().is_empty());
    }

    /// delWaitSeconds 0: the recorded DEL runs at once although ADD would wait.
    #[test]
    fn del_wait_seconds_zero_replays_at_once() {
        let fx = Fx::new();
        let conf =
            recorded_then_delegate_gone(&fx, json!({"waitSeconds": 600, "delWaitSeconds": 0}));
        let r = fx.run("DEL", &conf);
        r.ok();
        assert!(
            r.stderr.contains("still not ready after the wait"),
            "{}",
            r.stderr
        );
        assert_eq!(fx.calls(), ["multus-shim ADD", "multus-shim DEL"]);
        assert!(fx.cache_files().is_empty());
    }

    /// A recorded multus-shim ADD, the delegate there: the conf to run DEL with. The next DEL
    /// of multus-shim runs `once` (a shell script) inside it, as its daemon's shutdown would
    /// happen while the DEL is inside the daemon.
    fn recorded_with_del_hook(fx: &Fx, keys: serde_json::Value, once: &str) -> serde_json::Value {
        fx.plugin("multus-shim");
        fx.delegate("multus-shim", "1.0.0");
        fx.answer("multus-shim", "ADD", &result("1.0.0", "10.1.0.2/24"), 0);
        let conf = fx.guard("1.0.0", keys);
        fx.run("ADD", &conf).ok();
        std::fs::write(fx.path("fake/multus-shim.DEL.once"), once).unwrap();
        conf
    }

    /// Waits (at most 20 s) until `what` holds.
    fn until(what: impl Fn() -> bool) {
        let end = Instant::now() + Duration::from_secs(20);
        while !what() {
            assert!(Instant::now() < end, "timed out waiting");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Multus stopped while the DEL was inside its daemon: the daemon removed its file and the
    /// shim answered success for a DEL nobody finished. The guard does not trust that run: it
    /// waits for the delegate to come back and runs the recorded DEL again, then removes the
    /// record.
    #[test]
    fn a_del_whose_delegate_went_away_mid_run_runs_again_once_it_is_back() {
        let fx = Fx::new();
        let file = fx.delegate_path();
        let once = format!("rm -f '{}'\n", file.display());
        let conf = recorded_with_del_hook(&fx, json!({"waitSeconds": 20}), &once);
        let back = {
            let file = file.clone();
            std::thread::spawn(move || {
                until(|| !file.exists());
                std::thread::sleep(Duration::from_millis(300));
                std::fs::write(
                    &file,
                    r#"{"cniVersion":"1.0.0","name":"m","type":"multus-shim"}"#,
                )
                .unwrap();
                Instant::now()
            })
        };
        let r = fx.run("DEL", &conf);
        let done_at = Instant::now();
        let back_at = back.join().unwrap();
        r.ok();
        assert!(
            done_at >= back_at,
            "the DEL ended before the delegate was back"
        );
        assert_eq!(
            fx.calls(),
            ["multus-shim ADD", "multus-shim DEL", "multus-shim DEL"]
        );
        assert!(
            r.stderr
                .contains("went away while its DEL ran (its file was removed)")
                && r.stderr.contains("decision=deleted-recorded")
                && r.stderr.contains("reran=1"),
            "{}",
            r.stderr
        );
        // The run again is the recorded DEL, not the file that came back.
        assert_eq!(fx.received("multus-shim", "DEL")["name"], "multus-net");
        assert!(fx.cache_files().is_empty());
    }

    /// A delegate file replaced during the run by another configuration (a daemon that restarted
    /// with another one): the delegate is ready at once, and the DEL runs again at once. The
    /// same configuration written again (a daemon regenerating its file) is the same delegate:
    /// that run is trusted.
    #[test]
    fn a_del_whose_delegate_was_replaced_mid_run_runs_again_at_once() {
        for (other, reruns) in [(true, 1), (false, 0)] {
            let fx = Fx::new();
            let file = fx.delegate_path();
            let body = match other {
                true => r#"{"cniVersion":"1.0.0","name":"multus-net","type":"multus-shim","x":1}"#,
                false => r#"{"cniVersion":"1.0.0","name":"multus-net","type":"multus-shim"}"#,
            };
            let once = format!(
                "printf '%s' '{body}' > '{f}.new' && mv '{f}.new' '{f}'\n",
                f = file.display()
            );
            let conf = recorded_with_del_hook(&fx, json!({"waitSeconds": 20}), &once);
            let r = fx.run("DEL", &conf);
            r.ok();
            let dels = fx
                .calls()
                .iter()
                .filter(|c| *c == "multus-shim DEL")
                .count();
            assert_eq!(dels, 1 + reruns, "other={other}: {:?}", fx.calls());
            assert_eq!(
                r.stderr.contains("(its file was replaced)"),
                other,
                "{}",
                r.stderr
            );
            assert!(fx.cache_files().is_empty());
        }
    }

    /// Not back within the DEL's budget: the DEL fails with 11 and the record stays, so the
    /// runtime's retry tears the attachment down once the delegate is back.
    #[test]
    fn a_del_whose_delegate_stays_away_fails_retryably_and_keeps_the_record() {
        let fx = Fx::new();
        let file = fx.delegate_path();
        let once = format!("rm -f '{}'\n", file.display());
        let keys =
            json!({"lockWaitSeconds": 0, "delWaitSeconds": 0.5, "delegateTimeoutSeconds": 2});
        let conf = recorded_with_del_hook(&fx, keys, &once);
        let start = Instant::now();
        let e = fx.run("DEL", &conf).error(11);
        let took = start.elapsed();
        let msg = e["msg"].as_str().unwrap();
        assert!(
            msg.contains("went away while its DEL ran (its file was removed)")
                && msg.contains("not torn down for sure"),
            "{e}"
        );
        // It waited for the delegate, within the budget (0 + 0.5 + 2 s).
        assert!(
            took >= Duration::from_millis(1500) && took < Duration::from_secs(10),
            "{took:?}"
        );
        assert_eq!(fx.cache_files().len(), 1);
        // The runtime's retry, the delegate back: torn down from the record.
        fx.delegate("multus-shim", "1.0.0");
        fx.run("DEL", &conf).ok();
        assert_eq!(
            fx.calls(),
            ["multus-shim ADD", "multus-shim DEL", "multus-shim DEL"]
        );
        assert!(fx.cache_files().is_empty());
    }

    /// With per-pod awareness the DEL does not wait for a delegate that went away: waiting in
    /// the runtime would hold every pod start on the node (plain pods' too) behind it. It fails
    /// at once with 11, keeping the record, for the runtime's retry.
    #[test]
    fn with_per_pod_awareness_a_del_whose_delegate_went_away_fails_at_once() {
        let fx = Fx::new();
        let once = format!("rm -f '{}'\n", fx.delegate_path().display());
        let keys = json!({"waitSeconds": 20, "perPodPrimary": fx.path("primary.conflist")});
        let conf = recorded_with_del_hook(&fx, keys, &once);
        let start = Instant::now();
        let e = fx.run("DEL", &conf).error(11);
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
        assert!(
            e["msg"].as_str().unwrap().contains(
                "went away while its DEL ran (its file was removed): not torn down for sure"
            ),
            "{e}"
        );
        assert_eq!(fx.calls(), ["multus-shim ADD", "multus-shim DEL"]);
        assert_eq!(fx.cache_files().len(), 1, "the record stays");
    }

    /// A delegate that goes away during every run (its file replaced by another configuration
    /// each time) is run again at most ten times, then the DEL fails with 11, keeping the
    /// record: never a loop until the budget ends.
    #[test]
    fn a_delegate_that_goes_away_during_every_run_is_run_again_ten_times() {
        let fx = Fx::new();
        let file = fx.delegate_path();
        let count = fx.path("fake/count");
        // Re-arms itself for the next call, and writes the file with other bytes each time.
        let once = format!(
            "n=$(( $(cat '{c}' 2>/dev/null || echo 0) + 1 )); echo $n > '{c}'\n\
             printf '{{\"cniVersion\":\"1.0.0\",\"name\":\"multus-net\",\"type\":\"multus-shim\",\"n\":%s}}' $n > '{f}.new' && mv '{f}.new' '{f}'\n\
             cp \"$0\" \"${{0%.ran}}.once\"\n",
            c = count.display(),
            f = file.display()
        );
        let conf = recorded_with_del_hook(&fx, json!({"waitSeconds": 20}), &once);
        let start = Instant::now();
        let e = fx.run("DEL", &conf).error(11);
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "{:?}",
            start.elapsed()
        );
        let msg = e["msg"].as_str().unwrap();
        assert!(
            msg.contains("went away while its DEL ran (its file was replaced)")
                && msg.contains("not torn down for sure"),
            "{e}"
        );
        let dels = fx
            .calls()
            .iter()
            .filter(|c| *c == "multus-shim DEL")
            .count();
        assert_eq!(dels, 11, "{:?}", fx.calls());
        assert_eq!(fx.cache_files().len(), 1, "the record stays");
    }

    /// The daemon's socket: gone during the run, or there and no longer accepting (a daemon
    /// that died with its file left). Either way the run is not trusted and runs again once
    /// the socket accepts again.
    #[test]
    fn a_del_whose_socket_went_away_mid_run_runs_again() {
        for removed in [true, false] {
            let fx = Fx::new();
            let sock = fx.path("multus.sock");
            let marker = fx.path("inside");
            let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
            let once = match removed {
                true => format!("rm -f '{}'\n", sock.display()),
                false => format!("touch '{}'; sleep 0.5\n", marker.display()),
            };
            let keys = json!({"waitSeconds": 20, "sockets": [sock]});
            let conf = recorded_with_del_hook(&fx, keys, &once);
            let daemon = {
                let (sock, marker) = (sock.clone(), marker.clone());
                std::thread::spawn(move || {
                    match removed {
                        true => until(|| !sock.exists()),
                        false => until(|| marker.exists()),
                    }
                    // The daemon stops (its socket file stays when it was not removed) ...
                    drop(listener);
                    std::thread::sleep(Duration::from_millis(800));
                    // ... and a new one listens.
                    let _ = std::fs::remove_file(&sock);
                    let l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
                    std::thread::sleep(Duration::from_secs(3));
                    drop(l);
                })
            };
            let r = fx.run("DEL", &conf);
            r.ok();
            let want = match removed {
                true => "removed",
                false => "no longer accepting connections",
            };
            assert!(
                r.stderr
                    .contains(&format!("socket {} {want}", sock.display())),
                "{}",
                r.stderr
            );
            assert_eq!(
                fx.calls(),
                ["multus-shim ADD", "multus-shim DEL", "multus-shim DEL"]
            );
            assert!(fx.cache_files().is_empty());
            daemon.join().unwrap();
        }
    }

    #[test]
    fn tears_down_with_the_recorded_delegate_after_it_is_gone() {
        let fx = Fx::new();
        fx.plugin("multus-shim");
        fx.plugin("other");
        fx.delegate("multus-shim", "1.0.0");
        fx.answer("multus-shim", "ADD", &result("1.0.0", "10.1.0.2/24"), 0);
        let conf = fx.guard("1.0.0", json!({}));
        fx.run("ADD", &conf).ok();
        std::fs::remove_file(fx.delegate_path()).unwrap();
        let mut del = conf.clone();
        del["prevResult"] = serde_json::from_str(&result("1.0.0", "10.1.0.2/24")).unwrap();
        fx.run("DEL", &del).ok();
        assert_eq!(fx.calls(), ["multus-shim ADD", "multus-shim DEL"]);
        assert_eq!(
            fx.received("multus-shim", "DEL")["prevResult"]["ips"][0]["address"],
            "10.1.0.2/24"
        );
        assert!(fx.cache_files().is_empty());
        // Idempotent: again, nothing to do, success.
        fx.run("DEL", &del).ok();
        assert_eq!(fx.calls().len(), 2);
    }

    #[test]
    fn uses_the_record_even_when_the_delegate_changed() {
        let fx = Fx::new();
        fx.plugin("multus-shim");
        fx.plugin("cilium-cni");
        fx.delegate("multus-shim", "1.0.0");
        fx.answer("multus-shim", "ADD", &result("1.0.0", "10.1.0.2/24"), 0);
        let conf = fx.guard("1.0.0", json!({}));
        fx.run("ADD", &conf).ok();
        fx.delegate("cilium-cni", "1.0.0");
        fx.run("DEL", &conf).ok();
        assert_eq!(fx.calls(), ["multus-shim ADD", "multus-shim DEL"]);
    }

    #[test]
    fn without_record_or_delegate_there_is_nothing_to_do() {
        let fx = Fx::new();
        let r = fx.run_env("DEL", &fx.guard("1.0.0", json!({})), &[("CNI_NETNS", None)]);
        r.ok();
        assert_eq!(r.stdout, "");
        assert!(fx.calls().is_empty());
        assert!(!fx.cache().exists(), "DEL creates no cache dir");
    }

    #[test]
    fn after_a_refusal_for_a_missing_binary_del_succeeds() {
        let fx = Fx::new();
        fx.delegate("ptp", "1.0.0");
        let conf = fx.guard("1.0.0", json!({}));
        fx.run("ADD", &conf).error(11);
        fx.run("DEL", &conf).ok();
        assert!(fx.calls().is_empty());
    }

    /// The runtime's DEL right after a refusal: the delegate's binary is there, but ADD refused
    /// (its daemon's socket is dead), so DEL must not call it, and says why in the log.
    #[test]
    fn after_a_refusal_for_a_dead_socket_del_runs_nothing_and_says_so() {
        let fx = Fx::new();
        fx.plugin("multus-shim");
        fx.delegate("multus-shim", "1.0.0");
        let sock = fx.path("multus.sock");
        let conf = fx.guard("1.0.0", json!({"sockets": [sock]}));
        fx.run("ADD", &conf).error(11);
        let r = fx.run("DEL", &conf);
        r.ok();
        assert!(fx.calls().is_empty(), "{:?}", fx.calls());
        assert!(
            r.stderr.contains("no record, and ADD would refuse now")
                && r.stderr.contains("multus.sock"),
            "{}",
            r.stderr
        );
        // A missing attachment, the same.
        let conf = fx.guard(
            "1.0.0",
            json!({"attachments": [fx.path("net.d/05-cilium.conflist")]}),
        );
        fx.run("ADD", &conf).error(11);
        fx.run("DEL", &conf).ok();
        assert!(fx.calls().is_empty(), "{:?}", fx.calls());
    }

    #[test]
    fn without_record_the_current_delegate_is_used() {
        let fx = Fx::new();
        fx.plugin("bridge");
        fx.delegate("bridge", "1.0.0");
        fx.run("DEL", &fx.guard("1.0.0", json!({}))).ok();
        assert_eq!(fx.calls(), ["bridge DEL"]);
    }

    #[test]
    fn a_failed_del_keeps_the_record_and_reports_the_error() {
        let fx = Fx::new();
        fx.plugin("bridge");
        fx.delegate("bridge", "1.0.0");
        fx.answer("bridge", "ADD", &result("1.0.0", "10.1.0.2/24"), 0);
        let conf = fx.guard("1.0.0", json!({}));
        fx.run("ADD", &conf).ok();
        fx.answer(
            "bridge",
            "DEL",
            r#"{"cniVersion":"1.0.0","code":5,"msg":"ipam store busy"}"#,
            1,
        );
        fx.run("DEL", &conf).error(5);
        assert_eq!(fx.cache_files().len(), 1);
        fx.answer("bridge", "DEL", "", 0);
        fx.run("DEL", &conf).ok();
        assert!(fx.cache_files().is_empty());
    }

    #[test]
    fn conflist_del_runs_in_reverse_with_converted_prev_result() {
        let fx = Fx::new();
        fx.plugin("bridge");
        fx.plugin("portmap");
        let list = fx.file(
            "net.d/05-cilium.conflist",
            &json!({"cniVersion":"0.4.0","name":"c","plugins":[{"type":"bridge"},{"type":"portmap"}]}),
        );
        let mut conf = fx.guard("1.0.0", json!({"delegate": list}));
        conf["prevResult"] = serde_json::from_str(&result("1.0.0", "10.1.0.2/24")).unwrap();
        fx.run("DEL", &conf).ok();
        assert_eq!(fx.calls(), ["portmap DEL", "bridge DEL"]);
        let prev = &fx.received("bridge", "DEL")["prevResult"];
        assert_eq!(prev["cniVersion"], "0.4.0");
        assert_eq!(prev["ips"][0]["version"], "4");
    }

    #[test]
    fn a_malformed_prev_result_does_not_stop_teardown() {
        let fx = Fx::new();
        fx.plugin("bridge");
        fx.delegate("bridge", "1.0.0");
        fx.answer("bridge", "ADD", &result("1.0.0", "10.1.0.2/24"), 0);
        let conf = fx.guard("1.0.0", json!({}));
        fx.run("ADD", &conf).ok();
        for prev in [
            json!({"ips":"x"}),
            json!({"ips":[{}]}),
            json!({"cniVersion":"x.y"}),
        ] {
            let mut del = conf.clone();
            del["prevResult"] = prev;
            let r = fx.run("DEL", &del);
            r.ok();
            assert!(r.stderr.contains("invalid prevResult"), "{}", r.stderr);
            assert!(fx.received("bridge", "DEL").get("prevResult").is_none());
        }
        assert_eq!(
            fx.calls(),
            ["bridge ADD", "bridge DEL", "bridge DEL", "bridge DEL"]
        );
        assert!(fx.cache_files().is_empty());
    }

    #[test]
    fn a_0_3_1_delegate_gets_no_prev_result_on_del() {
        let fx = Fx::new();
        fx.plugin("bridge");
        fx.delegate("bridge", "0.3.1");
        let mut conf = fx.guard("1.0.0", json!({}));
        conf["prevResult"] = serde_json::from_str(&result("1.0.0", "10.1.0.2/24")).unwrap();
        fx.run("DEL", &conf).ok();
        assert!(fx.received("bridge", "DEL").get("prevResult").is_none());
    }
}

mod check {
    use super::harness::*;
    use serde_json::json;

    fn with_prev(fx: &Fx, version: &str) -> serde_json::Value {
        let mut conf = fx.guard(version, json!({}));
        conf["prevResult"] = serde_json::from_str(&result(version, "10.1.0.2/24")).unwrap();
        conf
    }

    #[test]
    fn runs_the_delegate_check_with_prev_result() {
        let fx = Fx::new();
        fx.plugin("bridge");
        fx.delegate("bridge", "0.4.0");
        fx.run("CHECK", &with_prev(&fx, "1.0.0")).ok();
        assert_eq!(fx.calls(), ["bridge CHECK"]);
        let got = fx.received("bridge", "CHECK");
        assert_eq!(got["prevResult"]["cniVersion"], "0.4.0");
        assert_eq!(got["prevResult"]["ips"][0]["address"], "10.1.0.2/24");
        fx.answer(
            "bridge",
            "CHECK",
            r#"{"cniVersion":"0.4.0","code":110,"msg":"veth gone"}"#,
            1,
        );
        fx.run("CHECK", &with_prev(&fx, "1.0.0")).error(110);
    }

    #[test]
    fn missing_delegate_is_an_error() {
        let fx = Fx::new();
        let e = fx.run("CHECK", &with_prev(&fx, "1.0.0")).error(11);
        assert!(e["msg"]
            .as_str()
            .unwrap()
            .contains(fx.delegate_path().to_str().unwrap()));
    }

    #[test]
    fn skipped_for_old_delegates_and_disable_check() {
        let fx = Fx::new();
        fx.plugin("bridge");
        fx.delegate("bridge", "0.3.1");
        fx.run("CHECK", &with_prev(&fx, "1.0.0")).ok();
        let list = fx.file(
            "net.d/x.conflist",
            &json!({"cniVersion":"1.0.0","name":"c","disableCheck":true,"plugins":[{"type":"bridge"}]}),
        );
        let mut conf = with_prev(&fx, "1.0.0");
        conf["delegate"] = json!(list);
        fx.run("CHECK", &conf).ok();
        assert!(fx.calls().is_empty());
    }

    /// CHECK judges an attachment by the delegate recorded at its ADD, as DEL tears it down
    /// with it: not by whatever the delegate file says now, nor only while it is there.
    #[test]
    fn checks_with_the_delegate_recorded_at_add() {
        let fx = Fx::new();
        fx.plugin("first");
        fx.plugin("second");
        fx.answer("first", "ADD", &result("1.0.0", "10.1.0.5/24"), 0);
        fx.delegate("first", "1.0.0");
        fx.run("ADD", &fx.guard("1.0.0", json!({}))).ok();
        // The delegate file now names another plugin.
        fx.delegate("second", "1.0.0");
        fx.run("CHECK", &with_prev(&fx, "1.0.0")).ok();
        // And then it is gone.
        std::fs::remove_file(fx.delegate_path()).unwrap();
        fx.run("CHECK", &with_prev(&fx, "1.0.0")).ok();
        assert_eq!(fx.calls(), ["first ADD", "first CHECK", "first CHECK"]);
    }

    #[test]
    fn a_guard_before_0_4_0_has_no_check() {
        let fx = Fx::new();
        fx.plugin("bridge");
        fx.delegate("bridge", "0.3.1");
        fx.run("CHECK", &with_prev(&fx, "0.3.1")).error(1);
    }
}

mod status_and_gc {
    use super::harness::*;
    use serde_json::json;

    #[test]
    fn status_is_50_while_not_ready_and_forwards_when_ready() {
        let fx = Fx::new();
        fx.plugin("bridge");
        let conf = fx.guard("1.1.0", json!({"waitSeconds": 30}));
        let e = fx
            .run_env(
                "STATUS",
                &conf,
                &[
                    ("CNI_CONTAINERID", None),
                    ("CNI_IFNAME", None),
                    ("CNI_NETNS", None),
                ],
            )
            .error(50);
        assert!(e["msg"]
            .as_str()
            .unwrap()
            .contains(fx.delegate_path().to_str().unwrap()));
        fx.delegate("bridge", "1.0.0");
        fx.run("STATUS", &conf).ok();
        assert!(fx.calls().is_empty(), "a 1.0.0 delegate has no STATUS");
        fx.delegate("bridge", "1.1.0");
        fx.run("STATUS", &conf).ok();
        assert_eq!(fx.calls(), ["bridge STATUS"]);
        fx.answer(
            "bridge",
            "STATUS",
            r#"{"cniVersion":"1.1.0","code":50,"msg":"no daemon"}"#,
            1,
        );
        fx.run("STATUS", &conf).error(50);
    }

    #[test]
    fn status_needs_1_1_0() {
        let fx = Fx::new();
        fx.run("STATUS", &fx.guard("1.0.0", json!({}))).error(1);
        fx.run("GC", &fx.guard("1.0.0", json!({}))).error(1);
    }

    #[test]
    fn gc_forwards_and_removes_stale_records() {
        let fx = Fx::new();
        fx.plugin("bridge");
        fx.delegate("bridge", "1.1.0");
        fx.answer("bridge", "ADD", &result("1.1.0", "10.1.0.2/24"), 0);
        for id in ["keep1", "gone2"] {
            fx.run_env(
                "ADD",
                &fx.guard("1.1.0", json!({})),
                &[("CNI_CONTAINERID", Some(id))],
            )
            .ok();
        }
        std::fs::write(fx.cache().join("guarded/.gone2:eth0.json.tmp"), "{").unwrap();
        let valid = json!([{"containerID":"keep1","ifname":"eth0"}]);
        let conf = fx.guard("1.1.0", json!({"cni.dev/valid-attachments": valid}));
        fx.run_env(
            "GC",
            &conf,
            &[
                ("CNI_CONTAINERID", None),
                ("CNI_IFNAME", None),
                ("CNI_NETNS", None),
            ],
        )
        .ok();
        assert_eq!(
            fx.received("bridge", "GC")["cni.dev/valid-attachments"],
            valid
        );
        let files: Vec<String> = fx
            .cache_files()
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(files, ["keep1:eth0.json"]);
    }

    /// A `cacheDir` written with a trailing `/` is the same folder: ADD records there, GC sweeps
    /// there, DEL tears down from there, and a file there that is no record is left alone.
    #[test]
    fn a_cache_dir_with_a_trailing_slash_is_the_same_folder() {
        let fx = Fx::new();
        fx.plugin("bridge");
        fx.delegate("bridge", "1.1.0");
        fx.answer("bridge", "ADD", &result("1.1.0", "10.1.0.2/24"), 0);
        let slash = format!("{}/", fx.cache().display());
        let conf = fx.guard("1.1.0", json!({"cacheDir": slash}));
        for id in ["keep1", "gone2"] {
            fx.run_env("ADD", &conf, &[("CNI_CONTAINERID", Some(id))])
                .ok();
        }
        std::fs::write(fx.cache().join("guarded/notes.json"), "{}").unwrap();
        let mut gc = conf.clone();
        gc["cni.dev/valid-attachments"] = json!([{"containerID":"keep1","ifname":"eth0"}]);
        let none = [
            ("CNI_CONTAINERID", None),
            ("CNI_IFNAME", None),
            ("CNI_NETNS", None),
        ];
        fx.run_env("GC", &gc, &none).ok();
        fx.run_env("DEL", &conf, &[("CNI_CONTAINERID", Some("keep1"))])
            .ok();
        let files: Vec<String> = fx
            .cache_files()
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(files, ["notes.json"]);
        assert_eq!(
            fx.calls(),
            ["bridge ADD", "bridge ADD", "bridge GC", "bridge DEL"]
        );
    }

    /// A runtime that sends no attachment list tells the delegate nothing: neither key is
    /// invented (an empty list would tell it that nothing is valid), and no record is removed.
    #[test]
    fn gc_without_an_attachment_list_forwards_none() {
        let fx = Fx::new();
        fx.plugin("bridge");
        fx.delegate("bridge", "1.1.0");
        fx.answer("bridge", "ADD", &result("1.1.0", "10.1.0.2/24"), 0);
        fx.run("ADD", &fx.guard("1.1.0", json!({}))).ok();
        fx.run_env(
            "GC",
            &fx.guard("1.1.0", json!({})),
            &[
                ("CNI_CONTAINERID", None),
                ("CNI_IFNAME", None),
                ("CNI_NETNS", None),
            ],
        )
        .ok();
        let sent = fx.received("bridge", "GC");
        assert!(
            sent.get("cni.dev/valid-attachments").is_none()
                && sent.get("cni.dev/attachments").is_none(),
            "{sent}"
        );
        assert_eq!(fx.cache_files().len(), 1, "{:?}", fx.cache_files());
    }

    #[test]
    fn gc_with_the_spec_key_and_no_delegate() {
        let fx = Fx::new();
        fx.plugin("bridge");
        fx.delegate("bridge", "1.0.0");
        fx.answer("bridge", "ADD", &result("1.0.0", "10.1.0.2/24"), 0);
        fx.run("ADD", &fx.guard("1.1.0", json!({}))).ok();
        std::fs::remove_file(fx.delegate_path()).unwrap();
        fx.run("GC", &fx.guard("1.1.0", json!({"cni.dev/attachments": []})))
            .ok();
        assert!(fx.cache_files().is_empty());
    }
}

mod version {
    use super::harness::*;
    use serde_json::json;

    #[test]
    fn reports_every_supported_version() {
        let fx = Fx::new();
        for v in VERSIONS {
            let r = fx.run_env(
                "VERSION",
                &json!({"cniVersion": v}),
                &[("CNI_PATH", None), ("CNI_CONTAINERID", None)],
            );
            let reply = r.ok().json();
            assert_eq!(reply["cniVersion"], v);
            assert_eq!(reply["supportedVersions"], json!(VERSIONS));
        }
    }
}

/// Per-pod awareness (`perPodPrimary`): while Multus is away, a pod that asks for no Multus
/// network runs on the primary directly; a pod that needs Multus is refused (and waits, with
/// `waitSeconds`).
mod per_pod {
    use super::harness::*;
    use serde_json::{json, Value};
    use std::time::{Duration, Instant};

    const ANNOTATIONS: &str = "io.kubernetes.cri.pod-annotations";

    /// Multus (`multus-shim`, 1.0.0) as the delegate, Cilium's conflist (`cilium-cni` and
    /// `portmap` at 0.3.1, so run as children) as the primary; neither file written yet.
    fn fx() -> Fx {
        let fx = Fx::new();
        for t in ["multus-shim", "cilium-cni", "portmap"] {
            fx.plugin(t);
        }
        fx.answer("multus-shim", "ADD", &result("1.0.0", "10.1.0.2/24"), 0);
        fx.answer("cilium-cni", "ADD", &result("0.3.1", "10.2.0.7/24"), 0);
        fx.answer("portmap", "ADD", &result("0.3.1", "10.2.0.7/24"), 0);
        std::fs::create_dir(fx.path("multus")).unwrap();
        fx
    }

    fn primary(fx: &Fx) -> std::path::PathBuf {
        fx.file(
            "multus/05-cilium.conflist",
            &json!({"cniVersion":"0.3.1","name":"cilium","plugins":[
                {"type":"cilium-cni"},
                {"type":"portmap","capabilities":{"portMappings":true, ANNOTATIONS: true}}]}),
        )
    }

    fn conf(fx: &Fx, annotations: Option<Value>, extra: Value) -> Value {
        let mut c = fx.guard(
            "1.0.0",
            json!({"perPodPrimary": fx.path("multus/05-cilium.conflist")}),
        );
        let mut rc =
            json!({"portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]});
        if let Some(a) = annotations {
            rc[ANNOTATIONS] = a;
        }
        c["runtimeConfig"] = rc;
        for (k, v) in extra.as_object().unwrap() {
            c[k] = v.clone();
        }
        c
    }

    const POD: [(&str, Option<&str>); 1] = [(
        "CNI_ARGS",
        Some("IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web;K8S_POD_INFRA_CONTAINER_ID=ctr1"),
    )];

    #[test]
    fn a_plain_pod_runs_on_the_primary_while_multus_is_away_and_del_replays_it() {
        let fx = fx();
        primary(&fx);
        let c = conf(&fx, Some(json!({"other": "x"})), json!({"waitSeconds": 30}));
        let start = Instant::now();
        let add = fx.run_env("ADD", &c, &POD);
        let reply = add.ok().json();
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "a plain pod waited"
        );
        assert_eq!(reply["ips"][0]["address"], "10.2.0.7/24", "{reply}");
        assert_eq!(reply["cniVersion"], "1.0.0");
        assert_eq!(fx.calls(), ["cilium-cni ADD", "portmap ADD"]);
        assert!(add.stderr.contains("perpod=primary"), "{}", add.stderr);
        // The annotations are the guard's capability, not the primary's, even where a plugin
        // of the primary declares it; the others go on as declared.
        let sent = fx.received("portmap", "ADD");
        assert!(sent["runtimeConfig"].get(ANNOTATIONS).is_none(), "{sent}");
        assert!(sent["runtimeConfig"]["portMappings"].is_array(), "{sent}");
        // Multus is back: the pod's DEL replays the primary's DEL from the record, not Multus's.
        fx.delegate("multus-shim", "1.0.0");
        fx.run_env("DEL", &c, &POD).ok();
        assert_eq!(
            fx.calls(),
            [
                "cilium-cni ADD",
                "portmap ADD",
                "portmap DEL",
                "cilium-cni DEL"
            ]
        );
        assert!(fx.cache_files().is_empty(), "{:?}", fx.cache_files());
    }

    #[test]
    fn pods_that_need_multus_are_refused_saying_why() {
        let fx = fx();
        primary(&fx);
        for (annotations, why) in [
            (
                Some(json!({"k8s.v1.cni.cncf.io/networks": "macvlan-net1"})),
                "asks for networks",
            ),
            (
                Some(json!({"k8s.v1.cni.cncf.io/networks": r#"[{"name":"macvlan-net1"}]"#})),
                "asks for networks",
            ),
            (
                Some(json!({"v1.multus-cni.io/default-network": "x"})),
                "replaces its default network",
            ),
            (None, "passed no pod annotations"),
        ] {
            let r = fx.run_env("ADD", &conf(&fx, annotations.clone(), json!({})), &POD);
            let e = r.error(11);
            assert!(e["msg"].as_str().unwrap().contains("00-multus.conf"), "{e}");
            assert!(
                e["details"].as_str().unwrap_or("").contains(why),
                "{annotations:?}: {e}"
            );
            assert!(r.stderr.contains("perpod=needs-multus"), "{}", r.stderr);
        }
        assert!(fx.calls().is_empty(), "{:?}", fx.calls());
        assert!(fx.cache_files().is_empty());
        // An empty list asks for nothing.
        let c = conf(
            &fx,
            Some(json!({"k8s.v1.cni.cncf.io/networks": "[]"})),
            json!({}),
        );
        fx.run_env("ADD", &c, &POD).ok();
        assert_eq!(fx.calls(), ["cilium-cni ADD", "portmap ADD"]);
    }

    #[test]
    fn default_networks_need_multus_outside_the_system_namespaces() {
        let fx = fx();
        primary(&fx);
        let c = conf(
            &fx,
            Some(json!({})),
            json!({"multusDefaultNetworks": ["net-a"], "multusSystemNamespaces": ["kube-system"]}),
        );
        let e = fx.run_env("ADD", &c, &POD).error(11);
        assert!(
            e["details"].as_str().unwrap().contains("defaultNetworks"),
            "{e}"
        );
        let system = [(
            "CNI_ARGS",
            Some("K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=coredns"),
        )];
        fx.run_env("ADD", &c, &system).ok();
        assert_eq!(fx.calls(), ["cilium-cni ADD", "portmap ADD"]);
    }

    #[test]
    fn a_networked_pod_waits_for_multus_and_gets_it() {
        let fx = fx();
        primary(&fx);
        let c = conf(
            &fx,
            Some(json!({"k8s.v1.cni.cncf.io/networks": "macvlan-net1"})),
            json!({"waitSeconds": 30}),
        );
        let writer = {
            let (tmp, to) = (fx.path("net.d/.m"), fx.delegate_path());
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(300));
                std::fs::write(
                    &tmp,
                    r#"{"cniVersion":"1.0.0","name":"multus-net","type":"multus-shim"}"#,
                )
                .unwrap();
                std::fs::rename(&tmp, &to).unwrap();
            })
        };
        let r = fx.run_env("ADD", &c, &POD);
        writer.join().unwrap();
        assert_eq!(r.ok().json()["ips"][0]["address"], "10.1.0.2/24");
        assert_eq!(fx.calls(), ["multus-shim ADD"]);
        assert!(r.stderr.contains(" waited="), "{}", r.stderr);
    }

    #[test]
    fn with_multus_ready_every_pod_goes_through_multus() {
        let fx = fx();
        primary(&fx);
        fx.delegate("multus-shim", "1.0.0");
        fx.run_env("ADD", &conf(&fx, Some(json!({})), json!({})), &POD)
            .ok();
        assert_eq!(fx.calls(), ["multus-shim ADD"]);
    }

    #[test]
    fn a_primary_that_is_not_there_is_a_refusal_naming_it() {
        let fx = fx();
        let e = fx
            .run_env("ADD", &conf(&fx, Some(json!({})), json!({})), &POD)
            .error(11);
        assert!(
            e["msg"].as_str().unwrap().contains("05-cilium.conflist"),
            "{e}"
        );
        assert!(
            e["details"].as_str().unwrap().contains("00-multus.conf"),
            "{e}"
        );
        assert!(fx.calls().is_empty());
    }

    #[test]
    fn a_record_less_del_frees_what_the_primary_holds() {
        let fx = fx();
        primary(&fx);
        let c = conf(&fx, Some(json!({})), json!({}));
        // Multus away: the primary's DEL alone.
        fx.run_env("DEL", &c, &POD).ok();
        assert_eq!(fx.calls(), ["portmap DEL", "cilium-cni DEL"]);
        // Multus there: Multus's DEL, then the primary's (Multus skips it for a pod it has no
        // cache entry for).
        fx.delegate("multus-shim", "1.0.0");
        fx.run_env("DEL", &c, &POD).ok();
        assert_eq!(
            fx.calls(),
            [
                "portmap DEL",
                "cilium-cni DEL",
                "multus-shim DEL",
                "portmap DEL",
                "cilium-cni DEL"
            ]
        );
        // The primary's DEL gets no prevResult (the runtime's is Multus's result).
        let mut with_prev = c.clone();
        with_prev["prevResult"] = serde_json::from_str(&result("1.0.0", "10.1.0.2/24")).unwrap();
        fx.run_env("DEL", &with_prev, &POD).ok();
        assert!(fx.received("cilium-cni", "DEL").get("prevResult").is_none());
    }

    /// A record-less DEL runs Multus's DEL and then the primary's, also when Multus's failed:
    /// one deadline, `delegateTimeoutSeconds`, bounds all of them together (each plugin with
    /// its share of what is left), not one deadline per list.
    #[test]
    fn a_record_less_del_runs_both_lists_under_one_deadline() {
        let fx = fx();
        primary(&fx);
        fx.delegate("multus-shim", "1.0.0");
        for t in ["multus-shim", "portmap", "cilium-cni"] {
            fx.sleep(t, "DEL", 30.0);
        }
        let c = conf(&fx, Some(json!({})), json!({"delegateTimeoutSeconds": 3}));
        let start = Instant::now();
        let r = fx.run_env("DEL", &c, &POD);
        let took = start.elapsed();
        let e = r.error(999);
        assert!(e["msg"].as_str().unwrap().contains("was killed"), "{e}");
        // Each list had its chance; within one, DEL stops at the first failure, as libcni's.
        assert_eq!(fx.calls(), ["multus-shim DEL", "portmap DEL"]);
        assert!(
            took < Duration::from_millis(3900),
            "DEL took {took:?} under a 3 s delegateTimeoutSeconds"
        );
    }
}

/// Logging is best effort on every path: with no syslog socket and stderr full or a closed
/// pipe, a verb that is done says so on stdout and exits 0.
mod logging {
    use super::harness::*;
    use serde_json::json;
    use std::io::{Read, Write};
    use std::process::{Command, Stdio};

    fn run_with_stderr(
        fx: &Fx,
        verb: &str,
        conf: &serde_json::Value,
        stderr: Stdio,
    ) -> (i32, String) {
        let mut child = Command::new(env!("CARGO_BIN_EXE_cni-guard"))
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("CNI_GUARD_SYSLOG", fx.path("no-syslog"))
            .env("CNI_COMMAND", verb)
            .env("CNI_CONTAINERID", "ctr1")
            .env("CNI_NETNS", "/run/netns/test")
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", fx.path("bin"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(&serde_json::to_vec(conf).unwrap())
            .unwrap();
        let mut out = String::new();
        child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        let status = child.wait().unwrap();
        (status.code().unwrap_or(-1), out)
    }

    #[test]
    fn a_full_or_closed_stderr_never_fails_a_verb() {
        let fx = Fx::new();
        // DEL with nothing to tear down: the guard logs a line and, for a missing delegate,
        // a warning; VERSION logs its line too.
        let del = fx.guard("1.0.0", json!({}));
        let version = json!({"cniVersion": "1.0.0"});
        let stderrs: [(&str, &dyn Fn() -> Stdio); 2] = [
            ("/dev/full", &|| {
                Stdio::from(
                    std::fs::OpenOptions::new()
                        .write(true)
                        .open("/dev/full")
                        .unwrap(),
                )
            }),
            ("a closed pipe", &|| {
                let (reader, writer) = nix::unistd::pipe().unwrap();
                drop(reader);
                Stdio::from(writer)
            }),
        ];
        for (what, stderr) in stderrs {
            let (code, out) = run_with_stderr(&fx, "DEL", &del, stderr());
            assert_eq!((code, out.as_str()), (0, ""), "DEL with stderr {what}");
            let (code, out) = run_with_stderr(&fx, "VERSION", &version, stderr());
            assert_eq!(code, 0, "VERSION with stderr {what}: {out}");
            let reply: serde_json::Value = serde_json::from_str(&out).unwrap();
            assert_eq!(reply["cniVersion"], "1.0.0", "{out}");
            assert!(reply["supportedVersions"].is_array(), "{out}");
        }
    }
}

mod bad_input {
    use super::harness::*;
    use serde_json::json;

    #[test]
    fn missing_parameters_are_code_4_and_all_named() {
        let fx = Fx::new();
        let r = fx.run_env(
            "ADD",
            &fx.guard("1.0.0", json!({})),
            &[
                ("CNI_CONTAINERID", None),
                ("CNI_NETNS", None),
                ("CNI_IFNAME", Some("")),
                ("CNI_PATH", None),
            ],
        );
        let e = r.error(4);
        for name in ["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"] {
            assert!(e["msg"].as_str().unwrap().contains(name), "{name}: {e}");
        }
        assert_eq!(e["cniVersion"], "1.0.0");
    }

    /// A panic (reached in test builds through CNI_GUARD_DEBUG_PANIC) still answers in the
    /// spec's terms, in the request's cniVersion.
    #[test]
    fn a_panic_answers_999_in_the_requests_version() {
        let fx = Fx::new();
        for version in ["0.4.0", "1.0.0"] {
            let r = fx.run_env(
                "ADD",
                &fx.guard(version, json!({})),
                &[("CNI_GUARD_DEBUG_PANIC", Some("1"))],
            );
            assert_ne!(r.status, 0);
            let v: serde_json::Value = serde_json::from_str(&r.stdout)
                .unwrap_or_else(|e| panic!("{e}: {:?} {:?}", r.stdout, r.stderr));
            assert_eq!(v["code"], 999, "{v}");
            assert_eq!(v["cniVersion"], version, "{v}");
        }
    }

    #[test]
    fn unknown_commands_are_code_4() {
        let fx = Fx::new();
        for c in ["add", "FROB", ""] {
            fx.run(c, &fx.guard("1.0.0", json!({}))).error(4);
        }
    }

    #[test]
    fn undecodable_stdin_is_code_6_and_bad_config_code_7() {
        let fx = Fx::new();
        fx.run_raw("ADD", b"{not json", &[]).error(6);
        fx.run_raw("ADD", b"", &[]).error(6);
        fx.run_raw("ADD", b"\xff\xfe", &[]).error(6);
        fx.run(
            "ADD",
            &json!({"cniVersion":"1.0.0","name":"g","type":"cni-guard"}),
        )
        .error(7);
        fx.run(
            "ADD",
            &fx.guard("1.0.0", json!({"delegate":"relative.conf"})),
        )
        .error(7);
        fx.run("ADD", &fx.guard("4.2.0", json!({}))).error(1);
    }

    #[test]
    fn unsafe_ids_never_reach_a_path() {
        let fx = Fx::new();
        fx.plugin("bridge");
        fx.delegate("bridge", "1.0.0");
        for (k, v) in [
            ("CNI_CONTAINERID", "../../etc"),
            ("CNI_CONTAINERID", "a/b"),
            ("CNI_IFNAME", "../x"),
            ("CNI_IFNAME", "0123456789abcdefg"),
        ] {
            for cmd in ["ADD", "DEL"] {
                fx.run_env(cmd, &fx.guard("1.0.0", json!({})), &[(k, Some(v))])
                    .error(4);
            }
        }
        assert!(fx.calls().is_empty());
        assert!(fx.cache_files().is_empty());
    }

    #[test]
    fn a_symlinked_cache_dir_is_refused() {
        let fx = Fx::new();
        fx.plugin("bridge");
        fx.delegate("bridge", "1.0.0");
        std::fs::create_dir(fx.path("real")).unwrap();
        std::os::unix::fs::symlink(fx.path("real"), fx.cache()).unwrap();
        let e = fx.run("ADD", &fx.guard("1.0.0", json!({}))).error(7);
        assert!(e["msg"].as_str().unwrap().contains("symlink"), "{e}");
        assert!(fx.calls().is_empty());
    }
}
