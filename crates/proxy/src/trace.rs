//! Tracing on the gateway's request path: the incoming context read when the head arrives,
//! a `traceparent` naming a fresh CLIENT span written into each upstream try, and, when the
//! request finishes, its SERVER span and one CLIENT span per try recorded if the head
//! sampler or the tail rule keeps them.
//!
//! Nothing is allocated or recorded while the request runs (a traced request's
//! [`RequestTrace`] lives in its record; only a retried request, or one naming a host longer
//! than 62 bytes, allocates), and the wall clock is not read: moments are
//! `Instant`s (one per try start and end), placed on the wall clock when a kept request
//! finishes, from an anchor the thread reads at most once a second. Spans are written at the
//! end, only for kept requests, as OTLP protobuf straight into the serving thread's buffer
//! (`tailguard-trace`'s `SpanWriter`), as an access-log line is formatted into the thread's
//! log buffer: the exporter thread only sends them. Tracing off (no endpoint)
//! costs one branch: the snapshot's [`Tracer`] is a no-op and the record's trace stays empty.
//!
//! A route with `tracing = false` gets no span and its upstream gets the client's
//! `traceparent` unchanged, as Envoy forwards trace headers untouched on a route it does not
//! trace.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Instant;

use http::{HeaderMap, HeaderValue, Request};
use tailguard_config::{Config, RouteConfig, RouteTracing};
use tailguard_trace::{
    Sampler, SpanContext, SpanId, SpanKind, SpanWriter, Status, TRACEPARENT_LINE_LEN, TailRule,
    TraceId, Tracer, extract, inject_beside_line, inject_known, method_name, protocol_version,
    traceparent_line, unix_nanos,
};

use tailguard_http::body::RequestBody;
use tailguard_policy::route::Router;
use tailguard_upstream::upstream::Upstream;

/// Client spans kept per request; tries beyond are counted in `tailguard.tries` only.
/// 8: a retry policy of more attempts is rare.
const MAX_TRY_SPANS: usize = 8;

/// A snapshot's tracing: the process's tracer (kept across reloads) and this config's
/// sampling.
#[derive(Debug, Clone, Default)]
pub struct SnapshotTracing {
    tracer: Tracer,
    sampler: Sampler,
    tail: TailRule,
    /// By route index (the router's order).
    routes: Vec<RouteTracing>,
    /// Some route has a `tracing` of its own: without one, a routed request's trace is
    /// left as it is, and `routes` is not read (another line to fetch).
    routes_differ: bool,
}

impl SnapshotTracing {
    /// The sampling of `config` recording into `tracer` (a no-op when tracing is off).
    /// `by_id` holds the config's routes by id.
    pub fn build(
        config: &Config,
        router: &Router,
        by_id: &HashMap<&str, &RouteConfig>,
        tracer: &Tracer,
    ) -> SnapshotTracing {
        let Some(t) = &config.tracing else {
            return SnapshotTracing::default();
        };
        let routes = router
            .routes()
            .iter()
            .map(|r| {
                by_id
                    .get(&*r.id)
                    .and_then(|c| c.tracing.as_ref().map(|t| *t.get_ref()))
                    .unwrap_or(RouteTracing::Default)
            })
            .collect::<Vec<_>>();
        SnapshotTracing {
            routes_differ: routes.iter().any(|r| *r != RouteTracing::Default),
            tracer: tracer.clone(),
            sampler: Sampler {
                parent_based: t.parent_based,
                ratio: t.sample_ratio,
            },
            tail: TailRule {
                keep_errors: true,
                slow_nanos: t.slow_ms.saturating_mul(1_000_000),
            },
            routes,
        }
    }

    /// The tracer.
    pub fn tracer(&self) -> &Tracer {
        &self.tracer
    }
}

/// One upstream try's CLIENT span, as far as it is known.
#[derive(Debug, Clone, Copy)]
struct Try {
    span_id: SpanId,
    started: Instant,
    /// When the try's answer (or failure) came; none while it is open.
    ended: Option<Instant>,
    /// The upstream's index in the snapshot and the endpoint's in the upstream, whose
    /// address the span names: two words written when the try opens, where the address was
    /// four (a `SocketAddr` copied as the caller built it, which stalled its load: 0.09 % of
    /// the serving core at 1 % sampling).
    endpoint: (usize, usize),
    number: u32,
    retry_reason: Option<&'static str>,
    status: Option<u16>,
    error: Option<&'static str>,
}

