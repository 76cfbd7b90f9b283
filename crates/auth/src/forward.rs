//! `type = "forward"`: the decision is an auth service's (nginx `auth_request`, Traefik
//! `ForwardAuth`, Envoy `ext_authz` over HTTP). For each request the gateway sends the auth
//! service a `GET` with the client's `request_headers` and `X-Forwarded-Method`, `-Uri`,
//! `-Host`, `-Proto`, `-For`; a `2xx` lets the request through with the answer's
//! `upstream_headers` set on it (the client's own copies removed first, by the gate); any
//! other answer goes back to the client as given (status, `WWW-Authenticate`, `Location`,
//! `Set-Cookie`, `Content-Type`, body up to [`BODY_LIMIT`]). The service unreachable, or
//! silent past `timeout_ms`: `503`, result `auth_service_error`; never let through.
//!
//! An `https://` service is called over TLS (rustls), verified against the system's roots and
//! the certificates of `ca` if given ([`crate::connect`]).
//!
//! The call is the request's [`Verdict::Pending`] future, awaited on the serving thread
//! that asked: no thread of its own, no CPU while it waits. Connections are keep-alive and
//! pooled per serving thread and authenticator (hyper-util's pooled client, one per thread,
//! so a connection's task and its requests share a runtime, as the gateway's upstream pools
//! do). With `cache`, answers other than `5xx` are remembered per serving thread for `ttl`,
//! keyed by a SHA-256 of the authenticator's salt, its revision (a config reload starts a
//! new one), the route and the values of `key_headers`: two clients share an answer only
//! when every key header is the same, so a decision never crosses identities.

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HOST, LOCATION, SET_COOKIE, WWW_AUTHENTICATE};
use http::{HeaderMap, HeaderName, HeaderValue, Request, StatusCode, Uri};
use http_body_util::{BodyExt as _, Empty, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::authenticate::{AuthRequest, Authenticate};
use crate::connect::Connector;
use crate::outcome::{Accepted, Outcome, Refusal, Verdict};
use crate::result::AuthResult;

/// The largest refusal body passed on to the client: a login page or a JSON error fits; an
/// auth service that answers more is broken (the answer becomes a `503`).
pub const BODY_LIMIT: usize = 64 * 1024;

/// Decisions remembered per serving thread and authenticator: at most this many; a full
/// table first drops what expired, then everything.
const CACHED: usize = 4096;

/// Idle keep-alive connections per serving thread and authenticator.
const IDLE_PER_THREAD: usize = 64;

/// What a [`Forward`] is built from.
#[derive(Debug, Clone)]
pub struct ForwardSettings {
    /// The auth service's URL (`http://host:port/path` or `https://...`): a `GET` to it per
    /// request.
    pub url: Uri,
    /// A PEM file of CA certificates trusted for an `https://` URL besides the system's.
    pub ca: Option<PathBuf>,
    /// Client headers passed to the auth service (besides the `X-Forwarded-*` ones).
    pub request_headers: Vec<HeaderName>,
    /// Headers of the service's `2xx` answer set on the request sent upstream.
    pub upstream_headers: Vec<HeaderName>,
    /// How long the service may take to answer (its head and body).
    pub timeout: Duration,
    /// `cache`: the headers that make the key, and how long an answer is remembered.
    pub cache: Option<(Vec<HeaderName>, Duration)>,
}

/// A forward-auth authenticator.
#[derive(Debug)]
pub struct Forward {
    settings: Arc<ForwardSettings>,
    /// `Host` of the call (the URL's authority).
    host: HeaderValue,
    /// The TLS config of an `https://` URL (read at build: never on a serving thread).
    tls: Option<Arc<rustls::ClientConfig>>,
    /// Ties a serving thread's client and cache entries to this authenticator: theirs die
    /// with it.
    id: Arc<()>,
    salt: [u8; 16],
    /// Bumped on each config reload that keeps this authenticator ([`Authenticate::revise`]):
    /// part of every cache key, so a reload forgets every remembered answer.
    revision: AtomicU64,
    /// Calls made to the service (tests and the lab: a cached answer makes none).
    calls: Arc<AtomicU64>,
}

/// A remembered answer.
#[derive(Debug, Clone)]
enum Decided {
    Accepted(Vec<(HeaderName, HeaderValue)>),
    Refused(Refusal),
}

type Cache = HashMap<[u8; 32], (Decided, Instant)>;

/// The pooled client of one authenticator on one serving thread.
type ThreadClient = Client<Connector, Empty<Bytes>>;

/// One authenticator's client and cache on a serving thread, tied to it by a weak pointer.
type PerThread = (Weak<()>, ThreadClient, Cache);

thread_local! {
    /// This serving thread's pooled client and cache of each forward authenticator.
    static THREAD: RefCell<Vec<PerThread>> = const { RefCell::new(Vec::new()) };
}

/// Header names an auth service's answer may never set on the request sent upstream: the
/// message's framing and hop-by-hop fields, and `Host` (the route's to decide).
pub const RESERVED: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "upgrade",
];

