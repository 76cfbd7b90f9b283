//! The runtime built from one config: a [`Snapshot`] holds the router, the upstreams with
//! their endpoints, pools and balancers, the overload state, the rate limits and the metric
//! handles, all found by index on the request path. A reload or a DNS refresh builds a new
//! one, carrying over what did not change (pools, health states, limits, responders).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use tailguard_config::{BuiltinConfig, Config, RouteConfig, Timeouts, UpstreamConfig};
use tailguard_http::body::RequestBody;
use tailguard_http::error::Error;
use tailguard_policy::overload::Overload;
use tailguard_policy::route::{Route, Router};
use tailguard_upstream::dns::{Names, Target};
use tailguard_upstream::h2::{H2Pool, H2Settings};
use tailguard_upstream::health::EndpointHealth;
use tailguard_upstream::health::checker::{Hub, Upstreams};
use tailguard_upstream::pool::{EndpointPool, PoolSettings};
use tailguard_upstream::tls::{ALPN_H2, ALPN_HTTP1, TlsTarget, UpstreamTls};
use tailguard_upstream::upstream::{EndpointAddr, Upstream};

use crate::builtin::Responder;
use crate::metrics::{GatewayMetrics, SnapshotMetrics};

fn millis(ms: u64) -> Option<Duration> {
    (ms > 0).then(|| Duration::from_millis(ms))
}

/// Everything built from one config: what a request needs, found by index, never by name.
/// Immutable once built; a reload builds a new one and swaps it in.
#[derive(Debug)]
pub struct Snapshot {
    /// The config it was built from.
    pub config: Config,
    /// Routes in precedence order.
    pub router: Router,
    /// Upstreams in config order (routes hold indexes into this).
    pub upstreams: Vec<Upstream<RequestBody>>,
    /// Shedder, breakers (by route index), carried over from the previous snapshot.
    pub overload: Overload,
    pub(crate) request_timeout: Option<Duration>,
    /// `timeouts.read_ms`, handed to each upstream response body.
    pub(crate) read_timeout: Option<Duration>,
    /// Set when a newer snapshot replaced this one: connections that cached this snapshot
    /// switch to the current one for their next request.
    pub(crate) retired: AtomicBool,
    /// Built-in responders by upstream name and config (a rebuild keeps the unchanged).
    responders: Vec<(Arc<str>, BuiltinConfig, Arc<Responder>)>,
    /// Metric handles of the routes and endpoints, by index.
    pub(crate) metrics: SnapshotMetrics,
    /// Rate limits of the routes, by index (unchanged ones carried over from the previous).
    pub(crate) rate_limits: tailguard_policy::rate_limit::RateLimits,
    /// `trusted_proxies`, compiled: the hops skipped when the forwarded client address is
    /// read for an `allow` / `deny` check (`tailguard_policy::access::client_ip`).
    pub(crate) trusted_proxies: tailguard_policy::access::Nets,
    /// The routes' authentication, by router index (authenticators of an unchanged
    /// `[[auth]]` carried over from the previous).
    pub(crate) auth: crate::auth::Auth,
    /// Tracing: the process's tracer (the exporter and its queue outlive snapshots) and
    /// this config's sampling.
    pub tracing: crate::trace::SnapshotTracing,
}

impl Snapshot {
    /// Builds a snapshot. Must run inside a tokio runtime (built-in responders start on it).
    /// An endpoint of `previous` with the same address, pool settings and TLS keeps its
    /// pool, so a reload keeps warm upstream connections; a built-in responder with the
    /// same config keeps running; an endpoint of a health-checked upstream keeps its health
    /// state (by upstream name and address), so a reload keeps what checks learned.
    /// Endpoint names take their addresses from `names` (none resolved without it). TLS
    /// files are read here (a reload reads them again; one that fails fails the build,
    /// naming the file).
    /// Spans go to `tracer` (a no-op one when tracing is off).
    pub fn build(
        config: Config,
        previous: Option<&Snapshot>,
        metrics: &Arc<GatewayMetrics>,
        names: Option<&Names>,
        health: &Hub,
        tracer: &tailguard_trace::Tracer,
    ) -> Result<Snapshot, Error> {
        Snapshot::build_with(
            config,
            previous,
            metrics,
            names,
            health,
            TlsFiles::Read,
            tracer,
        )
    }