/// A traced request's state, from its head to its end, held in the request's record.
///
/// In the record, not in a box of its own: the record's lines are the ones the proxy touches
/// when a try starts and ends (the endpoint, the upstream's time and status), so the trace's
/// are fetched with them. A box, even one the thread reused, was a pointer to follow into
/// lines the upstream's round trip had let go cold: at 1 % sampling, when a try ended, the
/// two loads of `tried` and the try's slot were 0.19 % of the serving core, its slot's write
/// when it opened 0.16 %, and the box's first read at the request's start 0.08 % (PGO
/// `262727c`, the outermost tracer line of each sample, `addr2line -i`). A retried request's
/// later tries go to a vector, allocated at its first retry.
#[derive(Debug)]
pub struct RequestTrace {
    /// The SERVER span's context; `sampled` is the head decision, what upstreams are told.
    context: SpanContext,
    /// The caller's context, if a valid one came.
    parent: Option<SpanContext>,
    /// A bare `b3` decision.
    hint: Option<bool>,
    tracestate: Option<HeaderValue>,
    /// The request came with `tracestate` or `b3`, to be replaced or removed upstream.
    carried_tracestate_or_b3: bool,
    /// The request came with `traceparent`, to be replaced upstream.
    carried_traceparent: bool,
    /// `server.address`.
    host: HostText,
    /// The first try, once it opened.
    first_try: Option<Try>,
    /// The tries after the first, up to [`MAX_TRY_SPANS`] in all.
    retries: Vec<Try>,
    /// Tries made, kept or not.
    tried: u32,
    /// Why the next try is made (set when a retry is decided).
    next_reason: Option<&'static str>,
    /// The route answered by itself.
    local: bool,
}

/// The most bytes of a request's host its server span names: longer than any DNS name
/// (253) or IP literal; a longer `Host` is not a host name, and is cut.
const HOST_TEXT_MAX: usize = 255;

/// The bytes of a host kept in the record itself; a longer one (rare: few names are longer
/// than 62 bytes) takes an allocation of its own.
const HOST_INLINE: usize = 62;

/// The host a request named (`server.address`: the `Host` field, or the authority of an
/// absolute-form target, without its port), copied out of the request's head while the head
/// is in cache. Read from the head at the request's end, as it was before, its first byte
/// was a cache miss (~0.2 % of a 100 %-traced gateway's core, `perf annotate`; saved once
/// the span's own lines are prefetched, see `tailguard_trace`'s recorder), and holding the
/// header value took and gave back a reference to the head's buffer (two atomic operations)
/// on every traced request.
struct HostText {
    len: u8,
    inline: [u8; HOST_INLINE],
    /// A host longer than [`HOST_INLINE`] bytes.
    long: Option<Box<[u8]>>,
}

impl HostText {
    const EMPTY: HostText = HostText {
        len: 0,
        inline: [0; HOST_INLINE],
        long: None,
    };

    /// `host` (a `Host` value, port and all), its port cut off and its first
    /// [`HOST_TEXT_MAX`] bytes kept (the span's writer repairs a character cut in two).
    fn set(&mut self, host: &[u8]) {
        let host = tailguard_trace::host_without_port(host);
        let kept = &host[..host.len().min(HOST_TEXT_MAX)];
        self.len = u8::try_from(kept.len()).expect("at most HOST_TEXT_MAX (255) bytes kept");
        match self.inline.get_mut(..kept.len()) {
            Some(room) => {
                room.copy_from_slice(kept);
                self.long = None;
            }
            None => self.long = Some(kept.into()),
        }
    }

    /// The host; empty when the request named none.
    fn as_bytes(&self) -> &[u8] {
        match &self.long {
            Some(long) => long,
            None => &self.inline[..usize::from(self.len)],
        }
    }
}

impl std::fmt::Debug for HostText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&String::from_utf8_lossy(self.as_bytes()))
    }
}

