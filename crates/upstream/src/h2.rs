//! The upstream HTTP/2 client (`protocol = "h2c"` or `"h2"`): per endpoint and serving
//! thread, a few connections, each carrying up to `max_concurrent_streams` requests at once.
//!
//! Like the HTTP/1.1 pool (`pool.rs`), a serving thread only touches its own slot, so the
//! slot's mutex is never contended (design.md §2 rule 3). Unlike it, a connection is not
//! checked out: requests share it as streams, and a request takes the first connection of
//! its thread with a free stream, or opens another. Each connection is driven by one task
//! on the serving thread's runtime (hyper's HTTP/2 needs one to read frames for every
//! stream); a connection that closed (GOAWAY, reset, the endpoint went away) is dropped from
//! the slot the next time the slot is looked at, and the next request opens a new one.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::http2::{Builder, SendRequest};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpStream;

use crate::error::UpstreamError;
use crate::pool_metrics::{OpenConnection, PoolMetrics};
use crate::shard::PerThread;
use crate::tls::TlsTarget;

/// A request body an HTTP/2 pool sends: the pool is generic over it, so it needs nothing
/// of the layer above whose body it carries (the gateway's streams the client's request,
/// under its limit). Implemented for every body hyper's HTTP/2 client can send.
pub trait H2Body:
    http_body::Body<Data = Bytes, Error: Into<Box<dyn std::error::Error + Send + Sync>>>
    + Send
    + Unpin
    + 'static
{
}

impl<T> H2Body for T where
    T: http_body::Body<Data = Bytes, Error: Into<Box<dyn std::error::Error + Send + Sync>>>
        + Send
        + Unpin
        + 'static
{
}

/// What an HTTP/2 pool is built with; two pools with equal settings are interchangeable,
/// which is how a reload keeps the connections of endpoints it did not change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct H2Settings {
    /// TCP connect and HTTP/2 handshake timeout (`None`: the OS's).
    pub connect_timeout: Option<Duration>,
    /// Streams one connection carries at once (`max_concurrent_streams`).
    pub max_streams: usize,
    /// A connection with no stream for this long is closed (`timeouts.idle_ms`).
    pub idle_timeout: Option<Duration>,
    /// Largest response head accepted (`limits.header_bytes`).
    pub header_bytes: u32,
    /// `SO_RCVBUF` of each connection (`None`: the kernel's default, autotuned).
    pub receive_buffer: Option<u32>,
}

/// Why a connection could not be opened, kept for every request that waited on it.
#[derive(Debug, Clone)]
enum Failed {
    Timeout,
    Refused(String),
    Tls(String),
    Handshake(String),
}

/// A connection's driver task, before it is spawned.
type Driver = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// A connection's handle once open, shared by the requests that waited for it to open.
type Opened<B> = Arc<tokio::sync::OnceCell<Result<SendRequest<B>, Failed>>>;

/// One multiplexed connection of a slot, open or being opened, and how many of its streams
/// are taken.
#[derive(Debug)]
struct H2Conn<B> {
    opened: Opened<B>,
    streams: Arc<AtomicUsize>,
    /// When the eviction pass first saw it without streams (`None`: busy when last seen).
    idle_since: Option<Instant>,
}

impl<B> H2Conn<B> {
    /// Closed, or failed to open: dropped from its slot.
    fn is_gone(&self) -> bool {
        match self.opened.get() {
            Some(Ok(send)) => send.is_closed(),
            Some(Err(_)) => true,
            None => false,
        }
    }
}

/// Keeps a stream counted against its connection's `max_concurrent_streams` until the
/// response body ends or is dropped.
#[derive(Debug)]
pub struct StreamGuard(Arc<AtomicUsize>);

