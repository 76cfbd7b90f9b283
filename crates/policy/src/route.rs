//! Routing: routes compiled at config load into one list in precedence order and an
//! [`index`] over their hosts and paths, so a request head is tested against the few routes
//! that can match it, never the whole table; matching allocates nothing.
//!
//! Precedence follows the Kubernetes Gateway API HTTPRoute rules, with an explicit
//! `priority` first: higher priority; then a more specific host (exact, then the longest
//! wildcard suffix, then any host); then an exact path over any prefix, and a longer prefix
//! over a shorter one; then a method match over none; then more header matches; then file
//! order.

use std::cmp::Reverse;
use std::sync::Arc;

use http::{HeaderMap, HeaderName, HeaderValue, Method};

use tailguard_config::{PathMatch, RouteConfig};

pub mod index;

pub use index::HostMatch;
use index::RouteIndex;

/// A route as built at config load.
///
/// Seam: per-route state (metric handles with the route label resolved, shedder class,
/// access-log settings) is added here and reached through the index the router returns.
#[derive(Debug)]
pub struct Route {
    /// The route's id.
    pub id: Arc<str>,
    /// Index of its upstream in the snapshot's upstream list; [`Route::NO_UPSTREAM`] for a
    /// route that answers by itself (`redirect`, `respond`), which is answered right after
    /// routing and never reaches admission or forwarding.
    pub upstream: usize,
    /// Explicit priority.
    pub priority: i32,
    /// Host match.
    pub host: HostMatch,
    /// Path match (`Prefix("/")` when the config has none).
    pub path: PathMatch,
    /// Method match.
    pub method: Option<Method>,
    /// Header matches (all must hold).
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// `Host` to send upstream instead of the client's.
    pub host_rewrite: Option<HeaderValue>,
    /// Rewrite, header operations, local answer (`None`: none of them).
    pub policy: Option<Box<tailguard_config::policy::Policy>>,
    /// The route's own timeouts and retries.
    pub tries: crate::retry_policy::RoutePolicy,
    /// CORS (`None`: the route leaves CORS to its upstream).
    pub cors: Option<Box<tailguard_config::cors::Cors>>,
    /// `allow` / `deny` (`None`: every address may call).
    pub access: Option<Box<crate::access::AccessList>>,
    /// Response compression (`None`: the listener's, if it has one). Shared: a request
    /// that may be compressed holds it until its response head is decided.
    pub compress: Option<std::sync::Arc<tailguard_config::compress::Compress>>,
}

impl Route {
    /// The `upstream` of a route with none (it answers by itself). An index, not an
    /// `Option`, so that forwarding, which only ever sees routes with an upstream, reads it
    /// as it always has.
    pub const NO_UPSTREAM: usize = usize::MAX;

    /// Builds a route from its validated config; `upstream` is the index of its upstream
    /// ([`Route::NO_UPSTREAM`] if it has none).
    pub fn build(config: &RouteConfig, upstream: usize) -> Route {
        let host = match config
            .host
            .as_ref()
            .map(|h| h.get_ref().to_ascii_lowercase())
        {
            None => HostMatch::Any,
            Some(h) => match h.strip_prefix('*') {
                Some(suffix) => HostMatch::Suffix(suffix.to_owned()),
                None => HostMatch::Exact(h),
            },
        };
        Route {
            id: Arc::from(config.id.get_ref().as_str()),
            upstream,
            priority: config.priority,
            host,
            path: config
                .path
                .as_ref()
                .map_or(PathMatch::Prefix("/".to_owned()), |p| p.get_ref().clone()),
            method: config
                .method
                .as_ref()
                .and_then(|m| Method::from_bytes(m.get_ref().as_bytes()).ok()),
            headers: config
                .headers
                .iter()
                .filter_map(|h| {
                    let name = HeaderName::from_bytes(h.name.get_ref().as_bytes()).ok()?;
                    let value = HeaderValue::from_str(&h.value).ok()?;
                    Some((name, value))
                })
                .collect(),
            host_rewrite: config
                .host_rewrite
                .as_ref()
                .and_then(|h| HeaderValue::from_str(h.get_ref()).ok()),
            policy: tailguard_config::policy::Policy::build(config),
            tries: crate::retry_policy::RoutePolicy::build(config),
            // The config was validated, so it compiles.
            cors: config
                .cors
                .as_ref()
                .and_then(|c| c.get_ref().compile().ok())
                .map(Box::new),
            access: crate::access::AccessList::build(config.access()).map(Box::new),
            compress: config
                .compress
                .as_ref()
                .and_then(|c| c.get_ref().compile().ok())
                .map(std::sync::Arc::new),
        }
    }