thread_local! {
    /// One moment read from both clocks, the monotonic and the wall clock, for placing this
    /// thread's kept requests on the wall clock ([`wall_clock_anchor`]).
    static ANCHOR: Cell<Option<(Instant, u64)>> = const { Cell::new(None) };
    /// The text of the last client and the last endpoint address this thread's spans named
    /// ([`with_ip_text`]).
    static CLIENT_IP: RefCell<IpText> = const { RefCell::new(IpText::EMPTY) };
    static ENDPOINT_IP: RefCell<IpText> = const { RefCell::new(IpText::EMPTY) };
}

/// Reads the incoming context and starts the request's trace in `trace` (the record's);
/// leaves it empty when tracing is off. `host_field` is the request's `Host` field, which
/// the caller looked up for routing.
pub(crate) fn start<B>(
    t: &SnapshotTracing,
    req: &Request<B>,
    host_field: Option<&HeaderValue>,
    trace: &mut Option<RequestTrace>,
) {
    if !t.tracer.is_enabled() {
        return;
    }
    let found = extract(req.headers());
    // The tracer's metrics are another line to fetch: looked at only when there is
    // something to count.
    if found.malformed.contains(&true)
        && let Some(m) = t.tracer.metrics()
    {
        for header in found.malformed() {
            m.context_invalid(header);
        }
    }
    let trace_id = found.parent.map_or_else(TraceId::random, |p| p.trace_id);
    let sampled = t
        .sampler
        .sample(found.parent.as_ref(), found.sampling_hint, trace_id);
    let context = SpanContext {
        trace_id,
        span_id: SpanId::random(),
        sampled,
    };
    let host = host_field
        .map(HeaderValue::as_bytes)
        .or_else(|| req.uri().host().map(str::as_bytes))
        .unwrap_or_default();
    // A trace already started is kept (a record is started once; knowing the slot empty,
    // the compiler drops nothing).
    if trace.is_some() {
        return;
    }
    // Written field by field into the record's bytes over a constant: a trace built aside
    // was copied in, 16 bytes at a time over fields just written narrower, and each such
    // load stalled (the host's copy 0.06 %, the rest 0.05 % of the serving core at 1 %
    // sampling).
    let trace = trace.insert(RequestTrace::EMPTY);
    trace.context = context;
    trace.parent = found.parent;
    trace.hint = found.sampling_hint;
    trace.tracestate = found.tracestate;
    trace.carried_tracestate_or_b3 = found.carried_tracestate_or_b3;
    trace.carried_traceparent = found.carried_traceparent;
    trace.host.set(host);
}

/// The request was routed to route `index`: its own `tracing` applies (`false` ends the
/// trace).
pub(crate) fn routed(t: &SnapshotTracing, trace: &mut Option<RequestTrace>, index: usize) {
    let Some(tr) = trace.as_mut().filter(|_| t.routes_differ) else {
        return;
    };
    match t.routes.get(index) {
        Some(RouteTracing::Off) => *trace = None,
        Some(RouteTracing::Ratio(ratio)) => {
            let sampler = Sampler {
                ratio: *ratio,
                ..t.sampler
            };
            tr.context.sampled = sampler.sample(tr.parent.as_ref(), tr.hint, tr.context.trace_id);
        }
        Some(RouteTracing::Default) | None => {}
    }
}

impl RequestTrace {
    /// A trace with no context yet, [`start`] fills it in.
    const EMPTY: RequestTrace = RequestTrace {
        context: SpanContext {
            trace_id: TraceId::INVALID,
            span_id: SpanId::INVALID,
            sampled: false,
        },
        parent: None,
        hint: None,
        tracestate: None,
        carried_tracestate_or_b3: false,
        carried_traceparent: false,
        host: HostText::EMPTY,
        first_try: None,
        retries: Vec::new(),
        tried: 0,
        next_reason: None,
        local: false,
    };

    /// The ids the access log prints: the trace and the SERVER span.
    pub(crate) fn ids(&self) -> ([u8; 16], [u8; 8]) {
        (self.context.trace_id.0, self.context.span_id.0)
    }

