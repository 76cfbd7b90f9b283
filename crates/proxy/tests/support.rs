//! Starting a gateway in the test process from config text.

use std::path::Path;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use tailguard_config::Error;
use tailguard_proxy::{Config, Server};
use tailguard_test_support::TestBody;

/// Parses config text, panicking with every diagnostic if it is invalid.
pub(crate) fn config(text: &str) -> Config {
    match Config::parse(text, "test.toml", Path::new(".")) {
        Ok(c) => c,
        Err(e) => panic!("invalid test config:\n{e}"),
    }
}

/// A config with one plain listener on 127.0.0.1:0 followed by `rest`.
pub(crate) fn with_listener(rest: &str) -> Config {
    config(&format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n{rest}"
    ))
}

/// One upstream named `up` with these endpoints and a catch-all route to it.
pub(crate) fn proxy_to(endpoints: &[std::net::SocketAddr], extra: &str) -> Config {
    let eps: Vec<String> = endpoints
        .iter()
        .map(|a| format!("{{ address = \"{a}\" }}"))
        .collect();
    with_listener(&format!(
        "[[upstreams]]\nname = \"up\"\nendpoints = [{}]\n\n[[routes]]\nid = \"all\"\nupstream = \"up\"\n\n{extra}",
        eps.join(", ")
    ))
}

/// Starts a gateway and returns it with its base URL.
pub(crate) fn start(config: Config) -> (Server, String) {
    let server = Server::start(config, 2).expect("gateway starts");
    let url = format!("http://{}", server.local_addrs()[0]);
    (server, url)
}

/// An empty request body.
pub(crate) fn empty() -> TestBody {
    Full::new(Bytes::new()).boxed()
}

/// A GET request builder with a body type the test clients take.
pub(crate) fn get(url: &str) -> Request<TestBody> {
    Request::get(url).body(empty()).expect("request")
}

/// Collects a response body as text.
pub(crate) async fn text(resp: http::Response<hyper::body::Incoming>) -> String {
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    String::from_utf8_lossy(&body).into_owned()
}

/// Bounds an exchange of a raw-socket test: a gateway that deadlocks or never answers fails
/// its test instead of hanging the suite.
pub(crate) async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(std::time::Duration::from_secs(30), f)
        .await
        .expect("the exchange finished within 30 s")
}

/// Reads more bytes into `buf`; false at EOF or on an error (a reset counts as closed).
pub(crate) async fn read_more(
    stream: &mut (impl tokio::io::AsyncRead + Unpin),
    buf: &mut Vec<u8>,
) -> bool {
    use tokio::io::AsyncReadExt as _;
    let mut chunk = [0u8; 16 * 1024];
    match stream.read(&mut chunk).await {
        Ok(0) | Err(_) => false,
        Ok(n) => {
            buf.extend_from_slice(&chunk[..n]);
            true
        }
    }
}

/// The gateway's metrics as a scrape renders them (Prometheus text).
pub(crate) fn metrics_text(server: &Server) -> String {
    String::from_utf8(
        server
            .gateway()
            .metrics()
            .registry()
            .render(tailguard_metrics::Format::Text),
    )
    .expect("the text exposition is UTF-8")
}

/// Every diagnostic of an invalid config (relative paths against the current directory),
/// as `tailguard check` prints them.
pub(crate) fn config_errors(text: &str) -> Vec<String> {
    config_errors_in(Path::new("."), text)
}

/// Every diagnostic of an invalid config whose relative paths (certificates) are in `dir`.
pub(crate) fn config_errors_in(dir: &Path, text: &str) -> Vec<String> {
    match Config::parse(text, "gw.toml", dir) {
        Ok(_) => panic!("config unexpectedly valid"),
        Err(Error::Config(diags)) => diags.iter().map(ToString::to_string).collect(),
        Err(other) => panic!("not a config error: {other}"),
    }
}

/// A client that uploads without waiting for the answer, as most do: on a new connection to
/// `addr`, sends a `POST` head declaring `declared` bytes and the body's first 16 KiB, reads
/// the gateway's answer to its end of stream (an early answer closes the connection), then
/// goes on sending `more` bytes of its body as if it had not looked, and closes. Every write
/// must be taken: the gateway lingers (reads and drops) rather than reset a client whose
/// answer may be unread (RFC 9112 §9.6). Returns the answer as received.
///
/// The client's send buffer is pinned small (the kernel's default can grow to MiBs): a write
/// completes only once the gateway has taken nearly all of it, so a gateway that closed
/// early fails this client's writes instead of leaving them in its own buffer.
pub(crate) async fn upload_past_an_early_answer(
    addr: std::net::SocketAddr,
    declared: u64,
    more: usize,
) -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_send_buffer_size(8 * 1024).expect("SO_SNDBUF");
    let mut c = socket.connect(addr).await.expect("connect");
    let head = format!("POST /up HTTP/1.1\r\nHost: gw.test\r\nContent-Length: {declared}\r\n\r\n");
    c.write_all(head.as_bytes()).await.expect("head");
    let chunk = vec![b'x'; 64 * 1024];
    c.write_all(&chunk[..16 * 1024])
        .await
        .expect("the body's start");
    let mut answer = Vec::new();
    // A reset here (instead of the gateway's end of stream) fails the read.
    c.read_to_end(&mut answer)
        .await
        .expect("the answer, then the gateway's end of stream");
    let mut sent = 0;
    while sent < more {
        let n = chunk.len().min(more - sent);
        c.write_all(&chunk[..n])
            .await
            .unwrap_or_else(|e| panic!("the body's rest after the answer, at {sent}: {e}"));
        sent += n;
    }
    c.shutdown().await.expect("shutdown");
    String::from_utf8_lossy(&answer).into_owned()
}
