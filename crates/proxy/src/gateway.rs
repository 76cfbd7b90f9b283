//! The request path: a config snapshot (router, upstreams and their connection pools)
//! swapped atomically on reload, and the function that takes a request from head to response.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use bytes::Bytes;
use futures_util::FutureExt as _;
use http::header::{CONNECTION, HOST, UPGRADE, VIA};
use http::uri::PathAndQuery;
use http::{HeaderValue, Method, Request, Response, StatusCode, Uri, Version};
use http_body::{Body as _, Frame};
use http_body_util::BodyExt as _;
use tailguard_http1::client::{self, SendError};
use tailguard_http1::server::{self as http1_server, H1Body, OnUpgrade};
use tailguard_http1::timer::LazyTimer;
use tokio::io::AsyncWriteExt as _;

use crate::admission;
use crate::balance::Outcome;
use crate::body::{IncomingBody, RequestBody};
use crate::config::{Config, Limits, Protocol};
use crate::dns::Resolver;
use crate::error::Error;
use crate::finish::Finish;
use crate::headers;
use crate::health::checker::{Current, Hub, Upstreams};
use crate::metrics::GatewayMetrics;
use crate::pool::EndpointPool;
use crate::record::RequestRecord;
use crate::recycle;
use crate::respond::{error_response, local_response};
use crate::response_body::ResponseBody;
use crate::route::Route;
use crate::snapshot::{Snapshot, TlsFiles};

/// An upstream response whose body streams from its connection.
type UpstreamBody = client::UpstreamBody<RequestBody>;

/// The gateway: the current snapshot, replaced atomically by [`Gateway::reload`].
#[derive(Debug)]
pub struct Gateway {
    /// Shared with every connection, which finds the current snapshot here when its own
    /// was retired.
    current: Arc<ArcSwap<Snapshot>>,
    metrics: Arc<GatewayMetrics>,
    /// Looks up endpoint names off the request path; rebuilds the snapshot on a change.
    resolver: Resolver,
    /// Held while a snapshot is built and swapped in, so a reload and a DNS refresh never
    /// build from the same old snapshot and lose one another's change. Only off-path
    /// threads (the reloading thread, the resolver thread) take it.
    rebuilding: Mutex<()>,
    /// The health checker thread (started by the first snapshot that needs it).
    health: Hub,
    /// This gateway, for the checker thread (which must not keep it alive).
    this: Weak<Gateway>,
}

impl Gateway {
    /// Builds the gateway's first snapshot (inside a tokio runtime).
    pub fn new(config: Config) -> Result<Arc<Gateway>, Error> {
        let metrics = GatewayMetrics::register(&tailguard_metrics::Registry::new())?;
        Self::with_metrics(config, metrics)
    }

    /// Builds the gateway recording into `metrics` (whose registry an exporter serves).
    pub fn with_metrics(
        config: Config,
        metrics: Arc<GatewayMetrics>,
    ) -> Result<Arc<Gateway>, Error> {
        let resolver = Resolver::start(&config.dns, metrics.registry())?;
        resolver.resolve_new(&config);
        let health = Hub::default();
        let snapshot = Arc::new(Snapshot::build(
            config,
            None,
            &metrics,
            Some(resolver.names()),
            &health,
        )?);
        let gateway = Arc::new_cyclic(|this| Gateway {
            current: Arc::new(ArcSwap::new(Arc::clone(&snapshot))),
            metrics,
            resolver,
            rebuilding: Mutex::new(()),
            health,
            this: this.clone(),
        });
        gateway.resolver.watch(
            &gateway.snapshot().config,
            refresh_on_change(Arc::downgrade(&gateway)),
        );
        gateway.health.follow(
            &snapshot.upstreams,
            current_upstreams(Arc::downgrade(&gateway)),
        );
        Ok(gateway)
    }

    /// The gateway's metrics.
    pub fn metrics(&self) -> &Arc<GatewayMetrics> {
        &self.metrics
    }

