//! Forwarding: headers, keep-alive reuse, balancing, streaming, HTTP/2 and TLS.

use std::collections::HashMap;

use http::{Request, Version};
use http_body_util::BodyExt;
use tailguard_test_support::{Source, TestCert, Upstream, h2c_client, http1_client, tls_get};

use crate::support;

/// Parses the echo upstream's header lines into a map (last value wins).
fn echoed_headers(body: &str) -> HashMap<String, String> {
    body.lines()
        .skip(1)
        .take_while(|l| !l.is_empty())
        .filter_map(|l| l.split_once(": "))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

#[tokio::test]
async fn an_untrusted_clients_request_gets_each_gateway_field_once_and_the_log_its_id() {
    // No forwarding field came and the peer is not trusted: the gateway's fields go into
    // the head as lines (`ForwardingLines`), not through the header map.
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let upstream = Upstream::start().await;
    let (server, url) = support::start(support::config(&format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n\
         [[upstreams]]\nname = \"up\"\nendpoints = [{{ address = \"{}\" }}]\n\n\
         [[routes]]\nid = \"all\"\nupstream = \"up\"\n\n\
         [access_log]\npath = \"{}\"\ntemplate = \"$request_id\"\n",
        upstream.addr,
        log.display()
    )));
    let client = http1_client();
    let mut ids = Vec::new();
    for client_id in [None, Some("client-7")] {
        let mut req = Request::get(format!("{url}/echo/x"))
            .header("host", "api.example.com")
            .header("via", "1.1 edge");
        if let Some(id) = client_id {
            req = req.header("x-request-id", id);
        }
        let resp = client
            .request(req.body(support::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let body = support::text(resp).await;
        let lines: Vec<&str> = body.lines().skip(1).take_while(|l| !l.is_empty()).collect();
        let all = |name: &str| -> Vec<&str> {
            lines
                .iter()
                .filter_map(|l| l.split_once(": "))
                .filter(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v)
                .collect()
        };
        assert_eq!(all("x-forwarded-for"), ["127.0.0.1"], "{body}");
        assert_eq!(all("x-real-ip"), ["127.0.0.1"], "{body}");
        assert_eq!(all("x-forwarded-proto"), ["http"], "{body}");
        assert_eq!(all("via"), ["1.1 edge", "1.1 tailguard"], "{body}");
        assert!(all("forwarded").is_empty(), "{body}");
        let id = all("x-request-id");
        assert_eq!(id.len(), 1, "{body}");
        match client_id {
            Some(sent) => assert_eq!(id[0], sent),
            None => {
                assert_eq!(id[0].len(), 32, "{body}");
                assert!(id[0].bytes().all(|b| b.is_ascii_hexdigit()), "{body}");
            }
        }
        ids.push(id[0].to_owned());
    }
    assert!(server.shutdown(std::time::Duration::from_secs(10)).await);
    // The access log names the id the upstream received.
    let written = std::fs::read_to_string(&log).unwrap();
    assert_eq!(written.lines().collect::<Vec<_>>(), ids, "{written}");
}

#[tokio::test]
async fn forwarding_headers_added_and_hop_by_hop_removed() {
    let upstream = Upstream::start().await;
    // The test's client is a trusted proxy: its X-Forwarded-For is kept and appended to
    // (from anyone else it is dropped: the conformance suite's client_address group).
    let (_server, url) = support::start(support::config(&format!(
        "trusted_proxies = [\"127.0.0.1/32\"]\n\n[[listeners]]\naddress = \"127.0.0.1:0\"\n\n\
         [[upstreams]]\nname = \"up\"\nendpoints = [{{ address = \"{}\" }}]\n\n\
         [[routes]]\nid = \"all\"\nupstream = \"up\"\n",
        upstream.addr
    )));
    let client = http1_client();
    let req = Request::get(format!("{url}/echo/x?q=1"))
        .header("host", "api.example.com")
        .header("connection", "keep-alive, x-drop-me")
        .header("x-drop-me", "secret")
        .header("keep-alive", "timeout=5")
        .header("te", "trailers")
        .header("x-forwarded-for", "10.0.0.1")
        .header("x-kept", "yes")
        .body(support::empty())
        .unwrap();
    let resp = client.request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["via"], "1.1 tailguard");
    let body = support::text(resp).await;
    assert!(body.starts_with("GET /echo/x?q=1 HTTP/1.1\n"), "{body}");
    let h = echoed_headers(&body);
    assert_eq!(h["host"], "api.example.com", "Host passes through");
    assert_eq!(h["x-forwarded-for"], "10.0.0.1, 127.0.0.1");
    assert_eq!(h["x-forwarded-proto"], "http");
    assert_eq!(h["via"], "1.1 tailguard");
    assert_eq!(h["x-kept"], "yes");
    assert_eq!(h["x-request-id"].len(), 32, "generated id: {body}");
    assert!(h["x-request-id"].bytes().all(|b| b.is_ascii_hexdigit()));
    for gone in ["x-drop-me", "keep-alive", "te"] {
        assert!(!h.contains_key(gone), "{gone} forwarded: {body}");
    }
    // hyper's client adds its own `connection` only when it wants to close; ours is gone.
    assert_ne!(
        h.get("connection").map(String::as_str),
        Some("keep-alive, x-drop-me")
    );

    // A client's request id is kept.
    let req = Request::get(format!("{url}/echo"))
        .header("x-request-id", "abc-123")
        .body(support::empty())
        .unwrap();
    let body = support::text(client.request(req).await.unwrap()).await;
    assert_eq!(echoed_headers(&body)["x-request-id"], "abc-123");
}

#[tokio::test]
async fn host_rewrite_replaces_host() {
    let upstream = Upstream::start().await;
    let config = support::with_listener(&format!(
        "[[upstreams]]\nname = \"up\"\nendpoints = [{{ address = \"{}\" }}]\n\n[[routes]]\nid = \"r\"\nupstream = \"up\"\nhost_rewrite = \"internal.svc\"\n",
        upstream.addr
    ));
    let (_server, url) = support::start(config);
    let (status, body) = tailguard_test_support::get(&http1_client(), &format!("{url}/echo")).await;
    assert_eq!(status, 200);
    assert_eq!(echoed_headers(&body)["host"], "internal.svc");
}

#[tokio::test]
async fn upstream_keep_alive_connections_are_reused() {
    let upstream = Upstream::start().await;
    let (_server, url) = support::start(support::proxy_to(&[upstream.addr], ""));
    let client = http1_client();
    for _ in 0..50 {
        let (status, _) = tailguard_test_support::get(&client, &format!("{url}/")).await;
        assert_eq!(status, 200);
    }
    assert_eq!(upstream.requests(), 50);
    assert_eq!(
        upstream.connections(),
        1,
        "sequential requests share one pooled connection"
    );
}

#[tokio::test]
async fn weighted_round_robin_splits_by_weight() {
    let a = Upstream::builder().body("a").start().await;
    let b = Upstream::builder().body("b").start().await;
    let config = support::with_listener(&format!(
        "[[upstreams]]\nname = \"up\"\nendpoints = [{{ address = \"{}\", weight = 3 }}, {{ address = \"{}\", weight = 1 }}]\n\n[[routes]]\nid = \"r\"\nupstream = \"up\"\n",
        a.addr, b.addr
    ));
    let (_server, url) = support::start(config);
    let client = http1_client();
    let mut seq = String::new();
    for _ in 0..400 {
        let (_, body) = tailguard_test_support::get(&client, &format!("{url}/")).await;
        seq.push_str(&body);
    }
    // One serving thread (current-thread test runtime), so one cursor: exactly 3:1, and
    // smooth (never more than three `a` in a row).
    assert_eq!((a.requests(), b.requests()), (300, 100));
    assert!(!seq.contains("aaaa"), "{seq}");
}

#[tokio::test]
async fn bodies_stream_both_ways() {
    let upstream = Upstream::start().await;
    let (_server, url) = support::start(support::proxy_to(
        &[upstream.addr],
        "[limits]\nbody_bytes = 100_000_000\n",
    ));
    let client = http1_client();
    let n: u64 = 8 * 1024 * 1024;
    // Chunked upload (no Content-Length): the upstream counts what arrives.
    let req = Request::post(format!("{url}/sink"))
        .body(Source::chunked(n).boxed())
        .unwrap();
    let resp = client.request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(support::text(resp).await, n.to_string());
    // Download.
    let resp = client
        .request(support::get(&format!("{url}/source/{n}")))
        .await
        .unwrap();
    assert_eq!(resp.headers()["content-length"], n.to_string().as_str());
    let got = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(got.len() as u64, n);
}

#[tokio::test]
async fn h2c_downstream_to_http1_upstream() {
    let upstream = Upstream::start().await;
    let (_server, url) = support::start(support::proxy_to(&[upstream.addr], ""));
    let client = h2c_client();
    let resp = client
        .request(support::get(&format!("{url}/echo")))
        .await
        .unwrap();
    assert_eq!(resp.version(), Version::HTTP_2);
    assert_eq!(resp.status(), 200);
    let body = support::text(resp).await;
    assert!(
        body.starts_with("GET /echo HTTP/1.1\n"),
        "upstream speaks HTTP/1.1: {body}"
    );
    let h = echoed_headers(&body);
    assert_eq!(
        h["host"],
        url.trim_start_matches("http://"),
        ":authority becomes Host"
    );
    assert_eq!(h["via"], "2 tailguard");
    // Several concurrent streams on one connection.
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let client = client.clone();
        let url = url.clone();
        tasks.push(tokio::spawn(async move {
            client
                .request(support::get(&format!("{url}/delay/20")))
                .await
                .unwrap()
                .status()
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), 200);
    }
}

#[tokio::test]
async fn tls_listener_negotiates_h2_and_http1_by_alpn() {
    let dir = tempfile::tempdir().unwrap();
    let cert = TestCert::generate(dir.path());
    let upstream = Upstream::start().await;
    let config = support::config(&format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\ntls = {{ cert = \"{}\", key = \"{}\" }}\n\n[[upstreams]]\nname = \"up\"\nendpoints = [{{ address = \"{}\" }}]\n\n[[routes]]\nid = \"r\"\nupstream = \"up\"\n",
        cert.cert_path.display(),
        cert.key_path.display(),
        upstream.addr
    ));
    let (server, _) = support::start(config);
    let addr = server.local_addrs()[0];
    let (alpn, status, body) = tls_get(addr, &cert.cert_der, &[b"h2", b"http/1.1"], "/echo").await;
    assert_eq!(alpn.as_deref(), Some(&b"h2"[..]));
    assert_eq!(status, 200);
    assert_eq!(echoed_headers(&body)["x-forwarded-proto"], "https");
    let (alpn, status, body) = tls_get(addr, &cert.cert_der, &[b"http/1.1"], "/echo").await;
    assert_eq!(alpn.as_deref(), Some(&b"http/1.1"[..]));
    assert_eq!(status, 200);
    assert_eq!(echoed_headers(&body)["via"], "1.1 tailguard");
}

#[tokio::test]
async fn healthz_is_answered_locally() {
    // The only upstream endpoint refuses connections: /healthz must not care.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let (_server, url) = support::start(support::proxy_to(&[dead], ""));
    let (status, body) =
        tailguard_test_support::get(&http1_client(), &format!("{url}/healthz")).await;
    assert_eq!((status, body.as_str()), (200, "ok\n"));
}

#[tokio::test]
async fn builtin_responder_answers_through_the_proxy() {
    let mut config = tailguard_proxy::Config::embedded_default();
    config.override_listen("127.0.0.1:0".parse().unwrap());
    let (_server, url) = support::start(config);
    let (status, body) =
        tailguard_test_support::get(&http1_client(), &format!("{url}/hello")).await;
    assert_eq!(status, 200);
    assert!(
        body.starts_with("\nHello from tailguard!") || body.starts_with("Hello from tailguard!"),
        "{body}"
    );
    assert!(body.contains("GET /hello HTTP/1.1"), "{body}");
    assert!(body.contains("x-forwarded-for: 127.0.0.1"), "{body}");
    assert!(body.contains("via: 1.1 tailguard"), "{body}");
}

#[tokio::test]
async fn a_stream_of_unknown_length_gets_its_head_before_its_body() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // An upstream that sends a chunked head at once and its body only when told to.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (release, released) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut buf = [0u8; 4096];
        let _ = s.read(&mut buf).await.unwrap();
        s.write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
            .await
            .unwrap();
        let _ = released.await;
        s.write_all(b"5\r\nhello\r\n0\r\n\r\n").await.unwrap();
        let _ = s.read(&mut buf).await;
    });
    let (_server, url) = support::start(support::proxy_to(&[addr], ""));
    let client = http1_client();
    // If the gateway waited for the body, the head would never come (the body waits for it).
    let resp = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        client.request(support::get(&format!("{url}/events"))),
    )
    .await
    .expect("head arrives before the body is sent")
    .unwrap();
    assert_eq!(resp.status(), 200);
    release.send(()).unwrap();
    assert_eq!(support::text(resp).await, "hello");
}

