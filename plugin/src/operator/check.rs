//! `cni-guard check`: the readiness report (written against the plugin's readiness module once
//! it lands on main).

use std::ffi::OsString;

use super::Failure;

pub fn run(_args: Vec<OsString>) -> Result<i32, Failure> {
    Err(Failure::failed("check is not built yet"))
}
