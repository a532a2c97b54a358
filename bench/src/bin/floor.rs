//! `exec-floor [--stdin FILE] PROGRAM [ARGS...]`: a static binary that does nothing but exec
//! PROGRAM with the same stdin, stdout and environment. `exec-floor cni-noop` minus `cni-noop`
//! is the cost of one extra exec, the physical floor for a guard that hands over by exec.
//!
//! With `--stdin FILE` it first opens FILE as its stdin: hyperfine runs commands without a shell
//! but cannot feed them stdin, so the cross-check puts this in front of every side alike (the
//! same extra exec on each side cancels out of every difference).

use std::ffi::CString;
use std::os::unix::ffi::OsStringExt;

fn main() {
    let mut args: Vec<CString> = std::env::args_os()
        .skip(1)
        .map(|a| CString::new(a.into_vec()).expect("arguments have no NUL"))
        .collect();
    if args.len() >= 2 && args[0].as_bytes() == b"--stdin" {
        // SAFETY: args[1] is a valid C string; the flags are valid for open.
        let fd = unsafe { libc::open(args[1].as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
        // SAFETY: dup2 onto fd 0 of a descriptor we own; the new 0 is not close-on-exec.
        if fd < 0 || unsafe { libc::dup2(fd, 0) } < 0 {
            eprintln!(
                "exec-floor: cannot open {:?}: {}",
                args[1],
                std::io::Error::last_os_error()
            );
            std::process::exit(127);
        }
        args.drain(..2);
    }
    if args.is_empty() {
        eprintln!("usage: exec-floor [--stdin FILE] PROGRAM [ARGS...]");
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