    /// Swaps in a new config. Requests already running finish on the old snapshot; every
    /// request that starts after this returns uses the new one. On error nothing changes.
    pub fn reload(self: &Arc<Self>, config: Config) -> Result<(), Error> {
        // Names new to this config are looked up before the lock: the resolver thread may
        // itself be waiting for it to apply a refresh.
        self.resolver.resolve_new(&config);
        let _rebuilding = self
            .rebuilding
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let old = self.current.load_full();
        let new = Snapshot::build(
            config,
            Some(&old),
            &self.metrics,
            Some(self.resolver.names()),
            &self.health,
        );
        self.metrics.reloaded(new.is_ok());
        let new = Arc::new(new?);
        self.swap_in(&new);
        self.resolver
            .watch(&new.config, refresh_on_change(Arc::downgrade(self)));
        Ok(())
    }

    /// Rebuilds the snapshot from the running config with the resolver's latest answers
    /// (called by the resolver thread when a name's addresses change): endpoints of
    /// unchanged addresses keep their pools, as on a reload.
    pub fn refresh_endpoints(&self) {
        let _rebuilding = self
            .rebuilding
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let old = self.current.load_full();
        match Snapshot::build_with(
            old.config.clone(),
            Some(&old),
            &self.metrics,
            Some(self.resolver.names()),
            &self.health,
            TlsFiles::KeepRunning,
        ) {
            Ok(new) => self.swap_in(&Arc::new(new)),
            Err(e) => tracing::error!(
                target: "tailguard::dns",
                "applying new endpoint addresses failed, the old ones stay: {e}"
            ),
        }
    }

    /// Makes `new` the current snapshot and retires what the old one had alone.
    fn swap_in(&self, new: &Arc<Snapshot>) {
        let old = self.current.swap(Arc::clone(new));
        old.retired.store(true, Ordering::Release);
        // Pools the new snapshot did not take over close their idle connections now; their
        // busy ones close when their requests finish.
        for pool in old.endpoint_pools() {
            if !new.endpoint_pools().any(|p| Arc::ptr_eq(p, pool)) {
                pool.retire();
            }
        }
        for pool in old.h2_pools() {
            if !new.h2_pools().any(|p| Arc::ptr_eq(p, pool)) {
                pool.retire();
            }
        }
        // Health states the new snapshot did not take over are retired; the checker
        // follows the new one (started now if it is the first with a health table).
        crate::health::handover::retire_missing(&old.upstreams, &new.upstreams);
        self.health
            .follow(&new.upstreams, current_upstreams(self.this.clone()));
    }

    /// The current snapshot.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.current.load_full()
    }

    /// Where the current snapshot is swapped in (a connection holds it, not the gateway).
    pub(crate) fn current(&self) -> &Arc<ArcSwap<Snapshot>> {
        &self.current
    }

    /// Whether a peer at `ip` is a trusted proxy under the current config (asked once per
    /// connection: a reload applies to the connections accepted after it).
    pub fn is_trusted(&self, ip: std::net::IpAddr) -> bool {
        let snapshot = self.current.load();
        snapshot
            .config
            .trusted_proxies
            .iter()
            .any(|net| net.contains(ip))
    }
}

/// How the health checker thread reads the current snapshot's upstreams: through `gateway`,
/// which it holds weakly (the thread must not keep the gateway alive).
fn current_upstreams(gateway: Weak<Gateway>) -> Current<RequestBody> {
    Box::new(move || {
        gateway
            .upgrade()
            .map(|g| -> Arc<dyn Upstreams<RequestBody>> { g.snapshot() })
    })
}

/// What the resolver thread calls when an answer changed: a refresh of `gateway`, which it
/// holds weakly (the thread must not keep the gateway alive).
fn refresh_on_change(gateway: Weak<Gateway>) -> crate::dns::OnChange {
    Box::new(move || {
        if let Some(gateway) = gateway.upgrade() {
            gateway.refresh_endpoints();
        }
    })
}

