//! Forwarding to an HTTP/1.1 upstream: the checks every forwarded request passes, the head
//! rewritten for the upstream (hop-by-hop fields, forwarding fields, the route's policy),
//! the body under its limit, the exchange on a pooled connection (with its one connect
//! retry, or the route's own retries: [`crate::retry`]), the outcome told to the balancer,
//! ejection and breaker, and the response head made ready for the client (a WebSocket's
//! `101` turned into a tunnel).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::FutureExt as _;
use http::header::{CONNECTION, HOST, UPGRADE, VIA};
use http::uri::PathAndQuery;
use http::{HeaderValue, Method, Request, Response, StatusCode, Uri, Version};
use http_body::{Body as _, Frame};
use http_body_util::BodyExt as _;
use tailguard_http1::client::{self, SendError};
use tailguard_http1::server::OnUpgrade;
use tailguard_http1::timer::LazyTimer;
use tokio::io::AsyncWriteExt as _;

/// An upstream response whose body streams from its connection.
type UpstreamBody = client::UpstreamBody<RequestBody>;

use tailguard_config::Limits;
use tailguard_http::body::RequestBody;
use tailguard_http::error::Error;
use tailguard_http::headers;
use tailguard_http::recycle;
use tailguard_policy::route::Route;
use tailguard_upstream::balance::Outcome;
use tailguard_upstream::pool::EndpointPool;

use crate::conn::ConnCtx;
use crate::record::RequestRecord;
use crate::retry::retry_endpoint;
use crate::snapshot::Snapshot;

/// What a request passes before it goes to any upstream, whatever the upstream's protocol:
/// a head within `limits.header_bytes`, not a CONNECT, a declared body within
/// `limits.body_bytes`.
pub(crate) fn check_forwardable<B: http_body::Body>(
    limits: &Limits,
    req: &Request<B>,
) -> Result<(), Error> {
    if head_bytes(req) > limits.header_bytes {
        return Err(Error::HeadersTooLarge);
    }
    // Forwarded, a CONNECT would reach the upstream as `CONNECT /` (its target has no path),
    // and a 2xx answer would leave the client believing it has a tunnel. (An HTTP/1.1
    // CONNECT never gets here: its connection refuses it and closes; this is HTTP/2's.)
    if req.method() == Method::CONNECT {
        return Err(Error::ConnectUnsupported);
    }
    // The declared length, as the connection parsed it (HTTP/1.1 keeps no framing field;
    // HTTP/2's `content-length` is checked against its DATA by the h2 layer).
    let declared = if req.body().is_end_stream() {
        None
    } else {
        req.body().size_hint().exact()
    };
    if declared.is_some_and(|n| n > limits.body_bytes) {
        return Err(Error::BodyTooLarge);
    }
    Ok(())
}

/// Puts the request body under `limit` (streamed bytes counted, 413 past it) and lets the
/// record count what it reads, for either protocol's forwarding.
pub(crate) fn limit_request_body(
    req: &mut Request<RequestBody>,
    limit: u64,
    record: &mut RequestRecord,
) {
    let count = (!req.body().is_end_stream()).then(|| Arc::new(AtomicU64::new(0)));
    record.bytes_in = count.clone();
    req.body_mut().limit(limit, count);
}

/// Bytes of the request head as a limit sees them (request line and header lines).
pub(crate) fn head_bytes<B>(req: &Request<B>) -> usize {
    let line = req.method().as_str().len()
        + req.uri().path_and_query().map_or(1, |p| p.as_str().len())
        + 12;
    req.headers()
        .iter()
        .fold(line, |n, (k, v)| n + k.as_str().len() + v.len() + 4)
}

