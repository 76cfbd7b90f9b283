//! The gateway's config file: its model, TOML parsed with positions, and every feature's
//! check, each error reported as `file:line:column: field: message`.
//!
//! [`Config::load`] (a file) or [`Config::parse`] (text) returns a [`Config`] that passed
//! every check, or [`Error::Config`] with every [`Diagnostic`] found. Parsing goes in two
//! steps so that one mistake does not hide the next: the document is first parsed into
//! spanned TOML values (collecting every syntax error), then each section and each element
//! of each array is deserialized on its own, and finally the checks (addresses, references
//! between sections, duplicates, certificates, each feature's own) run over everything that
//! did deserialize. `tailguard check` and a reload both print this same list.
//!
//! Every feature's config type and its check live here, and nothing here names the
//! runtime: the gateway (`tailguard-proxy`) builds its values from these types, from the
//! forms some checks produce on the way (a route's compiled [`policy::Policy`], a
//! listener's certificates loaded by [`tls::load_entry`], an upstream's TLS files parsed by
//! [`upstream_tls::load`]), so what was checked is what runs.
//!
//! The modules, as floors (each names only modules below it):
//! - [`diagnostic`], [`limits`] (`[timeouts]`, `[limits]`), [`cidr`], [`dns`], [`health`],
//!   [`rate_limit`], [`cors`], [`compress`], [`sni`], [`upstream_tls`], [`trace`]
//!   (`[tracing]`), [`status`], [`auth`] (`[[auth]]`, a route's `auth`): one section or
//!   value each, with its check;
//! - [`error`], [`retry`], [`tls`], [`upstream`];
//! - [`listener`], [`route`]: a listener and a route as written;
//! - [`policy`] (a route's policy compiled and checked), [`access_log`],
//!   [`file`](mod@file) (the whole [`Config`] and the command line's overrides);
//! - `validate` (the checks across sections), then [`parse`] on top.
//!
//! ```
//! use std::path::Path;
//! use tailguard_config::{Config, Protocol};
//!
//! let config = Config::parse(
//!     r#"
//! [[listeners]]
//! address = "127.0.0.1:8080"
//!
//! [[upstreams]]
//! name = "api"
//! protocol = "h2c"
//! endpoints = [{ address = "10.0.0.1:50051" }]
//!
//! [[routes]]
//! id = "grpc"
//! upstream = "api"
//! path = { prefix = "/" }
//! "#,
//!     "gw.toml",
//!     Path::new("."),
//! )
//! .expect("a valid config");
//! assert_eq!(*config.upstreams[0].protocol.get_ref(), Protocol::H2c);
//! assert_eq!(config.timeouts.connect_ms, 2_000, "the default");
//! ```
//!
//! Every problem is found, each with its position, in file order:
//!
//! ```
//! use std::path::Path;
//! use tailguard_config::{Config, Error};
//!
//! let text = r#"
//! [[listeners]]
//! address = "127.0.0.1:80800"
//!
//! [[routes]]
//! id = "api"
//! upstream = "missing"
//! "#;
//! let Err(Error::Config(diags)) = Config::parse(text, "gw.toml", Path::new(".")) else {
//!     panic!("an invalid config");
//! };
//! let lines: Vec<String> = diags.iter().map(ToString::to_string).collect();
//! assert_eq!(
//!     lines,
//!     [
//!         "gw.toml:3:11: listeners[0].address: `127.0.0.1:80800` is not an IP:PORT address",
//!         "gw.toml:7:12: routes[0].upstream: unknown upstream `missing`",
//!     ]
//! );
//! ```

pub mod access;
pub mod access_log;
pub mod auth;
pub mod cidr;
pub mod compress;
pub mod cors;
pub mod diagnostic;
pub mod dns;
pub mod error;
pub mod file;
pub mod health;
pub mod limits;
pub mod listener;
pub mod parse;
pub mod policy;
pub mod rate_limit;
pub mod redis;
pub mod retry;
pub mod route;
pub mod sni;
pub mod status;
pub mod tls;
pub mod trace;
pub mod upstream;
pub mod upstream_tls;
mod validate;

pub use diagnostic::Diagnostic;
pub use error::Error;
pub use file::Config;
pub use limits::{Limits, Timeouts};
pub use listener::ListenerConfig;
pub use parse::{DEFAULT_CONFIG, DEFAULT_CONFIG_NAME};
pub use redis::{OnRedisError, RedisConfig};
pub use route::{HeaderMatch, PathMatch, RouteConfig};
pub use status::{StatusAccess, StatusConfig};
pub use tls::TlsConfig;
pub use trace::{OtlpProtocol, RouteTracing, Tracing, TracingConfig};
pub use upstream::{BalanceKind, BuiltinConfig, EndpointConfig, Protocol, UpstreamConfig};
pub use upstream_tls::UpstreamTlsConfig;
