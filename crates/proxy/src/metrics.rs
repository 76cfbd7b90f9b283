//! The gateway's metrics: its families, registered once per process; the handles of each
//! route and endpoint, resolved when a config snapshot is built; and the one function that
//! records a finished request.
//!
//! Every name, label and bound is listed in `docs/metrics.md`. On the request path nothing
//! here looks anything up: a request reaches its route's and endpoint's handles through the
//! indexes the router and balancer return, and its method and status index dense tables.

use std::cell::Cell;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};

use std::time::{Duration, Instant};

use tailguard_http::error::{Blame, Error};
use tailguard_metrics::{
    Counter, Desc, Family, Gauge, Histogram, LATENCY_BUCKETS, MetricsError, Registry,
    StatusCounters, register_process_metrics,
};
use tailguard_upstream::pool_metrics::{PoolMetrics, UpstreamGuard};

use crate::record::RequestRecord;

/// Values of `kind` in `tailguard_errors_total` (every [`Error::kind`]).
const ERROR_KINDS: [&str; 23] = [
    "config",
    "read",
    "bind",
    "no_route",
    "headers_too_large",
    "body_too_large",
    "bad_request",
    "connect_unsupported",
    "uri_too_long",
    "version_unsupported",
    "downstream_timeout",
    "downstream_body",
    "overloaded",
    "upstream_connect",
    "upstream_timeout",
    "upstream_broken",
    "no_endpoint",
    "upstream_tls",
    "no_healthy_endpoint",
    "rate_limited",
    "address_denied",
    "tls",
    "internal",
];
/// How long the `tailguard_upstream_endpoint_up` series of an endpoint that left the config
/// (a reload, a DNS answer) lingers at 0 once nothing holds it: well under the `for:` of
/// the endpoint-down alerts (1 and 2 minutes, `deploy/prometheus/`), so an endpoint that is
/// gone is not reported down for ever. A configured endpoint's state holds its handle, so
/// its series never expires however long its value stays the same.
const LEFT_ENDPOINT_SERIES_TTL: Duration = Duration::from_secs(5);

const BLAMES: [Blame; 3] = [Blame::Downstream, Blame::Upstream, Blame::Internal];

/// Series per synthetic unit: 1 status counter, 2 bandwidth counters and 3 latency
/// histograms of 15 buckets (+Inf, `_sum`, `_count`: 18 series each): APISIX's default
/// metrics for one route and node, where histogram lines are ~95% of the exposition.
pub const SYNTHETIC_SERIES_PER_UNIT: usize = 3 + 3 * 18;

/// APISIX's default latency buckets, in milliseconds.
const APISIX_BUCKETS_MS: [f64; 15] = [
    1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0, 30000.0,
    60000.0,
];

/// Values of `grpc_status` in `tailguard_grpc_requests_total`: the codes gRPC defines
/// (0..=16), then `none` for a call that ended without a status (client gone, stream reset).
const GRPC_STATUS_LABELS: [&str; 18] = [
    "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15", "16",
    "none",
];

/// gRPC calls of one route by `grpc-status`: a dense table of handles, each created on
/// first use, so counting a call is an index and one relaxed add. The table itself is
/// made at the route's first gRPC call (most routes never see one).
#[derive(Debug)]
pub(crate) struct GrpcCounters {
    route: Arc<str>,
    family: Family<Counter>,
    table: OnceLock<Box<[OnceLock<Counter>; GRPC_STATUS_LABELS.len()]>>,
}

impl GrpcCounters {
    fn new(family: Family<Counter>, route: Arc<str>) -> GrpcCounters {
        GrpcCounters {
            route,
            family,
            table: OnceLock::new(),
        }
    }

