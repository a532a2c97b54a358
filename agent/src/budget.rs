//! Each verb's deadline against kubelet's: kubelet runs StopPodSandbox (the CNI DEL) under its
//! `--runtime-request-timeout`, 2 minutes by default, and RunPodSandbox (the ADD) under twice
//! that; the runtime kills the plugin when they end. A verb's budget is its lock wait, its wait
//! for the delegate and the delegate's own runs (docs/reference/cni-behaviour.md#deadlines).
//! `install`, `keep` and `check` say loudly when a configuration passes them.

use std::time::Duration;

use cni_guard::config::GuardConfig;

/// kubelet's default `--runtime-request-timeout`.
pub const KUBELET_RUNTIME_REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// What to say when a verb's budget passes kubelet's deadline for it; empty when each ends in
/// time.
pub fn warnings(cfg: &GuardConfig, timeout: Duration) -> Vec<String> {
    let s = |d: Duration| d.as_secs_f64();
    let (lock, run) = (s(cfg.lock_wait), s(cfg.delegate_timeout));
    let mut out = Vec::new();
    for (verb, key, wait, limit, call) in [
        (
            "DEL",
            "delWaitSeconds",
            s(cfg.del_wait),
            s(timeout),
            "StopPodSandbox",
        ),
        (
            "ADD",
            "waitSeconds",
            s(cfg.wait),
            2.0 * s(timeout),
            "RunPodSandbox",
        ),
    ] {
        let total = lock + wait + run;
        if total > limit {
            out.push(format!(
                "{verb} may take {total} s (lockWaitSeconds {lock} + {key} {wait} + \
                 delegateTimeoutSeconds {run}), past kubelet's {limit} s {call} deadline: the \
                 runtime would kill it mid-way; lower them"
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(keys: &str) -> GuardConfig {
        let v = format!(r#"{{"cniVersion":"1.0.0","name":"g","delegate":"/d.conf"{keys}}}"#);
        GuardConfig::parse(v.as_bytes()).unwrap()
    }

    #[test]
    fn the_plugins_defaults_end_in_time_and_a_long_wait_does_not() {
        assert!(warnings(
            &cfg(r#","waitSeconds":60,"delWaitSeconds":40"#),
            KUBELET_RUNTIME_REQUEST_TIMEOUT
        )
        .is_empty());
        let w = warnings(
            &cfg(r#","delWaitSeconds":100"#),
            KUBELET_RUNTIME_REQUEST_TIMEOUT,
        );
        assert_eq!(w.len(), 1);
        assert!(w[0].starts_with("DEL may take 150 s (lockWaitSeconds 10 + delWaitSeconds 100 + delegateTimeoutSeconds 40), past kubelet's 120 s StopPodSandbox"), "{}", w[0]);
        let w = warnings(
            &cfg(r#","waitSeconds":600,"delWaitSeconds":0"#),
            KUBELET_RUNTIME_REQUEST_TIMEOUT,
        );
        assert!(w[0].starts_with("ADD may take 650 s"), "{w:?}");
        // A longer kubelet timeout moves the line.
        assert!(warnings(&cfg(r#","delWaitSeconds":100"#), Duration::from_secs(200)).is_empty());
    }
}