    /// Sort key: smaller sorts first, i.e. wins.
    #[allow(clippy::type_complexity)]
    fn precedence(
        &self,
    ) -> (
        Reverse<i32>,
        Reverse<(u8, usize)>,
        Reverse<(u8, usize)>,
        Reverse<bool>,
        Reverse<usize>,
    ) {
        let host = match &self.host {
            HostMatch::Exact(_) => (2, 0),
            HostMatch::Suffix(s) => (1, s.len()),
            HostMatch::Any => (0, 0),
        };
        let path = match &self.path {
            PathMatch::Exact(p) => (2, p.len()),
            PathMatch::Prefix(p) => (1, p.trim_end_matches('/').len()),
        };
        (
            Reverse(self.priority),
            Reverse(host),
            Reverse(path),
            Reverse(self.method.is_some()),
            Reverse(self.headers.len()),
        )
    }

    fn matches(&self, host: &str, path: &str, method: &Method, headers: &HeaderMap) -> bool {
        let host_ok = match &self.host {
            HostMatch::Any => true,
            HostMatch::Exact(h) => host.eq_ignore_ascii_case(h),
            HostMatch::Suffix(s) => {
                host.len() > s.len()
                    && host.is_char_boundary(host.len() - s.len())
                    && host[host.len() - s.len()..].eq_ignore_ascii_case(s)
            }
        };
        host_ok
            && path_matches(&self.path, path)
            && self.method.as_ref().is_none_or(|m| m == method)
            && self
                .headers
                .iter()
                .all(|(n, v)| headers.get_all(n).iter().any(|got| got == v))
    }
}

fn path_matches(rule: &PathMatch, path: &str) -> bool {
    match rule {
        PathMatch::Exact(p) => path == p,
        PathMatch::Prefix(p) => {
            let p = p.trim_end_matches('/');
            // Segment boundary: `/api` matches `/api` and `/api/x`, not `/apix`.
            path.starts_with(p) && matches!(path.as_bytes().get(p.len()), None | Some(b'/'))
        }
    }
}

/// All routes of a config, in precedence order, and their index.
#[derive(Debug, Default)]
pub struct Router {
    routes: Vec<Route>,
    index: RouteIndex,
}

impl Router {
    /// Orders the routes by precedence (stable: file order breaks ties) and indexes them.
    pub fn new(mut routes: Vec<Route>) -> Router {
        routes.sort_by_key(Route::precedence);
        let index = RouteIndex::build(routes.iter().map(|r| (&r.host, &r.path)));
        Router { routes, index }
    }

    /// Index of the winning route for a request head, if any matches. `host` is the
    /// request's host without port. The index hands over the routes whose host and path can
    /// match; the first of them in precedence order that matches in full wins, the route
    /// [`Router::scan`] finds.
    pub fn find(
        &self,
        host: &str,
        path: &str,
        method: &Method,
        headers: &HeaderMap,
    ) -> Option<usize> {
        self.index
            .find(host, path, |i| {
                self.routes[i as usize].matches(host, path, method, headers)
            })
            .map(|i| i as usize)
    }

    /// What [`Router::find`] returns, found by testing every route in precedence order:
    /// the reference the index is proven against (its cost grows with the table; for tests
    /// and benchmarks, never the request path).
    pub fn scan(
        &self,
        host: &str,
        path: &str,
        method: &Method,
        headers: &HeaderMap,
    ) -> Option<usize> {
        self.routes
            .iter()
            .position(|r| r.matches(host, path, method, headers))
    }

    /// The route at an index [`Router::find`] returned.
    #[inline]
    pub fn get(&self, index: usize) -> &Route {
        &self.routes[index]
    }

    /// Routes in precedence order.
    pub fn routes(&self) -> &[Route] {
        &self.routes
    }
}

#[cfg(test)]
mod tests;
