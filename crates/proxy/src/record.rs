//! What is known about a request when it finishes: its record, filled in by the data path
//! as the request goes, read once when it finishes by the metrics and the access log.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use http::{HeaderValue, Method, Uri, Version};

/// Everything about one request that metrics and the access log need. Filled in as the
/// request goes (head, route, upstream exchange, response), read once when it finishes
/// (`crate::finish`).
#[derive(Debug)]
pub struct RequestRecord {
    /// When the request head was handed to the gateway.
    pub start: Instant,
    /// The downstream peer.
    pub remote: SocketAddr,
    /// Whether the downstream connection is TLS.
    pub tls: bool,
    /// Request method.
    pub method: Method,
    /// Request URI as received.
    pub uri: Uri,
    /// Downstream HTTP version.
    pub version: Version,
    /// `User-Agent`, if sent and the access log is on.
    pub user_agent: Option<HeaderValue>,
    /// `Referer`, if sent and the access log is on.
    pub referer: Option<HeaderValue>,
    /// `X-Request-Id` as sent upstream (the client's, or generated).
    pub request_id: Option<HeaderValue>,
    /// Index of the matched route in the snapshot's router.
    pub route: Option<usize>,
    /// Index of the upstream and of the endpoint the request was sent to (its last try).
    pub endpoint: Option<(usize, usize)>,
    /// The tries before the last, if the request was retried (empty, unallocated, if not).
    pub earlier_tries: Vec<tailguard_access_log::UpstreamTry>,
    /// Status the upstream answered with.
    pub upstream_status: Option<u16>,
    /// From dispatch to the upstream's response head (or failure).
    pub upstream_time: Option<Duration>,
    /// Status sent downstream.
    pub status: u16,
    /// Request body bytes read from the client (shared with the body while it streams).
    pub bytes_in: Option<Arc<AtomicU64>>,
    /// Response body bytes sent to the client.
    pub bytes_out: u64,
    /// Kind of the error that ended the request, if one did ([`crate::Error::kind`]).
    pub error: Option<&'static str>,
    /// False when the response body did not reach its end (client gone, upstream broke).
    pub completed: bool,
    /// The request is a gRPC call (`content-type: application/grpc...`); set only where it
    /// matters (an HTTP/2 upstream, or an error answered before one was chosen).
    pub grpc: bool,
    /// A gRPC call's `grpc-status`: from the upstream's head or trailers, or the gateway's.
    pub grpc_status: Option<u8>,
    /// The trace's state while the request runs ([`crate::trace`]); none when not traced.
    pub(crate) trace: Option<crate::trace::RequestTrace>,
    /// Counts the request in its client address's in-flight requests until the record is
    /// dropped (`limits.client_requests`).
    pub(crate) client: Option<crate::clients::ClientGuard>,
    /// Who called, as the route's `auth` named them (`$consumer`, the span's `enduser.id`).
    pub consumer: Option<Arc<str>>,
    /// How the route's `auth` ended (`$auth_result`); `None` on an open route.
    pub auth_result: Option<tailguard_auth::AuthResult>,
}

impl RequestRecord {
    /// A record for a request whose head just arrived. `logged`: the access log is on, so
    /// the headers only it prints (`User-Agent`, `Referer`) are looked up and kept.
    ///
    /// Boxed: the record (~730 bytes, 320 of them its trace) travels from the data path into
    /// the response body's `Finish` and through the response's moves to the connection; as a
    /// box each of those moves is a pointer, not a copy (callgrind: the copies were ~1,000
    /// instructions of `memcpy` per request, the box's allocation and free ~100).
    pub fn new<B>(
        start: Instant,
        remote: SocketAddr,
        tls: bool,
        head: &http::Request<B>,
        logged: bool,
    ) -> Box<RequestRecord> {
        let header = |name| logged.then(|| head.headers().get(name).cloned()).flatten();
        // Allocated first, then written: `Box::new` built the record aside and copied it
        // in, all ~730 bytes, the untraced request's empty trace included.
        let slot = Box::<RequestRecord>::new_uninit();
        Box::write(
            slot,
            RequestRecord {
                start,
                remote,
                tls,
                method: head.method().clone(),
                uri: head.uri().clone(),
                version: head.version(),
                user_agent: header(http::header::USER_AGENT),
                referer: header(http::header::REFERER),
                request_id: None,
                route: None,
                endpoint: None,
                earlier_tries: Vec::new(),
                upstream_status: None,
                upstream_time: None,
                status: 0,
                bytes_in: None,
                bytes_out: 0,
                error: None,
                completed: false,
                grpc: false,
                grpc_status: None,
                trace: None,
                client: None,
                consumer: None,
                auth_result: None,
            },
        )
    }

