//! Request metrics for any hyper/axum/tower service: requests by route, method and status,
//! a duration histogram and an in-flight gauge per route, with every handle resolved once
//! per route.
//!
//! Per request this costs: an `Instant::now()` at the start and the end, a table lookup for
//! the method and the status, and four relaxed atomic adds on the thread's own shard. No
//! lock, no hash, no allocation, and no reference count touched (the route's metrics are
//! `'static`, so the response future holds a plain reference).
//!
//! Two ways to name the route:
//! - [`RouteMetrics::layer`]: a layer fixed to one route, for a service that knows it.
//! - [`RequestMetrics::layer`]: one layer for a whole router, reading each request's route
//!   from its extensions through a [`RouteOf`] function, e.g. axum's `MatchedPath`, so
//!   `/users/{id}` is one series whatever the id. The crate names no framework: the function
//!   is the bridge. axum applies a router's layer to each route's service separately, so
//!   each wrapped service remembers the route it resolved first behind an `Arc` (axum clones
//!   a route's service for every request: state kept in the clone itself would be lost, and
//!   every request would take the registry's lock). A request then costs the function's
//!   extension lookup and one string comparison more than a fixed layer.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http::{Extensions, Method, Request, Response};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use crate::family::lock;
use crate::{Counter, Family, Gauge, Histogram, LATENCY_BUCKETS, MetricsError, Registry};

/// Methods with their own `method` label value; the rest are `other`.
const METHODS: [&str; 10] = [
    "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH", "other",
];

/// Statuses with a dense slot. Others are still counted exactly, through the family's cold
/// path (a lock and a hash), which only rare statuses take.
const STATUSES: [u16; 37] = [
    100, 101, 200, 201, 202, 204, 206, 301, 302, 303, 304, 307, 308, 400, 401, 403, 404, 405, 406,
    408, 409, 410, 411, 413, 414, 415, 416, 421, 422, 429, 431, 499, 500, 501, 502, 503, 504,
];

/// Slot of requests whose service returned an error instead of a response
/// (`status="error"`).
const ERROR_SLOT: usize = STATUSES.len();
const STATUS_SLOTS: usize = STATUSES.len() + 1;
const NO_SLOT: u8 = u8::MAX;

/// Status code → dense slot, `NO_SLOT` for codes without one.
static STATUS_INDEX: [u8; 600] = {
    let mut table = [NO_SLOT; 600];
    let mut i = 0;
    while i < STATUSES.len() {
        table[STATUSES[i] as usize] = i as u8;
        i += 1;
    }
    table
};

/// Route label of a request whose [`RouteOf`] found no route (axum's fallback, a 404): one
/// series for all of them, never the raw path. A matched path always starts with `/`, so
/// this cannot collide with one.
pub const UNMATCHED_ROUTE: &str = "unmatched";

/// Reads a request's route label from its extensions: a route name or pattern, never the
/// raw path (it is a label value, and the paths a client sends are unbounded). For axum,
/// the matched path (the router inserts it before the layers of [`Router::layer`] and
/// `route_layer` run; [`RequestMetrics::layer`] shows the whole use):
///
/// ```
/// use axum::extract::MatchedPath;
///
/// fn matched_path(extensions: &http::Extensions) -> Option<&str> {
///     extensions.get::<MatchedPath>().map(MatchedPath::as_str)
/// }
///
/// let route_of: tailguard_metrics::RouteOf = matched_path;
/// // Outside a router nothing matched: the layer records `route="unmatched"`.
/// assert_eq!(route_of(&http::Extensions::new()), None);
/// ```
///
/// [`Router::layer`]: https://docs.rs/axum/0.8/axum/struct.Router.html#method.layer
pub type RouteOf = for<'a> fn(&'a Extensions) -> Option<&'a str>;

/// nginx's code for "the client closed the connection before the response": recorded for a
/// request whose future was dropped before it completed.
const CLIENT_CLOSED: u16 = 499;

