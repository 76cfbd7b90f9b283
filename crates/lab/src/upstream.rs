//! The built-in upstream: an HTTP/1.1 and h2c server with a fixed body, optional delay,
//! optional CPU burn per request on the thread CPU clock, an optional pool of workers that
//! serve requests in arrival order, and an optional 5xx rate.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// What every response of the upstream does.
#[derive(Debug, Clone, Default)]
pub struct UpstreamConfig {
    /// Response body size in bytes (filled with `x`), unless `body` is given.
    pub body_bytes: usize,
    /// The response body as it is (a file's bytes), instead of `body_bytes` of `x`.
    pub body: Option<Bytes>,
    /// The response's `Content-Type` (default `text/plain`).
    pub content_type: Option<hyper::header::HeaderValue>,
    /// Delay before answering.
    pub latency: Duration,
    /// Uniform extra delay in `[0, jitter)`.
    pub jitter: Duration,
    /// CPU to burn per request on the serving thread, nanoseconds of thread CPU time.
    pub cpu_ns: u64,
    /// Probability (0..=1) of answering 500 instead of 200.
    pub error_rate: f64,
    /// At most this many requests are served at once; the others wait in arrival order.
    /// `None`: no limit.
    pub workers: Option<usize>,
    /// How long a request holds its worker (a sleep, not CPU: a database-bound service),
    /// before its CPU burn, if any.
    pub hold: Duration,
}

struct Shared {
    config: UpstreamConfig,
    body: Bytes,
    /// The workers: tokio's semaphore is fair, so waiting requests get a worker in the order
    /// they asked for one, as in a thread pool's queue or a database's connection pool.
    workers: Option<Semaphore>,
}

/// Serves `listener` until the task is dropped or the process ends.
pub async fn serve(listener: TcpListener, config: UpstreamConfig) -> std::io::Result<()> {
    let shared = Arc::new(Shared {
        body: config
            .body
            .clone()
            .unwrap_or_else(|| Bytes::from(vec![b'x'; config.body_bytes])),
        workers: config.workers.map(|n| Semaphore::new(n.max(1))),
        config,
    });
    let builder = auto::Builder::new(TokioExecutor::new());
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            // Running out of file descriptors under a connection storm must not end the
            // server; back off briefly and accept again.
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(5)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let shared = shared.clone();
        let builder = builder.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| handle(shared.clone(), req));
            let _ = builder
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn handle(
    shared: Arc<Shared>,
    _req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let c = &shared.config;
    let mut delay = c.latency;
    if !c.jitter.is_zero() {
        delay += c.jitter.mul_f64(fastrand::f64());
    }
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    // Held until the response is built. hyper drops the future of a request whose connection
    // closed, and with it the request's place in the queue.
    let _worker = match &shared.workers {
        Some(workers) => Some(
            workers
                .acquire()
                .await
                .expect("the semaphore is never closed"),
        ),
        None => None,
    };
    if !c.hold.is_zero() {
        tokio::time::sleep(c.hold).await;
    }
    if c.cpu_ns > 0 {
        // Burns on the serving thread on purpose: the point is to occupy this core the way
        // go-zero's CPU-bound handler did.
        tailguard_loadgen::clock::burn_cpu(c.cpu_ns);
    }
    let fail = c.error_rate > 0.0 && fastrand::f64() < c.error_rate;
    let (status, body) = if fail {
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            Bytes::from_static(b"injected error\n"),
        )
    } else {
        (StatusCode::OK, shared.body.clone())
    };
    let mut resp = Response::new(Full::new(body));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        shared
            .config
            .content_type
            .clone()
            .unwrap_or(hyper::header::HeaderValue::from_static("text/plain")),
    );
    Ok(resp)
}
