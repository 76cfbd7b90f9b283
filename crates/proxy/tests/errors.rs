//! Each failure maps to its status, with a short plain-text reason.

use std::time::Duration;

use http::Request;
use http_body_util::BodyExt;
use tailguard_test_support::{Source, Upstream, http1_client};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support;

async fn status_and_body(url: &str) -> (u16, String) {
    tailguard_test_support::get(&http1_client(), url).await
}

#[tokio::test]
async fn connect_refused_is_502() {
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let (_server, url) = support::start(support::proxy_to(&[dead], ""));
    assert_eq!(
        status_and_body(&format!("{url}/")).await,
        (502, "upstream connect failed\n".into())
    );
}

#[tokio::test]
async fn upstream_closing_without_answer_is_502() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf).await; // read the request, then hang up
        }
    });
    let (_server, url) = support::start(support::proxy_to(&[addr], ""));
    assert_eq!(
        status_and_body(&format!("{url}/")).await,
        (502, "upstream connection failed\n".into())
    );
}

#[tokio::test]
async fn slow_upstream_is_504() {
    let upstream = Upstream::builder()
        .delay(Duration::from_secs(5))
        .start()
        .await;
    let (_server, url) = support::start(support::proxy_to(
        &[upstream.addr],
        "[timeouts]\nrequest_ms = 100\n",
    ));
    assert_eq!(
        status_and_body(&format!("{url}/")).await,
        (504, "upstream timed out\n".into())
    );
}

#[tokio::test]
async fn no_route_is_404() {
    let upstream = Upstream::start().await;
    let config = support::with_listener(&format!(
        "[[upstreams]]\nname = \"up\"\nendpoints = [{{ address = \"{}\" }}]\n\n[[routes]]\nid = \"r\"\nupstream = \"up\"\npath = {{ exact = \"/only\" }}\n",
        upstream.addr
    ));
    let (_server, url) = support::start(config);
    assert_eq!(
        status_and_body(&format!("{url}/other")).await,
        (404, "no route\n".into())
    );
    assert_eq!(status_and_body(&format!("{url}/only")).await.0, 200);
}

#[tokio::test]
async fn declared_body_over_limit_is_413_without_touching_the_upstream() {
    let upstream = Upstream::start().await;
    let (_server, url) = support::start(support::proxy_to(
        &[upstream.addr],
        "[limits]\nbody_bytes = 1024\n",
    ));
    let req = Request::post(format!("{url}/sink"))
        .body(Source::new(4096).boxed())
        .unwrap();
    let resp = http1_client().request(req).await.unwrap();
    assert_eq!(resp.status(), 413);
    assert_eq!(support::text(resp).await, "request body too large\n");
    assert_eq!(upstream.requests(), 0);
}

#[tokio::test]
async fn streamed_chunked_body_over_limit_is_413() {
    let upstream = Upstream::start().await;
    let (_server, url) = support::start(support::proxy_to(
        &[upstream.addr],
        "[limits]\nbody_bytes = 100_000\n",
    ));
    let req = Request::post(format!("{url}/sink"))
        .body(Source::chunked(1_000_000).boxed())
        .unwrap();
    let resp = http1_client().request(req).await.unwrap();
    assert_eq!(resp.status(), 413);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"request body too large\n");
    // Under the limit, the same kind of body goes through.
    let req = Request::post(format!("{url}/sink"))
        .body(Source::chunked(50_000).boxed())
        .unwrap();
    let resp = http1_client().request(req).await.unwrap();
    assert_eq!(support::text(resp).await, "50000");
}

#[tokio::test]
async fn headers_over_limit_are_431() {
    let upstream = Upstream::start().await;
    let (_server, url) = support::start(support::proxy_to(
        &[upstream.addr],
        "[limits]\nheader_bytes = 2048\n",
    ));
    let req = Request::get(format!("{url}/"))
        .header("x-big", "a".repeat(4000))
        .body(support::empty())
        .unwrap();
    let resp = http1_client().request(req).await.unwrap();
    assert_eq!(resp.status(), 431);
    assert_eq!(support::text(resp).await, "request headers too large\n");
    assert_eq!(upstream.requests(), 0);
}

#[tokio::test]
async fn malformed_request_is_400() {
    let upstream = Upstream::start().await;
    let (server, _) = support::start(support::proxy_to(&[upstream.addr], ""));
    let mut s = tokio::net::TcpStream::connect(server.local_addrs()[0])
        .await
        .unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nthis is not a header\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
    let out = String::from_utf8_lossy(&out);
    assert!(out.starts_with("HTTP/1.1 400"), "{out}");
    assert_eq!(upstream.requests(), 0);
}
