//! Memory of a rate limit's key table under a flood of distinct clients: builds a
//! `client_ip` limit (the default `max_keys`, or the one given), sends it 1M distinct IPv4
//! and then 1M distinct IPv6 clients, and prints the table's heap bytes and the process's
//! resident memory before and after. Bounded by construction: the table is allocated whole
//! at load and never grows.
//!
//! `cargo run --release -p tailguard-proxy --example rate_limit_memory [max_keys]`

// An example reports to a person: failing loudly is the right answer.
#![allow(clippy::unwrap_used)]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use http::HeaderMap;
use tailguard_policy::rate_limit::{DEFAULT_MAX_KEYS, Limiter, RateLimitConfig, Scope};
use tailguard_proxy::GatewayMetrics;

/// Resident memory of this process, from `/proc/self/statm`.
fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * rustix::param::page_size() as u64
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

fn main() {
    let max_keys: u64 = std::env::args()
        .nth(1)
        .map_or(DEFAULT_MAX_KEYS, |a| a.parse().unwrap());
    let metrics = GatewayMetrics::register(&tailguard_metrics::Registry::new()).unwrap();
    let config: RateLimitConfig = toml::from_str(&format!(
        "rate = 10\nburst = 20\nkey = \"client_ip\"\nmax_keys = {max_keys}"
    ))
    .unwrap();
    let before = rss_bytes();
    let limiter = Limiter::build(&config, Scope::Route, "flood", metrics.rate_limit()).unwrap();
    let built = rss_bytes();
    println!(
        "max_keys {max_keys}: table {} bytes ({}), RSS {} before the table, {} after",
        limiter.heap_bytes(),
        mib(limiter.heap_bytes() as u64),
        mib(before),
        mib(built)
    );
    let headers = HeaderMap::new();
    let start = Instant::now();
    let mut refused = 0u64;
    for (family, key) in [
        (
            "IPv4",
            (|n: u32| IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + n))) as fn(u32) -> IpAddr,
        ),
        ("IPv6", |n: u32| {
            IpAddr::V6(Ipv6Addr::new(
                0x2001,
                0xdb8,
                0,
                0,
                0,
                0,
                (n >> 16) as u16,
                n as u16,
            ))
        }),
    ] {
        let began = Instant::now();
        for n in 0..1_000_000u32 {
            // Every client arrives within the burst's refill time: all keys are live, so
            // the table evicts (the worst case for memory and for exactness).
            let now = start + Duration::from_nanos(u64::from(n));
            refused += u64::from(limiter.check(now, key(n), &headers).is_err());
        }
        let took = began.elapsed();
        println!(
            "after 1M distinct {family} clients: table {} bytes, RSS {} ({} ns per check)",
            limiter.heap_bytes(),
            mib(rss_bytes()),
            took.as_nanos() / 1_000_000
        );
    }
    let text =
        String::from_utf8(metrics.registry().render(tailguard_metrics::Format::Text)).unwrap();
    for line in text
        .lines()
        .filter(|l| l.starts_with("tailguard_rate_limit"))
    {
        println!("{line}");
    }
    println!("refused: {refused} (every client's first request is admitted)");
}
