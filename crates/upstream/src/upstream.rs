//! Upstreams and their endpoints, built once per config load, with the balancer that
//! picks between the endpoints.

use std::net::SocketAddr;
use std::sync::Arc;

use http::HeaderValue;
use http::uri::Authority;

use crate::balance::{Balance, Outcome, P2cEwma, RoundRobin};
use crate::error::UpstreamError;
use crate::h2::H2Pool;
use crate::health::{EndpointHealth, HealthSettings, Up};
use crate::pool::EndpointPool;
use crate::tls::UpstreamTls;
use tailguard_config::{BalanceKind, Protocol, UpstreamConfig};

/// One address of an upstream, as built at config load. `B` is the request body its HTTP/2
/// connections carry (the gateway's).
///
/// Seam: per-endpoint state (metric handles with the endpoint label resolved, breaker
/// state, in-flight counters) is added here, so the request path reaches it through the
/// index the balancer returns, with no lookup.
#[derive(Debug)]
pub struct Endpoint<B> {
    /// The socket address.
    pub addr: SocketAddr,
    /// The DNS name `addr` was resolved from (`None` for an IP literal in the config).
    pub name: Option<Arc<str>>,
    /// `addr` as a URI authority, made once so a request does not format it.
    pub authority: Authority,
    /// `name:port` (or `addr`) as a `Host` header, for a request that arrived without one
    /// (HTTP/1.0).
    pub host: HeaderValue,
    /// Idle keep-alive connections to `addr`, per serving thread (kept across reloads).
    pub pool: Arc<EndpointPool>,
    /// The multiplexed HTTP/2 connections to `addr`, for an upstream whose protocol is
    /// `h2c` or `h2` (`None` for `http1`).
    pub h2: Option<Arc<H2Pool<B>>>,
    /// Relative share of requests.
    pub weight: u32,
    /// Whether it may take traffic (active checks, passive ejection); kept across reloads
    /// by (upstream name, address).
    pub health: Arc<EndpointHealth>,
}

/// A named service: endpoints plus the balancer over them (`B`: as for [`Endpoint`]).
///
/// Seam: per-upstream state (metrics, retry budget) is added here.
#[derive(Debug)]
pub struct Upstream<B> {
    /// The name routes refer to.
    pub name: Arc<str>,
    /// Endpoints, in config order; the balancer's indexes point here.
    pub endpoints: Vec<Endpoint<B>>,
    /// Picks the endpoint for each request.
    pub balance: Box<dyn Balance>,
    /// The endpoints' health states again, in endpoint order: what the balancer reads
    /// (through [`Up`]) to skip the endpoints that are down.
    states: Box<[Arc<EndpointHealth>]>,
    /// What the gateway speaks to the endpoints; a request branches on it once.
    pub protocol: Protocol,
    /// `[upstreams.health]`, when the upstream has one.
    pub health: Option<HealthSettings>,
    /// Passive ejection's `consecutive_failures` (0: off), read per finished exchange.
    eject_after: u32,
    /// Why the upstream has no endpoints (its names have not resolved), if it has none:
    /// its requests are answered 503 with this reason.
    pub unavailable: Option<Arc<str>>,
    /// TLS to the endpoints (`[upstreams.tls]`), shared by their pools.
    pub tls: Option<Arc<UpstreamTls>>,
}

/// One address an endpoint of the config stands for: an IP literal, or one address of a
/// name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointAddr {
    /// Where to connect.
    pub addr: SocketAddr,
    /// The endpoint's weight (a name's addresses each get the name's).
    pub weight: u32,
    /// The name it was resolved from.
    pub name: Option<Arc<str>>,
}