    /// Starts the request's trace (a no-op when tracing is off).
    /// `host_field`: the request's `Host` field, looked up by the caller.
    pub(crate) fn start_trace<B>(
        &mut self,
        tracing: &crate::trace::SnapshotTracing,
        head: &http::Request<B>,
        host_field: Option<&HeaderValue>,
    ) {
        crate::trace::start(tracing, head, host_field, &mut self.trace);
    }

    /// Applies the matched route's `tracing`.
    pub(crate) fn trace_routed(&mut self, tracing: &crate::trace::SnapshotTracing, route: usize) {
        crate::trace::routed(tracing, &mut self.trace, route);
    }

    /// The trace id and the gateway's SERVER span id, when the request is traced
    /// (`$trace_id` and `$span_id` in the access log).
    pub fn trace_ids(&self) -> Option<([u8; 16], [u8; 8])> {
        self.trace.as_ref().map(|t| t.ids())
    }

    /// A try to `endpoint` (the upstream's index and the endpoint's) is about to be sent
    /// (`at`): its CLIENT span's `traceparent` into `headers`.
    pub(crate) fn trace_try_started(
        &mut self,
        headers: &mut http::HeaderMap,
        endpoint: (usize, usize),
        at: Instant,
    ) {
        if let Some(t) = self.trace.as_mut() {
            t.try_started(headers, endpoint, at);
        }
    }

    /// A try to `endpoint` is about to be sent (`at`) by the HTTP/1.1 client: its CLIENT
    /// span's `traceparent` as the field line the client writes into the head (none when
    /// the request is not traced).
    pub(crate) fn trace_try_started_h1(
        &mut self,
        headers: &mut http::HeaderMap,
        endpoint: (usize, usize),
        at: Instant,
    ) -> Option<[u8; tailguard_trace::TRACEPARENT_LINE_LEN]> {
        self.trace
            .as_mut()
            .map(|t| t.try_started_h1(headers, endpoint, at))
    }

    /// The open try ended (`at`).
    pub(crate) fn trace_try_ended(
        &mut self,
        status: Option<u16>,
        error: Option<&'static str>,
        at: Instant,
    ) {
        if let Some(t) = self.trace.as_mut() {
            t.try_ended(status, error, at);
        }
    }

    /// A retry was decided for `reason`.
    pub(crate) fn trace_retrying(&mut self, reason: &'static str) {
        if let Some(t) = self.trace.as_mut() {
            t.retrying(reason);
        }
    }

    /// The route answered by itself.
    pub(crate) fn trace_answered_locally(&mut self) {
        if let Some(t) = self.trace.as_mut() {
            t.answered_locally();
        }
    }

    /// Request body bytes read so far.
    pub fn bytes_in(&self) -> u64 {
        self.bytes_in.as_ref().map_or(0, |b| {
            b.load(Ordering::Relaxed) & !tailguard_http::body::BODY_ENDED
        })
    }
}

/// The field lines a try adds to the request head: the gateway's own fields (if the request
/// takes them as lines) and the try's `traceparent` (from
/// [`RequestRecord::trace_try_started_h1`], when traced).
pub(crate) fn head_lines<'a, const N: usize>(
    gateway_lines: &[&'a [u8]; 3],
    traceparent: &'a Option<[u8; N]>,
) -> [&'a [u8]; 4] {
    let [a, b, c] = *gateway_lines;
    [a, b, c, traceparent.as_ref().map_or(&[], |line| &line[..])]
}
