//! The registry: the list of families a scrape walks, and the registry's own self-metrics.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use crate::MetricsError;
use crate::family::{Desc, Family, FamilyCore, SelfHandles, lock};
use crate::metric::{Counter, FloatCounter, FloatGauge, Gauge, Histogram, Metric};
use crate::render::{Format, Render, Snapshot};
use crate::shard::{default_shards, normalize_shards};

type Hook = Arc<dyn Fn() + Send + Sync>;

/// Buckets of the scrape-duration self-metric, in seconds.
const SCRAPE_BUCKETS: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// Builds a [`Registry`] with non-default settings.
#[derive(Debug, Clone)]
pub struct RegistryBuilder {
    shards: usize,
    self_prefix: Option<String>,
}

impl RegistryBuilder {
    /// Cells per series and counter (rounded up to a power of two, 1..=64). Default: the
    /// machine's parallelism. More shards than busy threads buys nothing but memory.
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = normalize_shards(shards);
        self
    }

    /// Prefix of the self-metrics (default `metrics`, e.g. `metrics_series`); `None` turns
    /// them off.
    pub fn self_metrics_prefix(mut self, prefix: Option<&str>) -> Self {
        self.self_prefix = prefix.map(str::to_owned);
        self
    }

    /// Builds the registry (registering the self-metric families first).
    pub fn build(self) -> Result<Registry, MetricsError> {
        let registry = Registry {
            inner: Arc::new(Inner {
                shards: self.shards,
                families: Mutex::default(),
                hooks: Mutex::default(),
                self_families: OnceLock::new(),
                scrape: OnceLock::new(),
            }),
        };
        if let Some(prefix) = self.self_prefix {
            registry.register_self_metrics(&prefix)?;
        }
        Ok(registry)
    }
}

struct SelfFamilies {
    series: Family<Gauge>,
    overflowed: Family<Counter>,
    expired: Family<Counter>,
}

/// Registry-wide scrape self-metrics, recorded by the exporter.
#[derive(Debug)]
pub(crate) struct ScrapeMetrics {
    pub(crate) bytes: Gauge,
    pub(crate) duration: Histogram,
    pub(crate) ok: Counter,
    pub(crate) timed_out: Counter,
    pub(crate) abandoned: Counter,
    pub(crate) coalesced: Counter,
}

struct Inner {
    shards: usize,
    families: Mutex<Vec<Arc<FamilyCore>>>,
    hooks: Mutex<Vec<Hook>>,
    self_families: OnceLock<SelfFamilies>,
    scrape: OnceLock<ScrapeMetrics>,
}

/// The set of metric families one exporter serves.
///
/// Cheap to clone (an `Arc`). Register families at startup or config load, keep their
/// handles, record on the handles.
#[derive(Clone)]
pub struct Registry {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("families", &lock(&self.inner.families).len())
            .field("shards", &self.inner.shards)
            .finish_non_exhaustive()
    }
}

impl Default for Registry {
    fn default() -> Self {
        Self::new()
    }
}

impl Registry {
    /// A registry with default settings and self-metrics prefixed `metrics_`.
    pub fn new() -> Self {
        Self::builder()
            .build()
            .expect("the default self-metric names are valid and registered once")
    }

    /// A builder for non-default settings.
    pub fn builder() -> RegistryBuilder {
        RegistryBuilder {
            shards: default_shards(),
            self_prefix: Some("metrics".to_owned()),
        }
    }

    /// Registers a family of `M` described by `desc`.
    pub fn register<M: Metric>(&self, desc: Desc) -> Result<Family<M>, MetricsError> {
        let core = Arc::new(FamilyCore::new(M::KIND, desc, self.inner.shards)?);
        {
            let mut families = lock(&self.inner.families);
            if families.iter().any(|f| f.name == core.name) {
                return Err(MetricsError::DuplicateFamily(core.name.clone()));
            }
            families.push(Arc::clone(&core));
        }
        if let Some(own) = self.inner.self_families.get() {
            attach_self_handles(own, &core)?;
        }
        Ok(Family::from_core(core))
    }

    /// Registers a counter family.
    pub fn counter(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
    ) -> Result<Family<Counter>, MetricsError> {
        self.register(Desc::new(name, help).labels(labels))
    }

    /// Registers a float counter family.
    pub fn float_counter(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
    ) -> Result<Family<FloatCounter>, MetricsError> {
        self.register(Desc::new(name, help).labels(labels))
    }

    /// Registers an integer gauge family.
    pub fn gauge(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
    ) -> Result<Family<Gauge>, MetricsError> {
        self.register(Desc::new(name, help).labels(labels))
    }

    /// Registers a float gauge family.
    pub fn float_gauge(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
    ) -> Result<Family<FloatGauge>, MetricsError> {
        self.register(Desc::new(name, help).labels(labels))
    }

    /// Registers a histogram family with the given bucket upper bounds.
    pub fn histogram(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
        buckets: &[f64],
    ) -> Result<Family<Histogram>, MetricsError> {
        self.register(Desc::new(name, help).labels(labels).buckets(buckets))
    }

