//! `[dns]`: how endpoint names are resolved (name servers, timeouts, the hosts file), and
//! what an endpoint's `address` points at ([`Target`]: an IP literal or a name and port).

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

/// `[dns]`: how names are resolved.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DnsConfig {
    /// Name servers, `IP` or `IP:PORT` (port 53 if none); empty: `/etc/resolv.conf`.
    #[serde(default)]
    pub servers: Vec<Spanned<String>>,
    /// How long one query waits for an answer.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// Queries per lookup before it fails (each server in turn).
    #[serde(default = "default_attempts")]
    pub attempts: usize,
    /// The hosts file names are looked up in before any name server, as written (relative
    /// to the config file).
    #[serde(default = "default_hosts_file")]
    pub hosts_file: Spanned<String>,
    /// `hosts_file` resolved against the config file's directory ([`DnsConfig::locate`]).
    #[serde(skip)]
    hosts_path: PathBuf,
}

impl Default for DnsConfig {
    fn default() -> DnsConfig {
        DnsConfig {
            servers: Vec::new(),
            timeout_ms: default_timeout_ms(),
            attempts: default_attempts(),
            hosts_file: default_hosts_file(),
            hosts_path: PathBuf::from(DEFAULT_HOSTS_FILE),
        }
    }
}

/// Where glibc, and so every other program on the host, reads it.
const DEFAULT_HOSTS_FILE: &str = "/etc/hosts";

fn default_hosts_file() -> Spanned<String> {
    Spanned::new(0..0, DEFAULT_HOSTS_FILE.to_owned())
}

fn default_timeout_ms() -> u64 {
    2000
}

fn default_attempts() -> usize {
    2
}

impl DnsConfig {
    /// The servers as socket addresses (validation has checked each).
    pub fn server_addrs(&self) -> Vec<SocketAddr> {
        self.servers
            .iter()
            .filter_map(|s| parse_server(s.get_ref()).ok())
            .collect()
    }

    /// Resolves `hosts_file` against `base_dir`, the config file's directory (called when
    /// a config is parsed).
    pub(crate) fn locate(&mut self, base_dir: &Path) {
        self.hosts_path = base_dir.join(self.hosts_file.get_ref());
    }

    /// The hosts file, as the resolver thread opens it.
    pub fn hosts_path(&self) -> &Path {
        &self.hosts_path
    }

    /// Whether two configs resolve the same way (spans aside).
    pub fn same_as(&self, other: &DnsConfig) -> bool {
        self.server_addrs() == other.server_addrs()
            && self.timeout_ms == other.timeout_ms
            && self.attempts == other.attempts
            && self.hosts_path == other.hosts_path
    }

    /// The longest a lookup can take before it fails.
    pub fn lookup_budget(&self) -> Duration {
        let attempts = u32::try_from(self.attempts.max(1)).unwrap_or(u32::MAX);
        Duration::from_millis(self.timeout_ms.max(1))
            .saturating_mul(attempts)
            .saturating_add(Duration::from_millis(500))
    }
}

/// A name server as written in `[dns] servers`: `IP` or `IP:PORT`.
pub fn parse_server(text: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(addr);
    }
    text.parse::<IpAddr>()
        .map(|ip| SocketAddr::new(ip, 53))
        .map_err(|_| format!("`{text}` is not an IP or IP:PORT address"))
}

/// Where an endpoint's `address` points.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// An IP literal: the endpoint as written.
    Ip(SocketAddr),
    /// A DNS name (lowercase) and port: one endpoint per address it resolves to.
    Name {
        /// The host name, lowercase, without a trailing dot.
        host: String,
        /// The port every address is reached on.
        port: u16,
    },
}

impl Target {
    /// Parses `IP:PORT`, `[IPv6]:PORT` or `NAME:PORT`.
    pub fn parse(text: &str) -> Result<Target, String> {
        if let Ok(addr) = text.parse::<SocketAddr>() {
            return Ok(Target::Ip(addr));
        }
        let bad = || format!("`{text}` is not an IP:PORT or NAME:PORT address");
        let (host, port) = text.rsplit_once(':').ok_or_else(bad)?;
        let port: u16 = port.parse().map_err(|_| bad())?;
        if port == 0 {
            return Err(format!("`{text}`: port 0 cannot be connected to"));
        }
        let host = host.strip_suffix('.').unwrap_or(host);
        if !is_dns_name(host) {
            return Err(bad());
        }
        Ok(Target::Name {
            host: host.to_ascii_lowercase(),
            port,
        })
    }
}

/// RFC 1123 host name: labels of letters, digits and inner hyphens, 1..=63 bytes each,
/// 253 in all; not all digits (that would be a malformed IPv4 address).
fn is_dns_name(host: &str) -> bool {
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(label_ok)
        && !host.bytes().all(|b| b.is_ascii_digit() || b == b'.')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_ip_literals_or_names_with_a_port() {
        assert_eq!(
            Target::parse("10.0.0.1:80"),
            Ok(Target::Ip("10.0.0.1:80".parse().expect("literal")))
        );
        assert_eq!(
            Target::parse("[::1]:8080"),
            Ok(Target::Ip("[::1]:8080".parse().expect("literal")))
        );
        assert_eq!(
            Target::parse("API.Internal.:8080"),
            Ok(Target::Name {
                host: "api.internal".into(),
                port: 8080
            })
        );
        assert_eq!(
            Target::parse("localhost:1"),
            Ok(Target::Name {
                host: "localhost".into(),
                port: 1
            })
        );
        for bad in [
            "api.internal",
            "api.internal:",
            "api.internal:99999",
            "api.internal:0",
            "api_internal:80",
            "-api:80",
            "a..b:80",
            "10.0.0:80",
            "http://api:80",
            ":80",
            "::1:80",
        ] {
            assert!(Target::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn name_servers_default_to_port_53() {
        assert_eq!(
            parse_server("10.0.0.2"),
            Ok("10.0.0.2:53".parse().expect("literal"))
        );
        assert_eq!(
            parse_server("127.0.0.1:5353"),
            Ok("127.0.0.1:5353".parse().expect("literal"))
        );
        assert!(parse_server("dns.internal").is_err());
    }
}
