//! Writing into CNI folders the way a running runtime tolerates: whole files only (temp file in
//! the same folder, fsync, rename, fsync the folder), nothing at all when the content is
//! already there, and the conf-dir ordering libcni and containerd apply.

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use cni_guard::sys::at;

/// What an atomic write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// The file already had this content (its mode may have been corrected); not rewritten.
    Unchanged,
    /// The file did not exist and was created.
    Created,
    /// The file existed with other content and was replaced.
    Replaced,
}

/// Puts `content` at `dir/name` with `mode`, so that a concurrent reader sees either the old
/// whole file or the new whole file, never a part. When the file already holds exactly
/// `content`, nothing is written (its mtime stays), because containerd reloads its CNI config
/// on every write in the conf dir.
pub fn write_atomically(dir: &Path, name: &str, content: &[u8], mode: u32) -> io::Result<Written> {
    let target = dir.join(name);
    let existed = match fs::read(&target) {
        Ok(current) if current == content => {
            let meta = fs::metadata(&target)?;
            if meta.permissions().mode() & 0o7777 != mode {
                fs::set_permissions(&target, fs::Permissions::from_mode(mode))?;
            }
            return Ok(Written::Unchanged);
        }
        Ok(_) => true,
        Err(e) if e.kind() == io::ErrorKind::NotFound => false,
        // A directory or an unreadable file in the way: replacing it blindly could lose
        // something that is not ours, so let the rename below decide (it fails on a folder).
        Err(_) => true,
    };

    // The plugin's one atomic writer, with fsync: a temp file of this writer's own (hidden,
    // ending in `.tmp`, so that neither libcni, which lists `.conf`, `.conflist`, `.json`, nor a
    // CNI_PATH lookup ever picks it up), renamed into place. Two writers of one file (a keep and
    // an install overlapping in a rollout, or install run by hand beside keep) each write their
    // own, and neither touches the other's.
    let dir_fd = at::open_dir(None, dir.as_os_str())?;
    sweep_stale_temps(dir, name);
    let result = at::write_replace(&dir_fd, name, &temp_name(name), content, mode, true);
    result.map(|()| {
        if existed {
            Written::Replaced
        } else {
            Written::Created
        }
    })
}

/// A temp file name for `name` that no other writer uses: `.<name>.<pid>-<n>-<nanos>.tmp` (the
/// pid alone is not enough: writers in other containers have their own pid namespaces).
fn temp_name(name: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(".{name}.{}-{n}-{nanos}.tmp", std::process::id())
}

/// A writer's temp file older than this was left by a writer that was killed (a live one
/// renames its file within milliseconds).
pub const STALE_TEMP: Duration = Duration::from_secs(600);

/// Removes the temp files of `name` that killed writers left in `dir` (this version's and the
/// `.<name>.tmp` of earlier ones), those older than [`STALE_TEMP`]: a younger one may be
/// another writer's, under way. Best effort: what cannot be read or removed stays.
fn sweep_stale_temps(dir: &Path, name: &str) {
    let prefix = format!(".{name}.");
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let file = entry.file_name();
        let Some(file) = file.to_str() else { continue };
        if !(file.starts_with(&prefix) && file.ends_with(".tmp")) {
            continue;
        }
        let age = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok());
        if age.is_some_and(|a| a > STALE_TEMP) {
            let _ = fs::remove_file(entry.path());
        }
    }
}

