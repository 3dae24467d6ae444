//! A session's network policy: which hosts the model provider may reach on the agent's
//! behalf.
//!
//! A rollout whose sandbox has no network (or only an allow list) could still ask the
//! *provider* to fetch the network for it: a web-search tool, an image URL, an MCP
//! server, stored server-side state. A restricted [`NetworkPolicy`] makes the server
//! mediate every request of the session ([`crate::Dialect::mediate`]): provider-side
//! capabilities that could reach a host the policy does not allow are removed (or, with
//! [`OnViolation::Reject`], the call is refused with 400), and the removed parts are
//! reported as value-free JSON paths.
//!
//! ```
//! use intercept_core::network::{NetworkPolicy, OnViolation};
//!
//! let open = NetworkPolicy::default();
//! assert!(!open.is_restricted());
//!
//! let policy: NetworkPolicy = serde_json::from_value(serde_json::json!({
//!     "allow": ["*.python.org", "example.com"],
//!     "block": ["evil.python.org"],
//! })).expect("valid policy");
//! assert!(policy.is_restricted());
//! assert!(policy.allows_host("docs.python.org"));
//! assert!(policy.allows_host("python.org"));
//! assert!(!policy.allows_host("evil.python.org"));
//! assert!(!policy.allows_host("www.example.com"));
//! assert_eq!(policy.on_violation(), OnViolation::Strip);
//! ```

use std::fmt;
use std::sync::LazyLock;

use serde::{Deserialize, Serialize};

/// The fixed text appended to the earliest user message of a call from which something
/// was removed, so that the agent knows why a capability is missing and does not retry it.
pub const NOTICE: &str = "Network protocol blocked fetching a resource. Continue without those \
capabilities; use local tools or inline data already present in the conversation, and do not \
retry the blocked provider-side operation.";

/// The code of the record's policy event ([`PolicyEvent::code`]).
pub(crate) const POLICY_CODE: &str = "provider_capability_unavailable";

/// What to do with a request that asks for a capability the policy forbids.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum OnViolation {
    /// Remove the capability, append the notice, send the rest upstream.
    #[default]
    Strip,
    /// Refuse the call with 400 in the dialect's error shape, naming the first path.
    Reject,
}

/// One host pattern: `*` (any host), `*.example.org` (example.org and every host under
/// it), or an exact host (`example.org`, `10.0.0.7`). Case-insensitive.
#[derive(Clone, PartialEq, Eq, Hash)]
enum HostPattern {
    Any,
    /// `*.domain`: the domain itself and its subdomains; holds the domain.
    Domain(String),
    Exact(String),
}

impl HostPattern {
    fn parse(text: &str) -> Result<Self, String> {
        let t = text.trim().to_ascii_lowercase();
        if t == "*" {
            return Ok(HostPattern::Any);
        }
        let (wild, host) = match t.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, t.as_str()),
        };
        // One trailing dot (the DNS root) is the same host.
        let host = host.strip_suffix('.').unwrap_or(host).to_owned();
        let valid = !host.is_empty()
            && host.len() <= 253
            && !host.starts_with('.')
            && !host.contains("..")
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
        if !valid {
            return Err(format!(
                "host pattern {text:?} is not `*`, `*.domain` or a host name (no scheme, port, \
                 path or inner `*`)"
            ));
        }
        Ok(if wild {
            HostPattern::Domain(host)
        } else {
            HostPattern::Exact(host)
        })
    }

    fn matches(&self, host: &str) -> bool {
        match self {
            HostPattern::Any => true,
            HostPattern::Exact(h) => h == host,
            HostPattern::Domain(d) => within(host, d),
        }
    }
}

/// Whether `host` is `domain` or a subdomain of it (both lowercase).
pub(crate) fn within(host: &str, domain: &str) -> bool {
    host == domain
        || (host.len() > domain.len()
            && host.ends_with(domain)
            && host.as_bytes()[host.len() - domain.len() - 1] == b'.')
}

impl fmt::Display for HostPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostPattern::Any => f.write_str("*"),
            HostPattern::Domain(d) => write!(f, "*.{d}"),
            HostPattern::Exact(h) => f.write_str(h),
        }
    }
}

