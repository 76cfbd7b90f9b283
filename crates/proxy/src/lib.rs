//! The gateway: routes, the HTTP data path and the server, built from a config, over the
//! upstream side of `tailguard-upstream` (endpoints, DNS, pools, health, balancers), the
//! HTTP vocabulary of `tailguard-http` and the route policy of `tailguard-policy`.
//!
//! A [`Config`] (the `tailguard-config` crate: parsed and validated from TOML, every error
//! with file:line:column) is built into a [`snapshot::Snapshot`]: a
//! [`Router`](tailguard_policy::route::Router) with the routes in precedence order, the
//! [`Upstream`](tailguard_upstream::upstream::Upstream)s with their endpoints and
//! [`Balance`](tailguard_upstream::balance::Balance)r, and a pooled keep-alive upstream
//! client. A [`Server`] binds the listeners and serves each connection (HTTP/1.1, h2c, or
//! TLS with ALPN) through the current snapshot; [`Server::reload`] swaps in a new one
//! atomically (binding, keeping or closing listeners as the new config says) and
//! [`Server::shutdown`] drains.
//!
//! A request goes through the data path's stages (`data_path.rs`, `serve`): head parsed →
//! by address (`allow` / `deny`) → rate limit → route → auth → local answer →
//! [`admit`](tailguard_policy::admission::admit) → forward with retries (hop-by-hop headers
//! removed, forwarding headers added, body streamed under its limit) → response streamed back → [`finish::finish`]. Failures are
//! [`Error`]s, each with a blame and one status ([`Error::status`]). See
//! `docs/life-of-a-request.md`; the modules' floors are in ARCHITECTURE.md ("Layers").
//!
//! ```
//! use std::path::Path;
//! use tailguard_proxy::Config;
//!
//! let config = Config::parse(
//!     r#"
//! [[listeners]]
//! address = "127.0.0.1:8080"
//!
//! [[routes]]
//! id = "api"
//! upstream = "missing"
//! bogus = 1
//! "#,
//!     "gw.toml",
//!     Path::new("."),
//! );
//! let err = config.unwrap_err().to_string();
//! assert_eq!(
//!     err,
//!     "gw.toml:8:1: routes[0]: unknown field `bogus`, expected one of `id`, `upstream`, \
//!      `priority`, `host`, `path`, `method`, `headers`, `host_rewrite`, `rewrite`, \
//!      `redirect`, `respond`, `request_headers`, `response_headers`, `timeouts`, `retry`, \
//!      `allow`, `deny`, `rate_limit`, `tracing`, `cors`, `compress`, `stream_request`, `auth`"
//! );
//! ```

pub mod access_log;
pub(crate) mod auth;
pub mod builtin;
pub(crate) mod clients;
pub(crate) mod conn;
pub(crate) mod data_path;
pub(crate) mod drain;
pub mod finish;
pub(crate) mod forward;
pub(crate) mod forward_h2;
pub mod gateway;
pub(crate) mod handler;
pub(crate) mod holdoff;
pub(crate) mod log_every;
pub mod metrics;
pub(crate) mod park;
pub mod record;
pub mod reloads;
pub(crate) mod respond;
pub mod response_body;
pub(crate) mod retired;
pub mod retry;
pub mod server;
pub mod snapshot;
pub mod sni;
pub mod tls;
pub mod trace;

pub use gateway::Gateway;
pub use metrics::GatewayMetrics;
pub use server::Server;
// The config a `Server` is built from and the error every function here returns: the types
// of this crate's own API, at its root.
pub use tailguard_config::Config;
pub use tailguard_http::{Blame, Error};
