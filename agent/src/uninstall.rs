//! `cni-guard-agent uninstall`: removes the guard's conflist, then its binary, so that containerd
//! never points at a missing binary. Nothing else removes the conflist: not `keep` on SIGTERM,
//! not a pod shutting down.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use crate::daemon::{signal_name, wait_readable, TermSignals};
use crate::files::remove_durably;
use crate::spec::{DEFAULT_CONF_NAME, PLUGIN_TYPE};
use crate::Flags;
use cni_guard::error::{Error, Kind, Result};

/// Between the conflist's removal and the binary's: the runtime reloads its CNI configuration a
/// few milliseconds after a change in the conf dir (containerd: 1-5 ms), and a CNI call that had
/// read the old configuration just before runs the binary right after.
const SETTLE: Duration = Duration::from_secs(2);

const HELP: &str = "\
Usage: cni-guard-agent uninstall --bin-dir DIR --conf-dir DIR [options]

Removes the guard's conflist, then, 2 s later, DIR/cni-guard (in that order and with that pause,
so the runtime never uses a conflist whose plugin binary is gone). Files already gone are fine. Stop `cni-guard-agent keep`
first, or it puts the conflist back. Once the conflist is gone, containerd uses the next
config in the conf dir (the delegate, e.g. 00-multus.conf) directly.

Paths as mounted in this container:
  --bin-dir DIR          the CNI bin dir, e.g. /host/opt/cni/bin (required)
  --conf-dir DIR         the CNI conf dir, e.g. /host/etc/cni/net.d (required)
  --conf-name NAME       the guard's file name [00-cni-guard.conflist]
  --stay                 afterwards, wait for SIGTERM instead of exiting (for a DaemonSet whose
                         pods show by running that their node is done)
";

pub fn run(args: Vec<OsString>) -> Result<i32> {
    let mut flags = Flags::new(args);
    let mut bin_dir: Option<PathBuf> = None;
    let mut conf_dir: Option<PathBuf> = None;
    let mut conf_name = DEFAULT_CONF_NAME.to_string();
    let mut stay = false;
    while let Some(flag) = flags.next_flag()? {
        match flag.as_str() {
            "--help" | "-h" => {
                print!("{HELP}");
                return Ok(0);
            }
            "--bin-dir" => bin_dir = Some(flags.path(&flag)?),
            "--conf-dir" => conf_dir = Some(flags.path(&flag)?),
            "--conf-name" => conf_name = flags.value(&flag)?,
            "--stay" => stay = true,
            other => return Err(Flags::unknown(other)),
        }
    }
    let bin_dir = bin_dir.ok_or_else(|| crate::usage_error("--bin-dir is required"))?;
    let conf_dir = conf_dir.ok_or_else(|| crate::usage_error("--conf-dir is required"))?;
    if conf_name.contains('/') || conf_name.is_empty() {
        return Err(crate::usage_error(format!(
            "--conf-name {conf_name:?}: must be a file name"
        )));
    }
    // A folder that is not there is a wrong flag or a missing mount, not a guard already gone:
    // saying "absent" would report a removal that never happened.
    for dir in [&conf_dir, &bin_dir] {
        if !dir.is_dir() {
            let msg = format!(
                "{} is not a directory (is the host folder mounted?); nothing was removed",
                dir.display()
            );
            return Err(Error::new(Kind::Misconfigured, msg));
        }
    }
    // Block the stop signals before doing anything, so a SIGTERM during removal cannot cut the
    // pair in half; it is seen (and honoured) only once both are gone.
    let signals = if stay {
        Some(TermSignals::block().map_err(|e| Error::new(Kind::Io, format!("signalfd: {e}")))?)
    } else {
        None
    };

    for (dir, name) in [(&conf_dir, conf_name.as_str()), (&bin_dir, PLUGIN_TYPE)] {
        let path = dir.join(name);
        match remove_durably(dir, name) {
            Ok(true) if name != PLUGIN_TYPE => {
                println!("removed {}", path.display());
                // The runtime reloads its configuration a few milliseconds after the removal; a
                // pod start that had already read the guard's conflist runs the binary after it.
                println!("waiting {} s before removing the binary", SETTLE.as_secs());
                std::thread::sleep(SETTLE);
            }
            Ok(true) => println!("removed {}", path.display()),
            Ok(false) => println!("absent {}", path.display()),
            Err(e) => {
                return Err(Error::new(
                    Kind::Io,
                    format!(
                        "removing {}: {e} (nothing after it was removed)",
                        path.display()
                    ),
                ))
            }
        }
    }

    if let Some(signals) = signals {
        println!("uninstalled; waiting for SIGTERM");
        loop {
            wait_readable(&[signals.as_fd()], -1)
                .map_err(|e| Error::new(Kind::Io, format!("poll: {e}")))?;
            if let Some(signo) = signals
                .take()
                .map_err(|e| Error::new(Kind::Io, format!("signalfd: {e}")))?
            {
                println!("{}: exiting", signal_name(signo));
                break;
            }
        }
    }
    Ok(0)
}
