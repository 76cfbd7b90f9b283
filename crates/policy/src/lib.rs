//! The gateway's routes compiled from the config, and what a route decides per request:
//! which route a request head matches, its rewrites and header operations, the answers it
//! gives by itself, its rate limits, its timeouts and retry policy, and admission. Built
//! once per snapshot; per request it decides from what it is handed (the head, a metric
//! family, the [`overload::Overload`]), never from the snapshot or the request's record.
//!
//! How the main types interact:
//! - A [`route::Router`] holds the [`route::Route`]s in precedence order, each built from
//!   its `RouteConfig` ([`route::Route::build`]) with its [`policy`] (the config's
//!   `Policy`: rewrite, header operations, a local answer) and its [`retry_policy`]
//!   (`RoutePolicy`: timeouts, retry conditions, backoff, retry counters).
//!   [`route::Router::find`] matches a request head and allocates nothing.
//! - [`rate_limit::Limiter`] is one limit (GCRA per key in a shared
//!   [`rate_limit::table::KeyTable`]); [`rate_limit::RateLimits`] holds the routes' limits.
//!   A refusal is a [`rate_limit::Limited`], which becomes `tailguard_http::Error::RateLimited`.
//! - [`overload::Overload`] holds the shedder, the breakers of each (upstream, route) and
//!   the retry budgets; [`admission::admit`] asks it whether a request is let in and
//!   returns the [`admission::AdmitGuard`] the request holds until its response finishes.
//!
//! - [`cors`] decides per request from a route's compiled `Cors`: a preflight's answer,
//!   and the fields an actual response gets for the request's `Origin` ([`cors::Actual`]).
//! - [`compress`] decides per request from a route's or listener's compiled `Compress`:
//!   the coding `Accept-Encoding` picks, whether the response is compressed (the skip
//!   rules), and its fields then.
//!
//! - [`access::AccessList`] is a route's or a listener's `allow` / `deny`, checked against
//!   [`access::client_ip`] (the peer, or behind trusted proxies the forwarded address).
//!
//! The modules, as floors (each names only modules below it): [`access`], [`retry_policy`],
//! [`rate_limit`], [`cors`], [`compress`]; [`route`]; [`policy`], [`overload`];
//! [`admission`].
//!
//! Routes from a config, matched against request heads:
//!
//! ```
//! use std::path::Path;
//!
//! use http::{HeaderMap, Method};
//! use tailguard_config::Config;
//! use tailguard_policy::route::{Route, Router};
//!
//! let config = Config::parse(
//!     r#"
//! [[listeners]]
//! address = "127.0.0.1:8080"
//!
//! [[upstreams]]
//! name = "api"
//! endpoints = [{ address = "127.0.0.1:9000" }]
//!
//! [[routes]]
//! id = "all"
//! upstream = "api"
//!
//! [[routes]]
//! id = "users"
//! upstream = "api"
//! path = { prefix = "/users" }
//! "#,
//!     "gw.toml",
//!     Path::new("."),
//! )
//! .expect("a valid config");
//! let router = Router::new(config.routes.iter().map(|r| Route::build(r, 0)).collect());
//!
//! let find = |path| {
//!     let i = router.find("example.com", path, &Method::GET, &HeaderMap::new());
//!     i.map(|i| router.get(i).id.to_string())
//! };
//! // The longer prefix wins over the catch-all, whatever the file order.
//! assert_eq!(find("/users/7").as_deref(), Some("users"));
//! assert_eq!(find("/health").as_deref(), Some("all"));
//! ```

pub mod access;
pub mod admission;
pub mod compress;
pub mod cors;
pub mod overload;
pub mod policy;
pub mod rate_limit;
pub mod retry_policy;
pub mod route;