    /// [`Snapshot::build`], reading the TLS files or keeping the running ones (`files`).
    pub(crate) fn build_with(
        config: Config,
        previous: Option<&Snapshot>,
        metrics: &Arc<GatewayMetrics>,
        names: Option<&Names>,
        health: &Hub,
        files: TlsFiles,
        tracer: &tailguard_trace::Tracer,
    ) -> Result<Snapshot, Error> {
        let settings = pool_settings(&config.timeouts, &config.limits);
        let mut responders = Vec::new();
        let mut upstreams = Vec::with_capacity(config.upstreams.len());
        for u in &config.upstreams {
            let tls = upstream_tls_of(&config, u, previous, files)?;
            let (addrs, unavailable) = match &u.builtin {
                Some(b) => {
                    let kept = previous.and_then(|p| {
                        p.responders
                            .iter()
                            .find(|(name, config, _)| {
                                **name == *u.name.get_ref().as_str() && config == b
                            })
                            .map(|(_, _, r)| Arc::clone(r))
                    });
                    let r = match kept {
                        Some(r) => r,
                        None => Arc::new(Responder::start(b)?),
                    };
                    let addr = EndpointAddr {
                        addr: r.addr(),
                        weight: 1,
                        name: None,
                    };
                    responders.push((Arc::from(u.name.get_ref().as_str()), b.clone(), r));
                    (vec![addr], None)
                }
                None => endpoint_addrs(u, names),
            };
            // The name each endpoint is verified against and sent as SNI.
            let target_of = |a: &EndpointAddr| {
                tls.as_ref().map(|tls| TlsTarget {
                    name: match &a.name {
                        Some(host) => tls
                            .server_name(host)
                            .unwrap_or_else(|| tls.server_name_of_addr(a.addr)),
                        None => tls.server_name_of_addr(a.addr),
                    },
                    tls: Arc::clone(tls),
                })
            };
            let pool_for = |a: &EndpointAddr| {
                let target = target_of(a);
                previous
                    .and_then(|p| p.pool_of(a.addr, settings, target.as_ref()))
                    .unwrap_or_else(|| {
                        Arc::new(EndpointPool::new(
                            a.addr,
                            settings,
                            target,
                            Arc::clone(metrics.pool()),
                        ))
                    })
            };
            let name = u.name.get_ref().as_str();
            let states = addrs
                .iter()
                .map(|a| a.addr)
                .map(|addr| {
                    match tailguard_upstream::health::handover::carry(
                        previous.map(|p| &p.upstreams[..]),
                        name,
                        addr,
                        u.health.is_some(),
                    ) {
                        Some(kept) => Ok((addr, kept)),
                        None => Ok((
                            addr,
                            Arc::new(EndpointHealth::new(
                                Arc::from(name),
                                addr,
                                metrics.endpoint_up(name, addr)?,
                                Arc::clone(health.wake()),
                            )),
                        )),
                    }
                })
                .collect::<Result<Vec<_>, Error>>()?;
            let health_for = |addr: SocketAddr| {
                let (_, state) = states
                    .iter()
                    .find(|(a, _)| *a == addr)
                    .expect("a state was made for every address above");
                Arc::clone(state)
            };
            let h2_settings = H2Settings {
                connect_timeout: settings.connect_timeout,
                max_streams: *u.max_concurrent_streams.get_ref() as usize,
                idle_timeout: settings.idle_timeout,
                header_bytes: u32::try_from(config.limits.header_bytes).unwrap_or(u32::MAX),
                receive_buffer: settings.receive_buffer,
            };
            let h2_for = |a: &EndpointAddr| {
                let target = target_of(a);
                previous
                    .and_then(|p| p.h2_pool_of(a.addr, h2_settings, target.as_ref()))
                    .unwrap_or_else(|| {
                        Arc::new(H2Pool::new(
                            a.addr,
                            h2_settings,
                            target,
                            Arc::clone(metrics.pool()),
                        ))
                    })
            };
            upstreams.push(Upstream::build(
                u,
                &addrs,
                unavailable,
                tls.clone(),
                pool_for,
                h2_for,
                health_for,
            ));
        }
        let routes = config
            .routes
            .iter()
            .filter_map(|r| {
                let up = match &r.upstream {
                    Some(name) => config
                        .upstreams
                        .iter()
                        .position(|u| u.name.get_ref() == name.get_ref())?,
                    None => Route::NO_UPSTREAM,
                };
                Some(Route::build(r, up))
            })
            .collect();
        let router = Router::new(routes);
        let names: Vec<Arc<str>> = upstreams.iter().map(|u| Arc::clone(&u.name)).collect();
        let endpoint_counts: Vec<usize> = upstreams.iter().map(|u| u.endpoints.len()).collect();
        let overload = Overload::build(
            &config.overload,
            &router,
            &names,
            &endpoint_counts,
            previous.map(|p| &p.overload),
            metrics.registry(),
        );
        // Each route's config by id, found once per route: a search of the list per route
        // made a start with 100,000 routes quadratic (49 s; the profile is in issue 46's note).
        let by_id: HashMap<&str, &RouteConfig> = config
            .routes
            .iter()
            .map(|c| (c.id.get_ref().as_str(), c))
            .collect();
        let rate_limits = tailguard_policy::rate_limit::RateLimits::build(
            router.routes().iter().map(|r| {
                let config = by_id.get(&*r.id);
                (&*r.id, config.and_then(|c| c.rate_limit.as_ref()))
            }),
            previous.map(|p| &p.rate_limits),
            &metrics.rate_limit,
        )?;
        let auth =
            crate::auth::Auth::build(&config, &router, previous.map(|p| &p.auth), &metrics.auth)?;
        let metrics = SnapshotMetrics::build(
            metrics,
            router.routes().iter().map(|r| Arc::clone(&r.id)),
            &upstreams,
        )?;
        let tracing = crate::trace::SnapshotTracing::build(&config, &router, &by_id, tracer);
        Ok(Snapshot {
            tracing,
            request_timeout: millis(config.timeouts.request_ms),
            read_timeout: millis(config.timeouts.read_ms),
            router,
            metrics,
            overload,
            upstreams,
            retired: AtomicBool::new(false),
            responders,
            rate_limits,
            trusted_proxies: tailguard_policy::access::Nets::build(&config.trusted_proxies),
            auth,
            config,
        })
    }
}

