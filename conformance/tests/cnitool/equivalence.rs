//! Suite 1: through the guard, cnitool add gives what the delegate gives used directly.
use crate::{binaries, bridge_conflist, host_namespace, macvlan_parent, put};
use conformance::cnitool::{container_id, Cnitool};
use conformance::fixture::Fixture;
use conformance::generation::generation;
use conformance::leaks::{iptables_rules, leases};
use conformance::netns::Netns;
use conformance::prereq::can_run;
use conformance::sandbox::{allocated_ips, interfaces, view};
use serde_json::{json, Value};

const PORTS: &str = r#"{"portMappings":[{"hostPort":18080,"containerPort":80,"protocol":"tcp"}]}"#;

/// A CNI result with what legitimately differs between two sandboxes masked: allocated
/// addresses, MACs, the netns path, host-side veth names.
fn normalize_result(result: &Value) -> Value {
    let ips = allocated_ips(result);
    let mut text = result.to_string();
    for ip in &ips {
        text = text.replace(&format!("\"{ip}/"), "\"<allocated>/");
        text = text.replace(&format!("\"{ip}\""), "\"<allocated>\"");
    }
    let mut v: Value = serde_json::from_str(&text).unwrap();
    if let Some(ifs) = v.get_mut("interfaces").and_then(Value::as_array_mut) {
        for i in ifs {
            if let Some(o) = i.as_object_mut() {
                o.remove("mac");
                if o.contains_key("sandbox") {
                    o.insert("sandbox".into(), json!("<sandbox>"));
                }
                let name = o.get("name").and_then(Value::as_str).unwrap_or_default();
                if name.starts_with("veth") {
                    o.insert("name".into(), json!("<host veth>"));
                }
            }
        }
    }
    v
}

