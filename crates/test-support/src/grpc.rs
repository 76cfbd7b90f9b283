//! A real gRPC service (tonic) on 127.0.0.1:0 and a client for it, with one method of each
//! kind (unary, server streaming, client streaming, bidirectional), for tests of proxying
//! gRPC end to end.
//!
//! The messages are written by hand with `prost`'s derive (no `protoc` needed). The service
//! is `test.Echo`; its proto would read:
//!
//! ```proto
//! message Msg { string text = 1; uint32 n = 2; }
//! service Echo {
//!   rpc Unary(Msg) returns (Msg);               // see GrpcUpstream for what `text` asks
//!   rpc ServerStream(Msg) returns (stream Msg); // n replies "text-0" .. "text-(n-1)";
//!                                               // text "tick": one every n ms, forever
//!   rpc ClientStream(stream Msg) returns (Msg); // texts joined by ",", n = how many
//!   rpc Bidi(stream Msg) returns (stream Msg);  // each message answered at once
//! }
//! ```

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use http::uri::PathAndQuery;
use tokio_stream::{Stream, StreamExt as _};
use tonic::body::Body;
use tonic::{Code, Status};
use tonic_prost::ProstCodec;

/// The one message of the test service.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Msg {
    /// What to do or say.
    #[prost(string, tag = "1")]
    pub text: String,
    /// A count or a duration, by method.
    #[prost(uint32, tag = "2")]
    pub n: u32,
}

impl Msg {
    /// A message.
    pub fn new(text: impl Into<String>, n: u32) -> Msg {
        Msg {
            text: text.into(),
            n,
        }
    }
}

type BoxStream = Pin<Box<dyn Stream<Item = Result<Msg, Status>> + Send>>;
type BoxFuture<T> = Pin<Box<dyn std::future::Future<Output = T> + Send>>;

/// The `test.Echo` service. `Unary` answers by the request's `text`:
///
/// | text | answer |
/// |---|---|
/// | `fail:MESSAGE` | status `n` (a gRPC code) with MESSAGE |
/// | `sleep` | waits `n` milliseconds, then replies `slept` |
/// | `timeout` | replies with the `grpc-timeout` the service received (or `none`) |
/// | anything else | the same message back, with the `x-echo` metadata and trailer set |
#[derive(Debug, Clone, Default)]
pub struct EchoService {
    calls: Arc<AtomicUsize>,
}

impl tonic::server::NamedService for EchoService {
    const NAME: &'static str = "test.Echo";
}

fn unary(req: tonic::Request<Msg>) -> BoxFuture<Result<tonic::Response<Msg>, Status>> {
    let timeout = req
        .metadata()
        .get("grpc-timeout")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("none")
        .to_owned();
    let msg = req.into_inner();
    Box::pin(async move {
        if let Some(message) = msg.text.strip_prefix("fail:") {
            return Err(Status::new(Code::from(msg.n as i32), message));
        }
        match msg.text.as_str() {
            "sleep" => {
                tokio::time::sleep(Duration::from_millis(u64::from(msg.n))).await;
                Ok(tonic::Response::new(Msg::new("slept", msg.n)))
            }
            "timeout" => Ok(tonic::Response::new(Msg::new(timeout, 0))),
            _ => {
                let mut resp = tonic::Response::new(msg);
                resp.metadata_mut()
                    .insert("x-echo", tonic::metadata::MetadataValue::from_static("yes"));
                Ok(resp)
            }
        }
    })
}

fn server_stream(
    req: tonic::Request<Msg>,
) -> BoxFuture<Result<tonic::Response<BoxStream>, Status>> {
    let msg = req.into_inner();
    Box::pin(async move {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tokio::spawn(async move {
            if msg.text == "tick" {
                // A message every `n` ms until the client goes away: a long, quiet stream.
                for i in 0.. {
                    tokio::time::sleep(Duration::from_millis(u64::from(msg.n))).await;
                    if tx.send(Ok(Msg::new("tick", i))).await.is_err() {
                        return;
                    }
                }
            }
            for i in 0..msg.n {
                if tx
                    .send(Ok(Msg::new(format!("{}-{i}", msg.text), i)))
                    .await
                    .is_err()
                {
                    return;
                }
            }
        });
        let stream: BoxStream = Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx));
        Ok(tonic::Response::new(stream))
    })
}

