//! The document `/status.json` serves and the page draws: every field is described in
//! `docs/status.md`, and `tests/schema.rs` checks a live document against
//! `schema/status.schema.json`. Rates are per second over the last 10 s; latencies in
//! milliseconds; ages and times left in milliseconds; `null` where a figure is not known
//! (no traffic in the window, a feature that is off).
//!
//! Nothing here may carry a secret: no TLS key, password, token, API key or header value.

use serde::Serialize;

/// The version of this document's shape; raised when a field changes meaning or goes.
pub const SCHEMA_VERSION: u32 = 1;

/// The whole document.
#[derive(Debug, Clone, Serialize)]
pub struct Status {
    /// [`SCHEMA_VERSION`].
    pub schema: u32,
    /// When it was built, in milliseconds since the Unix epoch.
    pub generated_at_ms: u64,
    /// What a person must notice at once, most severe first.
    pub alerts: Vec<Alert>,
    /// The gateway as a whole.
    pub gateway: GatewayStatus,
    /// Configured routes, in precedence order.
    pub routes: Vec<RouteStatus>,
    /// Configured upstreams, in config order.
    pub upstreams: Vec<UpstreamStatus>,
    /// The CPU-aware shedder.
    pub shedder: ShedderStatus,
    /// The OTLP trace exporter.
    pub tracing: TracingStatus,
    /// The access log.
    pub access_log: AccessLogStatus,
    /// The charts' points.
    pub history: History,
}

/// `red` (something is refusing or failing now) or `amber` (something to look at).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Refusing or failing now.
    Red,
    /// Worth a look.
    Amber,
}

/// One state a person must notice.
#[derive(Debug, Clone, Serialize)]
pub struct Alert {
    /// How bad.
    pub severity: Severity,
    /// What kind: `endpoint_down`, `upstream_down`, `route_shedding`, `breaker_open`,
    /// `reload_failed`, `etcd_disconnected`, `upstream_overloaded`, `route_errors`,
    /// `spans_dropped`, `log_lines_dropped`.
    pub kind: &'static str,
    /// What it is about: a route id, an upstream, `upstream/endpoint`, or `gateway`.
    pub subject: String,
    /// A sentence for a person.
    pub message: String,
}

/// The gateway as a whole.
#[derive(Debug, Clone, Serialize)]
pub struct GatewayStatus {
    /// The running build.
    pub version: String,
    /// Seconds since the process started.
    pub uptime_s: f64,
    /// Where the running config came from.
    pub config: ConfigSource,
    /// The last reloads, newest first.
    pub reloads: Vec<ReloadStatus>,
    /// Whether the last reload was applied (or none was tried).
    pub last_reload_ok: bool,
    /// Serving threads.
    pub threads: usize,
    /// Client connections open now.
    pub connections_open: f64,
    /// Of those, idle HTTP/1.1 connections parked.
    pub connections_parked: f64,
    /// Requests received and not finished.
    pub in_flight: f64,
    /// Requests per second (every route, and requests no route matched).
    pub requests_per_s: f64,
    /// Responses per second by class.
    pub status_per_s: StatusClasses,
    /// Median request duration.
    pub p50_ms: Option<f64>,
    /// 99th percentile request duration.
    pub p99_ms: Option<f64>,
}

/// Where the running config came from.
#[derive(Debug, Clone, Serialize)]
pub struct ConfigSource {
    /// `file`, `etcd` or `default` (the embedded config).
    pub kind: &'static str,
    /// The file's path, `etcd:KEY@REVISION`, or the cache file an etcd node started from.
    pub name: String,
    /// etcd only: serving the local cache because etcd was not reachable at start.
    pub cached: Option<bool>,
    /// etcd only: the watch is established.
    pub connected: Option<bool>,
    /// etcd only: the revision being served.
    pub revision: Option<f64>,
}

/// One reload.
#[derive(Debug, Clone, Serialize)]
pub struct ReloadStatus {
    /// When, in milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// What was loaded.
    pub source: String,
    /// Whether it was applied.
    pub ok: bool,
    /// Why not (the config errors, one per line).
    pub error: Option<String>,
}

