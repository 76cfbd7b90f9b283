//! A metric family (name, help, label names, series) and the cold path that finds or creates
//! a series and hands out its handle.
//!
//! Finding a series hashes its rendered labels into one of 16 index shards, each a small map
//! under its own mutex, so creators of different series rarely meet and a growing map only
//! rehashes one sixteenth of the family. A scrape never takes an index lock; it takes the
//! store lock only to copy the list of chunk pointers.

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher, RandomState};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use crate::MetricsError;
use crate::chunk::{Chunk, DEAD, SeriesRef};
use crate::metric::{Counter, Gauge, Kind, Metric, cells_per_series};
use crate::text::{check_label_name, check_metric_name, escape_help, render_labels};

/// Label value given to every label of a family's overflow series.
pub const OVERFLOW_LABEL_VALUE: &str = "__overflow__";

/// Index shards per family (a power of two).
const INDEX_SHARDS: usize = 16;

/// Largest chunk, in cells per shard: 64 Ki cells = 512 KiB per shard region, so a new chunk
/// is zeroed in tens of microseconds and a small family does not pay for a big one.
const MAX_CHUNK_CELLS: usize = 64 * 1024;

/// Largest chunk of a family with a TTL, in series: expiry frees memory a whole chunk at a
/// time, so TTL families use small chunks.
const TTL_CHUNK_SERIES: usize = 64;

/// What a family is: name, help text, label names, and the options that bound it.
///
/// ```
/// use tailguard_metrics::Desc;
/// let desc = Desc::new("http_requests", "Requests served.")
///     .labels(&["route", "status"])
///     .max_series(10_000);
/// # let _ = desc;
/// ```
#[derive(Debug, Clone)]
pub struct Desc {
    name: String,
    help: String,
    labels: Vec<String>,
    buckets: Option<Vec<f64>>,
    max_series: Option<usize>,
    ttl: Option<Duration>,
}

impl Desc {
    /// A family named `name` (a counter's `_total` suffix is added at render; passing it
    /// here is allowed and stripped) with HELP text `help`.
    pub fn new(name: impl Into<String>, help: impl Into<String>) -> Self {
        Desc {
            name: name.into(),
            help: help.into(),
            labels: Vec::new(),
            buckets: None,
            max_series: None,
            ttl: None,
        }
    }

    /// The label names, in the order values are passed to `get_or_create`.
    pub fn labels(mut self, names: &[&str]) -> Self {
        self.labels = names.iter().map(|n| (*n).to_owned()).collect();
        self
    }

    /// Histogram bucket upper bounds (finite, strictly ascending; `+Inf` is implied).
    /// Default: [`LATENCY_BUCKETS`].
    pub fn buckets(mut self, bounds: &[f64]) -> Self {
        self.buckets = Some(bounds.to_vec());
        self
    }

    /// At most `n` series; past that, `get_or_create` of a new label set returns the
    /// family's one overflow series (every label `__overflow__`) and counts it.
    pub fn max_series(mut self, n: usize) -> Self {
        self.max_series = Some(n);
        self
    }

    /// Expire a series after it has not been recorded to for `ttl` and no handle to it is
    /// held (checked by [`Registry::sweep`](crate::Registry::sweep), which the exporter runs).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }
}

/// Default histogram buckets for request latency in seconds: 1 ms to 10 s, roughly 1-2.5-5
/// per decade (the Prometheus client default, extended down to 1 ms for a gateway).
pub const LATENCY_BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 7.5, 10.0,
];

/// Where a series lives: chunk id (never reused) and slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Loc {
    chunk: u32,
    slot: u32,
}

/// Marks an index entry whose series expired while a later entry of the same probe chain
/// still needs the chain unbroken.
const TOMBSTONE: Loc = Loc {
    chunk: u32::MAX,
    slot: u32::MAX,
};

/// The index keys are already hashes: use them as they are.
#[derive(Default)]
struct IdentityHasher(u64);

impl Hasher for IdentityHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

type Index = HashMap<u64, Loc, BuildHasherDefault<IdentityHasher>>;

#[derive(Debug, Default)]
struct Store {
    chunks: Vec<(u32, Arc<Chunk>)>,
    next_id: u32,
    /// Slots used in the last chunk.
    used: usize,
}

