//! HTTP/2 connections across idle periods. The gateway's `h2` (`vendor/h2`, patched) frees a
//! connection's read buffer whenever a read finds the socket empty, and its write buffer
//! whenever everything it buffered is written, and takes them back at the next frame. Each
//! exchange here waits for the answer to the one before, so it starts on a connection whose
//! buffers the gateway has freed: the gateway cannot have read a request the client had not
//! yet sent, and it wrote the whole answer before the client could read it. The proof that the
//! buffers are really freed (a count, not a timing) is the proxy's unit test
//! `server::idle_http2_buffers`.
//!
//! Over h2c and over TLS, on one connection each: small requests, a request head larger than
//! the 8 KiB read buffer, a 1 MiB request body, a 4 MiB response, then 250 streams at once
//! (over `limits.http2_max_streams`, 100, so some wait for others to finish).

use std::sync::Arc;

use bytes::Bytes;
use futures_util::future::join_all;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tailguard_test_support::{TestBody, TestCert, Upstream};
use tokio::net::TcpStream;

use crate::support::{self, within};

fn body(bytes: impl Into<Bytes>) -> TestBody {
    Full::new(bytes.into()).boxed()
}

/// Sends one request on the connection and returns its status and whole body.
async fn exchange(send: &SendRequest<TestBody>, req: Request<TestBody>) -> (u16, Bytes) {
    let mut send = send.clone();
    within(send.ready()).await.expect("the connection is open");
    let resp = within(send.send_request(req)).await.expect("answered");
    let status = resp.status().as_u16();
    let body = within(resp.into_body().collect())
        .await
        .expect("the whole body")
        .to_bytes();
    (status, body)
}

/// The exchanges, in order, each after the answer to the one before; `base` is the
/// connection's scheme and authority.
async fn across_idle_periods(send: &SendRequest<TestBody>, base: &str) {
    for round in 0..3 {
        let req = Request::get(format!("{base}/echo/small-{round}"))
            .body(body(Bytes::new()))
            .expect("request");
        let (status, echoed) = exchange(send, req).await;
        assert_eq!(status, 200);
        let echoed = String::from_utf8_lossy(&echoed).into_owned();
        assert!(
            echoed.starts_with(&format!("GET /echo/small-{round} ")),
            "{echoed}"
        );
    }

    // A 12 KiB field (under `limits.header_bytes`, 16 KiB): its HEADERS frame is larger
    // than the read buffer the gateway takes back.
    let big = "b".repeat(12 * 1024);
    let req = Request::get(format!("{base}/echo/big-head"))
        .header("x-big", &big)
        .body(body(Bytes::new()))
        .expect("request");
    let (status, echoed) = exchange(send, req).await;
    assert_eq!(status, 200);
    let echoed = String::from_utf8_lossy(&echoed).into_owned();
    assert!(
        echoed.contains(&format!("x-big: {big}\n")),
        "the field is echoed whole"
    );

    // A 1 MiB request body, then a 4 MiB answer: many frames each way, through buffers
    // taken back after the idle moment before them.
    let upload = vec![b'u'; 1 << 20];
    let req = Request::post(format!("{base}/sink"))
        .body(body(upload))
        .expect("request");
    let (status, counted) = exchange(send, req).await;
    assert_eq!((status, &counted[..]), (200, &b"1048576"[..]));
    let req = Request::get(format!("{base}/source/{}", 4 << 20))
        .body(body(Bytes::new()))
        .expect("request");
    let (status, download) = exchange(send, req).await;
    assert_eq!((status, download.len()), (200, 4 << 20));

    // 250 streams at once; then one more request after they all finished.
    let all = join_all((0..250).map(|i| {
        let req = Request::get(format!("{base}/echo/stream-{i}"))
            .body(body(Bytes::new()))
            .expect("request");
        async move { (i, exchange(send, req).await) }
    }))
    .await;
    for (i, (status, echoed)) in all {
        assert_eq!(status, 200, "stream {i}");
        assert!(echoed.starts_with(format!("GET /echo/stream-{i} ").as_bytes()));
    }
    let req = Request::get(format!("{base}/echo/last"))
        .body(body(Bytes::new()))
        .expect("request");
    assert_eq!(exchange(send, req).await.0, 200);
}

#[tokio::test]
async fn an_h2c_connection_serves_after_each_idle_period() {
    let upstream = Upstream::start().await;
    let (server, _) = support::start(support::proxy_to(&[upstream.addr], ""));
    let addr = server.local_addrs()[0];
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let (send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .expect("h2c handshake");
    let conn = tokio::spawn(conn);
    across_idle_periods(&send, &format!("http://{addr}")).await;
    drop(send);
    within(conn)
        .await
        .expect("task")
        .expect("the connection ends cleanly");
}

#[tokio::test]
async fn an_http2_over_tls_connection_serves_after_each_idle_period() {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let cert = TestCert::generate(dir.path());
    let config = support::config(&format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\ntls = {{ cert = \"{}\", key = \"{}\" }}\n\n\
         [[upstreams]]\nname = \"up\"\nendpoints = [{{ address = \"{}\" }}]\n\n\
         [[routes]]\nid = \"r\"\nupstream = \"up\"\n",
        cert.cert_path.display(),
        cert.key_path.display(),
        upstream.addr
    ));
    let (server, _) = support::start(config);
    let addr = server.local_addrs()[0];

    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.cert_der.clone()).expect("add root");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("server name");
    let stream = tokio_rustls::TlsConnector::from(Arc::new(tls))
        .connect(name, tcp)
        .await
        .expect("TLS handshake");
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .expect("h2 handshake");
    let conn = tokio::spawn(conn);
    across_idle_periods(&send, "https://localhost").await;
    drop(send);
    within(conn)
        .await
        .expect("task")
        .expect("the connection ends cleanly");
}
