//! Who may call by address: a route's or a listener's `allow` / `deny` compiled into sorted
//! address ranges ([`AccessList`]), and the client address they are checked against
//! ([`client_ip`]: the connection's peer, or behind `trusted_proxies` the address the
//! proxies forwarded).
//!
//! The rule is `tailguard_config::access`'s: deny wins, then an `allow` list (when given)
//! must hold the address. Each list is built once per snapshot into merged, sorted ranges
//! of IPv4 and IPv6 addresses, so a lookup is a binary search (two for a list pair) whatever
//! the list's length, and allocates nothing.

use std::net::IpAddr;

use http::HeaderMap;
use tailguard_config::access::networks;
use tailguard_config::cidr::Cidr;

/// A set of networks as sorted, disjoint, merged ranges of addresses (IPv4 ones widened
/// to `u128`, in a list of their own).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Nets {
    v4: Vec<(u128, u128)>,
    v6: Vec<(u128, u128)>,
}

impl Nets {
    /// The networks of `cidrs`, merged.
    pub fn build(cidrs: &[Cidr]) -> Nets {
        let mut v4 = Vec::new();
        let mut v6 = Vec::new();
        for c in cidrs {
            match normal(c.addr()) {
                IpAddr::V4(a) => {
                    // A mapped network (`::ffff:10.0.0.0/104`) became IPv4: its prefix too.
                    let prefix = match c.addr() {
                        IpAddr::V6(_) => c.prefix().saturating_sub(96),
                        IpAddr::V4(_) => c.prefix(),
                    };
                    let host = u32::MAX.checked_shr(u32::from(prefix)).unwrap_or(0);
                    let first = a.to_bits() & !host;
                    v4.push((u128::from(first), u128::from(first | host)));
                }
                IpAddr::V6(a) => {
                    let host = u128::MAX.checked_shr(u32::from(c.prefix())).unwrap_or(0);
                    let first = a.to_bits() & !host;
                    v6.push((first, first | host));
                }
            }
        }
        Nets {
            v4: merged(v4),
            v6: merged(v6),
        }
    }

    /// Whether no network is in the set.
    pub fn is_empty(&self) -> bool {
        self.v4.is_empty() && self.v6.is_empty()
    }

    /// Whether `ip` is in one of the networks (an IPv4-mapped IPv6 address as its IPv4).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match normal(ip) {
            IpAddr::V4(a) => within(&self.v4, u128::from(a.to_bits())),
            IpAddr::V6(a) => within(&self.v6, a.to_bits()),
        }
    }
}

/// An IPv4-mapped IPv6 address (`::ffff:10.0.0.1`, how a dual-stack socket reports an IPv4
/// peer) as the IPv4 address it is.
fn normal(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Sorts ranges and joins the ones that overlap or touch.
fn merged(mut ranges: Vec<(u128, u128)>) -> Vec<(u128, u128)> {
    ranges.sort_unstable();
    let mut out: Vec<(u128, u128)> = Vec::with_capacity(ranges.len());
    for (first, last) in ranges {
        match out.last_mut() {
            Some(prev) if first <= prev.1.saturating_add(1) => prev.1 = prev.1.max(last),
            _ => out.push((first, last)),
        }
    }
    out.shrink_to_fit();
    out
}

/// Whether `x` falls in one of the sorted, disjoint `ranges`.
fn within(ranges: &[(u128, u128)], x: u128) -> bool {
    // The ranges starting at or before `x`; only the last of them can hold it.
    let after = ranges.partition_point(|&(first, _)| first <= x);
    after > 0 && x <= ranges[after - 1].1
}

/// A route's or a listener's `allow` / `deny`, compiled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessList {
    /// `None`: no `allow` list, every address not denied passes.
    allow: Option<Nets>,
    deny: Nets,
}

impl AccessList {
    /// The lists of a route or listener; `None` when it has neither (it stays open).
    pub fn build(config: tailguard_config::access::AccessConfig<'_>) -> Option<AccessList> {
        if !config.is_set() {
            return None;
        }
        Some(AccessList {
            allow: config.allow.map(|a| Nets::build(&networks(a))),
            deny: config
                .deny
                .map(|d| Nets::build(&networks(d)))
                .unwrap_or_default(),
        })
    }

    /// Whether a client at `ip` may call: not in `deny`, and in `allow` if there is one.
    pub fn allows(&self, ip: IpAddr) -> bool {
        !self.deny.contains(ip) && self.allow.as_ref().is_none_or(|a| a.contains(ip))
    }
}

/// The address a request's allow/deny lists are checked against. From a peer that is not a
/// trusted proxy: the peer. From a trusted proxy: its `X-Forwarded-For` read from the right
/// (nginx's `real_ip_recursive on`), skipping every element in `trusted` (proxies of the
/// operator's own), to the first one that is not: the address the last trusted proxy saw.
/// The elements to its left are the client's own to write and are never read. An element
/// that is not an IP address ends the walk at the trusted hop after it; when every element
/// is trusted, the leftmost one counts; without the field, the peer.
pub fn client_ip(peer: IpAddr, peer_trusted: bool, headers: &HeaderMap, trusted: &Nets) -> IpAddr {
    if !peer_trusted {
        return peer;
    }
    let mut client = peer;
    // Several field lines are one list, in order (RFC 9110 §5.3): the last line's elements
    // are the nearest hops.
    let lines = headers.get_all(&tailguard_http::headers::X_FORWARDED_FOR);
    for line in lines.iter().rev() {
        for element in line.as_bytes().rsplit(|&b| b == b',') {
            let Some(ip) = element_ip(element) else {
                return client;
            };
            client = ip;
            if !trusted.contains(ip) {
                return client;
            }
        }
    }
    client
}

