//! The containerd suites (issues 4 and 11), one test binary with a module per suite, each suite
//! once per containerd generation (`<suite>::containerd_1_6`, `<suite>::containerd_2`). Each test
//! starts its own containerd in its own network namespace and removes everything afterwards.
//!
//! They need root and are `#[ignore]`d in the plain workspace run; scripts/test.d/30-containerd.sh
//! runs them with `--ignored`.
mod common;
mod init_container;
mod race;
mod refusal;
mod sandbox;
mod status;
