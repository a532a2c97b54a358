//! Hostile input, table-driven: the built `cni-guard` (run it with `cargo test --release` to
//! test the release binary, as `scripts/test.d/50-hardening.sh` does) against what a broken
//! runtime, a broken file or a local user could hand it.
//!
//! Every case, in a fresh directory that already holds one real attachment (an ADD that went
//! through), asserts: the exit status; the CNI error code; that stdout is exactly one error JSON
//! in the spec's shape (in the request's cniVersion when it names one the guard speaks); that
//! nothing panicked; that no delegate ran; and that no file anywhere in the directory (the cache
//! dir, its record, the configuration files) changed.
//!
//! Not expressible here: a NUL inside a `CNI_*` value. `execve` takes C strings, so a runtime
//! cannot pass one; the `request` fuzz target feeds NULs to the parser through its getter.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

const SUPPORTED: [&str; 5] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];
const NOBODY: u32 = 65534;

struct Fx {
    dir: tempfile::TempDir,
}

impl Fx {
    fn new() -> Fx {
        let fx = Fx {
            dir: tempfile::tempdir().unwrap(),
        };
        for d in ["bin", "net.d", "fake", "cache"] {
            std::fs::create_dir(fx.path(d)).unwrap();
        }
        std::fs::set_permissions(fx.path("cache"), std::fs::Permissions::from_mode(0o700)).unwrap();
        let fake = Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/plugins/fake-plugin");
        std::os::unix::fs::symlink(fake, fx.path("bin/bridge")).unwrap();
        std::fs::write(fx.path("bin/noexec"), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(
            fx.path("bin/noexec"),
            std::fs::Permissions::from_mode(0o644),
        )
        .unwrap();
        fx.write(
            "net.d/00-multus.conf",
            &json!({"cniVersion":"1.0.0","name":"multus-net","type":"bridge"}),
        );
        std::fs::write(
            fx.path("fake/bridge.ADD.out"),
            json!({"cniVersion":"1.0.0","ips":[{"address":"10.1.0.2/24"}]}).to_string(),
        )
        .unwrap();
        // One real attachment, so that "the cache dir is unchanged" has something to keep.
        let add = fx.run(&Call {
            env: vec![("CNI_CONTAINERID", Some("existing".into()))],
            ..Call::new("ADD", Stdin::Json(fx.guard(json!({}))))
        });
        assert_eq!(add.status, Some(0), "fixture ADD: {}", add.stderr);
        assert!(fx.path("cache/guarded/existing:eth0.json").is_file());
        fx
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    fn write(&self, name: &str, v: &Value) -> PathBuf {
        let p = self.path(name);
        std::fs::write(&p, serde_json::to_vec(v).unwrap()).unwrap();
        p
    }

    /// The guard's configuration as the runtime passes it, with `extra` merged over it.
    fn guard(&self, extra: Value) -> Value {
        let mut v = json!({"cniVersion":"1.0.0","name":"guarded","type":"cni-guard",
            "delegate": self.path("net.d/00-multus.conf"), "cacheDir": self.path("cache")});
        for (k, val) in extra.as_object().unwrap() {
            v[k] = val.clone();
        }
        v
    }

    fn run(&self, call: &Call) -> Run {
        let mut c = Command::new(env!("CARGO_BIN_EXE_cni-guard"));
        c.env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("FAKE_DIR", self.path("fake"))
            .env("CNI_GUARD_SYSLOG", self.path("no-syslog"))
            .env("CNI_COMMAND", call.cmd)
            .env("CNI_CONTAINERID", "ctr1")
            .env("CNI_NETNS", "/run/netns/hostile")
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", self.path("bin"));
        for (k, v) in &call.env {
            match v {
                Some(v) => c.env(k, v),
                None => c.env_remove(k),
            };
        }
        if call.as_nobody {
            c.uid(NOBODY).gid(NOBODY);
        }
        let mut child = c
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut input = child.stdin.take().unwrap();
        let data = call.stdin.bytes();
        // The guard may stop reading (bounded stdin) and exit: a broken pipe here is expected.
        let writer = std::thread::spawn(move || {
            let _ = input.write_all(&data);
        });
        let out = child.wait_with_output().unwrap();
        writer.join().unwrap();
        Run {
            status: out.status.code(),
            stdout: out.stdout,
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Every entry under the fixture: type, mode, owner, size and (for regular files) content.
    fn snapshot(&self) -> BTreeMap<PathBuf, String> {
        fn walk(p: &Path, out: &mut BTreeMap<PathBuf, String>) {
            let Ok(rd) = std::fs::read_dir(p) else { return };
            for e in rd.flatten() {
                let path = e.path();
                let meta = std::fs::symlink_metadata(&path).unwrap();
                let ft = meta.file_type();
                let content = if ft.is_file() {
                    String::from_utf8_lossy(&std::fs::read(&path).unwrap_or_default()).into_owned()
                } else if ft.is_symlink() {
                    std::fs::read_link(&path).unwrap().display().to_string()
                } else {
                    String::new()
                };
                out.insert(
                    path.clone(),
                    format!(
                        "{:o} {} {} {content}",
                        meta.mode(),
                        meta.uid(),
                        if ft.is_dir() { 0 } else { meta.len() }
                    ),
                );
                if ft.is_dir() {
                    walk(&path, out);
                }
            }
        }
        let mut out = BTreeMap::new();
        walk(self.dir.path(), &mut out);
        out
    }
}

enum Stdin {
    Json(Value),
    Raw(Vec<u8>),
}

impl Stdin {
    fn bytes(&self) -> Vec<u8> {
        match self {
            Stdin::Json(v) => serde_json::to_vec(v).unwrap(),
            Stdin::Raw(b) => b.clone(),
        }
    }

    /// The cniVersion the reply must be in: the request's, when the guard speaks it. For bytes
    /// that are not JSON, any version the guard speaks (it may still find the request's).
    fn reply_version(&self) -> Option<String> {
        let Stdin::Json(v) = self else {
            return None;
        };
        Some(match v.get("cniVersion").and_then(Value::as_str) {
            Some(s) if SUPPORTED.contains(&s) => s.to_owned(),
            _ => "1.1.0".to_owned(),
        })
    }
}

struct Call {
    cmd: &'static str,
    env: Vec<(&'static str, Option<OsString>)>,
    stdin: Stdin,
    as_nobody: bool,
}

impl Call {
    fn new(cmd: &'static str, stdin: Stdin) -> Call {
        Call {
            cmd,
            env: Vec::new(),
            stdin,
            as_nobody: false,
        }
    }
}

struct Run {
    status: Option<i32>,
    stdout: Vec<u8>,
    stderr: String,
}

/// What a case must end with.
struct Want {
    code: u64,
    /// Substrings the error's `msg` must contain.
    msg: Vec<&'static str>,
}

struct Case {
    name: &'static str,
    /// Builds the call, preparing whatever files the case needs in the fixture.
    call: Box<dyn Fn(&Fx) -> Call>,
    want: Want,
}

fn want(code: u64, msg: &[&'static str]) -> Want {
    Want {
        code,
        msg: msg.to_vec(),
    }
}

/// A default ADD with some environment variables replaced (`None`: removed).
fn env_case(
    name: &'static str,
    cmd: &'static str,
    env: Vec<(&'static str, Option<OsString>)>,
    w: Want,
) -> Case {
    Case {
        name,
        call: Box::new(move |fx| Call {
            env: env.clone(),
            ..Call::new(cmd, Stdin::Json(fx.guard(json!({}))))
        }),
        want: w,
    }
}

/// A request whose guard configuration has `extra` merged in.
fn conf_case(name: &'static str, cmd: &'static str, extra: Value, w: Want) -> Case {
    Case {
        name,
        call: Box::new(move |fx| Call::new(cmd, Stdin::Json(fx.guard(extra.clone())))),
        want: w,
    }
}

/// An ADD whose stdin is exactly these bytes.
fn raw_case(name: &'static str, stdin: Vec<u8>, w: Want) -> Case {
    Case {
        name,
        call: Box::new(move |_| Call::new("ADD", Stdin::Raw(stdin.clone()))),
        want: w,
    }
}

/// An ADD whose delegate (or attachment, with `attachment`) is a path `make` prepares.
fn path_case(name: &'static str, attachment: bool, make: fn(&Fx) -> PathBuf, w: Want) -> Case {
    Case {
        name,
        call: Box::new(move |fx| {
            let p = make(fx);
            let extra = if attachment {
                json!({ "attachments": [p] })
            } else {
                json!({ "delegate": p })
            };
            Call::new("ADD", Stdin::Json(fx.guard(extra)))
        }),
        want: w,
    }
}

/// An ADD whose delegate file has this content (at `name` under net.d).
fn delegate_case(name: &'static str, file: &'static str, body: Value, w: Want) -> Case {
    Case {
        name,
        call: Box::new(move |fx| {
            let p = fx.write(&format!("net.d/{file}"), &body);
            Call::new("ADD", Stdin::Json(fx.guard(json!({ "delegate": p }))))
        }),
        want: w,
    }
}

fn s(v: &str) -> Option<OsString> {
    Some(OsString::from(v))
}

fn long(n: usize) -> Option<OsString> {
    Some(OsString::from("a".repeat(n)))
}

fn mkfifo(p: &Path) {
    let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
    // SAFETY: c is a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn cases() -> Vec<Case> {
    let mut v = Vec::new();

    // Every CNI_* variable missing, empty, too long, with control characters.
    for var in ["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"] {
        v.push(env_case(
            "missing",
            "ADD",
            vec![(var, None)],
            want(4, &["is missing"]),
        ));
        v.push(env_case(
            "empty",
            "ADD",
            vec![(var, s(""))],
            want(4, &["is empty"]),
        ));
    }
    for var in [
        "CNI_CONTAINERID",
        "CNI_NETNS",
        "CNI_IFNAME",
        "CNI_ARGS",
        "CNI_PATH",
    ] {
        v.push(env_case(
            "too long",
            "ADD",
            vec![(var, long(5000))],
            want(4, &["too long"]),
        ));
    }
    v.push(env_case(
        "CNI_COMMAND too long",
        "ADD",
        vec![("CNI_COMMAND", long(5000))],
        want(4, &["unknown CNI_COMMAND"]),
    ));
    for (var, val) in [
        ("CNI_CONTAINERID", "abc\ndef"),
        ("CNI_NETNS", "/run/netns/x\n"),
        ("CNI_IFNAME", "eth0\t"),
        ("CNI_ARGS", "K8S_POD_NAME=p\x1b[31m"),
        ("CNI_PATH", "/opt/cni/bin\r"),
    ] {
        v.push(env_case(
            "control characters",
            "ADD",
            vec![(var, s(val))],
            want(4, &["control characters"]),
        ));
    }
    v.push(env_case(
        "CNI_COMMAND with a newline",
        "ADD",
        vec![("CNI_COMMAND", s("ADD\n"))],
        want(4, &["unknown CNI_COMMAND"]),
    ));
    v.push(env_case(
        "every required variable missing at once",
        "ADD",
        vec![
            ("CNI_CONTAINERID", None),
            ("CNI_NETNS", None),
            ("CNI_IFNAME", None),
            ("CNI_PATH", None),
        ],
        want(
            4,
            &["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"],
        ),
    ));

    // Container IDs and interface names that could name another file, for ADD and DEL.
    for cmd in ["ADD", "DEL"] {
        for id in [
            "a/b",
            "../../etc",
            "..",
            ".hidden",
            "-dash",
            "ctr:1",
            "ctr 1",
        ] {
            v.push(env_case(
                "container id",
                cmd,
                vec![("CNI_CONTAINERID", s(id))],
                want(4, &["CNI_CONTAINERID"]),
            ));
        }
        v.push(env_case(
            "container id over 200",
            cmd,
            vec![("CNI_CONTAINERID", long(201))],
            want(4, &["longer than 200"]),
        ));
        for name in [
            "a/b",
            "..",
            ".",
            "eth:0",
            "eth 0",
            "0123456789abcdef",
            "0123456789abcdefg",
        ] {
            v.push(env_case(
                "ifname",
                cmd,
                vec![("CNI_IFNAME", s(name))],
                want(4, &["CNI_IFNAME"]),
            ));
        }
    }

    // Unknown and lower-case commands.
    for cmd in ["add", "del", "Add", "FROB", "ADD ", ""] {
        v.push(env_case(
            "command",
            "ADD",
            vec![("CNI_COMMAND", s(cmd))],
            want(4, &["unknown CNI_COMMAND"]),
        ));
    }

    // Stdin: empty, not JSON, the wrong shape, deeply nested, huge, invalid UTF-8.
    v.push(raw_case(
        "stdin empty",
        Vec::new(),
        want(6, &["cannot decode"]),
    ));
    v.push(raw_case(
        "stdin not JSON",
        b"{not json".to_vec(),
        want(6, &["cannot decode"]),
    ));
    v.push(raw_case(
        "stdin a JSON array",
        b"[1,2]".to_vec(),
        want(6, &["not a JSON object"]),
    ));
    v.push(raw_case(
        "stdin a JSON string",
        b"\"x\"".to_vec(),
        want(6, &["not a JSON object"]),
    ));
    v.push(raw_case(
        "stdin two objects",
        b"{}{}".to_vec(),
        want(6, &["cannot decode"]),
    ));
    v.push(raw_case(
        "stdin NUL bytes",
        b"\0\0\0".to_vec(),
        want(6, &["cannot decode"]),
    ));
    v.push(raw_case(
        "stdin invalid UTF-8",
        b"\xff\xfe\xfd".to_vec(),
        want(6, &["cannot decode"]),
    ));
    v.push(raw_case(
        "stdin invalid UTF-8 inside a string",
        b"{\"cniVersion\":\"1.0.0\",\"name\":\"\xc3\x28\"}".to_vec(),
        want(6, &["cannot decode"]),
    ));
    v.push(raw_case(
        "stdin with a byte-order mark",
        b"\xef\xbb\xbf{\"cniVersion\":\"1.0.0\"}".to_vec(),
        want(6, &["cannot decode"]),
    ));
    v.push(raw_case(
        "stdin nested 100000 deep",
        vec![b'['; 100_000],
        want(6, &["cannot decode"]),
    ));
    v.push(Case {
        name: "config with a value nested 10000 deep",
        call: Box::new(|fx| {
            let mut conf = serde_json::to_string(&fx.guard(json!({}))).unwrap();
            conf.pop();
            conf.push_str(",\"args\":");
            conf.push_str(&"{\"a\":".repeat(10_000));
            conf.push_str(&"}".repeat(10_001));
            Call::new("ADD", Stdin::Raw(conf.into_bytes()))
        }),
        want: want(6, &["cannot decode"]),
    });
    v.push(raw_case(
        "stdin 100 MiB",
        {
            let mut b = b"{\"cniVersion\":\"1.0.0\",\"pad\":\"".to_vec();
            b.resize(100 << 20, b'x');
            b
        },
        want(6, &["larger than 16 MiB"]),
    ));
    for (field, value) in [
        ("name", json!(5)),
        ("delegate", json!(7)),
        ("attachments", json!({"a": 1})),
        ("attachments", json!([1])),
        ("runtimeConfig", json!([])),
        ("prevResult", json!("x")),
        ("waitSeconds", json!("5")),
        ("waitSeconds", json!(-1)),
        ("strictPermissions", json!("yes")),
        ("cacheDir", json!("relative/cache")),
        ("name", json!("../etc")),
        ("name", json!("a/b")),
    ] {
        v.push(conf_case(
            "config of the wrong shape",
            "ADD",
            json!({ field: value }),
            want(7, &[field]),
        ));
    }
    v.push(Case {
        name: "config without a delegate",
        call: Box::new(|fx| {
            let mut c = fx.guard(json!({}));
            c.as_object_mut().unwrap().remove("delegate");
            Call::new("ADD", Stdin::Json(c))
        }),
        want: want(7, &["delegate is required"]),
    });

    // cniVersion unknown, missing, malformed.
    for ver in [
        json!("9.9.9"),
        json!("0.2.0"),
        json!("1.0"),
        json!("v1.0.0"),
        json!(""),
        json!(1),
        json!(null),
    ] {
        v.push(conf_case(
            "cniVersion",
            "ADD",
            json!({ "cniVersion": ver }),
            want(1, &["unsupported cniVersion"]),
        ));
    }
    v.push(Case {
        name: "cniVersion missing",
        call: Box::new(|fx| {
            let mut c = fx.guard(json!({}));
            c.as_object_mut().unwrap().remove("cniVersion");
            Call::new("ADD", Stdin::Json(c))
        }),
        want: want(7, &["cniVersion is required"]),
    });
    v.push(conf_case(
        "STATUS before 1.1.0",
        "STATUS",
        json!({}),
        want(1, &["STATUS"]),
    ));
    v.push(conf_case(
        "GC before 1.1.0",
        "GC",
        json!({"cniVersion":"0.4.0"}),
        want(1, &["GC"]),
    ));
    v.push(conf_case(
        "CHECK before 0.4.0",
        "CHECK",
        json!({"cniVersion":"0.3.1"}),
        want(1, &["CHECK"]),
    ));

    // Delegate and attachment paths that are not a readable regular file.
    for attachment in [false, true] {
        v.push(Case {
            name: "relative path",
            call: Box::new(move |fx| {
                let key = if attachment {
                    "attachments"
                } else {
                    "delegate"
                };
                let val = if attachment {
                    json!(["net.d/x.conf"])
                } else {
                    json!("net.d/x.conf")
                };
                Call::new("ADD", Stdin::Json(fx.guard(json!({ key: val }))))
            }),
            want: want(7, &["not an absolute path"]),
        });
        v.push(path_case(
            "a directory",
            attachment,
            |fx| fx.path("net.d"),
            want(11, &["directory"]),
        ));
        v.push(path_case(
            "a FIFO",
            attachment,
            |fx| {
                let p = fx.path("net.d/fifo.conf");
                mkfifo(&p);
                p
            },
            want(11, &["FIFO"]),
        ));
        v.push(path_case(
            "a socket",
            attachment,
            |fx| {
                let p = fx.path("net.d/sock.conf");
                let l = std::os::unix::net::UnixListener::bind(&p).unwrap();
                std::mem::forget(l);
                p
            },
            want(11, &["socket"]),
        ));
        v.push(path_case(
            "/dev/zero",
            attachment,
            |_| "/dev/zero".into(),
            want(11, &["device"]),
        ));
        v.push(path_case(
            "the guard's own stdin",
            attachment,
            |_| "/dev/stdin".into(),
            want(11, &["FIFO"]),
        ));
        v.push(path_case(
            "a dangling symlink",
            attachment,
            |fx| {
                let p = fx.path("net.d/dangling.conf");
                std::os::unix::fs::symlink(fx.path("net.d/nowhere"), &p).unwrap();
                p
            },
            want(11, &["dangling symlink"]),
        ));
        v.push(path_case(
            "a symlink loop",
            attachment,
            |fx| {
                let (a, b) = (fx.path("net.d/a.conf"), fx.path("net.d/b.conf"));
                std::os::unix::fs::symlink(&b, &a).unwrap();
                std::os::unix::fs::symlink(&a, &b).unwrap();
                a
            },
            want(11, &["symlink loop"]),
        ));
        v.push(Case {
            name: "an unreadable file",
            call: Box::new(move |fx| {
                let p = fx.write(
                    "net.d/secret.conf",
                    &json!({"cniVersion":"1.0.0","name":"s","type":"bridge"}),
                );
                std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o000)).unwrap();
                let key = if attachment {
                    "attachments"
                } else {
                    "delegate"
                };
                let val = if attachment { json!([p]) } else { json!(p) };
                let mut call = Call::new("ADD", Stdin::Json(fx.guard(json!({ key: val }))));
                // Root reads anything: drop to nobody, who can reach the file but not read it.
                if is_root() {
                    std::fs::set_permissions(fx.dir.path(), std::fs::Permissions::from_mode(0o755))
                        .unwrap();
                    std::fs::set_permissions(
                        fx.path("net.d"),
                        std::fs::Permissions::from_mode(0o755),
                    )
                    .unwrap();
                    call.as_nobody = true;
                }
                call
            }),
            want: want(11, &["not readable"]),
        });
    }

    // Delegates that name something the guard must never run.
    for ty in ["../../bin/sh", "/bin/sh", "bin/sh", ".", ".."] {
        v.push(delegate_case(
            "a type that is a path",
            "00-multus.conf",
            json!({"cniVersion":"1.0.0","name":"n","type": ty}),
            want(11, &["not a plain file name"]),
        ));
    }
    v.push(delegate_case(
        "an empty type",
        "00-multus.conf",
        json!({"cniVersion":"1.0.0","name":"n","type": ""}),
        want(11, &["empty plugin type"]),
    ));
    v.push(delegate_case(
        "naming cni-guard",
        "00-multus.conf",
        json!({"cniVersion":"1.0.0","name":"n","type":"cni-guard"}),
        want(7, &["itself"]),
    ));
    v.push(delegate_case(
        "naming cni-guard through a conflist",
        "10-chain.conflist",
        json!({"cniVersion":"1.0.0","name":"n","plugins":[{"type":"bridge"},{"type":"cni-guard"}]}),
        want(7, &["itself"]),
    ));
    v.push(delegate_case(
        "naming cni-guard inside Multus delegates",
        "00-multus.conf",
        json!({"cniVersion":"0.3.1","name":"m","type":"bridge",
               "delegates":[{"cniVersion":"0.3.1","name":"g","plugins":[{"type":"cni-guard"}]}]}),
        want(7, &["itself"]),
    ));
    v.push(Case {
        name: "an attachment naming cni-guard",
        call: Box::new(|fx| {
            let a = fx.write(
                "net.d/05-cilium.conflist",
                &json!({"cniVersion":"1.0.0","name":"c","plugins":[{"type":"cni-guard"}]}),
            );
            Call::new("ADD", Stdin::Json(fx.guard(json!({ "attachments": [a] }))))
        }),
        want: want(7, &["itself"]),
    });
    v.push(delegate_case(
        "naming a missing binary",
        "00-multus.conf",
        json!({"cniVersion":"1.0.0","name":"n","type":"no-such-plugin"}),
        want(11, &["\"no-such-plugin\"", "not in CNI_PATH"]),
    ));
    v.push(delegate_case(
        "naming a binary that is not executable",
        "00-multus.conf",
        json!({"cniVersion":"1.0.0","name":"n","type":"noexec"}),
        want(11, &["not executable"]),
    ));
    v.push(Case {
        name: "a group-writable delegate in strict mode",
        call: Box::new(|fx| {
            let p = fx.path("net.d/00-multus.conf");
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o664)).unwrap();
            Call::new(
                "ADD",
                Stdin::Json(fx.guard(json!({"strictPermissions": true}))),
            )
        }),
        want: want(7, &["strictPermissions"]),
    });

    // Cache dirs the guard must not write into.
    v.push(Case {
        name: "a symlinked cache dir",
        call: Box::new(|fx| {
            std::fs::create_dir(fx.path("elsewhere")).unwrap();
            std::os::unix::fs::symlink(fx.path("elsewhere"), fx.path("linked-cache")).unwrap();
            Call::new(
                "ADD",
                Stdin::Json(fx.guard(json!({"cacheDir": fx.path("linked-cache")}))),
            )
        }),
        want: want(7, &["symlink"]),
    });
    v.push(Case {
        name: "a world-writable cache dir",
        call: Box::new(|fx| {
            std::fs::create_dir(fx.path("open-cache")).unwrap();
            std::fs::set_permissions(
                fx.path("open-cache"),
                std::fs::Permissions::from_mode(0o777),
            )
            .unwrap();
            Call::new(
                "ADD",
                Stdin::Json(fx.guard(json!({"cacheDir": fx.path("open-cache")}))),
            )
        }),
        want: want(7, &["writable by others"]),
    });
    v.push(Case {
        name: "a cache dir that is a file",
        call: Box::new(|fx| {
            std::fs::write(fx.path("file-cache"), "").unwrap();
            Call::new(
                "ADD",
                Stdin::Json(fx.guard(json!({"cacheDir": fx.path("file-cache")}))),
            )
        }),
        want: want(7, &["not a directory"]),
    });
    if is_root() {
        v.push(Case {
            name: "a cache dir owned by another user",
            call: Box::new(|fx| {
                std::fs::create_dir(fx.path("foreign-cache")).unwrap();
                std::os::unix::fs::chown(fx.path("foreign-cache"), Some(4242), Some(4242)).unwrap();
                Call::new(
                    "ADD",
                    Stdin::Json(fx.guard(json!({"cacheDir": fx.path("foreign-cache")}))),
                )
            }),
            want: want(7, &["owned by uid 4242"]),
        });
    }
    v.push(Case {
        name: "a symlink planted as the network's record dir",
        call: Box::new(|fx| {
            std::fs::create_dir(fx.path("cache2")).unwrap();
            std::fs::set_permissions(fx.path("cache2"), std::fs::Permissions::from_mode(0o700))
                .unwrap();
            std::fs::create_dir(fx.path("elsewhere2")).unwrap();
            std::os::unix::fs::symlink(fx.path("elsewhere2"), fx.path("cache2/guarded")).unwrap();
            Call::new(
                "ADD",
                Stdin::Json(fx.guard(json!({"cacheDir": fx.path("cache2")}))),
            )
        }),
        want: want(7, &["symlink"]),
    });

    // prevResult malformed for CHECK and DEL. An object that is not a valid result is refused
    // by CHECK only: DEL is never refused over it and tears down without a prevResult
    // (plugin/tests/cni.rs, del::a_malformed_prev_result_does_not_stop_teardown).
    for cmd in ["CHECK", "DEL"] {
        for (prev, code, msg) in [
            (json!("x"), 7, "prevResult is not an object"),
            (json!([1]), 7, "prevResult is not an object"),
            (json!({"ips":"x"}), 6, "invalid prevResult"),
            (json!({"ips":[{}]}), 6, "invalid prevResult"),
            (json!({"cniVersion":"x.y"}), 6, "invalid prevResult"),
            (
                json!({"cniVersion":"1.0.0","dns":[]}),
                6,
                "invalid prevResult",
            ),
        ] {
            if cmd == "DEL" && code == 6 {
                continue;
            }
            v.push(conf_case(
                "malformed prevResult",
                cmd,
                json!({ "prevResult": prev }),
                want(code, &[msg]),
            ));
        }
    }
    v
}

#[test]
fn hostile_input_is_refused_cleanly() {
    let cases = cases();
    assert!(cases.len() >= 60, "only {} cases", cases.len());
    let mut failures = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let fx = Fx::new();
        let call = (case.call)(&fx);
        let before = fx.snapshot();
        let start = Instant::now();
        let run = fx.run(&call);
        let took = start.elapsed();
        let label = format!(
            "#{i} {} ({} {:?})",
            case.name,
            call.cmd,
            call.env
                .iter()
                .map(|(k, v)| format!("{k}={:?}", v.as_ref().map(|v| v.len())))
                .collect::<Vec<_>>()
        );
        if let Err(why) = check(&fx, &call, &run, &case.want, &before, took) {
            failures.push(format!(
                "{label}: {why}\n  stdout: {}\n  stderr: {}",
                String::from_utf8_lossy(&run.stdout),
                run.stderr.trim()
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    eprintln!("{} hostile cases passed", cases.len());
}

fn check(
    fx: &Fx,
    call: &Call,
    run: &Run,
    want: &Want,
    before: &BTreeMap<PathBuf, String>,
    took: Duration,
) -> Result<(), String> {
    if run.stderr.contains("panicked") {
        return Err("panicked".into());
    }
    if run.status != Some(1) {
        return Err(format!("exit status {:?}, want 1", run.status));
    }
    // Exactly one JSON value: serde_json refuses trailing data.
    let reply: Value = serde_json::from_slice(&run.stdout)
        .map_err(|e| format!("stdout is not exactly one JSON value: {e}"))?;
    let obj = reply.as_object().ok_or("reply is not an object")?;
    if obj
        .keys()
        .any(|k| !["cniVersion", "code", "msg", "details"].contains(&k.as_str()))
    {
        return Err(format!("reply has fields beyond the spec's error: {reply}"));
    }
    if reply["code"].as_u64() != Some(want.code) {
        return Err(format!("code {}, want {}", reply["code"], want.code));
    }
    let msg = reply["msg"].as_str().ok_or("msg is not a string")?;
    if let Some(d) = obj.get("details") {
        d.as_str().ok_or("details is not a string")?;
    }
    for part in &want.msg {
        if !msg.contains(part) {
            return Err(format!("msg {msg:?} does not mention {part:?}"));
        }
    }
    let version = reply["cniVersion"]
        .as_str()
        .ok_or("cniVersion is not a string")?;
    if !SUPPORTED.contains(&version) {
        return Err(format!(
            "reply in {version}, which the guard does not speak"
        ));
    }
    if let Some(want) = call.stdin.reply_version() {
        if version != want {
            return Err(format!("reply in {version}, want {want}"));
        }
    }
    let after = fx.snapshot();
    if &after != before {
        let changed: Vec<_> = before
            .keys()
            .chain(after.keys())
            .filter(|k| before.get(*k) != after.get(*k))
            .collect();
        return Err(format!("files changed: {changed:?}"));
    }
    if std::fs::read_to_string(fx.path("fake/calls")).unwrap_or_default() != "bridge ADD\n" {
        return Err("a delegate ran".into());
    }
    if took > Duration::from_secs(10) {
        return Err(format!("took {took:?}"));
    }
    Ok(())
}

#[test]
fn no_operator_mode_without_cni_command() {
    // Without CNI_COMMAND the binary is the operator tool: no CNI reply, no files touched.
    let fx = Fx::new();
    let before = fx.snapshot();
    let out = Command::new(env!("CARGO_BIN_EXE_cni-guard"))
        .env_clear()
        .env("CNI_CONTAINERID", "ctr1")
        .env("CNI_PATH", fx.path("bin"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    assert!(!String::from_utf8_lossy(&out.stderr).contains("panicked"));
    assert_eq!(fx.snapshot(), before);
}
