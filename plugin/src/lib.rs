//! cni-guard: a CNI meta-plugin that refuses ADD until its delegate network is complete.
//!
//! One invocation starts at [`cni::handle`]; `main.rs` turns its [`cni::Outcome`] into output,
//! an exit code, or an exec of the delegate. The node agent (`cni-guard-agent`, a crate of its
//! own) uses [`config`], [`readiness`] and [`events`] from here; nothing of it is compiled in.

#![deny(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod cni;
pub mod config;
pub mod delegate;
pub mod error;
pub mod events;
pub mod invoke;
pub mod log;
pub mod names;
pub mod netconf;
pub mod perpod;
pub mod problem;
pub mod readiness;
pub mod records;
pub mod request;
pub mod sys;
pub mod teardown;
pub mod verb;
pub mod version;
pub mod wait;
