//! Names the commit the binary is built from (`cni-guard --version`, `cni_guard_build_info`):
//! see build_commit.rs for the rule. Sets `CNI_GUARD_BUILD_COMMIT` for the crate.

use std::path::{Path, PathBuf};
use std::process::Command;

#[path = "build_commit.rs"]
mod build_commit;

fn main() {
    println!("cargo:rerun-if-env-changed=CNI_GUARD_COMMIT");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=build_commit.rs");
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let git = git_head(&manifest_dir);
    let env = std::env::var("CNI_GUARD_COMMIT").ok();
    match build_commit::choose(git.as_deref(), env.as_deref()) {
        Ok(commit) => println!("cargo:rustc-env=CNI_GUARD_BUILD_COMMIT={commit}"),
        Err(why) => {
            eprintln!("error: {why}");
            std::process::exit(1);
        }
    }
}

fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .filter(|s| !s.is_empty())
}

/// HEAD of the checkout this crate is in, when the checkout's top is the workspace (a crate
/// copied into another project's repository must not take that project's commit). Asks cargo to
/// rerun this script when HEAD, the branch it names, or packed-refs change.
fn git_head(manifest_dir: &Path) -> Option<String> {
    let top = PathBuf::from(git(manifest_dir, &["rev-parse", "--show-toplevel"])?);
    let workspace = manifest_dir.parent()?;
    if top.canonicalize().ok()? != workspace.canonicalize().ok()? {
        return None;
    }
    let mut watched = vec![git(manifest_dir, &["rev-parse", "--git-path", "HEAD"])?];
    watched.extend(git(
        manifest_dir,
        &["rev-parse", "--git-path", "packed-refs"],
    ));
    if let Some(branch) = git(manifest_dir, &["symbolic-ref", "-q", "HEAD"]) {
        if let Some(loose) = git(manifest_dir, &["rev-parse", "--git-path", &branch]) {
            // A packed branch has no file of its own until its next commit writes one: watch the
            // folder it will appear in.
            let loose = PathBuf::from(loose);
            match loose.exists() {
                true => watched.push(loose.display().to_string()),
                false => watched.extend(loose.parent().map(|p| p.display().to_string())),
            }
        }
    }
    for path in watched {
        let path = match Path::new(&path).is_absolute() {
            true => PathBuf::from(path),
            false => manifest_dir.join(path),
        };
        if path.exists() {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
    git(manifest_dir, &["rev-parse", "HEAD"])
}