/// Responses per second by status class.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct StatusClasses {
    /// 1xx.
    #[serde(rename = "1xx")]
    pub c1xx: f64,
    /// 2xx.
    #[serde(rename = "2xx")]
    pub c2xx: f64,
    /// 3xx.
    #[serde(rename = "3xx")]
    pub c3xx: f64,
    /// 4xx.
    #[serde(rename = "4xx")]
    pub c4xx: f64,
    /// 5xx.
    #[serde(rename = "5xx")]
    pub c5xx: f64,
}

impl StatusClasses {
    /// From `1xx` ... `5xx` in order.
    pub fn from_array(c: [f64; 5]) -> StatusClasses {
        StatusClasses {
            c1xx: c[0],
            c2xx: c[1],
            c3xx: c[2],
            c4xx: c[3],
            c5xx: c[4],
        }
    }
}

/// One route.
#[derive(Debug, Clone, Serialize)]
pub struct RouteStatus {
    /// Its `id`.
    pub id: String,
    /// Its upstream, `null` for a route that answers by itself.
    pub upstream: Option<String>,
    /// Requests per second.
    pub requests_per_s: f64,
    /// Responses per second by class.
    pub status_per_s: StatusClasses,
    /// Median duration.
    pub p50_ms: Option<f64>,
    /// 99th percentile duration.
    pub p99_ms: Option<f64>,
    /// Requests refused `429` by its rate limit, per second.
    pub rate_limited_per_s: f64,
    /// Requests shed (`503`) by the shedder or its upstream's concurrency limit, per second.
    pub shed_per_s: f64,
    /// Tries sent again, per second.
    pub retries_per_s: f64,
    /// Its route group is hot: it admits no more than its limit now (requests over it are
    /// shed, counted in `shed_per_s`).
    pub shedding: bool,
}

/// One upstream.
#[derive(Debug, Clone, Serialize)]
pub struct UpstreamStatus {
    /// Its `name`.
    pub name: String,
    /// `http1`, `h2c` or `h2`.
    pub protocol: String,
    /// `round_robin` or `p2c_ewma`.
    pub balance: String,
    /// Why it has no endpoint (its names did not resolve), if it has none.
    pub unavailable: Option<String>,
    /// Endpoints that may take traffic.
    pub endpoints_up: usize,
    /// Endpoints configured (addresses resolved).
    pub endpoints_total: usize,
    /// Requests per second through its routes.
    pub requests_per_s: f64,
    /// Of those, 5xx per second.
    pub errors_per_s: f64,
    /// Median time to the response head, over its endpoints.
    pub p50_ms: Option<f64>,
    /// 99th percentile time to the response head.
    pub p99_ms: Option<f64>,
    /// Tries sent again, per second.
    pub retries_per_s: f64,
    /// Its retry budget over the last 10 s.
    pub retry_budget: Option<RetryBudgetStatus>,
    /// Its adaptive concurrency limit (`[overload]` adaptive or gozero), `null` when off.
    pub concurrency: Option<ConcurrencyStatus>,
    /// The adaptive breaker of each of its routes.
    pub breakers: Vec<BreakerStatus>,
    /// Active checks and passive ejection, `null` without `[upstreams.health]`.
    pub health: Option<HealthSettingsStatus>,
    /// Its endpoints, in config order.
    pub endpoints: Vec<EndpointStatus>,
}

/// A retry budget.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct RetryBudgetStatus {
    /// Retries taken.
    pub used: u64,
    /// Retries allowed.
    pub allowed: u64,
}

/// An upstream's adaptive concurrency limit.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ConcurrencyStatus {
    /// The limit admissions see now.
    pub limit: f64,
    /// Requests in flight as the limit counts them.
    pub in_flight: f64,
    /// The measured no-queue response time.
    pub min_rtt_ms: Option<f64>,
    /// The latency target: `min_rtt x (1 + tolerance)`.
    pub target_ms: Option<f64>,
    /// The limit sees an overload and enforces itself.
    pub overloaded: bool,
    /// Requests it refused, per second.
    pub refused_per_s: f64,
}

/// The breaker of one (upstream, route).
#[derive(Debug, Clone, Serialize)]
pub struct BreakerStatus {
    /// The route.
    pub route: String,
    /// `closed`, `throttling` or `open`.
    pub state: &'static str,
    /// The share of requests it rejects now.
    pub reject_ratio: f64,
}