    /// Counts one call that ended with `status` (`None`: without one).
    fn inc(&self, status: Option<u8>) {
        let slot = status.map_or(GRPC_STATUS_LABELS.len() - 1, |s| {
            usize::from(s.min(tailguard_http::grpc::MAX_CODE))
        });
        self.table
            .get_or_init(|| Box::new(std::array::from_fn(|_| OnceLock::new())))[slot]
            .get_or_init(|| {
                self.family
                    .get_or_create(&[&self.route, GRPC_STATUS_LABELS[slot]])
                    .expect("the gRPC requests family has two labels")
            })
            .inc();
    }
}

/// The handles of one route.
///
/// Its series are made at the route's first finished request, not when the route is built:
/// a table of 100,000 routes of which a few serve then holds a few routes' series (a
/// latency histogram is 16 cells on every shard), and a route that has served nothing
/// costs about its config. Until then its families show no series for it.
#[derive(Debug)]
pub(crate) struct RouteHandles {
    requests: StatusCounters,
    grpc: GrpcCounters,
    series: OnceLock<Box<RouteSeries>>,
}

/// The series of a route that has finished a request.
#[derive(Debug)]
struct RouteSeries {
    duration: Histogram,
    bytes_in: Counter,
    bytes_out: Counter,
}

impl RouteSeries {
    fn new(
        duration: &Family<Histogram>,
        bytes_in: &Family<Counter>,
        bytes_out: &Family<Counter>,
        id: &str,
    ) -> Result<RouteSeries, MetricsError> {
        Ok(RouteSeries {
            duration: duration.get_or_create(&[id])?,
            bytes_in: bytes_in.get_or_create(&[id])?,
            bytes_out: bytes_out.get_or_create(&[id])?,
        })
    }
}

impl RouteHandles {
    fn new(
        requests: &Family<Counter>,
        grpc: &Family<Counter>,
        id: &Arc<str>,
    ) -> Result<RouteHandles, MetricsError> {
        Ok(RouteHandles {
            requests: StatusCounters::new(requests.clone(), id)?,
            grpc: GrpcCounters::new(grpc.clone(), Arc::clone(id)),
            series: OnceLock::new(),
        })
    }

    /// The route's series, made at its first use (the cold path: one lookup per family,
    /// once per route and process).
    fn series(&self, g: &GatewayMetrics) -> &RouteSeries {
        self.series.get_or_init(|| {
            Box::new(
                RouteSeries::new(&g.duration, &g.bytes_in, &g.bytes_out, &self.grpc.route)
                    .expect("the duration and body bytes families have one label each"),
            )
        })
    }
}

/// The handles of one endpoint of one upstream.
#[derive(Debug)]
pub(crate) struct EndpointHandles {
    duration: Histogram,
    /// `tailguard_balancer_picks_total`: every pick of this endpoint by the upstream's
    /// balancer (round robin or p2c-EWMA), counted at the pick.
    picks: Counter,
}

/// An endpoint by upstream name and address.
type EndpointKey = (Arc<str>, SocketAddr);

/// The gateway's metric families, one per process (reloads keep them; routes and
/// endpoints that come back after a reload get their old series).
#[derive(Debug)]
pub struct GatewayMetrics {
    registry: Registry,
    requests: Family<Counter>,
    grpc_requests: Family<Counter>,
    duration: Family<Histogram>,
    upstream_duration: Family<Histogram>,
    picks: Family<Counter>,
    retries: Family<Counter>,
    retries_skipped: Family<Counter>,
    endpoint_up: Family<Gauge>,
    bytes_in: Family<Counter>,
    bytes_out: Family<Counter>,
    in_flight: Gauge,
    connections_opened: Counter,
    connections_active: Gauge,
    connections_parked: Gauge,
    /// `tailguard_downstream_refused_total`, by [`Refusal`].
    refused: [Counter; Refusal::ALL.len()],
    pool: Arc<PoolMetrics>,
    errors: Family<Counter>,
    error_table: Box<[OnceLock<Counter>]>,
    reloads_ok: Counter,
    reloads_failed: Counter,
    last_reload_ok: Gauge,
    unrouted: Arc<RouteHandles>,
    routes: Mutex<HashMap<Arc<str>, Arc<RouteHandles>>>,
    endpoints: Mutex<HashMap<EndpointKey, Arc<EndpointHandles>>>,
    synthetic: OnceLock<Synthetic>,
    pub(crate) rate_limit: tailguard_policy::rate_limit::RateLimitMetrics,
    /// `tailguard_auth_requests_total`.
    pub(crate) auth: tailguard_auth::AuthMetrics,
}

