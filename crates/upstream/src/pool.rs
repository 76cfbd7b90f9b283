//! The upstream connection pool: idle HTTP/1.1 keep-alive connections to one endpoint, kept
//! per serving thread and handed out most recently used first.
//!
//! Not hyper-util's pooled `Client`, because that client cost about a sixth of the serving
//! thread's user CPU per proxied request (perf, `docs/benchmarks/2026-11-22-proxy-cpu/`): it
//! finds a connection in a pool shared by key (a SipHash map of scheme and authority behind a
//! mutex), boxes its connect and checkout futures, clones itself per request, and spawns a
//! task per request to wait until the connection can be reused. Here an endpoint owns its
//! pool and a request reaches it through
//! the index the balancer returned; a serving thread only takes and returns connections in its
//! own slot (the slot's mutex is never contended, design.md §2 rule 3); and a connection goes
//! back to the pool when its response body has been read to the end, with no task spawned.
//! A connection whose body was not read to the end is closed instead (its unread bytes would
//! otherwise be taken for the next response). The connections are the `client` module's: no
//! task runs per connection, and an idle one is only a socket in a list.
//!
//! An upstream with `[upstreams.tls]` gives its pools a [`TlsTarget`]: a new connection is
//! a TCP connect then a TLS handshake, both within `timeouts.connect_ms`; everything after
//! is the same, over the TLS stream.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::error::UpstreamError;
use crate::pool_metrics::{OpenConnection, PoolMetrics};
use crate::shard::PerThread;
use crate::tls::TlsTarget;
use tailguard_http1::client::Connection;
use tailguard_http1::stream::Stream;

/// Idle connections one serving thread keeps per endpoint (nginx's `keepalive` is the same
/// cap, per worker); a connection released beyond it is closed.
pub const MAX_IDLE_PER_THREAD: usize = 256;

/// What a pool is built with; two pools with equal settings are interchangeable, which is
/// how a reload keeps the warm pools of endpoints it did not change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolSettings {
    /// TCP connect timeout (`None`: the OS's).
    pub connect_timeout: Option<Duration>,
    /// An idle connection older than this is closed (`None`: kept until the upstream closes).
    pub idle_timeout: Option<Duration>,
    /// `SO_RCVBUF` of each connection (`None`: the kernel's default, autotuned).
    pub receive_buffer: Option<u32>,
}

#[derive(Debug)]
struct Idle {
    conn: Box<Connection>,
    since: Instant,
}

/// The pool of one endpoint.
#[derive(Debug)]
pub struct EndpointPool {
    addr: SocketAddr,
    settings: PoolSettings,
    /// TLS to the endpoint (`None`: plain TCP).
    tls: Option<TlsTarget>,
    slots: PerThread<Mutex<Vec<Idle>>>,
    metrics: Arc<PoolMetrics>,
    /// Set when a reload removed the endpoint: released connections are closed, not kept.
    retired: AtomicBool,
}

impl EndpointPool {
    /// An empty pool for `addr`, connecting over TLS when `tls` is set.
    pub fn new(
        addr: SocketAddr,
        settings: PoolSettings,
        tls: Option<TlsTarget>,
        metrics: Arc<PoolMetrics>,
    ) -> EndpointPool {
        EndpointPool {
            addr,
            settings,
            tls,
            slots: PerThread::new(|_| Mutex::new(Vec::new())),
            metrics,
            retired: AtomicBool::new(false),
        }
    }

    /// The endpoint's address.
    #[inline]
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The settings the pool was built with.
    #[inline]
    pub fn settings(&self) -> PoolSettings {
        self.settings
    }

    /// Whether a pool for `addr` built with `settings` and `tls` would make the same
    /// connections as this one (a reload keeps this one then, with its warm connections).
    pub fn makes_same(
        &self,
        addr: SocketAddr,
        settings: PoolSettings,
        tls: Option<&TlsTarget>,
    ) -> bool {
        self.addr == addr
            && self.settings == settings
            && TlsTarget::same_option(self.tls.as_ref(), tls)
    }

