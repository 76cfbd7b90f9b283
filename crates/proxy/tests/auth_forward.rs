//! `type = "forward"` through the real gateway, against a real auth service on 127.0.0.1:0:
//! what the service is sent, a `2xx` letting the request through with its headers (the
//! client's spoofed copies removed), any other answer passed back as given, the service down
//! or silent answered `503`, the cache, keep-alive connections to the service, and a service
//! over TLS (`https://`, its certificate from a test CA given as `ca`).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tailguard_proxy::Server;
use tailguard_test_support::{Upstream, http1_client};

use crate::support::{self, config, config_errors, empty, metrics_text, within};

/// A real auth service: decides by the `Authorization` it is sent, and keeps every head it
/// got and how many connections it accepted.
struct AuthService {
    addr: SocketAddr,
    heads: Arc<Mutex<Vec<HeaderMap>>>,
    connections: Arc<AtomicUsize>,
}

impl AuthService {
    async fn start() -> AuthService {
        AuthService::start_with(None).await
    }

    /// The service over TLS with `config` (a certificate from a test CA).
    async fn start_tls(config: rustls::ServerConfig) -> AuthService {
        AuthService::start_with(Some(tokio_rustls::TlsAcceptor::from(Arc::new(config)))).await
    }

    async fn start_with(tls: Option<tokio_rustls::TlsAcceptor>) -> AuthService {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let heads = Arc::new(Mutex::new(Vec::new()));
        let connections = Arc::new(AtomicUsize::new(0));
        let (h, c) = (Arc::clone(&heads), Arc::clone(&connections));
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                c.fetch_add(1, Ordering::SeqCst);
                let h = Arc::clone(&h);
                let tls = tls.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
                        h.lock().expect("heads").push(req.headers().clone());
                        let who = req
                            .headers()
                            .get("authorization")
                            .map(|v| v.to_str().unwrap_or("").to_owned())
                            .unwrap_or_default();
                        async move { Ok::<_, std::convert::Infallible>(decide(&who)) }
                    });
                    let server = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                    match tls {
                        None => {
                            let _ = server.serve_connection(TokioIo::new(stream), svc).await;
                        }
                        Some(tls) => {
                            let Ok(stream) = tls.accept(stream).await else {
                                return;
                            };
                            let _ = server.serve_connection(TokioIo::new(stream), svc).await;
                        }
                    }
                });
            }
        });
        AuthService {
            addr,
            heads,
            connections,
        }
    }

    fn calls(&self) -> usize {
        self.heads.lock().expect("heads").len()
    }

    fn last(&self) -> HeaderMap {
        self.heads
            .lock()
            .expect("heads")
            .last()
            .cloned()
            .expect("a call")
    }
}

/// The service's rules.
fn decide(authorization: &str) -> Response<Full<Bytes>> {
    let b = Response::builder();
    let b = match authorization {
        "Bearer alice" => b.status(200).header("x-user", "alice"),
        "Bearer sso" => b
            .status(302)
            .header("location", "https://login.example/?rd=back")
            .header("set-cookie", "state=abc; HttpOnly"),
        "Bearer broken" => b.status(500).header("x-internal", "no"),
        _ => b
            .status(401)
            .header("www-authenticate", "Bearer realm=\"sso\"")
            .header("content-type", "text/plain")
            .header("x-internal", "never passed"),
    };
    let body = match authorization {
        "Bearer alice" => "",
        "Bearer broken" => "auth service broke\n",
        _ => "who are you?\n",
    };
    b.body(Full::new(Bytes::from(body))).expect("response")
}

fn gateway(upstream: SocketAddr, url: &str, extra: &str) -> String {
    format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n\
         [[upstreams]]\nname = \"up\"\nendpoints = [{{ address = \"{upstream}\" }}]\n\n\
         [[auth]]\nname = \"sso\"\ntype = \"forward\"\nurl = \"{url}\"\n\
         request_headers = [\"authorization\", \"x-tenant\"]\nupstream_headers = [\"x-user\", \"x-groups\"]\n{extra}\n\
         [[routes]]\nid = \"app\"\nupstream = \"up\"\npath = {{ prefix = \"/echo/app\" }}\nauth = \"sso\"\n"
    )
}

/// A gateway with one serving thread (so connection and cache counts are exact).
fn start(text: &str) -> (Server, String) {
    let server = Server::start(config(text), 1).expect("gateway starts");
    let url = format!("http://{}", server.local_addrs()[0]);
    (server, url)
}