fn internal(e: MetricsError) -> Error {
    Error::Internal(format!("metrics: {e}"))
}

impl GatewayMetrics {
    /// Registers the gateway's families (and the `process_*` ones) on `registry`.
    pub fn register(registry: &Registry) -> Result<Arc<GatewayMetrics>, Error> {
        Self::register_inner(registry).map_err(internal)
    }

    fn register_inner(registry: &Registry) -> Result<Arc<GatewayMetrics>, MetricsError> {
        let r = registry;
        let requests = r.counter(
            "tailguard_requests",
            "Requests answered, by route, method and status.",
            &["route", "method", "status"],
        )?;
        let grpc_requests = r.counter(
            "tailguard_grpc_requests",
            "gRPC calls answered, by route and grpc-status (`none`: ended without one).",
            &["route", "grpc_status"],
        )?;
        let duration = r.histogram(
            "tailguard_request_duration_seconds",
            "From the request head's arrival to the end of the response.",
            &["route"],
            &LATENCY_BUCKETS,
        )?;
        let upstream_duration = r.histogram(
            "tailguard_upstream_duration_seconds",
            "From dispatch to an endpoint to its response head (or failure).",
            &["upstream", "endpoint"],
            &LATENCY_BUCKETS,
        )?;
        // The name the overload crate's `watch_balancer` would use; the gateway counts picks
        // here for every balancer instead, and never watches one.
        let picks = r.counter(
            "tailguard_balancer_picks",
            "Endpoint picks by the upstream's balancer (round robin or p2c-EWMA).",
            &["upstream", "endpoint"],
        )?;
        let retries = r.counter(
            "tailguard_upstream_retries",
            "Tries sent again after a failed one, by route and the condition it met \
             (connect, 502, 503, 504, timeout).",
            &["route", "reason"],
        )?;
        let retries_skipped = r.counter(
            "tailguard_upstream_retries_skipped",
            "Tries that met a retry condition and were not retried, by route and why \
             (method, body_too_large, body_budget, body_failed, retry_budget).",
            &["route", "reason"],
        )?;
        let endpoint_up = r.register::<Gauge>(
            Desc::new(
                "tailguard_upstream_endpoint_up",
                "1 if the endpoint may take traffic, 0 if health checks took it down or it is \
                 ejected (or it just left the config).",
            )
            .labels(&["upstream", "endpoint"])
            .ttl(LEFT_ENDPOINT_SERIES_TTL),
        )?;
        let bytes_in = r.counter(
            "tailguard_request_body_bytes",
            "Request body bytes read from clients.",
            &["route"],
        )?;
        let bytes_out = r.counter(
            "tailguard_response_body_bytes",
            "Response body bytes sent to clients.",
            &["route"],
        )?;
        let one = |name: &str, help: &str| -> Result<Counter, MetricsError> {
            r.counter(name, help, &[])?.get_or_create(&[])
        };
        let gauge = |name: &str, help: &str| -> Result<Gauge, MetricsError> {
            r.gauge(name, help, &[])?.get_or_create(&[])
        };
        let in_flight = gauge(
            "tailguard_requests_in_flight",
            "Requests received and not yet finished.",
        )?;
        let connections_opened = one(
            "tailguard_downstream_connections_opened",
            "Client connections accepted.",
        )?;
        let connections_active = gauge(
            "tailguard_downstream_connections_active",
            "Client connections open now.",
        )?;
        let connections_parked = gauge(
            "tailguard_downstream_connections_parked",
            "Idle HTTP/1.1 client connections parked (waiting for their next request without a \
             task; counted in the active ones too).",
        )?;
        let refused_family = r.counter(
            "tailguard_downstream_refused",
            "Client requests refused or streams cut to bound what a client holds, by reason \
             (client_requests, body_timeout, send_timeout, held_off).",
            &["reason"],
        )?;
        let mut refused = Vec::with_capacity(Refusal::ALL.len());
        for reason in Refusal::ALL {
            refused.push(refused_family.get_or_create(&[reason.as_str()])?);
        }
        let refused: [Counter; Refusal::ALL.len()] = refused
            .try_into()
            .expect("one counter per reason, made just above");
        let pool = PoolMetrics::register(r)?;
        let errors = r.counter(
            "tailguard_errors",
            "Requests that ended in an error, by kind and by who was at fault.",
            &["kind", "blame"],
        )?;
        let reloads = r.counter(
            "tailguard_config_reloads",
            "Config reloads by result.",
            &["result"],
        )?;
        // Whether the running config is the last one offered: a counter cannot say whether
        // the latest attempt failed (the "reload failing" alert of deploy/prometheus).
        let last_reload_ok = gauge(
            "tailguard_config_last_reload_successful",
            "1 if the last config reload was applied (or none was tried), 0 if it was rejected.",
        )?;
        last_reload_ok.set(1);
        r.gauge(
            "tailguard_build_info",
            "Always 1; the labels say which build is running.",
            &["version"],
        )?
        .get_or_create(&[env!("CARGO_PKG_VERSION")])?
        .set(1);
        register_process_metrics(r)?;
        let unrouted = RouteHandles::new(&requests, &grpc_requests, &Arc::from(""))?;
        // The unrouted series exist from the start, as they always have.
        let _ = unrouted.series.set(Box::new(RouteSeries::new(
            &duration, &bytes_in, &bytes_out, "",
        )?));
        Ok(Arc::new(GatewayMetrics {
            registry: r.clone(),
            error_table: (0..ERROR_KINDS.len() * BLAMES.len())
                .map(|_| OnceLock::new())
                .collect(),
            reloads_ok: reloads.get_or_create(&["ok"])?,
            reloads_failed: reloads.get_or_create(&["failed"])?,
            last_reload_ok,
            requests,
            grpc_requests,
            duration,
            upstream_duration,
            picks,
            retries,
            retries_skipped,
            endpoint_up,
            bytes_in,
            bytes_out,
            in_flight,
            connections_opened,
            connections_active,
            connections_parked,
            refused,
            pool,
            errors,
            unrouted: Arc::new(unrouted),
            routes: Mutex::default(),
            endpoints: Mutex::default(),
            synthetic: OnceLock::new(),
            rate_limit: tailguard_policy::rate_limit::RateLimitMetrics::register(r)?,
            auth: tailguard_auth::AuthMetrics::register(r)?,
        }))
    }

