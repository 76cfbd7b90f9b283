//! Upstreams over TLS (`[upstreams.tls]`): real HTTPS upstreams on 127.0.0.1 with
//! certificates from an rcgen CA; verification, SNI, expiry, trust, mTLS, session
//! resumption, what an idle TLS connection may receive, upgrades, reloads and validation.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use http::{Method, Request};
use http_body_util::BodyExt as _;
use tailguard_proxy::{Config, Server};
use tailguard_test_support::{AfterResponse, TestCa, TlsUpstream, http1_client};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::support::{self, within};

/// Every log line the gateways of this test binary write (one global subscriber: serving
/// threads are not the test's thread). Tests find theirs by the upstream's unique address.
fn log() -> &'static Arc<Mutex<Vec<u8>>> {
    static LOG: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOG.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&buf);
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .with_writer(move || LogWriter(Arc::clone(&sink)))
            .finish();
        // Another module may have set one first; then lines go there and the checks of
        // the reason below fail loudly rather than pass.
        let _ = tracing::subscriber::set_global_default(subscriber);
        buf
    })
}

struct LogWriter(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log").extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The log lines that mention `addr`.
fn lines_about(addr: SocketAddr) -> Vec<String> {
    let text = String::from_utf8_lossy(&log().lock().expect("log")).into_owned();
    let needle = addr.to_string();
    text.lines()
        .filter(|l| l.contains(&needle))
        .map(str::to_owned)
        .collect()
}

/// One upstream `up` at `addr` with `[upstreams.tls]` = `tls` (TOML lines), files relative
/// to `dir`.
fn tls_config(dir: &Path, addr: SocketAddr, tls: &str) -> Result<Config, tailguard_config::Error> {
    tls_config_at(dir, &addr.to_string(), tls)
}

/// [`tls_config`] with the endpoint's address as written (`IP:PORT` or `NAME:PORT`).
fn tls_config_at(dir: &Path, addr: &str, tls: &str) -> Result<Config, tailguard_config::Error> {
    Config::parse(
        &format!(
            "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n\
             [[upstreams]]\nname = \"up\"\nendpoints = [{{ address = \"{addr}\" }}]\n\
             [upstreams.tls]\n{tls}\n\n\
             [[routes]]\nid = \"all\"\nupstream = \"up\"\n"
        ),
        "test.toml",
        dir,
    )
}

/// A gateway with one serving thread (so consecutive requests share one pool slot: a
/// second connection is visible as a second handshake), proxying to `addr` with `tls`.
fn start(dir: &Path, addr: SocketAddr, tls: &str) -> (Server, String) {
    let config = match tls_config(dir, addr, tls) {
        Ok(c) => c,
        Err(e) => panic!("invalid test config:\n{e}"),
    };
    let server = Server::start(config, 1).expect("gateway starts");
    let url = format!("http://{}", server.local_addrs()[0]);
    (server, url)
}

/// Sends `method url` on a fresh client; returns status, `x-client-cert`, `x-tls-resumed`
/// and body.
async fn send(method: Method, url: &str) -> (u16, String, String, String) {
    let client = http1_client();
    let req = Request::builder()
        .method(method)
        .uri(url)
        .body(support::empty())
        .expect("request");
    let resp = within(client.request(req)).await.expect("response");
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .map(|v| v.to_str().unwrap_or("").to_owned())
            .unwrap_or_default()
    };
    let (cert, resumed) = (header("x-client-cert"), header("x-tls-resumed"));
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    (
        status,
        cert,
        resumed,
        String::from_utf8_lossy(&body).into_owned(),
    )
}

async fn get(url: &str) -> (u16, String) {
    let (status, _, _, body) = send(Method::GET, url).await;
    (status, body)
}

