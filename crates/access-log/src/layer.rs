//! Tower middleware: [`AccessLogLayer`] logs each request of any hyper/axum service to an
//! [`AccessLog`] when its response body ends, so `$body_bytes_sent` and `$request_time` are
//! what was really sent.
//!
//! Per request this costs an `Arc` clone of the log, the clones of the method, target and
//! two header values (reference counts, no copy of their bytes) and, when the body ends, the
//! formatting of one line into the thread's buffer. No file I/O, no lock another thread
//! holds for longer than a buffer swap.

use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Instant, SystemTime};

use bytes::Buf;
use http::{Extensions, HeaderValue, Method, Request, Response, Uri, Version, header};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use crate::{AccessLog, Record};

/// Reads the downstream's address from a request's extensions. For axum served with
/// `into_make_service_with_connect_info::<SocketAddr>()`:
///
/// ```
/// use std::net::{IpAddr, SocketAddr};
/// use axum::extract::ConnectInfo;
///
/// fn remote_addr(extensions: &http::Extensions) -> Option<IpAddr> {
///     extensions.get::<ConnectInfo<SocketAddr>>().map(|info| info.0.ip())
/// }
///
/// let of: tailguard_access_log::RemoteAddrOf = remote_addr;
/// let mut extensions = http::Extensions::new();
/// extensions.insert(ConnectInfo(SocketAddr::from(([192, 0, 2, 7], 50000))));
/// assert_eq!(of(&extensions), Some(IpAddr::from([192, 0, 2, 7])));
/// ```
pub type RemoteAddrOf = fn(&Extensions) -> Option<IpAddr>;

/// Logs every request through the service it wraps to an [`AccessLog`].
///
/// ```
/// use tailguard_access_log::{AccessLog, AccessLogLayer, Config};
/// use tower::{Layer, ServiceExt, service_fn};
///
/// let dir = tempfile::tempdir()?;
/// let path = dir.path().join("access.log");
/// let (log, writer) = AccessLog::start(&Config::to(path.to_str().unwrap()))?;
/// let service = AccessLogLayer::new(log).layer(service_fn(|_req: http::Request<String>| async {
///     Ok::<_, std::convert::Infallible>(http::Response::new(String::from("hello")))
/// }));
/// # tokio::runtime::Builder::new_current_thread().build()?.block_on(async {
/// let request = http::Request::get("/greeting?lang=en").body(String::new())?;
/// let response = service.oneshot(request).await?;
/// // The line is logged when the body ends (here: when it is dropped unread).
/// drop(response);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # })?;
/// writer.shutdown();
/// let text = std::fs::read_to_string(&path)?;
/// assert!(text.contains("\"GET /greeting?lang=en HTTP/1.1\" 200 0 \"-\" \"-\""), "{text}");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct AccessLogLayer {
    log: AccessLog,
    remote_addr: Option<RemoteAddrOf>,
}

impl AccessLogLayer {
    /// Logs to `log`, without the downstream's address (`$remote_addr` is `-`).
    pub fn new(log: AccessLog) -> Self {
        Self {
            log,
            remote_addr: None,
        }
    }

    /// Takes `$remote_addr` from each request's extensions through `remote_addr`.
    pub fn remote_addr(mut self, remote_addr: RemoteAddrOf) -> Self {
        self.remote_addr = Some(remote_addr);
        self
    }
}

impl<S> Layer<S> for AccessLogLayer {
    type Service = AccessLogService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        AccessLogService {
            inner,
            log: self.log.clone(),
            remote_addr: self.remote_addr,
        }
    }
}

/// The service made by [`AccessLogLayer`].
#[derive(Debug, Clone)]
pub struct AccessLogService<S> {
    inner: S,
    log: AccessLog,
    remote_addr: Option<RemoteAddrOf>,
}