    /// The registry these metrics live in (for the exporter).
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Registers at least `series` extra series shaped like APISIX's default metrics
    /// (counters and histograms in its proportion), updated by every request, so a scrape
    /// carries 100k or 1M series. Once per process; returns the series registered.
    pub fn add_synthetic_series(&self, series: usize) -> Result<usize, Error> {
        if series == 0 || self.synthetic.get().is_some() {
            return Ok(0);
        }
        let synthetic = Synthetic::register(&self.registry, series).map_err(internal)?;
        let registered = synthetic.units.len() * SYNTHETIC_SERIES_PER_UNIT;
        let _ = self.synthetic.set(synthetic);
        Ok(registered)
    }

    /// The handles of route `id` (the same ones after a reload).
    pub(crate) fn route(&self, id: &Arc<str>) -> Result<Arc<RouteHandles>, Error> {
        let mut routes = self.routes.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(found) = routes.get(id) {
            return Ok(Arc::clone(found));
        }
        let handles =
            Arc::new(RouteHandles::new(&self.requests, &self.grpc_requests, id).map_err(internal)?);
        routes.insert(Arc::clone(id), Arc::clone(&handles));
        Ok(handles)
    }

    /// The handles of endpoint `addr` of upstream `upstream`.
    pub(crate) fn endpoint(
        &self,
        upstream: &Arc<str>,
        addr: SocketAddr,
    ) -> Result<Arc<EndpointHandles>, Error> {
        let mut endpoints = self.endpoints.lock().unwrap_or_else(|p| p.into_inner());
        let key = (Arc::clone(upstream), addr);
        if let Some(found) = endpoints.get(&key) {
            return Ok(Arc::clone(found));
        }
        let addr_label = addr.to_string();
        let labels = [&**upstream, addr_label.as_str()];
        let handles = Arc::new(EndpointHandles {
            duration: self
                .upstream_duration
                .get_or_create(&labels)
                .map_err(internal)?,
            picks: self.picks.get_or_create(&labels).map_err(internal)?,
        });
        endpoints.insert(key, Arc::clone(&handles));
        Ok(handles)
    }