impl Snapshot {
    /// A pool of this snapshot that makes the connections a new pool for `addr` with
    /// `settings` and `tls` would, if there is one.
    fn pool_of(
        &self,
        addr: SocketAddr,
        settings: PoolSettings,
        tls: Option<&TlsTarget>,
    ) -> Option<Arc<EndpointPool>> {
        self.endpoint_pools()
            .find(|p| p.makes_same(addr, settings, tls))
            .map(Arc::clone)
    }

    /// The HTTP/2 connections of the endpoint at `addr` that make the connections
    /// `settings` and `tls` would, if this snapshot has them.
    fn h2_pool_of(
        &self,
        addr: SocketAddr,
        settings: H2Settings,
        tls: Option<&TlsTarget>,
    ) -> Option<Arc<H2Pool<RequestBody>>> {
        self.h2_pools()
            .find(|p| p.makes_same(addr, settings, tls))
            .map(Arc::clone)
    }

    /// Every HTTP/2 endpoint's connections.
    pub(crate) fn h2_pools(&self) -> impl Iterator<Item = &Arc<H2Pool<RequestBody>>> {
        self.upstreams
            .iter()
            .flat_map(|u| u.endpoints.iter().filter_map(|e| e.h2.as_ref()))
    }

    /// Every endpoint's pool (an address listed under two upstreams has two).
    pub(crate) fn endpoint_pools(&self) -> impl Iterator<Item = &Arc<EndpointPool>> {
        self.upstreams
            .iter()
            .flat_map(|u| u.endpoints.iter().map(|e| &e.pool))
    }
}