#[tokio::test]
async fn a_reload_serves_a_renewed_certificate_and_keeps_the_old_one_on_error() {
    let old_dir = tempfile::tempdir().unwrap();
    let new_dir = tempfile::tempdir().unwrap();
    let old = TestCert::generate(old_dir.path());
    let new = TestCert::generate(new_dir.path());
    let upstream = Upstream::start().await;
    let config_with = |cert: &std::path::Path, key: &std::path::Path| {
        support::config(&format!(
            "[[listeners]]\naddress = \"127.0.0.1:0\"\ntls = {{ cert = \"{}\", key = \"{}\" }}\n\n[[upstreams]]\nname = \"up\"\nendpoints = [{{ address = \"{}\" }}]\n\n[[routes]]\nid = \"r\"\nupstream = \"up\"\n",
            cert.display(),
            key.display(),
            upstream.addr
        ))
    };
    let (server, _) = support::start(config_with(&old.cert_path, &old.key_path));
    let addr = server.local_addrs()[0];
    let (_, status, _) = tls_get(addr, &old.cert_der, &[b"http/1.1"], "/").await;
    assert_eq!(status, 200);

    // The key file changes between validation and the swap (a renewal half written): the
    // reload fails as a whole and the old certificate stays.
    let renewed = config_with(&new.cert_path, &new.key_path);
    let new_key = std::fs::read(&new.key_path).unwrap();
    std::fs::copy(&old.key_path, &new.key_path).unwrap();
    assert!(server.reload(renewed.clone()).is_err());
    let (_, status, _) = tls_get(addr, &old.cert_der, &[b"http/1.1"], "/").await;
    assert_eq!(status, 200, "still the old certificate");

    // The renewed certificate: new connections are served with it (a client trusting only
    // the new one completes its handshake).
    std::fs::write(&new.key_path, new_key).unwrap();
    server
        .reload(renewed)
        .expect("reload with the renewed certificate");
    let (_, status, _) = tls_get(addr, &new.cert_der, &[b"h2"], "/").await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn an_upgrade_becomes_a_tunnel_after_the_upstreams_101() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // A WebSocket-like upstream on raw sockets: answers the handshake with 101, checks that
    // the upgrade headers arrived, then echoes bytes in upper case.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            s.read_exact(&mut byte).await.unwrap();
            head.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
        assert!(head.contains("upgrade: websocket\r\n"), "{head}");
        assert!(head.contains("connection: upgrade\r\n"), "{head}");
        s.write_all(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 64];
        loop {
            let n = s.read(&mut buf).await.unwrap();
            if n == 0 {
                return;
            }
            s.write_all(&buf[..n].to_ascii_uppercase()).await.unwrap();
        }
    });
    let (server, _) = support::start(support::proxy_to(&[upstream], ""));
    let mut client = tokio::net::TcpStream::connect(server.local_addrs()[0])
        .await
        .unwrap();
    client
        .write_all(b"GET /chat HTTP/1.1\r\nHost: example.test\r\nUpgrade: websocket\r\nConnection: keep-alive, Upgrade\r\n\r\n")
        .await
        .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        client.read_exact(&mut byte).await.unwrap();
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(head.contains("upgrade: websocket\r\n"), "{head}");
    for message in [&b"hello"[..], b"tunnel"] {
        client.write_all(message).await.unwrap();
        let mut echo = vec![0u8; message.len()];
        client.read_exact(&mut echo).await.unwrap();
        assert_eq!(echo, message.to_ascii_uppercase());
    }
}
