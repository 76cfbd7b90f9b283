//! Shared helpers: the registry every format test renders, and a raw HTTP/1.1 client that
//! reports whether a chunked body ended properly.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use tailguard_metrics::Registry;

/// A registry with every metric type and the edge cases of the formats: escaping in label
/// values and HELP, NaN and infinities, negative gauges, families without series.
pub(crate) fn every_type() -> Registry {
    let r = Registry::builder()
        .self_metrics_prefix(None)
        .shards(4)
        .build()
        .unwrap();
    let requests = r
        .counter("requests", "Requests served.", &["route", "status"])
        .unwrap();
    requests.get_or_create(&["/a", "200"]).unwrap().add(3);
    requests.get_or_create(&["/a", "500"]).unwrap().inc();
    requests
        .get_or_create(&["back\\slash \"quoted\"\nnext line", "200"])
        .unwrap()
        .add(7);
    r.counter("empty_things", "A family with no series yet.", &["kind"])
        .unwrap();
    r.gauge(
        "temperature_celsius",
        "Help with a back\\slash, \"quotes\" and a\nnewline.",
        &[],
    )
    .unwrap()
    .get_or_create(&[])
    .unwrap()
    .set(-12);
    let ratio = r
        .float_gauge("ratio", "Float gauge values.", &["case"])
        .unwrap();
    for (case, v) in [
        ("nan", f64::NAN),
        ("pos_inf", f64::INFINITY),
        ("neg_inf", f64::NEG_INFINITY),
        ("half", 0.5),
    ] {
        ratio.get_or_create(&[case]).unwrap().set(v);
    }
    r.float_counter("cpu_seconds", "Float counter.", &[])
        .unwrap()
        .get_or_create(&[])
        .unwrap()
        .add(1.5);
    let latency = r
        .histogram("latency_seconds", "Latency.", &["route"], &[0.01, 0.1, 1.0])
        .unwrap()
        .get_or_create(&["/a"])
        .unwrap();
    for v in [0.005, 0.05, 0.05, 5.0] {
        latency.observe(v);
    }
    r.histogram(
        "size_bytes",
        "No labels, no observations.",
        &[],
        &[100.0, 1000.0],
    )
    .unwrap()
    .get_or_create(&[])
    .unwrap();
    r.histogram(
        "unused_seconds",
        "A histogram family with no series.",
        &["x"],
        &[1.0],
    )
    .unwrap();
    r
}

/// A response read to the end of the connection.
#[derive(Debug)]
pub(crate) struct RawResponse {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Vec<u8>,
    /// For a chunked body: whether the terminating zero-size chunk arrived.
    pub(crate) complete: bool,
}

impl RawResponse {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// GET `path` over a fresh connection with `Connection: close` and extra headers.
pub(crate) fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> RawResponse {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        request.push_str(&format!("{k}: {v}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).unwrap();
    let mut raw = Vec::new();
    // A reset connection (an aborted scrape) is an error here; keep what arrived.
    let _ = stream.read_to_end(&mut raw);
    parse_response(&raw)
}

fn parse_response(raw: &[u8]) -> RawResponse {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("response head");
    let head = std::str::from_utf8(&raw[..split]).unwrap();
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let rest = &raw[split + 4..];
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    if !chunked {
        return RawResponse {
            status,
            headers,
            body: rest.to_vec(),
            complete: true,
        };
    }
    let mut body = Vec::new();
    let mut at = 0;
    let mut complete = false;
    while let Some(eol) = rest[at..].windows(2).position(|w| w == b"\r\n") {
        let size_text = std::str::from_utf8(&rest[at..at + eol]).unwrap();
        let size = usize::from_str_radix(size_text.split(';').next().unwrap().trim(), 16).unwrap();
        at += eol + 2;
        if size == 0 {
            complete = true;
            break;
        }
        if at + size > rest.len() {
            body.extend_from_slice(&rest[at..]);
            break;
        }
        body.extend_from_slice(&rest[at..at + size]);
        at += size + 2;
        if at > rest.len() {
            break;
        }
    }
    RawResponse {
        status,
        headers,
        body,
        complete,
    }
}
