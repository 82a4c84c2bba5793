//! The address of a remote tier: `redis://HOST:PORT[,HOST:PORT...]`.
//!
//! One host is a single node, or any node of a cluster (the store asks the
//! node whether cluster mode is on); several hosts are the seeds of one
//! cluster. Nothing else is accepted (no user, password, database or
//! query): a malformed address is refused with the form to use.

/// The form an address must have, for messages.
pub const URL_FORM: &str = "redis://HOST:PORT[,HOST:PORT...]";

/// The scheme every address starts with.
pub const SCHEME: &str = "redis://";

/// A parsed address: the hosts in the order given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisUrl {
    /// `(host, port)` pairs; never empty. A host is a name, an IPv4
    /// address or a bracketed IPv6 address (`[::1]`).
    pub hosts: Vec<(String, u16)>,
}

/// Why an address was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("bad remote tier address {url:?}: {why}; use {URL_FORM}, e.g. redis://127.0.0.1:6379 or redis://10.0.0.1:7000,10.0.0.2:7000 for a cluster")]
pub struct BadUrl {
    /// The address given.
    pub url: String,
    /// What is wrong with it.
    pub why: String,
}

impl RedisUrl {
    /// Parses `redis://HOST:PORT[,HOST:PORT...]`.
    pub fn parse(url: &str) -> Result<RedisUrl, BadUrl> {
        let bad = |why: String| BadUrl {
            url: url.to_string(),
            why,
        };
        let rest = url
            .strip_prefix(SCHEME)
            .ok_or_else(|| bad(format!("it does not start with {SCHEME}")))?;
        if let Some(c) = rest.chars().find(|c| matches!(c, '/' | '@' | '?' | '#')) {
            return Err(bad(format!(
                "{c:?} is not allowed: no user, password, database or options"
            )));
        }
        let mut hosts = Vec::new();
        for part in rest.split(',') {
            let (host, port) = part
                .rsplit_once(':')
                .ok_or_else(|| bad(format!("{part:?} has no port (HOST:PORT)")))?;
            let ipv6 = host.starts_with('[') && host.ends_with(']') && host.len() > 2;
            if host.is_empty() || (host.contains(':') && !ipv6) {
                return Err(bad(format!("{part:?} has no valid host")));
            }
            let port = port
                .parse::<u16>()
                .ok()
                .filter(|&p| p != 0)
                .ok_or_else(|| bad(format!("{port:?} is not a port (1..=65535)")))?;
            hosts.push((host.to_string(), port));
        }
        Ok(RedisUrl { hosts })
    }

    /// Whether `s` names a remote tier at all (starts with the scheme):
    /// what tells an address from a file path.
    pub fn is_remote(s: &str) -> bool {
        s.starts_with(SCHEME)
    }

    /// One `redis://HOST:PORT` per host, as the client takes them.
    pub fn node_urls(&self) -> Vec<String> {
        self.hosts
            .iter()
            .map(|(h, p)| format!("{SCHEME}{h}:{p}"))
            .collect()
    }
}

impl std::fmt::Display for RedisUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(SCHEME)?;
        for (i, (h, p)) in self.hosts.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{h}:{p}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn good_addresses_parse_and_print_back() {
        for s in [
            "redis://127.0.0.1:6379",
            "redis://a:1,b:2,c:3",
            "redis://[::1]:7000",
            "redis://cache.example:6380",
        ] {
            let u = RedisUrl::parse(s).unwrap();
            assert_eq!(u.to_string(), s);
        }
        let u = RedisUrl::parse("redis://a:1,b:2").unwrap();
        assert_eq!(u.node_urls(), ["redis://a:1", "redis://b:2"]);
    }

    #[test]
    fn bad_addresses_say_the_form() {
        for s in [
            "",
            "127.0.0.1:6379",
            "rediss://h:1",
            "redis://",
            "redis://h",
            "redis://h:0",
            "redis://h:99999",
            "redis://:6379",
            "redis://h:1,",
            "redis://u:pw@h:1",
            "redis://h:1/0",
            "redis://::1:6379",
        ] {
            let e = RedisUrl::parse(s).unwrap_err();
            assert!(e.to_string().contains(URL_FORM), "{s}: {e}");
        }
    }
}
