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

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!("cg-confdir-{}", crate::random_hex(4)));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn first_file_in_name_order_wins_and_other_names_are_ignored() {
        let d = dir();
        std::fs::write(d.join("05-cilium.conflist"), r#"{"name":"cilium"}"#).unwrap();
        std::fs::write(d.join("00-multus.conf"), r#"{"name":"multus"}"#).unwrap();
        std::fs::write(d.join(".00-multus.conf.1234.tmp"), "half").unwrap();
        std::fs::write(d.join("00-aaa.txt"), "not a conf").unwrap();
        let (file, _, name) = first_config(&d).unwrap();
        assert_eq!(name, "multus");
        assert_eq!(file.file_name().unwrap(), "00-multus.conf");
        std::fs::remove_file(d.join("00-multus.conf")).unwrap();
        assert_eq!(first_config(&d).unwrap().2, "cilium");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn snapshot_keeps_only_the_chosen_file() {
        let d = dir();
        let snap = d.join("snap");
        std::fs::write(d.join("00-guard.conflist"), r#"{"name":"guard"}"#).unwrap();
        std::fs::create_dir_all(&snap).unwrap();
        std::fs::write(snap.join("stale.conf"), r#"{"name":"stale"}"#).unwrap();
        let (name, _) = snapshot(&d, &snap).unwrap();
        assert_eq!(name, "guard");
        let files: Vec<_> = std::fs::read_dir(&snap)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(files, vec![std::ffi::OsString::from("00-guard.conflist")]);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn atomic_write_leaves_no_temp_file() {
        let d = dir();
        write_atomic(&d.join("00-multus.conf"), b"{}");
        let files: Vec<_> = std::fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(files, vec![std::ffi::OsString::from("00-multus.conf")]);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