/// Per downstream connection: the snapshot it started with, so a request touches only this
/// connection's reference count, not one shared by every serving thread.
#[derive(Debug)]
pub(crate) struct ConnCtx {
    /// The gateway's current snapshot, for when `snapshot` is retired.
    pub(crate) current: Arc<ArcSwap<Snapshot>>,
    pub(crate) snapshot: Arc<Snapshot>,
    pub(crate) remote: SocketAddr,
    /// What the forwarding fields say of the client, made once per connection.
    pub(crate) client: headers::Client,
    pub(crate) tls: bool,
    /// The listener's access log (a handle per connection, not per request).
    pub(crate) access_log: tailguard_access_log::AccessLog,
    /// The listener's rate limit, if it has one.
    pub(crate) rate_limit: Option<Arc<crate::rate_limit::Limiter>>,
}

/// A downstream HTTP/1.1 connection's handler: the gateway behind the HTTP/1.1 engine.
#[derive(Debug)]
pub(crate) struct Http1Handler(pub(crate) Arc<ConnCtx>);

impl http1_server::Handler for Http1Handler {
    type Body = RequestBody;
    type ResponseBody = ResponseBody;

    fn new_request(&self, fields: usize) -> Box<Request<RequestBody>> {
        recycle::request(fields)
    }

    fn attach_body(&self, req: &mut Request<RequestBody>, body: H1Body) {
        *req.body_mut() = RequestBody::unlimited(IncomingBody::Http1(body));
    }

    async fn serve(
        &self,
        req: Box<Request<RequestBody>>,
        timer: &mut LazyTimer,
    ) -> Response<ResponseBody> {
        let Ok(resp) = serve(&self.0, req, timer).await;
        resp
    }

    fn refused(&self, err: tailguard_http1::RequestError) -> (StatusCode, &'static str) {
        let err = Error::from(err);
        let status = err.status();
        self.0
            .snapshot
            .metrics
            .gateway
            .error(err.kind(), err.blame());
        tracing::info!(
            target: "tailguard::request",
            status = status.as_u16(),
            kind = err.kind(),
            blame = err.blame().as_str(),
            retryable = false,
            remote = %self.0.remote,
            "{err}"
        );
        (status, err.reason())
    }
}

/// How a request holds its snapshot until its response finishes.
#[derive(Debug)]
pub(crate) enum Held {
    /// Through its connection (the common case).
    Conn(Arc<ConnCtx>),
    /// Its connection's snapshot was retired by a reload: the current one, held directly
    /// (the connection too, for its access log).
    Fresh(Arc<Snapshot>, Arc<ConnCtx>),
}

impl Held {
    pub(crate) fn snapshot(&self) -> &Snapshot {
        match self {
            Held::Conn(c) => &c.snapshot,
            Held::Fresh(s, _) => s,
        }
    }

    pub(crate) fn access_log(&self) -> &tailguard_access_log::AccessLog {
        match self {
            Held::Conn(c) | Held::Fresh(_, c) => &c.access_log,
        }
    }
}

fn hold(conn: &Arc<ConnCtx>) -> Held {
    if conn.snapshot.retired.load(Ordering::Acquire) {
        Held::Fresh(conn.current.load_full(), Arc::clone(conn))
    } else {
        Held::Conn(Arc::clone(conn))
    }
}

