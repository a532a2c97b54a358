//! The conf dir the way containerd reads it: files ending in .conf, .conflist or .json, in name
//! order, the first one wins; what it loaded is kept in memory (here: a private snapshot dir).
use serde_json::Value;
use std::path::{Path, PathBuf};

/// Write by temp file + rename, so a reader never sees half a file. The temp name ends in
/// `.tmp`, which a conf-dir reader ignores.
pub fn write_atomic(path: &Path, bytes: &[u8]) {
    let tmp = path.with_file_name(format!(
        ".{}.{}.tmp",
        path.file_name().unwrap().to_string_lossy(),
        crate::random_hex(4)
    ));
    std::fs::write(&tmp, bytes).unwrap_or_else(|e| panic!("write {}: {e}", tmp.display()));
    std::fs::rename(&tmp, path).unwrap_or_else(|e| panic!("rename to {}: {e}", path.display()));
}

fn is_conf(p: &Path) -> bool {
    matches!(
        p.extension().and_then(|e| e.to_str()),
        Some("conf" | "conflist" | "json")
    )
}

/// The first network in `dir` at this moment: (file path, its bytes, its `name`).
/// A file that vanishes between listing and reading is skipped by listing again.
pub fn first_config(dir: &Path) -> Option<(PathBuf, Vec<u8>, String)> {
    for _ in 0..100 {
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .ok()?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| is_conf(p) && !p.file_name().unwrap().to_string_lossy().starts_with('.'))
            .collect();
        files.sort();
        let first = files.into_iter().next()?;
        let Ok(bytes) = std::fs::read(&first) else {
            continue;
        };
        let name = serde_json::from_slice::<Value>(&bytes)
            .ok()
            .and_then(|v| v.get("name").and_then(Value::as_str).map(String::from))
            .unwrap_or_else(|| panic!("{} has no network name", first.display()));
        return Some((first, bytes, name));
    }
    None
}

/// Chooses the first network in `confdir` and copies it into the empty-or-stale `snapshot` dir,
/// returning its network name (what cnitool is then told to run, with NETCONFPATH=snapshot).
pub fn snapshot(confdir: &Path, snapshot: &Path) -> Option<(String, PathBuf)> {
    let (file, bytes, name) = first_config(confdir)?;
    let _ = std::fs::remove_dir_all(snapshot);
    std::fs::create_dir_all(snapshot).expect("create snapshot dir");
    std::fs::write(snapshot.join(file.file_name().unwrap()), bytes).expect("write snapshot");
    Some((name, file))
}
