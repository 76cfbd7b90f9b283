//! Helpers shared by the tests: records, line parsing.

use std::net::SocketAddr;
use std::time::{Duration, UNIX_EPOCH};

use tailguard_access_log::Record;

/// A record whose target carries `id`, so every line can be traced back to its append.
pub(crate) fn numbered<'a>(target: &'a [u8]) -> Record<'a> {
    Record {
        time: UNIX_EPOCH + Duration::from_secs(1_795_295_993),
        remote_addr: Some([10, 1, 2, 3].into()),
        method: b"GET",
        target,
        status: 200,
        body_bytes_sent: 1234,
        bytes_sent: 1400,
        request_time: Duration::from_micros(1500),
        upstream_addr: Some(SocketAddr::from(([127, 0, 0, 1], 9000))),
        upstream_status: Some(200),
        upstream_response_time: Some(Duration::from_micros(1200)),
        referer: Some(b"https://example.com/"),
        user_agent: Some(b"Mozilla/5.0 (X11; Linux x86_64) load-test"),
        route: Some("demo"),
        ..Record::default()
    }
}

/// Every complete line of a combined log: checks its shape and returns the targets.
pub(crate) fn combined_targets(text: &str) -> Vec<String> {
    assert!(text.is_empty() || text.ends_with('\n'), "log ends mid-line");
    text.lines()
        .filter(|l| !l.starts_with("# tailguard"))
        .map(|l| {
            assert!(l.starts_with("10.1.2.3 - - [21/Nov/2026:21:19:53 +0000] \"GET "), "bad line {l:?}");
            assert!(
                l.ends_with(" HTTP/1.1\" 200 1234 \"https://example.com/\" \"Mozilla/5.0 (X11; Linux x86_64) load-test\""),
                "bad line {l:?}"
            );
            let start = l.find("\"GET ").unwrap() + 5;
            let end = l.find(" HTTP/1.1\"").unwrap();
            l[start..end].to_owned()
        })
        .collect()
}

/// The `N` of every "dropped N lines" record.
pub(crate) fn dropped_notes(text: &str) -> u64 {
    text.lines()
        .filter_map(|l| l.strip_prefix("# tailguard access log: dropped "))
        .map(|rest| rest.split(' ').next().unwrap().parse::<u64>().unwrap())
        .sum()
}