impl<S, B, RB> Service<Request<B>> for AccessLogService<S>
where
    S: Service<Request<B>, Response = Response<RB>>,
    RB: Body,
{
    type Response = Response<LoggedBody<RB>>;
    type Error = S::Error;
    type Future = AccessLogFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let pending = (!self.log.is_off()).then(|| {
            let header = |name| req.headers().get(name).cloned();
            Pending {
                log: self.log.clone(),
                start: Instant::now(),
                remote_addr: self.remote_addr.and_then(|of| of(req.extensions())),
                method: req.method().clone(),
                uri: req.uri().clone(),
                version: req.version(),
                referer: header(header::REFERER),
                user_agent: header(header::USER_AGENT),
                status: 0,
                body_bytes: 0,
            }
        });
        AccessLogFuture {
            inner: self.inner.call(req),
            pending,
        }
    }
}

pin_project! {
    /// Response future of [`AccessLogService`].
    #[derive(Debug)]
    pub struct AccessLogFuture<F> {
        #[pin]
        inner: F,
        pending: Option<Pending>,
    }
}

impl<F, RB, E> Future for AccessLogFuture<F>
where
    F: Future<Output = Result<Response<RB>, E>>,
    RB: Body,
{
    type Output = Result<Response<LoggedBody<RB>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let output = std::task::ready!(this.inner.poll(cx));
        let mut pending = this.pending.take();
        Poll::Ready(match output {
            Ok(response) => {
                if let Some(p) = &mut pending {
                    p.status = response.status().as_u16();
                }
                Ok(response.map(|inner| {
                    let mut body = LoggedBody { inner, pending };
                    // A body that is empty from the start may never be polled.
                    if body.inner.is_end_stream()
                        && let Some(p) = body.pending.take()
                    {
                        p.log();
                    }
                    body
                }))
            }
            Err(error) => {
                // No response: logged as nginx logs a request it could not answer.
                if let Some(mut p) = pending {
                    p.status = 500;
                    p.log();
                }
                Err(error)
            }
        })
    }
}

/// What a request's line needs, kept until its response body ends.
#[derive(Debug)]
pub(crate) struct Pending {
    log: AccessLog,
    start: Instant,
    remote_addr: Option<IpAddr>,
    method: Method,
    uri: Uri,
    version: Version,
    referer: Option<HeaderValue>,
    user_agent: Option<HeaderValue>,
    status: u16,
    body_bytes: u64,
}

impl Pending {
    fn log(self) {
        let target = self
            .uri
            .path_and_query()
            .map_or(self.uri.path(), |pq| pq.as_str());
        self.log.log(&Record {
            time: SystemTime::now(),
            remote_addr: self.remote_addr,
            method: self.method.as_str().as_bytes(),
            target: target.as_bytes(),
            protocol: protocol(self.version),
            status: self.status,
            body_bytes_sent: self.body_bytes,
            bytes_sent: self.body_bytes,
            request_time: self.start.elapsed(),
            referer: self.referer.as_ref().map(HeaderValue::as_bytes),
            user_agent: self.user_agent.as_ref().map(HeaderValue::as_bytes),
            ..Record::default()
        });
    }
}

fn protocol(version: Version) -> &'static str {
    match version {
        Version::HTTP_09 => "HTTP/0.9",
        Version::HTTP_10 => "HTTP/1.0",
        Version::HTTP_2 => "HTTP/2.0",
        Version::HTTP_3 => "HTTP/3.0",
        _ => "HTTP/1.1",
    }
}

pin_project! {
    /// A response body that counts its bytes and logs the request's line when it ends, or
    /// when it is dropped before (a client gone mid-body: logged with the bytes sent).
    #[derive(Debug)]
    pub struct LoggedBody<B> {
        #[pin]
        inner: B,
        pending: Option<Pending>,
    }

    impl<B> PinnedDrop for LoggedBody<B> {
        fn drop(this: Pin<&mut Self>) {
            if let Some(p) = this.project().pending.take() {
                p.log();
            }
        }
    }
}

impl<B: Body> Body for LoggedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let frame = std::task::ready!(this.inner.poll_frame(cx));
        match &frame {
            Some(Ok(frame)) => {
                if let (Some(p), Some(data)) = (this.pending.as_mut(), frame.data_ref()) {
                    p.body_bytes += data.remaining() as u64;
                }
            }
            // The end, or an error that ends it.
            _ => {
                if let Some(p) = this.pending.take() {
                    p.log();
                }
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