    /// Runs `hook` at the start of every scrape, on the exporter's thread: for values
    /// that are read rather than recorded (process metrics, pool sizes).
    pub fn on_scrape(&self, hook: impl Fn() + Send + Sync + 'static) {
        lock(&self.inner.hooks).push(Arc::new(hook));
    }

    /// Runs the scrape hooks and takes a [`Snapshot`] to render.
    pub fn snapshot(&self) -> Snapshot {
        let hooks: Vec<Hook> = lock(&self.inner.hooks).clone();
        for hook in hooks {
            hook();
        }
        let families = lock(&self.inner.families).clone();
        Snapshot::new(&families)
    }

    /// Renders the whole exposition into `out` (appending).
    pub fn render_into(&self, format: Format, out: &mut Vec<u8>) {
        let mut render = Render::new(self.snapshot(), format);
        render.fill(out, usize::MAX);
    }

    /// Renders the whole exposition into a new buffer.
    pub fn render(&self, format: Format) -> Vec<u8> {
        let mut out = Vec::new();
        self.render_into(format, &mut out);
        out
    }

    /// Expires idle series of the families that have a TTL, as of `now`; returns how many.
    /// The exporter calls it every second; call it yourself without an exporter.
    pub fn sweep(&self, now: Instant) -> usize {
        let families = lock(&self.inner.families).clone();
        families.iter().map(|f| f.sweep(now)).sum()
    }

    /// Live series over all families.
    pub fn series(&self) -> usize {
        lock(&self.inner.families).iter().map(|f| f.len()).sum()
    }

    /// Heap bytes held for series (cells, slots, rendered labels, index); shared label
    /// strings of the caller are not included.
    pub fn heap_bytes(&self) -> usize {
        let families = lock(&self.inner.families).clone();
        families.iter().map(|f| f.heap_bytes()).sum()
    }

    /// Whether any family expires series (so someone should call [`Registry::sweep`]).
    pub(crate) fn has_ttl(&self) -> bool {
        lock(&self.inner.families).iter().any(|f| f.ttl.is_some())
    }

    pub(crate) fn scrape_metrics(&self) -> Option<&ScrapeMetrics> {
        self.inner.scrape.get()
    }

    fn register_self_metrics(&self, prefix: &str) -> Result<(), MetricsError> {
        let own = SelfFamilies {
            series: self.gauge(
                &format!("{prefix}_series"),
                "Live series per metric family.",
                &["family"],
            )?,
            overflowed: self.counter(
                &format!("{prefix}_series_overflowed"),
                "New label sets sent to the family's overflow series because it was at its series cap.",
                &["family"],
            )?,
            expired: self.counter(
                &format!("{prefix}_series_expired"),
                "Series removed after being idle for the family's TTL.",
                &["family"],
            )?,
        };
        let bytes = self
            .gauge(
                &format!("{prefix}_exposition_bytes"),
                "Uncompressed size of the last complete exposition.",
                &[],
            )?
            .get_or_create(&[])?;
        let duration = self
            .histogram(
                &format!("{prefix}_scrape_duration_seconds"),
                "Time to render and send one exposition.",
                &[],
                &SCRAPE_BUCKETS,
            )?
            .get_or_create(&[])?;
        let scrapes = self.counter(
            &format!("{prefix}_scrapes"),
            "Expositions by outcome: ok, timeout (past X-Prometheus-Scrape-Timeout-Seconds), abandoned (every client left).",
            &["outcome"],
        )?;
        let coalesced = self
            .counter(
                &format!("{prefix}_scrapes_coalesced"),
                "Scrape requests served by a render shared with another concurrent request.",
                &[],
            )?
            .get_or_create(&[])?;
        let scrape = ScrapeMetrics {
            bytes,
            duration,
            ok: scrapes.get_or_create(&["ok"])?,
            timed_out: scrapes.get_or_create(&["timeout"])?,
            abandoned: scrapes.get_or_create(&["abandoned"])?,
            coalesced,
        };
        let families = lock(&self.inner.families).clone();
        for core in &families {
            attach_self_handles(&own, core)?;
        }
        let _ = self.inner.self_families.set(own);
        let _ = self.inner.scrape.set(scrape);
        Ok(())
    }
}

fn attach_self_handles(own: &SelfFamilies, core: &FamilyCore) -> Result<(), MetricsError> {
    let name = [core.name.as_str()];
    let handles = SelfHandles {
        series: own.series.get_or_create(&name)?,
        overflowed: if core.max_series < usize::MAX {
            Some(own.overflowed.get_or_create(&name)?)
        } else {
            None
        },
        expired: if core.ttl.is_some() {
            Some(own.expired.get_or_create(&name)?)
        } else {
            None
        },
    };
    // Series created before the handles existed (the self families' own) are counted here.
    handles
        .series
        .set(i64::try_from(core.len()).unwrap_or(i64::MAX));
    let _ = core.self_handles.set(handles);
    Ok(())
}