fn client_stream(
    req: tonic::Request<tonic::Streaming<Msg>>,
) -> BoxFuture<Result<tonic::Response<Msg>, Status>> {
    let mut stream = req.into_inner();
    Box::pin(async move {
        let mut texts = Vec::new();
        while let Some(msg) = stream.message().await? {
            texts.push(msg.text);
        }
        let n = texts.len() as u32;
        Ok(tonic::Response::new(Msg::new(texts.join(","), n)))
    })
}

fn bidi(
    req: tonic::Request<tonic::Streaming<Msg>>,
) -> BoxFuture<Result<tonic::Response<BoxStream>, Status>> {
    let stream = req.into_inner();
    Box::pin(async move {
        let replies: BoxStream = Box::pin(stream.map(|m| m.map(|m| Msg::new(m.text, m.n + 1))));
        Ok(tonic::Response::new(replies))
    })
}

impl<B> tower_service::Service<http::Request<B>> for EchoService
where
    B: http_body::Body + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<http::Response<Body>, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if req.uri().path().starts_with("/test.Echo/") {
            self.calls.fetch_add(1, Ordering::Relaxed);
        }
        let mut grpc = tonic::server::Grpc::new(ProstCodec::<Msg, Msg>::default());
        match req.uri().path() {
            "/test.Echo/Unary" => {
                Box::pin(async move { Ok(grpc.unary(tower::service_fn(unary), req).await) })
            }
            "/test.Echo/ServerStream" => Box::pin(async move {
                Ok(grpc
                    .server_streaming(tower::service_fn(server_stream), req)
                    .await)
            }),
            "/test.Echo/ClientStream" => Box::pin(async move {
                Ok(grpc
                    .client_streaming(tower::service_fn(client_stream), req)
                    .await)
            }),
            "/test.Echo/Bidi" => {
                Box::pin(async move { Ok(grpc.streaming(tower::service_fn(bidi), req).await) })
            }
            _ => Box::pin(async move { Ok(Status::unimplemented("no such method").into_http()) }),
        }
    }
}

/// The test gRPC service listening on 127.0.0.1 (h2c); stopped when dropped.
///
/// Served by hyper's HTTP/2 server directly rather than tonic's `transport::Server`, whose
/// deadline layer answers a call past its `grpc-timeout` itself (`CANCELLED`) and would
/// hide whether the gateway in front enforced the deadline.
#[derive(Debug)]
pub struct GrpcUpstream {
    /// Where it listens.
    pub addr: SocketAddr,
    calls: Arc<AtomicUsize>,
    connections: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for GrpcUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl GrpcUpstream {
    /// Starts the service on an ephemeral port (plaintext HTTP/2, h2c).
    pub async fn start() -> GrpcUpstream {
        let addr = SocketAddr::from(([127, 0, 0, 1], 0));
        GrpcUpstream::start_on(addr)
            .await
            .expect("bind 127.0.0.1:0")
    }

    /// Starts the service on `addr` (plaintext HTTP/2, h2c): a port of the test's choosing,
    /// or one a stopped service used.
    pub async fn start_on(addr: SocketAddr) -> std::io::Result<GrpcUpstream> {
        GrpcUpstream::serve(addr, None).await
    }

    /// Starts the service on an ephemeral port over TLS (HTTP/2 with ALPN `h2`), with
    /// `config`'s certificate (its ALPN is set to `h2` here).
    pub async fn start_tls(config: rustls::ServerConfig) -> GrpcUpstream {
        let mut config = config;
        config.alpn_protocols = vec![b"h2".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        GrpcUpstream::serve(SocketAddr::from(([127, 0, 0, 1], 0)), Some(acceptor))
            .await
            .expect("bind 127.0.0.1:0")
    }

    async fn serve(
        addr: SocketAddr,
        tls: Option<tokio_rustls::TlsAcceptor>,
    ) -> std::io::Result<GrpcUpstream> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let service = EchoService::default();
        let calls = Arc::clone(&service.calls);
        let connections = Arc::new(AtomicUsize::new(0));
        let accepted = Arc::clone(&connections);
        let task = tokio::spawn(async move {
            let mut open = tokio::task::JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                accepted.fetch_add(1, Ordering::SeqCst);
                let service = hyper_util::service::TowerToHyperService::new(service.clone());
                let tls = tls.clone();
                open.spawn(async move {
                    let http2 = hyper::server::conn::http2::Builder::new(
                        hyper_util::rt::TokioExecutor::new(),
                    );
                    let _ = match tls {
                        None => {
                            http2
                                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                                .await
                        }
                        Some(acceptor) => match acceptor.accept(stream).await {
                            Ok(tls) => {
                                http2
                                    .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                                    .await
                            }
                            Err(_) => return,
                        },
                    };
                });
            }
        });
        Ok(GrpcUpstream {
            addr,
            calls,
            connections,
            task,
        })
    }