impl Drop for StreamGuard {
    #[inline]
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A stream taken on a connection that may still be opening.
#[derive(Debug)]
pub(crate) struct Taken<B> {
    opened: Opened<B>,
    guard: StreamGuard,
}

/// The HTTP/2 connections of one endpoint, carrying request bodies of type `B`.
#[derive(Debug)]
pub struct H2Pool<B> {
    addr: SocketAddr,
    settings: H2Settings,
    /// `h2`: the upstream's TLS and the name this endpoint is verified against.
    tls: Option<TlsTarget>,
    slots: PerThread<Mutex<Vec<H2Conn<B>>>>,
    metrics: Arc<PoolMetrics>,
    /// Set when a reload removed the endpoint: connections are no longer kept for reuse.
    retired: AtomicBool,
}

impl<B: H2Body> H2Pool<B> {
    /// An empty pool for `addr`, connecting over TLS (ALPN `h2`) when `tls` is set.
    pub fn new(
        addr: SocketAddr,
        settings: H2Settings,
        tls: Option<TlsTarget>,
        metrics: Arc<PoolMetrics>,
    ) -> H2Pool<B> {
        H2Pool {
            addr,
            settings,
            tls,
            slots: PerThread::new(|_| Mutex::new(Vec::new())),
            metrics,
            retired: AtomicBool::new(false),
        }
    }

    /// The endpoint's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The settings the pool was built with.
    pub fn settings(&self) -> H2Settings {
        self.settings
    }

    /// Whether a pool for `addr` built with `settings` and `tls` would make the same
    /// connections (a reload keeps this one then, with its open connections).
    pub fn makes_same(
        &self,
        addr: SocketAddr,
        settings: H2Settings,
        tls: Option<&TlsTarget>,
    ) -> bool {
        self.addr == addr
            && self.settings == settings
            && TlsTarget::same_option(self.tls.as_ref(), tls)
    }

    fn slot(&self) -> MutexGuard<'_, Vec<H2Conn<B>>> {
        // A panic while holding a slot cannot leave the Vec half-changed (push and retain).
        self.slots
            .get()
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Takes a stream on the first connection of this thread with one free, open or being
    /// opened; else on a new connection, which the requests after this one share while it
    /// opens (a burst of requests opens one connection per `max_concurrent_streams`, not
    /// one each). Closed connections are dropped here.
    fn take(&self, fresh: bool) -> Taken<B> {
        let mut slot = self.slot();
        slot.retain(|c| !c.is_gone());
        let free = (!fresh)
            .then(|| {
                slot.iter().find(|c| {
                    c.streams.load(Ordering::Relaxed) < self.settings.max_streams
                        && c.opened
                            .get()
                            .is_none_or(|o| o.as_ref().is_ok_and(|s| s.is_ready()))
                })
            })
            .flatten();
        let (opened, streams) = match free {
            Some(c) => {
                if c.opened.initialized() {
                    self.metrics.reused.inc();
                }
                (Arc::clone(&c.opened), Arc::clone(&c.streams))
            }
            None => {
                let conn = H2Conn {
                    opened: Arc::default(),
                    streams: Arc::default(),
                    idle_since: None,
                };
                let taken = (Arc::clone(&conn.opened), Arc::clone(&conn.streams));
                if !self.retired.load(Ordering::Relaxed) {
                    slot.push(conn);
                }
                taken
            }
        };
        streams.fetch_add(1, Ordering::Relaxed);
        Taken {
            opened,
            guard: StreamGuard(streams),
        }
    }

    /// A stream on this thread's connections, its connection opened if it was not yet.
    /// Fails only if that connection cannot be opened (the request was not sent: safe to
    /// retry elsewhere).
    pub async fn stream(&self) -> Result<(SendRequest<B>, StreamGuard), UpstreamError> {
        self.ready(self.take(false)).await
    }

    async fn ready(&self, taken: Taken<B>) -> Result<(SendRequest<B>, StreamGuard), UpstreamError> {
        let opened = match taken.opened.get() {
            Some(opened) => opened,
            // Boxed: only the requests that wait for a connection pay for the connect
            // path's state. If the request opening it goes away, the next waiter goes on.
            None => Box::pin(taken.opened.get_or_init(|| self.connect())).await,
        };
        match opened {
            Ok(send) => Ok((send.clone(), taken.guard)),
            Err(Failed::Timeout) => Err(UpstreamError::Timeout {
                addr: self.addr,
                phase: "connect",
            }),
            Err(Failed::Refused(reason)) => Err(UpstreamError::Connect {
                addr: self.addr,
                reason: reason.clone(),
            }),
            Err(Failed::Tls(reason)) => Err(UpstreamError::Tls {
                addr: self.addr,
                reason: reason.clone(),
            }),
            Err(Failed::Handshake(reason)) => Err(UpstreamError::Connect {
                addr: self.addr,
                reason: format!("HTTP/2 handshake: {reason}"),
            }),
        }
    }