    /// The route answers by itself.
    pub(crate) fn answered_locally(&mut self) {
        self.local = true;
    }

    /// A try to `endpoint` is about to be sent: a new CLIENT span, named in the
    /// `traceparent` the upstream receives.
    pub(crate) fn try_started(
        &mut self,
        headers: &mut HeaderMap,
        endpoint: (usize, usize),
        at: Instant,
    ) {
        let ctx = self.open_try(endpoint, at);
        inject_known(
            headers,
            &ctx,
            self.tracestate.as_ref(),
            self.carried_tracestate_or_b3,
        );
    }

    /// [`RequestTrace::try_started`] for a try the gateway's HTTP/1.1 client sends: the
    /// `traceparent` comes back as the field line the client writes into the head, and
    /// `headers` is touched only to remove or replace context fields that came.
    pub(crate) fn try_started_h1(
        &mut self,
        headers: &mut HeaderMap,
        endpoint: (usize, usize),
        at: Instant,
    ) -> [u8; TRACEPARENT_LINE_LEN] {
        let ctx = self.open_try(endpoint, at);
        inject_beside_line(
            headers,
            self.tracestate.as_ref(),
            self.carried_traceparent,
            self.carried_tracestate_or_b3,
        );
        traceparent_line(&ctx)
    }

    /// Ends the open try and opens a new CLIENT span, both `at` (a moment the caller read
    /// already: the dispatch's); its context is what the upstream is told.
    fn open_try(&mut self, endpoint: (usize, usize), at: Instant) -> SpanContext {
        end_open_try(self, None, Some("_OTHER"), at);
        let span_id = SpanId::random();
        let ctx = SpanContext {
            span_id,
            ..self.context
        };
        self.tried += 1;
        let opened = Try {
            span_id,
            started: at,
            ended: None,
            endpoint,
            number: self.tried,
            retry_reason: self.next_reason.take(),
            status: None,
            error: None,
        };
        if self.tried == 1 {
            self.first_try = Some(opened);
        } else if self.retries.len() + 1 < MAX_TRY_SPANS {
            // Room for all the retries kept, once: a retried request often retries again.
            self.retries.reserve_exact(MAX_TRY_SPANS - 1);
            self.retries.push(opened);
        }
        ctx
    }

    /// The try opened last, if it is kept (the first [`MAX_TRY_SPANS`] are).
    fn open_try_mut(&mut self) -> Option<&mut Try> {
        match self.tried {
            0 => None,
            1 => self.first_try.as_mut(),
            n if usize::try_from(n).is_ok_and(|n| n <= MAX_TRY_SPANS) => self.retries.last_mut(),
            _ => None,
        }
    }

    /// The kept tries, in order.
    fn tries(&self) -> impl Iterator<Item = &Try> {
        self.first_try.iter().chain(&self.retries)
    }

    /// The open try ended `at`, with the upstream's `status`, or an `error` (its kind).
    pub(crate) fn try_ended(
        &mut self,
        status: Option<u16>,
        error: Option<&'static str>,
        at: Instant,
    ) {
        end_open_try(self, status, error, at);
    }

    /// A retry was decided, for `reason`: the next try says so.
    pub(crate) fn retrying(&mut self, reason: &'static str) {
        self.next_reason = Some(reason);
    }
}

fn end_open_try(
    trace: &mut RequestTrace,
    status: Option<u16>,
    error: Option<&'static str>,
    at: Instant,
) {
    let Some(t) = trace.open_try_mut() else {
        return;
    };
    if t.ended.is_some() {
        return;
    }
    t.ended = Some(at);
    t.status = status;
    t.error = error;
}

/// What the finished request's record says, for its spans.
#[derive(Debug)]
pub(crate) struct Ended<'a> {
    pub(crate) start: Instant,
    pub(crate) end: Instant,
    pub(crate) method: &'a http::Method,
    pub(crate) uri: &'a http::Uri,
    pub(crate) version: http::Version,
    pub(crate) remote: SocketAddr,
    pub(crate) route: Option<&'a str>,
    /// The snapshot's upstreams, which name each try's endpoint.
    pub(crate) upstreams: &'a [Upstream<RequestBody>],
    pub(crate) status: u16,
    pub(crate) error: Option<&'static str>,
    pub(crate) upstream_status: Option<u16>,
    pub(crate) grpc: bool,
    pub(crate) grpc_status: Option<u8>,
    /// The consumer the route's `auth` named (`enduser.id`).
    pub(crate) consumer: Option<&'a str>,
    /// How the route's `auth` ended (`tailguard.auth.result`).
    pub(crate) auth_result: Option<&'static str>,
}