/// An upstream's `[upstreams.health]`.
#[derive(Debug, Clone, Serialize)]
pub struct HealthSettingsStatus {
    /// The active check's path, `null` without active checks.
    pub check_path: Option<String>,
    /// Time between checks.
    pub check_interval_ms: Option<u64>,
    /// Passive ejection is on.
    pub ejection: bool,
}

/// One endpoint.
#[derive(Debug, Clone, Serialize)]
pub struct EndpointStatus {
    /// `IP:PORT`.
    pub address: String,
    /// The DNS name it was resolved from.
    pub name: Option<String>,
    /// Its configured weight.
    pub weight: u32,
    /// `up`, `down` (by checks), `ejected`, or `down+ejected`.
    pub state: &'static str,
    /// Why it last changed state.
    pub reason: Option<String>,
    /// How long ago it last changed state.
    pub since_ms: Option<u64>,
    /// Time left of its ejection.
    pub ejected_for_ms: Option<u64>,
    /// The last active check.
    pub last_check: Option<CheckStatus>,
    /// Consecutive failed requests (passive ejection's count).
    pub failures: u32,
    /// Requests in flight as its balancer counts them (p2c-EWMA only).
    pub in_flight: Option<i64>,
    /// Its balancer's peak-EWMA latency (p2c-EWMA only).
    pub ewma_ms: Option<f64>,
    /// Mean time to the response head over the window.
    pub latency_ms: Option<f64>,
    /// Picks per second by the balancer.
    pub picks_per_s: f64,
    /// Idle keep-alive connections pooled (HTTP/1.1).
    pub pooled: usize,
}

/// One active check.
#[derive(Debug, Clone, Serialize)]
pub struct CheckStatus {
    /// How long ago.
    pub age_ms: u64,
    /// Whether it passed.
    pub ok: bool,
    /// `status NNN`, or why there was none.
    pub result: String,
}

/// The shedder.
#[derive(Debug, Clone, Serialize)]
pub struct ShedderStatus {
    /// `off`, `adaptive` or `gozero`.
    pub mode: String,
    /// Smoothed CPU use of the process's budget (0 to 1), `null` when not read.
    pub cpu: Option<f64>,
    /// The CPU share that counts as overloaded.
    pub threshold: f64,
    /// Requests shed per second, every route.
    pub shed_per_s: f64,
    /// Routes whose group sheds now.
    pub shedding_routes: Vec<String>,
}

/// The trace exporter (`enabled: false` and zeros without `[tracing]`).
#[derive(Debug, Clone, Serialize)]
pub struct TracingStatus {
    /// `[tracing]` is on.
    pub enabled: bool,
    /// Spans the collector accepted, total.
    pub spans_exported: f64,
    /// Spans dropped, total.
    pub spans_dropped: f64,
    /// Failed export attempts, total.
    pub export_errors: f64,
    /// Spans exported per second.
    pub exported_per_s: f64,
    /// Spans dropped per second.
    pub dropped_per_s: f64,
    /// Spans waiting for export.
    pub queue: f64,
}

/// The access log (`enabled: false` when no listener logs).
#[derive(Debug, Clone, Serialize)]
pub struct AccessLogStatus {
    /// Some listener writes one.
    pub enabled: bool,
    /// Lines written, total.
    pub lines_written: f64,
    /// Lines dropped, total.
    pub lines_dropped: f64,
    /// Failed writes, total.
    pub write_errors: f64,
    /// Lines written per second.
    pub written_per_s: f64,
    /// Lines dropped per second.
    pub dropped_per_s: f64,
}

/// The charts: one point every `interval_s`, oldest first, the newest last.
#[derive(Debug, Clone, Serialize)]
pub struct History {
    /// Seconds between points.
    pub interval_s: u64,
    /// The gateway's.
    pub gateway: Chart,
    /// Each upstream's, in config order.
    pub upstreams: Vec<NamedChart>,
}

/// One chart's three lines, the same length.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Chart {
    /// Requests per second.
    pub requests_per_s: Vec<f64>,
    /// 5xx per second.
    pub errors_per_s: Vec<f64>,
    /// 99th percentile in ms, `null` where there was no traffic.
    pub p99_ms: Vec<Option<f64>>,
}

/// An upstream's chart.
#[derive(Debug, Clone, Serialize)]
pub struct NamedChart {
    /// The upstream.
    pub name: String,
    /// Its points.
    #[serde(flatten)]
    pub chart: Chart,
}
