//! The config file: TOML parsed with `toml`, validated, and every error reported with
//! `file:line:column: field: message`.
//!
//! Parsing goes in two steps so that one mistake does not hide the next: the document is
//! first parsed into spanned TOML values (collecting every syntax error), then each section
//! and each element of each array is deserialized on its own, and finally the semantic checks
//! (addresses, references between sections, duplicates, certificates) run over everything
//! that did deserialize. `tailguard check` and a SIGHUP reload both print this same list.
//!
//! Every feature's config type and its check live here; nothing here names the runtime,
//! which builds its values from these types.

pub mod access_log;
pub mod cidr;
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
pub mod retry;
pub mod route;
pub mod sni;
pub mod tls;
pub mod upstream;
pub mod upstream_tls;
mod validate;

pub use diagnostic::Diagnostic;
pub use error::Error;
pub use file::Config;
pub use limits::{Limits, Timeouts};
pub use listener::ListenerConfig;
pub use parse::{DEFAULT_CONFIG, DEFAULT_CONFIG_NAME};
pub use route::{HeaderMatch, PathMatch, RouteConfig};
pub use tls::TlsConfig;
pub use upstream::{BalanceKind, BuiltinConfig, EndpointConfig, Protocol, UpstreamConfig};
pub use upstream_tls::UpstreamTlsConfig;