/// What the span says about how the request ended (`tailguard.outcome`).
fn outcome(record: &Ended<'_>, trace: &RequestTrace) -> &'static str {
    match record.error {
        Some("overloaded") => "shed",
        Some("rate_limited") => "rate_limited",
        Some(_) => "error",
        None if trace.local => "local",
        None => "forwarded",
    }
}

/// The request ended: its spans are recorded if the head sampler or the tail rule keeps
/// them.
pub(crate) fn finish(t: &SnapshotTracing, trace: &mut RequestTrace, record: &Ended<'_>) {
    let duration = u64::try_from(
        record
            .end
            .saturating_duration_since(record.start)
            .as_nanos(),
    )
    .unwrap_or(u64::MAX);
    let failed = record.status >= 500
        || matches!(
            record.error,
            Some("overloaded" | "rate_limited" | "upstream_timeout")
        )
        || record.grpc_status.is_some_and(grpc_failed);
    if !t.tail.keep(trace.context.sampled, failed, duration) {
        return;
    }
    // A try still open (its body was streaming) ends with the request.
    end_open_try(trace, record.upstream_status, record.error, record.end);
    // Every moment the request noted is an `Instant`, placed on the wall clock from the
    // thread's anchor, read again once it is a second older than the request's end.
    let anchor = wall_clock_anchor(record.end);
    let unix = |at: Instant| unix_at(anchor, at);
    let start_unix = unix(record.start);
    let end_unix = start_unix.saturating_add(duration);
    let method = method_name(record.method);
    // Written as OTLP protobuf into the thread's span buffer as each field is set: one lock
    // for the request's spans, and the exporter sends the bytes as they are.
    t.tracer.record_with(|spans| {
        let parent = trace.parent.map(|p| p.span_id);
        if let Some(mut server) = spans.start(SpanKind::Server, &trace.context, parent) {
            server.start_unix_nanos = start_unix;
            server.end_unix_nanos = end_unix;
            server_span(&mut server, trace, record, method, failed);
        }
        for one in trace.tries() {
            let ctx = SpanContext {
                span_id: one.span_id,
                ..trace.context
            };
            let Some(mut client) = spans.start(SpanKind::Client, &ctx, Some(trace.context.span_id))
            else {
                continue;
            };
            client.start_unix_nanos = unix(one.started);
            client.end_unix_nanos = one
                .ended
                .map_or(end_unix, unix)
                .max(client.start_unix_nanos + 1);
            client_span(&mut client, one, record.upstreams, method);
        }
    });
}

/// The server span's name, attributes and status.
fn server_span(
    server: &mut SpanWriter<'_>,
    trace: &RequestTrace,
    record: &Ended<'_>,
    method: &'static str,
    failed: bool,
) {
    let route = record.route;
    match route {
        Some(r) => server.set_name_parts(&[method.as_bytes(), r.as_bytes()]),
        None => server.set_name(method),
    }
    server.str("http.request.method", method);
    if let Some(r) = route {
        server.bytes("http.route", r.as_bytes());
    }
    server.int("http.response.status_code", i64::from(record.status));
    server.bytes("url.path", record.uri.path().as_bytes());
    if !trace.host.as_bytes().is_empty() {
        server.bytes("server.address", trace.host.as_bytes());
    }
    with_ip_text(&CLIENT_IP, record.remote, |ip| {
        server.bytes("client.address", ip);
    });
    server.str("network.protocol.version", protocol_version(record.version));
    server.str("tailguard.outcome", outcome(record, trace));
    if let Some(consumer) = record.consumer {
        // OpenTelemetry's `enduser.id`: the authenticated caller (a name, never a key).
        server.bytes("enduser.id", consumer.as_bytes());
    }
    if let Some(result) = record.auth_result {
        server.str("tailguard.auth.result", result);
    }
    if trace.tried > 0 {
        server.int("tailguard.tries", i64::from(trace.tried));
    }
    if record.grpc {
        server.str("rpc.system", "grpc");
        if let Some((service, method)) = record.uri.path().trim_start_matches('/').split_once('/') {
            server.bytes("rpc.service", service.as_bytes());
            server.bytes("rpc.method", method.as_bytes());
        }
        if let Some(code) = record.grpc_status {
            server.int("rpc.grpc.status_code", i64::from(code));
        }
    }
    if failed {
        server.status = Status::Error;
        // The OTel conventions: the error's class; for a gRPC call answered with a status,
        // the status code's name (a failed call usually ends with HTTP 200).
        match (
            record.error,
            record.grpc.then_some(record.grpc_status).flatten(),
        ) {
            (Some(kind), _) => server.str("error.type", kind),
            (None, Some(code)) => server.str("error.type", grpc_code_name(code)),
            (None, None) => server.bytes("error.type", &status_digits(record.status)),
        }
    }
}

/// A try's client span: its name, attributes and status.
fn client_span(
    client: &mut SpanWriter<'_>,
    one: &Try,
    upstreams: &[Upstream<RequestBody>],
    method: &'static str,
) {
    client.set_name(method);
    client.str("http.request.method", method);
    let (u, e) = one.endpoint;
    if let Some(addr) = upstreams
        .get(u)
        .and_then(|u| u.endpoints.get(e))
        .map(|e| e.addr)
    {
        with_ip_text(&ENDPOINT_IP, addr, |ip| client.bytes("server.address", ip));
        client.int("server.port", i64::from(addr.port()));
    }
    client.int("tailguard.try", i64::from(one.number));
    if let Some(reason) = one.retry_reason {
        client.str("tailguard.retry_reason", reason);
    }
    if let Some(status) = one.status {
        client.int("http.response.status_code", i64::from(status));
    }
    if let Some(error) = one.error {
        client.status = Status::Error;
        client.str("error.type", error);
    } else if one.status.is_some_and(|s| s >= 500) {
        client.status = Status::Error;
        client.bytes("error.type", &status_digits(one.status.unwrap_or(500)));
    }
}

/// gRPC statuses that are the server's failure (as the OTel gRPC conventions mark a server
/// span's error): UNKNOWN, DEADLINE_EXCEEDED, UNIMPLEMENTED, INTERNAL, UNAVAILABLE,
/// DATA_LOSS.
fn grpc_failed(code: u8) -> bool {
    matches!(code, 2 | 4 | 12 | 13 | 14 | 15)
}

/// How old the thread's clock anchor may grow before it is read again. Both clocks were
/// read for every kept request; with the anchor kept and the address texts cached
/// ([`with_ip_text`]), a 100 %-sampled request costs 435 instructions less (24,185 ->
/// 23,750, callgrind, `lab/callgrind.sh`). The monotonic and the wall clock drift apart by at
/// most NTP's slew (0.5 ms a second, usually far less), and a stepped wall clock shows
/// within this.
const ANCHOR_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(1);

/// The thread's anchor, read again if it is older than [`ANCHOR_MAX_AGE`] at `now` (a
/// moment the caller has read: the request's end) or later than `now`.
fn wall_clock_anchor(now: Instant) -> (Instant, u64) {
    ANCHOR.with(|cell| match cell.get() {
        Some(anchor) if anchor_is_fresh(anchor.0, now) => anchor,
        _ => {
            let anchor = (Instant::now(), unix_nanos());
            cell.set(Some(anchor));
            anchor
        }
    })
}

/// Whether an anchor read at `anchor` may place moments seen at `now`.
fn anchor_is_fresh(anchor: Instant, now: Instant) -> bool {
    now.checked_duration_since(anchor)
        .is_some_and(|age| age <= ANCHOR_MAX_AGE)
}

/// An address's IP as text, kept with the address it was made from.
struct IpText {
    ip: Option<IpAddr>,
    text: [u8; 39],
    len: u8,
}

impl IpText {
    const EMPTY: IpText = IpText {
        ip: None,
        text: [0; 39],
        len: 0,
    };
}

/// Calls `f` with `addr`'s IP as text, formatted only when it is not the one `cache` (the
/// thread's last client or endpoint address) already holds: a gateway's requests come from
/// and go to few addresses in a row (behind a load balancer, one).
fn with_ip_text<R>(
    cache: &'static std::thread::LocalKey<RefCell<IpText>>,
    addr: SocketAddr,
    f: impl FnOnce(&[u8]) -> R,
) -> R {
    cache.with_borrow_mut(|c| {
        let ip = addr.ip();
        if c.ip != Some(ip) {
            let len = ip_text(addr, &mut c.text).len();
            c.len = u8::try_from(len).expect("an IP address's text fits in 39 bytes");
            c.ip = Some(ip);
        }
        f(&c.text[..usize::from(c.len)])
    })
}

/// `at` on the wall clock, given one moment read from both clocks (`anchor`).
fn unix_at((anchor, anchor_unix): (Instant, u64), at: Instant) -> u64 {
    let nanos = |d: std::time::Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    match at.checked_duration_since(anchor) {
        Some(after) => anchor_unix.saturating_add(nanos(after)),
        None => anchor_unix.saturating_sub(nanos(anchor.duration_since(at))),
    }
}

/// A gRPC status code's name, as the gRPC spec spells it.
fn grpc_code_name(code: u8) -> &'static str {
    const NAMES: [&str; 17] = [
        "OK",
        "CANCELLED",
        "UNKNOWN",
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
        "UNAUTHENTICATED",
    ];
    NAMES.get(usize::from(code)).copied().unwrap_or("UNKNOWN")
}

