//! Forwarding to an HTTP/2 upstream (`protocol = "h2c"` or `"h2"`), gRPC included: the
//! request made an HTTP/2 request whatever the client spoke, sent as a stream of one of the
//! endpoint's multiplexed connections, and the response streamed back frame by frame,
//! trailers included.
//!
//! gRPC calls are served as gRPC expects of a proxy: nothing read ahead or buffered (a
//! bidirectional stream gets each message across as it comes), `grpc-timeout` honoured
//! (the response head must come within the earlier of it and `timeouts.request_ms`, and the
//! whole call within it; past it the client gets `DEADLINE_EXCEEDED`), no `timeouts.read_ms`
//! between a stream's messages (a long-lived stream may be quiet for minutes), and every
//! error the gateway makes answered with a `grpc-status`.

use std::time::Instant;

use http::header::{HOST, TE, VIA};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{HeaderValue, Request, Response, Uri, Version};
use tailguard_config::Protocol;
use tailguard_http::body::{H2Body, RequestBody};
use tailguard_http::error::Error;
use tailguard_http::grpc;
use tailguard_http::headers;
use tailguard_http1::server::OnUpgrade;
use tailguard_upstream::balance::Outcome;

use crate::conn::ConnCtx;
use crate::forward::{check_forwardable, limit_request_body};
use crate::record::RequestRecord;
use crate::retry::retry_endpoint;
use crate::snapshot::Snapshot;

/// The request's `:authority` upstream: the route's `host_rewrite`, else what the client
/// named (`:authority` or `Host`), else the endpoint's name (or address) and port.
fn authority(
    rewrite: Option<&HeaderValue>,
    req: &Request<RequestBody>,
    endpoint: &tailguard_upstream::upstream::Endpoint<RequestBody>,
) -> Authority {
    let named = rewrite
        .or_else(|| req.headers().get(HOST))
        .and_then(|h| Authority::try_from(h.as_bytes()).ok());
    named
        .or_else(|| req.uri().authority().cloned())
        .or_else(|| Authority::try_from(endpoint.host.as_bytes()).ok())
        .unwrap_or_else(|| endpoint.authority.clone())
}

