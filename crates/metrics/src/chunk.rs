//! Append-only series storage: chunks of cells with stable addresses, one region per shard.
//!
//! A chunk holds `capacity` series of one family. Its cells are laid out
//! `[shard][series][cell]`, each shard's region padded by a cache line so that no line is
//! shared between two shards. A handle is an `Arc` of its chunk plus the series' offset, so
//! recording is an index computation and one add: no lock, no lookup.
//!
//! The thread with index `i < shards` is the only writer of shard `i`
//! ([`crate::shard::thread_index`] hands out each index once), so counters and histograms
//! add there with a plain load and store: a `lock`-prefixed add costs ~6 ns on this
//! project's machines, and a request records several. Threads beyond the shard count share
//! one extra region and add there atomically. Gauges and float counters can be `set`
//! from another thread, so they always add atomically (`add_shared`).
//!
//! A chunk is never moved or resized once created, so creating a series (filling the next free
//! slot, or appending a new chunk) never touches what a scrape is reading: the scrape holds
//! its own `Arc`s to the chunks it walks.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use crate::shard::thread_index;

/// Cells of padding after each shard region: one 64-byte cache line of `u64`s.
const PAD_CELLS: usize = 8;

/// Set in [`Slot::state`] once a series has expired: it is no longer rendered or found.
pub(crate) const DEAD: u32 = 1 << 31;

/// One series' metadata inside a chunk.
#[derive(Debug, Default)]
pub(crate) struct Slot {
    /// The series' labels rendered and escaped once at creation (`a="x",b="y"`), empty for a
    /// series without labels. Unset while the slot is free.
    pub(crate) labels: OnceLock<Box<[u8]>>,
    /// Number of live handles in the low bits, [`DEAD`] in the top bit. Only the cold path
    /// (handle clone/drop, creation, expiry) writes it.
    pub(crate) state: AtomicU32,
}

/// A fixed block of series of one family.
#[derive(Debug)]
pub(crate) struct Chunk {
    pub(crate) cells: Box<[AtomicU64]>,
    pub(crate) slots: Box<[Slot]>,
    /// Cells per series (1 for counters and gauges; buckets + sum for histograms).
    pub(crate) cells_per_series: usize,
    /// Cells per shard region, padding included.
    pub(crate) stride: usize,
    /// Shards - 1 (the shard count is a power of two).
    pub(crate) mask: usize,
    /// Histogram bucket upper bounds without `+Inf`; empty for other kinds.
    pub(crate) bounds: Arc<[f64]>,
}

impl Chunk {
    pub(crate) fn new(
        capacity: usize,
        cells_per_series: usize,
        shards: usize,
        bounds: Arc<[f64]>,
    ) -> Self {
        let stride = capacity * cells_per_series + PAD_CELLS;
        Chunk {
            // One region per shard, and the shared one for threads beyond them.
            cells: (0..stride * (shards + 1))
                .map(|_| AtomicU64::new(0))
                .collect(),
            slots: (0..capacity).map(|_| Slot::default()).collect(),
            cells_per_series,
            stride,
            mask: shards - 1,
            bounds,
        }
    }

    /// The calling thread's cell `base` (series offset + cell index), and whether the thread
    /// is its only writer (else it is in the shared region).
    #[inline]
    fn own_cell(&self, base: usize) -> (&AtomicU64, bool) {
        let index = thread_index();
        let (region, only_writer) = if index <= self.mask {
            (index, true)
        } else {
            (self.mask + 1, false)
        };
        (&self.cells[region * self.stride + base], only_writer)
    }

    /// Adds to the calling thread's cell `base`, for series nobody `set`s (counters,
    /// histogram buckets).
    #[inline]
    pub(crate) fn add_u64(&self, base: usize, n: u64) {
        match self.own_cell(base) {
            // Relaxed load and store: readers see the old or the new total, never a torn one.
            (cell, true) => cell.store(
                cell.load(Ordering::Relaxed).wrapping_add(n),
                Ordering::Relaxed,
            ),
            (cell, false) => {
                cell.fetch_add(n, Ordering::Relaxed);
            }
        }
    }

    /// Adds atomically to the calling thread's cell `base`, for series that another thread
    /// may `set` (gauges), where a plain store could undo the set.
    #[inline]
    pub(crate) fn add_shared(&self, base: usize, n: u64) {
        self.own_cell(base).0.fetch_add(n, Ordering::Relaxed);
    }

    /// Shard `shard`'s cell `base`.
    #[inline]
    pub(crate) fn shard_cell(&self, shard: usize, base: usize) -> &AtomicU64 {
        &self.cells[shard * self.stride + base]
    }

    /// Sum of an integer cell over all shards (wrapping, so signed gauges work too).
    #[inline]
    pub(crate) fn sum_u64(&self, base: usize) -> u64 {
        let mut total = 0u64;
        let mut index = base;
        for _ in 0..=self.mask + 1 {
            total = total.wrapping_add(self.cells[index].load(Ordering::Relaxed));
            index += self.stride;
        }
        total
    }