/// The forwarding stage for an HTTP/1.1 upstream: from the routed head to the upstream's
/// response head (checked, rewritten, sent under the route's timeouts and retries), and the
/// first frame of a small body read ahead.
pub(crate) async fn forward(
    snap: &Snapshot,
    conn: &ConnCtx,
    mut req: Box<Request<RequestBody>>,
    route: Option<usize>,
    record: &mut RequestRecord,
    timer: &mut LazyTimer,
) -> Result<(Response<UpstreamBody>, Option<Frame<Bytes>>), Error> {
    let limits = &snap.config.limits;
    check_forwardable(limits, &req)?;
    let route_index = route.ok_or(Error::NoRoute)?;
    record.route = Some(route_index);
    let route = snap.router.get(route_index);
    let upstream = &snap.upstreams[route.upstream];
    let endpoint_index = upstream.pick_endpoint()?;
    snap.metrics.picked(route.upstream, endpoint_index);
    let endpoint = &upstream.endpoints[endpoint_index];
    record.endpoint = Some((route.upstream, endpoint_index));

    // An HTTP/1.1 upgrade (WebSocket): its `Upgrade` and `Connection: upgrade` go upstream,
    // and a `101` answer turns both connections into one tunnel.
    // (HTTP/2 has no such upgrade: its requests carry no `OnUpgrade`.)
    // The connection attaches `OnUpgrade` only to a request that sent `Upgrade`: looked at
    // first, so the usual request pays no header lookup.
    let upgrade = req
        .extensions_mut()
        .remove::<OnUpgrade>()
        .and_then(|on| Some((headers::upgrade_requested(&req)?, on)));
    let version = req.version();
    let mut vars = tailguard_policy::policy::Vars::capture(route, &req);
    let headers = req.headers_mut();
    headers::remove_hop_by_hop(headers);
    if let Some((protocol, _)) = &upgrade {
        headers.insert(UPGRADE, protocol.clone());
        headers.insert(CONNECTION, HeaderValue::from_static("upgrade"));
    }
    if let Some(host) = &route.host_rewrite {
        headers.insert(HOST, host.clone());
    } else if !headers.contains_key(HOST) {
        // HTTP/2 carries the host in `:authority`; HTTP/1.1 upstreams need it as `Host`
        // (an HTTP/1.0 request may have neither: then the endpoint's address, as curl sends).
        let host = req
            .uri()
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
            .unwrap_or_else(|| endpoint.host.clone());
        req.headers_mut().insert(HOST, host);
    }
    // The gateway's own fields (forwarding, `Via`, the request id): as lines the HTTP/1.1
    // client writes into the head, or, for a request that carries some of them, from a
    // trusted peer, or on a route with header operations (which may read or change them),
    // into the map.
    let lines = if route.policy.is_none() {
        headers::ForwardingLines::for_request(req.headers(), &conn.client, version)
    } else {
        None
    };
    match &lines {
        Some(lines) => {
            // Kept only for the access log, its one reader.
            if !conn.access_log.is_off() {
                record.request_id = lines.request_id(req.headers());
            }
        }
        None => {
            let headers = req.headers_mut();
            let id = headers::request_id(headers);
            if !conn.access_log.is_off() {
                record.request_id = Some(id.clone());
            }
            headers::add_forwarding(headers, &conn.client, version);
        }
    }
    let gateway_lines = lines
        .as_ref()
        .map_or([&[][..]; 3], |lines| lines.parts(&conn.client));
    tailguard_policy::policy::on_request(route, &mut req, &conn.client, &mut vars);
    // Origin form on the wire (`GET /path?q HTTP/1.1`): the connection already says where.
    if req.uri().scheme().is_some() || req.uri().authority().is_some() {
        let path = req
            .uri()
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static("/"));
        *req.uri_mut() = Uri::from(path);
    }
    *req.version_mut() = Version::HTTP_11;

    limit_request_body(&mut req, limits.body_bytes, record);

    let breaker = snap.overload.dispatch(route_index)?;
    snap.overload.count_request(route.upstream);
    let dispatched = Instant::now();
    let waiting = snap.metrics.gateway.upstream_dispatched();
    // Boxed since its head was parsed: the request moves as a pointer through the exchange,
    // the client and its body writer, instead of ~300 bytes copied into each future.
    let request = req;
    let request_timeout = route.tries.request_timeout(snap.request_timeout);
    let connect_timeout = route
        .tries
        .connect_timeout(endpoint.pool.settings().connect_timeout);
    // The exchange future is built inside each arm, not bound before the match: a binding
    // would keep its ~2 KB slot in this future's state beside the `Timeout` holding it.
    // The third value is when the last try started (a route's `retry` may make several).
    let (result, endpoint_index, last_try) = match (&route.tries.retry, request_timeout) {
        // Boxed: the plain exchange's future does not grow by the retry loop. (Allocated
        // first, so the future is built in the box rather than copied into it.)
        (Some(policy), _) => {
            let retried = Box::write(
                Box::new_uninit(),
                crate::retry::exchange_http1(
                    snap,
                    route,
                    policy,
                    endpoint_index,
                    request,
                    dispatched,
                    timer,
                    record,
                    request_timeout,
                    connect_timeout,
                    &gateway_lines,
                ),
            );
            Box::into_pin(retried).await
        }
        (None, Some(limit)) => {
            let deadline = tokio::time::Instant::from_std(dispatched + limit);
            let limited = {
                let sent = std::pin::pin!(exchange(
                    snap,
                    route,
                    endpoint_index,
                    request,
                    dispatched,
                    connect_timeout,
                    record,
                    &gateway_lines,
                ));
                timer.limit(deadline, sent).await
            };
            match limited {
                Some((r, e)) => (r, e, dispatched),
                None => (
                    // A client still sending its body is the slow one (408), not the
                    // upstream waiting for it.
                    Err(match &record.bytes_in {
                        Some(count) if !tailguard_http::body::body_ended(count) => {
                            Error::DownstreamTimeout { phase: "request" }
                        }
                        _ => Error::UpstreamTimeout {
                            addr: endpoint.addr,
                            phase: "request",
                        },
                    }),
                    // A retry that timed out was on another endpoint; the record names the
                    // first (the rare case of a retry is in the log line's reason).
                    endpoint_index,
                    dispatched,
                ),
            }
        }
        (None, None) => {
            let sent = exchange(
                snap,
                route,
                endpoint_index,
                request,
                dispatched,
                connect_timeout,
                record,
                &gateway_lines,
            );
            let (r, e) = sent.await;
            (r, e, dispatched)
        }
    };
    let endpoint = &upstream.endpoints[endpoint_index];
    record.endpoint = Some((route.upstream, endpoint_index));
    let elapsed = dispatched.elapsed();
    drop(waiting);
    record.upstream_time = Some(elapsed);
    // The try's span ends at the moment just read (one clock read for both).
    let answered = dispatched + elapsed;
    match &result {
        Ok(r) => record.trace_try_ended(Some(r.status().as_u16()), None, answered),
        Err(e) => record.trace_try_ended(None, Some(e.kind()), answered),
    }
    let outcome = match &result {
        Ok(r) => Outcome::Status(r.status().as_u16()),
        Err(Error::UpstreamConnect { .. } | Error::UpstreamTls { .. }) => Outcome::ConnectFailed,
        Err(Error::UpstreamTimeout { .. }) => Outcome::Timeout,
        Err(Error::UpstreamBroken { .. }) => Outcome::Broken,
        Err(_) => Outcome::Aborted,
    };
    // The pick's own time: a retried request's last try, not the whole exchange.
    let try_elapsed = elapsed.saturating_sub(last_try.saturating_duration_since(dispatched));
    upstream
        .balance
        .complete(endpoint_index, outcome, try_elapsed);
    upstream.record(endpoint_index, outcome);
    breaker.finish(outcome);

    let mut resp = result?;
    resp.body_mut()
        .set_read_timeout(route.tries.read_timeout(snap.read_timeout));
    record.upstream_status = Some(resp.status().as_u16());
    if let Some((_, downstream)) = upgrade
        && resp.status() == StatusCode::SWITCHING_PROTOCOLS
    {
        let protocol = resp.headers().get(UPGRADE).cloned();
        if let Some(upstream_side) = resp.body_mut().take_upgraded() {
            tokio::spawn(tunnel(downstream, upstream_side, endpoint.addr));
        }
        headers::remove_hop_by_hop(resp.headers_mut());
        if let Some(protocol) = protocol {
            resp.headers_mut().insert(UPGRADE, protocol);
        }
        resp.headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("upgrade"));
        // The upstream connection now belongs to the tunnel, never to the pool.
        return Ok((resp, None));
    }
    let first = if !read_ahead_wanted(resp.body()) {
        None
    } else if let Some(frame) = resp.body_mut().frame().now_or_never() {
        // Usually the body came in the head's read: taken without arming a timer.
        frame.transpose()?
    } else {
        let frame = resp.body_mut().frame();
        match request_timeout {
            Some(limit) => {
                let deadline = tokio::time::Instant::from_std(last_try + limit);
                timer
                    .limit(deadline, frame)
                    .await
                    .ok_or(Error::UpstreamTimeout {
                        addr: endpoint.addr,
                        phase: "request",
                    })?
                    .transpose()?
            }
            None => frame.await.transpose()?,
        }
    };
    // The response's own fields may still be lines for an HTTP/1.1 writer; hyper's HTTP/2
    // server takes a map. (Split only then: moving the parts costs copies.)
    if version == Version::HTTP_2 {
        let (mut parts, mut body) = resp.into_parts();
        body.fields_into(&mut parts.headers);
        resp = Response::from_parts(parts, body);
    }
    headers::remove_hop_by_hop(resp.headers_mut());
    let via = headers::via_value(resp.version());
    resp.headers_mut().append(VIA, via);
    tailguard_policy::policy::on_response_h1(route, &mut resp, &conn.client, &vars);
    Ok((resp, first))
}