/// A session's network policy: `{allow, block, on_violation}`.
///
/// A host is allowed when some `allow` pattern matches it and no `block` pattern does.
/// The default (`allow: ["*"]`, no blocks) is unrestricted: requests are not mediated
/// at all. Any other policy is *restricted*.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "PolicyRepr", into = "PolicyRepr")]
pub struct NetworkPolicy {
    allow: Vec<HostPattern>,
    block: Vec<HostPattern>,
    on_violation: OnViolation,
    restricted: bool,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyRepr {
    #[serde(default = "any_host")]
    allow: Vec<String>,
    #[serde(default)]
    block: Vec<String>,
    #[serde(default)]
    on_violation: OnViolation,
}

fn any_host() -> Vec<String> {
    vec!["*".to_owned()]
}

impl TryFrom<PolicyRepr> for NetworkPolicy {
    type Error = String;

    fn try_from(r: PolicyRepr) -> Result<Self, String> {
        NetworkPolicy::new(&r.allow, &r.block).map(|p| p.with_on_violation(r.on_violation))
    }
}

impl From<NetworkPolicy> for PolicyRepr {
    fn from(p: NetworkPolicy) -> Self {
        PolicyRepr {
            allow: p.allow.iter().map(ToString::to_string).collect(),
            block: p.block.iter().map(ToString::to_string).collect(),
            on_violation: p.on_violation,
        }
    }
}

static UNRESTRICTED: LazyLock<NetworkPolicy> = LazyLock::new(NetworkPolicy::default);

impl Default for NetworkPolicy {
    fn default() -> Self {
        NetworkPolicy {
            allow: vec![HostPattern::Any],
            block: Vec::new(),
            on_violation: OnViolation::Strip,
            restricted: false,
        }
    }
}

impl NetworkPolicy {
    /// A policy from allow and block patterns (`*`, `*.domain`, exact hosts); the error
    /// names the pattern that is not one.
    pub fn new<A: AsRef<str>, B: AsRef<str>>(allow: &[A], block: &[B]) -> Result<Self, String> {
        let parse = |list: &str, items: &mut dyn Iterator<Item = &str>| {
            items
                .map(|p| HostPattern::parse(p).map_err(|e| format!("network.{list}: {e}")))
                .collect::<Result<Vec<_>, _>>()
        };
        let allow = parse("allow", &mut allow.iter().map(AsRef::as_ref))?;
        let block = parse("block", &mut block.iter().map(AsRef::as_ref))?;
        let restricted = allow != [HostPattern::Any] || !block.is_empty();
        Ok(NetworkPolicy {
            allow,
            block,
            on_violation: OnViolation::Strip,
            restricted,
        })
    }

    /// No network at all through the provider (`allow: []`).
    pub fn deny_all() -> Self {
        let mut p = NetworkPolicy::default();
        p.allow.clear();
        p.restricted = true;
        p
    }

    /// The unrestricted policy, shared (what [`crate::Session::network`] returns by
    /// default).
    pub fn unrestricted() -> &'static NetworkPolicy {
        &UNRESTRICTED
    }

    /// Sets what happens on a violation.
    pub fn with_on_violation(mut self, on_violation: OnViolation) -> Self {
        self.on_violation = on_violation;
        self
    }

    /// Whether requests must be mediated (anything but `allow: ["*"]` without blocks).
    #[inline]
    pub fn is_restricted(&self) -> bool {
        self.restricted
    }

    /// The allow patterns, as written (`*`, `*.domain`, hosts), normalised.
    pub fn allow_patterns(&self) -> Vec<String> {
        self.allow.iter().map(ToString::to_string).collect()
    }

    /// The block patterns, normalised.
    pub fn block_patterns(&self) -> Vec<String> {
        self.block.iter().map(ToString::to_string).collect()
    }

    /// What happens on a violation.
    pub fn on_violation(&self) -> OnViolation {
        self.on_violation
    }