/// Waits (at most 5 s) until `done` holds: the upstream counts a failed handshake when its
/// side of it ends, which may be just after the gateway answered.
async fn eventually(done: impl Fn() -> bool) -> bool {
    for _ in 0..500 {
        if done() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    done()
}

/// Asserts one log line about `addr` says the TLS handshake failed with `reason` in it,
/// blamed on the upstream with kind `upstream_tls`.
fn assert_logged(addr: SocketAddr, reason: &str) {
    let lines = lines_about(addr);
    assert!(
        lines
            .iter()
            .any(|l| l.contains("upstream TLS handshake with")
                && l.contains(reason)
                && l.contains("kind=\"upstream_tls\"")
                && l.contains("blame=\"upstream\"")
                && l.contains("status=502")),
        "no log line with `{reason}` about {addr}:\n{}",
        lines.join("\n")
    );
}

#[tokio::test]
async fn a_certificate_verified_with_ca_serves_and_its_connection_is_kept_alive() {
    log();
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = TestCa::new("test ca");
    ca.write(&dir.path().join("ca.pem"));
    let upstream = TlsUpstream::builder(ca.issue(&["127.0.0.1"]))
        .body("secret")
        .start()
        .await;
    let (_server, url) = start(dir.path(), upstream.addr, "ca = \"ca.pem\"");
    assert_eq!(get(&url).await, (200, "secret".to_owned()));
    assert_eq!(get(&url).await, (200, "secret".to_owned()));
    assert_eq!(upstream.requests(), 2);
    assert_eq!(
        upstream.handshakes(),
        1,
        "the second request reused the connection"
    );
}

#[tokio::test]
async fn a_certificate_for_another_name_is_502_and_an_sni_override_makes_it_pass() {
    log();
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = TestCa::new("test ca");
    ca.write(&dir.path().join("ca.pem"));
    let upstream = TlsUpstream::builder(ca.issue(&["api.internal"]))
        .start()
        .await;
    let (_server, url) = start(dir.path(), upstream.addr, "ca = \"ca.pem\"");
    let (status, body) = get(&url).await;
    assert_eq!(status, 502);
    assert_eq!(body, "upstream TLS handshake failed\n");
    assert_logged(upstream.addr, "not valid for name");
    assert_eq!(upstream.requests(), 0);

    let (_server, url) = start(
        dir.path(),
        upstream.addr,
        "ca = \"ca.pem\"\nsni = \"api.internal\"",
    );
    assert_eq!(get(&url).await, (200, "ok".to_owned()));
}

#[tokio::test]
async fn an_endpoint_by_name_is_verified_against_its_name_not_its_address() {
    log();
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = TestCa::new("test ca");
    ca.write(&dir.path().join("ca.pem"));
    let by_name = TlsUpstream::builder(ca.issue(&["localhost"])).start().await;
    let by_addr = TlsUpstream::builder(ca.issue(&["127.0.0.1"])).start().await;
    for (upstream, expected) in [(&by_name, 200), (&by_addr, 502)] {
        let endpoint = format!("localhost:{}", upstream.addr.port());
        let config = tls_config_at(dir.path(), &endpoint, "ca = \"ca.pem\"").expect("config");
        let server = Server::start(config, 1).expect("gateway starts");
        let url = format!("http://{}", server.local_addrs()[0]);
        assert_eq!(get(&url).await.0, expected, "{endpoint}");
    }
    assert_eq!(by_name.requests(), 1);
    // `localhost` may also resolve to ::1, where nothing listens: the failed handshake is
    // then retried there, and the log line is that connect's; the handshake count is not.
    assert_eq!(by_addr.requests(), 0);
    assert!(
        eventually(|| by_addr.failed_handshakes() >= 1).await,
        "the gateway refused the certificate"
    );
}

#[tokio::test]
async fn an_expired_certificate_is_502() {
    log();
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = TestCa::new("test ca");
    ca.write(&dir.path().join("ca.pem"));
    let upstream = TlsUpstream::builder(ca.issue_expired(&["127.0.0.1"]))
        .start()
        .await;
    let (_server, url) = start(dir.path(), upstream.addr, "ca = \"ca.pem\"");
    assert_eq!(get(&url).await.0, 502);
    assert_logged(upstream.addr, "expired");
}

#[tokio::test]
async fn an_untrusted_certificate_is_502_unless_verify_is_off() {
    log();
    let dir = tempfile::tempdir().expect("tempdir");
    let trusted = TestCa::new("trusted ca");
    trusted.write(&dir.path().join("ca.pem"));
    let other = TestCa::new("other ca");
    let upstream = TlsUpstream::builder(other.issue(&["127.0.0.1"]))
        .start()
        .await;
    let (_server, url) = start(dir.path(), upstream.addr, "ca = \"ca.pem\"");
    assert_eq!(get(&url).await.0, 502);
    assert_logged(upstream.addr, "UnknownIssuer");
    // The system roots do not know the test CA either.
    let (_server, url) = start(dir.path(), upstream.addr, "");
    assert_eq!(get(&url).await.0, 502);

    let (_server, url) = start(dir.path(), upstream.addr, "verify = false");
    assert_eq!(get(&url).await, (200, "ok".to_owned()));
}

#[tokio::test]
async fn an_upstream_that_requires_a_client_certificate_gets_it_with_mtls_and_refuses_without() {
    log();
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = TestCa::new("server ca");
    ca.write(&dir.path().join("ca.pem"));
    let clients = TestCa::new("client ca");
    clients
        .issue(&["tailguard.client"])
        .write(dir.path(), "client");
    let upstream = TlsUpstream::builder(ca.issue(&["127.0.0.1"]))
        .client_ca(&clients)
        .start()
        .await;

    // TLS 1.3: the client's handshake is done before the server judges its certificate;
    // the refusal arrives as an alert where the response should be: still a 502.
    let (_server, url) = start(dir.path(), upstream.addr, "ca = \"ca.pem\"");
    assert_eq!(get(&url).await.0, 502);
    assert_eq!(upstream.requests(), 0);
    assert!(eventually(|| upstream.failed_handshakes() >= 1).await);
    let lines = lines_about(upstream.addr);
    assert!(
        lines
            .iter()
            .any(|l| l.contains("CertificateRequired") && l.contains("status=502")),
        "{}",
        lines.join("\n")
    );

    let (_server, url) = start(
        dir.path(),
        upstream.addr,
        "ca = \"ca.pem\"\nclient_cert = \"client.pem\"\nclient_key = \"client.key\"",
    );
    let (status, cert, _, _) = send(Method::GET, &url).await;
    assert_eq!((status, cert.as_str()), (200, "true"));
}

#[tokio::test]
async fn a_second_connection_resumes_the_first_ones_session() {
    log();
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = TestCa::new("test ca");
    ca.write(&dir.path().join("ca.pem"));
    let upstream = TlsUpstream::builder(ca.issue(&["127.0.0.1"]))
        .after_response(AfterResponse::Close)
        .start()
        .await;
    let (_server, url) = start(dir.path(), upstream.addr, "ca = \"ca.pem\"");
    let (status, _, resumed, _) = send(Method::GET, &url).await;
    assert_eq!((status, resumed.as_str()), (200, "false"));
    let (status, _, resumed, _) = send(Method::GET, &url).await;
    assert_eq!((status, resumed.as_str()), (200, "true"));
    assert_eq!((upstream.handshakes(), upstream.resumed()), (2, 1));
}

#[tokio::test]
async fn a_key_update_on_an_idle_connection_leaves_it_usable() {
    log();
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = TestCa::new("test ca");
    ca.write(&dir.path().join("ca.pem"));
    let upstream = TlsUpstream::builder(ca.issue(&["127.0.0.1"]))
        .after_response(AfterResponse::KeyUpdate)
        .start()
        .await;
    let (_server, url) = start(dir.path(), upstream.addr, "ca = \"ca.pem\"");
    for _ in 0..3 {
        assert_eq!(send(Method::POST, &url).await.0, 200);
        // Lets the key update arrive while the connection is idle in the pool.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        upstream.handshakes(),
        1,
        "every request reused the connection"
    );
}

#[tokio::test]
async fn a_close_notify_on_an_idle_connection_makes_it_unusable() {
    log();
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = TestCa::new("test ca");
    ca.write(&dir.path().join("ca.pem"));
    let upstream = TlsUpstream::builder(ca.issue(&["127.0.0.1"]))
        .after_response(AfterResponse::CloseNotifyWhenTold)
        .start()
        .await;
    let (_server, url) = start(dir.path(), upstream.addr, "ca = \"ca.pem\"");
    // POST: not idempotent, so never resent; had the closed connection been taken, the
    // request would fail instead of going on a new one.
    assert_eq!(send(Method::POST, &url).await.0, 200);
    // The gateway has read the whole response (the client has it), so the connection is
    // idle in the pool when the alert comes. Waited for, not slept on.
    upstream.send_close_notifies();
    assert!(
        eventually(|| upstream.close_notifies() == 1).await,
        "the upstream sent its close_notify"
    );
    assert_eq!(send(Method::POST, &url).await.0, 200);
    assert_eq!(upstream.handshakes(), 2);
}

#[tokio::test]
async fn a_close_notify_right_behind_a_response_makes_the_connection_unusable() {
    log();
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = TestCa::new("test ca");
    ca.write(&dir.path().join("ca.pem"));
    let upstream = TlsUpstream::builder(ca.issue(&["127.0.0.1"]))
        .after_response(AfterResponse::CloseNotify)
        .start()
        .await;
    let (_server, url) = start(dir.path(), upstream.addr, "ca = \"ca.pem\"");
    assert_eq!(send(Method::POST, &url).await.0, 200);
    // The alert may arrive within the response's last read or just after it: either way
    // it has arrived once sent (the upstream's Nagle is off), and the POST must not take
    // the connection.
    assert!(
        eventually(|| upstream.close_notifies() == 1).await,
        "the upstream sent its close_notify"
    );
    assert_eq!(send(Method::POST, &url).await.0, 200);
    assert_eq!(upstream.handshakes(), 2);
}

/// The keep-alive race over TLS, treated as over TCP: a request written on a pooled
/// connection whose `close_notify` comes back instead of an answer is sent once more on a
/// new connection if it is idempotent and bodiless (unchanged by the attempt).
#[tokio::test]
async fn a_get_met_by_a_close_notify_on_a_pooled_connection_goes_again_on_a_new_one() {
    log();
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = TestCa::new("test ca");
    ca.write(&dir.path().join("ca.pem"));
    let upstream = TlsUpstream::builder(ca.issue(&["127.0.0.1"]))
        .after_response(AfterResponse::CloseNotifyOnNextRequest)
        .start()
        .await;
    let (_server, url) = start(dir.path(), upstream.addr, "ca = \"ca.pem\"");
    assert_eq!(send(Method::GET, &url).await.0, 200);
    assert_eq!(send(Method::GET, &url).await.0, 200);
    // The second GET reached the first connection (which closed instead of answering),
    // then went on a second one.
    assert_eq!(
        (
            upstream.close_notifies(),
            upstream.handshakes(),
            upstream.requests()
        ),
        (1, 2, 2)
    );
}

/// The other side of the race: a POST that reached the upstream may have been acted on, so
/// it is not sent again (RFC 9110 §9.2.2); the client gets a 502, as over TCP.
#[tokio::test]
async fn a_post_met_by_a_close_notify_on_a_pooled_connection_is_not_sent_again() {
    log();
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = TestCa::new("test ca");
    ca.write(&dir.path().join("ca.pem"));
    let upstream = TlsUpstream::builder(ca.issue(&["127.0.0.1"]))
        .after_response(AfterResponse::CloseNotifyOnNextRequest)
        .start()
        .await;
    let (_server, url) = start(dir.path(), upstream.addr, "ca = \"ca.pem\"");
    assert_eq!(send(Method::POST, &url).await.0, 200);
    assert_eq!(send(Method::POST, &url).await.0, 502);
    assert_eq!(
        (
            upstream.close_notifies(),
            upstream.handshakes(),
            upstream.requests()
        ),
        (1, 1, 1)
    );
    assert!(
        lines_about(upstream.addr)
            .iter()
            .any(|l| l.contains("connection closed before a response")),
        "{}",
        lines_about(upstream.addr).join("\n")
    );
}

/// Regression: the TLS idle check ran under tokio's cooperative budget (128 I/O polls per
/// poll of a task), so a checkout that had thrown away that many closed connections was told
/// "pending" for the next one without its `close_notify` being read, took it, and its POST
/// failed with a 502. (Over TCP the check's `try_read` never consulted the budget.)
#[tokio::test]
async fn a_checkout_past_many_closed_tls_connections_sees_every_one_closed() {
    // Above the 128 of tokio's budget, below the pool's 256 idle connections per thread.
    const OPEN: usize = 200;
    log();
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = TestCa::new("test ca");
    ca.write(&dir.path().join("ca.pem"));
    let upstream = TlsUpstream::builder(ca.issue(&["127.0.0.1"]))
        .after_response(AfterResponse::CloseNotifyWhenTold)
        .hold_until(OPEN)
        .start()
        .await;
    let mut config = tls_config(dir.path(), upstream.addr, "ca = \"ca.pem\"").expect("config");
    // All from 127.0.0.1: over `limits.client_requests` (100) they would be refused.
    config.limits.client_requests = 0;
    let _server = Server::start(config, 1).expect("gateway starts");
    let url = format!("http://{}", _server.local_addrs()[0]);
    // All at once, and none answered before all arrived: one connection each, every one
    // back in the pool's one slot once answered (its whole body was read, or the client
    // would not have it), then closed by a close_notify while idle.
    let answers = within(futures_util::future::join_all(
        (0..OPEN).map(|_| send(Method::GET, &url)),
    ))
    .await;
    assert!(answers.iter().all(|a| a.0 == 200));
    assert_eq!(upstream.handshakes(), OPEN);
    upstream.send_close_notifies();
    assert!(
        eventually(|| upstream.close_notifies() == OPEN).await,
        "the upstream sent every close_notify"
    );
    // POST: never resent, so a closed connection taken would fail it.
    assert_eq!(send(Method::POST, &url).await.0, 200);
    assert_eq!(upstream.handshakes(), OPEN + 1);
}

#[tokio::test]
async fn request_bodies_small_and_large_go_whole_over_one_tls_connection() {
    log();
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = TestCa::new("test ca");
    ca.write(&dir.path().join("ca.pem"));
    // The upstream reads a body only after a pause, so a 12 MiB one fills the socket
    // buffers and the writer waits for room over TLS (backpressure through the TLS layer).
    let upstream = TlsUpstream::builder(ca.issue(&["127.0.0.1"]))
        .body_delay(Duration::from_millis(200))
        .start()
        .await;
    let (_server, url) = start(dir.path(), upstream.addr, "ca = \"ca.pem\"");
    let client = http1_client();
    for size in [5, 12 << 20, 7] {
        let req = Request::post(url.as_str())
            .body(http_body_util::Full::new(bytes::Bytes::from(vec![b'x'; size])).boxed())
            .expect("request");
        let resp = within(client.request(req)).await.expect("response");
        assert_eq!(resp.status(), 200);
        assert_eq!(support::text(resp).await, format!("got {size}"));
    }
    assert_eq!(upstream.handshakes(), 1);
}

#[tokio::test]
async fn a_websocket_upgrade_tunnels_over_tls() {
    log();
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = TestCa::new("test ca");
    ca.write(&dir.path().join("ca.pem"));
    let upstream = TlsUpstream::builder(ca.issue(&["127.0.0.1"])).start().await;
    let (server, _url) = start(dir.path(), upstream.addr, "ca = \"ca.pem\"");
    let mut client = tokio::net::TcpStream::connect(server.local_addrs()[0])
        .await
        .expect("connect");
    client
        .write_all(
            b"GET /chat HTTP/1.1\r\nhost: x\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\n",
        )
        .await
        .expect("write");
    let mut got = Vec::new();
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        assert!(
            within(support::read_more(&mut client, &mut got)).await,
            "closed before the 101"
        );
    }
    assert!(
        got.starts_with(b"HTTP/1.1 101"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    client.write_all(b"ping over tls").await.expect("write");
    let mut echo = [0u8; 13];
    within(client.read_exact(&mut echo)).await.expect("echo");
    assert_eq!(&echo, b"ping over tls");
}

#[tokio::test]
async fn a_reload_with_a_new_ca_file_takes_effect_and_one_with_a_missing_file_is_refused() {
    log();
    let dir = tempfile::tempdir().expect("tempdir");
    let right = TestCa::new("right ca");
    let wrong = TestCa::new("wrong ca");
    let ca_path = dir.path().join("ca.pem");
    wrong.write(&ca_path);
    let upstream = TlsUpstream::builder(right.issue(&["127.0.0.1"]))
        .start()
        .await;
    let (server, url) = start(dir.path(), upstream.addr, "ca = \"ca.pem\"");
    assert_eq!(get(&url).await.0, 502);

    // Same path, new contents: the pool is new, and so are its connections.
    right.write(&ca_path);
    let config = tls_config(dir.path(), upstream.addr, "ca = \"ca.pem\"").expect("config");
    server.reload(config).expect("reload with the right ca");
    assert_eq!(get(&url).await.0, 200);
    let handshakes = upstream.handshakes();

    // The same file again: the pool and its warm connection stay.
    let config = tls_config(dir.path(), upstream.addr, "ca = \"ca.pem\"").expect("config");
    server.reload(config).expect("reload unchanged");
    assert_eq!(get(&url).await.0, 200);
    assert_eq!(
        upstream.handshakes(),
        handshakes,
        "the warm connection was kept"
    );

    // A missing file: `tailguard check` and a SIGHUP reload (which parse first) name it ...
    let err = tls_config(dir.path(), upstream.addr, "ca = \"gone.pem\"")
        .expect_err("a missing ca file is refused")
        .to_string();
    assert!(
        err.starts_with("test.toml:8:6: upstreams[0].tls.ca: cannot read ")
            && err.contains("gone.pem"),
        "{err}"
    );
    // ... and a file gone between parse and swap fails the reload the same way.
    let config = tls_config(dir.path(), upstream.addr, "ca = \"ca.pem\"").expect("config");
    std::fs::remove_file(&ca_path).expect("remove");
    let err = server
        .reload(config)
        .expect_err("the reload is refused")
        .to_string();
    assert!(err.contains("ca.pem") && err.contains("tls.ca"), "{err}");
    assert_eq!(get(&url).await.0, 200, "the running config keeps serving");
}

#[test]
fn tls_config_errors_name_the_file_line_and_field() {
    let dir = tempfile::tempdir().expect("tempdir");
    let addr: SocketAddr = "127.0.0.1:9".parse().expect("addr");
    let err = tls_config(dir.path(), addr, "verify = false\nclient_cert = \"c.pem\"")
        .expect_err("client_cert without client_key")
        .to_string();
    assert_eq!(
        err,
        "test.toml:9:15: upstreams[0].tls.client_key: `client_cert` needs `client_key`"
    );
    let err = tls_config(dir.path(), addr, "client_key = \"k.pem\"")
        .expect_err("client_key without client_cert")
        .to_string();
    assert_eq!(
        err,
        "test.toml:8:14: upstreams[0].tls.client_cert: `client_key` needs `client_cert`"
    );
    let ca = TestCa::new("test ca");
    ca.issue(&["x"]).write(dir.path(), "client");
    let mut f = std::fs::File::create(dir.path().join("empty.pem")).expect("create");
    f.write_all(b"not a certificate\n").expect("write");
    let err = tls_config(
        dir.path(),
        addr,
        "ca = \"empty.pem\"\nclient_cert = \"client.pem\"\nclient_key = \"client.key\"",
    )
    .expect_err("a ca file without certificates")
    .to_string();
    assert!(
        err.starts_with("test.toml:8:6: upstreams[0].tls.ca: ")
            && err.ends_with("empty.pem: no certificate in file"),
        "{err}"
    );
    let err = tls_config(
        dir.path(),
        addr,
        "verify = false\nclient_cert = \"client.pem\"\nclient_key = \"missing.key\"",
    )
    .expect_err("a missing key")
    .to_string();
    assert!(
        err.starts_with("test.toml:10:14: upstreams[0].tls.client_key: cannot read ")
            && err.contains("missing.key"),
        "{err}"
    );
    let err = tls_config(dir.path(), addr, "sni = \"not a name\"")
        .expect_err("a bad sni")
        .to_string();
    assert_eq!(
        err,
        "test.toml:8:7: upstreams[0].tls.sni: `not a name` is not a DNS name or IP address"
    );
}
