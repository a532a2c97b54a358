//! `cni-guard-agent install`: puts the plugin binary (`cni-guard`, beside the agent unless
//! `--binary` says otherwise) into the CNI bin dir and the guard's conflist into the conf dir,
//! each as one atomic rename, and only when the content differs. Only the plugin goes onto the
//! host: the agent stays in its image.
//!
//! Order: the binary first, so the conflist never names a binary that is not there yet. The
//! refusal check comes before both, so a refused install writes nothing.

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};

use crate::files::{conf_files_before, write_atomically, Written};
use crate::spec::{GuardFile, PLUGIN_TYPE, SPEC_FLAGS_HELP};
use crate::Flags;
use cni_guard::error::{Error, Kind, Result};

fn help() -> String {
    format!(
        "\
Usage: cni-guard-agent install --bin-dir DIR --conf-dir DIR --delegate FILE [options]

Copies the plugin binary to DIR/cni-guard (after asking it for its CNI VERSION) and writes the guard's conflist, each atomically (temp
file in the same folder, fsync, rename), and neither when its content is already there.
Refuses, writing nothing, when another config in the conf dir sorts before the guard's file:
containerd would use that one and the guard would not be in force.

Also written by this process:
  --bin-dir DIR          the CNI bin dir, e.g. /host/opt/cni/bin (required)
  --binary FILE          the plugin binary to copy [cni-guard beside this program]

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
    let bin_dir = bin_dir.ok_or_else(|| crate::usage_error("--bin-dir is required"))?;
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
    for warning in spec.budget_warnings() {
        cni_guard::log::to_stderr(&format!("cni-guard install: warning: {warning}"));
    }

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

/// The plugin's bytes, once the file has answered CNI VERSION as the plugin does: the agent
/// itself, or anything else, in the CNI bin dir would fail every pod start on the node.
fn read_binary(binary: Option<&Path>) -> Result<Vec<u8>> {
    let source = match binary {
        Some(b) => b.to_owned(),
        None => std::env::current_exe()
            .map_err(|e| Error::new(Kind::Io, format!("locating this program: {e}")))?
            .with_file_name(PLUGIN_TYPE),
    };
    let bytes = fs::read(&source)
        .map_err(|e| Error::new(Kind::Io, format!("reading {}: {e}", source.display())))?;
    // Pipes, not /dev/null: an image built FROM scratch has no /dev.
    let answer = std::process::Command::new(&source)
        .env_clear()
        .env("CNI_COMMAND", "VERSION")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            drop(child.stdin.take());
            child.wait_with_output()
        });
    let speaks_cni = answer.as_ref().is_ok_and(|out| {
        out.status.success()
            && serde_json::from_slice::<serde_json::Value>(&out.stdout)
                .is_ok_and(|v| v["supportedVersions"].is_array())
    });
    if !speaks_cni {
        return Err(Error::new(
            Kind::Misconfigured,
            format!(
                "{} is not the cni-guard plugin: it does not answer CNI VERSION (nothing was written)",
                source.display()
            ),
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
