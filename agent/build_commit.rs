//! Which commit a build names, shared by `build.rs` (which decides) and the crate's unit tests
//! (which check the decision): the work tree's `git rev-parse HEAD` when the source is a git
//! checkout, else `CNI_GUARD_COMMIT` (for builds from a tarball or a container context without
//! `.git`), else `unknown`. The name is the commit's first 12 hex digits.

/// How many hex digits of the commit the version line and `cni_guard_build_info` show.
pub const SHORT: usize = 12;

/// The commit to name: `git` is what `git rev-parse HEAD` printed (None when git failed or the
/// source is not a checkout of its own), `env` is `CNI_GUARD_COMMIT`. An `env` that is not a
/// commit id is an error (the build fails rather than naming a wrong commit).
pub fn choose(git: Option<&str>, env: Option<&str>) -> Result<String, String> {
    if let Some(id) = git.map(str::trim).filter(|id| is_commit(id)) {
        return Ok(id[..SHORT].to_ascii_lowercase());
    }
    match env.map(str::trim) {
        None | Some("") => Ok("unknown".to_owned()),
        Some(id) if is_commit(id) => Ok(id[..SHORT].to_ascii_lowercase()),
        Some(id) => Err(format!(
            "CNI_GUARD_COMMIT={id:?} is not a commit id ({SHORT} to 64 hex digits)"
        )),
    }
}

fn is_commit(id: &str) -> bool {
    (SHORT..=64).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_hexdigit())
}
