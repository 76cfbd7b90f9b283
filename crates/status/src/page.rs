//! The [`StatusPage`]: a [`Page`] of the metrics exporter that answers `/status` (the HTML
//! page, embedded in the binary) and `/status.json`, and ticks every second on the exporter
//! thread to keep the window and the charts.
//!
//! The JSON is built at most once per tick, whoever asks: any number of open pages cost one
//! build a second (and one gzip when they accept it).

use std::io::Write as _;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use flate2::Compression;
use flate2::write::GzEncoder;
use http::{HeaderValue, Method, Response, StatusCode, header};
use tailguard_config::StatusAccess;
use tailguard_metrics::{Page, Registry, accepts_gzip};
use tailguard_proxy::Gateway;
use tailguard_proxy::snapshot::Snapshot;

use crate::access::Access;
use crate::build::{Info, build, route_upstreams};
use crate::model::Status;
use crate::sample::Sample;
use crate::window::Tracker;

/// The page, its styles and its script, in one file with nothing fetched from elsewhere.
const HTML: &str = include_str!("../assets/status.html");

/// Where the page is served.
pub const PAGE_PATH: &str = "/status";
/// Where its data is served.
pub const JSON_PATH: &str = "/status.json";

/// What the page allows itself: its own inline style and script, requests to its own
/// origin, no frame around it.
const CSP: &str = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                   connect-src 'self'; img-src data:; frame-ancestors 'none'; base-uri 'none'";

/// The status page of one gateway. Made before the gateway starts (the exporter starts
/// first), then [`StatusPage::attach`]ed to it.
#[derive(Debug)]
pub struct StatusPage {
    registry: Registry,
    info: Info,
    access: Access,
    gateway: OnceLock<Weak<Gateway>>,
    tracker: Mutex<Tracker>,
    /// The JSON of the last tick it was built for: (tick, plain, gzipped).
    cache: Mutex<Option<(u64, Bytes, Option<Bytes>)>>,
    /// Each route's upstream, for the snapshot it was built from (rebuilt when a reload
    /// or a DNS change swaps the snapshot; the snapshot is held so that its address is not
    /// reused by another while compared).
    routes: Mutex<Option<(Arc<Snapshot>, Arc<RouteUpstreams>)>>,
}

/// Each configured route id and its upstream's name.
type RouteUpstreams = std::collections::HashMap<String, Option<String>>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl StatusPage {
    /// A page over `registry` (the one the gateway records into), readable as `access` says.
    pub fn new(registry: Registry, info: Info, access: StatusAccess) -> Arc<StatusPage> {
        Arc::new(StatusPage {
            registry,
            info,
            access: Access::new(access),
            gateway: OnceLock::new(),
            tracker: Mutex::default(),
            cache: Mutex::default(),
            routes: Mutex::default(),
        })
    }

    /// Shows `gateway` (held weakly: the page never keeps it alive). Once.
    pub fn attach(&self, gateway: &Arc<Gateway>) {
        let _ = self.gateway.set(Arc::downgrade(gateway));
    }

    fn gateway(&self) -> Option<Arc<Gateway>> {
        self.gateway.get().and_then(Weak::upgrade)
    }

    /// One tick as of `now`: reads the registry (running its scrape hooks, as a scrape does)
    /// into the window. Nothing before the gateway is attached.
    pub fn tick_at(&self, now: Instant) {
        let Some(gateway) = self.gateway() else {
            return;
        };
        let routes = self.route_upstreams(gateway.snapshot());
        let sample = Sample::read(&self.registry.snapshot(), now, &routes);
        lock(&self.tracker).push(sample);
    }

    /// Each route's upstream in `snapshot`, built once per snapshot.
    fn route_upstreams(&self, snapshot: Arc<Snapshot>) -> Arc<RouteUpstreams> {
        let mut cached = lock(&self.routes);
        match &*cached {
            Some((of, routes)) if Arc::ptr_eq(of, &snapshot) => Arc::clone(routes),
            _ => {
                let routes = Arc::new(route_upstreams(&snapshot));
                *cached = Some((snapshot, Arc::clone(&routes)));
                routes
            }
        }
    }

    /// The document as of now (ticking first if no tick ran yet); `None` before the gateway
    /// is attached.
    pub fn status(&self) -> Option<Status> {
        let gateway = self.gateway()?;
        if lock(&self.tracker).window().is_none() {
            self.tick_at(Instant::now());
        }
        build(&self.info, &lock(&self.tracker), &gateway, Instant::now())
    }

    /// The JSON of the current tick, built once per tick; gzipped too when `gzip`.
    pub fn json(&self, gzip: bool) -> Option<Bytes> {
        let tick = lock(&self.tracker).ticks();
        let mut cache = lock(&self.cache);
        let fresh = cache
            .as_ref()
            .is_some_and(|(t, _, _)| *t == tick && tick > 0);
        if !fresh {
            let status = self.status()?;
            let json = serde_json::to_vec(&status).expect("the status serializes");
            let tick = lock(&self.tracker).ticks();
            *cache = Some((tick, Bytes::from(json), None));
        }
        let (_, plain, gzipped) = cache.as_mut()?;
        if !gzip {
            return Some(plain.clone());
        }
        if gzipped.is_none() {
            let mut encoder = GzEncoder::new(Vec::new(), Compression::fast());
            // Writing into a Vec cannot fail.
            let _ = encoder.write_all(plain);
            *gzipped = encoder.finish().ok().map(Bytes::from);
        }
        gzipped.clone()
    }
}

