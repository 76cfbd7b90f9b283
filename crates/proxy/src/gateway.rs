//! The gateway: the current snapshot, swapped atomically on reload or when DNS answers
//! change, with the resolver and health checker threads wired to it.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use arc_swap::ArcSwap;
use tailguard_config::Config;
use tailguard_http::body::RequestBody;
use tailguard_http::error::Error;
use tailguard_upstream::dns::Resolver;
use tailguard_upstream::health::checker::{Current, Hub, Upstreams};

use crate::metrics::GatewayMetrics;
use crate::snapshot::{Snapshot, TlsFiles};

/// The gateway: the current snapshot, replaced atomically by [`Gateway::reload`].
#[derive(Debug)]
pub struct Gateway {
    /// Shared with every connection, which finds the current snapshot here when its own
    /// was retired.
    current: Arc<ArcSwap<Snapshot>>,
    metrics: Arc<GatewayMetrics>,
    /// Looks up endpoint names off the request path; rebuilds the snapshot on a change.
    resolver: Resolver,
    /// Held while a snapshot is built and swapped in, so a reload and a DNS refresh never
    /// build from the same old snapshot and lose one another's change. Only off-path
    /// threads (the reloading thread, the resolver thread) take it.
    rebuilding: Mutex<()>,
    /// The health checker thread (started by the first snapshot that needs it).
    health: Hub,
    /// This gateway, for the checker thread (which must not keep it alive).
    this: Weak<Gateway>,
    /// The trace exporter thread, started by the first config with `[tracing]` and kept
    /// for the process's life: a reload changes only the sampling, never the exporter or
    /// its queue. Taken only off the request path (start, reload, shutdown).
    tracing: Mutex<Tracing>,
    /// The last reloads and their outcome (the status page lists them).
    reloads: crate::reloads::Reloads,
    /// Replaced snapshots, freed off the serving threads once no connection holds them.
    retired: crate::retired::Retired,
    /// In-flight requests per client address (`limits.client_requests`), kept across
    /// reloads.
    clients: Arc<crate::clients::Clients>,
    /// The Redis sync thread of `scope = "global"` rate limits, started by the first config
    /// with `[redis]` and kept for the process's life; a reload hands it the new `[redis]`.
    redis: Mutex<Option<tailguard_policy::rate_limit::sync::RedisSync>>,
}

/// The exporter, if started, and the tracer snapshots are built with.
#[derive(Debug, Default)]
struct Tracing {
    exporter: Option<tailguard_trace::Exporter>,
    tracer: tailguard_trace::Tracer,
}

impl Tracing {
    /// Starts the exporter if `config` traces and none runs yet; the tracer to build with.
    fn for_config(
        &mut self,
        config: &Config,
        metrics: &GatewayMetrics,
    ) -> Result<tailguard_trace::Tracer, Error> {
        if let (Some(t), None) = (&config.tracing, &self.exporter) {
            let trace_metrics = tailguard_trace::TraceMetrics::register(metrics.registry())
                .map_err(|e| Error::Internal(e.to_string()))?;
            let exporter = tailguard_trace::Exporter::start(export_config(t), trace_metrics)
                .map_err(|e| Error::Internal(format!("tracing: {e}")))?;
            self.tracer = exporter.tracer();
            self.exporter = Some(exporter);
        }
        Ok(self.tracer.clone())
    }
}

/// The exporter's settings from `[tracing]` (and the `OTEL_*` variables).
pub fn export_config(t: &tailguard_config::Tracing) -> tailguard_trace::ExportConfig {
    let mut c = tailguard_trace::ExportConfig::new(t.endpoint.clone(), t.service_name.clone());
    c.traces_url = t.traces_url.clone();
    c.protocol = match t.protocol {
        tailguard_config::OtlpProtocol::HttpProtobuf => tailguard_trace::Protocol::HttpProtobuf,
        tailguard_config::OtlpProtocol::Grpc => tailguard_trace::Protocol::Grpc,
    };
    c.headers = t.headers.clone();
    c.timeout = std::time::Duration::from_millis(t.timeout_ms);
    c.gzip = t.gzip;
    c.batch_max_spans = t.batch_max_spans;
    if let Some(bytes) = t.batch_max_bytes {
        c.batch_max_bytes = bytes;
    }
    c.batch_interval = std::time::Duration::from_millis(t.batch_interval_ms);
    c.queue_max_spans = t.queue_max_spans;
    c.tls = tailguard_trace::TlsFiles {
        ca: t.tls_ca.clone(),
        cert: t.tls_cert.clone(),
        key: t.tls_key.clone(),
    };
    c
}

