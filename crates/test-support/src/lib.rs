//! Real upstreams and clients on 127.0.0.1:0 for tests.
//!
//! [`Upstream`] is an HTTP/1.1 + h2c server on an ephemeral port that counts the
//! connections it accepts and the requests it serves, and answers by path:
//!
//! | path | answer |
//! |---|---|
//! | `/echo...` | 200, body = request line, headers (`name: value` lines), blank line, request body |
//! | `/sink...` | reads the whole request body, 200 with its length in decimal |
//! | `/source/N` | 200 with N bytes streamed in 64 KiB chunks |
//! | `/status/N` | status N |
//! | `/delay/MS` | waits MS milliseconds, then the default answer |
//! | anything else | the default answer: [`UpstreamBuilder`]'s status, body and delay (after reading and keeping the request body, with [`UpstreamBuilder::record_bodies`]) |
//!
//! Clients: [`http1_client`], [`h2c_client`], [`tls_get`], and [`h2_frames`] for HTTP/2 frames
//! written byte by byte; certificates: [`TestCert`]; a free port named before the gateway
//! binds it: [`reserve_port`]; a port a server can be stopped on and started again on:
//! [`free_port`]. [`RecordingUpstream`] records every byte it receives, per
//! connection, for tests of what may never reach an upstream. [`TlsUpstream`] is an HTTPS
//! upstream with certificates from a [`TestCa`], counting full and resumed handshakes.
//! [`SwitchableUpstream`] changes its statuses, stops and comes back while a test runs
//! (health checks, ejection). [`etcd::EtcdServer`] is a real etcd on free ports;
//! [`jaeger::Jaeger`] a real Jaeger v2 (an OpenTelemetry collector) and its query API;
//! [`blocking::start`] a server on a runtime of its own, for tests whose client blocks.
//!
//! ```
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let upstream = tailguard_test_support::Upstream::builder().body("hi").start().await;
//! let client = tailguard_test_support::http1_client();
//! let (status, body) = tailguard_test_support::get(&client, &format!("http://{}/", upstream.addr)).await;
//! assert_eq!((status, body.as_str()), (200, "hi"));
//! assert_eq!(upstream.connections(), 1);
//! # });
//! ```

pub mod blocking;
pub mod credentials;
pub mod dns;
pub mod etcd;
pub mod grpc;
pub mod h2_frames;
pub mod jaeger;
pub mod otlp;
pub mod ports;
mod recording;
pub mod redis;
mod switchable;
mod tls_upstream;
mod tools;

