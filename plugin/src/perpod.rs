//! Per-pod awareness (opt-in, `perPodPrimary`): while the delegate (Multus) is not ready, a pod
//! that asks for no Multus network would be right on the primary network alone, so the guard
//! runs the primary (Multus's `clusterNetwork` file, e.g. Cilium's conflist) for it directly
//! and refuses only the pods that need Multus.
//!
//! What "needs Multus" means, from Multus's own rules (its annotations and its daemon-side
//! `defaultNetworks`, `systemNamespaces` and `auxiliaryCNIChainName`, which the operator gives
//! the guard because they are not in `00-multus.conf`). Anything the guard cannot read is
//! "needs Multus": the refusal is always the safe answer (fail closed).
//! - `k8s.v1.cni.cncf.io/networks` non-empty: a comma list of names, or a JSON list with an
//!   element (one that does not parse counts as non-empty);
//! - `v1.multus-cni.io/default-network` present, whatever its value;
//! - Multus has `defaultNetworks` and the pod's namespace (`K8S_POD_NAMESPACE` in `CNI_ARGS`)
//!   is not one of its `systemNamespaces`, or the namespace is not given;
//! - Multus runs an auxiliary chain for every pod;
//! - the runtime passed no pod annotations: the capability `io.kubernetes.cri.pod-annotations`
//!   (containerd ≥ 1.5 and CRI-O pass them when the plugin declares it) was not honoured.

use serde_json::Value;

use crate::config::{GuardConfig, PerPod};
use crate::request::Request;

/// The runtime capability through which containerd and CRI-O pass the pod's annotations.
pub const POD_ANNOTATIONS: &str = "io.kubernetes.cri.pod-annotations";
/// Multus's annotation naming the pod's secondary networks.
pub const NETWORKS: &str = "k8s.v1.cni.cncf.io/networks";
/// Multus's annotation replacing the pod's default network.
pub const DEFAULT_NETWORK: &str = "v1.multus-cni.io/default-network";

/// Whether a pod can do without Multus, and if not, why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Need {
    /// Nothing of the pod asks for Multus: the primary alone is what Multus would have given.
    PrimaryOnly,
    /// The pod needs Multus, for this reason (said in the refusal).
    Multus(String),
}

/// Decides for the pod of `req`, from the annotations in the guard's `runtimeConfig`.
pub fn need(per_pod: &PerPod, cfg: &GuardConfig, req: &Request) -> Need {
    let Some(annotations) = cfg.runtime_config.get(POD_ANNOTATIONS) else {
        return Need::Multus(format!(
            "the runtime passed no pod annotations (capability {POD_ANNOTATIONS}), so whether \
             the pod asks for a Multus network is unknown"
        ));
    };
    let Some(annotations) = annotations.as_object() else {
        return Need::Multus(format!("{POD_ANNOTATIONS} is not an object"));
    };
    let namespace = req.cni_arg("K8S_POD_NAMESPACE");
    let system = namespace.is_some_and(|ns| per_pod.system_namespaces.iter().any(|s| s == ns));
    let why = if annotations.get(NETWORKS).is_some_and(asks_for_networks) {
        format!("the pod asks for networks ({NETWORKS})")
    } else if annotations.contains_key(DEFAULT_NETWORK) {
        format!("the pod replaces its default network ({DEFAULT_NETWORK})")
    } else if let Some(chain) = &per_pod.auxiliary_chain {
        format!("Multus runs the auxiliary chain {chain:?} for every pod")
    } else if per_pod.default_networks.is_empty() || system {
        return Need::PrimaryOnly;
    } else if let Some(ns) = namespace {
        format!(
            "Multus adds its defaultNetworks to pods of namespace {ns:?} (not one of its systemNamespaces)"
        )
    } else {
        "Multus has defaultNetworks and CNI_ARGS names no K8S_POD_NAMESPACE".to_owned()
    };
    Need::Multus(why)
}