impl Gateway {
    /// Builds the gateway's first snapshot (inside a tokio runtime).
    pub fn new(config: Config) -> Result<Arc<Gateway>, Error> {
        let metrics = GatewayMetrics::register(&tailguard_metrics::Registry::new())?;
        Self::with_metrics(config, metrics)
    }

    /// Builds the gateway recording into `metrics` (whose registry an exporter serves).
    pub fn with_metrics(
        config: Config,
        metrics: Arc<GatewayMetrics>,
    ) -> Result<Arc<Gateway>, Error> {
        let resolver = Resolver::start(&config.dns, metrics.registry())?;
        resolver.resolve_new(&config);
        let health = Hub::default();
        let mut tracing = Tracing::default();
        let tracer = tracing.for_config(&config, &metrics)?;
        let snapshot = Arc::new(Snapshot::build(
            config,
            None,
            &metrics,
            Some(resolver.names()),
            &health,
            &tracer,
        )?);
        let gateway = Arc::new_cyclic(|this| Gateway {
            current: Arc::new(ArcSwap::new(Arc::clone(&snapshot))),
            metrics,
            resolver,
            rebuilding: Mutex::new(()),
            health,
            this: this.clone(),
            tracing: Mutex::new(tracing),
            reloads: crate::reloads::Reloads::default(),
            retired: crate::retired::Retired::default(),
            clients: Arc::default(),
            redis: Mutex::new(None),
        });
        gateway.follow_redis(&snapshot.config)?;
        gateway.resolver.watch(
            &gateway.snapshot().config,
            refresh_on_change(Arc::downgrade(&gateway)),
        );
        gateway.health.follow(
            &snapshot.upstreams,
            current_upstreams(Arc::downgrade(&gateway)),
        );
        Ok(gateway)
    }

    /// How many snapshots replaced by reloads are not freed yet: held by connections from
    /// before the reload, or freed within a second of their last connection's close.
    pub fn retired_snapshots(&self) -> usize {
        self.retired.len()
    }

    /// The gateway's metrics.
    pub fn metrics(&self) -> &Arc<GatewayMetrics> {
        &self.metrics
    }

    /// The last reloads (recorded by whoever applies a config: `tailguard run`'s reload path).
    pub fn reloads(&self) -> &crate::reloads::Reloads {
        &self.reloads
    }

    /// Swaps in a new config. Requests already running finish on the old snapshot; every
    /// request that starts after this returns uses the new one. On error nothing changes.
    pub fn reload(self: &Arc<Self>, config: Config) -> Result<(), Error> {
        // Names new to this config are looked up before the lock: the resolver thread may
        // itself be waiting for it to apply a refresh.
        self.resolver.resolve_new(&config);
        let _rebuilding = self
            .rebuilding
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let old = self.current.load_full();
        let tracer = self
            .tracing
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .for_config(&config, &self.metrics)?;
        let new = Snapshot::build(
            config,
            Some(&old),
            &self.metrics,
            Some(self.resolver.names()),
            &self.health,
            &tracer,
        );
        self.metrics.reloaded(new.is_ok());
        let new = Arc::new(new?);
        self.swap_in(&new);
        self.resolver
            .watch(&new.config, refresh_on_change(Arc::downgrade(self)));
        self.follow_redis(&new.config)
    }

    /// Starts the Redis sync for `config`'s `[redis]`, or hands the running one the new
    /// section (a config without one leaves it as it was: its global limits are gone).
    fn follow_redis(&self, config: &Config) -> Result<(), Error> {
        let Some(redis) = &config.redis else {
            return Ok(());
        };
        let fleet = self.metrics.rate_limit().fleet();
        let mut running = self.redis.lock().unwrap_or_else(PoisonError::into_inner);
        match &*running {
            Some(sync) => sync.update(redis, fleet),
            None => {
                *running = Some(
                    tailguard_policy::rate_limit::sync::RedisSync::start(
                        redis,
                        fleet,
                        self.metrics.registry(),
                    )
                    .map_err(Error::Internal)?,
                );
            }
        }
        Ok(())
    }