/// Self-metric handles of one family (see [`Registry`](crate::Registry)).
#[derive(Debug)]
pub(crate) struct SelfHandles {
    pub(crate) series: Gauge,
    /// Only for families with a series cap.
    pub(crate) overflowed: Option<Counter>,
    /// Only for families with a TTL.
    pub(crate) expired: Option<Counter>,
}

/// Pre-rendered bytes of a family that do not change: headers and sample names.
#[derive(Debug)]
pub(crate) struct FamilyBytes {
    pub(crate) header_text: Box<[u8]>,
    pub(crate) header_openmetrics: Box<[u8]>,
    /// Counters: `name_total`; gauges: `name`; histograms: `name_bucket`.
    pub(crate) sample: Box<[u8]>,
    /// Histograms: `name_sum` and `name_count`.
    pub(crate) sum: Box<[u8]>,
    pub(crate) count: Box<[u8]>,
    /// Histograms: `le="0.005"` ... `le="+Inf"`.
    pub(crate) le: Box<[Box<[u8]>]>,
}

/// The shared state of a family.
pub(crate) struct FamilyCore {
    pub(crate) kind: Kind,
    pub(crate) name: String,
    pub(crate) label_names: Box<[String]>,
    pub(crate) bytes: FamilyBytes,
    pub(crate) ttl: Option<Duration>,
    bounds: Arc<[f64]>,
    shards: usize,
    cells_per_series: usize,
    max_chunk: usize,
    pub(crate) max_series: usize,
    hasher: RandomState,
    index: Box<[Mutex<Index>]>,
    store: Mutex<Store>,
    live: AtomicUsize,
    label_bytes: AtomicUsize,
    overflowed: AtomicU64,
    expired: AtomicU64,
    overflow: OnceLock<SeriesRef>,
    pub(crate) self_handles: OnceLock<SelfHandles>,
    sweep_state: Mutex<HashMap<Loc, (u64, Instant)>>,
}