/// The forwarding stage for an HTTP/2 upstream: from the routed head to the upstream's
/// response head, its body under the call's deadline (gRPC) or the read timeout.
pub(crate) async fn forward(
    snap: &Snapshot,
    conn: &ConnCtx,
    mut req: Box<Request<RequestBody>>,
    route_index: usize,
    record: &mut RequestRecord,
) -> Result<Response<H2Body>, Error> {
    let limits = &snap.config.limits;
    check_forwardable(limits, &req)?;
    record.route = Some(route_index);
    let route = snap.router.get(route_index);
    let upstream = &snap.upstreams[route.upstream];
    let mut endpoint_index = upstream.pick_endpoint()?;
    snap.metrics.picked(route.upstream, endpoint_index);
    record.endpoint = Some((route.upstream, endpoint_index));

    // HTTP/2 has no `Upgrade`: a WebSocket handshake reaches the upstream as a plain GET.
    req.extensions_mut().remove::<OnUpgrade>();
    let grpc_timeout = if record.grpc {
        grpc::timeout(req.headers())
    } else {
        None
    };
    // `TE: trailers` is the one `TE` HTTP/2 allows, and gRPC servers ask for it: kept
    // where the client sent it.
    let te_trailers = req.headers().get_all(TE).iter().any(|v| {
        v.as_bytes()
            .split(|&b| b == b',')
            .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"trailers"))
    });
    let version = req.version();
    let mut vars = tailguard_policy::policy::Vars::capture(route, &req);
    let authority = authority(
        route.host_rewrite.as_ref(),
        &req,
        &upstream.endpoints[endpoint_index],
    );
    let headers = req.headers_mut();
    headers::remove_hop_by_hop(headers);
    if te_trailers {
        headers.insert(TE, HeaderValue::from_static("trailers"));
    }
    // HTTP/2 says the host in `:authority` (RFC 9113 §8.3.1).
    headers.remove(HOST);
    let id = headers::request_id(headers);
    if !conn.access_log.is_off() {
        record.request_id = Some(id.clone());
    }
    headers::add_forwarding(headers, &conn.client, version);
    tailguard_policy::policy::on_request(route, &mut req, &conn.client, &mut vars);
    let scheme = match upstream.protocol {
        Protocol::H2 => Scheme::HTTPS,
        _ => Scheme::HTTP,
    };
    let path = req
        .uri()
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| PathAndQuery::from_static("/"));
    *req.uri_mut() = Uri::builder()
        .scheme(scheme)
        .authority(authority)
        .path_and_query(path)
        .build()
        .map_err(|_| Error::BadRequest("request target"))?;
    *req.version_mut() = Version::HTTP_2;

    limit_request_body(&mut req, limits.body_bytes, record);

    let breaker = snap.overload.dispatch(route_index)?;
    snap.overload.count_request(route.upstream);
    let dispatched = Instant::now();
    let waiting = snap.metrics.gateway.upstream_dispatched();
    // The head must come within `timeouts.request_ms` and the call's own deadline.
    let request_timeout = route.tries.request_timeout(snap.request_timeout);
    let head_limit = match (request_timeout, grpc_timeout) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let connect = route.tries.h2_connect();
    // A route with `retry` takes its own loop: `request_ms` bounds each try, the call's
    // deadline all of them. Boxed, as on HTTP/1.1.
    let mut last_try = dispatched;
    let result = if let Some(policy) = &route.tries.retry {
        let retried = Box::write(
            Box::new_uninit(),
            crate::retry::exchange_h2(
                snap,
                route,
                policy,
                endpoint_index,
                *req,
                dispatched,
                record,
                request_timeout,
                grpc_timeout.map(|t| dispatched + t),
            ),
        );
        let retried = Box::into_pin(retried);
        let (result, endpoint, started) = retried.await;
        endpoint_index = endpoint;
        last_try = started;
        result
    } else {
        record.trace_try_started(
            req.headers_mut(),
            (route.upstream, endpoint_index),
            dispatched,
        );
        let exchange = async {
            let mut pool = upstream.endpoints[endpoint_index]
                .h2
                .as_ref()
                .expect("an HTTP/2 upstream's endpoints have HTTP/2 pools");
            let (send, stream) = match crate::retry::h2_stream(pool, connect).await {
                Ok(taken) => taken,
                Err(e) => {
                    // Nothing was sent: as on HTTP/1.1, once more on another endpoint if the
                    // request may be retried.
                    let Some(next) = retry_endpoint(snap, route.upstream, endpoint_index, &req, &e)
                    else {
                        return Err(e);
                    };
                    let failed = Instant::now();
                    record.trace_try_ended(None, Some(e.kind()), failed);
                    crate::retry::note_connect_retry(snap, route, endpoint_index, &e, record);
                    record.trace_try_started(req.headers_mut(), (route.upstream, next), failed);
                    upstream.balance.complete(
                        endpoint_index,
                        Outcome::ConnectFailed,
                        dispatched.elapsed(),
                    );
                    upstream.record(endpoint_index, Outcome::ConnectFailed);
                    endpoint_index = next;
                    pool = upstream.endpoints[next]
                        .h2
                        .as_ref()
                        .expect("an HTTP/2 upstream's endpoints have HTTP/2 pools");
                    crate::retry::h2_stream(pool, connect).await?
                }
            };
            pool.send(send, stream, *req).await.map_err(Error::from)
        };
        match head_limit {
            Some(limit) => {
                match tokio::time::timeout_at((dispatched + limit).into(), exchange).await {
                    Ok(r) => r,
                    Err(_) => Err(match &record.bytes_in {
                        // A client still sending its body is the slow one, not the upstream.
                        Some(count) if !tailguard_http::body::body_ended(count) && !record.grpc => {
                            Error::DownstreamTimeout { phase: "request" }
                        }
                        _ => Error::UpstreamTimeout {
                            addr: upstream.endpoints[endpoint_index].addr,
                            phase: "request",
                        },
                    }),
                }
            }
            None => exchange.await,
        }
    };
    // A request body over the limit resets the stream; the client is told why.
    let result = match result {
        Err(Error::UpstreamBroken { .. }) if record.bytes_in() > limits.body_bytes => {
            Err(Error::BodyTooLarge)
        }
        other => other,
    };
    let endpoint = &upstream.endpoints[endpoint_index];
    record.endpoint = Some((route.upstream, endpoint_index));
    let elapsed = dispatched.elapsed();
    drop(waiting);
    record.upstream_time = Some(elapsed);
    let answered = dispatched + elapsed;
    match &result {
        Ok((r, _)) => record.trace_try_ended(Some(r.status().as_u16()), None, answered),
        Err(e) => record.trace_try_ended(None, Some(e.kind()), answered),
    }
    let outcome = match &result {
        Ok((r, _)) => Outcome::Status(r.status().as_u16()),
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

    let (resp, stream) = result?;
    record.upstream_status = Some(resp.status().as_u16());
    let (mut parts, incoming) = resp.into_parts();
    headers::remove_hop_by_hop(&mut parts.headers);
    parts
        .headers
        .append(VIA, headers::via_value(Version::HTTP_2));
    tailguard_policy::policy::on_response(route, &mut parts.headers, &conn.client, &vars);
    // gRPC: the whole call within its deadline, and no read timeout between messages;
    // anything else: `timeouts.read_ms` between two reads, as from HTTP/1.1.
    let body = if record.grpc {
        let deadline =
            grpc_timeout.map(|t| Box::pin(tokio::time::sleep_until((dispatched + t).into())));
        H2Body::new(incoming, stream, endpoint.addr, deadline, None)
    } else {
        let read = route.tries.read_timeout(snap.read_timeout);
        H2Body::new(incoming, stream, endpoint.addr, None, read)
    };
    Ok(Response::from_parts(parts, body))
}
