//! The containerd suites (issue 4), one test binary with a module per suite. Each test starts its
//! own containerd in its own network namespace and removes everything afterwards.
//!
//! They need root and are `#[ignore]`d in the plain workspace run; scripts/test.d/30-containerd.sh
//! runs them with `--ignored`.
mod common;
mod init_container;
mod race;
mod refusal;
mod sandbox;