/// Copies bytes both ways between an upgraded client connection and the upstream
/// connection that answered `101` until either side closes (a WebSocket).
async fn tunnel(downstream: OnUpgrade, upstream: Box<client::Connection>, addr: SocketAddr) {
    let Some(mut client) = downstream.connection().await else {
        tracing::debug!(upstream = %addr, "upgrade failed: the client connection ended");
        return;
    };
    let (mut server, prelude, _open) = (*upstream).into_upgraded();
    // What the upstream sent right behind its 101 head is the tunnel's first bytes.
    if !prelude.is_empty()
        && let Err(e) = client.write_all(&prelude).await
    {
        tracing::debug!(upstream = %addr, "upgraded connection ended: {e}");
        return;
    }
    match tokio::io::copy_bidirectional(&mut client, &mut server).await {
        Ok((up, down)) => {
            tracing::debug!(upstream = %addr, up, down, "upgraded connection closed");
        }
        Err(e) => tracing::debug!(upstream = %addr, "upgraded connection ended: {e}"),
    }
}

/// Sends a request to endpoint `first` of upstream `upstream_index` on a pooled connection
/// (or a new one) and waits for the response head; returns the endpoint that answered.
///
/// Two failures are safe to retry because the request was not written:
/// - an idle connection the upstream closed as it was taken: once more, on a new connection
///   to the same endpoint;
/// - a failed connect: once, on another endpoint, if the request is idempotent, has no body,
///   and the upstream's retry budget (10 % of its requests plus a floor) allows it, so
///   retries cannot multiply the load on an upstream that is failing (counted and logged as
///   a retry of the route; a route with `retry` has its own loop, `crate::retry`).
///
/// New connections are made within `connect` (the route's or the global connect timeout).
/// `gateway_lines`: the gateway's own fields as lines, if the request takes them so.
#[allow(clippy::too_many_arguments)]
async fn exchange(
    snap: &Snapshot,
    route: &Route,
    first: usize,
    req: Box<Request<RequestBody>>,
    now: Instant,
    connect: Option<Duration>,
    record: &mut RequestRecord,
    gateway_lines: &[&[u8]; 3],
) -> (Result<Response<UpstreamBody>, Error>, usize) {
    let upstream_index = route.upstream;
    let upstream = &snap.upstreams[upstream_index];
    let pool = &upstream.endpoints[first].pool;
    let mut req = req;
    let traceparent = record.trace_try_started_h1(req.headers_mut(), (upstream_index, first), now);
    let (conn, reused) = match pool.checkout_within(now, connect).await {
        Ok(checked_out) => checked_out,
        Err(e) => {
            let e = Error::from(e);
            let retry_on = retry_endpoint(snap, upstream_index, first, &req, &e);
            let Some(next) = retry_on else {
                return (Err(e), first);
            };
            let failed = Instant::now();
            record.trace_try_ended(None, Some(e.kind()), failed);
            crate::retry::note_connect_retry(snap, route, first, &e, record);
            let traceparent =
                record.trace_try_started_h1(req.headers_mut(), (upstream_index, next), failed);
            upstream
                .balance
                .complete(first, Outcome::ConnectFailed, now.elapsed());
            upstream.record(first, Outcome::ConnectFailed);
            tracing::debug!(
                target: "tailguard::request",
                upstream = %upstream.name,
                failed = %pool.addr(),
                retry = %upstream.endpoints[next].addr,
                "connect failed, retrying on another endpoint: {e}"
            );
            let next_pool = &upstream.endpoints[next].pool;
            let sent = async {
                let (conn, reused) = next_pool.checkout_within(now, connect).await?;
                let extra = crate::record::head_lines(gateway_lines, &traceparent);
                send_once(conn, req, reused, next_pool, connect, &extra).await
            };
            return (Box::pin(sent).await, next);
        }
    };
    let extra = crate::record::head_lines(gateway_lines, &traceparent);
    (
        send_once(conn, req, reused, pool, connect, &extra).await,
        first,
    )
}

