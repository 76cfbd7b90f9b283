//! The data path: one request from its parsed head to its response, as its stages, each a
//! call into a lower layer. [`serve`] reads top to bottom:
//!
//! 1. **parse**: the head arrives parsed (the HTTP/1.1 engine through `crate::handler`,
//!    hyper for HTTP/2); `GET /healthz` is answered at once. The request holds its
//!    snapshot (`crate::conn::hold`) and starts its [`RequestRecord`];
//! 2. **client limit**: the client address's in-flight requests (`limits.client_requests`);
//!    over it the request is handed back [`Refused`] (`REFUSED_STREAM` or `429`, the
//!    caller's choice by protocol);
//! 3. **by address**: the listener's `allow` / `deny` (`tailguard_policy::access`, checked
//!    against the peer or, behind `trusted_proxies`, the forwarded client address); refused,
//!    a `403` ([`address_allowed`]). A route's own lists are checked as soon as it is found
//!    (the preflight's route, or the request's at step 6), before its rate limit and before
//!    anything that would ask for credentials;
//! 4. **CORS preflight**: an `OPTIONS` with `Origin` and `Access-Control-Request-Method`,
//!    routed as the request it announces to a route with `cors`, is answered here
//!    ([`answer_preflight`], the answer decided by `tailguard_policy::cors`): before the
//!    rate limits and before anything that would ask for credentials;
//! 5. **rate limit** of the listener (`tailguard_policy::rate_limit::Limiter::check`; a `429` from
//!    `crate::respond::rate_limited`);
//! 6. **route**: `tailguard_policy::route::Router::find`; its `allow` / `deny` (step 3); on a
//!    route with `cors`, what the response will carry for the request's `Origin` is decided
//!    (`cors::Actual`); then the route's own rate limit (unless it is per consumer);
//! 7. **auth**: the route's `auth` ([`authenticate`], `tailguard_auth::Gate`): the client's
//!    copies of the headers it sets removed, its authenticators asked until one accepts
//!    (a slow one awaited, its work off this thread); refused, the authenticator's answer
//!    (`crate::respond::auth_refused`: `401`, `403`, ...); accepted, the request changed as
//!    it says and its consumer noted; then a route's rate limit per consumer;
//! 8. **local answer**: a route with `redirect` or `respond` answers here
//!    ([`answer_locally`], the answer built by `tailguard_policy::policy`);
//! 9. **body**: a request with a body waits for its first bytes (or its end) before an
//!    upstream is chosen, `timeouts.body_ms` at most (then `408`), unless its route streams
//!    (`stream_request`, gRPC): [`wait_for_body`];
//! 10. **admit**: `tailguard_policy::admission::admit` (the shedder); refused, a `503`;
//! 11. **forward with retries**: `crate::forward::forward` for an HTTP/1.1 upstream,
//!     `crate::forward_h2::forward` (through [`serve_h2`]) for HTTP/2 and gRPC; the route's
//!     retries are `crate::retry`'s loops;
//! 12. **respond**: the upstream's head with a `ResponseBody` that streams its body, or an
//!     error's answer (`crate::respond::error_response`, the status from `Error::status`);
//!     on a route with `cors`, whatever answers gets its CORS fields ([`apply_cors`]);
//! 13. **record**: the response body carries the request's `Finish`, which reports it once
//!     when the body ends or is dropped (`crate::finish`: metrics, access log).
//!
//! The per-request state travels down as arguments (the held snapshot, the connection,
//! the record); nothing below this module names it.

use std::sync::Arc;
use std::time::Instant;

use http::{Method, Request, Response, StatusCode};
use tailguard_config::Protocol;
use tailguard_http::body::RequestBody;
use tailguard_http::error::Error;
use tailguard_http::grpc;
use tailguard_http::headers;
use tailguard_http1::timer::LazyTimer;
use tailguard_policy::access::{self, AccessList};
use tailguard_policy::admission::{self, AdmitGuard};
use tailguard_policy::{compress, cors};

use crate::conn::{ConnCtx, Held};
use crate::finish::Finish;
use crate::forward::check_forwardable;
use crate::record::RequestRecord;
use crate::respond::{error_response, local_response};
use crate::response_body::ResponseBody;
use crate::snapshot::Snapshot;

/// A request its client address had no room for (`limits.client_requests`): nothing was
/// done for it yet. HTTP/2 refuses the stream (`REFUSED_STREAM`: the client may send it
/// again, nothing was processed); HTTP/1.1 answers it ([`Refused::answer`]).
#[derive(Debug)]
pub(crate) struct Refused {
    record: Box<RequestRecord>,
    held: Held,
}