/// One `X-Forwarded-For` element as an address: `10.0.0.1`, `2001:db8::1`, `[2001:db8::1]`
/// (with optional surrounding spaces).
fn element_ip(element: &[u8]) -> Option<IpAddr> {
    let text = std::str::from_utf8(element).ok()?.trim();
    let text = text
        .strip_prefix('[')
        .and_then(|t| t.strip_suffix(']'))
        .unwrap_or(text);
    text.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn nets(list: &[&str]) -> Nets {
        let cidrs: Vec<Cidr> = list.iter().map(|s| s.parse().expect("cidr")).collect();
        Nets::build(&cidrs)
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    #[test]
    fn a_set_holds_its_networks_and_nothing_else() {
        let n = nets(&[
            "10.0.0.0/8",
            "192.168.1.0/25",
            "::1",
            "2001:db8::/32",
            "0.0.0.1",
        ]);
        for yes in [
            "10.0.0.0",
            "10.255.255.255",
            "192.168.1.127",
            "::1",
            "2001:db8:ffff::9",
            "::ffff:10.1.2.3",
            "0.0.0.1",
        ] {
            assert!(n.contains(ip(yes)), "{yes}");
        }
        for no in [
            "9.255.255.255",
            "11.0.0.0",
            "192.168.1.128",
            "::2",
            "2001:db9::",
            "127.0.0.1",
            "0.0.0.0",
            "::ffff:11.0.0.1",
        ] {
            assert!(!n.contains(ip(no)), "{no}");
        }
    }

    #[test]
    fn overlapping_and_touching_networks_merge() {
        let n = nets(&[
            "10.0.0.0/9",
            "10.128.0.0/9",
            "10.1.0.0/16",
            "0.0.0.0/0",
            "::/0",
        ]);
        assert_eq!(n.v4, vec![(0, u128::from(u32::MAX))]);
        assert_eq!(n.v6, vec![(0, u128::MAX)]);
        let n = nets(&["10.0.0.0/9", "10.128.0.0/9"]);
        assert_eq!(n.v4.len(), 1);
        assert!(n.contains(ip("10.200.0.1")));
        assert!(!nets(&[]).contains(ip("10.0.0.1")));
    }

    #[test]
    fn a_mapped_network_is_its_ipv4_network() {
        let n = nets(&["::ffff:10.0.0.0/104"]);
        assert!(n.contains(ip("10.9.9.9")));
        assert!(!n.contains(ip("11.0.0.1")));
    }

    fn list(allow: Option<&[&str]>, deny: Option<&[&str]>) -> AccessList {
        AccessList {
            allow: allow.map(nets),
            deny: deny.map(nets).unwrap_or_default(),
        }
    }

    #[test]
    fn deny_wins_over_allow_in_any_order() {
        let l = list(Some(&["10.0.0.0/8"]), Some(&["10.1.2.3"]));
        assert!(l.allows(ip("10.1.2.4")));
        assert!(!l.allows(ip("10.1.2.3")));
        assert!(!l.allows(ip("11.0.0.1")), "not in allow");
        let only_deny = list(None, Some(&["10.0.0.0/8"]));
        assert!(only_deny.allows(ip("127.0.0.1")));
        assert!(!only_deny.allows(ip("10.0.0.1")));
    }

    fn xff(lines: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for l in lines {
            h.append("x-forwarded-for", HeaderValue::from_str(l).expect("value"));
        }
        h
    }

    #[test]
    fn the_forwarded_address_is_the_first_untrusted_from_the_right() {
        let trusted = nets(&["127.0.0.0/8", "10.0.0.0/8"]);
        let peer = ip("127.0.0.1");
        // The client wrote 6.6.6.6 itself; 203.0.113.7 is what our proxy 10.0.0.5 saw.
        let h = xff(&["6.6.6.6, 203.0.113.7", "10.0.0.5"]);
        assert_eq!(client_ip(peer, true, &h, &trusted), ip("203.0.113.7"));
        // Not from a trusted peer: the field is not read at all.
        assert_eq!(client_ip(peer, false, &h, &trusted), peer);
        // No field: the peer.
        assert_eq!(client_ip(peer, true, &HeaderMap::new(), &trusted), peer);
        // All trusted: the leftmost.
        let h = xff(&["10.0.0.9, 10.0.0.5"]);
        assert_eq!(client_ip(peer, true, &h, &trusted), ip("10.0.0.9"));
        // Garbage stops the walk at the last trusted hop, never the garbage's left side.
        let h = xff(&["1.2.3.4, nonsense, 10.0.0.5"]);
        assert_eq!(client_ip(peer, true, &h, &trusted), ip("10.0.0.5"));
        // IPv6, bracketed or not.
        let h = xff(&["[2001:db8::7]", " ::1 "]);
        let trusted6 = nets(&["::1"]);
        assert_eq!(client_ip(ip("::1"), true, &h, &trusted6), ip("2001:db8::7"));
    }
}
