//! The built-in responder: a tiny HTTP/1.1 server on an ephemeral 127.0.0.1 port, started
//! for an upstream with `builtin = {...}`, so the embedded default config demonstrates a
//! real proxied exchange (a TCP hop through the upstream connection pool) with no other process.

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

use tailguard_config::BuiltinConfig;
use tailguard_http::error::Error;

/// A running responder on its own thread (with its own current-thread runtime, so it never
/// competes with a serving thread's tasks); it stops when this is dropped.
#[derive(Debug)]
pub struct Responder {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Responder {
    /// Binds 127.0.0.1:0 and starts serving.
    pub fn start(config: &BuiltinConfig) -> Result<Responder, Error> {
        let any: SocketAddr = "127.0.0.1:0".parse().expect("literal address");
        let bind_err = |source| Error::Bind { addr: any, source };
        let std_listener = std::net::TcpListener::bind(any).map_err(bind_err)?;
        std_listener.set_nonblocking(true).map_err(bind_err)?;
        let addr = std_listener.local_addr().map_err(bind_err)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::Internal(format!("builtin responder runtime: {e}")))?;
        let config = Arc::new(config.clone());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("tailguard-builtin".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let Ok(listener) = TcpListener::from_std(std_listener) else {
                        return;
                    };
                    tokio::select! {
                        _ = stopped => {}
                        _ = accept_loop(listener, config) => {}
                    }
                });
            })
            .map_err(|e| Error::Internal(format!("builtin responder thread: {e}")))?;
        Ok(Responder {
            addr,
            stop: Some(stop),
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

async fn accept_loop(listener: TcpListener, config: Arc<BuiltinConfig>) {
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