/// Whether a `k8s.v1.cni.cncf.io/networks` value names any network: a comma list with a
/// non-blank item, or a JSON list with an element. What cannot be read counts as asking.
fn asks_for_networks(value: &Value) -> bool {
    let Some(text) = value.as_str() else {
        return true;
    };
    let text = text.trim();
    if text.starts_with('[') {
        return !matches!(serde_json::from_str::<Value>(text), Ok(Value::Array(items)) if items.is_empty());
    }
    text.split(',').any(|item| !item.trim().is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cfg(runtime_config: Value) -> GuardConfig {
        let mut v = json!({"cniVersion":"1.0.0","name":"g","type":"cni-guard",
            "delegate":"/etc/cni/net.d/00-multus.conf",
            "perPodPrimary":"/etc/cni/multus/net.d/05-cilium.conflist"});
        v["runtimeConfig"] = runtime_config;
        GuardConfig::parse(&serde_json::to_vec(&v).unwrap()).unwrap()
    }

    fn req(cni_args: &str) -> Request {
        Request {
            container_id: "c".into(),
            ifname: "eth0".into(),
            cni_path: vec![],
            cni_args: cni_args.into(),
        }
    }

    fn with(annotations: Value) -> Value {
        json!({ POD_ANNOTATIONS: annotations })
    }

    #[test]
    fn the_networks_annotation_in_each_form() {
        for (value, needs) in [
            (json!("macvlan-net1"), true),
            (json!("a, b"), true),
            (json!("ns/a@net1"), true),
            (json!(""), false),
            (json!("  ,  "), false),
            (json!("[]"), false),
            (json!(" [ ] "), false),
            (json!(r#"[{"name":"macvlan-net1"}]"#), true),
            (json!("[{"), true),
            (json!(r#"{"name":"x"}"#), true),
            (json!(5), true),
        ] {
            let c = cfg(with(json!({ NETWORKS: value })));
            let per_pod = c.per_pod.clone().unwrap();
            let got = need(&per_pod, &c, &req(""));
            assert_eq!(matches!(got, Need::Multus(_)), needs, "{value}: {got:?}");
        }
    }

    #[test]
    fn default_network_missing_annotations_chains_and_default_networks() {
        let plain = with(json!({"other": "x"}));
        let c = cfg(plain.clone());
        let pp = c.per_pod.clone().unwrap();
        assert_eq!(need(&pp, &c, &req("")), Need::PrimaryOnly);
        // default-network, whatever its value.
        let c = cfg(with(json!({ DEFAULT_NETWORK: "" })));
        assert!(matches!(need(&pp, &c, &req("")), Need::Multus(m) if m.contains(DEFAULT_NETWORK)));
        // No annotations from the runtime: fail closed.
        let c = cfg(json!({"portMappings": []}));
        assert!(matches!(need(&pp, &c, &req("")), Need::Multus(m) if m.contains(POD_ANNOTATIONS)));
        let c = cfg(json!({ POD_ANNOTATIONS: "x" }));
        assert!(matches!(need(&pp, &c, &req("")), Need::Multus(_)));
        // An auxiliary chain: every pod.
        let c = cfg(plain.clone());
        let chained = PerPod {
            auxiliary_chain: Some("tuning".into()),
            ..pp.clone()
        };
        assert!(matches!(need(&chained, &c, &req("")), Need::Multus(m) if m.contains("tuning")));
        // defaultNetworks: all but the system namespaces.
        let defaults = PerPod {
            default_networks: vec!["net-a".into()],
            ..pp.clone()
        };
        assert_eq!(
            need(
                &defaults,
                &c,
                &req("IgnoreUnknown=1;K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=p")
            ),
            Need::PrimaryOnly
        );
        assert!(matches!(
            need(&defaults, &c, &req("K8S_POD_NAMESPACE=default;K8S_POD_NAME=p")),
            Need::Multus(m) if m.contains("\"default\"")
        ));
        assert!(
            matches!(need(&defaults, &c, &req("")), Need::Multus(m) if m.contains("K8S_POD_NAMESPACE"))
        );
    }

    #[test]
    fn the_daemon_side_keys_are_validated() {
        let base = json!({"cniVersion":"1.0.0","name":"g","type":"cni-guard",
            "delegate":"/d.conf","perPodPrimary":"/p.conflist"});
        let parse = |extra: Value| {
            let mut v = base.clone();
            for (k, val) in extra.as_object().unwrap() {
                v[k] = val.clone();
            }
            GuardConfig::parse(&serde_json::to_vec(&v).unwrap())
        };
        let c = parse(json!({})).unwrap();
        assert_eq!(c.per_pod.unwrap().system_namespaces, ["kube-system"]);
        let c =
            parse(json!({"multusSystemNamespaces": ["a", "b"], "multusDefaultNetworks": ["n"]}))
                .unwrap();
        let pp = c.per_pod.unwrap();
        assert_eq!(
            (pp.system_namespaces.len(), pp.default_networks.len()),
            (2, 1)
        );
        for bad in [
            json!({"perPodPrimary": "relative"}),
            json!({"multusDefaultNetworks": "n"}),
            json!({"multusDefaultNetworks": [""]}),
            json!({"multusSystemNamespaces": [1]}),
            json!({"multusAuxiliaryChain": 1}),
        ] {
            let e = parse(bad.clone()).unwrap_err();
            assert_eq!(
                e.code(crate::request::Command::Add),
                7,
                "{bad}: {}",
                e.msg()
            );
        }
        // Without perPodPrimary the daemon-side keys are inert.
        let mut v = base.clone();
        v.as_object_mut().unwrap().remove("perPodPrimary");
        assert!(GuardConfig::parse(&serde_json::to_vec(&v).unwrap())
            .unwrap()
            .per_pod
            .is_none());
    }
}
