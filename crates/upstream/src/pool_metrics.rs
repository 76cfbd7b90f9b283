//! The upstream connection pools' counters: registered once by the layer above from its
//! registry, then shared by every endpoint's HTTP/1.1 and HTTP/2 pool (no lookup per
//! request or per connection, design.md §2 rule 2).

use std::sync::Arc;

use tailguard_metrics::{Counter, Gauge, MetricsError, Registry};

/// Upstream connection pool counters, shared with every endpoint's pool.
#[derive(Debug)]
pub struct PoolMetrics {
    opened: Counter,
    open: Gauge,
    pub(crate) reused: Counter,
    in_flight: Gauge,
}

impl PoolMetrics {
    /// Registers the pools' families on `registry` (and the idle gauge, computed at scrape
    /// from the open connections and the requests waiting for a head).
    pub fn register(registry: &Registry) -> Result<Arc<PoolMetrics>, MetricsError> {
        let r = registry;
        let one = |name: &str, help: &str| -> Result<Counter, MetricsError> {
            r.counter(name, help, &[])?.get_or_create(&[])
        };
        let gauge = |name: &str, help: &str| -> Result<Gauge, MetricsError> {
            r.gauge(name, help, &[])?.get_or_create(&[])
        };
        let pool = Arc::new(PoolMetrics {
            opened: one(
                "tailguard_upstream_connections_opened",
                "Connections opened to upstream endpoints.",
            )?,
            open: gauge(
                "tailguard_upstream_connections_open",
                "Upstream connections open now (busy or idle in the pool).",
            )?,
            reused: one(
                "tailguard_upstream_connections_reused",
                "Upstream requests sent on a connection that had served a request before.",
            )?,
            in_flight: gauge(
                "tailguard_upstream_requests_in_flight",
                "Requests dispatched upstream and waiting for the response head.",
            )?,
        });
        let idle = gauge(
            "tailguard_upstream_connections_idle",
            "Upstream connections open and not waiting for a response head (computed at scrape).",
        )?;
        {
            let pool = Arc::clone(&pool);
            r.on_scrape(move || idle.set((pool.open.get() - pool.in_flight.get()).max(0)));
        }
        Ok(pool)
    }

    /// A request is being dispatched upstream; until the guard drops it waits for a head.
    #[inline]
    pub fn dispatched(&self) -> UpstreamGuard<'_> {
        self.in_flight.inc();
        UpstreamGuard(self)
    }
}

/// Keeps an upstream request counted as waiting for its response head.
#[derive(Debug)]
pub struct UpstreamGuard<'a>(&'a PoolMetrics);

impl Drop for UpstreamGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        self.0.in_flight.dec();
    }
}

/// An upstream connection counted as open until dropped.
#[derive(Debug)]
pub(crate) struct OpenConnection {
    pool: Arc<PoolMetrics>,
}

impl OpenConnection {
    /// Counts a newly opened connection.
    pub(crate) fn new(pool: &Arc<PoolMetrics>) -> OpenConnection {
        pool.opened.inc();
        pool.open.inc();
        OpenConnection {
            pool: Arc::clone(pool),
        }
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.pool.open.dec();
    }
}