    fn slot(&self) -> MutexGuard<'_, Vec<Idle>> {
        // A panic while holding a slot cannot leave the Vec half-changed (push and pop only).
        self.slots
            .get()
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A connection ready to take a request: the most recently released idle one of this
    /// thread, else a new one, connected within `connect` (the pool's
    /// [`PoolSettings::connect_timeout`], or a route's own `timeouts.connect_ms`). `now` is
    /// the request's start (no clock read here). Returns the connection and whether it
    /// served a request before.
    pub async fn checkout_within(
        &self,
        now: Instant,
        connect: Option<Duration>,
    ) -> Result<(Box<Connection>, bool), UpstreamError> {
        loop {
            let Some(mut idle) = self.slot().pop() else {
                break;
            };
            // Dropped (closed) if the upstream closed it or it idled too long.
            if !self.expired(&idle, now) && idle.conn.is_idle_usable() {
                self.metrics.reused.inc();
                return Ok((idle.conn, true));
            }
        }
        // Boxed: only a request that opens a connection pays for the connect path's state
        // (~300 bytes), instead of every request's future carrying it.
        Ok((Box::pin(self.connect_within(connect)).await?, false))
    }

    /// Opens a new connection (TCP, then TLS if the upstream has it, both within `connect`:
    /// the pool's connect timeout, or a route's own).
    pub async fn connect_within(
        &self,
        connect: Option<Duration>,
    ) -> Result<Box<Connection>, UpstreamError> {
        let addr = self.addr;
        let connecting = self.open();
        let stream = match connect {
            Some(limit) => match tokio::time::timeout(limit, connecting).await {
                Ok(r) => r,
                Err(_) => {
                    return Err(UpstreamError::Timeout {
                        addr,
                        phase: "connect",
                    });
                }
            },
            None => connecting.await,
        }?;
        Ok(Connection::new(
            stream,
            addr,
            Box::new(OpenConnection::new(&self.metrics)),
        ))
    }

    /// The transport a connection of this pool runs over: TCP, then TLS when the upstream
    /// has it (no timeout, nothing counted; health checks open theirs here too, so they
    /// test what requests use).
    pub(crate) async fn open(&self) -> Result<Stream, UpstreamError> {
        let addr = self.addr;
        let stream = crate::socket::connect(addr, self.settings.receive_buffer)
            .await
            .map_err(|e| connect_error(addr, &e))?;
        // Requests are written whole; waiting for an ACK (Nagle) would only add latency.
        let _ = stream.set_nodelay(true);
        let Some(tls) = &self.tls else {
            return Ok(Stream::Tcp(stream));
        };
        // Boxed: the handshake's state is large and only a new TLS connection needs it.
        match Box::pin(tls.connect(stream)).await {
            Ok(tls) => Ok(Stream::boxed(tls)),
            Err(e) => Err(UpstreamError::Tls {
                addr,
                reason: e.to_string(),
            }),
        }
    }

    /// Gives back a connection whose response was read to its end, to this thread's slot.
    /// `now` is when the response ended.
    #[inline]
    pub fn release(&self, conn: Box<Connection>, now: Instant) {
        if self.retired.load(Ordering::Relaxed) {
            return;
        }
        let mut slot = self.slot();
        if slot.len() < MAX_IDLE_PER_THREAD {
            slot.push(Idle { conn, since: now });
        }
    }

    fn expired(&self, idle: &Idle, now: Instant) -> bool {
        self.settings
            .idle_timeout
            .is_some_and(|limit| now.saturating_duration_since(idle.since) >= limit)
    }

    /// Closes this thread's idle connections that are past the idle timeout or already
    /// closed by the upstream. Called by each serving thread about once a second.
    pub fn evict(&self, now: Instant) {
        let expired: Vec<Idle> = {
            let mut slot = self.slot();
            if slot.is_empty() {
                return;
            }
            let mut keep = Vec::with_capacity(slot.len());
            let mut expired = Vec::new();
            for mut idle in std::mem::take(&mut *slot) {
                if idle.conn.is_idle_usable() && !self.expired(&idle, now) {
                    keep.push(idle);
                } else {
                    expired.push(idle);
                }
            }
            *slot = keep;
            expired
        };
        // Closed outside the lock.
        drop(expired);
    }

    /// The endpoint left the config: closes every idle connection and every one released
    /// from now on.
    pub fn retire(&self) {
        self.retired.store(true, Ordering::Relaxed);
        self.slots.clear_all();
    }

    /// Idle connections in every slot (for tests and the idle gauge).
    pub fn idle_count(&self) -> usize {
        self.slots
            .iter()
            .map(|s| s.lock().map_or(0, |v| v.len()))
            .sum()
    }
}

fn connect_error(addr: SocketAddr, err: &std::io::Error) -> UpstreamError {
    if err.kind() == std::io::ErrorKind::TimedOut {
        UpstreamError::Timeout {
            addr,
            phase: "connect",
        }
    } else {
        UpstreamError::Connect {
            addr,
            reason: err.to_string(),
        }
    }
}