/// Whether the gateway can call `settings.url`: `http://` or `https://` with a host.
pub fn check_url(settings: &ForwardSettings) -> Result<(), String> {
    host_of(&settings.url).map(|_| ())
}

/// Whether `settings.ca` can be used: only with an `https://` URL, a readable PEM file of
/// certificates.
pub fn check_ca(settings: &ForwardSettings) -> Result<(), String> {
    let Some(path) = &settings.ca else {
        return Ok(());
    };
    if settings.url.scheme_str() != Some("https") {
        return Err("only with an https:// `url`".to_owned());
    }
    crate::connect::read_ca(path).map(|_| ())
}

fn host_of(url: &Uri) -> Result<HeaderValue, String> {
    if !matches!(url.scheme_str(), Some("http" | "https")) {
        return Err("must be an http:// or https:// URL".to_owned());
    }
    url.authority()
        .ok_or("has no host")?
        .as_str()
        .parse::<HeaderValue>()
        .map_err(|_| "has an invalid host".to_owned())
}

impl Forward {
    /// Builds it; `Err` for a URL it cannot call (not `http://` or `https://`, no host) or
    /// a `ca` it cannot read.
    pub fn build(settings: ForwardSettings) -> Result<Forward, String> {
        let host = host_of(&settings.url)?;
        check_ca(&settings)?;
        let tls = if settings.url.scheme_str() == Some("https") {
            Some(crate::connect::tls_config(settings.ca.as_deref())?)
        } else {
            None
        };
        let mut salt = [0u8; 16];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut salt)
            .map_err(|_| "no random bytes for the cache's salt".to_owned())?;
        Ok(Forward {
            settings: Arc::new(settings),
            host,
            tls,
            id: Arc::new(()),
            salt,
            revision: AtomicU64::new(0),
            calls: Arc::new(AtomicU64::new(0)),
        })
    }

    /// Calls made to the auth service so far.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// The cache key of a request, if the authenticator caches.
    fn key(&self, req: &AuthRequest<'_>) -> Option<[u8; 32]> {
        let (key_headers, _) = self.settings.cache.as_ref()?;
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        ctx.update(&self.salt);
        ctx.update(&self.revision.load(Ordering::Relaxed).to_le_bytes());
        let mut field = |bytes: &[u8]| {
            // Length-prefixed, so no two lists of values make the same bytes.
            ctx.update(&(bytes.len() as u64).to_le_bytes());
            ctx.update(bytes);
        };
        field(req.route.as_bytes());
        for name in key_headers {
            let values = req.headers.get_all(name);
            field(&[u8::from(values.iter().next().is_some())]);
            for v in values {
                field(v.as_bytes());
            }
        }
        let mut out = [0u8; 32];
        out.copy_from_slice(ctx.finish().as_ref());
        Some(out)
    }

    /// The call's head: the client's `request_headers` and the `X-Forwarded-*` fields.
    fn call(&self, req: &AuthRequest<'_>) -> Request<Empty<Bytes>> {
        let mut call = Request::new(Empty::new());
        *call.uri_mut() = self.settings.url.clone();
        let headers = call.headers_mut();
        for name in &self.settings.request_headers {
            for v in req.headers.get_all(name) {
                headers.append(name.clone(), v.clone());
            }
        }
        headers.insert(HOST, self.host.clone());
        headers.insert(
            HeaderName::from_static("x-forwarded-method"),
            HeaderValue::from_str(req.method.as_str()).unwrap_or(HeaderValue::from_static("GET")),
        );
        let target = req.uri.path_and_query().map_or("/", |p| p.as_str());
        if let Ok(v) = HeaderValue::from_str(target) {
            headers.insert(HeaderName::from_static("x-forwarded-uri"), v);
        }
        let host = req
            .uri
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
            .or_else(|| req.headers.get(HOST).cloned());
        if let Some(host) = host {
            headers.insert(HeaderName::from_static("x-forwarded-host"), host);
        }
        headers.insert(
            HeaderName::from_static("x-forwarded-proto"),
            HeaderValue::from_static(if req.tls { "https" } else { "http" }),
        );
        headers.insert(
            HeaderName::from_static("x-forwarded-for"),
            ip_value(req.client),
        );
        call
    }
}

fn ip_value(ip: IpAddr) -> HeaderValue {
    HeaderValue::from_str(&ip.to_string()).expect("an IP address is a valid header value")
}

/// This thread's client for the authenticator `id`, made on first use; entries of dropped
/// authenticators are pruned then.
fn thread_client(id: &Arc<()>, tls: Option<&Arc<rustls::ClientConfig>>) -> ThreadClient {
    THREAD.with(|t| {
        let mut t = t.borrow_mut();
        if let Some((_, client, _)) = t.iter().find(|(w, _, _)| w.as_ptr() == Arc::as_ptr(id)) {
            return client.clone();
        }
        t.retain(|(w, _, _)| w.strong_count() > 0);
        let connector = Connector::new(tls.cloned());
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(IDLE_PER_THREAD)
            .pool_idle_timeout(Duration::from_secs(60))
            .build(connector);
        t.push((Arc::downgrade(id), client.clone(), HashMap::new()));
        client
    })
}