fn status_digits(status: u16) -> [u8; 3] {
    let d = |n: u16| b'0' + u8::try_from(n % 10).expect("a digit");
    [d(status / 100), d(status / 10), d(status)]
}

/// The address's IP as text, without allocating (the access log's writer: through `fmt` it
/// was ~1,100 instructions per address, the largest part of a traced request's cost on its
/// serving thread).
fn ip_text(addr: SocketAddr, buf: &mut [u8; 39]) -> &[u8] {
    tailguard_access_log::ip_text(addr.ip(), buf)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::{
        ANCHOR_MAX_AGE, CLIENT_IP, HOST_INLINE, HOST_TEXT_MAX, HostText, MAX_TRY_SPANS,
        RequestTrace, anchor_is_fresh, ip_text, unix_at, wall_clock_anchor, with_ip_text,
    };

    #[test]
    fn the_first_tries_are_kept_in_order_each_ended_once() {
        let mut trace = RequestTrace::EMPTY;
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut headers = http::HeaderMap::new();
        let mut told = Vec::new();
        for n in 0..MAX_TRY_SPANS + 2 {
            let at = t0 + ms(10 * n as u64);
            trace.try_started(&mut headers, (3, n), at);
            told.push(headers["traceparent"].to_str().unwrap().to_owned());
            // Even tries end with an answer; odd ones are still open when the next opens.
            if n % 2 == 0 {
                trace.try_ended(Some(503), None, at + ms(5));
                // A second end (the request's, for a try still streaming) changes nothing.
                trace.try_ended(Some(200), None, at + ms(7));
            }
        }
        assert_eq!(trace.tried, u32::try_from(MAX_TRY_SPANS + 2).unwrap());
        let kept: Vec<_> = trace.tries().collect();
        assert_eq!(kept.len(), MAX_TRY_SPANS, "the first {MAX_TRY_SPANS} tries");
        for (n, one) in kept.iter().enumerate() {
            let started = t0 + ms(10 * n as u64);
            assert_eq!(one.number, u32::try_from(n + 1).unwrap());
            assert_eq!(one.endpoint, (3, n));
            assert_eq!(one.started, started);
            if n % 2 == 0 {
                assert_eq!(
                    (one.ended, one.status, one.error),
                    (Some(started + ms(5)), Some(503), None)
                );
            } else {
                assert_eq!(
                    one.ended,
                    Some(started + ms(10)),
                    "ended as the next opened"
                );
                assert_eq!((one.status, one.error), (None, Some("_OTHER")));
            }
            // Each try's upstream was told its own span as the parent.
            assert!(told[n].contains(&one.span_id.to_string()), "{}", told[n]);
        }
        let ids: std::collections::HashSet<_> = kept.iter().map(|t| t.span_id).collect();
        assert_eq!(ids.len(), MAX_TRY_SPANS, "distinct span ids");
    }

    #[test]
    fn a_host_is_kept_without_its_port_and_cut_at_its_bound() {
        let mut host = HostText::EMPTY;
        for (given, kept) in [
            ("example.com:8080", "example.com"),
            ("example.com", "example.com"),
            ("[::1]:80", "::1"),
            ("[2001:db8::1]", "2001:db8::1"),
            ("10.0.0.1:443", "10.0.0.1"),
            ("", ""),
        ] {
            host.set(given.as_bytes());
            assert_eq!(host.as_bytes(), kept.as_bytes(), "{given}");
        }
        // Either side of what the record holds itself, and past the bound.
        for len in [HOST_INLINE - 1, HOST_INLINE, HOST_INLINE + 1, HOST_TEXT_MAX] {
            let name = "h".repeat(len);
            host.set(format!("{name}:8443").as_bytes());
            assert_eq!(host.as_bytes(), name.as_bytes());
            // A short one after it: nothing of the longer is left.
            host.set(b"b.io");
            assert_eq!(host.as_bytes(), b"b.io");
        }
        let long = "x".repeat(HOST_TEXT_MAX + 40);
        host.set(long.as_bytes());
        assert_eq!(host.as_bytes(), &long.as_bytes()[..HOST_TEXT_MAX]);
    }

    #[test]
    fn a_cached_address_text_follows_the_address() {
        for ip in [
            "127.0.0.1",
            "2001:db8::1",
            "2001:db8::1",
            "10.0.0.7",
            "127.0.0.1",
        ] {
            let addr = std::net::SocketAddr::new(ip.parse().unwrap(), 443);
            let text = with_ip_text(&CLIENT_IP, addr, <[u8]>::to_vec);
            assert_eq!(text, ip.as_bytes());
        }
    }

    #[test]
    fn the_clock_anchor_serves_the_second_after_it_was_read() {
        let at = Instant::now();
        assert!(anchor_is_fresh(at, at));
        assert!(anchor_is_fresh(at, at + ANCHOR_MAX_AGE));
        assert!(!anchor_is_fresh(
            at,
            at + ANCHOR_MAX_AGE + Duration::from_nanos(1)
        ));
        assert!(!anchor_is_fresh(at + Duration::from_millis(1), at));
        let first = wall_clock_anchor(Instant::now());
        assert_eq!(wall_clock_anchor(first.0), first, "kept while fresh");
        let unix_now = super::unix_nanos();
        assert!(first.1 <= unix_now && unix_now - first.1 < 60_000_000_000);
    }

    #[test]
    fn addresses_print_as_std_prints_them() {
        for ip in [
            "0.0.0.0",
            "127.0.0.1",
            "10.20.100.255",
            "192.168.9.99",
            "::1",
            "2001:db8::8a2e:370:7334",
            "::ffff:192.0.2.7",
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
        ] {
            let addr = std::net::SocketAddr::new(ip.parse().unwrap(), 80);
            let mut buf = [0u8; 39];
            assert_eq!(ip_text(addr, &mut buf), addr.ip().to_string().as_bytes());
        }
    }

    #[test]
    fn moments_before_and_after_the_anchor_land_on_the_wall_clock() {
        let anchor = Instant::now();
        let anchor_unix = 1_700_000_000_000_000_000;
        let before = anchor.checked_sub(Duration::from_micros(250)).unwrap();
        let after = anchor + Duration::from_micros(40);
        assert_eq!(unix_at((anchor, anchor_unix), anchor), anchor_unix);
        assert_eq!(
            unix_at((anchor, anchor_unix), before),
            anchor_unix - 250_000
        );
        assert_eq!(unix_at((anchor, anchor_unix), after), anchor_unix + 40_000);
    }
}
