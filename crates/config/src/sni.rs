//! The names a TLS listener's certificates are served for (`server_names`): parsed,
//! lowercased, checked against the certificate, and kept in a table an exact name or a
//! one-label wildcard is looked up in. The config check finds two entries claiming one name
//! with it; the runtime's SNI resolver picks certificates with it.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::net::IpAddr;

use rustls::pki_types::{CertificateDer, DnsName};

/// A name a certificate entry serves (`server_names`), lowercased.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ServerName {
    /// `a.example`: that name only.
    Exact(String),
    /// `*.b.example`, held as `b.example`: any one label in front of it (`x.b.example`),
    /// neither `b.example` itself nor `y.x.b.example`, as a wildcard certificate matches
    /// (RFC 6125 §6.4.3).
    Wildcard(String),
}

impl ServerName {
    /// Parses a `server_names` element: a DNS name, or `*.` and a DNS name of at least two
    /// labels. Case does not matter (SNI is compared lowercased).
    pub fn parse(text: &str) -> Result<ServerName, String> {
        let lower = text.to_ascii_lowercase();
        let (wildcard, name) = match lower.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, lower.as_str()),
        };
        if name.parse::<IpAddr>().is_ok() {
            return Err(format!(
                "`{text}` is an IP address; SNI carries DNS names only (a client connecting \
                 to an address gets the default certificate)"
            ));
        }
        if name.contains('*') {
            return Err(format!(
                "`{text}`: a wildcard is `*.` in front of a name, standing for one whole label"
            ));
        }
        if name.ends_with('.') || DnsName::try_from(name).is_err() {
            return Err(format!("`{text}` is not a DNS name"));
        }
        if !wildcard {
            return Ok(ServerName::Exact(name.to_owned()));
        }
        if !name.contains('.') {
            return Err(format!(
                "`{text}` would stand for every name under a top-level domain; a wildcard \
                 needs at least two labels after `*.`"
            ));
        }
        Ok(ServerName::Wildcard(name.to_owned()))
    }

    /// Whether the certificate `cert` (DER, end entity) is valid for this name: an exact
    /// name as a client would verify it, a wildcard only if the certificate itself carries
    /// that wildcard (a certificate for `a.b.example` does not cover `*.b.example`).
    /// On failure, the names the certificate has.
    pub fn covered_by(&self, cert: &CertificateDer<'_>) -> Result<(), String> {
        let parsed = webpki::EndEntityCert::try_from(cert)
            .map_err(|e| format!("the certificate does not parse: {e}"))?;
        let covered = match self {
            ServerName::Exact(name) => DnsName::try_from(name.as_str()).is_ok_and(|dns| {
                parsed
                    .verify_is_valid_for_subject_name(&rustls::pki_types::ServerName::DnsName(dns))
                    .is_ok()
            }),
            ServerName::Wildcard(parent) => parsed.valid_dns_names().any(|san| {
                san.strip_prefix("*.")
                    .is_some_and(|p| p.eq_ignore_ascii_case(parent))
            }),
        };
        if covered {
            return Ok(());
        }
        let names: Vec<&str> = parsed.valid_dns_names().collect();
        Err(format!(
            "the certificate is not valid for `{self}`; its DNS names are: {}",
            if names.is_empty() {
                "(none)".to_owned()
            } else {
                names.join(", ")
            }
        ))
    }
}

impl std::fmt::Display for ServerName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ServerName::Exact(name) => f.write_str(name),
            ServerName::Wildcard(parent) => write!(f, "*.{parent}"),
        }
    }
}

/// Server names and what each picks: used with certificates by the runtime's SNI resolver,
/// and with entry indexes by the config check that finds two entries claiming one name.
#[derive(Debug)]
pub struct Names<T> {
    exact: HashMap<String, T>,
    /// Keyed by the parent name (`b.example` for `*.b.example`).
    wildcard: HashMap<String, T>,
}

impl<T> Default for Names<T> {
    fn default() -> Self {
        Names {
            exact: HashMap::new(),
            wildcard: HashMap::new(),
        }
    }
}

impl<T> Names<T> {
    /// Claims `name` for `value`; if it is already claimed, changes nothing and returns the
    /// value that holds it. An exact name and a wildcard covering it do not conflict: the
    /// exact name wins for itself.
    pub fn claim(&mut self, name: ServerName, value: T) -> Result<(), &T> {
        let (map, key) = match name {
            ServerName::Exact(n) => (&mut self.exact, n),
            ServerName::Wildcard(p) => (&mut self.wildcard, p),
        };
        match map.entry(key) {
            Entry::Occupied(held) => Err(held.into_mut()),
            Entry::Vacant(free) => {
                free.insert(value);
                Ok(())
            }
        }
    }

    /// What a lowercase SNI name picks: its exact entry, else the wildcard of its parent.
    pub fn get(&self, sni: &str) -> Option<&T> {
        if let Some(exact) = self.exact.get(sni) {
            return Some(exact);
        }
        let (_, parent) = sni.split_once('.')?;
        self.wildcard.get(parent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[(&str, u32)]) -> Names<u32> {
        let mut n = Names::default();
        for (name, v) in list {
            n.claim(ServerName::parse(name).unwrap(), *v).unwrap();
        }
        n
    }

    #[test]
    fn exact_beats_wildcard_and_a_wildcard_covers_one_label() {
        let n = names(&[("a.b.example", 1), ("*.b.example", 2), ("A.Example", 3)]);
        assert_eq!(n.get("a.b.example"), Some(&1));
        assert_eq!(n.get("x.b.example"), Some(&2));
        assert_eq!(n.get("a.example"), Some(&3));
        assert_eq!(
            n.get("b.example"),
            None,
            "a wildcard does not cover its parent"
        );
        assert_eq!(n.get("y.x.b.example"), None, "nor two labels");
        assert_eq!(n.get("example"), None);
        assert_eq!(n.get(""), None);
    }

    #[test]
    fn a_name_is_claimed_once_whatever_its_case() {
        let mut n = names(&[("a.example", 1), ("*.b.example", 2)]);
        assert_eq!(n.claim(ServerName::parse("A.EXAMPLE").unwrap(), 9), Err(&1));
        assert_eq!(
            n.claim(ServerName::parse("*.B.example").unwrap(), 9),
            Err(&2)
        );
        assert_eq!(n.claim(ServerName::parse("b.example").unwrap(), 9), Ok(()));
    }

    #[test]
    fn malformed_names_are_refused() {
        for bad in [
            "",
            "*",
            "*.",
            "*.com",
            "a.*.example",
            "*a.example",
            "**.example",
            "a..example",
            "a.example.",
            "-a.example",
            "a b.example",
            "127.0.0.1",
            "::1",
        ] {
            assert!(ServerName::parse(bad).is_err(), "{bad:?} was accepted");
        }
        assert_eq!(
            ServerName::parse("*.B.Example"),
            Ok(ServerName::Wildcard("b.example".into()))
        );
        assert_eq!(
            ServerName::parse("localhost"),
            Ok(ServerName::Exact("localhost".into()))
        );
    }
}