/// Runs `f` on this thread's cache of the authenticator `id` (none if it has no client on
/// this thread yet).
fn with_cache<T>(id: &Arc<()>, f: impl FnOnce(&mut Cache) -> T) -> Option<T> {
    THREAD.with(|t| {
        let mut t = t.borrow_mut();
        t.iter_mut()
            .find(|(w, _, _)| w.as_ptr() == Arc::as_ptr(id))
            .map(|(_, _, cache)| f(cache))
    })
}

/// What the service's answer means for the request.
fn decide(
    status: StatusCode,
    headers: &HeaderMap,
    body: Bytes,
    upstream_headers: &[HeaderName],
) -> Decided {
    if status.is_success() {
        let mut set = Vec::new();
        for name in upstream_headers {
            // One value per name: the last, as a header set by a proxy is one field.
            if let Some(v) = headers.get_all(name).iter().next_back() {
                set.push((name.clone(), v.clone()));
            }
        }
        return Decided::Accepted(set);
    }
    let mut passed = HeaderMap::new();
    for name in [WWW_AUTHENTICATE, LOCATION, SET_COOKIE, CONTENT_TYPE] {
        for v in headers.get_all(&name) {
            passed.append(name.clone(), v.clone());
        }
    }
    Decided::Refused(Refusal {
        result: AuthResult::Refused,
        status,
        headers: passed,
        body,
    })
}

fn outcome(decided: Decided) -> Outcome {
    match decided {
        Decided::Accepted(headers) => Outcome::Accepted(Accepted {
            consumer: None,
            headers,
            strip: None,
        }),
        Decided::Refused(r) => Outcome::Refused(r),
    }
}

/// The answer when the service could not be asked: `503`, never let through.
fn unavailable() -> Outcome {
    let mut r = Refusal::text(
        AuthResult::AuthServiceError,
        StatusCode::SERVICE_UNAVAILABLE,
    );
    r.headers
        .insert(http::header::RETRY_AFTER, HeaderValue::from_static("1"));
    Outcome::Refused(r)
}

impl Authenticate for Forward {
    fn check(&self, req: &AuthRequest<'_>) -> Verdict {
        let key = self.key(req);
        let client = thread_client(&self.id, self.tls.as_ref());
        if let Some(key) = key {
            let now = Instant::now();
            let hit = with_cache(&self.id, |c| {
                c.get(&key)
                    .filter(|(_, until)| now < *until)
                    .map(|(d, _)| d.clone())
            })
            .flatten();
            if let Some(decided) = hit {
                return Verdict::Ready(outcome(decided));
            }
        }
        let call = self.call(req);
        let settings = Arc::clone(&self.settings);
        let id = Arc::downgrade(&self.id);
        let calls = Arc::clone(&self.calls);
        Verdict::Pending(Box::pin(async move {
            calls.fetch_add(1, Ordering::Relaxed);
            let exchange = async {
                let resp = client.request(call).await.map_err(|e| e.to_string())?;
                let (parts, body) = resp.into_parts();
                let body = Limited::new(body, BODY_LIMIT)
                    .collect()
                    .await
                    .map_err(|e| e.to_string())?
                    .to_bytes();
                Ok::<_, String>((parts, body))
            };
            let (parts, body) = match tokio::time::timeout(settings.timeout, exchange).await {
                Ok(Ok(answer)) => answer,
                Ok(Err(e)) => {
                    tracing::debug!(target: "tailguard::auth", url = %settings.url, "auth service failed: {e}");
                    return unavailable();
                }
                Err(_) => {
                    tracing::debug!(target: "tailguard::auth", url = %settings.url, "auth service timed out");
                    return unavailable();
                }
            };
            let decided = decide(
                parts.status,
                &parts.headers,
                body,
                &settings.upstream_headers,
            );
            if let (Some(key), Some((_, ttl)), Some(id)) = (key, &settings.cache, id.upgrade())
                && !parts.status.is_server_error()
            {
                let until = Instant::now() + *ttl;
                with_cache(&id, |c| {
                    if c.len() >= CACHED {
                        let now = Instant::now();
                        c.retain(|_, (_, u)| now < *u);
                        if c.len() >= CACHED {
                            c.clear();
                        }
                    }
                    c.insert(key, (decided.clone(), until));
                });
            }
            outcome(decided)
        }))
    }

    fn sets_headers(&self) -> &[HeaderName] {
        &self.settings.upstream_headers
    }

    fn revise(&self) {
        self.revision.fetch_add(1, Ordering::Relaxed);
    }
}