impl Refused {
    /// The `429` of a refused HTTP/1.1 request, counted and logged like a rate limit's.
    pub(crate) fn answer(self) -> Response<ResponseBody> {
        let Refused { record, held } = self;
        held.snapshot().metrics.gateway.request_started();
        let err = Error::RateLimited {
            scope: "client_requests",
            retry_after: 1,
        };
        let mut resp = error_response(err, record, held, None);
        resp.headers_mut().insert(
            http::header::RETRY_AFTER,
            http::HeaderValue::from_static("1"),
        );
        resp
    }
}

/// Serves one request from its parsed head to the response head (the body then streams).
/// `timer` is the connection's timer for `timeouts.request_ms` (kept across its requests).
pub(crate) async fn serve(
    conn: &Arc<ConnCtx>,
    mut req: Box<Request<RequestBody>>,
    timer: &mut LazyTimer,
) -> Result<Response<ResponseBody>, Refused> {
    // Parse: the head is here; `/healthz` needs nothing more.
    let start = Instant::now();
    // Answered locally on every listener, before admission, so it is never shed and never
    // touches an upstream.
    if req.uri().path() == "/healthz"
        && (req.method() == Method::GET || req.method() == Method::HEAD)
    {
        return Ok(local_response(StatusCode::OK, "ok\n", None));
    }
    let held = crate::conn::hold(conn);
    let mut record = RequestRecord::new(
        start,
        conn.remote,
        conn.tls,
        &req,
        !held.access_log().is_off(),
    );
    // Client limit: before anything is done for the request, so a refused one costs only
    // its head's parse.
    match conn
        .in_flight
        .enter(held.snapshot().config.limits.client_requests)
    {
        Some(guard) => record.client = Some(guard),
        None => {
            held.snapshot()
                .metrics
                .gateway
                .refused(crate::metrics::Refusal::ClientRequests);
            if let Some(count) =
                crate::log_every::note(crate::log_every::Cause::ClientRequests, start)
            {
                tracing::info!(
                    target: "tailguard::request",
                    count,
                    last_remote = %conn.remote,
                    "{count} requests refused in the last {} s: over limits.client_requests",
                    crate::log_every::INTERVAL.as_secs()
                );
            }
            record.grpc = tailguard_http::grpc::is_grpc(req.headers());
            return Err(Refused { record, held });
        }
    }
    held.snapshot().metrics.gateway.request_started();
    // One `Host` lookup for routing and the trace; none when the URI names the host
    // (HTTP/2's `:authority`, an absolute form) and the request is not traced.
    let tracing = &held.snapshot().tracing;
    let host_field = if req.uri().host().is_none() || tracing.tracer().is_enabled() {
        req.headers().get(http::header::HOST)
    } else {
        None
    };
    // Trace: the incoming context read, the request's SERVER span started (one branch when
    // tracing is off).
    record.start_trace(tracing, &req, host_field);
    // `OPTIONS *` asks about the server as a whole: routed as its root would be.
    let path = match req.uri().path() {
        "*" => "/",
        path => path,
    };
    let host = headers::host_from(req.uri(), host_field);
    // By address: the listener's lists, before anything else is done for the request (a
    // refused client spends no rate limit and learns no route).
    if let Some(list) = conn.access.as_deref()
        && !address_allowed(list, conn, held.snapshot(), req.headers())
    {
        record.grpc = tailguard_http::grpc::is_grpc(req.headers());
        let denied = Error::AddressDenied { scope: "listener" };
        return Ok(error_response(denied, record, held, None));
    }
    // CORS preflight: answered before the rate limits and before anything that would ask
    // for credentials (a browser sends none with a preflight). It is the browser's question
    // about the request it is about to send, which is limited and counted itself; a `429`
    // here would reach the page as an opaque CORS failure instead of a status it can read.
    // Routed as the request it announces, so a route with `method` answers its own.
    if let Some(announced) = cors::preflight_method(req.method(), req.headers())
        && let Some(r) = held
            .snapshot()
            .router
            .find(host, path, &announced, req.headers())
        && held.snapshot().router.get(r).cors.is_some()
    {
        // A refused address gets no answer about what the route accepts either.
        if !route_allows(conn, held.snapshot(), r, req.headers()) {
            record.route = Some(r);
            let denied = Error::AddressDenied { scope: "route" };
            return Ok(error_response(denied, record, held, None));
        }
        return Ok(answer_preflight(held, &req, r, record));
    }
    // Rate limit: the listener's limit covers everything it serves, checked before routing.
    if let Some(limit) = &conn.rate_limit
        && let Err(limited) = limit.check(start, conn.remote.ip(), req.headers())
    {
        record.grpc = tailguard_http::grpc::is_grpc(req.headers());
        return Ok(crate::respond::rate_limited(limited, record, held));
    }
    // Route. Matched once: admission (the route's group and class) and forwarding both use it.
    let route = held
        .snapshot()
        .router
        .find(host, path, req.method(), req.headers());
    if let Some(r) = route {
        record.trace_routed(&held.snapshot().tracing, r);
    }
    // CORS of an actual request: decided from its head now, applied to whatever answers it
    // below (the upstream, the route itself, an error), so a page can read a 429 or a 503.
    let cors_fields = route.and_then(|r| {
        let c = held.snapshot().router.get(r).cors.as_deref()?;
        Some(cors::Actual::of(c, req.headers()))
    });
    // Compression: what the request accepts, decided from its head now (the route's
    // `compress`, else its listener's); whether its response is compressed is decided when
    // the upstream's head comes.
    let compressing = route.and_then(|r| {
        let c = held
            .snapshot()
            .router
            .get(r)
            .compress
            .as_ref()
            .or(conn.compress.as_ref())?;
        let asked = compress::asked(c, req.method(), req.headers())?;
        Some((Arc::clone(c), asked))
    });
    let mut resp = 'answer: {
        // By address: the route's lists, before its rate limit (a refused client spends
        // none of it) and before anything that would ask for credentials.
        if let Some(r) = route
            && !route_allows(conn, held.snapshot(), r, req.headers())
        {
            record.route = Some(r);
            record.grpc = tailguard_http::grpc::is_grpc(req.headers());
            let denied = Error::AddressDenied { scope: "route" };
            break 'answer error_response(denied, record, held, None);
        }
        // Before local answers and admission: a limited request never counts against the
        // shedder or a breaker, and a route that answers by itself is limited too. Before
        // authentication unless its buckets are per consumer, so a flood of bad
        // credentials is limited before it costs a check.
        if let Some(r) = route
            && let Some(limit) = held.snapshot().rate_limits.route(r)
            && !limit.by_consumer()
            && let Err(limited) = limit.check(start, conn.remote.ip(), req.headers())
        {
            record.route = Some(r);
            record.grpc = tailguard_http::grpc::is_grpc(req.headers());
            break 'answer crate::respond::rate_limited(limited, record, held);
        }
        // Auth: before local answers (a route that answers by itself is protected too) and
        // admission (a refused request never counts against the shedder or a breaker).
        if let Some(r) = route
            && let Some(refusal) = authenticate(conn, &held, &mut req, r, &mut record).await
        {
            record.route = Some(r);
            record.grpc = tailguard_http::grpc::is_grpc(req.headers());
            break 'answer crate::respond::auth_refused(refusal, record, held);
        }
        // A route's limit per consumer, now that the consumer is known.
        if let Some(r) = route
            && let Some(limit) = held.snapshot().rate_limits.route(r)
            && limit.by_consumer()
            && let Err(limited) = limit.check_as(
                start,
                conn.remote.ip(),
                req.headers(),
                record.consumer.as_deref(),
            )
        {
            record.route = Some(r);
            record.grpc = tailguard_http::grpc::is_grpc(req.headers());
            break 'answer crate::respond::rate_limited(limited, record, held);
        }
        // Local answer.
        if let Some(r) = route
            && tailguard_policy::policy::answers_locally(held.snapshot().router.get(r))
        {
            break 'answer answer_locally(conn, held, req, r, record);
        }
        // Body: its first bytes, before an upstream is chosen.
        if let Err(e) = wait_for_body(held.snapshot(), &mut req, route, timer).await {
            record.route = route;
            record.grpc = tailguard_http::grpc::is_grpc(req.headers());
            break 'answer error_response(e, record, held, None);
        }
        // Admit.
        let mut admitted = match admission::admit(&held.snapshot().overload, route) {
            Ok(guard) => guard,
            Err(refused) => {
                // Only a routed request is refused: its metrics, log line and span name the
                // route it was shed from, as a rate-limited request's do.
                record.route = route;
                record.grpc = tailguard_http::grpc::is_grpc(req.headers());
                break 'answer refused.respond(error_response(
                    Error::Overloaded,
                    record,
                    held,
                    None,
                ));
            }
        };
        // Forward with retries, then respond (the record travels with the response body).
        // Branched once per request, on the upstream's protocol: an HTTP/2 upstream's
        // exchange is its own function (boxed, so the HTTP/1.1 path's future does not grow
        // by it).
        match route {
            Some(r) => {
                let snapshot = held.snapshot();
                if snapshot.upstreams[snapshot.router.get(r).upstream].protocol != Protocol::Http1 {
                    // Allocated before the future is made, so it is built in the box, not
                    // copied into it (see `tailguard_http1::server`'s request turn).
                    let h2 = Box::write(
                        Box::new_uninit(),
                        serve_h2(conn, held, req, r, record, admitted),
                    );
                    break 'answer Box::into_pin(h2).await;
                }
            }
            None => record.grpc = tailguard_http::grpc::is_grpc(req.headers()),
        }
        // Not boxed: the HTTP/1.1 connection awaits this future in place, in its own task's
        // state, so it is never moved once running (hyper's server moved each request's
        // future into its slot, which is why it was boxed before). Its ~2 KB is written
        // once.
        let forwarding =
            crate::forward::forward(held.snapshot(), conn, req, route, &mut record, timer);
        match forwarding.await {
            Ok((resp, first)) => {
                admitted.served();
                let (parts, body) = resp.into_parts();
                record.status = parts.status.as_u16();
                let finish = Finish {
                    record,
                    held,
                    upstream_conn: None,
                    _admitted: Some(admitted),
                };
                Response::from_parts(parts, ResponseBody::upstream(first, body, Some(finish)))
            }
            Err(e) => {
                if matches!(
                    e,
                    Error::UpstreamTimeout {
                        phase: "request",
                        ..
                    }
                ) {
                    admitted.timed_out();
                }
                error_response(e, record, held, Some(admitted))
            }
        }
    };
    if let Some((c, asked)) = &compressing {
        apply_compress(c, *asked, &mut resp);
    }
    if let Some(fields) = &cors_fields {
        apply_cors(fields, &mut resp);
    }
    Ok(resp)
}