impl<B> Upstream<B> {
    /// Builds an upstream from its config and the resolved endpoint addresses (for a
    /// `builtin` upstream, the responder's bound address); `pool_for` gives each address its
    /// connection pool (a reload passes the previous snapshot's, so warm connections stay),
    /// `h2_for` its HTTP/2 connections when the upstream speaks HTTP/2, and `health_for`
    /// its health state (likewise carried over). With no addresses, `unavailable` says why.
    /// `tls` is the loaded `[upstreams.tls]`, which `pool_for` and `h2_for` give the pools
    /// too.
    pub fn build(
        config: &UpstreamConfig,
        addrs: &[EndpointAddr],
        unavailable: Option<String>,
        tls: Option<Arc<UpstreamTls>>,
        mut pool_for: impl FnMut(&EndpointAddr) -> Arc<EndpointPool>,
        mut h2_for: impl FnMut(&EndpointAddr) -> Arc<H2Pool<B>>,
        mut health_for: impl FnMut(SocketAddr) -> Arc<EndpointHealth>,
    ) -> Upstream<B> {
        let protocol = *config.protocol.get_ref();
        let endpoints: Vec<Endpoint<B>> = addrs
            .iter()
            .map(|a| {
                let addr_text = a.addr.to_string();
                let host_text = match &a.name {
                    Some(name) => format!("{name}:{}", a.addr.port()),
                    None => addr_text.clone(),
                };
                Endpoint {
                    addr: a.addr,
                    name: a.name.clone(),
                    authority: addr_text
                        .parse()
                        .expect("a socket address is a valid URI authority"),
                    host: HeaderValue::from_str(&host_text)
                        .expect("a socket address or DNS name is a valid header value"),
                    pool: pool_for(a),
                    h2: (protocol != Protocol::Http1).then(|| h2_for(a)),
                    weight: a.weight,
                    health: health_for(a.addr),
                }
            })
            .collect();
        let weights: Vec<u32> = endpoints.iter().map(|e| e.weight).collect();
        let states = endpoints.iter().map(|e| Arc::clone(&e.health)).collect();
        let balance: Box<dyn Balance> = match config.balance {
            BalanceKind::RoundRobin => Box::new(RoundRobin::new(&weights)),
            BalanceKind::P2cEwma => Box::new(P2cEwma::new(endpoints.len())),
        };
        let unavailable = if endpoints.is_empty() {
            Some(Arc::from(
                unavailable.unwrap_or_else(|| "no endpoints".to_owned()),
            ))
        } else {
            None
        };
        let health = config.health.as_ref().map(HealthSettings::from_config);
        Upstream {
            name: Arc::from(config.name.get_ref().as_str()),
            endpoints,
            balance,
            states,
            protocol,
            unavailable,
            tls,
            eject_after: health
                .as_ref()
                .and_then(|h| h.ejection)
                .map_or(0, |e| e.consecutive_failures),
            health,
        }
    }

    /// The endpoint for the next request, skipping endpoints that are down (by checks or
    /// ejected); `None` when every endpoint is down.
    #[inline]
    pub fn pick(&self) -> Option<usize> {
        self.balance.pick(Up::new(&self.states))
    }

    /// The endpoint for the next request, or why there is none: no address resolved
    /// (`NoEndpoint`), or every endpoint down (`NoHealthyEndpoint`, answered at once rather
    /// than after a connect attempt that would only fail or reach a broken endpoint).
    pub fn pick_endpoint(&self) -> Result<usize, UpstreamError> {
        if let Some(reason) = &self.unavailable {
            return Err(UpstreamError::NoEndpoint {
                upstream: Arc::clone(&self.name),
                reason: Arc::clone(reason),
            });
        }
        self.pick().ok_or_else(|| UpstreamError::NoHealthyEndpoint {
            upstream: Arc::clone(&self.name),
        })
    }

    /// Counts how an exchange with `endpoint` ended for passive ejection (nothing without
    /// it). Call once per exchange, beside [`Balance::complete`].
    #[inline]
    pub fn record(&self, endpoint: usize, outcome: Outcome) {
        if self.eject_after > 0
            && let Some(e) = self.endpoints.get(endpoint)
        {
            e.health.record(outcome, self.eject_after);
        }
    }
}