/// Sends `req` on `conn` (with the `extra` field lines) and waits for the response head; if
/// `conn` was an idle connection the upstream had closed, sends it once more on a new
/// connection.
async fn send_once(
    conn: Box<client::Connection>,
    req: Box<Request<RequestBody>>,
    reused: bool,
    pool: &EndpointPool,
    connect: Option<Duration>,
    extra: &[&[u8]],
) -> Result<Response<UpstreamBody>, Error> {
    match client::send(conn, req, reused, extra).await {
        Ok(sent) => Ok(answered(sent)),
        // A request with a body is not kept here: only a route's `retry` keeps one.
        Err(SendError::Failed(e) | SendError::StaleSent(e)) => Err(e.into()),
        Err(SendError::Stale(req)) => {
            let resend = async {
                let conn = pool.connect_within(connect).await?;
                match client::send(conn, req, false, extra).await {
                    Ok(sent) => Ok(answered(sent)),
                    Err(SendError::Failed(e) | SendError::StaleSent(e)) => Err(e.into()),
                    Err(SendError::Stale(_)) => Err(Error::UpstreamBroken {
                        addr: pool.addr(),
                        reason: "connection closed before a response".to_string(),
                    }),
                }
            };
            // Boxed: only the rare resend pays for its future's size.
            Box::pin(resend).await
        }
    }
}

/// The response; a request sent whole already gives its containers to the thread's next
/// request.
fn answered((resp, sent): client::Sent<RequestBody>) -> Response<UpstreamBody> {
    if let Some(req) = sent {
        recycle::give_request(req);
    }
    resp
}

/// Bodies up to this size are read ahead (one frame) before the response head is sent.
const READ_AHEAD_BYTES: u64 = 64 * 1024;

/// Whether to wait for the body's first frame before the response head is handed to hyper:
/// for a small body of known length, so that head and body leave in one write (one syscall,
/// one TCP segment) instead of two; nginx's proxy buffering does the same. Streams of
/// unknown length (SSE, long polls) are never held back: their head goes out at once.
fn read_ahead_wanted(body: &UpstreamBody) -> bool {
    body.size_hint()
        .exact()
        .is_some_and(|n| n > 0 && n <= READ_AHEAD_BYTES)
}
