//! Hostile input as a table: the built `cni-guard` (run it with `cargo test --release` to test
//! the release binary, as `scripts/test.d/50-hardening.sh` does) against what a broken runtime,
//! a broken file or a local user could hand it. Each row of `CASES` is one case; one loop runs
//! them all.
//!
//! Every case, in a fresh directory that already holds one real attachment (an ADD that went
//! through), asserts: the exit status; the CNI error code; that stdout is exactly one error JSON
//! in the spec's shape (in the request's cniVersion when it names one the guard speaks); that
//! nothing panicked; that no delegate ran; and that no file anywhere in the directory (the cache
//! dir, its record, the configuration files) changed.
//!
//! Not expressible here: a NUL inside a `CNI_*` value. `execve` takes C strings, so a runtime
//! cannot pass one; the `request` fuzz target feeds NULs to the parser through its getter.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use test_support::Run;

const SUPPORTED: [&str; 5] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];
const NOBODY: u32 = 65534;
/// How many rows `CASES` had when it became a table: rows may be added, never lost.
const CASES_AT_LEAST: usize = 138;

/// A `CNI_*` variable of a case, over the runtime's defaults.
#[derive(Clone, Copy)]
enum Var {
    Unset,
    Set(&'static str),
    /// `n` times "a".
    Long(usize),
}
use Var::*;

/// What a case feeds the guard on stdin.
#[derive(Clone, Copy)]
enum Input {
    /// The guard's configuration with this JSON object merged over it; `{dir}` in it stands for
    /// the fixture's directory.
    Conf(&'static str),
    /// The guard's configuration without this field.
    ConfWithout(&'static str),
    /// Exactly these bytes.
    Raw(&'static [u8]),
    /// Bytes too large or too deep to write out here.
    Made(fn(&Fx) -> Vec<u8>),
}
use Input::*;

/// The guard's configuration as the runtime passes it.
const GUARD: Input = Conf("{}");

/// What a case prepares in the fixture before it runs; paths are under the fixture's directory.
#[derive(Clone, Copy)]
enum Prep {
    Dir(&'static str),
    File(&'static str, &'static str),
    Chmod(&'static str, u32),
    Chown(&'static str, u32),
    /// A symlink at the first path to the second.
    Symlink(&'static str, &'static str),
    Fifo(&'static str),
    /// A listening Unix socket (left listening).
    Socket(&'static str),
}
use Prep::*;

/// A delegate configuration nobody may read.
const UNREADABLE: &[Prep] = &[
    File(
        "net.d/secret.conf",
        r#"{"cniVersion":"1.0.0","name":"s","type":"bridge"}"#,
    ),
    Chmod("net.d/secret.conf", 0o000),
];

struct Case {
    name: &'static str,
    cmd: &'static str,
    env: &'static [(&'static str, Var)],
    stdin: Input,
    prep: &'static [Prep],
    /// Root reads anything: as root, run the guard as nobody, who can reach the fixture.
    nobody_if_root: bool,
    /// Runs only as root (it needs chown); not counted otherwise.
    root_only: bool,
    /// The CNI error code.
    code: u64,
    /// Substrings the error's `msg` must contain.
    msg: &'static [&'static str],
}

const fn case(
    name: &'static str,
    cmd: &'static str,
    env: &'static [(&'static str, Var)],
    stdin: Input,
    code: u64,
    msg: &'static [&'static str],
) -> Case {
    Case {
        name,
        cmd,
        env,
        stdin,
        prep: &[],
        nobody_if_root: false,
        root_only: false,
        code,
        msg,
    }
}

impl Case {
    const fn prep(self, prep: &'static [Prep]) -> Case {
        Case { prep, ..self }
    }

    const fn by_nobody_if_root(self) -> Case {
        Case {
            nobody_if_root: true,
            ..self
        }
    }

    const fn root_only(self) -> Case {
        Case {
            root_only: true,
            ..self
        }
    }
}

#[rustfmt::skip]
static CASES: &[Case] = &[
    // Every CNI_* variable missing, empty, too long, with control characters.
    case("CNI_CONTAINERID missing", "ADD", &[("CNI_CONTAINERID", Unset)], GUARD, 4, &["is missing"]),
    case("CNI_CONTAINERID empty", "ADD", &[("CNI_CONTAINERID", Set(""))], GUARD, 4, &["is empty"]),
    case("CNI_NETNS missing", "ADD", &[("CNI_NETNS", Unset)], GUARD, 4, &["is missing"]),
    case("CNI_NETNS empty", "ADD", &[("CNI_NETNS", Set(""))], GUARD, 4, &["is empty"]),
    case("CNI_IFNAME missing", "ADD", &[("CNI_IFNAME", Unset)], GUARD, 4, &["is missing"]),
    case("CNI_IFNAME empty", "ADD", &[("CNI_IFNAME", Set(""))], GUARD, 4, &["is empty"]),
    case("CNI_PATH missing", "ADD", &[("CNI_PATH", Unset)], GUARD, 4, &["is missing"]),
    case("CNI_PATH empty", "ADD", &[("CNI_PATH", Set(""))], GUARD, 4, &["is empty"]),
    case("CNI_CONTAINERID too long", "ADD", &[("CNI_CONTAINERID", Long(5000))], GUARD, 4, &["too long"]),
    case("CNI_NETNS too long", "ADD", &[("CNI_NETNS", Long(5000))], GUARD, 4, &["too long"]),
    case("CNI_IFNAME too long", "ADD", &[("CNI_IFNAME", Long(5000))], GUARD, 4, &["too long"]),
    case("CNI_ARGS too long", "ADD", &[("CNI_ARGS", Long(5000))], GUARD, 4, &["too long"]),
    case("CNI_PATH too long", "ADD", &[("CNI_PATH", Long(5000))], GUARD, 4, &["too long"]),
    case("CNI_COMMAND too long", "ADD", &[("CNI_COMMAND", Long(5000))], GUARD, 4, &["unknown CNI_COMMAND"]),
    case("CNI_CONTAINERID with control characters", "ADD", &[("CNI_CONTAINERID", Set("abc\ndef"))], GUARD, 4, &["control characters"]),
    case("CNI_NETNS with control characters", "ADD", &[("CNI_NETNS", Set("/run/netns/x\n"))], GUARD, 4, &["control characters"]),
    case("CNI_IFNAME with control characters", "ADD", &[("CNI_IFNAME", Set("eth0\t"))], GUARD, 4, &["control characters"]),
    case("CNI_ARGS with control characters", "ADD", &[("CNI_ARGS", Set("K8S_POD_NAME=p\x1b[31m"))], GUARD, 4, &["control characters"]),
    case("CNI_PATH with control characters", "ADD", &[("CNI_PATH", Set("/opt/cni/bin\r"))], GUARD, 4, &["control characters"]),
    case("CNI_COMMAND with a newline", "ADD", &[("CNI_COMMAND", Set("ADD\n"))], GUARD, 4, &["unknown CNI_COMMAND"]),
    case("every required variable missing at once", "ADD", &[("CNI_CONTAINERID", Unset), ("CNI_NETNS", Unset), ("CNI_IFNAME", Unset), ("CNI_PATH", Unset)], GUARD, 4, &["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"]),

    // Container IDs and interface names that could name another file, for ADD and DEL.
    case("container id a/b", "ADD", &[("CNI_CONTAINERID", Set("a/b"))], GUARD, 4, &["CNI_CONTAINERID"]),
    case("container id ../../etc", "ADD", &[("CNI_CONTAINERID", Set("../../etc"))], GUARD, 4, &["CNI_CONTAINERID"]),
    case("container id ..", "ADD", &[("CNI_CONTAINERID", Set(".."))], GUARD, 4, &["CNI_CONTAINERID"]),
    case("container id .hidden", "ADD", &[("CNI_CONTAINERID", Set(".hidden"))], GUARD, 4, &["CNI_CONTAINERID"]),
    case("container id -dash", "ADD", &[("CNI_CONTAINERID", Set("-dash"))], GUARD, 4, &["CNI_CONTAINERID"]),
    case("container id ctr:1", "ADD", &[("CNI_CONTAINERID", Set("ctr:1"))], GUARD, 4, &["CNI_CONTAINERID"]),
    case("container id ctr 1", "ADD", &[("CNI_CONTAINERID", Set("ctr 1"))], GUARD, 4, &["CNI_CONTAINERID"]),
    case("container id over 200", "ADD", &[("CNI_CONTAINERID", Long(201))], GUARD, 4, &["longer than 200"]),
    case("ifname a/b", "ADD", &[("CNI_IFNAME", Set("a/b"))], GUARD, 4, &["CNI_IFNAME"]),
    case("ifname ..", "ADD", &[("CNI_IFNAME", Set(".."))], GUARD, 4, &["CNI_IFNAME"]),
    case("ifname .", "ADD", &[("CNI_IFNAME", Set("."))], GUARD, 4, &["CNI_IFNAME"]),
    case("ifname eth:0", "ADD", &[("CNI_IFNAME", Set("eth:0"))], GUARD, 4, &["CNI_IFNAME"]),
    case("ifname eth 0", "ADD", &[("CNI_IFNAME", Set("eth 0"))], GUARD, 4, &["CNI_IFNAME"]),
    case("ifname 0123456789abcdef", "ADD", &[("CNI_IFNAME", Set("0123456789abcdef"))], GUARD, 4, &["CNI_IFNAME"]),
    case("ifname 0123456789abcdefg", "ADD", &[("CNI_IFNAME", Set("0123456789abcdefg"))], GUARD, 4, &["CNI_IFNAME"]),
    case("container id a/b", "DEL", &[("CNI_CONTAINERID", Set("a/b"))], GUARD, 4, &["CNI_CONTAINERID"]),
    case("container id ../../etc", "DEL", &[("CNI_CONTAINERID", Set("../../etc"))], GUARD, 4, &["CNI_CONTAINERID"]),
    case("container id ..", "DEL", &[("CNI_CONTAINERID", Set(".."))], GUARD, 4, &["CNI_CONTAINERID"]),
    case("container id .hidden", "DEL", &[("CNI_CONTAINERID", Set(".hidden"))], GUARD, 4, &["CNI_CONTAINERID"]),
    case("container id -dash", "DEL", &[("CNI_CONTAINERID", Set("-dash"))], GUARD, 4, &["CNI_CONTAINERID"]),
    case("container id ctr:1", "DEL", &[("CNI_CONTAINERID", Set("ctr:1"))], GUARD, 4, &["CNI_CONTAINERID"]),
    case("container id ctr 1", "DEL", &[("CNI_CONTAINERID", Set("ctr 1"))], GUARD, 4, &["CNI_CONTAINERID"]),
    case("container id over 200", "DEL", &[("CNI_CONTAINERID", Long(201))], GUARD, 4, &["longer than 200"]),
    case("ifname a/b", "DEL", &[("CNI_IFNAME", Set("a/b"))], GUARD, 4, &["CNI_IFNAME"]),
    case("ifname ..", "DEL", &[("CNI_IFNAME", Set(".."))], GUARD, 4, &["CNI_IFNAME"]),
    case("ifname .", "DEL", &[("CNI_IFNAME", Set("."))], GUARD, 4, &["CNI_IFNAME"]),
    case("ifname eth:0", "DEL", &[("CNI_IFNAME", Set("eth:0"))], GUARD, 4, &["CNI_IFNAME"]),
    case("ifname eth 0", "DEL", &[("CNI_IFNAME", Set("eth 0"))], GUARD, 4, &["CNI_IFNAME"]),
    case("ifname 0123456789abcdef", "DEL", &[("CNI_IFNAME", Set("0123456789abcdef"))], GUARD, 4, &["CNI_IFNAME"]),
    case("ifname 0123456789abcdefg", "DEL", &[("CNI_IFNAME", Set("0123456789abcdefg"))], GUARD, 4, &["CNI_IFNAME"]),

    // Unknown and lower-case commands.
    case("command `add`", "ADD", &[("CNI_COMMAND", Set("add"))], GUARD, 4, &["unknown CNI_COMMAND"]),
    case("command `del`", "ADD", &[("CNI_COMMAND", Set("del"))], GUARD, 4, &["unknown CNI_COMMAND"]),
    case("command `Add`", "ADD", &[("CNI_COMMAND", Set("Add"))], GUARD, 4, &["unknown CNI_COMMAND"]),
    case("command `FROB`", "ADD", &[("CNI_COMMAND", Set("FROB"))], GUARD, 4, &["unknown CNI_COMMAND"]),
    case("command `ADD `", "ADD", &[("CNI_COMMAND", Set("ADD "))], GUARD, 4, &["unknown CNI_COMMAND"]),
    case("command `` (empty)", "ADD", &[("CNI_COMMAND", Set(""))], GUARD, 4, &["unknown CNI_COMMAND"]),

    // Stdin: empty, not JSON, the wrong shape, deeply nested, huge, invalid UTF-8.
    case("stdin empty", "ADD", &[], Raw(b""), 6, &["cannot decode"]),
    case("stdin not JSON", "ADD", &[], Raw(b"{not json"), 6, &["cannot decode"]),
    case("stdin a JSON array", "ADD", &[], Raw(b"[1,2]"), 6, &["not a JSON object"]),
    case("stdin a JSON string", "ADD", &[], Raw(b"\"x\""), 6, &["not a JSON object"]),
    case("stdin two objects", "ADD", &[], Raw(b"{}{}"), 6, &["cannot decode"]),
    case("stdin NUL bytes", "ADD", &[], Raw(b"\0\0\0"), 6, &["cannot decode"]),
    case("stdin invalid UTF-8", "ADD", &[], Raw(b"\xff\xfe\xfd"), 6, &["cannot decode"]),
    case("stdin invalid UTF-8 inside a string", "ADD", &[], Raw(b"{\"cniVersion\":\"1.0.0\",\"name\":\"\xc3\x28\"}"), 6, &["cannot decode"]),
    case("stdin with a byte-order mark", "ADD", &[], Raw(b"\xef\xbb\xbf{\"cniVersion\":\"1.0.0\"}"), 6, &["cannot decode"]),
    case("stdin nested 100000 deep", "ADD", &[], Made(nested_100000_deep), 6, &["cannot decode"]),
    case("config with a value nested 10000 deep", "ADD", &[], Made(config_nested_10000_deep), 6, &["cannot decode"]),
    case("stdin 100 MiB", "ADD", &[], Made(stdin_100_mib), 6, &["larger than 16 MiB"]),
    case("config of the wrong shape: name 5", "ADD", &[], Conf(r#"{"name":5}"#), 7, &["name"]),
    case("config of the wrong shape: delegate 7", "ADD", &[], Conf(r#"{"delegate":7}"#), 7, &["delegate"]),
    case("config of the wrong shape: attachments {\"a\":1}", "ADD", &[], Conf(r#"{"attachments":{"a":1}}"#), 7, &["attachments"]),
    case("config of the wrong shape: attachments [1]", "ADD", &[], Conf(r#"{"attachments":[1]}"#), 7, &["attachments"]),
    case("config of the wrong shape: runtimeConfig []", "ADD", &[], Conf(r#"{"runtimeConfig":[]}"#), 7, &["runtimeConfig"]),
    case("config of the wrong shape: prevResult \"x\"", "ADD", &[], Conf(r#"{"prevResult":"x"}"#), 7, &["prevResult"]),
    case("config of the wrong shape: waitSeconds \"5\"", "ADD", &[], Conf(r#"{"waitSeconds":"5"}"#), 7, &["waitSeconds"]),
    case("config of the wrong shape: waitSeconds -1", "ADD", &[], Conf(r#"{"waitSeconds":-1}"#), 7, &["waitSeconds"]),
    case("config of the wrong shape: strictPermissions \"yes\"", "ADD", &[], Conf(r#"{"strictPermissions":"yes"}"#), 7, &["strictPermissions"]),
    case("config of the wrong shape: cacheDir \"relative/cache\"", "ADD", &[], Conf(r#"{"cacheDir":"relative/cache"}"#), 7, &["cacheDir"]),
    case("config of the wrong shape: name \"../etc\"", "ADD", &[], Conf(r#"{"name":"../etc"}"#), 7, &["name"]),
    case("config of the wrong shape: name \"a/b\"", "ADD", &[], Conf(r#"{"name":"a/b"}"#), 7, &["name"]),
    case("config without a delegate", "ADD", &[], ConfWithout("delegate"), 7, &["delegate is required"]),

    // cniVersion unknown, missing, malformed.
    case("cniVersion \"9.9.9\"", "ADD", &[], Conf(r#"{"cniVersion":"9.9.9"}"#), 1, &["unsupported cniVersion"]),
    case("cniVersion \"0.2.0\"", "ADD", &[], Conf(r#"{"cniVersion":"0.2.0"}"#), 1, &["unsupported cniVersion"]),
    case("cniVersion \"1.0\"", "ADD", &[], Conf(r#"{"cniVersion":"1.0"}"#), 1, &["unsupported cniVersion"]),
    case("cniVersion \"v1.0.0\"", "ADD", &[], Conf(r#"{"cniVersion":"v1.0.0"}"#), 1, &["unsupported cniVersion"]),
    case("cniVersion \"\"", "ADD", &[], Conf(r#"{"cniVersion":""}"#), 1, &["unsupported cniVersion"]),
    case("cniVersion 1", "ADD", &[], Conf(r#"{"cniVersion":1}"#), 1, &["unsupported cniVersion"]),
    case("cniVersion null", "ADD", &[], Conf(r#"{"cniVersion":null}"#), 1, &["unsupported cniVersion"]),
    case("cniVersion missing", "ADD", &[], ConfWithout("cniVersion"), 7, &["cniVersion is required"]),
    case("STATUS before 1.1.0", "STATUS", &[], GUARD, 1, &["STATUS"]),
    case("GC before 1.1.0", "GC", &[], Conf(r#"{"cniVersion":"0.4.0"}"#), 1, &["GC"]),
    case("CHECK before 0.4.0", "CHECK", &[], Conf(r#"{"cniVersion":"0.3.1"}"#), 1, &["CHECK"]),

    // Delegate and attachment paths that are not a readable regular file.
    case("delegate: relative path", "ADD", &[], Conf(r#"{"delegate":"net.d/x.conf"}"#), 7, &["not an absolute path"]),
    case("delegate: a directory", "ADD", &[], Conf(r#"{"delegate":"{dir}/net.d"}"#), 11, &["directory"]),
    case("delegate: a FIFO", "ADD", &[], Conf(r#"{"delegate":"{dir}/net.d/fifo.conf"}"#), 11, &["FIFO"]).prep(&[Fifo("net.d/fifo.conf")]),
    case("delegate: a socket", "ADD", &[], Conf(r#"{"delegate":"{dir}/net.d/sock.conf"}"#), 11, &["socket"]).prep(&[Socket("net.d/sock.conf")]),
    case("delegate: /dev/zero", "ADD", &[], Conf(r#"{"delegate":"/dev/zero"}"#), 11, &["device"]),
    case("delegate: the guard's own stdin", "ADD", &[], Conf(r#"{"delegate":"/dev/stdin"}"#), 11, &["FIFO"]),
    case("delegate: a dangling symlink", "ADD", &[], Conf(r#"{"delegate":"{dir}/net.d/dangling.conf"}"#), 11, &["dangling symlink"]).prep(&[Symlink("net.d/dangling.conf", "net.d/nowhere")]),
    case("delegate: a symlink loop", "ADD", &[], Conf(r#"{"delegate":"{dir}/net.d/a.conf"}"#), 11, &["symlink loop"]).prep(&[Symlink("net.d/a.conf", "net.d/b.conf"), Symlink("net.d/b.conf", "net.d/a.conf")]),
    case("delegate: an unreadable file", "ADD", &[], Conf(r#"{"delegate":"{dir}/net.d/secret.conf"}"#), 11, &["not readable"]).prep(UNREADABLE).by_nobody_if_root(),
    case("attachment: relative path", "ADD", &[], Conf(r#"{"attachments":["net.d/x.conf"]}"#), 7, &["not an absolute path"]),
    case("attachment: a directory", "ADD", &[], Conf(r#"{"attachments":["{dir}/net.d"]}"#), 11, &["directory"]),
    case("attachment: a FIFO", "ADD", &[], Conf(r#"{"attachments":["{dir}/net.d/fifo.conf"]}"#), 11, &["FIFO"]).prep(&[Fifo("net.d/fifo.conf")]),
    case("attachment: a socket", "ADD", &[], Conf(r#"{"attachments":["{dir}/net.d/sock.conf"]}"#), 11, &["socket"]).prep(&[Socket("net.d/sock.conf")]),
    case("attachment: /dev/zero", "ADD", &[], Conf(r#"{"attachments":["/dev/zero"]}"#), 11, &["device"]),
    case("attachment: the guard's own stdin", "ADD", &[], Conf(r#"{"attachments":["/dev/stdin"]}"#), 11, &["FIFO"]),
    case("attachment: a dangling symlink", "ADD", &[], Conf(r#"{"attachments":["{dir}/net.d/dangling.conf"]}"#), 11, &["dangling symlink"]).prep(&[Symlink("net.d/dangling.conf", "net.d/nowhere")]),
    case("attachment: a symlink loop", "ADD", &[], Conf(r#"{"attachments":["{dir}/net.d/a.conf"]}"#), 11, &["symlink loop"]).prep(&[Symlink("net.d/a.conf", "net.d/b.conf"), Symlink("net.d/b.conf", "net.d/a.conf")]),
    case("attachment: an unreadable file", "ADD", &[], Conf(r#"{"attachments":["{dir}/net.d/secret.conf"]}"#), 11, &["not readable"]).prep(UNREADABLE).by_nobody_if_root(),

    // Delegates that name something the guard must never run (the delegate is net.d/00-multus.conf):
    // whole files no wait can fix, so configuration errors (7) at once.
    case("a type that is a path: ../../bin/sh", "ADD", &[], GUARD, 7, &["not a plain file name"]).prep(&[File("net.d/00-multus.conf", r#"{"cniVersion":"1.0.0","name":"n","type":"../../bin/sh"}"#)]),
    case("a type that is a path: /bin/sh", "ADD", &[], GUARD, 7, &["not a plain file name"]).prep(&[File("net.d/00-multus.conf", r#"{"cniVersion":"1.0.0","name":"n","type":"/bin/sh"}"#)]),
    case("a type that is a path: bin/sh", "ADD", &[], GUARD, 7, &["not a plain file name"]).prep(&[File("net.d/00-multus.conf", r#"{"cniVersion":"1.0.0","name":"n","type":"bin/sh"}"#)]),
    case("a type that is a path: .", "ADD", &[], GUARD, 7, &["not a plain file name"]).prep(&[File("net.d/00-multus.conf", r#"{"cniVersion":"1.0.0","name":"n","type":"."}"#)]),
    case("a type that is a path: ..", "ADD", &[], GUARD, 7, &["not a plain file name"]).prep(&[File("net.d/00-multus.conf", r#"{"cniVersion":"1.0.0","name":"n","type":".."}"#)]),
    case("an empty type", "ADD", &[], GUARD, 7, &["empty plugin type"]).prep(&[File("net.d/00-multus.conf", r#"{"cniVersion":"1.0.0","name":"n","type":""}"#)]),
    case("naming cni-guard", "ADD", &[], GUARD, 7, &["itself"]).prep(&[File("net.d/00-multus.conf", r#"{"cniVersion":"1.0.0","name":"n","type":"cni-guard"}"#)]),
    case("naming cni-guard through a conflist", "ADD", &[], Conf(r#"{"delegate":"{dir}/net.d/10-chain.conflist"}"#), 7, &["itself"]).prep(&[File("net.d/10-chain.conflist", r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"bridge"},{"type":"cni-guard"}]}"#)]),
    case("naming cni-guard inside Multus delegates", "ADD", &[], GUARD, 7, &["itself"]).prep(&[File("net.d/00-multus.conf", r#"{"cniVersion":"0.3.1","name":"m","type":"bridge","delegates":[{"cniVersion":"0.3.1","name":"g","plugins":[{"type":"cni-guard"}]}]}"#)]),
    case("an attachment naming cni-guard", "ADD", &[], Conf(r#"{"attachments":["{dir}/net.d/05-cilium.conflist"]}"#), 7, &["itself"]).prep(&[File("net.d/05-cilium.conflist", r#"{"cniVersion":"1.0.0","name":"c","plugins":[{"type":"cni-guard"}]}"#)]),
    case("naming a missing binary", "ADD", &[], GUARD, 11, &["\"no-such-plugin\"", "not in CNI_PATH"]).prep(&[File("net.d/00-multus.conf", r#"{"cniVersion":"1.0.0","name":"n","type":"no-such-plugin"}"#)]),
    case("naming a binary that is not executable", "ADD", &[], GUARD, 11, &["not executable"]).prep(&[File("net.d/00-multus.conf", r#"{"cniVersion":"1.0.0","name":"n","type":"noexec"}"#)]),
    case("a group-writable delegate in strict mode", "ADD", &[], Conf(r#"{"strictPermissions":true}"#), 7, &["strictPermissions"]).prep(&[Chmod("net.d/00-multus.conf", 0o664)]),

    // Cache dirs the guard must not write into.
    case("a symlinked cache dir", "ADD", &[], Conf(r#"{"cacheDir":"{dir}/linked-cache"}"#), 7, &["symlink"]).prep(&[Dir("elsewhere"), Symlink("linked-cache", "elsewhere")]),
    case("a world-writable cache dir", "ADD", &[], Conf(r#"{"cacheDir":"{dir}/open-cache"}"#), 7, &["writable by others"]).prep(&[Dir("open-cache"), Chmod("open-cache", 0o777)]),
    case("a group-writable cache dir", "ADD", &[], Conf(r#"{"cacheDir":"{dir}/group-cache"}"#), 7, &["writable by its group"]).prep(&[Dir("group-cache"), Chmod("group-cache", 0o770)]),
    case("a cache dir that is a file", "ADD", &[], Conf(r#"{"cacheDir":"{dir}/file-cache"}"#), 7, &["not a directory"]).prep(&[File("file-cache", "")]),
    case("a cache dir owned by another user", "ADD", &[], Conf(r#"{"cacheDir":"{dir}/foreign-cache"}"#), 7, &["owned by uid 4242"]).prep(&[Dir("foreign-cache"), Chown("foreign-cache", 4242)]).root_only(),
    case("a symlink planted as the network's record dir", "ADD", &[], Conf(r#"{"cacheDir":"{dir}/cache2"}"#), 7, &["symlink"]).prep(&[Dir("cache2"), Chmod("cache2", 0o700), Dir("elsewhere2"), Symlink("cache2/guarded", "elsewhere2")]),

    // prevResult malformed for CHECK and DEL. An object that is not a valid result is refused
    // by CHECK only: DEL is never refused over it and tears down without a prevResult
    // (plugin/tests/cni.rs, del::a_malformed_prev_result_does_not_stop_teardown).
    case("malformed prevResult \"x\"", "CHECK", &[], Conf(r#"{"prevResult":"x"}"#), 7, &["prevResult: invalid type"]),
    case("malformed prevResult [1]", "CHECK", &[], Conf(r#"{"prevResult":[1]}"#), 7, &["prevResult: invalid type"]),
    case("malformed prevResult {\"ips\":\"x\"}", "CHECK", &[], Conf(r#"{"prevResult":{"ips":"x"}}"#), 6, &["invalid prevResult"]),
    case("malformed prevResult {\"ips\":[{}]}", "CHECK", &[], Conf(r#"{"prevResult":{"ips":[{}]}}"#), 6, &["invalid prevResult"]),
    case("malformed prevResult {\"cniVersion\":\"x.y\"}", "CHECK", &[], Conf(r#"{"prevResult":{"cniVersion":"x.y"}}"#), 6, &["invalid prevResult"]),
    case("malformed prevResult {\"cniVersion\":\"1.0.0\",\"dns\":[]}", "CHECK", &[], Conf(r#"{"prevResult":{"cniVersion":"1.0.0","dns":[]}}"#), 6, &["invalid prevResult"]),
    case("malformed prevResult \"x\"", "DEL", &[], Conf(r#"{"prevResult":"x"}"#), 7, &["prevResult: invalid type"]),
    case("malformed prevResult [1]", "DEL", &[], Conf(r#"{"prevResult":[1]}"#), 7, &["prevResult: invalid type"]),
];

fn nested_100000_deep(_: &Fx) -> Vec<u8> {
    vec![b'['; 100_000]
}

fn config_nested_10000_deep(fx: &Fx) -> Vec<u8> {
    let mut conf = serde_json::to_string(&fx.guard(json!({}))).unwrap();
    conf.pop();
    conf.push_str(",\"args\":");
    conf.push_str(&"{\"a\":".repeat(10_000));
    conf.push_str(&"}".repeat(10_001));
    conf.into_bytes()
}

fn stdin_100_mib(_: &Fx) -> Vec<u8> {
    let mut b = b"{\"cniVersion\":\"1.0.0\",\"pad\":\"".to_vec();
    b.resize(100 << 20, b'x');
    b
}

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
        std::fs::write(
            fx.path("net.d/00-multus.conf"),
            serde_json::to_vec(&json!({"cniVersion":"1.0.0","name":"multus-net","type":"bridge"}))
                .unwrap(),
        )
        .unwrap();
        std::fs::write(
            fx.path("fake/bridge.ADD.out"),
            json!({"cniVersion":"1.0.0","ips":[{"address":"10.1.0.2/24"}]}).to_string(),
        )
        .unwrap();
        // One real attachment, so that "the cache dir is unchanged" has something to keep.
        let add = fx.run(&Call {
            cmd: "ADD",
            env: vec![("CNI_CONTAINERID", Some("existing".into()))],
            stdin: Stdin::Json(fx.guard(json!({}))),
            as_nobody: false,
        });
        assert_eq!(add.status, Some(0), "fixture ADD: {}", add.stderr_text());
        assert!(fx.path("cache/guarded/existing:eth0.json").is_file());
        fx
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
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

    /// Prepares what `case` needs in the fixture and returns the guard's invocation.
    fn call(&self, case: &Case) -> Call {
        for p in case.prep {
            match *p {
                Dir(d) => std::fs::create_dir(self.path(d)).unwrap(),
                File(f, body) => std::fs::write(self.path(f), body).unwrap(),
                Chmod(f, mode) => {
                    std::fs::set_permissions(self.path(f), std::fs::Permissions::from_mode(mode))
                        .unwrap()
                }
                Chown(f, id) => std::os::unix::fs::chown(self.path(f), Some(id), Some(id)).unwrap(),
                Symlink(link, to) => {
                    std::os::unix::fs::symlink(self.path(to), self.path(link)).unwrap()
                }
                Fifo(f) => mkfifo(&self.path(f)),
                Socket(f) => {
                    let l = std::os::unix::net::UnixListener::bind(self.path(f)).unwrap();
                    std::mem::forget(l);
                }
            }
        }
        let as_nobody = case.nobody_if_root && test_support::is_root();
        if as_nobody {
            for d in [self.dir.path(), &self.path("net.d")] {
                std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
            }
        }
        let stdin = match case.stdin {
            Conf(extra) => {
                // The fixture's path as it reads inside a JSON string.
                let dir = serde_json::to_string(self.dir.path()).unwrap();
                let extra = extra.replace("{dir}", &dir[1..dir.len() - 1]);
                Stdin::Json(self.guard(serde_json::from_str(&extra).unwrap()))
            }
            ConfWithout(field) => {
                let mut c = self.guard(json!({}));
                c.as_object_mut().unwrap().remove(field);
                Stdin::Json(c)
            }
            Raw(bytes) => Stdin::Raw(bytes.to_vec()),
            Made(make) => Stdin::Raw(make(self)),
        };
        let env = case.env.iter().map(|(k, v)| {
            let v = match *v {
                Unset => None,
                Set(s) => Some(OsString::from(s)),
                Long(n) => Some(OsString::from("a".repeat(n))),
            };
            (*k, v)
        });
        Call {
            cmd: case.cmd,
            env: env.collect(),
            stdin,
            as_nobody,
        }
    }

    fn run(&self, call: &Call) -> Run {
        let defaults: [(&str, Option<OsString>); 8] = [
            ("PATH", Some("/usr/bin:/bin".into())),
            ("FAKE_DIR", Some(self.path("fake").into())),
            ("CNI_GUARD_SYSLOG", Some(self.path("no-syslog").into())),
            ("CNI_COMMAND", Some(call.cmd.into())),
            ("CNI_CONTAINERID", Some("ctr1".into())),
            ("CNI_NETNS", Some("/run/netns/hostile".into())),
            ("CNI_IFNAME", Some("eth0".into())),
            ("CNI_PATH", Some(self.path("bin").into())),
        ];
        let mut c = test_support::command(
            env!("CARGO_BIN_EXE_cni-guard"),
            defaults.into_iter().chain(call.env.iter().cloned()),
        );
        if call.as_nobody {
            c.uid(NOBODY).gid(NOBODY);
        }
        test_support::run(&mut c, &call.stdin.bytes())
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

fn mkfifo(p: &Path) {
    let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
    // SAFETY: c is a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

#[test]
fn hostile_input_is_refused_cleanly() {
    assert!(
        CASES.len() >= CASES_AT_LEAST,
        "only {} cases: a row was lost",
        CASES.len()
    );
    let mut names = BTreeSet::new();
    for case in CASES {
        assert!(
            names.insert((case.name, case.cmd)),
            "two {} cases named {:?}",
            case.cmd,
            case.name
        );
    }
    // The root-only cases are gated like any root-only suite: a failure under CI=true, a loud
    // skip of those cases (and only those) otherwise.
    let missing = if test_support::is_root() {
        vec![]
    } else {
        vec!["root".to_owned()]
    };
    let root_only = test_support::prerequisites("hostile input: the root-only cases", &missing);
    let mut failures = Vec::new();
    let mut ran = 0;
    for (i, case) in CASES.iter().enumerate() {
        if case.root_only && !root_only {
            continue;
        }
        ran += 1;
        let fx = Fx::new();
        let call = fx.call(case);
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
        if let Err(why) = check(&fx, &call, &run, case, &before, took) {
            failures.push(format!(
                "{label}: {why}\n  stdout: {}\n  stderr: {}",
                String::from_utf8_lossy(&run.stdout),
                run.stderr_text().trim()
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        ran,
        failures.join("\n")
    );
    eprintln!("{ran} hostile cases passed");
}

fn check(
    fx: &Fx,
    call: &Call,
    run: &Run,
    case: &Case,
    before: &BTreeMap<PathBuf, String>,
    took: Duration,
) -> Result<(), String> {
    if run.stderr_text().contains("panicked") {
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
    if reply["code"].as_u64() != Some(case.code) {
        return Err(format!("code {}, want {}", reply["code"], case.code));
    }
    let msg = reply["msg"].as_str().ok_or("msg is not a string")?;
    if let Some(d) = obj.get("details") {
        d.as_str().ok_or("details is not a string")?;
    }
    for part in case.msg {
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
    let out = test_support::run_cleared(
        env!("CARGO_BIN_EXE_cni-guard"),
        [
            ("CNI_CONTAINERID", Some(OsString::from("ctr1"))),
            ("CNI_PATH", Some(fx.path("bin").into())),
        ],
        b"",
    );
    assert_eq!(out.status, Some(2));
    assert!(out.stdout.is_empty());
    assert!(!out.stderr_text().contains("panicked"));
    assert_eq!(fx.snapshot(), before);
}

/// A record names the delegate DEL runs, as the guard's user: one another user could have
/// written (group- or world-writable, or owned by another uid) is not trusted, and the delegate
/// it names never runs. The owner case needs root (chown); it is gated like any root-only case.
#[test]
fn a_planted_record_is_not_trusted() {
    let planted = |fx: &Fx, id: &str| -> PathBuf {
        // The fixture's own record, made to name another plugin: what a planter would write.
        let evil = Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/plugins/fake-plugin");
        std::os::unix::fs::symlink(evil, fx.path("bin/evil")).unwrap();
        let mine = std::fs::read_to_string(fx.path("cache/guarded/existing:eth0.json")).unwrap();
        assert!(mine.contains("bridge"), "{mine}");
        let theirs = mine
            .replace("existing", id)
            .replace("\\\"bridge\\\"", "\\\"evil\\\"")
            .replace("\"bridge\"", "\"evil\"");
        assert!(
            theirs.contains("evil"),
            "the planted record names no other plugin: {theirs}"
        );
        let path = fx.path(&format!("cache/guarded/{id}:eth0.json"));
        std::fs::write(&path, theirs).unwrap();
        path
    };
    let del = |fx: &Fx, id: &str| -> Run {
        fx.run(&Call {
            cmd: "DEL",
            env: vec![("CNI_CONTAINERID", Some(id.into()))],
            stdin: Stdin::Json(fx.guard(json!({}))),
            as_nobody: false,
        })
    };
    // Writable by its group.
    let fx = Fx::new();
    let path = planted(&fx, "planted");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o660)).unwrap();
    // DEL succeeds, the planted delegate never runs, and the log says why.
    let not_run = |fx: &Fx, id: &str, why: &str| {
        let run = del(fx, id);
        assert_eq!(run.status, Some(0), "{}", run.stderr_text());
        let calls = std::fs::read_to_string(fx.path("fake/calls")).unwrap();
        assert!(
            !calls.contains("evil"),
            "the planted record's delegate ran: {calls}"
        );
        assert!(run.stderr_text().contains(why), "{}", run.stderr_text());
    };
    not_run(&fx, "planted", "not trusted");
    // Owned by another user.
    let missing = if test_support::is_root() {
        vec![]
    } else {
        vec!["root".to_owned()]
    };
    if !test_support::prerequisites("a planted record owned by another user", &missing) {
        return;
    }
    let fx = Fx::new();
    let path = planted(&fx, "foreign");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::chown(&path, Some(4242), Some(4242)).unwrap();
    not_run(&fx, "foreign", "owned by uid 4242");
}