    /// Whether the provider may reach `host` (a host name or IP literal).
    pub fn allows_host(&self, host: &str) -> bool {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        self.allow.iter().any(|p| p.matches(&host)) && !self.block.iter().any(|p| p.matches(&host))
    }

    /// Whether the provider may fetch `url`: `data:` URLs always; `http(s)` URLs whose
    /// host the policy allows; nothing else (other schemes, unparsable text).
    pub fn allows_url(&self, url: &str) -> bool {
        let t = url.trim_start();
        if t.len() >= 5 && t[..5].eq_ignore_ascii_case("data:") {
            return true;
        }
        let Ok(parsed) = url::Url::parse(t) else {
            return false;
        };
        if !matches!(parsed.scheme(), "http" | "https") {
            return false;
        }
        match parsed.host() {
            Some(url::Host::Domain(d)) => self.allows_host(d),
            Some(url::Host::Ipv4(ip)) => self.allows_host(&ip.to_string()),
            Some(url::Host::Ipv6(ip)) => self.allows_host(&ip.to_string()),
            None => false,
        }
    }

    /// The policy as a provider allowed-domain filter, when it can be one: every allow
    /// pattern is `*.domain` and no block pattern falls inside an allowed domain (a block
    /// outside them changes nothing). `None`: the filter cannot express the policy.
    pub fn allowed_domains(&self) -> Option<Vec<String>> {
        let mut domains = Vec::with_capacity(self.allow.len());
        for p in &self.allow {
            match p {
                HostPattern::Domain(d) => domains.push(d.clone()),
                _ => return None,
            }
        }
        if domains.is_empty() {
            return None;
        }
        for b in &self.block {
            let inside = match b {
                HostPattern::Any => true,
                HostPattern::Exact(h) | HostPattern::Domain(h) => {
                    domains.iter().any(|d| within(h, d) || within(d, h))
                }
            };
            if inside {
                return None;
            }
        }
        Some(domains)
    }

    /// The allowed-domain filter for a tool that already asks for `requested` domains
    /// (`None`: no filter of its own): the intersection of both, most specific domain of
    /// each overlapping pair, in the request's order. `None`: the policy is not a domain
    /// filter, or the intersection is empty (the tool must go).
    pub fn domain_filter(&self, requested: Option<&[String]>) -> Option<Vec<String>> {
        let ours = self.allowed_domains()?;
        let Some(requested) = requested else {
            return Some(ours);
        };
        let mut out: Vec<String> = Vec::new();
        for r in requested {
            let r = r.trim().trim_end_matches('.').to_ascii_lowercase();
            // A requested entry may be a URL-ish prefix (`example.com/docs`): only its host
            // part is compared, and the entry is kept as it was.
            let host = r.split('/').next().unwrap_or("");
            for d in &ours {
                let pick = if within(host, d) {
                    Some(r.clone())
                } else if within(d, host) && !r.contains('/') {
                    Some(d.clone())
                } else {
                    None
                };
                if let Some(p) = pick {
                    if !out.contains(&p) {
                        out.push(p);
                    }
                }
            }
        }
        (!out.is_empty()).then_some(out)
    }
}

impl fmt::Debug for NetworkPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = |l: &[HostPattern]| l.iter().map(ToString::to_string).collect::<Vec<_>>();
        f.debug_struct("NetworkPolicy")
            .field("allow", &list(&self.allow))
            .field("block", &list(&self.block))
            .field("on_violation", &self.on_violation)
            .finish()
    }
}

/// The policy event of a call record: what mediation removed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyEvent {
    /// Always `"provider_capability_unavailable"`.
    pub code: String,
    /// The value-free JSON paths removed or narrowed, de-duplicated, in body order
    /// (`tools[2].type`, `messages[3].content[1].image_url.url`).
    pub paths: Vec<String>,
}