    /// The `tailguard_upstream_endpoint_up` gauge of endpoint `addr` of `upstream`
    /// (resolved when the endpoint's health state is made, never per request).
    pub(crate) fn endpoint_up(&self, upstream: &str, addr: SocketAddr) -> Result<Gauge, Error> {
        let addr_label = addr.to_string();
        self.endpoint_up
            .get_or_create(&[upstream, addr_label.as_str()])
            .map_err(internal)
    }

    /// A request head arrived (paired with [`finish`] through the request's record).
    pub(crate) fn request_started(&self) {
        self.in_flight.inc();
    }

    /// A request failed with `kind` (an [`Error::kind`]), at `blame`'s fault.
    pub(crate) fn error(&self, kind: &'static str, blame: Blame) {
        let blame_index = BLAMES.iter().position(|b| *b == blame).unwrap_or(2);
        match ERROR_KINDS.iter().position(|k| *k == kind) {
            Some(k) => self.error_table[k * BLAMES.len() + blame_index]
                .get_or_init(|| {
                    self.errors
                        .get_or_create(&[kind, blame.as_str()])
                        .expect("the errors family has two labels")
                })
                .inc(),
            None => {
                if let Ok(c) = self.errors.get_or_create(&[kind, blame.as_str()]) {
                    c.inc();
                }
            }
        }
    }

    /// A client's request or stream was refused or cut for `reason`.
    pub(crate) fn refused(&self, reason: Refusal) {
        self.refused[reason as usize].inc();
    }

    /// A config reload was applied (`ok`) or rejected.
    pub fn reloaded(&self, ok: bool) {
        self.last_reload_ok.set(i64::from(ok));
        if ok {
            self.reloads_ok.inc();
        } else {
            self.reloads_failed.inc();
        }
    }

    /// A client connection was parked; it counts as parked until the guard drops.
    pub(crate) fn connection_parked(self: &Arc<Self>) -> ParkedGuard {
        self.connections_parked.inc();
        ParkedGuard(Arc::clone(self))
    }

    /// A client connection was accepted; it counts as active until the guard drops.
    pub(crate) fn connection_opened(self: &Arc<Self>) -> ConnectionGuard {
        self.connections_opened.inc();
        self.connections_active.inc();
        ConnectionGuard(Arc::clone(self))
    }

    /// A request is being dispatched upstream; until the guard drops it waits for a head.
    pub(crate) fn upstream_dispatched(&self) -> UpstreamGuard<'_> {
        self.pool.dispatched()
    }

    /// `tailguard_upstream_retries_total` (each route makes its handles at its first retry).
    pub(crate) fn retries(&self) -> &Family<Counter> {
        &self.retries
    }

    /// `tailguard_upstream_retries_skipped_total` (made like the retries' handles).
    pub(crate) fn retries_skipped(&self) -> &Family<Counter> {
        &self.retries_skipped
    }

    /// The rate limits' families (their handles are made when a limit is built).
    pub fn rate_limit(&self) -> &tailguard_policy::rate_limit::RateLimitMetrics {
        &self.rate_limit
    }

    /// The counters every endpoint's pool records into.
    pub(crate) fn pool(&self) -> &Arc<PoolMetrics> {
        &self.pool
    }
}