impl std::fmt::Debug for FamilyCore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FamilyCore")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .field("series", &self.live.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// Locks a mutex, recovering the data if a panicking thread poisoned it: every critical
/// section here leaves the data consistent at each step, so poisoning carries no meaning.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl FamilyCore {
    pub(crate) fn new(kind: Kind, desc: Desc, shards: usize) -> Result<Self, MetricsError> {
        let name = if kind.is_counter() {
            desc.name
                .strip_suffix("_total")
                .unwrap_or(&desc.name)
                .to_owned()
        } else {
            desc.name.clone()
        };
        check_metric_name(&name)?;
        for (i, label) in desc.labels.iter().enumerate() {
            check_label_name(label)?;
            if kind == Kind::Histogram && label == "le" {
                return Err(MetricsError::InvalidLabelName(label.clone()));
            }
            if desc.labels[..i].contains(label) {
                return Err(MetricsError::DuplicateLabelName(label.clone()));
            }
        }
        let bounds: Arc<[f64]> = if kind == Kind::Histogram {
            let bounds = desc.buckets.unwrap_or_else(|| LATENCY_BUCKETS.to_vec());
            let valid = !bounds.is_empty()
                && bounds.iter().all(|b| b.is_finite())
                && bounds.windows(2).all(|w| w[0] < w[1]);
            if !valid {
                return Err(MetricsError::InvalidBuckets(bounds));
            }
            bounds.into()
        } else {
            Arc::from(Vec::new())
        };
        let cells_per_series = cells_per_series(kind, bounds.len());
        let max_chunk = if desc.ttl.is_some() {
            TTL_CHUNK_SERIES
        } else {
            let fit = (MAX_CHUNK_CELLS / cells_per_series).max(1);
            // Largest power of two that fits.
            1 << (usize::BITS - 1 - fit.leading_zeros())
        };
        let bytes = family_bytes(kind, &name, &desc.help, &bounds);
        Ok(FamilyCore {
            kind,
            name,
            label_names: desc.labels.into(),
            bytes,
            ttl: desc.ttl,
            bounds,
            shards,
            cells_per_series,
            max_chunk,
            max_series: desc.max_series.unwrap_or(usize::MAX),
            hasher: RandomState::new(),
            index: (0..INDEX_SHARDS).map(|_| Mutex::default()).collect(),
            store: Mutex::default(),
            live: AtomicUsize::new(0),
            label_bytes: AtomicUsize::new(0),
            overflowed: AtomicU64::new(0),
            expired: AtomicU64::new(0),
            overflow: OnceLock::new(),
            self_handles: OnceLock::new(),
            sweep_state: Mutex::default(),
        })
    }

    /// Live series, the overflow series included.
    pub(crate) fn len(&self) -> usize {
        self.live.load(Ordering::Relaxed)
    }

    /// The chunks a scrape walks, copied under the store lock (a pointer copy per chunk).
    pub(crate) fn chunks(&self) -> Vec<Arc<Chunk>> {
        lock(&self.store)
            .chunks
            .iter()
            .map(|(_, chunk)| Arc::clone(chunk))
            .collect()
    }

    /// Heap bytes held by this family's series: cells, slots, rendered labels, index.
    pub(crate) fn heap_bytes(&self) -> usize {
        let chunks: usize = self.chunks().iter().map(|c| c.heap_bytes()).sum();
        let index: usize = self
            .index
            .iter()
            .map(|m| lock(m).capacity() * (size_of::<(u64, Loc)>() + 1))
            .sum();
        chunks + index + self.label_bytes.load(Ordering::Relaxed)
    }

    pub(crate) fn get_or_create(&self, values: &[&str]) -> Result<SeriesRef, MetricsError> {
        if values.len() != self.label_names.len() {
            return Err(MetricsError::LabelCount {
                family: self.name.clone(),
                expected: self.label_names.len(),
                got: values.len(),
            });
        }
        Ok(self.find_or_insert(render_labels(&self.label_names, values), false))
    }

    fn find_or_insert(&self, labels: Vec<u8>, is_overflow: bool) -> SeriesRef {
        let hash = self.hasher.hash_one(&labels[..]);
        let mut index = lock(&self.index[index_shard(hash)]);
        let mut key = hash;
        let mut free_key = None;
        while let Some(&loc) = index.get(&key) {
            if loc == TOMBSTONE {
                free_key.get_or_insert(key);
            } else if let Some(chunk) = self.chunk(loc.chunk) {
                let slot = &chunk.slots[loc.slot as usize];
                if slot.labels.get().map(|l| &l[..]) == Some(&labels[..]) {
                    slot.state.fetch_add(1, Ordering::Relaxed);
                    return SeriesRef::new(chunk, loc.slot as usize);
                }
            }
            key = key.wrapping_add(1);
        }
        let key = free_key.unwrap_or(key);
        if !is_overflow && self.live.fetch_add(1, Ordering::Relaxed) >= self.max_series {
            self.live.fetch_sub(1, Ordering::Relaxed);
            drop(index);
            self.overflowed.fetch_add(1, Ordering::Relaxed);
            if let Some(c) = self.self_handles.get().and_then(|h| h.overflowed.as_ref()) {
                c.inc();
            }
            return self.overflow_series();
        }
        if is_overflow {
            self.live.fetch_add(1, Ordering::Relaxed);
        }
        self.label_bytes
            .fetch_add(labels.len() + size_of::<usize>(), Ordering::Relaxed);
        let (loc, chunk) = self.allocate(labels);
        index.insert(key, loc);
        drop(index);
        if let Some(handles) = self.self_handles.get() {
            handles.series.inc();
        }
        SeriesRef::new(chunk, loc.slot as usize)
    }

    fn overflow_series(&self) -> SeriesRef {
        self.overflow
            .get_or_init(|| {
                let values = vec![OVERFLOW_LABEL_VALUE; self.label_names.len()];
                self.find_or_insert(render_labels(&self.label_names, &values), true)
            })
            .clone()
    }

    fn chunk(&self, id: u32) -> Option<Arc<Chunk>> {
        let store = lock(&self.store);
        let at = store.chunks.binary_search_by_key(&id, |(id, _)| *id).ok()?;
        Some(Arc::clone(&store.chunks[at].1))
    }

    /// Takes the next free slot (appending a chunk if the last one is full), gives it its
    /// labels and one handle.
    fn allocate(&self, labels: Vec<u8>) -> (Loc, Arc<Chunk>) {
        let mut store = lock(&self.store);
        loop {
            if let Some((id, chunk)) = store.chunks.last()
                && store.used < chunk.slots.len()
            {
                let (id, chunk) = (*id, Arc::clone(chunk));
                let slot = store.used;
                store.used += 1;
                drop(store);
                chunk.slots[slot].state.store(1, Ordering::Relaxed);
                // Setting the labels publishes the series to scrapes (release/acquire).
                let _ = chunk.slots[slot].labels.set(labels.into_boxed_slice());
                let slot = u32::try_from(slot).expect("chunk capacities are far below u32::MAX");
                return (Loc { chunk: id, slot }, chunk);
            }
            // Zero the new chunk outside the lock so a scrape's pointer copy never waits
            // for it; creators race only against other creators of this family.
            let capacity = (8usize << store.chunks.len().min(20)).min(self.max_chunk);
            drop(store);
            let chunk = Arc::new(Chunk::new(
                capacity,
                self.cells_per_series,
                self.shards,
                Arc::clone(&self.bounds),
            ));
            store = lock(&self.store);
            let full = store
                .chunks
                .last()
                .is_none_or(|(_, last)| store.used >= last.slots.len());
            if full {
                let id = store.next_id;
                store.next_id += 1;
                store.chunks.push((id, chunk));
                store.used = 0;
            }
        }
    }

    /// Expires series idle for the family's TTL with no handle held; returns how many.
    pub(crate) fn sweep(&self, now: Instant) -> usize {
        let Some(ttl) = self.ttl else { return 0 };
        let chunks: Vec<(u32, Arc<Chunk>)> = lock(&self.store).chunks.clone();
        let mut state = lock(&self.sweep_state);
        let mut expired = 0;
        for (id, chunk) in &chunks {
            for slot in 0..chunk.slots.len() {
                let Some(labels) = chunk.live_labels(slot) else {
                    continue;
                };
                let loc = Loc {
                    chunk: *id,
                    slot: u32::try_from(slot).expect("chunk capacities are far below u32::MAX"),
                };
                let fingerprint = chunk.fingerprint(slot);
                match state.get_mut(&loc) {
                    Some(seen) if seen.0 != fingerprint => *seen = (fingerprint, now),
                    Some(seen) => {
                        if now.saturating_duration_since(seen.1) >= ttl
                            && self.try_expire(loc, chunk, labels)
                        {
                            state.remove(&loc);
                            expired += 1;
                        }
                    }
                    None => {
                        state.insert(loc, (fingerprint, now));
                    }
                }
            }
        }
        drop(state);
        if expired > 0 {
            // Give back index memory once a shard is mostly empty.
            for shard in &self.index[..] {
                let mut index = lock(shard);
                if index.len() * 4 < index.capacity() {
                    index.shrink_to_fit();
                }
            }
            // Free every chunk whose slots are all used and all dead.
            let mut store = lock(&self.store);
            let last = store.chunks.last().map(|(id, _)| *id);
            store.chunks.retain(|(id, chunk)| {
                Some(*id) == last
                    || !chunk
                        .slots
                        .iter()
                        .all(|s| s.state.load(Ordering::Relaxed) & DEAD != 0)
            });
        }
        expired
    }

    fn try_expire(&self, loc: Loc, chunk: &Chunk, labels: &[u8]) -> bool {
        let hash = self.hasher.hash_one(labels);
        let mut index = lock(&self.index[index_shard(hash)]);
        let state = &chunk.slots[loc.slot as usize].state;
        // Under the index lock no new handle can appear (creation and lookup hold it; clones
        // need a live handle), so 0 stays 0.
        if state.load(Ordering::Acquire) != 0 {
            return false;
        }
        let mut key = hash;
        while let Some(&found) = index.get(&key) {
            if found == loc {
                if index.contains_key(&key.wrapping_add(1)) {
                    index.insert(key, TOMBSTONE);
                } else {
                    index.remove(&key);
                }
                break;
            }
            key = key.wrapping_add(1);
        }
        drop(index);
        state.fetch_or(DEAD, Ordering::Relaxed);
        self.live.fetch_sub(1, Ordering::Relaxed);
        self.label_bytes
            .fetch_sub(labels.len() + size_of::<usize>(), Ordering::Relaxed);
        self.expired.fetch_add(1, Ordering::Relaxed);
        if let Some(handles) = self.self_handles.get() {
            handles.series.dec();
            if let Some(c) = &handles.expired {
                c.inc();
            }
        }
        true
    }
}