/// Removes `dir/name` and makes the removal durable. `Ok(false)` when it was already gone.
pub fn remove_durably(dir: &Path, name: &str) -> io::Result<bool> {
    match fs::remove_file(dir.join(name)) {
        Ok(()) => {
            sync_dir(dir)?;
            Ok(true)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// fsync on the folder, so a rename or unlink in it survives a crash.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    fs::File::open(dir)?.sync_all()
}

/// The file extensions libcni's `ConfFiles` lists in a conf dir.
pub const CONF_EXTENSIONS: [&str; 3] = [".conf", ".conflist", ".json"];

pub fn is_conf_name(name: &str) -> bool {
    CONF_EXTENSIONS.iter().any(|ext| name.ends_with(ext))
}

/// The CNI configuration files in `dir` in the order containerd considers them: every
/// non-folder entry with a libcni extension, sorted by name as bytes (Go's `sort.Strings` over
/// paths in one folder). The first one is the network containerd uses.
pub fn conf_files(dir: &Path) -> io::Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            continue;
        }
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        if is_conf_name(&name) {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

/// The configuration files in `dir` that containerd would consider before `name`.
pub fn conf_files_before(dir: &Path, name: &str) -> io::Result<Vec<String>> {
    Ok(conf_files(dir)?
        .into_iter()
        .filter(|other| other.as_str() < name)
        .collect())
}

/// `root` joined with an absolute host path (`/host` + `/etc/cni/net.d` = `/host/etc/cni/net.d`);
/// the path unchanged when there is no root.
pub fn under_root(root: Option<&Path>, host_path: &Path) -> PathBuf {
    match root {
        None => host_path.to_path_buf(),
        Some(root) => root.join(host_path.strip_prefix("/").unwrap_or(host_path)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conf_files_sort_like_libcni_and_skip_folders_and_temp_files() {
        let dir = tempfile::tempdir().unwrap();
        for name in [
            "05-cilium.conflist",
            "00-multus.conf",
            "00-cni-guard.conflist",
            "10-x.json",
            "README",
            ".00-cni-guard.conflist.7.tmp",
            "05-cilium.conflist.cilium_bak",
        ] {
            fs::write(dir.path().join(name), "{}").unwrap();
        }
        fs::create_dir(dir.path().join("00-a.conf")).unwrap();
        assert_eq!(
            conf_files(dir.path()).unwrap(),
            [
                "00-cni-guard.conflist",
                "00-multus.conf",
                "05-cilium.conflist",
                "10-x.json"
            ]
        );
        assert_eq!(
            conf_files_before(dir.path(), "00-multus.conf").unwrap(),
            ["00-cni-guard.conflist"]
        );
    }

    #[test]
    fn write_reports_created_unchanged_replaced_and_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let w = |c: &[u8]| write_atomically(dir.path(), "a.conflist", c, 0o644).unwrap();
        assert_eq!(w(b"one"), Written::Created);
        assert_eq!(w(b"one"), Written::Unchanged);
        assert_eq!(w(b"two"), Written::Replaced);
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["a.conflist"]);
        let mode = fs::metadata(dir.path().join("a.conflist"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o7777, 0o644);
    }

    /// Two writers of one file at once (a keep and an install in a rollout): each writes its
    /// own temp file, so neither fails and a reader only ever sees one of the two whole files,
    /// never an empty or partial one.
    #[test]
    fn two_writers_of_one_file_never_publish_a_part() {
        let dir = tempfile::tempdir().unwrap();
        // Each writer alternates between two contents of its own, so that every write rewrites.
        let whole: Vec<Vec<u8>> = [b'a', b'A', b'b', b'B'].map(|c| vec![c; 64 << 10]).to_vec();
        write_atomically(dir.path(), "x.conflist", &whole[0], 0o644).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = {
            let (path, stop, whole) = (dir.path().join("x.conflist"), stop.clone(), whole.clone());
            std::thread::spawn(move || {
                let mut reads = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let got = fs::read(&path).unwrap();
                    assert!(whole.contains(&got), "read {} bytes: a part", got.len());
                    reads += 1;
                }
                reads
            })
        };
        let writers: Vec<_> = [0, 2]
            .map(|first| {
                let (dir, whole) = (dir.path().to_owned(), whole.clone());
                std::thread::spawn(move || {
                    for i in 0..150 {
                        let content = &whole[first + i % 2];
                        write_atomically(&dir, "x.conflist", content, 0o644).unwrap();
                    }
                })
            })
            .into_iter()
            .collect();
        for w in writers {
            w.join().unwrap();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(reader.join().unwrap() > 0);
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["x.conflist"], "temp files left");
    }

    /// A killed writer's temp file is removed by the next write once it is old enough to be no
    /// live writer's; a young one (maybe another writer's, under way) is left.
    #[test]
    fn a_killed_writers_temp_file_goes_once_it_is_stale() {
        let dir = tempfile::tempdir().unwrap();
        let old = dir.path().join(".x.conflist.77-0-1.tmp");
        let legacy = dir.path().join(".x.conflist.tmp");
        let young = dir.path().join(".x.conflist.78-0-1.tmp");
        let other = dir.path().join(".y.conflist.79-0-1.tmp");
        for p in [&old, &legacy, &young, &other] {
            fs::write(p, "{").unwrap();
        }
        let long_ago = SystemTime::now() - STALE_TEMP - Duration::from_secs(60);
        for p in [&old, &legacy, &other] {
            fs::File::options()
                .write(true)
                .open(p)
                .unwrap()
                .set_modified(long_ago)
                .unwrap();
        }
        write_atomically(dir.path(), "x.conflist", b"{}", 0o644).unwrap();
        assert!(!old.exists() && !legacy.exists());
        assert!(young.exists(), "a young temp file may be a live writer's");
        assert!(
            other.exists(),
            "another file's temp file is not this writer's"
        );
    }

    #[test]
    fn under_root_prefixes_absolute_host_paths() {
        assert_eq!(
            under_root(Some(Path::new("/host")), Path::new("/etc/cni/net.d")),
            Path::new("/host/etc/cni/net.d")
        );
        assert_eq!(
            under_root(None, Path::new("/etc/cni/net.d")),
            Path::new("/etc/cni/net.d")
        );
    }
}