impl PolicyEvent {
    /// The event for these paths.
    pub fn new(paths: Vec<String>) -> Self {
        PolicyEvent {
            code: POLICY_CODE.to_owned(),
            paths,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_parse_and_match() {
        let p = NetworkPolicy::new(
            &["*.Example.org.", "10.0.0.7", "files.test"],
            &["bad.example.org"],
        )
        .expect("policy");
        assert!(p.allows_host("example.org"));
        assert!(p.allows_host("a.b.EXAMPLE.org"));
        assert!(!p.allows_host("badexample.org"));
        assert!(!p.allows_host("bad.example.org"));
        assert!(p.allows_host("10.0.0.7"));
        assert!(!p.allows_host("sub.files.test"));
        for bad in [
            "http://x.org",
            "x.org:80",
            "a*.org",
            "*",
            "",
            "x.org/p",
            "*.",
            "a..b",
        ] {
            if bad == "*" {
                continue;
            }
            let e = NetworkPolicy::new(&[bad], &[] as &[&str]).expect_err(bad);
            assert!(e.starts_with("network.allow: host pattern"), "{e}");
        }
        assert!(!NetworkPolicy::new(&["*"], &[] as &[&str])
            .expect("open")
            .is_restricted());
        assert!(NetworkPolicy::new(&["*"], &["x.org"])
            .expect("block")
            .is_restricted());
        assert!(NetworkPolicy::deny_all().is_restricted());
        assert!(!NetworkPolicy::deny_all().allows_host("x.org"));
    }

    #[test]
    fn urls_need_an_allowed_http_host() {
        let p = NetworkPolicy::new(&["*.ok.org"], &[] as &[&str]).expect("policy");
        assert!(p.allows_url("data:image/png;base64,AAAA"));
        assert!(p.allows_url(" DATA:text/plain,hi"));
        assert!(p.allows_url("https://cdn.ok.org/a.png"));
        assert!(p.allows_url("HTTP://OK.ORG:8080/x"));
        assert!(!p.allows_url("https://ok.org@evil.com/a.png"));
        assert!(!p.allows_url("https://evil.com/?u=ok.org"));
        assert!(!p.allows_url("ftp://ok.org/a"));
        assert!(!p.allows_url("file:///etc/passwd"));
        assert!(!p.allows_url("not a url"));
        assert!(!p.allows_url("https://127.0.0.1/"));
        assert!(!p.allows_url("https://[::1]/"));
    }

    #[test]
    fn domain_filters() {
        let p = NetworkPolicy::new(&["*.a.org", "*.b.org"], &["c.org"]).expect("policy");
        assert_eq!(
            p.allowed_domains(),
            Some(vec!["a.org".into(), "b.org".into()])
        );
        assert_eq!(
            p.domain_filter(Some(&["docs.a.org".into(), "x.org".into(), "org".into()])),
            Some(vec!["docs.a.org".into(), "a.org".into(), "b.org".into()])
        );
        assert_eq!(p.domain_filter(Some(&["x.org".into()])), None);
        for (allow, block) in [
            (vec!["*.a.org", "exact.org"], vec![]),
            (vec!["*"], vec!["x.org"]),
            (vec!["*.a.org"], vec!["in.a.org"]),
            (vec![], vec![]),
        ] {
            let p = NetworkPolicy::new(&allow, &block).expect("policy");
            assert_eq!(p.allowed_domains(), None, "{allow:?} {block:?}");
        }
    }

    #[test]
    fn serde_defaults_and_errors() {
        let p: NetworkPolicy =
            serde_json::from_str(r#"{"block":["x.org"],"on_violation":"reject"}"#).expect("policy");
        assert_eq!(p.on_violation(), OnViolation::Reject);
        assert!(p.allows_host("y.org"));
        assert_eq!(
            serde_json::to_value(&p).expect("json"),
            serde_json::json!({"allow": ["*"], "block": ["x.org"], "on_violation": "reject"})
        );
        let open: NetworkPolicy = serde_json::from_str("{}").expect("open");
        assert_eq!(&open, NetworkPolicy::unrestricted());
        for bad in [
            r#"{"allow":["http://x"]}"#,
            r#"{"allow":"x"}"#,
            r#"{"deny":[]}"#,
            r#"{"on_violation":"drop"}"#,
        ] {
            assert!(serde_json::from_str::<NetworkPolicy>(bad).is_err(), "{bad}");
        }
    }
}
