//! What a sandbox looks like from inside: interfaces, addresses and routes, normalized so two
//! sandboxes built from the same network compare equal up to the allocated IP and the MACs.
use crate::must;
use crate::netns::Netns;
use serde_json::{json, Value};

/// The addresses (without prefix) a CNI result says were allocated.
pub fn allocated_ips(result: &Value) -> Vec<String> {
    result
        .get("ips")
        .and_then(Value::as_array)
        .map(|ips| {
            ips.iter()
                .filter_map(|ip| ip.get("address").and_then(Value::as_str))
                .filter_map(|a| a.split('/').next().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

fn masked(v: Option<&Value>, mask: &[String]) -> Value {
    match v {
        Some(Value::String(s)) if mask.iter().any(|m| m == s) => json!("<allocated>"),
        Some(v) => v.clone(),
        None => Value::Null,
    }
}

/// Normalized interfaces (name, kind, mtu, flags, non-link-local addresses) and main-table
/// routes of a namespace; `mask` holds addresses to replace by `<allocated>`.
pub fn view(ns: &Netns, mask: &[String]) -> Value {
    let addrs: Vec<Value> =
        serde_json::from_str(&must(ns.ip().args(["-j", "-d", "addr", "show"]))).unwrap_or_default();
    let mut interfaces: Vec<Value> = addrs
        .iter()
        .map(|l| {
            let mut flags: Vec<String> = l
                .get("flags")
                .and_then(Value::as_array)
                .map(|f| {
                    f.iter()
                        .filter_map(|x| x.as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default();
            flags.sort();
            let addresses: Vec<Value> = l
                .get("addr_info")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter(|x| x.get("scope").and_then(Value::as_str) != Some("link"))
                        .map(|x| {
                            json!({
                                "family": x.get("family"),
                                "local": masked(x.get("local"), mask),
                                "prefixlen": x.get("prefixlen"),
                            })
                        })
                        .collect()
                })
                .unwrap_or_default();
            json!({
                "ifname": l.get("ifname"),
                "kind": l.pointer("/linkinfo/info_kind"),
                "mtu": l.get("mtu"),
                "flags": flags,
                "addresses": addresses,
            })
        })
        .collect();
    interfaces.sort_by_key(|i| i["ifname"].as_str().unwrap_or_default().to_string());
    let mut routes = Vec::new();
    for family in ["-4", "-6"] {
        let out = must(
            ns.ip()
                .args(["-j", family, "route", "show", "table", "main"]),
        );
        let rs: Vec<Value> = serde_json::from_str(&out).unwrap_or_default();
        for r in rs {
            let dst = r.get("dst").and_then(Value::as_str).unwrap_or_default();
            if dst.starts_with("fe80:") || dst.starts_with("ff00:") {
                continue;
            }
            routes.push(json!({
                "dst": masked(r.get("dst"), mask),
                "gateway": r.get("gateway"),
                "dev": r.get("dev"),
                "prefsrc": masked(r.get("prefsrc"), mask),
                "scope": r.get("scope"),
                "protocol": r.get("protocol"),
            }));
        }
    }
    routes.sort_by_key(|r| r.to_string());
    json!({"interfaces": interfaces, "routes": routes})
}

/// Names of the interfaces in a sandbox other than `lo`.
pub fn interfaces(ns: &Netns) -> Vec<String> {
    ns.link_names().into_iter().filter(|n| n != "lo").collect()
}
