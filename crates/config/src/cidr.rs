//! IP networks (`10.0.0.0/8`, `::1/128`, a bare address): what `trusted_proxies`, `allow`
//! and `deny` are made of. Hand-written because it is twenty lines: a prefix compare on the address's bits, no
//! dependency needed.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// One network: an address and how many of its leading bits must match.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// The network's address as written (its host bits may be set: `10.1.2.3/8`).
    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    /// How many leading bits of [`Cidr::addr`] an address must share (32 or 128 for a bare
    /// address).
    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    /// Whether `ip` is in this network. An IPv4-mapped IPv6 address (`::ffff:10.0.0.1`, how
    /// a dual-stack socket reports an IPv4 peer) matches IPv4 networks.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => prefix_eq(
                u128::from(net.to_bits()) << 96,
                u128::from(ip.to_bits()) << 96,
                self.prefix,
            ),
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                prefix_eq(net.to_bits(), ip.to_bits(), self.prefix)
            }
            _ => false,
        }
    }
}

fn prefix_eq(a: u128, b: u128, prefix: u8) -> bool {
    prefix == 0 || (a ^ b) >> (128 - u32::from(prefix)) == 0
}

impl FromStr for Cidr {
    type Err = String;

    fn from_str(text: &str) -> Result<Cidr, String> {
        let (addr, prefix) = match text.split_once('/') {
            Some((addr, prefix)) => (addr, Some(prefix)),
            None => (text, None),
        };
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| format!("invalid CIDR {text:?}: not an IP address"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p.parse::<u8>().ok().filter(|&p| p <= max).ok_or_else(|| {
                format!("invalid CIDR {text:?}: the prefix length must be 0-{max}")
            })?,
        };
        Ok(Cidr { addr, prefix })
    }
}

/// From a string (`"10.0.0.0/8"`), the error at the element that is wrong.
impl<'de> serde::Deserialize<'de> for Cidr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Cidr, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Cidr;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a network as a string, like \"10.0.0.0/8\" or \"::1\"")
            }
            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Cidr, E> {
                text.parse().map_err(E::custom)
            }
        }
        d.deserialize_str(Visitor)
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cidr(s: &str) -> Cidr {
        s.parse().expect("valid")
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    #[test]
    fn networks_contain_their_addresses_and_no_others() {
        assert!(cidr("10.0.0.0/8").contains(ip("10.255.1.2")));
        assert!(!cidr("10.0.0.0/8").contains(ip("11.0.0.1")));
        assert!(cidr("127.0.0.1").contains(ip("127.0.0.1")));
        assert!(!cidr("127.0.0.1/32").contains(ip("127.0.0.2")));
        assert!(cidr("0.0.0.0/0").contains(ip("203.0.113.9")));
        assert!(!cidr("0.0.0.0/0").contains(ip("::1")));
        assert!(cidr("::1/128").contains(ip("::1")));
        assert!(cidr("2001:db8::/32").contains(ip("2001:db8:ffff::1")));
        assert!(!cidr("2001:db8::/32").contains(ip("2001:db9::1")));
        assert!(cidr("::/0").contains(ip("2001:db8::1")));
        assert!(cidr("10.0.0.0/8").contains(ip("::ffff:10.1.2.3")), "mapped");
        assert!(cidr("192.168.1.0/25").contains(ip("192.168.1.127")));
        assert!(!cidr("192.168.1.0/25").contains(ip("192.168.1.128")));
    }

    #[test]
    fn bad_networks_say_why() {
        for bad in [
            "10.0.0.0/33",
            "::/129",
            "10.0.0/8",
            "x",
            "10.0.0.0/",
            "10.0.0.0/-1",
            "",
        ] {
            let err = bad.parse::<Cidr>().expect_err(bad);
            assert!(err.starts_with("invalid CIDR"), "{err}");
        }
    }
}