fn index_shard(hash: u64) -> usize {
    // Bits the map itself does not use for small tables (it takes the low bits for the
    // position and the top 7 for its control bytes).
    ((hash >> 32) as usize) & (INDEX_SHARDS - 1)
}

fn family_bytes(kind: Kind, name: &str, help: &str, bounds: &[f64]) -> FamilyBytes {
    // Text 0.0.4 names a counter family by its sample name (`x_total`); OpenMetrics by the
    // family name (`x`) with `_total` only on the sample.
    let text_name = if kind.is_counter() {
        format!("{name}_total")
    } else {
        name.to_owned()
    };
    let header = |family: &str, openmetrics: bool| {
        let mut out = Vec::new();
        if !help.is_empty() {
            out.extend_from_slice(b"# HELP ");
            out.extend_from_slice(family.as_bytes());
            out.push(b' ');
            escape_help(&mut out, help, openmetrics);
            out.push(b'\n');
        }
        out.extend_from_slice(b"# TYPE ");
        out.extend_from_slice(family.as_bytes());
        out.push(b' ');
        out.extend_from_slice(kind.type_name().as_bytes());
        out.push(b'\n');
        out.into_boxed_slice()
    };
    let sample = match kind {
        Kind::Histogram => format!("{name}_bucket"),
        _ => text_name.clone(),
    };
    let le = if kind == Kind::Histogram {
        bounds
            .iter()
            .copied()
            .chain([f64::INFINITY])
            .map(|bound| {
                let mut out = b"le=\"".to_vec();
                crate::text::push_f64(&mut out, bound);
                out.push(b'"');
                out.into_boxed_slice()
            })
            .collect()
    } else {
        Box::default()
    };
    FamilyBytes {
        header_text: header(&text_name, false),
        header_openmetrics: header(name, true),
        sample: sample.into_bytes().into_boxed_slice(),
        sum: format!("{name}_sum").into_bytes().into_boxed_slice(),
        count: format!("{name}_count").into_bytes().into_boxed_slice(),
        le,
    }
}