fn text(status: StatusCode, body: &'static str) -> Response<Bytes> {
    let mut r = Response::new(Bytes::from_static(body.as_bytes()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

fn refused(challenge: &'static str) -> Response<Bytes> {
    let mut r = text(StatusCode::UNAUTHORIZED, "401 unauthorized\n");
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static(challenge),
    );
    r
}

impl Page for StatusPage {
    fn respond(&self, request: &http::request::Parts) -> Option<Response<Bytes>> {
        let path = request.uri.path();
        let page = path == PAGE_PATH || path == "/status/";
        if !page && path != JSON_PATH {
            return None;
        }
        let mut response = if request.method != Method::GET && request.method != Method::HEAD {
            let mut r = text(StatusCode::METHOD_NOT_ALLOWED, "use GET\n");
            r.headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
            r
        } else if (!page || self.access.guards_page()) && !self.access.allows(&request.headers) {
            refused(
                self.access
                    .challenge()
                    .unwrap_or(crate::access::BEARER_CHALLENGE),
            )
        } else if page {
            let mut r = Response::new(Bytes::from_static(HTML.as_bytes()));
            let h = r.headers_mut();
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/html; charset=utf-8"),
            );
            h.insert(
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static(CSP),
            );
            h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
            h.insert(
                header::REFERRER_POLICY,
                HeaderValue::from_static("no-referrer"),
            );
            r
        } else {
            let gzip = accepts_gzip(
                request
                    .headers
                    .get(header::ACCEPT_ENCODING)
                    .and_then(|v| v.to_str().ok()),
            );
            match self.json(gzip) {
                None => text(StatusCode::SERVICE_UNAVAILABLE, "the gateway is starting\n"),
                Some(body) => {
                    let mut r = Response::new(body);
                    let h = r.headers_mut();
                    h.insert(
                        header::CONTENT_TYPE,
                        HeaderValue::from_static("application/json"),
                    );
                    if gzip {
                        h.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
                    }
                    h.insert(header::VARY, HeaderValue::from_static("Accept-Encoding"));
                    r
                }
            }
        };
        let h = response.headers_mut();
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        h.insert(
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        );
        Some(response)
    }

    fn tick_every(&self) -> Option<Duration> {
        Some(Duration::from_secs(1))
    }

    fn tick(&self) {
        self.tick_at(Instant::now());
    }
}