fn method_index(method: &Method) -> usize {
    let known = [
        Method::GET,
        Method::HEAD,
        Method::POST,
        Method::PUT,
        Method::DELETE,
        Method::CONNECT,
        Method::OPTIONS,
        Method::TRACE,
        Method::PATCH,
    ];
    known
        .iter()
        .position(|m| m == method)
        .unwrap_or(METHODS.len() - 1)
}

/// The request-metric families of one service, and its routes.
#[derive(Debug)]
pub struct RequestMetrics {
    requests: Family<Counter>,
    duration: Family<Histogram>,
    in_flight: Family<Gauge>,
    routes: Mutex<HashMap<String, &'static RouteMetrics>>,
}

impl RequestMetrics {
    /// Registers `{prefix}_requests_total{route,method,status}`,
    /// `{prefix}_request_duration_seconds{route}` (latency buckets) and
    /// `{prefix}_requests_in_flight{route}`.
    pub fn register(registry: &Registry, prefix: &str) -> Result<Self, MetricsError> {
        Ok(RequestMetrics {
            requests: registry.counter(
                &format!("{prefix}_requests"),
                "Requests answered, by route, method and status.",
                &["route", "method", "status"],
            )?,
            duration: registry.histogram(
                &format!("{prefix}_request_duration_seconds"),
                "Time from receiving a request to sending its response head.",
                &["route"],
                &LATENCY_BUCKETS,
            )?,
            in_flight: registry.gauge(
                &format!("{prefix}_requests_in_flight"),
                "Requests received and not yet answered.",
                &["route"],
            )?,
            routes: Mutex::default(),
        })
    }

    /// One layer for a whole router: each request is recorded under the route `route_of`
    /// reads from its extensions ([`UNMATCHED_ROUTE`] when it reads none).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tailguard_metrics::{Format, Registry, RequestMetrics};
    /// use tower::{Layer, Service, ServiceExt, service_fn};
    ///
    /// /// What the router put in the request: here a `&'static str`, in axum `MatchedPath`.
    /// fn route_of(extensions: &http::Extensions) -> Option<&str> {
    ///     extensions.get::<&'static str>().copied()
    /// }
    ///
    /// let registry = Registry::builder().self_metrics_prefix(None).build()?;
    /// let metrics = Arc::new(RequestMetrics::register(&registry, "app")?);
    /// let mut service = metrics.layer(route_of).layer(service_fn(|_req: http::Request<()>| async {
    ///     Ok::<_, std::convert::Infallible>(http::Response::new(()))
    /// }));
    /// # tokio::runtime::Builder::new_current_thread().build()?.block_on(async {
    /// for id in 1..=3 {
    ///     let mut request = http::Request::get(format!("/users/{id}")).body(())?;
    ///     request.extensions_mut().insert("/users/{id}");
    ///     service.ready().await?.call(request).await?;
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })?;
    /// let text = String::from_utf8(registry.render(Format::Text))?;
    /// assert!(text.contains("app_requests_total{route=\"/users/{id}\",method=\"GET\",status=\"200\"} 3\n"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn layer(self: &Arc<Self>, route_of: RouteOf) -> RequestMetricsLayer {
        RequestMetricsLayer {
            route: LayerRoute::Matched {
                metrics: Arc::clone(self),
                route_of,
            },
        }
    }

    /// The metrics of `route` (a route name or pattern, never a raw path: it is a label
    /// value). Resolved once and kept for the life of the process, so asking again for
    /// the same route (e.g. after a config reload) returns the same object.
    pub fn route(&self, route: &str) -> Result<&'static RouteMetrics, MetricsError> {
        let mut routes = lock(&self.routes);
        if let Some(found) = routes.get(route) {
            return Ok(found);
        }
        let metrics: &'static RouteMetrics = Box::leak(Box::new(RouteMetrics {
            requests: StatusCounters::new(self.requests.clone(), route)?,
            duration: self.duration.get_or_create(&[route])?,
            in_flight: self.in_flight.get_or_create(&[route])?,
        }));
        routes.insert(route.to_owned(), metrics);
        Ok(metrics)
    }
}