/// Whether `list` lets the request's client in: the connection's peer, or, from a peer in
/// `trusted_proxies`, the client address its `X-Forwarded-For` names
/// (`tailguard_policy::access::client_ip`; read only here, for a list that needs it).
fn address_allowed(
    list: &AccessList,
    conn: &ConnCtx,
    snapshot: &Snapshot,
    headers: &http::HeaderMap,
) -> bool {
    list.allows(access::client_ip(
        conn.remote.ip(),
        conn.client.trusted,
        headers,
        &snapshot.trusted_proxies,
    ))
}

/// Whether route `r`'s `allow` / `deny` (if any) let the request's client in.
fn route_allows(conn: &ConnCtx, snapshot: &Snapshot, r: usize, headers: &http::HeaderMap) -> bool {
    snapshot
        .router
        .get(r)
        .access
        .as_deref()
        .is_none_or(|list| address_allowed(list, conn, snapshot, headers))
}

/// Runs route `route`'s `auth`, if it has one: the client's copies of the headers its
/// authenticators set are removed, then each is asked until one accepts. Accepted: the
/// request changed as the authenticator says (its claims set, its credential removed) and
/// the consumer noted in the record; refused: the answer to give. A credential in the query
/// is taken out of the logged target either way (`tailguard_auth::Gate::redact`).
async fn authenticate(
    conn: &ConnCtx,
    held: &Held,
    req: &mut Request<RequestBody>,
    route: usize,
    record: &mut RequestRecord,
) -> Option<tailguard_auth::Refusal> {
    use tailguard_auth::{AuthRequest, AuthResult, Check, Decision};
    let snapshot = held.snapshot();
    let gate = snapshot.auth.route(route)?;
    gate.remove_client_copies(req.headers_mut());
    let ask = AuthRequest {
        method: req.method(),
        uri: req.uri(),
        headers: req.headers(),
        peer: conn.remote,
        client: access::client_ip(
            conn.remote.ip(),
            conn.client.trusted,
            req.headers(),
            &snapshot.trusted_proxies,
        ),
        tls: conn.tls,
        route: &snapshot.router.get(route).id,
    };
    let decision = match gate.check(ask) {
        Check::Ready(d) => d,
        Check::Pending(p) => p.await,
    };
    if let Some(redacted) = gate.redact(req.uri()) {
        record.uri = redacted;
    }
    match decision {
        Decision::Accepted { accepted, .. } => {
            let mut uri = std::mem::take(req.uri_mut());
            accepted.apply(&mut uri, req.headers_mut());
            *req.uri_mut() = uri;
            record.consumer = accepted.consumer;
            record.auth_result = Some(AuthResult::Ok);
            None
        }
        Decision::Refused { refusal, .. } => Some(refusal),
    }
}

