//! `cni-guard install`: puts the binary into the CNI bin dir and the guard's conflist into the
//! conf dir, each as one atomic rename, and only when the content differs.
//!
//! Order: the binary first, so the conflist never names a binary that is not there yet. The
//! refusal check comes before both, so a refused install writes nothing.

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};

use super::files::{conf_files_before, write_atomically, Written};
use super::spec::{GuardFile, PLUGIN_TYPE, SPEC_FLAGS_HELP};
use super::Flags;
use crate::error::{Error, Kind, Result};

fn help() -> String {
    format!(
        "\
Usage: cni-guard install --bin-dir DIR --conf-dir DIR --delegate FILE [options]

Copies this binary to DIR/cni-guard and writes the guard's conflist, each atomically (temp
file in the same folder, fsync, rename), and neither when its content is already there.
Refuses, writing nothing, when another config in the conf dir sorts before the guard's file:
containerd would use that one and the guard would not be in force.

Also written by this process:
  --bin-dir DIR          the CNI bin dir, e.g. /host/opt/cni/bin (required)
  --binary FILE          the binary to copy [this running binary]

{SPEC_FLAGS_HELP}"
    )
}

pub fn run(args: Vec<OsString>) -> Result<i32> {
    let mut flags = Flags::new(args);
    let mut spec = GuardFile::default();
    let mut bin_dir: Option<PathBuf> = None;
    let mut binary: Option<PathBuf> = None;
    while let Some(flag) = flags.next_flag()? {
        match flag.as_str() {
            "--help" | "-h" => {
                print!("{}", help());
                return Ok(0);
            }
            "--bin-dir" => bin_dir = Some(flags.path(&flag)?),
            "--binary" => binary = Some(flags.path(&flag)?),
            other => {
                if !spec.take_flag(other, &mut flags)? {
                    return Err(Flags::unknown(other));
                }
            }
        }
    }
    let conf_dir = spec.validate()?;
    let bin_dir = bin_dir.ok_or_else(|| Error::usage("--bin-dir is required"))?;
    for dir in [&bin_dir, &conf_dir.to_path_buf()] {
        if !dir.is_dir() {
            return Err(Error::new(
                Kind::Misconfigured,
                format!(
                    "{} is not a directory (is the host folder mounted?)",
                    dir.display()
                ),
            ));
        }
    }

    refuse_unless_first(conf_dir, &spec.conf_name)?;

    let program = read_binary(binary.as_deref())?;
    let outcome = write_atomically(&bin_dir, PLUGIN_TYPE, &program, 0o755).map_err(|e| {
        Error::new(
            Kind::Io,
            format!("writing {}: {e}", bin_dir.join(PLUGIN_TYPE).display()),
        )
    })?;
    report(&bin_dir.join(PLUGIN_TYPE), outcome);

    let conf_path = conf_dir.join(&spec.conf_name);
    let outcome = write_atomically(conf_dir, &spec.conf_name, &spec.render(), 0o644)
        .map_err(|e| Error::new(Kind::Io, format!("writing {}: {e}", conf_path.display())))?;
    report(&conf_path, outcome);
    Ok(0)
}

/// Fails when a config in `conf_dir` sorts before `conf_name`.
pub fn refuse_unless_first(conf_dir: &Path, conf_name: &str) -> Result<()> {
    let before = conf_files_before(conf_dir, conf_name)
        .map_err(|e| Error::new(Kind::Io, format!("listing {}: {e}", conf_dir.display())))?;
    if before.is_empty() {
        return Ok(());
    }
    Err(Error::new(
        Kind::Misconfigured,
        format!(
        "refusing to install: {} sorts before {conf_name} in {}, so containerd would use it and \
         the guard would not be in force; move it out of the conf dir or choose a --conf-name \
         that sorts first (nothing was written)",
        before.join(", "),
        conf_dir.display(),
    ),
    ))
}

fn read_binary(binary: Option<&Path>) -> Result<Vec<u8>> {
    // /proc/self/exe is this program even when its path is gone or not visible here.
    let source = binary.unwrap_or(Path::new("/proc/self/exe"));
    let bytes = match fs::read(source) {
        Ok(bytes) => bytes,
        Err(_) if binary.is_none() => std::env::current_exe()
            .and_then(fs::read)
            .map_err(|e| Error::new(Kind::Io, format!("reading this program's binary: {e}")))?,
        Err(e) => {
            return Err(Error::new(
                Kind::Io,
                format!("reading {}: {e}", source.display()),
            ))
        }
    };
    if bytes.is_empty() {
        return Err(Error::new(
            Kind::Misconfigured,
            format!("{} is empty", source.display()),
        ));
    }
    Ok(bytes)
}

fn report(path: &Path, outcome: Written) {
    let what = match outcome {
        Written::Unchanged => "unchanged",
        Written::Created => "created",
        Written::Replaced => "replaced",
    };
    println!("{what} {}", path.display());
}
