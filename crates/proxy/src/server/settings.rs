//! What a listener serves new connections with ([`Settings`]: TLS, HTTP/1.1 and HTTP/2
//! limits, access log, rate limit, allow/deny, compression), built from a config at start and
//! on each reload.

use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioTimer};
use tailguard_access_log::AccessLog;
use tailguard_http1::server as downstream;
use tokio_rustls::TlsAcceptor;

use tailguard_config::{Config, Limits, Timeouts};
use tailguard_http::error::Error;

/// HTTP/2 connections are hyper's; HTTP/1.1 ones are served by [`downstream`].
pub(super) type Http2 = hyper::server::conn::http2::Builder<TokioExecutor>;

/// What a listener serves new connections with; a reload replaces it whole. A connection
/// keeps the settings it was accepted with.
pub(super) struct Settings {
    /// Plain TCP when `None`; a reload may switch TLS on or off, or renew the certificate.
    pub(super) tls: Option<Arc<TlsAcceptor>>,
    /// HTTP/2 settings from `[limits]` (header size, streams).
    pub(super) http2: Arc<Http2>,
    /// `timeouts.send_ms`: an HTTP/2 connection whose responses wait on it this long closes.
    pub(super) send: Option<Duration>,
    /// `limits.abuse_holdoff_ms`: how long an address whose HTTP/2 connection was closed for
    /// abuse has its new connections closed at the accept.
    pub(super) holdoff: Option<Duration>,
    /// HTTP/1.1 settings from `[limits]` and `[timeouts]` (idle, header, body).
    pub(super) http1: downstream::Limits,
    pub(super) access_log: AccessLog,
    /// The listener's rate limit (kept by a reload that leaves it unchanged).
    pub(super) rate_limit: Option<Arc<tailguard_policy::rate_limit::Limiter>>,
    /// The listener's `allow` / `deny`, if it has them.
    pub(super) access: Option<Arc<tailguard_policy::access::AccessList>>,
    /// The listener's compression, for its routes without their own.
    pub(super) compress: Option<Arc<tailguard_policy::compress::Compress>>,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

fn millis(ms: u64) -> Option<Duration> {
    (ms > 0).then(|| Duration::from_millis(ms))
}

fn http2(limits: &Limits) -> Http2 {
    let mut b = Http2::new(TokioExecutor::new());
    b.timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(limits.header_bytes).unwrap_or(u32::MAX))
        .max_concurrent_streams(limits.http2_max_streams);
    b
}

fn http1(limits: &Limits, timeouts: &Timeouts) -> downstream::Limits {
    downstream::Limits {
        header_bytes: limits.header_bytes,
        body_bytes: limits.body_bytes,
        idle: millis(timeouts.idle_ms),
        header: millis(timeouts.header_ms),
        body: millis(timeouts.body_ms),
        park_after: millis(timeouts.park_ms),
        linger: downstream::Linger::DEFAULT,
    }
}

/// The TLS acceptor of a listener's config (`None` for plain TCP).
fn tls_acceptor(
    config: &Config,
    listener: &tailguard_config::ListenerConfig,
) -> Result<Option<Arc<TlsAcceptor>>, Error> {
    crate::tls::server_config(&config.base_dir, listener)
        .map(|c| c.map(|c| Arc::new(TlsAcceptor::from(c))))
}

/// The TLS acceptor of each listener of `config`, in order: a certificate that does not
/// load fails the caller before anything changes.
pub(super) fn tls_acceptors(config: &Config) -> Result<Vec<Option<Arc<TlsAcceptor>>>, Error> {
    config
        .listeners
        .iter()
        .map(|l| tls_acceptor(config, l))
        .collect()
}

/// The settings of each listener of `config`, in order.
pub(super) fn settings(
    config: &Config,
    tls: Vec<Option<Arc<TlsAcceptor>>>,
    logs: Vec<AccessLog>,
    rate_limits: Vec<Option<Arc<tailguard_policy::rate_limit::Limiter>>>,
) -> Vec<Arc<Settings>> {
    let http2 = Arc::new(http2(&config.limits));
    let http1 = http1(&config.limits, &config.timeouts);
    tls.into_iter()
        .zip(logs)
        .zip(rate_limits)
        .zip(&config.listeners)
        .map(|(((tls, access_log), rate_limit), listener)| {
            // A TLS connection does not park: its TLS state (~10 KB) would stay with it, so
            // its task is the lesser part of what it holds.
            let park_after = if tls.is_some() {
                None
            } else {
                http1.park_after
            };
            Arc::new(Settings {
                tls,
                http2: Arc::clone(&http2),
                send: millis(config.timeouts.send_ms),
                holdoff: millis(config.limits.abuse_holdoff_ms),
                http1: downstream::Limits {
                    park_after,
                    ..http1
                },
                access_log,
                rate_limit,
                access: tailguard_policy::access::AccessList::build(listener.access())
                    .map(Arc::new),
                // The config was validated, so it compiles.
                compress: listener
                    .compress
                    .as_ref()
                    .and_then(|c| c.get_ref().compile().ok())
                    .map(Arc::new),
            })
        })
        .collect()
}