/// The handles of one route. Get it from [`RequestMetrics::route`]; put
/// [`RouteMetrics::layer`] on the route's service, or call [`RouteMetrics::start`] yourself.
#[derive(Debug)]
pub struct RouteMetrics {
    requests: StatusCounters,
    duration: Histogram,
    in_flight: Gauge,
}

impl RouteMetrics {
    /// A layer recording this route's metrics around a service.
    pub fn layer(&'static self) -> RequestMetricsLayer {
        RequestMetricsLayer {
            route: LayerRoute::Fixed(self),
        }
    }

    /// The route label these metrics carry.
    pub fn name(&self) -> &str {
        &self.requests.route
    }

    /// Starts timing one request: counts it in flight until the returned guard is finished
    /// or dropped (a drop without [`InFlight::finish`] records status 499, as nginx does).
    pub fn start(&'static self, method: &Method) -> InFlight {
        self.in_flight.inc();
        InFlight {
            route: self,
            method: method_index(method) as u8,
            start: Instant::now(),
            finished: false,
        }
    }

    fn record(&self, method: usize, status: Option<u16>, elapsed: Duration) {
        self.duration.observe_duration(elapsed);
        self.requests.inc_index(method, status);
    }
}

/// Request counters of one route by method and status: a dense `[method][status]` table
/// of handles over a family labelled `(route, method, status)`, each handle created on
/// first use. Counting a request is an index computation, two acquire loads and one
/// relaxed add. Statuses outside the common set are counted exactly through the family's
/// cold path.
///
/// A method's row of statuses is made at its first request: a route that has served
/// nothing holds ten empty cells (160 bytes), not the 380 handles' room (9 KB) a full
/// table takes, so a table of 100,000 routes costs little more than its config.
#[derive(Debug)]
pub struct StatusCounters {
    route: Box<str>,
    family: Family<Counter>,
    table: [OnceLock<Box<StatusRow>>; METHODS.len()],
}

/// One method's handles, by status slot.
type StatusRow = [OnceLock<Counter>; STATUS_SLOTS];

impl StatusCounters {
    /// Counters of `route` in `family`, which must have exactly three labels: route,
    /// method and status, in that order.
    pub fn new(family: Family<Counter>, route: &str) -> Result<Self, MetricsError> {
        // Fails now, not on the first request, if the family has other labels.
        if family.core.label_names.len() != 3 {
            return Err(MetricsError::LabelCount {
                family: family.name().to_owned(),
                expected: family.core.label_names.len(),
                got: 3,
            });
        }
        Ok(StatusCounters {
            route: route.into(),
            family,
            table: Default::default(),
        })
    }

    /// Counts one request with `method` answered with `status` (`None`: no response,
    /// counted as `status="error"`).
    #[inline]
    pub fn inc(&self, method: &Method, status: Option<u16>) {
        self.inc_index(method_index(method), status);
    }

    fn inc_index(&self, method: usize, status: Option<u16>) {
        let slot = match status {
            None => ERROR_SLOT,
            Some(code) => match STATUS_INDEX.get(code as usize) {
                Some(&slot) if slot != NO_SLOT => slot as usize,
                _ => {
                    // Cold path for a rare status: exact, but takes the family lock.
                    if let Ok(counter) = self.family.get_or_create(&[
                        &self.route,
                        METHODS[method],
                        &code.to_string(),
                    ]) {
                        counter.inc();
                    }
                    return;
                }
            },
        };
        self.table[method].get_or_init(|| Box::new(std::array::from_fn(|_| OnceLock::new())))[slot]
            .get_or_init(|| {
                let status = match status {
                    Some(code) => code.to_string(),
                    None => "error".to_owned(),
                };
                self.family
                    .get_or_create(&[&self.route, METHODS[method], &status])
                    .expect("the family was checked to have three labels")
            })
            .inc();
    }
}