/// Decides an upstream's response's compression (`tailguard_policy::compress::respond`)
/// and, when compressed, has its body go through an encoder. An HTTP/1.1 upstream's fields
/// kept as lines are moved into the map first: the skip rules read several of them and the
/// fields change. A local answer or an error's is never compressed.
fn apply_compress(
    c: &compress::Compress,
    asked: compress::Asked,
    resp: &mut Response<ResponseBody>,
) {
    use tailguard_http1::server::OutgoingBody as _;
    if !resp.body().is_upstream() {
        return;
    }
    if resp.body().raw_fields().is_some() {
        let mut map = std::mem::take(resp.headers_mut());
        resp.body_mut().fields_into(&mut map);
        *resp.headers_mut() = map;
    }
    let length = http_body::Body::size_hint(resp.body())
        .exact()
        .or_else(|| compress::length_of(resp.headers()));
    let mut decision = compress::decide(c, asked, resp.status(), resp.headers(), length);
    if let compress::Decision::Compress(how) = decision {
        let algorithm = match how.coding {
            compress::Coding::Gzip => tailguard_compress::Algorithm::Gzip,
            compress::Coding::Br => tailguard_compress::Algorithm::Br,
            compress::Coding::Zstd => tailguard_compress::Algorithm::Zstd,
        };
        match tailguard_compress::Encoder::new(algorithm, c.level(how.coding), length) {
            Ok(encoder) => resp.body_mut().compress(encoder, how.flush),
            Err(e) => {
                // zstd could not make its context (out of memory): sent as it is.
                tracing::warn!(target: "tailguard::request", "no encoder: {e}");
                decision = compress::Decision::Vary;
            }
        }
    }
    compress::rewrite(resp.headers_mut(), decision);
}