async fn send(url: &str, headers: &[(&str, &str)]) -> (u16, HeaderMap, String) {
    let mut req = Request::post(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = within(http1_client().request(req.body(empty()).expect("request")))
        .await
        .expect("an answer");
    let status = resp.status().as_u16();
    let head = resp.headers().clone();
    (status, head, support::text(resp).await)
}

fn echoed(body: &str, name: &str) -> Vec<String> {
    body.lines()
        .filter_map(|l| l.split_once(": "))
        .filter(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.to_owned())
        .collect()
}

#[tokio::test]
async fn a_2xx_lets_the_request_through_with_the_services_headers_and_none_of_the_clients() {
    let upstream = Upstream::start().await;
    let service = AuthService::start().await;
    let (server, url) = start(&gateway(
        upstream.addr,
        &format!("http://{}/verify", service.addr),
        "",
    ));
    let (status, _, body) = send(
        &format!("{url}/echo/app/orders?page=2"),
        &[
            ("authorization", "Bearer alice"),
            ("host", "app.example"),
            ("x-tenant", "t1"),
            ("cookie", "not-for-the-service=1"),
            // Spoofing: the client's own copies of what the service sets never arrive.
            ("x-user", "mallory"),
            ("x-groups", "admin"),
        ],
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(echoed(&body, "x-user"), ["alice"], "{body}");
    assert!(echoed(&body, "x-groups").is_empty(), "{body}");
    // What the service was sent.
    let head = service.last();
    assert_eq!(head["authorization"], "Bearer alice");
    assert_eq!(head["x-tenant"], "t1");
    assert!(head.get("cookie").is_none(), "only request_headers pass");
    assert!(head.get("x-user").is_none());
    assert_eq!(head["x-forwarded-method"], "POST");
    assert_eq!(head["x-forwarded-uri"], "/echo/app/orders?page=2");
    assert_eq!(head["x-forwarded-host"], "app.example");
    assert_eq!(head["x-forwarded-proto"], "http");
    assert_eq!(head["x-forwarded-for"], "127.0.0.1");
    assert_eq!(head["host"], service.addr.to_string().as_str());
    server.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn any_other_answer_goes_back_as_the_service_gave_it() {
    let upstream = Upstream::start().await;
    let service = AuthService::start().await;
    let (server, url) = start(&gateway(
        upstream.addr,
        &format!("http://{}/verify", service.addr),
        "",
    ));
    let app = format!("{url}/echo/app");
    let (status, head, body) = send(&app, &[("authorization", "Bearer who")]).await;
    assert_eq!(status, 401);
    assert_eq!(head["www-authenticate"], "Bearer realm=\"sso\"");
    assert_eq!(head["content-type"], "text/plain");
    assert!(head.get("x-internal").is_none());
    assert_eq!(body, "who are you?\n");
    let (status, head, _) = send(&app, &[("authorization", "Bearer sso")]).await;
    assert_eq!(status, 302);
    assert_eq!(head["location"], "https://login.example/?rd=back");
    assert_eq!(head["set-cookie"], "state=abc; HttpOnly");
    let (status, _, body) = send(&app, &[("authorization", "Bearer broken")]).await;
    assert_eq!((status, body.as_str()), (500, "auth service broke\n"));
    let (status, _, _) = send(&app, &[]).await;
    assert_eq!(status, 401);
    let metrics = metrics_text(&server);
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("tailguard_auth_requests_total{")
                && l.contains("result=\"refused\"")
                && l.ends_with(" 4")),
        "{metrics}"
    );
    server.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_service_down_or_silent_is_a_503_never_a_pass() {
    let upstream = Upstream::start().await;
    // Down: a port nothing listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let down = closed.local_addr().expect("addr");
    drop(closed);
    // Silent: accepts and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let silent_addr = silent.local_addr().expect("addr");
    let held = tokio::spawn(async move {
        let mut kept = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            kept.push(s);
        }
    });
    for target in [down, silent_addr] {
        let (server, url) = start(&gateway(
            upstream.addr,
            &format!("http://{target}/verify"),
            "timeout_ms = 200\n",
        ));
        let (status, head, _) = send(
            &format!("{url}/echo/app"),
            &[("authorization", "Bearer alice")],
        )
        .await;
        assert_eq!(status, 503, "{target}");
        assert_eq!(head["retry-after"], "1");
        let metrics = metrics_text(&server);
        assert!(
            metrics
                .lines()
                .any(|l| l.starts_with("tailguard_auth_requests_total{")
                    && l.contains("result=\"auth_service_error\"")
                    && l.ends_with(" 1")),
            "{metrics}"
        );
        server.shutdown(Duration::from_secs(5)).await;
    }
    held.abort();
}

#[tokio::test]
async fn answers_are_cached_per_key_and_connections_kept_alive() {
    let upstream = Upstream::start().await;
    let service = AuthService::start().await;
    let url_of = format!("http://{}/verify", service.addr);
    // Without a cache: every request is a call, all on one kept-alive connection.
    let (server, url) = start(&gateway(upstream.addr, &url_of, ""));
    for _ in 0..5 {
        let (status, _, _) = send(
            &format!("{url}/echo/app"),
            &[("authorization", "Bearer alice")],
        )
        .await;
        assert_eq!(status, 200);
    }
    assert_eq!(service.calls(), 5);
    assert_eq!(service.connections.load(Ordering::SeqCst), 1);
    server.shutdown(Duration::from_secs(5)).await;

    // With one: one call per key (accepted and refused alike), none across identities.
    let (server, url) = start(&gateway(
        upstream.addr,
        &url_of,
        "cache = { key_headers = [\"authorization\"], ttl_s = 30 }\n",
    ));
    let before = service.calls();
    for _ in 0..3 {
        let (status, _, body) = send(
            &format!("{url}/echo/app"),
            &[("authorization", "Bearer alice"), ("x-user", "mallory")],
        )
        .await;
        assert_eq!(status, 200);
        // A cached acceptance still sets the service's header over the client's.
        assert_eq!(echoed(&body, "x-user"), ["alice"], "{body}");
    }
    assert_eq!(service.calls(), before + 1);
    for _ in 0..3 {
        let (status, _, body) = send(
            &format!("{url}/echo/app"),
            &[("authorization", "Bearer eve")],
        )
        .await;
        assert_eq!((status, body.as_str()), (401, "who are you?\n"));
    }
    assert_eq!(service.calls(), before + 2);
    // A reload starts afresh: the same key is asked again.
    server
        .reload(config(&gateway(
            upstream.addr,
            &url_of,
            "cache = { key_headers = [\"authorization\"], ttl_s = 30 }\n",
        )))
        .expect("reload");
    let (status, _, _) = send(
        &format!("{url}/echo/app"),
        &[("authorization", "Bearer alice")],
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(service.calls(), before + 3);
    server.shutdown(Duration::from_secs(5)).await;
}

#[test]
fn forward_config_errors_name_the_line_and_the_field() {
    let text = r#"[[listeners]]
address = "127.0.0.1:0"

[[upstreams]]
name = "up"
endpoints = [{ address = "127.0.0.1:1" }]

[[auth]]
name = "a"
type = "forward"
url = "ftp://auth.example/verify"
ca = "ca.pem"
request_headers = ["bad header"]
upstream_headers = ["x-user", "Content-Length"]
timeout_ms = 0
cache = { key_headers = [], ttl_s = 0 }

[[routes]]
id = "r"
upstream = "up"
auth = "a"
"#;
    let errors = config_errors(text);
    let expected = [
        "gw.toml:11:7: auth[0].url: must be an http:// or https:// URL",
        "gw.toml:12:6: auth[0].ca: only with an https:// `url`",
        "gw.toml:13:20: auth[0].request_headers[0]: `bad header` is not a header name",
        "gw.toml:14:31: auth[0].upstream_headers[1]: `content-length` is the gateway's own to write",
        "gw.toml:15:14: auth[0].timeout_ms: 1..=60000",
        "gw.toml:16:9: auth[0].cache.key_headers: name at least one header (`[\"authorization\"]`): without one, every client of a route would share one answer",
        "gw.toml:16:37: auth[0].cache.ttl_s: 1..=3600",
    ];
    assert_eq!(errors, expected, "{errors:#?}");
}

#[tokio::test]
async fn an_https_auth_service_is_called_over_tls_trusting_the_ca_file() {
    let ca = tailguard_test_support::TestCa::new("auth test CA");
    let service = AuthService::start_tls(ca.issue(&["localhost"]).server_config(None)).await;
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    ca.write(&dir.path().join("auth-ca.pem"));
    let url = format!("https://localhost:{}/verify", service.addr.port());
    let text = gateway(upstream.addr, &url, "ca = \"auth-ca.pem\"\n");
    let server = Server::start(config_in(dir.path(), &text), 1).expect("gateway starts");
    let gw = format!("http://{}", server.local_addrs()[0]);

    let (status, _, body) = send(
        &format!("{gw}/echo/app"),
        &[("authorization", "Bearer alice")],
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(echoed(&body, "x-user"), ["alice"], "{body}");
    let (status, head, _) = send(
        &format!("{gw}/echo/app"),
        &[("authorization", "Bearer eve")],
    )
    .await;
    assert_eq!(status, 401);
    assert_eq!(head["www-authenticate"], "Bearer realm=\"sso\"");
    assert_eq!(service.calls(), 2);
    // Kept alive over TLS too: one handshake, one connection for both calls.
    assert_eq!(service.connections.load(Ordering::SeqCst), 1);
    server.shutdown(Duration::from_secs(5)).await;

    // Without the CA, the service's certificate is not trusted: 503, never a pass.
    let text = gateway(upstream.addr, &url, "");
    let server = Server::start(config_in(dir.path(), &text), 1).expect("gateway starts");
    let gw = format!("http://{}", server.local_addrs()[0]);
    let (status, _, _) = send(
        &format!("{gw}/echo/app"),
        &[("authorization", "Bearer alice")],
    )
    .await;
    assert_eq!(status, 503);
    assert_eq!(
        service.calls(),
        2,
        "no request was sent over an untrusted connection"
    );
    server.shutdown(Duration::from_secs(5)).await;
}

/// The config `text`, its files relative to `dir`.
fn config_in(dir: &std::path::Path, text: &str) -> tailguard_proxy::Config {
    tailguard_proxy::Config::parse(text, "gw.toml", dir)
        .unwrap_or_else(|e| panic!("invalid test config:\n{e}"))
}