/// Why a client's request or stream was refused or cut (the `reason` label of
/// `tailguard_downstream_refused_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Its address had `limits.client_requests` in flight.
    ClientRequests = 0,
    /// Its body sent nothing for `timeouts.body_ms` before it was forwarded.
    BodyTimeout = 1,
    /// Its response could not go out for `timeouts.send_ms`.
    SendTimeout = 2,
    /// A connection closed at the accept: its address is held off after abuse
    /// (`limits.abuse_holdoff_ms`).
    HeldOff = 3,
}

impl Refusal {
    pub(crate) const ALL: [Refusal; 4] = [
        Refusal::ClientRequests,
        Refusal::BodyTimeout,
        Refusal::SendTimeout,
        Refusal::HeldOff,
    ];

    /// The label value.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Refusal::ClientRequests => "client_requests",
            Refusal::BodyTimeout => "body_timeout",
            Refusal::SendTimeout => "send_timeout",
            Refusal::HeldOff => "held_off",
        }
    }
}

/// Keeps a downstream connection counted as active.
#[derive(Debug)]
pub(crate) struct ConnectionGuard(Arc<GatewayMetrics>);

/// Counts a connection as parked until dropped.
#[derive(Debug)]
pub(crate) struct ParkedGuard(Arc<GatewayMetrics>);

impl Drop for ParkedGuard {
    fn drop(&mut self) {
        self.0.connections_parked.dec();
    }
}

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        self.0.connections_active.dec();
    }
}

/// The metric handles of one snapshot, by the router's and upstreams' indexes.
#[derive(Debug)]
pub(crate) struct SnapshotMetrics {
    pub(crate) gateway: Arc<GatewayMetrics>,
    routes: Vec<Arc<RouteHandles>>,
    endpoints: Vec<Vec<Arc<EndpointHandles>>>,
}

impl SnapshotMetrics {
    /// Resolves the handles of every route (in router order) and endpoint.
    /// Counts a balancer pick of an endpoint, at the pick: every pick, whether its request
    /// is answered there, retried elsewhere after a failed connect, or released unused.
    pub(crate) fn picked(&self, upstream: usize, endpoint: usize) {
        if let Some(e) = self.endpoints.get(upstream).and_then(|es| es.get(endpoint)) {
            e.picks.inc();
        }
    }

    pub(crate) fn build<B>(
        gateway: &Arc<GatewayMetrics>,
        routes: impl Iterator<Item = Arc<str>>,
        upstreams: &[tailguard_upstream::upstream::Upstream<B>],
    ) -> Result<SnapshotMetrics, Error> {
        Ok(SnapshotMetrics {
            gateway: Arc::clone(gateway),
            routes: routes
                .map(|id| gateway.route(&id))
                .collect::<Result<_, _>>()?,
            endpoints: upstreams
                .iter()
                .map(|u| {
                    u.endpoints
                        .iter()
                        .map(|e| gateway.endpoint(&u.name, e.addr))
                        .collect::<Result<_, _>>()
                })
                .collect::<Result<_, _>>()?,
        })
    }
}