    /// Sum of a float cell (stored as bits) over all shards.
    #[inline]
    pub(crate) fn sum_f64(&self, base: usize) -> f64 {
        let mut total = 0.0;
        let mut index = base;
        for _ in 0..=self.mask + 1 {
            total += f64::from_bits(self.cells[index].load(Ordering::Relaxed));
            index += self.stride;
        }
        total
    }

    /// Adds a float to the calling thread's cell, for series nobody `set`s (histogram sums):
    /// a plain load and store when the thread is the cell's only writer.
    #[inline]
    pub(crate) fn add_f64(&self, base: usize, value: f64) {
        match self.own_cell(base) {
            (cell, true) => {
                let total = f64::from_bits(cell.load(Ordering::Relaxed)) + value;
                cell.store(total.to_bits(), Ordering::Relaxed);
            }
            (cell, false) => add_f64_atomic(cell, value),
        }
    }

    /// Adds a float to the calling thread's cell atomically, for series that another thread
    /// may `set` (float gauges and counters).
    #[inline]
    pub(crate) fn add_f64_shared(&self, base: usize, value: f64) {
        add_f64_atomic(self.own_cell(base).0, value);
    }

    /// Sets a cell's total: shard 0 gets the value, every other shard (and the shared region)
    /// 0. Concurrent `set`s all write shard 0, so the last one wins; atomic adds racing with a
    /// set land before or after it, which is why series that are set add only atomically.
    pub(crate) fn set_raw(&self, base: usize, bits: u64) {
        self.shard_cell(0, base).store(bits, Ordering::Relaxed);
        for shard in 1..=self.mask + 1 {
            self.shard_cell(shard, base).store(0, Ordering::Relaxed);
        }
    }

    /// A live series' labels, or `None` for a free or expired slot.
    #[inline]
    pub(crate) fn live_labels(&self, slot: usize) -> Option<&[u8]> {
        let s = &self.slots[slot];
        let labels = s.labels.get()?;
        if s.state.load(Ordering::Relaxed) & DEAD != 0 {
            return None;
        }
        Some(labels)
    }

    /// Sum of every cell of a series: a fingerprint that changes whenever it is recorded to.
    pub(crate) fn fingerprint(&self, slot: usize) -> u64 {
        let base = slot * self.cells_per_series;
        (0..self.cells_per_series).fold(0u64, |acc, cell| {
            acc.wrapping_mul(31).wrapping_add(self.sum_u64(base + cell))
        })
    }

    /// Bytes this chunk owns (cells and slots; label bytes are counted per series).
    pub(crate) fn heap_bytes(&self) -> usize {
        self.cells.len() * size_of::<AtomicU64>() + self.slots.len() * size_of::<Slot>()
    }
}

/// Adds a float to a cell with a compare-exchange loop (uncontended when threads do not
/// outnumber shards, so normally one iteration).
#[inline]
fn add_f64_atomic(cell: &AtomicU64, value: f64) {
    let mut current = cell.load(Ordering::Relaxed);
    loop {
        let next = (f64::from_bits(current) + value).to_bits();
        match cell.compare_exchange_weak(current, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return,
            Err(actual) => current = actual,
        }
    }
}

/// What every handle holds: its chunk and its series' place in it.
#[derive(Debug)]
#[allow(unreachable_pub)] // named by the sealed trait; not reachable from outside
pub struct SeriesRef {
    pub(crate) chunk: Arc<Chunk>,
    pub(crate) slot: u32,
    /// `slot * cells_per_series`, kept so the hot path does not multiply.
    pub(crate) base: u32,
}

impl SeriesRef {
    /// A new reference; the caller has already counted it in the slot's state.
    pub(crate) fn new(chunk: Arc<Chunk>, slot: usize) -> Self {
        let base = slot * chunk.cells_per_series;
        SeriesRef {
            chunk,
            slot: u32::try_from(slot).expect("chunk capacities are far below u32::MAX"),
            base: u32::try_from(base).expect("chunk cell counts are far below u32::MAX"),
        }
    }
}

impl Clone for SeriesRef {
    fn clone(&self) -> Self {
        self.chunk.slots[self.slot as usize]
            .state
            .fetch_add(1, Ordering::Relaxed);
        SeriesRef {
            chunk: Arc::clone(&self.chunk),
            slot: self.slot,
            base: self.base,
        }
    }
}

impl Drop for SeriesRef {
    fn drop(&mut self) {
        // Release: a sweeper that sees the count reach 0 (Acquire) also sees every record
        // this handle made.
        self.chunk.slots[self.slot as usize]
            .state
            .fetch_sub(1, Ordering::Release);
    }
}
