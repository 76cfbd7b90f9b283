//! The built-in responder: a tiny HTTP/1.1 server on an ephemeral 127.0.0.1 port, started
//! for an upstream with `builtin = {...}`, so the embedded default config demonstrates a
//! real proxied exchange (a TCP hop through the pooled client) with no other process.

use std::convert::Infallible;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::AbortHandle;

use crate::config::BuiltinConfig;
use crate::error::Error;

/// A running responder; its accept loop stops when this is dropped (connections already
/// accepted finish on their own).
#[derive(Debug)]
pub struct Responder {
    addr: SocketAddr,
    accept: AbortHandle,
}

impl Responder {
    /// Binds 127.0.0.1:0 and starts serving on the current tokio runtime.
    pub fn start(config: &BuiltinConfig) -> Result<Responder, Error> {
        let any: SocketAddr = "127.0.0.1:0".parse().expect("literal address");
        let std_listener =
            std::net::TcpListener::bind(any).map_err(|source| Error::Bind { addr: any, source })?;
        std_listener
            .set_nonblocking(true)
            .map_err(|source| Error::Bind { addr: any, source })?;
        let addr = std_listener
            .local_addr()
            .map_err(|source| Error::Bind { addr: any, source })?;
        let listener =
            TcpListener::from_std(std_listener).map_err(|source| Error::Bind { addr, source })?;
        let config = Arc::new(config.clone());
        let accept = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let config = Arc::clone(&config);
                tokio::spawn(async move {
                    let service = service_fn(move |req| respond(Arc::clone(&config), req));
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        })
        .abort_handle();
        Ok(Responder { addr, accept })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn respond(
    config: Arc<BuiltinConfig>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let mut body = config.body.clone();
    if config.echo {
        let _ = writeln!(body, "{} {} {:?}", req.method(), req.uri(), req.version());
        for (name, value) in req.headers() {
            let _ = writeln!(
                body,
                "{name}: {}",
                String::from_utf8_lossy(value.as_bytes())
            );
        }
    }
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = StatusCode::from_u16(config.status).unwrap_or(StatusCode::OK);
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    Ok(resp)
}