pub use ports::free_port;
pub use recording::{ConnectionLog, RecordedRequest, RecordingUpstream, parse_request};
pub use switchable::{HEALTH_PATH, SwitchableUpstream};
pub use tls_upstream::{AfterResponse, IssuedCert, TestCa, TlsUpstream, TlsUpstreamBuilder};

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::{Body, Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;

/// Response body type of the test upstream.
pub type TestBody = BoxBody<Bytes, Infallible>;

/// Configures an [`Upstream`]'s default answer.
#[derive(Debug, Clone)]
pub struct UpstreamBuilder {
    status: u16,
    body: Bytes,
    delay: Duration,
    /// At most this many default answers are being delayed at once, the rest wait in
    /// arrival order (a service with a fixed pool of workers).
    workers: Option<Arc<tokio::sync::Semaphore>>,
    /// Where to listen (127.0.0.1:0).
    bind: SocketAddr,
    /// The default answer reads the whole request body first and keeps it.
    record_bodies: bool,
}

impl UpstreamBuilder {
    /// Status of the default answer (200).
    pub fn status(mut self, status: u16) -> Self {
        self.status = status;
        self
    }

    /// Body of the default answer (`ok`).
    pub fn body(mut self, body: impl Into<Bytes>) -> Self {
        self.body = body.into();
        self
    }

    /// Delay before the default answer (none).
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// Serve at most `n` default answers at once, each held for the delay; the others
    /// queue in arrival order (a database-bound service: `n` workers of `delay` each).
    pub fn workers(mut self, n: usize) -> Self {
        self.workers = Some(Arc::new(tokio::sync::Semaphore::new(n)));
        self
    }

    /// Before the default answer, read the whole request body and keep it with its method
    /// ([`Upstream::bodies`]); without this the default answer reads none of it.
    pub fn record_bodies(mut self) -> Self {
        self.record_bodies = true;
        self
    }

    /// Listen on `addr` instead of 127.0.0.1:0 (e.g. another loopback address, so that
    /// several upstreams share a port as the addresses of one DNS name do).
    pub fn bind(mut self, addr: SocketAddr) -> Self {
        self.bind = addr;
        self
    }

    /// Binds (127.0.0.1:0 unless [`UpstreamBuilder::bind`] said otherwise) and serves until
    /// the [`Upstream`] is dropped.
    pub async fn start(self) -> Upstream {
        let listener = TcpListener::bind(self.bind)
            .await
            .expect("bind the test upstream");
        let addr = listener.local_addr().expect("local addr");
        let stats = Arc::new(Stats::default());
        let config = Arc::new(self);
        let (stats2, config2) = (Arc::clone(&stats), Arc::clone(&config));
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                stats2.connections.fetch_add(1, Ordering::SeqCst);
                let _ = stream.set_nodelay(true);
                let (stats, config) = (Arc::clone(&stats2), Arc::clone(&config2));
                tokio::spawn(async move {
                    let service =
                        service_fn(move |req| handle(Arc::clone(&config), Arc::clone(&stats), req));
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Upstream { addr, stats, task }
    }
}

#[derive(Debug, Default)]
struct Stats {
    connections: AtomicUsize,
    requests: AtomicUsize,
    bodies: std::sync::Mutex<Vec<(String, Bytes)>>,
}

/// A running test upstream; stops accepting when dropped.
#[derive(Debug)]
pub struct Upstream {
    /// Where it listens.
    pub addr: SocketAddr,
    stats: Arc<Stats>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Upstream {
    /// A builder with the defaults (200, body `ok`, no delay).
    pub fn builder() -> UpstreamBuilder {
        UpstreamBuilder {
            status: 200,
            body: Bytes::from_static(b"ok"),
            delay: Duration::ZERO,
            workers: None,
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            record_bodies: false,
        }
    }

    /// Starts an upstream with the defaults.
    pub async fn start() -> Upstream {
        Upstream::builder().start().await
    }

    /// TCP connections accepted so far.
    pub fn connections(&self) -> usize {
        self.stats.connections.load(Ordering::SeqCst)
    }

    /// Requests served so far.
    pub fn requests(&self) -> usize {
        self.stats.requests.load(Ordering::SeqCst)
    }

    /// Method and whole body of each default answer's request, in arrival order (with
    /// [`UpstreamBuilder::record_bodies`]; a body that failed is not there).
    pub fn bodies(&self) -> Vec<(String, Bytes)> {
        self.stats
            .bodies
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

fn full(b: impl Into<Bytes>) -> TestBody {
    Full::new(b.into()).boxed()
}

async fn handle(
    config: Arc<UpstreamBuilder>,
    stats: Arc<Stats>,
    req: Request<Incoming>,
) -> Result<Response<TestBody>, Infallible> {
    stats.requests.fetch_add(1, Ordering::SeqCst);
    let path = req.uri().path().to_owned();
    let mut segments = path.trim_start_matches('/').splitn(2, '/');
    let first = segments.next().unwrap_or("");
    let arg = segments.next().unwrap_or("");
    let answer = |status: u16, body: TestBody| {
        let mut r = Response::new(body);
        *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        Ok(r)
    };
    match first {
        "echo" => {
            let mut head = format!("{} {} {:?}\n", req.method(), req.uri(), req.version());
            for (k, v) in req.headers() {
                head.push_str(&format!("{k}: {}\n", String::from_utf8_lossy(v.as_bytes())));
            }
            head.push('\n');
            let body = req
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            let mut out = head.into_bytes();
            out.extend_from_slice(&body);
            answer(200, full(out))
        }
        "sink" => {
            let mut body = req.into_body();
            let mut n: u64 = 0;
            while let Some(frame) = body.frame().await {
                match frame {
                    Ok(f) => n += f.data_ref().map_or(0, |d| d.len() as u64),
                    Err(_) => return answer(400, full("body error")),
                }
            }
            answer(200, full(n.to_string()))
        }
        "source" => answer(200, BoxBody::new(Source::new(arg.parse().unwrap_or(0)))),
        "status" => answer(arg.parse().unwrap_or(500), full(format!("status {arg}"))),
        "delay" => {
            tokio::time::sleep(Duration::from_millis(arg.parse().unwrap_or(0))).await;
            answer(config.status, full(config.body.clone()))
        }
        _ => {
            if config.record_bodies {
                let method = req.method().to_string();
                let Ok(body) = req.into_body().collect().await else {
                    return answer(400, full("body error"));
                };
                stats
                    .bodies
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push((method, body.to_bytes()));
            }
            // The semaphore is fair: waiters get a worker in arrival order.
            let _worker = match &config.workers {
                Some(w) => Arc::clone(w).acquire_owned().await.ok(),
                None => None,
            };
            if !config.delay.is_zero() {
                tokio::time::sleep(config.delay).await;
            }
            answer(config.status, full(config.body.clone()))
        }
    }
}

/// A body of `n` bytes produced in 64 KiB chunks as it is polled, never held whole.
#[derive(Debug)]
pub struct Source {
    left: u64,
    chunk: Bytes,
    exact: bool,
}

impl Source {
    /// `n` bytes of `x`, with their length announced (`Content-Length`).
    pub fn new(n: u64) -> Source {
        Source {
            left: n,
            chunk: Bytes::from(vec![b'x'; 64 * 1024]),
            exact: true,
        }
    }

    /// `n` bytes of `x` without an announced length (HTTP/1.1 sends it chunked).
    pub fn chunked(n: u64) -> Source {
        Source {
            exact: false,
            ..Source::new(n)
        }
    }
}

impl Body for Source {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.left == 0 {
            return Poll::Ready(None);
        }
        let n = self.left.min(self.chunk.len() as u64) as usize;
        self.left -= n as u64;
        Poll::Ready(Some(Ok(Frame::data(self.chunk.slice(..n)))))
    }

    fn is_end_stream(&self) -> bool {
        self.left == 0
    }

    fn size_hint(&self) -> http_body::SizeHint {
        if self.exact {
            http_body::SizeHint::with_exact(self.left)
        } else {
            http_body::SizeHint::default()
        }
    }
}

/// A keep-alive HTTP/1.1 client.
pub fn http1_client() -> Client<HttpConnector, TestBody> {
    Client::builder(TokioExecutor::new()).build(HttpConnector::new())
}

/// An HTTP/2 over cleartext (prior knowledge) client.
pub fn h2c_client() -> Client<HttpConnector, TestBody> {
    Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build(HttpConnector::new())
}

/// GET `url` with `client`, returning status and body as text.
pub async fn get(client: &Client<HttpConnector, TestBody>, url: &str) -> (u16, String) {
    let resp = client
        .request(Request::get(url).body(full(Bytes::new())).expect("request"))
        .await
        .expect("request sent");
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// A self-signed certificate for `localhost` and 127.0.0.1, written as PEM files.
#[derive(Debug)]
pub struct TestCert {
    /// Certificate PEM path.
    pub cert_path: PathBuf,
    /// Key PEM path.
    pub key_path: PathBuf,
    /// The certificate, DER, to trust in a client.
    pub cert_der: rustls::pki_types::CertificateDer<'static>,
}

impl TestCert {
    /// Generates a certificate and writes `cert.pem` and `key.pem` into `dir`.
    pub fn generate(dir: &Path) -> TestCert {
        let names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
        let certified = rcgen::generate_simple_self_signed(names).expect("rcgen");
        let cert_path = dir.join("cert.pem");
        let key_path = dir.join("key.pem");
        std::fs::write(&cert_path, certified.cert.pem()).expect("write cert");
        std::fs::write(&key_path, certified.signing_key.serialize_pem()).expect("write key");
        TestCert {
            cert_path,
            key_path,
            cert_der: certified.cert.der().clone(),
        }
    }
}

/// GET `path` over TLS to `addr` (SNI `localhost`), trusting `cert`, offering `alpn`
/// (e.g. `[b"h2"]`). Returns the negotiated ALPN protocol, status and body.
pub async fn tls_get(
    addr: SocketAddr,
    cert: &rustls::pki_types::CertificateDer<'static>,
    alpn: &[&[u8]],
    path: &str,
) -> (Option<Vec<u8>>, u16, String) {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.clone()).expect("add root");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("server name");
    let tls = connector.connect(name, tcp).await.expect("tls handshake");
    let negotiated = tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
    let io = TokioIo::new(tls);
    let req = Request::get(path)
        .header("host", "localhost")
        .body(full(Bytes::new()))
        .expect("request");
    let resp = if negotiated.as_deref() == Some(b"h2") {
        let (mut send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
            .await
            .expect("h2 handshake");
        tokio::spawn(conn);
        let mut req = req;
        *req.uri_mut() = format!("https://localhost{path}").parse().expect("uri");
        send.send_request(req).await.expect("h2 request")
    } else {
        let (mut send, conn) = hyper::client::conn::http1::handshake(io)
            .await
            .expect("h1 handshake");
        tokio::spawn(conn);
        send.send_request(req).await.expect("h1 request")
    };
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    (
        negotiated,
        status,
        String::from_utf8_lossy(&body).into_owned(),
    )
}

/// Runs `promtool check metrics` (Debian's `prometheus` package, installed by
/// `scripts/install-tools`) on an exposition; returns whether it passed and what it printed.
pub fn promtool_check(exposition: &[u8]) -> (bool, String) {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool is installed (scripts/install-tools)");
    child
        .stdin
        .take()
        .expect("stdin is piped")
        .write_all(exposition)
        .expect("feed promtool");
    let out = child.wait_with_output().expect("promtool runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// A port on 127.0.0.1 held for a listener that a test must name before it is bound (a
/// config reloaded onto a new address): a socket bound with `SO_REUSEPORT` that never
/// listens. A gateway binding the port with `SO_REUSEPORT` as the same user succeeds and
/// gets every connection (a socket that does not listen is never chosen), while no other
/// socket can take the port meanwhile: unlike bind-then-release, nothing can race for it.
/// Keep the returned socket alive as long as the port is needed.
pub fn reserve_port() -> (socket2::Socket, SocketAddr) {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
    socket.set_reuse_port(true).expect("SO_REUSEPORT");
    socket
        .bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())
        .expect("bind 127.0.0.1:0");
    let addr = socket
        .local_addr()
        .ok()
        .and_then(|a| a.as_socket())
        .expect("an IPv4 socket address");
    (socket, addr)
}
