//! The gateway's upstream side: endpoints, the DNS resolver, the TLS client, the HTTP/1.1
//! and HTTP/2 connection pools, health checks and ejection, and the balancers. It knows
//! nothing of routes or of the downstream, and never names the gateway: the layer above
//! (`tailguard-proxy`) builds these values from the config, hands the resolver and the
//! health checker what they need (a closure that rebuilds, one that returns the current
//! upstreams), and maps [`UpstreamError`] into its own error.
//!
//! How the main types interact:
//! - An [`Upstream`] is built once per snapshot ([`Upstream::build`]) from its
//!   `UpstreamConfig` and the [`EndpointAddr`]s its endpoints stand for (an IP literal, or
//!   each address the [`dns::Resolver`] found for a name, read from its [`dns::Names`]).
//!   Each [`Endpoint`] holds its [`pool::EndpointPool`] (idle HTTP/1.1 connections, per
//!   serving thread), its [`h2::H2Pool`] for an HTTP/2 upstream, and its
//!   [`health::EndpointHealth`]. The builder is handed one closure for each, so a reload
//!   passes the previous snapshot's and warm connections and health survive it
//!   ([`health::handover`]).
//! - Per request, [`Upstream::pick_endpoint`] asks the upstream's [`balance::Balance`]
//!   ([`balance::RoundRobin`] or [`balance::P2cEwma`]) for an endpoint among those
//!   [`health::Up`] says are up; the caller takes a connection from that endpoint's pool
//!   ([`pool::EndpointPool::checkout_within`], or a stream from [`h2::H2Pool::stream`]),
//!   and when the exchange ends reports its [`Outcome`] to the balancer
//!   ([`balance::Balance::complete`]) and to passive ejection ([`Upstream::record`]).
//! - Off the request path, the resolver thread ([`dns::Resolver`]) re-resolves names and
//!   calls its [`dns::OnChange`] when an answer changed; the checker thread
//!   ([`health::checker::Hub`]) probes, ejects and readmits endpoints, reading the current
//!   upstreams through the [`health::checker::Current`] it is handed. Both run on threads
//!   of their own, never a serving thread.
//! - [`tls::UpstreamTls`] is an upstream's loaded `[upstreams.tls]` (one rustls client
//!   config); [`tls::TlsTarget`] is what an endpoint's pools connect with.
//! - Metrics are registered by the layer above on its registry, once:
//!   [`pool_metrics::PoolMetrics::register`], and the resolver's in [`dns::Resolver::start`].
//!   [`shard`] has the per-thread slots the pools and the round robin write to (the proxy
//!   uses them too).
//!
//! The modules, as floors (each names only modules below it): [`outcome`], [`error`],
//! [`shard`], [`pool_metrics`], [`tls`]; [`health`], [`dns`], [`pool`], [`h2`]; [`balance`];
//! [`upstream`]; [`health::handover`] and [`health::checker`] on top.
//!
//! An upstream built from its config, picked from, and one whose name has not resolved:
//!
//! ```
//! use std::path::Path;
//! use std::sync::Arc;
//!
//! use tailguard_config::Config;
//! use tailguard_metrics::Registry;
//! use tailguard_upstream::health::EndpointHealth;
//! use tailguard_upstream::pool::{EndpointPool, PoolSettings};
//! use tailguard_upstream::pool_metrics::PoolMetrics;
//! use tailguard_upstream::{EndpointAddr, Upstream, UpstreamError};
//!
//! let config = Config::parse(
//!     r#"
//! [[listeners]]
//! address = "127.0.0.1:8080"
//!
//! [[upstreams]]
//! name = "api"
//! balance = "round_robin"
//! endpoints = [
//!     { address = "10.0.0.1:80", weight = 2 },
//!     { address = "10.0.0.2:80" },
//! ]
//! "#,
//!     "gw.toml",
//!     Path::new("."),
//! )
//! .expect("a valid config");
//! let api = &config.upstreams[0];
//! let addrs: Vec<EndpointAddr> = api
//!     .endpoints
//!     .iter()
//!     .map(|e| EndpointAddr {
//!         addr: e.address.get_ref().parse().expect("an IP literal"),
//!         weight: *e.weight.get_ref(),
//!         name: None,
//!     })
//!     .collect();
//!
//! let registry = Registry::new();
//! let pools = PoolMetrics::register(&registry).expect("a fresh registry");
//! let up = registry.gauge("up", "Whether an endpoint is up.", &["endpoint"]).expect("gauge");
//! let wake = Arc::default();
//! let build = |addrs: &[EndpointAddr], unavailable: Option<String>| {
//!     // `()`: the HTTP/2 request body type, unused by an HTTP/1.1 upstream.
//!     Upstream::<()>::build(
//!         api,
//!         addrs,
//!         unavailable,
//!         None,
//!         |a| {
//!             let settings = PoolSettings {
//!                 connect_timeout: None,
//!                 idle_timeout: None,
//!                 receive_buffer: None,
//!             };
//!             Arc::new(EndpointPool::new(a.addr, settings, None, Arc::clone(&pools)))
//!         },
//!         |_| unreachable!("an HTTP/1.1 upstream has no HTTP/2 pools"),
//!         |addr| {
//!             let gauge = up.get_or_create(&[&addr.to_string()]).expect("gauge");
//!             Arc::new(EndpointHealth::new(Arc::from("api"), addr, gauge, Arc::clone(&wake)))
//!         },
//!     )
//! };
//!
//! // Smooth weighted round robin: endpoint 0 gets two requests of every three.
//! let upstream = build(&addrs, None);
//! let mut picks = [0; 2];
//! for _ in 0..300 {
//!     picks[upstream.pick_endpoint().expect("both endpoints are up")] += 1;
//! }
//! assert_eq!(picks, [200, 100]);
//! assert_eq!(upstream.endpoints[0].authority, "10.0.0.1:80");
//!
//! // No address yet (a name that has not resolved): each request is told why.
//! let unresolved = build(&[], Some("api.internal: no answer".to_owned()));
//! let err = unresolved.pick_endpoint().unwrap_err();
//! assert!(matches!(err, UpstreamError::NoEndpoint { .. }));
//! assert_eq!(err.to_string(), "upstream api has no endpoints: api.internal: no answer");
//! ```

pub mod balance;
pub mod dns;
pub mod error;
pub mod h2;
pub mod health;
pub mod outcome;
pub mod pool;
pub mod pool_metrics;
pub mod shard;
pub(crate) mod socket;
pub mod tls;
pub mod upstream;

pub use error::UpstreamError;
pub use outcome::Outcome;
pub use upstream::{Endpoint, EndpointAddr, Upstream};