/// One request in flight on a route (RAII: dropping it unfinished records status 499).
#[derive(Debug)]
pub struct InFlight {
    route: &'static RouteMetrics,
    method: u8,
    start: Instant,
    finished: bool,
}

impl InFlight {
    /// Records the request as answered with `status` (`None`: the service failed without a
    /// response).
    pub fn finish(mut self, status: Option<u16>) {
        self.complete(status);
    }

    fn complete(&mut self, status: Option<u16>) {
        if !self.finished {
            self.finished = true;
            self.route.in_flight.dec();
            self.route
                .record(self.method as usize, status, self.start.elapsed());
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.complete(Some(CLIENT_CLOSED));
    }
}

/// Tower layer recording request metrics: of one route ([`RouteMetrics::layer`]) or of the
/// route each request names ([`RequestMetrics::layer`]).
#[derive(Debug, Clone)]
pub struct RequestMetricsLayer {
    route: LayerRoute,
}

#[derive(Debug, Clone)]
enum LayerRoute {
    Fixed(&'static RouteMetrics),
    Matched {
        metrics: Arc<RequestMetrics>,
        route_of: RouteOf,
    },
}

impl<S> Layer<S> for RequestMetricsLayer {
    type Service = RequestMetricsService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        let route = match &self.route {
            LayerRoute::Fixed(route) => ServiceRoute::Fixed(route),
            // One memory per wrapped service, shared by its clones: axum wraps each route
            // separately and clones the wrapped service per request.
            LayerRoute::Matched { metrics, route_of } => ServiceRoute::Matched(Arc::new(Matched {
                metrics: Arc::clone(metrics),
                route_of: *route_of,
                first: OnceLock::new(),
            })),
        };
        RequestMetricsService { inner, route }
    }
}

/// The service made by [`RequestMetricsLayer`].
#[derive(Debug, Clone)]
pub struct RequestMetricsService<S> {
    inner: S,
    route: ServiceRoute,
}

#[derive(Debug, Clone)]
enum ServiceRoute {
    Fixed(&'static RouteMetrics),
    Matched(Arc<Matched>),
}

#[derive(Debug)]
struct Matched {
    metrics: Arc<RequestMetrics>,
    route_of: RouteOf,
    /// The route this service resolved first: in axum, the only one it ever sees.
    first: OnceLock<&'static RouteMetrics>,
}

impl Matched {
    fn resolve(&self, extensions: &Extensions) -> Option<&'static RouteMetrics> {
        let name = (self.route_of)(extensions).unwrap_or(UNMATCHED_ROUTE);
        if let Some(first) = self.first.get()
            && first.name() == name
        {
            return Some(first);
        }
        // Cold: the registry's lock and a hash, once per wrapped service in axum (more only
        // if one service serves several routes, e.g. a nested service).
        let route = self.metrics.route(name).ok()?;
        let _ = self.first.set(route);
        Some(route)
    }
}

impl<S, B, RB> Service<Request<B>> for RequestMetricsService<S>
where
    S: Service<Request<B>, Response = Response<RB>>,
{
    type Response = Response<RB>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let route = match &self.route {
            ServiceRoute::Fixed(route) => Some(*route),
            ServiceRoute::Matched(matched) => matched.resolve(req.extensions()),
        };
        let in_flight = route.map(|route| route.start(req.method()));
        ResponseFuture {
            inner: self.inner.call(req),
            in_flight,
        }
    }
}

pin_project! {
    /// Response future of [`RequestMetricsService`]: records when the inner future resolves.
    #[derive(Debug)]
    pub struct ResponseFuture<F> {
        #[pin]
        inner: F,
        in_flight: Option<InFlight>,
    }
}

impl<F, RB, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<RB>, E>>,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let output = match this.inner.poll(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(output) => output,
        };
        if let Some(in_flight) = this.in_flight.take() {
            in_flight.finish(output.as_ref().ok().map(|r| r.status().as_u16()));
        }
        Poll::Ready(output)
    }
}