/// Writes an actual request's CORS fields into its response. An HTTP/1.1 upstream's fields
/// may still be lines to be written as they are: moved into the map only when CORS fields
/// among them must be replaced.
fn apply_cors(fields: &cors::Actual, resp: &mut Response<ResponseBody>) {
    use tailguard_http1::server::OutgoingBody as _;
    if resp
        .body()
        .raw_fields()
        .is_some_and(|raw| fields.must_see(raw))
    {
        let mut map = std::mem::take(resp.headers_mut());
        resp.body_mut().fields_into(&mut map);
        *resp.headers_mut() = map;
    }
    let mut headers = std::mem::take(resp.headers_mut());
    fields.apply(&mut headers, resp.body().raw_fields());
    *resp.headers_mut() = headers;
}

/// Answers a CORS preflight of route `route_index` (`204`, the CORS fields when the route
/// allows what it asks, none when not). Counted and logged like any request.
fn answer_preflight(
    held: Held,
    req: &Request<RequestBody>,
    route_index: usize,
    mut record: Box<RequestRecord>,
) -> Response<ResponseBody> {
    record.route = Some(route_index);
    record.trace_answered_locally();
    let mut headers = http::HeaderMap::new();
    if let Some(c) = held.snapshot().router.get(route_index).cors.as_deref() {
        cors::preflight(c, req.headers(), &mut headers);
    }
    record.status = StatusCode::NO_CONTENT.as_u16();
    let mut resp = Response::new(ResponseBody::empty(Some(Finish {
        record,
        held,
        upstream_conn: None,
        _admitted: None,
    })));
    *resp.status_mut() = StatusCode::NO_CONTENT;
    *resp.headers_mut() = headers;
    resp
}

