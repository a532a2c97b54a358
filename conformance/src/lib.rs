//! Conformance suites: cni-guard under cnitool and containerd, in network namespaces.
//!
//! The library holds the small pieces the suites share: namespaces that remove themselves
//! (`netns`), a conf-dir/bin-dir fixture (`fixture`), the cnitool runner (`cnitool`), the
//! containerd-like choice of a network from a conf dir (`confdir`), what a sandbox looks like
//! (`sandbox`), leak checks (`leaks`), the prerequisite check (`prereq`) and which cnitool and
//! reference plugins a run uses (`generation`).
pub mod cnitool;
pub mod confdir;
pub mod fixture;
pub mod generation;
pub mod leaks;
pub mod netns;
pub mod prereq;
pub mod sandbox;

use std::process::{Command, Output};

/// Lower-case hex of `n` random bytes (names of namespaces, networks, temp dirs).
pub fn random_hex(n: usize) -> String {
    use std::io::Read;
    let mut buf = vec![0u8; n];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .expect("read /dev/urandom");
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

/// Runs a command to completion; a non-zero exit is an error carrying its stderr.
pub fn run(cmd: &mut Command) -> Result<Output, String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(format!(
            "{cmd:?}: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Runs a command and returns its stdout; panics with the command and its stderr on failure.
pub fn must(cmd: &mut Command) -> String {
    match run(cmd) {
        Ok(out) => String::from_utf8_lossy(&out.stdout).into_owned(),
        Err(e) => panic!("{e}"),
    }
}
