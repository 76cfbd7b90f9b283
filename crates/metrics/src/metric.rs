//! The handles: what a request path holds and records into (the hot path).
//!
//! Every method here is one or two relaxed operations on the calling thread's shard (plain
//! loads and stores when the thread is the shard's only writer, see `chunk`): no lock, no
//! allocation, no hashing, no lookup.

use std::time::Duration;

use crate::chunk::SeriesRef;

/// The kind of a family: decides its cells, its `# TYPE` and how its samples are rendered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(unreachable_pub)] // named by the sealed trait; not reachable from outside
pub enum Kind {
    Counter,
    FloatCounter,
    Gauge,
    FloatGauge,
    Histogram,
}

impl Kind {
    pub(crate) fn type_name(self) -> &'static str {
        match self {
            Kind::Counter | Kind::FloatCounter => "counter",
            Kind::Gauge | Kind::FloatGauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }

    pub(crate) fn is_counter(self) -> bool {
        matches!(self, Kind::Counter | Kind::FloatCounter)
    }
}

pub(crate) mod sealed {
    use super::{Kind, SeriesRef};

    /// The sealed half of [`Metric`](super::Metric): how a family builds its handles.
    pub trait Sealed {
        const KIND: Kind;
        fn from_series(series: SeriesRef) -> Self;
    }
}

/// A handle type a [`Family`](crate::Family) hands out. Implemented by [`Counter`],
/// [`FloatCounter`], [`Gauge`], [`FloatGauge`] and [`Histogram`]; sealed.
pub trait Metric: sealed::Sealed + Clone + Send + Sync + 'static {}

macro_rules! handle {
    ($(#[$doc:meta])* $name:ident, $kind:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone)]
        pub struct $name {
            series: SeriesRef,
        }

        impl sealed::Sealed for $name {
            const KIND: Kind = $kind;
            fn from_series(series: SeriesRef) -> Self {
                $name { series }
            }
        }

        impl Metric for $name {}
    };
}

handle!(
    /// A monotonic integer counter. Rendered with the `_total` suffix.
    Counter,
    Kind::Counter
);
handle!(
    /// A monotonic float counter (e.g. CPU seconds). Rendered with the `_total` suffix.
    FloatCounter,
    Kind::FloatCounter
);
handle!(
    /// An integer gauge. `inc`/`dec`/`add` are sharded like counters and exact from any
    /// thread; `set` is meant for one writer or the off-path (see [`Gauge::set`]).
    Gauge,
    Kind::Gauge
);
handle!(
    /// A float gauge. Same sharing rules as [`Gauge`].
    FloatGauge,
    Kind::FloatGauge
);
handle!(
    /// A histogram with the family's fixed buckets. `observe` is one add on the bucket and
    /// one on the sum; the count is the sum of the buckets, so `_count` always
    /// equals the `+Inf` bucket.
    Histogram,
    Kind::Histogram
);

impl Counter {
    /// Adds one.
    #[inline]
    pub fn inc(&self) {
        self.add(1);
    }

    /// Adds `n`.
    #[inline]
    pub fn add(&self, n: u64) {
        self.series.chunk.add_u64(self.series.base as usize, n);
    }

    /// The current total over all shards (for tests and diagnostics; not a hot-path call).
    pub fn get(&self) -> u64 {
        self.series.chunk.sum_u64(self.series.base as usize)
    }
}

impl FloatCounter {
    /// Adds `v` (callers keep it non-negative: a counter only goes up).
    #[inline]
    pub fn add(&self, v: f64) {
        self.series
            .chunk
            .add_f64_shared(self.series.base as usize, v);
    }

    /// Replaces the total, for mirroring a monotonic total kept elsewhere (e.g. the
    /// process's CPU time read from `/proc`). One writer at a time.
    pub fn set(&self, total: f64) {
        self.series
            .chunk
            .set_raw(self.series.base as usize, total.to_bits());
    }

    /// The current total over all shards.
    pub fn get(&self) -> f64 {
        self.series.chunk.sum_f64(self.series.base as usize)
    }
}

impl Gauge {
    /// Adds one.
    #[inline]
    pub fn inc(&self) {
        self.add(1);
    }

    /// Subtracts one.
    #[inline]
    pub fn dec(&self) {
        self.add(-1);
    }

    /// Adds `n` (negative to subtract).
    #[inline]
    pub fn add(&self, n: i64) {
        // Two's complement: a wrapping add of the bits is a signed add, and the sum over
        // shards wraps back to the signed total.
        self.series
            .chunk
            .add_shared(self.series.base as usize, n as u64);
    }

    /// Replaces the value. Writes every shard's cell, so call it from one thread or off the
    /// request path (config load, a sampler); hot paths use `inc`/`dec`/`add`.
    pub fn set(&self, v: i64) {
        self.series
            .chunk
            .set_raw(self.series.base as usize, v as u64);
    }

    /// The current value over all shards.
    pub fn get(&self) -> i64 {
        self.series.chunk.sum_u64(self.series.base as usize) as i64
    }
}

impl FloatGauge {
    /// Adds `v` (negative to subtract).
    #[inline]
    pub fn add(&self, v: f64) {
        self.series
            .chunk
            .add_f64_shared(self.series.base as usize, v);
    }

    /// Replaces the value. Same rule as [`Gauge::set`].
    pub fn set(&self, v: f64) {
        self.series
            .chunk
            .set_raw(self.series.base as usize, v.to_bits());
    }

    /// The current value over all shards.
    pub fn get(&self) -> f64 {
        self.series.chunk.sum_f64(self.series.base as usize)
    }
}

impl Histogram {
    /// Records one observation.
    #[inline]
    pub fn observe(&self, v: f64) {
        let chunk = &*self.series.chunk;
        let bounds = &*chunk.bounds;
        // Linear scan: bucket lists are short (the default has 14) and this beats a binary
        // search's unpredictable branches at that size. NaN lands in +Inf.
        let mut bucket = bounds.len();
        for (i, bound) in bounds.iter().enumerate() {
            if v <= *bound {
                bucket = i;
                break;
            }
        }
        let base = self.series.base as usize;
        chunk.add_u64(base + bucket, 1);
        chunk.add_f64(base + bounds.len() + 1, v);
    }

    /// Records a duration in seconds.
    #[inline]
    pub fn observe_duration(&self, d: Duration) {
        self.observe(d.as_secs_f64());
    }

    /// Number of observations so far.
    pub fn count(&self) -> u64 {
        let chunk = &*self.series.chunk;
        let base = self.series.base as usize;
        (0..=chunk.bounds.len())
            .map(|b| chunk.sum_u64(base + b))
            .fold(0, u64::wrapping_add)
    }

    /// Sum of all observations so far.
    pub fn sum(&self) -> f64 {
        let chunk = &*self.series.chunk;
        chunk.sum_f64(self.series.base as usize + chunk.bounds.len() + 1)
    }
}

/// Cells each series of a kind needs.
pub(crate) fn cells_per_series(kind: Kind, bounds: usize) -> usize {
    match kind {
        // One cell per bucket (the finite bounds and +Inf), then the sum.
        Kind::Histogram => bounds + 2,
        _ => 1,
    }
}