/// Waits for the first bytes (or the end) of a request's body before an upstream is chosen
/// (nginx's `proxy_request_buffering`, for the first bytes only: the body then streams), so
/// a client that opens requests and never sends their bodies holds no upstream connection
/// and no admission slot. `timeouts.body_ms` at most: then `408` (counted in
/// `tailguard_downstream_refused_total{reason="body_timeout"}`). Not for a request without a
/// body, an unrouted one (its `404` needs no body), or a route that streams
/// (`stream_request`, and every gRPC call: a client stream may send its first message
/// after the server's).
async fn wait_for_body(
    snapshot: &crate::snapshot::Snapshot,
    req: &mut Request<RequestBody>,
    route: Option<usize>,
    timer: &mut LazyTimer,
) -> Result<(), Error> {
    use http_body::Body as _;
    let Some(r) = route else {
        return Ok(());
    };
    // A request forwarding refuses anyway (a declared body over `limits.body_bytes`: its
    // `413` goes out without `100 Continue`, so its body may never come) is not waited for.
    if req.body().is_end_stream()
        || snapshot.router.get(r).tries.stream_request
        || grpc::is_grpc(req.headers())
        || check_forwardable(&snapshot.config.limits, req).is_err()
    {
        return Ok(());
    }
    let body = req.body_mut();
    let first = std::future::poll_fn(|cx| body.poll_first(cx));
    let waited = match snapshot.config.timeouts.body_ms {
        0 => Some(first.await),
        ms => {
            let deadline = tokio::time::Instant::now() + std::time::Duration::from_millis(ms);
            timer.limit(deadline, first).await
        }
    };
    // The HTTP/1.1 engine times a body's reads itself (the same `body_ms`): its timeout
    // comes as the body's error, and is the same refusal.
    let result = waited.unwrap_or(Err(Error::DownstreamTimeout { phase: "body" }));
    if let Err(Error::DownstreamTimeout { .. }) = result {
        snapshot
            .metrics
            .gateway
            .refused(crate::metrics::Refusal::BodyTimeout);
    }
    result
}

/// Serves a request routed to an HTTP/2 upstream, from its routed head to the response
/// head (the body then streams).
async fn serve_h2(
    conn: &Arc<ConnCtx>,
    held: Held,
    req: Box<Request<RequestBody>>,
    route: usize,
    mut record: Box<RequestRecord>,
    mut admitted: AdmitGuard,
) -> Response<ResponseBody> {
    record.grpc = grpc::is_grpc(req.headers());
    let forwarded =
        crate::forward_h2::forward(held.snapshot(), conn, req, route, &mut record).await;
    match forwarded {
        Ok(resp) => {
            admitted.served();
            let (parts, body) = resp.into_parts();
            record.status = parts.status.as_u16();
            if record.grpc {
                // A trailers-only answer carries its status in the head.
                record.grpc_status = grpc::status(&parts.headers);
            }
            let finish = Finish {
                record,
                held,
                upstream_conn: None,
                _admitted: Some(admitted),
            };
            Response::from_parts(parts, ResponseBody::upstream_h2(body, Some(finish)))
        }
        Err(e) => {
            if matches!(
                e,
                Error::UpstreamTimeout {
                    phase: "request",
                    ..
                }
            ) {
                admitted.timed_out();
            }
            error_response(e, record, held, Some(admitted))
        }
    }
}

/// Answers a request routed to a route that answers by itself. Called right after
/// routing, before admission: the answer costs less than a shed request's `503` would, and
/// it never reaches an upstream, whose limits and breakers admission guards. It is counted
/// (`tailguard_requests_total` with its route) and logged like any request.
fn answer_locally(
    conn: &ConnCtx,
    held: Held,
    mut req: Box<Request<RequestBody>>,
    route_index: usize,
    mut record: Box<RequestRecord>,
) -> Response<ResponseBody> {
    record.route = Some(route_index);
    record.trace_answered_locally();
    // Refused as a forwarded request would be (a 2xx answer to a CONNECT would tell the
    // client it has a tunnel).
    if let Err(e) = check_forwardable(&held.snapshot().config.limits, &req) {
        return error_response(e, record, held, None);
    }
    let logged = !held.access_log().is_off();
    let resp = {
        let route = held.snapshot().router.get(route_index);
        let Some(p) = route.policy.as_deref() else {
            return error_response(Error::NoRoute, record, held, None);
        };
        let mut vars = tailguard_policy::policy::Vars::capture(route, &req);
        if logged || p.needs_request_id {
            let id = headers::request_id(req.headers_mut()).clone();
            if logged {
                record.request_id = Some(id.clone());
            }
            vars.request_id = Some(id);
        }
        let mut resp = tailguard_policy::policy::local_response(p, &req);
        tailguard_policy::policy::on_response(route, resp.headers_mut(), &conn.client, &vars);
        resp
    };
    record.status = resp.status().as_u16();
    let (parts, body) = resp.into_parts();
    let finish = Some(Finish {
        record,
        held,
        upstream_conn: None,
        _admitted: None,
    });
    let body = match body {
        Some(b) => ResponseBody::local(b, finish),
        None => ResponseBody::empty(finish),
    };
    Response::from_parts(parts, body)
}