    /// Calls of `test.Echo`'s methods the service received (any outcome; requests for
    /// other paths, such as health checks, are not counted).
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::Relaxed)
    }

    /// TCP connections accepted so far.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

/// A tonic client of `test.Echo` at a URL (`http://IP:PORT`, h2c).
#[derive(Debug, Clone)]
pub struct GrpcClient {
    grpc: tonic::client::Grpc<tonic::transport::Channel>,
}

fn codec() -> ProstCodec<Msg, Msg> {
    ProstCodec::default()
}

fn request<T>(message: T, timeout: Option<Duration>) -> tonic::Request<T> {
    let mut req = tonic::Request::new(message);
    if let Some(t) = timeout {
        req.set_timeout(t);
    }
    req
}

impl GrpcClient {
    /// Connects (h2c, prior knowledge) to `url`.
    pub async fn connect(url: &str) -> GrpcClient {
        let channel = tonic::transport::Endpoint::from_shared(url.to_owned())
            .expect("a valid URL")
            .connect_timeout(Duration::from_secs(5))
            .connect()
            .await
            .expect("connect to the gRPC endpoint");
        GrpcClient {
            grpc: tonic::client::Grpc::new(channel),
        }
    }

    async fn ready(&mut self) -> Result<(), Status> {
        self.grpc
            .ready()
            .await
            .map_err(|e| Status::unavailable(e.to_string()))
    }

    /// `Unary`, with an optional deadline (sent as `grpc-timeout`).
    pub async fn unary(
        &mut self,
        msg: Msg,
        timeout: Option<Duration>,
    ) -> Result<tonic::Response<Msg>, Status> {
        self.ready().await?;
        self.grpc
            .unary(
                request(msg, timeout),
                PathAndQuery::from_static("/test.Echo/Unary"),
                codec(),
            )
            .await
    }

    /// `ServerStream`: the stream of replies.
    pub async fn server_stream(&mut self, msg: Msg) -> Result<tonic::Streaming<Msg>, Status> {
        self.ready().await?;
        Ok(self
            .grpc
            .server_streaming(
                request(msg, None),
                PathAndQuery::from_static("/test.Echo/ServerStream"),
                codec(),
            )
            .await?
            .into_inner())
    }

    /// `ClientStream` over `msgs`.
    pub async fn client_stream(&mut self, msgs: Vec<Msg>) -> Result<Msg, Status> {
        self.ready().await?;
        Ok(self
            .grpc
            .client_streaming(
                request(tokio_stream::iter(msgs), None),
                PathAndQuery::from_static("/test.Echo/ClientStream"),
                codec(),
            )
            .await?
            .into_inner())
    }

    /// `Bidi`: sends what arrives on the returned sender, yields the replies.
    pub async fn bidi(
        &mut self,
    ) -> Result<(tokio::sync::mpsc::Sender<Msg>, tonic::Streaming<Msg>), Status> {
        self.ready().await?;
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let replies = self
            .grpc
            .streaming(
                request(tokio_stream::wrappers::ReceiverStream::new(rx), None),
                PathAndQuery::from_static("/test.Echo/Bidi"),
                codec(),
            )
            .await?
            .into_inner();
        Ok((tx, replies))
    }
}

/// A message as gRPC frames it on the wire (uncompressed): flag byte 0, its length as four
/// bytes big-endian, then the message; for tests that speak gRPC over a plain HTTP/2 client.
pub fn frame(msg: &Msg) -> bytes::Bytes {
    let body = prost::Message::encode_to_vec(msg);
    let mut out = Vec::with_capacity(5 + body.len());
    out.push(0);
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    out.into()
}

/// The messages in gRPC-framed bytes (whole frames only).
pub fn unframe(mut bytes: &[u8]) -> Vec<Msg> {
    let mut out = Vec::new();
    while bytes.len() >= 5 {
        let len = u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]) as usize;
        let Some(body) = bytes.get(5..5 + len) else {
            break;
        };
        out.push(prost::Message::decode(body).expect("a valid Msg"));
        bytes = &bytes[5 + len..];
    }
    out
}