    /// Sends `req` on a stream taken with [`H2Pool::stream`] and waits for the response
    /// head. A request the connection refused before sending any of it (it closed as it was
    /// taken) is sent once more on a new connection.
    pub async fn send(
        &self,
        mut send: SendRequest<B>,
        guard: StreamGuard,
        req: Request<B>,
    ) -> Result<(Response<Incoming>, StreamGuard), UpstreamError> {
        match send.try_send_request(req).await {
            Ok(resp) => Ok((resp, guard)),
            Err(mut e) => match e.take_message() {
                Some(req) => {
                    drop(guard);
                    let (mut send, guard) = Box::pin(self.ready(self.take(true))).await?;
                    match send.send_request(req).await {
                        Ok(resp) => Ok((resp, guard)),
                        Err(e) => Err(self.broken(&e)),
                    }
                }
                None => Err(self.broken(e.error())),
            },
        }
    }

    /// A failed exchange, as the upstream side's error.
    fn broken(&self, e: &hyper::Error) -> UpstreamError {
        let reason = match std::error::Error::source(e) {
            Some(cause) => format!("{e}: {cause}"),
            None => e.to_string(),
        };
        UpstreamError::Broken {
            addr: self.addr,
            reason,
        }
    }

    /// Opens a connection: TCP, the transport, the HTTP/2 handshake; spawns its driver.
    async fn connect(&self) -> Result<SendRequest<B>, Failed> {
        let (send, driver) = self.handshake().await?;
        let open = OpenConnection::new(&self.metrics);
        tokio::spawn(async move {
            let _open = open;
            driver.await;
        });
        Ok(send)
    }

    /// A health check over HTTP/2 (`[upstreams.health]` of an `h2c`/`h2` upstream, whose
    /// endpoints may speak nothing else): `GET path` with `authority` on a connection of its
    /// own, opened like the pool's (TLS included) but neither kept nor counted; the status
    /// of the answer, or why there is none. The caller bounds it in time. Its request has
    /// no body, so its connection carries `Empty` bodies, not the pool's `B`.
    pub(crate) async fn probe(&self, path: &str, authority: &str) -> Result<u16, String> {
        let (mut send, driver) = self.handshake().await.map_err(|f| match f {
            Failed::Timeout => "connect timed out".to_owned(),
            Failed::Refused(why) => format!("connect: {why}"),
            Failed::Tls(why) => format!("TLS: {why}"),
            Failed::Handshake(why) => format!("HTTP/2 handshake: {why}"),
        })?;
        let driver = tokio::spawn(driver);
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let req = Request::get(format!("{scheme}://{authority}{path}"))
            .version(http::Version::HTTP_2)
            .header(http::header::USER_AGENT, "tailguard-health-check")
            .body(http_body_util::Empty::<Bytes>::new())
            .map_err(|e| format!("request: {e}"))?;
        let answer = send.send_request(req).await;
        // Closing the connection: dropping its last handle lets the driver end it.
        drop(send);
        driver.abort();
        answer
            .map(|resp| resp.status().as_u16())
            .map_err(|e| format!("HTTP/2: {e}"))
    }

