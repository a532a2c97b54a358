//! CNI spec versions and result conversion between them, as libcni's `pkg/types` converters do.
//!
//! Results come in three shapes: 0.1.0/0.2.0 (`ip4`/`ip6`), 0.3.x/0.4.0 (`ips` entries carry a
//! `version`), and 1.x (`ips` without `version`). The guard answers in 0.3.0 or later, so
//! conversion produces only the last two shapes; 0.1.0/0.2.0 results are read, never written.
//! Conversion works on JSON values, so fields a newer spec added (route `mtu`, interface
//! `socketPath`, ...) survive instead of being dropped by a fixed struct.

use serde_json::{json, Map, Value};

use crate::error::{Error, Kind, Result};

/// Versions the guard itself speaks (its own conflist's cniVersion).
pub const SUPPORTED: [&str; 5] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];
/// The newest version, used when a request carries none we can answer in.
pub const LATEST: &str = "1.1.0";

/// A parsed `major.minor.patch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version(pub u32, pub u32, pub u32);

impl Version {
    pub const V0_3_0: Version = Version(0, 3, 0);
    pub const V0_4_0: Version = Version(0, 4, 0);
    pub const V1_0_0: Version = Version(1, 0, 0);
    pub const V1_1_0: Version = Version(1, 1, 0);

    /// Parses `X.Y.Z` strictly: three decimal parts, nothing else.
    pub fn parse(s: &str) -> Option<Version> {
        let mut parts = s.split('.').map(|p| {
            let digits = (1..=9).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_digit());
            p.parse().ok().filter(|_| digits)
        });
        let v = Version(parts.next()??, parts.next()??, parts.next()??);
        parts.next().is_none().then_some(v)
    }

    /// Whether the guard speaks this version towards the runtime.
    pub fn guard_supported(s: &str) -> bool {
        SUPPORTED.contains(&s)
    }

    /// Whether a delegate configured at this version can be run (and its result read).
    pub fn delegate_supported(s: &str) -> bool {
        matches!(s, "0.1.0" | "0.2.0") || SUPPORTED.contains(&s)
    }

    pub fn has_check(self) -> bool {
        self >= Version::V0_4_0
    }

    /// CHECK, and DEL's prevResult, exist from 0.4.0 on.
    pub fn has_cached_result(self) -> bool {
        self >= Version::V0_4_0
    }

    pub fn has_status_and_gc(self) -> bool {
        self >= Version::V1_1_0
    }
}

/// Converts a result (any supported shape) into the shape and cniVersion of `target`.
///
/// `fallback_version` is used when the result does not say its own version (libcni then assumes
/// the version of the configuration that produced it). A result that cannot be converted is
/// [`Kind::BadInput`]; the message says why ("result has ...") for the caller to put in context.
pub fn convert_result(result: &Value, fallback_version: &str, target: &str) -> Result<Value> {
    let obj = result
        .as_object()
        .ok_or_else(|| invalid("result is not a JSON object"))?;
    let source = match obj.get("cniVersion") {
        Some(Value::String(s)) => s.as_str(),
        Some(_) => return Err(invalid("result cniVersion is not a string")),
        None => fallback_version,
    };
    let src = Version::parse(source)
        .ok_or_else(|| invalid(format!("result has invalid cniVersion {source:?}")))?;
    let dst = Version::parse(target)
        .ok_or_else(|| invalid(format!("invalid target cniVersion {target:?}")))?;
    if dst < Version::V0_3_0 {
        return Err(invalid(format!(
            "cannot convert a result to cniVersion {target}"
        )));
    }
    let mut out = if src < Version::V0_3_0 {
        from_020(obj)?
    } else {
        check_shape(obj)?;
        obj.clone()
    };
    out.insert("cniVersion".into(), Value::String(target.to_owned()));
    if let Some(Value::Array(ips)) = out.get_mut("ips") {
        for ip in ips.iter_mut().filter_map(Value::as_object_mut) {
            if dst >= Version::V1_0_0 {
                ip.remove("version");
            } else if !ip.contains_key("version") {
                // "4" or "6" from the CIDR address, as libcni's converter derives it.
                let address = ip.get("address").and_then(Value::as_str).unwrap_or("");
                let family = if address.contains(':') { "6" } else { "4" };
                ip.insert("version".into(), family.into());
            }
        }
    }
    Ok(Value::Object(out))
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::new(Kind::BadInput, msg)
}

/// Light validation of a 0.3.0+ result: the list fields, when present, are lists of objects.
fn check_shape(obj: &Map<String, Value>) -> Result<()> {
    let not_listed = |key| invalid(format!("result field {key:?} is not a list of objects"));
    for key in ["interfaces", "ips", "routes"] {
        match obj.get(key) {
            None | Some(Value::Null) => {}
            Some(Value::Array(items)) if items.iter().all(Value::is_object) => {}
            Some(_) => return Err(not_listed(key)),
        }
    }
    if let Some(Value::Array(ips)) = obj.get("ips") {
        if ips.iter().any(|ip| !ip["address"].is_string()) {
            return Err(invalid("result has an ips entry without an address"));
        }
    }
    match obj.get("dns") {
        None | Some(Value::Null) | Some(Value::Object(_)) => Ok(()),
        Some(_) => Err(invalid("result field \"dns\" is not an object")),
    }
}