/// iptables rules with per-container names masked (chain hashes, container ID, address).
fn normalize_rules(rules: &[String], cid: &str, ips: &[String]) -> Vec<String> {
    let mut out: Vec<String> = rules
        .iter()
        .map(|r| {
            let mut r = r.replace(cid, "<cid>");
            for ip in ips {
                r = r.replace(ip, "<allocated>");
            }
            r.split(' ')
                .map(|t| {
                    let hashed = ["CNI-DN-", "CNI-SN-", "CNI-"].iter().find_map(|p| {
                        t.strip_prefix(p)
                            .filter(|h| h.len() >= 12 && h.chars().all(|c| c.is_ascii_hexdigit()))
                    });
                    if hashed.is_some() {
                        "<chain>".to_string()
                    } else {
                        t.to_string()
                    }
                })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    out.sort();
    out
}

/// What one sandbox looked like while attached.
struct Seen {
    result: Value,
    view: Value,
    rules: Vec<String>,
    /// check's outcome: success, and its message with per-container names masked
    check: (bool, Vec<String>),
}

/// add, inspect, check, del, and prove del removed everything.
fn add_check_del(fx: &Fixture, cni: &Cnitool, host: &Netns, net: &str, lease_net: &str) -> Seen {
    let baseline = iptables_rules(host);
    let veths_before = host.links_of_kind("veth");
    let sandbox = Netns::create("cg-eq");
    let cid = container_id(&sandbox);
    let added = cni.add(net, &sandbox);
    let result = added.result();
    let ips = allocated_ips(&result);
    assert!(!ips.is_empty(), "{net}: no address in {result}");
    let seen_view = view(&sandbox, &ips);
    let added_rules: Vec<String> = iptables_rules(host)
        .into_iter()
        .filter(|r| !baseline.contains(r))
        .collect();
    // Per-container rules only: the shared CNI-HOSTPORT-* chains exist after the first run.
    let rules: Vec<String> = normalize_rules(&added_rules, &cid, &ips)
        .into_iter()
        .filter(|r| r.contains("<chain>") || r.contains("<cid>") || r.contains("<allocated>"))
        .collect();
    assert_eq!(
        leases(&fx.leases, lease_net).len(),
        1,
        "{net}: one lease while attached"
    );

    let checked = cni.check(net, &sandbox);
    // stderr minus the guard's own log lines (its syslog fallback): the delegate's error.
    let message: Vec<String> = checked
        .stderr
        .lines()
        .filter(|l| !l.starts_with("cni-guard:"))
        .map(String::from)
        .collect();
    let check = (checked.ok, normalize_rules(&message, &cid, &ips));

    let deleted = cni.del(net, &sandbox);
    assert!(deleted.ok, "{net}: del failed: {deleted:?}");
    assert_eq!(
        interfaces(&sandbox),
        Vec::<String>::new(),
        "{net}: interfaces left in sandbox"
    );
    assert_eq!(leases(&fx.leases, lease_net), vec![], "{net}: lease left");
    assert_eq!(
        host.links_of_kind("veth"),
        veths_before,
        "{net}: host veth left"
    );
    let left: Vec<String> = iptables_rules(host)
        .into_iter()
        .filter(|r| {
            r.contains(&cid) || ips.iter().any(|ip| r.contains(ip)) || r.contains("CNI-DN-")
        })
        .collect();
    assert_eq!(left, Vec::<String>::new(), "{net}: iptables rules left");
    assert!(
        fx.cached_results()
            .iter()
            .all(|p| !p.to_string_lossy().contains(&cid)),
        "{net}: result cache entry left"
    );
    Seen {
        result: normalize_result(&result),
        view: seen_view,
        rules,
        check,
    }
}

/// `check_supported`: whether the delegate's plugins implement CHECK correctly. portmap 1.1.1
/// does not for IPv4-only sandboxes (it looks for its chain in ip6tables too and fails); there
/// the guard must fail CHECK exactly as the delegate does (`Plugins::portmap_check`).
fn equivalent(
    fx: &Fixture,
    host: &Netns,
    label: &str,
    delegate: Value,
    cap_args: Option<&str>,
    check_supported: bool,
) {
    let delegate_net = delegate["name"].as_str().unwrap().to_string();
    let delegate_path = put(fx, &fx.delegates, &format!("{label}.conflist"), &delegate);
    let guard_net = fx.network(&format!("guard-{label}"));
    put(
        fx,
        &fx.netd,
        &format!("00-cni-guard-{label}.conflist"),
        &fx.guard_conflist(&guard_net, "1.0.0", &delegate_path, &[]),
    );

    let mut direct = Cnitool::new(fx, host, &fx.delegates);
    direct.cap_args = cap_args.map(String::from);
    let mut guarded = Cnitool::new(fx, host, &fx.netd);
    guarded.cap_args = cap_args.map(String::from);

    let wants_dns = delegate["plugins"][0].get("dns").is_some();
    let d = add_check_del(fx, &direct, host, &delegate_net, &delegate_net);
    let g = add_check_del(fx, &guarded, host, &guard_net, &delegate_net);
    if wants_dns {
        assert_eq!(
            g.result.pointer("/dns/nameservers"),
            Some(&json!(["10.96.0.10"])),
            "{label}: DNS missing from the result through the guard"
        );
    }
    if cap_args.is_some() {
        assert!(
            !g.rules.is_empty(),
            "{label}: no port mapping rules through the guard"
        );
    }
    if check_supported {
        assert!(
            d.check.0,
            "{label}: check of the delegate failed: {:?}",
            d.check
        );
    }
    assert_eq!(g.check, d.check, "{label}: check through the guard differs");
    assert_eq!(g.view, d.view, "{label}: sandbox differs through the guard");
    assert_eq!(
        g.result, d.result,
        "{label}: result differs through the guard"
    );
    assert_eq!(
        g.rules, d.rules,
        "{label}: iptables rules differ through the guard"
    );
    assert!(
        fx.guard_records().is_empty(),
        "{label}: guard records left: {:?}",
        fx.guard_records()
    );
    println!(
        "equivalence {} {label}: same interfaces, addresses, routes, DNS, iptables rules and check \
         outcome (ok={}) directly and through the guard; del clean both ways",
        generation().label(),
        g.check.0
    );
}

/// DNS settings as the bridge and ptp plugins take them (their result's `dns` is the config's).
fn dns() -> Value {
    json!({"nameservers": ["10.96.0.10"], "search": ["pods.example.test"], "options": ["ndots:5"]})
}

#[test]
#[ignore = "root: run by scripts/test.d/20-conformance.sh"]
fn equivalence() {
    if !can_run("equivalence", true) {
        return;
    }
    println!(); // start on a fresh line after libtest\'s "test ... "
    let fx = Fixture::new(&binaries(), false);
    let host = host_namespace();

    // bridge + host-local, with DNS
    let net = fx.network("eq-bridge");
    let mut bridge = bridge_conflist(&fx, &net, "1.0.0", "eqbr0", "10.41.0.0/24");
    bridge["plugins"][0]["dns"] = dns();
    equivalent(&fx, &host, "bridge", bridge, None, true);

    // ptp
    let net = fx.network("eq-ptp");
    let ipam = fx.host_local("10.42.0.0/24");
    let ptp = json!({"cniVersion": "1.0.0", "name": net,
        "plugins": [{"type": "ptp", "ipMasq": false, "ipam": ipam, "dns": dns()}]});
    equivalent(&fx, &host, "ptp", ptp, None, true);

    // macvlan on a parent link in the host namespace
    macvlan_parent(&host, "eqmv0");
    let net = fx.network("eq-macvlan");
    let macvlan = json!({"cniVersion": "1.0.0", "name": net,
        "plugins": [{"type": "macvlan", "master": "eqmv0", "mode": "bridge", "dns": dns(),
                     "ipam": fx.host_local("10.43.0.0/24")}]});
    equivalent(&fx, &host, "macvlan", macvlan, None, true);

    // chain: bridge + tuning + portmap (port mappings through the capability)
    let net = fx.network("eq-chain");
    let mut chain = bridge_conflist(&fx, &net, "1.0.0", "eqbr1", "10.44.0.0/24");
    chain["plugins"][0]["dns"] = dns();
    chain["plugins"].as_array_mut().unwrap().extend([
        json!({"type": "tuning", "mtu": 1400, "promisc": true}),
        json!({"type": "portmap", "capabilities": {"portMappings": true}, "snat": true}),
    ]);
    let portmap_check = generation().plugins.portmap_check;
    equivalent(&fx, &host, "chain", chain, Some(PORTS), portmap_check);
}
