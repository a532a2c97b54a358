//! `exec-floor PROGRAM [ARGS...]`: a static binary that does nothing but exec PROGRAM with the
//! same stdin, stdout and environment. `exec-floor cni-noop` minus `cni-noop` is the cost of one
//! extra exec, the physical floor for a guard that hands over by exec.

use std::ffi::CString;
use std::os::unix::ffi::OsStringExt;

fn main() {
    let args: Vec<CString> = std::env::args_os()
        .skip(1)
        .map(|a| CString::new(a.into_vec()).expect("arguments have no NUL"))
        .collect();
    if args.is_empty() {
        eprintln!("usage: exec-floor PROGRAM [ARGS...]");
        std::process::exit(2);
    }
    let mut argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    // SAFETY: argv is a NULL-terminated array of valid C strings that outlive the call.
    unsafe { libc::execv(argv[0], argv.as_ptr()) };
    eprintln!(
        "exec-floor: cannot exec {:?}: {}",
        args[0],
        std::io::Error::last_os_error()
    );
    std::process::exit(127);
}