/// The addresses of an upstream's endpoints: IP literals as written, names as last resolved
/// (each address with the name's weight). With none, why.
fn endpoint_addrs(
    u: &UpstreamConfig,
    names: Option<&Names>,
) -> (Vec<EndpointAddr>, Option<String>) {
    let mut addrs = Vec::with_capacity(u.endpoints.len());
    let mut unresolved = Vec::new();
    for e in &u.endpoints {
        let weight = *e.weight.get_ref();
        match Target::parse(e.address.get_ref()) {
            Ok(Target::Ip(addr)) => addrs.push(EndpointAddr {
                addr,
                weight,
                name: None,
            }),
            Ok(Target::Name { host, port }) => {
                let answer = names.and_then(|n| n.get(&host)).unwrap_or_default();
                if answer.addrs.is_empty() {
                    let why = answer.error.as_deref().unwrap_or("no answer yet");
                    unresolved.push(format!("{host} did not resolve: {why}"));
                }
                let name: Arc<str> = Arc::from(host.as_str());
                addrs.extend(answer.addrs.iter().map(|&ip| EndpointAddr {
                    addr: SocketAddr::new(ip, port),
                    weight,
                    name: Some(Arc::clone(&name)),
                }));
            }
            // Validation refused it; a config that is here has none.
            Err(_) => {}
        }
    }
    let unavailable = addrs.is_empty().then(|| unresolved.join("; "));
    (addrs, unavailable)
}

/// Whether a build reads the TLS files again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TlsFiles {
    /// Start and reload (SIGHUP): read, so renewed certificates apply.
    Read,
    /// A rebuild of the running config for new endpoint addresses (DNS): the running
    /// upstreams keep their TLS as loaded; certificates change on a reload only.
    KeepRunning,
}

/// Loads upstream `u`'s `[upstreams.tls]`, or keeps the previous snapshot's if it was
/// loaded from the same settings and file contents (its session cache and pools stay).
fn upstream_tls_of(
    config: &Config,
    u: &UpstreamConfig,
    previous: Option<&Snapshot>,
    files: TlsFiles,
) -> Result<Option<Arc<UpstreamTls>>, Error> {
    let Some(tls) = &u.tls else {
        return Ok(None);
    };
    let name = u.name.get_ref();
    let running = previous
        .and_then(|p| p.upstreams.iter().find(|old| *old.name == **name))
        .and_then(|old| old.tls.as_ref());
    if let (TlsFiles::KeepRunning, Some(running)) = (files, running) {
        return Ok(Some(Arc::clone(running)));
    }
    // ALPN says which protocol the endpoints must speak inside TLS.
    let alpn = match u.protocol.get_ref() {
        tailguard_config::Protocol::H2 => ALPN_H2,
        _ => ALPN_HTTP1,
    };
    let loaded = UpstreamTls::load(&config.base_dir, tls, alpn)
        .map_err(|e| Error::Tls(format!("upstream `{name}`: {e}")))?;
    if !loaded.verifies() {
        // At every load, so a reload's log says it too.
        tracing::warn!(
            upstream = %name,
            "tls.verify = false: any certificate is accepted from this upstream's endpoints"
        );
    }
    Ok(Some(match running.filter(|old| old.same_as(&loaded)) {
        Some(old) => Arc::clone(old),
        None => Arc::new(loaded),
    }))
}

fn pool_settings(t: &Timeouts, l: &tailguard_config::Limits) -> PoolSettings {
    PoolSettings {
        connect_timeout: millis(t.connect_ms),
        idle_timeout: millis(t.idle_ms),
        receive_buffer: (l.upstream_receive_buffer_bytes > 0)
            .then_some(l.upstream_receive_buffer_bytes),
    }
}

impl Upstreams<RequestBody> for Snapshot {
    fn upstreams(&self) -> &[Upstream<RequestBody>] {
        &self.upstreams
    }
}