/// A registered family: hands out handles for label values.
///
/// Hold the handles: look them up once (when a route or endpoint is built) and record on
/// them per request. `get_or_create` is the cold path (it hashes and takes a lock).
pub struct Family<M> {
    pub(crate) core: Arc<FamilyCore>,
    _metric: PhantomData<fn() -> M>,
}

impl<M> Clone for Family<M> {
    fn clone(&self) -> Self {
        Family {
            core: Arc::clone(&self.core),
            _metric: PhantomData,
        }
    }
}

impl<M> std::fmt::Debug for Family<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.core.fmt(f)
    }
}

impl<M: Metric> Family<M> {
    pub(crate) fn from_core(core: Arc<FamilyCore>) -> Self {
        Family {
            core,
            _metric: PhantomData,
        }
    }

    /// The handle of the series with these label values (in the order of the family's
    /// label names), created if new. Past the family's `max_series`, the overflow series.
    pub fn get_or_create(&self, values: &[&str]) -> Result<M, MetricsError> {
        Ok(M::from_series(self.core.get_or_create(values)?))
    }

    /// The family's name (without a counter's `_total`).
    pub fn name(&self) -> &str {
        &self.core.name
    }

    /// Live series in the family.
    pub fn len(&self) -> usize {
        self.core.len()
    }

    /// Whether the family has no series yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Times a new label set was refused because the family was at `max_series`.
    pub fn overflowed(&self) -> u64 {
        self.core.overflowed.load(Ordering::Relaxed)
    }

    /// Series expired so far by the TTL.
    pub fn expired(&self) -> u64 {
        self.core.expired.load(Ordering::Relaxed)
    }
}