/// Records a finished request into its snapshot's handles `m`: called once per request
/// from [`crate::finish::finish`].
pub(crate) fn finish(record: &RequestRecord, m: &SnapshotMetrics, end: Instant) {
    m.gateway.in_flight.dec();
    let elapsed = end.saturating_duration_since(record.start);
    let route = record
        .route
        .and_then(|r| m.routes.get(r))
        .unwrap_or(&m.gateway.unrouted);
    let status = (record.status != 0).then_some(record.status);
    route.requests.inc(&record.method, status);
    if record.grpc {
        route.grpc.inc(record.grpc_status);
    }
    let series = route.series(&m.gateway);
    series.duration.observe_duration(elapsed);
    let (bytes_in, bytes_out) = (record.bytes_in(), record.bytes_out);
    series.bytes_in.add(bytes_in);
    series.bytes_out.add(bytes_out);
    if let (Some((u, e)), Some(upstream)) = (record.endpoint, record.upstream_time)
        && let Some(endpoint) = m.endpoints.get(u).and_then(|es| es.get(e))
    {
        endpoint.duration.observe_duration(upstream);
    }
    if let Some(synthetic) = m.gateway.synthetic.get() {
        synthetic.record(bytes_in, bytes_out, elapsed, record.upstream_time);
    }
}

/// One synthetic route/node: its status counter, bandwidth counters and latency
/// histograms (request, upstream, gateway), as APISIX keeps them.
#[derive(Debug)]
struct SyntheticUnit {
    status: Counter,
    ingress: Counter,
    egress: Counter,
    latency: [Histogram; 3],
}

#[derive(Debug)]
struct Synthetic {
    units: Box<[SyntheticUnit]>,
}

thread_local! {
    // Each serving thread walks the units on its own, so no counter is shared.
    static NEXT_UNIT: Cell<usize> = const { Cell::new(0) };
}

impl Synthetic {
    fn register(registry: &Registry, series: usize) -> Result<Synthetic, MetricsError> {
        let units = series.div_ceil(SYNTHETIC_SERIES_PER_UNIT);
        let status = registry.counter(
            "tailguard_synthetic_http_status",
            "Synthetic load for scrape tests, shaped like APISIX's apisix_http_status.",
            &[
                "code",
                "route",
                "matched_uri",
                "matched_host",
                "service",
                "consumer",
                "node",
            ],
        )?;
        let latency = registry.histogram(
            "tailguard_synthetic_http_latency",
            "Synthetic load for scrape tests, shaped like APISIX's apisix_http_latency (ms).",
            &["type", "route", "service", "consumer", "node"],
            &APISIX_BUCKETS_MS,
        )?;
        let bandwidth = registry.counter(
            "tailguard_synthetic_bandwidth",
            "Synthetic load for scrape tests, shaped like APISIX's apisix_bandwidth.",
            &["type", "route", "service", "consumer", "node"],
        )?;
        let units = (0..units)
            .map(|i| {
                let route = i.to_string();
                let uri = format!("/synthetic/{i}/*");
                let node = format!("10.{}.{}.{}", (i >> 16) & 255, (i >> 8) & 255, i & 255);
                let l = |t: &'static str| [t, route.as_str(), "", "", node.as_str()];
                Ok(SyntheticUnit {
                    status: status.get_or_create(&["200", &route, &uri, "", "", "", &node])?,
                    ingress: bandwidth.get_or_create(&l("ingress"))?,
                    egress: bandwidth.get_or_create(&l("egress"))?,
                    latency: [
                        latency.get_or_create(&l("request"))?,
                        latency.get_or_create(&l("upstream"))?,
                        latency.get_or_create(&l("apisix"))?,
                    ],
                })
            })
            .collect::<Result<_, MetricsError>>()?;
        Ok(Synthetic { units })
    }

    fn record(&self, bytes_in: u64, bytes_out: u64, total: Duration, upstream: Option<Duration>) {
        let i = NEXT_UNIT.with(|next| {
            let i = next.get();
            next.set(if i + 1 >= self.units.len() { 0 } else { i + 1 });
            i
        });
        let Some(unit) = self.units.get(i) else {
            return;
        };
        unit.status.inc();
        unit.ingress.add(bytes_in);
        unit.egress.add(bytes_out);
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        let upstream = upstream.unwrap_or_default();
        unit.latency[0].observe(ms(total));
        unit.latency[1].observe(ms(upstream));
        unit.latency[2].observe(ms(total.saturating_sub(upstream)));
    }
}