    /// Rebuilds the snapshot from the running config with the resolver's latest answers
    /// (called by the resolver thread when a name's addresses change): endpoints of
    /// unchanged addresses keep their pools, as on a reload.
    pub fn refresh_endpoints(&self) {
        let _rebuilding = self
            .rebuilding
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let old = self.current.load_full();
        match Snapshot::build_with(
            old.config.clone(),
            Some(&old),
            &self.metrics,
            Some(self.resolver.names()),
            &self.health,
            TlsFiles::KeepRunning,
            old.tracing.tracer(),
        ) {
            Ok(new) => self.swap_in(&Arc::new(new)),
            Err(e) => tracing::error!(
                target: "tailguard::dns",
                "applying new endpoint addresses failed, the old ones stay: {e}"
            ),
        }
    }

    /// Makes `new` the current snapshot and retires what the old one had alone.
    fn swap_in(&self, new: &Arc<Snapshot>) {
        let old = self.current.swap(Arc::clone(new));
        old.retired.store(true, Ordering::Release);
        // Pools the new snapshot did not take over close their idle connections now; their
        // busy ones close when their requests finish.
        for pool in old.endpoint_pools() {
            if !new.endpoint_pools().any(|p| Arc::ptr_eq(p, pool)) {
                pool.retire();
            }
        }
        for pool in old.h2_pools() {
            if !new.h2_pools().any(|p| Arc::ptr_eq(p, pool)) {
                pool.retire();
            }
        }
        // Health states the new snapshot did not take over are retired; the checker
        // follows the new one (started now if it is the first with a health table).
        tailguard_upstream::health::handover::retire_missing(&old.upstreams, &new.upstreams);
        self.health
            .follow(&new.upstreams, current_upstreams(self.this.clone()));
        self.retired.keep(old);
    }

    /// Exports every span recorded so far and waits for the export to end (tests, and a
    /// clean stop). No-op when tracing is off.
    pub async fn flush_traces(&self) {
        let exporter = self
            .tracing
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .exporter
            .as_ref()
            .map(tailguard_trace::Exporter::flusher);
        if let Some(flush) = exporter {
            flush.flush().await;
        }
    }

    /// Takes the trace exporter, to stop it (a clean shutdown exports what is left). Spans
    /// recorded after this are dropped and counted (`reason="shutdown"`).
    pub fn take_trace_exporter(&self) -> Option<tailguard_trace::Exporter> {
        self.tracing
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .exporter
            .take()
    }

    /// The current snapshot.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.current.load_full()
    }

    /// The in-flight requests of each client address.
    pub(crate) fn clients(&self) -> &Arc<crate::clients::Clients> {
        &self.clients
    }

    /// Where the current snapshot is swapped in (a connection holds it, not the gateway).
    pub(crate) fn current(&self) -> &Arc<ArcSwap<Snapshot>> {
        &self.current
    }

    /// Whether a peer at `ip` is a trusted proxy under the current config (asked once per
    /// connection: a reload applies to the connections accepted after it).
    pub fn is_trusted(&self, ip: std::net::IpAddr) -> bool {
        let snapshot = self.current.load();
        snapshot
            .config
            .trusted_proxies
            .iter()
            .any(|net| net.contains(ip))
    }
}

/// How the health checker thread reads the current snapshot's upstreams: through `gateway`,
/// which it holds weakly (the thread must not keep the gateway alive).
fn current_upstreams(gateway: Weak<Gateway>) -> Current<RequestBody> {
    Box::new(move || {
        gateway
            .upgrade()
            .map(|g| -> Arc<dyn Upstreams<RequestBody>> { g.snapshot() })
    })
}

/// What the resolver thread calls when an answer changed: a refresh of `gateway`, which it
/// holds weakly (the thread must not keep the gateway alive).
fn refresh_on_change(gateway: Weak<Gateway>) -> tailguard_upstream::dns::OnChange {
    Box::new(move || {
        if let Some(gateway) = gateway.upgrade() {
            gateway.refresh_endpoints();
        }
    })
}
