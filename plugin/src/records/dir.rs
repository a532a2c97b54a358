//! The cache folder: a real directory owned by the guard's user and writable by nobody else.

use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::error::{Error, Kind, Result};
use crate::sys;
use crate::sys::at;

/// What [`check_dir`] looks at, from `lstat` or from `fstat` on an open directory.
pub(super) struct DirMeta {
    is_symlink: bool,
    is_dir: bool,
    uid: u32,
    mode: u32,
}

impl DirMeta {
    pub(super) fn of(meta: &std::fs::Metadata) -> DirMeta {
        DirMeta {
            is_symlink: meta.file_type().is_symlink(),
            is_dir: meta.is_dir(),
            uid: meta.uid(),
            mode: meta.mode(),
        }
    }

    pub(super) fn stat(fd: &OwnedFd, path: &Path) -> Result<DirMeta> {
        let st = at::fstat(fd).map_err(|e| io_error(path, "examine", &e))?;
        Ok(DirMeta {
            is_symlink: false,
            is_dir: st.st_mode & libc::S_IFMT == libc::S_IFDIR,
            uid: st.st_uid,
            mode: st.st_mode,
        })
    }
}

pub(super) fn check_dir(path: &Path, meta: &DirMeta) -> Result<()> {
    let refuse = |why: &str| {
        Err(Error::new(
            Kind::Misconfigured,
            format!("cacheDir {} {why}", path.display()),
        )
        .with_details("the guard keeps its records only in a private directory it owns"))
    };
    if meta.is_symlink {
        return refuse("is a symlink");
    }
    if !meta.is_dir {
        return refuse("is not a directory");
    }
    let euid = sys::geteuid();
    if meta.uid != euid {
        return refuse(&format!(
            "is owned by uid {}, not by the guard's uid {euid}",
            meta.uid
        ));
    }
    // Whoever can write here can plant a record whose delegate DEL then runs as the guard's
    // user (root): group members included.
    match meta.mode & 0o022 {
        0 => Ok(()),
        0o020 => refuse("is writable by its group"),
        0o002 => refuse("is writable by others"),
        _ => refuse("is writable by others and by its group"),
    }
}

pub(super) fn dir_open_error(path: &Path, e: &io::Error) -> Error {
    match e.raw_os_error() {
        Some(libc::ELOOP) => Error::new(
            Kind::Misconfigured,
            format!("cacheDir {} is a symlink", path.display()),
        )
        .with_details("the guard keeps its records only in a private directory it owns"),
        Some(libc::ENOTDIR) => Error::new(
            Kind::Misconfigured,
            format!("cacheDir {} is not a directory", path.display()),
        )
        .with_details("the guard keeps its records only in a private directory it owns"),
        _ => io_error(path, "open", e),
    }
}

pub(super) fn io_error(path: &Path, what: &str, e: &io::Error) -> Error {
    Error::new(Kind::Io, format!("cannot {what} {}: {e}", path.display()))
}