    /// TCP, the transport, the HTTP/2 handshake, within the connect timeout; the
    /// connection's handle and its driver (not yet spawned).
    async fn handshake<C: H2Body>(&self) -> Result<(SendRequest<C>, Driver), Failed> {
        let addr = self.addr;
        let opening = async {
            let tcp = crate::socket::connect(addr, self.settings.receive_buffer)
                .await
                .map_err(|e| {
                    if e.kind() == std::io::ErrorKind::TimedOut {
                        Failed::Timeout
                    } else {
                        Failed::Refused(e.to_string())
                    }
                })?;
            // Frames are written whole; waiting for an ACK (Nagle) would only add latency.
            let _ = tcp.set_nodelay(true);
            let mut builder = Builder::new(TokioExecutor::new());
            builder
                .timer(TokioTimer::new())
                .max_header_list_size(self.settings.header_bytes);
            // One handshake per transport type: the handle is the same either way, and each
            // connection's driver is spawned for its own transport.
            let (send, driver) = match &self.tls {
                None => {
                    let (send, conn) = builder
                        .handshake(TokioIo::new(tcp))
                        .await
                        .map_err(|e| Failed::Handshake(e.to_string()))?;
                    (send, drive(conn, addr))
                }
                Some(tls) => {
                    let io = tls_h2(tls, tcp).await?;
                    let (send, conn) = builder
                        .handshake(TokioIo::new(io))
                        .await
                        .map_err(|e| Failed::Handshake(e.to_string()))?;
                    (send, drive(conn, addr))
                }
            };
            Ok::<_, Failed>((send, driver))
        };
        match self.settings.connect_timeout {
            Some(limit) => tokio::time::timeout(limit, opening)
                .await
                .map_err(|_| Failed::Timeout)?,
            None => opening.await,
        }
    }

    /// Closes this thread's connections that carried no stream for `timeouts.idle_ms`, and
    /// drops closed ones. Called by each serving thread about once a second, so a
    /// connection's idle time is measured from the first pass that saw it idle (the request
    /// path reads no clock for it).
    pub fn evict(&self, now: Instant) {
        let Some(limit) = self.settings.idle_timeout else {
            return;
        };
        let idle: Vec<H2Conn<B>> = {
            let mut slot = self.slot();
            if slot.is_empty() {
                return;
            }
            for c in slot.iter_mut() {
                let busy = c.streams.load(Ordering::Relaxed) > 0 || !c.opened.initialized();
                c.idle_since = if busy {
                    None
                } else {
                    c.idle_since.or(Some(now))
                };
            }
            let (keep, idle) = std::mem::take(&mut *slot).into_iter().partition(|c| {
                !c.is_gone()
                    && c.idle_since
                        .is_none_or(|since| now.saturating_duration_since(since) < limit)
            });
            *slot = keep;
            idle
        };
        // Closed outside the lock (dropping the last handle ends the connection).
        drop(idle);
    }

    /// The endpoint left the config: its connections are dropped from the slots (each one
    /// closes once its open streams end) and no new one is kept.
    pub fn retire(&self) {
        self.retired.store(true, Ordering::Relaxed);
        self.slots.clear_all();
    }

    /// Connections kept in every slot and open (for tests).
    pub fn connection_count(&self) -> usize {
        self.slots
            .iter()
            .map(|s| {
                s.lock()
                    .map_or(0, |v| v.iter().filter(|c| !c.is_gone()).count())
            })
            .sum()
    }
}

/// `h2`: TLS over `tcp` with the upstream's config, which offers ALPN `h2` only; an endpoint
/// that does not agree to it (an HTTP/1.1-only server) is refused here, before a byte of
/// HTTP/2 is sent to it.
async fn tls_h2(
    tls: &TlsTarget,
    tcp: TcpStream,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, Failed> {
    let stream = tls
        .connect(tcp)
        .await
        .map_err(|e| Failed::Tls(e.to_string()))?;
    if stream.get_ref().1.alpn_protocol() != Some(b"h2".as_slice()) {
        return Err(Failed::Tls(
            "the endpoint did not agree to HTTP/2 (ALPN `h2`)".to_string(),
        ));
    }
    Ok(stream)
}

/// A connection's driver: reads frames for every stream, writes what they send; ends when
/// the connection closes or when every handle to it is dropped.
fn drive<F>(
    conn: F,
    addr: SocketAddr,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>
where
    F: std::future::Future<Output = hyper::Result<()>> + Send + 'static,
{
    Box::pin(async move {
        if let Err(e) = conn.await {
            tracing::debug!(upstream = %addr, "HTTP/2 connection ended: {e}");
        }
    })
}