/// Serves one request from its parsed head to the response head (the body then streams).
/// `timer` is the connection's timer for `timeouts.request_ms` (kept across its requests).
pub(crate) async fn serve(
    conn: &Arc<ConnCtx>,
    req: Box<Request<RequestBody>>,
    timer: &mut LazyTimer,
) -> Result<Response<ResponseBody>, Infallible> {
    let start = Instant::now();
    // Answered locally on every listener, before admission, so it is never shed and never
    // touches an upstream.
    if req.uri().path() == "/healthz"
        && (req.method() == Method::GET || req.method() == Method::HEAD)
    {
        return Ok(local_response(StatusCode::OK, "ok\n", None));
    }
    let held = hold(conn);
    let mut record = RequestRecord::new(
        start,
        conn.remote,
        conn.tls,
        &req,
        !held.access_log().is_off(),
    );
    held.snapshot().metrics.gateway.request_started();
    // The listener's limit covers everything it serves: checked before routing.
    if let Some(limit) = &conn.rate_limit
        && let Err(limited) = limit.check(start, conn.remote.ip(), req.headers())
    {
        record.grpc = crate::grpc::is_grpc(req.headers());
        return Ok(crate::respond::rate_limited(limited, record, held));
    }
    // Matched once: admission (the route's group and class) and forwarding both use it.
    // `OPTIONS *` asks about the server as a whole: routed as its root would be.
    let path = match req.uri().path() {
        "*" => "/",
        path => path,
    };
    let route =
        held.snapshot()
            .router
            .find(headers::host_of(&req), path, req.method(), req.headers());
    // Before local answers and admission: a limited request never counts against the
    // shedder or a breaker, and a route that answers by itself is limited too.
    if let Some(r) = route
        && let Some(limit) = held.snapshot().rate_limits.route(r)
        && let Err(limited) = limit.check(start, conn.remote.ip(), req.headers())
    {
        record.route = Some(r);
        record.grpc = crate::grpc::is_grpc(req.headers());
        return Ok(crate::respond::rate_limited(limited, record, held));
    }
    if let Some(r) = route
        && crate::policy::answers_locally(held.snapshot().router.get(r))
    {
        return Ok(answer_locally(conn, held, req, r, record));
    }
    let mut admitted = match admission::admit(&held.snapshot().overload, route) {
        Ok(guard) => guard,
        Err(refused) => {
            record.grpc = crate::grpc::is_grpc(req.headers());
            return Ok(refused.respond(error_response(Error::Overloaded, record, held, None)));
        }
    };
    // Branched once per request, on the upstream's protocol: an HTTP/2 upstream's exchange
    // is its own function (boxed, so the HTTP/1.1 path's future does not grow by it).
    match route {
        Some(r) => {
            let snapshot = held.snapshot();
            if snapshot.upstreams[snapshot.router.get(r).upstream].protocol != Protocol::Http1 {
                let h2 = crate::forward_h2::serve(conn, held, req, r, record, admitted);
                return Ok(Box::pin(h2).await);
            }
        }
        None => record.grpc = crate::grpc::is_grpc(req.headers()),
    }
    // Not boxed: the HTTP/1.1 connection awaits this future in place, in its own task's
    // state, so it is never moved once running (hyper's server moved each request's
    // future into its slot, which is why it was boxed before). Its ~2 KB is written once.
    let forwarding = forward(held.snapshot(), conn, req, route, &mut record, timer);
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
            Ok(Response::from_parts(
                parts,
                ResponseBody::upstream(first, body, Some(finish)),
            ))
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
            Ok(error_response(e, record, held, Some(admitted)))
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
    mut record: RequestRecord,
) -> Response<ResponseBody> {
    record.route = Some(route_index);
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
        let mut vars = crate::policy::Vars::capture(route, &req);
        if logged || p.needs_request_id {
            let id = headers::request_id(req.headers_mut()).clone();
            if logged {
                record.request_id = Some(id.clone());
            }
            vars.request_id = Some(id);
        }
        let mut resp = crate::policy::local_response(p, &req);
        crate::policy::on_response(route, resp.headers_mut(), &conn.client, &vars);
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

async fn forward(
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
    let mut vars = crate::policy::Vars::capture(route, &req);
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
    let headers = req.headers_mut();
    let id = headers::request_id(headers);
    // Kept only for the access log, its one reader.
    if !conn.access_log.is_off() {
        record.request_id = Some(id.clone());
    }
    headers::add_forwarding(headers, &conn.client, version);
    crate::policy::on_request(route, &mut req, &conn.client, &mut vars);
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
        // Boxed: the plain exchange's future does not grow by the retry loop.
        (Some(policy), _) => {
            Box::pin(crate::retry::exchange_http1(
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
            ))
            .await
        }
        (None, Some(limit)) => {
            let deadline = tokio::time::Instant::from_std(dispatched + limit);
            let sent = exchange(
                snap,
                route,
                endpoint_index,
                request,
                dispatched,
                connect_timeout,
                record,
            );
            match timer.limit(deadline, sent).await {
                Some((r, e)) => (r, e, dispatched),
                None => (
                    // A client still sending its body is the slow one (408), not the
                    // upstream waiting for it.
                    Err(match &record.bytes_in {
                        Some(count) if !crate::body::body_ended(count) => {
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
    crate::policy::on_response_h1(route, &mut resp, &conn.client, &vars);
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
async fn exchange(
    snap: &Snapshot,
    route: &Route,
    first: usize,
    req: Box<Request<RequestBody>>,
    now: Instant,
    connect: Option<Duration>,
    record: &mut RequestRecord,
) -> (Result<Response<UpstreamBody>, Error>, usize) {
    let upstream_index = route.upstream;
    let upstream = &snap.upstreams[upstream_index];
    let pool = &upstream.endpoints[first].pool;
    let (conn, reused) = match pool.checkout_within(now, connect).await {
        Ok(checked_out) => checked_out,
        Err(e) => {
            let e = Error::from(e);
            let retry_on = retry_endpoint(snap, upstream_index, first, &req, &e);
            let Some(next) = retry_on else {
                return (Err(e), first);
            };
            crate::retry::note_connect_retry(snap, route, first, &e, record);
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
                send_once(conn, req, reused, next_pool, connect).await
            };
            return (Box::pin(sent).await, next);
        }
    };
    (send_once(conn, req, reused, pool, connect).await, first)
}

/// Sends `req` on `conn` and waits for the response head; if `conn` was an idle connection
/// the upstream had closed, sends it once more on a new connection.
async fn send_once(
    conn: Box<client::Connection>,
    req: Box<Request<RequestBody>>,
    reused: bool,
    pool: &EndpointPool,
    connect: Option<Duration>,
) -> Result<Response<UpstreamBody>, Error> {
    match client::send(conn, req, reused).await {
        Ok(sent) => Ok(answered(sent)),
        Err(SendError::Failed(e)) => Err(e.into()),
        Err(SendError::Stale(req)) => {
            let resend = async {
                let conn = pool.connect_within(connect).await?;
                match client::send(conn, req, false).await {
                    Ok(sent) => Ok(answered(sent)),
                    Err(SendError::Failed(e)) => Err(e.into()),
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

/// The endpoint to retry a failed connect on, if the request may be retried: the
/// balancer's next pick that is not `failed` (never a down endpoint: the balancer skips
/// those).
pub(crate) fn retry_endpoint<B: http_body::Body>(
    snap: &Snapshot,
    upstream_index: usize,
    failed: usize,
    req: &Request<B>,
    err: &Error,
) -> Option<usize> {
    let upstream = &snap.upstreams[upstream_index];
    let n = upstream.endpoints.len();
    let connect_failed = matches!(
        err,
        Error::UpstreamConnect { .. }
            | Error::UpstreamTls { .. }
            | Error::UpstreamTimeout {
                phase: "connect",
                ..
            }
    );
    if n < 2
        || !connect_failed
        || !snap
            .overload
            .may_retry(upstream_index, req.method(), !req.body().is_end_stream())
    {
        return None;
    }
    // Every pick is completed exactly once (the balancer counts in-flight requests): a pick
    // of the failed endpoint is released unused, and after two such picks there is no retry.
    for _ in 0..2 {
        let pick = upstream.pick()?;
        snap.metrics.picked(upstream_index, pick);
        if pick != failed {
            return Some(pick);
        }
        upstream
            .balance
            .complete(pick, Outcome::Aborted, Duration::ZERO);
    }
    None
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
