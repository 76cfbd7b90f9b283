//! Tests of the built `tailguard` binary, run as a separate process and driven by signals
//! (and its status page in a real browser), and of the scripts that install its tools.

mod access_log;
mod browser;
mod container;
mod cors_browser;
mod debian;
mod deploy;
mod etcd;
mod etcd_tls;
mod gateway;
mod global_limit;
mod global_limit_faults;
mod helm;
mod install_tools;
mod listeners;
mod load;
mod metrics;
mod status;
mod support;
mod trace;
mod trace_jaeger;
mod valgrind;

/// GET `path` from `addr` over a fresh connection; (status, body).
pub(crate) fn metrics_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .expect("timeout");
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("write");
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).expect("read");
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status");
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    (status, body)
}