/// 0.1.0/0.2.0 (`ip4`, `ip6`, `dns`) to the 0.3.0+ shape.
fn from_020(obj: &Map<String, Value>) -> Result<Map<String, Value>> {
    let mut ips = Vec::new();
    let mut routes = Vec::new();
    for (key, family) in [("ip4", "4"), ("ip6", "6")] {
        let Some(cfg) = obj.get(key) else { continue };
        let cfg = cfg
            .as_object()
            .ok_or_else(|| invalid(format!("result field {key:?} is not an object")))?;
        let address = cfg
            .get("ip")
            .and_then(Value::as_str)
            .ok_or_else(|| invalid(format!("result field {key:?} has no ip")))?;
        let mut ip = json!({"version": family, "address": address});
        if let Some(gw) = cfg.get("gateway") {
            ip["gateway"] = gw.clone();
        }
        ips.push(ip);
        if let Some(Value::Array(rs)) = cfg.get("routes") {
            routes.extend(rs.iter().cloned());
        }
    }
    let mut out = Map::new();
    for (key, list) in [("ips", ips), ("routes", routes)] {
        if !list.is_empty() {
            out.insert(key.into(), Value::Array(list));
        }
    }
    if let Some(dns) = obj.get("dns") {
        out.insert("dns".into(), dns.clone());
    }
    check_shape(&out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_strictly() {
        assert_eq!(Version::parse("1.0.0"), Some(Version(1, 0, 0)));
        assert_eq!(Version::parse("0.3.1"), Some(Version(0, 3, 1)));
        for bad in [
            "", "1", "1.0", "1.0.0.0", "1.0.x", "v1.0.0", " 1.0.0", "1..0", "-1.0.0",
        ] {
            assert_eq!(Version::parse(bad), None, "{bad:?}");
        }
        assert!(Version::parse("0.4.0").unwrap() < Version::parse("1.0.0").unwrap());
        assert!(Version::parse("0.10.0").unwrap() > Version::parse("0.4.0").unwrap());
    }

    #[test]
    fn up_conversion_drops_ip_version() {
        let r = json!({"cniVersion":"0.4.0","interfaces":[{"name":"eth0"}],
            "ips":[{"version":"4","address":"10.1.0.2/24","gateway":"10.1.0.1","interface":0}],
            "routes":[{"dst":"0.0.0.0/0"}],"dns":{"nameservers":["10.1.0.1"]}});
        let c = convert_result(&r, "0.4.0", "1.0.0").unwrap();
        assert_eq!(c["cniVersion"], "1.0.0");
        assert!(c["ips"][0].get("version").is_none());
        assert_eq!(c["ips"][0]["address"], "10.1.0.2/24");
        assert_eq!(c["ips"][0]["interface"], 0);
        assert_eq!(c["routes"], r["routes"]);
        assert_eq!(c["dns"], r["dns"]);
    }

    #[test]
    fn down_conversion_derives_ip_version() {
        let r = json!({"cniVersion":"1.0.0",
            "ips":[{"address":"10.1.0.2/24"},{"address":"fd00::2/64"}]});
        let c = convert_result(&r, "1.0.0", "0.3.1").unwrap();
        assert_eq!(c["cniVersion"], "0.3.1");
        assert_eq!(c["ips"][0]["version"], "4");
        assert_eq!(c["ips"][1]["version"], "6");
    }

    #[test]
    fn keeps_newer_fields() {
        let r = json!({"cniVersion":"1.1.0","routes":[{"dst":"0.0.0.0/0","mtu":1400}],
            "interfaces":[{"name":"net1","socketPath":"/x"}]});
        let c = convert_result(&r, "1.1.0", "1.0.0").unwrap();
        assert_eq!(c["routes"][0]["mtu"], 1400);
        assert_eq!(c["interfaces"][0]["socketPath"], "/x");
    }

    #[test]
    fn converts_020_results() {
        let r = json!({"cniVersion":"0.2.0",
            "ip4":{"ip":"10.0.0.5/24","gateway":"10.0.0.1","routes":[{"dst":"0.0.0.0/0"}]},
            "dns":{"nameservers":["1.1.1.1"]}});
        let c = convert_result(&r, "0.2.0", "0.4.0").unwrap();
        assert_eq!(
            c,
            json!({"cniVersion":"0.4.0",
                "ips":[{"version":"4","address":"10.0.0.5/24","gateway":"10.0.0.1"}],
                "routes":[{"dst":"0.0.0.0/0"}],"dns":{"nameservers":["1.1.1.1"]}})
        );
    }

    #[test]
    fn uses_fallback_version_and_rejects_garbage() {
        let c = convert_result(&json!({"ips":[{"address":"10.0.0.1/8"}]}), "1.0.0", "0.4.0");
        assert_eq!(c.unwrap()["ips"][0]["version"], "4");
        assert!(convert_result(&json!([1]), "1.0.0", "1.0.0").is_err());
        assert!(convert_result(&json!({"ips":"x"}), "1.0.0", "1.0.0").is_err());
        assert!(convert_result(&json!({"ips":[{}]}), "1.0.0", "1.0.0").is_err());
        assert!(convert_result(&json!({"cniVersion":"x"}), "1.0.0", "1.0.0").is_err());
        assert!(convert_result(&json!({"dns":[]}), "1.0.0", "1.0.0").is_err());
        assert!(convert_result(&json!({}), "1.0.0", "0.2.0").is_err());
        // Found by fuzzing: a 0.2.0 result must meet the same shape rules as newer ones.
        let bad020 = json!({"cniVersion":"0.2.0","ip4":{"ip":"10.0.0.5/24","routes":[1,"x"]}});
        assert!(convert_result(&bad020, "0.2.0", "1.0.0").is_err());
        let bad_dns = json!({"cniVersion":"0.2.0","dns":"not-an-object"});
        assert!(convert_result(&bad_dns, "0.2.0", "1.0.0").is_err());
    }
}
