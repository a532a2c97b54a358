//! What the binary says about itself: its version and the commit it was built from
//! (`cni-guard-agent --version`, `cni_guard_build_info`). `build.rs` names the commit: git's HEAD,
//! else `CNI_GUARD_COMMIT`, else `unknown` (the rule is in `build_commit.rs`).

/// The crate's version (SemVer).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The first 12 hex digits of the commit built, or `unknown`.
pub const COMMIT: &str = env!("CNI_GUARD_BUILD_COMMIT");

/// `cni-guard-agent --version`'s line: `cni-guard-agent 0.4.0-dev (commit 0123456789ab)`.
pub fn version_line() -> String {
    format!("cni-guard-agent {VERSION} (commit {COMMIT})")
}

#[cfg(test)]
#[path = "../build_commit.rs"]
mod rule;

#[cfg(test)]
mod tests {
    use super::rule::choose;

    const FULL: &str = "0123456789abcdef0123456789abcdef01234567";

    #[test]
    fn git_first_then_the_environment_then_unknown() {
        assert_eq!(
            choose(Some(FULL), Some("fedcba987654")).unwrap(),
            "0123456789ab"
        );
        assert_eq!(
            choose(Some(&format!("{FULL}\n")), None).unwrap(),
            "0123456789ab"
        );
        assert_eq!(
            choose(None, Some("FEDCBA9876543210")).unwrap(),
            "fedcba987654"
        );
        // What git printed is not a commit (an empty repository): the environment decides.
        assert_eq!(
            choose(Some("HEAD"), Some("fedcba987654")).unwrap(),
            "fedcba987654"
        );
        assert_eq!(choose(None, None).unwrap(), "unknown");
        assert_eq!(choose(None, Some("")).unwrap(), "unknown");
    }

    #[test]
    fn a_wrong_environment_value_fails_the_build() {
        for bad in [
            "abc",
            "not-a-commit-at-all",
            "0123456789ag",
            &"a".repeat(65),
        ] {
            let e = choose(None, Some(bad)).unwrap_err();
            assert!(e.contains("CNI_GUARD_COMMIT"), "{e}");
        }
    }

    #[test]
    fn the_built_commit_follows_the_rule() {
        let commit = super::COMMIT;
        assert!(
            commit == "unknown"
                || (commit.len() == 12 && commit.bytes().all(|b| b.is_ascii_hexdigit())),
            "{commit}"
        );
        assert_eq!(
            super::version_line(),
            format!(
                "cni-guard-agent {} (commit {commit})",
                env!("CARGO_PKG_VERSION")
            )
        );
    }
}
